"""Gradient accumulation written as micro-steps (the shape of GPT training scripts)::

    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch('train')
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

An inner loop whose body calls ``backward()`` once and steps nothing, followed in the same
block by the optimizer's ``step()``. The optimizer may be built in another file
(``optimizer = model.configure_optimizers(...)``): the translation (passes/rewrite_loops.py) is an
accumulating step that does not touch the optimizer's transform: a jit-compiled gradient
step per micro-step, the gradients summed on the way (torch sums them in ``.grad``), then
clipping of the sum and one ``optimizer.update``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

CLIP_NORM = "clip_grad_norm_"


@dataclass
class MicroSteps:
    loop: cst.For | cst.While
    optimizer: str
    model: str
    max_norm: cst.BaseExpression | None = None  # clip_grad_norm_ of the summed gradients
    clip_direct: bool = False  # the clip is a statement of the step's block (no condition)
    # the statements between the loop and the optimizer's step
    between: list[cst.BaseStatement] = field(default_factory=list)
    # the micro-batches may differ in shape (drawn from an iterator: a loader's last,
    # shorter batch): they are not stacked (passes/accum_scan.py)
    ragged: bool = False


@dataclass
class Accumulation:
    loops: dict[int, MicroSteps] = field(default_factory=dict)  # id(inner For) ->
    steps: dict[int, MicroSteps] = field(default_factory=dict)  # id(Expr of step()) ->
    clips: dict[int, MicroSteps] = field(default_factory=dict)  # id(Expr of the clip) ->
    dropped: set[int] = field(default_factory=set)  # zero_grad / unscale_ Exprs of the step
    dropped_ifs: set[int] = field(default_factory=set)  # ifs around a clip folded in the step
    done: set[int] = field(default_factory=set)  # loops the rewrite translated
    applies: dict[int, str] = field(default_factory=dict)  # id(site) -> its apply function
    # id(site) -> the call of the one compiled step (passes/accum_scan.py) at the step()
    scans: dict[int, str] = field(default_factory=dict)
    folded: set[int] = field(default_factory=set)  # sites whose clip is in the apply function
    # id(the loop around a one-step site, outermost in its scope) -> (site, its ScanStep, the
    # nnx.jit step placed): the loop may make it the functional step (rewrite_loops.py)
    functional: dict[int, tuple] = field(default_factory=dict)
    # optimizers returned by a model's method (model.configure_optimizers(...)) ->
    # "model.configure_optimizers"
    foreign: dict[str, str] = field(default_factory=dict)


def _method(stmt: cst.CSTNode, meth: str) -> tuple[str, cst.Call] | None:
    """``recv.meth(...)`` as an expression statement: (recv, call)."""
    if m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Attribute(
            value=m.Name(), attr=m.Name(meth))))])):
        call = stmt.body[0].value
        return call.func.value.value, call
    return None


def _stepped(stmt: cst.CSTNode, scalers: set[str]) -> str | None:
    """``optimizer.step()`` or ``scaler.step(optimizer)``: the optimizer's name."""
    hit = _method(stmt, "step")
    if hit is None:
        return None
    recv, call = hit
    if recv in scalers:
        return call.args[0].value.value if call.args and isinstance(
            call.args[0].value, cst.Name) else None
    return None if call.args else recv


def _blocks(node: cst.CSTNode):
    for block in findall(node, m.IndentedBlock()):
        yield block.body
    yield node.body


