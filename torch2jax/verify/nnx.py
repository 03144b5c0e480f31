"""Verification for the flax NNX target (the default): the model built with
``rngs=nnx.Rngs(seed)``, the torch ``state_dict`` copied in (:mod:`torch2jax.weights`), the
forward pass under ``jax.jit``, gradients with ``nnx.grad``, BatchNorm statistics, and the
training trajectory (``nnx.Optimizer``, one ``nnx.jit`` step per batch). The NNX side of
:mod:`torch2jax.verify.sides`; :mod:`torch2jax.verify.run` and
:mod:`torch2jax.verify.trajectory` hold what the targets share.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from torch2jax.ruleset import RuleSet
from torch2jax.verify.common import (
    DROP_PATH_CLASSES,
    VerifyError,
    VerifyResult,
    build_call,
    check_float64,
    compare_arrays,
    compare_grads,
    compare_outputs,
    compare_stats,
    cotangents,
    flatten_output,
    jax_inputs,
    jax_to_numpy,
    stage,
    torch_grads,
    torch_inputs,
    torch_stats,
    torch_to_numpy,
    torch_train_mode,
    train_mode_note,
    widen,
)
from torch2jax.verify.load import find_name, load_module
from torch2jax.verify.spec import InputSpec, call_with, parse_spec
from torch2jax.verify.train_common import (
    JaxSetup,
    TrainSpec,
    Trajectory,
    TrajectoryResult,
    relative_loss_diff,
    settle_trajectory,
    torch_loss,
    torch_setup,
    torch_step,
    unalias,
)

# --- building, the forward pass, gradients and statistics ------------------------------------

_RNGS_NAME = "__torch2jax_rngs__"


def build_nnx_model(
    module: ModuleType, name: str, args: dict | None, build: str | None, seed: int
) -> Any:
    """The same construction as on the torch side, with ``rngs=nnx.Rngs(seed)`` added to the
    outermost call (docs/nnx-output.md: every converted constructor takes ``*, rngs``)."""
    from flax import nnx

    if build is None:
        return find_name(module, name, module.__file__ or name)(**(args or {}), rngs=nnx.Rngs(seed))
    tree = build_call(build)
    call = tree.body
    assert isinstance(call, ast.Call)
    call.keywords.append(ast.keyword(arg="rngs", value=ast.Name(_RNGS_NAME, ast.Load())))
    ast.fix_missing_locations(tree)
    rngs = nnx.Rngs(seed)
    namespace = {**vars(module), **with_keyword(vars(module), "rngs", rngs, _names_in(tree)),
                 _RNGS_NAME: rngs}
    return eval(compile(tree, "<--build>", "eval"), namespace)


def _names_in(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def with_keyword(namespace: dict[str, Any], keyword: str, value: Any, names: set[str]
                 ) -> dict[str, Any]:
    """For the ``names`` of ``namespace`` that are callables taking a ``keyword`` parameter
    (the converted file's helper functions and classes, which the conversion gave
    ``*, rngs``): a wrapper that passes ``keyword=value`` unless the call gives it, so that
    ``VGG(make_layers(cfg, batch_norm=True))`` builds as torch's does. Only the build
    expression sees the wrappers; the module's own code keeps calling the originals."""
    import functools
    import inspect

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault(keyword, value)
            return fn(*args, **kwargs)

        return call

    wrapped = {}
    for name in names:
        fn = namespace.get(name)
        if not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if keyword in params and params[keyword].kind in (
                inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            wrapped[name] = wrap(fn)
    return wrapped


def _jax_forward(model: Any, inputs: list[Any], specs: list[InputSpec]) -> Any:
    """The model's output under ``jax.jit``; what the call updates (BatchNorm's running
    statistics in training mode) is written back into ``model``."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state: Any, xs: list[Any]) -> Any:
        model = nnx.merge(graphdef, state)
        return call_with(model, xs, specs), nnx.state(model)

    out, state = forward(state, inputs)
    nnx.update(model, state)
    return out


def _nnx_train_mode(model: Any) -> int:
    """The NNX counterpart of :func:`torch_train_mode`: ``model.train()`` (BatchNorm on batch
    statistics), then ``eval()`` on nnx.Dropout and the converted drop-path modules."""
    from flax import nnx

    model.train()
    dropouts = [m for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Dropout)
                or type(m).__name__ in DROP_PATH_CLASSES]
    for m in dropouts:
        m.eval()
    return len(dropouts)


def nnx_stat_pairs(torch_model: Any, jax_model: Any, rules: RuleSet | None
                   ) -> list[tuple[str, str, Any, Any]]:
    """Each torch running statistic with its NNX variable's current value, by the transfer's
    own mapping (docs/nnx-output.md)."""
    from torch2jax.weights import plan_transfer

    plan = plan_transfer(torch_model, jax_model, rules)
    ref = torch_stats(torch_model)
    return [(m.torch_name, m.nnx_name, np.asarray(plan.variables[m.slot][...]),
             ref[m.torch_name]) for m in plan.mappings
            if m.status == "mapped" and m.torch_name in ref]


def _jax_grads(model: Any, inputs: list[Any], cotangents: dict[str, np.ndarray],
               specs: list[InputSpec]) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def scalar(params: Any, rest: Any, xs: list[Any], cots: dict[str, Any]) -> Any:
        out = call_with(nnx.merge(graphdef, params, rest, copy=True), xs, specs)
        leaves = dict(flatten_output(out))
        return sum(jnp.sum(leaves[k].astype(jnp.promote_types(leaves[k].dtype, jnp.float32)) * c) for k, c in cots.items())

    cots = {k: jnp.asarray(v) for k, v in cotangents.items()}
    grads = jax.jit(jax.grad(scalar))(params, rest, inputs, cots)
    return {tuple(path): np.asarray(v.get_value()) for path, v in nnx.to_flat_state(grads)}


def widen_nnx_dtypes(model: Any) -> int:
    """Set the ``dtype`` attributes that read float32 on the model's NNX layers to float64:
    the rest of torch's ``.double()``. A layer that fixes its compute dtype at construction
    (``nnx.Embed``: ``dtype or embedding.dtype``) would otherwise cast the widened parameters
    back to float32. Returns the number of layers changed."""
    import jax.numpy as jnp
    from flax import nnx

    changed = 0
    for _, module in nnx.iter_modules(model):
        value = getattr(module, "dtype", None)
        try:
            is_f32 = value is not None and jnp.dtype(value) == jnp.float32
        except TypeError:
            is_f32 = False
        if is_f32:
            module.dtype = jnp.float64
            changed += 1
    return changed


@contextlib.contextmanager
def _autograd_on(model: Any, r: VerifyResult) -> Iterator[None]:
    """torch's backward pass runs its forward with autograd on, which turns off torch's
    inference fast paths (TransformerEncoder's nested tensors: 0.0 at padded positions); the
    converted modules that reproduce one (``inference_fast_path``) follow torch's autograd
    forward while the JAX gradient is taken, so that both sides differentiate one function."""
    from flax import nnx

    modules = [m for _, m in nnx.iter_modules(model)
               if getattr(m, "inference_fast_path", None) is True]
    if modules:
        r.notes.append(f"gradients: {len(modules)} module(s) with torch's inference fast path "
                       "(TransformerEncoder) run as torch's forward with autograd on")
    for m in modules:
        m.inference_fast_path = False
    try:
        yield
    finally:
        for m in modules:
            m.inference_fast_path = True


def _run_grads(
    r: VerifyResult,
    req: Any,
    torch_model: Any,
    jax_model: Any,
    inputs: tuple[list[Any], list[Any]],
    torch_leaves: list[tuple[str, Any]],
    specs: list[InputSpec],
) -> None:
    from torch2jax.weights import gradient_parts

    cots = cotangents(torch_leaves, req.seed)
    if not cots:
        raise VerifyError("--grad: the model has no floating-point output to differentiate")
    mapping = gradient_parts(torch_model, jax_model, req.rules)
    with stage("the torch backward pass"):
        tg = torch_grads(torch_model, inputs[0], cots, specs)
    with stage("the JAX gradient (jax.grad under jax.jit)"), _autograd_on(jax_model, r):
        jg = _jax_grads(jax_model, inputs[1], cots, specs)
    g = compare_grads(jg, tg, mapping, r)
    r.grad_max_abs_diff, r.grad_max_rel_diff = g.abs, g.rel
    r.passed = r.passed and g.ok
    r.mismatch = r.mismatch or g.first_failure


def run_nnx_side(r: VerifyResult, req: Any, jax_module: ModuleType, jax_path: Path, name: str,
                 torch_model: Any, specs: list[InputSpec]) -> None:
    """Build the NNX model, transfer the torch weights, compare the forward pass (and, as
    asked, gradients, statistics, a benchmark) into ``r``."""
    import torch

    from torch2jax.weights import WeightTransferError, transfer_state_dict

    with stage("building the JAX model"):
        jax_model = build_nnx_model(jax_module, name, req.args, req.build, req.seed)
    if req.float64:
        from flax import nnx

        nnx.update(jax_model, widen(nnx.state(jax_model)))
        widened = widen_nnx_dtypes(jax_model)
        if widened:
            r.notes.append(f"float64: the compute dtype of {widened} NNX layers (fixed to "
                           "float32 at construction, as nnx.Embed does) widened too")
    try:
        report = transfer_state_dict(torch_model, jax_model, req.rules)
    except WeightTransferError as exc:
        raise VerifyError(str(exc)) from None
    r.notes.append(report.summary())
    if req.train_mode:
        n_torch, n_jax = torch_train_mode(torch_model), _nnx_train_mode(jax_model)
        r.notes.append(train_mode_note(n_torch, f"{n_jax} NNX modules in eval mode"))
    else:
        jax_model.eval()

    rng = np.random.default_rng(req.seed)
    arrays = [s.sample(rng) for s in specs]
    r.compared += [f"input[{i}] {s}" for i, s in enumerate(specs)]
    torch_in = torch_inputs(arrays, specs)
    jax_in = jax_inputs(arrays, specs)
    if req.float64:  # before torch's pass, which may not run in float64 (grouped_mm)
        from flax import nnx

        graphdef, state = nnx.split(jax_model)
        check_float64(lambda st, xs: call_with(nnx.merge(graphdef, st), xs, specs), state,
                      jax_in)
    with stage("the torch forward pass"), torch.no_grad():
        torch_out = call_with(torch_model, torch_in, specs)
    torch_leaves = [(k, torch_to_numpy(v)) for k, v in flatten_output(torch_out)]
    with stage("the JAX forward pass (under jax.jit)"):
        jax_out = _jax_forward(jax_model, jax_in, specs)
    jax_leaves = [(k, jax_to_numpy(v)) for k, v in flatten_output(jax_out)]
    out = compare_outputs(jax_leaves, torch_leaves, r)
    r.max_abs_diff, r.max_rel_diff = out.abs, out.rel
    r.passed, r.mismatch = out.ok, out.first_failure
    if req.train_mode:  # before the gradients: torch's backward pass runs the model again
        compare_stats(r, nnx_stat_pairs(torch_model, jax_model, req.rules),
                      "after the forward pass")
    if req.benchmark and out.shapes_match:
        from torch2jax.verify.benchmark import benchmark_forward

        with stage("the benchmark"):
            benchmark_forward(r, torch_model, torch_in, jax_model, jax_in)

    if req.grad and out.shapes_match:
        _run_grads(r, req, torch_model, jax_model, (torch_in, jax_in), torch_leaves, specs)
    elif req.grad:
        r.notes.append("gradients not compared: the outputs differ in structure or shape")


# --- the training trajectory ------------------------------------------------------------------


def disable_dropout(torch_model: Any, jax_model: Any) -> list[str]:
    """p = 0 on both sides (masks from two RNGs cannot agree); returns the notes."""
    import torch
    from flax import nnx

    n_torch = 0
    for mod in torch_model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p:
            mod.p = 0.0
            n_torch += 1
    n_jax = 0
    for _, mod in nnx.iter_graph(jax_model):
        if isinstance(mod, nnx.Dropout) and mod.rate:
            mod.rate = 0.0
            n_jax += 1
    notes = [("training mode on both sides; BatchNorm uses batch statistics and updates its "
             "running averages")]
    # stochastic depth (torchvision's StochasticDepth, timm's DropPath) reads self.training
    drop_paths = [m for m in torch_model.modules() if type(m).__name__ in DROP_PATH_CLASSES]
    drop_paths += [m for _, m in nnx.iter_modules(jax_model)
                   if type(m).__name__ in DROP_PATH_CLASSES]
    for mod in drop_paths:
        mod.eval()
    if n_torch or n_jax:
        notes.append(f"dropout disabled for the trajectory: {n_torch} torch Dropout modules "
                     f"and {n_jax} nnx.Dropout set to p=0 (random masks cannot agree)")
    if drop_paths:
        notes.append(f"stochastic depth off for the trajectory: {len(drop_paths)} drop-path "
                     "modules (torch and JAX) in eval mode")
    if not (n_torch or n_jax or drop_paths):
        notes.append("dropout disabled for the trajectory (no Dropout modules found; "
                     "functional dropout in forward() is not switched off)")
    return notes


def run_steps(
    torch_model: Any,
    jax_model: Any,
    spec: TrainSpec,
    specs: list[InputSpec],
    setup: JaxSetup,
    loss_jax: Callable[..., Any],
    seed: int = 0,
) -> Trajectory:
    """Train both models in place for ``spec.steps`` steps on the same batches."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    label_spec = parse_spec(spec.labels) if spec.labels else None
    loss_torch = torch_loss(spec.loss)
    opt, sched = torch_setup(spec, torch_model)
    optimizer = nnx.Optimizer(jax_model, setup.tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(model: Any, optimizer: Any, xs: list[Any], labels: Any) -> Any:
        def loss_fn(model: Any) -> Any:
            return loss_jax(model(*xs), labels)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    plateau_state = None
    if setup.plateau is not None:
        plateau_state = setup.plateau.init(nnx.state(jax_model, nnx.Param))

    rng = np.random.default_rng(seed + 3)
    torch_losses: list[float] = []
    jax_losses: list[float] = []
    for step in range(spec.steps):
        arrays = [s.sample(rng) for s in specs]
        label_arr = label_spec.sample(rng) if label_spec else None
        t_in = torch_inputs(arrays, specs)
        t_lab = torch_inputs([label_arr], [label_spec])[0] if label_spec else None
        torch_losses.append(torch_step(torch_model, opt, sched, loss_torch, t_in, t_lab,
                                          spec.clip_grad_norm, step))
        j_in = jax_inputs(arrays, specs)
        j_lab = jax_inputs([label_arr], [label_spec])[0] if label_spec else None
        with stage(f"the JAX training step {step} (nnx.jit)"):
            jloss = train_step(jax_model, optimizer, j_in, j_lab)
            if setup.plateau is not None:
                value = -jloss if setup.negate_metric else jloss
                _, plateau_state = setup.plateau.update(None, plateau_state, value=value)
                slot = optimizer.opt_state.hyperparams["learning_rate"]
                slot.value = jnp.asarray(setup.base_lr * plateau_state.scale, slot.value.dtype)
        jax_losses.append(float(jax.device_get(jloss)))
    params_torch = {n: p.detach().cpu().float().numpy().copy()
                    for n, p in torch_model.named_parameters()}
    params_jax = {tuple(path): np.asarray(v.get_value())
                  for path, v in nnx.to_flat_state(nnx.state(jax_model, nnx.Param))}
    return Trajectory(torch_losses, jax_losses, params_torch, params_jax)


def compare(traj: Trajectory, torch_model: Any, jax_model: Any, r: TrajectoryResult,
            rules: RuleSet | None) -> None:
    """Fill ``r`` with the worst loss and parameter differences."""
    from torch2jax.weights import apply_layout, gradient_map

    r.losses_torch, r.losses_jax = traj.losses_torch, traj.losses_jax
    rels = [relative_loss_diff(a, b)
            for a, b in zip(traj.losses_jax, traj.losses_torch, strict=True)]
    worst_step = int(np.argmax(rels)) if rels else 0
    loss_rel = rels[worst_step] if rels else 0.0
    r.loss_max_rel_diff = loss_rel
    mapping = gradient_map(torch_model, jax_model, rules)
    p_abs, p_rel, worst = 0.0, -1.0, None
    for name, m in mapping.items():
        ref = apply_layout(traj.params_torch[name], m.layout)
        got = traj.params_jax.get(tuple(m.nnx_path))
        if got is None:
            raise VerifyError(f"the JAX model has no parameter for {name} ({m.nnx_name})")
        if ref.shape != got.shape and ref.size == got.size:
            ref = ref.reshape(got.shape)
        d = compare_arrays(got, ref, r.atol, r.rtol)
        r.compared.append(f"param {name} -> {m.nnx_name} ({m.layout}) after {r.steps} steps")
        p_abs = max(p_abs, d.abs)
        if d.rel > p_rel:
            p_rel, worst = d.rel, name
    settle_trajectory(r, traj, loss_rel, worst_step, p_abs, p_rel, worst)
    compare_stats(r, nnx_stat_pairs(torch_model, jax_model, rules), f"after {r.steps} steps")


def nnx_model_from_torch(r: TrajectoryResult, req: Any, jax_path: Path, name: str,
               torch_model: Any) -> Any:
    from torch2jax.weights import WeightTransferError, transfer_state_dict

    jax_module = load_module(jax_path, prefix="torch2jax_verify_jax")
    if req.build is None:
        find_name(jax_module, name, jax_path)
    with stage("building the JAX model"):
        jax_model = build_nnx_model(jax_module, name, req.args, req.build, req.seed)
    try:
        report = transfer_state_dict(torch_model, jax_model, req.rules)
    except WeightTransferError as exc:
        raise VerifyError(str(exc)) from None
    r.notes.append(report.summary())
    unalias(torch_model)
    return jax_model


def nnx_trajectory(r: TrajectoryResult, req: Any, train: TrainSpec, jax_path: Path, name: str,
                   torch_model: Any, specs: list[InputSpec], setup: JaxSetup,
                   loss_fn: Callable[..., Any]) -> None:
    """Train the torch model and its NNX twin ``train.steps`` steps and compare into ``r``."""
    jax_model = nnx_model_from_torch(r, req, jax_path, name, torch_model)
    torch_model.train()
    jax_model.train()
    r.notes += disable_dropout(torch_model, jax_model)
    traj = run_steps(torch_model, jax_model, train, specs, setup, loss_fn, req.seed)
    compare(traj, torch_model, jax_model, r, req.rules)
