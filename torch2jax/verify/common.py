"""What the verifier's drivers (:mod:`torch2jax.verify.sides`) and the three target sides
(nnx.py, linen.py, equinox.py) share: the request, building the inputs, calling the models,
comparing outputs, gradients and running statistics, and the errors and results they report.
It imports no target side, so each side depends on it and not on another side.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from torch2jax.ruleset import RuleSet
from torch2jax.verify.load import LoadError
from torch2jax.verify.spec import InputSpec, call_with

_OUR_CODE = str(Path(__file__).resolve().parents[1])  # frames in torch2jax itself are not news

ATOL, RTOL = 1e-5, 1e-4  # the float32 pass (float32 rounding through a network: about 1e-6)
# The float64 pass: right translations agree to about 1e-14 relative (measured over the
# fixtures and the test models, docs/verification.md); a default that differs moves the
# numbers by 1e-8 or more.
ATOL64, RTOL64 = 1e-10, 1e-10


@dataclass(frozen=True)
class VerifyRequest:
    """Everything :func:`~torch2jax.verify.run.verify` was asked to do, passed along as one
    value (to the target sides too)."""

    target: str
    args: dict | None = None
    build: str | None = None
    inputs: tuple[str, ...] = ()
    jax_target: str = "nnx"
    grad: bool = True  # also compare the gradients of every parameter
    atol: float = ATOL  # the float32 pass
    rtol: float = RTOL
    seed: int = 0
    device: str | None = None
    converted: str | None = None
    rules: RuleSet | None = None
    benchmark: bool = False  # also time both forward passes (verify/benchmark.py)
    train_mode: bool = False  # one forward in training mode, running statistics compared
    # None: a float32 pass, then a float64 pass where both sides support it; True: the float64
    # pass only (torch .double(), JAX with x64 enabled); False: the float32 pass only
    float64: bool | None = None
    atol64: float = ATOL64  # the float64 pass
    rtol64: float = RTOL64
    # Python statements run in the model file's namespace before the model is built, on the
    # torch side and again on the converted side (--setup; a .py file's path reads the file)
    setup: str | None = None
    input_exprs: tuple[str, ...] = ()  # --input-expr: EXPR or NAME=EXPR inputs (spec.py)


class VerifyError(RuntimeError):
    """Verification could not run (as opposed to: it ran and the results differ)."""


@dataclass
class PassFigures:
    """The figures of one comparison pass (float32, or float64) of a verification."""

    dtype: str
    passed: bool
    atol: float
    rtol: float
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    stats_max_abs_diff: float | None = None
    stats_max_rel_diff: float | None = None
    mismatch: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, r: VerifyResult) -> PassFigures:
        return cls(r.dtype or "float32", r.passed, r.atol, r.rtol, r.max_abs_diff,
                   r.max_rel_diff, r.grad_max_abs_diff, r.grad_max_rel_diff,
                   r.stats_max_abs_diff, r.stats_max_rel_diff, r.mismatch, r.error)


@dataclass
class VerifyResult:
    """The outcome of one verification; ``to_json()`` is what ``verify --json`` prints."""

    model: str  # FILE.py::Name
    target: str = "nnx"
    passed: bool = False
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    grad_max_abs_diff: float | None = None
    grad_max_rel_diff: float | None = None
    stats_max_abs_diff: float | None = None  # BatchNorm running statistics, when compared
    stats_max_rel_diff: float | None = None
    device: str | None = None
    dtype: str | None = None
    mode: str = "eval"
    atol: float = 1e-5
    rtol: float = 1e-4
    compared: list[str] = field(default_factory=list)
    todos: int = 0
    error: str | None = None
    mismatch: str | None = None  # why it did not pass, when it ran (the worst tensor)
    notes: list[str] = field(default_factory=list)
    name: str | None = None  # case name, when run from a cases file
    jax_ms: float | None = None  # --benchmark: forward times (verify/benchmark.py)
    torch_ms: float | None = None
    speed_ratio: float | None = None  # torch_ms / jax_ms
    # every pass that ran, float32 then float64; the fields above are the first one's
    # (``passed`` and ``mismatch`` cover all of them)
    passes: list[PassFigures] = field(default_factory=list)
    float64_skipped: str | None = None  # why the float64 pass did not run, when it did not
    # why ``passed`` reads as it does, in a sentence (which pass decided, on what figures);
    # None when the comparison could not run (``error`` says why)
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; non-finite differences become the strings "nan"/"inf"."""
        return _finite(asdict(self))

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# Called as each stage starts (``seconds`` None) and ends (its seconds) where a caller that
# times the verifier's phases sets it (the transformers sweep's rows, benchmarks/): None else
phase_hook: Callable[[str, float | None], None] | None = None


