"""Every rule in ``rules/*.toml`` is checked against its own examples and the real JAX library.

Fixit style: a rule's examples live in the rule, and this one generic suite runs them all, so
adding a rule (or an example) adds its tests.

* **text**     each example, wrapped in a tiny module, converts to exactly its ``jax`` text
               (compared after ``ast.unparse`` on both sides) with no error diagnostic;
* **numbers**  function and method examples run on both sides with random inputs of their
               ``inputs`` specs; layer examples are built on both sides (weights copied through
               the rule's ``weights`` table) and run on a random input;
* **aliases**  an alias (or family member) has no example of its own: its base rule's examples
               are re-run with the alias's name (numbers only: the JAX text is not known);
* **targets**  tf_upgrade_v2 style: every dotted JAX name a rule can emit resolves in the
               installed jax / flax, accepts the keywords the rule renames to or emits, and
               every call written in an example's ``jax`` text binds to its target's signature;
               every ``special`` a rule names is a registered transform.

Known converter/rule bugs are listed in ``KNOWN_BUGS`` as strict xfails.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import tomllib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source
from torch2jax.passes.helpers import HELPERS
from torch2jax.passes.specials import SPECIALS
from torch2jax.ruleset import Example, Rule, builtin_rules

ROOT = Path(__file__).resolve().parent.parent
RULES = builtin_rules()
KINDS = {"layer": RULES.layers, "function": RULES.functions, "method": RULES.methods}

PRELUDE = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
RTOL, ATOL = 1e-5, 1e-6
MODULE_ATOL = 1e-5  # layers sum many products (conv, linear): a little more room

# Known failures, reported to the lead: test id -> reason. Each becomes a strict xfail, so a fix
# turns it into an XPASS failure that asks for its entry to be removed here.
KNOWN_BUGS: dict[str, str] = {}


def helper_namespace() -> dict:
    """Every NNX helper the converter writes into files, defined (to evaluate one converted
    expression on its own), with the imports they use."""
    from flax import linen

    ns: dict = {"jax": jax, "jnp": jnp, "np": np, "nnx": nnx, "nn": linen, "Any": Any,
                "NamedTuple": NamedTuple}
    for source, _ in (by_target["nnx"] for by_target in HELPERS.values() if "nnx" in by_target):
        exec(compile(source, "<torch2jax helper>", "exec"), ns)  # noqa: S102 - our own source
    return ns


def _marks(test_id: str) -> list[pytest.MarkDecorator]:
    reason = KNOWN_BUGS.get(test_id)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


# --------------------------------------------------------------------------------------------
# Which examples and rules there are
# --------------------------------------------------------------------------------------------


def _toml_tables() -> dict[str, list[dict[str, Any]]]:
    """The rule files as written: which torch names are rules and which are aliases of them."""
    tables: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for path in sorted((ROOT / "rules").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for kind in KINDS:
            tables[kind].extend(data.get(kind, []))
    return tables


TOML = _toml_tables()


def _base_rules(kind: str) -> list[Rule]:
    """Rules as written in the toml, each with its own entry (aliases excluded)."""
    return [KINDS[kind][raw["torch"]] for raw in TOML[kind] if raw["torch"] in KINDS[kind]]


def _aliases(kind: str) -> list[tuple[Rule, Rule]]:
    """(alias, base) for every name listed in a rule's ``aliases`` or ``family``."""
    out = []
    for raw in TOML[kind]:
        base = KINDS[kind].get(raw["torch"])
        for name in [*raw.get("aliases", ()), *raw.get("family", ())]:
            alias = KINDS[kind].get(name)
            if base is not None and alias is not None and alias.torch != base.torch:
                out.append((alias, base))
    return out


def _example_params(test: str, kinds: tuple[str, ...], *, numbers: bool = False,
                    targets: tuple[str, ...] | None = None) -> list[Any]:
    """(kind, rule, example index) params; KNOWN_BUGS keys are ``f"{test}:{id}"``.
    ``targets``: only the examples of these targets (default: all)."""
    params = []
    for kind in kinds:
        for rule in _base_rules(kind):
            for i, ex in enumerate(rule.examples):
                if numbers and not ex.runnable or targets and ex.target not in targets:
                    continue
                test_id = f"{rule.id}-{i}" + (f"-{ex.target}" if ex.target != "nnx" else "")
                params.append(pytest.param(kind, rule, i, id=test_id,
                                           marks=_marks(f"{test}:{test_id}")))
    return params


