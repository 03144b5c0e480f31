"""``F.batch_norm`` without running statistics (rules/functions.toml): normalised by the batch's
own mean and biased variance over every axis but the channels (axis 1), then scaled and shifted
per channel, as torch does in training mode. timm's ``StdConv2d`` / ``ScaledStdConv2d``
standardise a convolution's weight so: ``F.batch_norm(self.weight.reshape(1, out, -1), None,
None, weight=gain, training=True, momentum=0., eps=eps)``. The call becomes the
``torch_batch_norm`` helper written into the converted file. With running statistics the call
updates them in place: it is refused (a BatchNorm subclass's own call over its statistics is
its base's call: passes/rewrite_layers.py ``_own_batch_norm``).
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, try_literal
from torch2jax.passes.helper_registry import helper
from torch2jax.passes.registry import Site, special

helper("torch_batch_norm", {"jax", "jnp"}, '''
def torch_batch_norm(x: jax.Array, weight: jax.Array | None = None,
                     bias: jax.Array | None = None, eps: float = 1e-05) -> jax.Array:
    """torch's F.batch_norm in training mode without running statistics: x (N, C, ...)
    normalised by its mean and biased variance over every axis but the channels, then
    scaled by weight and shifted by bias, (C,) each."""
    axes = (0, *range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.var(x, axis=axes, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + eps)
    shape = (-1,) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * jnp.reshape(weight, shape)
    return y if bias is None else y + jnp.reshape(bias, shape)
''')


@special("batch_norm_function")
def batch_norm_function(site: Site) -> cst.BaseExpression:
    stats = [site.get(p) for p in ("running_mean", "running_var")]
    if not all(isinstance(s, cst.Name) and s.value == "None" for s in stats):
        raise Untranslatable("F.batch_norm with running statistics: torch updates them in "
                             "place in training mode")
    training = site.get("training")
    if training is None or try_literal(training, None) is not True:
        raise Untranslatable("F.batch_norm without running statistics needs training=True "
                             "(torch refuses it in evaluation mode)")
    args = [arg(site.x())]
    for name in ("weight", "bias", "eps"):
        node = site.get(name)
        if node is not None and not (isinstance(node, cst.Name) and node.value == "None"):
            args.append(arg(node, name))
    return call("torch_batch_norm", *args)
