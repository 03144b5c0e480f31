"""Assignments the translation left with nothing to do: ``x = x.to(device)`` and
``X, y = X.to(device), y.to(device)`` become ``x = x`` and ``X, y = X, y`` once the device
moves are gone (JAX arrays live where jit puts them). Names only, so dropping them changes
nothing; a block they were alone in keeps a ``pass``."""

from __future__ import annotations

import libcst as cst


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _names(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return True
    return isinstance(node, cst.Tuple) and bool(node.elements) and all(
        isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in node.elements)


def _noop(stmt: cst.CSTNode) -> bool:
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
