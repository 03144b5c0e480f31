"""Training-trajectory verification: K optimizer steps on both sides, compared step by step.

``verify --optimizer "torch.optim.SGD(params, lr=0.05, momentum=0.9)" --loss "F.cross_entropy(
output, labels)" --labels "int64[4]:10" --steps 10``:

1. build the torch model and the converted NNX model exactly as :mod:`torch2jax.verify.run` does
   (same seed, same randomised statistics, the torch weights transplanted);
2. put both in training mode with dropout switched off (``p = 0`` / ``nnx.Dropout.rate = 0``,
   random masks cannot agree across frameworks); BatchNorm stays in training mode on both sides
   (batch statistics, running averages updated);
3. translate the optimizer, the scheduler (stepped after every optimizer step) and gradient
   clipping with :mod:`torch2jax.training.optim`, and the loss expression with the converter
   (``loss = <expr>`` in a tiny torch snippet, ``output`` and ``labels`` bound);
4. run ``steps`` steps on fresh random batches (the same arrays on both sides): torch
   ``zero_grad / backward / clip_grad_norm_ / step / scheduler.step()``, JAX one ``nnx.jit``
   step of ``nnx.value_and_grad`` + ``nnx.Optimizer.update``;
5. compare the loss of every step, every parameter at the end and BatchNorm's running
   statistics at the end (torch's ``running_mean`` / ``running_var`` buffers against the JAX
   statistics they were transferred into).

Differences are relative: ``|jax - torch| / |torch|`` for a loss, ``max |jax - torch| /
max |torch|`` per parameter tensor (the norm-wise ratio of :func:`compare_arrays`). ``passed``
means the worst of both is at most ``rtol``.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from torch2jax.ruleset import RuleSet
from torch2jax.verify.common import (
    DROP_PATH_CLASSES,
    VerifyError,
    compare_arrays,
    compare_stats,
    jax_inputs,
    stage,
    torch_inputs,
)
from torch2jax.verify.load import LoadError, find_name, load_module
from torch2jax.verify.run import (
    VerifyRequest,
    _converted_todos,
    _device,
    build_nnx_model,
    build_torch_side,
    convert_tree,
    entry_classes,
    nnx_stat_pairs,
)
from torch2jax.verify.spec import InputSpec, parse_spec
from torch2jax.verify.train_common import (
    JaxSetup,
    TrainSpec,
    Trajectory,
    TrajectoryResult,
    relative_loss_diff,
    torch_loss,
    torch_setup,
    translate_loss,
    translate_setup,
    unalias,
)

# --- translating the training setup --------------------------------------------------------


# --- the two training loops -------------------------------------------------------------------


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
    import torch
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
        with stage(f"the torch training step {step}"):
            opt.zero_grad(set_to_none=True)
            loss = loss_torch(torch_model(*t_in), t_lab)
            loss.backward()
            if spec.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(torch_model.parameters(), spec.clip_grad_norm)
            opt.step()
            if sched is not None:
                if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    sched.step(loss.item())
                else:
                    sched.step()
        torch_losses.append(float(loss.item()))
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
    p_rel = max(p_rel, 0.0)
    r.param_max_abs_diff, r.param_max_rel_diff, r.worst_param = p_abs, p_rel, worst
    r.max_abs_diff, r.max_rel_diff = p_abs, p_rel
    r.passed = loss_rel <= r.rtol and p_rel <= r.rtol
    if not r.passed:
        if loss_rel > r.rtol:
            i = worst_step
            r.mismatch = (f"loss at step {i}: jax {traj.losses_jax[i]:.7g} vs torch "
                          f"{traj.losses_torch[i]:.7g} (rel {loss_rel:.2e})")
        else:
            r.mismatch = f"parameter {worst} after {r.steps} steps: rel {p_rel:.2e}"
    compare_stats(r, nnx_stat_pairs(torch_model, jax_model, rules), f"after {r.steps} steps")


# --- the entry point --------------------------------------------------------------------------


def verify_trajectory(req: VerifyRequest, train: TrainSpec) -> TrajectoryResult:
    """Build, convert and train both models; never raises for a model's or a setup's faults
    (``error`` says why it could not run)."""
    r = TrajectoryResult(model=req.target, target=req.jax_target, atol=req.atol, rtol=req.rtol,
                         mode=f"train {train.steps} steps", steps=train.steps,
                         optimizer=train.optimizer, scheduler=train.scheduler, loss=train.loss)
    try:
        _verify_trajectory(r, req, train)
    except (VerifyError, LoadError, ValueError) as exc:
        r.error = str(exc)
        r.passed = False
    return r


def _verify_trajectory(r: TrajectoryResult, req: VerifyRequest, train: TrainSpec) -> None:
    if train.steps < 1:
        raise VerifyError(f"--steps {train.steps}: give at least one step")
    if req.float64:
        raise VerifyError("float64 is checked for the forward pass and gradients only, not for "
                          "training trajectories")
    if train.labels:
        parse_spec(train.labels)
    path, name, specs, torch_model = build_torch_side(r, req)
    if any(s.name for s in specs):
        raise VerifyError("NAME=SPEC (keyword) inputs are verified for the forward pass and "
                          "gradients only, not for training trajectories")
    setup = translate_setup(train)
    r.optax, r.schedule = setup.tx_code, setup.schedule_code
    r.notes += setup.notes
    loss_fn, loss_text = translate_loss(train.loss, req.rules)
    r.notes.append(f"loss: {loss_text}")
    with tempfile.TemporaryDirectory(prefix="torch2jax-verify-") as tmp:
        if req.converted is not None:
            jax_path = Path(req.converted)
            r.todos = _converted_todos(req.converted)
        else:
            jax_path = Path(tmp) / path.name
            r.todos = convert_tree(path, Path(tmp), req.jax_target, req.rules,
                                   entry_classes(name, req.build))
        with _device(req.device) as platform:
            r.device = platform
            if req.jax_target == "linen":
                from torch2jax.verify.linen import linen_trajectory

                linen_trajectory(r, req, train, jax_path, name, torch_model, specs, setup,
                                 loss_fn)
                if r.todos and not r.passed:
                    r.notes.append(f"the conversion left {r.todos} TODO(torch2jax) markers")
                return
            if req.jax_target == "equinox":
                _equinox_trajectory(r, req, train, jax_path, name, torch_model)
                return
            jax_model = _jax_model(r, req, jax_path, name, torch_model)
            torch_model.train()
            jax_model.train()
            r.notes += disable_dropout(torch_model, jax_model)
            traj = run_steps(torch_model, jax_model, train, specs, setup, loss_fn, req.seed)
            compare(traj, torch_model, jax_model, r, req.rules)
    if r.todos and not r.passed:
        r.notes.append(f"the conversion left {r.todos} TODO(torch2jax) markers")


def _equinox_trajectory(r: TrajectoryResult, req: VerifyRequest, train: TrainSpec,
                        jax_path: Path, name: str, torch_model: Any) -> None:
    from dataclasses import fields

    from torch2jax.verify.equinox import train_equinox

    jax_module = load_module(jax_path, prefix="torch2jax_verify_jax")
    done = train_equinox(torch_model, jax_module, name, req.args, train, list(req.inputs),
                         build=req.build, seed=req.seed, rtol=req.rtol, rules=req.rules)
    for f in fields(done):
        if f.name not in ("model", "target", "atol", "todos", "device", "notes"):
            setattr(r, f.name, getattr(done, f.name))
    r.notes += done.notes
    if r.todos and not r.passed:
        r.notes.append(f"the conversion left {r.todos} TODO(torch2jax) markers")


def _jax_model(r: TrajectoryResult, req: VerifyRequest, jax_path: Path, name: str,
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


def build_models(req: VerifyRequest, workdir: str | Path) -> tuple[Any, Any]:
    """The torch model and its converted NNX twin (torch weights transplanted, memory not
    shared), as :func:`verify_trajectory` builds them; the conversion is written to
    ``workdir``. For callers that run many trajectories on one pair (:func:`train_models`)."""
    scratch = TrajectoryResult(model=req.target)  # notes nobody reads here
    path, name, _, torch_model = build_torch_side(scratch, req)
    jax_path = Path(req.converted) if req.converted else Path(workdir) / path.name
    if req.converted is None:
        convert_tree(path, Path(workdir), req.jax_target, req.rules,
                     entry_classes(name, req.build))
    jax_model = _jax_model(scratch, req, jax_path, name, torch_model)
    return torch_model, jax_model


def train_models(torch_model: Any, jax_model: Any, train: TrainSpec, inputs: list[str],
                 *, seed: int = 0, rtol: float = 1e-4, rules: RuleSet | None = None
                 ) -> TrajectoryResult:
    """The trajectory check on models already built (the JAX one with the torch weights):
    both are copied first, so the same pair serves many checks (tests build them once)."""
    from flax import nnx

    from torch2jax.verify.spec import parse_specs

    r = TrajectoryResult(model=type(torch_model).__name__, rtol=rtol,
                         mode=f"train {train.steps} steps", steps=train.steps,
                         optimizer=train.optimizer, scheduler=train.scheduler, loss=train.loss)
    tm, jm = copy.deepcopy(torch_model), nnx.clone(jax_model)
    setup = translate_setup(train)
    r.optax, r.schedule = setup.tx_code, setup.schedule_code
    r.notes += setup.notes
    loss_fn, _ = translate_loss(train.loss, rules)
    tm.train()
    jm.train()
    r.notes += disable_dropout(tm, jm)
    traj = run_steps(tm, jm, train, parse_specs(inputs), setup, loss_fn, seed)
    compare(traj, tm, jm, r, rules)
    return r


def print_trajectory(r: TrajectoryResult, console: Any) -> None:
    """The per-step losses, what ran on the JAX side and the notes (the summary row follows)."""
    from rich.table import Table

    if r.losses_torch:
        table = Table(title=f"training trajectory: {r.steps} steps")
        for column in ("step", "torch loss", "jax loss", "rel diff"):
            table.add_column(column, justify="right")
        for i, (t, j) in enumerate(zip(r.losses_torch, r.losses_jax, strict=True)):
            table.add_row(str(i), f"{t:.7g}", f"{j:.7g}", f"{relative_loss_diff(j, t):.2e}")
        console.print(table)
    if r.optax:
        console.print(f"optax: {r.optax}")
    if r.schedule:
        console.print(f"schedule: {r.schedule}")
    if r.param_max_rel_diff is not None:
        console.print(f"parameters after {r.steps} steps: worst rel diff "
                      f"{r.param_max_rel_diff:.2e} ({r.worst_param})")
    if r.stats_max_abs_diff is not None:
        console.print(f"running statistics after {r.steps} steps: max abs diff "
                      f"{r.stats_max_abs_diff:.2e}, rel {r.stats_max_rel_diff:.2e}")
    for note in r.notes:
        console.print(f"note: {note}")
