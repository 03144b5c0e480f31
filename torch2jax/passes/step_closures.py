"""A step given a closure, ``optimizer.step(closure)``, made the statements it runs before the
analysis.

torch's optimizers take an optional closure that re-evaluates the model and returns the loss
(time-series and style-transfer examples, SAM-style wrappers):

    def closure():
        optimizer.zero_grad()
        out = model(inputs)
        loss = criterion(out, target)
        loss.backward()
        return loss

    loss = optimizer.step(closure)

Every torch optimizer but L-BFGS calls the closure once, with gradients enabled, then steps,
and returns what the closure returned. So, on the torch source, the call is rewritten into the
same program written out, which the training passes translate as an ordinary step:

    optimizer.zero_grad()
    out = model(inputs)
    loss = criterion(out, target)
    loss.backward()
    optimizer.step()

(``X = optimizer.step(closure)`` keeps ``X = loss`` after the step: the loss tensor is not a
parameter, so the step does not change it.) L-BFGS calls its closure up to ``max_iter`` times
with a line search between; it is left as written (its optimizer is marked). Rewritten only
where that is the same program:

* the closure is a ``def`` without parameters or decorators in the same block, before the
  step, read nowhere else, with no ``global``/``nonlocal``/``yield``/nested function, one
  ``return`` of a name as its last statement (or none), and its statements between the
  ``def`` and the step assign nothing it reads;
* a name the closure assigns (its locals) is read in the enclosing scope only after an
  assignment of that name that follows the step in the same block: written out, the
  closure's locals would otherwise change what the enclosing code reads.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.grad_mode_branches import _assigned

# optimizers whose step calls the closure more than once (a line search): left as written
_MANY_CALLS = ("LBFGS",)


class _Names(cst.CSTVisitor):
    """The Name nodes of a tree that name a variable: not an attribute's name (``self.out``),
    a keyword (``f(out=1)``), nor a function's or class's own name."""

    def __init__(self) -> None:
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def _variables(node: cst.CSTNode) -> list[cst.Name]:
    names = _Names()
    node.visit(names)
    return names.found


def _reads(node: cst.CSTNode, names: set[str]) -> bool:
    """Whether ``node`` reads any of ``names`` (a Name not on the left of an assignment)."""
    targets = {id(n) for t in m.findall(node, m.AssignTarget() | m.AugAssign() | m.For()
                                        | m.AnnAssign() | m.WithItem())
               for n in m.findall(getattr(t, "target", None) or getattr(t, "asname", None)
                                  or cst.Name("_"), m.Name())}
    for n in _variables(node):
        if n.value in names and id(n) not in targets:
            return True
    # an augmented assignment reads its target too
    return any(isinstance(a.target, cst.Name) and a.target.value in names
               for a in m.findall(node, m.AugAssign()))


def _step_call(stmt: cst.CSTNode) -> tuple[cst.Call, cst.BaseExpression | None] | None:
    """``opt.step(NAME)`` or ``X = opt.step(NAME)`` as a statement: (the call, X)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    target = None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        call, target = small.value, small.targets[0].target
    elif isinstance(small, cst.Expr):
        call = small.value
    else:
        return None
    if m.matches(call, m.Call(func=m.Attribute(attr=m.Name("step")),
                              args=[m.Arg(value=m.Name(), keyword=None)])) or m.matches(
            call, m.Call(func=m.Attribute(attr=m.Name("step")),
                         args=[m.Arg(value=m.Name(), keyword=m.Name("closure"))])):
        return call, target
    return None


def _closure_body(fn: cst.FunctionDef) -> tuple[list[cst.BaseStatement], str | None] | None:
    """The closure's statements without its final ``return NAME``, and NAME."""
    if fn.decorators or fn.asynchronous or fn.params.params or fn.params.star_arg not in (
            None, cst.MaybeSentinel.DEFAULT) or fn.params.kwonly_params or fn.params.star_kwarg \
            or fn.params.posonly_params or not isinstance(fn.body, cst.IndentedBlock):
        return None
    body = list(fn.body.body)
    if m.findall(fn.body, m.Global() | m.Nonlocal() | m.Yield() | m.FunctionDef() | m.Lambda()
                 | m.ClassDef()):
        return None
    returns = m.findall(fn.body, m.Return())
    ret = None
    if returns:
        last = body[-1] if body else None
        if len(returns) != 1 or not m.matches(last, m.SimpleStatementLine(
                body=[m.Return(value=m.Name())])):
            return None
        ret = last.body[0].value.value
        body = body[:-1]
    if not body or not any(m.findall(s, m.Call(func=m.Attribute(attr=m.Name("backward"))))
                           for s in body):
        return None
    return body, ret


