"""Host-side code of a class that is not a module (a Dataset's ``__init__`` preparing its
arrays), under the equinox target.

The NNX translation writes such code in jnp, with flax's functional pooling where torch pools
(``F.avg_pool2d(t, 2)`` -> ``jnp.moveaxis(nnx.avg_pool(jnp.moveaxis(t, 1, -1),
window_shape=(2, 2), strides=(2, 2)), -1, 1)``). An equinox file has no flax: the pooling is
written with ``jax.lax.reduce_window`` over the same channels-last array, the batch and channel
axes given a window of 1 (what flax's pooling does). Only the form the NNX translation writes
for torch's batched NCHW pooling is taken (its argument moved from axis 1 to the last axis, so
its rank is the window's plus two); anything else stays NNX and the class goes back to torch,
marked.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code

_POOLS = {"avg_pool": ("0.0", "jax.lax.add"), "max_pool": ("-jnp.inf", "jax.lax.max")}


def _ints(node: cst.BaseExpression | None) -> list[str] | None:
    if not isinstance(node, cst.Tuple) or not all(
            isinstance(e.value, cst.Integer | cst.Name | cst.Attribute) for e in node.elements):
        return None
    return [code(e.value) for e in node.elements]


def _pads(node: cst.BaseExpression | None, n: int) -> str | None:
    """flax's padding -> reduce_window's over (batch, *spatial, channel)."""
    if node is None or m.matches(node, m.SimpleString('"VALID"') | m.SimpleString("'VALID'")):
        return '"VALID"'
    if isinstance(node, cst.Tuple) and len(node.elements) == n and all(
            isinstance(e.value, cst.Tuple) and _ints(e.value) and len(e.value.elements) == 2
            for e in node.elements):
        return f"((0, 0), {', '.join(code(e.value) for e in node.elements)}, (0, 0))"
    return None


class HostPools(cst.CSTTransformer):
    """``nnx.avg_pool`` / ``nnx.max_pool`` of an NCHW array moved channels-last ->
    ``jax.lax.reduce_window`` (the mean divides by the window's size: flax's
    ``count_include_pad=True``, torch's default)."""

    def leave_Call(self, original_node, updated_node):
        func = updated_node.func
        if not m.matches(func, m.Attribute(value=m.Name("nnx"), attr=m.Name("avg_pool") |
                                           m.Name("max_pool"))):
            return updated_node
        pos = [a for a in updated_node.args if a.keyword is None]
        kw = {a.keyword.value: a.value for a in updated_node.args if a.keyword is not None}
        if len(pos) != 1 or set(kw) - {"window_shape", "strides", "padding"} or not m.matches(
                pos[0].value, m.Call(func=m.Attribute(value=m.Name("jnp"),
                                                      attr=m.Name("moveaxis")),
                                     args=[m.Arg(), m.Arg(m.Integer("1")),
                                           m.Arg(m.UnaryOperation(operator=m.Minus(),
                                                                  expression=m.Integer("1")))])):
            return updated_node
        window = _ints(kw.get("window_shape"))
        strides = _ints(kw.get("strides")) if "strides" in kw else (
            ["1"] * len(window) if window else None)
        if not window or strides is None or len(strides) != len(window):
            return updated_node
        pads = _pads(kw.get("padding"), len(window))
        if pads is None:
            return updated_node
        init, op = _POOLS[func.attr.value]
        dims = f"(1, {', '.join(window)}, 1)"
        steps = f"(1, {', '.join(strides)}, 1)"
        pooled = (f"jax.lax.reduce_window({code(pos[0].value)}, {init}, {op}, {dims}, "
                  f"{steps}, {pads})")
        if func.attr.value == "avg_pool":
            size = " * ".join(window)
            pooled = f"{pooled} / ({size})" if len(window) > 1 else f"{pooled} / {size}"
        return cst.parse_expression(pooled)
