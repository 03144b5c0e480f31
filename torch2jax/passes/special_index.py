"""Transforms for indexed accumulation and selection: ``index_add``, ``scatter_add``,
``scatter``,
``torch.topk`` along any dimension, ``torch.histc``, ``repeat_interleave``.

JAX arrays are immutable: torch's accumulating writes (``x.index_add(0, idx, src)``) are the
out-of-place ``x.at[...].add(...)``, which adds repeated indices up as torch does. The in-place
forms (``x.index_add_(...)`` as a statement) are rewritten to ``x = <the out-of-place form>``
by the rewriter (passes/rewrite.py, ``_inplace``); on a tensor made on the spot
(``torch.zeros(n).scatter_add_(...)``) the in-place method is the out-of-place value.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, expr, int_value, try_literal
from torch2jax.passes.registry import Site, special


def _dim(site: Site, name: str = "dim", default: int | None = None) -> int:
    node = site.get(name)
    if node is None and default is not None:
        return default
    d = int_value(node)
    if d is None:
        raise Untranslatable(f"{site.rule.torch} with a dim that is not an integer literal")
    return d


def _scatter_axis(site: Site) -> cst.BaseExpression | str:
    """The dim of a scatter, read in the comprehension of its index: an integer literal, or any
    other expression (a Python int where the function is traced: ``dim`` passed down, as in
    groupvit's hard softmax), bound to a name first unless it is a name or an attribute; a
    dim that is traced fails at the comparison, never silently."""
    node = site.get("dim")
    if node is None:
        raise Untranslatable(f"{site.rule.torch} without dim")
    d = int_value(node)
    if d is not None:
        return str(d)
    if isinstance(node, (cst.Name, cst.Attribute)):
        return node
    return site.once(node, "dim", f"{site.rule.torch}'s dim")


def _scatter_where(site: Site, index: cst.BaseExpression) -> cst.BaseExpression:
    """The index tuple of a scatter: ``index`` on axis dim, the broadcasting aranges of
    ``jnp.indices(index.shape, sparse=True)`` on the others."""
    return expr("tuple({i} if axis == {d} % {i}.ndim else at for axis, at in "
                "enumerate(jnp.indices({i}.shape, sparse=True)))", i=index, d=_scatter_axis(site))


def _named(site: Site, node: cst.BaseExpression, name: str) -> cst.BaseExpression:
    """``node`` bound to a name before the statement when it is read twice."""
    if isinstance(node, cst.Name):
        return node
    return site.once(node, name, f"{site.rule.torch}'s {name}")


def _scaled(site: Site, src: cst.BaseExpression) -> cst.BaseExpression:
    alpha = site.get("alpha")
    if alpha is None or try_literal(alpha, ...) == 1:
        return src
    return expr("{a} * {s}", a=alpha, s=src)


@special("index_add")
def index_add(site: Site) -> cst.BaseExpression:
    """``x.index_add(d, index, source, alpha=a)``: ``x.at[:, ..., index].add(a * source)``
    (index on axis d, a 1-D index as torch requires)."""
    d = _dim(site)
    index, source = site.get("index"), site.get("source")
    if index is None or source is None:
        raise Untranslatable(f"{site.rule.torch} without index or source")
    if d >= 0:
        at = "{x}.at[" + ":, " * d + "{i}]"
    else:
        at = "{x}.at[..., {i}" + ", :" * (-d - 1) + "]"
    return call(expr(at + ".add", x=site.x(), i=index), arg(_scaled(site, source)))


@special("scatter_add")
def scatter_add(site: Site) -> cst.BaseExpression:
    """``x.scatter_add(d, index, src)``: ``x[..., index[i, j], ...] += src[i, j]`` with
    index on axis d and the position itself on the other axes: the index array on d, the
    broadcasting aranges of ``jnp.indices(index.shape, sparse=True)`` on the others. src
    must have index's shape (torch also reads the corner of a larger src: that shape fails
    to broadcast here, never silently)."""
    index, src = site.get("index"), site.get("src")
    if index is None or src is None:
        raise Untranslatable(f"{site.rule.torch} without index or src")
    where = _scatter_where(site, _named(site, index, "index"))
    return call(expr("{x}.at[{w}].add", x=site.x(), w=where), arg(src))


@special("scatter")
def scatter(site: Site) -> cst.BaseExpression:
    """``x.scatter(d, index, src)`` / ``x.scatter(d, index, value=v)``: ``x[..., index[i, j],
    ...] = src[i, j]`` (or ``v``), the index on axis d as in :func:`scatter_add`, set instead of
    added (a one-hot: ``torch.zeros(n, k).scatter_(1, idx, 1)``). ``reduce=`` is marked."""
    index, src = site.get("index"), site.get("src")
    src = site.get("value") if src is None else src
    if index is None or src is None:
        raise Untranslatable(f"{site.rule.torch} without index or src")
    if site.get("reduce") is not None:
        raise Untranslatable(f"{site.rule.torch} with reduce=: not translated")
    where = _scatter_where(site, _named(site, index, "index"))
    return call(expr("{x}.at[{w}].set", x=site.x(), w=where), arg(src))


@special("cdist")
def cdist(site: Site) -> cst.BaseExpression:
    """``torch.cdist(x1, x2, p)``: the p-norm of ``x1[..., :, None, :] - x2[..., None, :, :]``
    over the last axis. A zero distance (a point to itself) has torch's gradient, zero: the
    root is taken where the sum is positive only (the gradient of jnp.sqrt at 0 is inf)."""
    x1, x2, p = site.get("x1"), site.get("x2"), site.lit("p")
    if x1 is None or x2 is None:
        raise Untranslatable("torch.cdist without x1 and x2")
    if p == float("inf"):
        return expr("jnp.max(jnp.abs({a}[..., :, None, :] - {b}[..., None, :, :]), axis=-1)",
                    a=x1, b=x2)
    if p == 1:
        return expr("jnp.sum(jnp.abs({a}[..., :, None, :] - {b}[..., None, :, :]), axis=-1)",
                    a=x1, b=x2)
    if not isinstance(p, (int, float)) or isinstance(p, bool) or p < 1:
        raise Untranslatable("torch.cdist with a p that is not a number of at least 1 written "
                             "out")
    powered = "({a}[..., :, None, :] - {b}[..., None, :, :]) ** 2" if p == 2 else (
        f"jnp.abs({{a}}[..., :, None, :] - {{b}}[..., None, :, :]) ** {p!r}")
    total = site.once(expr(f"jnp.sum({powered}, axis=-1)", a=x1, b=x2), "sum_p",
                      "torch.cdist's sum")
    root = "jnp.sqrt({s_safe})" if p == 2 else f"{{s_safe}} ** (1 / {p!r})"
    return expr(f"jnp.where({{s}} > 0, {root}, 0.0)", s=total,
                s_safe=expr("jnp.where({s} > 0, {s}, 1.0)", s=total))


@special("topk")
def topk(site: Site) -> cst.BaseExpression:
    """``torch.topk(x, k, dim=d)``: ``jax.lax.top_k`` works on the last axis; another axis is
    moved there and back. ``largest=False`` is the top k of ``-x`` (values negated back);
    ``sorted=False`` lets torch return any order, and the sorted one is such an order."""
    x, k = site.x(), site.get("k")
    if k is None:
        raise Untranslatable("torch.topk without k")
    largest = site.lit("largest")
    if largest not in (None, True, False):
        raise Untranslatable("torch.topk with a largest= that is not a literal")
    if site.lit("sorted") not in (None, True, False):
        raise Untranslatable("torch.topk with a sorted= that is not a literal")
    d = _dim(site, default=-1)
    if largest is False:
        x = expr("-{x}", x=x)
    top = call("jax.lax.top_k", arg(x if d == -1 else call(
        "jnp.moveaxis", arg(x), arg(expr(str(d))), arg(expr("-1")))), arg(k))
    if d == -1 and largest is not False:
        return top
    if largest is False:  # the values of -x, negated back
        top = expr("(lambda values, indices: (-values, indices))(*{t})", t=top)
    if d == -1:
        return top
    return expr(f"jax.tree.map(lambda a: jnp.moveaxis(a, -1, {d}), {{t}})", t=top)


@special("histc")
def histc(site: Site) -> cst.BaseExpression:
    """``torch.histc(x, bins, min, max)``: ``jnp.histogram`` with the same equal-width bins
    (values outside [min, max] ignored, max in the last bin), counted in x's dtype as torch
    does. torch takes the data's range when min == max: so does jnp.histogram with
    ``range=None``."""
    x = _named(site, site.x(), "values")
    bins = site.get("bins") or expr("100")
    lo, hi = site.get("min"), site.get("max")
    lo_v = try_literal(lo, ...) if lo is not None else 0
    hi_v = try_literal(hi, ...) if hi is not None else 0
    if lo_v is not ... and hi_v is not ...:
        rng = expr("None") if lo_v == hi_v else expr("({a}, {b})", a=lo or expr("0"),
                                                     b=hi or expr("0"))
    else:  # the data's range when they are equal at run time, as torch
        a, b = lo or expr("0"), hi or expr("0")
        rng = expr("None if {a} == {b} else ({a}, {b})", a=a, b=b)
    hist = call("jnp.histogram", arg(x), arg(bins, "bins"), arg(rng, "range"))
    return expr("{h}[0].astype({x}.dtype)", h=hist, x=x)


@special("repeat_interleave")
def repeat_interleave(site: Site) -> cst.BaseExpression:
    """``x.repeat_interleave(r, dim=d)``: ``jnp.repeat(x, r, axis=d)`` (no dim: flattened, on
    both sides)."""
    repeats = site.get("repeats")
    if repeats is None:
        raise Untranslatable(f"{site.rule.torch} without repeats (the one-argument form)")
    kws = [arg(site.get("dim"), "axis")] if site.get("dim") is not None else []
    if site.get("output_size") is not None:
        kws.append(arg(site.get("output_size"), "total_repeat_length"))
    return call("jnp.repeat", arg(site.x()), arg(repeats), *kws)


@special("nonzero")
def nonzero(site: Site) -> cst.BaseExpression:
    """``x.nonzero()``: the (n, ndim) indices of the nonzero entries, ``jnp.argwhere(x)``
    (numpy's and jax's ``x.nonzero()`` is the tuple of index arrays, torch's
    ``as_tuple=True``: ``jnp.nonzero(x)``)."""
    as_tuple = site.lit("as_tuple")
    if as_tuple not in (None, True, False):
        raise Untranslatable("nonzero with an as_tuple= that is not a literal")
    return call("jnp.nonzero" if as_tuple else "jnp.argwhere", arg(site.x()))
