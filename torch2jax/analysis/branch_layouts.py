"""Attributes given layers of different layouts in different branches of ``__init__``
(``self.pool = nn.MaxPool2d(...)`` in one, a torch-layout block in another): the layers built
in place that take channels-last become torch-layout helpers, so that the attribute takes
torch's layout whichever branch built it."""

from __future__ import annotations

from typing import Any

import libcst as cst

# (class, attribute) -> [(layout, the conv built there or None), ...]
Assigns = dict[tuple[str, str], list[tuple[str, cst.Call | None]]]


def torch_layout_attrs(classes: dict[str, Any], torch_convs: set[int],
                       attr_assigns: Assigns) -> None:
    """An attribute given a torch-layout layer in one branch and a convolution built in
    place in another (mvitv2's ``self.pool_q = pool_op(kernel, stride, padding)`` with
    ``pool_op`` the NCHW pooling helper, or ``nn.Conv2d(..., groups=dim)``): the convs
    become the NCHW Conv2d helper (torch_convs), so that the attribute takes torch's
    layout whichever branch built it (it was called as channels-last or as NCHW, wrong
    for one of them: marked). ``classes``: the file's ClassInfo by name (analysis/index.py);
    ``torch_convs``: the ids of the convs built as the helper, added to."""
    for (cls, attr), assigns in attr_assigns.items():
        info = classes.get(cls)
        if info is None or info.attr_layout.get(attr) != "mixed":
            continue
        layouts = {layout for layout, conv in assigns if conv is None}
        convs = [conv for layout, conv in assigns if conv is not None]
        if convs and "torch" in layouts and layouts <= {"torch", "any"} and all(
                layout == "channels_last" for layout, conv in assigns if conv is not None):
            torch_convs.update(id(c) for c in convs)
            info.attr_layout[attr] = "torch"
