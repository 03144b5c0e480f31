"""A step taken only in one mode of a shared loop body, made a branch of its own before the
analysis.

PyTorch's transfer-learning tutorial (and many scripts after it) runs training and validation
through one loop body, the step taken under a condition:

    optimizer.zero_grad()
    with torch.set_grad_enabled(phase == "train"):
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        if phase == "train":
            loss.backward()
            optimizer.step()

and ``run_epoch(..., train=True)``-style functions write the same without the ``with``
(``loss = ...`` then ``if train: loss.backward(); optimizer.step()``). The training passes
translate a step from the statements since the parameters last changed; here the loss is
computed outside the block that steps. The condition is evaluated once either way, so the
block is rewritten on the torch source, with the same meaning, as a branch per mode:

    if phase == "train":
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
    else:
        with torch.no_grad():
            outputs = model(inputs)
            loss = criterion(outputs, labels)

The train branch is then an ordinary step (passes/rewrite_steps.py), the other branch an
evaluation (``torch.set_grad_enabled(False)`` is ``torch.no_grad()``; without the ``with``,
no gradient of that branch is ever taken, so ``no_grad`` changes no value). Rewritten only
where that is the same program:

* the condition is the same expression in the ``with`` and the ``if`` (or the ``if`` alone),
  made of names, attributes, constants, comparisons and ``and``/``or``/``not``: no call, so
  evaluating it once or twice is the same;
* the statements moved into both branches (the ``with`` body, or the simple statements just
  before the ``if`` that compute its loss) do not assign a name the condition reads;
* the ``if`` has no ``else`` and its body calls ``X.backward()`` and then ``opt.step()``, its
  loss ``X`` a name those statements assign;
* a ``opt.zero_grad()`` just before the ``with`` (or among the moved statements) goes into the
  train branch only: the other branch takes no step, so the gradients it would reset are
  reset again before the next ``backward()``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_GRAD_MODE = ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled")
_PURE = (cst.Name, cst.Attribute, cst.Comparison, cst.BooleanOperation, cst.UnaryOperation,
         cst.SimpleString, cst.Integer, cst.Float, cst.ComparisonTarget)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _same(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    return "".join(_code(a).split()).strip("()") == "".join(_code(b).split()).strip("()")


def _pure(test: cst.BaseExpression) -> bool:
    """Names, attributes, constants, comparisons and boolean operators only."""
    return not m.findall(test, m.Call() | m.Subscript() | m.NamedExpr() | m.Lambda()
                         | m.Await() | m.Yield())


def _names(test: cst.BaseExpression) -> set[str]:
    return {n.value for n in m.findall(test, m.Name())}


def _assigned(stmts: list[cst.BaseStatement]) -> set[str]:
    out: set[str] = set()
    for s in stmts:
        for t in m.findall(s, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For()
                           | m.WithItem() | m.NamedExpr()):
            target = getattr(t, "target", None) or getattr(t, "asname", None)
            if isinstance(target, cst.AsName):
                target = target.name
            if target is not None:
                out |= {n.value for n in m.findall(target, m.Name())}
    return out


def _method_call(stmt: cst.CSTNode, method: str) -> cst.Call | None:
    """``X.method(...)`` as a statement of its own."""
    if m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.Call(
            func=m.Attribute(attr=m.Name(method))))])):
        return stmt.body[0].value
    return None


def _stepping_if(stmt: cst.CSTNode) -> tuple[cst.If, str] | None:
    """An ``if`` (no ``else``) whose body calls ``loss.backward()`` then ``opt.step()``:
    (the statement, the loss's name)."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None or not isinstance(
            stmt.body, cst.IndentedBlock):
        return None
    body = list(stmt.body.body)
    back = [i for i, s in enumerate(body) if _method_call(s, "backward") is not None]
    if len(back) != 1:
        return None
    call = _method_call(body[back[0]], "backward")
    if not isinstance(call.func.value, cst.Name) or not any(
            (c := _method_call(s, "step")) is not None and not c.args
            for s in body[back[0] + 1:]):
        return None
    if call.func.value.value in _assigned(body):
        return None  # the branch computes its loss itself: a block step already
    return stmt, call.func.value.value


