"""A ``with torch.no_grad():`` block inside a module's method (its forward).

Outside a differentiated function such a block is plain code (its model calls go through the
evaluation step: passes/rewrite_loops.py). Inside a module's forward it is not: torch does not
differentiate what the block computes, so a parameter read there gets no gradient from it
(LayoutLMv3's relative-position bias, ``rel_pos = self.rel_pos_bias.weight.t()[rel_pos]``
under ``torch.no_grad()`` before transformers 5.24). The block's body stays in place and each
tensor it binds is ``jax.lax.stop_gradient(...)``: the same values, no gradient through them.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import value_kinds as vk
from torch2jax.analysis.walk import findall
from torch2jax.passes.common import expr

NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad",
           "torch.autograd.grad_mode.inference_mode")


def stops_gradient(q: str, item: cst.BaseExpression) -> bool:
    """``torch.no_grad()`` / ``torch.inference_mode()`` (not ``inference_mode(False)``)."""
    if q not in NO_GRAD:
        return False
    return not (isinstance(item, cst.Call) and any(
        a.keyword is None and isinstance(a.value, cst.Name) and a.value.value == "False"
        or a.keyword is not None and a.keyword.value == "mode"
        and isinstance(a.value, cst.Name) and a.value.value == "False" for a in item.args))


def _tensor_assign(t, stmt: cst.CSTNode) -> bool:
    """``name = <tensor>`` (a local: an attribute of self, a parameter or buffer, is left as
    it is)."""
    return isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
        stmt.body[0], cst.Assign) and all(isinstance(a.target, cst.Name) for a in
                                          stmt.body[0].targets) and t.values is not None \
        and t.values.kind(stmt.body[0].value) == vk.Kind.TENSOR


def _reads(t, value: cst.BaseExpression) -> set[str]:
    """The names ``value`` reads: not an attribute's or keyword's name, nor an import
    (``torch``, ``F``)."""
    skip = {id(a.attr) for a in findall(value, m.Attribute())} | {
        id(a.keyword) for a in findall(value, m.Arg()) if a.keyword is not None}
    return {n.value for n in findall(value, m.Name()) if id(n) not in skip
            and not (t.q(n) or "").startswith("torch")}


def stopped_body(t, original: list[cst.CSTNode], updated: list[cst.CSTNode]) -> list:
    """``updated`` (the block's translated statements) with each local ``name = <tensor>`` bound
    through ``jax.lax.stop_gradient``, but one computed from the block's stopped locals alone
    (``mask = mask.permute(...)`` after ``mask = <stopped>``); ``original`` the torch statements they came from (where
    the translation changed their number, the statements are returned as they are)."""
    if len(original) != len(updated):
        return updated
    out, stopped = [], set()
    for o, u in zip(original, updated):
        if _tensor_assign(t, o) and isinstance(u, cst.SimpleStatementLine) and len(
                u.body) == 1 and isinstance(u.body[0], cst.Assign):
            names = _reads(t, o.body[0].value)
            targets = {a.target.value for a in o.body[0].targets}
            if names and names <= stopped and not findall(o.body[0].value, m.Attribute(
                    value=m.Name("self"))):
                stopped |= targets  # computed from stopped values only: no gradient to stop
                out.append(u)
                continue
            stopped |= targets
            t.need("jax")
            value = expr("jax.lax.stop_gradient({v})", v=u.body[0].value)
            u = u.with_changes(body=[u.body[0].with_changes(value=value)])
        out.append(u)
    return out