def _rewrite(stmts: list[cst.BaseStatement], scope: cst.CSTNode,
             many: set[str]) -> list[cst.BaseStatement] | None:
    out = list(stmts)
    changed = False
    for i in range(len(out) - 1, -1, -1):
        found = _step_call(out[i])
        if found is None:
            continue
        call, target = found
        name = call.args[0].value.value
        opt = call.func.value
        if isinstance(opt, cst.Name) and opt.value in many:
            continue
        defs = [k for k in range(i) if isinstance(out[k], cst.FunctionDef)
                and out[k].name.value == name]
        if len(defs) != 1:
            continue
        k = defs[0]
        fn = out[k]
        parts = _closure_body(fn)
        if parts is None:
            continue
        body, ret = parts
        if target is not None and ret is None:
            continue
        # read nowhere but at the step
        uses = [n for n in _variables(scope) if n.value == name]
        if len(uses) != 2:  # the def's name and the step's argument
            continue
        local = _assigned(body)
        between = out[k + 1:i]
        if _assigned(between) & {n.value for n in _variables(fn.body)}:
            continue
        if not _locals_safe(out, i, local, scope, fn):
            continue
        step = cst.SimpleStatementLine(
            body=[cst.Expr(call.with_changes(args=[]))],
            leading_lines=out[i].leading_lines)
        new = [body[0].with_changes(leading_lines=fn.leading_lines), *body[1:]]
        after = [step]
        if target is not None:
            after.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(target)], value=cst.Name(ret))]))
        out = [*out[:k], *between, *new, *after, *out[i + 1:]]
        changed = True
    return out if changed else None


def _count_reads(nodes, names: set[str]) -> int:
    """How many reads of ``names`` the nodes hold (a Name not bound by an assignment there)."""
    total = 0
    for node in nodes:
        bound = {id(n) for t in m.findall(node, m.AssignTarget() | m.For() | m.AnnAssign()
                                          | m.WithItem() | m.CompFor())
                 for n in m.findall(getattr(t, "target", None) or getattr(t, "asname", None)
                                    or cst.Name("_"), m.Name())}
        total += sum(1 for n in _variables(node)
                     if n.value in names and id(n) not in bound)
    return total


def _unread(stmts: list[cst.BaseStatement], pending: set[str]) -> set[str] | None:
    """The names of ``pending`` still unbound after ``stmts`` run in order, or None when one of
    them is read first. A plain assignment binds; a ``with`` block runs its body (always);
    any other compound statement may not run, so it binds nothing here."""
    for s in stmts:
        if isinstance(s, cst.With) and isinstance(s.body, cst.IndentedBlock):
            if any(_reads(item, pending) for item in s.items):
                return None
            left = _unread(list(s.body.body), pending)
            if left is None:
                return None
            pending = left
            continue
        if _reads(s, pending):
            return None
        if isinstance(s, cst.SimpleStatementLine) and all(
                isinstance(x, cst.Assign) for x in s.body):
            pending = pending - _assigned([s])
    return pending


def _locals_safe(block: list[cst.BaseStatement], at: int, local: set[str], scope: cst.CSTNode,
                 fn: cst.FunctionDef) -> bool:
    """The closure's locals are read outside it only after an assignment of theirs that follows
    the step at ``at`` in ``block`` (a plain assignment statement of that block)."""
    if not local:
        return True
    rest = block[at + 1:]
    if _unread(rest, set(local)) is None:
        return False
    # no read elsewhere in the scope: before the closure, between, after the block
    return _count_reads([scope], local) == _count_reads([fn, *rest], local)


class _Rewrite(cst.CSTTransformer):
    def __init__(self, many: set[str]) -> None:
        super().__init__()
        self.changed = False
        self.many = many
        self.scopes: list[cst.CSTNode] = []

    def visit_Module(self, node):
        self.scopes.append(node)

    def visit_FunctionDef(self, node):
        self.scopes.append(node)

    def leave_FunctionDef(self, original_node, updated_node):
        self.scopes.pop()
        return updated_node

    def leave_IndentedBlock(self, original_node, updated_node):
        body = _rewrite(list(updated_node.body), self.scopes[-1], self.many)
        self.changed |= body is not None
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node, updated_node):
        body = _rewrite(list(updated_node.body), original_node, self.many)
        self.changed |= body is not None
        return updated_node if body is None else updated_node.with_changes(body=body)


def _line_search_optimizers(module: cst.Module) -> set[str]:
    """Names bound to an optimizer whose step calls its closure many times (L-BFGS)."""
    out = set()
    for a in m.findall(module, m.Assign(value=m.Call())):
        func = cst.Module(body=[]).code_for_node(a.value.func)
        if func.rsplit(".", 1)[-1] in _MANY_CALLS:
            for t in a.targets:
                out |= {n.value for n in m.findall(t.target, m.Name())}
    return out


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each ``optimizer.step(closure)`` written out as the statements it runs."""
    rewrite = _Rewrite(_line_search_optimizers(module))
    new = module.visit(rewrite)
    return new if rewrite.changed else module
