"""Check a converted model against its torch original, numerically.

``verify("models/mlp.py::MLP", inputs=["float32[4,784]"])``:

1. import the torch file, build the model (``torch.manual_seed(seed)`` first), randomise the
   values a fresh model would leave trivial (normalisation running statistics, parameters
   initialised to a constant) so that their transfer is really tested, ``.eval()``;
2. convert the file (or read ``converted=``), import the JAX code, build the same model with
   ``rngs=nnx.Rngs(seed)``, copy the torch ``state_dict`` into it (:mod:`torch2jax.weights`),
   ``.eval()``;
3. run both on the same random inputs (JAX under ``jax.jit``) and compare every output leaf;
4. with ``grad=True``, compare the gradients of ``sum(output * cotangent)`` (a fixed random
   cotangent, the same on both sides) for every parameter, after the same layout transform.

Differences: ``max_abs_diff`` is ``max |jax - torch|``; ``max_rel_diff`` is that difference
relative to the size of the reference, ``max |jax - torch| / max(max |torch|, atol)`` per
compared tensor (then the max over tensors). An element-wise ``|a - b| / |b|`` explodes wherever
torch's output crosses zero and says nothing; the norm-wise ratio stays meaningful, and the
``atol`` floor keeps a tensor that is zero up to rounding (the gradient of a bias that a
normalisation cancels) from reporting float32 noise as a 100% difference. ``passed`` is the
element-wise ``|jax - torch| <= atol + rtol * |torch|`` (numpy's allclose) on every tensor.
Gradients use the same test with ``atol`` scaled by the gradient's own magnitude
(``atol * max(1, max |torch grad|)``): summing a cotangent over thousands of outputs makes
gradients large, and their float32 rounding grows with them. ``grad_max_rel_diff`` is each
parameter's difference relative to the largest gradient of the model (the gradient's scale),
so that a parameter whose true gradient is zero (a bias just before a BatchNorm, whose batch
mean cancels it) does not report rounding noise as a large relative error; such parameters
are named in the notes.

Two passes by default: float32 at ``atol``/``rtol``, then the same comparison in float64
(torch ``.double()``, JAX under ``jax.enable_x64`` with the model's float32 arrays widened) at
``atol64``/``rtol64``, near float64 rounding. A difference that float32 noise hides at 1e-4
(GELU's tanh approximation for the exact one, another LayerNorm eps) is far above float64
rounding, so the second pass fails on it. ``float64=True`` runs the float64 pass only,
``float64=False`` the float32 pass only.

The verdict: where the float64 pass ran, it decides. float32 outside its tolerance with
float64 within is float32 rounding (gradients through 50 layers), and passes with the float64
figures as the evidence; float64 outside fails. Where float64 did not run or could not run,
float32 decides. ``reason`` says which, with the deciding figures.
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from torch2jax.ruleset import RuleSet
from torch2jax.verify.common import (
    ATOL,
    ATOL64,
    GRAD_REL_NOTE,
    RTOL,
    RTOL64,
    Float32Inside,
    PassFigures,
    VerifyError,
    VerifyRequest,
    VerifyResult,
    build_call,
    run_setup,
    stage,
    timed,
)
from torch2jax.verify.load import LoadError, find_name, load_module, split_target
from torch2jax.verify.registry import SIDES
from torch2jax.verify.sides import check_forward
from torch2jax.verify.spec import InputSpec, parse_specs

SUPPORTED_TARGETS = tuple(SIDES)


# --- building -------------------------------------------------------------------------------


def build_torch_model(module: ModuleType, name: str, args: dict | None, build: str | None) -> Any:
    if build is not None:
        code = compile(build_call(build), "<--build>", "eval")
        return eval(code, dict(vars(module)))  # the user's own expression
    return find_name(module, name, module.__file__ or name)(**(args or {}))


def randomise_for_verification(model: Any, seed: int) -> list[str]:
    """Give trivially initialised values random ones, so that their transfer is tested.

    A fresh BatchNorm has mean 0 / var 1 and LayerNorm scale 1 / bias 0 on both sides: a
    converter that dropped or swapped them would still match. Running statistics get
    ``mean ~ U(-0.5, 0.5)``, ``var ~ U(0.5, 1.5)``; every floating parameter whose elements are
    all equal gets ``U(-0.5, 0.5)`` added. Other buffers (masks, tables) stay as constructed.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    notes = []

    def uniform(like: Any, low: float, high: float) -> Any:
        draw = torch.rand(like.shape, generator=gen, dtype=torch.float64)
        return (low + (high - low) * draw).to(like.dtype)

    with torch.no_grad():
        stats = 0
        for mod in model.modules():
            mean, var = getattr(mod, "running_mean", None), getattr(mod, "running_var", None)
            if isinstance(mean, torch.Tensor) and isinstance(var, torch.Tensor):
                mean.copy_(uniform(mean, -0.5, 0.5))
                var.copy_(uniform(var, 0.5, 1.5))
                stats += 1
        constant = 0
        for p in model.parameters():
            if p.is_floating_point() and p.numel() > 0 and bool((p == p.flatten()[0]).all()):
                p.add_(uniform(p, -0.5, 0.5))
                constant += 1
    if stats:
        notes.append(f"randomised the running statistics of {stats} normalisation layers")
    if constant:
        notes.append(f"perturbed {constant} constant-initialised parameters")
    return notes


