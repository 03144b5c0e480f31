"""Verification for the equinox target: the same checks as for NNX, on an ``eqx.Module``.

The converted model is per-example (docs/equinox.md), so both runs map it over the batch:
``jax.vmap(model, axis_name="batch", in_axes=(0, ..., None), out_axes=(0, None))(*xs, state)``
for a model that holds BatchNorm state, ``jax.vmap(model)(*xs)`` otherwise, under
``eqx.filter_jit``, in ``eqx.nn.inference_mode``. Gradients come from ``eqx.filter_grad``.

The torch state_dict goes into the model by path: equinox keeps torch's attribute names and
torch's layouts (a Linear weight is ``(out, in)``, a conv weight ``(out, in, *k)``), so each
entry is copied as it is, reshaped where equinox stores it with other unit axes (a conv bias
is ``(out, 1, 1)``). A Sequential's layers are ``.layers[i]``, a list of blocks ``[i]``, a dict
of submodules ``["name"]``. BatchNorm running statistics go into the ``eqx.nn.State`` at the
layer's ``running_stats`` (the converter's BatchNorm helper) or ``batch_state_index``
(a hand-written ``eqx.nn.BatchNorm(mode="batch")``, whose counter stays 0: inference then uses
the stored statistics as they are); ``num_batches_tracked`` has no counterpart.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2jax.verify.common import (
    DROP_PATH_CLASSES,
    VerifyError,
    VerifyRequest,
    build_call,
    check_float64,
    flatten_output,
    torch_stats,
    train_mode_note,
    widen,
)
from torch2jax.verify.load import find_name
from torch2jax.verify.sides import JaxSide, ParamPairs, StatPairs, Trainer, check_trajectory
from torch2jax.verify.train_common import (
    TrajectoryResult,
    set_injected_learning_rate,
    translate_loss,
    translate_setup,
)
from torch2jax.weights import (
    ParamMapping,
    WeightTransferError,
    _storage_key,
    _to_numpy,
    apply_layout,
    invert_layout,
    join_parts,
)

Step = tuple[str, Any]  # ("attr", name) | ("index", i) | ("key", k)
_MAKE = "__torch2jax_make_with_state__"
_KEY = "__torch2jax_key__"


@dataclass(frozen=True)
class Part:
    """Where a torch tensor (or a piece of it) lives in the equinox model: the array at
    ``path`` is ``apply_layout(tensor, layout)`` (``layout`` may name a chunk, ``as_is[1/3]``);
    ``summed``: it is the sum of several torch tensors."""

    path: tuple[Step, ...]
    layout: str = "as_is"
    summed: bool = False


@dataclass
class EquinoxPlan:
    params: list[tuple[str, tuple[Part, ...]]] = field(default_factory=list)  # torch -> parts
    stats: dict[tuple[Step, ...], dict[str, str]] = field(default_factory=dict)  # bn -> mean/var
    tied: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)


def walk(tree: Any, path: tuple[Step, ...]) -> Any:
    for kind, k in path:
        tree = getattr(tree, k) if kind == "attr" else tree[k]
    return tree


def _step(obj: Any, torch_parent: Any, component: str) -> Step:
    import equinox as eqx
    import torch

    if isinstance(torch_parent, torch.nn.Sequential):
        if not isinstance(obj, eqx.nn.Sequential):
            raise KeyError(component)
        return ("seq", int(component))
    if isinstance(torch_parent, torch.nn.ModuleList):
        return ("index", int(component))
    if isinstance(torch_parent, torch.nn.ModuleDict):
        return ("key", component)
    return ("attr", SUBMODULES.get(type(obj).__name__, {}).get(component, component))


def torch_value(tree: Any, parts: tuple[Part, ...]) -> np.ndarray:
    """The torch-layout array that ``parts`` of ``tree`` (the model, or its gradients) hold;
    a summed part gives the sum (for gradients: each summand's gradient)."""
    chunks = [invert_layout(np.asarray(walk(tree, p.path)), p.layout) for p in parts]
    return chunks[0] if len(chunks) == 1 else join_parts(chunks)


# equinox layers that store torch's tensors under other names or layouts:
# class name -> {torch name: (equinox path, layout, summed)}; split tensors list their chunks
_MHA = {**{f"in_proj_{w}": [((f"{p}_proj", w), f"as_is[{i}/3]", False)
                            for i, p in enumerate(("query", "key", "value"))]
           for w in ("weight", "bias")},
        **{f"{p[0]}_proj_weight": [((f"{p}_proj", "weight"), "as_is", False)]
           for p in ("query", "key", "value")}}
RENAMED = {"MultiheadAttention": _MHA,
           "ConvTranspose": {"weight": [(("weight",), "flip_swap", False)]}}
SUBMODULES = {"MultiheadAttention": {"out_proj": "output_proj"}}


def _leaf_parts(obj: Any, path: tuple[Step, ...], leaf: str) -> tuple[Part, ...] | None:
    for cls in type(obj).__mro__:
        table = RENAMED.get(cls.__name__) if cls.__module__.startswith("equinox") else None
        if table is not None and leaf in table:
            return tuple(Part((*path, *(("attr", a) for a in attrs)), layout, summed)
                         for attrs, layout, summed in table[leaf])
    for name in (leaf, leaf.removesuffix("_l0")):  # a one-layer RNN held by its cell (GRU)
        if hasattr(getattr(obj, name, None), "shape"):
            return (Part((*path, ("attr", name))),)
    return None


def _expand(step: Step) -> tuple[Step, ...]:
    if step[0] == "seq":
        return (("attr", "layers"), ("index", step[1]))
    return (step,)


def stats_index(bn: Any) -> Any:
    """Where a BatchNorm keeps its (mean, var) in the State: the converter's BatchNorm helper
    (passes/helpers.py) in ``running_stats``, eqx.nn.BatchNorm(mode="batch") in
    ``batch_state_index``; None for eqx.nn.BatchNorm's other modes."""
    return getattr(bn, "running_stats", None) or getattr(bn, "batch_state_index", None)


def _is_batch_norm(obj: Any) -> bool:
    import equinox as eqx

    return isinstance(obj, eqx.nn.BatchNorm) or isinstance(
        getattr(obj, "running_stats", None), eqx.nn.StateIndex)


def plan_equinox(torch_model: Any, model: Any) -> EquinoxPlan:
    modules = dict(torch_model.named_modules(remove_duplicate=False))
    state = torch_model.state_dict(keep_vars=True)
    plan = EquinoxPlan()
    problems: list[str] = []
    carriers: dict[tuple, str] = {}
    for key, tensor in state.items():
        *parents, leaf = key.split(".")
        storage = _storage_key(tensor)
        obj, path, prefix = model, (), []
        try:
            for c in parents:
                step = _step(obj, modules.get(".".join(prefix)), c)
                for s in _expand(step):
                    path = (*path, s)
                    obj = walk(obj, (s,))
                prefix.append(c)
        except (KeyError, IndexError, AttributeError, ValueError):
            if storage is not None and storage in carriers:  # a tied weight (an LM head)
                plan.tied[key] = carriers[storage]
            else:
                problems.append(f"{key}: the equinox model has no {'.'.join(parents)}")
            continue
        if _is_batch_norm(obj) and leaf in ("running_mean", "running_var",
                                             "num_batches_tracked"):
            if leaf == "num_batches_tracked":
                plan.dropped.append(key)
            elif stats_index(obj) is None:
                problems.append(f"{key}: {'.'.join(parents)} is not mode='batch'")
            else:
                plan.stats.setdefault(path, {})["mean" if leaf == "running_mean" else "var"] = key
            continue
        parts = _leaf_parts(obj, path, leaf)
        if parts is None:
            if storage is not None and storage in carriers:
                plan.tied[key] = carriers[storage]
            else:
                problems.append(f"{key}: the equinox model has no array {'.'.join(parents + [leaf])}")
            continue
        sizes = [int(np.prod(walk(model, p.path).shape)) for p in parts]
        if sum(sizes) != tensor.numel():
            problems.append(f"{key} {tuple(tensor.shape)} does not fit "
                            f"{'.'.join(parents + [leaf])} ({sum(sizes)} values)")
            continue
        if storage is not None:
            carriers.setdefault(storage, key)
        plan.params.append((key, parts))
    if problems:
        raise WeightTransferError(problems)
    return plan


def transfer_to_equinox(torch_model: Any, model: Any, state: Any) -> tuple[Any, Any, EquinoxPlan]:
    """The model (and state) holding the torch model's weights: ``eqx.tree_at`` by path."""
    import equinox as eqx
    import jax.numpy as jnp

    plan = plan_equinox(torch_model, model)
    sd = torch_model.state_dict()
    arrays: dict[tuple[Step, ...], np.ndarray] = {}
    for key, parts in plan.params:
        for p in parts:
            value = apply_layout(_to_numpy(sd[key]), p.layout)
            arrays[p.path] = arrays[p.path] + value if p.summed and p.path in arrays else value
    paths = list(arrays)
    values = []
    for path in paths:
        leaf = walk(model, path)
        values.append(jnp.asarray(arrays[path].reshape(leaf.shape), dtype=leaf.dtype))
    if paths:
        model = eqx.tree_at(lambda mdl: [walk(mdl, p) for p in paths], model, replace=values)
    for path, names in plan.stats.items():
        bn = walk(model, path)
        mean, var = state.get(stats_index(bn))
        new = (jnp.asarray(_to_numpy(sd[names["mean"]]), mean.dtype) if "mean" in names else mean,
               jnp.asarray(_to_numpy(sd[names["var"]]), var.dtype) if "var" in names else var)
        state = state.set(stats_index(bn), new)
    return model, state, plan


def _takes_key(cls: Any) -> bool:
    """Whether ``cls`` is a module class of the converted file (an ``eqx.Module`` whose
    constructor takes ``*, key``): weights come from torch, any key builds it."""
    import equinox as eqx

    if not (isinstance(cls, type) and issubclass(cls, eqx.Module)):
        return False
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return False
    return "key" in params and params["key"].kind is inspect.Parameter.KEYWORD_ONLY


def build_equinox_model(module: Any, name: str, args: dict | None, build: str | None,
                        seed: int) -> tuple[Any, Any]:
    """``eqx.nn.make_with_state(Name)(..., key=jax.random.key(seed))``: the same construction
    as on the torch side with ``key=`` added to the outermost call."""
    import equinox as eqx
    import jax

    key = jax.random.key(seed)
    if build is None:
        cls = find_name(module, name, module.__file__ or name)
        return eqx.nn.make_with_state(cls)(**(args or {}), key=key)
    tree = build_call(build)
    call = tree.body
    assert isinstance(call, ast.Call)
    for inner in ast.walk(call):  # a model built around another: Wrapper(Net(8), steps=10)
        if inner is not call and isinstance(inner, ast.Call) and isinstance(
                inner.func, ast.Name) and _takes_key(getattr(module, inner.func.id, None)) \
                and not any(k.arg == "key" for k in inner.keywords):
            inner.keywords.append(ast.keyword(arg="key", value=ast.Name(_KEY, ast.Load())))
    call.func = ast.Call(func=ast.Name(_MAKE, ast.Load()), args=[call.func], keywords=[])
    call.keywords.append(ast.keyword(arg="key", value=ast.Name(_KEY, ast.Load())))
    ast.fix_missing_locations(tree)
    from torch2jax.verify.nnx import with_keyword

    # a module class of the file built inside the expression (GaussianDiffusion(Denoiser())):
    # its key too (the weights are torch's, loaded afterwards)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    namespace = {**vars(module), **with_keyword(vars(module), "key", key, names),
                 _MAKE: eqx.nn.make_with_state, _KEY: key}
    return eval(compile(tree, "<--build>", "eval"), namespace)


