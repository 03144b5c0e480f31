"""Train steps where they stand: ``loss.backward()`` and ``optimizer.step()`` in one block that
is not a loop body (NNX).

torch's training step is implicit state: ``.grad`` accumulates what ``backward()`` computes,
``zero_grad()`` resets it, ``clip_grad_norm_`` transforms it and ``optimizer.step()`` applies
it. The loop translations (passes/rewrite_loops.py) recognise that state inside a ``for`` or
a ``while`` body; this mixin translates it in any other block (a module's statements, a
function's or a method's body, a ``with`` or ``if`` body): a single step in a notebook, a
``def train_step(model, opt, x, y)`` helper called from a loop, consecutive steps written
out. Each *region* of the block, from after the previous ``optimizer.step()`` (the last
change of the parameters) to the next one, holds one ``backward()``: its loss is the backward
slice of the region's statements (training.loss_slice), and the region becomes a call of a
jit-compiled step that takes ``grad(loss)`` and applies it (training.build_train_step).

A region the step builder cannot prove (two backward() calls, a loss that does not depend on
the model, statements it does not know how to order) keeps its statements and is marked.

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.grad_sum import _touches_grads, summable_backwards, summed_region
from torch2jax.passes.held_steps import HeldStep, find_held_steps, named_backward
from torch2jax.passes.hoist_args import hoisted_step, passing
from torch2jax.passes.rewrite_support import STEP_GLOBALS, _free_names

_REGION_STATEMENTS = (cst.SimpleStatementLine, cst.With)


def _blocks(node: cst.CSTNode, fn: cst.FunctionDef | None = None, loop=None):
    """The statement blocks that are not a loop body: the module's, and those of functions,
    methods, ``with`` / ``if`` / ``try`` statements; each with the function it is in (None:
    the module level) and the outermost loop of that function around it (None: none). A loop's
    body is the loop translation's (passes/rewrite_loops.py); inside it, only the blocks of
    ``if`` statements (a step taken in one mode of a shared loop body:
    passes/grad_mode_branches.py), each nested in ifs only up to its loop body."""
    if isinstance(node, (cst.For, cst.While)):
        outer = loop or node
        for child in node.body.body if isinstance(node.body, cst.IndentedBlock) else ():
            yield from _if_blocks(child, fn, outer)
        return
    if isinstance(node, cst.FunctionDef):
        fn, loop = node, None
    body = getattr(node, "body", None)
    if isinstance(node, cst.Module):
        yield node, node.body, fn, loop
    elif isinstance(body, cst.IndentedBlock):
        yield body, body.body, fn, loop
    children = node.body if isinstance(node, cst.Module) else (
        body.body if isinstance(body, cst.IndentedBlock) else ())
    for child in children:
        if isinstance(child, cst.BaseCompoundStatement):
            yield from _blocks(child, fn, loop)
            orelse = getattr(child, "orelse", None)
            while orelse is not None:
                yield from _blocks(orelse, fn, loop)
                orelse = getattr(orelse, "orelse", None)


def _if_blocks(node: cst.CSTNode, fn, loop):
    """The blocks of an ``if`` statement in a loop body (and of the ifs nested in it, and in
    the loops nested in that body)."""
    if isinstance(node, (cst.For, cst.While)) and isinstance(node.body, cst.IndentedBlock):
        for child in node.body.body:
            yield from _if_blocks(child, fn, loop)
        return
    while isinstance(node, (cst.If, cst.Else)) and isinstance(node.body, cst.IndentedBlock):
        yield node.body, node.body.body, fn, loop
        for child in node.body.body:
            yield from _if_blocks(child, fn, loop)
        node = getattr(node, "orelse", None)


def _stepped(stmt: cst.CSTNode, receivers: set[str]) -> str | None:
    """``opt.step()`` without arguments (not ``scaler.step(opt)``, nor a closure)."""
    opt = tr._is_method_stmt(stmt, receivers, "step")
    return opt if opt is not None and not stmt.body[0].value.args else None


def _params(fn: cst.FunctionDef | None) -> set[str]:
    if fn is None:
        return set()
    return {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}


def find_block_steps(module: cst.Module, optimizers: set[str],
                     loops: dict[int, cst.CSTNode] | None = None) -> tuple[set[int], set[int]]:
    """(ids of the blocks that hold a step, ids of their ``backward()`` expressions): a block
    with ``X.backward()`` followed by ``opt.step()`` of a known optimizer, or of an optimizer
    a function receives (``def fit(net, optim, xb, yb)``). ``loops`` receives, for a block in
    a loop body's ``if``, the outermost loop of its function around it."""
    blocks: set[int] = set()
    backwards: set[int] = set()
    for owner, stmts, fn, loop in _blocks(module):
        if loop is not None and loops is None:
            continue  # (no loops given: the blocks that are not in a loop only)
        pending: list[cst.SimpleStatementLine] = []
        since: list[cst.CSTNode] = []  # the statements from the first pending backward on
        receivers = optimizers | _params(fn) - {"self", "cls"}
        for s in stmts:
            if tr._is_method_stmt(s, None, "backward"):
                pending.append(s)
            elif pending and _stepped(s, receivers):
                blocks.add(id(owner))
                if loop is not None and loops is not None:
                    loops[id(owner)] = loop
                # several backward() calls: summed (accumulated) where nothing between them
                # reads or resets the gradients; otherwise the last alone (marked there)
                summed = summable_backwards(since) and not any(
                    _touches_grads(x) for x in since)
                backwards.update(id(b.body[0]) for b in (pending if summed else pending[-1:]))
                pending, since = [], []
                continue
            if pending:
                since.append(s)
    return blocks, backwards


