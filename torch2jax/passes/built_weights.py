"""Writes into the weights of a layer the program built, outside the module classes (NNX).

NLP scripts load pretrained vectors into a model's embedding and zero the rows of the
special tokens (bentrevett's sentiment tutorials and many after them):

    model.embedding.weight.data.copy_(pretrained_embeddings)
    model.embedding.weight.data[UNK_IDX] = torch.zeros(EMBEDDING_DIM)

An NNX layer's parameters are ``nnx.Param`` variables that can be written in place, as
torch's ``.data`` can:

    model.embedding.embedding[...] = pretrained_embeddings
    model.embedding.embedding[UNK_IDX] = jnp.zeros(EMBEDDING_DIM)

in the JAX layer's layout (passes/layer_weight_writes.py, which lays out the writes into a
module's own layers): a Linear's ``weight.copy_(w)`` is the kernel given ``w.T``, a row of
its weight (``weight[i] = v``) a column of the kernel (``kernel[:, i] = v``), a conv's weight
transposed to the kernel's axes. Other writes (an in-place op other than ``copy_``, an index
into a transposed weight that is not a single row) stay marked. Not on linen (a layer object
holds no parameters) nor equinox (its translation of these lines is its own).
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes import layer_weight_writes as lw
from torch2jax.passes.common import expr


def writable(wm, q: str, parent: cst.CSTNode | None, holder: cst.CSTNode | None,
             around: cst.CSTNode | None) -> bool:
    """Whether a write of a built layer's weight is one this module translates: ``parent`` is
    the node around ``X.weight`` (or ``X.weight.data``), ``holder`` the node around that,
    ``around`` the node around ``holder`` (a ``copy_`` used as a value stays marked)."""
    if wm.to is None or wm.layout not in ("as_is", "transpose", "conv"):
        return False
    if wm.layout == "conv" and q[-2:] not in ("1d", "2d", "3d"):
        return False
    if isinstance(parent, cst.Attribute) and parent.attr.value == "copy_":
        return isinstance(holder, cst.Call) and isinstance(around, cst.Expr)
    if isinstance(parent, cst.Subscript) and isinstance(holder, cst.AssignTarget):
        return wm.layout == "as_is" or wm.layout == "transpose" and _single_row(parent)
    return False


def _single_row(sub: cst.Subscript) -> bool:
    return len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index) and not \
        isinstance(sub.slice[0].slice.value, cst.Tuple)


def copied(layer: cst.BaseExpression, wm, q: str, value: cst.BaseExpression) -> cst.Assign:
    """``X.weight.data.copy_(value)`` -> ``X.<kernel>[...] = value`` in the kernel's layout
    (a variable's ``[...] =`` broadcasts and casts as torch's ``copy_``; a transposed or conv
    weight's source is broadcast to torch's shape first: passes/layer_weight_writes.py)."""
    target = expr("{l}." + wm.to + "[...]", l=layer)
    new = value if wm.layout == "as_is" else lw.copied_into(target, wm.layout, q, value)
    return cst.Assign([cst.AssignTarget(target)], new)


def row_set(layer: cst.BaseExpression, wm, index: cst.BaseExpression,
            value: cst.BaseExpression) -> cst.Assign:
    """``X.weight.data[i] = value`` -> ``X.<embedding>[i] = value`` (``kernel[:, i]`` for a
    transposed weight)."""
    target = expr("{l}." + wm.to + ("[:, {i}]" if wm.layout == "transpose" else "[{i}]"),
                  l=layer, i=index)
    return cst.Assign([cst.AssignTarget(target)], value)