def takes_state(model: Any) -> bool:
    return "state" in inspect.signature(type(model).__call__).parameters


def batched(model: Any, n_inputs: int) -> Any:
    """The per-example model mapped over the batch: ``f(state, *xs) -> (out, state)``. A
    model the converter kept batched (``batched = True`` on its class) is called on the
    batch as it is."""
    import jax

    if getattr(type(model), "batched", False) is True:
        if takes_state(model):
            return lambda state, *xs: model(*xs, state)
        return lambda state, *xs: (model(*xs), state)
    if takes_state(model):
        mapped = jax.vmap(model, axis_name="batch", in_axes=(*(0,) * n_inputs, None),
                          out_axes=(0, None))
        return lambda state, *xs: mapped(*xs, state)
    mapped = jax.vmap(model)
    return lambda state, *xs: (mapped(*xs), state)


def _called(model: Any) -> str:
    """How :func:`batched` calls the model, for the notes."""
    if getattr(type(model), "batched", False) is True:
        return "model kept batched by the converter, called on the batch"
    return "per-example model mapped over the batch with jax.vmap"


@dataclass
class EquinoxModel:
    """The equinox side's model: the module, its ``eqx.nn.State`` and where the torch weights
    went."""

    model: Any
    state: Any
    plan: EquinoxPlan | None = None


