"""The GAN step (the DCGAN shape, passes/gan_step.py) under ``--target equinox``.

The NNX pass writes the step from :func:`torch2jax.passes.gan_step.gan_parts` (D's loss, the
sum of its backward losses; G's, through the updated D; G's forward once, under ``nnx.vjp``).
This pass reads that step back into the same parts (:func:`parse`) and renders them as
targets/linen_gan.py does for linen, with equinox's objects: each model has its own
``eqx.nn.State`` (``netD_state``, ``netG_state``; a model with BatchNorm) and each optimizer
its own optax state (``optimizerD_state``, ``optimizerG_state``)::

    @eqx.filter_jit
    def train_step(netD, netD_state, netG, netG_state, optimizerD, optimizerD_state,
                   optimizerG, optimizerG_state, noise, real_cpu, label):
        def generate(netG):
            return jax.vmap(netG, axis_name="batch", ...)(noise, netG_state)
        fake, generate_vjp, netG_state = eqx.filter_vjp(generate, netG, has_aux=True)

        def loss_fn_d(netD, netD_state, label):   # each call of D reads the statistics
            ...                                    # the previous one updated, as torch's do
        ... = eqx.filter_value_and_grad(loss_fn_d, has_aux=True)(netD, netD_state, label)
        updates, optimizerD_state = optimizerD.update(grads_d, optimizerD_state, ...)
        netD = eqx.apply_updates(netD, updates)

        def loss_fn_g(fake, netD_state, label):   # the updated D, its statistics again
            ...
        ... = jax.value_and_grad(loss_fn_g, has_aux=True)(fake, netD_state, label)
        (grads_g,) = generate_vjp(fake_grad)
        ...
        return netD, netD_state, netG, netG_state, optimizerD_state, optimizerG_state, ...

and its call in the loop takes and rebinds them. A model is mapped over the batch with
``jax.vmap`` (BatchNorm's ``axis_name="batch"``), or called on the batch when it is kept
batched. Models with dropout (a key per step) are not translated here (Refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code


class Refused(Exception):
    """The GAN step has no equinox form here; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Gan:
    """The NNX GAN step's parts (names are the step's own)."""

    d_model: str
    g_model: str
    d_opt: str
    g_opt: str
    rest: list[str]  # the step's other parameters (the batch, labels, noise)
    generate: str
    g_args: list[cst.Arg]  # G's forward's arguments
    fake: str
    vjp: str
    loss_d: cst.FunctionDef
    args_d: list[str]
    aux_d: list[str]
    grads_d: str
    loss_g: cst.FunctionDef
    args_g: list[str]
    value_g: str
    aux_g: list[str]
    fake_grad: str
    grads_g: str
    returned: list[str]


def _vg(stmt: cst.BaseStatement, fn: str) -> tuple[str, list[str], str, list[str]] | None:
    """``(loss, (aux...)), grads = nnx.value_and_grad(fn, ...)(args)`` -> (loss, aux, grads,
    args)."""
    if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
            m.Tuple(elements=[m.Element(), m.Element(m.Name())]))], value=m.Call(func=m.Call(
                func=m.Attribute(value=m.Name("nnx"), attr=m.Name("value_and_grad")),
                args=[m.Arg(m.Name(fn)), m.ZeroOrMore()])))])):
        return None
    a = stmt.body[0]
    value, grads = (e.value for e in a.targets[0].target.elements)
    if any(x.keyword is not None or x.star or not isinstance(x.value, cst.Name)
           for x in a.value.args):
        return None
    args = [x.value.value for x in a.value.args]
    if isinstance(value, cst.Tuple):
        if len(value.elements) != 2 or not isinstance(value.elements[1].value, cst.Tuple):
            return None
        loss = code(value.elements[0].value)
        aux = [code(e.value) for e in value.elements[1].value.elements]
    else:
        loss, aux = code(value), []
    return loss, aux, grads.value, args


def _update(stmt: cst.BaseStatement, opt: str, model: str, grads: str) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call(
        func=m.Attribute(value=m.Name(opt), attr=m.Name("update")),
        args=[m.Arg(m.Name(model)), m.Arg(m.Name(grads))]))]))


