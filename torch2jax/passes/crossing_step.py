"""A step whose backward slice crosses another model's step (NNX; issue 28).

torch records the graph of a forward when it runs and differentiates it at ``backward()``,
whatever ran in between. A GAN's D step moved into a function called from the loop is the case
seen::

    fake = netG(noise)                 # G's forward: torch records its graph here
    errD, D_x = train_d(real, fake)    # steps optimizerD (reads fake.detach() only)
    netG.zero_grad()
    errG = criterion(netD(fake), label)
    errG.backward()                    # through the updated netD, then G's recorded graph
    optimizerG.step()

The fused step (one ``nnx.value_and_grad`` of G) would run G's forward again after D's step
(its batch statistics updated twice, its dropout drawn again) and close over ``netD``. Here
the recorded graph is made explicit: G's forward becomes a jit-compiled ``nnx.vjp`` that
returns ``fake`` and its pullback, kept until the backward, as torch keeps the graph::

    fake, fake_vjp = forward_netG(netG, noise)
    errD, D_x = train_d(real, fake)
    errG = train_step(netG, optimizerG, netD, fake, fake_vjp, label)

and the backward becomes a jit-compiled step that differentiates the rest of the loss slice
with respect to ``fake`` (with ``netD`` an argument, so its current parameters and its batch
statistics' update), pulls that gradient back through ``fake_vjp`` and applies it.

What it proves first (on the torch source), else the loop stays marked: one backward() and one
step() of G's optimizer; G called once in the slice (``F = G(...)``) and nowhere else before
the step; G's gradients zeroed before the backward with no backward that could reach G between
the zero_grad() and it (a function called there reads ``F`` only as ``F.detach()``); every
other model the loss reads has its gradients zeroed before the first backward of the block
that steps it (torch adds the G loss's gradients into its ``.grad`` too, which that zero_grad()
discards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import gan_step as gan
from torch2jax.passes import training as tr


@dataclass
class CrossingStep:
    forward: cst.FunctionDef  # the model's forward under nnx.vjp: (output, pullback)
    step: cst.FunctionDef  # the backward through the pullback and the update
    body: list[cst.BaseStatement]  # the loop's new body


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _backwards(stmts: Sequence[cst.CSTNode]) -> list[int]:
    return [i for i, s in enumerate(stmts) if tr._is_method_stmt(s, None, "backward")]


def _zeroed_first(stmts: Sequence[cst.CSTNode], receivers: set[str]) -> bool:
    """A ``zero_grad()`` of ``receivers`` comes before the first backward of ``stmts``."""
    back = _backwards(stmts)
    zero = [i for i, s in enumerate(stmts) if tr._is_method_stmt(s, receivers, "zero_grad")]
    return bool(back) and bool(zero) and zero[0] < back[0]


def others_zeroed(module: cst.Module, loop_body: Sequence[cst.CSTNode],
                  optimizers: dict[str, str]) -> bool:
    """Each optimizer of ``optimizers`` (name -> its model) steps only at the top level of a
    top-level function's body or of the loop body, and that block zeroes its gradients before
    its first backward (a gradient the crossing backward adds to its model is discarded)."""
    blocks = [list(f.body.body) for f in module.body if isinstance(f, cst.FunctionDef)]
    blocks.append(list(loop_body))
    for opt, model in optimizers.items():
        calls = findall(module, m.Call(func=m.Attribute(value=m.Name(opt), attr=m.Name("step"))))
        held = [b for b in blocks if any(tr._is_method_stmt(s, {opt}, "step") for s in b)]
        top = sum(1 for b in held for s in b if tr._is_method_stmt(s, {opt}, "step"))
        if not calls or top != len(calls) or not all(
                _zeroed_first(b, {opt, model}) for b in held):
            return False
    return True


def _reads_only_detached(module: cst.Module, call: cst.Call, name: str) -> bool:
    """The top-level function ``call`` calls reads ``name`` (and the parameter it passes
    ``name`` to) only as ``.detach()``, and runs no backward itself through it."""
    fn = next((f for f in module.body if isinstance(f, cst.FunctionDef)
               and isinstance(call.func, cst.Name) and f.name.value == call.func.value), None)
    if fn is None:
        return False
    params = [p.name.value for p in fn.params.params]
    bound = {name}
    for i, a in enumerate(call.args):
        if a.star:
            return False
        if name in tr.names_of(a.value).used:
            if not isinstance(a.value, cst.Name):
                return False
            target = a.keyword.value if a.keyword else params[i] if i < len(params) else None
            if target is None:
                return False
            bound.add(target)
    return all(gan._reads_detached_only(fn.body.body, n) for n in bound)


def grads_isolated(module: cst.Module, orig: Sequence[cst.CSTNode], *, optimizer: str,
                   model: str, fake: str) -> bool:
    """The torch loop body zeroes the model's gradients before its backward, and nothing
    between that zero_grad() and the backward can add to them (another backward, or a
    function of the file that reads ``fake`` otherwise than detached)."""
    back = _backwards(orig)
    zero = [i for i, s in enumerate(orig[:back[0]] if back else [])
            if tr._is_method_stmt(s, {optimizer, model}, "zero_grad")]
    if len(back) != 1 or not zero:
        return False
    for s in orig[zero[-1] + 1:back[0]]:
        if findall(s, m.Call(func=m.Attribute(attr=m.Name("backward")))):
            return False
        for call in findall(s, m.Call(func=m.Name())):
            local = any(isinstance(f, cst.FunctionDef) and f.name.value == call.func.value
                        for f in module.body)
            if local and not _reads_only_detached(module, call, fake):
                return False
    # (a backward through G's graph before G's own would free it: torch then raises, unless
    # it retains the graph)
    return not findall(module, m.Arg(keyword=m.Name("retain_graph")))


def build_crossing_step(body: Sequence[cst.BaseStatement], *, optimizer: str, model: str,
                        others: Sequence[str], loop_names: set[str], taken: set[str],
                        read_later: set[str], step_name: str, tree_mode: bool,
                        functions: set[str]) -> CrossingStep | None:
    """The rewritten loop body with the model's forward carried to its backward (the module
    docstring); None when it does not have that shape. ``others``: the models of other
    optimizers the loss reads (arguments of the step); ``functions``: the file's functions."""
    body = [s for s in body if not tr._is_method_stmt(s, {optimizer, model}, "zero_grad")]
    back = _backwards(body)
    steps = [i for i, s in enumerate(body) if tr._is_method_stmt(s, {optimizer}, "step")]
    if len(back) != 1 or len(steps) != 1 or steps[0] < back[0]:
        return None
    ib, istep = back[0], steps[0]
    loss = tr._is_method_stmt(body[ib], None, "backward")
    before = body[:ib]
    in_slice = tr.loss_slice(before, loss)
    forwards = [i for i, s in enumerate(before) if in_slice[i] and gan._g_forward(s, model)]
    if len(forwards) != 1:
        return None
    f = forwards[0]
    fake, g_call = gan._g_forward(before[f], model)  # type: ignore[misc]
    if any(model in tr.names_of(s).used for i, s in enumerate(body[:istep]) if i != f):
        return None
    loss_body, _ = tr.split_loss(before[f + 1:], in_slice[f + 1:], fake)
    if not loss_body or any(optimizer in tr.names_of(s).used for s in loss_body):
        return None
    if tr._read_before_bound(loss_body, fake):
        return None  # a value carried between steps (a recurrent state): not this shape
    first = next(i for i, s in enumerate(before) if s is loss_body[0])
    defined = tr.assigned_in_order(loss_body)
    # the statements after the loss's first one that it does not hold: before its call when
    # they commute with the loss statements before them, after it when they read what those
    # computed and change nothing the later ones read
    pre: list[cst.BaseStatement] = []
    post: list[cst.BaseStatement] = []
    loss_ids = {id(s) for s in loss_body}
    for i, s in enumerate(before[first:], first):
        if id(s) in loss_ids:
            continue
        if not (isinstance(s, cst.SimpleStatementLine) and all(
                isinstance(b, (cst.Assign, cst.AnnAssign)) for b in s.body)):
            return None
        n = tr.names_of(s)
        used, assigned = set(n.used), set(n.assigned)
        earlier = [x for x in before[first:i] if id(x) in loss_ids]
        later = [x for x in before[i + 1:] if id(x) in loss_ids]
        reads_e = {u for x in earlier for u in tr.names_of(x).used}
        writes_e = {a for x in earlier for a in tr.names_of(x).assigned}
        reads_l = {u for x in later for u in tr.names_of(x).used}
        writes_l = {a for x in later for a in tr.names_of(x).assigned}
        if used & {model, optimizer, *others} or any(
                c.func.value in functions for c in findall(s, m.Call(func=m.Name()))):
            return None  # it could change what the loss statements before it read
        if not used & writes_e and not assigned & (reads_e | writes_e):
            pre.append(s)
        elif not assigned & (reads_l | writes_l):
            post.append(s)
        else:
            return None
    after = body[ib + 1:istep]
    if any({model, optimizer} & set(tr.names_of(s).used) for s in after):
        return None  # reads the model between backward() and step()
    rest = body[istep + 1:]
    used_later = set(read_later)
    for s in [*post, *after, *rest]:
        used_later |= set(tr.names_of(s).used)
    aux = [d for d in defined if d != loss and d in used_later]
    names = set(taken) | set(loop_names) | set(used_later) | {
        u for s in body for u in tr.names_of(s).used} | set(tr.assigned_in_order(body))
    lifter = tr._LiftBatches({model, fake, *others, *defined}, loop_names, names)
    loss_body = [s.visit(lifter) for s in loss_body]
    names |= {n for n, _ in lifter.lifted}
    free = []
    for s in loss_body:
        for u in tr.names_of(s).used:
            if u in loop_names and u not in defined and u not in (fake, *others) and (
                    u not in free):
                free.append(u)
    g_lifter = tr._LiftBatches({model}, loop_names, names)
    g_call = g_call.visit(g_lifter)
    names |= {n for n, _ in g_lifter.lifted}
    g_free = [u for a in g_call.args for u in tr.names_of(a.value).used
              if u in loop_names and u != model]
    fresh: dict[str, str] = {}
    for base in (f"forward_{model}", "generate", f"{fake}_vjp", "loss_fn", f"{fake}_grad",
                 "grads"):
        fresh[base] = tr._fresh(base, names)
        names.add(fresh[base])
    fwd_name, vjp = fresh[f"forward_{model}"], fresh[f"{fake}_vjp"]
    fwd_params = [model, *dict.fromkeys(g_free), *(n for n, _ in g_lifter.lifted)]
    fwd_args = [model, *dict.fromkeys(g_free), *(_code(e) for _, e in g_lifter.lifted)]
    jit = tr.nnx_jit(tree_mode)
    forward = cst.parse_statement(
        f"{jit}\ndef {fwd_name}({', '.join(fwd_params)}):\n"
        f"    def {fresh['generate']}({model}):\n"
        f"        return {model}({', '.join(_code(a.value) for a in g_call.args)})\n"
        f"    return nnx.vjp({fresh['generate']}, {model}, graph=False)\n")
    forward_call = before[f].with_changes(body=[cst.parse_statement(
        f"{fake}, {vjp} = {fwd_name}({', '.join(fwd_args)})\n").body[0]])
    diff = [*others, fake]
    params = [model, optimizer, *others, fake, vjp, *free, *(n for n, _ in lifter.lifted)]
    args = [model, optimizer, *others, fake, vjp, *free, *(_code(e) for _, e in lifter.lifted)]
    inner = gan._indent([s.with_changes(leading_lines=[]) if i == 0 else s
                         for i, s in enumerate(loss_body)], 2)
    has_aux = ", has_aux=True" if aux else ""
    ret_inner = f"        return {loss}, ({tr.tuple_text(aux)})\n" if aux else \
        f"        return {loss}\n"
    lhs = f"({loss}, ({tr.tuple_text(aux)})), {fresh[f'{fake}_grad']}" if aux else \
        f"{loss}, {fresh[f'{fake}_grad']}"
    step = cst.parse_statement(
        f"{jit}\ndef {step_name}({', '.join(params)}):\n"
        f"    def {fresh['loss_fn']}({', '.join(diff)}):\n{inner}{ret_inner}"
        f"    {lhs} = nnx.value_and_grad({fresh['loss_fn']}, argnums={len(others)}"
        f"{has_aux})({', '.join(diff)})\n"
        f"    ({fresh['grads']},) = {vjp}({fresh[f'{fake}_grad']})\n"
        f"    {optimizer}.update({model}, {fresh['grads']})\n"
        f"    return {', '.join([loss, *aux])}\n")
    call = cst.parse_statement(f"{', '.join([loss, *aux])} = {step_name}({', '.join(args)})\n")
    between = [s for s in before[f + 1:first] if id(s) not in loss_ids]
    new_body = [*before[:f], forward_call, *between, *pre, call, *post, *after, *rest]
    assert isinstance(forward, cst.FunctionDef) and isinstance(step, cst.FunctionDef)
    return CrossingStep(forward=forward, step=step, body=new_body)
