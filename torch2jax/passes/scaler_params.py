"""A ``GradScaler`` passed to a function of the file, on the torch source before the analysis.

Training code often hands the scaler to its train function with the rest of the training
state (``train_one_epoch(model, loader, optimizer, scheduler, scaler, epoch)``). The rewrite
removes a scaler (the autocast region computes in bfloat16, which needs no loss scaling:
passes/data.py) and makes its calls the plain ones where it reads the scaler by the name it
was built under; a parameter holding it is another name, and the call that passes it still
reads the removed scaler. Here, where every call of a top-level function passes a scaler
built in the file for one of its parameters, and the function uses that parameter only
through the scaler's training calls, those calls become the plain ones
(``scaler.scale(loss).backward()`` -> ``loss.backward()``, ``scaler.step(optimizer)`` ->
``optimizer.step()``; ``scaler.update()`` and ``scaler.unscale_(optimizer)`` go, as the
rewrite does with the scaler's own name) and the parameter and its arguments go. The scaler's
construction is then read by nothing and is removed by the rewrite with its usual message.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _scaler_names(module: cst.Module) -> set[str]:
    """Names assigned ``...GradScaler(...)`` anywhere in the file."""
    names = set()
    for a in findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                      value=m.Call())):
        if _code(a.value.func).split(".")[-1] == "GradScaler":
            names.add(a.targets[0].target.value)
    return names


def _scaled_backward(p: str):
    return m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(value=m.Name(p),
                                                                 attr=m.Name("scale")),
                                                args=[m.Arg(keyword=None)]),
                                   attr=m.Name("backward")))


def _statement(p: str, method: str, nargs: int):
    return m.SimpleStatementLine(body=[m.Expr(value=m.Call(
        func=m.Attribute(value=m.Name(p), attr=m.Name(method)),
        args=[m.Arg(keyword=None)] * nargs))])


def _only_scaler_calls(fn: cst.FunctionDef, p: str) -> bool:
    """Every read of ``p`` in ``fn``'s body is a scaler training call, and nothing binds it."""
    body = fn.body
    reads = len(findall(body, m.Name(p)))
    uses = (len(findall(body, _scaled_backward(p)))
            + sum(len(findall(body, _statement(p, meth, n)))
                  for meth, n in (("step", 1), ("update", 0), ("unscale_", 1))))
    bound = findall(body, m.AssignTarget(target=m.Name(p))) or findall(
        body, m.FunctionDef(name=m.Name(p)))
    return reads > 0 and reads == uses and not bound


def _passed(module: cst.Module, fn: cst.FunctionDef, index: int, p: str,
            scalers: set[str]) -> list[tuple[cst.Call, int]] | None:
    """Each call of ``fn`` with the position of its argument for ``p``, a scaler name; None
    when a call passes something else, or passes it otherwise."""
    found = []
    for c in findall(module, m.Call(func=m.Name(fn.name.value))):
        if any(a.star for a in c.args):
            return None
        at = next((i for i, a in enumerate(c.args) if a.keyword and a.keyword.value == p), None)
        if at is None and index < len(c.args) and c.args[index].keyword is None:
            at = index
        if at is None or not m.matches(c.args[at].value, m.Name()) or (
                c.args[at].value.value not in scalers):
            return None
        found.append((c, at))
    return found or None


class _Plain(cst.CSTTransformer):
    """Inside the function: the scaler's calls made the plain ones."""

    def __init__(self, p: str) -> None:
        self.p = p

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node, _scaled_backward(self.p)):
            loss = updated_node.func.value.args[0].value
            return updated_node.with_changes(func=updated_node.func.with_changes(value=loss))
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if m.matches(updated_node, _statement(self.p, "step", 1)):
            opt = updated_node.body[0].value.args[0].value
            return updated_node.with_changes(body=[cst.Expr(cst.Call(
                func=cst.Attribute(value=opt, attr=cst.Name("step"))))])
        if m.matches(updated_node, _statement(self.p, "update", 0)) or m.matches(
                updated_node, _statement(self.p, "unscale_", 1)):
            return cst.RemoveFromParent()
        return updated_node


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each scaler passed to a function of it (module docstring) removed from
    the calls and the function, its calls made the plain ones."""
    if "GradScaler" not in module.code:
        return module
    scalers = _scaler_names(module)
    edits: dict[str, tuple[int, str]] = {}  # function -> (parameter index, name)
    drops: dict[int, int] = {}  # id(call) -> argument index
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef):
            continue
        for i, param in enumerate(fn.params.params):
            p = param.name.value
            if not _only_scaler_calls(fn, p):
                continue
            calls = _passed(module, fn, i, p, scalers)
            if calls is not None:
                edits[fn.name.value] = (i, p)
                drops.update({id(c): at for c, at in calls})
                break
    if not edits:
        return module

    class _Drop(cst.CSTTransformer):
        def leave_Call(self, original_node, updated_node):
            at = drops.get(id(original_node))
            if at is None:
                return updated_node
            args = [a for i, a in enumerate(updated_node.args) if i != at]
            if args:  # no trailing comma left on the last argument
                args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated_node.with_changes(args=args)

        def leave_FunctionDef(self, original_node, updated_node):
            edit = edits.get(original_node.name.value)
            if edit is None or not any(original_node is s for s in module.body):
                return updated_node
            i, p = edit
            params = [x for j, x in enumerate(updated_node.params.params) if j != i]
            if params:
                params[-1] = params[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            body = updated_node.body.visit(_Plain(p))
            return updated_node.with_changes(
                params=updated_node.params.with_changes(params=params), body=body)

    return module.visit(_Drop())
