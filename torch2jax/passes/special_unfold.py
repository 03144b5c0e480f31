"""``F.unfold`` / ``nn.Unfold`` (im2col) and ``F.fold`` / ``nn.Fold`` (col2im), rules/vision.toml.

Both become calls of a helper written into the converted file (``torch_unfold``,
``torch_fold``): torch's sliding blocks of an ``(N, C, H, W)`` image as the columns of an
``(N, C*kh*kw, L)`` array, channel first then the kernel's rows and columns, the ``L`` blocks in
row-major order; fold sums the columns back (overlapping blocks add up), the adjoint of unfold.
The layers are the helper with the layer's arguments bound (``partial``).
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, expr
from torch2jax.passes.helper_registry import helper
from torch2jax.passes.registry import Site, special

helper("torch_unfold", {"jax"}, '''
def torch_unfold(x: jax.Array, kernel_size, dilation=1, padding=0, stride=1) -> jax.Array:
    """torch's F.unfold (im2col): the sliding blocks of an (N, C, H, W) image (or (C, H, W)) as
    columns, (N, C * kh * kw, L): channel first, then the kernel's rows and columns; the L
    blocks in row-major order. Zero padding; exact (the patches are copied, not summed)."""

    def pair(v):
        return (v, v) if isinstance(v, int) else tuple(v)

    batched = x.ndim == 4
    ph, pw = pair(padding)
    patches = jax.lax.conv_general_dilated_patches(
        x if batched else x[None],
        filter_shape=pair(kernel_size),
        window_strides=pair(stride),
        padding=((ph, ph), (pw, pw)),
        rhs_dilation=pair(dilation),
        precision=jax.lax.Precision.HIGHEST,
    )  # (N, C * kh * kw, out_h, out_w), features ordered (C, kh, kw)
    columns = patches.reshape(patches.shape[0], patches.shape[1], -1)
    return columns if batched else columns[0]
''')

helper("torch_fold", {"jax", "jnp"}, '''
def torch_fold(x: jax.Array, output_size, kernel_size, dilation=1, padding=0, stride=1) -> jax.Array:
    """torch's F.fold (col2im), the adjoint of F.unfold: the columns (N, C * kh * kw, L) (or
    (C * kh * kw, L)) of the sliding blocks of an output_size image, summed back into
    (N, C, H, W); where blocks overlap their values add up, padding is cropped."""

    def pair(v):
        return (v, v) if isinstance(v, int) else tuple(v)

    batched = x.ndim == 3
    x = x if batched else x[None]
    (h, w), (kh, kw), (dh, dw) = pair(output_size), pair(kernel_size), pair(dilation)
    (ph, pw), (sh, sw) = pair(padding), pair(stride)
    out_h = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    blocks = x.reshape(x.shape[0], -1, kh, kw, out_h, out_w)
    image = jnp.zeros((x.shape[0], blocks.shape[1], h + 2 * ph, w + 2 * pw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (out_h - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (out_w - 1) + 1, sw)
            image = image.at[:, :, rows, cols].add(blocks[:, :, i, j])
    image = image[:, :, ph : ph + h, pw : pw + w]
    return image if batched else image[0]
''')

_GEOMETRY = ("kernel_size", "dilation", "padding", "stride")


def _arguments(site: Site, names: tuple[str, ...]) -> list[cst.Arg]:
    out = []
    for name in names:
        node = site.get(name)
        if node is None:
            if name in ("kernel_size", "output_size"):
                raise Untranslatable(f"{site.rule.torch} without {name}")
            continue
        out.append(arg(node, name))
    return out


@special("unfold_function")
def unfold_function(site: Site) -> cst.BaseExpression:
    fold = site.rule.torch.endswith("fold") and not site.rule.torch.endswith("unfold")
    names = (("output_size",) if fold else ()) + _GEOMETRY
    return call("torch_fold" if fold else "torch_unfold", arg(site.x()),
                *_arguments(site, names))


@special("unfold_layer")
def unfold_layer(site: Site) -> cst.BaseExpression:
    fold = site.rule.torch.endswith(".Fold")
    names = (("output_size",) if fold else ()) + _GEOMETRY
    return call("partial", arg(expr("torch_fold" if fold else "torch_unfold")),
                *_arguments(site, names))


helper("tensor_unfold", {"jax", "jnp"}, '''
def tensor_unfold(x: jax.Array, dimension: int, size: int, step: int) -> jax.Array:
    """torch's Tensor.unfold: the windows of `size` items every `step` items along `dimension`,
    that axis becoming the windows' count and a new last axis each window's items."""
    axis = dimension % x.ndim
    starts = jnp.arange((x.shape[axis] - size) // step + 1) * step
    windows = jnp.take(x, starts[:, None] + jnp.arange(size), axis=axis)
    return jnp.moveaxis(windows, axis + 1, -1)
''')


@special("tensor_unfold")
def tensor_unfold(site: Site) -> cst.BaseExpression:
    """``x.unfold(dimension, size, step)``: the ``tensor_unfold`` helper (a gather of the
    windows, whose gradient adds the overlaps up as torch's)."""
    parts = [site.get(name) for name in ("dimension", "size", "step")]
    if any(p is None for p in parts):
        raise Untranslatable(f"{site.rule.torch} without dimension, size and step")
    return call("tensor_unfold", arg(site.x()), *[arg(p) for p in parts])
