"""A DataLoader wrapped in the user's own class (issue 28), made readable to the data pass.

The data pass translates a ``DataLoader(...)`` whose options it can read. A class that builds
its loader from its constructor's ``**kwargs`` hides them at the call of the class. Two
shapes are rewritten here, on the torch source, before the analysis (each line keeps its
place, so diagnostics point at the user's lines):

* a *transparent wrapper*: a plain class whose ``__init__(self, *args, **kwargs)`` only builds
  ``self.loader = DataLoader(*args, **kwargs)`` and whose other methods only hand on to it
  (``__iter__`` returning ``iter(self.loader)``, ``__len__`` returning
  ``len(self.loader)``, ``__getattr__`` returning ``getattr(self.loader, name)``). Iterating,
  measuring or reading it is iterating, measuring or reading the loader: each call of the
  class is that ``DataLoader(...)`` call, and the class goes;
* an *infinite loader* (makemore's ``InfiniteDataLoader``): a class whose ``__init__`` builds
  ``DataLoader(dataset, sampler=..., **kwargs)`` and keeps restarting its iterator. Each call
  of the class gives the same option names (the keywords ``__init__`` does not take). An
  option that every call gives as the same constant is written into the class's DataLoader
  call and leaves the calls (evaluated at the same moment with the same value: the class
  body runs when the class is called, and a constant is the same everywhere). Any other
  (``batch_size=args.batch_size``) becomes a keyword-only parameter of ``__init__``, which
  hands it to the DataLoader by name: the calls keep it, evaluated where torch evaluates it.
  The data pass then reads every option at the DataLoader. A call may give its options as
  ``**options``, a dict literal bound once and read nowhere else (its keys are the options).

Any other use of the class (``isinstance``, ``*args`` at a call, ``**options`` that is not
such a dict, calls that give different option names, an option named like a name that
``__init__`` reads, which a parameter would shadow) leaves the file as it is, where the
loader's ``**kwargs`` stays marked.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_LOADERS = ("DataLoader", "torch.utils.data.DataLoader", "data.DataLoader")
_CONSTANTS = (cst.Integer, cst.Float, cst.SimpleString, cst.Imaginary)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _is_loader(module: cst.Module, func: cst.BaseExpression) -> bool:
    name = _code(func)
    if name == "DataLoader":  # imported by name from torch
        return any(m.matches(i, m.ImportFrom(module=m.Attribute(value=m.Attribute(
            value=m.Name("torch"), attr=m.Name("utils")), attr=m.Name("data"))))
            and not isinstance(i.names, cst.ImportStar)
            and any(a.name.value == "DataLoader" and a.asname is None for a in i.names)
            for i in m.findall(module, m.ImportFrom()))
    return name in _LOADERS[1:]


def _constant(e: cst.BaseExpression) -> bool:
    if isinstance(e, cst.UnaryOperation):
        return _constant(e.expression)
    if isinstance(e, _CONSTANTS) or m.matches(e, m.Name("True") | m.Name("False")
                                                | m.Name("None")):
        return True
    if isinstance(e, cst.Call) and m.matches(e.func, m.Name("int") | m.Name("float")):
        return all(not a.keyword and not a.star and _constant(a.value) for a in e.args)
    return False


def _methods(cls: cst.ClassDef) -> dict[str, cst.FunctionDef] | None:
    out = {}
    for s in cls.body.body:
        if m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString()
                                                           | m.ConcatenatedString())])):
            continue  # the docstring
        if not isinstance(s, cst.FunctionDef) or s.decorators:
            return None
        out[s.name.value] = s
    return out


def _single_return(fn: cst.FunctionDef) -> cst.BaseExpression | None:
    body = fn.body.body
    if len(body) == 1 and m.matches(body[0], m.SimpleStatementLine(body=[m.Return()])):
        return body[0].body[0].value
    return None


def _transparent(module: cst.Module, cls: cst.ClassDef) -> cst.Call | None:
    """The ``DataLoader(*args, **kwargs)`` call of a transparent wrapper class, else None."""
    methods = _methods(cls)
    if not methods or set(methods) - {"__init__", "__iter__", "__len__", "__getattr__"}:
        return None
    init = methods.get("__init__")
    p = init.params if init is not None else None
    if (p is None or len(p.params) != 1 or p.kwonly_params or p.posonly_params
            or not isinstance(p.star_arg, cst.Param) or p.star_kwarg is None):
        return None
    args, kwargs = p.star_arg.name.value, p.star_kwarg.name.value
    body = init.body.body
    if len(body) != 1 or not m.matches(body[0], m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self")))],
            value=m.Call())])):
        return None
    assign = body[0].body[0]
    attr, call = assign.targets[0].target.attr.value, assign.value
    if not _is_loader(module, call.func) or not m.matches(call, m.Call(args=[
            m.Arg(value=m.Name(args), star="*"), m.Arg(value=m.Name(kwargs), star="**")])):
        return None
    loader = m.Attribute(value=m.Name("self"), attr=m.Name(attr))
    expected = {"__iter__": m.Call(func=m.Name("iter"), args=[m.Arg(value=loader)]),
                "__len__": m.Call(func=m.Name("len"), args=[m.Arg(value=loader)])}
    for name, fn in methods.items():
        if name == "__init__":
            continue
        value = _single_return(fn)
        if name == "__getattr__":
            if len(fn.params.params) != 2:
                return None
            key = fn.params.params[1].name.value
            expected[name] = m.Call(func=m.Name("getattr"), args=[
                m.Arg(value=loader), m.Arg(value=m.Name(key))])
        if value is None or not m.matches(value, expected[name]):
            return None
    return call


def _infinite(module: cst.Module, cls: cst.ClassDef) -> tuple[cst.Call, str] | None:
    """The ``DataLoader(..., **kwargs)`` call of ``__init__`` and the name of ``**kwargs``,
    for a class whose ``__init__`` forwards its ``**kwargs`` to one DataLoader only."""
    methods = _methods(cls)
    init = (methods or {}).get("__init__")
    if init is None or init.params.star_kwarg is None or isinstance(
            init.params.star_arg, cst.Param):
        return None
    kwargs = init.params.star_kwarg.name.value
    reads = [n for n in m.findall(init.body, m.Name(kwargs))]
    calls = [c for c in m.findall(init.body, m.Call()) if _is_loader(module, c.func)
             and any(a.star == "**" and m.matches(a.value, m.Name(kwargs)) for a in c.args)]
    if len(calls) != 1 or len(reads) != 1:
        return None
    return calls[0], kwargs


def line_map(before: str, after: str) -> dict[int, int]:
    """Each line of ``after`` (1-based) -> its line in ``before``: the same line where
    ``before`` has it, else (a call rewritten in place) the line as far below the last
    matched one as it is in ``after``."""
    import difflib

    same = {}
    after_lines = after.splitlines()
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after_lines, autojunk=False)
    for a, b, n in matcher.get_matching_blocks():
        same.update({b + i + 1: a + i + 1 for i in range(n)})
    out, offset = {}, 0
    for line in range(1, len(after_lines) + 1):
        if line in same:
            offset = same[line] - line
        out[line] = line + offset
    return out


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with its loader classes made readable (see the module's docstring)."""
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)
               and not s.bases and not s.decorators}
    for name, cls in classes.items():
        uses = [n for n in m.findall(module, m.Name(name))]
        calls = [c for c in m.findall(module, m.Call(func=m.Name(name)))]
        if len(uses) != len(calls) + 1 or not calls:  # the class statement's own name
            continue
        call = _transparent(module, cls)
        if call is not None:
            module = module.visit(_Unwrap(name, call.func, cls))
            continue
        found = _infinite(module, cls)
        if found is None or any(a.star == "*" for c in calls for a in c.args):
            continue
        init = _methods(cls)["__init__"]
        taken = {p.name.value for p in [*init.params.params, *init.params.kwonly_params]}
        options = [_options(module, c, taken) for c in calls]
        if any(o is None for o in options):
            continue
        names = set(options[0])
        if not names or any(set(o) != names for o in options):
            continue  # the calls do not all give the same options
        if any(n.value in names for n in m.findall(init, m.Name())):
            continue  # a parameter of that name would shadow what __init__ reads
        inline = {k for k, v in options[0].items() if v is not None and _constant(v) and all(
            o[k] is not None and o[k].deep_equals(v) for o in options)}
        module = module.visit(_Specialise(found[0], found[1], init, calls,
                                          [a for a in calls[0].args if a.keyword is not None
                                           and a.keyword.value in inline],
                                          [k for k in options[0] if k not in inline]))
    return module


