"""Tensor functions the transformers sweep found without a rule (docs/transformers-sweep.md):
torch.linalg's norms, the legacy constructors (``torch.Tensor(2, 3)``), ``F.embedding`` and
``x.expand`` (with sizes spread from a tensor's shape: ``x.expand(*y.shape[:-1], 1)``) and
``x.unflatten``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import Untranslatable, arg, call, code, expr, int_value, py
from torch2jax.passes.registry import Site, special
from torch2jax.passes.special import _dtype_kw, _hint, _is_int_like, _sizes, norm_axes


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


@special("dtype_kind")
def dtype_kind(site: Site) -> cst.BaseExpression:
    """``x.is_floating_point()`` / ``torch.is_complex(x)``: whether the tensor's dtype is of a
    kind (the rule's ``jax``, ``jnp.floating`` or ``jnp.complexfloating``), a Python bool."""
    return expr("jnp.issubdtype({x}.dtype, " + site.rule.jax + ")", x=site.x())


@special("scalar_tensor")
def scalar_tensor(site: Site) -> cst.BaseExpression:
    """``torch.scalar_tensor(s, dtype=...)``: a 0-d array of ``s``, float32 (torch's default
    dtype) unless ``dtype`` says otherwise; ``device`` has no JAX meaning."""
    dtype = site.get("dtype")
    return expr("jnp.asarray({s}, dtype={d})", s=site.get("s"),
                d=dtype if dtype is not None else expr("jnp.float32"))


# the specials that take sizes spread from a sequence (``x.expand(*y.shape[:-1], 1)``,
# ``torch.ones(*x.shape[:-1])``, ``x.new_empty(*x.shape[:-1], n)``); the others are marked
# when called with *args
STARRED_SPECIALS = frozenset({"expand", "creation", "new_creation", "meshgrid"})


def _spread_sizes(node: cst.BaseExpression) -> bool:
    """``y.shape`` / ``y.shape[:-1]`` (``y.size()`` once translated): sizes, never -1."""
    if isinstance(node, cst.Subscript) and all(
            isinstance(e.slice, cst.Slice) for e in node.slice):
        node = node.value
    return m.matches(node, m.Attribute(attr=m.Name("shape")))


def _expand_spread(site: Site) -> cst.BaseExpression:
    """``x.expand(*y.shape[:-1], 1)`` (GPT-OSS's sinks, Inkling's gather index): the sizes in
    their order, the spread ones a tensor's (never -1); a -1 after the last spread part keeps
    ``x``'s size there, counted from the end. A spread of other sizes, which may hold a -1, or a
    -1 before a spread part (its axis unknown) is not translated."""
    items = site.args.ordered
    last = max(i for i, a in enumerate(items) if a.star)
    for i, a in enumerate(items):
        if a.star and not _spread_sizes(a.value):
            raise Untranslatable(f"expand(*{code(a.value)}): sizes that may hold a -1")
        if not a.star and int_value(a.value) == -1 and i < last:
            raise Untranslatable("expand with a -1 before spread sizes: its axis is unknown")
    x = site.x()
    n = len(items)
    if any(not a.star and int_value(a.value) == -1 for a in items):
        x = site.once(x, _hint(x), "expand(-1, ...)'s input")
    parts = [("*" + code(a.value)) if a.star else f"{code(x)}.shape[{i - n}]"
             if int_value(a.value) == -1 else code(a.value) for i, a in enumerate(items)]
    return call("jnp.broadcast_to", arg(x), arg(expr("(" + ", ".join(parts) + ("," if n == 1
                                                                                 else "") + ")")))


@special("expand")
def expand(site: Site) -> cst.BaseExpression:
    if site.args.star:
        return _expand_spread(site)
    x = site.x()
    sizes = [site.args.get("size"), *site.args.extra_positional]
    if sizes[0] is None:
        raise Untranslatable("expand without sizes")
    if len(sizes) == 1 and isinstance(sizes[0], (cst.Tuple, cst.List)) and not any(
            isinstance(e, cst.StarredElement) for e in sizes[0].elements):
        sizes = [e.value for e in sizes[0].elements]  # x.expand((1, -1)): the sizes
    if len(sizes) == 1 and (isinstance(sizes[0], cst.Name) or not _is_int_like(sizes[0])):
        # x.expand(input_shape) (Reformer's positions): a name may hold a shape or one size,
        # jnp.broadcast_to takes either (a -1 in it fails there, loudly)
        return call("jnp.broadcast_to", arg(x), arg(sizes[0]))
    n = len(sizes)
    parts = []
    if any(int_value(s) == -1 for s in sizes):
        # torch.arange(n).expand((1, -1)): the tensor bound to a name, as its sizes are read
        # (x.shape[i]) beside it
        x = site.once(x, _hint(x), "expand(-1, ...)'s input")
    for i, s in enumerate(sizes):
        if int_value(s) == -1:
            parts.append(f"{code(x)}.shape[{i - n}]")
        else:
            parts.append(code(s))
    return call("jnp.broadcast_to", arg(x), arg(expr("(" + ", ".join(parts) + ("," if n == 1
                                                                                 else "") + ")")))


def _creation_sizes(site: Site) -> cst.BaseExpression:
    """The shape a creation function is given; ``torch.ones(*x.shape[:-1], n)`` (PEGASUS-X),
    ``x.new_empty(*x.shape[:-1], n)`` (the MLA attentions): the sizes in their order, spread
    ones too."""
    if not site.args.star:
        return _sizes(site)
    if site.rule.torch.endswith("full"):
        raise Untranslatable(f"{site.rule.torch} called with *args: its sizes are one "
                             "argument, its fill value the next")
    items = site.args.ordered
    return expr("(" + ", ".join(("*" if a.star else "") + code(a.value) for a in items)
                + ("," if len(items) == 1 else "") + ")")


@special("creation")
def creation(site: Site) -> cst.BaseExpression:
    """torch.zeros/ones/empty/rand-free creation with size varargs."""
    shape = _creation_sizes(site)
    extra = []
    if site.rule.torch.endswith("full"):
        extra.append(arg(site.args.get("fill_value")))
    return call(site.rule.jax, arg(shape), *extra, *_dtype_kw(site))


@special("new_creation")
def new_creation(site: Site) -> cst.BaseExpression:
    """x.new_zeros(shape) / new_ones / new_full / new_empty: a new array of x's dtype (unless
    dtype= says otherwise)."""
    shape = _creation_sizes(site)
    extra = []
    if site.rule.torch == "new_full":
        extra.append(arg(site.args.get("fill_value")))
    dtype = site.args.get("dtype") or expr("{x}.dtype", x=site.x())
    return call(site.rule.jax, arg(shape), *extra, arg(dtype, "dtype"))


@special("weight_norm")
def weight_norm(site: Site) -> cst.BaseExpression:
    """``nn.utils.weight_norm(module, name, dim)`` (and the parametrizations' one): the
    helper (rules/functions.toml) on a layer already bound (``self.conv = weight_norm(
    self.conv)``) or a Linear built on the spot; a convolution built in the call is refused:
    the layout pass reads its channels-first calls from the layer's own assignment."""
    module = site.get("module")
    if module is None:
        raise Untranslatable(f"{site.rule.torch} without a module")
    if isinstance(module, cst.Call) and not m.matches(module.func, m.Attribute(
            value=m.Name("nnx"), attr=m.Name("Linear"))):
        raise Untranslatable(f"{site.rule.torch} of a layer built in the call: bind the layer "
                             "first (self.conv = nn.Conv1d(...); self.conv = weight_norm("
                             "self.conv))")
    return call(site.rule.jax, arg(module), *[arg(site.args.get(k), k) for k in ("name", "dim")
                                              if site.args.has(k)])


@special("solve_triangular")
def solve_triangular(site: Site) -> cst.BaseExpression:
    """``torch.linalg.solve_triangular(A, B, *, upper, left=True, unitriangular=False)``:
    ``jax.lax.linalg.triangular_solve`` (batched as torch's, one batch shape for both), which
    solves ``A X = B`` with ``left_side=True``, ``X A = B`` without; both read only the
    triangle ``upper`` names."""
    a, b, upper = site.get("input"), site.get("B"), site.get("upper")
    if a is None or b is None or upper is None:
        raise Untranslatable("torch.linalg.solve_triangular without A, B or upper=")
    up = site.lit("upper")
    lower = py(not up) if isinstance(up, bool) else expr("not {u}", u=upper)
    left = site.args.get("left")
    unit = site.args.get("unitriangular")
    return call("jax.lax.linalg.triangular_solve", arg(a), arg(b),
                arg(left if left is not None else py(True), "left_side"), arg(lower, "lower"),
                *([arg(unit, "unit_diagonal")] if unit is not None else []))


@special("unflatten")
def unflatten(site: Site) -> cst.BaseExpression:
    """``x.unflatten(dim, sizes)`` / ``torch.unflatten(x, dim, sizes)``: axis ``dim`` split
    into ``sizes`` (one of them may be -1), a reshape keeping the other axes (V-JEPA 2's
    rotary embedding: ``x.unflatten(-1, (-1, 2))``)."""
    dim, sizes = site.get("dim"), site.get("sizes")
    if dim is None or sizes is None:
        raise Untranslatable(f"{site.rule.torch} without dim and sizes")
    x = site.once(site.x(), "x", "unflatten's input")
    # a literal (-1, 2) spliced in, else spread
    split = ", ".join(code(e.value) for e in sizes.elements) if isinstance(
        sizes, (cst.Tuple, cst.List)) and sizes.elements else f"*{code(sizes)}"
    d = int_value(dim)
    if d == -1:
        return expr(f"{{x}}.reshape(*{{x}}.shape[:-1], {split})", x=x)
    if d is not None:
        return expr(f"{{x}}.reshape(*{{x}}.shape[:{d}], {split}, *{{x}}.shape[{d + 1}:])", x=x)
    return expr(f"{{x}}.reshape(*{{x}}.shape[:{{d}} % {{x}}.ndim], {split}, "
                f"*{{x}}.shape[{{d}} % {{x}}.ndim + 1:])", x=x, d=dim)


@special("kaiser_window")
def kaiser_window(site: Site) -> cst.BaseExpression:
    """``torch.kaiser_window(n, periodic=False, beta=b, dtype=d)`` -> ``jnp.kaiser(n, b)``
    (cast to ``d`` where given): numpy's Kaiser window is torch's symmetric one."""
    if site.lit("periodic") is not False:
        raise Untranslatable("torch.kaiser_window periodic (its default): jnp.kaiser is the "
                             "symmetric window; pass periodic=False or take "
                             "jnp.kaiser(n + 1, beta)[:-1] for n > 1", rule="torch.kaiser_window")
    beta = site.get("beta")
    window = expr("jnp.kaiser({n}, {b})", n=site.get("window_length"),
                  b=beta if beta is not None else expr("12.0"))
    dtype = site.get("dtype")
    return window if dtype is None else expr("{w}.astype({d})", w=window, d=dtype)
