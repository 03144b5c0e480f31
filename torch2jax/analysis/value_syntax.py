"""The value analysis' pure helpers over the syntax tree (:mod:`torch2jax.analysis.values`
reads them): dotted names, positions, the ``isinstance`` tests and pair idioms it narrows by,
a method's ``self.x = ...`` assignments and a function's returned values."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

# einops' functions that return a tensor of their first argument's kind
_EINOPS_TENSOR_FUNCTIONS = frozenset({"rearrange", "reduce", "repeat", "einsum"})


def _dotted(node: cst.BaseExpression) -> bool:
    """``a`` / ``a.b.c``: a name that may resolve to an import."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _at(position) -> tuple[int, int]:
    return position.line, position.column


def _isinstance_class(test: cst.BaseExpression, name: str) -> cst.BaseExpression | None:
    """The class of ``isinstance(name, C)`` when ``test`` is that call or an ``and`` of it."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _isinstance_class(test.left, name) or _isinstance_class(test.right, name)
    if (isinstance(test, cst.Call) and m.matches(test.func, m.Name("isinstance"))
            and len(test.args) == 2 and not any(a.keyword or a.star for a in test.args)
            and m.matches(test.args[0].value, m.Name(name))
            and not isinstance(test.args[1].value, cst.Tuple)):
        return test.args[1].value
    return None


def _none_branch(node: cst.BaseExpression) -> bool:
    """``None``, or a conditional with a None branch."""
    if isinstance(node, cst.Name):
        return node.value == "None"
    if isinstance(node, cst.IfExp):
        return _none_branch(node.body) or _none_branch(node.orelse)
    return False


def _collect_self_assignments(fn: cst.FunctionDef,
                              attrs: dict[str, list[cst.BaseExpression]]) -> None:
    """``self.x = value`` (and ``self.register_buffer("x", value)``) in ``fn``, not in
    nested functions or classes."""
    stack: list[cst.CSTNode] = list(fn.body.children)
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, cst.Assign):
            for t in node.targets:
                target = t.target
                if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                        and target.value.value == "self":
                    attrs.setdefault(target.attr.value, []).append(node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None and isinstance(
                node.target, cst.Attribute) and isinstance(node.target.value, cst.Name) and \
                node.target.value.value == "self":
            attrs.setdefault(node.target.attr.value, []).append(node.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and (
                node.func.attr.value == "register_buffer") and len(node.args) >= 2 and \
                isinstance(node.args[0].value, cst.SimpleString):
            attrs.setdefault(node.args[0].value.evaluated_value, []).append(node.args[1].value)
        elif isinstance(node, cst.Call) and m.matches(node, m.Call(
                func=m.Name("setattr"), args=[m.Arg(value=m.Name("self"), keyword=None),
                                              m.Arg(keyword=None), m.Arg(keyword=None)])):
            key = _attr_key(node.args[1].value)  # setattr(self, f"{kind}_inv_freq", value)
            if key is not None:
                attrs.setdefault(key, []).append(node.args[2].value)
        if isinstance(node, cst.BaseExpression) and not isinstance(node, cst.Call):
            continue
        stack.extend(node.children)


_SEQUENCE_TYPES = {"Iterable", "abc.Iterable", "collections.abc.Iterable", "Sequence",
                   "abc.Sequence", "collections.abc.Sequence", "tuple", "list",
                   "(tuple, list)", "(list, tuple)"}


_SCALAR_TYPES = {"int", "float", "(int, float)", "(float, int)"}


def _pair_idiom(node: cst.IfExp) -> cst.Tuple | None:
    """``p if isinstance(p, Iterable) else (p, p)`` (transformers' vision embeddings), or
    ``(p, p) if isinstance(p, int) else p`` (CLAP's, Swin's): p when it is a sequence already,
    else a tuple of it. Returns that tuple."""
    test, code = node.test, cst.Module([]).code_for_node
    if not (isinstance(test, cst.Call) and m.matches(test.func, m.Name("isinstance"))
            and len(test.args) == 2):
        return None
    subject, types = code(test.args[0].value), code(test.args[1].value)
    pair, other, wanted = ((node.orelse, node.body, _SEQUENCE_TYPES)
                           if isinstance(node.orelse, cst.Tuple)
                           else (node.body, node.orelse, _SCALAR_TYPES))
    if (isinstance(pair, cst.Tuple) and code(other) == subject and types in wanted
            and all(code(e.value) == subject for e in pair.elements)):
        return pair
    return None


def _attr_key(name: cst.BaseExpression) -> str | None:
    """The attribute a ``getattr``/``setattr`` name stands for: a string literal's value, or
    an f-string's source (``f"{kind}_inv_freq"``: the same attribute where the same
    f-string is written)."""
    if isinstance(name, cst.SimpleString):
        return name.evaluated_value
    if isinstance(name, cst.FormattedString):
        return cst.Module([]).code_for_node(name)
    return None


def _return_values(fn: cst.FunctionDef) -> list[cst.BaseExpression]:
    """The values ``fn`` returns (not its nested functions'); empty for a generator."""
    out = []
    stack: list[cst.CSTNode] = list(fn.body.children)
    while stack:
        node = stack.pop()
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(node, (cst.Yield,)):
            return []
        if isinstance(node, cst.Return):
            out.append(node.value if node.value is not None else cst.Name("None"))
            continue
        stack.extend(node.children)
    return out


_EINOPS_GROUP = re.compile(r"\([^()]*\)|[^\s()]+")


def channels_last_pattern(pattern: str) -> str | None:
    """An einops pattern over torch's (N, C, H, W) read on channels-last arrays:
    ``"b c (h p1) (w p2) -> b (c p1 p2) h w"`` -> ``"b (h p1) (w p2) c -> b h w (c p1 p2)"``.
    Both sides must be four axes written out (no ``...``): the second of each moves last, as
    ``jnp.moveaxis(x, 1, -1)`` moves the array's. None for any other pattern."""
    if "..." in pattern or "…" in pattern or pattern.count("->") != 1:
        return None
    sides = []
    for side in pattern.split("->"):
        groups = _EINOPS_GROUP.findall(side)
        if len(groups) != 4 or "".join("".join(groups).split()) != "".join(side.split()):
            return None
        sides.append(" ".join([groups[0], *groups[2:], groups[1]]))
    return " -> ".join(sides)


def passed_arguments(scope, parents: dict, target: cst.FunctionDef | cst.ClassDef,
                     fn: cst.FunctionDef, param: cst.Param, method: bool
                     ) -> list[cst.BaseExpression] | None:
    """The expressions the file passes for ``param`` of ``fn`` where it calls ``target`` (the
    function by its name, or the class whose ``__init__`` ``fn`` is: ``method``, its ``self``
    left out), positionally or by keyword, one per call that passes it; None where a call
    passes ``*args`` or ``**kwargs`` (what it passes is not known)."""
    positional = [*fn.params.posonly_params, *fn.params.params][1 if method else 0:]
    index = next((i for i, p in enumerate(positional) if p is param), None)
    found: list[cst.BaseExpression] = []
    for assignment in scope.assignments[target.name.value]:
        if getattr(assignment, "node", None) is not target:
            continue
        for access in assignment.references:
            call = parents.get(access.node)
            if not isinstance(call, cst.Call) or call.func is not access.node:
                continue
            if any(a.star for a in call.args):
                return None
            given = None
            for i, a in enumerate(a for a in call.args if a.keyword is None):
                if i == index:
                    given = a.value
            for a in call.args:
                if a.keyword is not None and a.keyword.value == param.name.value:
                    given = a.value
            if given is not None:
                found.append(given)
    return found
