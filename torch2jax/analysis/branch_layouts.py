"""Attributes given layers of different layouts in different branches of ``__init__``
(``self.pool = nn.MaxPool2d(...)`` in one, a torch-layout block in another): the layers built
in place that take channels-last become torch-layout helpers, so that the attribute takes
torch's layout whichever branch built it."""

from __future__ import annotations

from typing import Any

import libcst as cst

# (class, attribute) -> [(layout, the conv or pooling layer built there or None), ...]
Assigns = dict[tuple[str, str], list[tuple[str, cst.Call | None]]]

# the layout of a branch whose nn.Sequential mixes channels-last layers and others in an
# order not known statically: the rewrite marks its line (passes/rewrite_layers.py), so
# whatever layout the attribute's calls take, that branch does not run unmarked
MARKED = "marked"


def branch_assign(layout: str, value: cst.BaseExpression, special: str | None
                  ) -> tuple[str, cst.Call | None]:
    """What one assignment ``self.x = value`` of layout ``layout`` tells the branches of
    ``x``: a conv or pooling layer built in place (``special``, its rule's) is kept, it may
    be built as the torch-layout helper class with torch's arguments instead."""
    if special in ("conv", "pool") and isinstance(value, cst.Call):
        return layout, value
    if special == "sequential" and layout == "mixed":
        return MARKED, None
    return layout, None


def torch_layout_attrs(classes: dict[str, Any], torch_convs: set[int],
                       attr_assigns: Assigns) -> None:
    """An attribute given a torch-layout layer in one branch and a convolution or pooling
    layer built in place in another (mvitv2's ``self.pool_q = pool_op(kernel, stride,
    padding)`` with ``pool_op`` the NCHW pooling helper, or ``nn.Conv2d(..., groups=dim)``;
    timm's ResNet stem: ``self.maxpool = nn.MaxPool2d(3, 2, 1)``, or ``aa_layer(2)``, or a
    Sequential of a pool and ``aa_layer(...)``): those layers become the NCHW Conv2d /
    MaxPool2d / AvgPool2d helpers (torch_convs), so that the attribute takes torch's layout
    whichever branch built it (it was called as channels-last or as NCHW, wrong for one of
    them: marked). A branch building a marked Sequential (MARKED) does not count.
    ``classes``: the file's ClassInfo by name (analysis/index.py); ``torch_convs``: the ids
    of the layers built as the helpers, added to."""
    for (cls, attr), assigns in attr_assigns.items():
        info = classes.get(cls)
        if info is None or info.attr_layout.get(attr) != "mixed":
            continue
        layouts = {layout for layout, conv in assigns if conv is None} - {MARKED}
        convs = [conv for layout, conv in assigns if conv is not None]
        if "torch" in layouts and layouts <= {"torch", "any"} and all(
                layout == "channels_last" for layout, conv in assigns if conv is not None):
            torch_convs.update(id(c) for c in convs)
            info.attr_layout[attr] = "torch"
