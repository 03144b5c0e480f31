"""Suppressing diagnostics: inline ``# torch2jax: ignore[rule-id]`` comments and ignored rules.

A post-processing step over a :class:`~torch2jax.convert.ConversionResult`; the rewrite itself
knows nothing about it.

* ``# torch2jax: ignore[rule-a, rule-b]`` on a line suppresses those rules' diagnostics for the
  statement the line belongs to (a simple statement, or the header of ``def``/``if``/``for``/
  ``with``/...); a bare ``# torch2jax: ignore`` suppresses every rule there. Rule ids may be
  glob patterns (``torch.distributed.*``).
* ``ignore`` (``[tool.torch2jax] ignore = [...]``) suppresses rules everywhere.

A suppressed diagnostic is dropped, and so is its ``# TODO(torch2jax): <message> [<rule>]``
comment line in the output. The code itself is unchanged: what was left untranslated stays
as it was, only unmarked.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from fnmatch import fnmatchcase

import libcst as cst

MARKER = re.compile(r"#\s*torch2jax:\s*ignore\b(?:\[([^\]]*)\])?")
TODO = re.compile(r"^\s*# TODO\(torch2jax\): (?P<msg>.*) \[(?P<rule>[^\]\[]*)\]\s*$")
ALL = "*"


def _rules_of(text: str) -> set[str]:
    """The rule patterns the markers in ``text`` name (``*`` for a bare marker)."""
    found: set[str] = set()
    for mt in MARKER.finditer(text):
        if mt.group(1) is None:
            found.add(ALL)
        else:
            found |= {r.strip() for r in mt.group(1).split(",") if r.strip()}
    return found


def _matches(rule: str, patterns: Iterable[str]) -> bool:
    return any(p == ALL or p == rule or fnmatchcase(rule, p) for p in patterns)


def _statement_spans(source: str) -> list[tuple[int, int]]:
    """``(first, last)`` line of every statement's own lines (headers for compound ones)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(node.lineno, body[0].lineno - 1)
            if body[0].lineno == node.lineno:  # if x: return y  (one line)
                last = node.lineno
        else:
            last = node.end_lineno or node.lineno
        spans.append((first, last))
    return spans


def suppress(result, source: str, ignore: Iterable[str] = ()):
    """``result`` without the suppressed diagnostics and their TODO comments."""
    ignore = tuple(ignore)
    has_markers = "torch2jax:" in source and MARKER.search(source) is not None
    if not ignore and not has_markers:
        return result
    lines = source.splitlines()
    spans = _statement_spans(source) if has_markers else []

    def markers_at(line: int) -> set[str]:
        if not has_markers:
            return set()
        inner = [s for s in spans if s[0] <= line <= s[1]]
        if inner:
            first, last = min(inner, key=lambda s: s[1] - s[0])
        else:
            first = last = line
        return _rules_of("\n".join(lines[first - 1:last]))

    kept, dropped = [], []
    for d in result.diagnostics:
        if _matches(d.rule, ignore) or _matches(d.rule, markers_at(d.line)):
            dropped.append(d)
        else:
            kept.append(d)
    if not dropped:
        return result
    todos = Counter((d.message, d.rule) for d in dropped if d.severity == "error")
    code = result.code
    if todos:
        code = _drop_todos(code, todos, ignore, has_markers)
    return replace(result, code=code, diagnostics=kept)


def _drop_todos(code: str, todos: Counter, ignore: tuple[str, ...], has_markers: bool) -> str:
    """Remove one TODO comment line per suppressed (message, rule)."""
    if ignore:  # rules ignored everywhere: their TODO lines go wherever they are
        out = []
        for line in code.splitlines(keepends=True):
            mt = TODO.match(line)
            key = (mt.group("msg"), mt.group("rule")) if mt else None
            if key and todos[key] > 0 and _matches(key[1], ignore):
                todos[key] -= 1
                continue
            out.append(line)
        code = "".join(out)
    if not has_markers or not +todos:
        return code
    try:
        module = cst.parse_module(code)
    except cst.ParserSyntaxError:
        return code
    return module.visit(_DropMarkedTodos(module, todos)).code


class _DropMarkedTodos(cst.CSTTransformer):
    """Drop the TODO comments above a statement whose own lines carry a matching marker."""

    def __init__(self, module: cst.Module, todos: Counter) -> None:
        super().__init__()
        self.module = module
        self.todos = todos

    def _header(self, node: cst.CSTNode) -> str:
        text = self.module.code_for_node(node.with_changes(leading_lines=()))
        body = getattr(node, "body", None)
        if isinstance(body, cst.IndentedBlock):
            body_text = self.module.code_for_node(body)
            cut = text.find(body_text)
            head = text[:cut] if cut >= 0 else text
            return head + self.module.code_for_node(body.header)
        return text.split("\n", 1)[0] if isinstance(body, cst.BaseSuite) else text

    def on_leave(self, original_node, updated_node):
        updated = super().on_leave(original_node, updated_node)
        if not isinstance(updated, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return updated
        leading = list(updated.leading_lines)
        if not any(ll.comment and TODO.match(ll.comment.value) for ll in leading):
            return updated
        rules = _rules_of(self._header(updated))
        if not rules:
            return updated
        keep = []
        for ll in leading:
            mt = TODO.match(ll.comment.value) if ll.comment else None
            key = (mt.group("msg"), mt.group("rule")) if mt else None
            if key and self.todos[key] > 0 and _matches(key[1], rules):
                self.todos[key] -= 1
                continue
            keep.append(ll)
        return updated.with_changes(leading_lines=keep)
