"""Training code for the flax.linen target.

A linen module holds no arrays: its variables live in a dict that ``model.init`` makes and
``model.apply`` reads. The torch pattern "an optimizer over ``model.parameters()``, a loop
that calls ``loss.backward()`` and ``optimizer.step()``" becomes what the flax examples write:

* the optimizer is the optax transform (the one the NNX target builds: schedules, clipping,
  parameter-group masks, MultiSteps, inject_hyperparams), kept under the optimizer's name;
* before the training loop, ``variables = model.init({"params": key}, sample)`` with a sample
  input taken from the data the loop reads (its first batch), and a
  ``flax.training.train_state.TrainState`` (with ``batch_stats`` when the model has
  BatchNorm) that holds the parameters, the optimizer state and the step count;
* a ``@jax.jit`` train step: ``jax.value_and_grad`` of a loss function of the parameters that
  calls ``state.apply_fn`` on a ``train=True`` clone of the model, with a dropout key split per
  step and ``mutable=["batch_stats"]``; ``state.apply_gradients`` applies the update;
* after the loop, ``variables = {"params": state.params, ...}``; evaluation calls
  ``model.apply(variables, x)`` (the model's ``train`` field is False) through a jitted
  ``eval_step``. Helpers that train a model they receive return its variables; helpers that
  evaluate one take them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import torch_init
from torch2jax.passes import training as tr
from torch2jax.passes.common import Untranslatable, arg, bind, call, code, expr, try_literal

STATE = "state"
VARIABLES = "variables"
DROPOUT_KEY = "dropout_key"
# the stream a module method's own draws take (a VAE's reparameterisation:
# ``self.make_rng("noise")``), with its key given to every apply
NOISE = "noise"
NOISE_KEY = "noise_key"
SUBKEY = "subkey"
EVAL_STEP = "eval_step"


@dataclass
class LinenStep:
    function: cst.FunctionDef  # the @jax.jit train step to define before the loop
    body: list[cst.BaseStatement]  # the loop's new body
    call: cst.SimpleStatementLine
    model_args: list[cst.BaseExpression]  # what the loss function passes to the model
    model_kwargs: list[cst.Arg]
    model: str = ""  # the model the step applies


class _ApplyCalls(cst.CSTTransformer):
    """``model(x)`` -> ``state.apply_fn(vars, x, ...)`` in the loss function."""

    def __init__(self, model: str, variables: str, extra: list[cst.Arg],
                 state: str = STATE) -> None:
        super().__init__()
        self.model = model
        self.variables = variables
        self.extra = extra
        self.state = state
        self.calls: list[cst.Call] = []

    def visit_Lambda(self, node) -> bool:
        return False

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node.func, m.Name(self.model)):
            self.calls.append(original_node)
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in updated_node.args]
            return call(f"{self.state}.apply_fn", arg(cst.parse_expression(self.variables)),
                        *args, *self.extra)
        return updated_node


def build_step(body: Sequence[cst.BaseStatement], *, optimizer: str, model: str,
               loop_names: set[str], step_name: str, batch_stats: bool, dropout: bool,
               accumulate: bool = False, noise: bool = False,
               summed: str | None = None) -> LinenStep | None:
    """The linen counterpart of :func:`torch2jax.passes.training.build_train_step`: the same
    statements form the loss function, which takes the parameters and calls the model through
    ``state.apply_fn``. ``summed``: a micro-step's body (no step() in it), whose gradients
    are added to the accumulator of that name (targets/linen_accum.py) instead of applied."""
    body = list(body)
    back = [i for i, s in enumerate(body) if tr._is_method_stmt(s, None, "backward")]
    steps = [i for i, s in enumerate(body) if tr._is_method_stmt(s, {optimizer}, "step") or (
        accumulate and isinstance(s, cst.If) and not s.orelse and len(s.body.body) == 1
        and tr._is_method_stmt(s.body.body[0], {optimizer}, "step"))]
    if summed is not None and len(back) == 1 and not steps:
        steps = [len(body)]
        body.append(cst.SimpleStatementLine(body=[cst.Pass()]))  # (where step() would be)
    if len(back) != 1 or len(steps) != 1 or steps[0] < back[0]:
        return None
    ib, istep = back[0], steps[0]
    loss = tr._is_method_stmt(body[ib], None, "backward")
    before = [s for s in body[:ib]
              if not tr._is_method_stmt(s, {optimizer, model}, "zero_grad")]
    loss_body, outside = tr.split_loss(before, tr.loss_slice(before, loss), model)
    if not loss_body:
        return None
    defined = tr.assigned_in_order(loss_body)
    after = [s for s in body[ib + 1:] if s is not body[istep]]
    used_later: set[str] = set()
    for s in [*outside, *after]:
        used_later |= set(tr.names_of(s).used)
    aux = [d for d in defined if d != loss and d in used_later]
    pre, post_dep = [], []
    read = {u for st in loss_body for u in tr.names_of(st).used}
    start = next(i for i, s in enumerate(before) if s is loss_body[0])
    for s in outside:
        # after the model call, what writes a name the loss reads (the next batch drawn
        # before backward(), nanoGPT's) runs after the step, as in torch
        late = set(tr.names_of(s).assigned) & read and any(s is b for b in before[start:])
        (post_dep if set(tr.names_of(s).used) & set(defined) or late else pre).append(s)
    # between backward() and step(), what reads nothing of the loss and writes nothing it
    # reads (a learning rate set by hand for this step) runs before the step, as in torch
    early = [s for s in body[ib + 1:istep] if not set(tr.names_of(s).used) & {*defined, loss}
             and not set(tr.names_of(s).assigned) & read]
    pre += early
    after = [s for s in after if not any(s is e for e in early)]
    taken0 = set(used_later) | set(loop_names) | {u for st in loss_body
                                                  for u in tr.names_of(st).used}
    # the model's inputs as the loop computes them (for the sample input of model.init)
    inputs = _model_inputs(loss_body, model)
    if inputs is None:
        raise Untranslatable("the model is called more than once, or used other than by a "
                             "call, in the loss: write the linen loss function by hand",
                             rule="training-loop")
    lifter = tr._LiftBatches({model, *defined}, loop_names, taken0)
    loss_body = [st.visit(lifter) for st in loss_body]
    free: list[str] = []
    seen: set[str] = set()  # defined by an earlier statement of the loss
    for s in [x for st in loss_body for x in (findall(st, m.SimpleStatementLine()) if (
            isinstance(st, cst.BaseCompoundStatement)) else [st])]:  # (in a `with`, in order)
        for u in tr.names_of(s).used:
            # a name the loss reads before it defines it (an RNN's hidden state carried
            # from step to step) is an argument of the step too: a jitted function's closure
            # would keep its value of the first call
            if (u not in defined or u not in seen) and u != model and u not in free and \
                    u in loop_names:
                free.append(u)
        seen |= set(tr.names_of(s).assigned)
    # (those the loss also assigns are parameters of the loss function: it reassigns them)
    carried = [u for u in free if u in defined]
    taken = taken0 | {n for n, _ in lifter.lifted} | {STATE, DROPOUT_KEY, NOISE_KEY,
                                                       *([summed] if summed else [])}
    loss_fn = tr._fresh("loss_fn", taken)
    grads = tr._fresh("micro_grads" if summed else "grads", taken)
    params = tr._fresh("params", taken)
    updates = tr._fresh("updates", taken)
    variables = (f'{{"params": {params}, "batch_stats": {STATE}.batch_stats}}' if batch_stats
                 else f'{{"params": {params}}}')
    extra = []
    streams = [*(["dropout"] if dropout else []), *([NOISE] if noise else [])]
    keys = {"dropout": DROPOUT_KEY, NOISE: NOISE_KEY}
    if streams:
        extra.append(arg(cst.parse_expression("{" + ", ".join(
            f'"{s}": {keys[s]}' for s in streams) + "}"), "rngs"))
    if batch_stats:
        extra.append(arg(expr('["batch_stats"]'), "mutable"))
    applier = _ApplyCalls(model, variables, extra)
    new_loss_body = []
    for s in loss_body:
        before_count = len(applier.calls)
        s2 = s.visit(applier)
        if batch_stats and len(applier.calls) > before_count:
            s2 = _unpack_updates(s2, updates, taken)
        new_loss_body.append(s2)
    if model in {u for s in new_loss_body for u in tr.names_of(s).used}:
        raise Untranslatable(f"the loss reads {model} other than by calling it: write the "
                             "linen loss function by hand", rule="training-loop")
    if summed and batch_stats:
        raise Untranslatable("micro-steps of a model with BatchNorm: each micro-step's "
                             "batch_stats would have to be applied before the next; write "
                             "the accumulation by hand", rule="accumulation")
    step_args = [STATE, *([summed] if summed else []), *free, *(n for n, _ in lifter.lifted)]
    call_args = [STATE, *([summed] if summed else []), *free,
                 *(code(e) for _, e in lifter.lifted)]
    for s in streams:
        step_args.append(keys[s])
        call_args.append(keys[s])
    inner = "".join("        " + line + "\n" for s in new_loss_body
                    for line in cst.Module(body=[s]).code.rstrip("\n").split("\n"))
    aux_all = [*aux, *([updates] if batch_stats else [])]
    if aux_all:
        packed = ", ".join(aux_all) + ("," if len(aux_all) == 1 and aux else "")
        ret_inner = f"        return {loss}, ({packed})\n" if len(aux_all) > 1 or aux else \
            f"        return {loss}, {packed}\n"
        inner_t = f"({packed})" if len(aux_all) > 1 or aux else packed
        vg = (f"    ({loss}, {inner_t}), {grads} = jax.value_and_grad({loss_fn}, "
              f"has_aux=True)({', '.join([f'{STATE}.params', *carried])})\n")
    else:
        ret_inner = f"        return {loss}\n"
        vg = (f"    {loss}, {grads} = jax.value_and_grad({loss_fn})("
              f"{', '.join([f'{STATE}.params', *carried])})\n")
    bs = f', batch_stats={updates}["batch_stats"]' if batch_stats else ""
    ret = ", ".join([summed or STATE, loss, *aux])
    update = (f"    {summed} = {grads} if {summed} is None else jax.tree.map(jnp.add, {summed}, "
              f"{grads})\n" if summed else
              f"    {STATE} = {STATE}.apply_gradients(grads={grads}{bs})\n")
    src = (f"@jax.jit\ndef {step_name}({', '.join(step_args)}):\n"
           f"    def {loss_fn}({', '.join([params, *carried])}):\n{inner}{ret_inner}{vg}"
           f"{update}    return {ret}\n")
    fn = cst.parse_statement(src)
    assert isinstance(fn, cst.FunctionDef)
    call_stmt = cst.parse_statement(f"{ret} = {step_name}({', '.join(call_args)})\n")
    first = loss_body[0]
    lines = first.leading_lines if isinstance(first, cst.SimpleStatementLine) else []
    stmts: list[cst.BaseStatement] = []
    for s in streams:
        stmts.append(cst.parse_statement(
            f"{tr.KEY}, {keys[s]} = jax.random.split({tr.KEY})\n"))
    stmts.append(call_stmt)
    if lines:
        stmts[0] = stmts[0].with_changes(leading_lines=lines)
    # the loop's other model calls (a validation loss between updates) read the TrainState
    reads = _ApplyCalls(model, f'{{"params": {STATE}.params}}', [])
    outside_step = [st.visit(reads) for st in [*pre, *post_dep, *after]]
    if reads.calls and (batch_stats or dropout or noise):
        raise Untranslatable(f"{model} is called in the training loop outside the loss, in "
                             "training mode, with BatchNorm or Dropout: apply it by hand",
                             rule="training-loop")
    if model in {u for st in outside_step for u in tr.names_of(st.visit(_EvaluatorArgs(
            model))).used}:
        raise Untranslatable(f"the training loop reads {model} other than by calling it",
                             rule="training-loop")
    outside_step = current_variables(outside_step, batch_stats)
    n_pre, n_dep = len(pre), len(post_dep)
    pre, post_dep, after = (outside_step[:n_pre], outside_step[n_pre:n_pre + n_dep],
                            outside_step[n_pre + n_dep:])
    new_body = [*pre, *stmts, *post_dep, *after]
    return LinenStep(function=fn, body=new_body, call=call_stmt, model_args=inputs[0],
                     model_kwargs=inputs[1], model=model)


class _EvaluatorArgs(cst.CSTTransformer):
    """Drops ``model, variables`` from the arguments of a call (an evaluation helper's,
    ``evaluate(model, variables, ...)``, as the rewrite passes them): such a call reads the
    model's variables, bound where it stands (:func:`current_variables`)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def leave_Call(self, original_node, updated_node):
        args = list(updated_node.args)
        for i in range(len(args) - 1):
            if m.matches(args[i], m.Arg(value=m.Name(self.model), keyword=None)) and \
                    m.matches(args[i + 1], m.Arg(value=m.Name(VARIABLES), keyword=None)):
                return updated_node.with_changes(args=[*args[:i], *args[i + 2:]])
        return updated_node


