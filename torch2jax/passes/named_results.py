"""A field of torch's named result read off a translated call: ``torch.topk(x, k).indices``
/ ``.values`` (DeepSeek-V3.2's and AXK2's indexers). ``jax.lax.top_k`` returns a plain
``[values, indices]`` list, so the field is its item. Called by
:meth:`torch2jax.passes.rewrite_attributes.AttributesMixin.leave_Attribute`."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import code, expr

_FIELDS = {"values": 0, "indices": 1}
# what the topk special writes (passes/special_index.py)
_TOP_K = ("jax.lax.top_k(", "jax.tree.map(lambda a: jnp.moveaxis(a, -1,", "(lambda values, indices:")


def named_field(original_node: cst.Attribute, updated_node: cst.Attribute
                ) -> cst.BaseExpression | None:
    """``[0]`` / ``[1]`` for ``.values`` / ``.indices`` on a translated ``topk``; else None."""
    item = _FIELDS.get(original_node.attr.value)
    if item is None or not isinstance(original_node.value, cst.Call):
        return None
    if not code(updated_node.value).startswith(_TOP_K):
        return None
    return expr(f"{{v}}[{item}]", v=updated_node.value)
