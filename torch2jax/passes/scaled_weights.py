"""A layer's weight scaled in place by a number where the layer's type is not known here
(timm's beit ``fix_init_weight``: ``for layer_id, layer in enumerate(self.blocks):
layer.attn.proj.weight.div_(scale)``, the attention built in the file, its MLP in another
module): a scale is the same in any layout, so the parameter the ``layer_weight`` helper finds
at run time (NNX's kernel, scale or embedding, passes/helpers_layers.py) is scaled in place,
``layer_weight(layer.attn.proj)[...] = layer_weight(layer.attn.proj)[...] / scale``. A tensor
factor stays marked (it would meet the kernel's transposed axes).

The same through a function of the file that only scales its parameter in place (timm's
hieradet_sam2: ``def rescale(param, _layer_id): param.div_(math.sqrt(2.0 * _layer_id))``,
called as ``rescale(layer.attn.proj.weight.data, layer_id + 1)``): the call is given the
parameter, ``rescale(layer_weight(layer.attn.proj), layer_id + 1)``, and the function scales
what it is given in place, ``param[...] = param[...] / ...`` (it rebound a local,
``param = param / ...``, which changed nothing the caller sees)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.walk import findall
from torch2jax.passes import torch_init
from torch2jax.passes.common import arg, expr
from torch2jax.passes.helper_registry import HELPERS
from torch2jax.passes.rewrite_support import INPLACE_OPS


def is_number(rw, node: cst.BaseExpression) -> bool:
    """A Python number, or a value the file's analysis knows to be a scalar."""
    return isinstance(node, (cst.Integer, cst.Float)) or (
        rw.values is not None and rw.values.kind(node) == vk.Kind.SCALAR)


def scaled_sublayer_weight(rw, original_node: cst.Expr, updated_node: cst.Expr,
                           meth: str) -> cst.Assign | None:
    """``X.weight.mul_(s)`` / ``.div_(s)`` (or through ``.data``) as a statement, ``X`` a
    layer reached from ``self`` or from a loop over one of its containers, ``s`` a number:
    the parameter scaled in place, else None."""
    call_node, new_call = original_node.value, updated_node.value
    if meth not in ("mul_", "div_") or len(call_node.args) != 1 or call_node.args[0].keyword \
            or call_node.args[0].star or rw.target.helper_target not in HELPERS.get(
                "layer_weight", {}) or not is_number(rw, call_node.args[0].value):
        return None
    if not m.matches(new_call, m.Call(func=m.Attribute(), args=[m.Arg()])):
        return None
    recv, new_recv = call_node.func.value, new_call.func.value
    if isinstance(recv, cst.Name) and rw._fn_stack and _scaled_only(
            rw, rw._fn_stack[-1], recv.value):
        target = expr("{p}[...]", p=cst.Name(recv.value))  # the caller's parameter, scaled
        return cst.Assign(targets=[cst.AssignTarget(target)], value=expr(
            "{t} " + INPLACE_OPS[meth] + " {y}", t=target, y=new_call.args[0].value))
    if m.matches(recv, m.Attribute(attr=m.Name("data"))):
        recv = recv.value
    if m.matches(new_recv, m.Attribute(attr=m.Name("data"))):
        new_recv = new_recv.value
    if not _sublayer_param(rw, recv, new_recv, original_node):
        return None  # (a weight the rewrite renamed, self.fc.kernel, is scaled by its name)
    target = expr("{p}[...]", p=_param(new_recv))
    return cst.Assign(targets=[cst.AssignTarget(target)], value=expr(
        "{t} " + INPLACE_OPS[meth] + " {y}", t=target, y=new_call.args[0].value))


def _sublayer_param(rw, node, new, statement) -> bool:
    """``node`` (``new`` translated) is ``X.weight`` or ``X.bias`` of a layer ``X`` held by a
    module (passes/torch_init.py's ``weight_of_a_sublayer``), still so named."""
    return m.matches(node, m.Attribute(attr=m.Name("weight") | m.Name("bias"))) and (
        m.matches(new, m.Attribute(attr=m.Name(node.attr.value)))) and (
            torch_init.weight_of_a_sublayer(node.with_changes(attr=cst.Name("weight")), rw,
                                            statement))


def _param(new: cst.Attribute) -> cst.BaseExpression:
    """The NNX parameter: ``layer_weight(X)`` for a weight (kernel, scale or embedding by the
    layer's type), ``X.bias`` (every flax layer's name for it)."""
    return expr("layer_weight({l})", l=new.value) if new.attr.value == "weight" else new


_SCALE = m.Call(func=m.Attribute(attr=m.Name("mul_") | m.Name("div_")), args=[m.Arg(
    keyword=None, star="")])


def _scaled_only(rw, fn: cst.FunctionDef, name: str) -> bool:
    """``name`` is a parameter of ``fn`` whose every use is a statement scaling it in place
    by a number (``name.div_(s)``, ``name.data.mul_(s)``)."""
    params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
    if name not in params:
        return False
    uses = [n for n in findall(fn.body, m.Name(name))]
    scales = [s for s in findall(fn.body, m.Expr(value=_SCALE))
              if m.matches(s.value.func.value, m.Name(name) | m.Attribute(
                  value=m.Name(name), attr=m.Name("data")))]
    return bool(scales) and len(uses) == len(scales) and all(
        is_number(rw, s.value.args[0].value) and not findall(s.value.args[0].value, m.Name(
            name)) for s in scales)


def _callee(rw, call: cst.Call) -> cst.FunctionDef | None:
    """The function of the file (nested in the functions around the call, or at the top
    level) that a call of a plain name calls, where one def of that name is found."""
    if not isinstance(call.func, cst.Name):
        return None
    node: cst.CSTNode | None = call
    while (node := rw.get_metadata(ParentNodeProvider, node, None)) is not None:
        if isinstance(node, cst.ClassDef):
            continue  # (a method is not called by its bare name)
        body = node.body if isinstance(node, cst.Module) else getattr(
            getattr(node, "body", None), "body", None)
        if not isinstance(body, (list, tuple)):
            continue
        defs = [s for s in body if isinstance(s, cst.FunctionDef)
                and s.name.value == call.func.value]
        if defs:
            return defs[0] if len(defs) == 1 else None
    return None


def scaled_weight_args(rw, original: cst.Call, updated: cst.Call) -> cst.Call | None:
    """``rescale(layer.attn.proj.weight.data, i)`` where ``rescale`` only scales that
    parameter in place by a number: the layer's parameter given (``layer_weight(...)``), not
    its array; else None."""
    if rw.target.helper_target not in HELPERS.get("layer_weight", {}) or any(
            a.keyword or a.star for a in original.args) or len(original.args) != len(
                updated.args):
        return None
    fn, given = None, False
    args = list(updated.args)
    for i, a in enumerate(original.args):
        t = a.value.value if m.matches(a.value, m.Attribute(attr=m.Name("data"))) else a.value
        new = updated.args[i].value
        new = new.value if m.matches(new, m.Attribute(attr=m.Name("data"))) else new
        if not _sublayer_param(rw, t, new, original):
            continue
        fn = fn or _callee(rw, original)
        params = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)] if (
            fn is not None) else []
        if i < len(params) and _scaled_only(rw, fn, params[i]):
            args[i] = arg(_param(new)).with_changes(
                comma=updated.args[i].comma)
            given = True
    return updated.with_changes(args=args) if given else None