@contextlib.contextmanager
def timed(what: str) -> Iterator[None]:
    """Report the phase ``what`` to ``phase_hook`` as it starts and ends (nothing without)."""
    hook = phase_hook
    if hook is None:
        yield
        return
    hook(what, None)
    start = time.perf_counter()
    try:
        yield
    finally:
        hook(what, time.perf_counter() - start)


def stage(what: str) -> contextlib.AbstractContextManager[None]:
    """Turn any exception in a stage into a VerifyError naming the stage and the place (and
    time the stage, ``timed``)."""

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        try:
            with timed(what):
                yield
        except (VerifyError, LoadError):
            raise
        except Exception as exc:
            raise VerifyError(f"{what} failed: {_describe(exc)}") from exc

    return guard()


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line: source)``, pointing at the deepest frame of user code."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "site-packages" not in f.filename and not f.filename.startswith(_OUR_CODE)
    ]
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {f.filename}:{f.lineno}: {(f.line or '').strip()})"
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}{where}"


def build_call(build: str) -> ast.Expression:
    try:
        tree = ast.parse(build, mode="eval")
    except SyntaxError as exc:
        raise VerifyError(f"--build {build!r} is not a Python expression: {exc.msg}") from None
    if not isinstance(tree.body, ast.Call):
        raise VerifyError(f"--build {build!r} must be a call, e.g. GPT(GPTConfig(n_layer=2))")
    return tree


# what a cache layer holds: keys and values (attention), convolution and recurrent states
# (transformers' LinearAttentionLayer of the state-space and linear-attention models)
CACHE_STATES = ("keys", "values", "conv_states", "recurrent_states")


def flatten_output(value: Any, prefix: str = "output") -> list[tuple[str, Any]]:
    """Leaves of a (nested) tuple/list/dict output with their paths; None stays a leaf. A
    transformers KV cache (torch's, or the converted ``_hf_support``'s) is its layers' keys
    and values (a state-space layer's its states), and an encoder-decoder's its two caches, so
    both sides flatten alike."""
    if type(value).__name__ == "EncoderDecoderCache":
        return flatten_output({"self_attention_cache": value.self_attention_cache,
                               "cross_attention_cache": value.cross_attention_cache}, prefix)
    layers = getattr(value, "layers", None) if type(value).__name__.endswith("Cache") else None
    if isinstance(layers, (list, tuple)):  # a state-space layer's states beside keys/values
        # a layer never written holds nothing (torch's layers are made empty, keys None, and
        # a decoder-only model's cross-attention cache stays so; the converted cache has none)
        states = [{n: getattr(layer, n) for n in CACHE_STATES if hasattr(layer, n)}
                  for layer in layers]
        return flatten_output([s for s in states if any(v is not None for v in s.values())],
                              prefix)
    if isinstance(value, dict):
        return [leaf for k in value for leaf in flatten_output(value[k], f"{prefix}[{k!r}]")]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in flatten_output(v, f"{prefix}[{i}]")]
    return [(prefix, value)]


def torch_to_numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return value if value is None else np.asarray(value)


