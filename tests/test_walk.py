"""torch2jax/analysis/walk.py: the read-only traversal finds what libcst's own visitors find,
node for node and in the same order, on real files and on every kind of syntax."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest

from torch2jax.analysis.walk import (
    TRIVIA,
    NoAttributeHooks,
    children,
    findall,
    of_type,
    visit,
    walk,
)

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("fixtures/**/*.py"), *ROOT.glob("tests/data/*.py"),
                *ROOT.glob("benchmarks/models/*.py"), ROOT / "torch2jax/passes/layout_blocks.py",
                ROOT / "torch2jax/cli.py"])

SYNTAX = textwrap.dedent('''
    """Docstring."""
    from __future__ import annotations
    import a.b as c, d
    from .x import (y as z, w)
    from . import *

    @decorator(1, k=2)
    @other
    class K[T](Base, metaclass=Meta):
        x: int = 1
        type Alias[U] = list[U]

        async def f[V](self, a, /, b=2, *args: int, c, d=3, **kw) -> "K":
            global g
            async with ctx() as (p, q), other:
                async for i in aiter():
                    await i
            try:
                pass
            except* ValueError as e:
                raise KeyError from e
            finally:
                del a[0], b.c
            return (yield from gen()) if b else lambda x=1, *y, **z: x

        def g(self):
            def h():
                nonlocal q
            q = [i ** 2 for i in range(3) if i] + [*{j: k for j, k in {}.items()}]
            s = {1, 2, *x} | {v async for v in w}
            t = (e for e in x)
            u = f"{self!r:>{width}} {{}} {x=}" "implicit" 'concat'
            v = b"bytes" + rb'raw'
            w = x[1:2, ::3, ...][-1]
            if (n := len(w)) > 2 and not n < 3 or n in w is not None:
                assert n, "msg"
            elif n:
                ...
            else:
                while True:
                    break
                else:
                    continue
            match w:
                case [1, *rest] | (2, 3):
                    pass
                case {"k": v, **others} if v:
                    pass
                case Point(x=0, y=yy) as pt:
                    pass
                case _:
                    pass
            x += 1; y @= z; z **= 2
            with open(f) as fh, other():
                print(*a, sep="", **kw)
            for i, (j, k) in enumerate(t):
                i: float
            return -x, +y, ~z, not w
''')


def _libcst_all(tree: cst.CSTNode) -> list[cst.CSTNode]:
    return list(m.findall(tree, m.MatchIfTrue(lambda n: True)))


MATCHERS = [
    m.Name(),
    m.Name("self"),
    m.Call(func=m.Attribute(value=m.Name("self"))),
    m.Assign(targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self")))]),
    m.FunctionDef() | m.Lambda() | m.ClassDef(),
    m.Attribute(attr=m.Name("weight")) | m.Subscript(),
    m.Return(),
]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_walk_visits_what_libcst_visits(path):
    tree = cst.parse_module(path.read_text(encoding="utf-8"))
    assert [id(n) for n in walk(tree)] == [id(n) for n in _libcst_all(tree)]


def test_every_kind_of_syntax():
    tree = cst.parse_module(SYNTAX)
    nodes = list(walk(tree))
    assert [id(n) for n in nodes] == [id(n) for n in _libcst_all(tree)]
    assert len({type(n) for n in nodes}) > 120  # the snippet covers most node classes
    for n in nodes:
        assert [id(c) for c in children(n)] == [id(c) for c in n.children]
    for matcher in MATCHERS:
        assert findall(tree, matcher) == list(m.findall(tree, matcher))


def test_findall_and_of_type_on_real_files():
    for path in FILES[::4]:
        tree = cst.parse_module(path.read_text(encoding="utf-8"))
        for matcher in MATCHERS:
            got = findall(tree, matcher)
            assert [id(n) for n in got] == [id(n) for n in m.findall(tree, matcher)], matcher
        calls = of_type(tree, cst.Call)
        assert [id(n) for n in calls] == [id(n) for n in m.findall(tree, m.Call())]


def test_shared_nodes_and_sentinels():
    """A transformed tree may hold one node object in two places: both are visited, as by
    libcst."""
    x = cst.Name("x")
    tree = cst.BinaryOperation(left=x, operator=cst.Add(), right=x)
    assert [id(n) for n in walk(tree)] == [id(n) for n in _libcst_all(tree)]
    assert len(findall(tree, m.Name("x"))) == 2
    assert findall(cst.RemoveFromParent(), m.Name()) == []
    assert findall(cst.MaybeSentinel.DEFAULT, m.Name()) == []


def test_trivia_subtrees_hold_only_trivia():
    """Pruning a trivia subtree can only drop trivia nodes."""
    for path in [*FILES[::3]]:
        tree = cst.parse_module(path.read_text(encoding="utf-8"))
        for n in walk(tree):
            if type(n) in TRIVIA:
                assert all(type(d) in TRIVIA for d in walk(n)), type(n)
        assert [id(n) for n in walk(tree, trivia=False)] == [
            id(n) for n in walk(tree) if type(n) not in TRIVIA]


class _Recorder(NoAttributeHooks, cst.CSTVisitor):
    """Records its visit_/leave_ calls for a few node types (no trivia handlers: the fast
    visit skips the trivia)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def visit_Name(self, node):
        self.calls.append(("Name", id(node)))

    def visit_Call(self, node):
        self.calls.append(("Call", id(node)))
        return not (isinstance(node.func, cst.Name) and node.func.value == "print")

    def leave_Call(self, node):
        self.calls.append(("/Call", id(node)))

    def visit_FunctionDef(self, node):
        self.calls.append(("FunctionDef", id(node)))

    def leave_FunctionDef(self, node):
        self.calls.append(("/FunctionDef", id(node)))