# --------------------------------------------------------------------------------------------
# Conversion of one example (cached: the text and the numbers tests share it)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converted:
    torch_module: str  # the wrapper module given to the converter
    code: str  # the converter's output
    expr: str  # the converted example expression, ast.unparse'd
    errors: tuple[str, ...]  # rendered error diagnostics


def _params_of(inputs: dict[str, str]) -> str:
    return ", ".join(inputs)


def _wrap(kind: str, torch_expr: str, inputs: dict[str, str]) -> str:
    if kind == "layer":
        return PRELUDE + (
            "\n\nclass M(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            f"        self.layer = {torch_expr}\n"
        )
    return PRELUDE + f"\n\ndef f({_params_of(inputs)}):\n    return {torch_expr}\n"


def _extract(kind: str, code: str) -> ast.expr:
    tree = ast.parse(code)
    for node in tree.body:
        if kind == "layer" and isinstance(node, ast.ClassDef) and node.name == "M":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name in ("__init__", "setup"):
                    for stmt in fn.body:
                        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                and ast.unparse(stmt.targets[0]) == "self.layer"):
                            return stmt.value
        if kind != "layer" and isinstance(node, ast.FunctionDef) and node.name == "f":
            returns = [s for s in node.body if isinstance(s, ast.Return)]
            if returns and returns[-1].value is not None:
                return returns[-1].value
    raise AssertionError(f"the converted example is missing from the output:\n{code}")


@functools.cache
def _convert(kind: str, torch_expr: str, inputs: tuple[tuple[str, str], ...],
             target: str = "nnx") -> Converted:
    source = _wrap(kind, torch_expr, dict(inputs))
    result = convert_source(source, path="<example>", target=target)
    errors = tuple(d.render() for d in result.diagnostics if d.severity == "error")
    return Converted(source, result.code, ast.unparse(_extract(kind, result.code)), errors)


def _convert_example(kind: str, ex: Example) -> Converted:
    return _convert(kind, ex.torch, tuple(ex.inputs.items()), ex.target)


def _normalized(source: str) -> str:
    return ast.unparse(ast.parse(source, mode="eval").body)


# --------------------------------------------------------------------------------------------
# Inputs and comparison
# --------------------------------------------------------------------------------------------

SPEC = re.compile(r"^(?P<dtype>[a-z0-9_]+)\[(?P<shape>[0-9,\s]*)\](?::(?P<mod>\w+))?$")