def jax_to_numpy(value: Any) -> Any:
    if value is None:
        return None
    arr = np.asarray(value)
    return arr.astype(np.float32) if arr.dtype.name == "bfloat16" else arr


@dataclass
class Diff:
    """How far one JAX tensor is from its torch reference."""

    abs: float
    rel: float
    ok: bool
    worst: str = ""
    comparable: bool = True  # False: the shapes (or the output structures) differ


def compare_arrays(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> Diff:
    """See the module docstring. Equal elements (also equal infinities) and NaN in both count
    as agreeing: masked attention scores are -inf on both sides."""
    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        return Diff(math.inf, math.inf, False, f"shape {a.shape} vs torch {b.shape}", False)
    if a.size == 0:
        return Diff(0.0, 0.0, True)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - b))
    err = np.nan_to_num(err, nan=math.inf)
    finite_ref = np.abs(b[np.isfinite(b)])
    scale = float(finite_ref.max()) if finite_ref.size else 0.0
    max_abs = float(err.max())
    rel = max_abs / max(scale, atol, np.finfo(np.float32).tiny)
    with np.errstate(invalid="ignore"):
        excess = err - (atol + rtol * np.abs(np.where(same, 0.0, b)))
    excess = np.nan_to_num(excess, nan=math.inf)
    ok = bool(np.all(excess <= 0))
    worst = ""
    if not ok:  # the element furthest outside the tolerance
        idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
        where = f"at index {tuple(int(i) for i in idx)}: " if a.ndim else ""
        digits = 16 if np.asarray(ref).dtype == np.float64 else 7  # enough to show the difference
        worst = f"{where}jax {float(a[idx]):.{digits}g} vs torch {float(b[idx]):.{digits}g}"
    return Diff(max_abs, rel, ok, worst)


def _describe_array(arr: Any) -> str:
    if arr is None:
        return "None"
    return f"{arr.dtype}[{','.join(str(d) for d in arr.shape)}]"


def torch_inputs(arrays: list[np.ndarray], specs: list[InputSpec]) -> list[Any]:
    import torch

    out = []
    for arr, spec in zip(arrays, specs, strict=True):
        if spec.expr is not None:  # filled in by expression_inputs
            out.append(None)
            continue
        t = torch.from_numpy(np.array(arr))
        out.append(t.to(getattr(torch, spec.dtype)))
    return out


def jax_inputs(arrays: list[np.ndarray], specs: list[InputSpec]) -> list[Any]:
    import jax
    import jax.numpy as jnp

    out = []
    for arr, spec in zip(arrays, specs, strict=True):
        if spec.expr is not None:  # filled in by expression_inputs
            out.append(None)
            continue
        dtype = jax.dtypes.canonicalize_dtype(jnp.dtype(spec.dtype))
        out.append(jnp.asarray(arr).astype(dtype))
    return out


def setup_source(setup: str) -> str:
    """The ``--setup`` code: the text itself, or the file's when it names a ``.py`` file."""
    if setup.strip().endswith(".py") and "\n" not in setup.strip():
        path = Path(setup.strip())
        if not path.is_file():
            raise VerifyError(f"--setup {setup}: no such file")
        return path.read_text()
    return setup


def run_setup(namespace: dict[str, Any], setup: str | None, side: str) -> None:
    """Run the ``--setup`` code in a model file's own namespace (so that the model's code
    sees the names it binds, as a script's globals)."""
    if not setup:
        return
    code = setup_source(setup)
    try:
        compiled = compile(code, "<--setup>", "exec")
    except SyntaxError as exc:
        raise VerifyError(f"--setup is not Python: {exc.msg} (line {exc.lineno})") from None
    with stage(f"running --setup on the {side} side"):
        exec(compiled, namespace)  # noqa: S102 (the user's own code)


