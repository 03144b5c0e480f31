"""A tensor's device read as an attribute (``x.device``, ``device.type``, ``x.is_cuda``): a
traced JAX array has no device to read, so these become the program's backend and default
device. Called by
:meth:`torch2jax.passes.rewrite_attributes.AttributesMixin.leave_Attribute` with the
transformer as ``t``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code, expr
from torch2jax.passes.special_device import GPU_TEST


def device_attribute(t, original_node: cst.Attribute) -> cst.BaseExpression | None:
    """The replacement of a device read, or None where ``original_node`` is none."""
    if original_node.attr.value == "type" and (
            m.matches(original_node.value, m.Name()) and original_node.value.value in
            t._device_names or m.matches(original_node.value, m.Attribute(
                attr=m.Name("device")))) and not t._is_module_expr(original_node.value):
        # device.type (device = x.device): the backend the program runs on, in torch's
        # names ("cpu", "cuda"; a traced array has no device to read)
        t.need("jax")
        return expr('jax.default_backend().replace("gpu", "cuda")')
    if original_node.attr.value == "device" and t._array_value(original_node.value):
        # x.device read as a value (passed on, compared, bound and read): a traced array
        # has no device; the program's arrays live on the default one (torch's
        # device=x.device arguments are dropped before this is reached)
        t.need("jax")
        t.diag(original_node, "tensor.device", "info",
               f"{code(original_node)}: the default device (JAX places arrays itself; "
               "a traced array has no device to read)")
        return expr("jax.devices()[0]")
    if original_node.attr.value == "is_cuda" and t._array_value(original_node.value):
        # x.is_cuda (a fast path taken on a GPU): whether the program runs on one, as
        # torch.cuda.is_available() (a traced array has no device to read)
        t.need("jax")
        return expr(GPU_TEST)
    return None