def current_variables(stmts: list[cst.BaseStatement], batch_stats: bool,
                      reads: m.BaseMatcherNode | None = None) -> list[cst.BaseStatement]:
    """The loop's statements that read ``variables`` between updates (an evaluation helper,
    a checkpoint; ``reads``: what reads them) read the TrainState's: ``variables =
    {"params": state.params, ...}`` is bound first, at the head of the ``if`` block that
    reads them when one does (an evaluation every k steps), else before the statement."""
    reads = m.Name(VARIABLES) if reads is None else reads
    out: list[cst.BaseStatement] = []
    for s in stmts:
        if not findall(s, reads):
            out.append(s)
            continue
        bind_ = final_variables(batch_stats)
        if isinstance(s, cst.If) and s.orelse is None and isinstance(
                s.body, cst.IndentedBlock) and not findall(s.test, reads):
            body = list(s.body.body)
            out.append(s.with_changes(body=s.body.with_changes(body=[bind_, *body])))
            continue
        out.append(bind_.with_changes(leading_lines=getattr(s, "leading_lines", ())))
        out.append(s.with_changes(leading_lines=[]) if hasattr(s, "leading_lines") else s)
    return out


def _model_inputs(loss_body, model: str):
    calls = [c for s in loss_body for c in findall(s, m.Call(func=m.Name(model)))]
    if len(calls) != 1:
        return None
    c = calls[0]
    if any(a.star for a in c.args):
        return None
    return ([a.value for a in c.args if a.keyword is None],
            [a for a in c.args if a.keyword is not None])


