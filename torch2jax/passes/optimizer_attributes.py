"""An optimizer held as an attribute of a trainer object (issue 28), made a local of the method
that steps it.

minGPT's ``Trainer.run`` builds ``self.optimizer = model.configure_optimizers(config)`` and
steps ``self.optimizer.step()`` in its loop; other trainers build ``self.optimizer`` in
``__init__`` and step it in ``train_step(self, ...)``. The training passes follow an optimizer
through a name. A flax ``nnx.Optimizer`` is an object updated in place, like torch's, so in a
method that steps ``self.<attr>`` the attribute and a local bound to the same object are the
same optimizer: the method reads it through that local, rewritten here on the torch source
before the analysis (each line keeps its place or is mapped back, ``loader_classes.line_map``):

* assigned in the method, once, by a statement of the method's body (not nested in a loop,
  a branch or a ``with``), and not read before that statement:
  ``self.optimizer = CALL`` becomes ``optimizer = CALL`` then ``self.optimizer = optimizer``
  (the trainer still holds it, for callbacks and checkpoints);
* not assigned in the method (built in ``__init__``): ``optimizer = self.optimizer`` is the
  method's first statement.

Every later read of ``self.<attr>`` in the method is the local. What is an optimizer: a call of
a ``torch.optim`` class (``torch.optim.AdamW(...)``, ``optim.SGD(...)``, a class imported from
``torch.optim``) or of a ``configure_optimizers`` method, assigned to ``self.<attr>`` somewhere in
the class. A method that assigns the attribute more than once, or assigns it inside a nested
block, is left as it is (its steps stay marked).
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

_OPTIM_CALL = re.compile(r"(^|\.)optim\.[A-Z]\w*$")


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _optim_imports(module: cst.Module) -> set[str]:
    """Names bound by ``from torch.optim import AdamW [as A]``."""
    out = set()
    for imp in m.findall(module, m.ImportFrom()):
        if imp.module is None or _code(imp.module) != "torch.optim" or isinstance(
                imp.names, cst.ImportStar):
            continue
        for alias in imp.names:
            bound = alias.asname.name if alias.asname else alias.name
            if isinstance(bound, cst.Name) and bound.value[:1].isupper():
                out.add(bound.value)
    return out


def _self_attr(attr: str | None = None) -> m.Attribute:
    return m.Attribute(value=m.Name("self"), attr=m.Name(attr) if attr else m.Name())


def _assigns_of(node: cst.CSTNode, attr: str) -> list[cst.Assign]:
    return [a for a in m.findall(node, m.Assign()) if any(
        m.matches(t.target, _self_attr(attr)) for t in a.targets)] + [
        a for a in m.findall(node, m.AugAssign() | m.AnnAssign())
        if m.matches(a.target, _self_attr(attr))]


class _Local(cst.CSTTransformer):
    """``self.<attr>`` read as ``local`` (the assignment's own target is kept)."""

    def __init__(self, attr: str, local: str) -> None:
        self.attr, self.local = attr, local

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return not m.matches(node.target, _self_attr(self.attr))

    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node, _self_attr(self.attr)):
            return cst.Name(self.local)
        return updated_node


def _fresh(fn: cst.FunctionDef, base: str) -> str:
    attrs = {id(a.attr) for a in m.findall(fn, m.Attribute())}
    taken = {n.value for n in m.findall(fn, m.Name()) if id(n) not in attrs}
    name = base
    while name in taken:
        name += "_"
    return name


def _first_index(body: list[cst.BaseStatement]) -> int:
    """Where a statement goes first in a body: after the docstring."""
    if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(
            value=m.SimpleString() | m.ConcatenatedString())])):
        return 1
    return 0