class StepsMixin:
    def _find_block_steps(self, module: cst.Module) -> None:
        t = self.training
        self._step_opts = {n for n in t.optimizer_names if t.model_of(n)}
        self._step_loops: dict[int, cst.CSTNode] = {}  # a block in a loop -> its outer loop
        if not t.optimizers:
            self._step_blocks, self._step_backwards = set(), set()
            return
        # (on equinox's NNX form too: there a loop's step is defined in its function, where
        # the equinox pass finds and hoists it, _region_step)
        self._step_blocks, self._step_backwards = find_block_steps(
            module, self._step_opts, self._step_loops)
        self._step_names: set[str] = set()
        self._step_backwards_at: dict[int, cst.CSTNode] = {}
        # steps held back by a condition (passes/held_steps.py): .grad as an accumulator
        self._held, self._held_exprs = find_held_steps(
            module, {n: t.model_of(n) for n in self._step_opts}, self._model_names(),
            self._file_names, self._multi_steps, fused=self._step_backwards) if (
            not self.target.intermediate) else ({}, {})  # (no equinox form: marked there)
        for held in self._held.values():
            self._step_names |= {held.holder, held.grad_step, held.apply}
            site = t.optimizer_names.get(held.optimizer)
            if site is not None:
                site.accumulate = None  # not optax.MultiSteps: the accumulator steps
        self._held_defined: set[str] = set()
        self._held_fns: dict[str, str] = {}  # a gradient step's code -> its name
        self._step_blocks |= set(self._held)
        self._step_backwards |= {held.backward for held in self._held.values()}

    def leave_IndentedBlock(self, original_node, updated_node):
        if id(original_node) not in getattr(self, "_step_blocks", ()):
            return updated_node
        body = self._block_steps(list(updated_node.body), original_node)
        if body and body[0] is not updated_node.body[0] and all(
                ln.comment is None for ln in body[0].leading_lines):
            body[0] = body[0].with_changes(leading_lines=[])  # a step first in its function
        return updated_node.with_changes(body=body)

    def _module_block_steps(self, original_node, updated_node):
        if id(original_node) not in getattr(self, "_step_blocks", ()):
            return updated_node
        return updated_node.with_changes(body=self._block_steps(list(updated_node.body),
                                                                original_node))

    def _scope_function(self) -> cst.FunctionDef | None:
        return self._fn_stack[-1] if self._fn_stack else None

    def _block_steps(self, stmts: list, original_block) -> list:
        """The block's statements with each region that ends in ``optimizer.step()``
        rewritten as a call of a jit-compiled step."""
        held = getattr(self, "_held", {}).get(id(original_block))
        if held is not None:
            return self._held_block(stmts, held)
        out: list = []
        start = 0
        i = 0
        while i < len(stmts):
            s = stmts[i]
            if not isinstance(s, _REGION_STATEMENTS):
                out.extend(stmts[start:i + 1])
                start = i = i + 1
                continue
            opt = _stepped(s, self._step_opts | (_params(self._scope_function())
                                                 - {"self", "cls"}))
            if opt is None:
                i += 1
                continue
            region = stmts[start:i + 1]
            # what the rest of the block reads (return loss, out): the step returns it too
            later = set(tr.names_of(cst.Module(body=stmts[i + 1:])).used)
            loop = self._step_loops.get(id(original_block))
            if loop is not None:  # and what the rest of the loop reads (the next iteration)
                inside = {id(n) for n in findall(original_block, m.Name())}
                later |= {n.value for n in findall(loop, m.Name()) if id(n) not in inside}
            new = self._region_step(region, opt, later, loop)
            if new is None:
                out.extend(region)
            else:
                out.extend(new)
            start = i = i + 1
        out.extend(stmts[start:])
        return out

    def _model_of(self, region: list, opt: str) -> str | None:
        """The model ``opt`` updates: a known optimizer's; for an optimizer the function
        receives, the one parameter of the function that the region calls."""
        fn = self._scope_function()
        params = _params(fn) - {"self", "cls", opt}
        if opt in _params(fn):
            called = {c.func.value for s in region for c in findall(
                s, m.Call(func=m.Name())) if c.func.value in params}
            if len(called) > 1:  # model(x) and criterion(out, y): the model's name
                called &= self._model_names()
            return called.pop() if len(called) == 1 else None
        return self.training.model_of(opt)

    def _region_step(self, region: list, opt: str, later: set[str] = frozenset(),
                     loop: cst.CSTNode | None = None) -> list | None:
        """The region as a call of a jit-compiled step. ``loop``: the outermost loop of the
        function around a region in a loop body's ``if``: the names the loop binds are
        passed to the step, which is defined once, before that loop (or at the top level)."""
        model = self._model_of(region, opt)
        back = [s for s in region if tr._is_method_stmt(s, None, "backward")]
        if len(back) > 1 and all(id(b.body[0]) in self._step_backwards_at for b in back):
            # (find_block_steps kept them all: nothing between them touches the gradients)
            where = self._step_backwards_at[id(back[-1].body[0])]
            taken = self._file_names | self._step_names
            summed = summed_region(region, taken)
            if summed is None:
                return self._marked(region, back, "the losses summed from several "
                                    "backward() calls are computed in statements other than "
                                    "assignments to names")
            region, back = summed
            self._step_backwards_at[id(back[0].body[0])] = where
            self._file_names |= taken
        if model is None or len(back) != 1:
            return self._marked(region, back, "the statements since the parameters last "
                                "changed hold no single backward()")
        # the statements before the loss's first statement stay before the step's call
        ib = next(i for i, s in enumerate(region) if s is back[0])
        before = region[:ib]
        loss_body, _ = tr.split_loss(before, tr.loss_slice(
            before, tr._is_method_stmt(back[0], None, "backward")), model)
        first = next((i for i, s in enumerate(before) if loss_body and s is loss_body[0]), ib)
        prefix, region = region[:first], region[first:]
        fn = self._scope_function()
        params = set()
        if fn is not None:
            params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
        # passed to the step: the function's parameters (a helper called per step) and what
        # the region computes; the rest is read from the scope the step is defined in
        # (a parameter the region calls, criterion(out, y), is a function: closed over)
        called = {c.func.value for st in region for c in findall(st, m.Call(func=m.Name()))}
        loop_names = (params - called | set(tr.names_of(cst.Module(body=region)).assigned)) - {
            model, opt}
        if loop is not None:  # jit would keep their values of the first call
            loop_names |= tr.loop_assigned_names(loop) - {model, opt}
        # zero_grad() of the optimizer or the model goes: JAX computes fresh gradients
        prefix = [st for st in prefix if not tr._is_method_stmt(st, {opt, model}, "zero_grad")]
        taken = self._file_names | self._step_names
        name = tr._fresh("train_step", taken)
        step = tr.build_train_step(region, optimizer=opt, model=model, loop_names=loop_names,
                                   step_name=name, tree_mode=not self.data.aliasing,
                                   read_later=later)
        if step is None:
            return self._marked(region, back, "its loss is not a function of "
                                f"{model} that torch2jax can separate (its backward slice)")
        stale = self._stale_models(step.function, model)
        if stale:
            return self._marked(region, back, self._stale_message(stale, model))
        self._step_names.add(name)
        self.need("nnx")
        if step.record is not None:
            self.train_steps.append(step.record)
        self.diag(self._step_backwards_at.get(id(back[0].body[0]), back[0]), "training-step",
                  "info",
                  f"train step: {name} takes grad(loss) of {model} (the backward slice of the "
                  f"statements since the parameters last changed) and applies it with "
                  f"{opt}.update, jit-compiled")
        function = step.function
        # a helper or a top-level class's method: the one function around the step
        owner = (None if fn is None else fn.name.value if not self._class_stack else
                 self._class_stack[0] if len(self._class_stack) == 1 else None)
        # (on equinox's NNX form a loop's step stays in its function, before the loop: the
        # equinox pass hoists it with the optimizer the function receives, equinox_hoist.py)
        free = _free_names(function) - (self._module_names | STEP_GLOBALS)
        hoist = (fn is not None and len(self._fn_stack) == 1 and owner is not None
                 and not (loop is not None and self.target.intermediate))
        hoisted = hoisted_step(self, function, free) if hoist and free else None
        if hoist and (not free or hoisted is not None):
            # a helper (or a trainer's method) called once per step: its step is defined and
            # compiled once, at the top level, not again at every call (what it reads of the
            # helper's names passed in: passes/hoist_args.py)
            function, names = hoisted or (function, [])
            self._module_hoist.append((owner, function))
            return [*prefix, *passing(step.body, function.name.value, names)]
        if loop is not None:  # defined once, before the loop (not again at each iteration)
            self._hoist.append(function)
            return [*prefix, *step.body]
        i = next(i for i, b in enumerate(step.body) if b is step.call)
        lines = step.call.leading_lines
        blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
        function = function.with_changes(leading_lines=[*lines, *blank] if not lines else
                                         [*lines])
        call_stmt = step.call.with_changes(leading_lines=blank)
        return [*prefix, *step.body[:i], function, call_stmt, *step.body[i + 1:]]

    def _stale_models(self, function: cst.FunctionDef, model: str,
                      loop: cst.CSTNode | None = None) -> list[str]:
        """The models another optimizer of the file trains that a jit-compiled step of
        ``model`` reads without taking them as arguments: jit would keep their parameters of
        the first call (a generator's step reading the discriminator). In a ``loop``, those
        whose optimizer steps in it, or in a function of the file it calls."""
        t = self.training
        stepped = set(t.optimizer_names)
        if loop is not None:
            called = {c.func.value for c in findall(loop, m.Call(func=m.Name()))}
            scopes = [loop, *(f for f in findall(self._root, m.FunctionDef())
                              if f.name.value in called)]
            stepped = {n for n in stepped for sc in scopes if findall(sc, m.Call(
                func=m.Attribute(value=m.Name(n), attr=m.Name("step"))))}
        trained = {t.model_of(n) for n in stepped} - {model, None}
        return sorted(_free_names(function) & trained)

    def _stale_message(self, stale: list[str], model: str) -> str:
        return (f"the step of {model} reads {', '.join(stale)}, which another optimizer "
                "trains: a jit-compiled step that does not take it as an argument would keep "
                "its first parameters (and torch2jax does not order the two steps); write the "
                "step with both models as arguments")

    def _marked(self, region: list, back: list, why: str) -> list:
        """The region as it is, each ``backward()`` marked at its line."""
        out = []
        for s in region:
            if any(s is b for b in back):
                message = (f"backward() not translated: {why}; write the step as "
                           "nnx.value_and_grad + optimizer.update")
                line, col = self.pos(self._step_backwards_at.get(id(s.body[0]), s))
                self.report(line, col, "training-loop", "error", message)
                s = s.with_changes(leading_lines=[*s.leading_lines, cst.EmptyLine(
                    comment=cst.Comment(f"# TODO(torch2jax): {message} [training-loop]"))])
            out.append(s)
        return out

    def _step_backward(self, original_node: cst.Expr, updated_node: cst.Expr) -> bool:
        """``loss.backward()`` of a block that holds a step: left for the block (its
        original, for the position of what is reported there)."""
        if id(original_node) not in getattr(self, "_step_backwards", ()):
            return False
        self._step_backwards_at[id(updated_node)] = original_node
        return True


    # -- a step held back by a condition: .grad as an explicit accumulator (held_steps.py)
    def _multi_steps(self, opt: str) -> bool:
        """The optimizer becomes optax.MultiSteps (the fast path of a step every k batches
        in a loop body): no learning rate set outside its update."""
        site = self.training.optimizer_names.get(opt)
        return site is not None and site.accumulate is not None and not site.lr_set and (
            site.scheduler is None or site.scheduler.per_update)

    def _held_statement(self, original_node: cst.Expr):
        """``optimizer.step()`` of a held step -> the compiled update; ``zero_grad()`` ->
        ``grads = None``."""
        kind, held, *names = self._held_exprs[id(original_node)]
        text = (f"{held.holder} = None\n" if kind == "zero" else
                f"{held.apply}({names[0]}, {names[1]}, {held.holder})\n")
        return cst.parse_statement(text).body[0]

    def _held_block(self, stmts: list, held: HeldStep) -> list:
        stmts, named = named_backward(stmts, self._file_names)
        if named:  # (loss / k).backward(): the step differentiates a name
            back = next(s for s in stmts if tr._is_method_stmt(s, None, "backward"))
            self._step_backwards_at[id(back.body[0])] = held.node
        ib = next(i for i, s in enumerate(stmts) if tr._is_method_stmt(s, None, "backward"))
        start = max((i + 1 for i, s in enumerate(stmts[:ib])
                     if not isinstance(s, _REGION_STATEMENTS)), default=0)
        region, rest = stmts[start:ib + 1], stmts[ib + 1:]
        fn = held.function
        called = {c.func.value for st in region for c in findall(st, m.Call(func=m.Name()))}
        loop_names = _params(fn) - {"self", "cls"} - called | set(
            tr.names_of(cst.Module(body=region)).assigned)
        if held.outer is not None:  # closed over, jit would keep their first value
            loop_names |= tr.loop_assigned_names(held.outer)
        loop_names -= {held.model, held.optimizer}
        later = set(tr.names_of(cst.Module(body=rest)).used)
        if held.outer is not None or named:  # what the function (the module) reads
            later |= set(tr.names_of(held.function or self._root).used)
        step = tr.build_train_step(region, optimizer=held.optimizer, model=held.model,
                                   loop_names=loop_names, step_name=held.grad_step,
                                   tree_mode=not self.data.aliasing, grads_out=held.holder,
                                   read_later=later)
        # a function's or a method's: .grad outlives the call (module state)
        glob = [cst.parse_statement(f"global {held.holder}\n")] if held.declare else []
        self.need("nnx", "jax", "jnp")
        if held.holder not in self._held_defined:  # once: the holder and the update
            # (the steps and zero_grad() read them, the others translated or not)
            self._held_defined.add(held.holder)
            self._top_steps.extend([
                cst.parse_statement(f"{held.holder} = None\n"),
                cst.parse_statement(
                    f"{tr.nnx_jit(not self.data.aliasing)}\n"
                    f"def {held.apply}({held.model}, {held.optimizer}, {held.holder}):\n"
                    f"    {held.optimizer}.update({held.model}, {held.holder})\n")])
        back = [s for s in region if tr._is_method_stmt(s, None, "backward")]
        same = None if step is None else self._held_fns.get(cst.Module(body=[
            step.function.with_changes(name=cst.Name("_"), leading_lines=[])]).code)
        if same is not None:  # the same gradient step as another held site's (a peeled loop)
            step = tr.build_train_step(region, optimizer=held.optimizer, model=held.model,
                                       loop_names=loop_names, step_name=same,
                                       tree_mode=not self.data.aliasing,
                                       grads_out=held.holder, read_later=later)
        if step is None:
            return [*glob, *stmts[:start], *self._marked(region, back, (
                f"its loss is not a function of {held.model} that torch2jax can separate "
                "(its backward slice)")), *rest]
        if _free_names(step.function) - (self._module_names | STEP_GLOBALS):
            return [*glob, *stmts[:start], *self._marked(region, back, (
                "the gradient step reads names of the function around it")), *rest]
        self.diag(held.node, "training-step", "info",
                  f"gradient accumulator: {held.holder} holds torch's .grad of "
                  f"{held.model}; backward() adds the gradients {same or held.grad_step} "
                  f"computes (the backward slice since the parameters last changed), "
                  f"{held.optimizer}.step() applies them with {held.apply}, zero_grad() "
                  f"resets them (None); both jit-compiled")
        if same is None:
            self._top_steps.append(step.function)
            self._held_fns[cst.Module(body=[step.function.with_changes(
                name=cst.Name("_"), leading_lines=[])]).code] = held.grad_step
        return [*glob, *stmts[:start], *step.body, *rest]
