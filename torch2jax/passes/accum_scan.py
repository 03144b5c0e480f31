"""Micro-step accumulation as one compiled step (issue 30).

The micro-step route of passes/rewrite_loops.py calls a jit-compiled gradient step per
micro-step and a jit-compiled update after the loop. Where the micro-steps' inputs do not
depend on anything the steps compute (the batches are drawn by host code: ``X, Y =
get_batch()``, ``next(loader)``), the loop only has to collect them: the gradients of all
micro-steps, the clip and the update are then one compiled step, a ``jax.lax.scan`` over the
stacked micro-batches (the form of a hand-written JAX program)::

    micro_batches = []
    for micro_step in range(k):
        micro_batches.append((X, Y))
        X, Y = get_batch()
    loss = accum_step(model, optimizer, jax.tree.map(lambda *b: np.stack(b), *micro_batches))

The step returns the last micro-step's values of what the program reads after the loop (the
loss it logs), as the loop left them. The model's other state (dropout's RNG counts, batch
statistics) is carried through the scan. :func:`build` returns None where that is not
provable (a loop statement reads what a step computes, or the model; a carried state; a loop
that breaks, continues or returns); the caller keeps the two-function route then.

Where the loop around it reads neither the model nor the optimizer between steps (the caller
checks), :meth:`ScanStep.functional` writes the step as a hand-written JAX program has it: a
``jax.jit`` of the state split once before that loop (``nnx.split((model, optimizer))``),
donated, closing over the graph definition, with the learning rate the loop sets by hand
(``optimizer.opt_state.hyperparams["learning_rate"].value = lr``) an argument of the step::

    train_state, loss = accum_step(train_state, jax.tree.map(...), lr)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.common import code


@dataclass
class ScanStep:
    function: cst.FunctionDef  # the compiled step
    init: cst.BaseStatement  # the list of micro-batches, before the loop
    body: list[cst.BaseStatement]  # the loop's body: the step call became an append
    call: str  # the statement the optimizer's step() becomes
    # (the learning rate's value, or None) -> the functional step and its call (module doc)
    render: Callable[[str | None], tuple[cst.FunctionDef, str]] | None = None

    def functional(self, lr: str | None) -> tuple[cst.FunctionDef, str]:
        assert self.render is not None
        return self.render(lr)


_JUMPS = m.Break() | m.Continue() | m.Return() | m.Yield() | m.Await()


def build(step: tr.TrainStep, loop: cst.For | cst.While, *, model: str, optimizer: str,
          acc_grads: str, name: str, clip: str, taken: set[str],
          tree_mode: bool) -> ScanStep | None:
    """``step``: the gradient step of one micro-step (``build_train_step`` with
    ``grads_out=acc_grads``); ``loop``: the micro-step loop as the source has it; ``clip``:
    the clip statement text of the step ("" when none) with ``{grads}`` to fill in."""
    fn = step.function
    stmts = list(fn.body.body)
    params = fn.params
    if len(stmts) != 4 or not isinstance(stmts[0], cst.FunctionDef) or params.star_arg not in (
            None, cst.MaybeSentinel.DEFAULT) or params.kwonly_params or params.star_kwarg:
        return None
    ret = stmts[3]
    if not m.matches(ret, m.SimpleStatementLine(body=[m.Return(value=m.Tuple())])):
        return None
    values = [e.value for e in ret.body[0].value.elements]
    if not all(isinstance(v, cst.Name) for v in values) or len(values) < 2:
        return None
    grads, outs = values[-1].value, [v.value for v in values[:-1]]
    names = [p.name.value for p in params.params]
    if len(names) < 3 or names[0] != model:
        return None
    acc, batch_params = names[1], names[2:]
    call = step.call.body[0] if isinstance(step.call, cst.SimpleStatementLine) else None
    if not isinstance(call, cst.Assign) or not isinstance(call.value, cst.Call):
        return None
    args = [a.value for a in call.value.args]
    if len(args) != len(names) or any(a.keyword or a.star for a in call.value.args):
        return None
    # what the steps compute, or the model they read, must not reach the loop's other
    # statements nor the next step's inputs (a carried state: one step at a time)
    computed = {*outs, acc_grads, model, optimizer}
    if set(tr.names_of(cst.Tuple([cst.Element(a) for a in args[2:]])).used) & computed:
        return None
    others = [s for s in step.body if s is not step.call]
    if len(others) == len(step.body) or any(set(tr.names_of(s).used) & computed
                                            for s in others):
        return None
    if findall(loop.body, _JUMPS):
        return None
    taken = taken | set(tr.names_of(fn).used) | set(tr.names_of(fn).assigned) | set(names) | {
        tr.GRAPHDEF, tr.STATE}
    for s in step.body:
        taken |= set(tr.names_of(s).used) | set(tr.names_of(s).assigned)
    fresh = {}
    for base in ("graphdef", "params", "rest", "micro_grads", "carry", "batch", "batches",
                 "micro_batches"):
        fresh[base] = tr._fresh(base, taken)
        taken.add(fresh[base])
    g, p, r = fresh["graphdef"], fresh["params"], fresh["rest"]
    single = len(batch_params) == 1
    xs = batch_params[0] if single else fresh["batches"]
    unpack = "" if single else f"        {', '.join(batch_params)} = {fresh['batch']}\n"
    item = batch_params[0] if single else fresh["batch"]
    inner = "".join("        " + line + "\n" for s in stmts[:2]
                    for line in cst.Module(body=[s]).code.rstrip("\n").split("\n"))
    out_text = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
    last = f"{outs[0]}[-1]" if len(outs) == 1 else f"jax.tree.map(lambda v: v[-1], {out_text})"

    def source(lr: str = "") -> str:
        return (
            f"    {g}, {p}, {r} = nnx.split({model}, nnx.Param, ...)\n"
            f"    def {fresh['micro_grads']}({fresh['carry']}, {item}):\n"
            f"        {acc}, {r} = {fresh['carry']}\n{unpack}"
            f"        {model} = nnx.merge({g}, {p}, {r}, copy=True)\n{inner}"
            f"        _, _, {r} = nnx.split({model}, nnx.Param, ...)\n"
            f"        return (jax.tree.map(jnp.add, {acc}, {grads}), {r}), {out_text}\n"
            f"    {acc} = jax.tree.map(jnp.zeros_like, {p})\n"
            f"    ({grads}, {r}), {out_text} = jax.lax.scan({fresh['micro_grads']}, "
            f"({acc}, {r}), {xs})\n"
            f"    nnx.update({model}, {r})\n"
            f"{clip.format(grads=grads)}{lr}"
            f"    {optimizer}.update({model}, {grads})\n")

    src = (f"{tr.nnx_jit(tree_mode)}\ndef {name}({model}, {optimizer}, {xs}):\n"
           f"{source()}    return {last}\n")
    function = cst.parse_statement(src)
    assert isinstance(function, cst.FunctionDef)
    micro = fresh["micro_batches"]
    record = code(args[2]) if single else ", ".join(code(a) for a in args[2:])
    append = cst.parse_statement(
        f"{micro}.append({record if single else f'({record})'})\n").with_changes(
        leading_lines=step.call.leading_lines)
    body = [append if s is step.call else s for s in step.body]
    init = cst.parse_statement(f"{micro} = []\n")
    stacked = f"jax.tree.map(lambda *b: np.stack(b), *{micro})"
    call_text = f"{', '.join(outs)} = {name}({model}, {optimizer}, {stacked})\n"

    def render(lr: str | None) -> tuple[cst.FunctionDef, str]:
        """The functional step: a jax.jit of the split state, the learning rate ``lr`` (the
        value the loop sets, or None) an argument written into the optimizer's injected
        hyperparameter before the update, as a strong float32 (the state keeps its type:
        one compile)."""
        inside = tr.names_of(function)  # (the parameter only shadows names of the step)
        lr_param = tr._fresh("lr", {*inside.used, *inside.assigned, *fresh.values(), *names,
                                    tr.STATE, tr.GRAPHDEF}) if lr is not None else None
        set_lr = (f"    {tr.lr_slot(optimizer)} = jnp.float32({lr_param})\n"
                  if lr_param else "")
        params = ", ".join([tr.STATE, xs, *([lr_param] if lr_param else [])])
        src = (f"@partial(jax.jit, donate_argnums=0)\ndef {name}({params}):\n"
               f"    {model}, {optimizer} = nnx.merge({tr.GRAPHDEF}, {tr.STATE})\n"
               f"{source(set_lr)}"
               f"    return nnx.state(({model}, {optimizer})), {last}\n")
        fn = cst.parse_statement(src)
        assert isinstance(fn, cst.FunctionDef)
        lhs = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
        args = ", ".join([tr.STATE, stacked, *([lr] if lr is not None else [])])
        return fn, f"{tr.STATE}, {lhs} = {name}({args})\n"

    return ScanStep(function=function, init=init, body=body, call=call_text, render=render)


_FLOAT32 = m.Call(func=m.Attribute(value=m.Name("jnp"), attr=m.Name("float32")),
                  args=[m.Arg(keyword=None)])


def functional_body(body: list[cst.BaseStatement], scan: ScanStep, *, model: str,
                    optimizer: str, readers: set[str]
                    ) -> tuple[list[cst.BaseStatement], cst.FunctionDef] | None:
    """The body of the loop around the step (translated) with the functional step's call, and
    that step (:meth:`ScanStep.functional`); None where the state cannot stay split through
    the loop: a statement of the body other than the step's call and one learning rate set
    before it uses the model or the optimizer, calls a function of ``readers`` (functions that
    read them as globals), or returns (the state would not be written back); the learning
    rate's value is rebound between its assignment and the call."""
    objects = {model, optimizer, tr.GRAPHDEF, tr.STATE}
    call = m.SimpleStatementLine(body=[m.Assign(value=m.Call(
        func=m.Name(scan.function.name.value),
        args=[m.Arg(m.Name(model)), m.Arg(m.Name(optimizer)), m.Arg()]))])
    at = [i for i, s in enumerate(body) if m.matches(s, call)]
    sets = [i for i, s in enumerate(body) if tr._sets_hyperparameter(s, optimizer)]
    if len(at) != 1 or len(sets) > 1 or sets and sets[0] > at[0]:
        return None
    lr = None
    if sets:
        value = body[sets[0]].body[0].value
        if m.matches(value, _FLOAT32):  # (its float32 is written in the step)
            value = value.args[0].value
        used = set(tr.names_of(value).used)
        # (evaluated at the call instead: no call in it, whose effects would move)
        if findall(value, m.Call()) or used & objects or any(set(tr.names_of(s).assigned) & used
                                 for s in body[sets[0] + 1:at[0]]):
            return None
        lr = code(value)
    for i, s in enumerate(body):
        if i in at or i in sets:
            continue
        n = tr.names_of(s)
        if (set(n.used) | set(n.assigned)) & objects or findall(
                s, m.Return() | m.Yield() | m.Await()) or any(
                isinstance(c.func, cst.Name) and c.func.value in readers
                for c in findall(s, m.Call())):
            return None
    fn, text = scan.functional(lr)
    new_call = cst.parse_statement(text).with_changes(leading_lines=body[at[0]].leading_lines)
    new = [new_call if i in at else s for i, s in enumerate(body) if i not in sets]
    if sets and sets[0] == 0 and new:  # (the set's blank lines stay)
        new[0] = new[0].with_changes(leading_lines=body[0].leading_lines)
    return new, fn
