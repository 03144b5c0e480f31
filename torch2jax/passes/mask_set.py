"""``x[mask] = v`` with a boolean mask and a scalar ``v``: ``jnp.where`` (a boolean index is
not traceable under ``jax.jit``: ``x.at[mask].set(v)`` raises NonConcreteBooleanIndexError).
torch's mask selects along ``x``'s leading axes (its shape is theirs), so the mask gets
trailing axes of size one where it may have fewer than ``x``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import expr

# calls whose result is a boolean tensor (a method of a tensor, or a torch function)
_BOOL_METHODS = {"bool", "isnan", "isinf", "isfinite", "eq", "ne", "lt", "le", "gt", "ge",
                 "logical_not", "logical_and", "logical_or", "logical_xor", "isin"}


def _is_scalar(node: cst.BaseExpression) -> bool:
    """A number written in place: ``0``, ``-1.0``, ``float("-inf")``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float)) or (m.matches(node, m.Call(
        func=m.Name("float"), args=[m.Arg(m.SimpleString(), keyword=None)])) and
        node.args[0].value.evaluated_value.lstrip("+-") in ("inf", "nan"))


def _is_mask(node: cst.BaseExpression, fn: cst.FunctionDef | None, depth: int = 0) -> bool:
    """``node`` (torch's code) is a boolean tensor: a comparison, ``~`` of one or of a name,
    ``&`` / ``|`` of masks, ``.bool()`` / ``torch.isnan(...)``, or a name every assignment of
    the function binds to one of those."""
    if depth > 4:
        return False
    if isinstance(node, cst.Comparison):
        return all(isinstance(c.operator, (cst.Equal, cst.NotEqual, cst.LessThan,
                                           cst.LessThanEqual, cst.GreaterThan,
                                           cst.GreaterThanEqual)) for c in node.comparisons)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        return isinstance(node.expression, cst.Name) or _is_mask(node.expression, fn, depth + 1)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, (
            cst.BitAnd, cst.BitOr, cst.BitXor)):
        return _is_mask(node.left, fn, depth + 1) and _is_mask(node.right, fn, depth + 1)
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and (
            node.func.attr.value in _BOOL_METHODS):
        return True
    if isinstance(node, cst.Name) and fn is not None:
        values = [a.value for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(
            m.Name(node.value))]))]
        return bool(values) and all(_is_mask(v, fn, depth + 1) for v in values)
    return False


def mask_set(original: cst.Assign, target: cst.Subscript, value: cst.BaseExpression,
             fn: cst.FunctionDef | None) -> cst.BaseExpression | None:
    """``x[mask] = v`` (``original``; ``target`` and ``value`` translated) as ``jnp.where``:
    ``jnp.where(x < 0, 0, x)`` where the mask compares ``x`` itself (its shape), else the mask
    given ``x``'s rank; None where the index is no boolean mask or the value no number."""
    given = original.targets[0].target
    if not (isinstance(given, cst.Subscript) and len(given.slice) == 1 == len(target.slice)
            and isinstance(given.slice[0].slice, cst.Index) and isinstance(
                target.slice[0].slice, cst.Index) and isinstance(target.value, cst.Name)
            and _is_scalar(original.value) and _is_mask(given.slice[0].slice.value, fn)):
        return None
    x, mask = target.value, target.slice[0].slice.value
    if isinstance(mask, cst.Comparison) and len(mask.comparisons) == 1 and (
            mask.left.deep_equals(x)):
        return expr("jnp.where({m}, {v}, {x})", m=mask, v=value, x=x)
    if not isinstance(mask, cst.Name) and not (isinstance(mask, cst.UnaryOperation)
                                               and isinstance(mask.expression, cst.Name)):
        return None  # (read twice below: a name, or ~name)
    rank = mask.expression if isinstance(mask, cst.UnaryOperation) else mask  # (~m: m's rank)
    return expr("jnp.where(jnp.expand_dims({m}, tuple(range({r}.ndim, {x}.ndim))), {v}, {x})",
                m=mask, r=rank, v=value, x=x)
