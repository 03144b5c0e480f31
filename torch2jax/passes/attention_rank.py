"""The rank of the tensors given to ``F.scaled_dot_product_attention`` where the enclosing
function's own lines show it: torch takes any leading dimensions, ``(..., heads, length,
dim)``, jax.nn.dot_product_attention only (batch, length, heads, dim). timm's nest and twins
attend over blocks, ``(B, heads, blocks, length, dim)``: ``qkv = self.qkv(x).reshape(B, T, N,
3, H, C // H).permute(3, 0, 4, 1, 2, 5)``, ``q, k, v = qkv.unbind(0)``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import of_type
from torch2jax.passes.common import bind

_SHAPED = {"reshape", "view", "permute"}  # x.reshape(a, b, c): rank 3
_SAME = {"transpose", "swapaxes", "contiguous", "float", "to", "type_as", "clone", "detach",
         "softmax", "masked_fill"}
_ARGS = ("query", "key", "value")


def rank_args(rw, original: cst.Call, rule) -> dict[str, int]:
    """``{argument: rank}`` for the query, key and value arguments of an attention call
    whose rank the enclosing function's assignments give (every assignment of the name
    agreeing); the others are left out."""
    if rule.special != "scaled_dot_product_attention" or not rw._fn_stack:
        return {}
    fn = rw._fn_stack[-1]
    bound = bind(original.args, rule.params)
    ranks = {}
    for name in _ARGS:
        value = bound.get(name)
        rank = _rank(fn, value, set()) if value is not None else None
        if rank is not None:
            ranks[name] = rank
    return ranks


def _assigned(fn: cst.FunctionDef, name: str) -> list[tuple[cst.BaseExpression, int | None]]:
    """(value, position in an unpacked tuple target or None) of every assignment of
    ``name`` in ``fn``."""
    out: list[tuple[cst.BaseExpression, int | None]] = []
    for a in of_type(fn, cst.Assign):
        for t in a.targets:
            if m.matches(t.target, m.Name(name)):
                out.append((a.value, None))
            elif isinstance(t.target, (cst.Tuple, cst.List)):
                for i, e in enumerate(t.target.elements):
                    if m.matches(e.value, m.Name(name)):
                        out.append((a.value, i))
    return out


def _rank(fn: cst.FunctionDef, node: cst.BaseExpression, seen: set[str],
          unpacked: int | None = None) -> int | None:
    if unpacked is not None:
        # q, k, v = qkv.unbind(0): each one rank less than what it unbinds
        if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("unbind")))):
            inner = _rank(fn, node.func.value, seen)
            return inner - 1 if inner is not None else None
        return None
    if isinstance(node, cst.Name):
        if node.value in seen:
            return None
        assigns = _assigned(fn, node.value)
        ranks = {_rank(fn, v, seen | {node.value}, i) for v, i in assigns}
        ranks.discard(None)  # (q = q * self.scale: the other assignments decide)
        return ranks.pop() if len(ranks) == 1 and assigns else None
    if isinstance(node, cst.BinaryOperation):
        ranks = {_rank(fn, node.left, seen), _rank(fn, node.right, seen)} - {None}
        return ranks.pop() if len(ranks) == 1 else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method = node.func.attr.value
        if method in _SHAPED and node.args and not any(a.star or a.keyword
                                                       for a in node.args):
            if len(node.args) == 1 and isinstance(node.args[0].value, (cst.Tuple, cst.List)):
                elements = node.args[0].value.elements
                if any(isinstance(e, cst.StarredElement) for e in elements):
                    return None
                return len(elements)
            return len(node.args)
        if method in _SAME:
            return _rank(fn, node.func.value, seen)
    return None
