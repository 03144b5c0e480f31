"""Training code under the equinox target: the NNX translation's training code, rewritten.

The NNX pass writes ``nnx.Optimizer``, a jitted ``train_step`` and an ``eval_step``; equinox
models are immutable pytrees: this rewrites them (docs/equinox.md; equinox_snapshots.py).

* ``model = Net(..., rngs=nnx.Rngs(k))`` -> ``model = Net(..., key=k)``, or
  ``model, state = eqx.nn.make_with_state(Net)(..., key=k)`` for a model with BatchNorm;
* ``optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)`` -> ``optimizer = tx`` and
  ``opt_state = optimizer.init(eqx.filter(model, eqx.is_array))``;
* the train step -> ``@eqx.filter_jit`` of ``(model, [state,] opt_state, *batch, [key])``
  with ``eqx.filter_value_and_grad``, ``optimizer.update`` and ``eqx.apply_updates``,
  returning the new model, state and optimizer state; the model is mapped over the batch with
  ``jax.vmap`` (BatchNorm's ``axis_name="batch"``, one dropout key per example);
* ``model.train()`` / ``model.eval()`` -> ``model = eqx.nn.inference_mode(model, False/True)``;
* a function that trains a model it receives returns it (with its state, and the optimizer
  state when it receives the optimizer) before what it returned, and its callers rebind them:
  ``model, state, opt_state, (loss, acc) = train(model, state, opt_state, loader, optimizer)``;
* the model called where inference mode is on -> ``eval_step(model, [state,] x)``.
What does not fit raises EquinoxError; the caller puts the torch original back, marked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.accumulate import find_memory_states
from torch2jax.analysis.walk import findall
from torch2jax.passes.common import Dedent, code
from torch2jax.result import TrainStepRecord
from torch2jax.targets import equinox_gan as gan
from torch2jax.targets import equinox_sequential as seq
from torch2jax.targets.equinox_eval import eval_step
from torch2jax.targets.equinox_globals import declare_globals, own_scope, read_globals
from torch2jax.targets.equinox_hoist import OPT_STATE, _assigned_names, _params, hoist_step
from torch2jax.targets.equinox_layers import _todo
from torch2jax.targets.equinox_params import TrainedFlag, param_arrays
from torch2jax.targets.equinox_snapshots import STATE, restore, snapshot

COUNTER = "opt_step"
# optimizer.step[...]: the NNX optimizer's update count, as the NNX pass reads it (Target.step_count)
_STEP_READ = m.Subscript(value=m.Attribute(attr=m.Name("step")),
                         slice=[m.SubscriptElement(m.Index(m.Ellipsis()))])
AUTOCAST_FN = "autocast"
REMOVED = "__removed__"
# the evaluation step: the NNX pass's name (ConversionResult.eval_step) is kept
EVAL_STEP = "eval_step"


@dataclass(frozen=True)
class TrainingContext:
    """What the rewrite of the training code knows of the rest of the file (built by
    equinox.convert, passed down; nothing is kept between files):

    * ``batch_reduced``: model class -> {output index: "mean" | "sum"}, a batch loss its
      forward computes, per example; the train step reduces it over the batch;
    * ``optimizer_methods``: class -> its methods that return the optax transform;
    * ``layer_of``: an NNX layer constructor -> (its equinox constructor, with a
      ``__needs_key__`` keyword where the key goes, and the layer's kind), or the reason it
      has none;
    * ``train_steps``: the train steps the NNX pass wrote (ConversionResult.train_steps):
      a function is rewritten as a train step when a record names it;
    * ``eval_step``: the name of the evaluation step the NNX pass wrote at the top of the
      file (ConversionResult.eval_step), or None;
    * ``batched``: the model classes kept batched (ClassInfo.batched): called on the batch as
      they are, not mapped over it;
    * ``draws``: the model classes whose forward draws random numbers (ClassInfo.draws): they
      take a key in evaluation too;
    * ``builders``: a function of the file that builds and returns one of its model classes
      (``def ResNet18(): return ResNet(BasicBlock, [2, 2, 2, 2])``) -> that class."""

    batch_reduced: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    optimizer_methods: Mapping[str, frozenset[str]] = field(default_factory=dict)
    layer_of: Callable[[cst.Call], tuple[cst.BaseExpression, str] | str] | None = None
    train_steps: tuple[TrainStepRecord, ...] = ()
    eval_step: str | None = None
    batched: frozenset[str] = frozenset()
    draws: frozenset[str] = frozenset()
    builders: Mapping[str, str] = field(default_factory=dict)


class _DropRemoved(cst.CSTTransformer):
    """Statements the pass removed go; their leading blank lines stay with the next one."""

    def _body(self, body):
        out, carry = [], []
        for s in body:
            if m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.Name(REMOVED))])):
                carry += list(s.leading_lines)
                continue
            if carry:
                s = s.with_changes(leading_lines=[*carry, *s.leading_lines])
                carry = []
            out.append(s)
        return out

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._body(updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._body(updated_node.body))


def _stmt(src: str) -> cst.BaseStatement:
    return cst.parse_statement(src if src.endswith("\n") else src + "\n")


def _step_record(fn: cst.FunctionDef, ctx: TrainingContext) -> TrainStepRecord | None:
    """The record of the train step the NNX pass wrote as ``fn`` (its name, and its model and
    optimizer where the step binds them: its first parameters, or the targets of the merge
    of a functional step's state), or None."""
    params = [p.name.value for p in fn.params.params]
    first = fn.body.body[0] if fn.body.body else None
    for rec in ctx.train_steps:
        if rec.name != fn.name.value:
            continue
        if rec.functional and m.matches(first, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(m.Tuple(elements=[m.Element(m.Name(rec.model)),
                                                          m.Element(m.Name(rec.optimizer))]))],
                value=m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("merge"))))])):
            return rec
        if not rec.functional and params[:2] == [rec.model, rec.optimizer]:
            return rec
    return None


