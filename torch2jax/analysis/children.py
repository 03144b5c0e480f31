"""``module.children()`` / ``module.named_children()`` on a module class of the file.

torch's children are the layers ``__init__`` registered, in registration order (activations
included: ``nn.ReLU()`` is a child). NNX has no such list (``nnx.iter_children`` yields modules
only, sorted by name, and the activations became functions), so the call is written as the
attributes themselves, in torch's order: ``iter([backbone.a, backbone.act, backbone.b])``.
That is exact only where the order is known statically: every attribute of the class's
``__init__`` is assigned once, unconditionally, at the top of ``__init__``, and is either a
layer (a rule's layer or a module class of the file) or a value that cannot be a module (a
number, a string, a config's field). Anything else (a module handed in, a layer built by an
unknown helper, a branch, ``add_module``) is marked by the caller.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m


class ChildrenUnknown(Exception):
    """The children of a module class are not known statically (the message says why)."""


class ChildrenByName(ChildrenUnknown):
    """The class registers its layers by computed names (``self.add_module(name, Block(...))``
    in a loop) and only layers that stay NNX modules: its children are the modules it holds,
    in the order it assigned them (the ``torch_named_children`` walk at run time)."""

_NOT_MODULES = (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString,
                cst.ConcatenatedString, cst.BinaryOperation, cst.UnaryOperation,
                cst.Comparison, cst.BooleanOperation)
_SCALAR_CALLS = frozenset({"int", "float", "bool", "str", "round", "max", "min", "abs", "len",
                           "math.sqrt", "math.log", "math.ceil", "math.floor"})


class IndexView:
    """What these functions read of the rewriter, from the Indexer (its ``finish``)."""

    def __init__(self, indexer, current_class: str, q) -> None:
        self.index, self.rules = indexer.index, indexer.rules
        self.current_class, self.q = current_class, q

    def in_module_class(self) -> bool:
        return self.current_class in self.index.module_classes


def _class_def(root: cst.Module, name: str) -> cst.ClassDef | None:
    return next((c for c in m.findall(root, m.ClassDef(name=m.Name(name)))), None)


def _scalar_param(init: cst.FunctionDef, name: str) -> bool:
    """A parameter of ``__init__`` that cannot hold a module: its default is a number, a
    string or a bool, or it is annotated int / float / str / bool."""
    for p in init.params.params:
        if p.name.value != name:
            continue
        if p.annotation is not None and m.matches(
                p.annotation.annotation, m.Name("int") | m.Name("float") | m.Name("str")
                | m.Name("bool")):
            return True
        return p.default is not None and (isinstance(p.default, _NOT_MODULES) or m.matches(
            p.default, m.Name("True") | m.Name("False")))
    return False


def children_of(rw, cls: str, root: cst.Module) -> list[str]:
    """The attributes that are ``cls``'s torch children, in registration order; raises
    ChildrenUnknown when that order is not known statically."""
    info = rw.index.classes.get(cls)
    if info is None or info.container is not None or info.module_base != "torch":
        raise ChildrenUnknown(f"{cls}.children(): {cls} is a container or derives from "
                             "another module class; its children are not read statically")
    node = _class_def(root, cls)
    init = next((f for f in node.body.body if m.matches(f, m.FunctionDef(
        name=m.Name("__init__")))), None) if node is not None else None
    if init is None:
        raise ChildrenUnknown(f"{cls}.children(): no __init__ of its own")
    if m.findall(node, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(
            "add_module") | m.Name("register_module")) | m.Name("setattr"))):
        if registered_modules_only(rw, info, node, init):
            raise ChildrenByName(f"{cls}.children(): layers registered by name")
        raise ChildrenUnknown(f"{cls}.children(): layers registered by name (add_module, "
                             "setattr)")
    top = set()
    order: list[str] = []
    for stmt in init.body.body:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                target=m.Attribute(value=m.Name("self")))])])):
            continue
        a = stmt.body[0]
        attr, value = a.targets[0].target.attr.value, a.value
        top.add(id(a))
        if attr in order:
            continue  # torch keeps the first registration's place
        if _is_layer(rw, value):
            order.append(attr)
        elif not _not_a_module(rw, init, value):
            raise ChildrenUnknown(f"{cls}.children(): whether self.{attr} is a module is not "
                                 "known statically")
    for a in m.findall(init, m.Assign(targets=[m.AssignTarget(target=m.Attribute(
            value=m.Name("self")))])):
        if id(a) not in top:
            raise ChildrenUnknown(f"{cls}.children(): self.{a.targets[0].target.attr.value} is "
                                  "assigned under a condition or a loop")
    if set(info.module_attrs) - set(order):
        raise ChildrenUnknown(f"{cls}.children(): layers are assigned outside __init__")
    return order


def registered_modules_only(rw, info, node: cst.ClassDef, init: cst.FunctionDef) -> bool:
    """Whether every layer of the class is registered in its ``__init__`` and stays an NNX
    module: by name (``self.add_module(name, Block(...))``, ``setattr(self, name, ...)``) or as
    an attribute, each a module class of the file built there (or built through a parameter
    of ``__init__`` that defaults to one: ``block_fn=Bottleneck``); the other attributes are no
    modules. An activation layer (a JAX function) or a layer handed in would be missed by
    a walk of the modules the instance holds."""
    by_name = m.findall(node, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(
        "add_module") | m.Name("register_module")) | m.Name("setattr")))
    in_init = {id(c) for c in m.findall(init, m.Call())}
    for call in by_name:
        on_self = isinstance(call.func, cst.Attribute) or (
            call.args and m.matches(call.args[0].value, m.Name("self")))
        if id(call) not in in_init or not on_self or len(call.args) != (
                3 if isinstance(call.func, cst.Name) else 2):
            return False
        if not _builds_file_class(rw, init, call.args[-1].value):
            return False
    built = set()
    for a in m.findall(init, m.Assign(targets=[m.AssignTarget(target=m.Attribute(
            value=m.Name("self")))])):
        if _builds_file_class(rw, init, a.value):
            built.add(a.targets[0].target.attr.value)
        elif not _not_a_module(rw, init, a.value):
            return False
    return set(info.module_attrs) <= built


def _builds_file_class(rw, init: cst.FunctionDef, value: cst.BaseExpression) -> bool:
    """``Block(...)`` of a module class of the file, or ``block_fn(...)`` of a parameter of
    ``__init__`` whose default is one."""
    if not m.matches(value, m.Call(func=m.Name())):
        return False
    classes = rw.index.module_classes
    name = value.func.value
    if name in classes:
        return True
    for p in (*init.params.params, *init.params.kwonly_params):
        if p.name.value == name:
            return p.default is not None and m.matches(p.default, m.Name()) and (
                p.default.value in classes)
    return False


def _is_layer(rw, value: cst.BaseExpression) -> bool:
    if not isinstance(value, cst.Call):
        return False
    if isinstance(value.func, cst.Name) and value.func.value in rw.index.module_classes:
        return True
    q = rw.q(value.func)
    rule = rw.rules.layers.get(q or "")
    return rule is not None and rule.special not in ("parameter",)


def _not_a_module(rw, init: cst.FunctionDef, value: cst.BaseExpression) -> bool:
    if isinstance(value, _NOT_MODULES) or m.matches(value, m.Name("True") | m.Name("False")):
        return True
    if isinstance(value, cst.Name):
        return _scalar_param(init, value.value)
    if isinstance(value, cst.Attribute):  # config.n_embd
        return not m.matches(value, m.Attribute(value=m.Name("self")))
    if isinstance(value, cst.Call):
        q = rw.q(value.func) or ""
        return (q.removeprefix("builtins.") in _SCALAR_CALLS
                or q in ("torch.nn.Parameter", "torch.nn.parameter.Parameter")
                or q.startswith("torch.") and q not in rw.rules.layers
                and not q.startswith("torch.nn."))
    return False


def receiver_class(rw, recv: cst.BaseExpression, fn: cst.FunctionDef | None) -> str | None:
    """The module class of the file that ``recv`` is an instance of: ``self``, a name the
    enclosing function binds once to ``Cls(...)``, or ``self.x`` built as ``Cls(...)``."""
    classes = rw.index.module_classes
    if m.matches(recv, m.Name("self")) and rw.in_module_class():
        return rw.current_class
    if m.matches(recv, m.Attribute(value=m.Name("self"))) and rw.in_module_class():
        ctor = rw.index.classes[rw.current_class].attr_ctor.get(recv.attr.value)
        if ctor is not None and m.matches(ctor.func, m.Name()) and ctor.func.value in classes:
            return ctor.func.value
        return None
    if isinstance(recv, cst.Name) and fn is not None:
        binds = [a for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(
            target=m.Name(recv.value))]))]
        others = m.findall(fn, m.AugAssign(target=m.Name(recv.value)) | m.For(
            target=m.Name(recv.value)) | m.NamedExpr(target=m.Name(recv.value)))
        if len(binds) == 1 and not others and m.matches(binds[0].value, m.Call(
                func=m.Name())) and binds[0].value.func.value in classes:
            return binds[0].value.func.value
    return None


def children_call(rw, original: cst.Call, updated: cst.Call, root: cst.Module,
                  fn: cst.FunctionDef | None, iterated: bool = False) -> cst.BaseExpression | None:
    """``recv.children()`` / ``recv.named_children()`` on a module class of the file: the
    attributes in torch's order (None when ``recv`` is not one); a list where the call is
    only iterated (``iterated``: a for loop, ``list(...)``), else an iterator over it, as
    torch's generator."""
    cls = receiver_class(rw, original.func.value, fn)
    if cls is None:
        return None
    recv = updated.func.value
    named = original.func.attr.value == "named_children"
    try:
        attrs = children_of(rw, cls, root)
    except ChildrenByName:
        if not rw.target.stateful_modules or rw.target.setup_modules:
            raise
        # every child an NNX module, assigned in torch's order: the modules it holds
        walk = cst.Call(cst.Name("torch_named_children"), [cst.Arg(recv)])
        if named:
            return walk
        return cst.GeneratorExp(cst.Name("child"), cst.CompFor(
            target=cst.Tuple([cst.Element(cst.Name("_")), cst.Element(cst.Name("child"))],
                             lpar=[], rpar=[]), iter=walk))
    items = [cst.Tuple([cst.Element(cst.SimpleString(f'"{a}"')), cst.Element(
        cst.Attribute(value=recv, attr=cst.Name(a)))]) if named
        else cst.Attribute(value=recv, attr=cst.Name(a)) for a in attrs]
    listed = cst.List([cst.Element(i) for i in items])
    return listed if iterated else cst.Call(func=cst.Name("iter"), args=[cst.Arg(listed)])


