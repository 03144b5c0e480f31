"""Read-only traversal of a libcst tree, without libcst's visitor machinery.

``libcst.matchers.findall``, ``CSTNode.visit`` and ``CSTNode.children`` all go through
``_visit_and_replace_children``, which builds (and validates) a new copy of every node it
passes: even a read-only search of a tree costs as much as transforming it. Here the children
are read from the node's fields instead, in the order libcst visits them (read once per node
class from its ``_visit_and_replace_children``), so that

    findall(tree, matcher) == libcst.matchers.findall(tree, matcher)
    visit(tree, visitor)   calls what tree.visit(visitor) calls, in the same order

node for node, at a fraction of the cost. A class whose order cannot be read (no source)
falls back to ``node.children``. Searches for nodes that are not whitespace, comments or
punctuation (:data:`TRIVIA`) skip those subtrees, which hold most of a tree's nodes.
``tests/test_walk.py`` checks the equalities on real files and on every kind of syntax.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterator

import libcst as cst
import libcst.matchers as m

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


def _no_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    return []


def _libcst_children(node: cst.CSTNode) -> list[cst.CSTNode]:
    return list(node.children)


def _children_function(cls: type) -> Callable[[cst.CSTNode], list[cst.CSTNode]]:
    """A function returning the children of a ``cls`` node, written out field by field."""
    order = _visit_order(cls)
    if order is None:
        return _libcst_children
    if not order:
        return _no_children
    lines = ["def children(n):", "    out = []"]
    for name, kind in order:
        if kind == _ONE:
            lines.append(f"    out.append(n.{name})")
        elif kind == _MANY:  # (None: a sequence libcst visits only when there is one)
            lines += [f"    v = n.{name}", "    if v:", "        out.extend(v)"]
        else:
            lines += [f"    v = n.{name}", "    if v is not None and v is not DEFAULT:",
                      "        out.append(v)"]
    lines.append("    return out")
    namespace = {"DEFAULT": cst.MaybeSentinel.DEFAULT}
    exec(compile("\n".join(lines), f"<children of {cls.__name__}>", "exec"),  # noqa: S102
         namespace)
    return namespace["children"]


class _Children(dict):
    def __missing__(self, cls: type) -> Callable[[cst.CSTNode], list[cst.CSTNode]]:
        fn = self[cls] = _children_function(cls)
        return fn


_CHILDREN = _Children()


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children``: its direct child nodes in lexical order."""
    return _CHILDREN[type(node)](node)


# Whitespace, comments, punctuation and operators: nodes whose subtrees hold only such nodes
# and which no analysis looks for (about two thirds of the nodes of a parsed file).
TRIVIA: frozenset[type] = frozenset({
    cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.Newline, cst.TrailingWhitespace,
    cst.EmptyLine, cst.Comment, cst.Comma, cst.Dot, cst.Colon, cst.Semicolon, cst.AssignEqual,
    cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket,
    cst.LeftCurlyBrace, cst.RightCurlyBrace,
    *(c for base in (cst.BaseBinaryOp, cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp,
                     cst.BaseAugOp)
      for c in vars(cst).values()
      if isinstance(c, type) and issubclass(c, base) and not inspect.isabstract(c)),
})


def _finds_trivia(types: tuple[type, ...]) -> bool:
    """Whether a node of one of ``types`` may be a trivia node."""
    return any(issubclass(t, types) for t in TRIVIA)


def walk(node: cst.CSTNode, trivia: bool = True) -> Iterator[cst.CSTNode]:
    """``node`` and every node under it, in libcst's visiting order (pre-order); with
    ``trivia=False``, without the :data:`TRIVIA` nodes under ``node``."""
    stack = [node]
    pop, extend = stack.pop, stack.extend
    table = _CHILDREN
    while stack:
        n = pop()
        yield n
        kids = table[type(n)](n)
        if kids:
            if not trivia:
                kids = [k for k in kids if type(k) not in TRIVIA]
            kids.reverse()
            extend(kids)


