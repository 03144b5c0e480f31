"""Activation layout (channels-last layers inside channels-first code) and the scopes the
traversal tracks for it: comprehensions, lambdas, f-strings, normalized lists.

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.accumulate import snapshot_comprehension
from torch2jax.analysis.index import Layouts
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes import comprehension_keys as cf
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    code,
    expr,
)
from torch2jax.passes.layout_fuse import FROM_CHANNELS_LAST as _FROM_CL
from torch2jax.passes.rewrite_support import (
    _call_partial,
    _fix_commas,
    _push_out_layout,
)
from torch2jax.passes.sequential_items import sequential_elem_layout


class LayoutMixin:
    def _bind_loop_layout(self, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
        """A loop over a container of layers: calls of its loop variable take the layout of
        the container's elements (``for layer in self.layers``, ``enumerate(...)``,
        ``zip(...)``, ``.items()``; ``for block, attn, down in self.stages`` over a
        ModuleList of fixed-length containers, by position)."""
        info = self.index.classes.get(self.current_class or "")
        if info is None or not self._loop_layouts:
            return
        if m.matches(it, m.Call(func=m.Name("enumerate"), args=[m.Arg(keyword=None)])):
            if m.matches(target, m.Tuple(elements=[m.Element(), m.Element()])):
                self._bind_loop_layout(target.elements[1].value, it.args[0].value)
            return
        if m.matches(it, m.Call(func=m.Name("zip"))) and isinstance(target, cst.Tuple) and (
                len(target.elements) == len(it.args)) and not any(
                    a.keyword or a.star for a in it.args):
            for element, a in zip(target.elements, it.args):
                self._bind_loop_layout(element.value, a.value)
            return
        layout = None
        attr = None
        if m.matches(it, m.Attribute(value=m.Name("self"))):
            # for layer in self.layers
            attr = it.attr.value
            layout = info.elem_layout.get(attr) or sequential_elem_layout(self, info, attr)
        elif m.matches(it, m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self")),
                                                   attr=m.Name("items") | m.Name("values")),
                                  args=[])):
            # for name, layer in self.heads.items() / for layer in self.heads.values()
            layout = info.elem_layout.get(it.func.value.attr.value)
        elif info.self_elem_layout and (m.matches(it, m.Name("self")) or (
                info.container == "module_dict" and m.matches(it, m.Call(func=m.Attribute(
                    value=m.Name("self"), attr=m.Name("items") | m.Name("values")), args=[])))):
            # a ModuleList / ModuleDict subclass running its layers: for layer in self,
            # for name, layer in self.items(), for layer in self.values()
            layout = info.self_elem_layout
        if m.matches(it, m.Call(func=m.Attribute(attr=m.Name("items")))):
            target = (target.elements[1].value if m.matches(target, m.Tuple(
                elements=[m.Element(), m.Element()])) else None)
        if layout and isinstance(target, cst.Name):
            self._loop_layouts[-1][target.value] = layout
        elif attr is not None and isinstance(target, (cst.Tuple, cst.List)) and (
                attr in info.elem_items):
            # unpacking each element of a ModuleList of containers: by position, or, when the
            # positions are not known, calls of the names are marked (a layer of either
            # layout may stand there)
            positions = info.elem_positions.get(attr)
            if positions is not None and len(positions) != len(target.elements):
                positions = None
            for i, element in enumerate(target.elements):
                if isinstance(element.value, cst.Name):
                    self._loop_layouts[-1][element.value.value] = (
                        positions[i] if positions is not None else "mixed")

    def _bind_comprehension(self, node) -> None:
        """The loop variables of a comprehension, bound before its element is rewritten
        (libcst visits the element first): ``[t(x) for i, t in enumerate(self.layers)]``."""
        comp = node.for_in
        while comp is not None:
            self._bind_loop_layout(comp.target, comp.iter)
            comp = comp.inner_for_in

    def _string_quote(self) -> str:
        """A quote character that may be written inside the f-string being rewritten."""
        return "'" if self._fstring_quotes and '"' in self._fstring_quotes[-1] else '"'

    def visit_FormattedString(self, node) -> None:
        self._fstring_quotes.append(node.start)

    def leave_FormattedString(self, original_node, updated_node):
        self._fstring_quotes.pop()
        return updated_node

    def visit_Lambda(self, node) -> None:
        self._in_expr_scope += 1
        self._comp_frames.append(None)  # (no statement of its own to split keys in)

    def leave_Lambda(self, original_node, updated_node):
        self._in_expr_scope -= 1
        self._comp_frames.pop()
        return updated_node

    def _enter_comp(self, node) -> None:
        """A comprehension: its draws take one key per element (passes/comprehension_keys.py)."""
        self._in_expr_scope += 1
        self._comp_frames.append(cf.frame_for(node, self._file_names))
        self._bind_comprehension(node)

    def _leave_comp(self, updated_node):
        self._in_expr_scope -= 1
        frame = self._comp_frames.pop()
        return updated_node if frame is None else cf.enumerated(updated_node, frame)

    def visit_ListComp(self, node) -> None:
        self._enter_comp(node)

    def visit_SetComp(self, node) -> None:
        self._enter_comp(node)

    def leave_SetComp(self, original_node, updated_node):
        return self._leave_comp(updated_node)

    # -- lists of layers in both layouts
    def _normalized_list(self, target: cst.BaseExpression) -> bool:
        return bool(isinstance(target, cst.Name) and self._fn_stack and (
            id(self._fn_stack[-1]), target.value) in self.index.normalized_lists)

    def _torch_layout_items(self, originals: list[cst.BaseExpression],
                            updated: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
        """The items put into a normalized list, channels-last ones between transposes."""
        layouts = Layouts(self.rules, self, self.index)
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if fid == id(self._fn_stack[-1])}
        items = [layouts.of(o, scope) for o in originals]
        return [a.value for a in self._insert_transposes([arg(u) for u in updated], items)]

    def leave_List(self, original_node, updated_node):
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        target = None
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and (
                parent.value is original_node):
            target = parent.targets[0].target if isinstance(parent, cst.Assign) else parent.target
        elif isinstance(parent, cst.Arg):
            call_node = self.get_metadata(ParentNodeProvider, parent, None)
            if m.matches(call_node, m.Call(func=m.Attribute(attr=m.Name("extend")))):
                target = call_node.func.value
        if target is None or not self._normalized_list(target) or any(
                isinstance(e, cst.StarredElement) for e in original_node.elements):
            return updated_node
        elements = list(updated_node.elements)
        values = self._torch_layout_items([e.value for e in original_node.elements],
                                          [e.value for e in elements])
        if len(values) == len(elements):
            return updated_node
        # the inserted transposes are separated like the list's items (without the comments)
        sep = next((e.comma for e in elements if isinstance(e.comma, cst.Comma)
                    and e is not elements[-1]), None) or cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        if isinstance(sep.whitespace_after, cst.ParenthesizedWhitespace):
            sep = sep.with_changes(whitespace_after=sep.whitespace_after.with_changes(
                first_line=cst.TrailingWhitespace(), empty_lines=[]))
        by_value = {id(e.value): e for e in elements}
        out = [by_value.get(id(v)) or cst.Element(v, comma=sep) for v in values]
        if out[-1] is not elements[-1]:  # a transpose last: it takes the trailing comma
            i = out.index(elements[-1])
            out[i] = elements[-1].with_changes(comma=sep)
            out[-1] = out[-1].with_changes(comma=elements[-1].comma)
        return updated_node.with_changes(elements=out)

    def _normalized_append(self, original, updated):
        """``layers.append(conv)`` of a channels-last layer into a normalized list: extend it
        with the layer between transposes."""
        values = self._torch_layout_items([original.args[0].value], [updated.args[0].value])
        if len(values) == 1:
            return updated
        return updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name("extend")),
            args=[arg(cst.List([cst.Element(v, comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))) for v in values[:-1]]
                + [cst.Element(values[-1])]))])

    def leave_ListComp(self, original_node, updated_node):
        return self._leave_comp(updated_node)

    def visit_GeneratorExp(self, node) -> None:
        self._enter_comp(node)

    def leave_GeneratorExp(self, original_node, updated_node):
        return self._leave_comp(updated_node)

    def visit_DictComp(self, node) -> None:
        self._enter_comp(node)

    def leave_DictComp(self, original_node, updated_node):
        updated_node = self._leave_comp(updated_node)
        call = snapshot_comprehension(original_node)
        if call is not None and id(call) in getattr(self, "_memory_states", ()) and m.matches(
                updated_node.for_in.iter, m.Call(func=m.Attribute(attr=m.Name("items")))):
            # {k: v.clone() for k, v in model.state_dict().items()}: a copy of the model's
            # state as a pure dict (jax arrays are immutable; the copy keeps a snapshot safe
            # from a step that donates the model's buffers)
            self.need("jax", "jnp")
            return expr("jax.tree.map(jnp.copy, {d})", d=updated_node.for_in.iter.func.value)
        return updated_node

    def _in_layer_layout(self, layer: cst.BaseExpression, build, args: list[cst.Arg]
                         ) -> cst.BaseExpression:
        """``build(args)``, a call of ``layer`` on ``args`` that is not written as one
        (checkpointed), with the input moved channels-last and the output back where the layer
        is a channels-last one (a conv, a Sequential of them)."""
        layout = self._layout_of_callee(layer)
        if layout == "mixed":
            raise Untranslatable("checkpoints a container mixing channels-last and other layers",
                                 rule="layout")
        if layout != "channels_last" or not args:
            return build(args)
        self.need("jnp")
        moved = args[0].with_changes(value=expr("jnp.moveaxis({x}, 1, -1)", x=args[0].value))
        return expr("jnp.moveaxis({y}, -1, 1)", y=build([moved, *args[1:]]))

    # ------------------------------------------------------------------ layout
    def _layout_of_callee(self, func: cst.BaseExpression) -> str | None:
        if isinstance(func, cst.Call):
            # a layer built and called on the spot: nn.MaxPool2d(3)(x)
            rule = self.rules.layers.get(self.q(func.func) or "")
            return rule.layout if rule is not None else None
        if isinstance(func, cst.Name) and not (self._loop_layouts
                                               and func.value in self._loop_layouts[-1]):
            layout = self._name_layout(func.value)
            if layout is not None:
                return layout
        if self.current_class is None:
            return None
        info = self.index.classes.get(self.current_class)
        if info is None:
            return None
        if m.matches(func, m.Attribute(value=m.Name("self"))):
            return info.attr_layout.get(func.attr.value)
        if isinstance(func, cst.Subscript) and m.matches(func.value,
                                                         m.Attribute(value=m.Name("self"))):
            attr = func.value.attr.value
            return info.elem_layout.get(attr) or sequential_elem_layout(self, info, attr)
        if isinstance(func, cst.Name) and self._loop_layouts:
            return self._loop_layouts[-1].get(func.value)
        return None

    def _name_layout(self, name: str) -> str | None:
        """The layout of the layer ``name`` holds when it was bound to one by a plain
        assignment in this function or at module level (``pool = nn.MaxPool2d(2)``), when
        that layout is not torch's; None otherwise (a parameter or another local shadows a
        module-level layer)."""
        layouts = self.index.name_layouts
        layout = None
        if self._fn_stack:
            fn = self._fn_stack[-1]
            layout = layouts.get((id(fn), name))
            if layout is None and name not in self._local_names(fn):
                layout = layouts.get((0, name))
        else:
            layout = layouts.get((0, name))
        return layout if layout in ("channels_last", "mixed") else None

    def _local_names(self, fn: cst.FunctionDef) -> set[str]:
        names = self._locals_cache.get(id(fn))
        if names is None:
            names = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params,
                                            *fn.params.posonly_params)}
            names |= set(tr.names_of(fn.body).assigned)
            self._locals_cache[id(fn)] = names
        return names

    def _layout_call(self, original, updated: cst.Call):
        func = original.func
        if m.matches(func, m.Attribute(value=m.Name("self"))) and self.in_module_class():
            info = self.index.classes[self.current_class]
            rule = self.rules.layers.get(info.attr_rule.get(func.attr.value, ""))
            if rule is not None and rule.call:
                return self._rule_call(original, updated, rule,
                                       info.attr_ctor[func.attr.value])
            table = info.tied_bias_heads.get(func.attr.value)
            cond = self._lt_tied.get((self.current_class, func.attr.value))
            if table is not None and cond is not None and len(updated.args) == 1 and not \
                    updated.args[0].keyword and not updated.args[0].star:
                # linen: the TiedDense head, given the table when the constructor tied it
                tied = f"{table}.embedding" if cond == "True" else \
                    f"{table}.embedding if {cond} else None"
                return updated.with_changes(args=[updated.args[0].with_changes(
                    comma=cst.MaybeSentinel.DEFAULT), arg(cst.parse_expression(tied))])
            if table is not None and self.target.stateful_modules and len(updated.args) == 1 \
                    and not updated.args[0].keyword and not updated.args[0].star:
                # tied in a branch of __init__ (passes/rewrite.py): the head's kernel deleted
                head, x = code(updated.func), updated.args[0].value
                return expr(f"({head}({{x}}) if hasattr({head}, 'kernel') else "
                            f"{table}.attend({{x}}) + {head}.bias)", x=x)
            table = info.tied_heads.get(func.attr.value)
            if table is not None:
                parts = table.split(".")
                if self.target.setup_modules and len(parts) == 3 and \
                        info.attr_rule.get(parts[1]) == "torch.nn.ModuleDict":
                    table = f'self.{parts[1]}["{parts[2]}"]'
                return updated.with_changes(func=expr(table + ".attend"))
            if func.attr.value in info.batch_stats_only and self.target.stateful_modules and \
                    not any(a.keyword and a.keyword.value == "use_running_average"
                            for a in updated.args):
                # torch's BatchNorm(track_running_stats=False) normalises with the batch
                # statistics in eval mode too; model.eval() must not switch it
                updated = updated.with_changes(args=_fix_commas(
                    [*updated.args, arg(expr("False"), "use_running_average")]))
        layout = self._layout_of_callee(original.func)
        if layout == "mixed":
            if self.target.intermediate:  # (every equinox layer takes torch's channel-first layout)
                return updated
            raise Untranslatable("calls a container mixing channels-last and other layers",
                                 rule="layout")
        if layout not in ("channels_last", "any") or not updated.args:
            return updated
        first = updated.args[0]
        if layout == "any":
            return _push_out_layout(updated)
        self.need("jnp")
        inner = first.value
        cl = inner.args[0].value if m.matches(inner, _FROM_CL) else expr(
            "jnp.moveaxis({x}, 1, -1)", x=inner)
        new = _call_partial(updated.with_changes(args=[first.with_changes(value=cl),
                                                       *updated.args[1:]]))
        return expr("jnp.moveaxis({y}, -1, 1)", y=new)
