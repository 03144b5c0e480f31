"""Assignments the translation left with nothing to do: ``x = x.to(device)`` and
``X, y = X.to(device), y.to(device)`` become ``x = x`` and ``X, y = X, y`` once the device
moves are gone (JAX arrays live where jit puts them). Names only, so dropping them changes
nothing; a block they were alone in keeps a ``pass``. An ``if`` with a side-effect-free test
whose body the translation emptied to ``pass`` goes too."""

from __future__ import annotations

import libcst as cst


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _names(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return True
    return isinstance(node, cst.Tuple) and bool(node.elements) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in node.elements)


_PURE = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString, cst.Comparison,
         cst.BooleanOperation, cst.UnaryOperation, cst.ComparisonTarget, cst.BaseCompOp,
         cst.BaseBooleanOp, cst.BaseUnaryOp, cst.LeftParen, cst.RightParen,
         cst.BaseParenthesizableWhitespace)


def _pure(node: cst.CSTNode) -> bool:
    """An expression of names, attributes, literals, comparisons and boolean operators only:
    evaluating it has no effect (no call, no subscript)."""
    return isinstance(node, _PURE) and all(_pure(c) for c in node.children)


def _empty_if(stmt: cst.CSTNode) -> bool:
    """``if grad_clip != 0.0: pass``, what is left of a block whose statements the
    translation moved elsewhere (clipping folded into the optimizer's chain)."""
    return (isinstance(stmt, cst.If) and stmt.orelse is None and _pure(stmt.test)
            and isinstance(stmt.body, cst.IndentedBlock) and (
                not stmt.body.body  # (libcst writes an emptied block as ``pass``)
                or len(stmt.body.body) == 1 and m_pass(stmt.body.body[0])))


def m_pass(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Pass) and not any(
                line.comment for line in stmt.leading_lines)
            and stmt.trailing_whitespace.comment is None)


def _noop(stmt: cst.CSTNode) -> bool:
    if _empty_if(stmt):
        return True
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    a = stmt.body[0]
    return isinstance(a, cst.Assign) and len(a.targets) == 1 and _names(a.value) and _names(
        a.targets[0].target) and code(a.targets[0].target).replace("(", "").replace(
        ")", "").replace(" ", "") == code(a.value).replace("(", "").replace(")", "").replace(
        " ", "")


class DropNoopAssigns(cst.CSTTransformer):
    def _body(self, body: list) -> list:
        out = []
        carried: list[cst.EmptyLine] = []
        for stmt in body:
            if _noop(stmt):
                carried += list(stmt.leading_lines)  # (its comments stay, on the next line)
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*carried, *stmt.leading_lines])
                carried = []
            out.append(stmt)
        if carried or not out:
            out.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=carried))
        return out

    def leave_IndentedBlock(self, original_node, updated_node):
        if not any(_noop(s) for s in updated_node.body):
            return updated_node
        body = self._body(list(updated_node.body))
        lines = list(body[0].leading_lines)
        while lines and lines[0].comment is None:  # (no blank line opens a block)
            lines.pop(0)
        body[0] = body[0].with_changes(leading_lines=lines)
        return updated_node.with_changes(body=body)

    def leave_Module(self, original_node, updated_node):
        if not any(_noop(s) for s in updated_node.body):
            return updated_node
        body = self._body(list(updated_node.body))
        if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and isinstance(
                body[0].body[0], cst.Pass) and not updated_node.body:
            body = []
        return updated_node.with_changes(body=body)
