"""A forward chosen at construction by assigning a bound method, written as a forward that
dispatches on the choice (a canonical form on the torch source, as ``passes/module_methods.py``).

timm's fasternet writes

    def __init__(self, dim, n_div, forward):
        ...
        if forward == 'slicing':
            self.forward = self.forward_slicing
        elif forward == 'split_cat':
            self.forward = self.forward_split_cat

In torch the instance attribute shadows the class's ``forward`` (or stands for a missing one),
so ``module(x)`` calls the chosen method. A JAX module is called through its class's
``__call__``: left as it was, the converted class had none ("object is not callable"). Each
``self.forward = self.NAME`` (``NAME`` a method of the class) becomes ``self.forward_name =
"NAME"``, a string (static on every target), and the class gets the ``forward`` torch called:

    def forward(self, x):
        if self.forward_name == "forward_slicing":
            return self.forward_slicing(x)
        return self.forward_split_cat(x)

taking the chosen methods' parameters where they are the same (else ``*args, **kwargs``). A
class that also defines ``forward`` keeps it as ``forward_default``, the choice before any
assignment.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_SELF_FORWARD = m.Assign(targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name("forward")))])


def _chosen(stmt: cst.BaseSmallStatement, methods: set[str]) -> str | None:
    """``NAME`` where ``stmt`` is ``self.forward = self.NAME`` of a method of the class."""
    if m.matches(stmt, _SELF_FORWARD) and m.matches(
            stmt.value, m.Attribute(m.Name("self"), m.Name())) and stmt.value.attr.value in methods:
        return stmt.value.attr.value
    return None


class _Choices(cst.CSTTransformer):
    """Inside one ``__init__``: each bound-method assignment to ``self.forward`` rewritten."""

    def __init__(self, methods: set[str], attr: str):
        self.methods, self.attr, self.names, self.other = methods, attr, [], False
        self.depth = 0

    def visit_FunctionDef(self, node):
        self.depth += 1
        return self.depth == 1  # not inside a function nested in ``__init__``

    def visit_ClassDef(self, node):
        return False

    def leave_Assign(self, original_node, updated_node):
        name = _chosen(updated_node, self.methods)
        if name is None:
            if m.matches(updated_node, _SELF_FORWARD):
                self.other = True  # a value that is not a method of the class: left as it is
            return updated_node
        self.names.append(name)
        return updated_node.with_changes(
            targets=[cst.AssignTarget(cst.Attribute(cst.Name("self"), cst.Name(self.attr)))],
            value=cst.SimpleString(f'"{name}"'))


def _params(fns: list[cst.FunctionDef]) -> tuple[cst.Parameters, list[cst.Arg]]:
    """The dispatching forward's parameters and the arguments it passes on."""
    first = fns[0].params
    code = cst.Module([]).code_for_node
    same = all(code(f.params.with_changes(params=[p.with_changes(annotation=None, default=None)
                                                  for p in f.params.params]))
               == code(first.with_changes(params=[p.with_changes(annotation=None, default=None)
                                                  for p in first.params]))
               for f in fns)
    if same and not first.star_kwarg and isinstance(first.star_arg, cst.MaybeSentinel) \
            and not first.kwonly_params and not first.posonly_params:
        return first, [cst.Arg(p.name) for p in first.params[1:]]
    params = cst.Parameters(params=[cst.Param(cst.Name("self"))],
                            star_arg=cst.Param(cst.Name("args")),
                            star_kwarg=cst.Param(cst.Name("kwargs")))
    return params, [cst.Arg(cst.Name("args"), star="*"), cst.Arg(cst.Name("kwargs"), star="**")]


def _dispatch(attr: str, names: list[str], fns: dict[str, cst.FunctionDef]) -> cst.FunctionDef:
    params, args = _params([fns[n] for n in names])
    body: list[cst.BaseStatement] = []
    for i, name in enumerate(names):
        call = cst.Call(cst.Attribute(cst.Name("self"), cst.Name(name)), args)
        ret = cst.SimpleStatementLine([cst.Return(call)])
        if i == len(names) - 1:
            body.append(ret)
        else:
            test = cst.Comparison(cst.Attribute(cst.Name("self"), cst.Name(attr)), [
                cst.ComparisonTarget(cst.Equal(), cst.SimpleString(f'"{name}"'))])
            body.append(cst.If(test, cst.IndentedBlock([ret])))
    return cst.FunctionDef(cst.Name("forward"), params, cst.IndentedBlock(body),
                           leading_lines=[cst.EmptyLine(indent=False)])


def _rewrite(cls: cst.ClassDef) -> cst.ClassDef:
    fns = {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}
    init = fns.get("__init__")
    if init is None or not m.findall(init, _SELF_FORWARD):
        return cls
    attr = "forward_name"
    while m.findall(cls, m.Attribute(m.Name("self"), m.Name(attr))):
        attr += "_"
    has_forward = "forward" in fns
    choices = _Choices(set(fns) - {"__init__", "forward"}, attr)
    new_init = init.visit(choices)
    if not choices.names or choices.other:
        return cls
    names = list(dict.fromkeys(choices.names))
    if has_forward:  # the class's own forward: the choice before any assignment
        names.append("forward_default")
        fns["forward_default"] = fns["forward"]
        first = cst.SimpleStatementLine([cst.Assign(
            [cst.AssignTarget(cst.Attribute(cst.Name("self"), cst.Name(attr)))],
            cst.SimpleString('"forward_default"'))])
        body = list(new_init.body.body)
        at = next((i + 1 for i, s in enumerate(body) if m.findall(
            s, m.Call(func=m.Attribute(m.Call(func=m.Name("super")), m.Name("__init__"))))), 0)
        new_init = new_init.with_changes(body=new_init.body.with_changes(
            body=[*body[:at], first, *body[at:]]))
    out: list[cst.BaseStatement] = []
    for stmt in cls.body.body:
        if stmt is init:
            out.append(new_init)
        elif isinstance(stmt, cst.FunctionDef) and stmt.name.value == "forward":
            out.append(stmt.with_changes(name=cst.Name("forward_default")))
        else:
            out.append(stmt)
    out.append(_dispatch(attr, names, fns))
    return cls.with_changes(body=cls.body.with_changes(body=out))


class _Classes(cst.CSTTransformer):
    def leave_ClassDef(self, original_node, updated_node):
        return _rewrite(updated_node)


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with each forward chosen by a bound-method assignment written as a dispatch."""
    if not m.findall(module, _SELF_FORWARD):
        return module
    return module.visit(_Classes())
