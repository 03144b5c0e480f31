"""A hand-written SGD update, made torch's own SGD optimizer before the analysis (issue 28).

The word_language_model example (and many teaching scripts) update the parameters by hand:

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)

with ``lr`` a variable the program changes (divided by 4 when the validation loss stops
improving). That update is plain SGD with the learning rate ``lr`` read at each step: the same
as ``torch.optim.SGD(model.parameters(), lr=...)`` stepped after setting its param_groups'
learning rate to ``lr``. The file is rewritten to that form on the torch source, so that the
training passes translate it as any optimizer step (optax.sgd with the learning rate injected,
clipping chained before it, one jit-compiled step):

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)   # after `model = ...`
    ...
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()

Recognised updates of ``X`` (``p.data``): ``X.add_(p.grad, alpha=-LR)``, ``X.add_(-LR,
p.grad)``, ``X.sub_(p.grad, alpha=LR)``, ``X.sub_(LR * p.grad)``, ``X.add_(-LR * p.grad)`` and
``X -= LR * p.grad``, the loop's body that one statement, over ``M.parameters()`` of a model
``M`` bound once at module level, after a ``backward()`` in the same block, which also holds ``M.zero_grad()`` (without it
torch sums the gradients over the steps); ``X`` may be ``p``
itself when the loop is the body of a ``with torch.no_grad():`` (then optionally followed by
``M.zero_grad()``, which stays after the step). Anything else is
left as it is (and stays marked by the passes). Lines keep their places but for the
optimizer's line and the step's (``loader_classes.line_map`` maps the diagnostics back).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _negated(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """``LR`` of ``-LR``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return node.expression
    return None


def _times_grad(node: cst.BaseExpression, p: str) -> cst.BaseExpression | None:
    """``LR`` of ``LR * p.grad`` or ``p.grad * LR``."""
    grad = m.Attribute(value=m.Name(p), attr=m.Name("grad"))
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        if m.matches(node.right, grad):
            return node.left
        if m.matches(node.left, grad):
            return node.right
    return None


