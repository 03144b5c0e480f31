"""The GAN training step (the DCGAN shape) for --target nnx: two models, two optimizers.

The torch loop body recognised here::

    netD.zero_grad()                       # or optimizerD.zero_grad(), before D's backwards
    errD_real = criterion(netD(real), label); errD_real.backward()
    fake = netG(noise)                     # G's one forward of the iteration
    errD_fake = criterion(netD(fake.detach()), label_fake); errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()                       # before G's backward (after D's, without detach)
    errG = criterion(netD(fake), label_real); errG.backward()
    optimizerG.step()

becomes one jit-compiled step: G's forward runs once under ``nnx.vjp`` (its batch statistics
update once, as in torch); D's gradient is that of the sum of its backward losses (torch
accumulates them); D is updated; the gradient of errG with respect to ``fake`` (through the
updated D, whose statistics update on that forward too) is pulled back through G's vjp, and G
is updated. Anything else with two optimizers stays marked TODO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from torch2jax.passes.training import (
    TrainStep,
    _fresh,
    _is_method_stmt,
    _LiftBatches,
    assigned_in_order,
    names_of,
    nnx_jit,
    tuple_text,
)


def _backward_ok(stmt: cst.CSTNode) -> bool:
    """``loss.backward()`` with no argument other than ``retain_graph``."""
    call = stmt.body[0].value  # type: ignore[attr-defined]
    return all(a.keyword is not None and a.keyword.value == "retain_graph" for a in call.args)


def _reads_detached_only(stmts: Sequence[cst.CSTNode], name: str) -> bool:
    """Every read of ``name`` in ``stmts`` is ``name.detach()``."""
    total = detached = 0

    class _V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            nonlocal total
            if node.value == name:
                total += 1

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal detached
            f = node.func
            if (isinstance(f, cst.Attribute) and f.attr.value == "detach" and not node.args
                    and isinstance(f.value, cst.Name) and f.value.value == name):
                detached += 1

    for s in stmts:
        s.visit(_V())
    return total == detached


def _g_forward(stmt: cst.CSTNode, g_model: str) -> tuple[str, cst.Call] | None:
    """``fake = netG(...)``: (the name, the call)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1):
        return None
    a = stmt.body[0]
    t, v = a.targets[0].target, a.value
    if (isinstance(t, cst.Name) and isinstance(v, cst.Call) and isinstance(v.func, cst.Name)
            and v.func.value == g_model and all(not x.star and x.keyword is None
                                                for x in v.args)):
        return t.value, v
    return None


def check_gan_source(body: Sequence[cst.BaseStatement], *, d_opt: str, d_model: str,
                     g_opt: str, g_model: str) -> bool:
    """The torch loop body (before rewriting) has the D-step/G-step structure whose
    gradients the emitted step reproduces: D's grads zeroed before its first backward and
    not again before its step, G's zeroed before its backward and after any backward that
    reaches G (a D loss that reads ``fake`` without ``.detach()``), G called once."""
    body = list(body)
    steps_d = [i for i, s in enumerate(body) if _is_method_stmt(s, {d_opt}, "step")]
    steps_g = [i for i, s in enumerate(body) if _is_method_stmt(s, {g_opt}, "step")]
    back = [i for i, s in enumerate(body) if _is_method_stmt(s, None, "backward")]
    if len(steps_d) != 1 or len(steps_g) != 1 or not all(_backward_ok(body[i]) for i in back):
        return False
    sd, sg = steps_d[0], steps_g[0]
    back_d = [i for i in back if i < sd]
    back_g = [i for i in back if sd < i < sg]
    if not back_d or len(back_g) != 1 or len(back_d) + 1 != len(back):
        return False
    zero_d = [i for i, s in enumerate(body) if _is_method_stmt(s, {d_opt, d_model}, "zero_grad")]
    zero_g = [i for i, s in enumerate(body) if _is_method_stmt(s, {g_opt, g_model}, "zero_grad")]
    if not zero_d or max(zero_d) > back_d[0] or not zero_g or max(zero_g) > back_g[0]:
        return False
    forwards = [i for i, s in enumerate(body) if _g_forward(s, g_model)]
    uses_g = [i for i, s in enumerate(body[:sg]) if g_model in names_of(s).used
              and i not in zero_g]
    if len(forwards) != 1 or uses_g != forwards or forwards[0] > sd:
        return False
    fake = _g_forward(body[forwards[0]], g_model)[0]  # type: ignore[index]
    d_phase = body[forwards[0] + 1:sd]
    # a D backward that reaches G (fake not detached) must come before G's zero_grad
    return _reads_detached_only(d_phase, fake) or min(zero_g) > back_d[-1]