def _step_parts(fn: cst.FunctionDef, ctx: TrainingContext) -> dict | None:
    """The pieces of a train step of the NNX pass, or None when ``fn`` is not one (no record
    of ctx.train_steps names it, or its body is not of the form this pass rewrites)."""
    rec = _step_record(fn, ctx)
    if rec is None:
        return None
    functional = rec.functional
    params = [p.name.value for p in fn.params.params]
    model, opt = rec.model, rec.optimizer
    body = list(fn.body.body)
    if functional:
        body = body[1:]  # (the merge of the state into the model and the optimizer)
    if len(body) != 4 or not isinstance(body[0], cst.FunctionDef):
        return None
    loss_fn, vg, upd, ret = body
    if not m.matches(upd, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
            value=m.Name(opt), attr=m.Name("update"))))])):
        return None
    vg_assign = vg.body[0] if isinstance(vg, cst.SimpleStatementLine) else None
    if not isinstance(vg_assign, cst.Assign) or not isinstance(ret, cst.SimpleStatementLine) \
            or not isinstance(ret.body[0], cst.Return):
        return None
    # (loss, (aux,)), grads  or  loss, grads
    target = vg_assign.targets[0].target
    if not isinstance(target, cst.Tuple) or len(target.elements) != 2:
        return None
    grads = code(target.elements[1].value)
    value = target.elements[0].value
    if isinstance(value, cst.Tuple):
        loss = code(value.elements[0].value)
        aux = [code(e.value) for e in value.elements[1].value.elements]
    else:
        loss, aux = code(value), []
    rv = ret.body[0].value
    outs = [code(e.value) for e in rv.elements] if isinstance(rv, cst.Tuple) else [code(rv)]
    if functional:
        outs = outs[1:]
    inner = list(loss_fn.body.body)
    if not inner or not m.matches(inner[-1], m.SimpleStatementLine(body=[m.Return()])):
        return None
    # the loss function's other arguments (an LSTM's hidden state), passed as they are named
    extra = [p.name.value for p in loss_fn.params.params[1:]]
    if not isinstance(vg_assign.value, cst.Call) or [code(a.value) for a in vg_assign.value.args[
            1:]] != extra or any(a.keyword or a.star for a in vg_assign.value.args):
        return None
    # the functional step takes (graphdef, train_state, ...), or (train_state, ...) when it
    # closes over the graphdef
    skip = 1 if rec.closure else 2
    return {"model": model, "opt": opt, "args": params[skip:], "skip": skip, "loss_fn": loss_fn,
            "inner": inner[:-1], "loss": loss, "aux": aux, "grads": grads, "outs": outs,
            "functional": functional, "extra": extra}


class _ModelCalls(cst.CSTTransformer):
    """``model(...)`` inside the loss function -> the model mapped over the batch."""

    def __init__(self, model: str, stateful: bool, keyed: bool, dtype: str | None,
                 batched: bool = False) -> None:
        self.model, self.stateful, self.keyed, self.dtype = model, stateful, keyed, dtype
        self.batched = batched
        self.hoisted: list[str] = []
        self.n = 0
        self.cast = False  # a call of the autocast helper written

    def mapped(self, call: cst.Call) -> str:
        args = [a for a in call.args]
        if any(a.keyword is not None or a.star for a in args):
            raise _Fail("a call of the model with keyword or starred arguments")
        pos = [code(a.value) for a in args]
        model = self.model
        if self.dtype:
            self.cast = True
            model = f"{AUTOCAST_FN}({model}, {self.dtype})"
            pos = [f"{AUTOCAST_FN}({p}, {self.dtype})" for p in pos]
        kw = ""
        if self.batched:  # a model kept batched: called on the batch, one key
            args = ", ".join([*pos, *([STATE] if self.stateful else []),
                              *(["key=key"] if self.keyed else [])])
            return f"{model}({args})"
        if self.keyed:
            kw = f", key=jax.random.split(key, {pos[0]}.shape[0])" if pos else ""
        if self.stateful:
            axes = ", ".join(["0"] * len(pos) + ["None"])
            return (f"jax.vmap({model}, axis_name=\"batch\", in_axes=({axes}), "
                    f"out_axes=(0, None))({', '.join(pos)}, {STATE}{kw})")
        return f"jax.vmap({model})({', '.join(pos)}{kw})"

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name(self.model)):
            return updated_node
        if not self.stateful:
            return cst.parse_expression(self.mapped(updated_node))
        out = "out" if self.n == 0 else f"out{self.n + 1}"
        self.n += 1
        self.hoisted.append(f"{out}, {STATE} = {self.mapped(updated_node)}")
        return cst.Name(out)


def _loss_body(stmts: list[cst.BaseStatement], model: str, stateful: bool, keyed: bool,
               dtype: str | None, ctx: TrainingContext, batched: bool = False
               ) -> tuple[list[cst.BaseStatement], bool]:
    """The loss function's statements, and whether they call the autocast helper."""
    out: list[cst.BaseStatement] = []
    cast = False
    for s in stmts:
        tr = _ModelCalls(model, stateful, keyed, dtype, batched)
        # `y = model(x)` with state: `y, state = ...` without a temporary
        if stateful and m.matches(s, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget()], value=m.Call(func=m.Name(model)))])):
            a = s.body[0]
            t = code(a.targets[0].target)
            if isinstance(a.targets[0].target, cst.Tuple):
                t = f"({t})"
            out.append(_stmt(f"{t}, {STATE} = {tr.mapped(a.value)}").with_changes(
                leading_lines=s.leading_lines))
            cast |= tr.cast
            continue
        new = s.visit(tr)
        out += [_stmt(h) for h in tr.hoisted]
        out.append(new)
        out += _batch_reductions(s, model, ctx)
        cast |= tr.cast
    return out, cast


def _batch_reductions(s: cst.BaseStatement, model: str, ctx: TrainingContext
                      ) -> list[cst.BaseStatement]:
    """``logits, loss = model(x, y)`` where the model's forward computes the batch loss: per
    example under jax.vmap, so ``loss = loss.mean()`` follows (the model classes of the file
    must agree on which outputs those are)."""
    if not ctx.batch_reduced or not m.matches(s, m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(m.Tuple())], value=m.Call(func=m.Name(model)))])):
        return []
    kinds = list(ctx.batch_reduced.values())
    if any(k != kinds[0] for k in kinds):
        raise _Fail("model classes that compute their batch loss in different outputs")
    targets = s.body[0].targets[0].target.elements
    out = []
    for i, how in sorted(kinds[0].items()):
        if i < len(targets) and isinstance(targets[i].value, cst.Name):
            name = targets[i].value.value
            out.append(_stmt(f"{name} = {name}.{how}()  # per-example {how}s of the batch "
                             "loss: their " + how + " over the batch"))
    return out


def train_step(fn: cst.FunctionDef, parts: dict, stateful: bool, keyed: bool,
               dtype: str | None, ctx: TrainingContext, batched: bool = False
               ) -> tuple[cst.FunctionDef, bool]:
    """The equinox train step, and whether it calls the autocast helper; ``batched``: the
    model is kept batched (called on the batch as it is)."""
    model, opt, loss, aux, grads = (parts[k] for k in ("model", "opt", "loss", "aux", "grads"))
    inner, cast = _loss_body(parts["inner"], model, stateful, keyed, dtype, ctx, batched)
    aux_out = ([STATE] if stateful else []) + aux
    loss_fn = parts["loss_fn"].name.value
    lf_params = ", ".join([model, *([STATE] if stateful else []), *parts["extra"]])
    if aux_out:
        tup = aux_out[0] if len(aux_out) == 1 else f"({', '.join(aux_out)})"
        ret_inner = f"return {loss}, {tup}"
        vg = (f"({loss}, {tup}), {grads} = eqx.filter_value_and_grad({loss_fn}, "
              f"has_aux=True)({lf_params})")
    else:
        ret_inner = f"return {loss}"
        vg = f"{loss}, {grads} = eqx.filter_value_and_grad({loss_fn})({lf_params})"
    head = [model] + ([STATE] if stateful else []) + [OPT_STATE]
    params = head + parts["args"] + (["key"] if keyed else [])
    body_src = "".join("        " + ln + "\n" for s in inner
                       for ln in cst.Module(body=[s]).code.rstrip("\n").split("\n"))
    src = (f"@eqx.filter_jit\ndef {fn.name.value}({', '.join(params)}):\n"
           f"    def {loss_fn}({lf_params}):\n{body_src}        {ret_inner}\n"
           f"    {vg}\n"
           f"    updates, {OPT_STATE} = {opt}.update({grads}, {OPT_STATE}, "
           f"eqx.filter({model}, eqx.is_array))\n"
           f"    {model} = eqx.apply_updates({model}, updates)\n"
           f"    return {', '.join(head + parts['outs'])}\n")
    new = cst.parse_statement(src)
    return new.with_changes(leading_lines=fn.leading_lines), cast