def _localise(fn: cst.FunctionDef, attr: str, built_only: bool = False) -> cst.FunctionDef:
    body = list(fn.body.body)
    assigns = _assigns_of(fn.body, attr)
    local = _fresh(fn, attr)
    if not assigns and built_only:
        return fn
    if not assigns:
        read = cst.parse_statement(f"{local} = self.{attr}\n")
        at = _first_index(body)
        rest = [s.visit(_Local(attr, local)) for s in body[at:]]
        return fn.with_changes(body=fn.body.with_changes(body=[*body[:at], read, *rest]))
    if len(assigns) != 1 or not isinstance(assigns[0], cst.Assign) or len(
            assigns[0].targets) != 1:
        return fn
    at = next((i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
               and len(s.body) == 1 and s.body[0] is assigns[0]), None)
    if at is None or any(m.findall(s, _self_attr(attr)) for s in body[:at]) or m.findall(
            assigns[0].value, _self_attr(attr)):
        return fn
    line = body[at]
    bind = line.with_changes(body=[assigns[0].with_changes(
        targets=[cst.AssignTarget(cst.Name(local))])])
    keep = cst.parse_statement(f"self.{attr} = {local}\n")
    rest = [s.visit(_Local(attr, local)) for s in body[at + 1:]]
    return fn.with_changes(body=fn.body.with_changes(body=[*body[:at], bind, keep, *rest]))


class _Methods(cst.CSTTransformer):
    def __init__(self, optimizer_call) -> None:
        self.is_optimizer = optimizer_call

    def _held(self, cls: cst.ClassDef) -> tuple[set[str], set[str]]:
        """(the attributes holding an optimizer, those holding the model it updates: ``self.M``
        in ``torch.optim.X(self.M.parameters())``, or ``self.M = model`` beside
        ``torch.optim.X(model.parameters())`` in the same method)."""
        held, models = set(), set()
        for fn in m.findall(cls, m.FunctionDef()):
            for a in m.findall(fn, m.Assign(value=m.Call())):
                if not self.is_optimizer(a.value.func):
                    continue
                attrs = {t.target.attr.value for t in a.targets
                         if m.matches(t.target, _self_attr())}
                held |= attrs
                first = a.value.args[0].value if attrs and a.value.args else None
                params = m.Call(func=m.Attribute(attr=m.Name("parameters")), args=[])
                if not m.matches(first, params):
                    continue
                owner = first.func.value
                if m.matches(owner, _self_attr()):
                    models.add(owner.attr.value)
                elif isinstance(owner, cst.Name):
                    models |= {b.targets[0].target.attr.value for b in m.findall(fn, m.Assign(
                        targets=[m.AssignTarget(target=_self_attr())],
                        value=m.Name(owner.value)))}
        return held, models - held

    def leave_ClassDef(self, original_node, updated_node):
        held, models = self._held(updated_node)
        if not held:
            return updated_node
        body = []
        for stmt in updated_node.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.params.params and (
                    stmt.params.params[0].name.value == "self"):
                stepping = [attr for attr in sorted(held) if m.findall(stmt.body, m.Call(
                    func=m.Attribute(value=_self_attr(attr), attr=m.Name("step")), args=[]))]
                for attr in stepping:
                    stmt = _localise(stmt, attr)
                if stepping:  # the model the step updates: read through a local too
                    for attr in sorted(models):
                        if m.findall(stmt.body, _self_attr(attr)):
                            stmt = _localise(stmt, attr)
                else:  # where the optimizer is built: bound to a local first
                    for attr in sorted(held):
                        stmt = _localise(stmt, attr, built_only=True)
            body.append(stmt)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each optimizer attribute a method steps read through a local."""
    imported = _optim_imports(module)

    def is_optimizer(func: cst.BaseExpression) -> bool:
        text = _code(func)
        return bool(_OPTIM_CALL.search(text) or text.endswith("configure_optimizers")
                    or text in imported)

    if not m.findall(module, m.Call(func=m.Attribute(value=_self_attr(),
                                                     attr=m.Name("step")))):
        return module
    return module.visit(_Methods(is_optimizer))