def _device_value(stmt: cst.BaseStatement) -> tuple[cst.BaseStatement, str | None]:
    """``D_x = output.mean().item()`` in the step: ``D_x = output.mean()`` there and the name,
    whose ``.item()`` is read on the host after the step returns it (a jit-compiled function
    cannot read a value on the host)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
            and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt, None
    value = stmt.body[0].value
    if not (isinstance(value, cst.Call) and not value.args and isinstance(
            value.func, cst.Attribute) and value.func.attr.value == "item"):
        return stmt, None
    inner = value.func.value
    return stmt.with_changes(body=[stmt.body[0].with_changes(value=inner)]), \
        stmt.body[0].targets[0].target.value


def _free_reads(stmts: Sequence[cst.BaseStatement]) -> list[str]:
    """Names the statements read before assigning them (in order)."""
    assigned: set[str] = set()
    free: list[str] = []
    for s in stmts:
        n = names_of(s)
        for u in n.used:
            if u not in assigned and u not in free:
                free.append(u)
        assigned |= set(n.assigned)
    return free


def _indent(stmts: Sequence[cst.BaseStatement], depth: int) -> str:
    pad = "    " * depth
    return "".join(pad + line + "\n" for s in stmts
                   for line in cst.Module(body=[s]).code.rstrip("\n").split("\n")
                   if line.strip())


@dataclass
class GanParts:
    """What the GAN step is made of, for a target to render (the NNX step below,
    targets/linen_gan.py): the statements of each loss function, the names it passes."""
    hoisted: list[cst.BaseStatement]  # loop statements that go before the step's call
    kept_d: list[cst.BaseStatement]  # D's loss function (both backward losses)
    kept_g: list[cst.BaseStatement]  # G's loss function (through the updated D)
    after: list[cst.BaseStatement]  # the loop body after G's step
    losses_d: list[str]
    loss_g: str
    fake: str
    g_args: str  # G's forward's arguments
    fresh: dict[str, str]  # the step's local names (generate, loss_fn_d, ...)
    taken: set[str]
    aux_d: list[str]
    aux_g: list[str]
    args_d: list[str]
    args_g: list[str]
    params: list[str]  # the step's parameters (the models and optimizers first)
    call_args: list[str]
    returned: list[str]
    host_reads: list[str]


def build_gan_step(body: Sequence[cst.BaseStatement], *, d_opt: str, d_model: str,
                   g_opt: str, g_model: str, loop_names: set[str], used_outside: set[str],
                   step_name: str, tree_mode: bool) -> TrainStep | None:
    """The step function and the loop's new body from the rewritten loop body (its torch
    form passed check_gan_source). ``used_outside``: names read in the enclosing loops
    outside this one (the step returns those it assigns). None when the body does not fit."""
    p = gan_parts(body, d_opt=d_opt, d_model=d_model, g_opt=g_opt, g_model=g_model,
                  loop_names=loop_names, used_outside=used_outside)
    if p is None:
        return None
    fresh, fake, loss_g, aux_d, aux_g = p.fresh, p.fake, p.loss_g, p.aux_d, p.aux_g
    value_d = " + ".join(p.losses_d)
    ret_d = f"        return {value_d}, ({tuple_text(aux_d)})\n" if aux_d else \
        f"        return {value_d}\n"
    ret_g = f"        return {loss_g}, ({tuple_text(aux_g)})\n" if aux_g else \
        f"        return {loss_g}\n"
    sig_d = ", ".join([d_model, *p.args_d])
    sig_g = ", ".join([d_model, fake, *p.args_g])
    lhs_d = f"(_, ({tuple_text(aux_d)})), {fresh['grads_d']}" if aux_d else \
        f"_, {fresh['grads_d']}"
    lhs_g = (f"({loss_g}, ({tuple_text(aux_g)})), {fresh[f'{fake}_grad']}" if aux_g
             else f"{loss_g}, {fresh[f'{fake}_grad']}")
    vg_d = f"nnx.value_and_grad({fresh['loss_fn_d']}{', has_aux=True' if aux_d else ''})"
    vg_g = (f"nnx.value_and_grad({fresh['loss_fn_g']}, argnums=1"
            f"{', has_aux=True' if aux_g else ''})")
    returned = p.returned
    src = (
        f"{nnx_jit(tree_mode)}\n"
        f"def {step_name}({', '.join(p.params)}):\n"
        f"    def {fresh['generate']}({g_model}):\n"
        f"        return {g_model}({p.g_args})\n"
        f"    {fake}, {fresh['generate_vjp']} = nnx.vjp({fresh['generate']}, {g_model}, "
        f"graph=False)\n\n"
        f"    def {fresh['loss_fn_d']}({sig_d}):\n{_indent(p.kept_d, 2)}{ret_d}"
        f"    {lhs_d} = {vg_d}({sig_d})\n"
        f"    {d_opt}.update({d_model}, {fresh['grads_d']})\n\n"
        f"    def {fresh['loss_fn_g']}({sig_g}):\n{_indent(p.kept_g, 2)}{ret_g}"
        f"    {lhs_g} = {vg_g}({sig_g})\n"
        f"    ({fresh['grads_g']},) = {fresh['generate_vjp']}({fresh[f'{fake}_grad']})\n"
        f"    {g_opt}.update({g_model}, {fresh['grads_g']})\n"
        f"    return {', '.join(returned)}\n")
    fn = cst.parse_statement(src)
    assert isinstance(fn, cst.FunctionDef)
    call_stmt = cst.parse_statement(f"{', '.join(returned)} = {step_name}("
                                    f"{', '.join(p.call_args)})\n")
    # the host reads (.item()) of values the step computes, after it
    reads = [cst.parse_statement(f"{h} = {h}.item()\n") for h in p.host_reads
             if h in returned]
    return TrainStep(function=fn, body=[*p.hoisted, call_stmt, *reads, *p.after],
                     call=call_stmt)


def gan_parts(body: Sequence[cst.BaseStatement], *, d_opt: str, d_model: str, g_opt: str,
              g_model: str, loop_names: set[str], used_outside: set[str]) -> GanParts | None:
    """The parts of the GAN step (:class:`GanParts`); None when the body does not fit."""
    body = [s for s in body if not _is_method_stmt(s, {d_opt, d_model, g_opt, g_model},
                                                   "zero_grad")]
    steps_d = [i for i, s in enumerate(body) if _is_method_stmt(s, {d_opt}, "step")]
    steps_g = [i for i, s in enumerate(body) if _is_method_stmt(s, {g_opt}, "step")]
    if len(steps_d) != 1 or len(steps_g) != 1 or steps_d[0] > steps_g[0]:
        return None
    sd, sg = steps_d[0], steps_g[0]
    region, after = body[:sg], body[sg + 1:]
    models = {d_model, g_model, d_opt, g_opt}
    losses_d: list[str] = []
    loss_g: str | None = None
    forward: tuple[str, cst.Call] | None = None
    hoisted: list[cst.BaseStatement] = []
    kept_d: list[cst.BaseStatement] = []
    kept_g: list[cst.BaseStatement] = []
    diff: set[str] = {d_model}
    kept_reads: set[str] = set()
    kept_writes: set[str] = set()
    host_reads: list[str] = []  # name = value.item() in the step: the step returns value
    for i, s in enumerate(region):
        if i == sd:
            continue
        loss = _is_method_stmt(s, None, "backward")
        if loss is not None:
            if i < sd:
                losses_d.append(loss)
            elif loss_g is None:
                loss_g = loss
            else:
                return None
            continue
        n = names_of(s)
        used, assigned = set(n.used), set(n.assigned)
        g = _g_forward(s, g_model)
        if g is not None:
            if forward is not None or i > sd or used & kept_writes or assigned & (
                    kept_reads | kept_writes):
                return None
            forward = g
            diff.add(g[0])
            kept_reads |= used
            kept_writes |= assigned
            continue
        if g_model in used or {d_opt, g_opt} & used or assigned & models:
            return None
        # a statement that reads the models' results, or that does not commute with what
        # stays in the step before it, stays in the step; the others go before its call
        if used & diff or used & kept_writes or assigned & (kept_reads | kept_writes):
            if not (isinstance(s, cst.SimpleStatementLine) and all(
                    isinstance(b, (cst.Assign, cst.AnnAssign)) for b in s.body)):
                return None
            s, host = _device_value(s)
            if host is not None:
                host_reads.append(host)
            text = cst.Module(body=[s]).code
            if ".item(" in text or ".tolist(" in text:
                return None  # host values inside the jit-compiled step
            (kept_d if i < sd else kept_g).append(s)
            if used & diff:
                diff |= assigned
            kept_reads |= used
            kept_writes |= assigned
        else:
            hoisted.append(s)
    if forward is None or not losses_d or loss_g is None:
        return None
    fake, g_call = forward
    if not {loss_g, *losses_d} <= set(assigned_in_order([*kept_d, *kept_g])):
        return None
    if d_model not in {u for s in kept_g for u in names_of(s).used}:
        return None
    taken = set(used_outside) | set(loop_names) | {u for s in body for u in names_of(s).used} \
        | set(assigned_in_order(body)) | models
    lifter = _LiftBatches({*models, fake, *assigned_in_order([*kept_d, *kept_g])}, loop_names,
                          taken)
    g_call = g_call.visit(lifter)  # type: ignore[assignment]
    kept_d = [s.visit(lifter) for s in kept_d]
    kept_g = [s.visit(lifter) for s in kept_g]
    taken |= {name for name, _ in lifter.lifted}
    fresh = {}
    for base in ("generate", "generate_vjp", "loss_fn_d", "grads_d", "loss_fn_g",
                 f"{fake}_grad", "grads_g"):
        fresh[base] = _fresh(base, taken)
        taken.add(fresh[base])

    later = set(used_outside) | {u for s in after for u in names_of(s).used}
    assigned_d, assigned_g = assigned_in_order(kept_d), assigned_in_order(kept_g)
    reads_g = set(_free_reads(kept_g))
    aux_d = [a for a in assigned_d if a in reads_g or a in later]
    aux_g = [a for a in assigned_g if a in later and a != loss_g]
    # names a loss function reads from outside before assigning them: its arguments
    args_d = [u for u in _free_reads(kept_d) if u in assigned_d and u != d_model]
    args_g = [u for u in _free_reads(kept_g) if u in assigned_g and u not in (d_model, fake)]
    # the step's parameters: loop variables it reads before assigning them
    inside = [*kept_d, *kept_g]
    step_reads = [u for u in [*(u for a in g_call.args for u in names_of(a).used),
                              *_free_reads(inside)]
                  if u not in (fake, *models)]
    params = [d_model, g_model, d_opt, g_opt]
    for u in step_reads:
        if u in loop_names and u not in params:
            params.append(u)
    call_args = [*params, *(cst.Module(body=[]).code_for_node(e) for _, e in lifter.lifted)]
    params += [name for name, _ in lifter.lifted]

    g_args = ", ".join(cst.Module(body=[]).code_for_node(a.value) for a in g_call.args)
    returned = [a for a in [*aux_d, *aux_g, fake] if a in later]
    returned = list(dict.fromkeys([*returned, loss_g]))
    return GanParts(hoisted=hoisted, kept_d=kept_d, kept_g=kept_g, after=after,
                    losses_d=losses_d, loss_g=loss_g, fake=fake, g_args=g_args, fresh=fresh,
                    taken=taken, aux_d=aux_d, aux_g=aux_g, args_d=args_d, args_g=args_g,
                    params=params, call_args=call_args, returned=returned,
                    host_reads=host_reads)


def names_outside(outer: cst.CSTNode, loop: cst.CSTNode) -> set[str]:
    """Names read in ``outer`` (the outermost enclosing loop) outside ``loop``."""
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if node is loop:
                return False
            if isinstance(node, cst.Name):
                found.add(node.value)
            return True

    if outer is not loop:
        outer.visit(_V())
    return found