def expression_inputs(xs: list[Any], specs: list[InputSpec], namespace: dict[str, Any],
                      model: Any, float64: bool, side: str,
                      torch_values: list[Any] | None = None) -> list[Any]:
    """``xs`` with each ``--input-expr`` placeholder replaced by its value: the expression
    evaluated in the model file's namespace with ``model`` bound to that side's model;
    float32 arrays in it widened to float64 in the float64 pass, as the model's are. On the
    JAX side (``torch_values``: the torch side's inputs), an expression that names torch and
    not the model (``torch.tensor([5, 3])``, which the converted file cannot evaluate) is the
    torch side's value, as JAX arrays."""
    if not any(s.expr is not None for s in specs):
        return xs
    out = list(xs)
    for i, spec in enumerate(specs):
        if spec.expr is None:
            continue
        if torch_values is not None and "torch" not in namespace and {"torch"} <= (
                names := _expression_names(spec.expr)) and "model" not in names:
            out[i] = _as_jax(torch_values[i])
            continue
        with stage(f"--input-expr {spec} on the {side} side"):
            value = eval(compile(spec.expr, "<--input-expr>", "eval"),  # the user's own code
                         {**namespace, "model": model})
        out[i] = _widen_input(value, side) if float64 else value
    return out


def _expression_names(text: str) -> set[str]:
    import ast

    return {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}


def _as_jax(value: Any) -> Any:
    """A torch-side input value with its tensors made JAX arrays (the same numbers)."""
    import jax.numpy as jnp
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: jnp.asarray(torch_to_numpy(v)) if isinstance(v, torch.Tensor)
                    else v, value)


def _widen_input(value: Any, side: str) -> Any:
    if side == "torch":
        import torch
        from torch.utils._pytree import tree_map

        return tree_map(lambda v: v.double() if isinstance(v, torch.Tensor)
                        and v.dtype == torch.float32 else v, value)
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda v: v.astype(jnp.float64) if hasattr(v, "dtype")
                        and v.dtype == jnp.float32 else v, value)


def compare_expression_inputs(r: VerifyResult, torch_in: list[Any], jax_in: list[Any],
                              specs: list[InputSpec]) -> None:
    """Each ``--input-expr`` value must be the same on both sides (same structure, shapes
    and numbers, at the pass's tolerance): otherwise the comparison of the outputs says
    nothing, and verification stops with an error that names the input."""
    for t, j, spec in zip(torch_in, jax_in, specs, strict=True):
        if spec.expr is None:
            continue
        tl = [(k, torch_to_numpy(v)) for k, v in flatten_output(t, "input")]
        jl = [(k, jax_to_numpy(v)) for k, v in flatten_output(j, "input")]
        if [k for k, _ in tl] != [k for k, _ in jl]:
            raise VerifyError(f"--input-expr {spec}: the two sides give values of different "
                              f"structure ({', '.join(k for k, _ in jl)} vs torch "
                              f"{', '.join(k for k, _ in tl)})")
        for (k, a), (_, b) in zip(jl, tl, strict=True):
            if a is None and b is None:
                continue
            if a is None or b is None:
                raise VerifyError(f"--input-expr {spec}: {k} is None on one side only")
            d = compare_arrays(a, b, r.atol, r.rtol)
            if not d.ok:
                raise VerifyError(f"--input-expr {spec}: {k} differs between the two sides "
                                  f"({d.worst}); both models must receive the same input")


RUNNING_STATS = ("running_mean", "running_var")  # torch buffers a training forward updates


# modules that drop values at random in training and read self.training (torchvision's
# StochasticDepth, timm's DropPath), besides torch's Dropout classes and nnx/linen/eqx Dropout
DROP_PATH_CLASSES = ("StochasticDepth", "DropPath")


def is_running_stat(torch_name: str) -> bool:
    return torch_name.rsplit(".", 1)[-1] in RUNNING_STATS


def is_torch_dropout(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.modules.dropout._DropoutNd) or \
        type(module).__name__ in DROP_PATH_CLASSES or _inner_dropout(module)


