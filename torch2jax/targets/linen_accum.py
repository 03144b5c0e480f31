"""Micro-step gradient accumulation rendered for ``--target linen``.

torch sums ``.grad`` over the micro-steps of an inner loop (``for micro_step in range(k): ...
loss.backward()``) and applies the sum with one ``optimizer.step()`` after it
(analysis/accumulate.py finds the shape). A TrainState is immutable, so the linen form is the
one a flax user writes: a ``@jax.jit`` gradient step per micro-step that adds its gradients
to an accumulator, and the TrainState rebound once after the loop::

    grads = None
    for micro_step in range(k):
        loss, grads = grad_step(state, grads, X, Y)   # grads + this micro-step's
        X, Y = get_batch("train")
    grads, _ = optax.clip_by_global_norm(c).update(grads, optax.EmptyState())
    state = state.apply_gradients(grads=grads)

The step is :func:`torch2jax.targets.linen_training.build_step` with ``summed``; this module
finds the sample input of ``model.init`` (before the outermost loop). It also finds the rest
of nanoGPT's and minGPT's training glue that linen renders differently from NNX: functions
that evaluate the module's model (``estimate_loss``), names bound to a model
(``raw_model``), and parameter counts printed by a constructor.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.targets import linen_training as lt


def before_call(body: Sequence[cst.BaseStatement], model: str) -> list[cst.BaseStatement]:
    """The statements of a micro-step's body that run before its call of ``model``."""
    out = []
    for st in body:
        if findall(st, m.Call(func=m.Name(model))):
            break
        out.append(st)
    return out


def micro_sample(step: lt.LinenStep, prefix: list[cst.BaseStatement],
                 outer_body: Sequence[cst.BaseStatement], loop: cst.For | cst.While,
                 outer: Sequence[cst.For], loop_names: set[str]
                 ) -> tuple[list[cst.BaseStatement], list[cst.BaseExpression]] | None:
    """Statements to run before the outermost loop and the inputs of ``model.init``: the
    first micro-step's. ``prefix``: the micro-step's statements before the model call."""
    called = m.Call(func=m.Name(step.function.name.value))
    head = []
    for st in outer_body:
        if findall(st, called):
            break
        head.append(st)
    before = [*head, *prefix]
    assigned = {n for st in before for n in tr.names_of(st).assigned}
    if isinstance(loop, cst.For):
        assigned |= {n.value for n in findall(loop.target, m.Name())}
    if all(isinstance(a, cst.Name) and a.value not in assigned for a in step.model_args):
        # read before the loops assign them (nanoGPT's X, Y, drawn again after the call):
        # before the loop they hold the first micro-step's inputs
        return [], list(step.model_args)
    return lt.sample_inputs(step, before, loop, outer, loop_names)


def _sets_grad_sync(st: cst.CSTNode, model: str) -> bool:
    return m.matches(st, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
        target=m.Attribute(value=m.Name(model), attr=m.Name("require_backward_grad_sync")))])]))


def without_grad_sync(body: Sequence[cst.BaseStatement], model: str
                      ) -> tuple[list[cst.BaseStatement], bool]:
    """The micro-step's body without DDP's ``model.require_backward_grad_sync = ...`` (also
    under ``if ddp:``): the translation runs one program that sums the micro-steps'
    gradients itself, with no all-reduce to hold back. Whether any was dropped."""
    out = [st for st in body if not _sets_grad_sync(st, model) and not (
        isinstance(st, cst.If) and st.orelse is None and all(
            _sets_grad_sync(s, model) for s in st.body.body))]
    return out, len(out) != len(body)


def global_evaluators(module: cst.Module, models: set[str], skip: set[str]) -> set[str]:
    """Functions of the module that call a model of the module's scope, which they neither
    receive nor bind, and train nothing (nanoGPT's ``estimate_loss()`` under
    ``@torch.no_grad()``): their model calls read the module's ``variables``, which the
    training loop binds from the TrainState before each call of them."""
    out = set()
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef) or fn.name.value in skip or findall(
                fn, m.Call(func=m.Attribute(attr=m.Name("backward") | m.Name("step")))):
            continue
        own = {p.name.value for p in [*fn.params.params, *fn.params.kwonly_params]} | {
            n for st in fn.body.body for n in tr.names_of(st).assigned}
        if any(findall(fn.body, m.Call(func=m.Name(g))) for g in models - own):
            out.add(fn.name.value)
    return out


def calls_of(names: set[str]) -> m.BaseMatcherNode:
    """A call of one of ``names`` (what reads the variables in a training loop's body)."""
    return m.Call(func=m.Name(m.MatchIfTrue(lambda n: n in names)))


_LISTS = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("parameters") | m.Name(
    "named_parameters")))


def constructor_counts(cls: cst.ClassDef) -> set[int]:
    """The statements of a module class's constructor that count its parameters for a print
    (minGPT's ``n_params = sum(p.numel() for p in self.parameters())`` and the print of it,
    nanoGPT's ``print(... self.get_num_params() ...)``, a method that reads them): ids of
    the statements. A linen module's ``setup()`` runs before its variables exist (and again
    at every apply), so such a count can only be read from the variables ``model.init``
    makes."""
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
    init = methods.get("__init__")
    if init is None:
        return set()
    counting = {n for n, f in methods.items() if n != "__init__" and findall(f, _LISTS)}
    reads = _LISTS | m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(
        m.MatchIfTrue(lambda n: n in counting))))
    lines = [st for st in init.body.body if isinstance(st, cst.SimpleStatementLine)
             and len(st.body) == 1]
    counts = {st.body[0].targets[0].target.value: st for st in lines if m.matches(
        st.body[0], m.Assign(targets=[m.AssignTarget(m.Name())])) and findall(
        st.body[0].value, reads)}
    printed = m.Expr(m.Call(func=m.Name("print")))
    prints = [st for st in lines if m.matches(st.body[0], printed)]
    # a count is dropped when nothing but prints reads it
    counts = {n: st for n, st in counts.items() if all(
        any(p is st2 for p in prints) or st2 is st for st2 in init.body.body
        if findall(st2, m.Name(n)))}
    names = m.Name(m.MatchIfTrue(lambda n: n in counts))
    dropped = {id(st) for st in prints if findall(st, reads) or findall(st, names)}
    return dropped | {id(st) for st in counts.values()}


def model_aliases(module: cst.Module, models: set[str]) -> dict[str, str]:
    """Names bound to a model under another name (nanoGPT's ``raw_model = model.module if
    ddp else model``, DDP's wrapper unwrapped): their method calls apply the model's
    variables as the model's do. Alias -> the model's name."""
    def is_model(e: cst.BaseExpression) -> bool:
        if isinstance(e, cst.Attribute) and e.attr.value == "module":
            e = e.value
        return isinstance(e, cst.Name) and e.value in models

    out: dict[str, str] = {}
    for a in findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
        v = a.value
        if isinstance(v, cst.IfExp) and is_model(v.body) and is_model(v.orelse):
            v = v.orelse
        if is_model(v) and a.targets[0].target.value not in models:
            out[a.targets[0].target.value] = (v.value if isinstance(v, cst.Attribute) else v).value
    return out