class EquinoxTrainer(Trainer):
    """The train step ``--target equinox`` emits (docs/equinox.md), over :func:`batched`:
    ``eqx.filter_value_and_grad`` of the loss of the model mapped over the batch, the optax
    update of ``eqx.filter(model, eqx.is_array)``, ``eqx.apply_updates``."""

    def __init__(self, model: EquinoxModel, setup: Any, loss_fn: Any) -> None:
        import equinox as eqx

        tx = setup.tx
        self.model, self.state, self.plan = model.model, model.state, model.plan
        self.opt_state = tx.init(eqx.filter(self.model, eqx.is_array))

        @eqx.filter_jit
        def train_step(model: Any, state: Any, opt_state: Any, xs: list, labels: Any) -> Any:
            def loss_of(model: Any, state: Any) -> Any:
                out, state = batched(model, len(xs))(state, *xs)
                return loss_fn(out, labels), state

            (loss, state), grads = eqx.filter_value_and_grad(loss_of, has_aux=True)(model,
                                                                                    state)
            updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state, opt_state, loss

        self._step = train_step

    def step(self, xs: list, labels: Any) -> Any:
        self.model, self.state, self.opt_state, loss = self._step(
            self.model, self.state, self.opt_state, xs, labels)
        return loss

    def params(self) -> Any:
        import equinox as eqx

        return eqx.filter(self.model, eqx.is_array)

    def set_learning_rate(self, value: float) -> None:
        set_injected_learning_rate(self.opt_state, value)

    def trained(self) -> tuple[Any, Any]:
        return EquinoxModel(self.model, self.state, self.plan), self.state