def _unpack_updates(stmt: cst.BaseStatement, updates: str, taken: set[str],
                    state: str = STATE):
    """``y = state.apply_fn(..., mutable=...)`` -> ``y, updates = ...``; a call nested in an
    expression is assigned first."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        raise Untranslatable("a model call with BatchNorm inside a compound statement of the "
                             "loss", rule="training-loop")
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and m.matches(
            small.value, m.Call(func=m.Attribute(value=m.Name(state),
                                                 attr=m.Name("apply_fn")))):
        target = small.targets[0].target
        if isinstance(target, cst.Tuple):
            target = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        new_t = cst.Tuple([cst.Element(target), cst.Element(cst.Name(updates))], lpar=[],
                          rpar=[])
        return stmt.with_changes(body=[small.with_changes(
            targets=[cst.AssignTarget(new_t)])])
    found = findall(small, m.Call(func=m.Attribute(value=m.Name(state),
                                                     attr=m.Name("apply_fn"))))
    out = tr._fresh("output", taken)
    taken.add(out)
    first = cst.parse_statement(f"{out}, {updates} = {code(found[0])}\n")
    replaced = small.deep_replace(found[0], cst.Name(out))
    return cst.FlattenSentinel([first.with_changes(leading_lines=stmt.leading_lines),
                                stmt.with_changes(body=[replaced], leading_lines=[])])


# ---------------------------------------------------------------------------- the sample
def sample_inputs(step: LinenStep, body: Sequence[cst.BaseStatement], loop: cst.For,
                  outer: Sequence[cst.For], loop_names: set[str]
                  ) -> tuple[list[cst.BaseStatement], list[cst.BaseExpression]] | None:
    """Statements to run before the training loop and the inputs ``model.init`` gets: the
    shapes of the loop's first batch. None when they cannot be told."""
    stmts: list[cst.BaseStatement] = []
    out: list[cst.BaseExpression] = []
    copied: set[int] = set()
    # with a carried state (its first value has the whole batch), the whole first batch
    exact = any(isinstance(a, cst.Name) and a.value in loop_names and step.model and _carried(
        a.value, body, step.model) for a in step.model_args)
    for a in step.model_args:
        e = _sample_of(a, body, loop, outer, loop_names, stmts, copied, model=step.model or None,
                       exact=exact)
        if e is None:
            return None
        out.append(e)
    return stmts, out


def _first_rows(e: cst.BaseExpression, loop_names: set[str], outer=(), exact: bool = False
                ) -> cst.BaseExpression | None:
    """A batch gathered from an array the loop does not assign: ``X[idx]`` or ``X[i:i + n]``
    -> ``X[:1]`` (the same shape past the batch axis); ``X[i]`` with ``i`` counting over a
    range -> ``X[0]``. ``exact``: the first batch itself (``X[0:0 + n]``, the counters at
    their first values), or None."""
    if not (isinstance(e, cst.Subscript) and isinstance(e.value, cst.Name)
            and e.value.value not in loop_names and len(e.slice) == 1):
        return None
    if exact:
        firsts = _range_firsts(outer)
        if set(tr.names_of(e.slice[0]).used) & loop_names - set(firsts):
            return None
        for k, v in firsts.items():
            e = _replace_name(e, k, v)
        return e
    index = e.slice[0].slice
    if isinstance(index, cst.Index) and isinstance(index.value, cst.Name) and any(
            isinstance(f.target, cst.Name) and f.target.value == index.value.value
            and m.matches(f.iter, m.Call(func=m.Name("range"))) for f in outer):
        return expr(f"{e.value.value}[0]")
    if isinstance(index, (cst.Index, cst.Slice)):
        return expr(f"{e.value.value}[:1]")
    return None


_DETACHED = m.Call(func=m.Attribute(attr=m.Name("detach")), args=[]) | m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("lax")),
                     attr=m.Name("stop_gradient")), args=[m.Arg()])


def _carried(name: str, body, model: str) -> bool:
    """``name`` is a state the loop carries from step to step (an RNN's hidden state): every
    assignment to it in the loop body is the model's output (``out, h = model(x, h)``) or
    reads it itself (``h = h.detach()``). Before the loop it holds the first step's input."""
    found = False
    for s in body:
        for a in findall(s, m.Assign() | m.AugAssign() | m.AnnAssign()):
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            if name not in {n.value for t in targets for n in findall(t, m.Name())}:
                continue
            found = True
            if not isinstance(a, cst.Assign) or not (
                    m.matches(a.value, m.Call(func=m.Name(model))) or (
                        targets == [cst.Name(name)] or m.matches(targets[0], m.Name(name)))
                    and name in set(tr.names_of(a.value).used)):
                return False
    return found


def _sample_of(e, body, loop, outer, loop_names, stmts, copied, model=None, exact=False):
    if m.matches(e, m.Call(func=m.Attribute(attr=m.Name("to")))):
        e = e.func.value  # data.to(device): the batch itself
    if m.matches(e, _DETACHED):
        e = e.func.value if isinstance(e.func, cst.Attribute) and e.func.attr.value == \
            "detach" else e.args[0].value  # h.detach(): the same shape
    if model is not None and isinstance(e, cst.Name) and e.value in loop_names and not (
            isinstance(loop, cst.For) and e.value in {n.value for n in findall(loop.target, m.Name())}
            ) and _carried(e.value, body, model):
        return e  # a carried state: its value before the loop, the first step's input
    if isinstance(loop, cst.For) and m.matches(loop.iter, m.Call(
            func=m.Name("enumerate"))) and 1 <= len(loop.iter.args) <= 2 and not any(
            a.star for a in loop.iter.args) and loop.iter.args[0].keyword is None and (
            isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == 2):
        # for i, (x, y) in enumerate(loader[, start]): the batch is the second element
        inner = loop.target.elements[1].value
        loop = loop.with_changes(target=inner, iter=loop.iter.args[0].value)
    rows = _first_rows(e, loop_names, [*outer, loop] if isinstance(loop, cst.For) else outer,
                       exact)
    if rows is not None or exact and m.matches(e, m.Subscript(value=m.Name(
            m.MatchIfTrue(lambda n: n not in loop_names)))):
        return rows
    if m.matches(e, m.Subscript(value=m.Name(), slice=[m.SubscriptElement(m.Index(
            m.Integer()))])) and e.value.value in loop_names:
        # batch[0] of a batch the loop binds: read from the first batch, bound before it
        first = _sample_of(e.value, body, loop, outer, loop_names, stmts, copied)
        return e if m.matches(first, m.Name(e.value.value)) else None
    if not isinstance(e, cst.Name):
        return None if set(tr.names_of(e).used) & loop_names else e
    name = e.value
    if name not in loop_names:  # an array the loop only reads
        return e
    for j, s in enumerate(body):
        if not isinstance(s, cst.SimpleStatementLine) or len(s.body) != 1 or not isinstance(
                s.body[0], cst.Assign) or len(s.body[0].targets) != 1:
            continue
        a = s.body[0]
        t = a.targets[0].target
        if isinstance(t, cst.Name) and t.value == name:
            return _sample_of(a.value, body[:j], loop, outer, loop_names, stmts, copied,
                              exact=exact)
        if isinstance(t, cst.Tuple) and name in [getattr(el.value, "value", None)
                                                 for el in t.elements]:
            k = [getattr(el.value, "value", None) for el in t.elements].index(name)
            if isinstance(a.value, cst.Tuple) and len(a.value.elements) == len(t.elements):
                return _sample_of(a.value.elements[k].value, body[:j], loop, outer,
                                  loop_names, stmts, copied, exact=exact)
            if isinstance(a.value, cst.Call):
                # x, y = get_batch(...): the first batch, drawn before the loop
                used = set(tr.names_of(a.value).used)
                prev = body[j - 1] if j else None
                split = prev is not None and m.matches(prev, m.SimpleStatementLine(body=[
                    m.Assign(value=m.Call(func=m.Attribute(attr=m.Name("split"))))]))
                keys = set(tr.names_of(prev).assigned) if split else set()
                # get_batch(source, i), i counting over a range: its first value
                firsts = _range_firsts([*outer, loop] if isinstance(loop, cst.For) else outer)
                if used & (loop_names - keys - set(firsts)):
                    return None
                if id(s) not in copied:
                    copied.add(id(s))
                    if split:
                        stmts.append(prev.with_changes(leading_lines=[]))
                    first = s.with_changes(leading_lines=[])
                    for k in used & set(firsts):
                        first = first.with_changes(body=[first.body[0].with_changes(
                            value=_replace_name(first.body[0].value, k, firsts[k]))])
                    stmts.append(first)
                return cst.Name(name)
            return None
    # a loop target: for x, y in loader
    if isinstance(loop, cst.For) and (isinstance(loop.target, cst.Tuple) and name in [
            getattr(el.value, "value", None) for el in loop.target.elements] or (
            isinstance(loop.target, cst.Name) and loop.target.value == name)):
        it = loop.iter
        firsts = _range_firsts(outer)
        used = set(tr.names_of(it).used)
        if used & (loop_names - set(firsts)):
            return None
        for k, v in firsts.items():
            it = _replace_name(it, k, v)
        if id(loop) not in copied:
            copied.add(id(loop))
            stmts.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(loop.target.with_changes(lpar=[], rpar=[]))
                         if isinstance(loop.target, cst.Tuple)
                         else cst.AssignTarget(loop.target)],
                value=call("next", arg(call("iter", arg(it)))))]))
        return cst.Name(name)
    return None


