"""The GAN step (the DCGAN shape, passes/gan_step.py) rendered for ``--target linen``.

The parts are the NNX step's (:func:`torch2jax.passes.gan_step.gan_parts`): the same
statements make D's loss (the sum of its backward losses) and G's (through the updated D).
What changes is where the state lives: each model has its own ``TrainState`` (``netD_state``,
``netG_state``; with BatchNorm, the subclass with ``batch_stats``), and the step is::

    @jax.jit
    def train_step(netD_state, netG_state, noise, real_cpu, label):
        def generate(params):
            return netG_state.apply_fn({"params": params, "batch_stats": ...}, noise,
                                       mutable=["batch_stats"])
        fake, generate_vjp, updates_g = jax.vjp(generate, netG_state.params, has_aux=True)

        def loss_fn_d(params, label):      # each call of D reads the statistics the
            ...                            # previous one updated, as torch's do
        ... = jax.value_and_grad(loss_fn_d, has_aux=True)(netD_state.params, label)
        netD_state = netD_state.apply_gradients(grads=grads_d, batch_stats=...)

        def loss_fn_g(fake, label):        # the updated D, its statistics updated again
            ...
        ... = jax.value_and_grad(loss_fn_g, has_aux=True)(fake, label)
        (grads_g,) = generate_vjp(fake_grad)
        netG_state = netG_state.apply_gradients(grads=grads_g, batch_stats=...)
        return netD_state, netG_state, ...

G's forward runs once (its statistics update once), D's three times, as in torch.
``model.init`` of each model takes the inputs of its first call, computed before the loop by
the loop's own statements on its first batch (:func:`gan_samples`).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.common import Untranslatable, arg, expr
from torch2jax.passes.gan_step import GanParts, _indent
from torch2jax.targets import linen_training as lt


def state_name(model: str, taken: set[str]) -> str:
    return tr._fresh(f"{model}_state", taken)


def _applied(stmts: Sequence[cst.BaseStatement], model: str, state: str, params: str,
             updates: str, taken: set[str], batch_stats: bool) -> list[cst.BaseStatement]:
    """D's calls in a loss function through ``state.apply_fn``, each reading the statistics
    the previous call updated (the first, the state's)."""
    out: list[cst.BaseStatement] = []
    current = f"{state}.batch_stats"
    for s in stmts:
        if len(findall(s, m.Call(func=m.Name(model)))) > 1:
            raise Untranslatable(f"{model} called twice in one statement of the GAN step")
        variables = (f'{{"params": {params}, "batch_stats": {current}}}' if batch_stats
                     else f'{{"params": {params}}}')
        extra = [arg(expr('["batch_stats"]'), "mutable")] if batch_stats else []
        applier = lt._ApplyCalls(model, variables, extra, state=state)
        s2 = s.visit(applier)
        if applier.calls and batch_stats:
            s2 = lt._unpack_updates(s2, updates, taken, state=state)
            current = f'{updates}["batch_stats"]'
        if isinstance(s2, cst.FlattenSentinel):
            out.extend(s2)
        else:
            out.append(s2)
    return out


def render_step(p: GanParts, *, d_model: str, g_model: str, d_opt: str, g_opt: str,
                d_state: str, g_state: str, step_name: str, batch_stats: bool
                ) -> tuple[cst.FunctionDef, list[cst.BaseStatement], cst.SimpleStatementLine]:
    """The jitted step, the loop's new body and its call of the step."""
    taken = set(p.taken) | {d_state, g_state}
    fresh = dict(p.fresh)
    for base in ("params", "updates", "updates_g"):
        fresh[base] = tr._fresh(base, taken)
        taken.add(fresh[base])
    updates, params = fresh["updates"], fresh["params"]
    kept_d = _applied(p.kept_d, d_model, d_state, params, updates, taken, batch_stats)
    kept_g = _applied(p.kept_g, d_model, d_state, f"{d_state}.params", updates, taken,
                      batch_stats)
    if any(d_model in tr.names_of(s).used for s in [*kept_d, *kept_g]):
        raise Untranslatable(f"the GAN step reads {d_model} other than by calling it")
    fake, loss_g = p.fake, p.loss_g
    aux_d = [*p.aux_d, *([updates] if batch_stats else [])]
    aux_g = [*p.aux_g, *([updates] if batch_stats else [])]

    def ret(value: str, aux: list[str]) -> str:
        return f"        return {value}, ({tr.tuple_text(aux)})\n" if aux else \
            f"        return {value}\n"

    def lhs(value: str, aux: list[str], grads: str) -> str:
        return f"({value}, ({tr.tuple_text(aux)})), {grads}" if aux else f"{value}, {grads}"

    def vg(fn: str, aux: list[str]) -> str:
        return f"jax.value_and_grad({fn}{', has_aux=True' if aux else ''})"

    mutable = ', mutable=["batch_stats"]' if batch_stats else ""
    vars_g = (f'{{"params": {params}, "batch_stats": {g_state}.batch_stats}}' if batch_stats
              else f'{{"params": {params}}}')
    bs_d = f', batch_stats={updates}["batch_stats"]' if batch_stats else ""
    bs_g = f', batch_stats={fresh["updates_g"]}["batch_stats"]' if batch_stats else ""
    vjp_out = f"{fake}, {fresh['generate_vjp']}" + (f", {fresh['updates_g']}" if batch_stats
                                                    else "")
    models = (d_model, g_model, d_opt, g_opt)
    step_params = [d_state, g_state, *(q for q in p.params if q not in models)]
    call_args = [d_state, g_state, *(q for q in p.call_args if q not in models)]
    sig_d = ", ".join([params, *p.args_d])
    sig_g = ", ".join([fake, *p.args_g])
    returned = [d_state, g_state, *p.returned]
    src = (
        f"@jax.jit\n"
        f"def {step_name}({', '.join(step_params)}):\n"
        f"    def {fresh['generate']}({params}):\n"
        f"        return {g_state}.apply_fn({vars_g}, {p.g_args}{mutable})\n"
        f"    {vjp_out} = jax.vjp({fresh['generate']}, {g_state}.params"
        f"{', has_aux=True' if batch_stats else ''})\n\n"
        f"    def {fresh['loss_fn_d']}({sig_d}):\n{_indent(kept_d, 2)}"
        f"{ret(' + '.join(p.losses_d), aux_d)}"
        f"    {lhs('_', aux_d, fresh['grads_d'])} = {vg(fresh['loss_fn_d'], aux_d)}("
        f"{', '.join([f'{d_state}.params', *p.args_d])})\n"
        f"    {d_state} = {d_state}.apply_gradients(grads={fresh['grads_d']}{bs_d})\n\n"
        f"    def {fresh['loss_fn_g']}({sig_g}):\n{_indent(kept_g, 2)}{ret(loss_g, aux_g)}"
        f"    {lhs(loss_g, aux_g, fresh[f'{fake}_grad'])} = {vg(fresh['loss_fn_g'], aux_g)}("
        f"{sig_g})\n"
        + (f"    {d_state} = {d_state}.replace(batch_stats={updates}[\"batch_stats\"])\n"
           if batch_stats else "") +
        f"    ({fresh['grads_g']},) = {fresh['generate_vjp']}({fresh[f'{fake}_grad']})\n"
        f"    {g_state} = {g_state}.apply_gradients(grads={fresh['grads_g']}{bs_g})\n"
        f"    return {', '.join(returned)}\n")
    fn = cst.parse_statement(src)
    assert isinstance(fn, cst.FunctionDef)
    call_stmt = cst.parse_statement(f"{', '.join(returned)} = {step_name}("
                                    f"{', '.join(call_args)})\n")
    assert isinstance(call_stmt, cst.SimpleStatementLine)
    reads = [cst.parse_statement(f"{h} = {h}.item()\n") for h in p.host_reads
             if h in p.returned]
    return fn, [*p.hoisted, call_stmt, *reads, *p.after], call_stmt


def gan_samples(body: Sequence[cst.BaseStatement], calls: Sequence[cst.Call], loop: cst.For,
                outer: Sequence[cst.For], loop_names: set[str]
                ) -> tuple[list[cst.BaseStatement], list[list[cst.BaseExpression]]] | None:
    """The inputs of the models' first calls (``calls``, statements of ``body``) on the
    loop's first batch: the statements of the loop body they depend on, run before the loop
    (a loader's batch bound with ``next(iter(...))``, a range counter at its first value, a
    key split as in the loop). None when they read anything else the loop changes."""
    where = {}
    for k, s in enumerate(body):
        for c in calls:
            if findall(s, m.Call(func=m.Name(c.func.value))) and c.func.value not in where:
                where[c.func.value] = k
    if len(where) != len(calls):
        return None
    chosen: dict[int, cst.BaseStatement] = {}
    needed: set[str] = set()
    for c in calls:
        need = {u for a in c.args for u in tr.names_of(a.value).used}
        for k in range(where[c.func.value] - 1, -1, -1):
            s = body[k]
            n = tr.names_of(s)
            if not set(n.assigned) & need:
                continue
            if not m.matches(s, m.SimpleStatementLine(body=[m.Assign()])) or any(
                    findall(s, m.Call(func=m.Name(x.func.value))) for x in calls):
                return None
            chosen[k] = s
            need = (need - set(n.assigned)) | set(n.used)
        needed |= need
    stmts: list[cst.BaseStatement] = []
    firsts = lt._range_firsts([*outer, loop])
    targets = {n.value for f in [*outer, loop] for n in findall(f.target, m.Name())}
    in_body = {a for s in body for a in tr.names_of(s).assigned}
    carried = set(_read_first(body)) & in_body - targets  # (a key split at every step)
    for name in sorted(needed & loop_names):
        if name in firsts or name in carried:
            continue
        if lt._sample_of(cst.Name(name), [], loop, outer, loop_names, stmts, set()) is None:
            return None  # not a batch of the loop's loader
    stmts += [chosen[k].with_changes(leading_lines=[]) for k in sorted(chosen)]
    inputs = [[a.value for a in c.args] for c in calls]
    for k, v in firsts.items():
        stmts = [lt._replace_name(s, k, v) for s in stmts]
        inputs = [[lt._replace_name(e, k, v) for e in i] for i in inputs]
    return stmts, inputs


def _read_first(body: Sequence[cst.BaseStatement]) -> list[str]:
    """Names the body reads before it assigns them (a key split at every step)."""
    assigned: set[str] = set()
    out: list[str] = []
    for s in body:
        n = tr.names_of(s)
        out += [u for u in n.used if u not in assigned and u not in out]
        assigned |= set(n.assigned)
    return out