def _options(module: cst.Module, call: cst.Call, taken: set[str]
             ) -> dict[str, cst.BaseExpression | None] | None:
    """The options a call of the class gives its ``**kwargs``: each keyword's value, and the
    keys of a ``**options`` dict (None for their values); None when they cannot be known."""
    out: dict[str, cst.BaseExpression | None] = {}
    for a in call.args:
        if a.keyword is not None and a.keyword.value not in taken:
            out[a.keyword.value] = a.value
        elif a.star == "**":
            keys = _dict_keys(module, a.value)
            if keys is None or taken & keys:
                return None
            out.update(dict.fromkeys(keys))
    return out


def _dict_keys(module: cst.Module, value: cst.BaseExpression) -> set[str] | None:
    """The keys of ``**name``, where ``name`` is bound once, to a dict literal with constant
    string keys (or ``dict(k=...)``), and read only by ``**name`` at calls: nothing else can
    change it, so the call passes exactly those keys."""
    if not isinstance(value, cst.Name):
        return None
    binds = m.findall(module, m.Assign(targets=[m.AssignTarget(m.Name(value.value))]))
    starred = m.findall(module, m.Arg(star="**", value=m.Name(value.value)))
    if len(binds) != 1 or len(m.findall(module, m.Name(value.value))) != 1 + len(starred):
        return None
    bound = binds[0].value
    if isinstance(bound, cst.Dict) and all(isinstance(e, cst.DictElement) and isinstance(
            e.key, cst.SimpleString) for e in bound.elements):
        return {e.key.evaluated_value for e in bound.elements}
    if m.matches(bound, m.Call(func=m.Name("dict"))) and all(
            a.keyword is not None and not a.star for a in bound.args):
        return {a.keyword.value for a in bound.args}
    return None


