"""Verification for the flax.linen target: the same checks as for NNX, on ``init``/``apply``.

The torch state_dict goes into the linen variables by the same rules (``weights`` of each
layer rule), with linen's names for containers: a Sequential's layers are ``layers_<i>`` inside
the Sequential's own scope, a list of submodules ``<name>_<i>`` and a dict of submodules
``<name>_<key>`` in the parent's scope (see docs/linen-output.md). Normalisation statistics
live in the ``batch_stats`` collection, everything else that has weights in ``params``.
Buffers that setup() recomputes as constants (a causal mask) are not variables in linen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2jax.ruleset import Rule, RuleSet, builtin_rules
from torch2jax.verify.common import (
    DROP_PATH_CLASSES,
    VerifyError,
    build_call,
    check_float64,
    flatten_output,
    stage,
    torch_stats,
    train_mode_note,
    widen,
)
from torch2jax.verify.load import find_name
from torch2jax.verify.sides import JaxSide, ParamPairs, StatPairs, Trainer
from torch2jax.verify.train_common import set_injected_learning_rate
from torch2jax.weights import (
    ParamMapping,
    WeightTransferError,
    _storage_key,
    _target_of,
    _to_numpy,
    apply_layout,
    layer_rules_by_class,
    rule_for_module,
    trainable_parts,
)

STATS = {"mean", "var"}
TRAIN_FIELD = "train"  # the train/eval field of converted modules (docs/linen-output.md)


@dataclass
class LinenPlan:
    mappings: list[ParamMapping]  # nnx_path holds (collection, *path); a split entry has several
    constants: list[str]  # torch buffers recomputed by setup()
    summed: set[tuple] = field(default_factory=set)  # paths holding a sum of torch tensors


def _linen_path(components: list[str], modules: dict[str, Any], variables: dict | None = None
                ) -> list[str]:
    import torch

    out: list[str] = []
    prefix: list[str] = []
    for c in components:
        parent = modules.get(".".join(prefix))
        if isinstance(parent, torch.nn.Sequential) and c.isdigit():
            out.append(_sequential_item(c, parent, [_lookup(variables.get(col, {}), out)
                                                    for col in ("params", "batch_stats")]
                                        if variables else []))
        elif isinstance(parent, (torch.nn.ModuleList, torch.nn.ModuleDict)) and prefix:
            out[-1] = f"{out[-1]}_{c}"
        elif c.isdigit() and prefix[-1:] in (["layers"], ["reverse_layers"]) and isinstance(
                modules.get(".".join(prefix[:-1])), torch.nn.RNNBase):
            out[-1] = f"{prefix[-1]}_{c}"  # layer k of the TorchLSTM helper, a list in setup()
        else:
            out.append(c)
        prefix.append(c)
    return out


def _sequential_item(c: str, seq: Any, scopes: list[Any]) -> str:
    """linen's name for item ``c`` of the torch Sequential ``seq``: ``layers_<c>``, unless
    the converter put layout transposes (weightless lambdas) between its layers. Then the
    items with weights are matched in order: the k-th torch item with a state is the k-th
    ``layers_<i>`` that holds variables."""
    held = {k for scope in scopes if isinstance(scope, dict) for k in scope}
    linen = sorted((k for k in held if re.fullmatch(r"layers_\d+", k)), key=lambda k: int(k[7:]))
    weighted = [name for name, child in seq.named_children() if child.state_dict()]
    if c in weighted and len(weighted) == len(linen):
        return linen[weighted.index(c)]
    return f"layers_{c}"


def _lookup(tree: Any, path: list[str]) -> Any:
    for p in path:
        if not isinstance(tree, dict) or p not in tree:
            return None
        tree = tree[p]
    return tree


def plan_linen(torch_model: Any, variables: dict, rules: RuleSet | None = None) -> LinenPlan:
    table = layer_rules_by_class(rules or builtin_rules())
    modules = dict(torch_model.named_modules(remove_duplicate=False))
    state = torch_model.state_dict(keep_vars=True)
    buffers = {name for name, _ in torch_model.named_buffers()}
    mappings: list[ParamMapping] = []
    constants: list[str] = []
    problems: list[str] = []
    carriers: dict[tuple, str] = {}
    summed: set[tuple] = set()
    def rule_at(prefix: str) -> Rule | None:
        owner = modules.get(prefix)
        return rule_for_module(owner, table) if owner is not None else None

    for key, tensor in state.items():
        shape = tuple(tensor.shape)
        storage = _storage_key(tensor)
        found = _target_of(key, rule_at)
        layout, rule = found[0].layout, found[0].rule
        if found[0].components is None:
            mappings.append(ParamMapping(key, "dropped", None, layout, rule, torch_shape=shape))
            continue
        new, missing = _destinations(key, shape, found, variables, modules)
        if missing is not None:
            if storage in carriers:  # a tied weight: the other name carries it
                mappings.append(ParamMapping(key, "tied", None, layout, rule,
                                             tied_to=carriers[storage], torch_shape=shape))
            elif key in buffers and rule is None:
                constants.append(key)
            else:
                problems.append(f"{key}: linen has no {missing}")
            continue
        if sum(int(np.prod(mp.nnx_shape)) for mp in new) != int(np.prod(shape)):
            problems.append(f"{key} {shape} does not fit "
                            + ", ".join("/".join(map(str, mp.nnx_path)) for mp in new))
            continue
        carriers.setdefault(storage, key)
        mappings += new
        if any(t.sum for t in found):
            summed |= {mp.nnx_path for mp in new}
    if problems:
        raise WeightTransferError(problems)
    return LinenPlan(mappings, constants, summed)


def _destinations(key: str, shape: tuple, found: list, variables: dict, modules: dict
                  ) -> tuple[list[ParamMapping], str | None]:
    """The linen variables one torch entry goes to (one per part), or the first missing one."""
    out = []
    for target in found:
        # layer 0 of a stacked recurrent layer (the TorchLSTM helper): its fallback path
        tries = [target.components, *([target.fallback] if target.fallback else [])]
        new, missing = [], None
        for components in tries:
            path = _linen_path(components, modules, variables)
            collection = "batch_stats" if target.rule is not None and path[-1] in STATS \
                else "params"
            leaf = _lookup(variables.get(collection, {}), path)
            if leaf is None:
                missing = f"{collection}/{'/'.join(path)}"
                continue
            new, missing = [ParamMapping(key, "mapped", (collection, *path), target.layout,
                                         target.rule, torch_shape=shape,
                                         nnx_shape=tuple(np.shape(leaf)))], None
            break
        if missing is not None:
            return [], missing
        out += new
    return out, None


def transfer_to_linen(torch_model: Any, variables: dict, rules: RuleSet | None = None
                      ) -> tuple[dict, LinenPlan]:
    """A copy of ``variables`` holding the torch model's weights."""
    import jax.numpy as jnp

    plan = plan_linen(torch_model, variables, rules)
    state = torch_model.state_dict()
    out = _thaw(variables)  # new dicts over the same arrays: the caller's tree is kept
    filled: set[tuple] = set()
    for mp in plan.mappings:
        if mp.status != "mapped":
            continue
        value = apply_layout(_to_numpy(state[mp.torch_name]), mp.layout).reshape(mp.nnx_shape)
        *parents, leaf = mp.nnx_path
        node = out
        for p in parents:
            node = node[p]
        if mp.nnx_path in plan.summed and mp.nnx_path in filled:  # a rule's sum = true
            value = value + np.asarray(node[leaf])
        filled.add(mp.nnx_path)
        node[leaf] = jnp.asarray(value, dtype=node[leaf].dtype)
    return out, plan


