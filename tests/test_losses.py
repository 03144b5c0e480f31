"""Loss functions: every loss and option, converted and run against torch.

Each case is a tiny torch snippet in two forms, ``loss = F.<fn>(a, b, <opts>)`` and
``crit = nn.<Loss>(<opts>); loss = crit(a, b)``. It is converted with ``convert_source``, the
converted code is executed with JAX arrays, and the number (or the unreduced array) must match
torch's within 1e-6 relative / 1e-6 absolute. The converted code must contain no ``torch`` and
no TODO. Options the converter cannot translate faithfully must leave a TODO, not code.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("optax")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from torch2jax.convert import convert_source

PRELUDE = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
RTOL = ATOL = 1e-6

Inputs = Callable[[np.random.Generator], dict[str, np.ndarray]]


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def _softmax(z: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def classes(shape=(6, 5), ignore=None, weight=False, probs=False) -> Inputs:
    """Logits of ``shape`` (class axis 1), integer labels (some equal to ``ignore``), an
    optional per-class weight; ``probs``: probability targets instead of labels."""
    def make(rng):
        n, c, *rest = shape
        out = {"a": rng.standard_normal(shape).astype(np.float32)}
        if probs:
            out["b"] = _softmax(rng.standard_normal(shape), 1).astype(np.float32)
        else:
            y = rng.integers(0, c, (n, *rest))
            if ignore is not None:
                flat = y.reshape(-1)
                flat[::3] = ignore  # some ignored, never all
            out["b"] = y.astype(np.int64)
        if weight:
            out["w"] = rng.uniform(0.2, 3.0, (c,)).astype(np.float32)
        return out
    return make


def log_probs(shape=(6, 5), ignore=None, weight=False) -> Inputs:
    def make(rng):
        out = classes(shape, ignore, weight)(rng)
        out["a"] = np.log(_softmax(out["a"].astype(np.float64), 1)).astype(np.float32)
        return out
    return make


def regression(shape=(4, 3), weight=False) -> Inputs:
    def make(rng):
        out = {"a": 2 * rng.standard_normal(shape).astype(np.float32),
               "b": 2 * rng.standard_normal(shape).astype(np.float32)}
        if weight:
            out["w"] = rng.uniform(0.2, 3.0, shape).astype(np.float32)
        return out
    return make


def probabilities(shape=(4, 3), weight=None) -> Inputs:
    """BCE: probabilities with exact 0 and 1 (torch clamps the logs at -100), soft targets."""
    def make(rng):
        p = rng.uniform(0.01, 0.99, shape).astype(np.float32)
        p.reshape(-1)[:2] = (0.0, 1.0)
        out = {"a": p, "b": rng.uniform(0, 1, shape).astype(np.float32)}
        if weight is not None:
            out["w"] = rng.uniform(0.2, 3.0, weight).astype(np.float32)
        return out
    return make


def logits(shape=(4, 3), weight=None, pos_weight=None) -> Inputs:
    def make(rng):
        out = {"a": 3 * rng.standard_normal(shape).astype(np.float32),
               "b": rng.uniform(0, 1, shape).astype(np.float32)}
        if weight is not None:
            out["w"] = rng.uniform(0.2, 3.0, weight).astype(np.float32)
        if pos_weight is not None:
            out["pw"] = rng.uniform(0.2, 3.0, pos_weight).astype(np.float32)
        return out
    return make


def distributions(shape=(4, 5), log_target=False) -> Inputs:
    def make(rng):
        t = _softmax(rng.standard_normal(shape), 1)
        t.reshape(-1)[0] = 0.0  # 0 * log 0 = 0
        out = {"a": np.log(_softmax(rng.standard_normal(shape), 1)).astype(np.float32),
               "b": (np.log(t + 1e-3) if log_target else t).astype(np.float32)}
        return out
    return make


# --------------------------------------------------------------------------------------------
# the table: (functional name, module name, options, inputs)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    fn: str
    module: str | None  # None: functional-only option (e.g. mse_loss weight=)
    opts: str
    inputs: Inputs = field(compare=False)
    target: str = "b"  # the target expression (probability targets: F.softmax(b, dim=1))
    functional: bool = True  # False: a computed option only the module form binds once


CE, NLL = "cross_entropy", "nll_loss"
CASES = [
    # cross_entropy
    Case("ce", CE, "CrossEntropyLoss", "", classes()),
    Case("ce-NCd", CE, "CrossEntropyLoss", "", classes((3, 5, 4))),
    Case("ce-NCdd", CE, "CrossEntropyLoss", "", classes((2, 4, 3, 2))),
    Case("ce-sum", CE, "CrossEntropyLoss", "reduction='sum'", classes()),
    Case("ce-none", CE, "CrossEntropyLoss", "reduction='none'", classes((3, 5, 4))),
    Case("ce-ignore", CE, "CrossEntropyLoss", "ignore_index=1", classes(ignore=1)),
    Case("ce-ignore-NCd", CE, "CrossEntropyLoss", "ignore_index=2", classes((3, 5, 4), ignore=2)),
    Case("ce-ignore-100", CE, "CrossEntropyLoss", "ignore_index=-100", classes(ignore=-100)),
    Case("ce-ignore-none", CE, "CrossEntropyLoss", "ignore_index=-100, reduction='none'",
         classes(ignore=-100)),
    Case("ce-ignore-sum", CE, "CrossEntropyLoss", "ignore_index=0, reduction='sum'",
         classes(ignore=0)),
    Case("ce-weight", CE, "CrossEntropyLoss", "weight=w", classes(weight=True)),
    Case("ce-weight-NCd", CE, "CrossEntropyLoss", "weight=w", classes((3, 5, 4), weight=True)),
    Case("ce-weight-none", CE, "CrossEntropyLoss", "weight=w, reduction='none'",
         classes(weight=True)),
    Case("ce-weight-ignore", CE, "CrossEntropyLoss", "weight=w, ignore_index=3",
         classes(ignore=3, weight=True)),
    Case("ce-smooth", CE, "CrossEntropyLoss", "label_smoothing=0.1", classes()),
    Case("ce-smooth-NCd", CE, "CrossEntropyLoss", "label_smoothing=0.25", classes((3, 5, 4))),
    Case("ce-smooth-ignore", CE, "CrossEntropyLoss", "ignore_index=-100, label_smoothing=0.1",
         classes(ignore=-100)),
    Case("ce-smooth-weight", CE, "CrossEntropyLoss", "weight=w, label_smoothing=0.2",
         classes(weight=True)),
    Case("ce-all", CE, "CrossEntropyLoss", "weight=w, ignore_index=1, label_smoothing=0.1",
         classes((3, 5, 4), ignore=1, weight=True)),
    Case("ce-all-none", CE, "CrossEntropyLoss",
         "weight=w, ignore_index=1, reduction='none', label_smoothing=0.1",
         classes(ignore=1, weight=True)),
    Case("ce-all-sum", CE, "CrossEntropyLoss",
         "weight=w, ignore_index=1, reduction='sum', label_smoothing=0.1",
         classes(ignore=1, weight=True)),
    Case("ce-weight-literal", CE, "CrossEntropyLoss",
         "weight=torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0])", classes(), functional=False),
    Case("ce-positional", CE, None, "w, None, 1", classes(ignore=1, weight=True)),
    Case("ce-legacy-sum", CE, "CrossEntropyLoss", "size_average=False", classes()),
    Case("ce-legacy-none", CE, "CrossEntropyLoss", "reduce=False", classes()),
    Case("ce-probs", CE, None, "", classes(probs=True), "F.softmax(b, dim=1)"),
    Case("ce-probs-NCd", CE, None, "", classes((3, 5, 4), probs=True), "F.softmax(b, dim=1)"),
    Case("ce-probs-smooth", CE, None, "label_smoothing=0.2", classes(probs=True),
         "F.softmax(b, dim=1)"),
    Case("ce-probs-weight-smooth-NCd", CE, None, "weight=w, label_smoothing=0.2",
         classes((3, 5, 4), weight=True, probs=True), "F.softmax(b, dim=1)"),
    Case("ce-probs-none", CE, None, "reduction='none'", classes(probs=True),
         "b.float()"),
    # nll_loss
    Case("nll", NLL, "NLLLoss", "", log_probs()),
    Case("nll-NCd", NLL, "NLLLoss", "", log_probs((3, 5, 4))),
    Case("nll-none", NLL, "NLLLoss", "reduction='none'", log_probs((3, 5, 4))),
    Case("nll-sum", NLL, "NLLLoss", "reduction='sum'", log_probs()),
    Case("nll-ignore", NLL, "NLLLoss", "ignore_index=-100", log_probs(ignore=-100)),
    Case("nll-weight", NLL, "NLLLoss", "weight=w", log_probs(weight=True)),
    Case("nll-weight-ignore-NCd", NLL, "NLLLoss", "weight=w, ignore_index=2",
         log_probs((3, 5, 4), ignore=2, weight=True)),
    Case("nll-weight-ignore-none", NLL, "NLLLoss", "weight=w, ignore_index=2, reduction='none'",
         log_probs(ignore=2, weight=True)),
    # regression
    Case("mse", "mse_loss", "MSELoss", "", regression()),
    Case("mse-sum", "mse_loss", "MSELoss", "reduction='sum'", regression()),
    Case("mse-none", "mse_loss", "MSELoss", "reduction='none'", regression()),
    Case("mse-legacy", "mse_loss", "MSELoss", "size_average=False, reduce=True", regression()),
    Case("mse-weight", "mse_loss", None, "weight=w", regression(weight=True)),
    Case("l1", "l1_loss", "L1Loss", "", regression()),
    Case("l1-none", "l1_loss", "L1Loss", "reduction='none'", regression()),
    Case("l1-weight-sum", "l1_loss", None, "reduction='sum', weight=w", regression(weight=True)),
    Case("l1-weight", "l1_loss", None, "weight=w", regression(weight=True)),
    Case("smoothl1", "smooth_l1_loss", "SmoothL1Loss", "", regression()),
    Case("smoothl1-beta", "smooth_l1_loss", "SmoothL1Loss", "beta=0.5", regression()),
    Case("smoothl1-beta-none", "smooth_l1_loss", "SmoothL1Loss", "reduction='none', beta=2.5",
         regression()),
    Case("smoothl1-beta0", "smooth_l1_loss", "SmoothL1Loss", "beta=0.0", regression()),
    Case("smoothl1-beta-sum", "smooth_l1_loss", "SmoothL1Loss", "reduction='sum', beta=0.3",
         regression()),
    Case("huber", "huber_loss", "HuberLoss", "", regression()),
    Case("huber-delta", "huber_loss", "HuberLoss", "delta=0.5", regression()),
    Case("huber-delta-none", "huber_loss", "HuberLoss", "reduction='none', delta=2.0",
         regression()),
    Case("huber-weight", "huber_loss", None, "delta=0.5, weight=w", regression(weight=True)),
    # binary cross-entropy
    Case("bce", "binary_cross_entropy", "BCELoss", "", probabilities()),
    Case("bce-none", "binary_cross_entropy", "BCELoss", "reduction='none'", probabilities()),
    Case("bce-weight", "binary_cross_entropy", "BCELoss", "weight=w", probabilities(weight=(3,))),
    Case("bce-weight-sum", "binary_cross_entropy", "BCELoss", "weight=w, reduction='sum'",
         probabilities(weight=(4, 3))),
    Case("bcel", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss", "", logits()),
    Case("bcel-none", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss", "reduction='none'",
         logits()),
    Case("bcel-weight", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss", "weight=w",
         logits(weight=(4, 3))),
    Case("bcel-posweight", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss",
         "pos_weight=pw", logits(pos_weight=(3,))),
    Case("bcel-posweight-weight-sum", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss",
         "weight=w, reduction='sum', pos_weight=pw", logits(weight=(3,), pos_weight=(3,))),
    Case("bcel-posweight-literal", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss",
         "pos_weight=torch.tensor([3.0])", logits()),
    Case("bcel-weight-literal", "binary_cross_entropy_with_logits", "BCEWithLogitsLoss",
         "weight=torch.tensor([1.0, 2.0, 0.5])", logits()),
    # KL divergence
    Case("kl-mean", "kl_div", "KLDivLoss", "", distributions()),
    Case("kl-batchmean", "kl_div", "KLDivLoss", "reduction='batchmean'", distributions()),
    Case("kl-batchmean-3d", "kl_div", "KLDivLoss", "reduction='batchmean'",
         distributions((3, 5, 2))),
    Case("kl-sum", "kl_div", "KLDivLoss", "reduction='sum'", distributions()),
    Case("kl-none", "kl_div", "KLDivLoss", "reduction='none'", distributions()),
    Case("kl-logtarget", "kl_div", "KLDivLoss", "reduction='batchmean', log_target=True",
         distributions(log_target=True)),
    Case("kl-logtarget-mean", "kl_div", "KLDivLoss", "log_target=True",
         distributions(log_target=True)),
    Case("kl-legacy", "kl_div", "KLDivLoss", "size_average=False", distributions()),
]


def _params(case: Case) -> str:
    return ", ".join(case.inputs(np.random.default_rng(0)))


def _functional(case: Case) -> str:
    opts = f", {case.opts}" if case.opts else ""
    return PRELUDE + (f"\n\ndef f({_params(case)}):\n"
                      f"    return F.{case.fn}(a, {case.target}{opts})\n")


def _module(case: Case) -> str:
    return PRELUDE + (f"\n\ndef f({_params(case)}):\n"
                      f"    crit = nn.{case.module}({case.opts})\n"
                      f"    return crit(a, {case.target})\n")


def _sources(case: Case) -> dict[str, str]:
    out = {"F": _functional(case)} if case.functional else {}
    if case.module:
        out["nn"] = _module(case)
    return out


def _forms() -> list:
    return [pytest.param(case, form, id=f"{form}-{case.id}")
            for case in CASES for form in _sources(case)]


# --------------------------------------------------------------------------------------------
# running both sides
# --------------------------------------------------------------------------------------------


@functools.cache
def _convert(source: str):
    return convert_source(source, path="<loss>")


def _converted_code(source: str) -> str:
    result = _convert(source)
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors) + "\n" + result.code
    assert "torch" not in result.code, result.code
    assert "TODO" not in result.code, result.code
    return result.code


def _run_torch(source: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    ns: dict = {}
    exec(compile(source, "<torch>", "exec"), ns)  # noqa: S102 - the test's own snippet
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kl_div 'mean', legacy size_average
        out = ns["f"](**{k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
    return out.detach().numpy()


def _jax_fn(code: str) -> Callable:
    ns: dict = {}
    exec(compile(code, "<jax>", "exec"), ns)  # noqa: S102 - converted snippet
    return ns["f"]


def _run_jax(codes: list[str], arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The converted ``f``s under one ``jax.jit`` (as they are used; one compilation)."""
    fns = [_jax_fn(code) for code in codes]
    out = jax.jit(lambda kw: [f(**kw) for f in fns])({k: jnp.asarray(v)
                                                       for k, v in arrays.items()})
    return [np.asarray(o) for o in out]