def _range_firsts(loops) -> dict[str, cst.BaseExpression]:
    """The first value of each loop counter ``for i in range(a, ...)``."""
    firsts = {}
    for f in loops:
        if isinstance(f.target, cst.Name) and m.matches(f.iter, m.Call(func=m.Name("range"))):
            r = f.iter.args
            firsts[f.target.value] = r[0].value if len(r) > 1 else cst.Integer("0")
    return firsts


def _replace_name(node: cst.BaseExpression, name: str, value: cst.BaseExpression):
    class R(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):
            return value if updated_node.value == name else updated_node
    return node.visit(R())


def init_statements(model: str, optimizer: str, sample: list[cst.BaseExpression] | None,
                    *, uses_train: bool, batch_stats: bool, dtype: str | None = None,
                    state: str = STATE) -> list[cst.BaseStatement]:
    """``variables = model.init(...)`` and the TrainState, before the training loop."""
    inputs = ", ".join(code(s) for s in sample) if sample is not None else "..."
    stmts = [cst.parse_statement(f"{tr.KEY}, subkey = jax.random.split({tr.KEY})\n")]
    init = cst.parse_statement(
        f'{VARIABLES} = {model}.init({{"params": subkey}}, {inputs})\n')
    if sample is None:
        init = init.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
            "# TODO(torch2jax): a sample input for model.init (the shapes of one batch) "
            "[training-loop]"))])
    stmts.append(init)
    changes = [*(["train=True"] if uses_train else []), *([f"dtype={dtype}"] if dtype else [])]
    apply_fn = f"{model}.clone({', '.join(changes)}).apply" if changes else f"{model}.apply"
    cls = "TrainState" if batch_stats else "train_state.TrainState"
    bs = f', batch_stats={VARIABLES}["batch_stats"]' if batch_stats else ""
    stmts.append(cst.parse_statement(
        f'{state} = {cls}.create(apply_fn={apply_fn}, params={VARIABLES}["params"], '
        f"tx={optimizer}{bs})\n"))
    return stmts


def final_variables(batch_stats: bool, state: str = STATE) -> cst.SimpleStatementLine:
    bs = f', "batch_stats": {state}.batch_stats' if batch_stats else ""
    return cst.parse_statement(f'{VARIABLES} = {{"params": {state}.params{bs}}}\n')


def train_state_class() -> cst.ClassDef:
    cls = cst.parse_statement("class TrainState(train_state.TrainState):\n"
                              "    batch_stats: Any\n")
    assert isinstance(cls, cst.ClassDef)
    return cls.with_changes(leading_lines=[cst.EmptyLine(indent=False),
                                           cst.EmptyLine(indent=False)])


def lr_slot(quote: str = '"') -> str:
    return f"{STATE}.opt_state.hyperparams[{quote}learning_rate{quote}]"


# ---------------------------------------------------------------------------- evaluation
def eval_step_function(noise: bool = False) -> cst.FunctionDef:
    fn = cst.parse_statement(
        f"@partial(jax.jit, static_argnums=0)\ndef {EVAL_STEP}(model, variables, *inputs):\n"
        "    return model.apply(variables, *inputs)\n" if not noise else
        f"@partial(jax.jit, static_argnums=0)\ndef {EVAL_STEP}(model, variables, {NOISE_KEY}, "
        f"*inputs):\n    return model.apply(variables, *inputs, rngs={{\"{NOISE}\": "
        f"{NOISE_KEY}}})\n")
    assert isinstance(fn, cst.FunctionDef)
    return fn.with_changes(leading_lines=[cst.EmptyLine(indent=False),
                                          cst.EmptyLine(indent=False)])


# ---------------------------------------------------------------------------- helpers
def model_functions(module: cst.Module, models: set[str], trainers: set[str]
                    ) -> dict[str, int]:
    """Free functions that call a model they receive (evaluation helpers): name -> the
    position of the model parameter. They get the model's variables after it."""
    out = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef) or stmt.name.value in trainers:
            continue
        params = [p.name.value for p in stmt.params.params]
        for i, p in enumerate(params):
            if p in models and findall(stmt.body, m.Call(func=m.Name(p))):
                out[stmt.name.value] = i
                break
    return out


class KeyedModelCalls(tr.JitModelCalls):
    """``model(x)`` -> ``eval_step(model, variables, subkey, x)`` after ``key, subkey =
    jax.random.split(key)``: the model's methods draw from the ``noise`` stream."""

    def __init__(self, models: set[str]) -> None:
        super().__init__(models, extra=(VARIABLES, SUBKEY))
        self._before: list[int] = []

    def visit_SimpleStatementLine(self, node) -> None:
        self._before.append(self.count)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self.count == self._before.pop():
            return updated_node
        split = cst.parse_statement(f"{tr.KEY}, {SUBKEY} = jax.random.split({tr.KEY})\n")
        return cst.FlattenSentinel([split.with_changes(
            leading_lines=updated_node.leading_lines), updated_node.with_changes(
            leading_lines=[])])


