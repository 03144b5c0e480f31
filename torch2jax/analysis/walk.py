"""Read-only traversal of a libcst tree, without libcst's visitor machinery.

``libcst.matchers.findall`` and ``CSTNode.children`` go through
``_visit_and_replace_children``, which builds (and validates) a new copy of every node it
passes: searching a tree costs about as much as transforming it. :func:`walk` reads the
children from the node's fields instead, in the order libcst visits them (read once per node
class from its ``_visit_and_replace_children``), so that

    findall(tree, matcher) == libcst.matchers.findall(tree, matcher)

node for node and in the same order, at about a third of the cost. A class whose order cannot
be read (no source) falls back to ``node.children``. ``tests/test_walk.py`` checks the
equality on real files.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator

import libcst as cst
import libcst.matchers as m

# node class -> (field, how libcst visits it) in visiting order; None: use node.children
_ORDER: dict[type, tuple[tuple[str, int], ...] | None] = {}
_ONE, _OPTIONAL, _SENTINEL, _MANY = range(4)
_KINDS = {"visit_required": _ONE, "visit_optional": _OPTIONAL, "visit_sentinel": _SENTINEL,
          "visit_sequence": _MANY, "visit_body_sequence": _MANY, "visit_iterable": _MANY,
          "visit_body_iterable": _MANY}


def _visit_order(cls: type) -> tuple[tuple[str, int], ...] | None:
    """The fields of ``cls`` in the order its ``_visit_and_replace_children`` visits them (the
    field names handed to libcst's ``visit_*`` helpers, in source order), each with the
    helper's kind, or None when that cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls._visit_and_replace_children)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id.startswith("visit_")]
    if any(c.func.id not in _KINDS or len(c.args) < 3 or not isinstance(c.args[1], ast.Constant)
           or not isinstance(c.args[1].value, str) for c in calls):
        return None
    fields: dict[str, int] = {}
    for c in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        kind = _KINDS[c.func.id]
        if fields.setdefault(c.args[1].value, kind) != kind:
            return None  # (one field visited two ways)
    return tuple(fields.items())


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children``: its direct child nodes in lexical order."""
    try:
        order = _ORDER[type(node)]
    except KeyError:
        order = _ORDER[type(node)] = _visit_order(type(node))
    if order is None:
        return list(node.children)
    out: list[cst.CSTNode] = []
    for name, kind in order:
        value = getattr(node, name)
        if kind is _ONE:
            out.append(value)
        elif kind is _MANY:
            if value:  # (None: a sequence libcst visits only when there is one)
                out.extend(value)
        elif value is not None and value is not cst.MaybeSentinel.DEFAULT:
            out.append(value)
    return out


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it, in libcst's visiting order (pre-order)."""
    stack = [node]
    pop, extend = stack.pop, stack.extend
    while stack:
        n = pop()
        yield n
        kids = children(n)
        if kids:
            kids.reverse()
            extend(kids)


def _types(matcher) -> tuple[type, ...] | None:
    """The libcst classes a node matching ``matcher`` is an instance of; None: not known."""
    if isinstance(matcher, m.OneOf):
        out: list[type] = []
        for option in matcher.options:
            types = _types(option)
            if types is None:
                return None
            out += types
        return tuple(out)
    if isinstance(matcher, m.BaseMatcherNode):
        cls = getattr(cst, type(matcher).__name__, None)
        if isinstance(cls, type) and issubclass(cls, cst.CSTNode):
            return (cls,)
    return None


def findall(tree: cst.CSTNode | cst.RemovalSentinel | cst.MaybeSentinel,
            matcher) -> list[cst.CSTNode]:
    """``libcst.matchers.findall(tree, matcher)`` for a node matcher (or a ``|`` of them)
    without metadata."""
    if isinstance(tree, (cst.RemovalSentinel, cst.MaybeSentinel)):
        return []
    types = _types(matcher)
    if types is None or not isinstance(tree, cst.CSTNode):
        # (MatchIfTrue, AllOf, metadata matchers, a MetadataWrapper: libcst's own search)
        return list(m.findall(tree, matcher))
    return [n for n in walk(tree) if isinstance(n, types) and m.matches(n, matcher)]


def of_type(tree: cst.CSTNode, types: type | tuple[type, ...]) -> list[cst.CSTNode]:
    """The nodes under ``tree`` (itself included) that are instances of ``types``, in
    visiting order."""
    return [n for n in walk(tree) if isinstance(n, types)]


def walk_up(node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, list[cst.CSTNode]]]:
    """``(node, its children)`` for ``node`` and every node under it, each after all the
    nodes under it (post-order: the order in which libcst's visitors leave them)."""
    stack: list[tuple[cst.CSTNode, list[cst.CSTNode], int]] = [(node, children(node), 0)]
    while stack:
        n, kids, i = stack[-1]
        if i < len(kids):
            stack[-1] = (n, kids, i + 1)
            stack.append((kids[i], children(kids[i]), 0))
        else:
            stack.pop()
            yield n, kids


def visit(tree: cst.CSTNode | cst.MetadataWrapper, visitor: cst.CSTVisitor) -> None:
    """``tree.visit(visitor)`` for a read-only ``CSTVisitor`` (on a ``MetadataWrapper``: with
    the visitor's metadata resolved, as ``wrapper.visit`` does): the same ``on_visit`` and
    ``on_leave`` calls in the same order, without copying the tree. The visitor must not
    define attribute hooks (``visit_Call_func``): they are not called."""
    if isinstance(tree, cst.MetadataWrapper):
        with visitor.resolve(tree):
            visit(tree.module, visitor)
        return
    if not visitor.on_visit(tree):
        visitor.on_leave(tree)
        return
    stack = [(tree, iter(children(tree)))]
    on_visit, on_leave = visitor.on_visit, visitor.on_leave
    while stack:
        node, rest = stack[-1]
        child = next(rest, None)
        if child is None:
            stack.pop()
            on_leave(node)
        elif on_visit(child):
            stack.append((child, iter(children(child))))
        else:
            on_leave(child)