def _thaw(tree: Any) -> Any:
    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {k: _thaw(v) for k, v in tree.items()}
    return tree


def gradient_map_linen(torch_model: Any, plan: LinenPlan) -> dict[str, list[ParamMapping]]:
    """For each trainable torch parameter, the linen parameters (one per part) that hold it,
    paths inside ``params``. A summed parameter has the gradient of the sum."""
    result = {}
    for name, ms in trainable_parts(torch_model, plan.mappings).items():
        if ms[0].nnx_path is not None and ms[0].nnx_path[0] == "params":
            result[name] = [ParamMapping(m.torch_name, m.status, tuple(m.nnx_path[1:]),
                                         m.layout, m.rule, torch_shape=m.torch_shape,
                                         nnx_shape=m.nnx_shape) for m in ms]
    return result


def flat_params(tree: dict, prefix: tuple = ()) -> dict[tuple, np.ndarray]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat_params(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = np.asarray(v)
    return out


@dataclass
class LinenModel:
    """The linen side's model: the module (cloned with ``train=True`` in training mode), its
    variables and where the torch weights went."""

    module: Any
    variables: dict
    plan: LinenPlan | None = None


class LinenTrainer(Trainer):
    """The training code linen output uses: a TrainState, ``jax.value_and_grad`` of
    ``apply`` under ``jax.jit``, ``mutable=["batch_stats"]``."""

    def __init__(self, model: LinenModel, setup: Any, loss_fn: Any) -> None:
        import flax.linen as nn
        import jax
        from flax.training import train_state

        self.model = model
        stats = "batch_stats" in model.variables

        class State(train_state.TrainState):
            batch_stats: Any = None

        self.state = State.create(apply_fn=model.module.apply,
                                  params=model.variables["params"], tx=setup.tx,
                                  batch_stats=model.variables.get("batch_stats"))

        @jax.jit
        def train_step(state: Any, xs: list, labels: Any) -> Any:
            def loss_of(params: Any) -> Any:
                with nn.intercept_methods(_no_dropout):
                    if stats:
                        out, updates = state.apply_fn(
                            {"params": params, "batch_stats": state.batch_stats}, *xs,
                            mutable=["batch_stats"])
                        return loss_fn(out, labels), updates["batch_stats"]
                    return loss_fn(state.apply_fn({"params": params}, *xs), labels), None

            (loss, new_stats), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
            return state.apply_gradients(grads=grads, batch_stats=new_stats), loss

        self._step = train_step

    def step(self, xs: list, labels: Any) -> Any:
        self.state, loss = self._step(self.state, xs, labels)
        return loss

    def params(self) -> Any:
        return self.state.params

    def set_learning_rate(self, value: float) -> None:
        set_injected_learning_rate(self.state.opt_state, value)

    def trained(self) -> tuple[Any, Any]:
        variables = {"params": self.state.params}
        if self.state.batch_stats is not None:
            variables["batch_stats"] = self.state.batch_stats
        return LinenModel(self.model.module, variables, self.model.plan), \
            self.state.batch_stats or {}


class LinenSide(JaxSide):
    name = "linen"
    build_stage = "building the linen model"
    forward_stage = "the linen forward pass (model.apply under jax.jit)"
    grad_stage = "the linen gradient (jax.grad under jax.jit)"
    step_stage = "the linen training step {step} (jax.jit)"

    def build(self, req: Any, module: Any, name: str, sample: list) -> LinenModel:
        """The module, then its variables initialised on ``sample`` (under jax.jit)."""
        import jax

        if req.build is None:
            model = find_name(module, name, module.__file__ or name)(**(req.args or {}))
        else:
            model = eval(compile(build_call(req.build), "<--build>", "eval"), dict(vars(module)))
        with stage("initialising the linen variables"):
            variables = jax.jit(lambda xs: model.init(jax.random.key(req.seed), *xs))(sample)
        return LinenModel(model, _thaw(variables))

    def load_weights(self, r: Any, req: Any, model: LinenModel, torch_model: Any
                     ) -> LinenModel:
        variables = widen(model.variables) if req.float64 else model.variables
        variables, plan = transfer_to_linen(torch_model, variables, req.rules)
        mapped = sum(1 for m in plan.mappings if m.status == "mapped")
        note = f"{mapped} tensors transferred into the linen variables"
        if plan.constants:
            note += f"; {len(plan.constants)} buffers recomputed by setup(): " + ", ".join(
                plan.constants)
        r.notes.append(note)
        return LinenModel(model.module, variables, plan)

    def train_mode(self, r: Any, model: LinenModel, n_torch: int) -> LinenModel:
        """Dropout-like modules deterministic (intercepted: :func:`_no_dropout`), the module
        cloned with ``train=True`` where it has that field."""
        r.notes.append(train_mode_note(n_torch, "linen's intercepted (they return their input)"))
        return LinenModel(_with_train(model.module), model.variables, model.plan)

    def eval_mode(self, r: Any, model: LinenModel) -> LinenModel:
        return model

    def check_float64(self, model: LinenModel, jax_in: list, specs: list) -> None:
        check_float64(lambda v, xs: _apply(model.module, v, xs), model.variables, jax_in)

    def forward(self, model: LinenModel, jax_in: list, specs: list) -> tuple[Any, Any]:
        import jax

        return jax.jit(lambda v, xs: _apply(model.module, v, xs))(model.variables, jax_in)

    def stats(self, req: Any, torch_model: Any, model: LinenModel, updated: Any) -> StatPairs:
        return stat_pairs(torch_model, model.plan, updated)

    def grads(self, r: Any, req: Any, torch_model: Any, model: LinenModel, jax_in: list,
              cots: dict, specs: list) -> tuple[dict, dict]:
        import jax
        import jax.numpy as jnp

        jcots = {k: jnp.asarray(v) for k, v in cots.items()}
        rest = {k: v for k, v in model.variables.items() if k != "params"}

        def scalar(params: Any, xs: list) -> Any:
            out = _apply(model.module, {"params": params, **rest}, xs)[0]
            leaves = dict(flatten_output(out))
            return sum(jnp.sum(leaves[k].astype(jnp.promote_types(leaves[k].dtype, jnp.float32))
                               * c) for k, c in jcots.items())

        jg = flat_params(jax.jit(jax.grad(scalar))(model.variables["params"], jax_in))
        return jg, gradient_map_linen(torch_model, model.plan)

    def trajectory_mode(self, r: Any, model: LinenModel, n_dropout: int, n_drop_path: int
                        ) -> LinenModel:
        if n_dropout:
            r.notes.append(f"dropout disabled for the trajectory: {n_dropout} torch Dropout "
                           "modules set to p=0, nn.Dropout intercepted (random masks cannot "
                           "agree)")
        if n_drop_path:
            r.notes.append(f"stochastic depth off for the trajectory: {n_drop_path} torch "
                           "drop-path modules in eval mode, the converted ones intercepted")
        trained = _with_train(model.module)
        r.notes.append("training mode on both sides" + (" (model.clone(train=True))"
                                                         if trained is not model.module else "")
                       + "; BatchNorm uses batch statistics and updates its running averages")
        return LinenModel(trained, model.variables, model.plan)

    def train_step(self, model: LinenModel, setup: Any, loss_fn: Any) -> Trainer:
        return LinenTrainer(model, setup, loss_fn)

    def param_pairs(self, req: Any, torch_model: Any, model: LinenModel,
                    params_torch: dict[str, np.ndarray], steps: int) -> ParamPairs:
        params_jax = flat_params(model.variables["params"])
        pairs = []
        for name, mp in ((n, mp) for n, ms in gradient_map_linen(torch_model, model.plan).items()
                         for mp in ms):
            if ("params", *mp.nnx_path) in model.plan.summed:
                raise VerifyError(f"{name} is summed with another torch tensor in the linen "
                                  "parameters: torch trains the two apart")
            got = params_jax.get(tuple(mp.nnx_path))
            if got is None:
                raise VerifyError(f"the linen variables have no parameter for {name}")
            compared = (f"param {name} -> params/{'/'.join(map(str, mp.nnx_path))} "
                        f"({mp.layout}) after {steps} steps")
            pairs.append((name, compared, got, apply_layout(params_torch[name], mp.layout)))
        return pairs


def _apply(model: Any, variables: dict, xs: list) -> tuple[Any, dict]:
    """``(output, batch statistics after the call)``; they stay mutable for layers that always
    use the batch's (torch's track_running_stats=False) and for a model in training mode.
    Dropout-like modules return their input (:func:`_no_dropout`)."""
    import flax.linen as nn

    with nn.intercept_methods(_no_dropout):
        if "batch_stats" in variables:
            out, updates = model.apply(variables, *xs, mutable=["batch_stats"])
            return out, updates["batch_stats"]
        return model.apply(variables, *xs), {}


def _with_train(module: Any) -> Any:
    """The module cloned with ``train=True`` where it has that field (docs/linen-output.md)."""
    if TRAIN_FIELD in getattr(type(module), "__dataclass_fields__", {}):
        return module.clone(train=True)
    return module


def stat_pairs(torch_model: Any, plan: LinenPlan, stats: dict) -> list[tuple[str, str, Any, Any]]:
    """Each torch running statistic with its value in the linen ``batch_stats``."""
    ref = torch_stats(torch_model)
    return [(m.torch_name, "/".join(map(str, m.nnx_path)), _lookup(stats, list(m.nnx_path[1:])),
             ref[m.torch_name]) for m in plan.mappings
            if m.status == "mapped" and m.torch_name in ref and m.nnx_path[0] == "batch_stats"]


# ---------------------------------------------------------------------------- trajectories
def _no_dropout(next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
    """A flax method interceptor: nn.Dropout and the converted drop-path modules return their
    input (random masks from two RNGs cannot agree; torch's get p = 0 or eval mode)."""
    import flax.linen as nn

    if (isinstance(context.module, nn.Dropout) or type(context.module).__name__ in
            DROP_PATH_CLASSES) and context.method_name == "__call__":
        return args[0]
    return next_fun(*args, **kwargs)