class EquinoxSide(JaxSide):
    """The per-example model mapped over the batch (:func:`batched`) under
    ``eqx.filter_jit``; gradients from ``eqx.filter_grad``."""

    name = "equinox"
    build_stage = "building the equinox model"
    forward_stage = "the equinox forward pass (jax.vmap under eqx.filter_jit)"
    grad_stage = "the equinox gradient (eqx.filter_grad under eqx.filter_jit)"
    step_stage = "the equinox training step {step} (eqx.filter_jit)"

    def build(self, req: Any, module: Any, name: str, sample: list) -> EquinoxModel:
        return EquinoxModel(*build_equinox_model(module, name, req.args, req.build, req.seed))

    def load_weights(self, r: Any, req: Any, model: EquinoxModel, torch_model: Any
                     ) -> EquinoxModel:
        mdl, state = model.model, model.state
        if req.float64:
            mdl, state = widen(mdl), widen(state)
        mdl, state, plan = transfer_to_equinox(torch_model, mdl, state)
        note = f"{len(plan.params)} tensors transferred into the equinox model"
        if plan.stats:
            note += (f", the running statistics of {len(plan.stats)} BatchNorm layers into its "
                     "State")
        if plan.tied:
            note += "; tied: " + ", ".join(f"{k} -> {v}" for k, v in plan.tied.items())
        r.notes.append(note)
        return EquinoxModel(mdl, state, plan)

    def train_mode(self, r: Any, model: EquinoxModel, n_torch: int) -> EquinoxModel:
        mdl, n_jax = train_mode(model.model)
        r.notes.append(train_mode_note(n_torch, f"{n_jax} equinox modules in inference mode"))
        r.notes.append(_called(mdl))
        return EquinoxModel(mdl, model.state, model.plan)

    def eval_mode(self, r: Any, model: EquinoxModel) -> EquinoxModel:
        import equinox as eqx

        r.notes.append(_called(model.model) + ", eqx.nn.inference_mode")
        return EquinoxModel(eqx.nn.inference_mode(model.model), model.state, model.plan)

    def check_float64(self, model: EquinoxModel, jax_in: list, specs: list) -> None:
        import equinox as eqx

        params, static = eqx.partition(model.model, eqx.is_array)
        check_float64(lambda p, st, xs: batched(eqx.combine(p, static), len(xs))(st, *xs),
                      params, model.state, jax_in)

    def forward(self, model: EquinoxModel, jax_in: list, specs: list) -> tuple[Any, Any]:
        import equinox as eqx

        return eqx.filter_jit(lambda model, state, xs: batched(model, len(xs))(state, *xs))(
            model.model, model.state, jax_in)

    def stats(self, req: Any, torch_model: Any, model: EquinoxModel, updated: Any
              ) -> StatPairs:
        return stat_pairs(torch_model, model.model, updated, model.plan)

    def grads(self, r: Any, req: Any, torch_model: Any, model: EquinoxModel, jax_in: list,
              cots: dict, specs: list) -> tuple[dict, dict]:
        import equinox as eqx
        import jax.numpy as jnp

        jcots = {k: jnp.asarray(v) for k, v in cots.items()}

        def scalar(mdl: Any, state: Any, xs: list) -> Any:
            leaves = dict(flatten_output(batched(mdl, len(xs))(state, *xs)[0]))
            return sum(jnp.sum(leaves[k].astype(jnp.promote_types(leaves[k].dtype, jnp.float32))
                               * c) for k, c in jcots.items())

        grads = eqx.filter_jit(eqx.filter_grad(scalar))(model.model, model.state, jax_in)
        jg, mapping = {}, {}
        by_name = dict(model.plan.params)
        for tname in (n for n, p in torch_model.named_parameters() if p.requires_grad):
            parts = by_name.get(model.plan.tied.get(tname, tname))
            if parts is None:
                continue
            mapping[tname] = []
            for p in parts:
                g = walk(grads, p.path)
                jg[p.path] = np.zeros(walk(model.model, p.path).shape, np.float32) if g is None \
                    else np.asarray(g)
                mapping[tname].append(ParamMapping(tname, "mapped", p.path, p.layout, None))
        return jg, mapping

    def trajectory_mode(self, r: Any, model: EquinoxModel, n_dropout: int, n_drop_path: int
                        ) -> EquinoxModel:
        return EquinoxModel(train_mode(model.model)[0], model.state, model.plan)

    def train_step(self, model: EquinoxModel, setup: Any, loss_fn: Any) -> Trainer:
        return EquinoxTrainer(model, setup, loss_fn)

    def param_pairs(self, req: Any, torch_model: Any, model: EquinoxModel,
                    params_torch: dict[str, np.ndarray], steps: int) -> ParamPairs:
        names = {n for n, p in torch_model.named_parameters() if p.requires_grad}
        pairs = []
        for key, parts in model.plan.params:
            if key not in names:
                continue
            if any(p.summed for p in parts):
                raise VerifyError(f"{key} is summed with another torch tensor in the equinox "
                                  "model: torch trains the two apart")
            pairs.append((key, f"param {key} after {steps} steps",
                          torch_value(model.model, parts), params_torch[key]))
        return pairs


