"""Helper classes with torch's constructor signatures, for a torch layer class used as a value
(``conv_layer=nn.Conv2d``, timm's ``aa_layer=nn.AvgPool2d``, ``norm_layer=nn.BatchNorm2d``,
``linear_layer=nn.Linear``) and called later with torch's arguments on channels-first input
(passes/rewrite_layers.py's ``_layer_class_value``; docs/nnx-output.md, "Layer classes used
as values"). Registered in passes/helper_registry.py's table, written in by passes/helpers.py."""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

_CONV = '''
class Conv{n}d(nnx.Conv):
    """nn.Conv{n}d where its arguments are the callers' (conv_layer=nn.Conv{n}d handed around,
    nn.Conv{n}d(cin, cout, **kwargs)): torch's arguments and its channels-first input and output
    around an nnx.Conv (kernel (*k, in, out), zero padding; dtype= the parameters' dtype,
    device= has no meaning: JAX places arrays by sharding)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device=None,
        dtype=None,
        *,
        rngs: nnx.Rngs,
    ) -> None:
        def spatial(v):
            return (v,) * {n} if isinstance(v, int) else tuple(v)

        if padding_mode != "zeros":
            raise NotImplementedError(f"padding_mode={{padding_mode!r}}: zero padding only")
        super().__init__(
            in_channels,
            out_channels,
            kernel_size=spatial(kernel_size),
            strides=spatial(stride),
            padding=padding.upper() if isinstance(padding, str) else [(p, p) for p in spatial(padding)],
            kernel_dilation=spatial(dilation),
            feature_group_count=groups,
            use_bias=bias,
            param_dtype=jnp.float32 if dtype is None else dtype,
            rngs=rngs,
        )
        # torch's attribute names, read by code that takes the layer as torch's (a block's
        # out_channels); padding keeps nnx.Conv's meaning, the (low, high) pairs
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.stride, self.dilation = spatial(stride), spatial(dilation)

    @property
    def weight(self) -> jax.Array:
        """torch's weight (out, in / groups, *k), read by code that takes the layer as torch's
        (a weight-standardised conv's forward): the kernel (*k, in / groups, out) transposed."""
        return jnp.transpose(self.kernel[...], {perm})

    def reset_parameters(self) -> None:
        """torch's re-draw of the weight and bias, called by a subclass resetting its own
        parameters (super().reset_parameters()): they were drawn when the layer was built, by
        flax's initialisers as every converted convolution's are; nothing is drawn again."""

    def _conv_forward(self, x: jax.Array, weight: jax.Array,
                      bias: jax.Array | None) -> jax.Array:
        """torch's Conv{n}d._conv_forward: channels-first x convolved with a weight in torch's
        layout (a subclass's forward computing its own: weight standardisation) by this
        layer's stride, padding, dilation and groups."""
        y = jax.lax.conv_general_dilated(
            x, weight, self.strides, self.padding, rhs_dilation=self.kernel_dilation,
            feature_group_count=self.feature_group_count, dimension_numbers={spec})
        return y if bias is None else y + bias[...].reshape(-1, *(1,) * {n})

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.moveaxis(super().__call__(jnp.moveaxis(x, 1, -1)), -1, 1)
'''
_SPECS = {1: '("NCH", "OIH", "NCH")', 2: '("NCHW", "OIHW", "NCHW")', 3: '("NCDHW", "OIDHW", "NCDHW")'}
for _n in (1, 2, 3):
    helper(f"Conv{_n}d", {"jax", "jnp", "nnx"}, _CONV.format(
        n=_n, perm=(_n + 1, _n, *range(_n)), spec=_SPECS[_n]))


