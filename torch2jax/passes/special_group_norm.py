"""``F.group_norm`` (rules/functions.toml): the ``torch_group_norm`` helper written into the
converted file, over channels-first input as torch's.

A user's subclass of ``nn.GroupNorm`` whose forward is ``F.group_norm`` over its own attributes
(timm's ``GroupNorm1``: ``super().__init__(1, num_channels)``) derives from ``nnx.GroupNorm``
(rules/layers.toml's ``[layer.subclass]``); that call is the base's, given channels-last input
(:func:`own_group_norm_call`).
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, expr
from torch2jax.passes.helper_registry import helper
from torch2jax.passes.registry import Site, special

helper("torch_group_norm", {"jax", "jnp"}, '''
def torch_group_norm(x: jax.Array, num_groups: int, weight=None, bias=None,
                     eps: float = 1e-5) -> jax.Array:
    """torch's F.group_norm over channels-first x, (N, C, *spatial): each sample's C channels
    in num_groups groups, each group standardised over its channels and positions (biased
    variance); weight and bias are per channel."""
    n, c = x.shape[:2]
    y = jax.nn.standardize(x.reshape(n, num_groups, -1), axis=-1, epsilon=eps).reshape(x.shape)
    per_channel = (c,) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * jnp.reshape(weight, per_channel)
    if bias is not None:
        y = y + jnp.reshape(bias, per_channel)
    return y
''')


@special("functional_group_norm")
def functional_group_norm(site: Site) -> cst.BaseExpression:
    groups = site.get("num_groups")
    if groups is None:
        raise Untranslatable("F.group_norm without num_groups")
    args = [arg(site.x()), arg(groups)]
    for name in ("weight", "bias", "eps"):
        node = site.get(name)
        if node is not None:
            args.append(arg(node, name))
    return call("torch_group_norm", *args)


def own_group_norm_call(x: cst.BaseExpression) -> cst.BaseExpression:
    """``F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)`` in a subclass of
    nn.GroupNorm: nnx.GroupNorm's own call, which normalises channels-last input."""
    return expr("jnp.moveaxis(super().__call__(jnp.moveaxis({x}, 1, -1)), -1, 1)", x=x)