def find_micro_steps(module: cst.Module, optimizers: dict[str, str], model_vars: set[str],
                     scalers: set[str]) -> Accumulation:
    """``optimizers``: optimizer variable -> model variable, of the optimizers built in this
    file; an optimizer returned by a method of a model (``model.configure_optimizers``)
    counts too."""
    known = dict(optimizers)
    acc = Accumulation()
    functions = {f.name.value: f for f in module.body if isinstance(f, cst.FunctionDef)}
    for a in findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                      value=m.Call(func=m.Attribute(value=m.Name())))):
        owner = a.value.func.value.value
        if owner in model_vars and a.targets[0].target.value not in known:
            known[a.targets[0].target.value] = owner
            acc.foreign[a.targets[0].target.value] = f"{owner}.{a.value.func.attr.value}"
    for body in _blocks(module):
        for i, loop in enumerate(body):
            # for micro_step in range(k), or a while over a counter: the gradients are summed
            # whatever the loop runs over
            if not isinstance(loop, (cst.For, cst.While)) or loop.orelse is not None:
                continue
            if len(findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("backward"))))) != 1 \
                    or findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("step")))):
                continue
            for j in range(i + 1, len(body)):
                opt = _stepped(body[j], scalers)
                if opt is not None:
                    break
            else:
                continue
            if opt not in known:
                continue
            # the sum starts from zero at the loop: torch's .grad is cleared in this block
            # (before the loop, or after the step) and not inside the loop, where it would
            # keep the last micro-step's gradients only
            clears = [k for k, st in enumerate(body) if (_method(st, "zero_grad") or ("", 0))[0]
                      in (opt, known[opt])]
            if findall(loop.body, m.Call(func=m.Attribute(attr=m.Name("zero_grad")))) or not (
                    any(k < i or k > j for k in clears)):
                continue
            site = MicroSteps(loop=loop, optimizer=opt, model=known[opt],
                              between=list(body[i + 1:j]), ragged=_ragged(loop, functions))
            for stmt in body[i + 1:j]:
                lines = [stmt] if isinstance(stmt, cst.SimpleStatementLine) else findall(
                    stmt, m.SimpleStatementLine())
                for line in lines:
                    first = line.body[0] if len(line.body) == 1 else None
                    if isinstance(first, cst.Expr) and isinstance(first.value, cst.Call) and \
                            cst.Module([]).code_for_node(first.value.func).endswith(
                                CLIP_NORM) and len(first.value.args) >= 2:
                        site.max_norm = first.value.args[1].value
                        site.clip_direct = line is stmt
                        acc.clips[id(first)] = site
                    unscale = _method(line, "unscale_")
                    if unscale is not None and unscale[0] in scalers:
                        acc.dropped.add(id(first))
            acc.loops[id(loop)] = site
            acc.steps[id(body[j].body[0])] = site
            for stmt in body[j + 1:]:
                hit = _method(stmt, "zero_grad") or _method(stmt, "update")
                if hit is not None and hit[0] in (opt, site.model, *scalers):
                    acc.dropped.add(id(stmt.body[0]))
    return acc


_NEXT = m.Call(func=m.Name("next"))


def _ragged(loop: cst.For | cst.While, functions: dict[str, cst.FunctionDef]) -> bool:
    """Whether the micro-batches may come from an iterator (whose last batch may be shorter):
    a loop over anything but ``range(...)``, a ``next(...)`` in its body or in a function of
    the module that its body calls (``get_batch()``)."""
    if isinstance(loop, cst.For) and not m.matches(loop.iter, m.Call(func=m.Name("range"))):
        return True
    if findall(loop.body, _NEXT):
        return True
    called = {c.func.value for c in findall(loop.body, m.Call(func=m.Name()))}
    return any(findall(functions[n], _NEXT) for n in called if n in functions)


def find_lr_loops(module: cst.Module) -> dict[int, tuple[str, cst.BaseExpression]]:
    """``for g in optimizer.param_groups: g['lr'] = value`` (the learning rate set by hand at
    each iteration): id(For) -> (optimizer, value)."""
    found: dict[int, tuple[str, cst.BaseExpression]] = {}
    for loop in findall(module, m.For(target=m.Name(), iter=m.Attribute(
            value=m.Name(), attr=m.Name("param_groups")))):
        body = loop.body.body
        if loop.orelse is not None or len(body) != 1 or not m.matches(
                body[0], m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                    target=m.Subscript(value=m.Name(loop.target.value), slice=[
                        m.SubscriptElement(slice=m.Index(value=m.SimpleString()))]))])])):
            continue
        a = body[0].body[0]
        if a.targets[0].target.slice[0].slice.value.evaluated_value != "lr":
            continue
        found[id(loop)] = (loop.iter.value.value, a.value)
    return found


def inline_checkpoint_dicts(module: cst.Module) -> bool:
    """Whether ``torch.save`` writes a dict literal holding a ``x.state_dict()`` value
    (``torch.save({'model': model.state_dict(), 'config': config}, path)``, a checkpoint
    dict written where it is built)."""
    return any(any(m.matches(e, m.DictElement(value=m.Call(func=m.Attribute(
        attr=m.Name("state_dict")), args=[]))) for e in c.args[0].value.elements)
        for c in findall(module, m.Call(func=m.Attribute(value=m.Name("torch"),
                                                         attr=m.Name("save")),
                                        args=[m.Arg(value=m.Dict()), m.ZeroOrMore()])))


