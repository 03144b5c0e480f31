"""Parameters updated through a loop over ``parameters()``: weight clipping, an exponential
moving average, a scaled copy.

torch updates each parameter in place through the loop variable:

    for p in critic.parameters():
        p.data.clamp_(-0.01, 0.01)                   # WGAN's weight clipping

    for ema_p, p in zip(ema.parameters(), model.parameters()):
        ema_p.mul_(decay).add_(p.detach(), alpha=1 - decay)

The loop's ``parameters()`` is the list of the NNX model's arrays, and rebinding its variable
(``p = jnp.clip(p, ...)``, what an in-place method becomes) writes nothing back: the model kept
its weights, silently (``p.data = ...`` failed at run time, unmarked). Such a loop is the model's
parameter state mapped and written back, what one writes by hand:

    nnx.update(critic, jax.tree.map(lambda p: jnp.clip(p, -0.01, 0.01),
                                    nnx.state(critic, nnx.Param)))

(several modules zipped: one tree of each, mapped together). Translated where the loop's body
is only such updates of its first variable (``p = E`` or ``p.data = E``, in order); any other
loop over parameters that rebinds its variable is marked. In a file that freezes parameters
(``freeze_parameters``: they become ``FrozenParam``s, not ``nnx.Param``), a model's parameters
are ``nnx.Any(nnx.Param, FrozenParam)`` and the states are mapped as arrays (``nnx.pure``).
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code, nnx_parameters

_PARAMETERS = m.Call(func=m.Attribute(attr=m.Name("parameters")), args=[])


def _modules(node: cst.For) -> tuple[list[str], list[cst.BaseExpression]] | None:
    """The loop's variables and the modules whose ``parameters()`` it iterates, or None."""
    if m.matches(node.iter, _PARAMETERS) and isinstance(node.target, cst.Name):
        return [node.target.value], [node.iter.func.value]
    if m.matches(node.iter, m.Call(func=m.Name("zip"))) and node.iter.args and all(
            a.keyword is None and not a.star and m.matches(a.value, _PARAMETERS)
            for a in node.iter.args) and isinstance(node.target, cst.Tuple) and len(
            node.target.elements) == len(node.iter.args) and all(
            isinstance(e.value, cst.Name) for e in node.target.elements):
        return ([e.value.value for e in node.target.elements],
                [a.value.func.value for a in node.iter.args])
    return None


def _written(stmt: cst.CSTNode, names: list[str]) -> str | None:
    """The loop variable a statement of the (rewritten) body binds (``p = E``,
    ``p.data = E``, ``p += E``), or None."""
    for t in m.findall(stmt, m.AssignTarget() | m.AugAssign() | m.AnnAssign()):
        target = t.target
        if isinstance(target, cst.Attribute) and target.attr.value == "data":
            target = target.value
        if isinstance(target, cst.Name) and target.value in names:
            return target.value
    return None


_FREEZE = (m.Call(func=m.Attribute(attr=m.Name("requires_grad_")))
           | m.Assign(targets=[m.AssignTarget(target=m.Attribute(attr=m.Name("requires_grad")))]))


def freezes(module: cst.Module) -> bool:
    """Whether the file freezes some parameters anywhere (``requires_grad_(False)``, read on
    the torch source once): a model's ``parameters()`` then holds the ``FrozenParam``s too,
    and a model zipped with another in a function may be one whose parameters are frozen by
    then (an EMA copy)."""
    return bool(m.findall(module, _FREEZE))


def param_loop(rw, original: cst.For, updated: cst.For):
    """``leave_For`` of a loop over ``parameters()``: the statement writing the parameters
    back (NNX), the loop marked (it rebinds its variable, which writes nothing back), or None
    (not such a loop, or it writes nothing)."""
    found = _modules(original)
    if found is None or not isinstance(updated.body, cst.IndentedBlock):
        return None
    names, modules = found
    body = list(updated.body.body)
    if not any(_written(s, names) for s in body):
        return None
    first = names[0]
    simple = original.orelse is None and all(
        isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
        and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1
        and _written(s, names) == first for s in body)
    module_ok = all(rw._is_module_expr(x) for x in modules)
    form = rw.target.parameter_leaves(False)
    if not simple or not module_ok or form is None or rw.target.intermediate:
        why = (f"the loop's body is not only updates of {first}" if not simple
               else "this target has no form for it")
        rw.diag(original, "param-write", "error",
                f"parameters updated through the loop variable {first}: rebinding it writes "
                f"nothing back to the model in JAX ({why}); map the parameter state and write "
                "it back: nnx.update(model, jax.tree.map(lambda p: ..., nnx.state(model, "
                "nnx.Param)))")
        return None
    values = [s.body[0].value for s in body]
    if len(values) == 1:
        fn: cst.BaseExpression = cst.Lambda(
            params=cst.Parameters(params=[cst.Param(cst.Name(n)) for n in names]),
            body=values[0])
        before: list[cst.BaseStatement] = []
    else:  # several updates in turn: a function of the parameters returning the last
        name = f"update_{first}"
        lines = [cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(cst.Name(first))], value=v)]) for v in values]
        lines.append(cst.SimpleStatementLine(body=[cst.Return(cst.Name(first))]))
        before = [cst.FunctionDef(
            name=cst.Name(name),
            params=cst.Parameters(params=[cst.Param(cst.Name(n)) for n in names]),
            body=cst.IndentedBlock(body=lines), leading_lines=original.leading_lines)]
        fn = cst.Name(name)
    # a file that freezes: the parameters are nnx.Param or FrozenParam (an EMA copy frozen, the
    # model not), trees of two Variable types mapped together as their arrays (nnx.pure);
    # nnx.update keeps each variable's type
    which, pure = nnx_parameters(rw.file_freezes), "nnx.pure({})" if rw.file_freezes else "{}"
    states = [cst.Arg(cst.parse_expression(pure.format(f"nnx.state({code(x)}, {which})")))
              for x in modules]
    rw.need("nnx", "jax")
    statement = cst.SimpleStatementLine(
        body=[cst.Expr(cst.parse_expression(
            f"nnx.update({code(modules[0])}, jax.tree.map(F, {', '.join('S' for _ in states)}))"
        ).visit(_Fill(fn, states)))],
        leading_lines=[] if before else original.leading_lines)
    return cst.FlattenSentinel([*before, statement])