def _make_input(spec: str, rng: np.random.Generator) -> np.ndarray:
    match = SPEC.match(spec.strip())
    assert match, f"bad input spec {spec!r} (want DTYPE[d0,d1,...] or DTYPE[...]:positive)"
    dtype = np.dtype(match["dtype"])
    shape = tuple(int(d) for d in match["shape"].split(",") if d.strip())
    mod = match["mod"]
    if dtype.kind == "f":
        if mod == "positive":
            return rng.uniform(0.1, 2.0, shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        high = int(mod) if mod and mod.isdigit() else 10
        return rng.integers(0, high, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise AssertionError(f"unsupported dtype in input spec {spec!r}")


def _inputs(inputs: dict[str, str], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: _make_input(spec, rng) for name, spec in inputs.items()}


def _leaves(value: Any, where: str = "out") -> list[tuple[str, np.ndarray]]:
    """Flatten tuples/lists (torch's (values, indices), split's list, a torch.Size against a
    JAX shape tuple) to numpy leaves."""
    if isinstance(value, (tuple, list)):
        out = [(f"{where}[len]", np.asarray(len(value)))]
        for i, v in enumerate(value):
            out.extend(_leaves(v, f"{where}[{i}]"))
        return out
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return [(where, value.numpy().copy())]
    if getattr(value, "dtype", None) == jnp.bfloat16:
        value = np.asarray(value, dtype=np.float32)
    return [(where, np.asarray(value))]


_KIND = {"i": "int", "u": "int", "f": "float", "b": "bool", "c": "complex"}


def _assert_same(got: Any, want: Any, atol: float = ATOL) -> None:
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert [w for w, _ in got_leaves] == [w for w, _ in want_leaves], (
        f"structure differs: jax {[w for w, _ in got_leaves]} vs torch "
        f"{[w for w, _ in want_leaves]}")
    for (where, g), (_, w) in zip(got_leaves, want_leaves):
        assert g.shape == w.shape, f"{where}: shape jax {g.shape} vs torch {w.shape}"
        # int64 (torch) vs int32 (jax) is fine; int vs float vs bool is not
        assert _KIND.get(g.dtype.kind) == _KIND.get(w.dtype.kind), (
            f"{where}: dtype jax {g.dtype} vs torch {w.dtype}")
        if w.dtype.kind == "b":
            np.testing.assert_array_equal(g, w, err_msg=where)
            continue
        rtol = 1e-3 if min(g.dtype.itemsize, w.dtype.itemsize) <= 2 else RTOL
        np.testing.assert_allclose(np.asarray(g, dtype=np.float64),
                                   np.asarray(w, dtype=np.float64),
                                   rtol=rtol, atol=atol, err_msg=where)


def _exec(code: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "rules_example", **(extra or {})}
    exec(compile(code, "<example>", "exec"), ns)  # noqa: S102 - rule examples, converted
    return ns


def _check_numbers(kind: str, torch_expr: str, inputs: dict[str, str]) -> None:
    conv = _convert(kind, torch_expr, tuple(inputs.items()))
    assert not conv.errors, "\n".join(conv.errors)
    arrays = _inputs(inputs)
    torch_f = _exec(conv.torch_module)["f"]
    jax_f = _exec(conv.code)["f"]
    try:
        want = torch_f(**{k: torch.from_numpy(v.copy()) for k, v in arrays.items()})
    except Exception as exc:  # the example itself is wrong, or (aliases) does not fit
        raise _TorchFailed(f"torch side raised: {type(exc).__name__}: {exc}") from exc
    got = jax_f(**{k: jnp.asarray(v) for k, v in arrays.items()})
    _assert_same(got, want)


class _TorchFailed(Exception):
    pass


# --------------------------------------------------------------------------------------------
# 1. text
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "rule", "index"),
                         _example_params("text", ("layer", "function", "method")))
def test_example_text(kind: str, rule: Rule, index: int) -> None:
    ex = rule.examples[index]
    conv = _convert_example(kind, ex)
    assert not conv.errors, "\n".join(conv.errors)
    assert conv.expr == _normalized(ex.jax), (
        f"{ex.torch!r} converted to {conv.expr!r}, the rule says {ex.jax!r}")


# --------------------------------------------------------------------------------------------
# 2. numbers: functions and methods
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "rule", "index"),
                         _example_params("numbers", ("function", "method"), numbers=True))
def test_example_numbers(kind: str, rule: Rule, index: int) -> None:
    ex = rule.examples[index]
    _check_numbers(kind, ex.torch, ex.inputs)


# --------------------------------------------------------------------------------------------
# 2. numbers: layers
# --------------------------------------------------------------------------------------------


def _spatial(name: str) -> int:
    for n in (1, 2, 3):
        if name.endswith(f"{n}d"):
            return n
    return 2