def parse(fn: cst.FunctionDef) -> Gan | None:
    """The parts of the NNX GAN step ``fn`` (gan_step.build_gan_step's form), or None."""
    body = list(fn.body.body)
    params = [p.name.value for p in fn.params.params]
    if len(body) != 10 or len(params) < 4 or fn.params.star_arg is not cst.MaybeSentinel.DEFAULT \
            and fn.params.star_arg is not None or fn.params.kwonly_params:
        return None
    gen, vjp, lfd, vgd, updd, lfg, vgg, back, updg, ret = body
    d, g, od, og = params[:4]
    if not (isinstance(gen, cst.FunctionDef) and [p.name.value for p in gen.params.params]
            == [g] and m.matches(gen.body, m.IndentedBlock(body=[m.SimpleStatementLine(
                body=[m.Return(m.Call(func=m.Name(g)))])]))):
        return None
    if not m.matches(vjp, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
            m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]))], value=m.Call(
                func=m.Attribute(value=m.Name("nnx"), attr=m.Name("vjp")),
                args=[m.Arg(m.Name(gen.name.value)), m.Arg(m.Name(g)), m.ZeroOrMore()]))])):
        return None
    fake, vjp_fn = (e.value.value for e in vjp.body[0].targets[0].target.elements)
    if not isinstance(lfd, cst.FunctionDef) or not isinstance(lfg, cst.FunctionDef):
        return None
    pd = _vg(vgd, lfd.name.value)
    pg = _vg(vgg, lfg.name.value)
    if pd is None or pg is None or pd[3][:1] != [d] or pg[3][:2] != [d, fake]:
        return None
    if [p.name.value for p in lfd.params.params] != pd[3] or \
            [p.name.value for p in lfg.params.params] != pg[3]:
        return None
    grads_g = code(updg.body[0].value.args[1].value) if m.matches(updg, m.SimpleStatementLine(
        body=[m.Expr(m.Call(args=[m.Arg(), m.Arg()]))])) else ""
    if not _update(updd, od, d, pd[2]) or not _update(updg, og, g, grads_g):
        return None
    if not m.matches(back, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
            m.Tuple(elements=[m.Element(m.Name(grads_g))]))], value=m.Call(
                func=m.Name(vjp_fn), args=[m.Arg(m.Name(pg[2]))]))])):
        return None
    if not m.matches(ret, m.SimpleStatementLine(body=[m.Return()])) or ret.body[0].value is None:
        return None
    rv = ret.body[0].value
    returned = [code(e.value) for e in rv.elements] if isinstance(rv, cst.Tuple) else [code(rv)]
    for lf in (lfd, lfg):
        if not lf.body.body or not m.matches(lf.body.body[-1], m.SimpleStatementLine(
                body=[m.Return()])):
            return None
    return Gan(d_model=d, g_model=g, d_opt=od, g_opt=og, rest=params[4:],
               generate=gen.name.value, g_args=list(gen.body.body[0].body[0].value.args),
               fake=fake, vjp=vjp_fn, loss_d=lfd, args_d=pd[3][1:], aux_d=pd[1],
               grads_d=pd[2], loss_g=lfg, args_g=pg[3][2:], value_g=pg[0], aux_g=pg[1],
               fake_grad=pg[2], grads_g=grads_g, returned=returned)


def state_names(p: Gan) -> tuple[dict[str, str], dict[str, str]]:
    """The name of each model's state and of each optimizer's state."""
    return ({p.d_model: f"{p.d_model}_state", p.g_model: f"{p.g_model}_state"},
            {p.d_opt: f"{p.d_opt}_state", p.g_opt: f"{p.g_opt}_state"})


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _mapped(model: str, args: list[str], state: str | None, batched: bool) -> str:
    """``model(*args)`` on a batch: mapped over it with jax.vmap (its state unbatched), or
    called as it is when it is kept batched."""
    if batched:
        return f"{model}({', '.join([*args, *([state] if state else [])])})"
    if state is None:
        return f"jax.vmap({model})({', '.join(args)})"
    axes = ", ".join(["0"] * len(args) + ["None"])
    return (f'jax.vmap({model}, axis_name="batch", in_axes=({axes}), out_axes=(0, None))'
            f"({', '.join([*args, state])})")


