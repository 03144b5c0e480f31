"""Module surgery at build time, outside the module's own class (NNX): a layer swapped for
another and the new layer's buffers filled from the old one's. transformers' DETR family
replaces each ``BatchNorm2d`` of its backbone by a frozen batch norm:

    for name, module in model.named_children():
        if isinstance(module, nn.BatchNorm2d):
            new_module = DetrFrozenBatchNorm2d(module.num_features)
            if module.weight.device != torch.device("meta"):
                new_module.weight.copy_(module.weight)
                new_module.running_mean.copy_(module.running_mean)
            model._modules[name] = new_module

In JAX code:

* ``new_module.weight.copy_(v)`` (``fill_(v)``, ``zero_()``, through ``.data`` too), where
  ``new_module`` holds a module of a class of the file and ``weight`` is one of its
  parameters or buffers (an NNX variable): the variable written in place,
  ``new_module.weight[...] = v`` (a variable's ``[...] =`` broadcasts and casts to its dtype,
  as torch's ``copy_`` does);
* ``model._modules[name] = new_module``: the ``torch_set_child`` helper puts the child in
  the place ``torch_named_children`` read it from (an attribute, a List's or Sequential's
  position, a Dict's key);
* ``x.device != torch.device("meta")`` (``==``, ``x.is_meta``): no array of JAX lives on
  torch's meta device (a build without storage), so the test is a constant and the ``if``
  keeps its body (or its ``else``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes.common import try_literal
from torch2jax.passes.helper_registry import helper

# model._modules[name] = child on NNX: the child where torch_named_children finds it
helper("torch_set_child", {"Any", "nnx", "jnp"}, '''
def torch_set_child(module: Any, name: str, child: Any) -> None:
    """torch's module._modules[name] = child on an NNX module: the child put where
    torch_named_children read it (a Sequential's or a List's position, a Dict's key, an
    attribute). A BatchNorm2d/3d ran channels-last (flax's feature axis is the last): a
    module of another class put in its place takes torch's layout, so its class becomes one
    that moves the feature axis to 1 and back around its call (its variables unchanged)."""
    names = getattr(module, "torch_names", None)
    if isinstance(module, nnx.Sequential):
        at, held = names[name] if names else int(name), module.layers
    elif isinstance(module, (nnx.List, list)):
        at, held = int(name), module
    elif isinstance(module, (nnx.Dict, dict)):
        at, held = name, module
    else:
        at, held = None, module
    old = getattr(module, name, None) if at is None else held[at]
    if isinstance(old, nnx.BatchNorm) and old.axis == -1 and not isinstance(
            child, nnx.BatchNorm) and not type(child).__module__.startswith("flax."):
        kind = type(child)

        def channels_last(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
            y = kind.__call__(self, jnp.moveaxis(x, -1, 1), *args, **kwargs)
            return jnp.moveaxis(y, 1, -1)

        child.__class__ = type(kind.__name__, (kind,), {"__call__": channels_last})
    if at is None:
        setattr(module, name, child)
    else:
        held[at] = child
''', targets=("nnx",))


def _nnx(rw) -> bool:
    return rw.target.stateful_modules and not rw.target.setup_modules and \
        not rw.target.intermediate and rw.values is not None


def held_tensor_write(rw, original_node: cst.Expr, updated_node: cst.Expr,
                      meth: str) -> cst.Assign | None:
    """``held.weight.copy_(v)`` / ``.fill_(v)`` / ``.zero_()`` on a parameter or buffer of a
    module of the file's classes that a name holds (not ``self``: the class's own rules) ->
    ``held.weight[...] = v``; None where the receiver is not such a variable."""
    call, new_call = original_node.value, updated_node.value
    if meth not in ("copy_", "fill_", "zero_") or not _nnx(rw) or not isinstance(
            new_call, cst.Call) or not isinstance(new_call.func, cst.Attribute) or any(
                a.keyword or a.star for a in call.args) or len(call.args) != (
                    0 if meth == "zero_" else 1) or len(new_call.args) != len(call.args):
        return None
    recv, new_recv = call.func.value, new_call.func.value
    if m.matches(recv, m.Attribute(attr=m.Name("data"), value=m.Attribute())):
        recv = recv.value
    if m.matches(new_recv, m.Attribute(attr=m.Name("data"), value=m.Attribute())):
        new_recv = new_recv.value
    if not m.matches(recv, m.Attribute(value=m.Name())) or recv.value.value == "self" or \
            not m.matches(new_recv, m.Attribute(value=m.Name(), attr=m.Name(recv.attr.value))):
        return None
    cls = rw.values.value(recv.value).cls or ""
    info = rw.index.classes.get(cls)
    held = info.tensor_attrs | rw._variable_attrs.get(cls, set()) if info else set()
    if cls not in rw.index.module_classes or recv.attr.value not in held:
        return None
    value = cst.Integer("0") if meth == "zero_" else new_call.args[0].value
    target = cst.Subscript(new_recv, [cst.SubscriptElement(cst.Index(cst.Ellipsis()))])
    return cst.Assign([cst.AssignTarget(target)], value)


def child_write(rw, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Expr | None:
    """``model._modules[name] = child`` -> ``torch_set_child(model, name, child)``."""
    if len(original_node.targets) != 1 or not _nnx(rw):
        return None
    target = updated_node.targets[0].target
    if not m.matches(target, m.Subscript(value=m.Attribute(attr=m.Name("_modules")))) or len(
            target.slice) != 1 or not isinstance(target.slice[0].slice, cst.Index):
        return None
    return cst.Expr(cst.Call(cst.Name("torch_set_child"), [
        cst.Arg(target.value.value), cst.Arg(target.slice[0].slice.value),
        cst.Arg(updated_node.value)]))


def _meta(rw, node: cst.BaseExpression) -> bool:
    """``torch.device("meta")`` or ``"meta"``."""
    if isinstance(node, cst.Call) and rw.q(node.func) == "torch.device" and len(
            node.args) == 1:
        node = node.args[0].value
    return try_literal(node, None) == "meta"


def meta_device_test(rw, test: cst.BaseExpression, if_test: bool = False) -> bool | None:
    """The constant value of a test whether a tensor is on torch's meta device
    (``x.device != torch.device("meta")``, ``x.device.type == "meta"``, ``x.is_meta``),
    else None. ``if_test``: only as the test of an ``if`` (which folds it)."""
    if if_test:
        parent = rw.get_metadata(ParentNodeProvider, test, None)
        if not isinstance(parent, cst.If) or parent.test is not test:
            return None
    if m.matches(test, m.Attribute(attr=m.Name("is_meta"))):
        return False
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    left, right = test.left, test.comparisons[0].comparator
    op = test.comparisons[0].operator
    if not isinstance(op, (cst.Equal, cst.NotEqual)):
        return None
    device = m.Attribute(attr=m.Name("device")) | m.Attribute(
        attr=m.Name("type"), value=m.Attribute(attr=m.Name("device")))
    if not (m.matches(left, device) and _meta(rw, right)
            or m.matches(right, device) and _meta(rw, left)):
        return None
    return isinstance(op, cst.NotEqual)


def constant_if(rw, original_node: cst.If, updated_node: cst.If, value: bool):
    """An ``if`` whose test is the constant ``value``: its body in its place (True) or its
    ``else`` (False; nothing where it has none)."""
    parent = rw.get_metadata(ParentNodeProvider, original_node, None)
    elif_ = isinstance(parent, cst.If) and parent.orelse is original_node
    if value:
        if elif_:
            return cst.Else(body=updated_node.body)
        body = list(updated_node.body.body)
        body[0] = body[0].with_changes(leading_lines=[*updated_node.leading_lines,
                                                      *body[0].leading_lines])
        return cst.FlattenSentinel(body)
    other = updated_node.orelse
    if other is None:
        return cst.RemoveFromParent()
    if elif_:
        return other  # an elif's place takes an elif or an else
    if isinstance(other, cst.If):
        return other.with_changes(leading_lines=updated_node.leading_lines)
    return cst.FlattenSentinel(list(other.body.body))
