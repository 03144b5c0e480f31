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
from torch2jax.verify.load import find_name
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


# NNX fused kernels that linen keeps per gate: nnx.OptimizedLSTMCell's dense_i / dense_h are
# linen's ii, if, ig, io / hi, hf, hg, ho (torch's gate order, i f g o). The TorchGRUCell helper's
# are fused in both (the same names and shapes as NNX's).
PER_GATE = {"dense_i": "i", "dense_h": "h"}
GATES = "ifgo"
FUSED = ("torch.nn.GRU", "torch.nn.GRUCell")  # rules whose dense_i / dense_h linen keeps fused


def _linen_parts(components: list[str], layout: str, per_gate: bool = True
                 ) -> list[tuple[list[str], str]]:
    """A rule's NNX destination -> linen's, one per part (several for a per-gate kernel)."""
    for i, c in enumerate(components):
        if per_gate and c in PER_GATE:
            if "[" in layout:
                raise ValueError(f"{layout}: a part of a per-gate kernel")
            return [([*components[:i], PER_GATE[c] + g, *components[i + 1:]],
                     f"{layout}[{k}/{len(GATES)}]") for k, g in enumerate(GATES)]
    return [(components, layout)]


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
        per_gate = target.rule not in FUSED
        for comps, layout in _linen_parts(target.components, target.layout, per_gate):
            path = _linen_path(comps, modules, variables)
            collection = "batch_stats" if target.rule is not None and path[-1] in STATS \
                else "params"
            leaf = _lookup(variables.get(collection, {}), path)
            if leaf is None:
                return [], f"{collection}/{'/'.join(path)}"
            out.append(ParamMapping(key, "mapped", (collection, *path), layout, target.rule,
                                    torch_shape=shape, nnx_shape=tuple(np.shape(leaf))))
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
        if mp.nnx_path in plan.summed and mp.nnx_path in filled:  # b_ih + b_hh
            value = value + np.asarray(node[leaf])
        filled.add(mp.nnx_path)
        node[leaf] = jnp.asarray(value, dtype=node[leaf].dtype)
    return out, plan


def _thaw(tree: Any) -> Any:
    if isinstance(tree, dict) or hasattr(tree, "items"):
        return {k: _thaw(v) for k, v in tree.items()}
    return tree


def _build_model(req: Any, jax_module: Any, name: str, jax_path: Any) -> Any:
    """The linen module ``name`` of the converted file, built with ``req.args`` (or by the
    ``--build`` expression)."""
    from torch2jax.verify import common as vr

    with vr.stage("building the linen model"):
        if req.build is None:
            return find_name(jax_module, name, jax_path)(**(req.args or {}))
        return eval(compile(vr.build_call(req.build), "<--build>", "eval"),
                    dict(vars(jax_module)))


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


def run_linen_side(r: Any, req: Any, jax_module: Any, jax_path: Any, name: str,
                   torch_model: Any, specs: list) -> None:
    """Build, init, transfer, run (under jit) and differentiate the linen model."""
    import jax
    import jax.numpy as jnp
    import torch

    from torch2jax.verify import common as vr

    model = _build_model(req, jax_module, name, jax_path)
    rng = np.random.default_rng(req.seed)
    arrays = [s.sample(rng) for s in specs]
    r.compared += [f"input[{i}] {s}" for i, s in enumerate(specs)]
    torch_in = vr.torch_inputs(arrays, specs)
    jax_in = vr.jax_inputs(arrays, specs)
    with vr.stage("initialising the linen variables"):
        variables = jax.jit(lambda xs: model.init(jax.random.key(req.seed), *xs))(jax_in)
    variables = _thaw(variables)
    if req.float64:
        variables = vr.widen(variables)
    try:
        variables, plan = transfer_to_linen(torch_model, variables, req.rules)
    except WeightTransferError as exc:
        raise vr.VerifyError(str(exc)) from None
    mapped = sum(1 for m in plan.mappings if m.status == "mapped")
    note = f"{mapped} tensors transferred into the linen variables"
    if plan.constants:
        note += f"; {len(plan.constants)} buffers recomputed by setup(): " + ", ".join(
            plan.constants)
    r.notes.append(note)
    if req.train_mode:
        model = _train_mode(model, torch_model, r)
    with vr.stage("the torch forward pass"), torch.no_grad():
        torch_out = torch_model(*torch_in)
    torch_leaves = [(k, vr.torch_to_numpy(v)) for k, v in vr.flatten_output(torch_out)]
    if req.float64:
        vr.check_float64(lambda v, xs: _apply(model, v, xs), variables, jax_in)
    with vr.stage("the linen forward pass (model.apply under jax.jit)"):
        jax_out, stats = jax.jit(lambda v, xs: _apply(model, v, xs))(variables, jax_in)
    jax_leaves = [(k, vr.jax_to_numpy(v)) for k, v in vr.flatten_output(jax_out)]
    out = vr.compare_outputs(jax_leaves, torch_leaves, r)
    r.max_abs_diff, r.max_rel_diff = out.abs, out.rel
    r.passed, r.mismatch = out.ok, out.first_failure
    if req.train_mode:  # before the gradients: torch's backward pass runs the model again
        vr.compare_stats(r, stat_pairs(torch_model, plan, stats), "after the forward pass")
    if not (req.grad and out.shapes_match):
        if req.grad:
            r.notes.append("gradients not compared: the outputs differ in structure or shape")
        return
    cots = vr.cotangents(torch_leaves, req.seed)
    with vr.stage("the torch backward pass"):
        tg = vr.torch_grads(torch_model, torch_in, cots)
    jcots = {k: jnp.asarray(v) for k, v in cots.items()}
    rest = {k: v for k, v in variables.items() if k != "params"}

    def scalar(params: Any, xs: list) -> Any:
        leaves = dict(vr.flatten_output(_apply(model, {"params": params, **rest}, xs)[0]))
        return sum(jnp.sum(leaves[k].astype(jnp.promote_types(leaves[k].dtype, jnp.float32)) * c) for k, c in jcots.items())

    with vr.stage("the linen gradient (jax.grad under jax.jit)"):
        jg = flat_params(jax.jit(jax.grad(scalar))(variables["params"], jax_in))
    mapping = gradient_map_linen(torch_model, plan)
    g = vr.compare_grads(jg, tg, mapping, r)
    r.grad_max_abs_diff, r.grad_max_rel_diff = g.abs, g.rel
    r.passed = r.passed and g.ok
    r.mismatch = r.mismatch or g.first_failure


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