def _layer_input(layer: Any, rng: np.random.Generator) -> np.ndarray:
    """A random torch-layout input that fits ``layer``."""
    nn = torch.nn
    if isinstance(layer, nn.Linear):
        return rng.standard_normal((2, layer.in_features)).astype(np.float32)
    if isinstance(layer, nn.Embedding):
        return rng.integers(0, layer.num_embeddings, (2, 5)).astype(np.int64)
    # normalisation layers see a small variance, so that an epsilon off by 10x shows
    if isinstance(layer, (nn.LayerNorm, nn.RMSNorm)):
        return 0.01 * rng.standard_normal((2, 3, *layer.normalized_shape)).astype(np.float32)
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):
        shape = (4, layer.num_features) if isinstance(layer, nn.BatchNorm1d) else (
            2, layer.num_features, *[4] * _spatial(type(layer).__name__))
        return 0.01 * rng.standard_normal(shape).astype(np.float32)
    if isinstance(layer, nn.GroupNorm):
        return 0.01 * rng.standard_normal((2, layer.num_channels, 4, 4)).astype(np.float32)
    if isinstance(layer, nn.Fold):  # the columns of 2 channels' blocks, (N, C * kh * kw, L)
        shape = torch.nn.functional.unfold(torch.zeros(2, 2, *layer.output_size),
                                           layer.kernel_size, layer.dilation, layer.padding,
                                           layer.stride).shape
        return rng.standard_normal(tuple(shape)).astype(np.float32)
    if isinstance(layer, nn.modules.conv._ConvNd):
        channels, size = layer.in_channels, 9
    else:
        channels, size = 4, 8
    shape = (2, channels, *[size] * _spatial(type(layer).__name__))
    return rng.standard_normal(shape).astype(np.float32)


def _to_jax_weight(value: np.ndarray, layout: str) -> np.ndarray:
    if layout == "transpose":
        return value.T
    if layout == "conv":  # (O, I, *k) -> (*k, I, O)
        return np.transpose(value, (*range(2, value.ndim), 1, 0))
    return value


def _randomize(layer: Any, rng: np.random.Generator) -> None:
    """Non-trivial weights and running statistics, so that a wrong mapping shows."""
    with torch.no_grad():
        for name, t in layer.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith("running_var"):
                # small, like the inputs: an epsilon off by 10x shows in the output
                t.copy_(torch.from_numpy(rng.uniform(1e-3, 1e-2, t.shape).astype(np.float32)))
            else:
                t.copy_(torch.from_numpy(rng.standard_normal(t.shape).astype(np.float32)))


def _transfer(rule: Rule, layer: Any, module: Any) -> None:
    for name, t in layer.state_dict().items():
        assert name in rule.weights, (
            f"{rule.id}: state_dict entry {name!r} is not in the rule's weights table")
        wm = rule.weights[name]
        if wm.to is None:
            continue
        # a copy: jnp.asarray may alias the numpy buffer, which torch then updates in place
        value = _to_jax_weight(t.detach().numpy().copy(), wm.layout)
        var = getattr(module, wm.to, None)
        assert var is not None, f"{rule.id}: the JAX layer has no {wm.to!r} (for {name!r})"
        target = tuple(var.value.shape)
        if target != value.shape and len(target) == 1 and value.size == target[0]:
            value = value.reshape(target)  # NNX keeps a multi-axis LayerNorm's scale flat
        assert target == value.shape, (
            f"{rule.id}: {name!r} {tuple(t.shape)} -> {wm.to!r}: JAX has "
            f"{target}, the {wm.layout!r} layout gives {value.shape}")
        var.value = jnp.asarray(value, dtype=var.value.dtype)
    # the table must also cover the JAX side: every parameter and statistic got a torch value
    state = nnx.state(module, nnx.Param, nnx.BatchStat)
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        assert isinstance(leaf, jax.Array), (
            f"{rule.id}: JAX {jax.tree_util.keystr(path)} has no torch source in the weights table")


def _build(expr: str) -> Any:
    """Evaluate a converted layer expression. nnx layer classes are built abstractly (their
    initialisers would compile once per shape, seconds each; the weights come from torch)."""
    def build() -> Any:
        ns = {**helper_namespace(), "nnx": nnx, "jax": jax, "jnp": jnp, "np": np,
              "partial": partial, "rngs": nnx.Rngs(0)}  # helpers: written into converted files
        return eval(expr, ns)  # the converter's output of a rule's example

    node = ast.parse(expr, mode="eval").body
    if isinstance(node, ast.Call) and DOTTED.match(ast.unparse(node.func)):
        target = _resolve(ast.unparse(node.func))
        if inspect.isclass(target) and issubclass(target, nnx.Module):
            return nnx.eval_shape(build)
    return build()


