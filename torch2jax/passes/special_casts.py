"""Casts: ``x.to(...)`` (a dtype, another tensor's dtype; a device goes) and ``x.type(dtype)``
(rules/methods.toml)."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, code, expr
from torch2jax.passes.registry import Site, special


@special("to")
def to(site: Site) -> cst.BaseExpression:
    """``x.to(device)`` disappears; ``x.to(dtype)`` / ``x.to(other)``-free dtype casts stay."""
    x = site.x()
    for c in [site.args.get("device"), site.args.get("dtype"), *site.args.extra_positional]:
        if c is not None and _is_dtype(c):
            return expr("{x}.astype({d})", x=x, d=c)
    for k in ("device", "dtype"):  # a dtype held by a name or read from .dtype
        if k in site.dtypes or (k == "dtype" and site.args.get(k) is not None):
            return expr("{x}.astype({d})", x=x, d=site.args.get(k))
    other = site.args.get("device")
    last = code(other).rsplit(".", 1)[-1].lower() if other is not None else ""
    if "dtype" in last and isinstance(other, (cst.Name, cst.Attribute)):
        # x.to(initial_dtype): a name of a dtype, bound where the analysis cannot follow
        # (BailingHybrid's initial_dtype = query.dtype in a kernel passed to a decorator)
        return expr("{x}.astype({d})", x=x, d=other)
    if isinstance(other, (cst.Name, cst.Attribute)) and "dev" not in last:
        # x.to(other_tensor): torch takes the other tensor's dtype (and device)
        site.note(f"x.to({code(other)}) read as a tensor: cast to its dtype")
        return expr("{x}.astype({o}.dtype)", x=x, o=other)
    return x


@special("type_cast")
def type_cast(site: Site) -> cst.BaseExpression:
    """``x.type(dtype)``: a cast; ``x.type()`` returns the type's name, and a type given by
    name (``'torch.FloatTensor'``) also moves between devices: both marked."""
    d = site.args.get("dtype")
    if d is not None and (_is_dtype(d) or "dtype" in site.dtypes):
        return expr("{x}.astype({d})", x=site.x(), d=d)
    raise Untranslatable("x.type(...) without a dtype (the type's name, or a tensor type given "
                         "by name) is not translated")


def _is_dtype(node: cst.BaseExpression) -> bool:
    text = code(node)
    if isinstance(node, cst.Attribute) and node.attr.value == "dtype":
        return True  # value.dtype: numpy's, torch's and jax's arrays hold a dtype there
    return text.startswith(("jnp.", "torch.")) and not text.startswith("torch.device")
