"""Attributes, methods and in-place ops: ``leave_Attribute`` (torch names, layer weights,
attributes of module classes), annotations, what a receiver holds (tensor or not), and
in-place updates (``x.add_(y)``, ``x[i].zero_()``).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.tensor_calls import tensor_result, torch_only_call
from torch2jax.analysis.value_choices import literal_choices
from torch2jax.analysis.walk import findall
from torch2jax.passes import built_weights as bw
from torch2jax.passes import optional_buffers
from torch2jax.passes.common import (
    arg,
    bind,
    call,
    code,
    expr,
    py,
    try_literal,
)
from torch2jax.passes.conv_attributes import conv_attribute
from torch2jax.passes.device_attributes import device_attribute
from torch2jax.passes.layer_weight_writes import copied_into, operated, updated_at
from torch2jax.passes.module_surgery import held_tensor_write
from torch2jax.passes.named_results import named_field
from torch2jax.passes.rewrite_annotations import AnnotationsMixin
from torch2jax.passes.rewrite_support import (
    _CONV_ATTRS,
    _CONVERSIONS,
    _FINAL,
    _INPLACE_DTYPE,
    _LAYER_ATTRS,
    _MADE,
    AMBIGUOUS_METHODS,
    DTYPES,
    INPLACE_OPS,
    ONE_BY_ONE,
    _fix_commas,
)
from torch2jax.passes.scaled_weights import scaled_sublayer_weight
from torch2jax.passes.sequential_items import sequential_elem_layout, sequential_layouts
from torch2jax.passes.sequential_names import indexed_sequential, iterated_sequential
from torch2jax.passes.variable_reads import given_to_jitted
from torch2jax.ruleset import Rule

# builtins that iterate their argument (or measure it)
_ITERATING = frozenset({"builtins.len", "builtins.enumerate", "builtins.reversed",
                        "builtins.list", "builtins.tuple", "builtins.iter", "builtins.zip"})


# what a tensor has besides its methods (rules/methods.toml): an argument whose other reads
# are these is taken for a tensor where its .device is read
_TENSOR_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "T", "mT", "H", "data",
                                "grad", "requires_grad", "is_cuda", "real", "imag", "layout"})

# torch's weight_norm functions read as values (an alias called later) -> the helper their
# calls become (rules/functions.toml, passes/helpers_weight_norm.py)
_WEIGHT_NORM_VALUES = {
    "torch.nn.utils.weight_norm": "torch_weight_norm",
    "torch.nn.utils.parametrizations.weight_norm": "torch_parametrized_weight_norm",
}
# torch.dtype's properties (not called: a tensor's methods of these names are), by the
# numpy kind jnp.issubdtype tests
_DTYPE_PROPERTIES = {"is_floating_point": "floating", "is_complex": "complexfloating"}


class AttributesMixin(AnnotationsMixin):
    def _called(self, node: cst.Attribute) -> bool:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        return isinstance(parent, cst.Call) and parent.func is node

    def leave_UnaryOperation(self, original_node, updated_node):
        # not self.training: self.deterministic (a bool), not `not not self.deterministic`
        if (isinstance(original_node.operator, cst.Not)
                and m.matches(original_node.expression,
                              m.Attribute(value=m.Name("self"), attr=m.Name("training")))
                and m.matches(updated_node.expression, m.UnaryOperation(
                    operator=m.Not(), expression=m.Attribute(
                        value=m.Name("self"), attr=m.Name("deterministic"))))):
            return updated_node.expression.expression.with_changes(
                lpar=updated_node.lpar, rpar=updated_node.rpar)
        return updated_node

    def _inplace_rule(self, call: cst.Call) -> Rule | None:
        """``x.masked_fill_(m, v)`` as a statement on a name: the rule of ``masked_fill``
        (the statement becomes ``x = jnp.where(m, v, x)``, see :meth:`_inplace`); not for the
        methods whose in-place form keeps the receiver's dtype (``eq_``, ``ne_``)."""
        meth = call.func.attr.value
        if (not meth.endswith("_") or meth.startswith("_") or meth[:-1] in _INPLACE_DTYPE
                or meth in ("zero_", "fill_", *INPLACE_OPS)
                or not isinstance(call.func.value, cst.Name)
                or not isinstance(self.get_metadata(ParentNodeProvider, call, None), cst.Expr)):
            return None
        return self.rules.methods.get(meth[:-1])

    def _own_tensor_attr(self, node: cst.BaseExpression) -> str | None:
        """``self.A_log`` (or ``self.A_log.data``) where the class holds a parameter or
        buffer of that name (``nn.Parameter``, ``register_buffer``, ``nn.Buffer``): the name."""
        if m.matches(node, m.Attribute(attr=m.Name("data"))):
            node = node.value
        info = self.index.classes.get(self.current_class or "")
        if info and m.matches(node, m.Attribute(value=m.Name("self"))) and (
                node.attr.value in info.tensor_attrs
                or node.attr.value in self._variable_attrs.get(self.current_class, ())):
            return node.attr.value  # (a buffer too: self.register_buffer("idxs", ...))
        return None

    def _param_copy(self, original_node, updated_node):
        """``self.A_log.copy_(v)`` / ``self.A_log.data.copy_(v)`` (Mamba's, under no_grad;
        transformers' ``init.copy_(self.A_log, v)``) and ``self.A_log.data = v`` on a parameter
        or buffer of the class: its value rebound (copy_ keeps its shape and dtype)."""
        if isinstance(original_node, cst.Assign):
            target = original_node.targets[0].target if len(original_node.targets) == 1 else None
            if target is None or not m.matches(target, m.Attribute(attr=m.Name("data"))):
                return None
            name = self._own_tensor_attr(target)
            return None if name is None else cst.Assign(
                targets=[cst.AssignTarget(expr(f"self.{name}.value"))], value=updated_node.value)
        call_node = original_node.value
        name = self._own_tensor_attr(call_node.func.value)
        if name is None or len(call_node.args) != 1 or call_node.args[0].keyword:
            return None
        value = updated_node.value.args[0].value if isinstance(updated_node.value, cst.Call) \
            and len(updated_node.value.args) == 1 else call_node.args[0].value
        self.need("jnp")
        return cst.Assign(targets=[cst.AssignTarget(expr(f"self.{name}.value"))], value=expr(
            "jnp.broadcast_to(jnp.asarray({v}, dtype={p}.dtype), {p}.shape)", v=value,
            p=expr(f"self.{name}.value")))

    def _layer_weight(self, node: cst.BaseExpression):
        """``self.v.weight`` (or its ``.data``), a weight or bias of a layer of the class:
        (the flax parameter's value, ``self.v.kernel.value``; its layout; the torch layer),
        else None."""
        if m.matches(node, m.Attribute(attr=m.Name("data"))):
            node = node.value
        if not self.current_class or not self.target.stateful_modules or not m.matches(
                node, m.Attribute(value=m.Attribute(value=m.Name("self")),
                                  attr=m.Name("weight") | m.Name("bias"))):
            return None  # (NNX: the parameters are attributes, rebound through .value)
        layer = self._inherited_attr_rule(node.value.attr.value) or ""
        rule = self.rules.layers.get(layer)
        wm = rule.weights.get(node.attr.value) if rule is not None else None
        if wm is None or not wm.to:
            return None
        return expr(f"self.{node.value.attr.value}.{wm.to}.value"), wm.layout, layer

    def _layer_weight_write(self, original_node, updated_node, op: str | None = None):
        """A write into a layer's weight or bias in torch's layout (timm's convit
        ``local_init``): ``self.v.weight.data.copy_(torch.eye(dim))`` (``op`` None),
        ``self.pos.weight.data[:, -1] = -1`` (``op`` "set", "add", ...: the statement is an
        assignment to a subscript), ``self.pos.weight.data *= s`` (``op`` "*", ...): the flax
        parameter's value rebound, in its layout (passes/layer_weight_writes.py)."""
        if op is None:
            call_node, new_call = original_node.value, updated_node.value
            if len(call_node.args) != 1 or call_node.args[0].keyword or call_node.args[0].star \
                    or not isinstance(new_call, cst.Call) or len(new_call.args) != 1:
                return None
            found = self._layer_weight(call_node.func.value)
            value = found and copied_into(*found, new_call.args[0].value)
        elif isinstance(original_node, cst.AugAssign) and not isinstance(
                original_node.target, cst.Subscript):
            found = self._layer_weight(original_node.target)
            number = isinstance(original_node.value, (cst.Integer, cst.Float)) or (
                self.values is not None and self.values.kind(original_node.value)
                == vk.Kind.SCALAR)
            value = found and operated(*found, op, updated_node.value, number)
        else:  # updated_node: (the subscript written, translated; the value)
            target = (original_node.target if isinstance(original_node, cst.AugAssign)
                      else original_node.targets[0].target)
            found = self._layer_weight(target.value)
            value = found and updated_at(*found, updated_node[0].slice, op, updated_node[1])
        if not value:
            return None
        self.need("jnp")
        return cst.Assign(targets=[cst.AssignTarget(found[0])], value=value)

    def _param_fill_in_place(self, original_node, updated_node, meth: str):
        """``self.input_min.fill_(-inf)`` / ``self.A.zero_()`` / ``self.A.mul_(s)`` (or through
        ``.data``) on a parameter or buffer of the class (gemma4_vit's clip buffers): its value
        rebound, in its shape and dtype (``jnp.full_like``, ``jnp.zeros_like``; an operation's
        result by a tensor cast back, as torch's in-place one keeps the receiver's dtype)."""
        call_node = original_node.value
        name = self._own_tensor_attr(call_node.func.value)
        new_call = updated_node.value
        if name is None or not isinstance(new_call, cst.Call) or any(
                a.keyword or a.star for a in call_node.args) or len(call_node.args) != (
                    0 if meth == "zero_" else 1):
            return None
        p = expr(f"self.{name}.value")
        self.need("jnp")
        if meth == "zero_":
            value = expr("jnp.zeros_like({p})", p=p)
        elif meth == "fill_":
            value = expr("jnp.full_like({p}, {v})", p=p, v=new_call.args[0].value)
        elif isinstance(call_node.args[0].value, (cst.Integer, cst.Float)):
            # (a Python number is weakly typed: the parameter's dtype is kept)
            value = expr("{p} " + INPLACE_OPS[meth] + " {v}", p=p, v=new_call.args[0].value)
        else:
            value = expr("({p} " + INPLACE_OPS[meth] + " {v}).astype({p}.dtype)", p=p,
                         v=new_call.args[0].value)
        return cst.Assign(targets=[cst.AssignTarget(p)], value=value)

    def _inplace(self, original_node, updated_node, meth: str):
        call_node = original_node.value
        recv = call_node.func.value
        new_value = updated_node.value  # the rewritten call, if a rule matched the base name
        if meth == "copy_" and self.current_class:
            copied = self._param_copy(original_node, updated_node) or self._layer_weight_write(
                original_node, updated_node)
            if copied is not None:
                return copied
        written = self._built_writes.get(id(call_node.func)) if meth == "copy_" else None
        if written is not None and len(updated_node.value.args) == 1:  # a built layer's weight
            self.need("jnp")
            layer, wm, q = written
            return bw.copied(layer, wm, q, updated_node.value.args[0].value)
        if meth in ("zero_", "fill_", *INPLACE_OPS) and self.current_class:
            filled = self._param_fill_in_place(original_node, updated_node, meth)
            if filled is not None:
                return filled
        if isinstance(recv, (cst.Subscript, cst.Attribute)) and meth in (
                "zero_", "fill_", "copy_", *INPLACE_OPS):
            indexed = self._inplace_indexed(original_node, updated_node, meth)
            if indexed is not None:
                return indexed
        scaled = self._scaled_layer_param(original_node, updated_node, meth) or (
            scaled_sublayer_weight(self, original_node, updated_node, meth)) or (
            held_tensor_write(self, original_node, updated_node, meth))  # new.weight.copy_(v)
        if scaled is not None:
            return scaled
        if not isinstance(recv, cst.Name):
            self.diag(original_node, "inplace", "error",
                      f"in-place {meth} on an expression: JAX arrays are immutable")
            return updated_node
        if meth in INPLACE_OPS and call_node.args:
            new_value = expr("{x} " + INPLACE_OPS[meth] + " {y}", x=recv,
                             y=updated_node.value.args[0].value if isinstance(
                                 updated_node.value, cst.Call) else call_node.args[0].value)
        elif meth == "zero_":
            new_value = expr("jnp.zeros_like({x})", x=recv)
        elif meth == "fill_" and call_node.args:
            new_value = expr("jnp.full_like({x}, {v})", x=recv, v=call_node.args[0].value)
        elif isinstance(new_value, cst.Call) and code(new_value.func).endswith(meth):
            self.diag(original_node, "inplace", "error", f"in-place method {meth}")
            return updated_node
        self._note_imports(new_value)
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(recv.value))], value=new_value)

    def _scaled_layer_param(self, original_node, updated_node, meth: str):
        """``module.weight.data.mul_(head_init_scale)`` (timm's convnext ``_init_weights``) on a
        layer's weight or bias translated to its flax parameter (``module.kernel``): the
        parameter's value rebound, scaled. Only by a number: a scale is the same in any
        layout, a tensor would meet the kernel's transposed axes."""
        call_node = original_node.value
        recv, new_recv = call_node.func.value, updated_node.value.func.value if isinstance(
            updated_node.value, cst.Call) and isinstance(updated_node.value.func,
                                                         cst.Attribute) else None
        if meth not in ("mul_", "div_") or new_recv is None or len(call_node.args) != 1 or (
                call_node.args[0].keyword or call_node.args[0].star):
            return None
        if m.matches(recv, m.Attribute(attr=m.Name("data"))):
            recv = recv.value
        if m.matches(new_recv, m.Attribute(attr=m.Name("data"))):
            new_recv = new_recv.value
        if not (m.matches(recv, m.Attribute(attr=m.Name("weight") | m.Name("bias")))
                and m.matches(new_recv, m.Attribute(attr=m.Name("kernel") | m.Name("bias")
                                                    | m.Name("scale") | m.Name("embedding")))):
            return None
        factor = call_node.args[0].value
        if not (isinstance(factor, (cst.Integer, cst.Float)) or (
                self.values is not None and self.values.kind(factor) == vk.Kind.SCALAR)):
            return None
        op = INPLACE_OPS[meth]
        target = expr("{p}.value", p=new_recv)
        return cst.Assign(targets=[cst.AssignTarget(target)], value=expr(
            "{p} " + op + " {y}", p=target, y=updated_node.value.args[0].value))

    def _inplace_indexed(self, original_node, updated_node, meth: str):
        """``qkv_bias[n : 2 * n].zero_()`` -> ``qkv_bias = qkv_bias.at[n : 2 * n].set(0)``
        (``fill_(v)``, ``copy_(v)``: ``.set(v)``); on a
        layer's bias in a module (``self.qkv.bias[n : 2 * n].data.zero_()``) the parameter's
        value is rebound."""
        call_node = original_node.value
        recv = call_node.func.value
        if m.matches(recv, m.Attribute(attr=m.Name("data"))):
            recv = recv.value
        if not isinstance(recv, cst.Subscript) or not isinstance(updated_node.value, cst.Call) \
                or not isinstance(updated_node.value.func, cst.Attribute):
            return None
        base = recv.value
        if isinstance(base, cst.Name):
            target = cst.Name(base.value)
            current = target
        elif (m.matches(base, m.Attribute(value=m.Attribute(value=m.Name("self")),
                                          attr=m.Name("bias")))
              and self.in_module_class()):
            # the layer's bias keeps its name and layout in NNX
            target = expr("{b}.value", b=base)
            current = target
        else:
            return None
        args = updated_node.value.args
        if meth == "zero_":
            op, value = "set", py(0)
        elif meth in ("fill_", "copy_") and len(args) == 1 and not args[0].keyword:
            # copy_ casts to the receiver's dtype and broadcasts, as .at[...].set does
            op, value = "set", args[0].value
        elif meth in INPLACE_OPS and args:
            op = {"add_": "add", "sub_": "subtract", "mul_": "multiply", "div_": "divide"}[meth]
            value = args[0].value
        else:
            return None
        index = cst.Subscript(value=expr("{c}.at", c=current), slice=recv.slice)
        return cst.Assign(targets=[cst.AssignTarget(target)],
                          value=call(expr("{i}." + op, i=index), arg(value)))

    def leave_DictElement(self, original_node, updated_node):
        return self._loader_dict_element(original_node, updated_node)

    def leave_Subscript(self, original_node, updated_node):
        if (self._in_annotation and self.q(original_node.value) in _FINAL
                and len(updated_node.slice) == 1
                and isinstance(updated_node.slice[0].slice, cst.Index)):
            # dynamic_img_pad: torch.jit.Final[bool] (a TorchScript constant): the type itself
            return updated_node.slice[0].slice.value
        lr = self._group_lr(original_node)
        if lr is not None:
            return lr
        item = self._loader_dict_item(original_node, updated_node) or indexed_sequential(
            self, original_node, updated_node)
        if item is not None:
            return item
        if (m.matches(updated_node.value, m.Attribute(
                value=m.Attribute(value=m.Name("self")), attr=m.Name("layers")))
                and m.matches(original_node.value, m.Attribute(value=m.Name("self")))
                and len(updated_node.slice) == 1
                and isinstance(updated_node.slice[0].slice, cst.Slice)):
            # self.layers[1:] of a Sequential: a Sequential of those layers
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            outer = self.get_metadata(ParentNodeProvider, parent, None) if isinstance(
                parent, cst.Arg) else None
            if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original_node or (
                    isinstance(outer, cst.Call) and self.q(outer.func) in _ITERATING):
                return updated_node  # iterated or measured: the layers themselves
            if self.target.setup_modules:
                self.diag(original_node, "torch.nn.Sequential", "error",
                          f"{code(original_node)}: a linen Sequential cannot be built in "
                          "__call__; call the layers in a loop")
                return updated_node
            self.need("nnx")
            return expr("nnx.Sequential(*{s})", s=updated_node)
        # [x][0], left by a rewrite that returns a one-element list (get_last_lr()[0])
        if (isinstance(updated_node.value, cst.List) and len(updated_node.value.elements) == 1
                and not isinstance(original_node.value, cst.List)
                and len(updated_node.slice) == 1
                and m.matches(updated_node.slice[0].slice, m.Index(value=m.Integer("0")))):
            return updated_node.value.elements[0].value
        return updated_node

    def leave_Name(self, original_node, updated_node):
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        items = self._sequential_self(original_node, parent) or iterated_sequential(
            self, original_node, parent)
        if items is not None:
            return items
        if self._in_annotation and not isinstance(parent, cst.Attribute):
            return self._annotation_type(original_node) or updated_node
        if not isinstance(parent, cst.Attribute):
            if self._tensor_type_value(original_node, parent):
                self.need("jax")
                return expr("jax.Array")
            return self._layer_class_value(original_node) or updated_node
        return updated_node

    def _sequential_self(self, original: cst.Name, parent) -> cst.BaseExpression | None:
        """``self`` in a subclass of nn.Sequential, iterated (``for layer in self``,
        ``enumerate(self)``), indexed (``self[0]``), measured (``len(self)``) or grown
        (``self.append(layer)``, ``extend``): nnx.Sequential is none of these, its
        list of layers is, ``self.layers``. One whose layers run channels-last (the
        translation put transposes among them) is marked: its items are not torch's."""
        if original.value != "self" or not self.in_module_class() or not (
                self.target.stateful_modules):
            return None
        info = self.index.classes[self.current_class]
        if info.container != "sequential":
            return None
        used = isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original or \
            isinstance(parent, cst.Subscript) and parent.value is original or \
            isinstance(parent, cst.Attribute) and parent.value is original and \
            parent.attr.value in ("append", "extend", "insert", "pop")
        if not used and isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            used = isinstance(outer, cst.Call) and self.q(outer.func) in _ITERATING
        if not used:
            return None
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("insert", "pop"):
            self.diag(original, "torch.nn.Sequential", "error",
                      f"self.{parent.attr.value}(...) in an nn.Sequential subclass: NNX's list "
                      "of layers cannot shift the functions (activations) it holds; build "
                      "the layers in order")
            return None
        if info.self_elem_layout not in (None, "any", "torch"):
            self.diag(original, "torch.nn.Sequential", "error",
                      "an nn.Sequential subclass iterated, indexed or grown: its translation "
                      "holds channels-last layers (and the transposes around them), not "
                      "torch's items")
            return None
        return cst.Attribute(value=cst.Name("self"), attr=cst.Name("layers"))

    # ------------------------------------------------------------------ attributes
    def _sequential_items(self, original: cst.Attribute,
                          updated: cst.Attribute) -> cst.BaseExpression | None:
        """``self.layers`` (an nn.Sequential attribute) iterated (``for layer in self.layers``,
        ``enumerate(self.layers)``), indexed (``self.layers[0]``, ``[-1]``, a slice: see
        leave_Subscript) or measured (``len``): NNX's and linen's Sequential are none of
        these, their list of layers is: ``self.layers.layers``. A Sequential the translation
        put transposes into, or one whose layers run channels-last, is marked: its items are
        not torch's."""
        if not (self.current_class and m.matches(original, m.Attribute(value=m.Name("self")))
                and (self.target.stateful_modules or self.target.setup_modules)):
            return None
        info = self.index.classes.get(self.current_class)
        attr = original.attr.value
        if info is None:
            return None
        sub = self._sequential_subclass_attr(info, attr)
        if attr in info.attr_rule and info.attr_rule[attr] != "torch.nn.Sequential" and (
                sub is None):
            return None
        parent = self.get_metadata(ParentNodeProvider, original, None)
        used = isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original or \
            isinstance(parent, cst.Subscript) and parent.value is original
        if not used and isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            used = isinstance(outer, cst.Call) and self.q(outer.func) in _ITERATING
        if not used:
            return None
        if sub is not None:
            # self.features = SequentialList(...), a Sequential subclass of the file whose
            # layers are torch's items (timm's selecsls: len(self.features))
            return updated.with_changes(value=updated, attr=cst.Name("layers"))
        if attr not in info.attr_rule and sequential_layouts(self, info, attr) is None:
            return None  # (not a Sequential; one a function of the file returns is)
        if sequential_elem_layout(self, info, attr) is None:  # (channels-last items: called
            # between transposes, rewrite_layout.py)
            self.diag(original, "torch.nn.Sequential", "error",
                      f"self.{attr} iterated or indexed: its translation holds channels-last "
                      "layers (and the transposes around them), not torch's items")
            return None
        return updated.with_changes(value=updated, attr=cst.Name("layers"))

    def _built_in_scope(self, ctor: cst.Call) -> dict[str, str]:
        """The layouts of the lists of layers of the function ``ctor`` is in (``stages``
        of ``nn.Sequential(*stages)``, built by ``stages.append(stage)``: timm's fastvit)."""
        node: cst.CSTNode | None = ctor
        while node is not None and not isinstance(node, cst.FunctionDef):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return {} if node is None else {name: lay for (fid, name), lay in
                                        self.index.list_layouts.items() if fid == id(node)}

    def _sequential_subclass_attr(self, info, attr: str):
        """The Sequential subclass of the file that ``self.<attr>`` is always built as, where
        its layers are torch's items (no transposes among them); else None."""
        built = info.built_by.get(attr) or set()
        if len(built) != 1 or attr in info.attr_rule:
            return None
        sub = self.index.classes.get(next(iter(built)))
        if sub is None or sub.container != "sequential" or (
                sub.self_elem_layout not in ("torch", "any")):
            return None
        return sub

    def leave_Attribute(self, original_node, updated_node):
        helper = _WEIGHT_NORM_VALUES.get(self.q(original_node) or "")
        if helper is not None:
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if not (isinstance(parent, cst.Call) and parent.func is original_node):
                # weight_norm = nn.utils.parametrizations.weight_norm (wav2vec2): the helper
                # its calls become (rules/functions.toml)
                return cst.Name(helper)
        kind = _DTYPE_PROPERTIES.get(original_node.attr.value)
        if kind is not None and not self._called(original_node) and not (
                self.q(original_node) or "").startswith("torch."):  # (torch.is_complex)
            # dtype.is_floating_point: a property of torch.dtype (a tensor's is a method,
            # called); a JAX dtype has none, jnp.issubdtype answers it
            self.need("jnp")
            return expr(f"jnp.issubdtype({{d}}, jnp.{kind})", d=updated_node.value)
        device = device_attribute(self, original_node) or named_field(
            original_node, updated_node) or conv_attribute(self, original_node, updated_node)
        if device is not None:
            return device
        renamed = self._layer_attribute(original_node, updated_node)
        if renamed is not None:
            return renamed
        items = self._sequential_items(original_node, updated_node) or iterated_sequential(
            self, original_node, None, updated_node)
        if items is not None:
            return items
        if original_node.attr.value == "data" and id(original_node.value) in self._weight_reads:
            return updated_node.value  # model.weight.data: the array read above
        if original_node.attr.value == "data" and (
                id(original_node.value) in self._detached_weight_reads):
            # self.fc.weight.data read in a method: torch's detached tensor, the array
            # without a gradient
            self.need("jax")
            return expr("jax.lax.stop_gradient({w})", w=updated_node.value)
        weight = self._built_layer_weight(original_node, updated_node)
        if weight is not None:
            return weight
        detached = self._data_read(original_node, updated_node)
        if detached is not None:
            return detached
        if self.current_class is not None and self._layer_subclass_rule(
                self.current_class) is not None:
            if (original_node.attr.value == "T" and m.matches(updated_node.value, m.Attribute(
                    value=m.Attribute(attr=m.Name("value")), attr=m.Name("T")))
                    and m.matches(original_node.value, m.Attribute(value=m.Name("self")))):
                return updated_node.value.value  # self.weight.T of nn.Linear: the kernel
            mapped = self._layer_subclass_attribute(original_node, updated_node)
            if mapped is not None:
                return mapped
        if (original_node.attr.value == "module" and isinstance(original_node.value, cst.Name)
                and original_node.value.value in self.data.wrapped):
            return updated_node.value  # DDP(model).module: the model itself
        if original_node.attr.value in ("dataset", "sampler", "batch_size") and (
                self.values is not None and self.values.kind(original_node.value)
                == vk.Kind.LOADER):
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            holder = self.get_metadata(ParentNodeProvider, parent, None)
            if (original_node.attr.value == "dataset" and self.data.dataset_length_known()
                    and isinstance(parent, cst.Arg) and isinstance(holder, cst.Call)
                    and m.matches(holder, m.Call(func=m.Name("len"), args=[m.Arg(keyword=None,
                                                                                star="")]))):
                # len(loader.dataset): the examples before .batch(...)
                return expr("{l}.parents[0]", l=updated_node.value)
            self.diag(original_node, "torch.utils.data.DataLoader", "error",
                      f"{code(original_node)}: the loader is a grain pipeline, which has no "
                      f".{original_node.attr.value}: read it from what the loader was built "
                      "from")
        if (original_node.attr.value == "forward" and self.in_module_class()
                and (m.matches(original_node.value, m.Call(func=m.Name("super")))
                     or self._is_module_expr(original_node.value))):
            # super().forward(x), layer.forward(h) (SqueezeBERT's encoder): the module's call
            return updated_node.with_changes(attr=cst.Name("__call__"))
        if self._in_annotation and not isinstance(
                self.get_metadata(ParentNodeProvider, original_node, None), cst.Attribute):
            # the whole dotted name (torch.nn.Module), not its prefix (torch.nn)
            mapped = self._annotation_type(original_node)
            if mapped is not None:
                return mapped
        if not isinstance(self.get_metadata(ParentNodeProvider, original_node, None),
                          cst.Attribute):
            factory = self._layer_class_value(original_node)
            if factory is not None:
                return factory
        q = self.q(original_node)
        if q in self.rules.functions and not self._in_annotation:
            value = self._function_value(original_node, self.rules.functions[q])
            if value is not None:
                return value
        if q and q.startswith("torch."):
            short = q[len("torch."):]
            if short in ("pi", "e", "inf", "nan"):  # torch's constants (math's)
                self.need("jnp")
                return expr(f"jnp.{short}")
            if short in DTYPES:
                if short in ("int64", "long"):
                    self.diag(original_node, "dtype", "info",
                              "torch.int64 becomes jnp.int32 (JAX's default integer width)")
                self.need("jnp")
                return expr(DTYPES[short])
            if q in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor"):
                self.need("jax")
                return expr("jax.Array")
        if original_node.attr.value == "requires_grad" and isinstance(self.get_metadata(
                ParentNodeProvider, original_node, None), cst.AssignTarget) and (
                self._freezes_one_by_one(original_node, original_node.value)):
            self.diag(original_node, "requires_grad", "error", ONE_BY_ONE)
            return updated_node
        if original_node.attr.value == "requires_grad" and self._a_models_parameter(
                original_node.value):
            if self.file_freezes and m.matches(self.get_metadata(
                    ParentNodeProvider, original_node, None), m.UnaryOperation(m.Not())):
                self.diag(original_node, "requires_grad", "error", "not p.requires_grad: the "
                          "frozen parameters are the model's FrozenParams (nnx.state(model, "
                          "FrozenParam))")  # (a file that freezes reads every parameter)
            return cst.Name("True")  # (the trainable ones are the model's nnx.Params)
        if (original_node.attr.value == "requires_grad" and self.in_module_class()
                and not isinstance(self.get_metadata(ParentNodeProvider, original_node, None),
                                   cst.AssignTarget)
                and not self._in_removed_line(original_node)):
            # densenet's any_requires_grad (behind memory_efficient=False)
            self.diag(original_node, "requires_grad", "error",
                      "x.requires_grad: JAX arrays carry no such flag (jax.grad differentiates "
                      "with respect to the arguments it is given)")
        if m.matches(original_node, m.Attribute(value=m.Name("self"), attr=m.Name("training"))) \
                and self.in_module_class():
            self._training_reads[self.current_class] = self._training_reads.get(
                self.current_class, 0) + 1
            return expr(self.target.training_flag)
        if self.target.setup_modules and m.matches(original_node.value,
                                                   m.Attribute(value=m.Name("self"))) \
                and self.in_module_class() and self.index.classes[
                    self.current_class].attr_rule.get(original_node.value.attr.value) == \
                "torch.nn.ModuleDict":
            # a linen dict of submodules is indexed: self.transformer["wte"]
            return cst.Subscript(value=updated_node.value, slice=[cst.SubscriptElement(
                cst.Index(cst.SimpleString(f'"{original_node.attr.value}"')))])
        if original_node.attr.value in ("values", "indices") and isinstance(
                updated_node.value, cst.Tuple) and len(updated_node.value.elements) == 2:
            # x.max(dim).values / .indices after max(dim) became (max, argmax)
            return updated_node.value.elements[
                0 if original_node.attr.value == "values" else 1].value
        if (original_node.attr.value == "param_groups" and isinstance(original_node.value, cst.Name)
                and original_node.value.value in self.training.optimizer_names):
            outer = self.get_metadata(ParentNodeProvider, original_node, None)
            outer = self.get_metadata(ParentNodeProvider, outer, None) if outer else None
            outer2 = self.get_metadata(ParentNodeProvider, outer, None) if outer else None
            read = isinstance(outer, cst.Subscript) and self._group_lr(outer) is not None and \
                not isinstance(outer2, cst.AssignTarget) or id(self.get_metadata(
                    ParentNodeProvider, original_node, None)) in self._lr_loops
            if not read:
                self.diag(original_node, "param_groups", "error",
                          "optimizer.param_groups used other than to read the learning rate: "
                          "build the optimizer with optax.inject_hyperparams and set "
                          "opt_state.hyperparams['learning_rate']")
        if isinstance(original_node.value, (cst.Name, cst.Attribute)) and (
                original_node.attr.value in ("weight", "bias", "running_mean", "running_var")):
            # (isinstance(m, nn.Linear) / isinstance(self.heads.head, nn.Linear) above)
            layers = self._narrowed_layer(original_node, code(original_node.value))
            if layers:
                # several classes (isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))): only when
                # they name this weight alike
                tos = {getattr(self.rules.layers[n].weights.get(original_node.attr.value),
                               "to", None) for n in layers}
                if len(tos) == 1:
                    to = tos.pop()
                    if to and to != original_node.attr.value:
                        return updated_node.with_changes(attr=cst.Name(to))
        if isinstance(original_node.value, (cst.Name, cst.Attribute)) and (
                original_node.attr.value in _CONV_ATTRS):
            # fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels (regnet's init)
            layers = self._narrowed_layer(original_node, code(original_node.value))
            if layers and all(self.rules.layers[n].special == "conv" for n in layers):
                return updated_node.with_changes(
                    attr=cst.Name(_CONV_ATTRS[original_node.attr.value]))
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Name("self")))):
            # nn.init.zeros_(self.head.weight): the layer's JAX name for it (kernel)
            layer = self._inherited_attr_rule(original_node.value.attr.value)
            rule = self.rules.layers.get(layer)
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            as_value = wm is not None and wm.to and self._weight_read_as_value(original_node)
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if as_value and isinstance(parent, cst.Attribute) and parent.attr.value == "data":
                self._detached_weight_reads.add(id(original_node))
            if wm is not None and wm.to and wm.to != original_node.attr.value:
                renamed = updated_node.with_changes(attr=cst.Name(wm.to))
                if wm.layout in ("as_is", "any") or not as_value:
                    return renamed
                if wm.layout == "transpose":
                    # shifted_window_attention(x, self.qkv.weight, ...) computes with torch's
                    # (out, in) layout: the NNX kernel is (in, out)
                    return expr("{k}.T", k=renamed)
                if wm.layout == "conv" and self.target.setup_modules:
                    self.diag(original_node, "layer-weight", "error",
                              f"{code(original_node)}: linen's nn.Conv keeps its kernel in the "
                              "variables, not as an attribute a parent reads; declare the kernel "
                              "with self.param and call jax.lax.conv_general_dilated instead")
                    return renamed
                if wm.layout == "conv" and (layer or "")[-2:] in ("1d", "2d", "3d"):
                    # self.conv.weight.shape, F.conv2d(x, self.conv.weight): torch's
                    # (out, in, *kernel) from the NNX kernel's (*kernel, in, out)
                    nd = int(layer[-2])
                    self.need("jnp")
                    return expr(f"jnp.transpose({{k}}, {(nd + 1, nd, *range(nd))})", k=renamed)
                self.diag(original_node, "layer-weight", "error",
                          f"{code(original_node)}: the JAX layer lays this weight out otherwise "
                          f"({wm.layout}); read here in torch's layout, it is not translated")
                return renamed
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Attribute(
                    value=m.Name("self"))))):
            # self.transformer.wpe.weight, transformer a ModuleDict built with its layers
            rule = self.rules.layers.get(self._dict_item_rule(
                original_node.value.value.attr.value, original_node.value.attr.value) or "")
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            if wm is not None and wm.to and wm.to != original_node.attr.value and not (
                    wm.layout == "transpose" and self._weight_read_as_value(original_node)):
                return updated_node.with_changes(attr=cst.Name(wm.to))
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Attribute()))):
            # self.embeddings.patch_embeddings.projection.weight.dtype (ViT): a layer reached
            # through module classes of the file; its dtype (any layout), or an as-is weight
            rule = self.rules.layers.get(self._chain_layer_rule(original_node.value) or "")
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if wm is not None and wm.to and wm.to != original_node.attr.value and (
                    wm.layout == "as_is" or (isinstance(parent, cst.Attribute)
                                             and parent.attr.value == "dtype")):
                return updated_node.with_changes(attr=cst.Name(wm.to))
        if self.in_module_class() and m.matches(original_node.value, m.Attribute(
                value=m.Name("self") | m.Attribute())) and any(
                    original_node.attr.value in t for t in _LAYER_ATTRS.values()):
            # self.embed_tokens.embedding_dim, self.a.b.conv.out_channels: the NNX layer's
            # name for the size (nnx.Embed's features, nnx.Conv's out_features)
            inner = original_node.value
            q = (self._inherited_attr_rule(inner.attr.value)
                 if m.matches(inner.value, m.Name("self")) else self._chain_layer_rule(inner))
            rule = self.rules.layers.get(q or "")
            to = _LAYER_ATTRS.get(rule.special or "", {}).get(original_node.attr.value) \
                if rule is not None else None
            if to:
                return updated_node.with_changes(attr=cst.Name(to))
        if (self.target.stateful_modules and self.in_module_class()
                and m.matches(original_node.value, m.Name("self"))
                and original_node.attr.value in self._variable_attrs.get(
                    self.current_class, ())):
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            outer = self.get_metadata(ParentNodeProvider, parent, None) if isinstance(
                parent, cst.Arg) else None
            callee = (self.q(outer.func) or "") if isinstance(outer, cst.Call) else ""
            rule = self.rules.functions.get(callee)
            if isinstance(outer, cst.Call) and (not callee.startswith("torch") or (
                    rule is not None and rule.special in ("conv_function",
                                                           "conv_transpose_function"))) or (
                    given_to_jitted(self, original_node)):  # jax.nn.sigmoid(self.alpha[...])
                # _get_relative_position_bias(self.relative_position_bias_table, ...): a
                # function of the file computes with the array, not the nnx.Variable (x[...]
                # reads it; the equinox pass keeps it, a plain array's x[...] being x);
                # F.conv2d(x, self.weight) too: jax.lax takes arrays only (None stays None)
                return optional_buffers.optional_read(
                    self, original_node.attr.value, expr("{v}[...]", v=updated_node), updated_node)
            if isinstance(parent, cst.Index):
                # table[self.relative_position_index]: an index is an array, not the
                # nnx.Variable that holds it
                return expr("{v}[...]", v=updated_node)
        if (original_node.attr.value in _CONV_ATTRS and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Name("self")))):
            # self.conv_proj.in_channels (vit's init)
            rule = self.rules.layers.get(self.index.classes[self.current_class].attr_rule.get(
                original_node.value.attr.value, ""))
            if rule is not None and rule.special == "conv":
                return updated_node.with_changes(
                    attr=cst.Name(_CONV_ATTRS[original_node.attr.value]))
        return updated_node

    # torch layers whose equinox layer names its weights and lays them out as torch does
    EQX_TORCH_WEIGHTS = frozenset({"torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d",
                                   "torch.nn.Conv3d", "torch.nn.Embedding", "torch.nn.LayerNorm",
                                   "torch.nn.GroupNorm"})

    def _built_layer_weight(self, original_node: cst.Attribute, updated_node: cst.Attribute
                            ) -> cst.BaseExpression | None:
        """``model.weight`` (``.bias``, ``.data`` after it) where ``model`` holds a torch layer
        the file built (``model = nn.Linear(3, 4)``, or ``net.fc`` of a model of the file's
        class, value analysis): read,
        the target layer's array in torch's layout (NNX ``model.kernel[...].T``; equinox
        keeps torch's names and layouts); written, or on linen (a layer object holds no
        parameters), marked. None: not such a read."""
        if original_node.attr.value not in ("weight", "bias") or self.values is None:
            return None
        root = original_node.value  # model.weight, net.fc.weight (self.fc.weight: below)
        while isinstance(root, (cst.Attribute, cst.Subscript)):  # (net.body[0].weight)
            root = root.value
        if not isinstance(root, cst.Name) or root.value == "self":
            return None
        q = self.values.layer(original_node.value)
        rule = self.rules.layers.get(q or "")
        wm = rule.weights.get(original_node.attr.value) if rule is not None else None
        if wm is None:
            return None
        read = original_node
        parent = self.get_metadata(ParentNodeProvider, read, None)
        if isinstance(parent, cst.Attribute) and parent.value is read and \
                parent.attr.value == "data":
            read, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(outer, cst.Call) and (self.q(outer.func) or "").startswith(
                    "torch.nn.init"):
                return None  # an initialiser's target (its own rule)
        holder = self.get_metadata(ParentNodeProvider, parent, None) if parent else None
        written = isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
            isinstance(parent, cst.Attribute) and parent.value is read and (
                parent.attr.value.endswith("_") or parent.attr.value in (
                    "grad", "requires_grad", "data"))) or (
            isinstance(parent, cst.Subscript) and isinstance(holder, (cst.AssignTarget,
                                                                      cst.AugAssign)))
        text = code(original_node)
        if written and self.target.stateful_modules and not self.target.intermediate and (
                bw.writable(wm, q, parent, holder, self.get_metadata(ParentNodeProvider,
                                                                     holder, None))):
            self._built_writes[id(holder.func if isinstance(holder, cst.Call) else parent)] = (
                updated_node.value, wm, q)
            return None
        if written or self.target.setup_modules or wm.to is None:
            why = ("a linen layer object holds no parameters: they are in the variables "
                   "model.init returns (variables['params'])"
                   if self.target.setup_modules and not written
                   else "written in place: the layer's array is immutable in JAX (build the "
                   "layer with an initializer instead)")
            self.diag(original_node, "layer-weight", "error",
                      f"{text} of the {q.rsplit('.', 1)[-1]} built outside a module: {why}")
            return None
        if self.target.intermediate:
            if q not in self.EQX_TORCH_WEIGHTS:
                self.diag(original_node, "layer-weight", "error",
                          f"{text}: the equinox layer of a {q.rsplit('.', 1)[-1]} may name or "
                          "lay out its weights otherwise; not translated")
                return None
            self._weight_reads.add(id(original_node))
            return updated_node  # torch's name and layout
        array = expr("{v}." + wm.to + "[...]", v=updated_node.value)
        if wm.layout == "transpose":
            array = expr("{a}.T", a=array)
        elif wm.layout == "conv" and q[-2:] in ("1d", "2d", "3d"):
            nd = int(q[-2])
            self.need("jnp")
            array = expr(f"jnp.transpose({{a}}, {(nd + 1, nd, *range(nd))})", a=array)
        elif wm.layout != "as_is":
            self.diag(original_node, "layer-weight", "error",
                      f"{text}: the JAX layer lays this weight out otherwise ({wm.layout}); "
                      "not translated")
            return None
        self._weight_reads.add(id(original_node))
        return array

    def _dict_item_rule(self, attr: str, key: str) -> str | None:
        """The torch layer of ``self.<attr>[key]`` when ``self.<attr>`` is an nn.ModuleDict
        built from a dict of layers (``nn.ModuleDict(dict(wpe=nn.Embedding(...)))``)."""
        info = self.index.classes.get(self.current_class or "")
        if info is None or info.attr_rule.get(attr) != "torch.nn.ModuleDict":
            return None
        ctor = info.attr_ctor.get(attr)
        if ctor is None or not ctor.args:
            return None
        items = ctor.args[0].value
        value = None
        if m.matches(items, m.Call(func=m.Name("dict"))):
            value = next((a.value for a in items.args if a.keyword is not None
                          and a.keyword.value == key), None)
        elif isinstance(items, cst.Dict):
            value = next((e.value for e in items.elements if isinstance(e, cst.DictElement)
                          and try_literal(e.key, None) == key), None)
        if not isinstance(value, cst.Call):
            return None
        try:
            return self.q(value.func)
        except Exception:  # noqa: BLE001 - a node of another tree: no metadata
            return None

    def _inherited_attr_rule(self, attr: str) -> str:
        """The torch layer ``self.<attr>`` is, set in this class or a module class of this
        file it derives from (ShiftedWindowAttentionV2 reads its base's self.qkv)."""
        info = self.index.classes.get(self.current_class or "")
        seen = set()
        while info is not None and info.name not in seen:
            seen.add(info.name)
            if attr in info.attr_rule:
                return info.attr_rule[attr]
            layer = self._built_layer_subclass(info, attr)
            if layer is not None:
                return layer
            info = self.index.classes.get(info.module_base or "")
        return ""

    def _built_layer_subclass(self, info, attr: str) -> str | None:
        """The torch layer that ``self.<attr>`` of class ``info`` extends, where one module
        class of this file builds it and that class derives from the JAX layer (timm's
        ``BatchNormAct2d(nn.BatchNorm2d)``, an ``nnx.BatchNorm`` whose weight is ``scale``)."""
        built = info.built_by.get(attr, set()) & self.index.module_classes
        if len(built) != 1:
            return None
        cls = next(iter(built))
        return self.index.classes[cls].layer_base if self._layer_subclass_rule(cls) else None

    def _chain_layer_rule(self, node: cst.BaseExpression) -> str | None:
        """The torch layer ``self.a.b.c`` is when ``self.a`` and ``.b`` are each built by one
        module class of this file (``self.embeddings = ViTEmbeddings(config)``) and ``c`` is a
        layer of the last one."""
        names: list[str] = []
        while isinstance(node, cst.Attribute):
            names.append(node.attr.value)
            node = node.value
        if not m.matches(node, m.Name("self")) or len(names) < 2:
            return None
        names.reverse()
        info = self.index.classes.get(self.current_class or "")
        for name in names[:-1]:
            if info is None:
                return None
            built = info.built_by.get(name, set()) & self.index.module_classes
            if len(built) != 1 or name in info.attr_rule:
                return None
            info = self.index.classes.get(built.pop())
        if info is None:
            return None
        return info.attr_rule.get(names[-1]) or self._built_layer_subclass(info, names[-1])

    def _weight_read_as_value(self, node: cst.Attribute) -> bool:
        """``self.fc.weight`` read for its values outside construction: handed to a function or
        computed with (not an nn.init target, not in ``__init__``, not an attribute's base)."""
        if not self._fn_stack or self._fn_stack[-1].name.value == "__init__":
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and parent.attr.value == "data":
            # self.fc.weight.data.normal_(...), self.fc.weight.data = ...: written in place;
            # w = self.fc.weight.data: read (detached)
            node, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(parent, cst.Subscript):
                return False  # self.fc.weight.data[0] = ..., .data[i].zero_(): in place
        if isinstance(parent, cst.Attribute) and (
                parent.attr.value in ("data", "grad") or parent.attr.value.endswith("_")):
            return False  # self.fc.weight.data.normal_(...): initialisation, in place
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)):
            return False
        if isinstance(parent, cst.Assign) and any(t.target is node for t in parent.targets):
            return False
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(outer, cst.Call) and (self.q(outer.func) or "").startswith(
                    "torch.nn.init"):
                return False
        return True

    # ------------------------------------------------------------------ tensor detection
    def _is_module_expr(self, node: cst.BaseExpression) -> bool:
        """``model`` / ``self`` / ``self.encoder``: things that are modules, not tensors."""
        if m.matches(node, m.Name("self")):
            return True
        if m.matches(node, m.Attribute(value=m.Name("self"))) and self.current_class:
            info = self.index.classes.get(self.current_class)
            return bool(info and node.attr.value in info.attr_layout
                        and node.attr.value not in info.tensor_attrs)
        if isinstance(node, cst.Name) and node.value in ("model", "net", "module"):
            return True
        # Net().to(device), self.transformer.h[0], a model passed to a function
        return self.values is not None and self.values.kind(node) == vk.Kind.MODULE

    def _receiver_unsure(self, recv: cst.BaseExpression, meth: str,
                         call: cst.Call | None = None) -> bool:
        """``recv.meth(...)`` where the value analysis cannot see what ``recv`` is and
        ``meth`` is also a method of other objects (``run.log``): marked, not rewritten,
        unless the call's arguments are a tensor's (``x.mean(dim=1)``, analysis/tensor_calls.py)
        and ``recv`` is not what another library returns (a torch value it keeps making)."""
        if self.values is None or self.values.kind(recv) != vk.Kind.UNKNOWN:
            return False
        if self._imported_result(recv):
            return True
        if call is not None and torch_only_call(call, meth) and not self.values._file_method(
                meth):  # a class of the file with that method may be the receiver
            return False
        if tensor_result(recv) and not self.values._file_method(recv.func.attr.value):
            return False
        return meth in vk.SHARED_METHODS

    def _imported_result(self, recv: cst.BaseExpression) -> bool:
        """What a function of another library returns (``Image.open(p)``,
        ``make_mask(...)``): any method on it is marked when its kind is not known."""
        if not isinstance(recv, cst.Call):
            return False
        q = self.q(recv)
        return bool(q) and not q.startswith("torch") and "." in q and "<locals>" not in q \
            and not q.startswith("self.")

    def _made(self, recv: cst.BaseExpression) -> bool:
        """A tensor made here (``torch.zeros(1, 1)``), through conversions of its dtype or
        device (``torch.zeros(1, 1).type_as(src)``): nothing else holds it."""
        while m.matches(recv, m.Call(func=m.Attribute(attr=m.Name()))) and (
                recv.func.attr.value in _CONVERSIONS):
            recv = recv.func.value
        return isinstance(recv, cst.Call) and self.q(recv.func) in _MADE

    def _inplace_value(self, original: cst.Call, updated: cst.Call,
                       meth: str) -> cst.BaseExpression | None:
        """``res.append(correct_k.mul_(100.0 / n))`` (pytorch/examples' ``accuracy``): an
        in-place method whose value is used, on a tensor held by a name, is the out-of-place
        method's value bound to the name again, ``(correct_k := correct_k * (100.0 / n))``.
        None where the method is not in-place, or has no out-of-place rule."""
        recv = original.func.value
        while m.matches(recv, m.Call(func=m.Attribute(attr=m.Name()))) and \
                recv.func.attr.value.endswith("_"):
            recv = recv.func.value  # y.add_(1).clamp_(max=4): both write y
        if not (meth.endswith("_") and not meth.startswith("_") and meth[:-1] not in
                _INPLACE_DTYPE and meth not in ("copy_", "set_", "resize_", "detach_",
                                                "requires_grad_", "share_memory_")
                and isinstance(recv, cst.Name) and not isinstance(
                    self.get_metadata(ParentNodeProvider, original, None), cst.Expr)):
            return None
        base = self.rules.methods.get(meth[:-1])
        if base is not None:
            value = self._method(original, updated, base)
        else:
            function = self.rules.functions.get(f"torch.{meth[:-1]}")
            if function is None or function.params[:1] != ("input",):
                return None
            value = self._function(original, updated.with_changes(
                func=expr(f"torch.{meth[:-1]}"),
                args=[arg(updated.func.value), *_fix_commas(list(updated.args))]), function)
        return cst.NamedExpr(target=cst.Name(recv.value), value=value,
                             lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

    def _split_sizes(self, original: cst.Call, rule: Rule) -> frozenset[str]:
        """``torch.split(x, self.split_indexes, dim=1)`` where the name holds a tuple or list
        of sizes (set from one in ``__init__``), not a chunk size: value analysis."""
        if self.values is None:
            return frozenset()
        sizes = bind(original.args, rule.params).get("split_size_or_sections")
        return frozenset({"split_size_or_sections"}) if sizes is not None and self.values.kind(
            sizes) in (vk.Kind.TUPLE, vk.Kind.LIST) else frozenset()

    def _choice_args(self, original: cst.Call, rule: Rule) -> dict[str, tuple]:
        """F.interpolate's mode when it is not a literal but one the file shows
        (``mode=self.mode``, set once from a constructor parameter)."""
        mode = bind(original.args, rule.params).get("mode")
        if self.values is None or rule.special != "interpolate" or mode is None:
            return {}
        found = literal_choices(self.values, mode)
        return {} if found is None else {"mode": found}

    def _scalar_args(self, original: cst.Call, rule: Rule) -> frozenset[str]:
        """The first argument of a legacy constructor (``torch.Tensor(dim)``) when it holds a
        Python number: a size, not data."""
        if self.values is not None and rule.special == "interpolate" and "size" in rule.params:
            size = bind(original.args, rule.params).get("size")  # size=n, an int: every axis'
            return frozenset({"size"}) if size is not None and self.values.kind(size) == (
                vk.Kind.SCALAR) else frozenset()
        if self.values is None or rule.special != "legacy_tensor":
            return frozenset()
        first = bind(original.args, rule.params).get("data")
        return frozenset({"data"}) if first is not None and self.values.kind(first) == (
            vk.Kind.SCALAR) else frozenset()

    def _data_read(self, original: cst.Attribute, updated: cst.Attribute):
        """``y.data`` read (``loss.data``, ``next_word.data[0]``, ``x.data.dtype``) of a tensor:
        torch's detached tensor, ``jax.lax.stop_gradient(y)`` (its dtype, shape or device:
        the tensor's own). None where it is written (``w.data = v``, ``w.data.normal_()``,
        ``w.data[i] = v``: their own rules) or not known to be a tensor."""
        if original.attr.value != "data":
            return None
        recv = original.value
        while m.matches(recv, m.Call(func=m.Attribute(attr=m.Name()))) and (
                recv.func.attr.value in _CONVERSIONS | {"clone"}):
            recv = recv.func.value  # (y.detach().data, y.cpu().data)
        if not self._array_value(recv):
            return None
        parent = self.get_metadata(ParentNodeProvider, original, None)
        holder = self.get_metadata(ParentNodeProvider, parent, None) if parent else None
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
                isinstance(parent, cst.Subscript) and isinstance(holder, (
                    cst.AssignTarget, cst.AugAssign))):
            return None
        if isinstance(parent, cst.Attribute) and parent.value is original:
            if parent.attr.value in ("dtype", "shape", "ndim", "device", "size"):
                return updated.value  # (x.data.dtype: x.dtype)
            if parent.attr.value.endswith("_"):
                return None  # (w.data.normal_(): an in-place method's own rule)
        if m.matches(updated.value, m.Call(func=m.Attribute(
                value=m.Attribute(value=m.Name("jax"), attr=m.Name("lax")),
                attr=m.Name("stop_gradient")))):
            return updated.value  # (y.detach().data: detached once)
        self.need("jax")
        return expr("jax.lax.stop_gradient({x})", x=updated.value)

    def _array_value(self, node: cst.BaseExpression) -> bool:
        """``node`` holds an array: a tensor the value analysis knows, an argument nothing
        tells about (FastSpeech2-Conformer's ``pos_enc.device != x.device``), a layer's weight."""
        kind = self.values.kind(node) if self.values is not None else None
        if kind == vk.Kind.PARAM and not self._tensor_argument(node):
            return False  # (config.device of a config object: kept as written)
        if kind in (vk.Kind.TENSOR, vk.Kind.PARAM):
            return not self._is_module_expr(node)
        return m.matches(node, m.Attribute(attr=m.Name("weight") | m.Name("bias"))) and \
            self._is_module_expr(node.value)

    def _tensor_argument(self, node: cst.BaseExpression) -> bool:
        """An argument nothing types, whose ``.device`` is read: a tensor where the function
        reads it as one (another tensor attribute or method, ``x.shape``, ``x.size()``) and
        in no other way, or compares its device with another's (``pe.device !=
        x.device``)."""
        if not (isinstance(node, cst.Name) and self._fn_stack):
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        outer = self.get_metadata(ParentNodeProvider, parent, None) if parent else None
        if isinstance(outer, cst.ComparisonTarget):
            outer = self.get_metadata(ParentNodeProvider, outer, None)
        if isinstance(outer, cst.Comparison) and len(outer.comparisons) == 1 and all(
                m.matches(side, m.Attribute(attr=m.Name("device")))
                for side in (outer.left, outer.comparisons[0].comparator)):
            return True
        reads = {a.attr.value for a in findall(self._fn_stack[-1], m.Attribute(
            value=m.Name(node.value)))} - {"device"}
        return bool(reads) and all(r in _TENSOR_ATTRIBUTES or r in self.rules.methods
                                   for r in reads)

    def _array_target(self, base: cst.BaseExpression) -> str:
        """``base[i] = v``: "array" (rebind it with .at[i].set(v)), "python" (a dict, list,
        optimizer.param_groups item, numpy array...: stays as it is) or "unsure"."""
        if self.values is None:
            return "array"
        kind = self.values.kind(base)
        if kind in vk.NON_TENSOR:
            return "python"
        return "unsure" if kind == vk.Kind.UNKNOWN else "array"

    def _freezes_one_by_one(self, node: cst.CSTNode, receiver: cst.BaseExpression) -> bool:
        """A freeze of ``receiver``, a parameter a loop binds, other than the one statement of
        ``for p in module.parameters():`` (which freezes the module: passes/rewrite_loops.py's
        ``_frozen_loop``)."""
        if not self._a_models_parameter(receiver, any_owner=True):
            return False
        line = node
        while line is not None and not isinstance(line, cst.SimpleStatementLine):
            line = self.get_metadata(ParentNodeProvider, line, None)
        block = self.get_metadata(ParentNodeProvider, line, None) if line else None
        loop = self.get_metadata(ParentNodeProvider, block, None) if block else None
        return not (isinstance(loop, cst.For) and len(block.body) == 1 and len(line.body) == 1
                    and isinstance(loop.target, cst.Name) and m.matches(loop.iter, m.Call(
                        func=m.Attribute(attr=m.Name("parameters")), args=[])))

    def _a_models_parameter(self, node: cst.BaseExpression, any_owner: bool = False) -> bool:
        """``node`` is the name a comprehension or a for loop binds to each of a model's
        parameters (``sum(p.numel() for p in model.parameters() if p.requires_grad)``), where
        the parameters become the arrays of its nnx.Param state (those torch trains).
        ``any_owner``: of any module's ``parameters()`` / ``named_parameters()``."""
        if not isinstance(node, cst.Name):
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.ClassDef)):
            loop = parent.for_in if isinstance(parent, (cst.GeneratorExp, cst.ListComp,
                                                        cst.SetComp)) else parent
            if isinstance(loop, (cst.CompFor, cst.For)) and (m.matches(loop.target, m.Name(
                    node.value)) and m.matches(loop.iter, m.Call(func=m.Attribute(
                        attr=m.Name("parameters")), args=[])) or m.matches(
                    loop.target, m.Tuple(elements=[m.Element(), m.Element(m.Name(
                        node.value))])) and m.matches(loop.iter, m.Call(func=m.Attribute(
                            attr=m.Name("named_parameters")), args=[]))):
                return any_owner or self._parameters_call(loop.iter) is not None
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return False

    def _tensorlike(self, recv: cst.BaseExpression, meth: str | None = None,
                    call_node: cst.Call | None = None) -> bool:
        if isinstance(recv, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
                             cst.Dict, cst.List, cst.Tuple, cst.Integer, cst.Float)):
            return False
        if self.values is not None:
            kind = self.values.kind(recv)
            if kind == vk.Kind.TENSOR:
                return True
            if kind == vk.Kind.SCALAR and meth in self.rules.methods and not any(
                    hasattr(t, meth) for t in (int, float, complex, str, bytes)):
                # a tensor method no Python number or string has: the value is a tensor
                # whatever its annotation says (PVT's ``hidden_states: int``, then .size())
                return True
            if kind in vk.NON_TENSOR:
                return False  # wandb.log(...), config.get(...), model.to(...)
            rule = self.rules.methods.get(meth or "")
            if call_node is not None and rule is not None and not rule.special and len(
                    [a for a in call_node.args if a.keyword is None and not a.star]) > len(
                    rule.params):
                return False  # more arguments than the tensor method takes: run.log(k, v)
        if self._is_module_expr(recv):
            return False
        q = self.q(recv)
        if q == "builtins.None" and not isinstance(recv, cst.Name):
            q = None  # (a - b).permute(1, 2, 0): libcst names the call of a parenthesised sum so
        if q and not q.startswith("torch") and "." in q and "<locals>" not in q \
                and not q.startswith("self.") and not isinstance(recv, cst.Call):
            # an imported module or object: os.path, np, math (what an imported function
            # returns, create_causal_mask(...), is not known from its name)
            return False
        if q in ("math", "np", "numpy", "os", "random", "re", "json", "sys"):
            return False
        if meth in AMBIGUOUS_METHODS and call_node is not None:
            for a in call_node.args:
                if isinstance(a.value, (cst.SimpleString, cst.FormattedString)):
                    return False
            if meth == "split" and not call_node.args:
                return False
        return True