_POOL = '''
class {kind}Pool{n}d(nnx.Module):
    """nn.{kind}Pool{n}d where the class is handed around as a value (aa_layer=nn.{kind}Pool{n}d):
    torch's arguments on channels-first input. The stride defaults to the kernel size; with
    ceil_mode the last window may overhang the input, but never starts in the right padding;
    {doc}"""

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] | None = None,
        padding: int | tuple[int, ...] = 0,
        {params},
        *,
        rngs: nnx.Rngs | None = None,
    ) -> None:
        def spatial(v):
            return (v,) * {n} if isinstance(v, int) else tuple(v)

        self.kernel_size = spatial(kernel_size)
        self.stride = spatial(kernel_size if stride is None else stride)
        self.padding = spatial(padding)
        self.ceil_mode = ceil_mode
        {init}

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.ndim - {n}  # batch and channels (or channels alone)
        pads = []
        for d, k, s, p, dil in zip(x.shape[lead:], self.kernel_size, self.stride, self.padding,
                                   {dilation}):
            span = dil * (k - 1) + 1
            windows = d + 2 * p - span
            out = (-(-windows // s) if self.ceil_mode else windows // s) + 1
            if self.ceil_mode and (out - 1) * s >= d + p:
                out -= 1  # torch drops a last window that would start in the right padding
            pads.append((p, max(p, (out - 1) * s + span - d - p)))
        window, strides = (1,) * lead + self.kernel_size, (1,) * lead + self.stride
        {call}
'''
_MAX_CALL = '''return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, strides,
                                     [(0, 0)] * lead + pads,
                                     window_dilation=(1,) * lead + self.dilation)'''
_AVG_CALL = '''total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides,
                                      [(0, 0)] * lead + pads)
        if self.divisor_override is not None:
            return total / self.divisor_override
        # the divisor: the part of each window inside the input, and inside its symmetric
        # padding too with count_include_pad (the overhang of ceil_mode never counts)
        inside = jnp.pad(jnp.ones(x.shape[lead:], x.dtype), [(p, p) for p, _ in pads],
                         constant_values=1 if self.count_include_pad else 0)
        count = jax.lax.reduce_window(inside, 0.0, jax.lax.add, self.kernel_size, self.stride,
                                      [(0, hi - p) for p, hi in pads])
        return total / count'''
for _n in (1, 2, 3):
    helper(f"MaxPool{_n}d", {"jax", "jnp", "nnx"}, _POOL.format(
        kind="Max", n=_n, doc="the padding is -inf.",
        params="dilation: int | tuple[int, ...] = 1,\n        return_indices: bool = False,\n"
               "        ceil_mode: bool = False",
        init="self.dilation = spatial(dilation)\n        if return_indices:\n"
             "            raise NotImplementedError(\"MaxPool with return_indices=True\")",
        dilation="self.dilation", call=_MAX_CALL))
    helper(f"AvgPool{_n}d", {"jax", "jnp", "nnx"}, _POOL.format(
        kind="Avg", n=_n, doc="the padding is zeros, counted in the\n"
        "    divisor with count_include_pad.",
        params="ceil_mode: bool = False,\n        count_include_pad: bool = True,\n"
               "        divisor_override: int | None = None",
        init="self.count_include_pad = count_include_pad\n"
             "        self.divisor_override = divisor_override",
        dilation="(1,) * " + str(_n), call=_AVG_CALL))


helper("Linear", {"jax", "jnp", "nnx"}, '''
class Linear(nnx.Linear):
    """nn.Linear for code that hands the layer class around as a value (linear_layer=nn.Linear):
    torch's arguments over an nnx.Linear (bias= is use_bias=, dtype= the parameters' dtype;
    device= has no meaning: JAX places arrays by sharding)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, rngs: nnx.Rngs) -> None:
        super().__init__(in_features, out_features, use_bias=bias,
                         param_dtype=jnp.float32 if dtype is None else dtype, rngs=rngs)

    @property
    def weight(self) -> jax.Array:
        """torch's weight (out, in), read by code that takes the layer as torch's: the kernel
        (in, out) transposed."""
        return self.kernel[...].T
''')


# torch's ``weight`` of a norm helper: the flax scale under torch's name (BatchNorm{n}d, LayerNorm)
_SCALE_AS_WEIGHT = '''
    @property
    def weight(self) -> nnx.Param | None:
        """torch's name of the scale, read by code that takes the layer as torch's (its
        dtype, an initialiser setting it): the same parameter, of the same shape."""
        return self.scale

    @weight.setter
    def weight(self, value: nnx.Param | None) -> None:
        self.scale = value
'''