def _check_layer(rule: Rule, torch_expr: str) -> None:
    conv = _convert("layer", torch_expr, ())
    assert not conv.errors, "\n".join(conv.errors)
    ns = _exec(PRELUDE)
    layer = eval(torch_expr, ns)  # the rule file's own example
    built = _build(conv.expr)
    rng = np.random.default_rng(0)
    _randomize(layer, rng)
    x = _layer_input(layer, rng)
    layer.eval()
    try:
        with torch.no_grad():
            want = layer(torch.from_numpy(x.copy()))
    except Exception as exc:
        raise _TorchFailed(f"torch side raised: {type(exc).__name__}: {exc}") from exc
    if isinstance(built, nnx.Module):
        _transfer(rule, layer, built)
        built.eval()
        fn = built
    else:
        assert callable(built), f"{conv.expr!r} is neither an nnx.Module nor callable"
        assert not layer.state_dict(), f"{rule.id}: torch layer has state, JAX side is a function"
        fn = built

    def run_jax(xj: jax.Array) -> jax.Array:
        if rule.layout == "channels_last":
            return jnp.moveaxis(fn(jnp.moveaxis(xj, 1, -1)), -1, 1)
        return fn(xj)

    _assert_same(run_jax(jnp.asarray(x)), want, atol=MODULE_ATOL)

    if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.track_running_stats:
        # one training step: batch statistics, the running mean's momentum convention and
        # torch's unbiased running variance (on a unit-variance batch, where the unbiased
        # and the biased variance differ by far more than the tolerance)
        layer.train()
        built.train()
        batch = x / 0.01
        with torch.no_grad():
            want = layer(torch.from_numpy(batch.copy()))
        _assert_same(run_jax(jnp.asarray(batch)), want, atol=MODULE_ATOL)
        for stat in ("running_mean", "running_var"):
            got = getattr(built, rule.weights[stat].to).value
            _assert_same(got, getattr(layer, stat), atol=1e-6)


@pytest.mark.parametrize(("kind", "rule", "index"),
                         _example_params("layer", ("layer",), numbers=True, targets=("nnx",)))
def test_layer_example_runs(kind: str, rule: Rule, index: int) -> None:
    _check_layer(rule, rule.examples[index].torch)


def _target_weights(rule: Rule, target: str, layer: Any) -> dict[str, np.ndarray]:
    """torch's state_dict -> {the target layer's parameter: value}, through the rule's weights
    table (torch -> NNX) and its target table (NNX -> the target's names). equinox keeps
    torch's layouts; linen has NNX's."""
    spec = rule.target_layers[target]
    out = {}
    for name, t in layer.state_dict().items():
        wm = rule.weights[name]
        if wm.to is None:
            continue
        value = t.detach().numpy().copy()
        out[spec.weights.get(wm.to, wm.to)] = (
            _to_jax_weight(value, wm.layout) if target == "linen" else value)
    return out