def _grad_mode(stmt: cst.CSTNode) -> cst.BaseExpression | None:
    """The condition of ``with torch.set_grad_enabled(C):`` (its only item, no ``as``)."""
    if not isinstance(stmt, cst.With) or len(stmt.items) != 1 or stmt.items[0].asname or (
            not isinstance(stmt.body, cst.IndentedBlock)):
        return None
    item = stmt.items[0].item
    if not (isinstance(item, cst.Call) and _code(item.func) in _GRAD_MODE
            and len(item.args) == 1 and item.args[0].keyword is None):
        return None
    return item.args[0].value


def _branched(branch: cst.If) -> bool:
    """An ``if`` this form wrote: its body steps, its ``else`` is one ``no_grad`` block."""
    orelse = branch.orelse
    return isinstance(orelse, cst.Else) and len(orelse.body.body) == 1 and m.matches(
        orelse.body.body[0], m.With(items=[m.WithItem(item=m.Call(func=m.Attribute(
            value=m.Name("torch"), attr=m.Name("no_grad"))))])) and any(
        _method_call(x, "backward") is not None for x in branch.body.body)


def _no_grad(stmts: list[cst.BaseStatement]) -> cst.With:
    return cst.With(items=[cst.WithItem(cst.parse_expression("torch.no_grad()"))],
                    body=cst.IndentedBlock(body=stmts))


def _branches(test: cst.BaseExpression, train: list, other: list, lines) -> cst.If:
    train[0] = train[0].with_changes(leading_lines=[])
    orelse = None
    if other:
        other = [other[0].with_changes(leading_lines=[]), *other[1:]]
        orelse = cst.Else(body=cst.IndentedBlock(body=[_no_grad(other)]))
    return cst.If(test=test, body=cst.IndentedBlock(body=train), orelse=orelse,
                  leading_lines=lines)


def _rewrite(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
    out: list[cst.BaseStatement] = []
    changed = False
    for s in stmts:
        test = _grad_mode(s)
        found = None
        inner = list(s.body.body) if test is not None else []
        if test is not None and len(inner) == 1 and isinstance(inner[0], cst.If) and _same(
                inner[0].test, test) and _pure(test) and _branched(inner[0]):
            # the with's body already made a branch per mode (below, on the inner block)
            branch = inner[0]
            zero = []
            if out and _method_call(out[-1], "zero_grad") is not None:
                zero = [out.pop()]
            body = [*zero, *branch.body.body]
            body[0] = body[0].with_changes(leading_lines=[])
            found = branch.with_changes(body=branch.body.with_changes(body=body),
                                        leading_lines=(zero[0] if zero else s).leading_lines)
        elif test is not None and _pure(test):
            body = list(s.body.body)
            at = [i for i, x in enumerate(body) if _stepping_if(x) is not None
                  and _same(x.test, test)]
            if len(at) == 1:
                branch, loss = _stepping_if(body[at[0]])
                before, after = body[:at[0]], body[at[0] + 1:]
                if loss in _assigned(before) and not _names(test) & _assigned(before):
                    zero = []
                    if out and _method_call(out[-1], "zero_grad") is not None:
                        zero = [out.pop()]
                    lines = zero[0].leading_lines if zero else s.leading_lines
                    found = _branches(test, [*zero, *before, *branch.body.body, *after],
                                      [*before, *after], lines)
        elif _stepping_if(s) is not None and _pure(s.test):
            branch, loss = _stepping_if(s)
            k = len(out)
            while k and isinstance(out[k - 1], cst.SimpleStatementLine):
                k -= 1
            before = out[k:]
            if before and loss in _assigned(before) and not _names(s.test) & _assigned(before):
                del out[k:]
                other = [x for x in before if _method_call(x, "zero_grad") is None]
                found = _branches(s.test, [*before, *branch.body.body], other,
                                  before[0].leading_lines)
        if found is not None:
            out.append(found)
            changed = True
        else:
            out.append(s)
    return out if changed else None


class _Rewrite(cst.CSTTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.changed = False

    def leave_IndentedBlock(self, original_node, updated_node):
        body = _rewrite(list(updated_node.body))
        self.changed |= body is not None
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node, updated_node):
        body = _rewrite(list(updated_node.body))
        self.changed |= body is not None
        return updated_node if body is None else updated_node.with_changes(body=body)


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each step taken in one mode of a shared body made a branch of its own."""
    rewrite = _Rewrite()
    new = module.visit(rewrite)
    return new if rewrite.changed else module