AUTOCAST_SRC = (f"def {AUTOCAST_FN}(tree, dtype):\n"
                "    \"\"\"The floating-point arrays of tree in dtype: torch.autocast's compute "
                "dtype\n    (the parameters stay float32 outside the loss function).\"\"\"\n"
                "    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) "
                "else a, tree)\n")


# nn.Module methods with no counterpart on an equinox model: a call of one is kept, marked
MODULE_API = {"load_state_dict", "state_dict", "to", "cuda", "cpu", "half", "float", "double",
              "bfloat16", "zero_grad", "requires_grad_", "share_memory", "apply",
              "register_buffer"}


def imported_message(cls: str) -> str:
    return (f"{cls} is imported from another file: whether its equinox model keeps BatchNorm "
            "state or takes a dropout key is not known here")


def _marked(small: cst.BaseSmallStatement, message: str) -> cst.SimpleStatementLine:
    """``small`` kept as written, under a TODO of this target."""
    line = cst.EmptyLine(comment=cst.Comment(f"# TODO(torch2jax): {message} [equinox]"))
    return cst.SimpleStatementLine(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                                   leading_lines=[line])


# the equinox layers (equinox.Layer kinds) a statement outside a module may build: their
# weights keep torch's names and layouts (rewrite.py's _built_layer_weight reads them so)
BUILT_LAYERS = frozenset({"linear", "conv", "layernorm", "embedding"})


class _Fail(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message); self.message = message


