"""torch's ``.grad`` made explicit: a step whose ``optimizer.step()`` is held back by a
condition (a step every k calls) where the fused step translations refuse it.

The fused translations (passes/rewrite_steps.py, passes/rewrite_loops.py) make one
jit-compiled step of a region that runs ``backward()`` and then ``optimizer.step()``. A block
(a helper's or a method's body, the module's statements, a loop body where optax.MultiSteps
does not apply, micro-steps) whose one ``loss.backward()`` is followed by ``if cond:
optimizer.step()`` (after the micro-step loop, for micro-steps) is not such a region: the
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
``StepsMixin._held_block`` (passes/rewrite_steps.py). What it cannot prove the steps of one
optimizer (another gradient read, clipping other than just before each step, two optimizers
passed to the helper, a backward() that is not held) it does not take: the fused
translations or the output invariant (finish/grad_state.py) mark it.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr


@dataclass
class HeldStep:
    optimizer: str
    model: str
    holder: str  # the accumulator (torch's .grad), one per optimizer
    grad_step: str  # the jit-compiled gradient step backward() becomes
    apply: str  # the jit-compiled update optimizer.step() becomes, one per optimizer
    function: cst.FunctionDef | None  # the function around the block (None: the module)
    backward: int = 0  # id of the backward() Expr
    node: cst.CSTNode | None = None  # that Expr (where diagnostics point)
    outer: cst.CSTNode | None = None  # the outermost loop around the block, in its function
    declare: bool = False  # the first in its function: ``global holder`` goes here


def _params(fn: cst.FunctionDef | None) -> list[str]:
    if fn is None:
        return []
    return [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]


def _stepped(stmt: cst.CSTNode, receivers: set[str] | None) -> str | None:
    opt = tr._is_method_stmt(stmt, receivers, "step")
    return opt if opt is not None and not stmt.body[0].value.args else None


def _walk(node: cst.CSTNode, fn, loops: tuple, parent):
    """Every statement block (loop bodies too): (owner, statements, function, the loops
    around it in its function, (the parent's statements, the compound statement) or None)."""
    if isinstance(node, cst.FunctionDef):
        fn, loops = node, ()
    stmts = node.body if isinstance(node, cst.Module) else getattr(
        getattr(node, "body", None), "body", None)
    if not isinstance(stmts, (list, tuple)):
        return
    owner = node if isinstance(node, cst.Module) else node.body
    inner = (*loops, node) if isinstance(node, (cst.For, cst.While)) else loops
    yield owner, list(stmts), fn, inner, parent
    for child in stmts:
        if isinstance(child, cst.BaseCompoundStatement):
            yield from _walk(child, fn, inner, (list(stmts), child))
            orelse = getattr(child, "orelse", None)
            while orelse is not None:
                yield from _walk(orelse, fn, inner, (list(stmts), child))
                orelse = getattr(orelse, "orelse", None)


def _held_if(stmts: list, receivers: set[str]) -> tuple[cst.If, str] | None:
    """The one ``if ...: optimizer.step()`` (no else) of ``stmts``, and the optimizer."""
    held = [s for s in stmts if isinstance(s, cst.If) and s.orelse is None
            and any(_stepped(x, receivers) for x in s.body.body)]
    if len(held) != 1:
        return None
    return held[0], next(_stepped(x, receivers) for x in held[0].body.body
                         if _stepped(x, receivers))


def _one_optimizer_passed(module: cst.Module, fn: cst.FunctionDef, opt: str,
                          method: bool) -> bool:
    """Every call of ``fn`` in the file passes the same expression for its parameter ``opt``
    (the accumulator is one per optimizer name: two optimizers would share it)."""
    passed = _passed(module, fn, opt, method)
    return passed is not None and len(passed) <= 1


def _passed(module: cst.Module, fn: cst.FunctionDef, param: str, method: bool
            ) -> set[str] | None:
    """The code of what each call of ``fn`` in the file passes for ``param`` (None: a call
    that passes it in a form not read here, or does not pass it)."""
    names = _params(fn)
    index = names.index(param) - (1 if method else 0)
    name = fn.name.value
    passed = set()
    for c in findall(module, m.Call(func=m.Name(name) | m.Attribute(attr=m.Name(name)))):
        value = next((a.value for a in c.args if a.keyword and a.keyword.value == param), None)
        positional = [a for a in c.args if a.keyword is None]
        if value is None and 0 <= index < len(positional) and not positional[index].star:
            value = positional[index].value
        if value is None:
            return None
        passed.add(cst.Module(body=[]).code_for_node(value))
    return passed


def _free_step(module: cst.Module, stmts: list, ib: int, fn, method: bool,
               model_of: dict[str, str]) -> tuple[str, str, list] | None:
    """A backward() whose optimizer steps outside its function, unconditionally or not (a
    helper runs ``loss.backward()`` and returns, the caller's loop calls ``optimizer.step()``):
    the gradients add up in ``.grad`` until a step applies them, wherever it stands. Taken for
    the file's one optimizer ``G`` (of model ``M``) when the block reads them under names that
    are provably ``G`` and ``M`` (the globals, or parameters every call passes them to):
    (the optimizer's and the model's names in the block, the blocks that call ``G.step()``,
    each as (its statements, the statement))."""
    if len(model_of) != 1:
        return None
    (g, model), = model_of.items()
    params = set(_params(fn)) - {"self", "cls"}

    def local(target: str) -> str | None:
        if fn is None:
            return target
        bound = [p for p in params if _passed(module, fn, p, method) == {target}]
        if len(bound) == 1:
            return bound[0]
        return None if bound or target in params else target

    opt, mdl = local(g), local(model)
    if opt is None or mdl is None:
        return None
    called = {c.func.value for s in stmts[:ib] for c in findall(s, m.Call(func=m.Name()))}
    if mdl not in called:
        return None  # the loss is not (visibly) the model's output
    tops = {id(f) for f in module.body if isinstance(f, cst.FunctionDef)}
    steps = []
    for _, block, where, _, _ in _walk(module, None, (), None):
        if where is fn and any(_stepped(s, None) for s in block):
            return None  # a step in the backward's own function: the fused routes' shapes
        if where is not None and (id(where) not in tops or g in _params(where)):
            continue  # a method's, a nested function's, or one where the name is another's
        steps += [(block, s) for s in block if _stepped(s, {g})]
    return (opt, mdl, steps) if steps else None


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


def named_backward(body: list, taken: set[str]) -> tuple[list, bool]:
    """``(loss / k).backward()`` -> ``micro_loss = loss / k`` and ``micro_loss.backward()``
    (the step builder differentiates a name); whether a name was made."""
    for i, s in enumerate(body):
        if m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.Call(
                func=m.Attribute(attr=m.Name("backward")), args=[]))])):
            receiver = s.body[0].value.func.value
            if isinstance(receiver, cst.Name):
                return body, False
            name = tr._fresh("micro_loss", taken)
            value = receiver.with_changes(lpar=[], rpar=[]) if isinstance(
                receiver, cst.BinaryOperation) else receiver
            bind = s.with_changes(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))],
                                                   value=value)])
            back = cst.parse_statement(f"{name}.backward()\n")
            return [*body[:i], bind, back, *body[i + 1:]], True
    return body, False