# --- converting -----------------------------------------------------------------------------


def local_imports(source: str, directory: Path) -> list[Path]:
    """Files under ``directory`` that ``source`` imports absolutely (``import config``,
    ``from layers.attention import X``): the siblings a script run from there would load."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    found: list[Path] = []
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            base = directory.joinpath(*parts[:i])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file() and candidate not in found:
                    found.append(candidate)
    return found


def _convert_file(
    path: Path, jax_target: str, rules: RuleSet | None, known_modules: set[str] | None = None,
    public: set[str] | None = None, files_to: Path | None = None,
) -> tuple[str, int]:
    try:
        from torch2jax.convert import convert_source
    except ImportError as exc:
        raise VerifyError(f"the converter is not available: {exc}") from None
    with stage(f"converting {path}"):
        extra = {"known_modules": known_modules} if known_modules else {}
        if files_to is None:  # a package's own file (a mirror package): nothing to follow
            extra["follow_packages"] = False
        out = convert_source(path.read_text(), path=str(path), target=jax_target, rules=rules,
                             public=public, **extra)
    for rel, code in getattr(out, "files", {}).items():  # an installed package's model code
        assert files_to is not None
        (files_to / rel).parent.mkdir(parents=True, exist_ok=True)
        (files_to / rel).write_text(code)
    return out.code, sum(1 for d in out.diagnostics if d.severity == "error")


def convert_tree(path: Path, out_dir: Path, jax_target: str, rules: RuleSet | None,
                 entry: Collection[str] = (), model_types: Collection[str] = ()) -> int:
    """Convert ``path`` and the local modules it imports (transitively) into ``out_dir``,
    keeping their relative paths, so that the converted model imports converted siblings.
    Returns the number of untranslated constructs (TODOs) over all of them. ``entry``: the
    classes of ``path`` the verifier builds and calls (they keep torch's layout);
    ``model_types``: the transformers model types of the model built (its sub-models that
    ``AutoModel.from_config`` builds are converted too)."""
    from torch2jax.verify.package import convert_package_file, package_of

    if package_of(path) is not None:  # a package's module: a mirror package (verify/package.py)
        # (which classes the package's other modules import is not indexed: all keep NCHW)
        return convert_package_file(
            path, out_dir, lambda f, known: _convert_file(f, jax_target, rules, known),
            set(entry) or None, model_types=set(model_types))[1]
    from torch2jax.repo import import_closure, index_repository
    from torch2jax.ruleset import load_rules

    root = path.parent.resolve()
    # module classes defined in the sibling files (cross-file subclasses), as `convert` knows
    closure = [f for f in import_closure([path]) if f.is_relative_to(root)]
    repo = index_repository(closure, (rules or load_rules()).layers)
    queue, seen, todos = [path.resolve(), *closure], set(), 0
    while queue:
        file = queue.pop()
        if file in seen:
            continue
        seen.add(file)
        public = repo.exported_from(file) | (set(entry) if file == path.resolve() else set())
        target = out_dir / file.relative_to(root)
        code, n = _convert_file(file, jax_target, rules, repo.known_for(file) or None, public,
                                files_to=target.parent)
        todos += n
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
        with stage(f"reading the imports of {file}"):
            queue += local_imports(file.read_text(), root)
    return todos


def entry_classes(name: str, build: str | None) -> set[str]:
    """The classes the verifier builds: the target's, and any the ``--build`` expression
    names."""
    return {name, *re.findall(r"[A-Za-z_]\w*", build or "")}


def converted_location(path: Path, out_dir: Path) -> Path:
    """Where :func:`convert_tree` put the conversion of ``path``."""
    from torch2jax.verify.package import package_of

    found = package_of(path)
    if found is None:
        return out_dir / path.name
    mirrors = sorted(out_dir.glob(found[1].split(".")[0] + "_jax_*"))
    rel = found[1].split(".")[1:]
    base = mirrors[-1].joinpath(*rel)
    return base / "__init__.py" if path.name == "__init__.py" else base.with_suffix(".py")


def _converted_todos(converted: str) -> int:
    conv = Path(converted)
    if not conv.is_file():
        raise VerifyError(f"{conv}: no such file (--converted)")
    return conv.read_text().count("TODO(torch2jax)")


# --- the entry point --------------------------------------------------------------------------


def verify(
    target: str,
    *,
    args: dict | None = None,
    build: str | None = None,
    inputs: list[str] | tuple[str, ...] = (),
    jax_target: str = "nnx",
    grad: bool = True,
    atol: float = ATOL,
    rtol: float = RTOL,
    seed: int = 0,
    device: str | None = None,
    converted: str | None = None,
    rules: RuleSet | None = None,
    benchmark: bool = False,
    train_mode: bool = False,
    float64: bool | None = None,
    atol64: float = ATOL64,
    rtol64: float = RTOL64,
    setup: str | None = None,
    input_exprs: list[str] | tuple[str, ...] = (),
) -> VerifyResult:
    """Verify ``FILE.py::Name`` against its conversion; never raises for a model's faults.

    ``error`` is set (and ``passed`` False) when the comparison could not run at all: missing
    file or name, conversion or import failure, a constructor or forward pass that raises,
    weights that do not fit. Otherwise ``passed`` says whether the numbers agree and
    ``mismatch`` names the worst offender. ``rules`` (default: the built-in rules, see
    :func:`torch2jax.ruleset.load_rules`) decide the weight layouts. ``grad`` (default on)
    also compares the gradient of every parameter. ``train_mode`` runs both models in
    training mode (dropout-like modules deterministic) and also compares the BatchNorm running
    statistics that the forward pass updated.

    ``float64``: by default (None) the comparison runs in float32 at ``atol``/``rtol``, then
    again in float64 (float32 inputs and parameters widened) at ``atol64``/``rtol64``,
    wherever both sides support it (the model's parameters are float32, the device is not a
    TPU); ``passes`` holds both passes' figures. The float64 pass catches what float32 noise
    hides (GELU's approximation, an eps) and tells float32 rounding (a pre-activation on the
    other side of a ReLU, say) from a translation error. ``True`` runs the float64 pass only,
    ``False`` the float32 pass only.

    ``setup``: Python statements (or a ``.py`` file's path) run in the torch file's namespace
    before the model is built, and again in the converted file's; the build expression, the
    input expressions and the model's own code see the names it binds. ``input_exprs``: more
    inputs to the forward pass, ``EXPR`` (positional, after the specs' positional inputs) or
    ``NAME=EXPR`` (keyword), each evaluated on each side in its file's namespace with
    ``model`` bound to that side's built model (``hidden=model.init_hidden(2)``); both sides'
    values must agree. NNX target only.
    """
    req = VerifyRequest(
        target, args, build, tuple(inputs), jax_target, grad, atol, rtol, seed, device,
        converted, rules, benchmark, train_mode, float64, atol64, rtol64, setup,
        tuple(input_exprs),
    )  # fmt: skip
    return run_request(req)


def run_request(req: VerifyRequest) -> VerifyResult:
    only64 = req.float64 is True
    result = VerifyResult(model=req.target, target=req.jax_target,
                          atol=req.atol64 if only64 else req.atol,
                          rtol=req.rtol64 if only64 else req.rtol,
                          mode="train" if req.train_mode else "eval")
    with tempfile.TemporaryDirectory(prefix="torch2jax-verify-") as tmp:
        source = _JaxSource(req, Path(tmp))
        try:
            _verify(result, replace(req, float64=only64), source)
        except (VerifyError, LoadError, ValueError) as exc:
            result.error = str(exc)
            result.passed = False
        result.passes.append(PassFigures.of(result))
        if req.float64 is None:
            _float64_pass(result, req, source)
    if result.error is None and not result.passed and req.float64 is False and math.isfinite(
            result.max_abs_diff or 0.0) and result.dtype == "float32":
        result.notes.append("the numbers differ in float32: if they agree in float64 (the "
                            "default, without --no-float64), the difference is float32 "
                            "rounding (a value at a ReLU's kink, say), not the translation "
                            "(docs/verification.md)")
    if result.error is None and result.reason is None:
        result.reason = _single_pass_reason(result, req)
    if result.todos and not result.passed:
        hint = "fix them and pass the edited file as converted= (--converted)"
        result.notes.append(f"the conversion left {result.todos} TODO(torch2jax) markers: {hint}")
    return result


def _float64_skip(r: VerifyResult) -> str | None:
    """Why the default float64 pass does not run after the float32 pass ``r``, or None."""
    if r.error is not None:
        return "the float32 comparison could not run"
    if r.dtype != "float32":
        return f"the model's parameters are {r.dtype}, not float32"
    if r.device == "tpu":
        return "TPUs do not compute in float64"
    if not math.isfinite(r.max_abs_diff if r.max_abs_diff is not None else math.inf):
        return "the outputs differ in structure, shape or finiteness"
    return None


def _float64_pass(result: VerifyResult, req: VerifyRequest, source: _JaxSource) -> None:
    """The default second pass in float64, folded into ``result`` (:func:`run_request`)."""
    skip = _float64_skip(result)
    if skip is not None:
        result.float64_skipped = skip
        if result.error is None:
            result.notes.append(f"float64 pass not run: {skip}")
        return
    r64 = VerifyResult(model=req.target, target=req.jax_target, atol=req.atol64,
                       rtol=req.rtol64, mode=result.mode)
    try:
        _verify(r64, replace(req, float64=True, benchmark=False), source)
    except Float32Inside as exc:
        result.float64_skipped = str(exc)
        result.notes.append(f"float64 pass not run: {exc}")
        return
    except (VerifyError, LoadError, ValueError) as exc:
        r64.error, r64.passed = str(exc), False
    result.passes.append(PassFigures.of(r64))
    result.notes += [f"float64 pass: {n}" for n in r64.notes if n not in result.notes
                     and not n.startswith(GRAD_REL_NOTE)]  # the float32 pass names them
    if r64.error is not None:  # the float32 comparison ran: its verdict stands
        result.notes.append(f"the float64 pass could not run ({r64.error}); the verdict is "
                            "the float32 comparison's")
        return
    f32 = result.passes[0]
    if f32.passed and r64.passed:
        result.reason = (f"float32 and float64 agree within their tolerances "
                         f"({_figures(f32)}; {_figures(r64)})")
    elif f32.passed:
        result.notes.append(
            "float32 agrees within its tolerance but float64 does not: a difference below "
            "float32 noise, such as a default that differs (GELU's approximation, an eps, a "
            "momentum), or a computation the model does in float32 on purpose (then "
            "--no-float64) (docs/verification.md)")
        result.reason = (f"float64 differs ({_figures(r64)}, beyond atol64 {_tol(r64.atol)} "
                         f"rtol64 {_tol(r64.rtol)}) although float32 agrees ({_figures(f32)}): "
                         "a difference below float32 noise, the translation computes "
                         "something else")
    elif r64.passed:
        result.notes.append(
            "float32 differs but float64 agrees to float64 rounding: the float32 difference "
            "is rounding (a value at a ReLU's kink, say), not the translation "
            "(docs/verification.md)")
        result.reason = (f"float32 rounding: float32 is outside its tolerance ({_figures(f32)}"
                         f", atol {_tol(f32.atol)} rtol {_tol(f32.rtol)}) but float64 agrees "
                         f"({_figures(r64)}, within atol64 {_tol(r64.atol)} rtol64 "
                         f"{_tol(r64.rtol)}): the float64 figures are the evidence that the "
                         "translation computes what torch computes")
    else:
        result.notes.append("float64 differs as well: not float32 rounding, the two models "
                            "compute different things")
        result.reason = (f"float64 differs as well ({_figures(r64)}, beyond atol64 "
                         f"{_tol(r64.atol)} rtol64 {_tol(r64.rtol)}): not float32 rounding, "
                         "the two models compute different things")
    # float64 decides: a right translation agrees there to float64 rounding whatever float32
    # rounding did through a deep network, and a wrong one differs there
    result.passed = r64.passed
    if result.passed:  # float32's worst tensor stays in passes[0].mismatch
        result.mismatch = None
    elif not result.mismatch:
        result.mismatch = f"float64: {r64.mismatch}"


def _figures(p: PassFigures | VerifyResult) -> str:
    """``float32 out rel 1.2e-07, grad rel 6.0e-04``: one pass's relative figures."""
    parts = [f"{p.dtype or 'float32'} out rel {_num(p.max_rel_diff)}"]
    if p.grad_max_rel_diff is not None:
        parts.append(f"grad rel {_num(p.grad_max_rel_diff)}")
    if p.stats_max_rel_diff is not None:
        parts.append(f"stats rel {_num(p.stats_max_rel_diff)}")
    return ", ".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _tol(value: float) -> str:
    return f"{value:.0e}" if value else "0"


def _single_pass_reason(result: VerifyResult, req: VerifyRequest) -> str:
    """The verdict's reason when one pass decided: float64 only (--float64), float32 only
    (--no-float64), or float32 because the float64 pass was not run or could not run."""
    p = result.passes[0] if result.passes else PassFigures.of(result)
    within = "within" if result.passed else "outside"
    tol = "atol64" if p.dtype == "float64" else "atol"
    line = (f"{p.dtype} is {within} its tolerance ({_figures(p)}, {tol} {_tol(p.atol)} "
            f"r{tol[1:]} {_tol(p.rtol)})")
    if p.dtype == "float64":
        return line + " (--float64: the float64 pass only)"
    if req.float64 is False:
        why = "--no-float64"
    elif result.float64_skipped:
        why = f"float64 not run: {result.float64_skipped}"
    else:
        failed = next((q for q in result.passes[1:] if q.error), None)
        why = f"float64 could not run: {failed.error.splitlines()[0]}" if failed else ""
    if not result.passed:
        line += (f"; float64 cannot tell rounding from a mistranslation here, so {p.dtype} "
                 "decides")
    return f"{line} ({why})" if why else line


class _JaxSource:
    """The JAX file to verify: ``--converted``, or the conversion (made once, in ``tmp``, and
    shared by the float32 and float64 passes)."""

    def __init__(self, req: VerifyRequest, tmp: Path) -> None:
        self.req, self.tmp = req, tmp
        self.done: tuple[Path, int] | None = None

    def get(self, path: Path, name: str, torch_model: Any = None) -> tuple[Path, int]:
        """``(the JAX file, its TODO count)``. ``torch_model``: the model built, whose
        sub-models' configs name the model types that ``AutoModel.from_config`` builds."""
        req = self.req
        if self.done is None:
            if req.converted is not None:
                self.done = Path(req.converted), _converted_todos(req.converted)
            else:  # same file names, so that tracebacks read like the user's files
                types = {t for mod in getattr(torch_model, "modules", list)() if isinstance(
                    t := getattr(getattr(mod, "config", None), "model_type", None), str) and t}
                todos = convert_tree(path, self.tmp, req.jax_target, req.rules,
                                     entry_classes(name, req.build), types)
                self.done = converted_location(path, self.tmp), todos
        return self.done


def _check_request(req: VerifyRequest) -> tuple[Path, str, list[InputSpec]]:
    if req.jax_target not in SIDES:
        raise VerifyError(
            f"--target {req.jax_target}: verify supports {', '.join(SUPPORTED_TARGETS)}"
        )
    if req.args is not None and req.build is not None:
        raise VerifyError("give either args (--args) or a build expression (--build), not both")
    specs = parse_specs(req.inputs, req.input_exprs)
    if any(s.name for s in specs) and not SIDES[req.jax_target].keyword_inputs:
        raise VerifyError("NAME=SPEC (keyword) inputs are verified with the nnx target only")
    if req.input_exprs and not SIDES[req.jax_target].keyword_inputs:
        raise VerifyError("--input-expr inputs are verified with the nnx target only")
    if not specs:
        raise VerifyError("no inputs: give at least one --input SPEC, e.g. float32[2,3,32,32]")
    path, name = split_target(req.target)
    if not path.is_file():
        raise VerifyError(f"{path}: no such file")
    return path, name, specs


def build_torch_side(r: Any, req: VerifyRequest
                     ) -> tuple[Path, str, list[InputSpec], Any, ModuleType]:
    """Check the request, import the torch file (then run ``--setup`` in it) and build its
    model with randomised statistics (seeded): ``(path, name, input specs, model, the torch
    module)``. Also used by trajectories."""
    import torch

    path, name, specs = _check_request(req)
    if req.float64:
        specs = [replace(s, dtype="float64") if s.dtype == "float32" else s for s in specs]
    torch_module = load_module(path)
    run_setup(vars(torch_module), req.setup, "torch")
    if req.build is None:
        find_name(torch_module, name, path)
    with stage("building the torch model"):
        torch.manual_seed(req.seed)
        torch_model = build_torch_model(torch_module, name, req.args, req.build)
        r.notes += randomise_for_verification(torch_model, req.seed)
    if req.float64:
        torch_model.double()
        r.notes.append("float64 on both sides: torch .double(), JAX with x64 enabled and "
                       "every float32 array of the model widened")
    r.dtype = _param_dtype(torch_model)
    return path, name, specs, torch_model, torch_module


def _verify(r: VerifyResult, req: VerifyRequest, source: _JaxSource) -> None:
    """One pass: float64 when ``req.float64``, else float32."""
    path, name, specs, torch_model, torch_module = build_torch_side(r, req)
    torch_model.eval()
    jax_path, r.todos = source.get(path, name, torch_model)
    with _device(req.device) as platform, x64(bool(req.float64)):
        r.device = platform
        with timed("importing the converted file"):
            module = load_converted(jax_path, name, req.build, req.setup)
        check_forward(SIDES[req.jax_target], r, req, module, name, torch_model, specs,
                      vars(torch_module))


def _param_dtype(model: Any) -> str:
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return "float32"


@contextlib.contextmanager
def x64(enabled: bool) -> Iterator[None]:
    """JAX with 64-bit types (``jax.enable_x64``) inside, when ``enabled``, and torch's
    default float type float64 to match: a float made without a dtype (``torch.arange(n) *
    -emb``, ``jnp.arange(n) * -emb``) is float64 on both sides, as it is float32 on both in
    the float32 pass."""
    if not enabled:
        yield
        return
    import jax
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with jax.enable_x64(True):
            yield
    finally:
        torch.set_default_dtype(before)


@contextlib.contextmanager
def _device(device: str | None) -> Iterator[str]:
    """Run the JAX side on ``device`` (default: JAX's default backend) at full float32 matmul
    and convolution precision. On GPUs JAX's default precision lets float32 matmuls and
    convolutions run in TF32 (relative error about 1e-3) while torch's CPU reference is exact
    float32; the comparison checks the translation, so both sides compute in float32. The
    converted code itself keeps JAX's default (docs/verification.md)."""
    import jax

    with jax.default_matmul_precision("highest"):
        if device is None:
            yield jax.default_backend()
            return
        try:
            dev = jax.devices({"cuda": "gpu"}.get(device, device))[0]
        except RuntimeError as exc:
            raise VerifyError(f"--device {device}: not available to JAX ({exc})") from None
        with jax.default_device(dev):
            yield dev.platform


def load_converted(jax_path: Path, name: str, build: str | None, setup: str | None = None
                   ) -> ModuleType:
    """The converted module (``--setup`` run in it), checked to define ``name`` when the
    model is built by name."""
    jax_module = load_module(jax_path, prefix="torch2jax_verify_jax")
    run_setup(vars(jax_module), setup, "JAX")
    if build is None:
        find_name(jax_module, name, jax_path)
    return jax_module
