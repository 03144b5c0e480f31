"""An optimizer given a model's trainable parameters, ``filter(lambda p: p.requires_grad,
model.parameters())``, made the optimizer of ``model.parameters()`` before the analysis.

Fine-tuning code freezes part of a model and hands the optimizer the parameters left
trainable:

    for p in model.backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.1)

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

The converted freeze makes those parameters ``FrozenParam``s (``freeze_parameters``), which are
not ``nnx.Param``s: an ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` already holds exactly the
parameters left trainable, as torch's filtered list does. So, on the torch source, such an
argument is the model's ``parameters()``, which the training passes translate (before: the
optimizer was marked, "parameters given as something other than model.parameters()"). Inside
parameter-group dicts (``{"params": filter(lambda p: p.requires_grad,
model.head.parameters()), "lr": ...}``) likewise. Only the filters that keep the trainable
parameters and nothing else are rewritten: a lambda or a comprehension whose one test is
``<p>.requires_grad``, over ``<module>.parameters()``, given in the call or bound once to a name
of the same function (``params = [p for p in model.parameters() if p.requires_grad]``, then
``SGD(params, ...)``: the assignment stays, a list the optimizer no longer reads).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.optimizer_attributes import _OPTIM_CALL, _code, _optim_imports

_PARAMETERS = m.Call(func=m.Attribute(attr=m.Name("parameters")), args=[])


def _requires_grad_of(test: cst.BaseExpression, name: str) -> bool:
    return m.matches(test, m.Attribute(value=m.Name(name), attr=m.Name("requires_grad")))


def _parameters_kept(node: cst.BaseExpression) -> cst.Call | None:
    """The ``X.parameters()`` call that ``node`` filters down to its trainable parameters,
    or None."""
    if m.matches(node, m.Call(func=m.Name("filter"))) and len(node.args) == 2 and all(
            a.keyword is None and not a.star for a in node.args):
        fn, over = node.args[0].value, node.args[1].value
        if isinstance(fn, cst.Lambda) and len(fn.params.params) == 1 and not (
                isinstance(fn.params.star_arg, cst.Param) or fn.params.kwonly_params
                or fn.params.star_kwarg or fn.params.posonly_params) and _requires_grad_of(
                    fn.body, fn.params.params[0].name.value) and m.matches(over, _PARAMETERS):
            return over
        return None
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        comp = node.for_in
        if (comp.inner_for_in is None and comp.asynchronous is None
                and isinstance(comp.target, cst.Name)
                and m.matches(node.elt, m.Name(comp.target.value))
                and len(comp.ifs) == 1 and _requires_grad_of(comp.ifs[0].test, comp.target.value)
                and m.matches(comp.iter, _PARAMETERS)):
            return comp.iter
    return None


def trainable_only(call: cst.Call, parent: cst.CSTNode | None) -> bool:
    """``call`` (``X.parameters()``) is the iterable of a comprehension that keeps the
    trainable parameters, ``sum(p.numel() for p in model.parameters() if p.requires_grad)``:
    in a file that freezes, the ``nnx.Param``s alone (``p.requires_grad`` reads ``True``)."""
    if not isinstance(parent, cst.CompFor) or parent.iter is not call or not isinstance(
            parent.target, cst.Name):
        return False
    name = parent.target.value
    tests = []
    for test in (c.test for c in parent.ifs):
        while isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            tests.append(test.right)
            test = test.left
        tests.append(test)
    return any(_requires_grad_of(t, name) for t in tests)


class _Arguments(cst.CSTTransformer):
    """Inside an optimizer's arguments: each trainable-parameter filter its ``parameters()``."""

    def leave_Call(self, original_node, updated_node):
        return _parameters_kept(updated_node) or updated_node

    def leave_ListComp(self, original_node, updated_node):
        return _parameters_kept(updated_node) or updated_node

    def leave_GeneratorExp(self, original_node, updated_node):
        return _parameters_kept(updated_node) or updated_node


def _named_filters(scope: cst.CSTNode) -> dict[str, cst.Call]:
    """The names ``scope`` binds once, to a trainable-parameter filter (``params = [p for p in
    model.parameters() if p.requires_grad]``): name -> its ``parameters()`` call."""
    counts: dict[str, int] = {}
    found: dict[str, cst.Call] = {}
    for a in m.findall(scope, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For()):
        targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
        for t in targets:
            for n in ([t] if isinstance(t, cst.Name) else m.findall(t, m.Name())):
                counts[n.value] = counts.get(n.value, 0) + 1
        if isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(
                a.targets[0].target, cst.Name):
            kept = _parameters_kept(a.value)
            if kept is not None:
                found[a.targets[0].target.value] = kept
    return {n: c for n, c in found.items() if counts.get(n) == 1}


class _Optimizers(cst.CSTTransformer):
    """Each optimizer's trainable-parameter filter, written in its call or bound once to a
    name of the same function and passed (``SGD(params, ...)``), its ``parameters()``."""

    def __init__(self, imported: set[str], module: cst.Module) -> None:
        super().__init__()
        self.imported = imported
        self.scopes = [_named_filters(module)]

    def visit_FunctionDef(self, node):
        self.scopes.append(_named_filters(node.body))

    def leave_FunctionDef(self, original_node, updated_node):
        self.scopes.pop()
        return updated_node

    def leave_Call(self, original_node, updated_node):
        text = _code(updated_node.func)
        if not (_OPTIM_CALL.search(text) or text in self.imported) or not updated_node.args:
            return updated_node
        first = updated_node.args[0]
        if first.keyword is not None and first.keyword.value != "params":
            return updated_node
        if isinstance(first.value, cst.Name) and first.value.value in self.scopes[-1]:
            return updated_node.with_changes(
                args=[first.with_changes(value=self.scopes[-1][first.value.value]),
                      *updated_node.args[1:]])
        return updated_node.with_changes(
            args=[first.with_changes(value=first.value.visit(_Arguments())),
                  *updated_node.args[1:]])


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each optimizer's trainable-parameter filter its ``parameters()``."""
    return module.visit(_Optimizers(_optim_imports(module), module))