def statements(node) -> list[cst.BaseStatement]:
    """A statement a transformer returned, as a list (a FlattenSentinel's nodes)."""
    return list(node.nodes) if isinstance(node, cst.FlattenSentinel) else [node]


class ApplyMethods(cst.CSTTransformer):
    """``model.get_block_size()`` -> ``model.apply(variables, method="get_block_size")`` in
    a helper that receives the model and its variables: a linen module's attributes made
    in ``setup()`` (and its layers) exist only inside ``init`` / ``apply``."""

    def __init__(self, model: str, methods: set[str]) -> None:
        self.model, self.methods = model, methods

    def visit_FunctionDef(self, node) -> bool:
        return False

    def leave_Call(self, original_node, updated_node):
        f = updated_node.func
        if m.matches(f, m.Attribute(value=m.Name(self.model))) and f.attr.value in (
                self.methods) and not any(a.star for a in updated_node.args):
            args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in updated_node.args]
            return call(f"{self.model}.apply", arg(cst.Name(VARIABLES)), *args,
                        arg(cst.SimpleString(f'"{f.attr.value}"'), "method"))
        return updated_node


def module_methods(module: cst.Module, classes) -> set[str]:
    """The methods the file's module classes define, other than their constructor and
    forward."""
    return {f.name.value for c in module.body if isinstance(c, cst.ClassDef)
            and c.name.value in classes for f in c.body.body if isinstance(f, cst.FunctionDef)
            and not f.name.value.startswith("__") and f.name.value != "forward"}


_NEW_TENSORS = ("new_zeros", "new_ones", "new_full", "new_empty")
# calls that change the dtype of a model's parameters (then their dtype is not float32)
_CASTS = m.Call(func=m.Attribute(attr=m.Name("half") | m.Name("double") | m.Name("bfloat16"))
                ) | m.Call(func=m.Attribute(attr=m.Name("set_default_dtype")))


def unbound_methods(module: cst.Module, classes, qualify) -> dict[str, set[str]]:
    """The methods of the file's module classes (class -> names) that read nothing of the
    module but its fields (constructor arguments stored under their own name) and, for a
    dtype, its first parameter (``w = next(self.parameters())`` read only as ``w.dtype`` or
    by ``w.new_zeros(...)``; linen makes its parameters float32, param_dtype): they run on
    the unbound module, as flax's ``initialize_carry`` does (an RNN's ``init_hidden``), so
    they are called as written and can give ``model.init`` a sample input. None draws."""
    from torch2jax.analysis.torch_api import RANDOM
    out: dict[str, set[str]] = {}
    if findall(module, _CASTS) or any(
            "float16" in code(c) or "float64" in code(c) or "double" in code(c)
            for c in findall(module, m.Call(func=m.Attribute(attr=m.Name("to")))) if c.args):
        return out  # the parameters may be cast: their dtype is the torch program's
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef) or cls.name.value not in classes:
            continue
        fns = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
        init = fns.get("__init__")
        if init is None:
            continue
        params = {p.name.value for p in init.params.params[1:]}
        stores: dict[str, set[bool]] = {}
        for a in findall(init.body, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self"), attr=m.Name()))])):
            attr = a.targets[0].target.attr.value
            stores.setdefault(attr, set()).add(m.matches(a.value, m.Name(attr)))
        fields = {p for p in params - set(tr.names_of(init.body).assigned)
                  if stores.get(p, {True}) == {True}}
        for name, fn in fns.items():
            if name.startswith("__") or name == "forward" or any(
                    qualify(c.func) in RANDOM for c in findall(fn, m.Call())):
                continue
            if _reads_only_fields(fn, fields):
                out.setdefault(cls.name.value, set()).add(name)
    return out


def _reads_only_fields(fn: cst.FunctionDef, fields: set[str]) -> bool:
    first = m.Call(func=m.Name("next"), args=[m.Arg(m.Call(func=m.Attribute(
        value=m.Name("self"), attr=m.Name("parameters")), args=[]))])
    dtype_of: set[str] = set()
    allowed: set[int] = set()
    for s in fn.body.body:
        if m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                m.Name())], value=first)])):
            dtype_of.add(s.body[0].targets[0].target.value)
            allowed.add(id(s.body[0].value.args[0].value.func.value))
    for w in dtype_of:  # the parameter read for its dtype only
        reads = findall(fn.body, m.Attribute(value=m.Name(w), attr=m.Name("dtype")))
        news = findall(fn.body, m.Call(func=m.Attribute(value=m.Name(w), attr=m.MatchIfTrue(
            lambda n: n.value in _NEW_TENSORS))))
        if len(findall(fn.body, m.Name(w))) != 1 + len(reads) + len(news):
            return False
    reads = findall(fn.body, m.Attribute(value=m.Name("self"), attr=m.MatchIfTrue(
        lambda n: n.value in fields)))
    if len(findall(fn.body, m.Name("self"))) != len(reads) + len(allowed):
        return False  # self passed on, or an attribute that is no field (a layer)
    called = findall(fn.body, m.Call(func=m.Attribute(value=m.Name("self"))))
    return all(id(c.func.value) in allowed for c in called)