def _assert_close(got: np.ndarray, want: np.ndarray, code: str) -> None:
    assert got.shape == want.shape, f"shape jax {got.shape} vs torch {want.shape}\n{code}"
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=RTOL,
                               atol=ATOL, err_msg=code)


def _compare(source: str, arrays: dict[str, np.ndarray]) -> None:
    code = _converted_code(source)
    _assert_close(_run_jax([code], arrays)[0], _run_torch(source, arrays), code)


@functools.cache
def _case_results(case: Case) -> dict[str, tuple[str, np.ndarray | Exception]]:
    """Both forms of a case, run under one jit: form -> (code, result or conversion error)."""
    arrays = case.inputs(np.random.default_rng(0))
    codes: dict[str, str] = {}
    out: dict[str, tuple[str, np.ndarray | Exception]] = {}
    for form, source in _sources(case).items():
        try:
            codes[form] = _converted_code(source)
        except AssertionError as exc:
            out[form] = ("", exc)
    for form, got in zip(codes, _run_jax(list(codes.values()), arrays)):
        out[form] = (codes[form], got)
    return out


@pytest.mark.parametrize(("case", "form"), _forms())
def test_loss_matches_torch(case: Case, form: str) -> None:
    code, got = _case_results(case)[form]
    if isinstance(got, Exception):
        raise got
    source = _sources(case)[form]
    _assert_close(got, _run_torch(source, case.inputs(np.random.default_rng(0))), code)