class Scope(cst.CSTTransformer):
    """Rewrites the statements of one function (or of the module's top level)."""

    def __init__(self, models: dict[str, str], classes: dict[str, tuple[bool, bool]],
                 receivers: dict[str, int], trainers: set[str], has_key: bool,
                 stmts: list[cst.BaseStatement], opt_receivers: dict[str, int] | None = None,
                 optimizers: set[str] | frozenset[str] = frozenset(), *,
                 ctx: TrainingContext) -> None:
        self.ctx = ctx
        self.models, self.classes = models, classes
        self.receivers, self.trainers = receivers, trainers
        self.opt_receivers = opt_receivers or {}
        self.has_key = has_key
        self.steps: dict[str, dict] = {}
        self.gans: dict[str, gan.Gan] = {}  # GAN steps (equinox_gan.py)
        self.states: dict[str, str] = {}  # a model's state, when not `state` (a GAN's)
        self.opt_states: dict[str, str] = {}  # an optimizer's state, when not `opt_state`
        # the step each name is bound to at this point (two loops, each with its own step)
        self.current: dict[str, dict] = {}
        self.built_optimizers: set[str] = set()  # built in this scope
        self.dtype: str | None = None
        self.optimizers: set[str] = set(optimizers)  # built here, or received
        self.inference: set[str] = set()  # models in inference mode here
        self.eval_calls = 0  # model calls that became eval_step calls
        self.trainer_calls: list[cst.Call] = []  # calls of trainers not yet rebound
        self.split_model: str | None = None
        self.counter = any(findall(s, _STEP_READ) for s in stmts)
        self.trained: set[str] = set()  # models rebound by a train step here
        # trainers given a `key` (their model has dropout): their calls pass one
        self.keyed_trainers: set[str] = set()
        self.layers: set[str] = set()  # torch layers built here, outside a module
        self.eval_stateful = False  # the file's eval_step takes the models' state
        self.eval_batched = False  # ... and calls them on the batch as they are
        self.layer_called: str | None = None  # such a layer called in the statement
        self.needs_autocast = False  # a train step written here calls the autocast helper
        self.in_step = 0
        self.nested = 0  # inside a function defined in the scope's (not a step)
        self.pre: list[cst.BaseStatement] = []  # to write before the statement (eval_key)
        self.in_line = 0  # inside a simple statement (not a compound statement's header)
        self.params, self.snapshots = set(), find_memory_states(cst.Module(body=stmts))[1]
        for s in stmts:
            for fn in findall(s, m.FunctionDef()):
                parts = _step_parts(fn, ctx)
                if parts is not None:
                    self.steps[fn.name.value] = parts
                elif (g := gan.parse(fn)) is not None:  # each model and optimizer its state
                    self.gans[fn.name.value] = g
                    self.states.update(gan.state_names(g)[0])
                    self.opt_states.update(gan.state_names(g)[1])
            for c in findall(s, m.Call(func=m.Attribute(attr=m.Name("set_attributes")))):
                for a in c.args:
                    if a.keyword is not None and a.keyword.value == "dtype" and \
                            code(a.value) != "None":
                        self.dtype = code(a.value)

    def flags(self, model: str) -> tuple[bool, bool]:
        cls = self.models.get(model)
        if cls is None:
            raise _Fail(f"{model} is not a model this pass knows the class of")
        if self.classes[cls] is None:
            raise _Fail(imported_message(cls))
        return self.classes[cls]

    # -- the train step and the evaluation step
    def visit_FunctionDef(self, node):
        if node.name.value in self.steps or node.name.value in self.gans:
            self.in_step += 1
        elif not self.in_step:
            self.nested += 1  # (a function defined in the scope's: fit_batch in main)
        return True

    def leave_FunctionDef(self, original_node, updated_node):
        if original_node.name.value in self.gans:
            self.in_step -= 1
            p = self.gans[original_node.name.value]
            return gan.render(original_node, p, {n: self.flags(n) for n in (
                p.d_model, p.g_model)}, {n: self.models[n] in self.ctx.batched for n in (
                    p.d_model, p.g_model)})
        if original_node.name.value not in self.steps:
            self.nested -= 0 if self.in_step else 1
            return updated_node
        parts = _step_parts(original_node, self.ctx) or self.steps[original_node.name.value]
        self.current[original_node.name.value] = parts
        self.in_step -= 1
        stateful, keyed = self.flags(parts["model"])
        new, cast = train_step(updated_node, parts, stateful, keyed, self.dtype, self.ctx,
                               self.models.get(parts["model"]) in self.ctx.batched)
        self.needs_autocast |= cast
        return new

    def leave_Attribute(self, original_node, updated_node):
        # the optimizer's entry of a functional step's state is the optimizer
        if m.matches(updated_node.value, m.Subscript(value=m.Name("train_state"), slice=[
                m.SubscriptElement(m.Index(m.Integer("1")))])) and \
                updated_node.attr.value in ("opt_state", "step") and len(self.optimizers) == 1:
            updated_node = updated_node.with_changes(value=cst.Name(next(iter(self.optimizers))))
        # optimizer.opt_state -> opt_state; hyperparams[...].value -> hyperparams[...]
        if m.matches(updated_node, m.Attribute(value=m.Name(), attr=m.Name("opt_state"))) and \
                updated_node.value.value in self.optimizers:
            return cst.Name(self.opt_states.get(updated_node.value.value, OPT_STATE))
        if m.matches(updated_node, m.Attribute(value=m.Subscript(value=m.Attribute(
                attr=m.Name("hyperparams"))), attr=m.Name("value"))):
            return updated_node.value
        return updated_node

    def leave_Subscript(self, original_node, updated_node):
        # optimizer.step[...] (the NNX optimizer's update count) -> the step counter
        if m.matches(updated_node, _STEP_READ) and m.matches(
                updated_node.value.value, m.Name()) and (
                updated_node.value.value.value in self.optimizers):
            return cst.Name(COUNTER)
        return updated_node

    def arrays(self, model: str) -> str:
        """The model's arrays (with its state): what torch's state_dict holds."""
        state = self.states.get(model, STATE)
        tree = f"({model}, {state})" if self.flags(model)[0] else model
        return f"eqx.filter({tree}, eqx.is_array)"

    def leave_Call(self, original_node, updated_node):
        func = code(updated_node.func)
        if func in self.layers:
            self.layer_called = func
        if (arrays := param_arrays(updated_node, {n for n, c in self.models.items() if not (
                self.classes.get(c) or (True,))[0]})) is not None:  # model.parameters()
            return arrays
        if func == "nnx.state" and not self.in_step and len(updated_node.args) == 1 and \
                code(updated_node.args[0].value) in self.models:
            # a checkpoint of the model (torch.save(model.state_dict(), path))
            return cst.parse_expression(self.arrays(code(updated_node.args[0].value)))
        if func in self.models and not self.in_step:
            # the model called on a batch outside the steps (a validation loss in the loop)
            stateful, keyed = self.flags(func)
            plain = not any(a.keyword or a.star for a in updated_node.args)
            if (stateful or keyed) and plain and func in self.inference:
                # evaluation: no dropout key, the running statistics as they are
                self.eval_calls += 1
                state = [cst.Arg(cst.Name(self.states.get(func, STATE)))] if stateful else []
                args = [cst.Arg(cst.Name(func)), *state, *updated_node.args]
                args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
                    " "))) for a in args[:-1]] + [args[-1].with_changes(
                        comma=cst.MaybeSentinel.DEFAULT)]
                return self.eval_key(cst.Call(func=cst.Name(EVAL_STEP), args=args), func)
            if stateful or keyed or not plain:
                raise _Fail("the model called outside the train and eval steps with "
                            "BatchNorm state or dropout")
            if self.models.get(func) in self.ctx.batched:
                return updated_node  # (kept batched: called on the batch)
            return updated_node.with_changes(func=cst.parse_expression(f"jax.vmap({func})"))
        if func == EVAL_STEP or func in self.receivers:
            at = 0 if func == EVAL_STEP else self.receivers[func]
            args = list(updated_node.args)
            added = []
            if len(args) > at and args[at].keyword is None and \
                    code(args[at].value) in self.models and \
                    self.flags(code(args[at].value))[0]:
                added.append(self.states.get(code(args[at].value), STATE))
            elif func == EVAL_STEP and self.eval_stateful:
                raise _Fail("a model without BatchNorm state evaluated by the eval_step of "
                            "the models with state")
            if func in self.opt_receivers:
                j = self.opt_receivers[func]
                if len(args) <= j or args[j].keyword is not None or args[j].star or \
                        code(args[j].value) not in self.optimizers:
                    raise _Fail(f"{func} is given an optimizer this pass does not know")
                added.append(OPT_STATE)
            for name in reversed(added):
                args.insert(at + 1, cst.Arg(cst.Name(name), comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))))
            if func in self.trainers:
                updated_node = updated_node.with_changes(args=args)
                self.trainer_calls.append(updated_node)
                return updated_node
            if added:
                updated_node = updated_node.with_changes(args=args)
            if func == EVAL_STEP and args and args[0].keyword is None:
                return self.eval_key(updated_node, code(args[0].value))
        return updated_node

    def eval_key(self, call: cst.Call, model: str) -> cst.Call:
        """``eval_step(model, x)`` of a model whose forward draws: a key split off the
        scope's before the statement (``key, subkey = jax.random.split(key)``), passed as
        ``key=subkey``. A model kept batched evaluated by the eval_step of models mapped
        over the batch (or the reverse) is refused."""
        cls = self.models.get(model)
        if cls is not None and self.classes.get(cls) is not None and \
                (cls in self.ctx.batched) != self.eval_batched:
            raise _Fail("a model kept batched and a model per example share one eval_step")
        if self.models.get(model) not in self.ctx.draws:
            return call
        if not self.has_key:
            raise _Fail("the model draws random numbers in its forward pass and no `key` is "
                        "in scope here")
        if not self.in_line:
            raise _Fail("an evaluation of a model that draws in a compound statement's header "
                        "(its key is split off in a statement before it)")
        self.pre.append(_stmt("key, subkey = jax.random.split(key)"))
        args = [*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")))]
        return call.with_changes(args=[*args, cst.Arg(cst.Name("subkey"), keyword=cst.Name(
            "key"), equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                          whitespace_after=cst.SimpleWhitespace("")))])

    def trainer_call(self, call: cst.Call, target: cst.BaseAssignTargetExpression | None
                     ) -> list:
        """``out = train(model, ...)`` (arguments already given the state and optimizer state)
        -> ``model, state, opt_state, out = train(model, state, opt_state, ...)``."""
        self.trainer_calls = [c for c in self.trainer_calls if c is not call]
        func = call.func.value
        if self.nested:
            raise _Fail(f"{func} trains the model, called by a function defined inside the one "
                        "that holds it: the model it returns would be that function's local")
        model = code(call.args[self.receivers[func]].value)
        if model not in self.models:
            raise _Fail(f"{func} trains a model this pass does not know the class of")
        self.inference.discard(model)  # it comes back in training mode
        head = [model] + ([STATE] if self.flags(model)[0] else []) + (
            [OPT_STATE] if func in self.opt_receivers else [])
        if target is not None:
            t = code(target)
            head.append(f"({t})" if isinstance(target, cst.Tuple) else t)
        lhs = ", ".join(head)
        if func not in self.keyed_trainers:
            return [_stmt(f"{lhs} = {code(call)}")]
        if not self.has_key:
            raise _Fail(f"{func} trains a model with dropout: it needs a key, and no `key` is "
                        "in scope here")
        args = [*call.args[:-1], call.args[-1].with_changes(comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" ")))] if call.args else []
        call = call.with_changes(args=[*args, cst.Arg(cst.Name("subkey"), keyword=cst.Name(
            "key"), equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                          whitespace_after=cst.SimpleWhitespace("")))])
        return [_stmt("key, subkey = jax.random.split(key)"), _stmt(f"{lhs} = {code(call)}")]

    # -- statements
    def visit_SimpleStatementLine(self, node) -> bool:
        self.in_line += 1
        return True

    def leave_SimpleStatementLine(self, original_node, updated_node):
        self.in_line -= 1
        pre, self.pre = self.pre, []
        if pre:  # (statements a call in it needs first: eval_key)
            out = self._statement_line(original_node, updated_node)
            first, *rest = out.nodes if isinstance(out, cst.FlattenSentinel) else [out]
            pre[0] = pre[0].with_changes(leading_lines=first.leading_lines)
            return cst.FlattenSentinel([*pre, first.with_changes(leading_lines=[]), *rest])
        return self._statement_line(original_node, updated_node)

    def _statement_line(self, original_node, updated_node):
        called, self.layer_called = self.layer_called, False
        if len(updated_node.body) != 1:
            return self._layer_call_marked(updated_node, called)
        small = updated_node.body[0]
        lead = updated_node.leading_lines
        out = self.statement(small)
        if out is None:
            return self._layer_call_marked(updated_node, called)
        if not out:  # removed; its blank lines go to the next statement (_DropRemoved)
            out = [_stmt(REMOVED)]
        out[0] = out[0].with_changes(leading_lines=[*lead, *out[0].leading_lines])
        out[0] = self._layer_call_marked(out[0], called)
        return cst.FlattenSentinel(out)

    @staticmethod
    def _layer_call_marked(stmt: cst.SimpleStatementLine, called: str | None
                           ) -> cst.SimpleStatementLine:
        if not called:
            return stmt
        line = cst.EmptyLine(comment=cst.Comment(
            f"# TODO(torch2jax): {called}(...): an equinox layer applies to one example, not "
            "to a batch: map it over the batch axes (jax.vmap) with its input in torch's "
            "layout [equinox]"))
        return stmt.with_changes(leading_lines=[*stmt.leading_lines, line])

    def layer_build(self, target: str, value: cst.Call) -> list | None:
        """``layer = nnx.Linear(..., rngs=nnx.Rngs(k))`` outside a module -> the equinox layer
        (``key=k``); its weights keep torch's names and layouts. None: not such a layer."""
        k = next((a.value for a in value.args if a.keyword and a.keyword.value == "rngs"),
                 None)
        if not m.matches(k, m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Rngs")),
                                   args=[m.Arg(keyword=None)])):
            return None
        layer_of = self.ctx.layer_of
        found = layer_of(value) if layer_of is not None else None
        if isinstance(found, str):
            raise _Fail(found)
        if found is None or found[1] not in BUILT_LAYERS:
            return None
        new = found[0]
        seed = k.args[0].value
        kv = f"jax.random.key({code(seed)})" if isinstance(seed, cst.Integer) else code(seed)
        self.layers.add(target)
        return [_stmt(f"{target} = {code(new).replace('__needs_key__', kv)}")]

    def statement(self, small: cst.BaseSmallStatement) -> list | None:
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            value = small.value
            if isinstance(target, cst.Name) and m.matches(value, m.Call(func=m.Attribute(
                    value=m.Name("nnx")))):
                built = self.layer_build(target.value, value)
                if built is not None:
                    return built
            cls = seq.model_build(value, self.classes, self.ctx.builders)
            if cls in seq.CLASSES and isinstance(target, cst.Name):
                built = seq.sequential_model(value, self.ctx.layer_of)
                if built is None:
                    raise _Fail("a Sequential model built outside a module from layers "
                                "other than linear layers, layer norms and activations")
                self.models[target.value] = cls
                return [_stmt(f"{target.value} = {built}")]
            if cls is not None and isinstance(target, cst.Name):
                other = [n for n, c in self.models.items() if n != target.value
                         and (self.classes.get(c) or (False, False))[0]]
                if (self.classes[cls] or (False, False))[0] and other and not {
                        target.value, *other} <= set(self.states):
                    # one `state` name per function: the second model's would replace the first's
                    raise _Fail(f"two models with BatchNorm state in one function "
                                f"({' and '.join(sorted([other[0], target.value]))}): "
                                "each needs its own "
                                "eqx.nn.State")
                self.models[target.value] = cls
                args = [a for a in value.args if not (a.keyword and a.keyword.value == "rngs")]
                k = next(a for a in value.args if a.keyword and a.keyword.value == "rngs")
                seed = k.value.args[0].value if k.value.args else cst.Integer("0")
                # nnx.Rngs(0) seeds from an int; nnx.Rngs(subkey) takes a key
                kv = f"jax.random.key({code(seed)})" if isinstance(seed, cst.Integer) \
                    else code(seed)
                pos = ", ".join([code(a.value) if a.keyword is None else
                                 f"{a.keyword.value}={code(a.value)}" for a in args] +
                                [f"key={kv}"])
                callee = value.func.value  # the class, or a function that builds it
                if (self.classes[cls] or (False, False))[0]:
                    return [_stmt(f"{target.value}, {self.states.get(target.value, STATE)} = "
                                  f"eqx.nn.make_with_state({callee})({pos})")]
                return [_stmt(f"{target.value} = {callee}({pos})")]
            if m.matches(value, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                        attr=m.Name("Optimizer")))) and \
                    isinstance(target, cst.Name):
                args = value.args
                kw = {a.keyword.value: code(a.value) for a in args if a.keyword}
                if kw.get("wrt", "nnx.Param") != "nnx.Param" or len(args) < 2 or \
                        args[0].keyword or args[1].keyword:
                    raise _Fail("an nnx.Optimizer over other variables than the parameters")
                model = code(args[0].value)
                self.optimizers.add(target.value)
                self.one_opt_state(target.value)
                tx = args[1].value.visit(Dedent())
                out = [_stmt(f"{target.value} = {code(tx)}"),
                       _stmt(f"{self.opt_states.get(target.value, OPT_STATE)} = "
                             f"{target.value}.init(eqx.filter({model}, "
                             "eqx.is_array))")]
                if self.counter:
                    out.append(_stmt(f"{COUNTER} = 0"))
                return out
            if m.matches(value, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                        attr=m.Name("split")))):
                objs = value.args[0].value
                if isinstance(objs, cst.Tuple):
                    self.split_model = code(objs.elements[0].value)
                return []
            if m.matches(value, m.Call(func=m.Name())) and value.func.value in self.steps:
                return self.step_call(value, target)
            if m.matches(value, m.Call(func=m.Name())) and value.func.value in self.gans:
                p = self.gans[value.func.value]
                return [_stmt(gan.call(value, target, p, {n: self.flags(n) for n in (
                    p.d_model, p.g_model)}))]
            if m.matches(value, m.Call(func=m.Attribute(value=m.Name()))) and \
                    isinstance(target, cst.Name) and value.func.value.value in self.models \
                    and value.func.attr.value in self.ctx.optimizer_methods.get(
                        self.models[value.func.value.value], ()):
                # torch's configure_optimizers: the method returns the optax transform
                self.optimizers.add(target.value)
                self.one_opt_state(target.value)
                out = [_stmt(f"{target.value} = {code(value)}"),
                       _stmt(f"{OPT_STATE} = {target.value}.init(eqx.filter("
                             f"{value.func.value.value}, eqx.is_array))")]
                if self.counter:
                    out.append(_stmt(f"{COUNTER} = 0"))
                return out
        if isinstance(small, cst.Assign) and {f"{n}.state_dict" for n in self.models} & {
                code(c.func) for c in findall(small.value, m.Call())}:  # deepcopy(m.state_dict())
            return snapshot(self, small) or [_marked(
                small, "model.state_dict(): an equinox model is its own state (a pytree of "
                "arrays): left as written")]
        mode = _mode_choice(small, self.models)
        if mode is not None:  # model.train() if training else model.eval()
            name, inference = mode
            return [_stmt(f"{name} = eqx.nn.inference_mode({name}, {inference})")]
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            func = call.func
            if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("train") |
                                           m.Name("eval"))) and func.value.value in self.models:
                name = func.value.value
                flag = "" if func.attr.value == "eval" else ", False"
                if func.attr.value == "eval":
                    self.inference.add(name)
                else:
                    self.inference.discard(name)
                return [_stmt(f"{name} = eqx.nn.inference_mode({name}{flag})")]
            if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name())) and \
                    func.value.value in self.models and func.attr.value in MODULE_API:
                return restore(self, call) or [_marked(small, f"{code(func)}(...): torch's Module API has no "
                                "counterpart on an equinox model (a pytree of arrays): "
                                "left as written")]
            if m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("set_attributes"))):
                return []  # the compute dtype: the train step's autocast
            if m.matches(call, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                       attr=m.Name("update")),
                                      args=[m.Arg(m.Tuple(elements=[m.Element(m.Name()),
                                                                    m.ZeroOrMore()])),
                                            m.Arg(m.Call(func=m.Attribute(
                                                value=m.Name("jax"), attr=m.Name("device_put")),
                                                args=[m.Arg(keyword=None),
                                                      m.Arg(keyword=None)]))])) and \
                    call.args[0].value.elements[0].value.value in self.models:
                # data parallel: the model and optimizer state replicated over the mesh
                # before the first step, as the step returns them (one compile)
                model = call.args[0].value.elements[0].value.value
                names = ", ".join([model, *([STATE] if self.flags(model)[0] else []),
                                   OPT_STATE])
                sharding = code(call.args[1].value.args[1].value)
                return [_stmt(f"{names} = eqx.filter_shard(  # replicated, as the step "
                              f"returns them\n    ({names}), {sharding})")]
            if m.matches(call, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                       attr=m.Name("update")),
                                      args=[m.Arg(m.Tuple()), m.Arg()])):
                return []  # after a functional train step: the step returned the objects
            if m.matches(call, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                       attr=m.Name("update")),
                                      args=[m.Arg(m.Name()), m.Arg()])) and \
                    call.args[0].value.value in self.models:
                # a checkpoint restored into the model (model.load_state_dict(...))
                model = call.args[0].value.value
                tree = f"{model}, {STATE}" if self.flags(model)[0] else model
                paren = f"({tree})" if self.flags(model)[0] else tree
                return [_stmt(f"{tree} = eqx.combine({code(call.args[1].value)}, {paren})")]
            if m.matches(func, m.Name()) and func.value in self.steps:
                return self.step_call(call, None)
            if m.matches(func, m.Name()) and func.value in self.trainers:
                return self.trainer_call(call, None)
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and m.matches(
                small.value, m.Call(func=m.Name())) and small.value.func.value in self.trainers:
            return self.trainer_call(small.value, small.targets[0].target)
        return None

    def one_opt_state(self, optimizer: str) -> None:
        """One ``opt_state`` name per function: a second optimizer's would replace the first's."""
        other = self.built_optimizers - {optimizer}
        if other and not {optimizer, *other} <= set(self.opt_states):
            raise _Fail(f"two optimizers in one function ({min(other)} and {optimizer}): "
                        "each needs its own optimizer state")
        self.built_optimizers.add(optimizer)

    def step_call(self, call: cst.Call, target) -> list:
        if self.nested:
            raise _Fail("a train step run by a function defined inside the one that holds "
                        "the model: the model and optimizer state it returns would be that "
                        "function's locals")
        if not self.optimizers:  # (its opt_state would be unbound)
            raise _Fail("a train step of an optimizer this pass does not know (not built, "
                        "received nor read here)")
        parts = self.current.get(call.func.value, self.steps[call.func.value])
        args = list(call.args)
        if parts["functional"]:
            model = self.split_model or parts["model"]
            if target is None or not isinstance(target, cst.Tuple):
                raise _Fail("a functional train step whose result is not unpacked")
            rest = [code(e.value) for e in target.elements[1:]]
        else:
            model = code(args[0].value)
            rest = ([code(e.value) for e in target.elements] if isinstance(target, cst.Tuple)
                    else [code(target)] if target is not None else ["_"])
        stateful, keyed = self.flags(model)
        head = [model] + ([STATE] if stateful else []) + [OPT_STATE]
        extra = [code(a.value) if a.keyword is None else
                 f"{a.keyword.value}={code(a.value)}" for a in args[parts["skip"]:]]
        out = []
        if keyed:
            if not self.has_key:
                raise _Fail("the model needs a dropout key and no `key` is in scope here")
            # (the key of a forward that draws is not only dropout's)
            sub = "step_key" if self.models.get(model) in self.ctx.draws else "dropout_key"
            out.append(_stmt(f"key, {sub} = jax.random.split(key)"))
            extra.append(sub)
        self.trained.add(model)
        out.append(_stmt(f"{', '.join(head + rest)} = {call.func.value}"
                         f"({', '.join(head + extra)})"))
        if self.counter:
            out.append(_stmt(f"{COUNTER} += 1"))
        return out