class Float32Parameters(cst.CSTTransformer):
    """In a method of :func:`unbound_methods`: ``w = next(...)`` read for its dtype is
    dropped and ``w.dtype`` is ``jnp.float32`` (linen's parameters' dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if m.matches(updated_node, m.SimpleStatementLine(body=[m.Assign(targets=[
                m.AssignTarget(m.Name())], value=m.Call(func=m.Name("next")))])) and \
                "self.variables" in code(updated_node):
            self.names.add(updated_node.body[0].targets[0].target.value)
            return cst.RemoveFromParent()
        return updated_node

    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node, m.Attribute(value=m.Name(), attr=m.Name("dtype"))) and \
                updated_node.value.value in self.names:
            return expr("jnp.float32")
        return updated_node


def returns(fn: cst.FunctionDef) -> bool:
    """Whether ``fn`` itself (not a function nested in it) has a return statement."""
    class V(cst.CSTVisitor):
        found = False

        def visit_FunctionDef(self, node) -> bool:
            return node is fn

        def visit_Lambda(self, node) -> bool:
            return False

        def visit_Return(self, node) -> None:
            V.found = True
    v = V()
    fn.visit(v)
    return V.found


def add_variables_param(fn: cst.FunctionDef, index: int) -> cst.FunctionDef:
    params = list(fn.params.params)
    params.insert(index + 1, cst.Param(cst.Name(VARIABLES)))
    return fn.with_changes(params=fn.params.with_changes(params=[
        p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in params]))


# ---------------------------------------------------------------------------- initialisation
# torch layer -> {torch weight name: the linen layer's initializer argument}
INIT_ARGS = {
    "torch.nn.Linear": {"weight": "kernel_init", "bias": "bias_init"},
    "torch.nn.Embedding": {"weight": "embedding_init"},
    "torch.nn.Conv1d": {"weight": "kernel_init", "bias": "bias_init"},
    "torch.nn.Conv2d": {"weight": "kernel_init", "bias": "bias_init"},
    "torch.nn.Conv3d": {"weight": "kernel_init", "bias": "bias_init"},
    "torch.nn.LayerNorm": {"weight": "scale_init", "bias": "bias_init"},
    **{f"torch.nn.ConvTranspose{d}d": {"weight": "kernel_init", "bias": "bias_init"}
       for d in (1, 2, 3)},
    **{f"torch.nn.BatchNorm{d}d": {"weight": "scale_init", "bias": "bias_init"}
       for d in (1, 2, 3)},
}
# layers whose JAX kernel holds torch's weight in another order of its fans (a transposed
# convolution's in / out channels): only elementwise initializers carry over
_FANS_DIFFER = {f"torch.nn.ConvTranspose{d}d" for d in (1, 2, 3)}


def _initializer(fn: str, call_node: cst.Call) -> cst.BaseExpression:
    """``torch.nn.init.normal_(w, mean=0.0, std=0.02)`` -> ``nn.initializers.normal(0.02)``;
    Untranslatable for what has no elementwise linen initializer."""
    from torch2jax.passes.common import bind, try_literal

    params = {"normal_": ("tensor", "mean", "std"), "zeros_": ("tensor",),
              "ones_": ("tensor",), "constant_": ("tensor", "val"),
              "trunc_normal_": ("tensor", "mean", "std", "a", "b")}
    structured = _structured_initializer(fn, call_node)
    if structured is not None:
        return structured
    if fn not in params:
        raise Untranslatable(f"torch.nn.init.{fn} in an init function applied with "
                             "self.apply: no linen initializer written for it")
    b = bind(call_node.args, params[fn])
    if fn == "zeros_":
        return expr("nn.initializers.zeros")
    if fn == "ones_":
        return expr("nn.initializers.ones")
    if fn == "constant_":
        return expr("nn.initializers.constant({v})", v=b.get("val"))
    mean = try_literal(b.get("mean"), 0.0) if b.get("mean") is not None else 0.0
    std = b.get("std") if b.get("std") is not None else cst.Float("1.0")
    if fn == "normal_" and mean not in (0, 0.0) and b.get("mean") is not None:
        # N(mean, std): linen's normal initializer shifted (DCGAN's BatchNorm scales)
        return expr("lambda key, shape, dtype=jnp.float32: {m} + nn.initializers.normal("
                    "stddev={s})(key, shape, dtype)", m=b.get("mean"), s=std)
    if mean not in (0, 0.0):
        raise Untranslatable(f"torch.nn.init.{fn} with a nonzero mean")
    if fn == "normal_":
        return expr("nn.initializers.normal(stddev={s})", s=std)
    lo = try_literal(b.get("a"), -2.0) if b.get("a") is not None else -2.0
    hi = try_literal(b.get("b"), 2.0) if b.get("b") is not None else 2.0
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))):
        raise Untranslatable(f"torch.nn.init.{fn} with computed bounds")
    return expr("nn.initializers.truncated_normal(stddev={s}, lower={lo}, upper={hi})",
                s=std, lo=cst.parse_expression(repr(float(lo))),
                hi=cst.parse_expression(repr(float(hi))))


def _literal_gain(node: cst.BaseExpression | None, fn: str) -> float:
    """A gain written as a number or as ``calculate_gain('relu')`` (torch's table)."""
    if node is None:
        return 1.0
    if isinstance(node, cst.Call) and m.matches(node.func, m.Name("calculate_gain") | m.Attribute(
            attr=m.Name("calculate_gain"))):
        b = bind(node.args, ("nonlinearity", "param"))
        gain = torch_init.calculate_gain(b.literal("nonlinearity", ...),
                                         b.literal("param", None))
    else:
        gain = try_literal(node, None)
    if not isinstance(gain, (int, float)) or isinstance(gain, bool):
        raise Untranslatable(f"torch.nn.init.{fn} with a computed gain")
    return float(gain)


def _structured_initializer(fn: str, call_node: cst.Call) -> cst.BaseExpression | None:
    """kaiming_* / xavier_* -> nn.initializers.variance_scaling (a linen Dense or Conv
    kernel's fans are torch's: in axis -2, out axis -1, the rest receptive field; see
    passes/torch_init.py), orthogonal_ -> nn.initializers.orthogonal (the kernel holds torch's
    first axis last, the default column_axis). None for other functions."""
    dist = "normal" if fn.endswith("normal_") else "uniform"
    if fn in ("xavier_normal_", "xavier_uniform_"):
        gain = _literal_gain(bind(call_node.args, ("tensor", "gain")).get("gain"), fn)
        return expr(f'nn.initializers.variance_scaling({gain * gain!r}, "fan_avg", "{dist}")')
    if fn in ("kaiming_normal_", "kaiming_uniform_"):
        b = bind(call_node.args, ("tensor", "a", "mode", "nonlinearity"))
        mode, nl = b.literal("mode", "fan_in"), b.literal("nonlinearity", "leaky_relu")
        gain = torch_init.calculate_gain(nl, b.literal("a", 0))
        if gain is None or mode not in ("fan_in", "fan_out"):
            raise Untranslatable(f"torch.nn.init.{fn} with mode={mode!r}, nonlinearity={nl!r}")
        return expr(f'nn.initializers.variance_scaling({gain * gain!r}, "{mode}", "{dist}")')
    if fn == "orthogonal_":
        gain = _literal_gain(bind(call_node.args, ("tensor", "gain")).get("gain"), fn)
        return expr(f"nn.initializers.orthogonal({gain!r})")
    return None


def init_specs(fn: cst.FunctionDef, qualify, named=None
               ) -> dict[str, dict[str, cst.BaseExpression]]:
    """An init function applied with ``self.apply(fn)`` (a method) or ``model.apply(fn)`` (a
    function of the module): ``if isinstance(m, nn.Linear):`` branches, or tests of the class
    name (``if classname.find("Conv") != -1:``; ``named(test, fn)``: the torch layers of the
    file it selects, None when it is no such test), of ``torch.nn.init`` calls on
    ``m.weight`` / ``m.bias`` -> {torch layer: {linen initializer argument: initializer}}.
    Untranslatable for any other statement."""
    params = [p.name.value for p in fn.params.params]
    if len(params) != 2 and not (len(params) == 1 and named is not None):
        raise Untranslatable("an init function with other than (self, module) parameters")
    mod = params[-1]
    specs: dict[str, dict[str, cst.BaseExpression]] = {}
    body = list(fn.body.body)
    while body:
        stmt = body.pop(0)
        if named is not None and m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(m.Name())], value=m.Attribute(
                    value=m.Attribute(value=m.Name(mod), attr=m.Name("__class__")),
                    attr=m.Name("__name__")))])):
            continue  # classname = m.__class__.__name__: read by the tests below
        picked = named(stmt.test, fn) if named is not None and isinstance(stmt, cst.If) \
            else None
        if picked is None and (not isinstance(stmt, cst.If) or not m.matches(stmt.test, m.Call(
                func=m.Name("isinstance"), args=[m.Arg(m.Name(mod)), m.Arg()]))):
            raise Untranslatable("an init function with statements other than isinstance "
                                 "branches")
        if picked is not None:
            layers = sorted(picked)
        else:
            kinds = stmt.test.args[1].value
            elems = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) \
                else [kinds]
            layers = [qualify(e) for e in elems]
        found: dict[str, cst.BaseExpression] = {}
        _branch(stmt.body.body, mod, found, qualify)
        for q in layers:
            if q not in INIT_ARGS:
                raise Untranslatable(f"an init function for {q}: no linen initializer "
                                     "arguments known")
            mapping = INIT_ARGS[q]
            unknown = set(found) - set(mapping)
            if unknown:
                raise Untranslatable(f"an init function setting {', '.join(sorted(unknown))} "
                                     f"of {q}")
            if any((mapping[w] != "kernel_init" or q in _FANS_DIFFER) and (
                    "variance_scaling" in code(v) or "orthogonal" in code(v))
                   for w, v in found.items()):
                # an Embedding's weight (num, dim): torch's fan_in is dim, JAX's num
                raise Untranslatable(f"an init function drawing {q}'s weight with torch's "
                                     "fans: the JAX weight's fans are not torch's")
            specs.setdefault(q, {}).update({mapping[w]: v for w, v in found.items()})
        if isinstance(stmt.orelse, cst.If):
            body.insert(0, stmt.orelse)
        elif stmt.orelse is not None:
            raise Untranslatable("an init function with an else branch")
    return specs


