"""The layout of the items of an ``nn.Sequential`` attribute, for the rewriter's uses of them
one at a time (``for conv, bn in zip(self.fusion_conv, self.fusion_bn)``,
``self.stages[0](x)``, ``len(self.stages)``): NNX's and linen's Sequential keep their items in
``.layers``, which holds torch's items exactly when the translation put no transposes among
them (all of them run in one layout). A loop variable over such items, or an indexed item, is
then called in that layout: channels-last items (``nn.Conv2d``, ``nn.BatchNorm2d``) get the
transposes around their calls that a ModuleList's items get."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.index import Layouts
from torch2jax.analysis.layer_lists import combine
from torch2jax.analysis.walk import findall


def returned_sequential(rw, cls: str, attr: str) -> cst.Call | None:
    """The ``nn.Sequential(...)`` a top-level function of the file returns where the class
    ``cls`` unpacks its result into ``self.<attr>`` (timm's byobnet: ``self.stages, feats,
    size = create_byob_stages(...)``, which ends ``return nn.Sequential(*stages), ...``): one
    such call, in every return of every such function; else None."""
    root = getattr(rw, "_root", None)
    if root is None:
        return None
    functions = {f.name.value: f for f in root.body if isinstance(f, cst.FunctionDef)}
    me = m.Attribute(value=m.Name("self"), attr=m.Name(attr))
    found: set[cst.Call] = set()
    for c in root.body:
        if not (isinstance(c, cst.ClassDef) and c.name.value == cls):
            continue
        for a in findall(c, m.Assign(targets=[m.AssignTarget(m.Tuple())],
                                     value=m.Call(func=m.Name()))):
            elements = a.targets[0].target.elements
            at = [i for i, e in enumerate(elements) if m.matches(e.value, me)]
            if not at:
                continue
            fn = functions.get(a.value.func.value)
            returns = findall(fn, m.Return()) if fn is not None else []
            if not returns:
                return None
            for r in returns:
                if not (isinstance(r.value, cst.Tuple) and len(r.value.elements) == len(
                        elements)):
                    return None
                item = r.value.elements[at[0]].value
                rule = rw.rules.layers.get(rw.q(item.func) or "") if isinstance(
                    item, cst.Call) else None
                if rule is None or rule.special != "sequential":
                    return None
                found.add(item)
    return next(iter(found)) if len(found) == 1 else None


def sequential_layouts(rw, info, attr: str) -> tuple[str, list[str]] | None:
    """(overall, per-item layouts) of ``self.<attr>`` of the class ``info``, an nn.Sequential
    attribute of known construction (the layers appended later included; or one a function
    of the file returns, :func:`returned_sequential`); None when it is not one."""
    if info.attr_rule.get(attr) == "torch.nn.Sequential":
        ctor = info.attr_ctor.get(attr)
    elif attr not in info.attr_rule:
        ctor = returned_sequential(rw, info.name, attr)
        if ctor is None:
            return None
    else:
        return None
    if ctor is None:
        return "mixed", []
    overall, items = Layouts(rw.rules, rw, rw.index).sequential(
        ctor.args, rw._built_in_scope(ctor))
    return overall, [*items, *info.added_layouts.get(attr, ())]


def sequential_elem_layout(rw, info, attr: str) -> str | None:
    """The one layout the items of ``self.<attr>`` (an nn.Sequential attribute) run in, when
    its translation holds torch's items with nothing among them: "torch", "any" or
    "channels_last" (a Sequential of convolutions and norms only, built in place or from a
    local list: repghost's ``nn.Sequential(*fusion_bn)``). None when it is not a Sequential
    attribute, its items mix layouts (the translation put transposes among them) or channels-
    last layers were appended to it later (those run between transposes of their own)."""
    found = sequential_layouts(rw, info, attr)
    if found is None:
        return None
    overall, items = found
    if overall == "mixed" or "mixed" in items:
        return None
    layout = combine(items)
    if layout == "mixed":
        return None
    if layout == "channels_last" and info.added_layouts.get(attr):
        return None
    return layout