def _update_lr(stmt: cst.BaseStatement, p: str, no_grad: bool) -> cst.BaseExpression | None:
    """The learning rate of one hand-written SGD update of ``p.data`` (or of ``p`` itself
    under ``torch.no_grad()``), or None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    data = m.Attribute(value=m.Name(p), attr=m.Name("data"))
    if no_grad:
        data = data | m.Name(p)
    grad = m.Attribute(value=m.Name(p), attr=m.Name("grad"))
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.SubtractAssign) \
            and m.matches(small.target, data):
        return _times_grad(small.value, p)
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    call = small.value
    if not m.matches(call.func, m.Attribute(value=data, attr=m.Name("add_") | m.Name("sub_"))):
        return None
    method = call.func.attr.value
    args = call.args
    if any(a.star for a in args):
        return None
    pos = [a.value for a in args if a.keyword is None]
    kw = {a.keyword.value: a.value for a in args if a.keyword is not None}
    if set(kw) - {"alpha"}:
        return None
    alpha = kw.get("alpha")
    if len(pos) == 1 and m.matches(pos[0], grad) and alpha is not None:
        return _negated(alpha) if method == "add_" else alpha
    if len(pos) == 2 and alpha is None and method == "add_" and m.matches(pos[1], grad):
        return _negated(pos[0])  # the old signature: add_(value, tensor)
    if len(pos) == 1 and alpha is None:
        if method == "sub_":
            return _times_grad(pos[0], p)
        inner = _negated(pos[0])
        if inner is not None:
            return _times_grad(inner, p)
        scaled = _times_grad(pos[0], p)
        return _negated(scaled) if scaled is not None else None
    return None


def _sgd_loop(stmt: cst.BaseStatement, models: set[str], no_grad: bool = False
              ) -> tuple[str, cst.BaseExpression] | None:
    """(the model, the learning rate) of ``for p in M.parameters(): <update of p.data>``."""
    if not isinstance(stmt, cst.For) or stmt.orelse is not None or stmt.asynchronous:
        return None
    if not isinstance(stmt.target, cst.Name) or not m.matches(stmt.iter, m.Call(
            func=m.Attribute(value=m.Name(), attr=m.Name("parameters")), args=[])):
        return None
    model = stmt.iter.func.value.value
    body = stmt.body.body
    if model not in models or len(body) != 1:
        return None
    lr = _update_lr(body[0], stmt.target.value, no_grad)
    if lr is None or stmt.target.value in {n.value for n in m.findall(lr, m.Name())}:
        return None
    return model, lr


_NO_GRAD = m.With(items=[m.WithItem(item=m.Call(func=m.Attribute(
    value=m.Name("torch"), attr=m.Name("no_grad")), args=[]), asname=None)])


def _no_grad_update(stmt: cst.BaseStatement, models: set[str]
                    ) -> tuple[str, cst.BaseExpression, list[cst.BaseStatement]] | None:
    """``with torch.no_grad():`` around the update loop (the tutorial's ``p -= p.grad * lr``),
    optionally followed by ``M.zero_grad()`` / ``p.grad.zero_()`` of the same model in the
    block: (the model, the learning rate, the statements kept after the step)."""
    if not m.matches(stmt, _NO_GRAD) or not isinstance(stmt.body, cst.IndentedBlock):
        return None
    body = stmt.body.body
    found = _sgd_loop(body[0], models, no_grad=True) if body else None
    if found is None:
        return None
    rest = list(body[1:])
    zero = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
        value=m.Name(found[0]), attr=m.Name("zero_grad"))))])
    if any(not m.matches(s, zero) for s in rest):
        return None
    return found[0], found[1], rest


def _backward(stmt: cst.BaseStatement) -> bool:
    return bool(m.findall(stmt, m.Call(func=m.Attribute(attr=m.Name("backward")))))


def _module_models(module: cst.Module) -> dict[str, int]:
    """Module-level names bound once, by a call (``model = RNNModel(...)``): name -> the index
    of the statement."""
    bound: dict[str, list[int]] = {}
    for i, stmt in enumerate(module.body):
        for target in m.findall(stmt, m.AssignTarget(target=m.Name())):
            bound.setdefault(target.target.value, []).append(i)
    out = {}
    for name, where in bound.items():
        stmt = module.body[where[0]]
        if len(where) == 1 and m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(target=m.Name(name))], value=m.Call())])):
            out[name] = where[0]
    return out


class _Rewrite(cst.CSTTransformer):
    def __init__(self, models: set[str], fresh) -> None:
        super().__init__()
        self.models = models
        self.fresh = fresh
        self.optimizers: dict[str, str] = {}  # model -> the optimizer made for it

    def _block(self, body):
        out = list(body)
        changed = False
        for i, stmt in enumerate(body):
            found = _sgd_loop(stmt, self.models)
            kept: list[cst.BaseStatement] = []
            if found is None:
                wrapped = _no_grad_update(stmt, self.models)
                found = wrapped[:2] if wrapped is not None else None
                kept = wrapped[2] if wrapped is not None else []
            if found is None or not any(_backward(s) for s in body[:i]):
                continue
            model, lr = found
            zeroed = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
                value=m.Name(model), attr=m.Name("zero_grad"))))])
            if not kept and not any(m.matches(s, zeroed) for s in body):
                continue  # torch sums the gradients of every step: not one SGD step each
            opt = self.optimizers.setdefault(model, self.fresh("optimizer"))
            group = self.fresh("group")
            new = cst.parse_module(f"for {group} in {opt}.param_groups:\n    {group}[\"lr\"] = "
                                   f"{_code(lr)}\n{opt}.step()\n").body
            out[i] = [new[0].with_changes(leading_lines=stmt.leading_lines), new[1], *kept]
            changed = True
        if not changed:
            return None
        flat = []
        for s in out:
            flat.extend(s if isinstance(s, list) else [s])
        return flat

    def leave_IndentedBlock(self, original_node, updated_node):
        body = self._block(updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with its hand-written SGD updates made torch.optim.SGD steps."""
    if "backward" not in module.code or ".grad" not in module.code or not m.findall(
            module, m.Import(names=[m.ImportAlias(name=m.Name("torch"), asname=None)])):
        return module
    models = _module_models(module)
    taken = {n.value for n in m.findall(module, m.Name())}

    def fresh(base: str) -> str:
        name, k = base, 2
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    rewrite = _Rewrite(set(models), fresh)
    new = module.visit(rewrite)
    if not rewrite.optimizers:
        return module
    body = list(new.body)
    for model, opt in sorted(rewrite.optimizers.items(), key=lambda kv: -models[kv[0]]):
        at = models[model] + 1
        body.insert(at, cst.parse_statement(
            f"{opt} = torch.optim.SGD({model}.parameters(), lr=0.0)\n"))
    return new.with_changes(body=body)
