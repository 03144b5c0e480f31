"""A train step defined in a function that runs once per epoch (``def train_epoch(model,
loader, optimizer, criterion)``), hoisted to the top level with what it closes over passed in.

A step defined in such a function is a new function at every call, so ``jax.jit`` compiles it
again every epoch. Hoisted to the top level it is compiled once, but only if the names it
reads from the function it came from (``criterion``, ``class_weights``, ``clip``) reach it as
arguments. Each becomes a keyword-only parameter of the step, passed at its calls by name:

- a function, a loss object (``nn.CrossEntropyLoss()``, a function once translated) or a
  Python scalar: a static argument (``static_argnames``), hashed by jit, compiled once per
  value;
- an array or a module: a traced argument.

A name whose value the analysis does not know (a config object, a dict) keeps the step where
it is (None here), compiled per call as before, rather than guessing whether jit can hash it.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.value_kinds import Kind

_TRACED = (Kind.TENSOR,)  # (PARAM, a parameter of no known kind, may be a function)


def hoisted_step(rw, function: cst.FunctionDef, free: set[str]
                 ) -> tuple[cst.FunctionDef, list[str]] | None:
    """``function`` (the step) with each name of ``free`` made a keyword-only parameter, and
    those names (``passing`` gives them at its calls); None where a value is not known well
    enough."""
    if not free or not rw._fn_stack or rw.values is None or rw.target.intermediate:
        return None  # (equinox's pass rewrites the NNX step its own way: equinox_hoist.py)
    static: list[str] = []
    traced: list[str] = []
    for name in sorted(free):
        value = _value_in(rw, rw._fn_stack[0], name)
        if value is None:
            return None
        loss = value.layer is not None and value.layer.startswith("torch.nn.") and (
            value.layer.endswith("Loss"))
        if value.kind in (Kind.FUNCTION, Kind.SCALAR) or value.kind == Kind.MODULE and loss:
            static.append(name)
        elif value.kind in _TRACED or value.kind == Kind.MODULE and (value.cls or value.layer) and (
                "nnx.jit" in _code(function.decorators)):  # (jax.jit takes no module)
            traced.append(name)
        else:
            return None
    params = function.params
    added = [cst.Param(cst.Name(n)) for n in (*static, *traced)]
    params = params.with_changes(
        kwonly_params=[*params.kwonly_params, *added],
        star_arg=params.star_arg if isinstance(params.star_arg, cst.Param | cst.ParamStar)
        else cst.ParamStar())
    decorators = list(function.decorators)
    if static:
        if not decorators:
            return None
        jit = _with_static(decorators[0].decorator, static)
        if jit is None:
            return None
        decorators[0] = decorators[0].with_changes(decorator=jit)
        if "partial(" in _code(decorators[:1]):
            rw.need("partial")
    return function.with_changes(params=params, decorators=decorators), [*static, *traced]


def passing(body: list[cst.BaseStatement], step: str, names: list[str]
            ) -> list[cst.BaseStatement]:
    """``body`` with its calls of ``step`` given ``names`` by keyword."""
    return [s.visit(_Passing(step, names)) for s in body] if names else body


def _code(decorators) -> str:
    return "".join(cst.Module([]).code_for_node(d.decorator) for d in decorators)


def _value_in(rw, enclosing: cst.FunctionDef, name: str):
    """The value of ``name`` as the original function reads it (its first read)."""
    for node in m.findall(enclosing.body, m.Name(name)):
        try:
            value = rw.values.value(node)
        except KeyError:
            continue
        return value if value.kind != Kind.UNKNOWN else None
    return None


def _with_static(decorator: cst.BaseExpression, names: list[str]) -> cst.BaseExpression | None:
    """The jit decorator with ``names`` added to its ``static_argnames``."""
    if isinstance(decorator, cst.Call):
        args = list(decorator.args)
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == "static_argnames":
                if not (isinstance(a.value, cst.Tuple | cst.List) and all(
                        isinstance(e.value, cst.SimpleString) for e in a.value.elements)):
                    return None
                had = [e.value.evaluated_value for e in a.value.elements]
                args[i] = a.with_changes(value=cst.parse_expression(repr((*had, *names))))
                return decorator.with_changes(args=args)
        keyword = cst.Arg(cst.parse_expression(repr(tuple(names))),
                          keyword=cst.Name("static_argnames"),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                cst.SimpleWhitespace("")))
        return decorator.with_changes(args=[*args, keyword])
    if m.matches(decorator, m.Attribute(value=m.Name("nnx"), attr=m.Name("jit"))):
        return _with_static(cst.Call(decorator), names)
    if m.matches(decorator, m.Attribute(value=m.Name("jax"), attr=m.Name("jit"))):
        return _with_static(cst.Call(cst.Name("partial"), [cst.Arg(decorator)]), names)
    return None


class _Passing(cst.CSTTransformer):
    """Calls of the step given the new arguments by name."""

    def __init__(self, step: str, names: list[str]) -> None:
        super().__init__()
        self.step, self.names = step, names

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name(self.step)):
            return updated_node
        eq = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
        return updated_node.with_changes(args=[
            *updated_node.args, *(cst.Arg(cst.Name(n), keyword=cst.Name(n), equal=eq)
                                  for n in self.names)])
