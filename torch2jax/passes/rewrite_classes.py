"""Module classes: class and method shells, ``__init__`` and ``super().__init__``, Sequential
subclasses, module iteration and ``apply``, the ``rngs`` a constructor takes.

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.class_locals import (
    builder_instance,
    local_function,
    looked_up_class,
    param_default,
    param_loop_targets,
    unpacked_classes,
)
from torch2jax.analysis.index import Layouts, ordered_dict_items, spread_literals
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.tables import method_on_parameter, table_items
from torch2jax.analysis.walk import findall, walk
from torch2jax.passes import class_names, closures, training_flag
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    add_kwonly_param,
    arg,
    bind,
    call,
    code,
    expr,
    unnamed_modules_loop,
    wrap_long_statement,
)
from torch2jax.passes.rewrite_support import (
    _BUILTINS,
    _OVERLOADS,
    _STATE_DICT_HOOKS,
    _apply_loop,
    _fix_commas,
    _is_docstring,
    _isinstance_of,
)
from torch2jax.targets import linen as linen_target
from torch2jax.targets import linen_training as lt

# a key of _module_class_tables: a top-level alias of a torch layer class, not a table
ALIAS = "alias:"


class ModuleClassMixin:
    # ------------------------------------------------------------------ classes
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_stack.append(node.name.value)
        # self.x = nn.Parameter(...) / self.register_buffer("x", ...) anywhere in the class
        # (define_relative_position_bias_table) or in its bases of this file
        names = set().union(*(self._variable_attrs.get(b.value.value, set())
                              for b in node.bases if isinstance(b.value, cst.Name)))
        for a in findall(node, m.Assign(targets=[m.AssignTarget(target=m.Attribute(
                value=m.Name("self")))], value=m.Call())):
            if self.q(a.value.func) in ("torch.nn.Parameter", "torch.nn.parameter.Parameter",
                                        "torch.nn.Buffer", "torch.nn.parameter.Buffer"):
                names.add(a.targets[0].target.attr.value)
        for c in findall(node, m.Call(func=m.Attribute(value=m.Name("self"),
                                                          attr=m.Name("register_buffer")))):
            if c.args and isinstance(c.args[0].value, cst.SimpleString):
                names.add(c.args[0].value.evaluated_value)
        self._variable_attrs[node.name.value] = names
        self._class_inits[node.name.value] = any(
            isinstance(f, cst.FunctionDef) and f.name.value == "__init__" for f in node.body.body)

    def leave_ClassDef(self, original_node, updated_node):
        name = self._class_stack.pop()
        if name not in self.index.module_classes:
            return self._dataset_class(original_node, updated_node)
        updated_node = self._lambda_methods(original_node, updated_node)
        info = self.index.classes[name]
        bases = []
        for b, ob in zip(updated_node.bases, original_node.bases):
            q = self.q(ob.value)
            if q in ("torch.nn.Module", "torch.nn.modules.module.Module"):
                bases.append(b.with_changes(value=expr(self.target.module_base)))
                self.need(self.target.module_import)
            elif (q in self.rules.layers and self.rules.layers[q].special in (
                    "sequential", "module_dict", "module_list") and self.target.stateful_modules):
                # class ConvNormActivation(nn.Sequential): super().__init__(*layers) fills it;
                # class _DenseBlock(nn.ModuleDict): a dict of layers in insertion order
                special = self.rules.layers[q].special
                bases.append(b.with_changes(value=expr(
                    "LayerDict" if special == "module_dict"
                    else self.rules.layers[q].targets["nnx"])))
                self.need("nnx")
            elif q in self.rules.layers and q == info.layer_base and (
                    self._layer_subclass_rule(name) is not None):
                # class LayerNorm2d(nn.LayerNorm): the JAX layer, with the subclass's methods
                base = ("Embedding" if name in self._padded_embedding_subclasses
                        else "LayerNorm" if name in self._torch_layer_norm_subclasses
                        else self._batch_norm_base(name)
                        if self.rules.layers[q].special in ("batch_norm", "conv")
                        else self.rules.layers[q].targets["nnx"])
                bases.append(b.with_changes(value=expr(base)))
                self.need("nnx")
            elif q in self.rules.layers:
                self.diag(ob, "module-subclass", "error",
                          f"subclass of the torch layer {q}: its parameters and forward are "
                          "not translated")
                bases.append(b)
            else:
                bases.append(b)
        body = list(updated_node.body.body)
        has_init = any(isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                       for s in body)
        if info.module_base == "torch" and self._torch_signature_layer(name):
            # class Linear(nn.Linear) with only a forward: built with torch's arguments
            init = self._torch_signature_init(self._layer_subclass_rule(name))
            i = 1 if body and _is_docstring(body[0]) else 0
            body.insert(i, init)
            if i + 1 < len(body) and isinstance(body[i + 1], cst.FunctionDef):
                body[i + 1] = body[i + 1].with_changes(leading_lines=[cst.EmptyLine()])
            has_init = True
            self.need("nnx")
        # (not when every self.training read became an nnx.Dropout, which has its own flag,
        # and no class of the file derives from this one)
        hoisted_all = (self._training_hoisted.get(name, 0) == self._training_reads.get(name, 0)
                       and self._training_hoisted.get(name, 0) > 0 and not any(
                           c.module_base == name for c in self.index.classes.values()))
        if (training_flag.sets_training_flag(self.index.classes, name, info) and has_init
                and self.target.stateful_modules and not hoisted_all
                and (info.module_base == "torch" or not self._training_base(info))):
            body = [self._add_training_flag(s) if isinstance(s, cst.FunctionDef)
                    and s.name.value == "__init__" else s for s in body]
        new = updated_node.with_changes(
            bases=bases, body=updated_node.body.with_changes(body=body))
        new = self._add_dropouts(name, new)
        if self.target.setup_modules:
            try:
                is_base = any(c.module_base == name for c in self.index.classes.values())
                new = linen_target.readable_dense(new, self._linear_inputs(info))
                new = linen_target.tied_dense(new, {h for c, h in self._lt_tied if c == name})
                values = () if is_base else self._plain_values(original_node)
                new, needs = linen_target.to_setup(
                    new, self.uses_train and info.module_base == "torch", kw_only=is_base,
                    values=values)
                self.need(*needs)
                if name in self._lt_dtype_classes:
                    new = lt.add_dtype_field(new)
                    self.need("Any")
            except Untranslatable as exc:
                self.diag(original_node, "linen", "error", exc.message)
        return new

    def _plain_values(self, cls: cst.ClassDef) -> set[str]:
        """The attributes of ``cls`` that hold values, not layers, and are read nowhere but on
        ``self``: every ``self.x = ...`` of them calls only the file's functions that build
        no layer and a few builtins (``self.out_dim = default(out_dim, channels)``)."""
        plain = {f for f in self.index.fn_returns if "." not in f} - self.index.rngs_functions \
            - self.index.module_classes | {"int", "float", "bool", "len", "max", "min", "abs"}
        kinds: dict[str, bool] = {}
        for a in findall(cls, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self")))])):
            calls = findall(a.value, m.Call())
            kinds[a.targets[0].target.attr.value] = kinds.get(
                a.targets[0].target.attr.value, True) and not findall(a.value, m.Lambda()) and all(
                isinstance(c.func, cst.Name) and c.func.value in plain for c in calls)
        read_elsewhere = {a.attr.value for a in findall(self._root, m.Attribute(
            value=~m.Name("self")))}
        return {a for a, plain_value in kinds.items() if plain_value} - read_elsewhere

    def _linear_inputs(self, info) -> dict[str, cst.BaseExpression]:
        """self.x -> the input size of its torch ``nn.Linear(in, out)``."""
        out = {}
        for attr, layer in info.attr_rule.items():
            rule = self.rules.layers.get(layer)
            ctor = info.attr_ctor.get(attr)
            if layer == "torch.nn.Linear" and rule is not None and ctor is not None:
                size = bind(ctor.args, rule.params).get("in_features")
                if size is not None:
                    out[attr] = size
        return out

    def _training_base(self, info) -> bool:
        """Whether a module class of the file that ``info``'s class derives from reads
        ``self.training`` (and so sets ``self.deterministic``). A class built on a base that
        does not (WhisperEncoder on transformers' PreTrainedModel, from _hf_support) sets the
        flag itself."""
        base, seen = info.module_base, set()
        while base in self.index.classes and base not in seen:
            seen.add(base)
            if self.index.classes[base].uses_training:
                return True
            base = self.index.classes[base].module_base
        return False

    def _add_training_flag(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        stmt = cst.parse_statement("self.deterministic = False  # flipped by .train()/.eval()")
        body = list(fn.body.body)
        i = 0
        while i < len(body) and _is_docstring(body[i]):
            i += 1
        body.insert(i, stmt)
        return fn.with_changes(body=fn.body.with_changes(body=body))

    # ------------------------------------------------------------------ functions
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._fn_stack.append(node)
        key = f"{self.current_class}.{node.name.value}" if self.current_class else node.name.value
        is_init = self.in_module_class() and node.name.value == "__init__"
        self._rngs_scope.append(is_init or key in self.index.rngs_functions)
        self._param_names.append({p.name.value for p in node.params.params}
                                 | {p.name.value for p in node.params.kwonly_params})
        self._loop_layouts.append({})
        free = self.current_class is None
        name = node.name.value
        takes_key = name in self.training.key_functions if free else (
            not self.in_module_class() and f"{self.current_class}.{name}" in
            self.training.key_functions)  # a plain class's method that draws
        self._key_scopes.append(tr.KeyScope(
            has_key=takes_key, takes_key=takes_key,
            seeds_here=free and name in self.training.seed_functions))
        if self.target.setup_modules and (self.current_class, name) in self._lt_init_fns:
            return False  # its initializers went to the layers; removed in leave_FunctionDef
        return None

    def leave_FunctionDef(self, original_node, updated_node):
        self._fn_stack.pop()
        takes_rngs = self._rngs_scope.pop()
        self._param_names.pop()
        self._loop_layouts.pop()
        keys = self._key_scopes.pop()
        if any(self.q(d.decorator) in _OVERLOADS for d in original_node.decorators):
            # @torch.jit._overload_method stubs (signatures for TorchScript): the definition
            # that follows them is the method
            return cst.RemoveFromParent()
        if self.in_module_class() and original_node.name.value in _STATE_DICT_HOOKS:
            self.diag(original_node, "module-hook", "info",
                      f"{original_node.name.value} removed: a hook of torch's state_dict "
                      "loading (torch2jax's weight transfer maps the torch names itself)")
            return cst.RemoveFromParent()
        node = self._remat_closures_take_self(original_node, updated_node)
        info = self.index.classes.get(self.current_class or "")
        if (self.in_module_class() and original_node.name.value == "__init__" and info
                and info.module_base == "torch" and info.container == "sequential"
                and self.target.stateful_modules):
            self._fn_stack.append(original_node)
            try:
                if self._sequential_children():
                    node = self._sequential_from_attributes(node)
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or "torch.nn.Sequential", "error",
                          exc.message)
            finally:
                self._fn_stack.pop()
        if original_node.name.value == "__init__" and self._module_rngs():
            # the stream forward's draws take their keys from (_subkey)
            body = list(node.body.body)
            body.append(cst.parse_statement("self.rngs = rngs.fork()\n"))
            node = node.with_changes(body=node.body.with_changes(body=body))
        if keys.takes_key:
            self.need("jax")
            node = tr.add_key_param(node)
        if keys.global_key:
            node = tr.declare_global_key(node)
        if keys.seeds_here:
            try:
                node = tr.return_key(node)
            except Untranslatable as exc:
                self.diag(original_node, "seed", "error", exc.message)
        if self.target.setup_modules and self.in_module_class() and node.name.value in \
                self._lt_unbound.get(self.current_class, ()):
            node = node.visit(f32 := lt.Float32Parameters())  # (runs unbound)
            if f32.names:
                self.need("jnp")
        if self.in_module_class() and node.name.value == "forward":
            node = node.with_changes(name=cst.Name("__call__"))
        if self.target.train_state and not self._class_stack and not self._fn_stack:
            node = self._lt_function(node)
        if self.target.setup_modules and (self.current_class, node.name.value) in self._lt_init_fns:
            return cst.RemoveFromParent()
        if takes_rngs and self.target.setup_modules and self.uses_train and \
                not self.in_module_class():
            # a layer-building helper: says whether the layers it builds train
            node = add_kwonly_param(node, linen_target.TRAIN, "bool", "False")
        if takes_rngs and self.target.stateful_modules:
            self.need("nnx")
            node = add_kwonly_param(node, "rngs", self.target.rngs_type)
        # @torch.no_grad() decorators
        decos = [d for d, od in zip(node.decorators, original_node.decorators)
                 if not (self.q(od.decorator) or "").startswith(("torch.no_grad",
                                                                 "torch.inference_mode"))
                 and not (isinstance(od.decorator, cst.Call)
                          and (self.q(od.decorator.func) or "").startswith(
                              ("torch.no_grad", "torch.inference_mode", "torch.jit")))
                 and not (self.q(od.decorator) or "").startswith(("torch.jit", "torch.fx.wrap"))]
        no_grad = any((self.q(od.decorator.func if isinstance(od.decorator, cst.Call) else
                              od.decorator) or "").startswith(("torch.no_grad",
                                                               "torch.inference_mode"))
                      for od in original_node.decorators)
        if no_grad and not self._class_stack and not self._fn_stack and \
                self.target.stateful_modules:
            # @torch.no_grad() def evaluate(model, loader): its model calls go through the
            # jit-compiled eval step, as in a `with torch.no_grad():` block
            jitted = tr.JitModelCalls(self._model_names())
            node = node.with_changes(body=node.body.visit(jitted))
            if jitted.count:
                self._eval_step = True
                self.need("nnx")
        node = node.with_changes(decorators=decos)
        ep = self._lt_epoch.get(node.name.value) if self.target.train_state and \
            not self._class_stack and not self._fn_stack else None
        if ep is not None and ep.module_step is not None:
            # the train step of a function run once per epoch, compiled once
            return cst.FlattenSentinel([ep.module_step.with_changes(
                leading_lines=node.leading_lines), node.with_changes(
                leading_lines=[cst.EmptyLine(indent=False)] * 2)])
        return node

    def _modules_loop(self, original_node, updated_node):
        """for m in self.modules(): -> for _, m in nnx.iter_modules(self): (also of a
        submodule: for m in self.mlp.modules(), swin's init); for _n, m in
        self.named_modules() whose loop never reads the name likewise (timm's init)"""
        owner = m.Name("self") | m.Attribute(value=m.Name("self"))
        modules = m.matches(original_node.iter, m.Call(func=m.Attribute(
            attr=m.Name("modules")), args=[])) and isinstance(original_node.target, cst.Name)
        # (also a model of a script or function: for m in net.modules())
        of_a_model = modules and not self._class_stack and self.values is not None and \
            self.values.kind(original_node.iter.func.value) == vk.Kind.MODULE
        if of_a_model and not self.target.stateful_modules:
            self.diag(original_node, "modules", "error", "for m in model.modules(): the "
                      f"modules of a {self.target.name} model are not walked this way")
            return updated_node
        if (self.target.stateful_modules and (self.in_module_class() or of_a_model)
                and m.matches(original_node.iter, m.Call(func=m.Attribute(
                    value=owner if not of_a_model else m.DoNotCare(),
                    attr=m.Name("modules")), args=[]))
                and isinstance(original_node.target, cst.Name)):
            self.need("nnx")
            return updated_node.with_changes(
                target=cst.Tuple([cst.Element(cst.Name("_")),
                                  cst.Element(original_node.target)], lpar=[], rpar=[]),
                iter=expr("nnx.iter_modules({o})", o=original_node.iter.func.value))
        if self.target.stateful_modules and self.in_module_class() and \
                unnamed_modules_loop(original_node):
            self.need("nnx")
            return updated_node.with_changes(
                target=cst.Tuple([cst.Element(cst.Name("_")),
                                  cst.Element(original_node.target.elements[1].value)],
                                 lpar=[], rpar=[]),
                iter=expr("nnx.iter_modules({o})", o=original_node.iter.func.value))
        return updated_node

    def _isinstance(self, original: cst.Call, updated: cst.Call):
        """isinstance(m, nn.Linear) -> isinstance(m, nnx.Linear); a test of a layer class
        or a function also passes a JAX function (an activation class handed on)."""
        new = self._isinstance_classes(original, updated)
        kinds = original.args[1].value if len(original.args) == 2 else None
        elems = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        names = {(self.q(e) or code(e)).removeprefix("builtins.") for e in elems if e is not None}
        if {"type", "types.FunctionType"} <= names and self.target.stateful_modules and (
                not self.target.setup_modules) and isinstance(new, cst.Call) and isinstance(
                    original.args[0].value, (cst.Name, cst.Attribute)):
            # isinstance(act_layer, (type, str, types.FunctionType, partial)): a layer class
            # or a function (timm's get_norm_act_layer). An activation class handed on is a
            # JAX function here, often a jitted one (jax.nn.relu), no FunctionType: any
            # callable that is not a module instance passes, as a class would in torch
            self.need("nnx")
            x = new.args[0].value
            return expr("({c} or callable({x}) and not isinstance({x}, nnx.Module))",
                        c=new, x=x)
        return new

    def _isinstance_classes(self, original: cst.Call, updated: cst.Call):
        if len(original.args) != 2:
            return updated
        kinds = original.args[1].value
        elems = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        out = []
        for e in elems:
            q = self.q(e)
            if q is None or not q.startswith("torch."):
                out.append(e)
                continue
            if q == "torch.Tensor":
                # an array rather than a list of them (densenet's _DenseLayer takes either);
                # jax.Array also matches the tracers of jit and grad
                self.need("jax")
                out.append(expr("jax.Array"))
                continue
            rule = self.rules.layers.get(q)
            target = rule.targets.get(self.target.name) if rule else None
            if not target or not re.fullmatch(r"nnx\.[A-Z]\w*", target):
                raise Untranslatable(f"isinstance check against {q}: no single JAX class",
                                     rule="isinstance")
            out.append(expr(target))
        new_kinds = out[0] if len(out) == 1 else cst.Tuple([cst.Element(e) for e in out])
        return updated.with_changes(args=[updated.args[0], updated.args[1].with_changes(
            value=new_kinds)])

    def _narrowed_layer(self, node: cst.CSTNode, name: str) -> list[str] | None:
        """The torch layer ``name`` is known to be at ``node`` (inside an
        ``if isinstance(name, nn.Linear):`` body, or a test of its class name that selects
        torch layers only: ``if m.__class__.__name__.find("Conv") != -1:``)."""
        child, parent = node, self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None:
            elems = _isinstance_of(parent.test, name) if isinstance(parent, cst.If) else None
            named = class_names.narrowed_by(parent.test, name, self._fn_stack[-1] if (
                self._fn_stack) else None) if isinstance(parent, cst.If) and (
                elems is None) else None
            if child is getattr(parent, "body", None) and named is not None and (
                    self._module_subject(name)):
                try:
                    layers, users = self._classes_named(named[1])
                except Untranslatable:
                    return None
                return sorted(layers) if layers and not users else None
            if child is getattr(parent, "body", None) and elems is not None:
                names = {self.q(e) for e in elems}
                layers = sorted(n for n in names if n in self.rules.layers)
                if len(layers) != len(names) or not layers:
                    return None
                return layers
            child, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        return None

    def _module_classes_here(self) -> tuple[set[str], set[str]]:
        """The classes a module walked in this file can be: the torch layers the file names
        (rules/layers.toml's) and its own module classes. Untranslatable where the file builds
        models of a package, whose layers it does not name."""
        if getattr(self, "_classes_here", None) is None:
            names = {self.q(n) for n in findall(self._root, m.Name() | m.Attribute())}
            if any(q and q.startswith(("torchvision.models", "timm.", "transformers."))
                   for q in names):
                raise Untranslatable("a test of a module's class name, in a file that builds "
                                     "models of a package (their layers are not known here)",
                                     rule="class-name")
            self._classes_here = ({q for q in names if q in self.rules.layers},
                                  set(self.index.module_classes))
        return self._classes_here

    def _jax_classes_of(self, torch_layer: str) -> str | None:
        """The JAX module class of a torch layer (None: a function, or no single class)."""
        rule = self.rules.layers.get(torch_layer)
        target = rule.targets.get(self.target.name) if rule else None
        return target if target and re.fullmatch(r"nnx\.[A-Z]\w*", target) else None

    def _matched_by(self, cls: str) -> set[str]:
        """The JAX classes an instance of this file's module class ``cls`` is an instance of:
        its own, its local bases' and the JAX layer it extends."""
        out: set[str] = set()
        while cls and cls not in out:
            out.add(cls)
            info = self.index.classes.get(cls)
            if info is None:
                break
            if info.layer_base and self._jax_classes_of(info.layer_base):
                out.add(self._jax_classes_of(info.layer_base))
            cls = info.module_base if info.module_base != "torch" else None
        return out

    def _module_subject(self, subject: str) -> bool:
        """``subject`` is a module being walked: the first parameter of a function this file
        gives to ``.apply(fn)``, or the target of a loop over ``.modules()`` /
        ``.children()`` in the current function (a class-name test of anything else, a
        tensor's type, is not about layers)."""
        fn = self._fn_stack[-1] if self._fn_stack else None
        if fn is None:
            return False
        applies = [c for c in findall(self._root, m.Call(func=m.Attribute(attr=m.Name(
            "apply")), args=[m.Arg(value=m.Name(fn.name.value))]))]
        first = fn.params.params[0].name.value if fn.params.params else None
        if applies and first == subject:
            return all(self._built_here(c.func.value) for c in applies)
        walks = [f.iter.func.value for f in findall(fn, m.For(target=m.Name(subject), iter=m.Call(
            func=m.Attribute(attr=m.Name("modules") | m.Name("children")))))]
        return bool(walks) and all(self._built_here(w) for w in walks)

    def _built_here(self, model: cst.BaseExpression) -> bool:
        """``model`` is ``self`` in a module class of this file, or a name every assignment
        of which builds one of its module classes or a torch layer (``nn.Sequential(...)``):
        its modules are classes this file names (a model received as an argument may hold
        any)."""
        if m.matches(model, m.Name("self")):
            return self.in_module_class()
        if not isinstance(model, cst.Name):
            return False
        values = [a.value for a in findall(self._root, m.Assign(targets=[m.AssignTarget(
            target=m.Name(model.value))]))]
        return bool(values) and all(isinstance(v, cst.Call) and (
            self.q(v.func) in self.rules.layers or m.matches(v.func, m.Name())
            and v.func.value in self.index.module_classes) for v in values)

    def _classes_named(self, test) -> tuple[set[str], set[str]]:
        """The torch layers and the file's module classes whose class name passes ``test``
        (a predicate on torch's class name), checked to be told apart by an ``isinstance``
        of their JAX classes from the classes it does not pass."""
        layers, users = self._module_classes_here()
        short = lambda q: q.rsplit(".", 1)[-1]
        picked = {q for q in layers if test(short(q))}
        picked_users = {c for c in users if test(c)}
        for q in sorted(picked):
            if self._jax_classes_of(q) is None:
                raise Untranslatable(f"the class-name test selects {short(q)}, which is no "
                                     "module class in JAX (a function, or several classes)",
                                     rule="class-name")
        chosen = {self._jax_classes_of(q) for q in picked} | picked_users
        others = [(short(q), {self._jax_classes_of(q)}) for q in layers - picked] + [
            (c, self._matched_by(c)) for c in users - picked_users]
        for name, jax_classes in others:
            if jax_classes & chosen:
                raise Untranslatable(f"the class-name test does not select {name}, whose JAX "
                                     f"class is also that of a class it selects "
                                     f"({', '.join(sorted(jax_classes & chosen))}): write "
                                     "the test with isinstance", rule="class-name")
        return picked, picked_users

    def _class_name_if(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        """``if classname.find("Conv") != -1:`` (``classname = m.__class__.__name__``) ->
        ``if isinstance(m, (nnx.Conv, nnx.ConvTranspose)):``: the torch classes of this file
        whose name passes the test, as their JAX classes (class_names.py)."""
        if not self.target.stateful_modules or not self._fn_stack:
            return updated_node
        found = class_names.class_name_test(original_node.test, self._fn_stack[-1])
        if found is None:
            return updated_node
        subject, test = found
        if not self._module_subject(subject):
            return updated_node
        try:
            layers, users = self._classes_named(test)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or "class-name", "error", exc.message)
            return updated_node
        kinds = sorted({self._jax_classes_of(q) for q in layers}) + sorted(users)
        if not kinds:
            return updated_node.with_changes(test=cst.Name("False"))
        self.need("nnx")
        spelled = kinds[0] if len(kinds) == 1 else f"({', '.join(kinds)})"
        return updated_node.with_changes(test=expr(f"isinstance({subject}, {spelled})"))

    def _model_apply(self, original_node: cst.Expr, updated_node: cst.Expr):
        """``net.apply(init_weights)`` on a model, outside its class: ``init_weights`` on every
        submodule (nnx.iter_modules: children before their parent, as torch's apply), with one
        nnx.Rngs from the function's key when the init function draws."""
        fn = updated_node.value.args[0].value.value
        model = updated_node.value.func.value.value
        if self.target.setup_modules and (None, fn) in self._lt_init_fns:
            self.diag(original_node, "init", "info", f"{model}.apply({fn}) -> the layers' "
                      "kernel_init / scale_init / bias_init arguments")
            return cst.RemoveFromParent()
        if not self.target.stateful_modules:
            self.diag(original_node, "target", "error", f"{model}.apply(init function): "
                      f"translated for --target nnx so far")
            return updated_node
        if fn not in self.index.defined:
            self.diag(original_node, "init", "error", f"{model}.apply({fn}): {fn} is not a "
                      "function of this file, so its translation is not known")
            return updated_node
        self.need("nnx")
        takes_rngs = fn in self.index.rngs_functions
        loop = _apply_loop(model, fn, "init_rngs" if takes_rngs else None)
        if not takes_rngs:
            self._pending[-1].after.append(loop.with_changes(
                leading_lines=self._pending_line_comments()))
            return cst.RemoveFromParent()
        try:
            key = self._subkey(original_node)  # (its split goes before this line)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or "random", "error", exc.message)
            return updated_node
        self._pending[-1].after.append(loop)
        return cst.Assign(targets=[cst.AssignTarget(cst.Name("init_rngs"))],
                          value=expr("nnx.Rngs({k})", k=key))

    def _scalar_param(self, param: cst.Param) -> bool:
        """A constructor parameter known to receive a number, string or bool: hashable, so
        a module keeping it as an attribute can still be a static argument of jax.jit."""
        return self.values is not None and self.values.param_kind(param) == vk.Kind.SCALAR

    def _lambda_methods(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        """``self.f = lambda x: m.c_proj(m.c_fc(x))`` over submodules -> a method
        (passes/closures.py); one that cannot move is marked at its line."""
        def where(attr: str) -> cst.CSTNode:
            init = next((s for s in original.body.body if isinstance(s, cst.FunctionDef)
                         and s.name.value == "__init__"), original)
            return next((s for s in init.body.body if isinstance(s, cst.SimpleStatementLine)
                         and m.matches(s.body[0], m.Assign(targets=[m.AssignTarget(
                             m.Attribute(value=m.Name("self"), attr=m.Name(attr)))],
                             value=m.Lambda()))), original) if isinstance(
                                 init, cst.FunctionDef) else original

        def mark(attr: str, message: str) -> None:
            line, col = self.pos(where(attr))
            self.report(line, col, closures.RULE, "error", message)

        info = self.index.classes.get(original.name.value)
        dicts = frozenset(a for a, r in info.attr_rule.items() if r == "torch.nn.ModuleDict") \
            if self.target.setup_modules and info is not None else frozenset()
        updated, moved = closures.lambdas_to_methods(updated, mark, dicts)
        for attr in moved:
            line, col = self.pos(where(attr))
            self.report(line, col, closures.RULE, "info",
                        f"self.{attr} = lambda over submodules -> method {attr}: a lambda "
                        "would keep the layers it closed over out of JAX transforms (their "
                        "parameters would get no gradient)")
        return updated

    def _parameter_attribute(self, original: cst.Call) -> str:
        """The name of the ``self.<name>`` that ``nn.Parameter(...)`` is assigned to (a target
        that declares parameters by name: ``self.param("w", ...)``)."""
        assign = self.get_metadata(ParentNodeProvider, original, None)
        if isinstance(assign, cst.IfExp) and (original is assign.body or original is
                                              assign.orelse):
            # self.bias = nn.Parameter(torch.zeros(n)) if bias else None
            assign = self.get_metadata(ParentNodeProvider, assign, None)
        target = assign.targets[0].target if isinstance(assign, cst.Assign) else None
        if not m.matches(target, m.Attribute(value=m.Name("self"))):
            raise Untranslatable("nn.Parameter not assigned to self.<name>", rule="parameter")
        return target.attr.value

    def _super_init(self, original, updated):
        cls = self.current_class
        info = self.index.classes.get(cls or "")
        if not info or cls not in self.index.module_classes:
            return updated
        if info.module_base == "torch" and info.container == "sequential" and \
                self.target.stateful_modules:
            return self._sequential_super_init(original, updated)
        rule = self._layer_subclass_rule(cls)
        if rule is not None and (info.module_base == "torch" or (
                self._takes_layer_arguments(info.module_base)
                and not self._torch_signature_layer(info.module_base))):
            # super().__init__(normalized_shape, eps=eps): the JAX layer's arguments
            return self._layer_arguments(original, updated, rule, super_init=True)
        if info.module_base == "torch" and info.container and self.target.stateful_modules:
            return updated  # nnx.Dict / nnx.List take torch's arguments (a mapping, a list)
        if info.module_base == "torch":
            return cst.Name("__REMOVE__")
        if self.target.setup_modules:
            if updated.args:
                raise Untranslatable("super().__init__(...) with arguments: a linen subclass "
                                     "inherits its base's fields", rule="linen")
            return expr("super().setup()")
        return self._with_rngs(original, updated)

    def _sequential_super_init(self, original, updated):
        """``super().__init__(*layers)`` in a subclass of nn.Sequential: nnx.Sequential's, with
        the children in torch's order (their state_dict names "0.weight", "1.running_mean"
        are nnx's layers[0], layers[1]). The class takes and returns NCHW like any module
        class, so channels-last children get transposes around them."""
        if any(a.keyword for a in original.args):
            raise Untranslatable("nn.Sequential subclass built with keywords",
                                 rule="torch.nn.Sequential")
        if not original.args:
            try:
                children = self._sequential_children()
            except Untranslatable:
                children = []  # marked at the def (leave_FunctionDef)
            if children:
                # its children are the layers assigned to attributes below (densenet's
                # _Transition): nnx.Sequential is given them once they exist (leave_FunctionDef)
                return cst.Name("__REMOVE__")
        info = self.index.classes.get(self.current_class or "")
        if info is not None and info.varargs_items and info.self_elem_layout in ("torch", "any"):
            # super().__init__(*args) of its own varargs, given layers of torch's layout
            # wherever the file builds the class (timm's SequentialList): passed on as they are
            return updated
        layouts = Layouts(self.rules, self, self.index)
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if self._fn_stack and fid == id(self._fn_stack[-1])}
        overall, items = layouts.sequential(original.args, scope)
        if overall == "mixed":
            raise Untranslatable("nn.Sequential subclass mixing channels-last layers and other "
                                 "layers in an order not known statically",
                                 rule="torch.nn.Sequential")
        args = self._ordered_dict_values(original, spread_literals(updated.args), layouts)
        if "channels_last" in items:
            args = self._insert_transposes(args, items)
        return updated.with_changes(args=_fix_commas(args))

    def _sequential_children(self) -> list[str]:
        """The attributes ``__init__`` of a Sequential subclass assigns layers to, in order:
        torch registers them as the Sequential's children, which its forward runs."""
        fn = self._fn_stack[-1] if self._fn_stack else None
        info = self.index.classes.get(self.current_class or "")
        if fn is None or fn.name.value != "__init__" or info is None:
            return []
        layers = set(info.attr_rule) | info.module_attrs
        children: list[str] = []
        for stmt in fn.body.body:
            for a in findall(stmt, m.Assign(targets=[m.AssignTarget(
                    m.Attribute(value=m.Name("self")))])):
                name = a.targets[0].target.attr.value
                if name not in layers:
                    if isinstance(a.value, cst.Call) and name not in info.tensor_attrs and not (
                            m.matches(a.value.func, m.Name()) and a.value.func.value in _BUILTINS):
                        # torch registers every Module assigned to an attribute as a child
                        raise Untranslatable(
                            f"nn.Sequential subclass: whether self.{name} is a layer (one of "
                            "its children) is not known here", rule="torch.nn.Sequential")
                    continue
                if not (isinstance(stmt, cst.SimpleStatementLine) and a in stmt.body):
                    raise Untranslatable(
                        f"nn.Sequential subclass whose layer self.{name} is assigned under a "
                        "condition or in a loop: the order of its children is not known "
                        "statically", rule="torch.nn.Sequential")
                if name not in children:
                    children.append(name)
        if children and any(findall(fn.body, m.Call(func=m.Attribute(
                value=m.Name("self"), attr=m.Name("add_module"))))):
            raise Untranslatable("nn.Sequential subclass filled both by attributes and by "
                                 "add_module", rule="torch.nn.Sequential")
        return children

    def _sequential_from_attributes(self, node: cst.FunctionDef) -> cst.FunctionDef:
        """``super().__init__(self.norm, self.relu, ...)`` at the end of the __init__ of a
        Sequential subclass whose children are attributes (torch's registration order), with
        transposes around the channels-last ones: the class takes NCHW like any module."""
        children = self._sequential_children()
        info = self.index.classes[self.current_class]
        items = [info.attr_layout.get(c, "torch") for c in children]
        if "mixed" in items:
            raise Untranslatable("nn.Sequential subclass with a child whose layout is not "
                                 "known statically", rule="torch.nn.Sequential")
        args = [arg(expr(f"self.{c}")) for c in children]
        if "channels_last" in items:
            args = self._insert_transposes(args, items)
        stmt = cst.SimpleStatementLine(body=[cst.Expr(call("super().__init__", *args))])
        stmt = wrap_long_statement(stmt, 8)
        return node.with_changes(body=node.body.with_changes(body=[*node.body.body, stmt]))

    def _ordered_dict_values(self, original: cst.Call, args: list[cst.Arg],
                             layouts: Layouts) -> list[cst.Arg]:
        """``nn.Sequential(OrderedDict(pairs))`` / ``super().__init__(layers)`` of an OrderedDict:
        nnx.Sequential takes the layers themselves, in order (their torch names become
        positions: the weight transfer maps them)."""
        if len(original.args) != 1 or ordered_dict_items(
                original.args[0], layouts.is_ordered_dict) is None:
            return args
        return [cst.Arg(expr("{d}.values()", d=args[0].value), star="*")]

    def _holds_weight_norm(self, fn: cst.FunctionDef, n: str) -> bool:
        """The local ``n`` of ``fn`` is bound to torch's weight_norm functions only."""
        values = [a.value for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(
            target=m.Name(n))]))]
        return bool(values) and all(self.q(v) in (
            "torch.nn.utils.weight_norm", "torch.nn.utils.parametrizations.weight_norm")
            for v in values)

    def _builds_module(self, original: cst.Call, name: str | None) -> bool:
        func = original.func
        if isinstance(func, cst.Name):
            n = func.value
            if n in self.index.module_classes and self._no_constructor(n):
                return False  # class NewGELU(nn.Module) with only a forward: built bare
            if n in self.index.module_classes or n in self.index.rngs_functions or (
                    self._builds_layers_here() and builder_instance(
                        self._fn_stack, n, self.index.rngs_functions)):
                return True
            if self._builds_layers_here() and ALIAS + n in self._module_class_tables(
                    original) and not (self._param_names and n in self._param_names[-1]):
                return True  # LayoutLMLayerNorm(size, eps=eps): an alias of nn.LayerNorm
            if n == "cls" and self.current_class and self._fn_stack and (
                    f"{self.current_class}.{self._fn_stack[-1].name.value}"
                    in self.index.rngs_functions):
                return True  # a classmethod constructor: cls(config)
            if local_function(self._fn_stack, n):  # a closure: rngs where its def takes them
                return ".".join(filter(None, (self.current_class, n))) in self.index.rngs_functions
            if n in self._file_functions and not (
                    self._param_names and n in self._param_names[-1]):
                return False  # a function of the file that builds no layer (its def takes
                # no rngs): get_norm_layer(name) returning a class
            if not (self._param_names and n in self._param_names[-1]) and (
                    n.startswith(("get_", "is_", "has_")) or self._returns_factory(original)):
                # an imported lookup or predicate: act_layer = get_act_layer(act_layer),
                # is_fast_norm() (a name ending in "layer" or "norm" reads as a factory
                # handed in, below)
                return False
            if self._fn_stack and self._holds_weight_norm(self._fn_stack[-1], n):
                return False  # weight_norm = nn.utils.weight_norm (wav2vec2): a function
            # a layer factory handed in as an argument (block(...), norm_layer(...))
            # (or held in a local: norm_layer = self._norm_layer)
            factory = n.endswith(("layer", "block", "Layer", "Block", "norm", "module"))
            if (self._rngs_scope and self._rngs_scope[-1] and self._param_names and (
                    (n in self._param_names[-1] and (n[:1].isupper() or factory
                                                     or n.endswith("act"))) or factory)):
                return True
            if not (self._rngs_scope and self._rngs_scope[-1] and self._fn_stack):
                return False
            # a parameter whose default is a module class of the file
            # (inverted_residual: Callable[..., nn.Module] = InvertedResidual), a local
            # assigned one (stem_type = SimpleStemIN), or a parameter named for one
            # (block_constructor, block_type)
            if param_default(self._fn_stack[-1], n) in self.index.module_classes or (
                    n in self._module_class_locals()) or self._layer_class_default(n):
                return True
            if n in self._param_names[-1] and self.current_class and (
                    self._fn_stack[-1].name.value == "__init__") and n in (
                    self._module_class_arguments(original).get(self.current_class, ())):
                # SwinStage(..., downsample=SwinPatchMerging if last else None): a parameter
                # of __init__ that the file's calls of the class give a module class
                return True
            if n in self._param_names[-1] and len(self._fn_stack) == 1 and (
                    not self.current_class) and n in self._module_class_arguments(
                    original).get(self._fn_stack[-1].name.value, ()):
                # outlooker_blocks(Outlooker, i, dim, ...) then block_fn(dim, ...) (timm's
                # volo): a parameter of a function of the file that its calls give a class
                return True
            return n in self._param_names[-1] and n.endswith(("constructor", "_type", "_cls")) or (
                looked_up_class(self._fn_stack[-1], original))
        if m.matches(func, m.Call(func=m.Name())) and self._builds_layers_here() and (
                self.index.class_returns.get(func.func.value, {None}) <= (
                    self.index.module_classes)):
            # _get_block_type(block_type)(in_chs, ...) (timm's rdnet): a function of the file
            # returning one of its module classes, the class built
            return True
        if m.matches(func, m.Subscript(value=m.Name())) and self._builds_layers_here():
            # ATTENTION_CLASSES[config._attn_implementation](config, layer_idx): an item of a
            # table of the file's module classes
            return func.value.value in self._module_class_tables(original)
        if m.matches(func, m.Attribute(value=m.Name("self"))) and self.current_class:
            return f"{self.current_class}.{func.attr.value}" in self.index.rngs_functions
        if m.matches(func, m.Attribute(value=m.Name())) and (
                func.value.value in self.index.module_classes) and (
                f"{func.value.value}.{func.attr.value}" in self.index.rngs_functions):
            return True  # Net.from_config(...): a classmethod constructor that takes rngs
        if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("from_config"))) and (
                func.value.value in self.index.module_classes) and (
                func.value.value not in self.index.classes):
            return True  # AutoModel.from_config(...) of a converted module: it takes rngs
        # a module class held by a config: block_cnf.block(block_cnf, sd_prob, norm_layer),
        # or by a dict of one: cfg["block"](*block_args) (timm's selecsls)
        held = (func.attr.value if isinstance(func, cst.Attribute) and not m.matches(
            func.value, m.Name("self")) else func.slice[0].slice.value.evaluated_value
            if m.matches(func, m.Subscript(slice=[m.SubscriptElement(m.Index(m.SimpleString()))]))
            else None)
        return bool(isinstance(held, str) and held.endswith(("block", "Block"))
                    and self._rngs_scope and self._rngs_scope[-1])

    def _returns_factory(self, call: cst.Call) -> bool:
        """The call's value is a layer class or factory, not a layer: it is bound to a name
        that the call itself takes (``act_layer = get_act_layer(act_layer)``), or that the
        function calls afterwards (``norm_layer = get_norm_layer(kind) or LayerNorm`` then
        ``norm_layer(dim)``)."""
        node: cst.CSTNode = call
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while isinstance(parent, cst.BooleanOperation):  # get_norm_layer(kind) or LayerNorm
            node, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if not (isinstance(parent, cst.Assign) and parent.value is node
                and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name)
                and self._fn_stack):
            return False
        bound = parent.targets[0].target.value
        if any(m.matches(a.value, m.Name(bound)) for a in call.args):
            return True
        return bool(findall(self._fn_stack[-1].body, m.Call(func=m.Name(bound))))

    def _builds_layers_here(self) -> bool:
        """Inside a function that builds layers with an ``rngs`` in scope (a module's
        __init__, a layer-building helper), outside lambdas and comprehensions."""
        return bool(self._rngs_scope and self._rngs_scope[-1] and not self._in_expr_scope
                    and self.target.stateful_modules)

    def _local_sequential_add(self, original: cst.Call,
                              updated: cst.Call) -> cst.BaseExpression | None:
        """``stem.add_module(name, layer)`` / ``stem.append(layer)`` of a local the function
        assigned an empty ``nn.Sequential()`` (timm's cspnet stem): appended to its layers, an
        added name recorded with its layer's position in ``torch_names``. A local Sequential
        takes NCHW, so a channels-last layer comes between transposes; one whose layout is not
        known is marked."""
        recv = original.func.value
        if not (isinstance(recv, cst.Name) and self._fn_stack and self.target.stateful_modules):
            return None
        fn = self._fn_stack[-1]
        built = [a.value for a in findall(fn, m.Assign(targets=[m.AssignTarget(
            m.Name(recv.value))]))]
        if not built or not all(isinstance(v, cst.Call) and not v.args and self.q(
                v.func) == "torch.nn.Sequential" for v in built):
            return None
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if fid == id(fn)}
        layout = Layouts(self.rules, self, self.index).of(original.args[-1].value, scope)
        if layout == "mixed":
            raise Untranslatable(f"{original.func.attr.value} of a layer whose activation "
                                 "layout is not known into a local nn.Sequential",
                                 rule="torch.nn.Sequential")
        layer = updated.args[-1].value
        if len(updated.args) == 2 and self._pending and not self._in_expr_scope:
            # torch's name kept (cspnet's stem_names.index("conv2") of the stem's
            # named_children()): torch_named_children reads it, the layer at its position
            seq, at = recv.value, " + 1" if layout == "channels_last" else ""
            name = cst.Module([]).code_for_node(updated.args[0].value)
            self._pending[-1].before.append(cst.parse_statement(
                f'{seq}.torch_names = {{**getattr({seq}, "torch_names", {{}}), '
                f"{name}: len({seq}.layers){at}}}\n"))
        if layout == "channels_last":
            self.need("jnp")
            return expr(f"{recv.value}.layers.extend([\n    lambda x: jnp.moveaxis(x, 1, -1),"
                        "\n    {m},\n    lambda x: jnp.moveaxis(x, -1, 1),\n])", m=layer)
        return expr(f"{recv.value}.layers.append({{m}})", m=layer)

    def _sequential_extend(self, original: cst.Call,
                           updated: cst.Call) -> cst.BaseExpression | None:
        """``self.stages.extend([stage, ...])`` of a Sequential attribute whose layers and the
        added ones are all of torch's layout: its list of layers extended (nnx.Sequential has
        no ``extend``). Others are left as they are."""
        recv = original.func.value
        info = self.index.classes[self.current_class]
        if info.attr_rule.get(recv.attr.value) != "torch.nn.Sequential" or (
                info.attr_layout.get(recv.attr.value, "torch") not in ("torch", "any")):
            return None
        added = original.args[0].value
        if not isinstance(added, (cst.List, cst.Tuple)) or any(
                isinstance(e, cst.StarredElement) for e in added.elements):
            return None
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if self._fn_stack and fid == id(self._fn_stack[-1])}
        layouts = Layouts(self.rules, self, self.index)
        if any(layouts.of(e.value, scope) not in ("torch", "any") for e in added.elements):
            return None
        return updated.with_changes(func=updated.func.with_changes(
            value=cst.Attribute(value=updated.func.value, attr=cst.Name("layers"))))

    def _add_module(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression | None:
        """``self.add_module(name, block)`` in a Sequential subclass (regnet's AnyStage), or on
        a Sequential attribute (densenet's self.features): appended to the nnx.Sequential's
        layers (the name becomes a position; the weight transfer maps it); a channels-last
        layer added to a Sequential that takes NCHW comes with transposes around it. In a
        ModuleDict subclass: ``self[name] = block`` (see leave_Expr); on a plain module:
        ``setattr(self, name, block)``."""
        recv = original.func.value
        info = self.index.classes[self.current_class]
        appended = len(original.args) == 1  # self.stages.append(stage): no name
        layer = original.args[-1].value
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if self._fn_stack and fid == id(self._fn_stack[-1])}
        layout = Layouts(self.rules, self, self.index).of(layer, scope)
        if appended and not (m.matches(recv, m.Attribute(value=m.Name("self"))) and
                             info.attr_rule.get(recv.attr.value) == "torch.nn.Sequential"):
            return None
        if m.matches(recv, m.Name("self")):
            if info.container == "sequential":
                target, seq_layout = "self.layers", "torch"
            elif info.container in (None, "module_dict"):
                return call("setattr", arg(cst.Name("self")), *updated.args)
            else:
                raise Untranslatable("add_module in a ModuleList subclass: append the layer",
                                     rule="torch.nn.ModuleList")
        elif m.matches(recv, m.Attribute(value=m.Name("self"))) and info.attr_rule.get(
                recv.attr.value) == "torch.nn.Sequential":
            target = f"self.{recv.attr.value}.layers"
            seq_layout = info.attr_layout.get(recv.attr.value, "torch")
            if seq_layout not in ("torch", "any") and layout not in ("any", seq_layout):
                raise Untranslatable(
                    "add_module of a layer in torch's layout into a Sequential built from "
                    "channels-last layers: its calls give it channels-last input",
                    rule="torch.nn.Sequential")
        else:
            return None
        layer = updated.args[-1].value
        name = original.args[0].value
        if not appended and isinstance(name, cst.SimpleString) and isinstance(
                name.evaluated_value, str) and name.evaluated_value.isidentifier():
            # self.add_module("bn", layer) in a Sequential subclass, then self.bn.weight
            # (timm's ConvBN), or self.query.add_module("proj", ...) then self.query.proj
            # (mobilenetv5's attention): an attribute too, the Sequential holds the same
            held = cst.Attribute(value=updated.func.value, attr=cst.Name(name.evaluated_value))
            self._pending[-1].before.append(cst.SimpleStatementLine([cst.Assign(
                targets=[cst.AssignTarget(held)], value=layer)]))
            layer = held
        elif not appended and m.matches(recv, m.Attribute(value=m.Name("self"))):
            # self.features.add_module(f"denseblock{i + 1}", block) (densenet): an attribute
            seq = updated.func.value  # by that name too, read by torch_named_children
            self._pending[-1].before.append(cst.SimpleStatementLine([cst.Expr(call(
                "setattr", arg(seq), arg(updated.args[0].value), arg(layer)))]))
            layer = call("getattr", arg(seq), arg(updated.args[0].value))
        if layout == "channels_last" and seq_layout == "any":
            raise Untranslatable("add_module of a channels-last layer into a Sequential: "
                                 "wrap it with transposes", rule="torch.nn.Sequential")
        if layout == "channels_last" and seq_layout == "torch":
            # the Sequential takes NCHW: the layer gets its input channels-last
            self.need("jnp")
            return expr(f"{target}.extend([\n    lambda x: jnp.moveaxis(x, 1, -1),\n"
                        "    {m},\n    lambda x: jnp.moveaxis(x, -1, 1),\n])", m=layer)
        return expr(f"{target}.append({{m}})", m=layer)

    def _module_class_arguments(self, node: cst.CSTNode) -> dict[str, set[str]]:
        """For each module class of the file, the parameters of its ``__init__`` that a call
        of the class in the file passes a module class of the file to (or one of two, or
        None: ``downsample=PatchMerging if i < n - 1 else None``); for each top-level function
        of the file, its parameters that a call of it passes one to."""
        while not isinstance(node, cst.Module):
            node = self.get_metadata(ParentNodeProvider, node)
        cached = getattr(self, "_class_arguments", None)
        if cached is not None and cached[0] is node:
            return cached[1]
        classes = self.index.module_classes

        def a_class(value: cst.BaseExpression, none: bool = False) -> bool:
            if isinstance(value, cst.IfExp):
                return a_class(value.body, True) and a_class(value.orelse, True) and not (
                    m.matches(value.body, m.Name("None"))
                    and m.matches(value.orelse, m.Name("None")))
            return (isinstance(value, cst.Name) and value.value in classes
                    and not self._no_constructor(value.value)) or (
                none and m.matches(value, m.Name("None")))

        inits = {c.name.value: f for c in findall(node, m.ClassDef()) if c.name.value in classes
                 for f in c.body.body if m.matches(f, m.FunctionDef(name=m.Name("__init__")))}
        # the file's top-level functions too (a stage builder given the block class)
        functions = {f.name.value: f for f in node.body if isinstance(f, cst.FunctionDef)}
        found: dict[str, set[str]] = {}
        for c in findall(node, m.Call(func=m.Name())):
            init = inits.get(c.func.value)
            function = functions.get(c.func.value) if init is None else None
            if init is None and function is None:
                continue
            positional = [p.name.value for p in (init or function).params.params][
                1 if init is not None else 0:]
            for i, a in enumerate(c.args):
                if a.star or not a_class(a.value):
                    continue
                if a.keyword is not None:
                    found.setdefault(c.func.value, set()).add(a.keyword.value)
                elif i < len(positional):
                    found.setdefault(c.func.value, set()).add(positional[i])
        self._class_arguments = (node, found)
        return found

    def _module_class_tables(self, node: cst.CSTNode) -> set[str]:
        """The names the file binds at its top level to a dict, list or tuple of its module
        classes (``ATTENTION_CLASSES = {"eager": Attention, "sdpa": SdpaAttention}``)."""
        while not isinstance(node, cst.Module):
            node = self.get_metadata(ParentNodeProvider, node)
        cached = getattr(self, "_class_tables", None)
        if cached is not None and cached[0] is node:
            return cached[1]
        classes = self.index.module_classes
        tables = set()
        for stmt in node.body:
            if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Assign)
                    and len(stmt.body[0].targets) == 1
                    and isinstance(stmt.body[0].targets[0].target, cst.Name)):
                continue
            value = stmt.body[0].value
            if isinstance(value, (cst.Name, cst.Attribute)) and self._layer_class(value):
                # LayoutLM's ``LayoutLMLayerNorm = nn.LayerNorm``: an alias of a torch layer
                # class (its calls build the layer), as a table of one
                tables.add(ALIAS + stmt.body[0].targets[0].target.value)
                continue
            items = table_items(value)  # (byobnet's _block_registry = dict(basic=..., ...))
            if items and all(
                    isinstance(v, cst.Name) and v.value in classes
                    and not self._no_constructor(v.value) or self._layer_class(v)
                    for v in items):
                # (InternVL's NORM2FN = {"layer_norm": nn.LayerNorm, "rms_norm": RMSNorm})
                tables.add(stmt.body[0].targets[0].target.value)
        self._class_tables = (node, tables)
        return tables

    def _module_type_fields(self, node: cst.CSTNode) -> set[str]:
        """The fields of the file's classes annotated as module classes (timm's byobnet
        ``LayerFn``: ``conv_norm_act: Type[nn.Module] = ConvNormAct``, ``act: Type[nn.Module]
        = nn.ReLU``): ``layers.conv_norm_act(...)`` builds what the field holds."""
        while not isinstance(node, cst.Module):
            node = self.get_metadata(ParentNodeProvider, node)
        cached = getattr(self, "_type_fields", None)
        if cached is None or cached[0] is not node:
            self._type_fields = (node, {
                a.target.value for c in findall(node, m.ClassDef()) for line in c.body.body
                if isinstance(line, cst.SimpleStatementLine) for a in line.body
                if isinstance(a, cst.AnnAssign) and isinstance(a.target, cst.Name)
                and re.search(r"\bType\[.*Module\b", cst.Module([]).code_for_node(
                    a.annotation.annotation))})
        return self._type_fields[1] | self.index.type_fields  # (and imported classes')

    def _module_class_locals(self) -> set[str]:
        """Names the enclosing function assigns a module class of the file (or of another
        file of the package) to: ``stem_type = SimpleStemIN``, an item of a local list of
        them (``blocks = [BasicConv2d, InceptionA]; inception_a = blocks[1]``), or one of
        two (``attention_class = Cross if is_cross_attention else Self``)."""
        fn = self._fn_stack[-1]
        if fn in self._class_locals:
            return self._class_locals[fn]
        assigns = [(node.targets[0].target.value, node.value) for node in walk(fn.body, False)
                   if isinstance(node, cst.Assign) and len(node.targets) == 1
                   and isinstance(node.targets[0].target, cst.Name)]
        classes = self.index.module_classes
        lists = {name for name, value in assigns if isinstance(value, (cst.List, cst.Tuple))
                 and value.elements and all(isinstance(e.value, cst.Name)
                                            and e.value.value in classes for e in value.elements)}
        def a_class(value: cst.BaseExpression) -> bool:
            if isinstance(value, cst.IfExp):  # Cross if is_cross_attention else Self
                # (or Bamba's MLP if num_experts == 1 else None: None is never called)
                none = [m.matches(v, m.Name("None")) for v in (value.body, value.orelse)]
                return not all(none) and all(n or a_class(v) for n, v in zip(
                    none, (value.body, value.orelse), strict=True))
            if isinstance(value, cst.Call) and value.args and not value.args[0].keyword and (
                    self.q(value.func) == "functools.partial"):
                return a_class(value.args[0].value)  # mlp = partial(Mlp, hidden=12)
            return (isinstance(value, cst.Name) and value.value in classes) or (
                isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name)
                and value.value.value in lists)

        found = self._class_locals[fn] = {name for name, value in assigns if a_class(value)}
        found |= self._class_loop_targets(fn)
        # stage_fn, stage_args = _get_stage_fn(stage_args): a class from a returned tuple
        found |= unpacked_classes(fn, self.index.class_tuple_returns, classes)
        return found

    def _class_loop_targets(self, fn: cst.FunctionDef) -> set[str]:
        """Loop targets that take the items of a parameter annotated as module classes:
        ``for block_fn, n in zip(block_fns, depths)`` with ``block_fns: Tuple[Type[Block],
        ...]`` (timm's make_blocks)."""
        params = {p.name.value: p for p in (*fn.params.params, *fn.params.kwonly_params)}
        code = cst.Module([]).code_for_node
        classes = self.index.module_classes

        def class_typed(name: str) -> bool:
            annotation = params[name].annotation
            if annotation is None:
                return False
            text = code(annotation.annotation)
            return "nn.Module" in text or any(
                f"Type[{c}]" in text or f"type[{c}]" in text for c in classes)

        return {t for t, p in param_loop_targets(fn).items() if class_typed(p)}

    def _layer_class_default(self, name: str) -> bool:
        """A parameter of the enclosing function defaulting to a torch layer class that builds
        with rngs (mlp-mixer's ``FeedForward(dim, ..., dense=nn.Linear)``, called with
        ``partial(nn.Conv1d, kernel_size=1)`` too): its calls build a layer."""
        params = self._fn_stack[-1].params
        for p in (*params.params, *params.kwonly_params):
            if p.name.value == name and p.default is not None:
                return self._layer_class(p.default)
        return False

    def _method_of_some_class_takes_rngs(self, original: cst.Call, name: str | None) -> bool:
        """``module.init_weights()`` with an ``rngs`` in scope, ``module`` a parameter of the
        enclosing function, and a module class of the file whose method of that name takes
        rngs (it draws): which class the parameter holds is known only at run time."""
        func = original.func  # (self.encoder._init_weights(...), or a loop's over children)
        if not (self.target.stateful_modules and self._rngs_scope and self._rngs_scope[-1]
                and self._fn_stack and method_on_parameter(original, self._fn_stack[-1])):
            return False
        return any(f.endswith("." + func.attr.value) and f.split(".")[0] in {
            *self.index.classes, "*"} for f in self.index.rngs_functions)  # (*: imported)

    def _build_layer(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``act_layer(inplace=True)`` where what ``act_layer`` holds is known only at run time
        (a JAX function, a converted module class, a class taking no rngs): the
        ``build_layer`` helper, which uses a function as it is and builds a class, passing the
        rngs only where its constructor takes them."""
        built = self._with_rngs(original, updated)
        if not isinstance(built, cst.Call) or not any(
                a.keyword and a.keyword.value == "rngs" for a in built.args):
            return expr("({b} if isinstance({f}, type) else {f})", b=built, f=updated.func)
        return call("build_layer", arg(updated.func), *built.args)

    def _layer_class(self, node: cst.BaseExpression) -> bool:
        """``nn.LayerNorm``, ``nn.Linear``: a torch layer class whose JAX layer builds with
        rngs (not a container)."""
        rule = self.rules.layers.get(self.q(node) or "")
        nnx_target = rule.targets.get("nnx", "") if rule is not None else ""
        return nnx_target.startswith("nnx.") and nnx_target[4:5].isupper() and (
            rule.special not in ("sequential", "module_list", "module_dict"))

    def _with_rngs(self, original, updated: cst.Call):
        if self.target.setup_modules:
            # linen modules take no RNG state; the train flag is handed down instead
            inside = self.in_module_class() or (self._rngs_scope and self._rngs_scope[-1])
            if isinstance(original.func, cst.Name) and \
                    original.func.value in self.index.module_classes:
                # a linen module is hashed (a static argument of jax.jit): list fields are
                # tuples, ResNet(BasicBlock, (1, 1))
                updated = updated.with_changes(args=[a.with_changes(value=cst.Tuple(
                    a.value.elements)) if isinstance(a.value, cst.List) and a.value.elements
                    else a for a in updated.args])
            # (a layer-building method of the module reads its field: self._make_layer(...))
            if (self.uses_train and inside and not m.matches(original.func, m.Attribute(
                    value=m.Name("self"))) and not any(
                    a.keyword and a.keyword.value == linen_target.TRAIN for a in updated.args)):
                updated = updated.with_changes(args=_fix_commas([*updated.args, arg(
                    expr(self._linen_train()), linen_target.TRAIN)]))
            if self.current_class in self._lt_dtype_classes and self.in_module_class() and \
                    isinstance(original.func, cst.Name) and \
                    original.func.value in self._lt_dtype_classes:
                updated = updated.with_changes(args=_fix_commas([*updated.args, arg(
                    expr("self.dtype"), "dtype")]))
            return updated
        if any(a.keyword and a.keyword.value == "rngs" for a in updated.args):
            return updated
        return updated.with_changes(args=_fix_commas([*updated.args,
                                                      arg(self.rngs_expr(original), "rngs")]))