def _train_mode(model: Any, torch_model: Any, r: Any) -> Any:
    """Both models in training mode, dropout-like modules deterministic: the linen model
    cloned with ``train=True`` where it has that field."""
    from torch2jax.verify import common as vr

    n_torch = vr.torch_train_mode(torch_model)
    r.notes.append(vr.train_mode_note(n_torch, "linen's intercepted (they return their input)"))
    if TRAIN_FIELD in getattr(type(model), "__dataclass_fields__", {}):
        return model.clone(train=True)
    return model


def stat_pairs(torch_model: Any, plan: LinenPlan, stats: dict) -> list[tuple[str, str, Any, Any]]:
    """Each torch running statistic with its value in the linen ``batch_stats``."""
    from torch2jax.verify import common as vr

    ref = vr.torch_stats(torch_model)
    return [(m.torch_name, "/".join(map(str, m.nnx_path)), _lookup(stats, list(m.nnx_path[1:])),
             ref[m.torch_name]) for m in plan.mappings
            if m.status == "mapped" and m.torch_name in ref and m.nnx_path[0] == "batch_stats"]


# ---------------------------------------------------------------------------- trajectories
def _no_dropout(next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
    """A flax method interceptor: nn.Dropout and the converted drop-path modules return their
    input (random masks from two RNGs cannot agree; torch's get p = 0 or eval mode)."""
    import flax.linen as nn

    from torch2jax.verify.common import DROP_PATH_CLASSES

    if (isinstance(context.module, nn.Dropout) or type(context.module).__name__ in
            DROP_PATH_CLASSES) and context.method_name == "__call__":
        return args[0]
    return next_fun(*args, **kwargs)


def linen_trajectory(r: Any, req: Any, train: Any, jax_path: Any, name: str, torch_model: Any,
                     specs: list, setup: Any, loss_jax: Any) -> None:
    """The trajectory check for --target linen: the converted module initialised, the torch
    weights transferred, then ``train.steps`` steps of the training code linen output uses
    (a TrainState, ``jax.value_and_grad`` of ``model.clone(train=True).apply`` under
    ``jax.jit``, ``mutable=["batch_stats"]``) against torch's, on the same batches."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import torch
    from flax.training import train_state

    from torch2jax.verify import common as vr
    from torch2jax.verify import train_common as vt
    from torch2jax.verify.load import load_module
    from torch2jax.verify.spec import parse_spec

    jax_module = load_module(jax_path, prefix="torch2jax_verify_jax")
    model = _build_model(req, jax_module, name, jax_path)
    rng = np.random.default_rng(req.seed)
    sample = vr.jax_inputs([s.sample(rng) for s in specs], specs)
    with vr.stage("initialising the linen variables"):
        variables = _thaw(jax.jit(lambda xs: model.init(jax.random.key(req.seed), *xs))(sample))
    try:
        variables, plan = transfer_to_linen(torch_model, variables, req.rules)
    except WeightTransferError as exc:
        raise vr.VerifyError(str(exc)) from None
    r.notes.append(f"{sum(1 for m in plan.mappings if m.status == 'mapped')} tensors "
                   "transferred into the linen variables")
    vt.unalias(torch_model)
    torch_model.train()
    dropped = 0
    for mod in torch_model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p:
            mod.p = 0.0
            dropped += 1
    if dropped:
        r.notes.append(f"dropout disabled for the trajectory: {dropped} torch Dropout modules "
                       "set to p=0, nn.Dropout intercepted (random masks cannot agree)")
    trained = model.clone(train=True) if "train" in getattr(
        type(model), "__dataclass_fields__", {}) else model
    r.notes.append("training mode on both sides" + (" (model.clone(train=True))"
                                                     if trained is not model else "")
                   + "; BatchNorm uses batch statistics and updates its running averages")
    stats = "batch_stats" in variables

    class State(train_state.TrainState):
        batch_stats: Any = None

    state = State.create(apply_fn=trained.apply, params=variables["params"], tx=setup.tx,
                         batch_stats=variables.get("batch_stats"))

    @jax.jit
    def train_step(state: Any, xs: list, labels: Any) -> Any:
        def loss_fn(params: Any) -> Any:
            with nn.intercept_methods(_no_dropout):
                if stats:
                    out, updates = state.apply_fn(
                        {"params": params, "batch_stats": state.batch_stats}, *xs,
                        mutable=["batch_stats"])
                    return loss_jax(out, labels), updates["batch_stats"]
                return loss_jax(state.apply_fn({"params": params}, *xs), labels), None

        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        return state.apply_gradients(grads=grads, batch_stats=new_stats), loss

    plateau_state = None
    if setup.plateau is not None:
        plateau_state = setup.plateau.init(state.params)
    label_spec = parse_spec(train.labels) if train.labels else None
    loss_torch = vt.torch_loss(train.loss)
    opt, sched = vt.torch_setup(train, torch_model)
    rng = np.random.default_rng(req.seed + 3)
    torch_losses: list[float] = []
    jax_losses: list[float] = []
    for step in range(train.steps):
        arrays = [s.sample(rng) for s in specs]
        label_arr = label_spec.sample(rng) if label_spec else None
        t_in = vr.torch_inputs(arrays, specs)
        t_lab = vr.torch_inputs([label_arr], [label_spec])[0] if label_spec else None
        torch_losses.append(vt.torch_step(torch_model, opt, sched, loss_torch, t_in, t_lab,
                                          train.clip_grad_norm, step))
        j_in = vr.jax_inputs(arrays, specs)
        j_lab = vr.jax_inputs([label_arr], [label_spec])[0] if label_spec else None
        with vr.stage(f"the linen training step {step} (jax.jit)"):
            state, jloss = train_step(state, j_in, j_lab)
            if setup.plateau is not None:
                value = -jloss if setup.negate_metric else jloss
                _, plateau_state = setup.plateau.update(None, plateau_state, value=value)
                hp = _hyperparams(state.opt_state)
                hp["learning_rate"] = jnp.asarray(setup.base_lr * plateau_state.scale,
                                                  hp["learning_rate"].dtype)
        jax_losses.append(float(jax.device_get(jloss)))
    params_torch = {n: p.detach().cpu().float().numpy().copy()
                    for n, p in torch_model.named_parameters()}
    traj = vt.Trajectory(torch_losses, jax_losses, params_torch, flat_params(state.params))
    _compare_trajectory(traj, torch_model, plan, r)
    vr.compare_stats(r, stat_pairs(torch_model, plan, state.batch_stats or {}),
                     f"after {train.steps} steps")


def _hyperparams(opt_state: Any) -> dict:
    """The injected hyperparameters (inside a chain: clipping comes first)."""
    if hasattr(opt_state, "hyperparams"):
        return opt_state.hyperparams
    for part in opt_state if isinstance(opt_state, tuple) else ():
        found = _hyperparams(part)
        if found is not None:
            return found
    return None


def _compare_trajectory(traj: Any, torch_model: Any, plan: LinenPlan, r: Any) -> None:
    from torch2jax.verify import train_common as vt
    from torch2jax.verify.common import VerifyError, compare_arrays

    r.losses_torch, r.losses_jax = traj.losses_torch, traj.losses_jax
    rels = [vt.relative_loss_diff(a, b)
            for a, b in zip(traj.losses_jax, traj.losses_torch, strict=True)]
    worst_step = int(np.argmax(rels)) if rels else 0
    loss_rel = rels[worst_step] if rels else 0.0
    r.loss_max_rel_diff = loss_rel
    p_abs, p_rel, worst = 0.0, -1.0, None
    for name, mp in ((n, mp) for n, ms in gradient_map_linen(torch_model, plan).items()
                     for mp in ms):
        if ("params", *mp.nnx_path) in plan.summed:
            raise VerifyError(f"{name} is summed with another torch tensor in the linen "
                              "parameters: torch trains the two apart")
        ref = apply_layout(traj.params_torch[name], mp.layout)
        got = traj.params_jax.get(tuple(mp.nnx_path))
        if got is None:
            raise VerifyError(f"the linen variables have no parameter for {name}")
        if ref.shape != got.shape and ref.size == got.size:
            ref = ref.reshape(got.shape)
        d = compare_arrays(got, ref, r.atol, r.rtol)
        r.compared.append(f"param {name} -> params/{'/'.join(map(str, mp.nnx_path))} "
                          f"({mp.layout}) after {r.steps} steps")
        p_abs = max(p_abs, d.abs)
        if d.rel > p_rel:
            p_rel, worst = d.rel, name
    vt.settle_trajectory(r, traj, loss_rel, worst_step, p_abs, p_rel, worst)