_BACKWARD = m.Call(func=m.Attribute(attr=m.Name("backward")))
_CLIPS = m.Name("clip_grad_norm_") | m.Name("clip_grad_value_")
_GRADS = m.Attribute(attr=m.Name("grad") | m.Name("zero_grad") | _CLIPS) | _CLIPS


def _is_clip(s: cst.CSTNode) -> bool:
    """``torch.nn.utils.clip_grad_norm_(...)`` (or ``clip_grad_value_``) as a statement."""
    return m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.Call(
        func=_CLIPS | m.Attribute(attr=_CLIPS)))]))


def _is_backward(s: cst.CSTNode) -> bool:
    """``X.backward()`` as a statement, of a name or of an expression (``(loss / k)``)."""
    return m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.Call(
        func=m.Attribute(attr=m.Name("backward")), args=[]))]))


@dataclass
class _Place:
    """Where an ``optimizer.step()`` of a held step stands."""
    key: int  # id of the ``if`` holding it, or of the step's statement
    block: list  # the statements around the step
    step: cst.SimpleStatementLine
    names: tuple[str, str]  # the model's and the optimizer's names there
    held: bool  # inside its ``if`` (every clip before it counts), or free (those just before)


def _clips_before(place: _Place) -> list:
    """The clipping statements before the step (in its ``if``; or the run just before it)."""
    before = place.block[:next(i for i, x in enumerate(place.block) if x is place.step)]
    if place.held:
        return [x for x in before if _is_clip(x)]
    run = []
    for x in reversed(before):
        if not _is_clip(x):
            break
        run.insert(0, x)
    return run


