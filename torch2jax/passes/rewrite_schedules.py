"""Optimizers and schedules: torch.optim constructors -> optax, learning-rate schedulers,
ReduceLROnPlateau, and the training bookkeeping used as statements (seeding, zero_grad,
scheduler steps, clipping).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.training import (
    CLIPS,
    DROPPED_SEEDS,
    SEEDS,
)
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    call,
    code,
    expr,
    try_literal,
)
from torch2jax.passes.rewrite_support import (
    GRAD_MODES,
    _apply_loop,
)


def _folded(site) -> bool:
    """The optimizer's scheduler is stepped once per update in the optimizer's scope: its
    schedule is folded into the optimizer's transformation (a function of the update count)."""
    sched = site.scheduler
    return bool(sched is not None and sched.per_update and sched.scope == site.scope
                and site.name is not None and not sched.qualname.endswith("ReduceLROnPlateau"))


def decide_folded(optimizers) -> None:
    """Decide every scheduler's folding before the rewrite: a ``scheduler.step()`` in a
    function defined before the optimizer is built (``train_one_epoch(model, loader,
    optimizer, scheduler, ...)`` above ``main()``) is rewritten first and must know it."""
    for site in optimizers:
        if site.scheduler is not None and _folded(site):
            site.scheduler.inline = True