def _inner_dropout(module: Any) -> bool:
    """A layer that draws its own dropout mask in training mode from a float attribute
    (nn.LSTM's between its layers, nn.MultiheadAttention's on its weights)."""
    import torch

    return isinstance(module, (torch.nn.RNNBase, torch.nn.MultiheadAttention)) and bool(
        getattr(module, "dropout", 0.0))


def switch_off_dropout(module: Any) -> None:
    """Dropout of probability 0 in ``module`` (one that :func:`is_torch_dropout` names)."""
    if _inner_dropout(module):
        module.dropout = 0.0
    else:
        module.p = 0.0


def torch_train_mode(model: Any) -> int:
    """``model.train()`` with every dropout-like module in eval mode (random masks cannot
    agree across frameworks): the number of such modules."""
    model.train()
    dropouts = [m for m in model.modules() if is_torch_dropout(m)]
    for m in dropouts:
        m.eval()
    return len(dropouts)


def train_mode_note(n_torch: int, jax_side: str) -> str:
    return (f"training mode on both sides: BatchNorm normalises with batch statistics and "
            f"updates its running statistics; dropout and stochastic depth deterministic: "
            f"{n_torch} torch modules in eval mode, {jax_side} (functional dropout in forward() "
            "is not switched off)")


def compare_stats(r: VerifyResult, pairs: list[tuple[str, str, Any, Any]], after: str) -> None:
    """Compare running statistics, ``(torch name, JAX name, JAX value, torch value)`` each,
    as outputs are compared; ``after`` says when (``after the forward pass``)."""
    worst = _Worst()
    for name, where, got, ref in pairs:
        got = np.asarray(got)
        r.compared.append(f"running statistic {name} -> {where} {after}")
        worst.add(f"running statistic {name} {after}",
                  compare_arrays(got, np.asarray(ref).reshape(got.shape), r.atol, r.rtol))
    if pairs:
        r.stats_max_abs_diff, r.stats_max_rel_diff = worst.abs, worst.rel
    r.passed = r.passed and worst.ok
    r.mismatch = r.mismatch or worst.first_failure


def torch_stats(model: Any) -> dict[str, np.ndarray]:
    return {n: torch_to_numpy(b).copy() for n, b in model.named_buffers() if is_running_stat(n)}


def torch_grads(model: Any, inputs: list[Any], cotangents: dict[str, np.ndarray],
                 specs: list[InputSpec] | None = None) -> dict:
    import torch

    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        leaves = dict(flatten_output(call_with(model, inputs, specs)))
        total = sum((leaves[k].to(torch.promote_types(leaves[k].dtype, torch.float32))
                     * torch.from_numpy(c)).sum() for k, c in cotangents.items())
        if not isinstance(total, torch.Tensor) or not total.requires_grad:
            raise VerifyError("--grad: no output depends on a trainable parameter")
        total.backward()
    return {
        name: (np.zeros(tuple(p.shape), np.float32) if p.grad is None else torch_to_numpy(p.grad))
        for name, p in model.named_parameters()
    }


def cotangents(torch_leaves: list[tuple[str, Any]], seed: int) -> dict[str, np.ndarray]:
    """A fixed random cotangent per floating output, so the scalar weighs every element."""
    rng = np.random.default_rng(seed + 2)
    return {
        k: rng.standard_normal(v.shape).astype(np.float32)
        for k, v in torch_leaves
        if v is not None and np.issubdtype(v.dtype, np.floating)
    }


@dataclass
class _Worst:
    abs: float = 0.0
    rel: float = 0.0
    ok: bool = True
    first_failure: str | None = None
    shapes_match: bool = True  # False: structure or a shape differs, no gradient comparison

    def add(self, what: str, d: Diff) -> None:
        self.abs = max(self.abs, d.abs)
        self.rel = max(self.rel, d.rel)
        if not d.comparable:
            self.shapes_match = False
        if not d.ok:
            self.ok = False
            self.first_failure = self.first_failure or f"{what}: {d.worst}"


