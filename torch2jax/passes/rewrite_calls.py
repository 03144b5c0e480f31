"""Calls: ``leave_Call`` and the rule-table rewrite of a call (functions, methods, ``apply``,
generic), specials' bindings, factory keyword dicts, activation checkpointing (remat).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import itertools

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import children
from torch2jax.analysis import host as ha
from torch2jax.analysis import values as vk
from torch2jax.analysis.class_locals import (
    forwards_kwargs,
    hands_class_kwargs,
    holds_drawing_function,
    holds_rngs_function,
    looked_up_activation,
)
from torch2jax.analysis.index import Layouts, combine
from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.analysis.torch_api import FILLED_NEW, TORCH_ONLY_TENSOR_METHODS
from torch2jax.analysis.training import (
    CLIPS,
    DROPPED_SEEDS,
    RANDOM,
    SEEDS,
)
from torch2jax.analysis.value_kinds import _PROGRESS_BARS
from torch2jax.analysis.walk import findall, walk
from torch2jax.passes import module_casts as mc
from torch2jax.passes import remat as rm
from torch2jax.passes import training as tr
from torch2jax.passes.attention_rank import rank_args
from torch2jax.passes.calls import CALLS, CallSite
from torch2jax.passes.common import (
    BoundArgs,
    Untranslatable,
    arg,
    bind,
    call,
    code,
    expr,
    int_value,
    needs_parens,
    try_literal,
    unnamed_modules_loop,
)
from torch2jax.passes.conv_subclass import conv_forward, conv_forward_reads
from torch2jax.passes.data import read_by_iterator
from torch2jax.passes.fresh_values import inplace_on_made_value, torch_only_method
from torch2jax.passes.modules_walk import named_modules_walk, submodule_call
from torch2jax.passes.rewrite_support import (
    _FILLED,
    _INPLACE_DTYPE,
    _KERNEL_CHOICES,
    _MADE,
    _SIGNATURE_OPTIMIZERS,
    EINOPS_TORCH_LAYERS,
    GRAD_MODES,
    ONE_BY_ONE,
    _activation_value,
    _call_name,
    _call_partial,
    _fix_commas,
    _is_dotted,
    _push_out_layout,
    _rule_args,
)
from torch2jax.passes.scaled_weights import scaled_weight_args
from torch2jax.passes.special_device import drop_device_argument
from torch2jax.passes.special_group_norm import own_group_norm_call
from torch2jax.passes.special_tensors import STARRED_SPECIALS
from torch2jax.passes.specials import SPECIALS, Site
from torch2jax.passes.walrus import write_walrus as _write_walrus
from torch2jax.ruleset import Rule


class CallsMixin:
    def _drop_noop_kwargs(self, value: cst.Call) -> cst.Call:
        """``AdamW(groups, lr=lr, **extra_args)`` with ``extra_args = dict(fused=True) if
        use_fused else dict()`` in the same function: the dict only holds torch's kernel
        choices (fused, foreach, capturable), which optax has no counterpart for."""
        fn = self._fn_stack[-1] if self._fn_stack else None
        args = list(value.args)
        for a in value.args:
            if a.star != "**" or not isinstance(a.value, cst.Name) or fn is None:
                continue
            binds = [x.value for x in findall(fn, m.Assign(targets=[m.AssignTarget(
                target=m.Name(a.value.value))]))]
            if len(binds) != 1:
                continue
            parts = [binds[0].body, binds[0].orelse] if isinstance(
                binds[0], cst.IfExp) else [binds[0]]
            if all(m.matches(p, m.Call(func=m.Name("dict"))) and all(
                    x.keyword is not None and x.keyword.value in _KERNEL_CHOICES
                    for x in p.args) or m.matches(p, m.Dict()) and all(
                    isinstance(e, cst.DictElement) and try_literal(e.key, None)
                    in _KERNEL_CHOICES for e in p.elements) for p in parts):
                args.remove(a)
        if len(args) == len(value.args):
            return value
        return value.with_changes(args=_fix_commas(args))

    # ------------------------------------------------------------------ calls
    def visit_Call(self, node: cst.Call) -> None:
        if self._class_stack and self._own_functional(node):
            self._own_calls.add(id(node))
        elif self._class_stack:
            conv_forward_reads(self, node)  # F.conv2d(x, w, ...) in a conv subclass

    def _group_modules(self, original: cst.Call, updated: cst.Call):
        """``for mn, m in self.named_modules():`` in the function that builds an optimizer
        whose parameter groups are selected by torch's names (minGPT's configure_optimizers):
        the NNX modules with their dotted paths. The names the loop builds from them
        (``mn + "." + pn``, ``pn`` from ``m.named_parameters()``) are the names the mask
        gives the parameters (``torch_parameter_name``), so each parameter is sorted as the
        loop sorts it, by the class of the module holding it and its name. (A Sequential's
        layers are under ``layers`` on both sides.)"""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        here = self._fn_stack[-1].name.value if self._fn_stack else None
        if not isinstance(parent, cst.For) or parent.iter is not original or not any(
                site.function == here and site.groups and any(
                    g.names is not None for g in site.groups)
                for site in self.training.optimizers.values()):
            return None
        self.need("nnx")
        return expr('((".".join(map(str, path)), module) for path, module in '
                    'nnx.iter_graph({m}) if isinstance(module, nnx.Module))',
                    m=updated.func.value)

    def _parameter_listing(self, original_node: cst.Call, updated_node: cst.Call):
        """``for p in model.parameters()`` / ``for n, p in model.named_parameters()`` (also in
        a comprehension: ``sum(p.numel() for p in self.parameters())``) on a module: the
        parameter arrays of the target library. None: not such a call."""
        func = original_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in (
                "parameters", "named_parameters") and not original_node.args
                and self.values is not None
                and self.values.kind(func.value) == vk.Kind.MODULE):
            return None
        if self.target.train_state and self._lt_in_count(original_node):
            return updated_node  # (the statement is removed)
        if self.target.setup_modules and func.attr.value == "parameters" and m.matches(
                func.value, m.Name("self")) and self.in_module_class() and \
                self._applied_method():
            # linen: a method runs under init / apply, which bind the module's variables
            # (next(self.parameters()).dtype in a method that makes a state)
            self.need("jax")
            return expr('iter(jax.tree.leaves(self.variables.get("params", {})))')
        if not self._iterated(original_node):
            return None
        here = self._fn_stack[-1].name.value if self._fn_stack else None
        if any(site.function == here for site in self.training.optimizers.values()):
            return None  # parameter groups: translated with their optimizer, or kept with it
        owner = updated_node.func.value
        named = func.attr.value == "named_parameters"
        leaves = self.target.parameter_leaves(named, self.file_freezes)
        if leaves is not None:
            self.need(*leaves[1])  # next(m.parameters()): an iterator of them (a list's is)
            return expr(("iter({l})" if self._iterated(original_node, "next") else "{l}"),
                        l=expr(leaves[0], m=owner))
        self.diag(original_node, "module-api", "error",
                  f"{code(original_node)}: the {self.target.name} model's parameters are not "
                  "attributes of the module" if self.target.setup_modules else
                  f"{code(original_node)}: parameter names are not translated for "
                  f"{self.target.name}")
        return updated_node

    def _applied_method(self) -> bool:
        """linen: the method being rewritten runs under init / apply with the variables made:
        not the constructor (setup()) nor a method it calls (get_num_params in __init__)."""
        if not self._fn_stack or self._fn_stack[0].name.value == "__init__":
            return False
        name = self._fn_stack[0].name.value
        cls = next((c for c in self._root.body if isinstance(c, cst.ClassDef)
                    and c.name.value == self.current_class), None)
        init = next((f for f in (cls.body.body if cls else ()) if isinstance(
            f, cst.FunctionDef) and f.name.value == "__init__"), None)
        return init is None or not any(findall(st, m.Call(func=m.Attribute(
            value=m.Name("self"), attr=m.Name(name)))) for st in init.body.body
            if id(st) not in self._lt_counts)  # (linen: a count printed there is removed)

    def _epoch_loader_wrapped(self, original_node: cst.Call, updated_node: cst.Call):
        """``pbar = tqdm(loader)`` (or ``enumerate``, ``zip``) outside a ``for`` header,
        of a loader shuffled per epoch: the wrapper iterates the epoch's pipeline (the loop's
        own header is rewritten by rewrite_data's _loader_loop)."""
        q = self.q(original_node.func) or ""
        if q not in (*_PROGRESS_BARS, "builtins.enumerate", "builtins.zip"):
            return None
        if not any(isinstance(a.value, cst.Name) and a.value.value in self.data.loaders
                   and self.data.loaders[a.value.value].shuffled for a in updated_node.args):
            return None
        return self._epoch_loaders(updated_node, self._epoch_of(self._for_stack))

    def _epoch_loader_len(self, original_node: cst.Call, updated_node: cst.Call):
        """len(loader) and len(loader.dataset) of a loader shuffled per epoch (a function of the
        epoch after the rewrite): the sizes do not depend on the epoch, so they are read from
        the pipeline of epoch 0."""
        if not m.matches(original_node, m.Call(func=m.Name("len"), args=[m.Arg(keyword=None,
                                                                            star="")])):
            return None
        arg = updated_node.args[0].value
        name = arg
        if m.matches(arg, m.Subscript(value=m.Attribute(value=m.Name(), attr=m.Name("parents")))):
            name = arg.value.value
        site = self.data.loaders.get(name.value) if isinstance(name, cst.Name) else None
        if site is None or self._shadowed(name.value):
            return None
        iterated = arg is name and read_by_iterator(site, self.data)
        if not (site.shuffled or iterated):
            return None
        called = expr(f"{name.value}(0)") if site.shuffled else name
        value = called if arg is name else arg.with_changes(
            value=arg.value.with_changes(value=called))
        if iterated:  # (a grain IterDataset has no len: the MapDataset it reads has)
            value = expr("{v}.parents[0]", v=value)
        return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=value)])

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call):
        if self.target.train_state:
            self._lt_unbound_call(original_node)
            self._lt_unbound_eval(original_node)
            applied = self._lt_method_call(original_node, updated_node) or (
                self._lt_checkpoint_load(original_node)) or self._lt_checkpoint_entry(
                original_node)
            if applied is not None:
                return applied
        handled = self._checkpoint_dict_call(original_node) or self._parameters_call(
            original_node) or scaled_weight_args(self, original_node, updated_node)
        if handled is not None:
            return handled
        if self._param_fill(original_node):
            return updated_node  # an initialiser as a statement (_param_fill_statement)
        if self.in_module_class():
            self._inplace_input(original_node)  # self.block(x), ReLU(inplace=True) first
        if m.matches(original_node, m.Call(func=m.Name("int") | m.Name("float") | m.Name(
                "bool"), args=[m.Arg(value=m.Call(), keyword=None)])) and self.q(
                original_node.args[0].value.func) in _SIZED_DRAWS and isinstance(
                updated_node.args[0].value, cst.Call):
            # int(torch.randint(0, n, (1,))): torch converts any one-element tensor, JAX a
            # 0-d array only; .item() reads the one element of either
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(
                value=expr("{x}.item()", x=updated_node.args[0].value))])
        if len(original_node.args) == 1 and self.q(original_node.func) == "inspect.signature" \
                and self.q(original_node.args[0].value) in _SIGNATURE_OPTIMIZERS:
            # 'fused' in inspect.signature(torch.optim.AdamW).parameters: optax's signature
            self.need("optax")
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(
                value=expr(_SIGNATURE_OPTIMIZERS[self.q(original_node.args[0].value)]))])
        if m.matches(original_node, m.Call(func=m.Name("hasattr"), args=[
                m.Arg(), m.Arg(value=m.SimpleString())])):
            owner = self.q(original_node.args[0].value)
            attr = original_node.args[1].value.evaluated_value
            if owner == "torch.nn.functional" and attr == "scaled_dot_product_attention":
                # the flash-attention guard: JAX's fused attention is jax.nn.dot_product_attention
                self.need("jax")
                return expr("hasattr(jax.nn, 'dot_product_attention')")
            if owner == "torch.nn.utils.parametrizations" and attr == "weight_norm":
                # the newer weight_norm's guard (wav2vec2): rules/functions.toml translates it
                return cst.Name("True")
        wrapped = self._epoch_loader_wrapped(original_node, updated_node)
        if wrapped is not None:
            return wrapped
        sized = self._epoch_loader_len(original_node, updated_node)
        if sized is not None:
            return sized
        if m.matches(original_node, m.Call(func=m.Name("iter"), args=[m.Arg(
                value=m.Name(), keyword=None, star="")])):
            # iter(loader) of a loader shuffled per epoch (a function of the epoch after the
            # rewrite), as `for x in loader` reads it: in the epoch loop, that epoch's order
            arg = updated_node.args[0].value
            site = self.data.loaders.get(arg.value)
            if site is not None and site.shuffled and not self._shadowed(arg.value):
                epochs = [f.target.value for f in self._for_stack if isinstance(f.target, cst.Name)]
                if not epochs:
                    raise Untranslatable(f"iter({arg.value}) outside a for loop over epochs: the "
                                         "loader is shuffled per epoch (a function of it)")
                return updated_node.with_changes(args=[updated_node.args[0].with_changes(
                    value=self._epoch_loaders(arg, epochs[-1]))])
        if isinstance(updated_node.func, cst.Lambda) and not updated_node.func.lpar:
            # a layer or loss built and called on the spot: nn.Identity()(x)
            updated_node = updated_node.with_changes(func=updated_node.func.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        if self.target.train_state and isinstance(original_node.func, cst.Name) and (
                original_node.func.value in self._lt_evaluators) and not self._class_stack:
            updated_node = self._lt_pass_variables(original_node, updated_node)
        if self._factory_dicts:
            updated_node = self._factory_dict_call(original_node, updated_node)
        if self._device_functions and self.values is not None:
            updated_node = drop_device_argument(original_node, updated_node,
                                                self._device_functions, self.values.is_tensor,
                                                self._is_module_expr)
        listed = self._parameter_listing(original_node, updated_node)
        if listed is not None:
            return listed
        if isinstance(original_node.func, cst.Name) and (
                original_node.func.value in self._file_functions):
            # train(model, train_loader, ...): the loader shuffled per epoch is that epoch's
            epoch = self._epoch_of(self._for_stack)
            updated_node = updated_node.with_changes(args=[
                a.with_changes(value=self._epoch_loaders(a.value, epoch))
                if isinstance(a.value, cst.Name) else a for a in updated_node.args])
        try:
            result = self._rewrite_call(original_node, updated_node)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or (self.q(original_node.func) or
                                                  _call_name(original_node)), "error",
                      exc.message)
            return updated_node
        if id(original_node) in self.data.host.arrays:
            result = ha.numpy_array(result)  # an array that only feeds host-side batches
        if result is not updated_node:
            result = _call_partial(result)
            self._note_imports(result)
            if isinstance(result, cst.BaseExpression) and needs_parens(result) and isinstance(
                    self.get_metadata(ParentNodeProvider, original_node, None),
                    (cst.BinaryOperation, cst.UnaryOperation, cst.Attribute, cst.Subscript,
                     cst.Call, cst.Comparison, cst.BooleanOperation, cst.ComparisonTarget,
                     cst.Await)):
                # x @ w.T + b inside a - ...: keep the operator precedence of the call
                result = result.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return result

    def _takes_key(self, func: cst.BaseExpression) -> bool:
        """A call of a function of the file that draws (it gained a ``key`` parameter), or of
        such a method of a plain class: ``self.method`` in the class, ``obj.method`` on a name
        the file binds once to an instance of it."""
        keyed = self.training.key_functions
        if isinstance(func, cst.Name):
            return func.value in keyed
        if not m.matches(func, m.Attribute(value=m.Name(), attr=m.Name())):
            return False
        recv = func.value.value
        cls = (self.current_class if recv == "self" and self.current_class
               and not self.in_module_class() else self.training.instances.get(recv))
        return cls is not None and f"{cls}.{func.attr.value}" in keyed

    def children_layout(self, v: cst.BaseExpression) -> str | None:
        """The layout of ``*list(recv.children())[a:b]`` spread into a Sequential (Layouts)."""
        layouts = children.children_layouts(self, v, self._root,
                                            self._fn_stack[-1] if self._fn_stack else None)
        return None if layouts is None else combine(layouts or ["any"])

    def _factory_dict_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.ones(n, **dd)`` / ``nn.Linear(a, b, **dd)`` with ``dd`` a factory keyword dict:
        a torch function that takes a dtype gets ``dtype=`` (the dict's value); a torch layer
        drops it, as its explicit ``device=``/``dtype=`` are dropped. Other callees (module
        classes of the project, parameters holding a layer class) keep ``**dd``, now without
        its device."""
        name = self.q(original.func) or ""
        rule = self.rules.functions.get(name) or self.rules.layers.get(name)
        if rule is None:
            return updated
        args, dtype = [], None
        for a in updated.args:
            if (a.star == "**" and isinstance(a.value, cst.Name)
                    and a.value.value in self._factory_dicts):
                dtype = self._factory_dicts[a.value.value] or expr(
                    f'{a.value.value}.get("dtype")')
                continue
            args.append(a)
        if len(args) == len(updated.args):
            return updated
        if (dtype is not None and "dtype" in rule.params and "dtype" not in rule.drop
                and not any(a.keyword and a.keyword.value == "dtype" for a in args)):
            args.append(arg(dtype, "dtype"))
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)

    def _built_by_file_function(self, recv: cst.BaseExpression) -> bool:
        """``self.stem`` unpacked from a call of a layer-building function of the file
        (cspnet's ``self.stem, info = create_csp_stem(...)``, its stem a Sequential)."""
        if not (m.matches(recv, m.Attribute(m.Name("self"), m.Name())) and self.current_class):
            return False
        cls = next((c for c in m.findall(self._root, m.ClassDef(name=m.Name(
            self.current_class)))), None)
        held = m.Element(m.Attribute(m.Name("self"), m.Name(recv.attr.value)))
        return cls is not None and any(
            isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Name)
            and a.value.func.value in self.index.fn_returns
            for a in m.findall(cls, m.Assign(targets=[m.AssignTarget(m.Tuple(elements=[
                m.ZeroOrMore(), held, m.ZeroOrMore()]))])))

    def _layer_fn_locals(self, node: cst.CSTNode) -> set[str]:
        """Names the enclosing function assigns one of two layer factories, either a function
        of the file that builds layers (it takes rngs), a config field holding a module class
        or a module class: ``layer_fn = layers.conv_norm_act if na else create_conv2d``."""
        fields = self._module_type_fields(node)

        def factory(v: cst.BaseExpression) -> bool:
            return m.matches(v, m.Name(m.MatchIfTrue(lambda n: n in self.index.rngs_functions
                                                     or n in self.index.module_classes))) or (
                m.matches(v, m.Attribute(value=m.Name(), attr=m.Name(m.MatchIfTrue(
                    fields.__contains__)))) and v.value.value != "self")
        return {a.targets[0].target.value for a in walk(self._fn_stack[-1].body, False)
                if isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(
                    a.targets[0].target, cst.Name) and isinstance(a.value, cst.IfExp)
                and factory(a.value.body) and factory(a.value.orelse)}

    def _rewrite_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = self.q(original.func) if _is_dotted(original.func) else None
        # super().__init__() in a module class
        if m.matches(original, m.Call(func=m.Attribute(value=m.Call(func=m.Name("super")),
                                                        attr=m.Name("__init__")))):
            return self._super_init(original, updated)
        if name and name in self.rules.layers:
            return self._layer(original, updated, self.rules.layers[name])
        if (sub := submodule_call(self, original, updated)) is not None:
            return sub  # self.get_submodule("layers.3.block.1")
        if m.matches(original, m.Call(func=m.Attribute(attr=m.Name("children")
                                                        | m.Name("named_children")), args=[])):
            # backbone.children(): its layers in torch's order (passes/children.py)
            parent = self.get_metadata(ParentNodeProvider, original, None)
            outer = (self.get_metadata(ParentNodeProvider, parent, None)
                     if isinstance(parent, cst.Arg) else None)
            iterated = (isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original
                        or isinstance(outer, cst.Call) and len(outer.args) == 1
                        and m.matches(outer.func, m.Name("list") | m.Name("tuple")
                                      | m.Name("enumerate") | m.Name("sorted")))
            try:
                listed = children.children_call(self, original, updated, self._root,
                                                self._fn_stack[-1] if self._fn_stack else None,
                                                iterated)
            except children.ChildrenUnknown as exc:
                raise Untranslatable(str(exc), rule="torch.nn.Module.children") from None
            if listed is not None:
                return listed
            if self.target.stateful_modules and not self.target.setup_modules and (
                    self._is_module_expr(original.func.value)
                    or self._built_by_file_function(original.func.value)):
                # a module of a class the file does not define (timm's named_apply walks the
                # model it is given): its submodules as NNX holds them
                self.diag(original, "torch.nn.Module.children", "info",
                          "children of a module of another file: the torch_named_children "
                          "helper (its submodules in torch's order; activation layers are "
                          "JAX functions, not children)")
                walk = cst.Call(cst.Name("torch_named_children"), [cst.Arg(updated.func.value)])
                if original.func.attr.value == "named_children":
                    return walk
                return expr("(child for _, child in {w})", w=walk)
        if (m.matches(original, m.Call(func=m.Attribute(attr=m.Name("named_modules")), args=[]))
                and self.target.stateful_modules and self._is_module_expr(original.func.value)
                and not unnamed_modules_loop(self.get_metadata(ParentNodeProvider, original,
                                                                None))):
            walked = self._group_modules(original, updated)
            if walked is not None:
                return walked
            # timm's efficientnet_init_weights: for n, m in model.named_modules(): init_fn(m, n)
            return named_modules_walk(self, original, updated)
        if name and name.startswith(EINOPS_TORCH_LAYERS):
            return self._einops_layer(updated, name)
        if name in ("torch.nn.Buffer", "torch.nn.parameter.Buffer"):
            # self.x = nn.Buffer(t, persistent=False): as self.register_buffer("x", t)
            b = bind(updated.args, ("data", "persistent"))
            value, imports = self.target.buffer_value(b.get("data"))
            self.need(*imports)
            return value
        if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            b = bind(updated.args, ("data", "requires_grad"))
            attr = self._parameter_attribute(original) if self.target.parameters_named else None
            value, warning = self.target.parameter_value(
                attr, b.get("data"), b.literal("requires_grad") is not False)
            if warning is not None:
                self.diag(original, "parameter", "warning", warning)
            return value
        if name in RANDOM and self._builds_layers_here():
            # a draw while building layers (pos_embedding = torch.randn(...) in __init__):
            # from the rngs the layers are built with
            return tr.random_call(name, updated, expr("rngs.params()"))
        gen = next((a.value for a in original.args if a.keyword is not None
                    and a.keyword.value == "generator"), None)
        if name in RANDOM and isinstance(gen, cst.Name) and self.data.seeded_draw(gen.value):
            # a draw from a seeded generator: its own key, split at every draw
            if self._in_expr_scope:
                raise Untranslatable("random draw inside a lambda or comprehension: each draw "
                                     "needs its own key; make it a loop", rule="random")
            g = gen.value
            self.need("jax")
            self._pending[-1].before.append(cst.parse_statement(
                f"{g}, {g}_key = jax.random.split({g})\n"))
            kept = [a for a in updated.args if not (a.keyword is not None
                                                    and a.keyword.value == "generator")]
            if kept:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return tr.random_call(name, updated.with_changes(args=kept),
                                  cst.Name(f"{g}_key"))
        if name in RANDOM and id(original) in self.data.numpy_generators.draws:
            # a draw from a generator passed around as an object: a numpy Generator
            self.need("np", "jnp")
            return tr.numpy_generator_call(name, updated,
                                           self.data.numpy_generators.draws[id(original)])
        if name == "torch.stack" and self.data.host.loops:
            gathered = ha.stacked_slices(original, updated, self.data.host)
            if gathered is not None:
                self.need("np", "jnp")
                return gathered
        if name in RANDOM and id(original) in self.data.host.draws:
            # batch indices of the input pipeline: numpy, from the script's seed
            self.need("np")
            self._host_rng = True
            return tr.host_random_call(name, updated)
        drawn = self._dataset_draw(original, updated, name) if name in RANDOM else None
        if drawn is not None:  # a Dataset's method, read on the host as grain reads it
            return drawn
        if name in RANDOM:
            return tr.random_call(name, updated, self._subkey(original))
        if name in ("torch.fx.wrap", "torch._assert") and self._is_statement_call(original):
            return updated  # statements: handled in leave_Expr
        data = self._data_call(original, updated, name or "")
        if data is not None:
            return data
        if name in SEEDS or name in DROPPED_SEEDS or name in CLIPS or name in GRAD_MODES:
            return updated  # statements, with blocks and decorators: handled there
        if name == "torch.nn.init.calculate_gain":
            return self._calculate_gain(updated)
        if name and name.startswith("torch.nn.init.") and self._is_statement_call(original):
            return updated  # an initialisation statement: handled in leave_Expr
        if name in ("torch.save", "torch.load") and self._checkpoint_call(original) is not None:
            return updated  # checkpoint statements: handled in leave_Expr
        if name == "torch.save" and self.target.train_state and self._lt_saves_dict(original):
            return updated  # a checkpoint dict (linen): handled in leave_Expr
        if name == "torch.save" and self.target.stateful_modules and len(
                original.args) >= 2 and isinstance(original.args[0].value, cst.Name) and (
                original.args[0].value.value in self._ckpt_dicts) and isinstance(
                self.get_metadata(ParentNodeProvider, original, None), cst.Expr):
            return updated  # a checkpoint dict: handled in leave_Expr
        if name == "torch.save" and self._ckpt_inline and len(original.args) >= 2 and (
                isinstance(original.args[0].value, cst.Dict)) and isinstance(
                self.get_metadata(ParentNodeProvider, original, None), cst.Expr):
            return updated  # a checkpoint dict literal: handled in leave_Expr
        if name == "isinstance" or (isinstance(original.func, cst.Name)
                                    and original.func.value == "isinstance"):
            return self._isinstance(original, updated)
        if id(original) in self.training.optimizers or id(original) in self.training.schedulers:
            return updated  # statements: handled in leave_Assign / leave_Return
        if name and id(original) in self._own_calls:
            # F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps) in a
            # subclass of nn.LayerNorm: the layer's own call
            fn = self.rules.functions.get(name)
            params = fn.params if fn is not None else ("input",)  # F.batch_norm: no rule
            x = bind(updated.args, params).get(params[0])
            if name == "torch.nn.functional.group_norm":  # nnx.GroupNorm: channels-last
                return own_group_norm_call(x)
            return call("super().__call__", arg(x))
        if (own := conv_forward(self, original, updated)) is not None:
            return own  # F.conv2d(x, w, b, self.stride, ...) in a subclass of nn.Conv2d
        if name == rm.CHECKPOINT:
            return self._remat(original, updated)
        if name == rm.SEQUENTIAL:
            if self.target.setup_modules:
                raise Untranslatable("checkpoint_sequential in linen code: nn.remat of each "
                                     "segment is not translated", rule=name)
            layers, segments, x = rm.sequential_args(original, updated)
            return self._in_layer_layout(original.args[0].value, lambda xs: call(
                "checkpoint_sequential", layers, segments, *xs), [x])
        if name == "torch.nn.functional.dropout":
            layer = self._dropout_layer(original, updated)
            if layer is not None:
                return layer
        if name and name in self.rules.functions:
            return self._function(original, updated, self.rules.functions[name])
        if name and name.startswith("torch."):
            method = self._function_as_method(original, updated, name)
            if method is not None:
                return method
            raise Untranslatable(f"no rule for {name}", rule=name)
        if m.matches(original.func, m.Attribute(value=m.Name(), attr=m.Name("state_dict"))) and (
                original.func.value.value in self.training.scheduler_names):
            sched = self.training.scheduler_names[original.func.value.value]
            state = self._scheduler_state(original, sched) if sched.optimizer else None
            if state is None:
                raise Untranslatable("scheduler.state_dict() of a schedule not translated to "
                                     "optax, or of ReduceLROnPlateau", rule=sched.qualname)
            return state
        if m.matches(original.func, m.Attribute(value=m.Name(), attr=m.Name("get_last_lr"))):
            sched = self.training.scheduler_names.get(original.func.value.value)
            if sched is not None and sched.optimizer:
                # torch's list of Python floats (a JAX array would print as Array(...))
                if sched.inline:
                    step = self.target.step_count(sched.optimizer)
                    return expr(f"[float({sched.name}({step}))]")
                quote = self._string_quote()
                return expr(f"[float({self._lr_slot(sched.optimizer, quote)})]")
        if self._takes_key(original.func) and not any(
                a.keyword and a.keyword.value == tr.KEY for a in updated.args):
            return updated.with_changes(args=_fix_commas(
                [*updated.args, arg(self._subkey(original), tr.KEY)]))
        if name == "functools.partial" and original.args and self.target.stateful_modules:
            factory = self._partial_of_layer(original)
            if factory is not None:
                return factory
        if (m.matches(original.func, m.Attribute(attr=m.Name("normal_") | m.Name("uniform_")))
                and isinstance(original.func.value, cst.Call)
                and self.q(original.func.value.func) in _FILLED
                and self._builds_layers_here()):
            return self._random_fill(original, updated)
        if (m.matches(original.func, m.Attribute(attr=m.Name("normal_") | m.Name("uniform_")))
                and isinstance(original.func.value, cst.Call)
                and self.q(original.func.value.func) in FILLED_NEW
                and not self._builds_layers_here() and self._module_rngs()):
            # a module's draw at call time (Mixtral's router jitter): from its nnx.Rngs
            return self._random_fill(original, updated, self._subkey(original))
        if (m.matches(original.func, m.Attribute(value=m.Name("self"), attr=m.Name("add_module")))
                and len(original.args) == 1 and original.args[0].star == "*"
                and self.in_module_class()
                and self.index.classes[self.current_class].container is None):
            # self.add_module(*stage), stage a (name, module) pair (timm's ResNet): setattr,
            # as the two-argument form on a plain module
            return call("setattr", arg(cst.Name("self")), *updated.args)
        if (m.matches(original.func, m.Attribute(attr=m.Name("add_module")))
                and len(original.args) == 2 and self.in_module_class()):
            added = self._add_module(original, updated)
            if added is not None:
                return added
        if (m.matches(original.func, m.Attribute(value=m.Name(), attr=m.Name("add_module")))
                and len(original.args) == 2 or m.matches(original.func, m.Attribute(
                    value=m.Name(), attr=m.Name("append"))) and len(original.args) == 1) and (
                not any(a.star or a.keyword for a in original.args)):
            added = self._local_sequential_add(original, updated)
            if added is not None:
                return added
        if (m.matches(original.func, m.Attribute(value=m.Attribute(value=m.Name("self")),
                                                 attr=m.Name("append")))
                and len(original.args) == 1 and not original.args[0].star
                and not original.args[0].keyword and self.in_module_class()):
            # self.stages.append(stage) of a Sequential attribute (timm's cspnext, mambaout)
            added = self._add_module(original, updated)
            if added is not None:
                return added
        if (m.matches(original.func, m.Attribute(value=m.Attribute(value=m.Name("self")),
                                                 attr=m.Name("extend")))
                and len(original.args) == 1 and not original.args[0].star
                and not original.args[0].keyword and self.in_module_class()):
            extended = self._sequential_extend(original, updated)
            if extended is not None:
                return extended
        if (m.matches(original.func, m.Attribute(attr=m.Name("append")))
                and len(original.args) == 1 and not original.args[0].keyword
                and self._normalized_list(original.func.value)):
            return self._normalized_append(original, updated)
        if isinstance(original.func, cst.Name) and self.target.stateful_modules:
            n = original.func.value
            factory = Layouts(self.rules, self, self.index).factory_rule(n)
            if (factory is not None and _activation_value(factory) is not None) or (
                    factory is None and self._fn_stack and n in self._param_names[-1]
                    and ("activation" in n or n.endswith("act_layer"))
                    and all(a.star == "**" or (a.keyword and a.keyword.value == "inplace")
                            for a in original.args)):
                # an activation class handed in (activation_layer(inplace=True)): the
                # classes passed for it are their functions
                out = self._activation_factory_call(original, updated)
                if (factory is None or self.index.outside_callers) and (
                        self._rngs_scope and self._rngs_scope[-1]):
                    # no default says what it is, or the file's classes are built by code
                    # not seen here (a package's module: timm's Mlp given convnext's
                    # GELUTanh by get_act_layer("gelu_tanh")): a module class may come
                    # (rdnet's act_layer from timm's get_act_layer("gelu"), timm's GELU
                    # module): built then, as the torch call built it (it was called on the
                    # activations in the forward)
                    self.diag(original, "layer-factory", "info",
                              f"{n}(...): an activation function is used as it is, a "
                              "module class is built")
                    return self._build_layer(original, updated)
                return out
            if self._fn_stack and not self.target.setup_modules and looked_up_activation(
                    self._fn_stack[-1], original):
                # act_layer = get_act_layer(name); act_layer(inplace=inplace): the lookup
                # gives a JAX function (a torch activation class converted) or a module class
                self.diag(original, "layer-factory", "info",
                          f"{n}(...): an activation function from a lookup is used as it is "
                          "(its constructor keywords, inplace, are dropped); a module class "
                          "is built")
                return self._build_layer(original, updated)
        if isinstance(original.func, cst.Name) and self.target.stateful_modules and (
                self._layer_subclass_rule(original.func.value) is not None
                and self._takes_layer_arguments(original.func.value)
                and not self._torch_signature_layer(original.func.value)):
            # LayerNorm2d(dim, eps=1e-6): built with the JAX layer's arguments
            return self._layer_arguments(original, updated,
                                         self._layer_subclass_rule(original.func.value))
        if (name == "functools.partial" and original.args and self.target.stateful_modules
                and m.matches(original.args[0].value, m.Name())
                and holds_drawing_function(self._fn_stack, original.args[0].value.value,
                                           self.index.draw_functions, self.index.rngs_functions)
                and self._rngs_scope and self._rngs_scope[-1]):
            # named_apply(partial(_init_weights, head_bias=0.), self): the init function runs
            # elsewhere, its draws with the rngs the partial binds
            return self._with_rngs(original, updated)
        if (name == "functools.partial" and original.args and self.target.stateful_modules
                and m.matches(original.args[0].value, m.Attribute(value=m.Name("self")))
                and self.current_class and self._rngs_scope and self._rngs_scope[-1]
                and f"{self.current_class}.{original.args[0].value.attr.value}"
                in self.index.rngs_functions and not m.matches(self.get_metadata(
                    ParentNodeProvider, self.get_metadata(ParentNodeProvider, original)),
                    m.Call(func=m.Attribute(attr=m.Name("apply"))))):  # (self.apply: a loop)
            # named_apply(partial(self._init_weights, scheme=scheme), self) (timm's maxxvit):
            # the method runs elsewhere, with the rngs the partial binds
            return self._with_rngs(original, updated)
        if (name != "functools.partial" and self._rngs_scope and self._rngs_scope[-1]
                and self.target.stateful_modules
                and not m.matches(original.func, m.Attribute(attr=m.Name("apply")))
                and any(m.matches(a.value, m.Name(m.MatchIfTrue(
                    self.index.draw_functions.__contains__))) for a in original.args)):
            # named_apply(_init_conv, self) (timm's vitamin): a function of the file that
            # draws, handed on bare, runs elsewhere with the rngs bound to it
            self.need("partial")
            updated = updated.with_changes(args=[
                a.with_changes(value=call("partial", arg(a.value), arg(
                    self.rngs_expr(original), "rngs")))
                if m.matches(o.value, m.Name(m.MatchIfTrue(
                    self.index.draw_functions.__contains__))) else a
                for o, a in zip(original.args, updated.args)])
        # user module classes and layer-building functions need rngs
        if self._builds_module(original, name):
            return self._with_rngs(original, updated)
        if (m.matches(original.func, m.Call(func=m.Name())) and self._builds_layers_here()
                and ((original.func.func.value.startswith("get_")
                      and original.func.func.value not in self._file_functions)
                     or original.func.func.value in self._class_lookups)):
            # get_norm_act_layer(norm_layer, act_layer=act_layer)(chs, **dd) (timm's
            # xception_aligned): an imported lookup's class (or activation function), built
            return self._build_layer(original, updated)
        if (m.matches(original.func, m.Attribute(value=m.Name())) and self._builds_layers_here()
                and original.func.value.value != "self"
                and original.func.attr.value in self._module_type_fields(original)):
            # layers.conv_norm_act(in_chs, out_chs, 1) (timm's byobnet): a field of a config
            # holding a module class, a partial of one, or an activation function
            return self._build_layer(original, updated)
        if m.matches(original.func, m.Name()) and self._builds_layers_here() and (
                original.func.value in self._layer_fn_locals(original)):
            # layer_fn = layers.conv_norm_act if na else create_conv2d (timm's byobnet Stem)
            return self._build_layer(original, updated)
        if self._builds_layers_here() and forwards_kwargs(
                self._fn_stack[-1], original, self._kwargs_functions - self.index.rngs_functions):
            return self._with_rngs(original, updated)  # (the rngs its caller gave in kwargs)
        if self._builds_layers_here() and hands_class_kwargs(
                self._fn_stack[-1], original, self.index.module_classes,
                self._file_functions | self.index.module_classes | self.index.rngs_functions):
            return self._with_rngs(original, updated)  # build_model_with_cfg(Cls, **kwargs)
        if self._method_of_some_class_takes_rngs(original, name) or self._builds_layers_here() and (
                holds_rngs_function(self._fn_stack[-1], original, self.index.rngs_functions)):
            # module.init_weights() in timm's _init_weights (mlp_mixer), the module any of the
            # model's: the method draws in some classes (it takes rngs), not in others
            return call("call_with_rngs", arg(updated.func), *self._with_rngs(
                original, updated).args)
        if (m.matches(original.func, m.Attribute(attr=m.Name("requires_grad_")))
                and self.target.stateful_modules and not self.target.intermediate
                and (self._builds_layers_here() or not self.in_module_class())
                and _false_flag(original) and self._is_module_expr(original.func.value)):
            # self.embed_positions.requires_grad_(False) while building, model.backbone's in a
            # script: its parameters are FrozenParams (passes/helpers.py), which nnx.grad and
            # nnx.Optimizer over nnx.Param leave alone, as torch's backward and optimizers do
            return cst.Call(cst.Name("freeze_parameters"), [cst.Arg(updated.func.value)])
        if m.matches(original.func, m.Attribute(attr=m.Name("requires_grad_"))) and (
                _false_flag(original) and self._freezes_one_by_one(original, original.func.value)):
            raise Untranslatable(ONE_BY_ONE, rule="requires_grad")
        # method calls on tensors
        if isinstance(original.func, cst.Attribute):
            meth = original.func.attr.value
            rule = self.rules.methods.get(meth) or self._inplace_rule(original)
            recv = original.func.value
            if rule is not None and self._tensorlike(recv, meth, original):
                if meth in ("reshape", "view") and original.args and all(
                        a.keyword is None and a.star != "**" for a in original.args) and (
                        (meth == "reshape" and self._receiver_unsure(recv, meth))
                        or any(a.star == "*" for a in original.args)):
                    # x.reshape(*shape, -1) / x.reshape(b, -1): the same call for torch, numpy
                    # and jax arrays (jax.Array.reshape takes the sizes as arguments too);
                    # x.view(*shape) is that reshape (a dtype is never given starred)
                    return updated.with_changes(func=updated.func.with_changes(
                        attr=cst.Name("reshape")))
                if self._receiver_unsure(recv, meth, original):
                    raise Untranslatable(
                        f"{code(recv)}.{meth}(...): {code(recv)} is not known to be a tensor "
                        f"(other objects have a .{meth} too): left as it is",
                        rule="unknown-receiver")
                return self._method(original, updated, rule)
            if meth in ("to", "cuda", "cpu", *mc.CAST_METHODS) and self._is_module_expr(recv):
                return mc.rewrite_cast(self, original, updated)  # .to(device), .double()
            made = self.rules.methods.get(meth[:-1]) if (
                rule is None and meth.endswith("_") and meth[:-1] not in _INPLACE_DTYPE
                and isinstance(recv, cst.Call) and self.q(recv.func) in _MADE) else None
            if made is not None:
                # torch.zeros(n).scatter_add_(0, i, s): the new tensor, which nothing else
                # reads, is the value of the out-of-place method
                return self._method(original, updated, made)
            if rule is None and meth in ("fill_", "zero_") and self._made(recv) and len(
                    original.args) == (meth == "fill_") and (
                    not original.args[0].star if original.args else True):
                # torch.empty(b, 1, dtype=torch.long).fill_(sos): the new tensor filled
                self.need("jnp")
                return (expr("jnp.full_like({x}, {v})", x=updated.func.value,
                             v=updated.args[0].value) if meth == "fill_"
                        else expr("jnp.zeros_like({x})", x=updated.func.value))
            fresh = inplace_on_made_value(self, original, updated, meth) if rule is None and (
                made is None) else None  # x.mul(std).add_(mean): passes/fresh_values.py
            if fresh is not None:
                return fresh
            known = (rule is None and made is None and self.values is not None
                     and self.values.kind(recv) == vk.Kind.TENSOR)
            function = self.rules.functions.get(f"torch.{meth}") if known or (
                rule is None and made is None and torch_only_method(self, recv, meth)) else None
            if function is not None and function.params[:1] == ("input",):
                # x.mul(y), x.flip(0), x.gather(1, i): a tensor method with no rule of its own
                # whose torch function has one is that function of the receiver
                return self._function(original, updated.with_changes(
                    func=expr(f"torch.{meth}"),
                    args=[arg(updated.func.value), *_fix_commas(list(updated.args))]), function)
            inplace = self._inplace_value(original, updated, meth) if rule is None and (
                made is None) and (self.values is None or self.values.kind(recv) in (
                    vk.Kind.TENSOR, vk.Kind.UNKNOWN, vk.Kind.PARAM)) else None
            if inplace is not None:
                return inplace
            if known and meth in TORCH_ONLY_TENSOR_METHODS and meth != "backward" and not (
                    meth.endswith("_") and isinstance(
                        self.get_metadata(ParentNodeProvider, original, None), cst.Expr)):
                # (an in-place method as a statement, x.zero_(), w[i].fill_(v), is the
                # statement's: translated there or marked as an in-place update)
                # (loss.backward() belongs to the training loop, which translates it or
                # marks the loop; the NNX translation the equinox pass goes on from keeps it)
                # x.register_hook(...), x.index_fill(...): no rule, and a JAX array has no such
                # method: marked, not left to raise AttributeError where it runs
                raise Untranslatable(f"{code(recv)}.{meth}(...): torch's tensor method "
                                     f".{meth} has no rule, and a JAX array has no .{meth}",
                                     rule="tensor-method")
        # self.layer(x): activation layout
        return self._layout_call(original, updated)

    def _remat(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``checkpoint(fn, *args, use_reentrant=False)``: see passes/remat.py for the forms."""
        ofn, fn, args = rm.split_args(original, updated)
        transform = self.target.remat
        result = self._remat_form(original, ofn, fn, args, transform)
        if transform in code(result):
            self.diag(original, rm.CHECKPOINT, "info", "torch's checkpoint runs the function "
                      "again in the backward pass, so a BatchNorm inside it folds its batch "
                      f"statistics into the running ones twice per training step; {transform} "
                      "folds them once, as torch does without the checkpoint")
        return result

    def _remat_form(self, original: cst.Call, ofn: cst.BaseExpression, fn: cst.BaseExpression,
                    args: list[cst.Arg], transform: str) -> cst.BaseExpression:
        closure = self._local_function(ofn)
        if closure is not None and findall(closure, m.Name("self")):
            if isinstance(fn, cst.Lambda):
                fn = rm.with_self_param(fn)
            else:
                self._remat_closures.setdefault(id(self._fn_stack[-1]), set()).add(ofn.value)
            return rm.remat_call(transform, fn, args, cst.Name("self"))
        if m.matches(ofn, m.Attribute(value=m.Name("self"))) and not self._is_module_expr(ofn):
            # a method (of this class or of a base class of another file)
            return rm.remat_call(transform, expr(f"type(self).{ofn.attr.value}"), args,
                                 cst.Name("self"))
        if closure is not None or (isinstance(ofn, cst.Name) and "<locals>" not in (
                self.q(ofn) or "<locals>")):
            if any(self._is_module_expr(a.value) for a in args):
                return rm.remat_call(transform, fn, args)
            self.need("jax")
            return rm.remat_call("jax.checkpoint", fn, args)
        return self._in_layer_layout(ofn, lambda xs: rm.layer_call(transform, fn, xs), args)

    def _local_function(self, fn: cst.BaseExpression) -> cst.FunctionDef | cst.Lambda | None:
        """A lambda, or a function defined in the function being rewritten and used there only
        as checkpoint's function (its definition is given a ``self`` parameter)."""
        if isinstance(fn, cst.Lambda):
            return fn
        if not isinstance(fn, cst.Name) or not self._fn_stack:
            return None
        outer = self._fn_stack[-1]
        local = next((s for s in outer.body.body if isinstance(s, cst.FunctionDef)
                      and s.name.value == fn.value), None)
        if local is None:
            return None
        for use in findall(outer.body, m.Name(fn.value)):
            parent = self.get_metadata(ParentNodeProvider, use, None)
            if parent is local:
                continue
            grand = self.get_metadata(ParentNodeProvider, parent, None)
            if not (isinstance(parent, cst.Arg) and isinstance(grand, cst.Call)
                    and grand.args[0] is parent and self.q(grand.func) == rm.CHECKPOINT):
                raise Untranslatable(f"{fn.value} is checkpointed and also used otherwise: "
                                     "nnx.remat needs it to take the module as an argument",
                                     rule=rm.CHECKPOINT)
        return local

    def _remat_closures_take_self(self, original: cst.FunctionDef,
                                  updated: cst.FunctionDef) -> cst.FunctionDef:
        """The nested defs checkpointed with the module passed in take it as ``self``."""
        names = self._remat_closures.pop(id(original), set())
        if not names:
            return updated
        body = [rm.with_self_param(s) if isinstance(s, cst.FunctionDef) and s.name.value in names
                else s for s in updated.body.body]
        return updated.with_changes(body=updated.body.with_changes(body=body))

    # -- functions and methods
    def _function(self, original, updated, rule: Rule) -> cst.BaseExpression:
        b = bind(updated.args, rule.params)
        site = Site(rule=rule, args=b, unpack=self._unpack.get(id(original)),
                    target=self.target.name, defined=self.index.defined,
                    optional=self._optional_args(original, rule),
                    sequences=self._sequence_args(original, rule),
                    scalars=self._scalar_args(original, rule),
                    choices=self._choice_args(original, rule), packed=self._packs,
                    ranks=rank_args(self, original, rule))
        given = bind(original.args, rule.params) if len(original.args) == len(updated.args) \
            else BoundArgs()
        pairs = [(b.get(k), given.get(k)) for k in b.named if given.get(k) is not None]
        flush = self._binder(original, site, pairs)
        return flush(self._apply(original, site, receiver_first=False))

    def _binder(self, original: cst.Call, site: Site, pairs):
        """Gives ``site`` its ``bind`` (a tensor the translation reads twice, bound to a fresh
        name, evaluated once and in torch's order) and returns what completes the translation
        ``out`` once the special has written it: the bound statements go before the current
        one, in the order of their source, and the walrus bindings into ``out``.

        A binding is a statement before the current one when nothing the statement evaluates
        before the expression can have an effect (no call outside the ones it sits in) and the
        statement evaluates it exactly once (not in a branch of ``a if c else b``, ``a and b``,
        a lambda or a comprehension). Elsewhere it is a walrus, ``(name := value)``, at the
        first read of the name in the translation, where Python allows one."""
        path: list[cst.CSTNode] = [original]
        node: cst.CSTNode | None = original
        while node is not None and not isinstance(node, (cst.SimpleStatementLine,
                                                         cst.BaseCompoundStatement)):
            node = self.get_metadata(ParentNodeProvider, node, None)
            if node is not None:
                path.append(node)
        stmt = node if isinstance(node, cst.SimpleStatementLine) else None
        once = stmt is not None and not self._in_expr_scope and bool(self._pending)
        walrus_ok = True
        for child, parent in itertools.pairwise(path):
            if isinstance(parent, (cst.Lambda, cst.BaseComp, cst.CompFor)) or (
                    isinstance(parent, cst.IfExp) and child is not parent.test) or (
                    isinstance(parent, cst.BooleanOperation) and child is parent.right):
                once = False
            if isinstance(parent, cst.CompFor) and child is parent.iter:
                walrus_ok = False  # Python: not in a comprehension's iterable
            if isinstance(parent, (cst.BaseComp, cst.CompFor)):
                scope = next((n for n in path[path.index(parent):]
                              if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef))),
                             None)
                if scope is None:
                    scope = self._enclosing_scope(parent)
                walrus_ok = walrus_ok and not isinstance(scope, cst.ClassDef)
        pending = self._pending[-1] if self._pending else None
        hoisted: list[tuple[tuple[int, int], cst.CSTNode, cst.BaseStatement]] = []

        def start(n: cst.CSTNode) -> tuple[int, int]:
            return self.get_metadata(PositionProvider, n).start

        def in_order(source: cst.CSTNode) -> bool:
            """Nothing the statement evaluates before ``source`` is a call, but the calls it
            is an argument of and the expressions bound before it."""
            chain = {id(source)}
            n: cst.CSTNode | None = source
            while n is not None and n is not stmt:
                n = self.get_metadata(ParentNodeProvider, n, None)
                chain.add(id(n))
            first = start(source)
            first = (first.line, first.column)
            bound = {id(c) for _, h, _ in hoisted for c in findall(h, m.Call())}
            for c in findall(stmt, m.Call() | m.Await() | m.Yield()):
                if id(c) in chain or id(c) in bound or self._pure_call(c):
                    continue
                p = start(c)
                if (p.line, p.column) < first:
                    return False
            return True

        def bind_name(value: cst.BaseExpression, hint: str) -> cst.Name:
            source = next((o for u, o in pairs if u is value), None)
            name, n = hint, 1
            while name in self._file_names:
                n += 1
                name = f"{hint}{n}"
            if once and source is not None and pending is not None and in_order(source):
                self._file_names.add(name)
                p = start(source)
                hoisted.append(((p.line, p.column), source, cst.SimpleStatementLine(
                    body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=value)])))
                return cst.Name(name)
            if not walrus_ok:
                raise Untranslatable(f"`{code(value)}` is used more than once in the "
                                     "translation, and Python allows no binding here (a "
                                     "comprehension's iterable, or one in a class body): "
                                     "assign it to a name first")
            self._file_names.add(name)
            site.walrus.append((name, value))
            return cst.Name(name)

        site.bind = bind_name
        if once and pending is not None:
            site.before = pending.before.append

        def flush(out):
            for name, value in site.walrus:
                out = _write_walrus(out, name, value)
            if pending is not None:
                pending.before.extend(s for _, _, s in sorted(hoisted, key=lambda h: h[0]))
            return out
        return flush

    def _pure_call(self, c: cst.CSTNode) -> bool:
        """A call whose evaluation has no effect another expression could see, so an operand
        may be bound before it: a torch function that is not in-place and draws nothing
        (``torch.zeros(n)``), or a method of a known tensor that is not in-place
        (``logits.view(-1, logits.size(-1))``)."""
        if not isinstance(c, cst.Call):
            return False
        q = self.q(c.func) or ""
        if q.startswith("torch.") and q.count(".") == 1:
            return not q.endswith("_") and q not in RANDOM and q not in SEEDS
        if isinstance(c.func, cst.Attribute) and self.values is not None:
            name = c.func.attr.value
            return (not name.endswith("_") and name not in _EFFECT_METHODS
                    and self.values.kind(c.func.value) is vk.Kind.TENSOR)
        return False

    def _enclosing_scope(self, node: cst.CSTNode) -> cst.CSTNode | None:
        while node is not None and not isinstance(node, (cst.FunctionDef, cst.Lambda,
                                                         cst.ClassDef)):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node

    def _optional_args(self, original: cst.Call, rule: Rule) -> frozenset[str]:
        """The arguments of ``original`` that may hold None at run time (value analysis)."""
        if self.values is None or rule.special not in ("functional_layer_norm",
                                                       "conv_function",
                                                       "conv_transpose_function"):
            return frozenset()
        given = bind(original.args, rule.params)
        return frozenset(name for name in ("weight", "bias") if given.get(name) is not None
                         and self.values.may_be_none(given.get(name)))

    def _sequence_args(self, original: cst.Call, rule: Rule) -> frozenset[str]:
        """Size arguments that hold a tuple or list: ``F.conv2d(x, w, None, self.stride)``,
        ``F.adaptive_avg_pool2d(x, size)``, ``torch.empty(self.normalized_shape)``."""
        if self.values is not None and rule.special == "legacy_tensor":  # LongTensor(indices)
            # (or a numpy array: torch.FloatTensor(np.sin(table)), the sinusoidal positions of
            # nine modeling files)
            data = bind(original.args, rule.params).get("data")
            return frozenset({"data"}) if data is not None and (self.values.kind(data) in (
                vk.Kind.TUPLE, vk.Kind.LIST) or self.values.value(data) == vk.NUMPY) \
                else frozenset()
        if self.values is not None and rule.special == "split":  # x.split(self.sizes)
            return self._split_sizes(original, rule)
        if self.values is not None and rule.special == "meshgrid":  # torch.meshgrid(t)
            t = bind(original.args, rule.params).get("tensors")
            return frozenset({"tensors"}) if t is not None and self.values.kind(t) in (
                vk.Kind.TUPLE, vk.Kind.LIST) else frozenset()
        if self.values is None or rule.special not in (
                "conv_function", "conv_transpose_function", "adaptive_pool_function", "creation"):
            return frozenset()
        given, seq = bind(original.args, rule.params), (vk.Kind.TUPLE, vk.Kind.LIST)
        return frozenset(k for k in ("stride", "padding", "dilation", "output_size", "size")
                         if given.get(k) is not None and self.values.kind(given.get(k)) in seq)

    def _function_as_method(self, original: cst.Call, updated: cst.Call,
                            name: str) -> cst.BaseExpression | None:
        """``torch.masked_fill(x, mask, v)``, a torch function with no rule of its own whose
        tensor method has one: torch's function form of a method is that method on its first
        argument (a tensor, as the function takes one), ``x.masked_fill(mask, v)``."""
        short = name.removeprefix("torch.")
        rule = self.rules.methods.get(short)
        if rule is None or "." in short or not updated.args or updated.args[0].keyword or (
                updated.args[0].star):
            return None
        method = updated.with_changes(
            func=cst.Attribute(value=updated.args[0].value, attr=cst.Name(short)),
            args=_fix_commas(list(updated.args[1:])))
        return self._method(original, method, rule,
                            receiver=original.args[0].value if original.args else None)

    def _method(self, original, updated, rule: Rule,
                receiver: cst.BaseExpression | None = None) -> cst.BaseExpression:
        """``receiver``: the original node of the receiver where the call is torch's function
        form of the method (``torch.sort(x)``), else the original call's ``func.value``."""
        b = bind(updated.args, rule.params)
        dtypes: frozenset[str] = frozenset()
        if rule.special in ("to", "type_cast") and self.values is not None:  # x.to(y.dtype)
            given = bind(original.args, rule.params)
            dtypes = frozenset(k for k in ("device", "dtype") if given.get(k) is not None
                               and self.values.is_dtype(given.get(k)))
        site = Site(rule=rule, args=b, receiver=updated.func.value,
                    unpack=self._unpack.get(id(original)), target=self.target.name,
                    dtypes=dtypes, sequences=self._split_sizes(original, rule)
                    if rule.special == "split" else frozenset())
        if receiver is None and isinstance(original.func, cst.Attribute):
            receiver = original.func.value
        pairs = [(site.receiver, receiver)] if receiver is not None else []
        given = bind(original.args, rule.params) if len(original.args) == len(updated.args) \
            else BoundArgs()
        pairs += [(b.get(k), given.get(k)) for k in b.named if given.get(k) is not None]
        flush = self._binder(original, site, pairs)
        return flush(self._apply(original, site, receiver_first=True))

    def _apply(self, original, site: Site, receiver_first: bool) -> cst.BaseExpression:
        rule = site.rule
        b = site.args
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown:
            raise Untranslatable(f"{rule.torch}: argument(s) {', '.join(unknown)} not "
                                 "translated", rule=rule.id)
        if b.star and not (rule.special in STARRED_SPECIALS and all(
                a.star == "*" for a in b.star)):
            raise Untranslatable(f"{rule.torch} called with *args/**kwargs", rule=rule.id)
        if rule.special:
            out = SPECIALS[rule.special](site)
            if self.target.setup_modules and rule.special == "pool_function":
                self.need("linen")  # nn.max_pool / nn.avg_pool
        else:
            out = self._generic(site, receiver_first)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        if rule.layout == "any" or (rule.special is None and rule.jax and rule.jax.startswith(
                "jax.nn.")):
            out = _push_out_layout(out)
        return out

    def _generic(self, site: Site, receiver_first: bool) -> cst.BaseExpression:
        rule = site.rule
        args = _rule_args(site)
        jax = rule.jax or ""
        if receiver_first:
            if jax.startswith("."):
                return call(expr("{x}" + jax, x=site.receiver), *args)
            return call(jax, arg(site.receiver), *args)
        if jax.startswith("."):
            first, *rest = args
            return call(expr("{x}" + jax, x=first.value), *rest)
        return call(jax, *args)

    def _rule_call(self, original, updated: cst.Call, rule: Rule, ctor: cst.Call):
        """``self.attn(q, k, v)`` of a layer whose rule has a ``call`` transform."""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        unpack = index = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
                parent.targets[0].target, (cst.Tuple, cst.List)):
            unpack = tuple(code(e.value) for e in parent.targets[0].target.elements)
        elif (isinstance(parent, cst.Subscript) and parent.value is original
              and len(parent.slice) == 1 and isinstance(parent.slice[0].slice, cst.Index)):
            index = int_value(parent.slice[0].slice.value)
        site = CallSite(rule=rule, func=updated.func, ctor=bind(ctor.args, rule.params),
                        args=bind(updated.args, rule.call_params), unpack=unpack, index=index,
                        target=self.target.name, packed=self._packs)
        out = CALLS[rule.call](site)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        self._note_imports(out)
        return out


# tensor methods with an effect beyond their value (not in-place by name)
# tensors made with a shape (a one-element one converts to a Python number in torch)
_SIZED_DRAWS = frozenset({"torch.randint", "torch.rand", "torch.randn", "torch.zeros",
                          "torch.ones", "torch.full", "torch.empty", "torch.multinomial",
                          "torch.randperm", "torch.normal", "torch.bernoulli"})
_EFFECT_METHODS = frozenset({"backward", "register_hook", "record_stream", "retain_grad",
                             "share_memory_", "pin_memory", "tolist", "item"})


def _false_flag(call: cst.Call) -> bool:
    """``x.requires_grad_(False)`` / ``x.requires_grad_(requires_grad=False)``."""
    return len(call.args) == 1 and not call.args[0].star and (
        call.args[0].keyword is None or call.args[0].keyword.value == "requires_grad") and (
        m.matches(call.args[0].value, m.Name("False")))