class _Fill(cst.CSTTransformer):
    """The template's ``F`` and ``S`` placeholders, filled in order."""

    def __init__(self, fn: cst.BaseExpression, states: list[cst.Arg]) -> None:
        super().__init__()
        self.fn, self.states = fn, list(states)

    def leave_Name(self, original_node, updated_node):
        if updated_node.value == "F":
            return self.fn
        if updated_node.value == "S" and self.states:
            return self.states.pop(0).value
        return updated_node


# in-place methods of a parameter in such a loop -> torch's out-of-place form of
# ``{a}`` (the value so far) and the method's arguments
def _p(text: str) -> str:
    """An operand, parenthesized unless it is a name, an attribute or a number."""
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


_CHAIN = {
    "mul_": lambda a, x: f"{a} * {_p(x[0])}",
    "div_": lambda a, x: f"{a} / {_p(x[0])}",
    "add_": lambda a, x, alpha=None: (f"{a} + {_p(alpha)} * {_p(x[0])}" if alpha
                                      else f"{a} + {_p(x[0])}"),
    "sub_": lambda a, x, alpha=None: (f"{a} - {_p(alpha)} * {_p(x[0])}" if alpha
                                      else f"{a} - {_p(x[0])}"),
    "lerp_": lambda a, x: f"torch.lerp({a}, {x[0]}, {x[1]})",
    "copy_": lambda a, x: x[0],
}


def _chain(call: cst.BaseExpression, var: str) -> str | None:
    """``var.mul_(d).add_(p, alpha=1 - d)`` (or ``var.data....``): torch's out-of-place
    expression of the value it leaves in ``var``, or None."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return None
    meth = call.func.attr.value
    if meth not in _CHAIN:
        return None
    receiver = call.func.value
    if m.matches(receiver, m.Name(var) | m.Attribute(value=m.Name(var), attr=m.Name("data"))):
        inner = f"{var}.data"
    else:
        inner = _chain(receiver, var)
        if inner is None:
            return None
    args = [code(a.value) for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: code(a.value) for a in call.args if a.keyword is not None}
    if any(a.star for a in call.args) or set(keywords) - ({"alpha"} if meth in (
            "add_", "sub_") else set()) or len(args) != (2 if meth == "lerp_" else 1):
        return None
    return _CHAIN[meth](inner, args, **keywords)


def canonicalise(module: cst.Module) -> cst.Module:
    """The torch file with each chain of in-place arithmetic on a loop variable of a loop over
    ``parameters()`` (``ema_p.mul_(d).add_(p, alpha=1 - d)``) written as the assignment of its
    value (``ema_p.data = ema_p.data * (d) + (1 - d) * (p)``), which ``param_loop`` writes
    back; the same program, torch's in-place methods applied in order."""

    class _Chains(cst.CSTTransformer):
        def __init__(self) -> None:
            super().__init__()
            self.vars: list[str | None] = []
            self.changed = False

        def visit_For(self, node: cst.For) -> None:
            found = _modules(node)
            self.vars.append(found[0][0] if found else None)

        def leave_For(self, original_node, updated_node):
            self.vars.pop()
            return updated_node

        def leave_SimpleStatementLine(self, original_node, updated_node):
            var = self.vars[-1] if self.vars else None
            if var is None or len(updated_node.body) != 1 or not isinstance(
                    updated_node.body[0], cst.Expr):
                return updated_node
            value = _chain(updated_node.body[0].value, var)
            if value is None or re.search(r"\.grad\b", value):  # (an update by gradients:
                return updated_node  # passes/manual_sgd.py's, or marked where it stands)
                return updated_node
            self.changed = True
            return updated_node.with_changes(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.parse_expression(f"{var}.data"))],
                value=cst.parse_expression(value))])

    chains = _Chains()
    new = module.visit(chains)
    return new if chains.changed else module
