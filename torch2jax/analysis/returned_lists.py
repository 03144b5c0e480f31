"""A ModuleList built and returned by a function or method of the file and kept in an
attribute (timm's hrnet: ``self.transition1 = self._make_transition_layer(...)``, which
returns ``nn.ModuleList(transition_layers)`` of conv-norm-act Sequentials): the layout of
its elements, for the loops that call them (``[t(x) for i, t in enumerate(self.transition1)]``)
as for a ModuleList built in place. The indexer (analysis/index.py) calls these."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.layer_lists import combine


def note_returned_list(builder, key: str | None, value: cst.BaseExpression | None,
                       rule) -> None:
    """``return nn.ModuleList(layers)`` in the function ``key`` (``rule``: the layer rule of
    the call returned, or None): the layout of its elements (a local list's, a literal's, a
    comprehension's element's)."""
    if key is None or rule is None or rule.special != "module_list" or not isinstance(
            value, cst.Call) or len(value.args) != 1 or value.args[0].keyword or \
            value.args[0].star:
        return
    inner, scope = value.args[0].value, builder._scope()
    if isinstance(inner, cst.Name):
        layout = scope.get(inner.value, "mixed")
    elif isinstance(inner, (cst.List, cst.Tuple)):
        layout = combine([builder.layouts.of(e.value, scope) for e in inner.elements]
                         or ["any"])
    elif isinstance(inner, cst.ListComp):
        layout = builder.layouts.of(inner.elt, scope)
    else:
        layout = "mixed"
    builder.__dict__.setdefault("_returned_elems", {}).setdefault(key, []).append(layout)


def note_attr_call(builder, info, attr: str, value: cst.BaseExpression) -> None:
    """``self.attr = self.method(...)`` / ``= fn(...)``: what the attribute was given."""
    if not isinstance(value, cst.Call):
        return
    func = value.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and (
            func.value.value == "self"):
        key = f"{info.name}.{func.attr.value}"
    elif isinstance(func, cst.Name):
        key = func.value
    else:
        return
    builder.__dict__.setdefault("_attr_calls", []).append((info, attr, key))


def returned_list_layouts(builder) -> None:
    """The element layouts of the attributes given such a returned ModuleList (where every
    assignment of the attribute was one), now that every function is read."""
    returned = builder.__dict__.get("_returned_elems", {})
    calls = builder.__dict__.get("_attr_calls", [])
    for info, attr, key in calls:
        if key in returned and attr not in info.elem_layout and all(
                k in returned for i, a, k in calls if i is info and a == attr):
            info.elem_layout[attr] = combine(
                [x for i, a, k in calls if i is info and a == attr for x in returned[k]])


def note_method_list_returns(builder, node: cst.ClassDef) -> None:
    """The methods of class ``node`` returning a list of layers they build (timm's cpubone:
    ``blocks, in_channels = self._build_conv_stage(...)`` in ``__init__``, a method defined
    below it, whose ``blocks = []`` gets ``blocks.append(ResidualBlock(...))``), read before
    the class's methods are, so that ``__init__``'s ``nn.Sequential(*blocks)`` knows the
    layout of what it is given. Only lists of torch's layout (modules of the file: they take
    NCHW), built from a literal and ``append`` alone, are noted, under ``Class.method``."""
    for fn in node.body.body:
        if not isinstance(fn, cst.FunctionDef):
            continue
        items: dict[str, list[str]] = {}
        other: set[str] = set()
        for a in m.findall(fn, m.Assign() | m.AugAssign() | m.AnnAssign()):
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            for t in targets:
                if isinstance(a, cst.Assign) and isinstance(t, cst.Name) and isinstance(
                        a.value, cst.List) and t.value not in items:
                    items[t.value] = [builder.layouts.of(e.value, {}) if not isinstance(
                        e, cst.StarredElement) else "mixed" for e in a.value.elements]
                else:
                    other.update(n.value for n in m.findall(t, m.Name()))
        for c in m.findall(fn, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()))):
            name, method = c.func.value.value, c.func.attr.value
            if name in items and method == "append" and len(c.args) == 1:
                items[name].append(builder.layouts.of(c.args[0].value, {}))
            elif name in items:
                other.add(name)  # extend, insert, pop: not followed
        layouts = {n: combine(v) for n, v in items.items() if v and n not in other}
        found = set()
        for ret in m.findall(fn, m.Return()):
            value = ret.value
            elems = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
            found.add(tuple((i, v.value) for i, v in enumerate(elems) if isinstance(
                v, cst.Name) and layouts.get(v.value) == "torch"))
        if len(found) == 1 and next(iter(found)):
            builder._list_returns[f"{node.name.value}.{fn.name.value}"] = {
                i: "torch" for i, _ in next(iter(found))}


def list_return_key(builder, call: cst.BaseExpression) -> str | None:
    """The key of ``builder._list_returns`` a call returning a list of layers has (``fn(...)``
    of the file, ``self.method(...)`` of the class being read), or None."""
    if not isinstance(call, cst.Call):
        return None
    func = call.func
    if isinstance(func, cst.Name):
        key = func.value
    elif m.matches(func, m.Attribute(value=m.Name("self"))) and builder.current_class:
        key = f"{builder.current_class}.{func.attr.value}"
    else:
        return None
    return key if key in builder._list_returns else None
