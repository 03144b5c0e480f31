"""``nn.Sequential(*filter(None, [conv, aa if use_aa else None, norm, act]))`` whose layers
mix the two layouts (timm's ResNet stem pool with ``replace_stem_pool``): transposes between
them inside the filtered list, so that the Sequential takes and returns NCHW
(analysis/layer_lists.py's list_layout)."""

from __future__ import annotations

import libcst as cst

from torch2jax.analysis.layer_lists import filtered_literal, list_layout
from torch2jax.passes.common import arg


def with_filtered_transposes(rw, original_args: list[cst.Arg], updated_args: list[cst.Arg],
                             layouts, scope: dict[str, str]) -> list[cst.Arg]:
    """``updated_args`` with the filtered literals of mixed layouts given their transposes
    (``rw``: the rewriter, whose ``_insert_transposes`` writes them)."""
    out = []
    for o, u in zip(original_args, updated_args):
        literal, new = filtered_literal(o.value), filtered_literal(u.value)
        if o.star == "*" and literal is not None and new is not None and len(
                literal.elements) == len(new.elements):
            items = [layouts.of(e.value, scope) for e in literal.elements]
            if list_layout(items) == "torch" and "channels_last" in items:
                values = rw._insert_transposes([arg(e.value) for e in new.elements], items)
                listed = new.with_changes(elements=_elements(list(new.elements),
                                                             [a.value for a in values]))
                call = u.value
                u = u.with_changes(value=call.with_changes(
                    args=[call.args[0], call.args[1].with_changes(value=listed)]))
        out.append(u)
    return out


def _elements(elements: list[cst.Element], values: list[cst.BaseExpression]
              ) -> list[cst.Element]:
    """The list's elements with the transposes among them, laid out as its items are (one a
    line where they were), the last comma kept last."""
    sep = next((e.comma for e in elements[:-1] if isinstance(e.comma, cst.Comma)),
               cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    by_value = {id(e.value): e for e in elements}
    out = [by_value.get(id(v)) or cst.Element(v, comma=sep) for v in values]
    if out[-1] is not elements[-1]:  # a transpose last: it takes the trailing comma
        i = out.index(elements[-1])
        out[i] = elements[-1].with_changes(comma=sep)
        out[-1] = out[-1].with_changes(comma=elements[-1].comma)
    return out
