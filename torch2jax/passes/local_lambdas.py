"""A local lambda that only forwards to a method of ``self``, written out at its calls before the
analysis.

Research code names a short form of a method and calls it several times:

    register_buffer = lambda name, val: self.register_buffer(name, val.to(torch.float32))
    register_buffer("betas", betas)

The translation of ``self.register_buffer(...)`` (a buffer of the module, its name a literal)
needs the call itself, and a lambda keeps it out of reach: it stayed ``self.register_buffer``
on a JAX module, unmarked, and failed at run time. Each call of such a name is the lambda's
body with the call's arguments in place of its parameters:

    self.register_buffer("betas", betas.to(torch.float32))

which is what Python evaluates, under these conditions (otherwise the file is left as it is):
the name is assigned once in its function, to a lambda of plain positional parameters whose
body is one call of ``self.<method>``; each parameter is read exactly once in the body, in the
order of the parameters (so the arguments are evaluated once each, in the same order); the body
binds no names of its own (no nested lambda or comprehension); and every other use of the name
in the function is a call with as many positional arguments as the lambda has parameters.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_SELF_CALL = m.Call(func=m.Attribute(value=m.Name("self")))


def _forwarding(stmt: cst.BaseStatement) -> tuple[str, cst.Lambda] | None:
    """(name, lambda) of ``name = lambda a, b: self.f(...)`` of the shape the docstring says."""
    if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(target=m.Name())], value=m.Lambda(body=_SELF_CALL))])):
        return None
    assign = stmt.body[0]
    fn: cst.Lambda = assign.value
    ps = fn.params
    if ps.posonly_params or ps.kwonly_params or ps.star_arg not in (None, cst.MaybeSentinel.DEFAULT) \
            or ps.star_kwarg is not None or any(p.default is not None for p in ps.params):
        return None
    names = [p.name.value for p in ps.params]
    if m.findall(fn.body, m.Lambda() | m.ListComp() | m.SetComp() | m.DictComp()
                 | m.GeneratorExp() | m.NamedExpr()):
        return None
    read = [n.value for n in m.findall(fn.body, m.Name()) if n.value in names]
    if read != names:
        return None  # each parameter once, in order
    return assign.targets[0].target.value, fn


class _Substitute(cst.CSTTransformer):
    def __init__(self, values: dict[str, cst.BaseExpression]) -> None:
        self.values = values

    def leave_Name(self, original_node, updated_node):
        return self.values.get(updated_node.value, updated_node)


class _Calls(cst.CSTTransformer):
    """Each call of ``name`` as ``fn``'s body with the call's arguments in place."""

    def __init__(self, name: str, fn: cst.Lambda) -> None:
        self.name, self.fn = name, fn

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name(self.name)):
            return updated_node
        values = {p.name.value: a.value for p, a in zip(self.fn.params.params,
                                                          updated_node.args)}
        return self.fn.body.visit(_Substitute(values))


def _inline_one(body: list[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
    """``body`` with its first forwarding lambda written out at its calls, or None."""
    for i, stmt in enumerate(body):
        found = _forwarding(stmt)
        if found is None:
            continue
        name, fn = found
        rest = cst.IndentedBlock(body=body[i + 1:])
        uses = m.findall(rest, m.Name(name))
        calls = m.findall(rest, m.Call(func=m.Name(name)))
        n = len(fn.params.params)
        if not calls or len(uses) != len(calls) or any(
                len(c.args) != n or any(a.keyword or a.star for a in c.args) for c in calls):
            continue
        if m.findall(cst.IndentedBlock(body=body[:i]), m.Name(name)):
            continue

        new_rest = list(rest.visit(_Calls(name, fn)).body)
        if new_rest and stmt.leading_lines:  # the comments above the lambda stay
            new_rest[0] = new_rest[0].with_changes(
                leading_lines=[*stmt.leading_lines, *new_rest[0].leading_lines])
        return [*body[:i], *new_rest]
    return None


class _Inline(cst.CSTTransformer):
    def leave_FunctionDef(self, original_node, updated_node):
        if not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body, changed = list(updated_node.body.body), False
        while (inlined := _inline_one(body)) is not None:
            body, changed = inlined, True
        if not changed:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with its forwarding lambdas written out at their calls (the docstring)."""
    if not m.findall(module, m.Assign(value=m.Lambda(body=_SELF_CALL))):
        return module
    return module.visit(_Inline())