def compare_outputs(
    jax_leaves: list[tuple[str, Any]], torch_leaves: list[tuple[str, Any]], r: VerifyResult
) -> _Worst:
    worst = _Worst()
    jax_paths = [k for k, _ in jax_leaves]
    torch_paths = [k for k, _ in torch_leaves]
    if jax_paths != torch_paths:
        worst.add(
            "output structure",
            Diff(math.inf, math.inf, False, f"jax {jax_paths} vs torch {torch_paths}", False),
        )
        return worst
    for (path, a), (_, b) in zip(jax_leaves, torch_leaves, strict=True):
        r.compared.append(f"{path} {_describe_array(b)}")
        if a is None or b is None:
            if (a is None) != (b is None):
                worst.add(path, Diff(math.inf, math.inf, False, "None on one side only", False))
            continue
        worst.add(path, compare_arrays(a, b, r.atol, r.rtol))
    return worst


def compare_grads(jax_grads: dict, torch_grads: dict, mapping: dict, r: VerifyResult) -> _Worst:
    from torch2jax.weights import apply_layout

    worst = _Worst()
    parts = [(name, m) for name, ms in mapping.items() for m in ms]  # split: one per part
    pairs = []
    for name, m in parts:
        ref = apply_layout(torch_grads[name], m.layout)
        got = jax_grads.get(tuple(m.nnx_path))
        if got is None:
            worst.add(
                f"grad {name}",
                Diff(math.inf, math.inf, False, f"JAX has no gradient for {m.nnx_name}"),
            )
            continue
        if ref.shape != got.shape and ref.size == got.size:
            ref = ref.reshape(got.shape)
        pairs.append((name, m, got, ref))
    scales = {name: _scale(ref) for name, _, _, ref in pairs}
    model_scale = max(scales.values(), default=0.0)
    for name, m, got, ref in pairs:
        d = compare_arrays(got, ref, r.atol * max(1.0, scales[name]), r.rtol)
        if math.isfinite(d.rel):  # relative to the gradient's scale over the whole model
            d = replace(d, rel=d.abs / max(model_scale, r.atol, np.finfo(np.float32).tiny))
        r.compared.append(f"grad {name} -> {m.nnx_name} ({m.layout})")
        worst.add(f"grad {name}", d)
    _note_vanishing_grads(r, scales, model_scale)
    return worst


def _scale(arr: np.ndarray) -> float:
    finite = np.abs(np.asarray(arr, dtype=np.float64))
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) if finite.size else 0.0


GRAD_REL_NOTE = "grad rel: "  # the note on parameters whose gradient is zero up to rounding


# A gradient this small against the model's largest is zero up to the rounding of the backward
# pass (float32: about 1e-7 relative per operation, summed over the batch)
VANISHING = {"float32": 1e-4, "float64": 1e-12}


def _note_vanishing_grads(r: VerifyResult, scales: dict[str, float], model_scale: float) -> None:
    """Name the parameters whose true gradient is zero up to rounding: a bias just before a
    BatchNorm (the batch mean cancels it in training mode). Their own relative error compares
    rounding noise with rounding noise, so ``grad_max_rel_diff`` is taken relative to the
    model's largest gradient instead."""
    limit = VANISHING.get(r.dtype or "float32", 1e-4) * model_scale
    tiny = sorted(name for name, scale in scales.items() if 0.0 < model_scale and scale <= limit)
    if not tiny:
        return
    shown = ", ".join(f"{n} ({scales[n]:.1e})" for n in tiny[:4]) + (
        f" and {len(tiny) - 4} more" if len(tiny) > 4 else "")
    r.notes.append(
        f"{GRAD_REL_NOTE}{len(tiny)} parameter(s) with a gradient that is zero up to "
        f"{r.dtype or 'float32'} rounding against the model's largest ({model_scale:.1e}): "
        f"{shown}; typically a bias just before a BatchNorm in training mode (the batch mean "
        "cancels it). Their own relative error would compare rounding with rounding, so grad "
        "rel is taken against the model's largest gradient")


