"""A torch convolution's geometry read off a converted one: ``conv_layer.stride``,
``.dilation``, ``.in_channels`` of a layer handed to a function (``def apply_tf_padding(x,
conv_layer: nn.Conv2d)``, MobileNet's TensorFlow-style padding) or reached through ``self``
(``self.convolution.stride``): NNX's names for them (``strides``, ``kernel_dilation``,
``in_features``). A mixin's helper of passes/rewrite_attributes.py (the rewriter is ``rw``)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes.rewrite_support import _CONV_ATTRS

# torch's per-dimension tuples: nnx.Conv keeps what it was given, a tuple where the converted
# constructor passes one and its default int (1) where it passes none, so these are renamed
# only where an int would fail loudly (unpacked, indexed), never compared or computed with
_TUPLES = {"stride": "strides", "dilation": "kernel_dilation"}


def conv_attribute(rw, original_node: cst.Attribute,
                   updated_node: cst.Attribute) -> cst.BaseExpression | None:
    """NNX's name for a torch convolution's attribute read on ``original_node.value`` where
    that is known to hold a converted convolution; None otherwise."""
    attr = original_node.attr.value
    to = _CONV_ATTRS.get(attr) or _TUPLES.get(attr)
    if to is None or not rw.in_module_class() and not rw._fn_stack:
        return None
    if attr in _TUPLES and not _unpacked_or_indexed(rw, original_node):
        return None
    if attr in _TUPLES and m.matches(original_node.value, m.Attribute(value=m.Name("self"))):
        return None  # (self.conv1.stride: rewrite_layers' rule reads the constructor's value)
    if not _holds_conv(rw, original_node.value):
        return None
    return updated_node.with_changes(attr=cst.Name(to))


def _unpacked_or_indexed(rw, node: cst.Attribute) -> bool:
    parent = rw.get_metadata(ParentNodeProvider, node, None)
    if isinstance(parent, cst.Subscript) and parent.value is node:
        return True
    return isinstance(parent, cst.Assign) and parent.value is node and all(
        isinstance(t.target, (cst.Tuple, cst.List)) for t in parent.targets)


def _holds_conv(rw, node: cst.BaseExpression) -> bool:
    rules = rw.rules.layers

    def conv(q: str | None) -> bool:
        rule = rules.get(q or "")
        return rule is not None and rule.special == "conv"

    if isinstance(node, cst.Name) and rw._fn_stack:
        params = rw._fn_stack[-1].params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            if p.name.value == node.value:
                # def apply_tf_padding(features, conv_layer: nn.Conv2d)
                return p.annotation is not None and conv(rw.q(p.annotation.annotation))
    if isinstance(node, (cst.Name, cst.Attribute)):
        layers = rw._narrowed_layer(node, cst.Module([]).code_for_node(node))
        if layers:
            return all(conv(q) for q in layers)
    if not rw.in_module_class() or not isinstance(node, cst.Attribute):
        return False
    if m.matches(node.value, m.Name("self")):
        return conv(rw._inherited_attr_rule(node.attr.value))
    return conv(rw._chain_layer_rule(node))