# --------------------------------------------------------------------------------------------
# notes, the emitted forms, and loss modules inside a class
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "loss = F.cross_entropy(a, b)", "loss = F.nll_loss(a, b)",
    "crit = nn.CrossEntropyLoss(label_smoothing=0.1)",
])
def test_default_ignore_index_is_reported(source: str) -> None:
    result = _convert(PRELUDE + source + "\n")
    notes = [d.message for d in result.diagnostics if d.severity == "info"]
    assert any("-100" in n and "not ignored" in n for n in notes), notes


def test_simplest_form_without_options() -> None:
    code = _converted_code(PRELUDE + "loss = F.cross_entropy(logits, y)\n")
    assert "loss = optax.softmax_cross_entropy_with_integer_labels(logits, y, axis=1).mean()" \
        in code
    assert "import optax" in code
    assert "where" not in code and "one_hot" not in code


def test_no_masking_without_ignore_index_or_weight() -> None:
    code = _converted_code(PRELUDE + "loss = F.cross_entropy(x, y, label_smoothing=0.1)\n")
    assert "where" not in code and "!=" not in code


def test_mse_is_not_l2_loss() -> None:
    code = _converted_code(PRELUDE + "loss = F.mse_loss(a, b)\n")
    assert "optax.squared_error" in code and "l2_loss" not in code