def widen(tree: Any) -> Any:
    """Every float32 array of a pytree as float64 (under :func:`x64`)."""
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda a: a.astype(jnp.float64) if getattr(
        a, "dtype", None) == jnp.float32 else a, tree)


def _narrow_float(aval: Any) -> bool:
    """A float array type of fewer than 64 bits (float32, bfloat16, float16)."""
    dtype = getattr(aval, "dtype", None)
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return False
    return dtype.kind == "f" and dtype.itemsize < 8 or dtype.name == "bfloat16"


class Float32Inside(VerifyError):
    """The JAX side computes in float32 even with float64 inputs and parameters (JAX's
    ``jax.nn.dot_product_attention`` keeps its softmax in float32): float64 cannot be checked."""


# frames of JAX's tracing machinery, skipped when naming where a float32 cast happens
_TRACING_FILES = ("core.py", "lax.py", "partial_eval.py", "source_info_util.py", "batching.py",
                  "api.py", "pjit.py", "dispatch.py", "linear_util.py", "traceback_util.py",
                  "ad.py", "api_util.py", "util.py", "array_methods.py", "numpy/lax_numpy.py")


# primitives whose float result is exact given exact operands (they move, pick or compare
# values) or whose float32 results are their inner jaxpr's, walked on their own
_EXACT = frozenset({
    "convert_element_type", "iota", "broadcast_in_dim", "reshape", "transpose", "squeeze",
    "expand_dims", "slice", "dynamic_slice", "dynamic_update_slice", "gather", "concatenate",
    "pad", "rev", "select_n", "copy", "copy_p", "neg", "abs", "sign", "max", "min", "floor",
    "ceil", "round", "clamp", "stop_gradient", "reduce_max", "reduce_min", "argmax", "argmin",
    "sort", "split", "device_put", "optimization_barrier", "pjit", "jit", "closed_call",
    "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "cond", "while", "scan", "real", "imag"})


def check_float64(fn: Any, *args: Any) -> None:
    """Raise :class:`Float32Inside` when ``fn(*args)``, traced under x64 with float64 inputs
    and parameters, narrows a float64 value to float32 (or lower) anywhere, or rounds in
    float32 a value it made float32 itself (timm's Fourier position encodings:
    ``mask.cumsum(1, dtype=torch.float32)``, then a division, a power, ``sin``: torch's
    float64 model computes them in float32 as well, on purpose): its result is then
    float32-accurate, and the float64 pass would report that rounding (torch's ``sin`` against
    XLA's, a few float32 ulps) as a difference. An exact float32 value (``arange(n).float()``
    moved, sliced, compared) is not rounding."""
    import jax

    found: list[str] = []

    def where(eqn: Any) -> str:
        frames = list(getattr(eqn.source_info.traceback, "frames", None) or [])
        inner = [f for f in frames if not f.file_name.replace("\\", "/").endswith(_TRACING_FILES)]
        user = [f for f in frames if "site-packages" not in f.file_name]
        parts = [f"{inner[0].function_name}" if inner else eqn.primitive.name]
        if user:
            parts.append(f"called from {Path(user[0].file_name).name}:{user[0].line_num}")
        return " ".join(parts)

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "convert_element_type":
                new = np.dtype(eqn.params.get("new_dtype") or np.float64)
                old = np.dtype(eqn.invars[0].aval.dtype)
                if old == np.float64 and new.kind == "f" and new.itemsize < 8:
                    found.append(where(eqn))
            elif eqn.primitive.name not in _EXACT and any(
                    _narrow_float(v.aval) for v in eqn.outvars):
                found.append(where(eqn))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (list, tuple)) else [value]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    if found:
        places = list(dict.fromkeys(found))
        more = f" and {len(places) - 3} more" if len(places) > 3 else ""
        raise Float32Inside("the JAX side computes in float32 even in float64: "
                            + "; ".join(places[:3]) + more)