def _run_target_layer(rule: Rule, ex: Example, layer: Any, x: np.ndarray) -> Any:
    """Build the converted layer of a linen or equinox example, give it the torch layer's
    weights (every parameter of the target layer must get one) and run it on ``x``."""
    from types import SimpleNamespace

    conv = _convert("layer", ex.torch, (), ex.target)
    assert not conv.errors, "\n".join(conv.errors)
    weights = _target_weights(rule, ex.target, layer)
    if ex.target == "linen":
        from flax import linen

        module = eval(conv.expr, {"nn": linen, "jax": jax, "jnp": jnp,  # the converter's output
                                  "self": SimpleNamespace(train=False)})
        xin = jnp.moveaxis(x, 1, -1) if rule.layout == "channels_last" else jnp.asarray(x)
        params = dict(module.init(jax.random.key(0), xin).get("params", {}))
        assert set(params) == set(weights), (
            f"{rule.id}: linen parameters {sorted(params)}, from torch {sorted(weights)}")
        params = {k: jnp.asarray(v.reshape(params[k].shape)) for k, v in weights.items()}
        got = module.apply({"params": params}, xin)
        return jnp.moveaxis(got, -1, 1) if rule.layout == "channels_last" else got
    import equinox as eqx

    from torch2jax.targets.equinox_layers import VECTOR_LAYERS

    spec = rule.target_layers["equinox"]
    ns = {"eqx": eqx, "jax": jax, "jnp": jnp, "key": jax.random.key(0)}
    module = eval(conv.expr, ns)  # the converter's output of a rule's example
    arrays = jax.tree_util.tree_leaves(eqx.filter(module, eqx.is_array))
    assert len(arrays) == len(weights), (
        f"{rule.id}: the equinox layer has {len(arrays)} arrays, torch gives {sorted(weights)}")
    for name, value in weights.items():
        old = getattr(module, name)
        module = eqx.tree_at(lambda mdl, n=name: getattr(mdl, n), module,
                             jnp.asarray(value.reshape(old.shape)))
    # equinox layers take one example: mapped over the leading axes
    rank = VECTOR_LAYERS.get(spec.kind, x.ndim - 1)
    flat = x.reshape(-1, *x.shape[x.ndim - rank:])
    fn = partial(module, inference=True) if spec.kind == "dropout" else module
    got = jax.vmap(fn)(jnp.asarray(flat))
    return got.reshape(*x.shape[:x.ndim - rank], *got.shape[1:])


@pytest.mark.parametrize(("kind", "rule", "index"), _example_params(
    "target_layer", ("layer",), numbers=True, targets=("linen", "equinox")))
def test_target_layer_example_runs(kind: str, rule: Rule, index: int) -> None:
    """A linen or equinox example of a layer rule: the converted layer, with the torch layer's
    weights, gives torch's output (eval mode)."""
    ex = rule.examples[index]
    ns = _exec(PRELUDE)
    layer = eval(ex.torch, ns)  # the rule file's own example
    rng = np.random.default_rng(0)
    _randomize(layer, rng)
    x = _layer_input(layer, rng)
    layer.eval()
    with torch.no_grad():
        want = layer(torch.from_numpy(x.copy()))
    _assert_same(_run_target_layer(rule, ex, layer, x), want, atol=MODULE_ATOL)


# --------------------------------------------------------------------------------------------
# 2b. aliases: the base rule's example with the alias's name
# --------------------------------------------------------------------------------------------


def _renamed(kind: str, torch_expr: str, alias: Rule) -> str | None:
    """``torch_expr`` (one call) with its callee replaced by ``alias``."""
    tree = ast.parse(torch_expr, mode="eval")
    call = tree.body
    if not isinstance(call, ast.Call):
        return None
    if kind == "method":
        if not isinstance(call.func, ast.Attribute):
            return None
        call.func.attr = alias.torch
    else:
        short = alias.torch
        for long, abbrev in (("torch.nn.functional.", "F."), ("torch.nn.", "nn.")):
            if short.startswith(long):
                short = abbrev + short[len(long):]
        call.func = ast.parse(short, mode="eval").body
    return ast.unparse(tree)


def _alias_params() -> list[Any]:
    params = []
    for kind in ("layer", "function", "method"):
        for alias, base in _aliases(kind):
            candidates = []  # (torch expression, inputs), tried in order
            for ex in base.examples:
                if not ex.runnable or not (ex.inputs or kind == "layer"):
                    continue
                renamed = _renamed(kind, ex.torch, alias)
                if renamed is not None:
                    candidates.append((renamed, dict(ex.inputs)))
            if not candidates:
                continue
            test_id = f"{alias.torch}(alias of {base.torch})"
            params.append(pytest.param(kind, alias, candidates, id=test_id,
                                       marks=_marks(f"alias:{test_id}")))
    return params


@pytest.mark.parametrize(("kind", "alias", "candidates"), _alias_params())
def test_alias_numbers(kind: str, alias: Rule, candidates: list[tuple[str, dict]]) -> None:
    """The first of the base's examples that torch accepts under the alias's name decides."""
    reasons = []
    for torch_expr, inputs in candidates:
        try:
            if kind == "layer":
                _check_layer(alias, torch_expr)
            else:
                _check_numbers(kind, torch_expr, inputs)
            return
        except _TorchFailed as exc:
            reasons.append(f"{torch_expr!r}: {exc}")
    pytest.skip("no example of the base rule fits the alias: " + "; ".join(reasons))