def find_checkpoint_dicts(module: cst.Module) -> tuple[set[str], set[str]]:
    """Checkpoint dicts: the names assigned a dict literal holding ``x.state_dict()`` values
    (``checkpoint = {'model': model.state_dict(), 'iter_num': iter_num}``) that
    ``torch.save(name, path)`` writes, and the names assigned ``torch.load(path)`` that are
    read by a string key (``checkpoint['model']``)."""
    saved, loaded = set(), set()
    for a in findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                      value=m.Dict())):
        if any(m.matches(e, m.DictElement(value=m.Call(func=m.Attribute(
                attr=m.Name("state_dict")), args=[]))) for e in a.value.elements):
            saved.add(a.targets[0].target.value)
    saved &= {c.args[0].value.value for c in findall(module, m.Call(
        func=m.Attribute(value=m.Name("torch"), attr=m.Name("save")),
        args=[m.Arg(value=m.Name()), m.ZeroOrMore()]))}
    saved |= _passed_checkpoint_dicts(module)
    keyed = {s.value.value for s in findall(module, m.Subscript(value=m.Name(), slice=[
        m.SubscriptElement(slice=m.Index(value=m.SimpleString()))]))}
    for a in findall(module, m.Assign(targets=[m.AssignTarget(target=m.Name())],
                                      value=m.Call(func=m.Attribute(value=m.Name("torch"),
                                                                    attr=m.Name("load"))))):
        if a.targets[0].target.value in keyed:
            loaded.add(a.targets[0].target.value)
    return saved, loaded


# a dict literal holding ``x.state_dict()`` values: a checkpoint dict
HOLDS_STATE = m.Dict(elements=[m.ZeroOrMore(), m.DictElement(value=m.Call(
    func=m.Attribute(attr=m.Name("state_dict")), args=[])), m.ZeroOrMore()])


def _passed_checkpoint_dicts(module: cst.Module) -> set[str]:
    """The parameters that a function of the file saves (``def save_checkpoint(state,
    is_best, filename): torch.save(state, filename)``, pytorch/examples' ImageNet script) where
    every call of the function in the file gives a dict literal holding ``x.state_dict()``
    values (at least one call)."""
    holds_state = HOLDS_STATE
    out = set()
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef):
            continue
        params = [p.name.value for p in fn.params.params]
        saves = {c.args[0].value.value for c in findall(fn, m.Call(
            func=m.Attribute(value=m.Name("torch"), attr=m.Name("save")),
            args=[m.Arg(value=m.Name(), keyword=None), m.ZeroOrMore()]))} & set(params)
        for name in saves:
            at = params.index(name)
            given = []
            for c in findall(module, m.Call(func=m.Name(fn.name.value))):
                args = [a for a in c.args if a.keyword is None and not a.star]
                kw = [a for a in c.args if a.keyword is not None and a.keyword.value == name]
                given.append(args[at].value if at < len(args) else kw[0].value if kw else None)
            if given and all(g is not None and m.matches(g, holds_state) for g in given):
                out.add(name)
    return out


_STATE_DICT = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("state_dict")), args=[])
_DEEPCOPY = m.Call(func=m.Name("deepcopy") | m.Attribute(value=m.Name("copy"),
                                                          attr=m.Name("deepcopy")),
                   args=[m.Arg(value=_STATE_DICT)])


def _copied_value(value: cst.BaseExpression, name: str) -> bool:
    """``v`` copied as a tensor: ``v.clone()``, ``v.detach().clone()``, ``v.cpu().clone()``,
    ``copy.deepcopy(v)`` (any chain of detach/clone/cpu/to(...) on ``v``)."""
    if m.matches(value, m.Call(func=m.Name("deepcopy") | m.Attribute(
            value=m.Name("copy"), attr=m.Name("deepcopy")), args=[m.Arg(m.Name(name))])):
        return True
    seen_clone = False
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in {"clone", "detach", "cpu", "to"}:
            seen_clone |= value.func.attr.value == "clone"
            value = value.func.value
        elif m.matches(value.func, m.Attribute(value=m.Name("jnp"), attr=m.Name("copy")) |
                       m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("lax")),
                                   attr=m.Name("stop_gradient"))) and len(value.args) == 1:  # (the equinox pass reads the NNX pass's form)
            seen_clone |= value.func.attr.value == "copy"
            value = value.args[0].value
        else:
            break
    return seen_clone and m.matches(value, m.Name(name))


