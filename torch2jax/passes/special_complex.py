"""Complex tensors made from and read as real ones (rules/functions.toml): ``torch.polar``,
``torch.view_as_complex`` and ``torch.view_as_real``, as DeepSeek-V2's rotary embedding
writes them (the frequencies as unit complex numbers, the query's pairs as complex numbers
multiplied by them, the product's real and imaginary parts as pairs again)."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, expr
from torch2jax.passes.registry import Site, special


@special("polar")
def polar(site: Site) -> cst.BaseExpression:
    """``torch.polar(abs, angle)``: ``abs * (cos(angle) + i sin(angle))``, built from its
    real and imaginary parts (complex64 from float32, as torch's)."""
    magnitude, angle = site.get("abs"), site.get("angle")
    if magnitude is None or angle is None:
        raise Untranslatable(f"{site.rule.torch} without abs and angle")
    magnitude = site.once(magnitude, "magnitude", "the magnitude")
    angle = site.once(angle, "angle", "the angle")
    return expr("jax.lax.complex({r} * jnp.cos({a}), {r} * jnp.sin({a}))", r=magnitude, a=angle)


@special("view_as_complex")
def view_as_complex(site: Site) -> cst.BaseExpression:
    """``torch.view_as_complex(x)``: the last axis (of size 2) the real and imaginary parts."""
    x = site.once(site.x(), "pairs", "the input")
    return expr("jax.lax.complex({x}[..., 0], {x}[..., 1])", x=x)


@special("view_as_real")
def view_as_real(site: Site) -> cst.BaseExpression:
    """``torch.view_as_real(x)``: the real and imaginary parts on a new last axis."""
    x = site.once(site.x(), "z", "the input")
    return expr("jnp.stack([{x}.real, {x}.imag], axis=-1)", x=x)