class _Calls(cst.CSTTransformer):
    """Calls of D in a loss function's statement: ``out, netD_state = <mapped call>`` before
    it, the call replaced by ``out``."""

    def __init__(self, model: str, state: str | None, batched: bool, taken: set[str]) -> None:
        self.model, self.state, self.batched, self.taken = model, state, batched, taken
        self.hoisted: list[str] = []

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name(self.model)):
            return updated_node
        if any(a.keyword is not None or a.star for a in updated_node.args):
            raise Refused("a call of the GAN step's model with keyword or starred arguments")
        call = _mapped(self.model, [code(a.value) for a in updated_node.args], self.state,
                       self.batched)
        if self.state is None:
            return cst.parse_expression(call)
        out = _fresh("out", self.taken)
        self.hoisted.append(f"{out}, {self.state} = {call}")
        return cst.Name(out)


def _body(stmts: list[cst.BaseStatement], model: str, state: str | None, batched: bool,
          taken: set[str]) -> list[str]:
    out: list[str] = []
    for s in stmts:
        calls = _Calls(model, state, batched, taken)
        simple = m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
            m.Name())], value=m.Call(func=m.Name(model)))]))
        if simple and state is not None:  # `output = D(x)`: `output, state = ...`
            a = s.body[0]
            out.append(f"{code(a.targets[0].target)}, {state} = " + _mapped(
                model, [code(x.value) for x in a.value.args], state, batched))
            continue
        if len(findall(s, m.Name(model))) != len(findall(s, m.Call(func=m.Name(model)))):
            raise Refused(f"the GAN step reads {model} other than by calling it")
        new = s.visit(calls)
        out += calls.hoisted
        out += cst.Module(body=[new]).code.rstrip("\n").split("\n")
    return out


