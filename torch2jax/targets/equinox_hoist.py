"""The train step of a function that trains the model it receives, moved out of it to the
top level (``hoist_step``), and the name bookkeeping the equinox training pass shares
(equinox_training.py): the names a function's parameters and statements bind."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code
from torch2jax.targets.equinox_globals import own_scope

OPT_STATE = "opt_state"


def _assigned_names(stmts) -> set[str]:
    names: set[str] = set()
    for s in stmts:
        for t in findall(s, m.AssignTarget() | m.For()):
            tgt = t.target
            for n in findall(tgt, m.Name()):
                names.add(n.value)
    return names


def _params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]


def _bound(node: cst.CSTNode) -> set[str]:
    """Names ``node`` binds anywhere in it (over-approximated: nested scopes count)."""
    names = _assigned_names([node])
    names |= {p.name.value for p in findall(node, m.Param())}
    names |= {d.name.value for d in findall(node, m.FunctionDef() | m.ClassDef())}
    names |= {n.value for c in findall(node, m.CompFor() | m.AsName())
              for n in findall(c.target if isinstance(c, cst.CompFor) else c.name, m.Name())}
    return names


class _AddArg(cst.CSTTransformer):
    """Calls of ``func``: ``name`` passed after their ``after`` argument."""

    def __init__(self, func: str, after: int, name: str) -> None:
        self.func, self.after, self.name = func, after, name

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name(self.func)):
            return updated_node
        args = list(updated_node.args)
        args.insert(self.after + 1, cst.Arg(cst.Name(self.name), comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))))
        return updated_node.with_changes(args=args)


def hoist_step(fn: cst.FunctionDef, opt: str | None, taken: set[str]
               ) -> tuple[cst.FunctionDef | None, cst.FunctionDef]:
    """The train step of a function called once per epoch, moved to the top level with the
    optax transform ``opt`` (the function's parameter) as its argument, or as it is when
    ``opt`` is None (the function reads the optimizer as a global): a step defined inside the
    function is a new function at every call, which eqx.filter_jit traces and compiles again
    every epoch. The other parameters of the function the step closes over and the function
    does not rebind (a loss function handed in, ``run_epoch(model, loader, optimizer,
    scheduler, loss_fn)``) are its arguments too, after ``opt``, in the function's order
    (eqx.filter_jit holds what is not an array as static: the same function object, one
    compile). ``(None, fn)`` when it closes over other local names or its name is
    ``taken``."""
    steps = [i for i, st in enumerate(fn.body.body) if isinstance(st, cst.FunctionDef) and
             [code(d.decorator) for d in st.decorators] == ["eqx.filter_jit"]]
    if len(steps) != 1:
        return None, fn
    step = fn.body.body[steps[0]]
    name = step.name.value
    rest = [st for i, st in enumerate(fn.body.body) if i != steps[0]]
    # (names the function declares global are the script's)
    local = (set(_params(fn)) | _bound(cst.Module(body=rest))) - own_scope(fn.body)[1]
    used = {n.value for n in findall(step, m.Name())}
    params = [p.name.value for p in step.params.params]
    closure = (used - _bound(step.body) - set(params)) & local
    # (a parameter the function rebinds is not the one the caller gave: left closed over)
    handed = [p for p in _params(fn) if p in closure and p != opt
              and p not in _bound(cst.Module(body=rest))]
    if name in taken or closure != ({opt} if opt else set()) | set(handed) or \
            OPT_STATE not in params or opt in params:
        return None, fn
    at = params.index(OPT_STATE)
    body = rest
    passed = ([opt] if opt is not None else []) + handed
    plist = list(step.params.params)
    for i, p in enumerate(passed):
        plist.insert(at + 1 + i, cst.Param(cst.Name(p), comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))))
        body = [st.visit(_AddArg(name, at + i, p)) for st in body]
    step = step.with_changes(params=step.params.with_changes(params=plist))
    step = step.with_changes(leading_lines=fn.leading_lines)
    lead = step.leading_lines
    if body and steps[0] < len(body):
        body[steps[0]] = body[steps[0]].with_changes(leading_lines=[
            ln for ln in body[steps[0]].leading_lines if ln.comment is not None])
    fn = fn.with_changes(body=fn.body.with_changes(body=body),
                         leading_lines=[cst.EmptyLine(indent=False)] * 2)
    return step.with_changes(leading_lines=lead), fn