# --- training mode ----------------------------------------------------------------------------


def _is_dropout(x: Any) -> bool:
    import equinox as eqx

    return isinstance(x, eqx.nn.Dropout) or (isinstance(x, eqx.Module) and type(
        x).__name__ in DROP_PATH_CLASSES)


def train_mode(model: Any) -> tuple[Any, int]:
    """The model in training mode (BatchNorm on batch statistics) with its dropout-like
    modules in inference mode, and how many there are."""
    import equinox as eqx
    import jax

    def dropouts(mdl: Any) -> list[Any]:
        return [x for x in jax.tree.leaves(mdl, is_leaf=_is_dropout) if _is_dropout(x)]

    model = eqx.nn.inference_mode(model, False)
    found = len(dropouts(model))
    if found:
        model = eqx.tree_at(dropouts, model, replace_fn=eqx.nn.inference_mode)
    return model, found


def stat_pairs(torch_model: Any, model: Any, state: Any, plan: EquinoxPlan
               ) -> list[tuple[str, str, Any, Any]]:
    """Each torch running statistic with its value in the ``State``."""
    ref = torch_stats(torch_model)
    pairs = []
    for path, names in plan.stats.items():
        where = ".".join(str(k) for _, k in path)
        for which, value in zip(("mean", "var"), state.get(stats_index(walk(model, path))),
                                strict=True):
            if names.get(which) in ref:
                pairs.append((names[which], f"{where} running {which}", value, ref[names[which]]))
    return pairs