def find_held_steps(module: cst.Module, model_of: dict[str, str], models: set[str],
                    taken: set[str], multi_steps=lambda opt: False, fused=frozenset()
                    ) -> tuple[dict[int, HeldStep], dict[int, tuple]]:
    """(id(block) -> its held step, id(Expr) -> (kind, step) of each ``optimizer.step()``
    and ``zero_grad()`` the route rewrites). A block is held when its one ``backward()`` is
    followed by one ``if ...: optimizer.step()`` in the block, or, in a loop body (the
    micro-steps), after the loop. All or nothing: every ``backward()`` and every step of the
    optimizer in the file must be held, and nothing else may read or change the gradients
    (clipping, ``p.grad``), or none is taken. The fast path keeps its shape: one step every k
    batches in a loop body, where ``multi_steps(optimizer)`` says the optimizer becomes
    ``optax.MultiSteps`` (passes/rewrite_schedules.py), is left to it."""
    sites: list[tuple[int, HeldStep, cst.If, list]] = []
    fast = False  # a site the fast path takes
    classes = {id(f) for c in module.body if isinstance(c, cst.ClassDef)
               for f in c.body.body if isinstance(f, cst.FunctionDef)}
    tops = {id(f) for f in module.body if isinstance(f, cst.FunctionDef)} | classes
    for owner, stmts, fn, loops, parent in _walk(module, None, (), None):
        if fn is not None and id(fn) not in tops:
            continue  # a nested function
        receivers = set(model_of) | set(_params(fn)) - {"self", "cls"}
        back = [i for i, s in enumerate(stmts) if _is_backward(s)]
        if len(back) != 1 or any(_stepped(s, None) for s in stmts):
            continue
        ib = back[0]
        held = _held_if(stmts[ib + 1:], receivers)
        scope = stmts
        if held is None and parent is not None and isinstance(parent[1], (cst.For, cst.While)) \
                and parent[1].orelse is None and len(findall(parent[1], _BACKWARD)) == 1:
            at = next(i for i, s in enumerate(parent[0]) if s is parent[1])
            held, scope = _held_if(parent[0][at + 1:], receivers), parent[0]
        free = None
        if held is None and fn is not None and id(stmts[ib].body[0]) not in fused:
            free = _free_step(module, stmts, ib, fn, id(fn) in classes, model_of)
        if free is not None:  # the step stands elsewhere (passes/held_steps.py _free_step)
            opt, model, found = free
            (ident, gmodel), = model_of.items()
            places = [_Place(id(st), block, st, (gmodel, ident), False) for block, st in found]
            zeros = [(stmts, {opt, model})] + [(b, {ident, gmodel}) for b, _ in found]
        else:
            if held is None:
                continue
            step_if, opt = held
            model = _model(stmts[:ib], opt, fn, model_of, models)
            if model is None or fn is not None and opt in _params(fn) and not (
                    _one_optimizer_passed(module, fn, opt, id(fn) in classes)):
                continue
            ident = opt
            places = [_Place(id(step_if), step_if.body.body, next(
                x for x in step_if.body.body if _stepped(x, {opt})), (model, opt), True)]
            zeros = [([*scope, *step_if.body.body], None)]
        grad_step = tr._fresh("grad_step", taken)
        taken.add(grad_step)
        outer = loops[0] if loops else None
        in_loop = parent is not None and isinstance(parent[1], (cst.For, cst.While))
        if in_loop and free is None and scope is stmts and multi_steps(opt):
            fast = True
        sites.append((id(owner), HeldStep(opt, model, "", grad_step, "", fn,
                                          backward=id(stmts[ib].body[0]), node=stmts[ib].body[0],
                                          outer=outer),
                      ident, places, zeros))
    if not sites or fast and len(sites) == 1:
        return {}, {}
    # all or nothing
    backwards = findall(module, _BACKWARD)
    opts = {ident for _, _, ident, _, _ in sites}
    names = opts | {h.optimizer for _, h, _, _, _ in sites if h.function is None}
    steps = [c for c in findall(module, m.Call(func=m.Attribute(attr=m.Name("step"))))
             if isinstance(c.func.value, cst.Name) and c.func.value.value in names]
    places = {p.key: p for _, _, _, ps, _ in sites for p in ps}
    if len(backwards) != len(sites) or len(steps) != len(places) or len(opts) != 1:
        return {}, {}
    models_ = {h.model for _, h, _, _, _ in sites}
    holder = tr._fresh("grads", taken)
    apply = tr._fresh("apply_grads", taken | {holder})
    taken |= {holder, apply}
    exprs: dict[int, tuple] = {}
    for _, h, _, ps, zeros in sites:
        h.holder, h.apply = holder, apply
        for p in ps:
            exprs.setdefault(id(p.step.body[0]), ("step", h, *p.names))
        for block, receivers in zeros:
            receivers = receivers or {h.optimizer, *models_}
            for s in block:
                if id(s.body[0] if isinstance(s, cst.SimpleStatementLine) else s) not in exprs \
                        and tr._is_method_stmt(s, receivers, "zero_grad"):
                    exprs[id(s.body[0])] = ("zero", h)
    # nothing else reads or changes the gradients but clipping before each held step, the
    # same at each (the optimizer's chain clips what it applies: passes/rewrite_schedules.py)
    clip_stmts = {k: _clips_before(p) for k, p in places.items()}
    if len({tuple(cst.Module(body=[]).code_for_node(c.body[0]) for c in cs)
            for cs in clip_stmts.values()}) > 1:
        return {}, {}
    clipping = {id(n) for cs in clip_stmts.values() for c in cs for n in findall(c, _GRADS)}
    for node in findall(module, _GRADS):
        if id(node) not in clipping and not (
                isinstance(node, cst.Attribute) and node.attr.value == "zero_grad"):
            return {}, {}
    zero_calls = findall(module, m.Call(func=m.Attribute(attr=m.Name("zero_grad"))))
    if len(zero_calls) != sum(1 for k, *_ in exprs.values() if k == "zero"):
        return {}, {}
    declared: set[int] = set()
    for _, h, _, _, _ in sites:  # in source order: the first of each function declares
        if h.function is not None and id(h.function) not in declared:
            h.declare = True
            declared.add(id(h.function))
    return {i: h for i, h, _, _, _ in sites}, exprs
