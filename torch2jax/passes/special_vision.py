"""Transforms for the vision layers and ops of ``rules/vision.toml``.

Each is registered with ``@special(name)`` like the transforms of :mod:`special` and takes a
:class:`Site`. The numbers each translation reproduces (and the cases it refuses) are in the
rules' notes; the examples are run against torch by ``tests/test_rules.py`` and the weight
transfers by ``tests/test_vision_layers.py``.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import (
    Untranslatable,
    arg,
    call,
    code,
    expr,
    is_simple,
    py,
    try_literal,
)
from torch2jax.passes.registry import Site, spatial_dims, special, tuple_of

# --------------------------------------------------------------------------------------------
# PReLU
# --------------------------------------------------------------------------------------------


@special("prelu")
def prelu(site: Site) -> cst.BaseExpression:
    """``nn.PReLU(n, init)`` -> ``nnx.PReLU`` holding torch's ``(n,)`` slopes.

    The layer runs channels-last, so that ``n`` per-channel slopes broadcast over the last axis
    (torch's axis 1) whatever the input's rank; ``n = 1`` broadcasts everywhere."""
    n = site.get("num_parameters")
    init = site.get("init")
    n_code = code(n) if n is not None else "1"
    init_code = code(init) if init is not None else "0.25"
    return call(site.rule.targets[site.target],
                arg(expr(f"jnp.full(({n_code},), {init_code})"), "negative_slope_init"))


# --------------------------------------------------------------------------------------------
# PixelShuffle / PixelUnshuffle
# --------------------------------------------------------------------------------------------


def _shuffle_text(x: str, r: str, unshuffle: bool) -> str:
    """torch's channel <-> space rearrangement of an (N, C, H, W) array, as reshapes."""
    if unshuffle:  # (N, C, H*r, W*r) -> (N, C*r*r, H, W)
        return (f"{x}.reshape({x}.shape[0], {x}.shape[1], {x}.shape[2] // {r}, {r}, "
                f"{x}.shape[3] // {r}, {r}).transpose(0, 1, 3, 5, 2, 4).reshape("
                f"{x}.shape[0], {x}.shape[1] * {r} * {r}, {x}.shape[2] // {r}, "
                f"{x}.shape[3] // {r})")
    # (N, C*r*r, H, W) -> (N, C, H*r, W*r)
    return (f"{x}.reshape({x}.shape[0], -1, {r}, {r}, {x}.shape[2], {x}.shape[3])"
            f".transpose(0, 1, 4, 2, 5, 3).reshape({x}.shape[0], -1, {x}.shape[2] * {r}, "
            f"{x}.shape[3] * {r})")


def _factor(site: Site, name: str) -> str:
    node = site.get(name)
    if node is None:
        raise Untranslatable(f"{site.rule.torch} without {name}")
    text = code(node)
    return text if is_simple(node) or isinstance(node, cst.Integer) else f"({text})"


@special("pixel_shuffle_module")
def pixel_shuffle_module(site: Site) -> cst.BaseExpression:
    unshuffle = site.rule.torch.endswith("Unshuffle")
    r = _factor(site, "downscale_factor" if unshuffle else "upscale_factor")
    return expr("lambda x: " + _shuffle_text("x", r, unshuffle))


@special("pixel_shuffle")
def pixel_shuffle(site: Site) -> cst.BaseExpression:
    unshuffle = site.rule.torch.endswith("unshuffle")
    r = _factor(site, "downscale_factor" if unshuffle else "upscale_factor")
    x = site.once(site.x(), "shuffled", f"{site.rule.torch}'s input")
    return expr(_shuffle_text(code(x), r, unshuffle))


# --------------------------------------------------------------------------------------------
# InstanceNorm
# --------------------------------------------------------------------------------------------


@special("instance_norm")
def instance_norm(site: Site) -> cst.BaseExpression:
    if site.lit("track_running_stats") is not False:
        raise Untranslatable(
            f"{site.rule.torch}(track_running_stats=True): torch then normalises with running "
            "statistics in eval mode; nnx.InstanceNorm always uses the instance's own")
    if site.get("num_features") is None:
        raise Untranslatable(f"{site.rule.torch} without num_features")
    out = [arg(site.get("num_features"))]
    eps = site.get("eps")
    out.append(arg(eps if eps is not None else py(1e-5), "epsilon"))
    affine = site.lit("affine")
    if affine is not True:
        value = site.get("affine") if site.get("affine") is not None else py(False)
        out += [arg(value, "use_scale"), arg(value, "use_bias")]
    # flax's default E[x^2] - E[x]^2 loses everything to cancellation when the mean is large
    # compared with the spread (post-ReLU activations); torch computes the variance directly
    out.append(arg(py(False), "use_fast_variance"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


# --------------------------------------------------------------------------------------------
# ConvTranspose
# --------------------------------------------------------------------------------------------


@special("conv_transpose")
def conv_transpose(site: Site) -> cst.BaseExpression:
    """torch's padding crops the full transposed convolution; flax pads the dilated input:
    ``(d*(k-1) - p, d*(k-1) - p + output_padding)`` per side reproduces torch's output. With
    ``transpose_kernel=True`` flax flips the kernel and swaps its in/out axes itself, so torch's
    ``(in, out, *k)`` weight only needs the ``conv`` layout: ``(*k, out, in)``."""
    n = spatial_dims(site.rule.torch)
    a = site.args
    for required in ("in_channels", "out_channels", "kernel_size"):
        if not a.has(required):
            raise Untranslatable(f"{site.rule.torch} without {required}")
    if site.lit("groups") != 1:
        raise Untranslatable("ConvTranspose with groups != 1: nnx.ConvTranspose has no "
                             "feature groups; write jax.lax.conv_transpose per group")
    mode = site.lit("padding_mode")
    if mode not in ("zeros", None):
        raise Untranslatable(f"ConvTranspose padding_mode={mode!r}")
    values = {}
    for name in ("kernel_size", "stride", "padding", "output_padding", "dilation"):
        v = site.lit(name)
        if isinstance(v, int):
            v = (v,) * n
        if not (isinstance(v, (tuple, list)) and len(v) == n and all(isinstance(i, int)
                                                                      for i in v)):
            return _conv_transpose_computed(site, n)
        values[name] = tuple(v)
    k, s, p, op, d = (values[name] for name in ("kernel_size", "stride", "padding",
                                                "output_padding", "dilation"))
    pads = [(di * (ki - 1) - pi, di * (ki - 1) - pi + oi) for ki, pi, oi, di in zip(k, p, op, d)]
    out = [arg(a.get("in_channels")), arg(a.get("out_channels")),
           arg(tuple_of(a.get("kernel_size"), n), "kernel_size")]
    if any(si != 1 for si in s):
        out.append(arg(tuple_of(a.get("stride"), n), "strides"))
    out.append(arg(expr("(" + ", ".join(f"({lo}, {hi})" for lo, hi in pads)
                        + ("," if n == 1 else "") + ")"), "padding"))
    if any(di != 1 for di in d):
        out.append(arg(tuple_of(a.get("dilation"), n), "kernel_dilation"))
    if site.lit("bias") is not True:
        out.append(arg(a.get("bias"), "use_bias"))
    out.append(arg(py(True), "transpose_kernel"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


_PURE_CALLS = frozenset({"int", "abs", "min", "max", "len", "round", "math.ceil",
                         "math.floor"})


def _pure(node: cst.BaseExpression) -> bool:
    """Arithmetic over names, attributes and ints (``2 * stride``, ``math.ceil(stride / 2)``,
    ``kernel_list[2]``): the same value each time it is evaluated, so it may be written twice."""
    if is_simple(node) or isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _pure(node.left) and _pure(node.right)
    if isinstance(node, cst.UnaryOperation):
        return _pure(node.expression)
    if isinstance(node, cst.Subscript):
        return _pure(node.value) and len(node.slice) == 1 and isinstance(
            node.slice[0].slice, cst.Index) and _pure(node.slice[0].slice.value)
    if isinstance(node, cst.Call):
        return (code(node.func) in _PURE_CALLS and all(not a.keyword and not a.star
                                                           and _pure(a.value)
                                                           for a in node.args))
    return False


def _atom(node: cst.BaseExpression) -> str:
    """``node``'s code, in parentheses where an operator would bind into it."""
    text = code(node)
    bare = node.with_changes(lpar=[], rpar=[]) if hasattr(node, "lpar") else node
    if isinstance(bare, (cst.BinaryOperation, cst.UnaryOperation, cst.BooleanOperation,
                         cst.Comparison, cst.IfExp, cst.Lambda)) and not node.lpar:
        return f"({text})"
    return text


def _per_axis(site: Site, name: str, n: int) -> tuple[cst.BaseExpression, list[str]]:
    """A ConvTranspose size that is not a literal: the argument (a name bound to a computed
    one) and its ``n`` per-axis expressions: a tuple's items, ``k[i]`` of a name value
    analysis finds holding a tuple or list, else the expression itself on each axis (an int;
    a tuple there fails loudly in flax, in the kernel's shape and the padding's arithmetic)."""
    node = site.args.get(name)
    value = site.lit(name)
    if node is None or isinstance(value, int) and not isinstance(value, bool):
        v = value if node is not None else site.rule.defaults[name]
        return py(v), [str(v)] * n
    if isinstance(node, (cst.Tuple, cst.List)):
        if len(node.elements) != n or any(isinstance(e, cst.StarredElement)
                                          for e in node.elements):
            raise Untranslatable(f"ConvTranspose {name}={code(node)}: not {n} sizes")
        if not all(_pure(e.value) for e in node.elements):
            raise Untranslatable(f"ConvTranspose {name}={code(node)}: assign it to a name "
                                 "first (the flax padding is computed from it)")
        return node, [_atom(e.value) for e in node.elements]
    if value is not ...:
        raise Untranslatable(f"ConvTranspose {name}={code(node)}")
    if not _pure(node):
        node = site.once(node, name, f"ConvTranspose's {name}")
    text = _atom(node)
    if name in site.sequences:
        return expr(f"tuple({text})"), [f"{text}[{i}]" for i in range(n)]
    return node, [text] * n


def _conv_transpose_computed(site: Site, n: int) -> cst.BaseExpression:
    """:func:`conv_transpose` where a size is computed (DPT's ``kernel_size=factor,
    stride=factor``): the flax padding ``(d*(k-1) - p, d*(k-1) - p + output_padding)`` as an
    expression of the sizes, evaluated when the layer is built."""
    a = site.args
    sizes = {name: _per_axis(site, name, n)
             for name in ("kernel_size", "stride", "padding", "output_padding", "dilation")}

    def minus(x: str, y: str) -> str:
        return x if y == "0" else f"{x} - {y}"

    pads = []
    for i in range(n):
        k, p, op, d = (sizes[name][1][i] for name in ("kernel_size", "padding",
                                                      "output_padding", "dilation"))
        lo = minus(f"{k} - 1" if d == "1" else f"{d} * ({k} - 1)", p)
        pads.append(f"({lo}, {lo if op == '0' else f'{lo} + {op}'})")

    def sizes_arg(name: str) -> cst.BaseExpression:
        node, items = sizes[name]
        if isinstance(node, cst.Call):  # tuple(k)
            return node
        return tuple_of(node, n) if len(set(items)) == 1 and not isinstance(
            node, (cst.Tuple, cst.List)) else expr(_seq(items))

    out = [arg(a.get("in_channels")), arg(a.get("out_channels")),
           arg(sizes_arg("kernel_size"), "kernel_size")]
    if set(sizes["stride"][1]) != {"1"}:
        out.append(arg(sizes_arg("stride"), "strides"))
    out.append(arg(expr(_seq(pads)), "padding"))
    if set(sizes["dilation"][1]) != {"1"}:
        out.append(arg(sizes_arg("dilation"), "kernel_dilation"))
    if site.lit("bias") is not True:
        out.append(arg(a.get("bias"), "use_bias"))
    out.append(arg(py(True), "transpose_kernel"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


# --------------------------------------------------------------------------------------------
# F.conv1d / conv2d / conv3d
# --------------------------------------------------------------------------------------------

_CONV_DIMS = {1: '("NCH", "OIH", "NCH")', 2: '("NCHW", "OIHW", "NCHW")',
              3: '("NCDHW", "OIDHW", "NCDHW")'}


def _seq(items: list[str]) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _conv_sizes(site: Site, name: str, n: int) -> str | None:
    """stride / dilation as the tuple of ``n`` ints lax takes; None when it is all ones."""
    node = site.get(name)
    value = site.lit(name)
    if node is None or value == 1:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return _seq([str(value)] * n)
    if isinstance(value, (tuple, list)) and len(value) == n and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None if all(v == 1 for v in value) else _seq([str(v) for v in value])
    if isinstance(node, (cst.Tuple, cst.List)):
        if len(node.elements) != n or any(isinstance(e, cst.StarredElement)
                                          for e in node.elements):
            raise Untranslatable(f"{site.rule.torch} {name}={code(node)}: not {n} sizes")
        return _seq([code(e.value) for e in node.elements])
    if value is not ...:
        raise Untranslatable(f"{site.rule.torch} {name}={code(node)}")
    if name in site.sequences:  # a tuple already (self.stride of an nn.Conv2d subclass)
        return code(node)
    text = code(node) if is_simple(node) else f"({code(node)})"
    return _seq([text] * n)  # an int (a tuple there fails loudly in lax)


def _conv_padding(site: Site, n: int) -> str | None:
    """torch's symmetric zero padding as lax's (low, high) pairs, or 'SAME' / 'VALID'.

    torch's 'same' (stride 1 only) pads ``d*(k-1)`` in all, the odd one on the right: lax's
    "SAME" at stride 1 pads the same (checked for even and odd kernels and dilations)."""
    node = site.get("padding")
    value = site.lit("padding")
    if node is None or value == 0:
        return None
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise Untranslatable(f"{site.rule.torch} padding={value!r} (torch raises)")
        if value == "same" and _conv_sizes(site, "stride", n) is not None:
            raise Untranslatable(f"{site.rule.torch} padding='same' with a stride (torch "
                                 "raises)")
        return repr(value.upper())
    if isinstance(value, int) and not isinstance(value, bool):
        return _seq([f"({value}, {value})"] * n)
    if isinstance(value, (tuple, list)) and len(value) == n and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None if not any(value) else _seq([f"({v}, {v})" for v in value])
    if isinstance(node, (cst.Tuple, cst.List)):
        if len(node.elements) != n or any(isinstance(e, cst.StarredElement)
                                          for e in node.elements):
            raise Untranslatable(f"{site.rule.torch} padding={code(node)}: not {n} sizes")
        items = [code(e.value) for e in node.elements]
        return _seq([f"({v}, {v})" for v in items])
    if value is not ...:
        raise Untranslatable(f"{site.rule.torch} padding={code(node)}")
    text = code(site.once(node, "pad", f"{site.rule.torch}'s computed padding"))
    if "padding" in site.sequences:  # a tuple (self.padding of an nn.Conv2d subclass)
        return f"tuple((p, p) for p in {text})"
    # an int: a tuple or a padding string there fails loudly in lax, never silently
    site.note(f"{site.rule.torch}: padding={text} is read as an int (symmetric zero padding)",
              "warning")
    return _seq([f"({text}, {text})"] * n)


@special("conv_function")
def conv_function(site: Site) -> cst.BaseExpression:
    """``F.conv2d(x, w, b, stride, padding, dilation, groups)`` on torch's layouts, (N, C, *s)
    input and (out, in/groups, *k) weight: ``jax.lax.conv_general_dilated`` with dimension
    numbers that say so (no moves of the channel axis) and the bias over the channel axis."""
    n = spatial_dims(site.rule.torch)
    x = site.x()
    w = site.get("weight")
    if w is None:
        raise Untranslatable(f"{site.rule.torch} without a weight")
    out = [arg(x), arg(w)]
    strides = _conv_sizes(site, "stride", n)
    out.append(arg(expr(strides or _seq(["1"] * n)), "window_strides"))
    padding = _conv_padding(site, n)
    out.append(arg(expr(padding or _seq(["(0, 0)"] * n)), "padding"))
    dilation = _conv_sizes(site, "dilation", n)
    if dilation is not None:
        out.append(arg(expr(dilation), "rhs_dilation"))
    groups = site.get("groups")
    if groups is not None and site.lit("groups") != 1:
        if site.lit("groups") is not ... and not isinstance(site.lit("groups"), int):
            raise Untranslatable(f"{site.rule.torch} groups={code(groups)}")
        out.append(arg(groups, "feature_group_count"))
    out.append(arg(expr(_CONV_DIMS[n]), "dimension_numbers"))
    y = call("jax.lax.conv_general_dilated", *out)
    b = site.get("bias")
    if b is None or site.lit("bias") is None:
        return y
    index = "[:, " + ", ".join(["None"] * n) + "]"
    if (isinstance(b, cst.Subscript) and len(b.slice) == 1 and isinstance(
            b.slice[0].slice, cst.Index) and isinstance(b.slice[0].slice.value, cst.Ellipsis)):
        b = b.value  # self.bias[...] (an nnx.Param's array): indexing the Param reads it too
    if "bias" in site.optional:  # self.bias of a class that sets it to None without one
        return expr("{y} + ({b}" + index + " if {b} is not None else 0.0)", y=y, b=b)
    return expr("{y} + {b}" + index, y=y, b=b)


def _literal_sizes(site: Site, name: str, n: int) -> tuple[int, ...]:
    value = site.lit(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise Untranslatable(f"{site.rule.torch} with a non-literal {name}: the padding of the "
                         "dilated input is computed from it")


@special("conv_transpose_function")
def conv_transpose_function(site: Site) -> cst.BaseExpression:
    """``F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation)``:
    ``jax.lax.conv_transpose`` with ``transpose_kernel=True`` on torch's (in, out, *k) weight
    (read as "OI..." and swapped back by lax), padding the stride-dilated input by
    ``(d*(k-1) - p, d*(k-1) - p + output_padding)`` per axis (k from the weight's shape)."""
    n = spatial_dims(site.rule.torch)
    x = site.x()
    w = site.get("weight")
    if w is None:
        raise Untranslatable(f"{site.rule.torch} without a weight")
    if site.lit("groups") != 1:
        raise Untranslatable(f"{site.rule.torch} with groups: jax.lax.conv_transpose has no "
                             "feature groups")
    w = site.once(w, "kernel", f"{site.rule.torch}'s weight (the padding reads its shape)")
    p, op, d = (_literal_sizes(site, k, n) for k in ("padding", "output_padding", "dilation"))
    wt = code(w)
    pads = []
    def plus(base: str, c: int) -> str:
        return base if c == 0 else f"{base} + {c}" if c > 0 else f"{base} - {-c}"

    for i in range(n):
        k = f"{wt}.shape[{2 + i}]"
        if d[i] == 1:  # k - 1 - p, k - 1 - p + output_padding
            pads.append(f"({plus(k, -1 - p[i])}, {plus(k, -1 - p[i] + op[i])})")
        else:
            base = f"{d[i]} * ({k} - 1)"
            pads.append(f"({plus(base, -p[i])}, {plus(base, op[i] - p[i])})")
    out = [arg(x), arg(w), arg(expr(_conv_sizes(site, "stride", n) or _seq(["1"] * n)),
                               "strides"), arg(expr(_seq(pads)), "padding")]
    if any(v != 1 for v in d):
        out.append(arg(expr(_seq([str(v) for v in d])), "rhs_dilation"))
    out += [arg(expr(_CONV_DIMS[n]), "dimension_numbers"), arg(py(True), "transpose_kernel")]
    y = call("jax.lax.conv_transpose", *out)
    b = site.get("bias")
    if b is None or site.lit("bias") is None:
        return y
    index = "[:, " + ", ".join(["None"] * n) + "]"
    if "bias" in site.optional:
        return expr("{y} + ({b}" + index + " if {b} is not None else 0.0)", y=y, b=b)
    return expr("{y} + {b}" + index, y=y, b=b)


# --------------------------------------------------------------------------------------------
# Upsample / F.interpolate
# --------------------------------------------------------------------------------------------

_MODES = ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact")


def _resize(site: Site, x: str, channels_last: bool = False, per_example: bool = False,
            mode: str | None = None) -> str:
    """The JAX expression resizing ``x`` (an (N, C, *spatial) array named by ``x``, or
    (N, *spatial, C) with ``channels_last``, or one example's (C, *spatial) with
    ``per_example``) as torch's ``F.interpolate`` does with the site's size / scale_factor /
    mode (or ``mode``) / align_corners."""
    first = 1 if channels_last or per_example else 2  # the first spatial axis
    spatial = f"{x}.shape[1:-1]" if channels_last else f"{x}.shape[{first}:]"
    axes = f"tuple(range(1, {x}.ndim - 1))" if channels_last else \
        f"tuple(range({first}, {x}.ndim))"

    def shape_of(sizes: str) -> str:  # the output shape around its spatial sizes
        if channels_last:
            return f"({x}.shape[0], {sizes}, {x}.shape[-1])"
        if per_example:
            return f"({x}.shape[0], {sizes})"
        return f"(*{x}.shape[:2], {sizes})"

    mode = site.lit("mode") if mode is None else mode
    mode = "nearest" if mode is None else mode
    if mode is ...:
        raise Untranslatable("interpolate with a non-literal mode")
    if mode == "bicubic" and (channels_last or per_example):
        raise Untranslatable("interpolate mode='bicubic' in a channels-last or per-example "
                             "layout")
    if mode not in ("nearest", "nearest-exact", "linear", "bilinear", "trilinear", "bicubic"):
        raise Untranslatable(f"interpolate mode={mode!r}: adaptive average pooling is not "
                             "translated")
    if site.lit("antialias") not in (False, None):
        raise Untranslatable("interpolate with antialias=True")
    if site.lit("recompute_scale_factor") not in (False, None):
        raise Untranslatable("interpolate with recompute_scale_factor=True")
    linear = mode in ("linear", "bilinear", "trilinear")
    align = site.lit("align_corners")
    if align is ...:
        raise Untranslatable("interpolate with a non-literal align_corners")
    if align and not linear and mode != "bicubic":
        raise Untranslatable(f"align_corners=True with mode={mode!r} (torch raises)")
    size, factor = site.get("size"), site.get("scale_factor")
    if (size is None or site.lit("size") is None) == (factor is None
                                                      or site.lit("scale_factor") is None):
        raise Untranslatable("interpolate needs exactly one of size and scale_factor")
    # the output's spatial sizes: a list (one per axis), or per input axis `d` (any rank)
    sizes: list[str] | None = None
    per_axis = None
    scales: list[float] | None = None  # torch's 1/scale_factor source scale, per axis
    if size is not None and site.lit("size") is not None:
        value = site.lit("size")
        if isinstance(value, int):
            per_axis = str(value)
        elif value is ... and "size" in site.scalars:  # a number held by a name (SAM's
            per_axis = code(size)  # size=max_rel_dist, an int(...)): every axis' size
        elif isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            sizes = [str(v) for v in value]
        else:  # a computed sequence of sizes (size=x.shape[-2:])
            sizes = [f"{code(size)}[{i}]" for i in range(2)]
            if mode != "nearest":
                sizes = None
        given = "size"
    else:
        f = site.lit("scale_factor")
        if isinstance(f, (int, float)) and not isinstance(f, bool):
            per_axis = _out_size("d", f)
            fs = [f]
        elif isinstance(f, (tuple, list)) and all(isinstance(v, (int, float)) for v in f):
            sizes = [_out_size(f"{x}.shape[{first + i}]", v) for i, v in enumerate(f)]
            fs = list(f)
        elif linear and not align and isinstance(factor, (cst.Name, cst.Attribute)):
            # a factor held by a name (timm's coat: scale_factor=scale_factor, a float
            # parameter): torch's output size floor(d * f), mapped with f itself (below)
            per_axis, fs = f"int(d * {code(factor)})", None
        elif mode == "nearest" and isinstance(factor, (cst.Name, cst.Attribute)):
            # nearest by a factor held by a name (timm's cpubone: nn.Upsample(scale_factor=
            # att_stride)): torch's sizes floor(d * f), its source index floor(dst / f)
            f = code(factor)
            return _nearest_take(x, [f"int({x}.shape[{first + i}] * {f})" for i in range(2)],
                                 [f] * 2, first)
        else:
            raise Untranslatable("interpolate with a non-literal scale_factor")
        given = "name" if fs is None else "int" if all(
            float(v).is_integer() for v in fs) else "float"
        scales = None if fs is None else [float(v) for v in fs]
    if sizes is not None:
        shape = shape_of(", ".join(sizes))
    elif per_axis is not None:
        shape = shape_of(f"*({per_axis} for d in {spatial})")
    else:
        shape = shape_of(f"*{code(size)}")
    if mode == "bicubic":  # the resize_bicubic helper (passes/helpers.py): torch's a=-0.75
        factors = "" if scales is None or given == "size" else (
            f", scales=({', '.join(repr(v) for v in scales)})" if len(scales) > 1 else
            f", scales=({scales[0]!r},) * ({x}.ndim - 2)")
        return f"resize_bicubic({x}, {shape}, align_corners={bool(align)}{factors})"
    if linear and align:
        if sizes is not None:
            scale = ", ".join(f"({o} - 1) / ({x}.shape[{first + i}] - 1)" for i, o in
                              enumerate(sizes))
            scale = f"jnp.array([{scale}])"
        elif per_axis is not None:
            scale = f"jnp.array([({per_axis} - 1) / (d - 1) for d in {spatial}])"
        else:
            scale = f"jnp.array([(o - 1) / (i - 1) for o, i in zip({code(size)}, {spatial})])"
        return (f"jax.image.scale_and_translate({x}, {shape}, {axes}, "
                f"{scale}, 0.5 * (1 - {scale}), method='linear', antialias=False)")
    if given in ("size", "int") and (linear or mode == "nearest-exact" or given == "int"):
        # torch's source scale is jax.image's in/out ratio here
        if linear:
            return f"jax.image.resize({x}, {shape}, method='linear', antialias=False)"
        return f"jax.image.resize({x}, {shape}, method='nearest')"
    if mode == "nearest-exact":
        raise Untranslatable("nearest-exact with a non-integer scale_factor")
    if linear:  # torch maps with the given factor, not with the rounded in/out ratio
        n_spatial = f"{x}.ndim - {1 if per_example else 2}"
        scale = (f"jnp.full({n_spatial}, {code(factor)})" if scales is None else
                 f"jnp.full({n_spatial}, {scales[0]!r})" if len(scales) == 1 else
                 "jnp.array([" + ", ".join(repr(v) for v in scales) + "])")
        return (f"jax.image.scale_and_translate({x}, {shape}, {axes}, "
                f"{scale}, jnp.zeros({n_spatial}), method='linear', antialias=False)")
    # legacy nearest: two spatial axes (a scalar factor or size is read as 2-D)
    if scales is not None and len(scales) == 1:
        scales = scales * 2
    if sizes is None:
        sizes = ([_out_size(f"{x}.shape[{first + i}]", v) for i, v in enumerate(scales)]
                 if scales else [str(per_axis)] * 2)
    return _nearest_take(x, sizes, scales, first)


def _out_size(d: str, f: float) -> str:
    if float(f).is_integer():
        return f"{d} * {int(f)}"
    return f"int({d} * {f!r})"


def _nearest_take(x: str, sizes: list[str], factors: list[float | str] | None,
                  first: int) -> str:
    """torch's legacy nearest: source index ``floor(dst * scale)`` in float32, with scale
    ``in / out`` (size given) or ``1 / scale_factor`` (a number, or the name holding it),
    one ``jnp.take`` per spatial axis."""
    out = x
    for i, size in enumerate(sizes):
        axis = first + i
        scale = f"({x}.shape[{axis}] / {size})" if factors is None else (
            f"(1 / {factors[i]})" if isinstance(factors[i], str) else repr(1 / factors[i]))
        out = (f"jnp.take({out}, (jnp.arange({size}) * {scale}).astype(jnp.int32), "
               f"axis={axis})")
    return out


@special("upsample")
def upsample(site: Site) -> cst.BaseExpression:
    # channels-last, like the convolutions it sits between (not for the equinox target,
    # whose layers are channel-first: see convert.py)
    # (one example's (C, *spatial) for the equinox target: Site.per_example)
    return expr("lambda x: " + _resize(site, "x", site.rule.layout == "channels_last",
                                       site.per_example))


@special("interpolate")
def interpolate(site: Site) -> cst.BaseExpression:
    x = site.once(site.x(), "resized", "F.interpolate's input")
    if site.lit("mode") is ... and "mode" in site.choices:
        return expr(_resize_chosen(site, code(x), site.choices["mode"]))
    return expr(_resize(site, code(x)))


def _resize_chosen(site: Site, x: str, modes: tuple) -> str:
    """``F.interpolate(x, ..., mode=self.mode)`` with ``self.mode`` one of ``modes`` (what the
    file shows: analysis/value_choices.py): the method picked at run time, the mode being a
    Python string (static under jit), one branch per translation; an assert before the
    statement stops the program for a mode the file does not show (another file may pass
    one)."""
    mode = site.get("mode")
    if not is_simple(mode) or site.before is None or not all(isinstance(m, str) for m in modes):
        raise Untranslatable("interpolate with a non-literal mode")
    branches: dict[str, list[str]] = {}  # translation -> the modes it serves
    for m in modes:
        try:
            branches.setdefault(_resize(site, x, mode=m), []).append(m)
        except Untranslatable as e:
            raise Untranslatable(f"interpolate with mode={code(mode)}, which may be {m!r}: "
                                 f"{e}") from None
    def test(ms: list[str]) -> str:
        return f"{code(mode)} == {ms[0]!r}" if len(ms) == 1 else \
            f"{code(mode)} in ({', '.join(map(repr, ms))})"

    *first, (last, _) = branches.items()
    out = "".join(f"{text} if {test(ms)} else " for text, ms in first) + last
    listed = ", ".join(map(repr, modes)) + ("," if len(modes) == 1 else "")
    site.before(cst.parse_statement(
        f"assert {code(mode)} in ({listed}), \"F.interpolate's mode is "
        f"translated for {', '.join(modes)} (the modes this file shows)\"\n"))
    return out if len(branches) == 1 else f"({out})"



# --------------------------------------------------------------------------------------------
# TorchScript / tracing queries
# --------------------------------------------------------------------------------------------


@special("false")
def false(site: Site) -> cst.BaseExpression:
    """``torch.jit.is_scripting()`` and the like: JAX code is never TorchScript."""
    return expr("False")


@special("tracing")
def tracing(site: Site) -> cst.BaseExpression:
    """``torch.jit.is_tracing()``: the converted code is never recorded by torch.jit.trace (the
    ``if``s it heads that memoize on self keep their traced path: passes/tracing_branches.py)."""
    return expr("False")


@special("jit_annotate")
def jit_annotate(site: Site) -> cst.BaseExpression:
    """``torch.jit.annotate(T, value)`` only types ``value`` for TorchScript."""
    value = site.get("the_value")
    if value is None:
        raise Untranslatable("torch.jit.annotate without a value")
    return value


@special("random_fill")
def random_fill(site: Site) -> cst.BaseExpression:
    """``noise.bernoulli_(p)``: an in-place draw from torch's global generator (stochastic
    depth's row mask). JAX draws need a key that this call site does not have."""
    raise Untranslatable(
        f"x.{site.rule.torch}(...) fills x in place from torch's global random generator: "
        f"draw it with {site.rule.jax}(key, ...) from an explicit key (an nnx.Rngs stream of "
        "the module that calls this)")


# --------------------------------------------------------------------------------------------
# Padding layers (ReflectionPad2d, ReplicationPad1d, ZeroPad2d, ConstantPad3d, ...)
# --------------------------------------------------------------------------------------------

_PAD_MODES = {"Reflection": "reflect", "Replication": "edge", "Circular": "wrap"}


@special("pad_module")
def pad_module(site: Site) -> cst.BaseExpression:
    """``nn.ReflectionPad2d(p)``: a function padding the last n axes as torch's layer does
    (torch's spatial axes, so it holds for a batch and for one example alike)."""
    n = spatial_dims(site.rule.torch)
    short = site.rule.torch.rsplit(".", 1)[1]
    mode = next((v for k, v in _PAD_MODES.items() if short.startswith(k)), "constant")
    node = site.get("padding")
    if node is None:
        raise Untranslatable(f"{site.rule.torch} without its padding")
    pads = try_literal(node, ...)
    head = "lambda x: "
    if isinstance(pads, int):
        width = f"[(0, 0)] * (x.ndim - {n}) + [{', '.join([f'({pads}, {pads})'] * n)}]"
    elif isinstance(pads, (tuple, list)) and pads and len(pads) % 2 == 0 and all(
            isinstance(p, int) for p in pads):
        # torch hands a tuple to F.pad as it is: the last len // 2 axes
        pairs = [(pads[i], pads[i + 1]) for i in range(0, len(pads), 2)][::-1]
        width = (f"[(0, 0)] * (x.ndim - {len(pairs)}) + "
                 f"[{', '.join(f'({a}, {b})' for a, b in pairs)}]")
    elif is_simple(node):
        # a padding held in a name: an int or torch's (before, after) pairs, read where it runs
        p = code(node)
        width = (f"[(0, 0)] * (x.ndim - {n}) + ([({p}, {p})] * {n} if isinstance({p}, int) "
                 f"else list(zip({p}[-2::-2], {p}[::-2])))")
    elif isinstance(node, (cst.Tuple, cst.List)) and node.elements and len(
            node.elements) % 2 == 0 and all(isinstance(e, cst.Element) for e in node.elements):
        # nn.ConstantPad1d((pad_beg, pad_end), 0) (CANINE): torch's pairs, computed where the
        # layer is built, bound there as the lambda's default (the layer keeps them)
        k = len(node.elements) // 2
        pairs = ", ".join(f"(widths[{2 * i}], widths[{2 * i + 1}])" for i in reversed(range(k)))
        width = f"[(0, 0)] * (x.ndim - {k}) + [{pairs}]"
        head = f"lambda x, widths=({', '.join(code(e.value) for e in node.elements)}): "
    else:
        raise Untranslatable(f"{site.rule.torch} with a computed padding")
    if isinstance(pads, (tuple, list)) and any(isinstance(p, int) and p < 0 for p in pads) or (
            isinstance(pads, int) and pads < 0):
        raise Untranslatable(f"{site.rule.torch} with negative (cropping) padding")
    kws = f", mode={mode!r}" if mode != "constant" else ""
    value = site.get("value")
    if value is not None and try_literal(value, ...) not in (0, 0.0):
        kws += f", constant_values={code(value)}"
    return expr(f"{head}jnp.pad(x, {width}{kws})")
