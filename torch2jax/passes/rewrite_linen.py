"""Linen training glue (``--target linen``, targets/linen_training.py): the loop's step,
TrainState, per-epoch train functions, autocast regions and checkpoints under linen.

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.analysis.value_kinds import _MODULE_METHODS
from torch2jax.analysis.walk import findall
from torch2jax.passes import class_names
from torch2jax.passes import data as dt
from torch2jax.passes import gan_step as gan
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    code,
    expr,
    wrap_long_statement,
)
from torch2jax.passes.rewrite_support import ACC_GRADS, _fix_commas
from torch2jax.targets import linen as linen_target
from torch2jax.targets import linen_accum as la
from torch2jax.targets import linen_gan as lg
from torch2jax.targets import linen_helpers as lh
from torch2jax.targets import linen_named_init as ln
from torch2jax.targets import linen_training as lt

# wrappers of a model that the translation removes (one program over a mesh)
_WRAPPERS = {"torch.nn.parallel.DistributedDataParallel", "torch.nn.DataParallel",
             "torch.nn.parallel.DataParallel"}


# the model built at the top of the file (a Sequential), among the classes an init function
# reaches: its layers are built outside any class
TOP = "<top level>"


class LinenTrainingMixin:
    def _lt_find_autocast_classes(self, node: cst.Module) -> None:
        """Model classes called in an autocast region (and the classes they build) get a
        ``dtype`` field handed to their layers, as in the flax examples."""
        classes = {c.name.value: c for c in node.body if isinstance(c, cst.ClassDef)}
        called: set[str] = set()
        for w in findall(node, m.With()):
            if any((self.q(i.item.func if isinstance(i.item, cst.Call) else i.item) or "")
                   in dt.AUTOCASTS for i in w.items):
                called |= {c.func.value for c in findall(w.body, m.Call(func=m.Name()))}
        called &= self._model_names()
        roots: set[str] = set()
        for a in findall(node, m.Assign(targets=[m.AssignTarget(m.Name())])):
            if a.targets[0].target.value in called:
                roots |= {c.func.value for c in findall(a.value, m.Call(func=m.Name()))
                          if c.func.value in self.index.module_classes}

        def built(name: str) -> None:
            if name in self._lt_dtype_classes or name not in classes:
                return
            self._lt_dtype_classes.add(name)
            for c in findall(classes[name], m.Call(func=m.Name())):
                if c.func.value in self.index.module_classes:
                    built(c.func.value)
        for r in roots:
            built(r)

    def _lt_find_init_functions(self, node: cst.Module) -> None:
        """``self.apply(self._init_weights)`` in a constructor: linen layers take their
        initializers when they are built, so the init function's torch.nn.init calls become
        ``kernel_init=`` / ``embedding_init=`` arguments of the layers of that class and of
        the classes it builds; the statement and the function are removed."""
        classes = {c.name.value: c for c in node.body if isinstance(c, cst.ClassDef)}

        def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
            return next((f for f in cls.body.body if isinstance(f, cst.FunctionDef)
                         and f.name.value == name), None)

        def built(name: str, seen: set[str]) -> set[str]:
            if name in seen or name not in classes:
                return seen
            seen.add(name)
            init = method(classes[name], "__init__")
            for c in findall(init, m.Call(func=m.Name())) if init is not None else []:
                if c.func.value in self.index.module_classes:
                    built(c.func.value, seen)
            return seen

        for name, cls in classes.items():
            init = method(cls, "__init__")
            if init is None:
                continue
            for c in findall(init, m.Call(func=m.Attribute(value=m.Name("self"),
                                                             attr=m.Name("apply")))):
                if len(c.args) != 1 or not m.matches(c.args[0].value, m.Attribute(
                        value=m.Name("self"))):
                    continue
                fn = method(cls, c.args[0].value.attr.value)
                if fn is None:
                    continue
                try:
                    specs = lt.init_specs(fn, self.q)
                except Untranslatable:
                    continue  # marked where it is
                for reached in built(name, set()):
                    merged = self._lt_inits.setdefault(reached, {})
                    for layer, inits in specs.items():
                        merged.setdefault(layer, {}).update(inits)
                self._lt_init_fns.add((name, fn.name.value))
        for cls in classes.values():  # then nanoGPT's `for pn, p in self.named_parameters()`
            for loop in ln.name_loops(cls):
                try:
                    found = ln.loop_inits(loop, cls, classes, self.q, lt.INIT_ARGS,
                                          lt._initializer)
                except Untranslatable:
                    continue  # marked where it is
                for cname, attrs in found.items():
                    for attr, inits in attrs.items():
                        self._lt_attr_inits.setdefault(cname, {}).setdefault(attr, {}).update(
                            inits)
                self._lt_init_loops.add(id(loop))
        # netG.apply(weights_init) at the top level, netG = Generator(): the DCGAN example's
        # init function of the module, its branches picked by isinstance or the class name
        functions = {f.name.value: f for f in node.body if isinstance(f, cst.FunctionDef)}
        applied: dict[str, set[str]] = {}
        calls: dict[str, int] = {}
        for s in node.body:
            if m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
                    value=m.Name(), attr=m.Name("apply")), args=[m.Arg(m.Name(), keyword=None)]))])):
                c = s.body[0].value
                built_from = {a.value.func.value for a in findall(node, m.Assign(
                    targets=[m.AssignTarget(m.Name(c.func.value.value))], value=m.Call(
                        func=m.Name())))}
                fname = c.args[0].value.value
                calls[fname] = calls.get(fname, 0) + 1
                if not built_from and self._lt_top_sequential(node, c.func.value.value):
                    built_from = {TOP}
                applied.setdefault(fname, set()).update(
                    built_from if len(built_from) == 1 and built_from <= {*classes, TOP}
                    else {""})
        for fname, models in applied.items():
            fn = functions.get(fname)
            if fn is None or "" in models or len(findall(node, m.Name(fname))) != 1 + calls[
                    fname]:
                continue  # a model of unknown class, or a function read elsewhere too
            try:
                specs = lt.init_specs(fn, self.q, named=self._lt_named_layers)
            except Untranslatable:
                continue  # marked where it is
            for model_cls in models:
                for reached in built(model_cls, set()) if model_cls != TOP else {""}:
                    merged = self._lt_inits.setdefault(reached, {})
                    for layer, inits in specs.items():
                        merged.setdefault(layer, {}).update(inits)
            self._lt_init_fns.add((None, fname))

    def _lt_variables_now(self) -> cst.BaseExpression:
        """The model's variables as the TrainState holds them (``{"params": state.params}``,
        with its batch_stats)."""
        return lt.final_variables(self._lt_batch_stats).body[0].value

    def _lt_top_sequential(self, node: cst.Module, model: str) -> bool:
        """``model = nn.Sequential(nn.Linear(...), ...)`` built once, at the top of the file,
        of torch layers only, and no layer with weights built anywhere else outside a class:
        the layers an init function applied to it reaches are those the top level builds."""
        def layer(c: cst.Call) -> bool:
            q = self.q(c.func) or ""
            return q.startswith("torch.nn.") and q.rsplit(".", 1)[-1][:1].isupper()

        seqs = [s for s in node.body if m.matches(s, m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(m.Name(model))], value=m.Call())]))]
        bound = findall(node, m.AssignTarget(m.Name(model)))
        if len(seqs) != 1 or len(bound) != 1:
            return False
        value = seqs[0].body[0].value
        if self.q(value.func) != "torch.nn.Sequential" or not value.args or not all(
                isinstance(a.value, cst.Call) and layer(a.value) and a.keyword is None
                for a in value.args):
            return False
        return not any((self.q(c.func) or "") in lt.INIT_ARGS for s in node.body
                       if s is not seqs[0] and not isinstance(s, cst.ClassDef)
                       for c in findall(s, m.Call()))

    def _lt_find_glue(self, node: cst.Module) -> None:
        """The functions that evaluate the module's model (estimate_loss), and the parameter
        counts printed by constructors (targets/linen_accum.py)."""
        if self.training.optimizers or self._acc.loops:
            self._lt_global_evals = la.global_evaluators(
                node, self._model_names(), {*self._lt_trainers, *self._lt_epoch,
                                            *self._lt_evaluators})
        self._lt_counts = {i for c in node.body if isinstance(c, cst.ClassDef) and (
            c.name.value in self.index.module_classes) for i in la.constructor_counts(c)}

    def _lt_named_layers(self, test: cst.BaseExpression, fn: cst.FunctionDef) -> set[str] | None:
        """The torch layers of the file whose class name passes ``test`` (``classname.find(
        "Conv") != -1``); None when ``test`` is no such test; Untranslatable when it also
        passes a module class of the file (whose weights are not one layer's)."""
        found = class_names.class_name_test(test, fn)
        if found is None:
            return None
        layers, users = self._module_classes_here()
        short = lambda q: q.rsplit(".", 1)[-1]
        if any(found[1](c) for c in users):
            raise Untranslatable("a class-name test that passes a module class of the file")
        return {q for q in layers if found[1](short(q))}

    def _lt_checkpoint(self, original_node, kind: str, model: str, p: str):
        """torch.save(model.state_dict(), path) -> an orbax checkpoint of the trained
        variables, where they are known: after the training loop, or read from the state
        after each epoch's training call."""
        scope = id(self._fn_stack[-1]) if self._fn_stack else 0
        if self._lt_trains_none() and model in self._model_names():
            # no training loop of this file binds the variables (no model.init is written)
            self.diag(original_node, f"torch.{kind}", "error",
                      f"torch.{kind} of {model}'s state_dict in a file that trains no model: "
                      f"linen keeps the parameters outside the module and this file binds "
                      f"none (build them with {model}.init(key, sample_input))")
            return None
        if model not in self._model_names() or (self._for_stack and scope not in (
                self._lt_state_made)) or (self._fn_stack and self._fn_stack[0].name.value
                                          in self._lt_epoch):
            self.diag(original_node, f"torch.{kind}", "error",
                      f"torch.{kind} of {model}'s state_dict in the training loop or in a "
                      "function run once per epoch: checkpoint the TrainState's variables by "
                      "hand (orbax)")
            return None
        if kind == "save":
            inner = f"checkpointer.save(os.path.abspath({p}), {lt.VARIABLES}, force=True)"
        else:
            inner = (f"{lt.VARIABLES} = checkpointer.restore(os.path.abspath({p}), "
                     f"{lt.VARIABLES})")
        return self._orbax(original_node, kind, inner, f"{model}'s variables")

    def _lt_checkpoint_entry(self, original_node: cst.Call) -> cst.BaseExpression | None:
        """``model.state_dict()`` / ``optimizer.state_dict()`` as a value of a checkpoint dict
        (nanoGPT's ``{'model': raw_model.state_dict(), 'optimizer': ..., 'iter_num': ...}``)
        in a training loop's body or after it: the variables of the update (bound from the
        TrainState) and the TrainState's optimizer state."""
        func = original_node.func
        if not m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("state_dict"))) or \
                original_node.args or not isinstance(self.get_metadata(
                    ParentNodeProvider, original_node, None), cst.DictElement):
            return None
        owner = func.value.value
        if not hasattr(self, "_lt_aliases"):
            self._lt_aliases = la.model_aliases(self._root, self._model_names())
        model = owner in self.training.model_vars or owner in self._lt_aliases
        # (in a function that evaluates the module's model, test(epoch): the module's
        # variables, bound after each epoch's training)
        # (the optimizer's: the module's TrainState, where the function binds no `state`)
        evaluator = len(self._fn_stack) == 1 and self._fn_stack[0].name.value in (
            self._lt_global_evals) and (model or lt.STATE not in lt.local_names(
                self._fn_stack[0]))
        if not model and owner not in self.training.optimizer_names or \
                self._lt_trains_none() or self._class_stack or (
                    self._fn_stack and not evaluator) or \
                self._for_stack or not self._lt_bound_before(original_node):
            return None
        if model:
            return expr(lt.VARIABLES)
        self.need("serialization")  # (optax's named tuples as flax's state dict: restorable)
        return expr(f"serialization.to_state_dict({lt.STATE}.opt_state)")

    def _lt_saves_dict(self, value: cst.BaseExpression) -> bool:
        """``torch.save(checkpoint, path)`` of a checkpoint dict that
        :meth:`_lt_checkpoint_dict_save` writes: every state_dict in it is read."""
        if not (isinstance(value, cst.Call) and self.q(value.func) == "torch.save" and len(
                value.args) >= 2 and m.matches(value.args[0].value, m.Name()) and
                value.args[0].value.value in self._ckpt_dicts) or self._for_stack or \
                len(self._fn_stack) > 1 or self._class_stack:
            return False
        entries = [c for a in findall(self._root, m.Assign(targets=[m.AssignTarget(m.Name(
            value.args[0].value.value))], value=m.Dict())) for c in findall(a.value, m.Call(
                func=m.Attribute(attr=m.Name("state_dict")), args=[]))]
        return bool(entries) and all(self._lt_checkpoint_entry(c) is not None
                                     for c in entries)

    def _lt_checkpoint_dict_save(self, original_node: cst.Expr) -> cst.Expr | None:
        """``torch.save(checkpoint, path)`` of a checkpoint dict whose state_dicts
        :meth:`_lt_checkpoint_entry` read: the dict as an orbax PyTree checkpoint."""
        value = original_node.value
        if not self._lt_saves_dict(value):
            return None
        self.need("os", "ocp")
        self.diag(original_node, "torch.save", "info",
                  "torch.save of a checkpoint dict -> an orbax PyTree checkpoint (a directory "
                  "at that path); a model's state_dict in it is its linen variables, an "
                  "optimizer's the TrainState's opt_state")
        return cst.Expr(expr(
            f"ocp.PyTreeCheckpointer().save(os.path.abspath({code(value.args[1].value)}), "
            f"{value.args[0].value.value}, force=True)"))

    def _lt_checkpoint_load(self, original_node: cst.Call) -> cst.BaseExpression | None:
        """``checkpoint = torch.load(path)`` of a checkpoint dict (analysis/accumulate.py) in
        a file that trains no model (a sampling script): the orbax PyTree restored, as on NNX;
        a model's state_dict in it is read as its variables (``model.load_state_dict(d)`` ->
        ``variables = d``). Where a model is trained, it stays marked."""
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if self.q(original_node.func) != "torch.load" or not original_node.args or \
                not m.matches(parent, m.Assign(targets=[m.AssignTarget(target=m.Name())])) or \
                parent.targets[0].target.value not in self._ckpt_loads or \
                not (self._lt_trains_none() or self._lt_resume_loads(
                    parent.targets[0].target.value) and self._lt_resume_site(original_node)):
            return None
        self.need("os", "ocp")
        self.diag(original_node, "torch.load", "info",
                  "torch.load of a checkpoint dict -> the orbax PyTree checkpoint (a directory "
                  "at that path); a model's state_dict in it is read as its linen variables "
                  "({'params': ...})")
        return cst.parse_expression(f"ocp.PyTreeCheckpointer().restore(os.path.abspath("
                                    f"{code(original_node.args[0].value)}))")

    LT_UNAPPLIED = ("the linen model called outside a train step, in a file that binds none of "
                    "its variables (it is trained elsewhere): left as written; pass its "
                    "variables in and call model.apply(variables, ...)")

    def _lt_trains_none(self) -> bool:
        """No optimizer and no backward() in the file: no training loop binds variables."""
        if not hasattr(self, "_lt_no_training"):
            self._lt_no_training = not self.training.optimizers and not findall(
                self._root, m.Call(func=m.Attribute(attr=m.Name("backward"))))
        return self._lt_no_training

    def _lt_unbound_call(self, original_node: cst.Call) -> None:
        """linen: a model called outside a module class in a file that trains no model (and
        binds none of its variables): an unbound module's call fails, so it is marked."""
        if not self.target.train_state or self.in_module_class() or not self._lt_trains_none() \
                or not isinstance(original_node.func, cst.Name) or \
                original_node.func.value not in self._model_names():
            return
        self._lt_marked_calls.add(id(original_node))
        self.diag(original_node, "linen", "error", self.LT_UNAPPLIED)

    def _lt_attr_init(self, original: cst.Call) -> dict:
        """The initializers a named_parameters() loop gives the layer ``self.<attr> =
        original`` builds (targets/linen_named_init.py)."""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if not m.matches(parent, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self")))])):
            return {}
        return self._lt_attr_inits.get(self.current_class or "", {}).get(
            parent.targets[0].target.attr.value, {})

    def _lt_count_dropped(self, original) -> bool:
        """A parameter count printed by a module's constructor (targets/linen_accum.py's
        constructor_counts): removed, with a warning; a named_parameters() init loop whose
        draws are the layers' initializers: removed (with what was reported inside)."""
        if id(original) in self._lt_init_loops:
            span = self.get_metadata(PositionProvider, original)
            self.rewritten_lines.append((span.start.line, span.end.line))
            return True
        if id(original) not in self._lt_counts:
            return False
        self.diag(original, "module-api", "warning",
                  "a parameter count in the constructor is removed: a linen module's setup() "
                  "runs before model.init makes the variables (count them there: "
                  "sum(x.size for x in jax.tree.leaves(variables['params'])))")
        return True

    def _lt_in_count(self, node: cst.CSTNode) -> bool:
        """``node`` stands in a statement :meth:`_lt_count_dropped` removes."""
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node is not None and id(node) in self._lt_counts

    def _lt_unbound_eval(self, original_node: cst.Call) -> None:
        """linen: a call of a function that evaluates the module's model (estimate_loss)
        where no variables are bound yet (before the training loop): marked."""
        if not self._lt_global_evals or not m.matches(original_node.func, m.Name(
                m.MatchIfTrue(lambda n: n in self._lt_global_evals))) or (
                self._lt_bound_before(original_node)):
            return
        self.diag(original_node, "linen", "error",
                  f"{original_node.func.value}() reads the model's variables, which no "
                  "training loop has bound here yet: bind variables = model.init(...) first")

    def _lt_unapplied(self, original: list, body: list) -> list:
        """linen: model calls in an evaluation block of a file that trains no model are marked
        at their lines (``eval_step(model, variables, ...)`` would read unbound variables)."""
        models = self._model_names()
        pattern = m.Call(func=m.Name(value=m.MatchIfTrue(lambda v: v in models)))
        found = [c for s in original for c in findall(s, pattern)
                 if id(c) not in self._lt_marked_calls]  # (marked at the call already)
        if not found:
            return body
        for c in found:
            self.report(*self.pos(c), "linen", "error", self.LT_UNAPPLIED)
        comment = cst.EmptyLine(comment=cst.Comment(
            f"# TODO(torch2jax): {self.LT_UNAPPLIED} [linen]"))

        class Mark(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original_node, updated_node):
                if not findall(updated_node, pattern):
                    return updated_node
                return updated_node.with_changes(
                    leading_lines=[*updated_node.leading_lines, comment])
        return [s.visit(Mark()) for s in body]

    # ------------------------------------------------------------------ linen training
    def _lt_loop(self, original_node, updated_node, body):
        """A training loop under --target linen (targets/linen_training.py): the loop's new
        body; the step, model.init and the TrainState go before the outermost loop."""
        t = self.training
        ep = self._lt_epoch.get(self._fn_stack[0].name.value) if len(
            self._fn_stack) == 1 and not self._class_stack else None
        micro = self._lt_micro.pop(id(original_node), None)
        pairs = [(ep.optimizer, ep.model)] if ep is not None else [
            (n, t.model_of(n)) for n in t.optimizer_names]
        if micro is not None:  # micro-steps summed in an inner loop: their step, made there
            ep, pairs = None, [(micro[0].optimizer, micro[0].model)]
        for name, model in pairs:
            if model is None:
                continue
            outer = self._for_stack[0] if self._for_stack else original_node
            loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
            if self._while_stack:  # (the step goes before an epoch loop written as a while)
                loop_names |= tr.loop_assigned_names(self._while_stack[0])
            site = t.optimizer_names.get(name)
            try:
                step = micro[1] if micro is not None else lt.build_step(
                    body, optimizer=name, model=model, loop_names=loop_names,
                    step_name="train_step", batch_stats=self._lt_batch_stats,
                    dropout=self._lt_dropout, noise=self._lt_noise,
                    accumulate=site is not None and site.accumulate is not None)
                if ep is not None and step is not None:
                    if (self._lt_dropout or self._lt_noise) and not (
                            self._key_scopes[-1].has_key):
                        raise Untranslatable(
                            f"no key in {ep.name} for the dropout keys: {ep.name} runs once "
                            "per epoch with the TrainState its caller makes; pass it a key",
                            rule="training-loop")
                    return self._lt_epoch_loop(ep, step, body, original_node, updated_node,
                                               loop_names)
                if step is not None and not self._key_scopes[-1].has_key and len(
                        self._key_scopes) == 1:
                    # torch's global RNG was never seeded: a root key, as for random draws
                    self._key_scopes[0].root_needed = self._key_scopes[0].has_key = True
                    self.need("jax")
                    self.diag(original_node, "random", "warning",
                              "model.init without torch.manual_seed: a root key "
                              "jax.random.key(0) is added at the top of the file")
                if step is not None and not self._key_scopes[-1].has_key:
                    raise Untranslatable("no key in this scope for model.init and the dropout "
                                         "keys: seed with torch.manual_seed or pass one",
                                         rule="training-loop")
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or "training-loop", "error", exc.message)
                self._lt_marked = True
                return None
            if step is None:
                continue
            sample = la.micro_sample(step, micro[2], body, updated_node,
                                                self._for_stack, loop_names) if (
                micro is not None) else lt.sample_inputs(step, body, updated_node,
                                                         self._for_stack, loop_names)
            if micro is None and isinstance(original_node, cst.While) and (
                    sample is None or sample[0]):
                # the batch is drawn in the loop (the next batch of an iterator): drawn once
                # more before it, the loop would start one batch later
                return self._lt_lazy_init(model, name, step, original_node)
            if sample is None:
                self.diag(original_node, "training-loop", "error",
                          "no sample input for model.init: the model's inputs are not a "
                          "batch gathered from an array, a loader's batch or a helper's "
                          "result")
            stmts, inputs = sample if sample is not None else ([], None)
            init = self._lt_init(model, name, inputs)
            depth = 4 * (self._depth - len(self._for_stack))  # the outermost loop's
            init = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                    else st for st in init]
            new_body = body if micro is not None else step.body
            if micro is not None or self._lt_global_evals:
                # estimate_loss(): the variables of this update; and what reads them between
                # micro-step updates (build_step binds them for its loop's statements)
                new_body = lt.current_variables(new_body, self._lt_batch_stats, la.calls_of(
                    self._lt_global_evals) | (m.Name(lt.VARIABLES) if micro is not None
                                              else la.calls_of(set())))
            batch = dt.loop_names(original_node.target) if isinstance(
                original_node, cst.For) else None
            if self.data.distributed and batch and isinstance(original_node.iter, (
                    cst.Name, cst.Call)):
                # the batch is split over the devices; the replicated parameters follow
                self.need("jax", "sharding")
                self._hoist.extend(dt.mesh_statements())
                new_body = [dt.shard_batch(batch), *new_body]
                # the TrainState replicated before the first call, as the step returns it
                # (left on one device, the first call compiled the step a second time)
                init = [*init, *cst.parse_module(
                    f"{lt.STATE} = jax.device_put({lt.STATE}, NamedSharding(mesh, P()))"
                    "  # replicated, as the step returns it\n").body]
            self._hoist.extend([step.function, *stmts, *init, *self._lt_after_state])
            self._lt_after_state = []
            self._lt_post.append(lt.final_variables(self._lt_batch_stats))
            return new_body
        return None

    def _lt_micro_steps(self, site, body, original_node, node, loop_names):
        """``for micro_step in range(k): ... loss.backward()`` then ``optimizer.step()``
        (analysis/accumulate.py) under linen: a jitted gradient step per micro-step that adds
        its gradients to ``grads`` (None before the loop), as torch sums ``.grad``; the step()
        after the loop is ``state = state.apply_gradients(grads=grads)``. model.init and the
        TrainState go before the outermost loop (``_lt_loop``)."""
        outer = [*self._for_stack[:1], *self._while_stack[:1]]
        if len(outer) != 1 or self._class_stack or self._fn_stack and (
                self._fn_stack[0].name.value in {*self._lt_epoch, *self._lt_trainers}):
            return None  # (a function run per epoch: its caller makes the state; marked)
        taken = self._file_names | self._step_names_taken()
        name = tr._fresh("grad_step", taken)
        self._micro_names.add(name)
        body, dropped = la.without_grad_sync(body, site.model)
        if dropped:
            self.diag(original_node, "torch.nn.parallel.DistributedDataParallel", "info",
                      f"{site.model}.require_backward_grad_sync removed: the micro-steps' "
                      "gradients are summed in one program, with no all-reduce to hold back")
        try:
            step = lt.build_step(body, optimizer=site.optimizer, model=site.model,
                                 loop_names=loop_names - {site.model, site.optimizer},
                                 step_name=name, batch_stats=self._lt_batch_stats,
                                 dropout=self._lt_dropout, noise=self._lt_noise,
                                 summed=ACC_GRADS)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or "accumulation", "error", exc.message)
            return None
        if step is None:
            return None
        self.need("jax", "jnp", "optax", "train_state")
        self._acc.done.add(id(original_node))
        self._acc.scans[id(site)] = (f"{lt.STATE} = {lt.STATE}.apply_gradients("
                                     f"grads={ACC_GRADS})\n")
        self._lt_micro[id(outer[0])] = (site, step, la.before_call(body, site.model))
        self.diag(original_node, "accumulation", "info",
                  f"gradient accumulation: {name} computes each micro-step's gradients "
                  f"(jit-compiled) and adds them to {ACC_GRADS}, as torch sums .grad; "
                  f"{lt.STATE}.apply_gradients applies the sum once after the loop")
        init = cst.parse_statement(f"{ACC_GRADS} = None\n").with_changes(
            leading_lines=node.leading_lines)
        loop = node.with_changes(leading_lines=[], body=node.body.with_changes(body=step.body))
        return cst.FlattenSentinel([init, loop])

    def _lt_lazy_init(self, model: str, optimizer: str, step, loop) -> list[cst.BaseStatement]:
        """model.init on the loop's first batch, at the first step (``if state is None:``),
        where the batch is drawn in the loop; the state is None before it."""
        init = self._lt_init(model, optimizer, step.model_args)
        depth = 4 * (self._depth + 2)
        init = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                else st for st in [*init, *self._lt_after_state]]
        self._lt_after_state = []
        guard = cst.If(test=cst.parse_expression(f"{lt.STATE} is None"),
                       body=cst.IndentedBlock(body=init))
        body = list(step.body)
        at = next((i for i, st in enumerate(body) if st is step.call), 0)
        guard = guard.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[])
        self._hoist.extend([step.function, cst.parse_statement(f"{lt.STATE} = None\n")])
        self._lt_post.append(lt.final_variables(self._lt_batch_stats))
        self.diag(loop, "training-loop", "info",
                  f"model.init runs at the first step, on the loop's first batch ({lt.STATE} "
                  "is None before it): the loop draws its batches itself")
        return [*body[:at], guard, *body[at:]]

    def _lt_while(self, original_node, updated_node, body):
        """``while True:`` around a train step (makemore's, minGPT's Trainer.run): the step,
        model.init and the TrainState before the loop, as for a ``for`` loop (the sample input
        is the first batch, drawn before the loop); the variables after it."""
        new_body = self._lt_loop(original_node, updated_node, body)
        if new_body is None:
            return None
        self._lt_marked = False
        hoisted, post, blank = self._lt_take_hoisted()
        loop = updated_node.with_changes(body=updated_node.body.with_changes(body=new_body),
                                         leading_lines=blank)
        return cst.FlattenSentinel([*hoisted, loop, *post])

    def _lt_epoch_loop(self, ep, step, body, original_node, updated_node, loop_names):
        """The training loop of a function called once per epoch: its step, and what its
        caller's model.init sample is made from; the caller makes the TrainState."""
        ep.step, ep.body, ep.loop = step, body, updated_node
        ep.outer, ep.loop_names = list(self._for_stack), loop_names
        self.need("jax", "optax", "train_state")
        fn = self._fn_stack[0]
        taken = self._file_functions | {e.module_step.name.value for e in self._lt_epoch.values()
                                        if e.module_step is not None}
        if step.function.name.value not in taken and not (
                lt.free_names(step.function) & lt.local_names(fn)):
            # it reads nothing of the function: defined once, before it (one compilation)
            ep.module_step = step.function
        else:
            self._hoist.append(step.function)
        self.diag(original_node, "training-loop", "info",
                  f"{ep.name} runs once per epoch: its caller makes the variables and the "
                  f"TrainState once; {ep.name} takes the state"
                  + (f" first (in place of the module's {ep.model} and {ep.optimizer})"
                     if ep.reads_globals else
                     f"{'' if ep.drop_model else ' (after the model)'} in place of the "
                     "optimizer") + " and returns it first")
        return step.body

    def _lt_epoch_call(self, original: cst.Call, updated: cst.Call,
                       target: cst.BaseExpression | None) -> cst.Assign:
        """``loss, acc = train(model, loader, optimizer, scheduler)`` ->
        ``state, (loss, acc) = train(loader, state, scheduler)``; the caller's first such call
        makes the variables and the TrainState before its outermost loop; the variables are
        read from the state after every call."""
        ep = self._lt_epoch[original.func.value]
        scope = id(self._fn_stack[-1]) if self._fn_stack else 0
        if scope not in self._lt_state_made:
            self._lt_state_made.add(scope)
            self._lt_global_key = False
            stmts = self._lt_epoch_state(ep, original, updated)
            if self._lt_global_key and not self._key_scopes[-1].global_key:
                stmts = [cst.parse_statement("global key\n"), *stmts]
            depth = 4 * (self._depth - len(self._for_stack))
            stmts = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                     else st for st in stmts]
            if self._for_stack or self._while_stack:  # (made once, before the epoch loop)
                self._hoist.extend(stmts)
            else:
                self._pending[-1].before.extend(stmts)
        self._pending[-1].after.append(lt.final_variables(self._lt_batch_stats))
        return cst.Assign(targets=[cst.AssignTarget(lt.with_state_target(target))],
                          value=updated.with_changes(args=ep.call_args(updated)))

    def _lt_epoch_preview(self, ep):
        """The step of an epoch function defined after its caller (not rewritten yet), read
        from its torch source for the caller's model.init sample: (step, loop body, loop,
        enclosing loops, loop names), or None."""
        fn = ep.fn
        if fn is None:
            return None
        for loop in findall(fn, m.For()):
            body = list(loop.body.body)
            if not any(tr._is_method_stmt(s, None, "backward") for s in body):
                continue
            names = tr.loop_assigned_names(loop)
            try:
                step = lt.build_step(body, optimizer=ep.optimizer, model=ep.model,
                                     loop_names=names, step_name="train_step",
                                     batch_stats=self._lt_batch_stats, dropout=self._lt_dropout,
                                     noise=self._lt_noise, accumulate=False)
            except Untranslatable:
                return None
            return (step, body, loop, [], names) if step is not None else None
        return None

    def _lt_take_hoisted(self) -> tuple[list, list, list[cst.EmptyLine]]:
        """What goes before a linen training loop (the step, model.init, the TrainState: blank
        lines before each compound statement and after one) and after it (the variables),
        taken from where the loop's rewrite left them, and the blank lines between them."""
        hoisted, self._hoist = self._hoist, []
        post, self._lt_post = self._lt_post, []
        blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
        hoisted = [h.with_changes(leading_lines=blank) if i == 0 or isinstance(
            h, cst.BaseCompoundStatement) or isinstance(hoisted[i - 1], cst.BaseCompoundStatement)
            else h for i, h in enumerate(hoisted)]
        return hoisted, post, blank

    def _lt_epoch_state(self, ep, original: cst.Call, updated: cst.Call):
        """model.init on a sample of the loader the call passes, and the TrainState."""
        b = ep.bound(original)
        model, optimizer = (ep.model, ep.optimizer) if ep.reads_globals else (
            b[ep.model].value, b[ep.optimizer].value)
        if not self._key_scopes[-1].has_key and len(self._key_scopes) == 1:
            self._key_scopes[0].root_needed = self._key_scopes[0].has_key = True
            self.diag(original, "random", "warning", "model.init without torch.manual_seed: "
                      "a root key jax.random.key(0) is added at the top of the file")
        elif not self._key_scopes[-1].has_key and self._fn_stack and (
                self._key_scopes[0].has_key) and "key" not in {
                n.value for n in findall(self._fn_stack[-1], m.Name())}:
            # main() of a script seeded at the top: model.init splits the script's key
            self._key_scopes[-1].has_key = True
            self._lt_global_key = True
        elif not self._key_scopes[-1].has_key:
            self.diag(original, "training-loop", "error", "no key in this scope for "
                      "model.init: seed with torch.manual_seed or pass one")
        sample = None
        found = (ep.step, ep.body, ep.loop, ep.outer, ep.loop_names) if (
            ep.step is not None) else self._lt_epoch_preview(ep)
        if ep.name in self._lt_helpers and ep.step is not None and self._for_stack:
            # a step helper called per batch: the caller's loop gives the first batch
            found = None
            names = tr.loop_assigned_names(self._for_stack[0]) | tr.loop_assigned_names(
                self._for_stack[-1])
            sample = lh.sample_inputs(ep, updated, self._for_stack[-1],
                                      list(self._for_stack[:-1]), names)
        if found is not None and found[0] is not None and found[2] is not None:
            ep_step, ep_body, ep_loop, ep_outer, ep_names = found
            values = ep.bound(updated) or {}
            loop = ep_loop.with_changes(iter=lt.bind_names(ep_loop.iter, values))
            outer = [*self._for_stack, *(ep_outer or [])]
            names = set(ep_names or ()) | (tr.loop_assigned_names(self._for_stack[0])
                                           if self._for_stack else set())
            step = replace(ep_step, model_args=[
                lt.bind_names(a, values) for a in ep_step.model_args])
            sample = lt.sample_inputs(step, ep_body, loop, outer, names)
            if sample is not None:
                stmts, inputs = sample
                inner = lt.local_names(ep.fn) - set(ep.params) if ep.fn is not None else set()
                used = {n.value for x in [*stmts, *inputs] for n in findall(x, m.Name())}
                used -= {n for st in stmts for n in tr.names_of(st).assigned}
                starts = [lt.carried_start(ep, n, inner) for n in sorted(used & inner)]
                if all(starts):  # a state the loop carries, started before it
                    stmts, used = [*stmts, *starts], used - inner
                sample = (stmts, inputs) if not used & inner else None
        if sample is None:
            self.diag(original, "training-loop", "error",
                      f"no sample input for model.init: {ep.name} is defined after its caller"
                      if ep.step is None else f"no sample input for model.init: the inputs "
                      f"of {ep.name}'s model are not a batch of a loader or an array it "
                      "receives")
        stmts, inputs = sample if sample is not None else ([], None)
        init = self._lt_init(model, optimizer, inputs)
        after, self._lt_after_state = self._lt_after_state, []
        return [*stmts, *init, *after]

    def _lt_init(self, model: str, optimizer: str, inputs, state: str = lt.STATE
                 ) -> list[cst.BaseStatement]:
        """``model.init`` and the TrainState over ``optimizer`` (targets/linen_training.py)."""
        self.need("jax", "optax", "train_state")
        if self._lt_batch_stats:
            self._lt_train_state_class = True
            self.need("Any")
        return lt.init_statements(model, optimizer, inputs, uses_train=self.uses_train,
                                  batch_stats=self._lt_batch_stats,
                                  dtype=self._lt_autocast.get(model), state=state)

    def _lt_gan_loop(self, original_node, node, body) -> list | None:
        """A GAN iteration under linen (targets/linen_gan.py): the loop's new body; the step,
        each model's init and TrainState before the outermost loop; after it, the variables
        of the model read there."""
        t = self.training
        orig = list(original_node.body.body)
        stepped = [n for n in t.optimizer_names if t.model_of(n) is not None and any(
            tr._is_method_stmt(s, {n}, "step") for s in orig)]
        if len(stepped) != 2 or self.data.aliasing or not isinstance(original_node, cst.For):
            return None
        d_opt = min(stepped, key=lambda n: next(i for i, s in enumerate(orig)
                                                if tr._is_method_stmt(s, {n}, "step")))
        g_opt = next(n for n in stepped if n != d_opt)
        d_model, g_model = t.model_of(d_opt), t.model_of(g_opt)
        if d_model == g_model or not gan.check_gan_source(
                orig, d_opt=d_opt, d_model=d_model, g_opt=g_opt, g_model=g_model):
            return None
        outer = self._for_stack[0] if self._for_stack else original_node
        loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
        outside = gan.names_outside(outer, original_node)
        parts = gan.gan_parts(body, d_opt=d_opt, d_model=d_model, g_opt=g_opt,
                              g_model=g_model, loop_names=loop_names, used_outside=outside)
        if parts is None:
            return None
        models = {d_model, g_model}
        try:
            if self._lt_dropout or self._lt_noise:
                raise Untranslatable("a GAN step whose models draw (Dropout, a method's "
                                     "draws): each call needs its own key; write it by hand")
            if models & (outside | {u for s in [*parts.hoisted, *parts.after]
                                    for u in tr.names_of(s).used}):
                raise Untranslatable("a GAN loop that reads a model outside the step (in "
                                     "training mode, with its state in the TrainState)")
            later = models & self._lt_read_after(outer)
            if len(later) > 1:
                raise Untranslatable(f"both {d_model} and {g_model} are read after the "
                                     "GAN loop: one set of variables is bound there")
            if not self._key_scopes[-1].has_key and len(self._key_scopes) == 1:
                self._key_scopes[0].root_needed = self._key_scopes[0].has_key = True
                self.need("jax")
            if not self._key_scopes[-1].has_key:
                raise Untranslatable("no key in this scope for model.init")
            taken = set(parts.taken) | self._file_names
            d_state = lg.state_name(d_model, taken)
            g_state = lg.state_name(g_model, taken | {d_state})
            fn, new_body, _ = lg.render_step(
                parts, d_model=d_model, g_model=g_model, d_opt=d_opt, g_opt=g_opt,
                d_state=d_state, g_state=g_state, step_name=self._loop_step_name(),
                batch_stats=self._lt_batch_stats)
            calls = [next(c for s in body for c in findall(s, m.Call(func=m.Name(x))))
                     for x in (d_model, g_model)]
            samples = lg.gan_samples(body, calls, node, self._for_stack, loop_names)
            if samples is None:
                raise Untranslatable("no sample input for model.init: the models' first "
                                     "inputs are not computed from the loop's batch")
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or "training-loop", "error", exc.message)
            self._lt_marked = True
            return None
        stmts, (d_in, g_in) = samples
        init = [*self._lt_init(d_model, d_opt, d_in, d_state),
                *self._lt_init(g_model, g_opt, g_in, g_state)]
        depth = 4 * (self._depth - len(self._for_stack))
        init = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                else st for st in [*stmts, *init]]
        self._hoist.extend([fn, *init, *self._lt_after_state])
        self._lt_after_state = []
        for name in later:
            state = d_state if name == d_model else g_state
            self._lt_post.append(lt.final_variables(self._lt_batch_stats, state))
        self.diag(original_node, "training-loop", "info",
                  f"GAN step: {d_opt} (on {d_model}) then {g_opt} (on {g_model}) in one "
                  f"jit-compiled step over their TrainStates ({d_state}, {g_state}); "
                  f"{g_model}'s forward runs once, under jax.vjp")
        return new_body

    def _lt_read_after(self, loop: cst.CSTNode) -> set[str]:
        """Names read by the statements after ``loop`` in its block."""
        parent = self.get_metadata(ParentNodeProvider, loop, None)
        stmts = list(getattr(parent, "body", ()))
        if not any(s is loop for s in stmts):
            return set()
        rest = stmts[next(i for i, s in enumerate(stmts) if s is loop) + 1:]
        return {u for s in rest for u in tr.names_of(s).used}

    def _lt_autocast_region(self, original_node, updated_node, item: cst.Call, q: str):
        """with torch.autocast(...) in a training loop: the training step applies a clone of
        the model with ``dtype=jnp.bfloat16`` (its layers compute in bfloat16, the parameters
        stay float32); the outputs are cast to float32 as torch does for the loss."""
        try:
            dtype, notes = dt.autocast_dtype(item, q)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or q, "error", exc.message)
            return updated_node
        body = list(updated_node.body.body)
        if not dtype:
            return cst.FlattenSentinel(body)
        called, new_body = dt.cast_model_outputs(body, self._model_names())
        if not called or not self._for_stack or not self._lt_dtype_classes:
            self.diag(original_node, q, "error", "autocast region outside a training loop, or "
                      "without a model call assigned to a name: give the model a dtype by "
                      "hand (model.clone(dtype=jnp.bfloat16))")
            return updated_node
        for note in notes:
            self.diag(original_node, q, "warning", note)
        for name in called:
            self._lt_autocast[name] = dtype
        self.need("jnp")
        self.diag(original_node, q, "info", f"autocast -> the training step applies "
                  f"{', '.join(sorted(set(called)))}.clone(dtype={dtype}) (flax layers' "
                  "dtype) with float32 parameters; outputs cast to float32")
        if updated_node.leading_lines and new_body:
            new_body[0] = new_body[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(new_body)

    def _lt_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        f = value.func
        if (isinstance(f, cst.Attribute) and f.attr.value in ("train", "eval")
                and isinstance(f.value, cst.Name) and f.value.value in self._model_names()
                and not value.args):
            # a linen module has no mode: model.apply reads its `train` field
            line = self.get_metadata(ParentNodeProvider, original_node, None)
            if isinstance(line, cst.SimpleStatementLine) and line.leading_lines and all(
                    ln.comment is None for ln in line.leading_lines):
                self._lt_blank = self._depth  # the next statement keeps the blank line
            return cst.RemoveFromParent()
        if isinstance(f, cst.Name) and f.value in self._lt_epoch:
            return self._lt_epoch_call(value, updated_node.value, None)
        if isinstance(f, cst.Name) and f.value in self._lt_trainers:
            # the helper trains the model it receives: it returns the model's variables
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(lt.VARIABLES))],
                              value=updated_node.value)
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name(
                "load_state_dict")), args=[m.Arg(value=m.Name(), keyword=None)])) and \
                f.value.value in self._model_names() and not self._class_stack and \
                self._lt_trains_none():
            # sample.py: model.load_state_dict(checkpoint['model']) in a file that trains
            # none: the dict is the model's variables (what the linen save writes)
            self.diag(original_node, "load_state_dict", "info",
                      f"{f.value.value}.load_state_dict(d) -> variables = d: the dict is "
                      "read as the linen model's variables ({'params': ...}, as the linen "
                      "checkpoint of variables saves them)")
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(lt.VARIABLES))],
                              value=value.args[0].value)
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name(
                "load_state_dict")), args=[m.Arg(value=m.Name(), keyword=None)])) and (
                f.value.value in self._model_names()) and (
                value.args[0].value.value in getattr(self, "_memory_state_names", ())) and (
                not self._lt_trains_none()):
            # an early stop's best weights kept in memory (their snapshot below): back into
            # the TrainState, and the variables the evaluation reads
            best = value.args[0].value.value
            bs = f', batch_stats={best}["batch_stats"]' if self._lt_batch_stats else ""
            self.diag(original_node, "load_state_dict", "info",
                      f"{f.value.value}.load_state_dict({best}) -> the TrainState's variables "
                      f"replaced by {best} (kept as {lt.VARIABLES})")
            self._pending[-1].after.append(cst.parse_statement(f"{lt.VARIABLES} = {best}\n"))
            return cst.parse_statement(
                f'{lt.STATE} = {lt.STATE}.replace(params={best}["params"]{bs})\n').body[0]
        resumed = self._lt_resume(original_node)
        if resumed is not None:
            return resumed
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name(
                "load_state_dict")), args=[m.Arg(value=~m.Call(), keyword=None)])) and (
                f.value.value in self._model_names() or f.value.value in
                self.training.optimizer_names):
            # a linen module or an optax transform has no state to load into
            self.diag(original_node, "load_state_dict", "error",
                      f"{f.value.value}.load_state_dict(d) where {f.value.value} is trained: "
                      "linen keeps the variables and the optimizer state in the TrainState; "
                      "restore them into it by hand")
        return None

    def _lt_tie_condition(self, original_node: cst.Assign) -> str | None:
        """The condition under which ``self.head.weight = self.table.weight`` runs in the
        constructor, over its fields (``self.tie_weights``); "True" when it always runs; None
        when it reads anything else, or sits in a loop."""
        tests: list[str] = []
        node: cst.CSTNode = original_node
        init = None
        while True:
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if parent is None:
                return None
            if isinstance(parent, cst.FunctionDef):
                init = parent
                break
            if isinstance(parent, (cst.For, cst.While, cst.With, cst.Try)):
                return None
            if isinstance(parent, cst.If):
                t = code(parent.test)
                if not m.matches(parent.test, m.Name() | m.Attribute()):
                    t = f"({t})"
                tests.append(t if node is parent.body else f"not {t}")
            node = parent
        if init.name.value != "__init__":
            return None
        params = {p.name.value for p in init.params.params[1:]} | {
            p.name.value for p in init.params.kwonly_params}
        assigned = set(tr.names_of(init.body).assigned)
        for t in tests:
            names = {n.value for n in findall(cst.parse_expression(t), m.Name())}
            if names - {"not", "self", "and", "or", "None", "True", "False"} - params or \
                    names & assigned:
                return None
        if not tests:
            return "True"

        class Fields(cst.CSTTransformer):
            def visit_Attribute(self, node) -> bool:
                return False

            def leave_Name(self, original_node, updated_node):
                if updated_node.value in params:
                    return cst.Attribute(value=cst.Name("self"), attr=updated_node.with_changes(
                        lpar=[], rpar=[]), lpar=updated_node.lpar, rpar=updated_node.rpar)
                return updated_node
        return " and ".join(code(cst.parse_expression(t).visit(Fields())) for t in tests)

    LT_METHOD_UNBOUND = ("a method of the linen model called outside apply, where none of "
                         "its variables are bound: left as written; call model.apply("
                         "variables, ..., method=...) with its variables")

    def _lt_method_call(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """``model.generate(x, n)`` outside the module classes -> ``model.apply(variables, x,
        n, method="generate", rngs={"noise": subkey})`` after ``key, subkey =
        jax.random.split(key)``: a linen module's layers exist only inside ``apply``, and a
        method that draws reads apply's ``noise`` stream (``self.make_rng``). The key is
        given when a module class of the file draws, and always for a class of another
        file (whose methods this file cannot see; flax ignores a stream nothing reads)."""
        f = original.func
        if not hasattr(self, "_lt_aliases"):
            self._lt_aliases = la.model_aliases(self._root, self._model_names())
        if self._class_stack or not m.matches(f, m.Attribute(value=m.Name(), attr=m.Name())):
            return None
        base = self._lt_aliases.get(f.value.value)  # raw_model = model: the model's methods
        if base is None and (f.value.value not in self._model_names() or not (
                self._is_module_expr(f.value))) or f.attr.value.startswith("_") or (
                f.attr.value in _MODULE_METHODS):
            return None
        base = base or f.value.value
        if self._assign_target(original) in self.training.optimizer_names:
            return None  # configure_optimizers: it returns the optax transform, unbound
        here = lt.module_methods(self._root, self.index.module_classes)
        imported = self._lt_imported_model(base)
        classes = {a.value.func.value for a in findall(self._root, m.Assign(
            targets=[m.AssignTarget(target=m.Name(base))], value=m.Call(
                func=m.Name())))}
        if classes and all(f.attr.value in self._lt_unbound.get(c, ()) for c in classes):
            return None  # it reads only the module's fields: it runs on the unbound module
        if f.attr.value not in here and not imported:
            return None
        if any(a.star for a in original.args) or not self._lt_variables_bound() or \
                not self._lt_bound_before(original):
            self._lt_marked_calls.add(id(original))
            self.diag(original, "linen", "error", self.LT_METHOD_UNBOUND)
            return None
        if self._lt_noise or imported:
            scope = self._key_scopes[-1]
            if not scope.has_key and len(self._key_scopes) == 1:
                self._key_scopes[0].root_needed = scope.has_key = True
                self.diag(original, "random", "warning", "a model method's draws without "
                          "torch.manual_seed: a root key jax.random.key(0) is added at the "
                          "top of the file")
            if not self._key_scopes[-1].has_key:
                self._lt_marked_calls.add(id(original))
                self.diag(original, "linen", "error", "no key in this scope for the model "
                          "method's noise stream: seed with torch.manual_seed or pass one")
                return None
        q = self._string_quote()  # (inside an f-string: the other quote)
        extra = []
        if self._lt_noise or imported:
            self.need("jax")
            self._pending[-1].before.append(cst.parse_statement(
                f"{tr.KEY}, {lt.SUBKEY} = jax.random.split({tr.KEY})\n"))
            extra = [arg(cst.parse_expression(f'{{{q}{lt.NOISE}{q}: {lt.SUBKEY}}}'), "rngs")]
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in updated.args]
        return updated.with_changes(
            func=cst.Attribute(value=f.value, attr=cst.Name("apply")),
            args=_fix_commas([arg(cst.Name(lt.VARIABLES)), *args, arg(
                cst.SimpleString(f'{q}{f.attr.value}{q}'), "method"), *extra]))

    def _lt_imported_model(self, name: str) -> bool:
        """``name`` is bound to an instance of a module class of another file (GPT(conf) in
        sample.py, with ``from model import GPT``; ``model = DDP(model)`` wraps it)."""
        classes = {a.value.func.value for a in findall(self._root, m.Assign(
            targets=[m.AssignTarget(target=m.Name(name))], value=m.Call(func=m.Name())))
            if self.q(a.value.func) not in _WRAPPERS}
        here = {c.name.value for c in self._root.body if isinstance(c, cst.ClassDef)}
        return bool(classes) and all(c in self.index.module_classes and c not in here
                                     for c in classes)

    def _lt_bound_before(self, node: cst.CSTNode) -> bool:
        """A top-level statement binds the variables before ``node`` (a training loop, a
        function it calls that trains, a state dict loaded), or ``node`` is in a function
        (called later, as the evaluation helpers)."""
        if self._fn_stack:
            return True
        while True:
            parent = self.get_metadata(ParentNodeProvider, node, None)
            if parent is None or isinstance(parent, cst.Module):
                break
            node = parent
        binds = m.Call(func=m.Attribute(attr=m.Name("backward") | m.Name(
            "load_state_dict"))) | m.Call(func=m.Name(m.MatchIfTrue(
                lambda n: n in self._lt_epoch or n in self._lt_trainers or any(
                    isinstance(f, cst.FunctionDef) and f.name.value == n and findall(
                        f, m.Call(func=m.Attribute(attr=m.Name("backward"))))
                    for f in self._root.body))))
        for s in self._root.body:
            if findall(s, binds):
                return True
            if s is node:
                return False
        return False

    def _lt_variables_bound(self) -> bool:
        """A file that trains a model binds its variables (model.init, then the state's);
        one that trains none binds them where it loads a state dict into the model."""
        if not self._lt_trains_none():
            return True
        return bool(findall(self._root, m.Call(func=m.Attribute(
            value=m.Name(), attr=m.Name("load_state_dict")), args=[m.Arg(
                value=m.Name(), keyword=None)])))

    def _lt_function(self, node: cst.FunctionDef) -> cst.FunctionDef:
        name = node.name.value
        if name in self._lt_evaluators:
            i = self._lt_evaluators[name]
            # its model calls (a @torch.no_grad() evaluation) apply the variables under jit
            jitted = self._lt_eval_calls({node.params.params[i].name.value})
            node = node.with_changes(body=node.body.visit(jitted).visit(lt.ApplyMethods(
                node.params.params[i].name.value, lt.module_methods(
                    self._root, self.index.module_classes))))
            if jitted.count:
                self._eval_step = True
                self.need("jax", "partial")
            node = lt.add_variables_param(node, i)
        if name in self._lt_global_evals:  # the module's model: the module's variables
            jitted = self._lt_eval_calls(self._model_names())
            node = node.with_changes(body=node.body.visit(jitted))
            if jitted.count:
                self._eval_step = True
                self.need("jax", "partial")
        if name in self._lt_helpers:
            node = self._lt_step_helper(node, self._lt_epoch[name])
        if name in self._lt_epoch:
            body = list(node.body.body)
            loop = next((i for i, st in enumerate(body) if isinstance(st, (cst.For, cst.While))),
                        len(body))
            self._lt_epoch[name].prelude = body[:loop]
            node = lt.takes_state(node, self._lt_epoch[name])
        if name in self._lt_trainers and not lt.returns(node):
            body = [*node.body.body, cst.parse_statement(f"return {lt.VARIABLES}\n")]
            node = node.with_changes(body=node.body.with_changes(body=body))
        return node

    def _lt_find_step_helpers(self) -> None:
        """Step helpers (``def train_step(x, y)`` over the script's model): their backward()
        is translated with the helper's block (:meth:`_lt_step_helper`)."""
        self._lt_helpers = lh.step_helpers(self._lt_epoch)
        self._step_backwards = set().union(*self._lt_helpers.values())
        self._step_backwards_at = {}

    def _lt_step_helper(self, node: cst.FunctionDef, ep) -> cst.FunctionDef:
        """A step helper (targets/linen_helpers.py): its block becomes a call of a
        jit-compiled step over the TrainState, defined once before the helper; or, where
        the step cannot be built, its backward() is marked where it stands."""
        body = list(node.body.body)
        back = next(s for s in body if tr._is_method_stmt(s, None, "backward"))
        where = self._step_backwards_at.get(id(back.body[0]), back)
        taken = self._file_names | {e.module_step.name.value for e in self._lt_epoch.values()
                                    if e.module_step is not None}
        try:
            if self._lt_dropout or self._lt_noise:
                raise Untranslatable(f"{ep.name} is a step helper of a model that draws "
                                     "(Dropout, noise): its keys are not threaded through "
                                     "the helper's calls", rule="training-loop")
            step = lt.build_step(body, optimizer=ep.optimizer, model=ep.model,
                                 loop_names=lh.helper_names(ep.fn),
                                 step_name=tr._fresh("train_step", taken),
                                 batch_stats=self._lt_batch_stats, dropout=False, noise=False)
            if step is None or lt.free_names(step.function) & lt.local_names(ep.fn):
                raise Untranslatable("the statements before backward() hold no loss of the "
                                     f"model {ep.model} that torch2jax can separate",
                                     rule="training-loop")
        except Untranslatable as exc:
            self.diag(where, exc.rule or "training-loop", "error",
                      f"backward() not translated: {exc.message}")
            del self._lt_epoch[ep.name]
            return node
        self.need("jax", "optax", "train_state")
        ep.step, ep.body, ep.loop, ep.outer = step, step.body, None, []
        ep.loop_names = lh.helper_names(ep.fn)
        ep.module_step = step.function
        self.diag(where, "training-step", "info",
                  f"{ep.name} takes one train step: {step.function.name.value} (jit-compiled) "
                  f"takes grad(loss) of {ep.model}'s parameters and applies it to the "
                  f"TrainState; {ep.name} takes the state first and returns it first, and its "
                  "callers make the state before their loop")
        return node.with_changes(body=node.body.with_changes(body=step.body))

    def _lt_draw_key(self) -> cst.BaseExpression:
        """The key of a draw in a module method: the stream every apply gives a key."""
        self.need("jax")
        return cst.parse_expression(f'self.make_rng("{lt.NOISE}")')

    def _lt_eval_calls(self, models: set[str]) -> cst.CSTTransformer:
        """The model calls of evaluation code through ``eval_step``, with a key split for
        each when the model's methods draw (a VAE's reparameterisation)."""
        if self._lt_noise:
            return lt.KeyedModelCalls(models)
        return tr.JitModelCalls(models, extra=(lt.VARIABLES,))

    def _lt_pass_variables(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        i = self._lt_evaluators[original.func.value]
        args = list(updated.args)
        if len(args) <= i or any(a.keyword or a.star for a in args[:i + 1]):
            return updated
        args.insert(i + 1, arg(cst.Name(lt.VARIABLES)))
        return updated.with_changes(args=_fix_commas(args))

    def _linen_train(self) -> str:
        """Inside a module: its field; inside a layer-building helper: its argument."""
        return f"self.{linen_target.TRAIN}" if self.in_module_class() else linen_target.TRAIN