def render(fn: cst.FunctionDef, p: Gan, flags: dict[str, tuple[bool, bool]],
           batched: dict[str, bool]) -> cst.FunctionDef:
    """The equinox step for the NNX step ``fn``; ``flags``: model -> (stateful, keyed)."""
    d, g = p.d_model, p.g_model
    if flags[d][1] or flags[g][1]:
        raise Refused("a GAN step of models with dropout (a key per step) has no equinox "
                      "translation yet")
    states, opt_states = state_names(p)
    sd = states[d] if flags[d][0] else None
    sg = states[g] if flags[g][0] else None
    taken = {n.value for n in findall(fn, m.Name())} | {*states.values(), *opt_states.values()}
    updates = _fresh("updates", taken)
    kept_d = _body(list(p.loss_d.body.body[:-1]), d, sd, batched[d], taken)
    kept_g = _body(list(p.loss_g.body.body[:-1]), d, sd, batched[d], taken)
    if any(n.value == g for s in [*p.loss_d.body.body, *p.loss_g.body.body]
           for n in findall(s, m.Name())):
        raise Refused(f"the GAN step reads {g} in a loss function")

    def returned(lf: cst.FunctionDef, aux: list[str]) -> str:
        value = lf.body.body[-1].body[0].value
        if not aux:
            return code(value)
        if not isinstance(value, cst.Tuple) or len(value.elements) != 2:
            raise Refused("a loss function of the GAN step of another form")
        return code(value.elements[0].value)
    value_d, value_g = returned(p.loss_d, p.aux_d), returned(p.loss_g, p.aux_g)
    aux_d = [*([sd] if sd else []), *p.aux_d]
    aux_g = [*([sd] if sd else []), *p.aux_g]

    def tup(aux: list[str]) -> str:
        return f"({aux[0]},)" if len(aux) == 1 else f"({', '.join(aux)})"

    def ret(value: str, aux: list[str]) -> str:
        return f"        return {value}, {tup(aux)}\n" if aux else f"        return {value}\n"

    def lhs(value: str, aux: list[str], grads: str) -> str:
        return f"({value}, {tup(aux)}), {grads}" if aux else f"{value}, {grads}"

    def ind(lines: list[str]) -> str:
        return "".join(f"        {ln}\n" for ln in lines)

    g_call = _mapped(g, [code(a.value) for a in p.g_args], sg, batched[g])
    sig_d = ", ".join([d, *([sd] if sd else []), *p.args_d])
    sig_g = ", ".join([p.fake, *([sd] if sd else []), *p.args_g])
    head = [d, *([sd] if sd else []), g, *([sg] if sg else []), opt_states[p.d_opt],
            opt_states[p.g_opt]]
    params = [d, *([sd] if sd else []), g, *([sg] if sg else []), p.d_opt, opt_states[p.d_opt],
              p.g_opt, opt_states[p.g_opt], *p.rest]
    aux_vg = ", has_aux=True"
    src = (
        "@eqx.filter_jit\n"
        f"def {fn.name.value}({', '.join(params)}):\n"
        f"    def {p.generate}({g}):\n"
        f"        return {g_call}\n"
        f"    {p.fake}, {p.vjp}{', ' + sg if sg else ''} = eqx.filter_vjp({p.generate}, {g}"
        f"{aux_vg if sg else ''})\n\n"
        f"    def {p.loss_d.name.value}({sig_d}):\n{ind(kept_d)}{ret(value_d, aux_d)}"
        f"    {lhs('_', aux_d, p.grads_d)} = eqx.filter_value_and_grad({p.loss_d.name.value}"
        f"{aux_vg if aux_d else ''})({sig_d})\n"
        f"    {updates}, {opt_states[p.d_opt]} = {p.d_opt}.update({p.grads_d}, "
        f"{opt_states[p.d_opt]}, eqx.filter({d}, eqx.is_array))\n"
        f"    {d} = eqx.apply_updates({d}, {updates})\n\n"
        f"    def {p.loss_g.name.value}({sig_g}):\n{ind(kept_g)}{ret(value_g, aux_g)}"
        f"    {lhs(p.value_g, aux_g, p.fake_grad)} = jax.value_and_grad({p.loss_g.name.value}"
        f"{aux_vg if aux_g else ''})({sig_g})\n"
        f"    ({p.grads_g},) = {p.vjp}({p.fake_grad})\n"
        f"    {updates}, {opt_states[p.g_opt]} = {p.g_opt}.update({p.grads_g}, "
        f"{opt_states[p.g_opt]}, eqx.filter({g}, eqx.is_array))\n"
        f"    {g} = eqx.apply_updates({g}, {updates})\n"
        f"    return {', '.join([*head, *p.returned])}\n")
    new = cst.parse_statement(src)
    assert isinstance(new, cst.FunctionDef)
    return new.with_changes(leading_lines=fn.leading_lines)


def call(value: cst.Call, target: cst.BaseAssignTargetExpression | None, p: Gan,
         flags: dict[str, tuple[bool, bool]]) -> str:
    """The loop's call of the step: ``netD, netD_state, ..., D_x, ... = train_step(netD,
    netD_state, netG, netG_state, optimizerD, optimizerD_state, ...)``."""
    args = list(value.args)
    names = [p.d_model, p.g_model, p.d_opt, p.g_opt]
    if len(args) < 4 or any(a.keyword is not None or a.star or not m.matches(
            a.value, m.Name(n)) for a, n in zip(args, names)) or any(
                a.keyword is not None or a.star for a in args[4:]):
        raise Refused("the GAN step called with other models or optimizers than its own")
    states, opt_states = state_names(p)
    sd = [states[p.d_model]] if flags[p.d_model][0] else []
    sg = [states[p.g_model]] if flags[p.g_model][0] else []
    head = [p.d_model, *sd, p.g_model, *sg, opt_states[p.d_opt], opt_states[p.g_opt]]
    passed = [p.d_model, *sd, p.g_model, *sg, p.d_opt, opt_states[p.d_opt], p.g_opt,
              opt_states[p.g_opt], *(code(a.value) for a in args[4:])]
    rest = ([code(e.value) for e in target.elements] if isinstance(target, cst.Tuple)
            else [code(target)] if target is not None else ["_"])
    return f"{', '.join([*head, *rest])} = {code(value.func)}({', '.join(passed)})"
