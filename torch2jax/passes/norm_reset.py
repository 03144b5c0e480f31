"""``m.reset_parameters()`` of a torch norm layer (timm's efficientvim ``_init_weights``:
``elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm1d)): m.reset_parameters()``).

torch's norms reset their affine weight to ones, their bias to zeros and their running
statistics to zeros (mean) and ones (variance). flax's norms have no such method: the call of
a layer known to be one of them (an ``isinstance`` test around it) becomes the
``reset_norm_parameters`` helper (NNX; registered here, written in by passes/helpers.py),
which sets the flax variables of those names that the layer has (``scale``, ``bias``,
``mean``, ``var``) in place."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import arg, call, code
from torch2jax.passes.helper_registry import HELPERS, helper

# the rules' layer kinds (rules/layers.toml) whose torch reset_parameters sets only these
_NORMS = frozenset({"batch_norm", "layer_norm", "group_norm", "rms_norm"})
_RESET = frozenset({"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})

helper("reset_norm_parameters", {"Any", "jnp"}, '''
def reset_norm_parameters(layer: Any) -> None:
    """torch's reset_parameters() of a norm layer: its scale ones, its bias zeros, its running
    mean zeros and variance ones (those of them the layer has)."""
    for name, fill in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0)):
        variable = getattr(layer, name, None)
        if variable is not None:
            variable[...] = jnp.full_like(variable[...], fill)
''', targets=("nnx",))


def reset_call(rw, value: cst.BaseExpression, new: cst.BaseExpression) -> cst.Call | None:
    """``m.reset_parameters()`` (``value``; ``new`` its translation) where ``m`` is known to
    be a torch norm layer: the helper's call, else None."""
    if rw.target.helper_target not in HELPERS["reset_norm_parameters"] or not m.matches(value, m.Call(
            args=[], func=m.Attribute(value=m.Name() | m.Attribute(),
                                      attr=m.Name("reset_parameters")))):
        return None
    layer = value.func.value
    names = rw._narrowed_layer(value, code(layer))
    if not names:
        return None
    for name in names:
        rule = rw.rules.layers.get(name)
        if rule is None or rule.special not in _NORMS or not set(rule.weights) <= _RESET:
            return None
    method = new.func if isinstance(new, cst.Call) else None
    if m.matches(new, m.Call(func=m.Name("call_with_rngs"))) and new.args:
        method = new.args[0].value  # (the method draws in some classes: rngs plumbing)
    if not m.matches(method, m.Attribute(attr=m.Name("reset_parameters"))):
        return None
    return call("reset_norm_parameters", arg(method.value))
