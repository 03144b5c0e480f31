"""In-place activations that change the tensor they are called on (issue 34).

``nn.ReLU(inplace=True)`` first in a Sequential (VQ-VAE's residual block,
``return x + self.block(x)``) activates the caller's tensor in torch: a read of ``x`` that is
evaluated after the call sees the activated values, so torch computes ``relu(x) + block(x)``.
JAX arrays are immutable: the translation would add the original ``x``, an unmarked wrong
number. Where the activation is idempotent (ReLU, ReLU6: applying it again changes nothing),
the caller's name is rebound to the activated value before the statement (what torch's tensor
holds from the call on); otherwise a read of the name after the call is marked.

Only the calling method's own reads of the name are followed (an alias, ``identity = x``, and
a caller of the method reading the tensor it handed in are not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import try_literal

# torch activation layer -> the position of its ``inplace`` argument
INPLACE_POSITION = {
    "torch.nn.ReLU": 0, "torch.nn.ReLU6": 0, "torch.nn.SELU": 0, "torch.nn.SiLU": 0,
    "torch.nn.Hardswish": 0, "torch.nn.Hardsigmoid": 0, "torch.nn.Mish": 0,
    "torch.nn.LeakyReLU": 1, "torch.nn.ELU": 1, "torch.nn.CELU": 1,
    "torch.nn.Hardtanh": 2, "torch.nn.Threshold": 2, "torch.nn.RReLU": 2,
}
# the idempotent ones: activating the caller's tensor first is torch's result
IDEMPOTENT = {"torch.nn.ReLU": "jax.nn.relu", "torch.nn.ReLU6": "jax.nn.relu6"}


def inplace_activation(node: cst.BaseExpression, q: Callable) -> str | None:
    """The torch activation class ``node`` builds with ``inplace=True``, else None; for an
    ``nn.Sequential(...)``, its first layer's."""
    if not isinstance(node, cst.Call):
        return None
    name = q(node.func)
    if name == "torch.nn.Sequential":
        first = node.args[0] if node.args else None
        return None if first is None or first.star or first.keyword else inplace_activation(
            first.value, q)
    if name not in INPLACE_POSITION:
        return None
    positional = [a for a in node.args if not a.keyword and not a.star]
    for a in node.args:
        if a.keyword and a.keyword.value == "inplace":
            return name if try_literal(a.value, None) is True else None
    at = INPLACE_POSITION[name]
    return name if len(positional) > at and try_literal(positional[at].value, None) is True \
        else None


@dataclass
class Visible:
    """What the caller sees of the in-place activation of ``name``."""

    name: str
    read: bool  # the name's value is read after the call
    rebind: bool  # and no read of it in the statement comes before the call: rebinding it
    # to the activated value before the statement is torch's result


def _line(pos: Callable, node: cst.CSTNode) -> int:
    return pos(node).start.line


def _after(pos: Callable, node: cst.CSTNode, call: cst.Call, parent: Callable) -> bool:
    """Whether the read ``node`` of the statement is evaluated after ``call``: an operand of
    an operation whose other side holds the call (``x + self.block(x)``: the sum is taken
    after), or written after it (``self.block(x) + x``, ``f(self.block(x), x)``)."""
    up = parent(node)
    while isinstance(up, cst.ComparisonTarget):
        up = parent(up)
    if isinstance(up, (cst.BinaryOperation, cst.Comparison)) and findall(
            up, m.Call()) and any(c is call for c in findall(up, m.Call())):
        return True
    a, b = pos(node).start, pos(call).end
    return (a.line, a.column) >= (b.line, b.column)


def visible_reads(fn: cst.FunctionDef, call: cst.Call, statement: cst.CSTNode,
                  parent: Callable, pos: Callable) -> Visible | None:
    """For ``call`` (``self.block(x)``, the activation in place on ``x``) in ``statement`` of
    ``fn`` (``pos``: a node's CodeRange): whether ``x`` is read after the call, in the
    statement or in the ones after it until ``x`` is assigned again."""
    if len(call.args) != 1 or call.args[0].keyword or call.args[0].star or not isinstance(
            call.args[0].value, cst.Name):
        return None
    arg = call.args[0].value
    x = arg.value
    stores = _stores(fn, x, parent)
    same = [n for n in findall(statement, m.Name(x)) if n is not arg and id(n) not in stores]
    start, end = _line(pos, statement), _end_line(statement, pos)
    names = [n for n in findall(fn, m.Name(x)) if n is not arg]
    later: list[cst.Name] = []
    if not any(start <= _line(pos, n) <= end for n in names if id(n) in stores):
        rebound = min((_line(pos, n) for n in names if id(n) in stores
                       and _line(pos, n) > end), default=None)
        later = [n for n in names if id(n) not in stores and _line(pos, n) > end
                 and (rebound is None or _line(pos, n) <= rebound)]
    after = [n for n in same if _after(pos, n, call, parent)]
    before = len(same) > len(after)
    return Visible(x, read=bool(after or later),
                   rebind=not before and isinstance(statement, cst.SimpleStatementLine))


def _end_line(node: cst.CSTNode, pos: Callable) -> int:
    names = findall(node, m.Name())
    return max((_line(pos, n) for n in names), default=_line(pos, node))


def _stores(fn: cst.FunctionDef, x: str, parent: Callable) -> set[int]:
    """The ids of the Name nodes of ``x`` that ``fn`` assigns to (targets, loop targets)."""
    out: set[int] = set()
    for n in findall(fn, m.Name(x)):
        node, up = n, parent(n)
        while isinstance(up, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            node, up = up, parent(up)
        if isinstance(up, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.CompFor)) and (
                getattr(up, "target", None) is node):
            out.add(id(n))
    return out