def test_loss_module_in_a_class_gets_no_rngs_and_runs() -> None:
    source = PRELUDE + (
        "\n\nclass M(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.criterion = nn.CrossEntropyLoss(ignore_index=1, label_smoothing=0.1)\n"
        "\n"
        "    def forward(self, x, y):\n"
        "        return self.criterion(x, y)\n")
    code = _converted_code(source)
    line = next(ln for ln in code.splitlines() if "self.criterion" in ln)
    assert "rngs" not in line and "input, target" in line, code
    arrays = classes((3, 5, 4), ignore=1)(np.random.default_rng(1))
    ns: dict = {}
    exec(compile(code, "<jax>", "exec"), ns)  # noqa: S102 - converted snippet
    from flax import nnx

    got = ns["M"](rngs=nnx.Rngs(0))(jnp.asarray(arrays["a"]), jnp.asarray(arrays["b"]))
    tns: dict = {}
    exec(compile(source, "<torch>", "exec"), tns)  # noqa: S102
    want = tns["M"]()(torch.from_numpy(arrays["a"]), torch.from_numpy(arrays["b"]))
    np.testing.assert_allclose(float(got), want.item(), rtol=RTOL, atol=ATOL)


def test_computed_module_option_is_evaluated_once() -> None:
    code = _converted_code(PRELUDE + "crit = nn.CrossEntropyLoss(weight=torch.ones(5) * 2)\n")
    # a default of the function: evaluated once, when the loss is built (lambda or def form)
    assert re.search(r"(lambda |def crit\()input, target, weight=jnp\.ones\(\(5,\)\) \* 2[:)]",
                     code), code