# --------------------------------------------------------------------------------------------
# 3. targets resolve in the installed library and accept the emitted keywords
# --------------------------------------------------------------------------------------------

TARGET_NS = {"jax": jax, "jnp": jnp, "nnx": nnx, "np": np}
# the names of the linen and equinox examples and target tables
TARGET_NS_BY = {"linen": {"nn": "flax.linen"}, "equinox": {"eqx": "equinox"}}
CONTAINERS = ("sequential", "module_list", "module_dict")  # built from children, no rngs
DOTTED = re.compile(r"^(jax|jnp|nnx|np|nn|eqx)(\.[A-Za-z_]\w*)+$")


def _resolve(name: str) -> Any:
    import importlib

    head, *rest = name.split(".")
    modules = {**TARGET_NS_BY["linen"], **TARGET_NS_BY["equinox"]}
    obj = TARGET_NS[head] if head in TARGET_NS else importlib.import_module(modules[head])
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _dotted_targets(rule: Rule) -> list[str]:
    names = [rule.jax] if rule.kind != "layer" else []
    names += list(rule.targets.values())
    return [n for n in names if n and DOTTED.match(n)]


def _signature(target: Any) -> inspect.Signature | None:
    try:
        if inspect.isclass(target):
            sig = inspect.signature(target.__init__)
            return sig.replace(parameters=list(sig.parameters.values())[1:])
        return inspect.signature(target)
    except (TypeError, ValueError):  # builtins without a signature
        return None


def _accepts(sig: inspect.Signature, keyword: str) -> bool:
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return True
    p = params.get(keyword)
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def _rule_params(test: str) -> list[Any]:
    return [pytest.param(rule, id=f"{rule.kind}:{rule.torch}",
                         marks=_marks(f"{test}:{rule.kind}:{rule.torch}"))
            for table in KINDS.values() for rule in table.values()]


@pytest.mark.parametrize("rule", _rule_params("targets"))
def test_targets_resolve(rule: Rule) -> None:
    for name in _dotted_targets(rule):
        try:
            _resolve(name)
        except AttributeError:
            pytest.fail(f"{rule.torch}: JAX target {name} does not exist in the installed "
                        f"jax {jax.__version__}")
    if rule.kind == "method" and rule.jax and rule.jax.startswith(".") and len(rule.jax) > 1:
        attr = rule.jax[1:]
        assert hasattr(jax.Array, attr), f"{rule.torch}: jax.Array has no {attr!r}"


@pytest.mark.parametrize("rule", _rule_params("keywords"))
def test_targets_accept_keywords(rule: Rule) -> None:
    keywords = set(rule.rename.values()) | set(rule.emit)
    targets = _dotted_targets(rule)
    if rule.kind == "method" and rule.jax and rule.jax.startswith(".") and len(rule.jax) > 1:
        targets.append("jax.Array." + rule.jax[1:])
    checked = False
    for name in targets:
        if name.startswith("jax.Array."):
            target = getattr(jax.Array, name.rsplit(".", 1)[1], None)
        else:
            target = _resolve(name)
        sig = _signature(target) if target is not None else None
        if sig is None:
            continue
        wanted = set(keywords)
        takes_rngs = not rule.examples or any("rngs=" in ex.jax for ex in rule.examples)
        if (name.startswith("nnx.") and name[4:5].isupper()
                and rule.special not in CONTAINERS and takes_rngs):
            # the converter passes rngs= to every nnx layer class, unless the rule's examples
            # show otherwise (nnx.PReLU takes none)
            wanted.add("rngs")
        missing = sorted(k for k in wanted if not _accepts(sig, k))
        assert not missing, f"{rule.torch}: {name}{sig} does not accept {missing}"
        checked = True
    if keywords and not checked:
        pytest.skip(f"{rule.torch}: no inspectable target for keywords {sorted(keywords)}")


