"""The training loop: ``for`` / ``while`` loops around a train step (NNX), gradient
accumulation, learning-rate loops, the GAN step, and autocast regions (``with``).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import callbacks as cb
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.walk import findall
from torch2jax.passes import accum_scan
from torch2jax.passes import crossing_step as cs
from torch2jax.passes import data as dt
from torch2jax.passes import gan_step as gan
from torch2jax.passes import grad_sum as gs
from torch2jax.passes import no_grad_blocks as ngb
from torch2jax.passes import param_inits as pinit
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    code,
    expr,
)
from torch2jax.passes.held_steps import named_backward as _named_backward
from torch2jax.passes.hoist_args import hoisted_step, passing
from torch2jax.passes.param_writes import param_loop
from torch2jax.passes.rewrite_support import (
    ACC_GRADS,
    STEP_GLOBALS,
    _after,
    _fix_commas,
    _free_names,
)
from torch2jax.targets import linen_training as lt

# the note of a learning rate set by hand in the file's own optimizer state (a claim that
# finish/claims.py checks against the code written)
LR_INJECTED = "param_groups learning rate set in the optimizer state"


class LoopsMixin:
    def leave_For(self, original_node, updated_node):
        init_loop = self._param_init_loops.pop(id(original_node), None)
        if init_loop is not None:
            self._for_stack.pop()
            return init_loop
        frozen = self._frozen_loop(original_node, updated_node)
        if frozen is None:  # parameters updated through the loop variable: written back
            frozen = param_loop(self, original_node, updated_node)
        if frozen is not None:
            self._for_stack.pop()  # (left, a later loop's step took this loop for its own)
            return frozen
        updated_node = self._loader_loop(original_node, updated_node)
        return self._leave_for(original_node, self._modules_loop(original_node, updated_node))

    def _frozen_loop(self, node: cst.For, updated: cst.For) -> cst.SimpleStatementLine | None:
        """``for p in module.parameters(): p.requires_grad = False`` (or
        ``p.requires_grad_(False)``; Whisper's ``_freeze_parameters``), nnx: the
        ``freeze_parameters(module)`` helper (passes/helpers.py), as ``module.requires_grad_(
        False)`` is. Before, the flag was set on each array, which JAX ignores."""
        if not self.target.stateful_modules or self.target.intermediate or (
                node.orelse is not None) or not (
                isinstance(node.target, cst.Name) and m.matches(node.iter, m.Call(
                    func=m.Attribute(attr=m.Name("parameters")), args=[]))
                and isinstance(node.body, cst.IndentedBlock) and len(node.body.body) == 1
                and m.matches(node.body.body[0], m.SimpleStatementLine(body=[m.DoNotCare()]))):
            return None
        p, stmt = node.target.value, node.body.body[0].body[0]
        flag = m.Attribute(value=m.Name(p), attr=m.Name("requires_grad"))
        if not (m.matches(stmt, m.Assign(targets=[m.AssignTarget(target=flag)],
                                         value=m.Name("False")))
                or m.matches(stmt, m.Expr(value=m.Call(
                    func=m.Attribute(value=m.Name(p), attr=m.Name("requires_grad_")),
                    args=[m.Arg(value=m.Name("False"), keyword=None)])))):
            return None
        module = node.iter.func.value
        if not self._is_module_expr(module):
            return None
        if m.matches(updated.iter, m.Call(func=m.Attribute(attr=m.Name("parameters")))):
            module = updated.iter.func.value  # as rewritten: model.body[0] -> .layers[0]
        return cst.SimpleStatementLine(
            [cst.Expr(cst.Call(cst.Name("freeze_parameters"), [cst.Arg(module)]))],
            leading_lines=node.leading_lines)

    def _per_call_trainer(self, optimizer: str) -> bool:
        """The loop is in a top-level function that receives the optimizer (``def train(model,
        loader, optimizer, scheduler)``, called once per epoch)."""
        return len(self._fn_stack) == 1 and not self._class_stack and self._shadowed(optimizer)

    def _shadowed(self, name: str) -> bool:
        """``name`` is a parameter of the function being rewritten (``def train(model, loader)``
        receives the epoch's loader, whatever the caller's loader is called)."""
        return bool(self._fn_stack) and name in {
            p.name.value for p in (*self._fn_stack[-1].params.params,
                                   *self._fn_stack[-1].params.kwonly_params)}

    def leave_CompFor(self, original_node, updated_node):
        """[x for epoch in range(n) for x in loader]: loader(epoch), as in a for statement."""
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        outer = [f.target.value for f in self._for_stack if isinstance(f.target, cst.Name)]
        if isinstance(parent, cst.CompFor) and isinstance(parent.target, cst.Name):
            outer.append(parent.target.value)
        ifs = [c for c in updated_node.ifs if not m.matches(c.test, m.Name("True"))]
        return updated_node.with_changes(iter=self._epoch_loaders(
            updated_node.iter, outer[-1] if outer else "0"), ifs=ifs)

    def leave_With(self, original_node, updated_node):
        items = [(oi, ui) for oi, ui in zip(original_node.items, updated_node.items)]
        keep, stopped = [], False
        for oi, ui in items:
            item = oi.item
            fn = item.func if isinstance(item, cst.Call) else item
            q = self.q(fn) or ""
            if q.startswith(("torch.no_grad", "torch.inference_mode", "torch.enable_grad",
                             "torch.autograd.set_grad_enabled")):
                stopped = stopped or ngb.stops_gradient(q, item)
                continue
            if q in dt.AUTOCASTS and isinstance(item, cst.Call) and len(items) == 1:
                if self.target.train_state:
                    return self._lt_autocast_region(original_node, updated_node, item, q)
                return self._autocast(original_node, updated_node, item, q,
                                      translated=ui.item)
            ctx = self._ctx_autocasts.get(item.value) if isinstance(item, cst.Name) and len(
                items) == 1 and self.target.stateful_modules else None
            if ctx is not None:
                # with ctx: where ctx = nullcontext() if ... else torch.amp.autocast(...)
                call, cq, enabled = ctx
                return self._autocast(original_node, updated_node, call, cq, enabled)
            keep.append(ui)
        if len(keep) == len(items):
            return updated_node
        if not keep:
            # outside of a differentiated function a no_grad block is plain code; the model
            # calls in it (evaluation) go through one jit-compiled eval step
            body = list(updated_node.body.body)
            if stopped and self.in_module_class():  # a forward's no_grad block
                body = ngb.stopped_body(self, original_node.body.body, body)
            if not self.in_module_class() and self.target.train_state and \
                    not self.training.optimizers:
                # no model is trained in this file, so no `variables` are bound here: the
                # model calls stay as written, marked
                body = self._lt_unapplied(original_node.body.body, body)
            elif not self.in_module_class() and self.target.train_state:
                jitted = self._lt_eval_calls(self._model_names())
                body = [x for b in body for x in lt.statements(b.visit(jitted))]
                if jitted.count:
                    self._eval_step = True
                    self.need("jax", "partial")
            if not self.in_module_class() and self.target.stateful_modules:
                models = self._model_names()
                jitted = tr.JitModelCalls(models)
                body = [b.visit(jitted) for b in body]
                if jitted.count:
                    self._eval_step = True
                    self.need("nnx")
            if body and updated_node.leading_lines:
                body[0] = body[0].with_changes(
                    leading_lines=[*updated_node.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel(body)
        return updated_node.with_changes(items=_fix_commas(keep))

    def _find_autocast_contexts(self, module: cst.Module) -> None:
        """``ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(...)``,
        assigned once at the top level: ``with ctx:`` is an autocast region enabled when the
        condition selects the autocast (a run-time dtype); ``ctx`` itself is a nullcontext."""
        found: dict[str, tuple[cst.Call, str, cst.BaseExpression]] = {}
        counts: dict[str, int] = {}
        for a in findall(module, m.AssignTarget(target=m.Name())):
            counts[a.target.value] = counts.get(a.target.value, 0) + 1
        for stmt in module.body:
            if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
                    targets=[m.AssignTarget(target=m.Name())], value=m.IfExp())])):
                continue
            a = stmt.body[0]
            name, ifexp = a.targets[0].target.value, a.value
            if counts.get(name) != 1:
                continue
            branches = (ifexp.body, ifexp.orelse)
            null = [isinstance(b, cst.Call) and not b.args and self.q(b.func) ==
                    "contextlib.nullcontext" for b in branches]
            auto = [isinstance(b, cst.Call) and self.q(b.func) in dt.AUTOCASTS
                    for b in branches]
            if null == [True, False] and auto == [False, True]:
                enabled = expr("not {t}", t=ifexp.test)
                call = ifexp.orelse
            elif null == [False, True] and auto == [True, False]:
                enabled = ifexp.test
                call = ifexp.body
            else:
                continue
            found[name] = (call, self.q(call.func), enabled)
            self._ctx_ifexps.add(id(ifexp))
        self._ctx_autocasts = found

    def leave_IfExp(self, original_node, updated_node):
        if id(original_node) in self._ctx_ifexps:
            # the autocast is applied where ``with ctx:`` stands (leave_With)
            return updated_node.body if isinstance(original_node.body, cst.Call) and (
                not original_node.body.args) and self.q(original_node.body.func) == (
                    "contextlib.nullcontext") else updated_node.orelse
        if isinstance(original_node.test, cst.Call) and getattr(self.rules.functions.get(
                self.q(original_node.test.func) or ""), "special", None) == "tracing":
            return updated_node.orelse  # a if torch.jit.is_tracing() else b: b
        # nn.Identity() if a else B -> (lambda x: x) if a else B: a bare lambda would take
        # the whole conditional as its body (iformer's downsample)
        parts = {}
        for field in ("body", "test"):
            part = getattr(updated_node, field)
            if isinstance(part, cst.Lambda) and not part.lpar:
                parts[field] = part.with_changes(lpar=[cst.LeftParen()],
                                                 rpar=[cst.RightParen()])
        return updated_node.with_changes(**parts) if parts else updated_node

    def _autocast(self, original_node, updated_node, item: cst.Call, q: str,
                  enabled: cst.BaseExpression | None = None,
                  translated: cst.BaseExpression | None = None):
        """with torch.autocast(...): the model computes in bfloat16 for these statements.
        ``enabled``: decided at run time (``enabled=(dtype == "bfloat16")``, or the condition
        under which ``ctx`` is the autocast rather than ``nullcontext()``): the dtype is set
        to ``bfloat16 if enabled else None``. ``translated``: the call as the rewriter left
        it, whose ``enabled=`` expression reads the converted names (``device.type``)."""
        try:
            dtype, notes = dt.autocast_dtype(item, q, variable=True)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or q, "error", exc.message)
            return updated_node
        own = dt.autocast_enabled(item, q)
        if own is not None and isinstance(translated, cst.Call):
            own = dt.autocast_enabled(translated, q) or own
        if own is not None:
            enabled = own if enabled is None else expr(
                "({a}) and ({b})", a=enabled, b=own)
        for note in notes:
            self.diag(original_node, q, "warning", note)
        body = list(updated_node.body.body)
        if not dtype:  # enabled=False
            return cst.FlattenSentinel(body)
        called, new_body = dt.cast_model_outputs(body, self._model_names(), nested=True)
        if not called:
            # model.generate(...): the model's methods compute in the region's dtype; their
            # outputs (sampled token ids) are left as they come
            called = [c.func.value.value for b in body for c in findall(b, m.Call(
                func=m.Attribute(value=m.Name(), attr=m.Name())))
                if c.func.value.value in self._model_names()]
        if not called:
            self.diag(original_node, q, "error", "autocast region without a model call "
                      "assigned to a name: no dtype policy emitted")
            return updated_node
        self.need("jnp")
        if any("jax.tree.map" in code(b) for b in new_body):
            self.need("jax")
        self.diag(original_node, q, "info", f"autocast -> {', '.join(sorted(set(called)))} "
                  f"computes in {dtype.removeprefix('jnp.')} (flax layers' dtype) with "
                  "float32 parameters; outputs cast to float32")
        if enabled is not None:
            dtype = f"{dtype} if {code(enabled)} else None"
        before = [dt.set_dtype(name, dtype) for name in dict.fromkeys(called)]
        after = [dt.set_dtype(name, "None") for name in dict.fromkeys(called)]
        if updated_node.leading_lines:
            before[0] = before[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*before, *new_body, *after])

    def _accumulation_statement(self, original_node: cst.Expr):
        """The statements after a micro-step loop (analysis/accumulate.py): the optimizer's
        step applies the summed gradients, clipping clips them, zero_grad goes."""
        site = self._acc.steps.get(id(original_node))
        if site is not None:
            if id(site.loop) not in self._acc.done:
                return None
            if id(site) in self._acc.scans:
                return cst.parse_statement(self._acc.scans[id(site)]).body[0]
            return cst.parse_statement(
                f"{self._acc.applies[id(site)]}({site.model}, {site.optimizer}, {ACC_GRADS})\n"
            ).body[0]
        site = self._acc.clips.get(id(original_node))
        if site is not None:
            if id(site.loop) not in self._acc.done:
                return None
            local = self.training.optimizer_names.get(site.optimizer)
            if local is not None and local.clip is not None or id(site) in self._acc.folded:
                return cst.RemoveFromParent()  # in the optimizer's chain, or apply_grads'
            self.need("optax")
            return cst.parse_statement(
                f"{ACC_GRADS}, _ = optax.clip_by_global_norm({code(site.max_norm)}).update("
                f"{ACC_GRADS}, optax.EmptyState())\n").body[0]
        if id(original_node) in self._acc.dropped:
            return cst.RemoveFromParent()
        return None

    def _lr_loop(self, original_node, node):
        """``for g in optimizer.param_groups: g['lr'] = lr`` -> the optimizer's injected
        learning rate (an optax.inject_hyperparams hyperparameter in its state)."""
        if id(original_node) not in self._lr_loops:
            return None
        opt, _ = self._lr_loops[id(original_node)]
        value = node.body.body[0].body[0].value
        site = self.training.optimizer_names.get(opt)
        if self.target.train_state:
            # linen: the TrainState the training loop around it makes holds the optimizer
            # state; only in the body of a loop that steps this optimizer
            steps = m.Call(func=m.Attribute(value=m.Name(opt), attr=m.Name("step"))) | m.Call(
                func=m.Attribute(attr=m.Name("step")), args=[m.Arg(m.Name(opt))])  # a scaler's
            around = (self._for_stack or self._while_stack or [None])[-1]  # (a while: nanoGPT's)
            # an optimizer a model's method returns (configure_optimizers) is built with
            # optax.inject_hyperparams where torch2jax converts that method
            foreign = site.external and site.scheduler is None if site is not None else (
                opt in self._acc.foreign)
            if (site is None or site.external or id(site) in self.failed_sites or
                    site.scheduler is not None) and not foreign or around is None or \
                    not m.findall(around, steps):
                return self._lr_loop_left(original_node, opt)
            self.need("jnp")
            self.diag(original_node, "param_groups", "info",
                      f"{LR_INJECTED}: the TrainState's injected learning_rate ({opt} is "
                      "built with optax.inject_hyperparams)")
            return cst.parse_statement(
                f"{self._lr_slot(opt)} = jnp.float32({code(value)})\n").with_changes(
                leading_lines=node.leading_lines)
        if site is not None and not site.external:
            if id(site) in self.failed_sites or site.scheduler is not None:
                return self._lr_loop_left(original_node, opt)
            self.diag(original_node, "param_groups", "info",
                      f"{LR_INJECTED}: {opt}'s injected learning_rate (the optimizer is built "
                      "with optax.inject_hyperparams)")
        elif site is not None or opt in self._acc.foreign:
            source = self._acc.foreign.get(opt) or f"{site.model}.configure_optimizers"
            where = (f"returned by {source}, built with "
                     "optax.inject_hyperparams where torch2jax converts an optimizer that a "
                     "function returns to another file")
            self.diag(original_node, "param_groups", "info",
                      f"param_groups learning rate -> {opt}'s injected learning_rate (the "
                      f"optimizer is {where})")
        else:
            return self._lr_loop_left(original_node, opt)
        # a strong float32, as optax.inject_hyperparams keeps it: a Python float in the state
        # is weakly typed and compiles the jitted step again (equinox's eqx.filter_jit would
        # take it as a static argument: one compile per learning rate)
        self.need("jnp")
        value = f"jnp.float32({code(value)})"
        return cst.parse_statement(f"{tr.lr_slot(opt)} = {value}\n").with_changes(
            leading_lines=node.leading_lines)

    def _lr_loop_left(self, original_node, opt: str) -> None:
        """The learning rate set by hand on an optimizer the file does not build here (a
        helper's argument) or whose schedule owns it: the loop stays, marked (an optax
        transform has no param_groups)."""
        self.diag(original_node, "param_groups", "error",
                  f"{opt}.param_groups' learning rate set by hand, on an optimizer whose "
                  "learning rate torch2jax does not inject here (an argument of this function, "
                  "or one a scheduler drives): build it with optax.inject_hyperparams and set "
                  "opt_state.hyperparams['learning_rate']")

    def _micro_step_loop(self, original_node, node):
        """``for micro_step in range(k): ... loss.backward()`` then ``optimizer.step()``: a
        jit-compiled gradient step per micro-step, the gradients summed in the loop. The loop
        may stand in any block (nested in the epoch loop, in a function); the backward may be
        of an expression (``(loss / k).backward()``: the gradient step differentiates it and
        returns the names the rest of the program reads, ``loss`` among them)."""
        site = self._acc.loops.get(id(original_node))
        if site is None or (self._class_stack and not self._fn_stack):
            return None
        body, scaled = _named_backward(list(node.body.body), self._file_names)
        # the names the enclosing loops assign are passed to the step (a batch X[i:i + 4] of
        # the epoch loop's i): closed over, jit would keep their first value
        loop_names = tr.loop_assigned_names(original_node)
        for outer in (*self._for_stack[:1], *self._while_stack[:1]):
            loop_names |= tr.loop_assigned_names(outer)
        if self.target.train_state:  # linen: the TrainState's (rewrite_linen.py)
            return self._lt_micro_steps(site, body, original_node, node, loop_names)
        if self._fn_stack:
            loop_names |= {p.name.value for p in (*self._fn_stack[-1].params.params,
                                                  *self._fn_stack[-1].params.kwonly_params)}
        taken = self._file_names | self._step_names_taken()
        name = tr._fresh("grad_step", taken) if self._fn_stack else "grad_step"
        step = tr.build_train_step(body, optimizer=site.optimizer, model=site.model,
                                   loop_names=loop_names - {site.model, site.optimizer},
                                   step_name=name, tree_mode=not self.data.aliasing,
                                   grads_out=ACC_GRADS,
                                   read_later=self._file_names if scaled else frozenset())
        if step is None:
            return None
        self.need("nnx", "jax", "jnp")
        self._acc.done.add(id(original_node))
        scan = self._scan_micro_steps(site, step, original_node, loop_names)
        if scan is not None:
            new_body, init, functions = scan.body, scan.init, [scan.function]
            self.diag(original_node, "accumulation", "info",
                      f"gradient accumulation: the loop collects the micro-batches; "
                      f"{scan.function.name.value} computes the micro-steps' gradients (a "
                      f"jax.lax.scan over the stacked batches, summed as torch sums .grad) and "
                      f"applies {site.optimizer}.update to the sum, in one compiled step")
        else:
            apply = self._apply_grads(site, loop_names)
            new_body, functions = step.body, [step.function, apply]
            self.diag(original_node, "accumulation", "info",
                      f"gradient accumulation: {name} computes each micro-step's gradients "
                      f"(jit-compiled), summed in the loop as torch sums .grad; "
                      f"{site.optimizer}.update applies the sum once after the loop")
            init = cst.parse_statement(f"{ACC_GRADS} = None\n")
        init = init.with_changes(leading_lines=node.leading_lines)
        loop = node.with_changes(leading_lines=[], body=node.body.with_changes(body=new_body))
        if scan is not None and len(self._for_stack) == 1 and not self._while_stack and (
                not self._class_stack) and len(self._fn_stack) <= 1 and not (
                self._shadowed(site.model) or self._shadowed(site.optimizer)) and (
                not self.data.distributed) and self.data.functional_ok(
                site.model, self.index.module_classes, self._scalar_param):
            # the loop around it, outermost in a scope that builds the model and the
            # optimizer (a function called once), may keep their state split (_functional_scan)
            self._acc.functional[id(self._for_stack[0])] = (site, scan, functions[0])
        if not self._fn_stack and not self._class_stack:
            self._top_steps.extend(functions)
        elif len(self._fn_stack) == 1 and not self._class_stack and not any(
                _free_names(f) - (self._module_names | STEP_GLOBALS) for f in functions):
            # a helper called once per step: its functions are compiled once, at the top level
            self._module_hoist.extend((self._fn_stack[0].name.value, f) for f in functions)
        elif self._for_stack:  # defined before the outermost loop of its function
            self._hoist.extend(functions)
        else:
            blank = [cst.EmptyLine(indent=False)]
            return cst.FlattenSentinel([
                functions[0].with_changes(leading_lines=[*node.leading_lines]),
                *(f.with_changes(leading_lines=blank) for f in functions[1:]),
                init.with_changes(leading_lines=blank), loop])
        return cst.FlattenSentinel([init, loop])

    def _scan_micro_steps(self, site, step, original_node, loop_names: set[str]):
        """The micro-steps, the clip and the update as one compiled step
        (passes/accum_scan.py), where nothing stands between the loop and the optimizer's
        step but the clip (in the optimizer's chain, or folded into the step) and statements
        the translation drops; None: the two-function route."""
        if site.ragged:
            return None
        local = self.training.optimizer_names.get(site.optimizer)
        in_chain = local is not None and local.clip is not None
        clip, guards = "", []

        def kind(stmt) -> str | None:
            first = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(
                stmt.body) == 1 else None
            if first is not None and id(first) in self._acc.dropped:
                return "drop"
            return "clip" if first is not None and self._acc.clips.get(id(first)) is site \
                else None

        for stmt in site.between:
            test = None
            if isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(
                    stmt.body, cst.IndentedBlock):
                # ``if grad_clip != 0.0:`` around the clip (nanoGPT): it goes where the clip is
                # in the optimizer's chain (a condition of names the loops do not assign)
                kinds = [kind(s) for s in stmt.body.body]
                if set(tr.names_of(stmt.test).used) & (loop_names | {site.model,
                                                                     site.optimizer}):
                    return None
                guards.append(stmt)
                test = code(stmt.test)
            else:
                kinds = [kind(stmt)]
            if None in kinds:
                return None
            if "clip" not in kinds or in_chain:
                continue
            if test is not None or set(tr.names_of(site.max_norm).used) & loop_names:
                return None
            clip = (f"    {{grads}}, _ = optax.clip_by_global_norm({code(site.max_norm)})"
                    f".update({{grads}}, optax.EmptyState())\n")
        name = tr._fresh("accum_step", self._file_names | self._step_names_taken())
        scan = accum_scan.build(step, original_node, model=site.model,
                                optimizer=site.optimizer, acc_grads=ACC_GRADS, name=name,
                                clip=clip, taken=set(self._file_names),
                                tree_mode=not self.data.aliasing)
        if scan is None:
            return None
        self._micro_names.add(name)
        self._acc.scans[id(site)] = scan.call
        self._acc.dropped_ifs |= {id(g) for g in guards}
        if clip:
            self._acc.folded.add(id(site))
            self.need("optax")
        self.need("np")
        return scan

    def _functional_scan(self, original_node, node):
        """The loop around a one-compiled-step accumulation (passes/accum_scan.py) that reads
        neither the model nor the optimizer but through the step (the learning rate set before
        it aside): the step becomes a ``jax.jit`` of their state, split once before the loop,
        donated and written back after it, the learning rate an argument, as a hand-written
        JAX program has it. (the new loop, (statements before it, after it)) or None."""
        pending = self._acc.functional.pop(id(original_node), None)
        if pending is None or original_node.orelse is not None:
            return None
        site, scan, placed = pending
        objects = {site.model, site.optimizer}
        defs = {f.name.value: f for f in findall(self._root, m.FunctionDef())}
        readers = {n for n, f in defs.items() if set(tr.names_of(f).used) & objects}
        while True:  # and the functions that call them
            more = {n for n, f in defs.items() if n not in readers and any(
                isinstance(c.func, cst.Name) and c.func.value in readers
                for c in findall(f, m.Call()))}
            if not more:
                break
            readers |= more
        found = accum_scan.functional_body(list(node.body.body), scan, model=site.model,
                                           optimizer=site.optimizer, readers=readers)
        if found is None:
            return None
        body, function = found
        self._top_steps[:] = [f for f in self._top_steps if f is not placed]
        self._module_hoist[:] = [(n, f) for n, f in self._module_hoist if f is not placed]
        self._hoist[:] = [f for f in self._hoist if f is not placed]
        self.need("jax", "jnp", "nnx", "partial")
        blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
        split = cst.parse_statement(
            f"{tr.GRAPHDEF}, {tr.STATE} = nnx.split(({site.model}, {site.optimizer}))\n")
        update = cst.parse_statement(
            f"nnx.update(({site.model}, {site.optimizer}), {tr.STATE})\n")
        return node.with_changes(body=node.body.with_changes(body=body)), (
            [split, function.with_changes(leading_lines=blank)], [update])

    def _apply_grads(self, site, loop_names: set[str]) -> cst.FunctionDef:
        """The jit-compiled update that ``optimizer.step()`` after the micro-steps becomes:
        it applies the summed gradients, clipped first where ``clip_grad_norm_`` stands
        unconditionally between the loop and the step (with a norm that the loops do not
        change): no eager optax call between the gradient steps and the update."""
        name = tr._fresh("apply_grads", self._file_names | self._step_names_taken())
        self._micro_names.add(name)
        local = self.training.optimizer_names.get(site.optimizer)
        clip = ""
        if site.max_norm is not None and site.clip_direct and not (
                local is not None and local.clip is not None) and not (
                set(tr.names_of(site.max_norm).used) & loop_names):
            clip = (f"    {ACC_GRADS}, _ = optax.clip_by_global_norm({code(site.max_norm)})"
                    f".update({ACC_GRADS}, optax.EmptyState())\n")
            self._acc.folded.add(id(site))
            self.need("optax")
        self._acc.applies[id(site)] = name
        return cst.parse_statement(
            f"{tr.nnx_jit(not self.data.aliasing)}\ndef {name}({site.model}, {site.optimizer}, "
            f"{ACC_GRADS}):\n{clip}    {site.optimizer}.update({site.model}, {ACC_GRADS})\n")

    def _loop_step_name(self) -> str:
        """``train_step``, or a fresh name where a step of a block (passes/rewrite_steps.py)
        already took it."""
        return tr._fresh("train_step", getattr(self, "_step_names", set()))

    def _step_names_taken(self) -> set[str]:
        if not hasattr(self, "_micro_names"):
            self._micro_names: set[str] = set()
        return self._micro_names | getattr(self, "_step_names", set())

    def _leave_for(self, original_node, updated_node):
        self._for_stack.pop()
        node = updated_node
        micro = self._micro_step_loop(original_node, node) if self._acc.loops else None
        if micro is not None:
            return micro
        lr_loop = self._lr_loop(original_node, node) if self._lr_loops else None
        if lr_loop is not None:
            return lr_loop
        t = self.training
        surround: tuple[list, list] | None = None  # a functional step: split / update
        functional = self._functional_scan(original_node, node)
        if functional is not None:
            node, surround = functional
        body = list(node.body.body)
        linen_body = self._lt_loop(original_node, node, body) if self.target.train_state \
            else None
        if linen_body is not None:
            node = node.with_changes(body=node.body.with_changes(body=linen_body))
        gan_body = self._gan_loop(original_node, body) if self.target.stateful_modules else (
            self._lt_gan_loop(original_node, node, body) if self.target.train_state
            and linen_body is None and not self._lt_marked else None)
        if gan_body is not None:
            node = node.with_changes(body=node.body.with_changes(body=gan_body))
        body = self._summed_loop_body(original_node, body) if (
            self.target.stateful_modules and gan_body is None) else body
        for name in t.optimizer_names if self.target.stateful_modules and gan_body is None and (
                functional is None) else ():
            model = t.model_of(name)
            if model is None:
                continue
            outer = self._for_stack[0] if self._for_stack else original_node
            loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
            site = t.optimizer_names[name]
            kwargs = {"optimizer": name, "model": model, "loop_names": loop_names,
                      "step_name": self._loop_step_name(), "accumulate": site.accumulate is not None}
            joint = tr.joint_pairs(body, name, {n: t.model_of(n) for n in t.optimizer_names})
            if joint:  # one loss, an optimizer per model (the seq2seq tutorial's two)
                kwargs["joint"] = joint
            if group := t.group_of(name):  # one optimizer of several models' parameters
                kwargs["group"] = group
            step = tr.build_train_step(body, functional=True, **kwargs) if (
                not group and self.data.functional_ok(model, self.index.module_classes,
                                                      self._scalar_param)) else None
            around = tr.functional_loop(step, model, name) if step is not None else None
            if around is None:  # the loop reads the model between steps: the nnx.jit step
                step = tr.build_train_step(body, tree_mode=not self.data.aliasing, **kwargs)
            else:
                self.need("jax", "partial")
            stale = self._stale_models(step.function, model, original_node) if (
                step is not None) else []
            crossing = self._crossing_loop(original_node, body, name, model, stale,
                                           loop_names) if stale else None
            if crossing is not None:
                node = node.with_changes(body=node.body.with_changes(body=crossing))
                break
            if stale:
                self.diag(original_node, "training-loop", "error",
                          self._stale_message(stale, model))
                break
            free = _free_names(step.function) - (self._module_names | STEP_GLOBALS) if (
                step is not None) else set()
            hoisted = hoisted_step(self, step.function, free) if step is not None and (
                self.hoist_steps and self._per_call_trainer(name)) else None
            module_hoist = step is not None and self.hoist_steps and self._per_call_trainer(
                name) and (not free or hoisted is not None)
            if around is not None and not module_hoist and not self._for_stack and (
                    not self._while_stack):
                # the outermost loop of its scope: the split runs once, just before it, and
                # the step defined after the split closes over the graphdef (a static argument
                # would be hashed by jax.jit on every call)
                closed = tr.build_train_step(body, functional=True, closure=True, **kwargs)
                closed_around = (tr.functional_loop(closed, model, name)
                                 if closed is not None else None)
                if closed_around is not None:
                    step, around = closed, closed_around
            if step is not None:
                self.need("nnx")
                if step.record is not None:
                    self.train_steps.append(step.record)
                new_body = around[1] if around is not None else step.body
                batch = dt.loop_names(original_node.target)
                if self.data.distributed and batch and isinstance(original_node.iter, (
                        cst.Name, cst.Call)):
                    # the batch is split over the devices; the replicated parameters follow
                    self.need("jax", "sharding")
                    self._hoist.extend(dt.mesh_statements())
                    if self.data.shard == "params":
                        self._hoist.extend(dt.shard_state(model, name))
                    elif around is not None:
                        self._hoist.extend(dt.replicate_state(model, name))
                    new_body = [dt.shard_batch(batch), *new_body]
                if module_hoist:
                    # train(model, loader, optimizer) runs once per epoch: a step defined in it
                    # would be a new function, compiled again, at every call (what it reads
                    # of train's names passed in: passes/hoist_args.py)
                    function, names = hoisted or (step.function, [])
                    new_body = passing(new_body, step.function.name.value, names)
                    self._module_hoist.append((self._fn_stack[0].name.value, function))
                elif not step.closure:
                    self._hoist.append(step.function)
                node = node.with_changes(body=node.body.with_changes(body=new_body))
                if around is not None:
                    surround = (around[0], around[2])
                if step.closure:  # defined after the split it closes over
                    blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
                    surround = ([*around[0], step.function.with_changes(leading_lines=blank)],
                                around[2])
                break
        else:
            if linen_body is None and gan_body is None and any(
                    tr._is_method_stmt(s, None, "backward")
                                          for s in body) and not self._lt_marked:
                self.diag(original_node, "training-loop", "error",
                          "training loop not recognised (one loss.backward() and one "
                          "optimizer.step() in the same loop body): write the step as "
                          f"{self.target.train_step_form}" if self.target.train_step_form
                          else f"training loops: translated for --target nnx so far "
                          f"({self.target.name} is planned)")
        self._lt_marked = False
        pre, post = surround if surround is not None else ([], [])
        outermost = not self._for_stack and not (self.target.train_state and self._while_stack)
        if self.target.train_state and linen_body is not None and not outermost and (
                self._model_read_after(original_node)):
            # the step's loop in an epoch loop: what the epoch does next (an evaluation)
            # reads this epoch's variables
            post = [*post, lt.final_variables(self._lt_batch_stats)]
        if self.target.train_state and outermost and self._lt_post:
            post, self._lt_post = [*post, *self._lt_post], []
        if outermost and self._hoist:
            hoisted, self._hoist = self._hoist, []
            blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
            lines = list(node.leading_lines)
            while lines and lines[0].comment is None:
                lines.pop(0)
            hoisted = [h.with_changes(leading_lines=blank) if i == 0 or isinstance(
                h, cst.BaseCompoundStatement) or isinstance(hoisted[i - 1],
                                                            cst.BaseCompoundStatement)
                else h for i, h in enumerate(hoisted)]
            if pre:
                pre = [pre[0].with_changes(leading_lines=[*blank, *lines]), *pre[1:]]
                node = node.with_changes(leading_lines=_after(pre, blank))
            else:
                node = node.with_changes(leading_lines=[*blank, *lines])
            return cst.FlattenSentinel([*hoisted, *pre, node, *post])
        if pre:
            blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
            pre = [pre[0].with_changes(leading_lines=node.leading_lines), *pre[1:]]
            return cst.FlattenSentinel([*pre, node.with_changes(
                leading_lines=_after(pre, blank)), *post])
        return cst.FlattenSentinel([node, *post]) if post else node

    def _model_read_after(self, loop: cst.For) -> bool:
        """Whether a statement after ``loop`` in the loop around it reads a model."""
        models = set(self._model_names())
        for outer in (*self._for_stack[-1:], *self._while_stack[-1:]):
            body = list(outer.body.body)
            if loop in body:
                return any(n.value in models for s in body[body.index(loop) + 1:]
                           for n in findall(s, m.Name()))
        return False

    def _summed_loop_body(self, original_node, body: list) -> list:
        """A loop body whose one optimizer steps after several ``backward()`` calls (nothing
        between them touching the gradients): the gradient of the sum of the losses, as in
        a block (passes/rewrite_steps.py, "Several backward() calls")."""
        t = self.training
        orig = list(original_node.body.body)
        stepped = [n for n in t.optimizer_names if any(
            tr._is_method_stmt(s, {n}, "step") for s in orig)]
        if len(stepped) != 1 or t.optimizer_names[stepped[0]].accumulate is not None or (
                not gs.summable_backwards(orig)):
            return body
        at = [i for i, s in enumerate(orig) if tr._is_method_stmt(s, None, "backward")]
        if not any(tr._is_method_stmt(s, stepped, "step") for s in orig[at[-1]:]):
            return body
        taken = self._file_names | self._step_names_taken()
        summed = gs.summed_region(body, taken)
        if summed is None:
            return body
        self._file_names |= taken
        return summed[0]

    def _gan_loop(self, original_node, body) -> list | None:
        """A GAN iteration (passes/gan_step.py): the loop's new body, the step hoisted."""
        t = self.training
        orig = list(original_node.body.body)
        stepped = [n for n in t.optimizer_names if t.model_of(n) is not None and any(
            tr._is_method_stmt(s, {n}, "step") for s in orig)]
        if len(stepped) != 2 or self.data.aliasing:
            return None
        first = min(stepped, key=lambda n: next(i for i, s in enumerate(orig)
                                                if tr._is_method_stmt(s, {n}, "step")))
        d_opt = first
        g_opt = stepped[1] if stepped[0] == first else stepped[0]
        d_model, g_model = t.model_of(d_opt), t.model_of(g_opt)
        if d_model == g_model or not gan.check_gan_source(
                orig, d_opt=d_opt, d_model=d_model, g_opt=g_opt, g_model=g_model):
            return None
        outer = self._for_stack[0] if self._for_stack else original_node
        loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
        step = gan.build_gan_step(body, d_opt=d_opt, d_model=d_model, g_opt=g_opt,
                                  g_model=g_model, loop_names=loop_names,
                                  used_outside=gan.names_outside(outer, original_node),
                                  step_name=self._loop_step_name(), tree_mode=True)
        if step is None:
            return None
        self.need("nnx")
        self._hoist.append(step.function)
        self.diag(original_node, "training-loop", "info",
                  f"GAN step: {d_opt} (on {d_model}) then {g_opt} (on {g_model}) in one "
                  f"jit-compiled step; {g_model}'s forward runs once, under nnx.vjp")
        return step.body

    def _crossing_loop(self, original_node, body: list, opt: str, model: str,
                       others: list[str], loop_names: set[str]) -> list | None:
        """A loop body whose step of ``model`` differentiates through its forward across
        another optimizer's step (passes/crossing_step.py): the new body, the forward and
        the step hoisted; None when it does not have that shape."""
        t = self.training
        orig = list(original_node.body.body)
        forward = [gan._g_forward(s, model) for s in orig]
        fakes = {f[0] for f in forward if f is not None}
        if self.data.aliasing or len(fakes) != 1 or not cs.grads_isolated(
                self._root, orig, optimizer=opt, model=model, fake=next(iter(fakes))):
            return None
        stepping = {n: t.model_of(n) for n in t.optimizer_names if t.model_of(n) in others}
        if set(stepping.values()) != set(others) or not cs.others_zeroed(
                self._root, orig, stepping):
            return None
        outer = self._for_stack[0] if self._for_stack else original_node
        functions = {f.name.value for f in findall(self._root, m.FunctionDef())}
        step = cs.build_crossing_step(
            body, optimizer=opt, model=model, others=others, loop_names=loop_names,
            taken=self._file_names | self._step_names_taken(),
            read_later=gan.names_outside(outer, original_node),
            step_name=self._loop_step_name(), tree_mode=True, functions=functions)
        if step is None or self._stale_models(step.step, model, original_node):
            return None
        self.need("nnx")
        self._hoist.extend([step.forward, step.step])
        self.diag(original_node, "training-loop", "info",
                  f"{model}'s forward is recorded as torch records its graph (nnx.vjp, its "
                  f"pullback kept until the backward that crosses {', '.join(others)}'s "
                  f"step); {opt}'s step pulls the loss's gradient back through it, "
                  f"jit-compiled")
        return step.body

    def visit_While(self, node: cst.While) -> None:
        self._while_stack.append(node)

    def leave_While(self, original_node, updated_node):
        out = self._leave_while(original_node, updated_node)
        if not self.target.train_state or self._for_stack or self._while_stack or not (
                self._hoist or self._lt_post) or not isinstance(out, cst.While):
            return out
        # linen, an epoch loop written as a while around the step's for loop: the step,
        # model.init and the TrainState go before it (once), the variables after it
        hoisted, post, blank = self._lt_take_hoisted()
        lines = list(out.leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        return cst.FlattenSentinel([*hoisted, out.with_changes(leading_lines=[*blank, *lines]),
                                    *post])

    def _leave_while(self, original_node, updated_node):
        """``while True:`` around a train step (a minGPT-style Trainer.run: next(data_iter),
        forward, backward, clip, step, callbacks, break after max_iters): the step becomes a
        jitted function defined just before the loop."""
        self._while_stack.pop()
        micro = self._micro_step_loop(original_node, updated_node) if self._acc.loops else None
        if micro is not None:
            return micro
        clip = self._while_clips.pop(id(original_node), None)
        t = self.training
        body = list(updated_node.body.body)
        if self.target.train_state and not self._for_stack and not self._while_stack and (
                clip is None):
            loop = self._lt_while(original_node, updated_node, body)
            if loop is not None:
                return loop
        if not self.target.stateful_modules or self._for_stack and any(
                "clip_grad" in code(s) for s in body):
            marked = self._lt_marked and not self._for_stack  # (linen: marked by _lt_loop)
            if not self._for_stack:
                self._lt_marked = False
            if not self._for_stack and any("backward()" in code(s) for s in body) and (
                    not marked):
                self.diag(original_node, "training-loop", "error",
                          "a train step in a while loop: translated for --target nnx only "
                          "so far unless the loop body holds one backward() and one step() "
                          "and the loop stands in no for loop" if self.target.train_state else
                          f"a train step in a while loop: translated for --target nnx only "
                          f"so far ({self.target.name} is planned)")
            return self._unclipped(updated_node, clip)
        clip_stmt = next((s for s in body if clip is not None and "clip_grad_norm_(" in code(s)),
                         None)
        for name in t.optimizer_names:
            model = t.model_of(name)
            # a step every k batches (`if (i + 1) % k == 0: optimizer.step()`): the optimizer
            # is optax.MultiSteps, updated at every batch, as in a for loop
            every_k = t.optimizer_names[name].accumulate is not None
            if model is None or not any(tr._is_method_stmt(s, {name}, "step") or (
                    every_k and isinstance(s, cst.If) and not s.orelse
                    and len(s.body.body) == 1 and tr._is_method_stmt(s.body.body[0], {name},
                                                                     "step"))
                    for s in body):
                continue
            loop_names = tr.loop_assigned_names(original_node)
            if self._while_stack:  # names of the enclosing while (the epoch) are passed too
                loop_names |= tr.loop_assigned_names(self._while_stack[0])
            if self._for_stack:  # ... and those of the enclosing for loops
                loop_names |= tr.loop_assigned_names(self._for_stack[0])
            kwargs = {"optimizer": name, "model": model, "loop_names": loop_names,
                      "accumulate": every_k, "step_name": self._loop_step_name(),
                      "clip": clip_stmt}
            if group := t.group_of(name):  # one optimizer of several models' parameters
                kwargs["group"] = group
            split = None if group else self._split_while(original_node, body, model, kwargs,
                                                         updated_node.test)
            if split is not None:
                return split
            step = tr.build_train_step(body, tree_mode=not self.data.aliasing, **kwargs)
            if step is None:
                break
            stale = self._stale_models(step.function, model, original_node)
            if stale:
                self.diag(original_node, "training-loop", "error",
                          self._stale_message(stale, model))
                return self._unclipped(updated_node, clip)
            self.need("nnx")
            if step.record is not None:
                self.train_steps.append(step.record)
            if clip_stmt is not None:
                self.need("optax")
            loop = updated_node.with_changes(body=updated_node.body.with_changes(body=step.body))
            if self._for_stack:
                # a while loop in a for loop (batches drawn with next() in each epoch): the
                # step is defined once, before the outermost for loop, not at every epoch
                self._hoist.append(step.function)
                return loop
            blank = [cst.EmptyLine(indent=False)]
            fn = step.function.with_changes(leading_lines=blank)
            return cst.FlattenSentinel([fn, loop.with_changes(leading_lines=blank)])
        if any(tr._is_method_stmt(s, None, "backward") for s in body) or any(
                "backward()" in code(s) for s in body):
            self.diag(original_node, "training-loop", "error",
                      "training loop not recognised (one loss.backward() and one "
                      "optimizer.step() in the same loop body): write the step as "
                      "nnx.value_and_grad + optimizer.update")
        return self._unclipped(updated_node, clip)

    def _split_while(self, original_node, body: list, model: str, kwargs: dict,
                     test: cst.BaseExpression):
        """The outermost ``while`` loop of its scope around a train step (minGPT's
        ``Trainer.run``) whose other statements read neither the model nor the optimizer,
        by name, through ``self`` or through the methods and callbacks they call
        (analysis/callbacks.py): the step is a ``jax.jit`` of their state split once before
        the loop, donated to each call and written back after it, the form of the for loops'
        steps. None where that is not shown (the ``nnx.jit`` step then)."""
        optimizer = kwargs["optimizer"]
        if self._for_stack or self._while_stack or original_node.orelse is not None or (
                self.data.distributed) or findall(original_node.body, m.Return()):
            return None
        step = tr.build_train_step(body, functional=True, closure=True, **kwargs)
        around = tr.functional_loop(step, model, optimizer) if step is not None else None
        if around is None:
            return None
        cls = next((s for s in self._root.body if isinstance(s, cst.ClassDef) and (
            self._class_stack and s.name.value == self._class_stack[-1])), None)
        fn = self._fn_stack[-1] if self._fn_stack else self._root
        reads = cb.LoopReads(self._root, cls, fn, {model, optimizer},
                             set(self.index.module_classes))
        if not reads.only_state([original_node.test, *(s for s in around[1]
                                                       if s is not step.call)]) or (
                self._stale_models(step.function, model, original_node)):
            return None
        self.need("nnx", "jax", "partial")
        if step.record is not None:
            self.train_steps.append(step.record)
        if kwargs["clip"] is not None:
            self.need("optax")
        blank = [cst.EmptyLine(indent=False)]
        loop = original_node.with_changes(test=test, body=original_node.body.with_changes(
            body=around[1]), leading_lines=blank)  # (the test translated: xs.size(0))
        return cst.FlattenSentinel([*around[0], step.function.with_changes(
            leading_lines=blank), loop, *around[2]])

    def visit_For(self, node: cst.For) -> bool | None:
        self._for_stack.append(node)
        self._bind_loop_layout(node.target, node.iter)
        loop = self._parameter_init_loop(node)
        if loop is not None:
            self._param_init_loops[id(node)] = loop
            return False  # (its initialisers are translated whole, not call by call)
        return None

    def _parameter_init_loop(self, node: cst.For) -> cst.For | None:
        """``for p in model.parameters(): [if <cond on p>:] nn.init.<fn>(p, ...) [else: ...]``
        in an NNX scope with a key stream (a builder's rngs): the loop over the model's
        nnx.Param variables that writes each (passes/param_inits.py); None otherwise."""
        if not (self.target.stateful_modules and not self.target.intermediate
                and self._rngs_scope and self._rngs_scope[-1] and node.orelse is None
                and isinstance(node.target, cst.Name) and m.matches(node.iter, m.Call(
                    func=m.Attribute(attr=m.Name("parameters")), args=[]))
                and self._is_module_expr(node.iter.func.value)
                and isinstance(node.body, cst.IndentedBlock) and len(node.body.body) == 1):
            return None
        p = node.target.value

        def assign(block) -> str | None:
            stmts = block.body if isinstance(block, cst.IndentedBlock) else []
            if len(stmts) != 1 or not m.matches(stmts[0], m.SimpleStatementLine(
                    body=[m.Expr(value=m.Call())])):
                return None
            call = stmts[0].body[0].value
            found = pinit.as_init_call(call, p, self.q(call.func))
            if found is None:
                return None
            value = pinit.init_value(found[0], found[1], "rngs.params()", p)
            if "kernel else" in value:
                return ('kernel = path[-1] == "kernel"  # (a Linear or Conv kernel: '
                        'transposed, its fans on its last two axes)\n'
                        f"{p}[...] = {value}")
            return f"{p}[...] = {value}"

        stmt = node.body.body[0]
        param = f"isinstance({p}, nnx.Param)"
        try:
            if isinstance(stmt, cst.If):
                first = assign(stmt.body)
                orelse = stmt.orelse
                second = None if orelse is None else assign(orelse.body) if isinstance(
                    orelse, cst.Else) else None
                if first is None or orelse is not None and second is None:
                    return None
                test = tr.predicate_text(stmt.test)
                if isinstance(stmt.test, cst.BooleanOperation):
                    test = f"({test})"
                lines = [f"if {param} and {test}:", *_indent(first)]
                if second is not None:
                    lines += [f"elif {param}:", *_indent(second)]
            else:
                only = assign(node.body)
                if only is None:
                    return None
                lines = [f"if {param}:", *_indent(only)]
        except Untranslatable:
            return None
        self.need("nnx", "jax", "jnp")
        body = "\n".join("    " + line for line in lines)
        loop = cst.parse_statement(f"for path, {p} in nnx.iter_graph("
                                   f"{code(node.iter.func.value)}):\n{body}\n")
        assert isinstance(loop, cst.For)
        return loop.with_changes(leading_lines=node.leading_lines)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_loop_layout(node.target, node.iter)  # [blk(x) for blk in self.blocks]


def _indent(text: str) -> list[str]:
    return ["    " + line for line in text.splitlines()]