# a BatchNorm class handed around as a value (norm_layer=nn.BatchNorm2d, partial(
# nn.BatchNorm2d, eps=1e-3)) reaches code that calls it with torch's keywords and may read its
# name (timm's get_norm_act_layer unbinds a partial, rebinds its keywords to a class of its
# own and maps the class by ``__name__``): a class with torch's name and signature
_BATCH_NORM_ND = '''
class BatchNorm{n}d(BatchNorm):
    """nn.BatchNorm{n}d as a value (a default argument, a table entry, a partial): torch's
    arguments and name over the BatchNorm helper, on channels-first input (features on axis 1).
    torch's momentum weighs the batch, flax's the running average: 1 - momentum."""

    def __init__(self, num_features: int, eps: float = 1e-05, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None, *, rngs: nnx.Rngs) -> None:
        if momentum is None:
            raise NotImplementedError("BatchNorm momentum=None (a cumulative moving average) "
                                      "has no flax form")
        super().__init__(num_features, axis=1, momentum=1 - momentum, epsilon=eps,
                         use_bias=affine, use_scale=affine,
                         param_dtype=jnp.float32 if dtype is None else dtype, rngs=rngs)
        self.affine, self.track_running_stats = affine, track_running_stats
        self.num_batches_tracked = None  # no counter: momentum=None, its use, is refused
{weight}
    def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
        if not self.track_running_stats:  # no running statistics: the batch's, in eval too
            use_running_average = False
        return super().__call__(x, use_running_average)
'''
for _n in (1, 2, 3):
    helper(f"BatchNorm{_n}d", {"jax", "jnp", "nnx"}, _BATCH_NORM_ND.format(n=_n, weight=_SCALE_AS_WEIGHT),
           targets=("nnx",))


# nn.LayerNorm as a value (LayoutLM's ``LayoutLMLayerNorm = nn.LayerNorm``, InternVL's
# ``NORM2FN = {"layer_norm": nn.LayerNorm, ...}``, a subclass built with ``*args, **kwargs``)
# reaches calls with torch's keywords (eps=, elementwise_affine=): a class with that signature
helper("LayerNorm", {"jnp", "nnx"}, '''
class LayerNorm(nnx.LayerNorm):
    """nn.LayerNorm as a value (a table entry, an alias, a base built with *args, **kwargs):
    torch's arguments over an nnx.LayerNorm of the last axis (eps= is epsilon=, torch's
    default 1e-5; elementwise_affine= and bias= the scale and the bias; device= has no
    meaning: JAX places arrays by sharding)."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-05,
                 elementwise_affine: bool = True, bias: bool = True, device=None, dtype=None,
                 *, rngs: nnx.Rngs) -> None:
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(
            normalized_shape)
        if len(shape) != 1:
            raise NotImplementedError("LayerNorm over several trailing axes as a value")
        super().__init__(shape[0], epsilon=eps, use_scale=elementwise_affine,
                         use_bias=elementwise_affine and bias,
                         param_dtype=jnp.float32 if dtype is None else dtype, rngs=rngs)
''' + _SCALE_AS_WEIGHT, targets=("nnx",))


# torch.nn.init.zeros_(self.conv3.bn.weight) where the converter cannot tell the layer's type
# (built in another module: timm's ConvNormAct's norm): the parameter found at run time
helper("layer_weight", {"nnx"}, '''
def layer_weight(layer: nnx.Module) -> nnx.Param:
    """The parameter torch calls a layer's weight: NNX names it kernel (Linear, Conv), scale
    (the norms) or embedding (Embed); a module of the user's own keeps torch's name, weight.
    Only for an initialiser that sets or draws every element alike, which the layout (a kernel
    is torch's weight transposed) does not change."""
    for name in ("kernel", "scale", "embedding", "weight"):
        param = getattr(layer, name, None)
        if isinstance(param, nnx.Param):
            return param
    raise AttributeError(f"{type(layer).__name__} has no weight (kernel, scale, embedding or "
                         "weight)")
''', targets=("nnx",))