@pytest.mark.parametrize(("rule", "target"), [
    pytest.param(rule, target, id=f"{target}:{rule.torch}")
    for rule in _base_rules("layer") for target in rule.target_layers])
def test_target_tables_resolve(rule: Rule, target: str) -> None:
    """A layer's linen / equinox table names a class of the installed library that takes the
    keywords the table writes."""
    spec = rule.target_layers[target]
    assert spec.cls.split(".")[0] in TARGET_NS_BY[target], spec.cls
    written = set(spec.add) | set((spec.keywords or {}).values()) | ({"key"} if spec.key else set())
    base = _resolve(spec.cls)
    # a class by rank (eqx.nn.Conv2d): each of them, a subclass of the table's (isinstance)
    for cls in [f"{spec.cls}{n}d" for n in (1, 2, 3)] if spec.rank else [spec.cls]:
        found = _resolve(cls)
        assert issubclass(found, base), f"{cls} is not a {spec.cls}"
        sig = _signature(found)
        missing = sorted(k for k in written if not _accepts(sig, k))
        assert not missing, f"{rule.torch}: {cls}{sig} does not accept {missing}"


def _special_params() -> list[Any]:
    return [pytest.param(rule, id=f"{rule.kind}:{rule.torch}",
                         marks=_marks(f"special:{rule.kind}:{rule.torch}"))
            for table in KINDS.values() for rule in table.values() if rule.special]


@pytest.mark.parametrize("rule", _special_params())
def test_special_is_registered(rule: Rule) -> None:
    """A ``special`` names a transform in passes/special.py (containers: in the rewriter)."""
    if rule.kind == "layer" and rule.special in CONTAINERS:
        return
    assert rule.special in SPECIALS, (
        f"{rule.torch}: special {rule.special!r} is not registered in torch2jax.passes.special "
        "(the converter raises KeyError on every call of it)")


def _example_calls(source: str, input_names: set[str]) -> list[tuple[str, Any, int, list[str]]]:
    """(text, target, n_positional, keywords) for each call of a resolvable JAX callable."""
    calls = []
    for node in ast.walk(ast.parse(source, mode="eval")):
        if not isinstance(node, ast.Call):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords):
            continue
        func, args = node.func, list(node.args)
        if isinstance(func, ast.Name) and func.id == "partial" and args:
            func, args = args[0], args[1:]
        text = ast.unparse(func)
        if DOTTED.match(text):
            target = _resolve(text)
        elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
              and func.value.id in input_names):
            target = getattr(jax.Array, func.attr, None)
            if target is None:
                raise AssertionError(f"{text}: jax.Array has no method {func.attr!r}")
            args = [ast.Name("self"), *args]
        else:
            continue
        calls.append((text, target, len(args), [k.arg for k in node.keywords]))
    return calls


def _example_call_params() -> list[Any]:
    params = []
    for kind in ("layer", "function", "method"):
        for rule in _base_rules(kind):
            for i, ex in enumerate(rule.examples):
                test_id = f"{rule.id}-{i}" + (f"-{ex.target}" if ex.target != "nnx" else "")
                params.append(pytest.param(kind, rule, i, id=test_id,
                                           marks=_marks("calls:" + test_id)))
    return params


@pytest.mark.parametrize(("kind", "rule", "index"), _example_call_params())
def test_example_calls_bind(kind: str, rule: Rule, index: int) -> None:
    """Every JAX call written in an example's expected text binds to the real signature."""
    ex = rule.examples[index]
    names = set(ex.inputs) | {"x"}
    for text, target, n_pos, keywords in _example_calls(ex.jax, names):
        sig = _signature(target)
        if sig is None:
            continue
        try:
            sig.bind_partial(*[None] * n_pos, **{k: None for k in keywords})
        except TypeError as exc:
            pytest.fail(f"{ex.jax!r}: {text}{sig} rejects {n_pos} positional and "
                        f"keywords {keywords}: {exc}")


def rules_without_examples() -> list[str]:
    """Rules written in the toml (aliases aside) that carry no example: shown with ``-s``."""
    return [f"{kind}:{r.torch}" for kind in KINDS for r in _base_rules(kind) if not r.examples]