def _builds_optimizer(value: cst.BaseExpression, models: dict[str, str],
                      ctx: TrainingContext) -> bool:
    if m.matches(value, m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Optimizer")))):
        return True
    return m.matches(value, m.Call(func=m.Attribute(value=m.Name()))) and \
        value.func.value.value in models and value.func.attr.value in ctx.optimizer_methods.get(
            models[value.func.value.value], ())


class _Returns(cst.CSTTransformer):
    """The returns of a function that trains the model it receives (not those of the
    functions defined in it): ``return x`` -> ``return model, state, opt_state, x``."""

    def __init__(self, head: list[str], valued: bool) -> None:
        self.head, self.valued = head, valued

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_Lambda(self, node) -> bool:
        return False

    def leave_Return(self, original_node, updated_node):
        head = ", ".join(self.head)
        if not self.valued:
            return cst.parse_statement(f"return {head}\n").body[0]
        value = code(updated_node.value) if updated_node.value is not None else "None"
        if isinstance(updated_node.value, cst.Tuple) and not updated_node.value.lpar:
            value = f"({value})"
        return cst.parse_statement(f"return {head}, {value}\n").body[0]


def _own_returns(fn: cst.FunctionDef) -> list[cst.Return]:
    nested = [x for f in findall(fn.body, m.FunctionDef() | m.Lambda())
              for x in findall(f, m.Return())]
    return [r for r in findall(fn.body, m.Return()) if r not in nested]


def _trainer(new: cst.FunctionDef, at: int, stateful: bool, opt_at: int | None
             ) -> cst.FunctionDef:
    """A function that trains the model it receives (parameter ``at``): it takes the model's
    state and the optimizer state (when it receives the optimizer, parameter ``opt_at``)
    after the model and returns them, the model first, before what it returned."""
    pname = new.params.params[at].name.value
    head = [pname] + ([STATE] if stateful else []) + ([OPT_STATE] if opt_at is not None else [])
    plist = list(new.params.params)
    for name in reversed(head[1:]):
        plist.insert(at + 1, cst.Param(cst.Name(name), comma=cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))))
    new = new.with_changes(params=new.params.with_changes(params=plist))
    returns = _own_returns(new)
    valued = any(r.value is not None for r in returns)
    body = new.body.visit(_Returns(head, valued))
    last = body.body[-1]
    if not m.matches(last, m.SimpleStatementLine(body=[m.Return()])):
        end = f"return {', '.join(head)}" + (", None" if valued else "")
        body = body.with_changes(body=[*body.body, _stmt(end)])
    return new.with_changes(body=body)


