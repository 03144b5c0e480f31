"""Initialisers applied to every parameter of a model in a loop (the annotated Transformer's
``make_model``, PyTorch's Transformer tutorial, seq2seq scripts)::

    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)

NNX: the loop walks the model's nnx.Param variables with their paths and writes each one, so
the model is built as torch builds it::

    for path, p in nnx.iter_graph(model):
        if isinstance(p, nnx.Param) and p.ndim > 1:
            p[...] = jax.nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", ...)(
                rngs.params(), p.shape, p.dtype)

torch computes a tensor's fans from its layout (fan in: axis 1, fan out: axis 0, each times
the rest); a converted Linear or Conv kernel is transposed (fans on its last two axes), every
other parameter keeps torch's layout, so the axes are chosen per parameter by its name. Only
initialisers that torch's fans decide the same way on both layouts are translated: xavier's
(fan_avg), and those that read no fan (normal_, uniform_, trunc_normal_, constant_, zeros_,
ones_). kaiming's read one fan, and a converted ConvTranspose's kernel does not keep torch's
idea of it: they stay marked, as does any other body.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import Untranslatable, bind, code

_AXES = "in_axis=-2 if kernel else 1, out_axis=-1 if kernel else 0"
PARAMS = {
    "xavier_uniform_": ("tensor", "gain"), "xavier_normal_": ("tensor", "gain"),
    "normal_": ("tensor", "mean", "std"), "uniform_": ("tensor", "a", "b"),
    "trunc_normal_": ("tensor", "mean", "std", "a", "b"), "constant_": ("tensor", "val"),
    "zeros_": ("tensor",), "ones_": ("tensor",),
}


def _number(node: cst.BaseExpression | None, default: float) -> str:
    """A literal number's text (a negative one included), or ``default``; raises for other
    expressions (the value would have to be computed before the loop)."""
    if node is None:
        return repr(default)
    if isinstance(node, (cst.Integer, cst.Float)) or m.matches(node, m.UnaryOperation(
            operator=m.Minus(), expression=m.Integer() | m.Float())):
        return code(node)
    if isinstance(node, (cst.Name, cst.Attribute)):
        return code(node)  # a constant of the program (math.pi, a config value)
    raise Untranslatable(f"an initialiser's argument {code(node)} that is computed")


def init_value(fn: str, call: cst.Call, key: str, p: str) -> str:
    """The JAX expression of the value ``nn.init.<fn>(p, ...)`` gives the variable ``p`` (with
    its key path ``path``), drawn with ``key``; raises Untranslatable."""
    if fn not in PARAMS:
        raise Untranslatable(f"torch.nn.init.{fn} over a model's parameters: translated for "
                             + ", ".join(sorted(PARAMS)) + " only (the others read a fan "
                             "that a converted layer's layout does not keep)")
    b = bind(call.args, PARAMS[fn])
    if b.star:
        raise Untranslatable(f"torch.nn.init.{fn} with arguments not written out")
    shape = f"{p}.shape, {p}.dtype"
    if fn.startswith("xavier"):
        gain = _number(b.get("gain"), 1.0)
        dist = "uniform" if fn.endswith("uniform_") else "normal"
        if dist == "uniform" and gain in ("1", "1.0"):
            return f"jax.nn.initializers.xavier_uniform(\n    {_AXES})({key}, {shape})"
        # (JAX's xavier_normal draws from a truncated normal; torch's from a normal)
        return (f'jax.nn.initializers.variance_scaling(\n    {gain} ** 2, "fan_avg", "{dist}", '
                f"{_AXES})({key}, {shape})")
    if fn == "normal_":
        mean, std = _number(b.get("mean"), 0.0), _number(b.get("std"), 1.0)
        return f"{mean} + {std} * jax.random.normal({key}, {shape})"
    if fn == "uniform_":
        lo, hi = _number(b.get("a"), 0.0), _number(b.get("b"), 1.0)
        return f"jax.random.uniform({key}, {shape}, {lo}, {hi})"
    if fn == "trunc_normal_":
        mean, std = _number(b.get("mean"), 0.0), _number(b.get("std"), 1.0)
        lo, hi = _number(b.get("a"), -2.0), _number(b.get("b"), 2.0)
        return (f"{mean} + {std} * jax.random.truncated_normal({key}, ({lo} - {mean}) / {std}, "
                f"({hi} - {mean}) / {std}, {shape})")
    value = {"zeros_": "0.0", "ones_": "1.0"}.get(fn) or _number(b.get("val"), 0.0)
    return f"jnp.full({p}.shape, {value}, {p}.dtype)"


# a tensor's own in-place initialisers (``p.data.normal_(0, 0.02)``) as torch.nn.init's
_METHODS = {"normal_": "normal_", "uniform_": "uniform_", "zero_": "zeros_", "fill_": "constant_"}


def as_init_call(call: cst.Call, p: str, q: str | None) -> tuple[str, cst.Call] | None:
    """``nn.init.<fn>(p, ...)`` (``q`` its qualified name), or ``p.<m>_(...)`` /
    ``p.data.<m>_(...)``, as ``(fn, call with p first)``; None for another call."""
    if q is not None and q.startswith("torch.nn.init.") and call.args and m.matches(
            call.args[0].value, m.Name(p)):
        return q.rsplit(".", 1)[1], call
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in _METHODS:
        return None
    recv = func.value
    if not (m.matches(recv, m.Name(p)) or m.matches(recv, m.Attribute(
            value=m.Name(p), attr=m.Name("data")))):
        return None
    args = list(call.args)
    if func.attr.value == "uniform_":  # torch's uniform_(from, to)
        args = [a.with_changes(keyword=cst.Name({"from": "a", "to": "b"}[a.keyword.value]))
                if a.keyword is not None and a.keyword.value in ("from", "to") else a
                for a in args]
    if func.attr.value == "fill_":
        args = [a.with_changes(keyword=cst.Name("val")) if a.keyword is not None else a
                for a in args]
    return _METHODS[func.attr.value], call.with_changes(
        args=[cst.Arg(cst.Name(p)), *args])