class _RecorderAll(_Recorder):
    """Overrides on_visit: the fast visit must visit every node, trivia included."""

    def on_visit(self, node):
        self.calls.append(("on_visit", id(node)))
        return super().on_visit(node)


def test_visit_calls_what_libcst_calls():
    for source in [SYNTAX, *(p.read_text(encoding="utf-8") for p in FILES[::5])]:
        tree = cst.parse_module(source)
        for cls in (_Recorder, _RecorderAll):
            ours, theirs = cls(), cls()
            visit(tree, ours)
            tree.visit(theirs)
            assert ours.calls == theirs.calls and ours.calls


def test_attribute_hooks_are_refused():
    with pytest.raises(TypeError, match="attribute hook"):
        class _Hooked(NoAttributeHooks, cst.CSTVisitor):
            def visit_Call_func(self, node):
                pass
    with pytest.raises(TypeError, match="NoAttributeHooks"):
        visit(cst.parse_module("x = 1\n"), cst.CSTVisitor())


def test_metadata_as_libcst_computes_it():
    """analysis/metadata.py: the same parents and positions as libcst's providers, and the
    qualified names of libcst's QualifiedNameProvider through ScopeProvider."""
    from libcst import metadata as lm

    from torch2jax.analysis.index import qualified
    from torch2jax.analysis.metadata import FileMetadata, ParentNodeProvider, PositionProvider

    class _Scoped(cst.CSTVisitor):
        METADATA_DEPENDENCIES = (lm.ScopeProvider,)

    for source in [SYNTAX, *(p.read_text(encoding="utf-8") for p in FILES[::5])]:
        tree = cst.parse_module(source)
        ours = FileMetadata(tree)
        theirs = lm.MetadataWrapper(tree, unsafe_skip_copy=True)
        got = ours.resolve_many([ParentNodeProvider, PositionProvider, lm.ScopeProvider])
        want = theirs.resolve_many([lm.ParentNodeProvider, lm.PositionProvider,
                                    lm.QualifiedNameProvider])
        assert dict(got[ParentNodeProvider]) == dict(want[lm.ParentNodeProvider])
        assert dict(got[PositionProvider]) == dict(want[lm.PositionProvider])
        scoped = _Scoped()
        names = want[lm.QualifiedNameProvider]
        with scoped.resolve(ours):
            for node in walk(tree):
                value = names[node]
                value = value() if callable(value) else value
                assert qualified(scoped, node) == (min(n.name for n in value) if value
                                                   else None)