def _branch(stmts, mod, found, qualify) -> None:
    for s in stmts:
        if isinstance(s, cst.If) and m.matches(s.test, m.Comparison(
                left=m.Attribute(value=m.Name(mod), attr=m.Name("bias")),
                comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name(
                    "None"))])) and s.orelse is None:
            _branch(s.body.body, mod, found, qualify)  # the initializer applies if it has one
            continue
        if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                and isinstance(s.body[0], cst.Expr) and isinstance(s.body[0].value, cst.Call)):
            raise Untranslatable("an init function with statements other than "
                                 "torch.nn.init calls")
        c = s.body[0].value
        q = qualify(c.func) or ""
        if not q.startswith("torch.nn.init.") or not c.args or not m.matches(
                c.args[0].value, m.Attribute(value=m.Name(mod))):
            raise Untranslatable("an init function with statements other than "
                                 f"torch.nn.init calls on {mod}.weight / {mod}.bias")
        found[c.args[0].value.attr.value] = _initializer(q.rsplit(".", 1)[1], c)


def with_initializers(layer: cst.BaseExpression, inits: dict[str, cst.BaseExpression]
                      ) -> cst.BaseExpression:
    if not isinstance(layer, cst.Call):
        return layer
    have = {a.keyword.value for a in layer.args if a.keyword is not None}
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in layer.args]
    args += [arg(v, k) for k, v in inits.items() if k not in have]
    return layer.with_changes(args=args)


# ---------------------------------------------------------------------------- dtype
DTYPE_LAYERS = ("nn.Dense", "nn.Conv", "nn.Embed", "nn.LayerNorm", "nn.BatchNorm",
                "BatchNorm", "nn.GroupNorm", "nn.ConvTranspose")  # BatchNorm: the helper


def add_dtype_field(cls: cst.ClassDef) -> cst.ClassDef:
    """``dtype: Any = None``: the dtype the layers compute in (None: that of their inputs and
    parameters); the parameters stay float32 (param_dtype)."""
    body = list(cls.body.body)
    i = next((k for k, st in enumerate(body) if isinstance(st, cst.FunctionDef)), len(body))
    body.insert(i, cst.parse_statement("dtype: Any = None\n"))
    return cls.with_changes(body=cls.body.with_changes(body=body))


def with_dtype(layer: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(layer, cst.Call) and code(layer.func) in DTYPE_LAYERS and not any(
            a.keyword is not None and a.keyword.value == "dtype" for a in layer.args):
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in layer.args]
        return layer.with_changes(args=[*args, arg(expr("self.dtype"), "dtype")])
    if isinstance(layer, cst.Call) and code(layer.func) == "nn.Sequential" and layer.args \
            and isinstance(layer.args[0].value, cst.List):
        items = layer.args[0].value
        return layer.with_changes(args=[layer.args[0].with_changes(value=items.with_changes(
            elements=[e.with_changes(value=with_dtype(e.value)) for e in items.elements]))])
    return layer


# ---------------------------------------------------------------------------- per-epoch helpers
@dataclass
class EpochFunction:
    """``def train(model, loader, optimizer, scheduler)`` called once per epoch by the function
    that builds the optimizer: the caller creates the variables and the TrainState once; the
    function takes the state in place of the model (when it only calls it: ``train(state,
    loader, scheduler)``) or of the optimizer, and returns it first, before its own
    results."""
    name: str
    params: list[str]
    optimizer: str  # its parameters that receive the optimizer and the model
    model: str
    drop_model: bool
    # filled when its training loop is translated: what model.init's sample is made from
    step: LinenStep | None = None
    body: list[cst.BaseStatement] | None = None
    loop: cst.For | None = None
    outer: list[cst.For] | None = None
    loop_names: set[str] | None = None
    module_step: cst.FunctionDef | None = None  # the step, defined before the function
    fn: cst.FunctionDef | None = None  # the torch definition
    # the model and the optimizer are module-level names the function reads (``def
    # train(epoch)``): the state is added as its first parameter
    reads_globals: bool = False
    # its translated statements before its training loop (a state the loop carries starts
    # there: ``hidden = model.init_hidden(n)``)
    prelude: list[cst.BaseStatement] | None = None

    def bound(self, c: cst.Call) -> dict[str, cst.BaseExpression] | None:
        """The call's arguments by parameter name (None with * or ** arguments)."""
        out: dict[str, cst.BaseExpression] = {}
        for i, a in enumerate(c.args):
            if a.star:
                return None
            if a.keyword is not None:
                out[a.keyword.value] = a.value
            elif i < len(self.params):
                out[self.params[i]] = a.value
        return out

    @property
    def replaced(self) -> tuple[str, str]:
        """The parameter the state takes the place of, and the one dropped."""
        if self.reads_globals:
            return "", ""
        return (self.model, self.optimizer) if self.drop_model else (self.optimizer, "")

    def call_args(self, c: cst.Call) -> list[cst.Arg]:
        """The call's arguments with the state in place of the model or the optimizer."""
        state, dropped = self.replaced
        args = [arg(cst.Name(STATE))] if self.reads_globals else []
        for i, a in enumerate(c.args):
            p = a.keyword.value if a.keyword is not None else (
                self.params[i] if i < len(self.params) else None)
            if p == dropped:
                continue
            if p == state:
                a = a.with_changes(value=cst.Name(STATE), keyword=a.keyword and cst.Name(
                    STATE))
            args.append(a)
        return [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]


