"""Callbacks a class of the file calls with its own instance, and what they can reach.

minGPT's ``Trainer`` keeps callbacks in a container attribute (``self.callbacks``), filled
by a registration method (``add_callback(onevent, callback)``) and called with the trainer
(``for callback in self.callbacks.get(onevent, []): callback(self)``). Two questions need
this:

* what a callback's parameter is (``trainer.loss`` is the trainer's attribute, a tensor;
  analysis/values.py): ``receiver``;
* whether a training loop in the trainer's method lets its model and optimizer be read
  between steps, through ``self`` or the callbacks it calls (a loop that does not can keep
  their state split, passes/rewrite_loops.py): ``loop_reads_only_state``.

Pure syntax over the module; every answer is a proof or nothing (None / False).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "add",
                       "__setitem__"})
_EMPTY = ("defaultdict", "dict", "list", "set")  # self.callbacks = defaultdict(list)


@dataclass
class Registry:
    """The callbacks class ``cls`` keeps in ``self.<attr>`` and calls with its instance at
    argument ``position``: the file's functions registered (``functions``), and whether
    those are all of them (``complete``: every registration passes a function of the file,
    nothing outside the class touches the container)."""

    cls: str
    attr: str
    position: int
    functions: list[str] = field(default_factory=list)
    complete: bool = True


def _self_attr(node: cst.CSTNode) -> str | None:
    if m.matches(node, m.Attribute(value=m.Name("self"))):
        return node.attr.value
    return None


def _container_root(node: cst.BaseExpression) -> str | None:
    """``self.A``, ``self.A[k]``, ``self.A.get(k, [])``, ``self.A.values()`` -> ``A``."""
    while True:
        found = _self_attr(node)
        if found is not None:
            return found
        if isinstance(node, cst.Subscript):
            node = node.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and (
                node.func.attr.value in ("get", "values", "copy")):
            node = node.func.value
        else:
            return None


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}


def _params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]


def _calls_with_self(fn: cst.FunctionDef) -> list[tuple[str, int]]:
    """(container, position) for each ``v(..., self, ...)`` where ``v`` iterates a container
    attribute (``for v in self.A...``)."""
    found = []
    for loop in findall(fn, m.For(target=m.Name())):
        root = _container_root(loop.iter)
        if root is None:
            continue
        var = loop.target.value
        for call in findall(loop.body, m.Call(func=m.Name(var))):
            for i, a in enumerate(call.args):
                if a.keyword is None and not a.star and m.matches(a.value, m.Name("self")):
                    found.append((root, i))
    return found


def _registration(fn: cst.FunctionDef, attr: str) -> int | None:
    """The parameter position (after ``self``) of the callable ``fn`` puts into
    ``self.<attr>`` (``self.A[k].append(p)``, ``self.A.append(p)``, ``self.A[k] = [p]``)."""
    params = _params(fn)[1:]
    for call in findall(fn, m.Call(func=m.Attribute(attr=m.Name("append")))):
        if _container_root(call.func.value) == attr and len(call.args) == 1 and (
                isinstance(call.args[0].value, cst.Name)) and call.args[0].value.value in params:
            return params.index(call.args[0].value.value)
    for assign in findall(fn, m.Assign(targets=[m.AssignTarget(target=m.Subscript())])):
        value = assign.value
        if isinstance(value, cst.List) and len(value.elements) == 1:
            value = value.elements[0].value
        if _container_root(assign.targets[0].target) == attr and isinstance(
                value, cst.Name) and value.value in params:
            return params.index(value.value)
    return None


def _registered(value: cst.BaseExpression, params: list[str], at: int | None) -> bool:
    return at is not None and m.matches(value, m.Name()) and value.value in params and (
        params.index(value.value) == at)


def _empty(node: cst.BaseExpression) -> bool:
    if isinstance(node, (cst.Dict, cst.List, cst.Set)):
        return not node.elements
    return m.matches(node, m.Call(func=m.Name())) and node.func.value in _EMPTY


def registries(module: cst.Module) -> list[Registry]:
    classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
    defs = {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)}
    out = []
    for cls in classes:
        methods = _methods(cls)
        for attr, position in {c for f in methods.values() for c in _calls_with_self(f)}:
            reg = Registry(cls.name.value, attr, position)
            out.append(reg)
            adders = {n: i for n, f in methods.items()
                      if (i := _registration(f, attr)) is not None}
            for name, f in methods.items():  # other writes: only an empty container
                for assign in findall(f, m.Assign()):
                    if any(_self_attr(t.target) == attr for t in assign.targets) and (
                            not _empty(assign.value)):
                        reg.complete = False
                params = _params(f)[1:]
                for target, value in _bindings(f):  # what goes in: the registered parameter
                    if isinstance(value, cst.List) and len(value.elements) == 1:
                        value = value.elements[0].value
                    if isinstance(target, cst.Subscript) and _container_root(target) == attr \
                            and not _registered(value, params, adders.get(name)):
                        reg.complete = False
                for call in findall(f, m.Call(func=m.Attribute())):
                    if _container_root(call.func.value) == attr and (
                            call.func.attr.value in _MUTATORS) and not all(
                            _registered(a.value, params, adders.get(name)) for a in call.args):
                        reg.complete = False
            others = [c for c in classes if c is not cls]
            if any(attr in _methods(c) or set(adders) & set(_methods(c)) for c in others) or (
                    not adders):
                reg.complete = False
            built = [c for s in module.body if not isinstance(s, (cst.FunctionDef,
                                                                  cst.ClassDef))
                     for c in findall(s, m.Call(func=m.Name(cls.name.value)))]
            if not built:  # a class another file builds (and gives callbacks of its own)
                reg.complete = False
            for stmt in module.body:  # the container reached from outside the class
                if stmt is not cls and findall(stmt, m.Attribute(attr=m.Name(attr))):
                    reg.complete = False
            for call in findall(module, m.Call(func=m.Attribute(attr=m.Name()))):
                at = adders.get(call.func.attr.value)
                if at is None:
                    continue
                given = [a for a in call.args if a.keyword is None]
                arg = given[at].value if at < len(given) else None
                if isinstance(arg, cst.Name) and arg.value in defs:
                    reg.functions.append(arg.value)
                else:
                    reg.complete = False
    return out


def receiver(module: cst.Module, fn: cst.FunctionDef, found: list[Registry]
             ) -> tuple[str, int] | None:
    """(class, position) when the module-level function ``fn`` is read only where it is
    registered as a callback of one class (of ``found``, the module's registries), which
    calls it with its instance there."""
    name = fn.name.value
    found = [r for r in found if name in r.functions]
    if len(found) != 1:
        return None
    reads = [n for n in findall(module, m.Name(name))
             if n is not fn.name]
    if len(reads) != found[0].functions.count(name):  # called or passed elsewhere too
        return None
    return found[0].cls, found[0].position


# ------------------------------------------------ what a loop between train steps can read
def _mentions(node: cst.CSTNode, names: set[str], attrs: set[str]) -> bool:
    """Whether ``node`` reads one of ``names`` or ``self.<attr>`` of ``attrs`` other than as
    the callee of a call (``model(x)`` gives the model's output, not the model)."""
    if isinstance(node, cst.Call):
        callee = isinstance(node.func, cst.Name) or _self_attr(node.func) is not None
        return (not callee and _mentions(node.func, names, attrs)) or any(
            _mentions(a.value, names, attrs) for a in node.args)
    if isinstance(node, cst.Name):
        return node.value in names
    attr = _self_attr(node)
    if attr is not None:
        return attr in attrs
    return any(_mentions(c, names, attrs) for c in node.children)


def _bindings(fn: cst.CSTNode) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """(target, value) of the assignments under ``fn``, a tuple assigned a tuple element by
    element."""
    out = []
    for node in findall(fn, m.Assign() | m.AugAssign() | m.AnnAssign()):
        if getattr(node, "value", None) is None:
            continue
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [
            node.target]
        for target in targets:
            if isinstance(target, cst.Tuple) and isinstance(node.value, cst.Tuple) and len(
                    target.elements) == len(node.value.elements):
                out += [(t.value, v.value) for t, v in zip(target.elements,
                                                           node.value.elements)]
            elif isinstance(target, cst.Tuple):
                out += [(t.value, node.value) for t in target.elements]
            else:
                out.append((target, node.value))
    return out


def _root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def tainted_globals(module: cst.Module, module_classes: set[str]) -> set[str]:
    """The module-level names that may hold a model (built from a module class of the file)
    or what holds one (a trainer given it, a list it was appended to), to a fixpoint."""
    top = [s for s in module.body if not isinstance(s, (cst.FunctionDef, cst.ClassDef))]
    held: set[str] = set()
    while True:
        more = set()
        for stmt in top:
            for target, value in _bindings(stmt):
                seed = any(isinstance(c.func, cst.Name) and c.func.value in module_classes
                           for c in findall(value, m.Call()))
                name = _root_name(target)
                if name and name not in held and (seed or _mentions(value, held, set())):
                    more.add(name)
            for call in findall(stmt, m.Call(func=m.Attribute())):  # held.append(model)
                name = _root_name(call.func.value)
                if name and name not in held and any(_mentions(a.value, held, set())
                                                     for a in call.args):
                    more.add(name)
        if not more:
            return held
        held |= more


class LoopReads:
    """Whether the statements of a loop in a method of class ``cls`` read the model or the
    optimizer (``objects``) only through the train step: not by name, not through an
    attribute of ``self`` that may hold them (``holders``), not in a method of the class they
    call, nor in a callback of the class they call with ``self`` (a function of the file that
    reads no attribute of those names and no module-level name that may hold a model)."""

    def __init__(self, module: cst.Module, cls: cst.ClassDef | None, fn: cst.FunctionDef,
                 objects: set[str], module_classes: set[str]) -> None:
        self.module = module
        self.cls = cls
        self.methods = _methods(cls) if cls is not None else {}
        self.globals = tainted_globals(module, module_classes)
        self.defs = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        self.registries = {r.attr: r for r in registries(module)
                           if cls is not None and r.cls == cls.name.value}
        self.holders = self._holders(objects) if cls is not None else set()
        self.objects = set(objects) | self._aliases(fn, set(objects))
        self.local = {t.value for t, _ in _bindings(fn) if isinstance(t, cst.Name)} | (
            set(_params(fn)) if isinstance(fn, cst.FunctionDef) else set())
        self._seen: set[tuple[str, str]] = set()

    def _holder_params(self) -> set[str]:
        """The constructor's parameters that a call of the class may give a model: an
        argument reading a module-level name that may hold one; all of them where the class
        is built elsewhere than at the module level or with ``*args``."""
        init = self.methods.get("__init__")
        params = _params(init)[1:] if init is not None else []
        name = self.cls.name.value
        held: set[str] = set()
        for stmt in self.module.body:
            for call in findall(stmt, m.Call(func=m.Name(name))):
                if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or any(
                        a.star for a in call.args):
                    return set(params) | {"*"}
                for i, a in enumerate(call.args):
                    key = a.keyword.value if a.keyword is not None else (
                        params[i] if i < len(params) else "*")
                    if _mentions(a.value, self.globals, set()):
                        held.add(key)
        return held

    def _holders(self, objects: set[str]) -> set[str]:
        init_params = self._holder_params()
        # the callbacks' containers: what they hold is checked where they are called
        complete = {a for a, r in self.registries.items() if r.complete}
        held: set[str] = set()
        while True:
            more = set()
            for name, fn in self.methods.items():
                params = init_params if name == "__init__" else set(_params(fn)[1:])
                names = params | set(objects) | self._aliases(fn, params | set(objects), held)
                for target, value in _bindings(fn):  # self.X = v, self.X[k] = v
                    attr = _container_root(target)
                    if attr is not None and attr not in held | set(complete) and _mentions(
                            value, names, held):
                        more.add(attr)
                for call in findall(fn, m.Call(func=m.Attribute())):  # self.X.append(v)
                    attr = _container_root(call.func.value)
                    if attr is not None and attr not in held | set(complete) and any(
                            _mentions(a.value, names, held) for a in call.args):
                        more.add(attr)
                if findall(fn, m.Call(func=m.Name("setattr"))):
                    return {"*"}
            if not more:
                return held
            held |= more

    def _aliases(self, fn: cst.CSTNode, names: set[str], attrs: set[str] | None = None
                 ) -> set[str]:
        attrs = self.holders if attrs is None else attrs
        found: set[str] = set()
        while True:
            more = {t.value for t, v in _bindings(fn) if isinstance(t, cst.Name) and (
                t.value not in found) and _mentions(v, names | found, attrs)}
            if not more:
                return found
            found |= more

    def only_state(self, stmts: list[cst.CSTNode]) -> bool:
        return "*" not in self.holders and all(self._ok(s) for s in stmts)

    def _ok(self, node: cst.CSTNode, callbacks: dict[str, str] | None = None) -> bool:
        callbacks = callbacks or {}
        if isinstance(node, cst.Name):
            return node.value not in self.objects and node.value != "self" and (
                node.value not in self.globals or node.value in self.local)
        attr = _self_attr(node)
        if attr is not None:
            return attr not in self.holders and attr not in self.methods
        if isinstance(node, cst.For) and isinstance(node.target, cst.Name):
            root = _container_root(node.iter)
            if root is not None and root in self.registries:
                callbacks = {**callbacks, node.target.value: root}
        if isinstance(node, cst.Call):
            return self._call_ok(node, callbacks)
        return all(self._ok(c, callbacks) for c in node.children)

    def _call_ok(self, call: cst.Call, callbacks: dict[str, str]) -> bool:
        attr = _self_attr(call.func)
        container = callbacks.get(call.func.value) if isinstance(call.func, cst.Name) else (
            _container_root(call.func) if attr is None else None)
        if attr is not None:  # self.method(...): its body too
            if attr in self.holders or attr not in self.methods or not self._method_ok(attr):
                return False
        elif container is not None and container in self.registries:
            reg = self.registries[container]
            given = [a for i, a in enumerate(call.args) if not (
                i == reg.position and m.matches(a.value, m.Name("self")))]
            return reg.complete and all(self._callback_ok(f, reg.position)
                                        for f in reg.functions) and all(
                self._ok(a.value, callbacks) for a in given)
        elif isinstance(call.func, cst.Name) and call.func.value in self.defs:
            if not self._callback_ok(call.func.value, -1):  # a function of the file
                return False
        elif not self._ok(call.func, callbacks):
            return False
        return all(self._ok(a.value, callbacks) for a in call.args)

    def _method_ok(self, name: str) -> bool:
        if ("method", name) in self._seen:
            return True
        self._seen.add(("method", name))
        fn = self.methods[name]
        return all(self._ok(s) for s in fn.body.body)

    def _callback_ok(self, name: str, position: int) -> bool:
        """A callback given the instance at ``position``: it reads the instance only as
        ``trainer.<attr>`` of an attribute that holds no model and is no method, reads no
        module-level name that may hold a model, and calls only such functions of the file."""
        if ("function", name) in self._seen:
            return True
        self._seen.add(("function", name))
        fn = self.defs.get(name)
        if fn is None or findall(fn, m.Global() | m.Nonlocal()):
            return False
        params = _params(fn)
        mine = params[position] if 0 <= position < len(params) else None
        local = {t.value for t, _ in _bindings(fn) if isinstance(t, cst.Name)} | set(params)
        for node in findall(fn, m.Attribute()):
            if node.attr.value in self.holders or node.attr.value in self.methods:
                return False
        declared = {id(p.name) for p in findall(fn.params, m.Param())}
        bare = [n for n in findall(fn, m.Name(mine)) if id(n) not in declared] if mine else []
        based = [a.value for a in findall(fn, m.Attribute(value=m.Name(mine)))] if mine else []
        if len(bare) != len(based):  # the instance passed on, or returned
            return False
        for node in findall(fn, m.Name()):
            if node.value in self.globals and node.value not in local:
                return False
        return all(self._callback_ok(c.func.value, 0) if c.func.value in self.defs else True
                   for c in findall(fn, m.Call(func=m.Name())))