# --------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------


GRADIENT_CASES = [
    pytest.param("cross_entropy", "CrossEntropyLoss",
                 "weight=w, ignore_index=1, label_smoothing=0.1", classes((6, 5), 1, True),
                 id="ce-all-NC"),
    pytest.param("cross_entropy", "CrossEntropyLoss",
                 "weight=w, ignore_index=1, label_smoothing=0.1", classes((3, 5, 4), 1, True),
                 id="ce-all-NCd"),
    pytest.param("cross_entropy", "CrossEntropyLoss", "weight=w, ignore_index=-100",
                 classes((3, 5, 4), -100, True), id="ce-weight-ignore-100"),
    pytest.param("nll_loss", "NLLLoss", "weight=w, ignore_index=-100",
                 log_probs((6, 5), -100, True), id="nll-weight-ignore-100"),
]


@pytest.mark.parametrize(("fn", "module", "opts", "inputs"), GRADIENT_CASES)
@pytest.mark.parametrize("form", ["functional", "module"])
def test_gradient_matches_torch(fn, module, opts, inputs, form) -> None:
    """d loss / d input, with ignored labels (out of range: -100) and class weights."""
    if form == "functional":
        source = PRELUDE + f"\n\ndef f(a, b, w):\n    return F.{fn}(a, b, {opts})\n"
    else:
        source = PRELUDE + (f"\n\ndef f(a, b, w):\n    crit = nn.{module}({opts})\n"
                            "    return crit(a, b)\n")
    code = _converted_code(source)
    arrays = inputs(np.random.default_rng(2))
    b, w = jnp.asarray(arrays["b"]), jnp.asarray(arrays["w"])
    f = _jax_fn(code)
    got = jax.jit(jax.grad(lambda a: f(a, b, w)))(jnp.asarray(arrays["a"]))
    tns: dict = {}
    exec(compile(source, "<torch>", "exec"), tns)  # noqa: S102 - the test's own snippet
    a = torch.from_numpy(arrays["a"].copy()).requires_grad_(True)
    tns["f"](a, torch.from_numpy(arrays["b"]), torch.from_numpy(arrays["w"])).backward()
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(np.asarray(got), a.grad.numpy(), rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------
# random shapes and options (cross_entropy)
# --------------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 5), c=st.integers(2, 6), rest=st.lists(st.integers(1, 3), max_size=2),
    ignore=st.sampled_from([None, 0, 1, -100]), weight=st.booleans(),
    smoothing=st.sampled_from([0.0, 0.05, 0.3]),
    reduction=st.sampled_from(["mean", "sum", "none"]), seed=st.integers(0, 2**16),
)
def test_cross_entropy_random(n, c, rest, ignore, weight, smoothing, reduction, seed) -> None:
    shape = (n, c, *rest)
    opts = [f"reduction={reduction!r}"]
    if weight:
        opts.append("weight=w")
    if ignore is not None:
        opts.append(f"ignore_index={ignore}")
    if smoothing:
        opts.append(f"label_smoothing={smoothing}")
    arrays = classes(shape, ignore=ignore, weight=weight)(np.random.default_rng(seed))
    if ignore is None:  # labels are never -100 here: torch's default does not apply
        assert (arrays["b"] >= 0).all()
    params = ", ".join(arrays)
    source = PRELUDE + f"\n\ndef f({params}):\n    return F.cross_entropy(a, b, {', '.join(opts)})\n"
    _compare(source, arrays)


