"""Values made by arithmetic on the spot, which nothing else holds.

An in-place method on such a value (timm's csatv2: ``x.mul(self.std).add_(self.mean)``, or
``(x * 2).mul_(3)``) writes a tensor no name holds: its value is the out-of-place method's,
as on a tensor made by ``torch.zeros(...)`` (passes/rewrite_support.py's ``_MADE``). A view
(``x.view(...)``, ``x[0]``, ``x.transpose(0, 1)``) is not such a value: the write would reach
``x``, so those keep their marker.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.torch_api import TORCH_ONLY_TENSOR_METHODS
from torch2jax.passes.rewrite_support import _fix_commas

# out-of-place tensor methods whose result is always a new tensor (never ``self`` or a view)
_NEW_TENSOR_METHODS = frozenset({
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "pow", "neg",
    "exp", "log", "sigmoid", "tanh", "sqrt", "rsqrt", "abs", "clone", "matmul", "clamp",
    "clip", "softmax", "reciprocal", "square"})
# torch functions of the same kind
_NEW_TENSOR_FUNCTIONS = frozenset({f"torch.{name}" for name in _NEW_TENSOR_METHODS} | {
    "torch.cat", "torch.stack", "torch.concat"})
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power,
               cst.MatrixMultiply, cst.Modulo)


def made_by_arithmetic(recv: cst.BaseExpression, qualified: str | None) -> bool:
    """``recv`` (an original node; ``qualified``: its callee's torch name, where it is a call)
    is a new tensor made by arithmetic right here: ``a * b``, ``-a``, ``a.mul(b)``,
    ``torch.add(a, b)``."""
    if isinstance(recv, cst.BinaryOperation):
        return isinstance(recv.operator, _ARITHMETIC)
    if isinstance(recv, cst.UnaryOperation):
        return isinstance(recv.operator, cst.Minus)
    if not isinstance(recv, cst.Call):
        return False
    if qualified in _NEW_TENSOR_FUNCTIONS:
        return True
    if not m.matches(recv.func, m.Attribute(attr=m.Name())):
        return False
    name = recv.func.attr.value
    if name.endswith("_") and name[:-1] in _NEW_TENSOR_METHODS:
        return made_by_arithmetic(recv.func.value, None)  # (x * 2).mul_(3), itself made
    return name in _NEW_TENSOR_METHODS


def inplace_on_made_value(tr, original: cst.Call, updated: cst.Call,
                          meth: str) -> cst.BaseExpression | None:
    """``x.mul(std).add_(mean)``: an in-place arithmetic method (``add_``, ``mul_``, ...) on a
    value made by arithmetic here is the out-of-place method's value, by its method rule or
    its torch function's (``torch.add(x * std, mean)``); None where it is not that."""
    recv = original.func.value
    if not (meth.endswith("_") and not meth.startswith("_") and made_by_arithmetic(
            recv, tr.q(recv.func) if isinstance(recv, cst.Call) else None)):
        return None
    base = meth[:-1]
    rule = tr.rules.methods.get(base)
    if rule is not None:
        return tr._method(original, updated, rule)
    function = tr.rules.functions.get(f"torch.{base}")
    if function is None or function.params[:1] != ("input",):
        return None
    return tr._function(original, updated.with_changes(
        func=cst.Attribute(cst.Name("torch"), cst.Name(base)),
        args=[cst.Arg(updated.func.value), *_fix_commas(list(updated.args))]), function)


def torch_only_method(tr, recv: cst.BaseExpression, meth: str) -> bool:
    """``x.mul(std)`` where the value analysis cannot tell what ``x`` is (a parameter of a
    helper method, not annotated): ``.mul`` is a method of torch's tensors only, and of no
    class of the file, so ``x`` is a tensor (it was left, unmarked: "DynamicJaxprTracer has
    no attribute mul" where it ran). Not what another library returns."""
    return (meth in TORCH_ONLY_TENSOR_METHODS and not meth.endswith("_")
            and tr.values is not None and tr.values.kind(recv) in (vk.Kind.UNKNOWN, vk.Kind.PARAM)
            and not tr.values._file_method(meth) and not tr._imported_result(recv))