def children_layouts(rw, v: cst.BaseExpression, root: cst.Module,
                     fn: cst.FunctionDef | None) -> list[str] | None:
    """The layouts of the layers ``*list(recv.children())[a:b]`` (or ``*recv.children()``)
    spreads into a Sequential, the slice taken when it is constant; ["mixed"] when they are
    not known, None when ``v`` is no such spread."""
    sl = None
    if m.matches(v, m.Subscript(value=m.Call(func=m.Name("list")), slice=[m.SubscriptElement(
            m.Slice())])):
        sl, v = v.slice[0].slice, v.value.args[0].value
    elif m.matches(v, m.Call(func=m.Name("list"), args=[m.Arg()])):
        v = v.args[0].value
    if not m.matches(v, m.Call(func=m.Attribute(attr=m.Name("children")), args=[])):
        return None
    cls = receiver_class(rw, v.func.value, fn)
    if cls is None:
        return None
    try:
        attrs = children_of(rw, cls, root)
    except ChildrenUnknown:
        return ["mixed"]
    layouts = [rw.index.classes[cls].attr_layout.get(a, "torch") for a in attrs]
    if sl is not None:
        bounds = []
        for b in (sl.lower, sl.upper):
            if b is None:
                bounds.append(None)
                continue
            try:
                bounds.append(int(cst.Module([]).code_for_node(b)))
            except ValueError:
                return ["mixed"]
        if sl.step is not None:
            return ["mixed"]
        layouts = layouts[bounds[0]:bounds[1]]
    return layouts