# --------------------------------------------------------------------------------------------
# what is not translated leaves a TODO
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "loss = F.cross_entropy(x, y, reduction=red)",  # non-literal reduction
    "loss = F.cross_entropy(x, y, reduction='batchmean')",  # unknown reduction
    "loss = F.cross_entropy(x, y, label_smoothing=1.5)",  # torch rejects it
    "loss = F.cross_entropy(x, F.softmax(t, dim=1), ignore_index=0)",  # torch rejects it
    "loss = F.cross_entropy(x, y, size_average=flag)",  # legacy flag, non-literal
    "loss = F.kl_div(x, t, log_target=flag)",
    "loss = F.smooth_l1_loss(x, y, beta=-1.0)",
    "loss = F.huber_loss(x, y, delta=0.0)",
    "crit = nn.CrossEntropyLoss(reduce=flag)",
    "crit = nn.KLDivLoss(reduction='average')",
])
def test_untranslatable_leaves_todo(source: str) -> None:
    result = _convert(PRELUDE + source + "\n")
    assert "TODO(torch2jax)" in result.code, result.code
    assert any(d.severity == "error" for d in result.diagnostics)


def test_a_compound_target_read_twice_is_bound_once() -> None:
    """`F.cross_entropy(x, y[:, 0], ignore_index=0)`: the mean over the kept rows reads the
    target twice (the mask and the labels), so the expression is bound to a name on the line
    before (it was marked untranslated before). Same value as torch, ignored rows included."""
    code = _converted_code(PRELUDE + "loss = F.cross_entropy(x, y[:, 0], ignore_index=0)\n")
    assert code.splitlines()[1] == "target = y[:, 0]"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = rng.integers(0, 5, (8, 2))
    y[[1, 4], 0] = 0  # two ignored rows
    scope: dict = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
    exec(compile(code, "converted", "exec"), scope)  # noqa: S102 (the converted snippet)
    want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(y[:, 0]),
                                             ignore_index=0)
    np.testing.assert_allclose(np.asarray(scope["loss"]), want.numpy(), rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------------------
# binary cross-entropy where a sigmoid saturates: torch's gradient, not nan
# --------------------------------------------------------------------------------------------

SATURATED_BCE = """
import torch
import torch.nn.functional as F


def f(logits, y, w):
    return F.binary_cross_entropy(torch.sigmoid(logits), y, weight=w, reduction="sum")
"""


def test_bce_gradient_where_the_sigmoid_saturates() -> None:
    import jax
    import jax.numpy as jnp

    # logits past +-17 (float32 sigmoid is exactly 1.0 from about 16.7, exactly 0.0 below
    # about -88) and targets that disagree with them: the loss is clamped, and the gradient is
    # torch's (p - y) / max(p(1 - p), 1e-12) * p(1 - p), not 0 * inf = nan
    logits = np.array([40.0, -120.0, 17.0, 3.0, -2.0, 0.0, 25.0, -30.0], np.float32)
    y = np.array([0.0, 1.0, 0.0, 0.3, 1.0, 0.5, 1.0, 0.0], np.float32)
    w = np.linspace(0.5, 2.0, 8).astype(np.float32)
    code = _converted_code(SATURATED_BCE)
    assert "binary_cross_entropy(jax.nn.sigmoid(logits), y)" in code  # a compound input
    ns: dict = {}
    exec(compile(code, "<bce>", "exec"), ns)  # noqa: S102 - the converter's output
    value, grads = jax.value_and_grad(ns["f"], argnums=(0, 1))(
        jnp.asarray(logits), jnp.asarray(y), jnp.asarray(w))
    tl, ty = (torch.tensor(a, requires_grad=True) for a in (logits, y))
    want = torch.nn.functional.binary_cross_entropy(torch.sigmoid(tl), ty, weight=torch.tensor(w),
                                                    reduction="sum")
    want.backward()
    assert np.isfinite(float(value)) and np.all(np.isfinite(np.asarray(grads[0])))
    np.testing.assert_allclose(float(value), want.item(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grads[0]), tl.grad.numpy(), rtol=1e-5, atol=1e-6)
    # the target's gradient, log(1 - p) - log(p), is infinite at a saturated p in torch too
    np.testing.assert_array_equal(np.isinf(np.asarray(grads[1])), np.isinf(ty.grad.numpy()))
    finite = np.isfinite(ty.grad.numpy())
    np.testing.assert_allclose(np.asarray(grads[1])[finite], ty.grad.numpy()[finite], rtol=1e-5)


def test_a_file_with_its_own_binary_cross_entropy_keeps_it() -> None:
    source = PRELUDE + (
        "def binary_cross_entropy(p, y):\n    return F.binary_cross_entropy(p, y)\n")
    result = _convert(source)
    assert "custom_vjp" not in result.code
    assert "jnp.maximum(jnp.log(p), -100)" in result.code
    assert any("defines its own binary_cross_entropy" in d.message for d in result.diagnostics)
