"""A ModuleList built and returned by a function or method of the file and kept in an
attribute (timm's hrnet: ``self.transition1 = self._make_transition_layer(...)``, which
returns ``nn.ModuleList(transition_layers)`` of conv-norm-act Sequentials): the layout of
its elements, for the loops that call them (``[t(x) for i, t in enumerate(self.transition1)]``)
as for a ModuleList built in place. The indexer (analysis/index.py) calls these."""

from __future__ import annotations

import libcst as cst

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