def walk_up(node: cst.CSTNode, trivia: bool = True
            ) -> Iterator[tuple[cst.CSTNode, list[cst.CSTNode]]]:
    """``(node, its children)`` for ``node`` and every node under it, each after all the
    nodes under it (post-order: the order in which libcst's visitors leave them); with
    ``trivia=False``, without the :data:`TRIVIA` nodes under ``node``."""
    table = _CHILDREN

    def kids_of(n: cst.CSTNode) -> list[cst.CSTNode]:
        kids = table[type(n)](n)
        return kids if trivia else [k for k in kids if type(k) not in TRIVIA]

    stack: list[tuple[cst.CSTNode, list[cst.CSTNode], int]] = [(node, kids_of(node), 0)]
    while stack:
        n, kids, i = stack[-1]
        if i < len(kids):
            stack[-1] = (n, kids, i + 1)
            stack.append((kids[i], kids_of(kids[i]), 0))
        else:
            stack.pop()
            yield n, kids


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
    return [n for n in walk(tree, _finds_trivia(types))
            if isinstance(n, types) and m.matches(n, matcher)]


def of_type(tree: cst.CSTNode, types: type | tuple[type, ...]) -> list[cst.CSTNode]:
    """The nodes under ``tree`` (itself included) that are instances of ``types``, in
    visiting order."""
    types = types if isinstance(types, tuple) else (types,)
    return [n for n in walk(tree, _finds_trivia(types)) if isinstance(n, types)]


_NODE_NAMES = frozenset(name for name, c in vars(cst).items()
                        if isinstance(c, type) and issubclass(c, cst.CSTNode))
_TRIVIA_NAMES = frozenset(c.__name__ for c in TRIVIA)


class NoAttributeHooks:
    """For a libcst visitor or transformer without attribute hooks (``visit_Call_func``,
    ``leave_ClassDef_bases``): libcst looks such a hook up by name twice for every field of
    every node it passes (finding libcst's no-op stubs); with this mixed in first, it does
    not. A subclass that defines an attribute hook is refused when the class is created."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for c in cls.__mro__:
            if c.__module__.split(".")[0] == "libcst":
                continue  # (libcst's visitor classes define every hook as a no-op)
            for name in vars(c):
                parts = name.split("_", 2)
                if len(parts) == 3 and parts[0] in ("visit", "leave") and \
                        parts[1] in _NODE_NAMES:
                    raise TypeError(f"{c.__name__}.{name}: an attribute hook, which "
                                    "NoAttributeHooks does not call")

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None


_SKIPS_TRIVIA: dict[type, bool] = {}


def _skips_trivia(cls: type) -> bool:
    """Whether visiting the trivia nodes cannot change what ``cls`` does: no method of its
    own for them, and libcst's own ``on_visit`` / ``on_leave``."""
    if cls not in _SKIPS_TRIVIA:
        own = [c for c in cls.__mro__ if c.__module__.split(".")[0] != "libcst"]
        _SKIPS_TRIVIA[cls] = not any(
            name in ("on_visit", "on_leave")
            or name.split("_", 1)[0] in ("visit", "leave")
            and name.split("_", 1)[-1] in _TRIVIA_NAMES
            for c in own for name in vars(c))
    return _SKIPS_TRIVIA[cls]


def visit(tree: cst.CSTNode | cst.MetadataWrapper, visitor: cst.CSTVisitor) -> None:
    """``tree.visit(visitor)`` for a read-only ``CSTVisitor`` that mixes in
    :class:`NoAttributeHooks` (on a ``MetadataWrapper``: with the visitor's metadata resolved,
    as ``wrapper.visit`` does): the same ``on_visit`` and ``on_leave`` calls in the same order,
    without copying the tree, and without the trivia nodes when the visitor has nothing to do
    with them."""
    if not isinstance(visitor, NoAttributeHooks):
        raise TypeError(f"{type(visitor).__name__} must mix in NoAttributeHooks")
    if isinstance(tree, cst.MetadataWrapper):
        with visitor.resolve(tree):
            visit(tree.module, visitor)
        return
    on_visit, on_leave, table = visitor.on_visit, visitor.on_leave, _CHILDREN
    skip = TRIVIA if _skips_trivia(type(visitor)) else frozenset()

    def one(node: cst.CSTNode) -> None:  # (recursion: a tenth of libcst's own depth)
        if on_visit(node):
            for child in table[type(node)](node):
                if type(child) not in skip:
                    one(child)
        on_leave(node)

    one(tree)