class _Unwrap(cst.CSTTransformer):
    """Each call of the wrapper class becomes the DataLoader call; the class goes."""

    def __init__(self, name: str, loader: cst.BaseExpression, cls: cst.ClassDef) -> None:
        self.name, self.loader, self.cls = name, loader, cls

    def leave_Call(self, original, updated):
        if m.matches(original.func, m.Name(self.name)):
            return updated.with_changes(func=self.loader)
        return updated

    def leave_ClassDef(self, original, updated):
        if original is self.cls:
            return cst.RemoveFromParent()
        return updated


class _Specialise(cst.CSTTransformer):
    """The options the calls give: a constant that every call gives alike moves into the
    class's DataLoader call and leaves the calls; any other becomes a keyword-only parameter
    of ``__init__``, handed to the DataLoader by name, in place of ``**kwargs``."""

    def __init__(self, loader: cst.Call, kwargs: str, init: cst.FunctionDef,
                 calls: list[cst.Call], inline: list[cst.Arg], passed: list[str]) -> None:
        self.loader, self.kwargs, self.init = loader, kwargs, init
        self.calls, self.inline, self.passed = calls, inline, passed
        self.moved = {a.keyword.value for a in inline}

    def leave_FunctionDef(self, original, updated):
        if original is not self.init or not self.passed:
            return updated
        params = updated.params
        added = [cst.Param(cst.Name(k)) for k in self.passed]
        star = params.star_arg if isinstance(params.star_arg, cst.ParamStar) else cst.ParamStar()
        return updated.with_changes(params=params.with_changes(
            star_arg=star, kwonly_params=[*params.kwonly_params, *added]))

    def leave_Call(self, original, updated):
        if original is self.loader:
            args = []
            for a in updated.args:
                if a.star == "**" and m.matches(a.value, m.Name(self.kwargs)):
                    args.extend(k.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                for k in self.inline)
                    args.extend(cst.Arg(cst.Name(k), keyword=cst.Name(k)) for k in self.passed)
                else:
                    args.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
            return updated.with_changes(args=args)
        if any(original is c for c in self.calls):
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in updated.args
                    if a.keyword is None or a.keyword.value not in self.moved]
            return updated.with_changes(args=args)
        return updated
