"""Tensor functions the transformers sweep found without a rule (docs/transformers-sweep.md):
torch.linalg's norms, the legacy constructors (``torch.Tensor(2, 3)``) and ``F.embedding``."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, code, expr
from torch2jax.passes.registry import Site, special
from torch2jax.passes.special import norm_axes


@special("linalg_norm")
def linalg_norm(site: Site) -> cst.BaseExpression:
    """``torch.linalg.norm`` / ``torch.linalg.vector_norm(x, ord, dim, keepdim)``: numpy's
    norms, which ``jnp.linalg.norm`` / ``jnp.linalg.vector_norm`` compute with the same ``ord``
    (``dim`` is ``axis``; an int is a vector norm, a pair a matrix norm, None every element)."""
    if site.get("dtype") is not None:
        raise Untranslatable(f"{site.rule.torch} with dtype= is not translated")
    out = [arg(site.x())]
    if site.get("ord") is not None:
        out.append(arg(site.get("ord"), "ord"))
    out += norm_axes(site)
    return call(site.rule.jax, *out)


# the legacy constructors' dtypes (torch.Tensor and torch.FloatTensor: float32); int64 is
# JAX's default integer width, int32, as everywhere in the translation
_LEGACY_DTYPES = {"torch.LongTensor": "jnp.int32", "torch.BoolTensor": "jnp.bool_"}


@special("legacy_tensor")
def legacy_tensor(site: Site) -> cst.BaseExpression:
    """``torch.Tensor(2, 3)`` / ``torch.FloatTensor(n)``, torch's legacy constructors: sizes
    (two or more arguments, or one int expression, config size or name that value analysis
    knows holds a number) make an uninitialised float32 tensor, ``jnp.empty`` (zeros: JAX has
    no uninitialised memory); one list or tuple is data, ``jnp.asarray(data, jnp.float32)``.
    One other name may be either: marked."""
    first, rest = site.args.get("data"), site.args.extra_positional
    dtype = _LEGACY_DTYPES.get(site.rule.torch, "jnp.float32")
    if first is None:
        raise Untranslatable(f"{site.rule.torch}() without arguments is not translated")
    if (isinstance(first, (cst.List, cst.Tuple)) or "data" in site.sequences) and not rest:
        # (a name: one that value analysis knows holds a list, LeViT's indices)
        return expr("jnp.asarray({d}, dtype=" + dtype + ")", d=first)
    config_size = isinstance(first, cst.Attribute) and code(first).startswith(
        ("config.", "self.config."))
    if rest or isinstance(first, (cst.Integer, cst.BinaryOperation)) or config_size or (
            "data" in site.scalars):  # dim = config.hidden_size; torch.Tensor(dim)
        sizes = [first, *rest]
        return expr("jnp.empty((" + ", ".join(code(n) for n in sizes)
                    + ("," if len(sizes) == 1 else "") + "), dtype=" + dtype + ")")
    raise Untranslatable(f"{site.rule.torch}({code(first)}): a size or data, unknown here "
                         "(write torch.empty(n) or torch.tensor(data))")


@special("embedding_function")
def embedding_function(site: Site) -> cst.BaseExpression:
    """``F.embedding(input, weight)``: the rows of ``weight`` at ``input``. padding_idx (a
    gradient masked on that row), max_norm (renormalised in place) and scale_grad_by_freq
    change the gradient or the weight in torch: marked."""
    for name in ("padding_idx", "max_norm"):
        if site.get(name) is not None and site.lit(name) is not None:
            raise Untranslatable(f"F.embedding with {name}= is not translated")
    if site.get("scale_grad_by_freq") is not None and site.lit("scale_grad_by_freq") is not False:
        raise Untranslatable("F.embedding with scale_grad_by_freq= is not translated")
    return expr("jnp.take({w}, {i}, axis=0)", w=site.args.get("weight"), i=site.x())


@special("masked_scatter")
def masked_scatter(site: Site) -> cst.BaseExpression:
    """``x.masked_scatter(mask, source)``: the elements of ``source``, in order, written where
    ``mask`` (broadcast to ``x``) is True (the VLMs' ``inputs_embeds.masked_scatter(image_mask,
    image_features)``). With static shapes: the k-th True position takes ``source``'s k-th
    element, found by a running count of the mask."""
    x = site.once(site.x(), "scattered", "masked_scatter's input")
    mask = site.once(site.get("mask"), "scatter_mask", "masked_scatter's mask")
    source = site.once(site.get("source"), "scatter_source", "masked_scatter's source")
    where = site.once(expr("jnp.broadcast_to({m}, {x}.shape).reshape(-1)", m=mask, x=x),
                      "scatter_where", "masked_scatter's mask")
    return expr("jnp.where({w}, {s}.reshape(-1)[jnp.clip(jnp.cumsum({w}) - 1, 0, {s}.size - 1)]"
                ".astype({x}.dtype), {x}.reshape(-1)).reshape({x}.shape)", w=where, s=source, x=x)


@special("default_dtype")
def default_dtype(site: Site) -> cst.BaseExpression:
    """``torch.get_default_dtype()``: float32, torch's default float type and JAX's (a program
    that changes torch's with ``torch.set_default_dtype`` has that line marked: no rule)."""
    return expr("jnp.float32")


@special("is_tensor")
def is_tensor(site: Site) -> cst.BaseExpression:
    """``torch.is_tensor(obj)``: whether ``obj`` is an array, ``isinstance(obj, jax.Array)``
    (a traced array is one too; a Python or numpy number is not, as it is no tensor in torch)."""
    return expr("isinstance({x}, jax.Array)", x=site.get("obj"))


@special("scalar_tensor")
def scalar_tensor(site: Site) -> cst.BaseExpression:
    """``torch.scalar_tensor(s, dtype=...)``: a 0-d array of ``s``, float32 (torch's default
    dtype) unless ``dtype`` says otherwise; ``device`` has no JAX meaning."""
    dtype = site.get("dtype")
    return expr("jnp.asarray({s}, dtype={d})", s=site.get("s"),
                d=dtype if dtype is not None else expr("jnp.float32"))
