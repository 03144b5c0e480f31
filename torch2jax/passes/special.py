"""Named transforms for the rules that are not plain renames.

A rule in ``rules/*.toml`` names one of these with ``special = "name"``. Each takes a
:class:`Site` (the bound torch arguments, the receiver for methods, the rule) and returns the
JAX expression, or raises :class:`Untranslatable` with the reason.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.ceil_pool import ceil_pool
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    call,
    code,
    expr,
    int_value,
    is_simple,
    py,
    try_literal,
)
from torch2jax.passes.registry import Site, pool_window, spatial_dims, special, tuple_of


def _pairs(node: cst.BaseExpression, n: int) -> cst.BaseExpression:
    """torch's symmetric int padding -> flax's ((lo, hi),) per spatial dim."""
    value = try_literal(node, ...)
    if isinstance(value, int):
        return expr("(" + ", ".join([f"({value}, {value})"] * n) + ("," if n == 1 else "") + ")")
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return expr("(" + ", ".join(f"({v}, {v})" for v in value) + ("," if n == 1 else "") + ")")
    text = code(node)
    if isinstance(node, (cst.Tuple, cst.List)):
        return expr("(" + ", ".join(f"({code(e.value)}, {code(e.value)})" for e in node.elements)
                    + ("," if n == 1 else "") + ")")
    return expr("(" + ", ".join([f"({text}, {text})"] * n) + ("," if n == 1 else "") + ")")


# --------------------------------------------------------------------------------------------
# Layers (built in __init__)
# --------------------------------------------------------------------------------------------


# the arguments of the Conv{n}d helper class (passes/helpers.py): torch's, without padding_mode
_CONV_HELPER_ARGS = ("in_channels", "out_channels", "kernel_size", "stride", "padding",
                     "dilation", "groups", "bias")


@special("conv")
def conv(site: Site) -> cst.BaseExpression:
    n = spatial_dims(site.rule.torch)
    a = site.args
    if a.star and site.renders.helper_classes and site.rngs is not None:
        # nn.Conv2d(cin, cout, bias=False, **kwargs) (torchvision's BasicConv2d): the callers'
        # keywords are torch's, unknown here; the Conv2d helper class takes them as they are
        # (and torch's layout: Layouts.of says so)
        extra = [k for k in a.named if k not in _CONV_HELPER_ARGS and not (
            k == "padding_mode" and site.lit(k) == "zeros") and k not in site.rule.drop]
        if extra or a.extra_positional:
            raise Untranslatable(f"{site.rule.torch}(..., **kwargs) with "
                                 f"{', '.join(extra) or 'extra positional arguments'}")
        args = [arg(a.get(k), k if k in a.keywords else None) for k in _CONV_HELPER_ARGS
                if a.has(k)]
        return call(f"Conv{n}d", *args, *a.star, *site.rngs_arg())
    for required in ("in_channels", "out_channels", "kernel_size"):
        if not a.has(required):
            raise Untranslatable(f"{site.rule.torch} without {required}")
    mode = site.lit("padding_mode")
    wrapped = None if mode in ("zeros", None) else _wrapped_padding(site, mode, n)
    def sizes(name: str) -> cst.BaseExpression:  # a tuple already, or (k, k)
        node = a.get(name)
        return node if name in site.sequences else tuple_of(node, n)

    out = [arg(a.get("in_channels")), arg(a.get("out_channels")),
           arg(sizes("kernel_size"), "kernel_size")]
    stride = site.lit("stride")
    if stride != 1:
        out.append(arg(sizes("stride"), "strides"))
    padding = site.get("padding")
    pad_value = site.lit("padding")
    if wrapped is not None:
        out.append(arg(py(wrapped), "padding"))
    elif isinstance(pad_value, str):
        if pad_value not in ("same", "valid"):
            raise Untranslatable(f"unknown padding {pad_value!r}")
        out.append(arg(py(pad_value.upper()), "padding"))
    elif padding is not None and "padding" in site.sequences and not isinstance(
            padding, (cst.Tuple, cst.List)):  # a name bound to a tuple: one pair per entry
        out.append(arg(expr("tuple((p, p) for p in {x})", x=padding), "padding"))
    else:
        out.append(arg(_pairs(padding if padding is not None else py(0), n), "padding"))
    if site.lit("dilation") != 1:
        out.append(arg(sizes("dilation"), "kernel_dilation"))
    if site.lit("groups") != 1:
        out.append(arg(a.get("groups"), "feature_group_count"))
    if site.lit("bias") is not True:
        out.append(arg(a.get("bias"), "use_bias"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


def _wrapped_padding(site: Site, mode: object, n: int) -> str:
    """torch's ``padding_mode='circular'`` / ``'reflect'`` as flax's ``'CIRCULAR'`` /
    ``'REFLECT'``, which pad ``((kd - 1) // 2, kd // 2)`` per axis (kd the dilated kernel's
    size) before a valid convolution: torch's when its padding is half of ``kd - 1`` on each
    side, or 'same'."""
    flax_mode = {"circular": "CIRCULAR", "reflect": "REFLECT"}.get(mode)  # type: ignore[arg-type]
    sizes = {}
    for name in ("kernel_size", "padding", "dilation"):
        v = site.lit(name)
        sizes[name] = (v,) * n if isinstance(v, int) and not isinstance(v, bool) else v
    k, p, d = sizes["kernel_size"], sizes["padding"], sizes["dilation"]
    if flax_mode is not None and isinstance(k, tuple) and isinstance(d, tuple) and (
            p == "same" or isinstance(p, tuple) and all(
                2 * pi == di * (ki - 1) for ki, pi, di in zip(k, p, d))):
        return flax_mode
    raise Untranslatable(
        f"padding_mode={mode!r}: flax convolutions pad only with zeros, or 'CIRCULAR' / "
        "'REFLECT' by half the kernel on each side; pad with jnp.pad (mode 'reflect'/"
        "'edge'/'wrap') and use padding='VALID'")


@special("batch_norm")
def batch_norm(site: Site) -> cst.BaseExpression:
    a = site.args
    out = [arg(a.get("num_features"))]
    if site.rule.torch.endswith("BatchNorm1d"):
        out.append(arg(py(1), "axis"))
    momentum = site.lit("momentum")
    if momentum is None:
        raise Untranslatable("BatchNorm momentum=None (cumulative moving average) has no flax equivalent")
    if momentum is ...:
        out.append(arg(expr("1 - {m}", m=a.get("momentum")), "momentum"))
    else:
        out.append(arg(py(round(1 - momentum, 12)), "momentum"))
    eps = a.get("eps")
    out.append(arg(eps if eps is not None else py(1e-5), "epsilon"))
    affine = site.lit("affine")
    if affine is not True:
        out.append(arg(a.get("affine"), "use_scale"))
        out.append(arg(a.get("affine"), "use_bias"))
    if site.lit("track_running_stats") is False:
        out.append(arg(py(False), "use_running_average"))
        site.note("track_running_stats=False: the calls of this layer pass "
                  "use_running_average=False, so model.eval() keeps batch statistics like torch")
        # no running statistics to keep: the library layer as it is
        return call(site.rule.targets[site.target], *out, *site.rngs_arg())
    # the BatchNorm helper (passes/helpers.py): torch's unbiased running variance
    return call(batch_norm_helper(site.defined), *out, *site.rngs_arg())


def batch_norm_helper(defined: set[str]) -> str:
    """The name of the BatchNorm helper class; Untranslatable when the file binds that name
    itself (the helper would not be written in, and the calls would reach the file's own)."""
    if "BatchNorm" in defined:
        raise Untranslatable("the file defines its own BatchNorm: rename it, the converted "
                             "file needs that name for the BatchNorm helper class (torch's "
                             "running statistics)")
    return "BatchNorm"


def _normalized_shape(site: Site, what: str) -> list[cst.Arg]:
    """torch's normalized_shape -> flax's feature count, and the axes for several of them."""
    shape = site.args.get("normalized_shape")
    value = site.lit("normalized_shape")
    out: list[cst.Arg] = []
    if isinstance(value, (tuple, list)) and len(value) > 1:
        k = len(value)
        size = " * ".join(str(v) for v in value)
        out.append(arg(expr(size)))
        axes = "(" + ", ".join(str(i) for i in range(-k, 0)) + ")"
        out.append(arg(expr(axes), "reduction_axes"))
        out.append(arg(expr(axes), "feature_axes"))
        site.note(f"{what} over the last {k} axes: the {'scale/bias' if what == 'LayerNorm' else 'scale'} "
                  f"of shape {tuple(value)} are stored flattened", "info")
    elif isinstance(value, (tuple, list)):
        out.append(arg(py(value[0])))
    elif isinstance(shape, (cst.Tuple, cst.List)) and len(shape.elements) == 1:
        out.append(arg(shape.elements[0].value))
    elif isinstance(shape, (cst.Tuple, cst.List)):
        raise Untranslatable(f"{what} over several axes with non-literal sizes")
    else:
        out.append(arg(shape))
    return out


@special("layer_norm")
def layer_norm(site: Site) -> cst.BaseExpression:
    a = site.args
    out = _normalized_shape(site, "LayerNorm")
    eps = a.get("eps")
    out.append(arg(eps if eps is not None else py(1e-5), "epsilon"))
    if site.lit("elementwise_affine") is not True:
        out.append(arg(a.get("elementwise_affine"), "use_scale"))
        out.append(arg(a.get("elementwise_affine"), "use_bias"))
    elif site.lit("bias") is not True:
        out.append(arg(a.get("bias"), "use_bias"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


@special("rms_norm")
def rms_norm(site: Site) -> cst.BaseExpression:
    """torch.nn.RMSNorm -> nnx.RMSNorm. torch's eps=None is the machine epsilon of the input's
    dtype, taken at each call; flax's default is 1e-6 (equinox's 1e-5): the float32 one is
    written out, and a note says so."""
    a = site.args
    out = _normalized_shape(site, "RMSNorm")
    eps = a.get("eps")
    if site.lit("eps") is None:
        eps = expr("float(jnp.finfo(jnp.float32).eps)")
        site.note("RMSNorm eps=None: torch takes the machine epsilon of the input's dtype at "
                  "each call; written as float32's, jnp.finfo(jnp.float32).eps (for inputs of "
                  "another dtype, write that dtype's)", "info")
    out.append(arg(eps, "epsilon"))
    if site.lit("elementwise_affine") is not True:
        out.append(arg(a.get("elementwise_affine"), "use_scale"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


@special("group_norm")
def group_norm(site: Site) -> cst.BaseExpression:
    a = site.args
    out = [arg(a.get("num_channels")), arg(a.get("num_groups"), "num_groups")]
    eps = a.get("eps")
    out.append(arg(eps if eps is not None else py(1e-5), "epsilon"))
    if site.lit("affine") is not True:
        out.append(arg(a.get("affine"), "use_scale"))
        out.append(arg(a.get("affine"), "use_bias"))
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


@special("embedding")
def embedding(site: Site) -> cst.BaseExpression:
    if site.lit("max_norm") is not None:
        raise Untranslatable("Embedding max_norm: lookups are renormalised in place in torch")
    a = site.args
    if site.lit("padding_idx") is not None:
        # the Embedding helper (passes/helpers.py): the row zeroed, its gradient masked
        if not site.renders.helper_classes:
            raise Untranslatable("Embedding padding_idx: flax has no zeroed, gradient-masked "
                                 "row (the Embedding helper class is NNX only)")
        if "Embedding" in site.defined:
            raise Untranslatable("the file defines its own Embedding: rename it, the converted "
                                 "file needs that name for the Embedding helper class "
                                 "(padding_idx)")
        return call("Embedding", arg(a.get("num_embeddings")), arg(a.get("embedding_dim")),
                    arg(a.get("padding_idx"), "padding_idx"), *site.rngs_arg())
    return call(site.rule.targets[site.target], arg(a.get("num_embeddings")),
                arg(a.get("embedding_dim")), *site.rngs_arg())


@special("embedding_bag")
def embedding_bag(site: Site) -> cst.BaseExpression:
    """``nn.EmbeddingBag(num, dim, mode=..., ...)`` -> the EmbeddingBag helper class
    (passes/helpers.py): an nnx.Embed whose call reduces each bag with jax.ops.segment_*."""
    if not site.renders.helper_classes:
        raise Untranslatable("EmbeddingBag: translated for the NNX target only (the "
                             "EmbeddingBag helper class)")
    for name, why in (("max_norm", "lookups are renormalised in place in torch"),
                      ("scale_grad_by_freq", "gradients scaled by each id's frequency")):
        if site.lit(name) not in (False, None):
            raise Untranslatable(f"EmbeddingBag {name}: {why}")
    mode = site.lit("mode")
    if mode is not ... and mode not in ("mean", "sum", "max"):  # (a name: checked at run time)
        raise Untranslatable(f"EmbeddingBag mode={mode!r}: not 'sum', 'mean' or 'max'")
    if "EmbeddingBag" in site.defined:
        raise Untranslatable("the file defines its own EmbeddingBag: rename it, the converted "
                             "file needs that name for the EmbeddingBag helper class")
    a = site.args
    out = [arg(a.get("num_embeddings")), arg(a.get("embedding_dim"))]
    for name in ("mode", "include_last_offset", "padding_idx"):
        if a.has(name):
            out.append(arg(a.get(name), name))
    return call("EmbeddingBag", *out, *site.rngs_arg())


@special("dropout")
def dropout(site: Site) -> cst.BaseExpression:
    p = site.args.get("p")
    return call(site.rule.targets[site.target], arg(p if p is not None else py(0.5)),
                *site.rngs_arg())


@special("identity")
def identity(site: Site) -> cst.BaseExpression:
    return expr("lambda x: x")


@special("flatten_module")
def flatten_module(site: Site) -> cst.BaseExpression:
    start, end = site.lit("start_dim"), site.lit("end_dim")
    if start is ... or end is ...:
        raise Untranslatable("nn.Flatten with non-literal dims")
    if site.per_example and start == 1 and end == -1:  # (the equinox pass: one example)
        return expr("lambda x: x.reshape(-1)")
    return expr("lambda x: " + _flatten_text("x", start, end))


def _flatten_text(x: str, start: int, end: int) -> str:
    if end != -1:
        return f"jax.lax.collapse({x}, {start}, {end + 1 if end >= 0 else f'{x}.ndim + {end + 1}'})"
    if start == 0:
        return f"{x}.reshape(-1)"
    if start == 1:
        return f"{x}.reshape({x}.shape[0], -1)"
    return f"{x}.reshape(*{x}.shape[:{start}], -1)"


@special("gelu_module")
def gelu_module(site: Site) -> cst.BaseExpression:
    approx = site.lit("approximate")
    if approx not in ("none", "tanh"):
        raise Untranslatable(f"GELU approximate={approx!r}")
    return expr(f"partial(jax.nn.gelu, approximate={approx == 'tanh'})")


@special("activation_with_args")
def activation_with_args(site: Site) -> cst.BaseExpression:
    target = site.rule.targets[site.target]
    extra = [(site.rule.rename.get(k, k), v) for k, v in site.args.named.items()
             if k in site.rule.params and k not in site.rule.drop]
    if not extra:
        return expr(target)
    return call("partial", arg(expr(target)), *[arg(v, k) for k, v in extra])


@special("softmax_module")
def softmax_module(site: Site) -> cst.BaseExpression:
    dim = site.args.get("dim")
    if dim is None or site.lit("dim") is None:
        raise Untranslatable("Softmax without dim (torch's implicit, deprecated choice of axis)")
    return call("partial", arg(expr(site.rule.targets[site.target])), arg(dim, "axis"))


def _check_pool(site: Site) -> None:
    if site.lit("dilation") not in (1, None):
        raise Untranslatable("max pooling with dilation")
    if site.lit("return_indices") not in (False, None):
        raise Untranslatable("max pooling with return_indices=True")
    if site.lit("divisor_override") is not None:
        raise Untranslatable("avg pooling with divisor_override")


@special("pool")
def pool(site: Site) -> cst.BaseExpression:
    n = spatial_dims(site.rule.torch)
    _check_pool(site)
    k = site.args.get("kernel_size")
    stride = site.args.get("stride")
    if stride is None or site.lit("stride") is None:
        stride = k  # torch: stride defaults to the kernel size, flax's to 1
    ceil_mode = site.lit("ceil_mode")
    if ceil_mode not in (False, None):
        if ceil_mode is not True:
            raise Untranslatable("pooling with a non-literal ceil_mode")
        return expr("lambda x: " + ceil_pool(site, n, k, stride, "x", 1))
    out = [arg(expr(site.rule.targets[site.target])), *pool_window(site, k, stride, n)]
    if site.lit("padding") not in (0, None) and "padding" not in site.sequences:
        out.append(arg(_pairs(site.args.get("padding"), n), "padding"))
    if site.lit("count_include_pad") is False:
        out.append(arg(py(False), "count_include_pad"))
    return call("partial", *out)


@special("pool_function")
def pool_function(site: Site) -> cst.BaseExpression:
    """``F.max_pool2d(x, 3, stride=2)`` / ``F.avg_pool2d`` on torch's channels-first input:
    flax's pooling (channels-last) between two moves of the channel axis, the arguments as
    nn.MaxPool2d / nn.AvgPool2d translate them (stride defaults to the kernel size; ceil_mode
    pads the last window's overhang, computed from the static shape of the input)."""
    n = spatial_dims(site.rule.torch)
    _check_pool(site)
    x = site.x()
    k = site.get("kernel_size")
    if k is None:
        raise Untranslatable(f"{site.rule.torch} without kernel_size")
    stride = site.get("stride")
    if stride is None or site.lit("stride") is None:
        stride = k
    # a value just moved back from channels-last is pooled as it was
    moved = (isinstance(x, cst.Call) and code(x.func) == "jnp.moveaxis" and len(x.args) == 3
             and [code(a.value) for a in x.args[1:]] == ["-1", "1"])
    cl = x.args[0].value if moved else expr("jnp.moveaxis({x}, 1, -1)", x=x)
    target = site.renders.flax_function(site.rule.jax)
    ceil_mode = site.lit("ceil_mode")
    if ceil_mode not in (False, None):
        if ceil_mode is not True:
            raise Untranslatable("pooling with a non-literal ceil_mode")
        if not is_simple(x):  # the padding is computed from its shape
            x = site.once(x, "pooled_input", "ceil_mode pooling's input")
            cl = expr("jnp.moveaxis({x}, 1, -1)", x=x)
        pooled = expr(ceil_pool(site, n, k, stride, code(x), 2, source=code(cl),
                                 target=target))
    else:
        out = [arg(cl), arg(tuple_of(k, n), "window_shape"), arg(tuple_of(stride, n), "strides")]
        if site.lit("padding") not in (0, None):
            out.append(arg(_pairs(site.get("padding"), n), "padding"))
        if site.lit("count_include_pad") is False:
            out.append(arg(py(False), "count_include_pad"))
        pooled = call(target, *out)
    return expr("jnp.moveaxis({y}, -1, 1)", y=pooled)


@special("adaptive_avg_pool")
def adaptive_avg_pool(site: Site) -> cst.BaseExpression:
    """``nn.AdaptiveAvgPool2d(s)`` / ``nn.AdaptiveMaxPool2d(s)`` (NCHW): output size 1 is a
    mean (max) over the spatial axes; other sizes call the ``adaptive_avg_pool`` helper
    written into the converted file (torch's overlapping bins, from the static shape)."""
    return expr("lambda x: " + _adaptive_text(site, "x"))


@special("adaptive_pool_function")
def adaptive_pool_function(site: Site) -> cst.BaseExpression:
    # x is read once, as a call's first argument: a compound expression needs no name
    return expr(_adaptive_text(site, code(site.x())))


def _adaptive_text(site: Site, x: str) -> str:
    n = spatial_dims(site.rule.torch)
    kind = "max" if "max" in site.rule.torch.lower() else "avg"
    if site.lit("return_indices") not in (False, None):
        raise Untranslatable("adaptive max pooling with return_indices=True")
    node = site.get("output_size")
    if node is None:
        raise Untranslatable(f"{site.rule.torch} without output_size")
    size = site.lit("output_size")
    if isinstance(size, int) or size is None:
        sizes = (size,) * n
    elif isinstance(size, (tuple, list)) and len(size) == n and all(
            v is None or isinstance(v, int) for v in size):
        sizes = tuple(size)
    else:
        # a computed size: the helper takes it as it is (an int is the same for every axis; a
        # name holding a tuple, vgg's output_size = (max(k, h), max(k, w)), is the tuple)
        sizes_text = code(node) if "output_size" in site.sequences else code(tuple_of(node, n))
        return f"adaptive_{kind}_pool({x}, {sizes_text})"
    if all(s == 1 for s in sizes):
        axes = "(" + ", ".join(str(2 + i) for i in range(n)) + ("," if n == 1 else "") + ")"
        return f"jnp.{'mean' if kind == 'avg' else 'max'}({x}, axis={axes}, keepdims=True)"
    text = "(" + ", ".join(str(s) for s in sizes) + ("," if n == 1 else "") + ")"
    return f"adaptive_{kind}_pool({x}, {text})"


# --------------------------------------------------------------------------------------------
# Functions and tensor methods
# --------------------------------------------------------------------------------------------


def _dim_kw(site: Site, name: str = "dim") -> list[cst.Arg]:
    d = site.args.get(name)
    return [arg(d, "axis")] if d is not None else []


def _sizes(site: Site, first: str = "size") -> cst.BaseExpression:
    """torch's ``f(2, 3)`` / ``f((2, 3))`` / ``f(shape)`` size forms -> one shape expression."""
    first_node = site.args.get(first)
    rest = site.args.extra_positional
    if first_node is None:
        raise Untranslatable(f"{site.rule.torch} without a size")
    if not rest:
        if (isinstance(first_node, (cst.Tuple, cst.List, cst.Name)) or first in site.sequences
                or not _is_int_like(first_node)):
            # a name may hold an int or a sequence of sizes (size = [1] * x.ndim): jnp takes
            # either as it is
            return first_node
        return expr("({a},)", a=first_node)
    items = [first_node, *rest]
    return expr("(" + ", ".join(code(i) for i in items) + ")")


def _is_int_like(node: cst.BaseExpression) -> bool:
    """An int literal or an arithmetic expression / name that could be one dimension."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return False
    if isinstance(node, cst.Attribute) and node.attr.value == "shape":
        return False
    if isinstance(node, cst.Call):
        f = node.func
        if isinstance(f, cst.Attribute) and f.attr.value == "size" and not node.args:
            return False
        if isinstance(f, cst.Name) and f.value in ("tuple", "list"):
            return False  # LayoutLMv3's tuple(list(input_shape) + [4])
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (cst.Add,
                                                                            cst.Multiply)):
        # LiLT's (LayoutLMv3's) input_shape + (4,), (1,) * n: a sequence where a side is one
        return _is_int_like(node.left) and _is_int_like(node.right)
    # x.shape[:-1], x.size()[1:]: a slice of sizes
    return not (isinstance(node, cst.Subscript)
                and any(isinstance(e.slice, cst.Slice) for e in node.slice))


def _dtype_kw(site: Site) -> list[cst.Arg]:
    d = site.args.get("dtype")
    return [arg(d, "dtype")] if d is not None else []


@special("addcmul")
def addcmul(site: Site) -> cst.BaseExpression:
    """torch.addcmul / addcdiv: ``input + value * tensor1 (*|/) tensor2`` (the rule's jax field
    names the operator)."""
    op = site.rule.jax
    value = site.args.get("value")
    parts = {"x": site.x(), "a": site.args.get("tensor1"), "b": site.args.get("tensor2")}
    if parts["a"] is None or parts["b"] is None:
        raise Untranslatable(f"{site.rule.torch}: missing tensor1/tensor2", rule=site.rule.id)
    if value is None:
        return expr("{x} + {a} " + op + " {b}", **parts)
    return expr("{x} + {v} * {a} " + op + " {b}", v=value, **parts)


@special("addmm")
def addmm(site: Site) -> cst.BaseExpression:
    """torch.addmm / baddbmm (and the methods): ``beta * input + alpha * (batch1 @ batch2)``;
    with ``beta=0`` torch leaves input out (its NaN and inf included), a computed beta tested
    (a Python number; a traced one fails loudly under jit)."""
    a, b = site.args.get("batch1"), site.args.get("batch2")
    if a is None or b is None:
        raise Untranslatable(f"{site.rule.torch}: missing the matrices", rule=site.rule.id)
    product = expr("jnp.matmul({a}, {b})", a=a, b=b)
    beta, alpha = site.lit("beta"), site.lit("alpha")
    if site.args.get("alpha") is not None and alpha != 1:
        product = expr("{al} * {p}", al=site.args.get("alpha"), p=product)
    if beta is ...:  # a number the model holds (Bloom's self.beta): 0 leaves input out
        be = site.once(site.args.get("beta"), "beta", "beta")
        return expr("({be} * {x} if {be} != 0 else 0) + {p}", be=be, x=site.x(), p=product)
    if beta == 0:
        return product
    x = site.x()
    if beta not in (None, 1):
        x = expr("{be} * {x}", be=site.args.get("beta"), x=x)
    return expr("{x} + {p}", x=x, p=product)


@special("normalize")
def normalize(site: Site) -> cst.BaseExpression:
    """F.normalize: x over its p-norm along dim, the norm clamped below at eps. For p=2 as
    x / sqrt(max(sum(x * x), eps ** 2)): the same values, and a zero vector (a padded token)
    gets torch's gradient (1 / eps) where the gradient of jnp.linalg.norm at 0 is NaN."""
    x = site.once(site.x(), "normalized", "F.normalize's input")
    p, dim, eps = site.lit("p"), site.args.get("dim") or py(1), site.args.get("eps")
    e = try_literal(eps, ...) if eps is not None else 1e-12
    if p == 2:
        floor = py(e * e) if isinstance(e, (int, float)) else expr("{e} ** 2", e=eps)
        return expr("{x} / jnp.sqrt(jnp.maximum(jnp.sum({x} * {x}, axis={d}, keepdims=True), "
                    "{f}))", x=x, d=dim, f=floor)
    norm = expr("jnp.linalg.norm({x}, ord={p}, axis={d}, keepdims=True)", x=x,
                p=site.args.get("p"), d=dim)
    site.note("F.normalize with p other than 2: the gradient at a zero vector is NaN in JAX "
              "(jnp.linalg.norm), 0 in torch", "warning")
    return expr("{x} / jnp.maximum({n}, {e})", x=x, n=norm, e=eps if eps is not None
                else py(1e-12))


@special("meshgrid")
def meshgrid(site: Site) -> cst.BaseExpression:
    """torch.meshgrid(a, b) / torch.meshgrid([a, b]): torch's indexing defaults to "ij"
    (numpy's and jnp's to "xy"). ``torch.meshgrid(*tensors, indexing="ij")`` (timm's
    ``ndgrid``): the tensors spread into ``jnp.meshgrid`` as they were into torch's."""
    indexing = site.lit("indexing")
    if site.args.star:
        if site.args.get("tensors") is not None or site.args.extra_positional or len(
                site.args.star) != 1 or indexing is ...:
            raise Untranslatable("torch.meshgrid of a spread and other arguments")
        return call("jnp.meshgrid", site.args.star[0], arg(py(indexing or "ij"), "indexing"))
    ops = [site.args.get("tensors"), *site.args.extra_positional]
    # a non-literal indexing (timm's pos_embed_sincos: indexing=grid_indexing) is passed on:
    # torch and jnp take the same strings, "ij" and "xy"
    how = arg(site.get("indexing") if indexing is ... else py(indexing or "ij"), "indexing")
    if len(ops) == 1 and isinstance(ops[0], (cst.List, cst.Tuple)):
        ops = [e.value for e in ops[0].elements]
    elif len(ops) == 1 and "tensors" in site.sequences:
        # torch.meshgrid(t) with t a list of tensors (pos_embed_sincos: t = [torch.arange(s)
        # for s in feat_shape]): spread into jnp.meshgrid
        return call("jnp.meshgrid", cst.Arg(ops[0], star="*"), how)
    elif len(ops) == 1:
        raise Untranslatable("torch.meshgrid of one name: a tensor or a sequence of them")
    return call("jnp.meshgrid", *[arg(o) for o in ops], how)


@special("like")
def like(site: Site) -> cst.BaseExpression:
    extra = []
    if site.rule.torch.endswith("full_like"):
        extra.append(arg(site.args.get("fill_value")))
    return call(site.rule.jax, arg(site.x()), *extra, *_dtype_kw(site))


@special("arange")
def arange(site: Site) -> cst.BaseExpression:
    a = site.args
    pos = [arg(a.get(n)) for n in ("start", "end", "step") if a.get(n) is not None]
    return call("jnp.arange", *pos, *_dtype_kw(site))


@special("reshape")
def reshape(site: Site) -> cst.BaseExpression:
    x = site.x()
    shape_first = site.args.get("shape")
    if shape_first is None:
        raise Untranslatable("reshape/view without a shape")
    value = try_literal(shape_first, ...)
    if not site.args.extra_positional and value is not ... and not isinstance(value, (int, tuple,
                                                                                      list)):
        raise Untranslatable("view(dtype) reinterprets bits; use jax.lax.bitcast_convert_type")
    items = [shape_first, *site.args.extra_positional]
    return call(expr("{x}.reshape", x=x), *[arg(i) for i in items])


@special("flatten")
def flatten(site: Site) -> cst.BaseExpression:
    x = site.x()
    start = site.lit("start_dim")
    end = site.lit("end_dim")
    start = 0 if start is None else start
    end = -1 if end is None else end
    if start is ... or end is ...:
        raise Untranslatable("flatten with non-literal dims")
    if end == -1 and not is_simple(x):
        return expr(f"jax.lax.collapse({{x}}, {start})", x=x)
    x = site.once(x, "flat", "flatten(start, end)'s input")
    return expr(_flatten_text(code(x), start, end))


@special("permute")
def permute(site: Site) -> cst.BaseExpression:
    dims = [site.args.get("dims"), *site.args.extra_positional]
    if dims[0] is None:
        raise Untranslatable("permute without dims")
    return call(expr("{x}.transpose", x=site.x()), *[arg(d) for d in dims])


@special("transpose")
def transpose(site: Site) -> cst.BaseExpression:
    d0, d1 = site.args.get("dim0"), site.args.get("dim1")
    if (d0 is None or d1 is None) and site.receiver is not None:
        # x.transpose() / x.transpose(axes): not torch's (two dims), numpy's, which jax.Array
        # has with the same meaning
        return call(expr("{x}.transpose", x=site.receiver), *[arg(d) for d in (d0, d1) if d])
    return call("jnp.swapaxes", arg(site.x()), arg(d0), arg(d1))


@special("identity_method")
def identity_method(site: Site) -> cst.BaseExpression:
    return site.x()


@special("flip")
def flip(site: Site) -> cst.BaseExpression:
    """``x.flip(0)`` / ``x.flip(0, 1)`` / ``x.flip(dims=[0, 1])`` -> ``jnp.flip(x, axis=...)``
    (jnp.flip takes an int or a tuple, not a list)."""
    dims = [site.args.get("dims"), *site.args.extra_positional]
    if dims[0] is None:
        raise Untranslatable("flip without dims")
    if len(dims) > 1:
        axis: cst.BaseExpression = expr("(" + ", ".join(code(d) for d in dims) + ")")
    elif isinstance(dims[0], cst.List):
        axis = cst.Tuple(elements=dims[0].elements) if len(dims[0].elements) != 1 else \
            expr("({d},)", d=dims[0].elements[0].value)
    elif isinstance(dims[0], (cst.Tuple, cst.Integer, cst.UnaryOperation)):
        axis = dims[0]
    else:
        axis = expr("tuple({d}) if isinstance({d}, list) else {d}", d=dims[0]) \
            if is_simple(dims[0]) else call("tuple", arg(dims[0]))
    return call("jnp.flip", arg(site.x()), arg(axis, "axis"))


def norm_axes(site: Site) -> list[cst.Arg]:
    """A norm's ``dim`` and ``keepdim`` as ``axis=`` / ``keepdims=`` (a list of dims a
    tuple; ``dim=None`` every element)."""
    out = []
    dim = site.get("dim")
    if dim is not None and not (isinstance(dim, cst.Name) and dim.value == "None"):
        if isinstance(dim, cst.List):
            dim = cst.Tuple(elements=dim.elements)
        out.append(arg(dim, "axis"))
    if site.get("keepdim") is not None and site.lit("keepdim") is not False:
        out.append(arg(site.get("keepdim"), "keepdims"))
    return out


@special("tensor_norm")
def tensor_norm(site: Site) -> cst.BaseExpression:
    """``x.norm(p='fro', dim=None, keepdim=False)`` / ``torch.norm``: torch's vector p-norm
    over ``dim`` (all the elements when None; 'fro' is the 2-norm over them), which is
    ``jnp.linalg.vector_norm`` (jnp.linalg.norm reads a 2-tuple of axes as a matrix norm)."""
    p = site.lit("p")
    if p == "nuc" or site.get("dtype") is not None:
        raise Untranslatable(f"{site.rule.torch} with p='nuc' or dtype= is not translated")
    out = [arg(site.x())]
    if p is ...:
        out.append(arg(site.get("p"), "ord"))
    elif p not in (None, "fro", 2, 2.0):
        if isinstance(p, str):
            raise Untranslatable(f"{site.rule.torch}(p={p!r}) is not translated")
        out.append(arg(site.get("p"), "ord"))
    out += norm_axes(site)
    return call("jnp.linalg.vector_norm", *out)


@special("size")
def size(site: Site) -> cst.BaseExpression:
    d = site.args.get("dim")
    if d is None:
        return expr("{x}.shape", x=site.x())
    return expr("{x}.shape[{d}]", x=site.x(), d=d)


@special("attr")
def attr(site: Site) -> cst.BaseExpression:
    """A method that is an attribute in JAX: ``x.dim()`` -> ``x.ndim``."""
    return expr("{x}." + site.rule.jax.lstrip("."), x=site.x())


@special("astype")
def astype(site: Site) -> cst.BaseExpression:
    return expr("{x}.astype(" + site.rule.jax + ")", x=site.x())


@special("t")
def t(site: Site) -> cst.BaseExpression:
    """x.t() / torch.t(x): the transpose of a matrix (a vector as it is; .T does both)."""
    return expr("{x}.T", x=site.x())


@special("type_as")
def type_as(site: Site) -> cst.BaseExpression:
    return expr("{x}.astype({o}.dtype)", x=site.x(), o=site.args.get("other"))


@special("squeeze")
def squeeze(site: Site) -> cst.BaseExpression:
    d = site.args.get("dim")
    if d is None:
        return call("jnp.squeeze", arg(site.x()))
    site.note("jnp.squeeze raises when the axis is not of size 1, where torch's squeeze(dim) "
              "does nothing", "info")
    return call("jnp.squeeze", arg(site.x()), arg(d, "axis"))


def _hint(x: cst.BaseExpression) -> str:
    """A local name for the value of ``x``: its function's name (``jnp.arange(n)``: arange)."""
    if isinstance(x, cst.Call):
        func = x.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (
            func.value if isinstance(func, cst.Name) else "")
        if name.isidentifier() and not name.startswith("_"):
            return name
    return "value"


@special("repeat")
def repeat(site: Site) -> cst.BaseExpression:
    reps = [site.args.get("repeats"), *site.args.extra_positional]
    if reps[0] is None:
        raise Untranslatable("repeat without sizes")
    shape = reps[0] if len(reps) == 1 and not _is_int_like(reps[0]) else expr(
        "(" + ", ".join(code(r) for r in reps) + ("," if len(reps) == 1 else "") + ")")
    return call("jnp.tile", arg(site.x()), arg(shape))


@special("split")
def split(site: Site) -> cst.BaseExpression:
    """torch splits into chunks of a *size*; jnp.split takes a count or split indices."""
    x = site.x()
    size_node = site.args.get("split_size_or_sections")
    d = site.args.get("dim")
    axis = [arg(d if d is not None else py(0), "axis")]
    sizes = try_literal(size_node, ...)
    if isinstance(sizes, (list, tuple)):
        idx, total = [], 0
        for s in sizes[:-1]:
            total += s
            idx.append(total)
        return call("jnp.split", arg(x), arg(py(idx)), *axis)
    if isinstance(size_node, (cst.List, cst.Tuple)):
        parts, acc = [], []
        for e in size_node.elements[:-1]:
            acc.append(code(e.value))
            parts.append(" + ".join(acc))
        return call("jnp.split", arg(x), arg(expr("[" + ", ".join(parts) + "]")), *axis)
    if "split_size_or_sections" in site.sequences:  # sizes held by a name (value analysis)
        return call("torch_split", arg(x), arg(size_node), *axis)
    listed = m.matches(size_node, m.BinaryOperation(left=m.List() | m.Tuple()) | m.ListComp())
    if site.unpack and not isinstance(size_node, cst.Name) and not listed:
        # q, k, v = x.split(self.n_embd, dim=2): a chunk size (a local may hold the sizes:
        # Qwen3-Next's split_arg_list; Kimi-Linear's [self.qkv_dim] * 3: torch_split)
        s = code(size_node)
        idx = [s if i == 1 else f"{i} * {s}" for i in range(1, site.unpack)]
        return call("jnp.split", arg(x), arg(expr("[" + ", ".join(idx) + "]")), *axis)
    if isinstance(sizes, int) or not isinstance(size_node, (cst.Name, cst.Attribute)) \
            and not listed:
        x = site.once(x, "whole", "split's input (an unknown number of chunks)")  # a chunk size
        s, dim = code(size_node), code(d) if d is not None else "0"
        return call("jnp.split", arg(x), arg(expr(f"list(range({s}, {code(x)}.shape[{dim}], {s}))")),
                    *axis)
    # a size held by a name: an int or sizes (timm's drop-path rates), told apart when it runs
    return call("torch_split", arg(x), arg(size_node), *axis)


def _reduction_dim(site: Site) -> cst.BaseExpression | None:
    d = site.args.get("dim")
    return d


@special("sort")
def sort(site: Site) -> cst.BaseExpression:
    """torch.sort -> (values, indices)."""
    x = site.x()
    d = site.args.get("dim") or expr("-1")
    kw = [arg(d, "axis")]
    desc = site.args.get("descending")
    if desc is not None and try_literal(desc, ...) is not False:
        kw.append(arg(desc, "descending"))
    x = site.once(x, "unsorted", "torch.sort's input")
    return cst.Tuple(elements=[cst.Element(call("jnp.sort", arg(x), *kw)),
                               cst.Element(call("jnp.argsort", arg(x), *kw))])


@special("max_min")
def max_min(site: Site) -> cst.BaseExpression:
    """torch.max has three overloads: full reduction, (values, indices) along dim, elementwise."""
    kind = site.rule.jax  # "max" or "min"
    x = site.x()
    d = site.args.get("dim")
    other = site.args.get("other")
    if d is not None and other is None and "dim" not in site.args.keywords and not _dim_like(d):
        other, d = d, None
    if other is not None:
        site.note(f"torch.{kind}(a, b) read as the elementwise {kind}imum (b is not an int dim)",
                  "warning")
        return call(f"jnp.{kind}imum", arg(x), arg(other))
    if d is None:
        return expr(f"{{x}}.{kind}()", x=x)
    keep = site.args.get("keepdim")
    kw = [arg(d, "axis")] + ([arg(keep, "keepdims")] if keep is not None else [])
    vals = call(expr(f"{{x}}.{kind}", x=x), *kw)
    idx = call(expr(f"{{x}}.arg{kind}", x=x), *kw)
    return cst.Tuple(elements=[cst.Element(vals), cst.Element(idx)])


def _dim_like(node: cst.BaseExpression) -> bool:
    if int_value(node) is not None:
        return True
    if isinstance(node, cst.Tuple):
        return all(int_value(e.value) is not None for e in node.elements)
    return isinstance(node, cst.Name) and node.value in ("dim", "axis", "d")


@special("var_std")
def var_std(site: Site) -> cst.BaseExpression:
    name = site.rule.jax
    x = site.x()
    kw: list[cst.Arg] = []
    d = site.args.get("dim")
    unbiased = site.args.get("unbiased")
    correction = site.args.get("correction")
    if d is not None and isinstance(try_literal(d, ...), bool) and unbiased is None:
        unbiased, d = d, None  # x.var(False): the legacy positional unbiased flag
    if d is not None:
        kw.append(arg(d, "axis"))
    if correction is not None:
        kw.append(arg(correction, "ddof"))
    elif unbiased is not None:
        u = try_literal(unbiased, ...)
        kw.append(arg(py(1 if u else 0) if u is not ... else expr("int({u})", u=unbiased),
                      "ddof"))
    else:
        kw.append(arg(py(1), "ddof"))  # torch's default is the unbiased estimate
    keep = site.args.get("keepdim")
    if keep is not None:
        kw.append(arg(keep, "keepdims"))
    return call(expr(f"{{x}}.{name}", x=x), *kw)


@special("masked_fill")
def masked_fill(site: Site) -> cst.BaseExpression:
    return call("jnp.where", arg(site.args.get("mask")), arg(site.args.get("value")),
                arg(site.x()))


@special("softmax")
def softmax(site: Site) -> cst.BaseExpression:
    d = site.args.get("dim")
    if d is None:
        raise Untranslatable("softmax without dim (torch's implicit, deprecated choice of axis)")
    x = site.x()
    dtype = site.args.get("dtype")
    if dtype is not None:
        x = expr("{x}.astype({d})", x=x, d=dtype)
    return call(site.rule.jax, arg(x), arg(d, "axis"))


@special("gelu")
def gelu(site: Site) -> cst.BaseExpression:
    approx = site.lit("approximate")
    approx = "none" if approx is None else approx
    if approx not in ("none", "tanh"):
        raise Untranslatable(f"gelu approximate={approx!r}")
    return call("jax.nn.gelu", arg(site.x()), arg(py(approx == "tanh"), "approximate"))


@special("linear")
def linear(site: Site) -> cst.BaseExpression:
    b = site.args.get("bias")
    w = site.args.get("weight")
    # F.linear(x, self.fc.weight): the kernel read in torch's layout is kernel.T, whose .T is
    # the kernel itself
    wt = w.value if m.matches(w, m.Attribute(attr=m.Name("T"))) else expr("{w}.T", w=w)
    if b is None or try_literal(b, ...) is None:
        return expr("{x} @ {w}", x=site.x(), w=wt)
    return expr("{x} @ {w} + {b}", x=site.x(), w=wt, b=b)


@special("functional_layer_norm")
def functional_layer_norm(site: Site) -> cst.BaseExpression:
    shape = site.args.get("normalized_shape")
    value = try_literal(shape, ...)
    if isinstance(value, int):
        axes = "-1"
    elif isinstance(value, (tuple, list)):
        axes = "(" + ", ".join(str(i) for i in range(-len(value), 0)) + ("," if len(value) == 1
                                                                          else "") + ")"
        if len(value) == 1:
            axes = "-1"
    elif isinstance(shape, (cst.Tuple, cst.List)):
        k = len(shape.elements)
        axes = "-1" if k == 1 else "(" + ", ".join(str(i) for i in range(-k, 0)) + ")"
    else:
        axes = f"tuple(range(-len({code(shape)}), 0))"
    eps = site.args.get("eps")
    out = expr(f"jax.nn.standardize({{x}}, axis={axes}, epsilon={{e}})", x=site.x(),
               e=eps if eps is not None else py(1e-5))
    w, b = site.args.get("weight"), site.args.get("bias")
    # (a weight or bias that is None on some instances: self.bias of a LayerNorm whose class
    # sets it to None when built without one)
    if w is not None and try_literal(w, ...) is not None:
        out = expr("{o} * ({w} if {w} is not None else 1.0)" if "weight" in site.optional
                   else "{o} * {w}", o=out, w=w)
    if b is not None and try_literal(b, ...) is not None:
        out = expr("{o} + ({b} if {b} is not None else 0.0)" if "bias" in site.optional
                   else "{o} + {b}", o=out, b=b)
    return out


@special("pad")
def pad(site: Site) -> cst.BaseExpression:
    x = site.x()
    node = site.args.get("pad")
    pads = try_literal(node, ...)
    if pads is ... and isinstance(node, (cst.Tuple, cst.List)) and not any(
            isinstance(e, cst.StarredElement) for e in node.elements):
        # (0, 0, 0, W % 2, 0, H % 2): a display of amounts computed from static shapes; the
        # integers that are literals are checked here, jnp.pad refuses a negative one at trace
        items = [e.value for e in node.elements]
        pads = [try_literal(v, ...) for v in items]
        pads = [code(v) if p is ... else p for v, p in zip(items, pads)]
    if pads is ... and node is not None and is_simple(node) and is_simple(x):
        # pad_values = (0, 0, 0, right, 0, bottom); F.pad(x, pad_values): torch takes a
        # Python sequence of ints, (low, high) pairs from the last axis back
        return _pad_call(site, x, expr("[(0, 0)] * ({x}.ndim - len({p}) // 2) + list(zip("
                                       "{p}[-2::-2], {p}[::-2]))", x=x, p=node))
    if pads is ... or not isinstance(pads, (tuple, list)) or len(pads) % 2:
        raise Untranslatable("F.pad with a non-literal padding")
    if any(isinstance(p, (int, float)) and p < 0 for p in pads):
        raise Untranslatable("F.pad with negative (cropping) padding")
    pairs = [(pads[i], pads[i + 1]) for i in range(0, len(pads), 2)][::-1]
    k = len(pairs)
    listed = "[" + ", ".join(f"({lo}, {hi})" for lo, hi in pairs) + "]"
    if not is_simple(x):
        # F.pad(self.conv(x), ...): the widths read the operand's rank; the operand is
        # computed once, handed to a function of it
        t = cst.Name("_t")
        padded = _pad_call(site, t, expr(f"[(0, 0)] * (_t.ndim - {k}) + {listed}"))
        return cst.Call(func=cst.Lambda(params=cst.Parameters([cst.Param(t)]), body=padded,
                                        lpar=[cst.LeftParen()], rpar=[cst.RightParen()]),
                        args=[arg(x)])
    return _pad_call(site, x, expr(f"[(0, 0)] * ({code(x)}.ndim - {k}) + {listed}"))


def _pad_call(site: Site, x: cst.BaseExpression, width: cst.BaseExpression) -> cst.BaseExpression:
    mode = site.lit("mode") or "constant"
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    given = site.args.get("mode")
    if mode is ... and given is not None and is_simple(given) and site.args.get(
            "value") is None:
        # F.pad(x, pad, mode=self.mode): torch's names mapped where it runs (a KeyError for
        # another name, as torch raises)
        table = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in modes.items()) + "}"
        return call("jnp.pad", arg(x), arg(width),
                    arg(expr(f"{table}[{code(given)}]"), "mode"))
    if mode not in modes:
        raise Untranslatable(f"F.pad mode={mode!r}" if mode is not ... else
                             f"F.pad mode={code(given)}: a mode not written out, with a value")
    kws = []
    if mode != "constant":
        kws.append(arg(py(modes[mode]), "mode"))
    value = site.args.get("value")
    if value is not None and try_literal(value, ...) not in (0, 0.0, None):
        kws.append(arg(value, "constant_values"))
    return call("jnp.pad", arg(x), arg(width), *kws)


@special("one_hot")
def one_hot(site: Site) -> cst.BaseExpression:
    n = site.get("num_classes")
    if n is None or try_literal(n, ...) == -1:
        raise Untranslatable("F.one_hot without num_classes: the class count comes from the "
                             "data in torch, JAX needs it statically")
    return call("jax.nn.one_hot", arg(site.x()), arg(n), arg(expr("jnp.int32"), "dtype"))


@special("expand_as")
def expand_as(site: Site) -> cst.BaseExpression:
    return expr("jnp.broadcast_to({x}, {y}.shape)", x=site.x(), y=site.args.get("other"))


@special("view_as")
def view_as(site: Site) -> cst.BaseExpression:
    return expr("{x}.reshape({y}.shape)", x=site.x(), y=site.args.get("other"))


@special("sub_alpha")
def sub_alpha(site: Site) -> cst.BaseExpression:
    alpha = site.args.get("alpha")
    y = site.args.get("other")
    if alpha is not None:
        y = expr("{a} * {y}", a=alpha, y=y)
    return expr("{x} - {y}", x=site.x(), y=y)


@special("div_rounding")
def div_rounding(site: Site) -> cst.BaseExpression:
    mode = site.lit("rounding_mode")
    q = call("jnp.divide", arg(site.x()), arg(site.args.get("other")))
    if mode is None:
        return q
    if mode == "trunc":
        return call("jnp.trunc", arg(q))
    if mode == "floor":
        return call("jnp.floor_divide", arg(site.x()), arg(site.args.get("other")))
    raise Untranslatable(f"torch.div rounding_mode={mode!r}")


@special("dropout_fn")
def dropout_fn(site: Site) -> cst.BaseExpression:
    training = site.lit("training")
    if training is False:
        return site.x()
    if training is ... and is_simple(site.x()):
        # F.dropout(attn, p=attention_dropout, training=training) in a function that has no
        # key: the identity (training off, or p == 0) is translated; the random branch is kept
        # as it was, marked, and fails loudly if it is ever reached
        p = site.args.get("p") or py(0.5)
        site.note("functional dropout needs a random key: only training=False or p == 0 "
                  "(the identity) is translated; pass a key (jax.random.bernoulli) or make it "
                  "an nnx.Dropout attribute to train with dropout", "error")
        return expr("{x} if not {t} or {p} == 0.0 else F.dropout({x}, {p}, training={t})",
                    x=site.x(), t=site.args.get("training"), p=p)
    raise Untranslatable(
        "functional dropout needs a random key: make it an nnx.Dropout attribute "
        "(torch's F.dropout defaults to training=True even in eval mode)"
    )


@special("stop_gradient")
def stop_gradient(site: Site) -> cst.BaseExpression:
    return call("jax.lax.stop_gradient", arg(site.x()))


@special("numpy")
def numpy(site: Site) -> cst.BaseExpression:
    return call("np.asarray", arg(site.x()))


@special("cat")
def cat(site: Site) -> cst.BaseExpression:
    d = site.args.get("dim")
    return call(site.rule.jax, arg(site.args.get("tensors")),
                arg(d if d is not None else py(0), "axis"))


@special("einsum")
def einsum(site: Site) -> cst.BaseExpression:
    eq = site.args.get("equation")
    ops = site.args.extra_positional
    if len(ops) == 1 and isinstance(ops[0], (cst.List, cst.Tuple)):
        ops = [e.value for e in ops[0].elements]
    return call("jnp.einsum", arg(eq), *[arg(o) for o in ops])


@special("tensor")
def tensor(site: Site) -> cst.BaseExpression:
    return call("jnp.asarray", arg(site.args.get("data")), *_dtype_kw(site))


@special("clamp")
def clamp(site: Site) -> cst.BaseExpression:
    kws = []
    for name in ("min", "max"):
        v = site.args.get(name)
        if v is not None:
            kws.append(arg(v, name))
    return call("jnp.clip", arg(site.x()), *kws)


@special("inplace")
def inplace(site: Site) -> cst.BaseExpression:
    raise Untranslatable("in-place tensor method used as a value")


@special("gather")
def gather(site: Site) -> cst.BaseExpression:
    return call("jnp.take_along_axis", arg(site.x()), arg(site.args.get("index")),
                arg(site.args.get("dim"), "axis"))


@special("index_select")
def index_select(site: Site) -> cst.BaseExpression:
    return call("jnp.take", arg(site.x()), arg(site.args.get("index")),
                arg(site.args.get("dim"), "axis"))
