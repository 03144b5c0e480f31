"""The literal values an expression can hold, where the file shows them all: ``self.mode`` set
once, in ``__init__``, from a parameter with a literal default, and the file's constructions of
the class passing literals for it (a U-Net's ``Up(..., mode="bilinear")``).

The answer serves a translation that picks among the values at run time (``F.interpolate``'s
mode, a Python string, static under jit); it is what this file shows, not a proof (another
file may construct the class with another value), so the translation checks the value it gets.
"""

from __future__ import annotations

import ast

import libcst as cst

from torch2jax.analysis.value_syntax import passed_arguments

_NOT_LITERAL = object()


def try_literal(node: cst.BaseExpression, default):
    """The Python literal ``node`` spells, or ``default``."""
    try:
        return ast.literal_eval(cst.Module([]).code_for_node(node))
    except (ValueError, SyntaxError, TypeError):
        return default


def literal_choices(facts, node: cst.BaseExpression) -> tuple | None:
    """The literals ``node`` may hold, in the order the file shows them (the default first), or
    None where the file does not show them all. ``facts``: the file's ``ValueFacts``."""
    value = try_literal(node, _NOT_LITERAL)
    if value is not _NOT_LITERAL:
        return (value,)
    if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
            and node.value.value == "self"):
        return None
    cls = facts.value(node.value).cls
    if cls is None or facts._file_class(cls) is None:
        return None
    assigned = facts._class_values(cls, node.attr.value)
    if len(assigned) != 1:  # set once
        return None
    value = try_literal(assigned[0], _NOT_LITERAL)
    if value is not _NOT_LITERAL:
        return (value,)
    param = _init_param(facts, assigned[0], cls)
    return None if param is None else _param_choices(facts, param, cls)


def _init_param(facts, node: cst.BaseExpression, cls: str) -> cst.Param | None:
    """The parameter of ``cls.__init__`` that ``node`` (a name) reads, unless rebound there."""
    if not isinstance(node, cst.Name):
        return None
    access = facts._access(node)
    referents = [getattr(a, "node", None) for a in access.referents] if access else []
    if len(referents) != 1 or not isinstance(referents[0], cst.Param):
        return None
    fn = facts._parents.get(facts._parents.get(referents[0]))
    if not (isinstance(fn, cst.FunctionDef) and fn.name.value == "__init__"
            and facts._parents.get(facts._parents.get(fn)) is facts._classes[cls]):
        return None
    return referents[0]


def _param_choices(facts, param: cst.Param, cls: str) -> tuple | None:
    """The default of ``param`` (a literal) and the literals the file's calls of the class pass
    for it; None where one is not a literal (or passed through ``*args`` / ``**kwargs``)."""
    found: list = []
    if param.default is not None:
        default = try_literal(param.default, _NOT_LITERAL)
        if default is _NOT_LITERAL:
            return None
        found.append(default)
    node = facts._classes[cls]
    fn = facts._parents.get(facts._parents.get(param))
    scope = facts._scopes.get(node)
    given = None if scope is None else passed_arguments(scope, facts._parents, node, fn, param,
                                                        True)
    if given is None:
        return None
    for g in given:
        value = try_literal(g, _NOT_LITERAL)
        if value is _NOT_LITERAL:
            return None
        found.append(value)
    if not found:
        return None
    return tuple(dict.fromkeys(found))


def param_name_choices(facts, node: cst.BaseExpression, cls: str | None) -> tuple | None:
    """The literals a bare name may hold where it reads a parameter of ``cls.__init__``
    (``nn.LSTM(..., bias=bias)`` in the ``__init__`` whose ``bias=True`` no call of the class
    in the file overrides): its default and what the file's calls pass; None otherwise."""
    if not isinstance(node, cst.Name) or cls is None or facts._file_class(cls) is None:
        return None
    param = _init_param(facts, node, cls)
    return None if param is None else _param_choices(facts, param, cls)
