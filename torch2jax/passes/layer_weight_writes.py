"""A tensor written into a layer's weight in place, in the JAX layer's layout (timm's convit
``local_init``: ``self.v.weight.data.copy_(torch.eye(self.dim))``,
``self.pos_proj.weight.data[:, -1] = -1``, ``self.pos_proj.weight.data *= strength``).

torch's ``copy_`` broadcasts the source to the weight's shape and casts it to its dtype; the
flax parameter holds the weight in its own layout (a Linear's kernel is torch's ``(out, in)``
weight transposed, a Conv's ``(*k, in, out)`` from torch's ``(out, in, *k)``). The source is
broadcast to torch's shape (read off the kernel) before it is laid out, so that a row vector
or a scalar lands where torch puts it; an indexed write or an operation by a tensor is done on
the parameter viewed in torch's layout and laid out back.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import expr


def _permutations(layout: str, layer: str) -> tuple[str, str] | None:
    """Templates of ``{a}`` in torch's layout, and of ``{a}`` (torch's) in the JAX layer's;
    None for a layout this does not know."""
    if layout == "as_is":
        return "{a}", "{a}"
    if layout == "transpose":
        return "{a}.T", "{a}.T"
    if layout == "conv" and layer[-2:] in ("1d", "2d", "3d"):
        nd = int(layer[-2])
        return (f"jnp.transpose({{a}}, {(nd + 1, nd, *range(nd))})",
                f"jnp.transpose({{a}}, {(*range(2, nd + 2), 1, 0)})")
    return None


def copied_into(param: cst.BaseExpression, layout: str, layer: str,
                value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The new value of the flax parameter ``param`` (``self.v.kernel.value``) after torch's
    ``weight.copy_(value)``; None where the layout is not one this knows."""
    cast = "jnp.asarray({v}, dtype={p}.dtype)"
    if layout == "as_is":
        return expr(f"jnp.broadcast_to({cast}, {{p}}.shape)", v=value, p=param)
    if layout == "transpose":
        return expr(f"jnp.broadcast_to({cast}, {{p}}.shape[::-1]).T", v=value, p=param)
    perms = _permutations(layout, layer)
    if perms is None:
        return None
    torch_shape = "({p}.shape[-1], {p}.shape[-2], *{p}.shape[:-2])"
    return expr(perms[1].format(a=f"jnp.broadcast_to({cast}, {torch_shape})"), v=value,
                p=param)


def updated_at(param: cst.BaseExpression, layout: str, layer: str, index: cst.BaseSlice,
               op: str, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """``param`` after torch's ``weight[index] = value`` (``op`` "set") or ``weight[index] op=
    value`` ("add", "multiply", ...): the update at torch's index, on the parameter viewed in
    torch's layout."""
    perms = _permutations(layout, layer)
    if perms is None:
        return None
    viewed = expr(perms[0].format(a="{p}"), p=param)
    updated = cst.Call(
        func=cst.Attribute(value=cst.Subscript(value=cst.Attribute(
            value=viewed, attr=cst.Name("at")), slice=index), attr=cst.Name(op)),
        args=[cst.Arg(value)])
    return expr(perms[1].format(a="{u}"), u=updated)


def operated(param: cst.BaseExpression, layout: str, layer: str, op: str,
             value: cst.BaseExpression, scalar: bool) -> cst.BaseExpression | None:
    """``param`` after torch's ``weight op= value`` (``op`` a Python operator): a number in any
    layout; a tensor broadcasts against torch's layout, and the result keeps the dtype."""
    if scalar:
        return expr("{p} " + op + " {v}", p=param, v=value)
    perms = _permutations(layout, layer)
    if perms is None:
        return None
    viewed = perms[0].format(a="{p}")
    return expr(perms[1].format(a=f"({viewed} {op} {{v}}).astype({{p}}.dtype)"), p=param,
                v=value)