def snapshot_comprehension(value: cst.BaseExpression) -> cst.Call | None:
    """``{k: v.clone() for k, v in model.state_dict().items()}`` (a copy of every tensor of
    the state dict, keys kept): the ``state_dict()`` call, else None."""
    if not (isinstance(value, cst.DictComp) and value.for_in.inner_for_in is None
            and not value.for_in.ifs and m.matches(value.for_in.target, m.Tuple(
                elements=[m.Element(m.Name()), m.Element(m.Name())])) and m.matches(
                value.for_in.iter, m.Call(func=m.Attribute(value=_STATE_DICT,
                                                           attr=m.Name("items")), args=[]))):
        return None
    k, v = (e.value.value for e in value.for_in.target.elements)
    if not (m.matches(value.key, m.Name(k)) and _copied_value(value.value, v)):
        return None
    return value.for_in.iter.func.value


def find_memory_states(module: cst.Module) -> tuple[set[int], set[str]]:
    """State dicts kept in memory (an early stop's best weights): ``best = model.state_dict()``
    or ``copy.deepcopy(model.state_dict())`` or ``{k: v.clone() for k, v in
    model.state_dict().items()}`` (one element of a tuple assignment too), whose
    name is only rebound, tested against None, deep-copied again or given to
    ``x.load_state_dict(best)``. Their form is never read (a torch state_dict's flat keys),
    so the model's nnx.state as a pure dict keeps their meaning. (ids of the ``state_dict()``
    calls, the names)."""
    calls: dict[str, list[int]] = {}
    targets: set[int] = set()
    other: set[str] = set()
    for a in findall(module, m.Assign()):
        for t in a.targets:
            pairs = [(t.target, a.value)]
            if isinstance(t.target, (cst.Tuple, cst.List)) and isinstance(
                    a.value, (cst.Tuple, cst.List)) and len(t.target.elements) == len(
                    a.value.elements):
                pairs = [(e.value, v.value) for e, v in zip(t.target.elements,
                                                             a.value.elements, strict=True)]
            for target, value in pairs:
                for n in findall(t.target, m.Name()):
                    targets.add(id(n))
                if isinstance(target, cst.Name):
                    call = value if m.matches(value, _STATE_DICT) else (
                        value.args[0].value if m.matches(value, _DEEPCOPY) else
                        snapshot_comprehension(value))
                    if call is not None:
                        calls.setdefault(target.value, []).append(id(call))
                    elif not m.matches(value, m.Name("None")):
                        other.add(target.value)  # bound to something else too
                else:
                    other |= {n.value for n in findall(target, m.Name())}
    for n in findall(module, m.For() | m.With() | m.AugAssign() | m.AnnAssign()
                     | m.NamedExpr() | m.FunctionDef()):
        # (a loop's, a with's, an augmented or annotated assignment's, a parameter's)
        for part in (getattr(n, "target", None), *(getattr(i, "asname", None) for i in getattr(
                n, "items", ())), getattr(n, "params", None)):
            if part is not None:
                other |= {x.value for x in findall(part, m.Name())}
    calls = {n: c for n, c in calls.items() if n not in other}
    if not calls:
        return set(), set()
    allowed: set[int] = set(targets)
    for c in findall(module, m.Call(func=m.Attribute(attr=m.Name("load_state_dict")),
                                    args=[m.Arg(value=m.Name(), keyword=None)])):
        allowed.add(id(c.args[0].value))
    for c in findall(module, m.Comparison(left=m.Name(), comparisons=[m.ComparisonTarget(
            operator=m.Is() | m.IsNot(), comparator=m.Name("None"))])):
        allowed.add(id(c.left))
    for c in findall(module, m.Call(func=m.Name("deepcopy") | m.Attribute(
            attr=m.Name("deepcopy")), args=[m.Arg(value=m.Name())])):
        allowed.add(id(c.args[0].value))
    names = {n for n in calls if all(id(x) in allowed for x in findall(module, m.Name(n)))}
    return {i for n in names for i in calls[n]}, names
