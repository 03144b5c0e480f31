"""The layout of the items of an ``nn.Sequential`` attribute, for the rewriter's uses of them
one at a time (``for conv, bn in zip(self.fusion_conv, self.fusion_bn)``,
``self.stages[0](x)``, ``len(self.stages)``): NNX's and linen's Sequential keep their items in
``.layers``, which holds torch's items exactly when the translation put no transposes among
them (all of them run in one layout). A loop variable over such items, or an indexed item, is
then called in that layout: channels-last items (``nn.Conv2d``, ``nn.BatchNorm2d``) get the
transposes around their calls that a ModuleList's items get."""

from __future__ import annotations

from torch2jax.analysis.index import Layouts
from torch2jax.analysis.layer_lists import combine


def sequential_layouts(rw, info, attr: str) -> tuple[str, list[str]] | None:
    """(overall, per-item layouts) of ``self.<attr>`` of the class ``info``, an nn.Sequential
    attribute of known construction (the layers appended later included); None when it is
    not one."""
    if info.attr_rule.get(attr) != "torch.nn.Sequential":
        return None
    ctor = info.attr_ctor.get(attr)
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