def epoch_functions(module: cst.Module, optimizers: dict[str, str], trainers: set[str],
                    unbound: dict[str, set[str]] | None = None) -> dict[str, EpochFunction]:
    """Free functions that step an optimizer and a model they receive (``optimizers``: the
    optimizer variables of other functions -> their models), every call passing them the
    same way. One that reads the module's model may also call its methods that run
    unbound (``unbound``, :func:`unbound_methods`) and clip its gradients."""
    out = {}
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef) or fn.name.value in trainers or \
                fn.params.star_arg is not cst.MaybeSentinel.DEFAULT and fn.params.star_arg:
            continue
        params = [p.name.value for p in fn.params.params]
        found: set[tuple[str, str]] = set()
        calls = findall(module, m.Call(func=m.Name(fn.name.value)))
        for c in calls:
            ep = EpochFunction(fn.name.value, params, "", "", False)
            b = ep.bound(c) or {}
            opt = [(p, v.value) for p, v in b.items() if isinstance(v, cst.Name)
                   and v.value in optimizers]
            mod = {p for p, v in b.items() if opt and isinstance(v, cst.Name)
                   and v.value == optimizers[opt[0][1]]}
            if len(opt) != 1 or len(mod) != 1:
                found.add(("", ""))
                break
            found.add((opt[0][0], mod.pop()))
        reads_globals = False
        if found == {("", "")} and not any(  # def train(epoch): the module's, read
                isinstance(v, cst.Name) and v.value in optimizers
                for c in calls for v in (self_bound(fn, c) or {}).values()):
            steps = {c.func.value.value for c in findall(fn.body, m.Call(func=m.Attribute(
                value=m.Name(), attr=m.Name("step"))))} & set(module_names(module))
            inner = local_names(fn)
            opts = [o for o in steps if o in optimizers and o not in inner
                    and optimizers[o] not in inner and optimizers[o] in module_names(module)]
            if len(opts) == 1 and calls:
                found = {(opts[0], optimizers[opts[0]])}
                reads_globals = True
        if len(found) != 1 or ("", "") in found:
            continue
        optimizer, model = found.pop()
        if not findall(fn.body, m.Call(func=m.Attribute(value=m.Name(optimizer),
                                                          attr=m.Name("step")))) or \
                not findall(fn.body, m.Call(func=m.Attribute(attr=m.Name("backward")))):
            continue
        # the model is only called (in the loss) and put in train or eval mode
        uses = len(findall(fn.body, m.Name(model)))
        calls_or_modes = len(findall(fn.body, m.Call(func=m.Name(model)) | m.Call(
            func=m.Attribute(value=m.Name(model), attr=m.Name("train") | m.Name("eval")
                             | m.Name("zero_grad")))))
        if reads_globals:  # model.init_hidden(n), clip_grad_norm_(model.parameters(), c)
            classes = {a.value.func.value for a in findall(module, m.Assign(targets=[
                m.AssignTarget(m.Name(model))], value=m.Call(func=m.Name())))}
            free = set.intersection(*[(unbound or {}).get(c, set()) for c in classes]) \
                if classes else set()
            calls_or_modes += len(findall(fn.body, m.Call(func=m.Attribute(value=m.Name(
                model), attr=m.MatchIfTrue(lambda n, free=free: n.value in free)))))
            calls_or_modes += len(findall(fn.body, m.Call(func=m.Attribute(
                attr=m.Name("clip_grad_norm_")), args=[m.Arg(m.Call(func=m.Attribute(
                    value=m.Name(model), attr=m.Name("parameters")))), m.ZeroOrMore()])))
        if reads_globals and (uses != calls_or_modes or any(
                a.star for c in calls for a in c.args)):
            continue
        out[fn.name.value] = EpochFunction(fn.name.value, params, optimizer, model,
                                           drop_model=uses == calls_or_modes, fn=fn,
                                           reads_globals=reads_globals)
    return out


def self_bound(fn: cst.FunctionDef, c: cst.Call) -> dict[str, cst.BaseExpression] | None:
    return EpochFunction(fn.name.value, [p.name.value for p in fn.params.params], "", "",
                         False).bound(c)


def module_names(module: cst.Module) -> set[str]:
    """The names the module's top-level statements assign."""
    return {n for s in module.body if isinstance(s, cst.SimpleStatementLine)
            for n in tr.names_of(s).assigned}


def carried_start(ep: EpochFunction, name: str, inner: set[str]
                  ) -> cst.SimpleStatementLine | None:
    """The statement of ``ep``'s function that starts the state ``name`` its loop carries
    (``hidden = model.init_hidden(args.batch_size)``), when it reads none of the function's
    locals: its caller can run it for the sample input of ``model.init``."""
    for s in ep.prelude or ():
        if m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                m.Name(name))])])):
            used = {n.value for n in findall(s.body[0].value, m.Name())}
            return s.with_changes(leading_lines=[]) if not used & inner else None
    return None


def takes_state(fn: cst.FunctionDef, ep: EpochFunction) -> cst.FunctionDef:
    """The state in place of the optimizer parameter (the model's dropped); every return of
    the function returns the state first, and one that returned nothing returns it."""
    state, dropped = ep.replaced
    params = [p.with_changes(name=cst.Name(STATE), annotation=None, default=None)
              if p.name.value == state else p for p in fn.params.params
              if p.name.value != dropped]
    if ep.reads_globals:
        params = [cst.Param(cst.Name(STATE)), *params]
    params = [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in params]

    class Returns(cst.CSTTransformer):
        def visit_FunctionDef(self, node) -> bool:
            return node is fn

        def visit_Lambda(self, node) -> bool:
            return False

        def leave_Return(self, original_node, updated_node):
            if updated_node.value is None:
                return updated_node.with_changes(value=cst.Name(STATE))
            value = updated_node.value
            if isinstance(value, cst.Tuple) and not value.lpar:
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return updated_node.with_changes(value=cst.Tuple(
                [cst.Element(cst.Name(STATE)), cst.Element(value)], lpar=[], rpar=[]))

    node = fn.visit(Returns())
    if not returns(fn):
        node = node.with_changes(body=node.body.with_changes(body=[
            *node.body.body, cst.parse_statement(f"return {STATE}\n")]))
    return node.with_changes(params=node.params.with_changes(params=params))


def with_state_target(target: cst.BaseExpression | None) -> cst.BaseExpression:
    """``loss, acc`` -> ``state, (loss, acc)``; none (a bare call) -> ``state``."""
    if target is None:
        return cst.Name(STATE)
    if isinstance(target, (cst.Tuple, cst.List)):
        target = cst.Tuple(target.elements, lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Tuple([cst.Element(cst.Name(STATE)), cst.Element(target)], lpar=[], rpar=[])


def bind_names(node: cst.CSTNode, values: dict[str, cst.BaseExpression]) -> cst.CSTNode:
    """The names of ``values`` replaced by their expressions (not attribute names)."""
    class R(cst.CSTTransformer):
        def visit_Attribute(self, node) -> bool:
            return False

        def leave_Attribute(self, original_node, updated_node):
            return updated_node.with_changes(value=updated_node.value.visit(self))

        def leave_Name(self, original_node, updated_node):
            return values.get(updated_node.value, updated_node)
    return node.visit(R())


def free_names(fn: cst.FunctionDef) -> set[str]:
    """Names ``fn`` reads that nothing in it binds (an over-approximation: attribute names
    count)."""
    bound = {n.value for t in findall(fn, m.AssignTarget() | m.Param() | m.For())
             for n in findall(t.target if isinstance(t, cst.For) else t, m.Name())}
    bound |= {d.name.value for d in findall(fn, m.FunctionDef())}
    return {n.value for n in findall(fn, m.Name())} - bound


def local_names(fn: cst.FunctionDef) -> set[str]:
    """The parameters of ``fn`` and every name bound in it."""
    names = {p.name.value for p in findall(fn.params, m.Param())}
    for t in findall(fn.body, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For()
                       | m.AsName() | m.FunctionDef() | m.ClassDef()):
        node = t.name if isinstance(t, (cst.AsName, cst.FunctionDef, cst.ClassDef)) else (
            t.target)
        names |= {n.value for n in findall(node, m.Name())}
    return names
