"""A value a translation reads more than once, evaluated once: ``(name := value)`` written at
its first read (split from passes/rewrite_calls.py)."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, code


class _Walrus(cst.CSTTransformer):
    """Writes ``(name := value)`` at the first read of ``name`` (in the order Python evaluates
    the translation's calls, attributes and operators: the order of the text), where that read
    is evaluated exactly once (not in a lambda, a comprehension or a branch)."""

    def __init__(self, name: str, value: cst.BaseExpression):
        self.name, self.value = name, value
        self.done = self.failed = False
        self.depth = 0

        self.attrs: set[int] = set()  # attribute names are not reads

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Attribute):
            self.attrs.add(id(node.attr))
        if isinstance(node, (cst.Lambda, cst.BaseComp, cst.IfExp, cst.BooleanOperation)):
            self.depth += 1
        return super().on_visit(node)

    def on_leave(self, original, updated):
        if isinstance(original, (cst.Lambda, cst.BaseComp, cst.IfExp, cst.BooleanOperation)):
            self.depth -= 1
        return super().on_leave(original, updated)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if self.done or updated.value != self.name or id(original) in self.attrs:
            return updated
        self.done = True
        if self.depth:
            self.failed = True
            return updated
        return cst.NamedExpr(target=cst.Name(self.name), value=self.value,
                             lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def write_walrus(out: cst.BaseExpression, name: str,
                  value: cst.BaseExpression) -> cst.BaseExpression:
    writer = _Walrus(name, value)
    if isinstance(out, cst.CSTNode):
        out = out.visit(writer)
    if not writer.done or writer.failed:
        raise Untranslatable(f"`{code(value)}` is used more than once in the translation, and "
                             "is not read first where it is evaluated once: assign it to a "
                             "name first")
    return out
