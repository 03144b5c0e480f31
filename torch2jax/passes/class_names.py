"""Tests of a module's class name (the DCGAN example's ``weights_init``)::

    classname = m.__class__.__name__
    if classname.find("Conv") != -1: ...
    elif "BatchNorm" in classname: ...

The name tested is torch's (``Conv2d``, ``BatchNorm2d``); the converted model's classes are
named otherwise (``nnx.Conv``, ``nnx.BatchNorm``), so the test is not kept as text: it is
evaluated on the torch classes the walked module can be, and the classes it selects become an
``isinstance`` test of their JAX classes (``rewrite_classes.ClassesMixin._class_name_test``).
This module only reads the test: which expression's class it names, and the predicate on a
class name it applies."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code

# class_name_test's result: the subject (the code of the expression whose class is tested)
# and the predicate on a class name
NameTest = tuple[str, Callable[[str], bool]]

_CLASS_NAME = m.Attribute(value=m.Attribute(attr=m.Name("__class__")), attr=m.Name("__name__"))
_TYPE_NAME = m.Attribute(value=m.Call(func=m.Name("type"), args=[m.Arg()]),
                         attr=m.Name("__name__"))


def _subject(node: cst.BaseExpression, fn: cst.FunctionDef | None) -> str | None:
    """``m.__class__.__name__`` / ``type(m).__name__`` -> ``m``; a name assigned one of them
    once in ``fn`` (and nowhere else in it) likewise."""
    if m.matches(node, _CLASS_NAME):
        return code(node.value.value)
    if m.matches(node, _TYPE_NAME):
        return code(node.value.args[0].value)
    if isinstance(node, cst.Name) and fn is not None:
        assigns, others = _bindings(fn)
        found = assigns.get(node.value, [])
        if len(found) == 1 and others.get(node.value, 0) == 1 and (
                m.matches(found[0].value, _CLASS_NAME | _TYPE_NAME)):
            return _subject(found[0].value, None)
    return None


# fn -> (name -> its one-target assignments, name -> how often it is bound): read once per
# function (a test of each name in a long function walked it again: quadratic in its size)
_BINDINGS: dict[int, tuple[cst.FunctionDef, dict[str, list[cst.Assign]], dict[str, int]]] = {}


def _bindings(fn: cst.FunctionDef) -> tuple[dict[str, list[cst.Assign]], dict[str, int]]:
    hit = _BINDINGS.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1], hit[2]
    assigns: dict[str, list[cst.Assign]] = {}
    for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        assigns.setdefault(a.targets[0].target.value, []).append(a)
    others: dict[str, int] = {}
    for b in m.findall(fn, m.AssignTarget(target=m.Name()) | m.AugAssign(target=m.Name())
                       | m.For(target=m.Name())):
        others[b.target.value] = others.get(b.target.value, 0) + 1
    if len(_BINDINGS) > 256:
        _BINDINGS.clear()
    _BINDINGS[id(fn)] = (fn, assigns, others)
    return assigns, others


def _text(node: cst.BaseExpression) -> str | None:
    return node.evaluated_value if isinstance(node, cst.SimpleString) and isinstance(
        node.evaluated_value, str) else None


def _number(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if m.matches(node, m.UnaryOperation(operator=m.Minus(), expression=m.Integer())):
        return -int(node.expression.value)
    return None


def class_name_test(test: cst.BaseExpression, fn: cst.FunctionDef | None) -> NameTest | None:
    """The subject and predicate of ``test`` when it is a test of a class name:
    ``name.find("X") != -1`` (``>= 0``, ``> -1``), ``"X" in name``, ``name == "X"``,
    ``name.startswith("X")`` / ``endswith``; ``not`` and ``==  -1`` / ``not in`` / ``!=``
    negate. None for any other test."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = class_name_test(test.expression, fn)
        return (inner[0], lambda n, f=inner[1]: not f(n)) if inner else None
    if isinstance(test, cst.Call) and m.matches(test.func, m.Attribute(
            attr=m.Name("startswith") | m.Name("endswith"))) and len(test.args) == 1 and (
            not test.args[0].keyword and not test.args[0].star):
        s, x = _subject(test.func.value, fn), _text(test.args[0].value)
        if s is None or x is None:
            return None
        if test.func.attr.value == "startswith":
            return s, lambda n: n.startswith(x)
        return s, lambda n: n.endswith(x)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    left, op, right = test.left, test.comparisons[0].operator, test.comparisons[0].comparator
    if isinstance(op, (cst.In, cst.NotIn)):
        s, x = _subject(right, fn), _text(left)
        if s is None or x is None:
            return None
        inside = isinstance(op, cst.In)
        return s, lambda n: (x in n) == inside
    if isinstance(op, (cst.Equal, cst.NotEqual, cst.GreaterThanEqual, cst.GreaterThan)) and \
            m.matches(left, m.Call(func=m.Attribute(attr=m.Name("find")), args=[m.Arg(
                keyword=None, star="")])):
        s, x, k = _subject(left.func.value, fn), _text(left.args[0].value), _number(right)
        if s is None or x is None or k is None:
            return None
        found = {(cst.NotEqual, -1): True, (cst.Equal, -1): False,
                 (cst.GreaterThanEqual, 0): True, (cst.GreaterThan, -1): True}.get(
                     (type(op), k))
        if found is None:
            return None
        return s, lambda n: (x in n) == found
    if isinstance(op, (cst.Equal, cst.NotEqual)):
        for a, b in ((left, right), (right, left)):
            s, x = _subject(a, fn), _text(b)
            if s is not None and x is not None:
                same = isinstance(op, cst.Equal)
                return s, lambda n, x=x, same=same: (n == x) == same
    return None


def narrowed_by(test: cst.BaseExpression, subject: str,
                fn: cst.FunctionDef | None) -> NameTest | None:
    """``class_name_test`` of ``test`` (or of one operand of an ``and`` in it) about
    ``subject``."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return narrowed_by(test.left, subject, fn) or narrowed_by(test.right, subject, fn)
    found = class_name_test(test, fn)
    return found if found is not None and found[0] == subject else None