# --- training trajectories --------------------------------------------------------------------


def train_equinox(torch_model: Any, jax_module: Any, name: str, args: dict | None,
                  train: Any, inputs: list[str], *, build: str | None = None, seed: int = 0,
                  rtol: float = 1e-4, rules: Any = None) -> TrajectoryResult:
    """The trajectory check (:func:`torch2jax.verify.sides.check_trajectory`) of a copy of
    ``torch_model`` against the converted ``eqx.Module`` of ``jax_module``, built with
    ``key=`` and given the torch weights: ``train.steps`` steps of the equinox train step
    (:class:`EquinoxTrainer`) against torch's on the same batches; the loss of every step and
    every parameter and BatchNorm running statistic at the end are compared. Dropout is off on
    both sides; BatchNorm normalises with batch statistics on both sides."""
    import copy

    from torch2jax.verify.spec import parse_specs

    r = TrajectoryResult(model=name, target="equinox", rtol=rtol,
                         mode=f"train {train.steps} steps", steps=train.steps,
                         optimizer=train.optimizer, scheduler=train.scheduler, loss=train.loss)
    setup = translate_setup(train)
    r.optax, r.schedule = setup.tx_code, setup.schedule_code
    loss_fn, _ = translate_loss(train.loss, rules)
    req = VerifyRequest(name, args=args, build=build, inputs=tuple(inputs),
                        jax_target="equinox", rtol=rtol, seed=seed, rules=rules)
    check_trajectory(EquinoxSide(), r, req, train, jax_module, name, copy.deepcopy(torch_model),
                     parse_specs(inputs), setup, loss_fn)
    return r