def _rebound(scope: Scope) -> None:
    if scope.trainer_calls:
        scope.trainer_calls = []
        raise _Fail("a function that trains the model it receives, called inside an "
                    "expression: its caller cannot rebind the model it returns")


def translate(stmts: list[cst.BaseStatement], classes: dict[str, tuple[bool, bool] | None],
              ctx: TrainingContext) -> list[list[cst.BaseStatement] | str]:
    """The module's statements other than classes, builders and imports, rewritten: for each,
    the new statements, or a message when it cannot be translated. ``classes``: model class ->
    (stateful, keyed), None for a class imported from another file (built with ``key=``; what
    needs its flags is refused). ``ctx``: what the rest of the file tells (TrainingContext)."""
    classes = {**classes, **seq.CLASSES}
    fns = {s.name.value: s for s in stmts if isinstance(s, cst.FunctionDef)}
    # train steps defined at the top level belong to the top-level loop that calls them
    top = [s for s in stmts if not isinstance(s, (cst.FunctionDef, cst.ClassDef)) or (
        isinstance(s, cst.FunctionDef) and (_step_parts(s, ctx) or gan.parse(s)))]
    fns = {n: f for n, f in fns.items() if f not in top}
    # ... and to the functions that call them (a step helper, `def train_step(x, y)` over the
    # script's model and optimizer, whose step the NNX pass hoisted to the top level)
    top_steps = {s.name.value: parts for s in top if isinstance(s, cst.FunctionDef) and (
        parts := _step_parts(s, ctx)) is not None}

    def builds(body) -> dict[str, str]:
        found = {}
        for s in body:
            for a in findall(s, m.Assign(targets=[m.AssignTarget(m.Name())])):
                cls = seq.model_build(a.value, classes, ctx.builders)
                if cls is not None:
                    found[a.targets[0].target.value] = cls
        return found

    models = {name: builds(fn.body.body) for name, fn in fns.items()}
    models[""] = builds(top)

    def optimizers_built(scope, body) -> set[str]:
        return {a.targets[0].target.value for s in body for a in findall(
            s, m.Assign(targets=[m.AssignTarget(m.Name())]))
            if _builds_optimizer(a.value, models[scope], ctx)}

    optimizers = {name: optimizers_built(name, fn.body.body) for name, fn in fns.items()}
    optimizers[""] = optimizers_built("", top)
    # a function that reads a model (and its optimizer) of the top level as a global
    # (`def train(epoch)` of a script): they are its too, and what it rebinds of them (the
    # step's results, the key it splits) is declared global (equinox_globals.py)
    top_bound = _assigned_names(top)
    rebinds: dict[str, set[str]] = {}
    for name, fn in fns.items():
        ms = read_globals(fn, set(models[""]), _params(fn))
        opts = read_globals(fn, optimizers[""], _params(fn))
        if not ms:
            continue
        models[name].update({g: models[""][g] for g in ms})
        optimizers[name] |= opts
        # the script's key, for the keys of its steps (split, so rebound)
        rebinds[name] = set(ms) | ({"key"} & top_bound) - own_scope(fn.body, _params(fn))[0]
        if any((classes[models[""][g]] or (False, False))[0] for g in ms):
            rebinds[name].add(STATE)
        if opts:
            rebinds[name] |= {OPT_STATE, COUNTER}
    receivers: dict[str, int] = {}
    opt_receivers: dict[str, int] = {}  # function -> the parameter its optimizer comes in
    changed = True
    while changed:
        changed = False
        for scope, body in [*((n, fn.body.body) for n, fn in fns.items()), ("", top)]:
            for s in body:
                for c in findall(s, m.Call(func=m.Name())):
                    g = c.func.value
                    if g not in fns or g == scope:
                        continue
                    params = [p.name.value for p in fns[g].params.params]
                    for i, a in enumerate(c.args):
                        if a.keyword is not None or a.star or i >= len(params):
                            continue
                        if code(a.value) in models[scope] and params[i] not in models[g] \
                                and classes[models[scope][code(a.value)]] is not None:
                            models[g][params[i]] = models[scope][code(a.value)]
                            receivers[g] = i
                            changed = True
                        if code(a.value) in optimizers[scope] and \
                                params[i] not in optimizers[g]:
                            optimizers[g].add(params[i])
                            opt_receivers[g] = i
                            changed = True
    # (with an optimizer it builds, receives or reads: one this pass does not know, its
    # construction marked, leaves the function's step marked, Scope.step_call)
    trainers = {g for g in receivers if optimizers[g] and any(
        _step_parts(fn, ctx) is not None for fn in findall(fns[g], m.FunctionDef()))}
    # the optimizer given to a function that does not train the model it receives
    opt_receivers = {g: i for g, i in opt_receivers.items() if g in trainers}
    any_stateful = any((classes[c] or (False, False))[0] for ms in models.values()
                       for c in ms.values())
    # one eval step for the models of the file: on the batch when they are kept batched;
    # a model class imported from another file decides when called (its `batched`)
    # (of the models it evaluates: passed to it, or put in inference mode; Scope.eval_key)
    evaluated = {code(c.args[0].value) for s in stmts for c in findall(s, m.Call(
        func=m.Name(EVAL_STEP), args=[m.Arg(keyword=None), m.ZeroOrMore()]))} | {
        c.func.value.value for s in stmts for c in findall(s, m.Call(func=m.Attribute(
            value=m.Name(), attr=m.Name("eval"))))}
    kinds = {c in ctx.batched for ms in models.values() for n, c in ms.items()
             if classes.get(c) is not None and n in evaluated}
    imported = any(classes.get(c) is None for ms in models.values() for c in ms.values())

    draws = {c in ctx.draws for ms in models.values() for c in ms.values()
             if classes.get(c) is not None}

    def the_eval_step() -> cst.FunctionDef:
        if len(kinds) > 1:
            raise _Fail("models kept batched and models per example share one eval_step")
        if len(draws) > 1 or (draws == {True} and imported):
            raise _Fail("models that draw in their forward pass and models that do not "
                        "share one eval_step")
        if imported and not any_stateful:
            return eval_step(False, None)
        return eval_step(any_stateful, kinds == {True}, draws == {True})

    def needs_key(g: str) -> bool:
        """A trainer of a model with dropout that has no `key` of its own: it takes one."""
        fn = fns[g]
        cls = models[g].get(fn.params.params[receivers[g]].name.value)
        return classes.get(cls) is not None and classes[cls][1] and \
            "key" not in _params(fn) and "key" not in _assigned_names(fn.body.body)
    keyed_trainers = {g for g in trainers if needs_key(g)}

    out: list[list[cst.BaseStatement] | str] = []
    autocast_at = None
    top_scope = Scope(models[""], classes, receivers, trainers,
                      "key" in _assigned_names(top), top, opt_receivers, optimizers[""],
                      ctx=ctx)
    top_scope.keyed_trainers = keyed_trainers
    top_scope.eval_stateful = any_stateful
    top_scope.eval_batched = kinds == {True}
    eval_calls = 0
    # a statement written below calls the autocast helper (a train step under a compute dtype)
    needs_autocast = False
    hoisted: set[str] = set()
    # the eval step of the NNX pass: written before the other functions of the file
    nnx_eval = next((s for s in stmts if isinstance(s, cst.FunctionDef) and
                     s.name.value == ctx.eval_step), None) if ctx.eval_step else None
    for s in stmts:
        try:
            if s is nnx_eval:
                autocast_at = len(out)
                out.append([the_eval_step().with_changes(leading_lines=s.leading_lines)])
                continue
            if isinstance(s, cst.FunctionDef) and s.name.value in fns:
                name = s.name.value
                body = list(s.body.body)
                has_key = "key" in _params(s) or "key" in _assigned_names(body) or \
                    name in keyed_trainers or "key" in rebinds.get(name, ())
                scope = Scope(models[name], classes, receivers, trainers, has_key, body,
                              opt_receivers, optimizers[name], ctx=ctx)
                scope.keyed_trainers, scope.params = keyed_trainers, set(_params(s))
                scope.steps = {**{n: p for n, p in top_steps.items() if n not in _params(s)},
                               **scope.steps}
                scope.eval_stateful = any_stateful
                scope.eval_batched = kinds == {True}
                new_body = list(cst.Module(body=body).visit(scope).visit(_DropRemoved()).visit(
                    TrainedFlag()).body)
                _rebound(scope)
                casts = scope.needs_autocast
                eval_calls += scope.eval_calls
                new = s.with_changes(body=s.body.with_changes(body=new_body))
                if name in rebinds:
                    new = declare_globals(new, rebinds[name])
                    taken = {t.name.value for t in stmts
                             if isinstance(t, cst.FunctionDef | cst.ClassDef)}
                    taken |= _assigned_names([t for t in stmts if not isinstance(
                        t, cst.FunctionDef | cst.ClassDef)]) | hoisted
                    step, new = hoist_step(new, None, taken)
                    if step is not None:  # (the optimizer a global: the step's as it is)
                        hoisted.add(step.name.value)
                        out.append([step, new])
                        needs_autocast |= casts
                        continue
                if name in receivers:
                    at = receivers[name]
                    pname = s.params.params[at].name.value
                    if classes[models[name][pname]] is None:
                        raise _Fail(imported_message(models[name][pname]))
                    stateful = classes[models[name][pname]][0]
                    if name in trainers:
                        new = _trainer(new, at, stateful, opt_receivers.get(name))
                        if name in keyed_trainers:  # the dropout keys of its steps
                            new = new.with_changes(params=new.params.with_changes(
                                star_arg=new.params.star_arg if isinstance(
                                    new.params.star_arg, cst.Param) else cst.ParamStar(),
                                kwonly_params=[*new.params.kwonly_params,
                                               cst.Param(cst.Name("key"))]))
                        if name in opt_receivers:
                            taken = {t.name.value for t in stmts
                                     if isinstance(t, cst.FunctionDef | cst.ClassDef)}
                            taken |= _assigned_names([t for t in stmts if not isinstance(
                                t, cst.FunctionDef | cst.ClassDef)]) | hoisted
                            step, new = hoist_step(
                                new, s.params.params[opt_receivers[name]].name.value, taken)
                            if step is not None:
                                hoisted.add(step.name.value)
                                out.append([step, new])
                                needs_autocast |= casts
                                continue
                    elif stateful:
                        plist = list(new.params.params)
                        plist.insert(at + 1, cst.Param(cst.Name(STATE), comma=cst.Comma(
                            whitespace_after=cst.SimpleWhitespace(" "))))
                        new = new.with_changes(params=new.params.with_changes(params=plist))
                out.append([new])
                needs_autocast |= casts
            else:
                before = top_scope.eval_calls
                top_scope.needs_autocast = False
                done = list(cst.Module(body=[s]).visit(top_scope).visit(_DropRemoved()).visit(
                    TrainedFlag()).body)
                _rebound(top_scope)
                eval_calls += top_scope.eval_calls - before
                out.append(done)
                needs_autocast |= top_scope.needs_autocast
        except (_Fail, gan.Refused) as exc:
            out.append(exc.message)
    if eval_calls and autocast_at is None:
        # no eval step came from NNX (evaluation under @torch.no_grad(), not a no_grad block)
        at = next((i for i, o in enumerate(out) if not isinstance(o, str) and o and isinstance(
            o[0], cst.FunctionDef) and findall(o[0], m.Call(func=m.Name(EVAL_STEP)))), None)
        if at is not None:
            first = out[at][0]
            try:
                step = the_eval_step().with_changes(leading_lines=first.leading_lines)
            except _Fail as exc:
                step = _todo(eval_step(any_stateful), exc.message)
            out[at] = [step, first.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2),
                       *out[at][1:]]
    # (a statement of the NNX form that equinox drops, nnx.split(...) or nnx.update(...),
    # leaves [])
    # the helper, written where a statement of the output calls it (a call the train step
    # writes, recorded as it is written: not a torch.amp.autocast( left as torch)
    if needs_autocast:
        helper = _stmt(AUTOCAST_SRC).with_changes(leading_lines=[cst.EmptyLine(indent=False),
                                                                 cst.EmptyLine(indent=False)])
        written = [i for i, o in enumerate(out) if not isinstance(o, str) and o]
        at = autocast_at if autocast_at is not None else next(
            (i for i in written if isinstance(out[i][0], cst.FunctionDef)), written[0])
        out[at] = [*out[at], helper]
    return out


def _mode_choice(small: cst.BaseSmallStatement, models) -> tuple[str, str] | None:
    """``model.train() if C else model.eval()`` (or the other way round) as a statement: (the
    model, the ``inference`` flag's expression, ``not (C)`` or ``C``)."""
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.IfExp)):
        return None
    choice = small.value
    modes = []
    for branch in (choice.body, choice.orelse):
        if not m.matches(branch, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("train")
                                                         | m.Name("eval")), args=[])):
            return None
        modes.append((branch.func.value.value, branch.func.attr.value))
    (a, first), (b, second) = modes
    if a != b or a not in models or {first, second} != {"train", "eval"}:
        return None
    test = code(choice.test)
    if first == "eval":
        return a, test
    simple = isinstance(choice.test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
    return a, f"not {test}" if simple else f"not ({test})"
