"""Calls whose own arguments show that their receiver is a torch tensor.

``x.mean(dim=1)`` and ``k.transpose(2, 3)`` call methods that numpy arrays (and the JAX arrays
the converted code hands on) share with tensors, so a receiver the value analysis cannot see
(``outputs.last_hidden_state[:, 1:]``, a name bound from a cache in one branch) leaves the call
ambiguous. Some arguments settle it: numpy names the axis of its reductions ``axis``, never
``dim``, and its two-argument ``transpose(i, j)`` is a permutation of a 2-D array's axes, so
``transpose(2, 3)`` raises there; their ``size`` is a number, not a method, and they have
no ``.to(dtype)``. Where the arguments are ones only a tensor's method accepts
(or ones that mean the same for both), the call is translated as the tensor's.
"""

from __future__ import annotations

import libcst as cst

# keywords of tensor methods that numpy's and JAX's methods of the same name do not take
_DIM = frozenset({"dim", "keepdim"})
_TORCH_KEYWORDS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("sum", "mean", "max", "min", "prod", "argmax", "argmin", "all", "any",
                     "squeeze", "split", "size", "cumsum"), _DIM),
    **dict.fromkeys(("std", "var"), _DIM | {"unbiased"}),
    "flatten": frozenset({"start_dim", "end_dim"}),
    "transpose": frozenset({"dim0", "dim1"}),
}


def _int(node: cst.BaseExpression) -> int | None:
    """An integer literal, negative ones included."""
    if isinstance(node, cst.Integer):
        return int(node.value, 0)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _int(node.expression)
        return None if inner is None else -inner
    return None


_DTYPES = frozenset({"float32", "float", "float16", "half", "bfloat16", "float64", "double",
                     "int64", "long", "int32", "int", "int16", "int8", "uint8", "bool"})


def _dtype(node: cst.BaseExpression) -> bool:
    """``y.dtype`` or ``torch.float32``."""
    if not isinstance(node, cst.Attribute):
        return False
    if node.attr.value == "dtype":
        return True
    return (isinstance(node.value, cst.Name) and node.value.value == "torch"
            and node.attr.value in _DTYPES)


def torch_only_call(call: cst.Call, meth: str) -> bool:
    """``recv.meth(...)`` whose arguments only a tensor's ``meth`` takes, or take in a way that
    gives a numpy or JAX array the same result (``x.transpose(-1, -2)``: numpy accepts it on a
    2-D array only, where it swaps the two axes as torch does)."""
    if any(a.star for a in call.args):
        return False
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if keywords & _TORCH_KEYWORDS.get(meth, frozenset()):
        return True
    positional = [a.value for a in call.args if a.keyword is None]
    if meth == "transpose" and len(positional) == 2 and not keywords:
        first, second = (_int(p) for p in positional)
        if first is None or second is None:
            return False
        # numpy's transpose(i, j) on a 2-D array keeps the axes for (0, 1) and (-2, -1)
        # (torch swaps them), swaps them for (1, 0) and (-1, -2) (as torch), raises otherwise
        keeps = first in (0, -2) and second in (1, -1)
        return not keeps
    if meth == "to":
        # x.to(y.dtype) / x.to(torch.float32) / x.to(dtype=...): a dtype only a tensor's (or a
        # module's, which the value analysis sees) .to takes; numpy's and JAX's have no .to
        return "dtype" in keywords or any(_dtype(p) for p in positional)
    if meth == "size" and not keywords:
        # numpy's and JAX's size is a number: only a tensor's is called (x.size()[:-2])
        return not positional or (len(positional) == 1 and _int(positional[0]) is not None)
    if meth == "unflatten":  # numpy's and JAX's arrays have none
        return True
    if meth == "flatten" and positional and not keywords:
        return _int(positional[0]) is not None  # numpy's flatten takes an order ("C")
    return False


def tensor_result(node: cst.BaseExpression) -> bool:
    """``x.transpose(1, 2)`` in ``x.transpose(1, 2).to(dtype)`` (Falcon-Mamba): a call whose
    arguments are a tensor method's returns a tensor (``size()`` a ``torch.Size``)."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value != "size" and torch_only_call(node, node.func.attr.value))
