"""A subclass of ``nn.Conv{n}d`` with its own forward (a weight-standardised conv: timm's
``StdConv2d`` / ``ScaledStdConv2d``, a same-padding conv): its JAX class derives from the
``Conv{n}d`` helper (passes/helpers_layers.py: torch's signature, channels-first input, torch's
``weight`` layout), and its forward's ``F.conv2d(x, w, self.bias, self.stride, self.padding,
self.dilation, self.groups)`` over a weight it computes is the helper's ``_conv_forward`` (torch's
own method of that name): the convolution by the layer's geometry, which the helper keeps in
flax's form (padding pairs). Called from passes/rewrite_calls.py."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import arg, bind, call

# the helper class a subclass of a torch layer of this special derives from (with {n}d)
HELPER_BASES = {"batch_norm": "BatchNorm", "conv": "Conv"}

_CONV_FUNCTIONS = {f"torch.nn.functional.conv{n}d" for n in (1, 2, 3)} | {
    f"torch.conv{n}d" for n in (1, 2, 3)}
_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_GEOMETRY = ("stride", "padding", "dilation", "groups")


def conv_forward_reads(visitor, node: cst.Call) -> bool:
    """Whether ``node`` (seen on the way down) is ``F.conv{n}d(x, w, b, self.stride,
    self.padding, self.dilation, self.groups)`` in a subclass of nn.Conv{n}d that derives from
    the helper: the geometry read is the layer's own, so those reads are not marked (the
    call becomes ``self._conv_forward(x, w, b)`` on the way up: :func:`conv_forward`)."""
    rule = visitor._layer_subclass_rule(visitor.current_class)
    if rule is None or rule.special != "conv" or visitor.q(node.func) not in _CONV_FUNCTIONS:
        return False
    b = bind(node.args, _PARAMS)
    if b.star or b.extra_positional or b.get("input") is None or b.get("weight") is None:
        return False
    reads = [b.get(p) for p in _GEOMETRY]
    if not all(m.matches(r, m.Attribute(value=m.Name("self"), attr=m.Name(p)))
               for r, p in zip(reads, _GEOMETRY)):
        return False
    visitor._own_reads.update(id(r) for r in reads)
    visitor.__dict__.setdefault("_conv_forward_calls", set()).add(id(node))
    return True


def conv_forward(visitor, original: cst.Call, updated: cst.Call) -> cst.Call | None:
    """``self._conv_forward(x, w, b)`` for a call :func:`conv_forward_reads` accepted."""
    if id(original) not in visitor.__dict__.get("_conv_forward_calls", ()):
        return None
    b = bind(updated.args, _PARAMS)
    bias = b.get("bias")
    return call("self._conv_forward", arg(b.get("input")), arg(b.get("weight")),
                arg(bias if bias is not None else cst.Name("None")))
