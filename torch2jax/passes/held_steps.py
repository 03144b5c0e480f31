"""torch's ``.grad`` made explicit: a step whose ``optimizer.step()`` is held back by a
condition (a step every k calls) where the fused step translations refuse it.

The fused translations (passes/rewrite_steps.py, passes/rewrite_loops.py) make one
jit-compiled step of a region that runs ``backward()`` and then ``optimizer.step()``. A block
that is not a loop body (a helper's or a method's body, the module's statements) whose one
``loss.backward()`` is followed by ``if cond: optimizer.step()`` is not such a region: the
gradients of several calls add up in ``.grad`` until the step applies them. Here that state is
an explicit gradient accumulator, ``grads`` (None after ``zero_grad()``, as torch's
``set_to_none``):

* ``loss.backward()`` becomes a call of a jit-compiled gradient step that differentiates the
  backward slice of the statements before it and adds the result into ``grads``;
* ``optimizer.step()`` a jit-compiled ``optimizer.update(model, grads)``;
* ``optimizer.zero_grad()`` (or the model's) ``grads = None``.

In a function or a method, ``grads`` is module state (``global grads``: it outlives the
call, as ``.grad`` does), defined once at the top level with the two compiled functions. This
module finds the blocks (``find_held_steps``); the rewrite is
``StepsMixin._held_block`` (passes/rewrite_steps.py). What it cannot prove one step of one
optimizer (another gradient read, clipping, two optimizers passed to the helper) it does not
take: the fused translations or the output invariant (finish/grad_state.py) mark it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.grad_sum import _touches_grads

REGION_STATEMENTS = (cst.SimpleStatementLine, cst.With)


@dataclass
class HeldStep:
    optimizer: str
    model: str
    holder: str  # the accumulator (torch's .grad)
    grad_step: str  # the jit-compiled gradient step backward() becomes
    apply: str  # the jit-compiled update optimizer.step() becomes
    function: cst.FunctionDef | None  # the function around the block (None: the module)
    owner: str | None = None  # the top-level function or class the functions go before
    backward: int = 0  # id of the backward() Expr
    zeros: set[int] = field(default_factory=set)  # ids of the zero_grad() Exprs


def _params(fn: cst.FunctionDef | None) -> list[str]:
    if fn is None:
        return []
    return [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]


def _stepped(stmt: cst.CSTNode, receivers: set[str]) -> str | None:
    opt = tr._is_method_stmt(stmt, receivers, "step")
    return opt if opt is not None and not stmt.body[0].value.args else None


def _one_optimizer_passed(module: cst.Module, fn: cst.FunctionDef, opt: str,
                          method: bool) -> bool:
    """Every call of ``fn`` in the file passes the same expression for its parameter ``opt``
    (the accumulator is one per function: two optimizers would share it)."""
    names = _params(fn)
    index = names.index(opt) - (1 if method else 0)
    name = fn.name.value
    passed = set()
    for c in findall(module, m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name)))):
        value = next((a.value for a in c.args if a.keyword and a.keyword.value == opt), None)
        positional = [a for a in c.args if a.keyword is None]
        if value is None and 0 <= index < len(positional) and not positional[index].star:
            value = positional[index].value
        if value is None:
            return False
        passed.add(cst.Module(body=[]).code_for_node(value))
    return len(passed) <= 1


def _model(stmts: list, opt: str, fn, model_of: dict[str, str], models: set[str]
           ) -> str | None:
    """The model ``opt`` updates: a known optimizer's; for one the function receives, the
    one parameter of the function the statements call (``model(x)``)."""
    if opt not in _params(fn):
        return model_of.get(opt)
    params = set(_params(fn)) - {"self", "cls", opt}
    called = {c.func.value for s in stmts for c in findall(s, m.Call(func=m.Name()))
              if c.func.value in params}
    if len(called) > 1:
        called &= models
    return called.pop() if len(called) == 1 else None


def find_held_steps(module: cst.Module, blocks, model_of: dict[str, str], models: set[str],
                    taken: set[str]) -> dict[int, HeldStep]:
    """id(block) -> its held step, for each block (``blocks``: rewrite_steps._blocks) whose one
    ``backward()`` is followed by one ``if ...: optimizer.step()`` (no other step, nothing else
    that reads or changes the gradients than ``zero_grad()`` in the block or that ``if``)."""
    out: dict[int, HeldStep] = {}
    classes = {id(f): c.name.value for c in module.body if isinstance(c, cst.ClassDef)
               for f in c.body.body if isinstance(f, cst.FunctionDef)}
    tops = {id(f) for f in module.body if isinstance(f, cst.FunctionDef)}
    for owner, stmts, fn in blocks:
        if fn is not None and id(fn) not in tops and id(fn) not in classes:
            continue  # a nested function: its compiled functions would have no top level
        receivers = set(model_of) | set(_params(fn)) - {"self", "cls"}
        back = [i for i, s in enumerate(stmts) if tr._is_method_stmt(s, None, "backward")]
        if len(back) != 1 or any(_stepped(s, receivers) for s in stmts):
            continue
        ib = back[0]
        held = [s for s in stmts[ib + 1:] if isinstance(s, cst.If) and s.orelse is None
                and any(_stepped(x, receivers) for x in s.body.body)]
        if len(held) != 1:
            continue
        opt = next(_stepped(x, receivers) for x in held[0].body.body if _stepped(x, receivers))
        calls = m.Call(func=m.Attribute(value=m.Name(opt), attr=m.Name("step")))
        if sum(len(findall(s, calls)) for s in stmts) != 1:
            continue
        start = max((i + 1 for i, s in enumerate(stmts[:ib])
                     if not isinstance(s, REGION_STATEMENTS)), default=0)
        model = _model(stmts[start:ib], opt, fn, model_of, models)
        if model is None or fn is not None and opt in _params(fn) and not (
                _one_optimizer_passed(module, fn, opt, id(fn) in classes)):
            continue
        zeros, clean = set(), True
        for s in [*stmts, *held[0].body.body]:
            if s is stmts[ib] or s is held[0] or _stepped(s, {opt}):
                continue
            if tr._is_method_stmt(s, {opt, model}, "zero_grad"):
                zeros.add(id(s.body[0]))
            elif _touches_grads(s) or findall(s, m.Attribute(attr=m.Name("backward"))):
                clean = False
        if not clean:
            continue
        names = [tr._fresh(base, taken) for base in ("grads", "grad_step", "apply_grads")]
        taken |= set(names)
        owner_name = None if fn is None else classes.get(id(fn), fn.name.value)
        out[id(owner)] = HeldStep(opt, model, *names, function=fn, owner=owner_name,
                                  backward=id(stmts[ib].body[0]), zeros=zeros)
    return out