class SchedulesMixin:
    def _nnx_only(self, what: str) -> None:
        if not self.target.stateful_modules:
            raise Untranslatable(f"{what}: translated for --target nnx so far "
                                 f"({self.target.name} is planned)", rule="target")

    def _training_assign(self, original_node, updated_node, site):
        from torch2jax.analysis.training import SchedulerSite

        if self.target.stateful_modules:
            self._nnx_only("optimizers and schedulers")
        if isinstance(site, SchedulerSite):
            return self._scheduler(original_node, updated_node, site)
        value = self._optimizer(original_node, updated_node.value, site)
        new = updated_node.with_changes(value=value)
        sched = site.scheduler
        if sched is not None and sched.inline:
            self._deferred[sched.name] = new
            return cst.RemoveFromParent()
        return new

    def _optimizer(self, original_node, value: cst.Call, site) -> cst.BaseExpression:
        try:
            from torch2jax.training import optim
        except ImportError:  # pragma: no cover - the package is part of torch2jax
            raise Untranslatable(f"no translation for {site.qualname}") from None
        value = self._drop_noop_kwargs(value)
        if site.clip_refused:
            raise Untranslatable(site.clip_refused, rule="clip_grad_norm_")
        opt = optim.translate_optimizer(value, site.qualname)
        overrides: dict[str, cst.BaseExpression] = {}
        mask = None
        sched = site.scheduler
        # the learning rate set by hand (param_groups), or the optimizer returned to another
        # file (configure_optimizers), whose loop may set it: an injected hyperparameter
        inline = _folded(site)
        inject = (sched is not None and not inline) or sched is None and (
            site.lr_set or site.returned and not site.aliases)
        multi = None
        wrt = None
        if site.groups is not None and len(site.groups) == 1 and (
                site.groups[0].paths is not None and not site.groups[0].options) and (
                self.target.stateful_modules and not self.target.intermediate):
            # one submodule's parameters (a new head fine-tuned: SGD(model.fc.parameters())):
            # the optimizer holds and updates those only, as torch's does
            wrt = expr(f"nnx.All(nnx.Param, lambda path, _: "
                       f"{tr.group_test(site.groups[0])})")
            self.diag(original_node, "param-groups", "info",
                      "the optimizer over a submodule's parameters holds those only: "
                      "nnx.Optimizer(..., wrt=...) selects them by torch's parameter names")
        elif site.groups is not None:
            if not self.target.stateful_modules and any(
                    g.names is not None or g.paths is not None for g in site.groups):
                if any(g.names is not None for g in site.groups):
                    raise Untranslatable("parameter groups selected by torch's parameter "
                                         f"names: translated for NNX only, not "
                                         f"{self.target.name}", rule="param-groups")
                raise Untranslatable("parameter groups selected by submodule or by a list of "
                                     "parameters: translated for NNX and equinox, not "
                                     f"{self.target.name}", rule="param-groups")
            try:
                overrides, mask = tr.group_mask(site.groups, opt)
            except Untranslatable as why:
                if sched is not None or inject:
                    raise Untranslatable(f"{why}; per-group options with a learning rate "
                                         "scheduled or set by hand are not translated",
                                         rule="param-groups") from None
                multi = tr.group_transform(site.groups, opt)
            self.diag(original_node, "param-groups", "info", (
                f"parameter groups became optax.multi_transform ({len(site.groups)} "
                "groups: one transform per group, a label per parameter)" if multi is not None
                else
                "parameter groups became an optax mask") + "; the statements that only "
                "built the groups were removed (a print of the group sizes keeps the "
                "lists it reads, taken from the model's parameters)")
        elif site.groups_problem:
            raise Untranslatable(site.groups_problem, rule="param-groups")
        if sched is not None:
            sched.inline = inline
        if site.name:  # (aliases in other scopes read the lr from the optimizer)
            self._opt_lr[site.name] = opt.lr
            if multi is not None:
                self._group_lrs[site.name] = [g.options.get("lr", opt.lr) for g in site.groups]
        clip = site.clip
        # OneCycleLR's cycle_momentum: the momentum / beta1 schedule is injected with the
        # optimizer (the scheduler line itself only gives the learning-rate schedule)
        momentum = self._cycled_momentum(sched, opt) if inline else None
        if multi is not None:
            tx = multi
        elif inject and clip is not None:
            # the injected hyperparameters must be the outermost state: clip inside
            tx = opt.build(lr=cst.Name("learning_rate"), overrides=overrides, mask=mask)
        else:
            tx = opt.build(lr=cst.Name(sched.name) if inline else None, overrides=overrides,
                           mask=mask, inject=inject, momentum=momentum)
        if clip is not None:
            kind, limit = clip
            tx = (optim.with_clipping(tx, max_norm=limit) if kind == "norm"
                  else optim.with_clipping(tx, clip_value=limit))
        if site.accumulate is not None:
            if inject:
                raise Untranslatable("gradient accumulation with a learning rate set outside "
                                     "the update (scheduler stepped per epoch)",
                                     rule="accumulation")
            # torch sums the gradients of the k backward() calls (the loss is usually divided
            # by k already): MultiSteps without averaging
            tx = expr("optax.MultiSteps({tx}, every_k_schedule={k}, use_grad_mean=False)",
                      tx=tx, k=site.accumulate)
            self.diag(original_node, "accumulation", "info",
                      "gradient accumulation became optax.MultiSteps: the update is applied "
                      "every k steps, with the sum of the k gradients (torch differs when an "
                      "epoch's batch count is not a multiple of k and the counter restarts)")
        if clip is not None and inject:
            lr = overrides.get("lr", opt.lr)
            tx = expr("optax.inject_hyperparams(lambda learning_rate: {tx})"
                      "(learning_rate={lr})", tx=tx, lr=lr)
        for severity, msg in opt.notes:
            self.diag(original_node, site.qualname, severity, msg)
        model = site.model or "model"
        if site.group and not self.target.stateful_modules:
            raise Untranslatable("one optimizer over several models' parameters (NNX's "
                                 "nnx.Optimizer over their tuple; not written for this target)",
                                 rule="param-groups")
        if self.target.train_state:  # the optax transform; the TrainState is made before the loop
            self.need("optax")
            self._note_imports(tx)
            return tx
        self.need("nnx", "optax")
        out = tr.optimizer_object(model, tx, wrt, site.group)
        self._note_imports(out)
        return out

    def _cycled_momentum(self, sched, opt) -> cst.BaseExpression | None:
        """The momentum / beta1 schedule of a scheduler folded into the optimizer (OneCycleLR
        with cycle_momentum), translated ahead of the scheduler's own line; None when it has
        none or cannot be translated (the scheduler's line reports why)."""
        from torch2jax.training import optim

        mixin = self

        class _Lengths(cst.CSTTransformer):
            # steps_per_epoch=len(loader): read as the scheduler's own line reads it (a loader
            # shuffled per epoch is a function of the epoch there)
            def leave_Call(self, original_node, updated_node):
                return mixin._epoch_loader_len(original_node, updated_node) or updated_node

        try:
            schedule = optim.translate_scheduler(sched.call.visit(_Lengths()), sched.qualname,
                                                 opt.lr, lambda e: self._schedules.get(code(e)))
        except Untranslatable:
            return None
        return schedule.momentum

    def _scheduler(self, original_node, updated_node, sched):
        from torch2jax.training import optim

        base = self._opt_lr.get(sched.optimizer or "")
        before: list[cst.BaseStatement] = []
        if base is None and sched.part:
            raise Untranslatable("a scheduler combined by another one, on an optimizer built "
                                 "elsewhere", rule=sched.qualname)
        if base is None:
            # the optimizer was built elsewhere (configure_optimizers): read its lr
            base_name = f"{sched.name}_base_lr"
            before.append(cst.parse_statement(
                f"{base_name} = {self._lr_slot(sched.optimizer)}\n"))
            base = cst.Name(base_name)
        schedule = optim.translate_scheduler(updated_node.value, sched.qualname, base,
                                             lambda e: self._schedules.get(code(e)))
        if schedule.plateau is not None:
            return self._plateau(original_node, updated_node, sched, schedule, base, before)
        if schedule.fn is None:
            raise Untranslatable(f"{sched.qualname}: no schedule", rule=sched.qualname)
        if schedule.momentum is not None and not sched.inline:
            raise Untranslatable(f"{sched.qualname}: cycle_momentum=True with a scheduler "
                                 "stepped other than after every optimizer step: only the "
                                 "learning rate is set at each step(), the momentum / beta1 "
                                 "would stay constant (pass cycle_momentum=False, or step it "
                                 "after every update)", rule=sched.qualname)
        self._schedules[sched.name] = schedule
        for severity, msg in schedule.notes:
            self.diag(original_node, sched.qualname, severity, msg)
        new = updated_node.with_changes(value=schedule.fn)
        self._note_imports(schedule.fn)
        after: list[cst.BaseSmallStatement] = []
        if sched.part:
            pass
        elif sched.inline:
            deferred = self._deferred.pop(sched.name, None)
            if deferred is not None:
                after.append(deferred)
        elif sched.optimizer:
            # the optimizer's learning rate is a hyperparameter set where step() was called
            after.append(cst.parse_statement(f"{self._steps(sched.name)} = 0\n").body[0])
            after.append(cst.parse_statement(
                f"{self._lr_slot(sched.optimizer)} = jnp.float32({sched.name}(0))\n").body[0])
            self.need("jnp")
            self.diag(original_node, sched.qualname, "info",
                      "scheduler stepped other than after every optimizer step: the learning "
                      "rate is an optax.inject_hyperparams hyperparameter set at each step()")
        if self.target.train_state and not sched.inline and not sched.part and sched.optimizer:
            # the learning rate lives in the TrainState's optimizer state: set once it exists
            self._lt_after_state.extend([*before, *(cst.SimpleStatementLine(body=[a])
                                                    for a in after)])
            before, after = [], []
        if self._pending:
            self._pending[-1].before.extend(before)
            if after:
                self._pending[-1].after.extend(cst.SimpleStatementLine(body=[a]) for a in after)
        return new

    def _lr_slot(self, optimizer: str, quote: str = '"') -> str:
        return self.target.lr_slot(optimizer, quote)

    def _plateau(self, original_node, updated_node, sched, schedule, base, before):
        """ReduceLROnPlateau: optax's transform keeps the scale in its state; the script steps
        it with the metric where torch did and sets the injected learning rate from it."""
        if sched.inline or sched.part or not sched.optimizer:
            raise Untranslatable("ReduceLROnPlateau stepped with every update or combined with "
                                 "another scheduler", rule=sched.qualname)
        self._schedules[sched.name] = schedule
        for severity, msg in schedule.notes:
            self.diag(original_node, sched.qualname, severity, msg)
        base_code = code(base)
        if not isinstance(base, cst.Name):
            base_code = f"{sched.name}_base_lr"
            before.append(cst.parse_statement(f"{base_code} = {code(base)}\n"))
        self._note_imports(schedule.plateau)
        after = [cst.parse_statement(f"{sched.name}_state = {sched.name}.init(None)\n")]
        if self._pending:
            self._pending[-1].before.extend(before)
            self._pending[-1].after.extend(after)
        self._plateaus[sched.name] = (schedule, base_code)
        return updated_node.with_changes(value=schedule.plateau)

    def _seed_numpy(self, original_node, seed: cst.BaseExpression) -> None:
        """``np.random.seed(s)`` before the key of ``torch.manual_seed(s)``: a dataset of the
        program draws from numpy's global generator in torch's place (passes/host_data.py), or
        a loader its order's seed (passes/data.py's ``host_seed``), so torch's seed seeds it
        too, wherever the program seeds. A seed computed by a call
        (evaluated twice, it could differ) is not repeated: the line is marked."""
        if m.findall(seed, m.Call(func=m.DoesNotMatch(m.Name("int")))):
            self.diag(original_node, "seed", "error", "the seed is computed by a call: numpy's "
                      "global generator, which the program's host-side draws come from in "
                      "torch's place, is not seeded with it (bind the seed to a name first)")
            return
        self.need("np")
        self._pending[-1].before.append(cst.SimpleStatementLine(
            [cst.Expr(call("np.random.seed", arg(seed)))]))

    def _training_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """Seeding, gradient bookkeeping and scheduler steps used as statements."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        q = self.q(value.func)
        t = self.training
        checkpoint = self._checkpoint_statement(original_node, updated_node)
        if checkpoint is not None:
            return checkpoint
        if (q or "").endswith("._log_api_usage_once") or m.matches(
                value.func, m.Name("_log_api_usage_once")):
            return cst.RemoveFromParent()  # torch's usage logging
        if q and q.startswith("torch.nn.init."):
            try:
                self._nnx_only("torch.nn.init")
                return self._init_statement(original_node, updated_node, q)
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or q, "error", exc.message)
                return updated_node
        filled = self._param_fill_statement(original_node, updated_node)
        if filled is not None:
            return filled
        init_fn = m.Attribute(value=m.Name("self"))
        if (m.matches(value, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("apply")),
                                    args=[m.Arg(init_fn | m.Call(
                                        func=m.Name("partial") | m.Attribute(attr=m.Name(
                                            "partial")), args=[m.Arg(init_fn, keyword=None),
                                                               m.ZeroOrMore()]))]))
                and self.in_module_class()):
            # self.apply(self._init_weights): every submodule, children first, then self;
            # self.apply(partial(self._init_weights, flag=flag)) likewise
            method = value.args[0].value
            method = method if isinstance(method, cst.Attribute) else method.args[0].value
            if self.target.setup_modules and (
                    self.current_class, code(method.attr)) in self._lt_init_fns:
                self.diag(original_node, "init", "info", "self.apply(init function) -> the "
                          "layers' kernel_init / bias_init / embedding_init arguments")
                return cst.RemoveFromParent()
            if not self.target.stateful_modules:
                self.diag(original_node, "target", "error", "self.apply(init_fn): translated "
                          f"for --target nnx so far ({self.target.name} is planned)")
                return updated_node
            fn = code(updated_node.value.args[0].value)
            rngs = "rngs" if self._rngs_scope and self._rngs_scope[-1] else None
            bound = updated_node.value.args[0].value
            keywords = ""
            if isinstance(bound, cst.Call) and all(a.keyword for a in bound.args[1:]):
                # partial(self._init_weights, flag=flag): the method, given those keywords
                fn = code(bound.args[0].value)
                keywords = "".join(", " + code(a.with_changes(
                    comma=cst.MaybeSentinel.DEFAULT)) for a in bound.args[1:])
            self.need("nnx")
            loop = _apply_loop("self", fn, rngs, keywords)
            self._pending[-1].after.append(loop.with_changes(
                leading_lines=self._pending_line_comments()))
            return cst.RemoveFromParent()
        if (m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("apply")),
                                    args=[m.Arg(m.Name())]))
                and (value.func.value.value in self.training.model_vars
                     or self.values is not None and self.values.kind(
                         original_node.value.func.value) == vk.Kind.MODULE)
                and not self.in_module_class()):
            return self._model_apply(original_node, updated_node)
        if q in SEEDS:
            if q == "torch.seed" or not updated_node.value.args:
                self.diag(original_node, q, "error", "torch.seed() draws a non-deterministic "
                          "seed: pass one to jax.random.key")
                return updated_node
            self._key_scopes[-1].has_key = True
            self.need("jax")
            if self.data.numpy_seeded:
                self._seed_numpy(original_node, updated_node.value.args[0].value)
            return tr.seed_statement(updated_node.value.args[0].value)
        if q in GRAD_MODES:
            self.diag(original_node, q, "info", f"{q}() removed: JAX only differentiates what "
                      "runs inside jax.grad / nnx.value_and_grad")
            return cst.RemoveFromParent()
        if q in DROPPED_SEEDS:
            self.diag(original_node, q, "info", f"{q} removed: JAX's random streams are "
                      "explicit keys and deterministic on every backend")
            return cst.RemoveFromParent()
        if q in CLIPS:
            if any(site.clip is not None for site in t.optimizers.values()):
                return cst.RemoveFromParent()  # folded into the optimizer's chain
            if (self._while_stack and not self._for_stack and CLIPS[q] == "norm"
                    and self.target.stateful_modules):
                # decided where the loop is left: clipped inside its train step, or marked
                self._while_clips[id(self._while_stack[-1])] = (original_node, q)
                return updated_node
            self.diag(original_node, q, "error", "gradient clipping outside a recognised "
                      "training step: chain optax.clip_by_global_norm before the optimizer")
            return updated_node
        if isinstance(value.func, cst.Name) and value.func.value in t.seed_functions:
            self._key_scopes[-1].has_key = True
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(tr.KEY))],
                              value=updated_node.value)
        if not (isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Name)):
            return None
        recv, meth = value.func.value.value, value.func.attr.value
        if meth == "zero_grad" and (recv in t.optimizer_names or any(
                recv == s.model for s in t.optimizers.values())):
            return cst.RemoveFromParent()  # JAX computes fresh gradients every step
        if meth == "backward" and self._step_backward(original_node, updated_node):
            return updated_node  # translated with its block (passes/rewrite_steps.py)
        if meth == "backward" and not self._for_stack and not self._while_stack:
            self.diag(original_node, "training-loop", "error",
                      "backward() outside a loop that steps an optimizer: write the step "
                      "as nnx.value_and_grad + optimizer.update")
            return updated_node
        sched = t.scheduler_names.get(recv)
        if meth == "step" and sched is not None:
            return self._scheduler_step(original_node, updated_node, sched)
        if meth == "load_state_dict" and sched is not None:
            return self._scheduler_load(original_node, updated_node, sched)
        return None

    def _scheduler_load(self, original_node, updated_node, sched):
        """``scheduler.load_state_dict(d)``: torch restores the scheduler's count (its
        ``last_epoch``), not the optimizer's lr (the optimizer's own state_dict holds that).
        A schedule of the update count is restored with the optimizer's state; a counted
        schedule takes ``d["last_epoch"]`` (what :meth:`_scheduler_state` saves)."""
        args = updated_node.value.args
        if sched.name not in self._schedules or len(args) != 1 or args[0].keyword or (
                sched.name in self._plateaus):
            self.diag(original_node, sched.qualname, "error",
                      "scheduler.load_state_dict: only the count of a schedule translated "
                      "to optax is restored (not ReduceLROnPlateau's state)")
            return updated_node
        if sched.inline:
            self.diag(original_node, sched.qualname, "info",
                      "scheduler.load_state_dict: the schedule reads the optimizer's update "
                      "count, restored with the optimizer's state")
            return cst.RemoveFromParent()
        return cst.Assign(targets=[cst.AssignTarget(cst.parse_expression(
            self._steps(sched.name)))], value=expr('{d}["last_epoch"]', d=args[0].value))

    def _scheduler_state(self, original, sched) -> cst.BaseExpression | None:
        """``scheduler.state_dict()``: ``{"last_epoch": count}``, the count torch's scheduler
        saves (the update count for a schedule of it)."""
        if original.args or sched.name not in self._schedules or sched.name in self._plateaus:
            return None
        count = (self.target.step_count(sched.optimizer) if sched.inline
                 else self._steps(sched.name))
        return cst.parse_expression(f'{{"last_epoch": int({count})}}')

    def _scheduler_step(self, original_node, updated_node, sched):
        if sched.inline:
            return cst.RemoveFromParent()  # the schedule is a function of the update count
        plateau, base_code = self._plateaus.get(sched.name, (None, None))
        if plateau is not None:
            args = updated_node.value.args
            if len(args) != 1 or args[0].keyword is not None and args[0].keyword.value != \
                    "metrics":
                self.diag(original_node, sched.qualname, "error",
                          "ReduceLROnPlateau.step() without the metric")
                return updated_node
            metric = args[0].value
            value = expr("-{m}", m=metric) if plateau.negate_metric else metric
            self._pending[-1].before.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(expr(f"_, {sched.name}_state"))],
                value=expr(f"{sched.name}.update(None, {sched.name}_state, value={{v}})",
                           v=value))]))
            return cst.parse_statement(
                f"{self._lr_slot(sched.optimizer)} = jnp.float32({base_code} * "
                f"{sched.name}_state.scale)\n").body[0]
        if original_node.value.args or sched.optimizer is None:
            self.diag(original_node, sched.qualname, "error",
                      "scheduler.step() with an argument (a metric or an epoch)")
            return updated_node
        # (a scheduler a function receives is read through its parameter there)
        name = value.func.value.value if m.matches(value := original_node.value, m.Call(
            func=m.Attribute(value=m.Name()))) and value.func.value.value in (
            self._passed_schedulers) else sched.name
        count = f"{name}.steps" if sched.name in self._passed_schedulers else self._steps(
            sched.name)
        self._pending[-1].before.append(cst.parse_statement(f"{count} += 1\n"))
        # a strong float32: a weak-typed value would make the jitted step compile again
        self.need("jnp")
        return cst.parse_statement(
            f"{self._lr_slot(sched.optimizer)} = jnp.float32({name}({count}))\n").body[0]

    def _steps(self, scheduler: str) -> str:
        """The count of a scheduler's step() calls: a local, or an attribute of the schedule
        function where a function it is passed to steps it."""
        if scheduler in self._passed_schedulers:
            return f"{scheduler}.steps"
        return f"{scheduler}_steps"

    def _unclipped(self, node, clip):
        if clip is not None:
            self.diag(clip[0], clip[1], "error", "gradient clipping outside a recognised "
                      "training step: chain optax.clip_by_global_norm before the optimizer")
        return node

    def _group_lr(self, node: cst.Subscript) -> cst.BaseExpression | None:
        """``optimizer.param_groups[0]["lr"]`` read: the learning rate the next update uses."""
        if not (m.matches(node, m.Subscript(value=m.Subscript(value=m.Attribute(
                value=m.Name(), attr=m.Name("param_groups"))))) and len(node.slice) == 1
                and try_literal(getattr(node.slice[0].slice, "value", None), ...) == "lr"):
            return None
        name = node.value.value.value.value
        site = self.training.optimizer_names.get(name)
        if site is None:
            return None
        sched = site.scheduler
        if sched is not None and sched.inline:
            step = self.target.step_count(name)
            return expr(f"{sched.name}({step})")
        if sched is not None:
            quote = self._string_quote()
            return expr(self._lr_slot(name, quote))
        lrs = self._group_lrs.get(name)
        if lrs is not None:  # param_groups[i]["lr"]: group i's own
            index = try_literal(getattr(node.value.slice[0].slice, "value", None), ...) if len(
                node.value.slice) == 1 else ...
            if isinstance(index, int) and -len(lrs) <= index < len(lrs):
                return lrs[index]
            return None
        lr = self._opt_lr.get(name)
        return lr
