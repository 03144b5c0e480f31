"""Training-trajectory verification: K optimizer steps on both sides, compared step by step.

``verify --optimizer "torch.optim.SGD(params, lr=0.05, momentum=0.9)" --loss "F.cross_entropy(
output, labels)" --labels "int64[4]:10" --steps 10``:

1. build the torch model and the converted model of ``--target`` exactly as
   :mod:`torch2jax.verify.run` does (same seed, same randomised statistics, the torch weights
   transplanted);
2. put both in training mode with dropout switched off (``p = 0`` on torch's Dropout, the
   drop-path modules in eval mode, and the JAX side's counterparts: ``nnx.Dropout.rate = 0``,
   linen's intercepted, equinox's in inference mode; random masks cannot agree across
   frameworks); BatchNorm stays in training mode on both sides (batch statistics, running
   averages updated);
3. translate the optimizer, the scheduler (stepped after every optimizer step) and gradient
   clipping with :mod:`torch2jax.training.optim`, and the loss expression with the converter
   (``loss = <expr>`` in a tiny torch snippet, ``output`` and ``labels`` bound);
4. run ``steps`` steps on fresh random batches (the same arrays on both sides): torch
   ``zero_grad / backward / clip_grad_norm_ / step / scheduler.step()``, JAX one step of the
   target's training code (NNX: ``nnx.jit`` of ``nnx.value_and_grad`` +
   ``nnx.Optimizer.update``; linen: a TrainState under ``jax.jit``; equinox: the emitted
   ``eqx.filter_jit`` step), :func:`torch2jax.verify.sides.check_trajectory`;
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
from pathlib import Path
from typing import Any

from torch2jax.ruleset import RuleSet
from torch2jax.verify.common import VerifyError
from torch2jax.verify.load import LoadError
from torch2jax.verify.nnx import NnxSide
from torch2jax.verify.registry import SIDES
from torch2jax.verify.run import (
    VerifyRequest,
    _device,
    _JaxSource,
    build_torch_side,
    load_converted,
)
from torch2jax.verify.sides import check_trajectory, model_for_training, train_and_compare
from torch2jax.verify.spec import parse_spec, parse_specs
from torch2jax.verify.train_common import (
    TrainSpec,
    TrajectoryResult,
    relative_loss_diff,
    translate_loss,
    translate_setup,
)


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
    path, name, specs, torch_model, _ = build_torch_side(r, req)
    if any(s.name or s.expr is not None for s in specs):
        raise VerifyError("NAME=SPEC (keyword) and --input-expr inputs are verified for the "
                          "forward pass and gradients only, not for training trajectories")
    setup = translate_setup(train)
    r.optax, r.schedule = setup.tx_code, setup.schedule_code
    r.notes += setup.notes
    loss_fn, loss_text = translate_loss(train.loss, req.rules)
    r.notes.append(f"loss: {loss_text}")
    with tempfile.TemporaryDirectory(prefix="torch2jax-verify-") as tmp:
        jax_path, r.todos = _JaxSource(req, Path(tmp)).get(path, name)
        with _device(req.device) as platform:
            r.device = platform
            check_trajectory(SIDES[req.jax_target], r, req, train,
                             load_converted(jax_path, name, req.build, req.setup), name,
                             torch_model, specs, setup, loss_fn)
    if r.todos and not r.passed:
        r.notes.append(f"the conversion left {r.todos} TODO(torch2jax) markers")


def build_models(req: VerifyRequest, workdir: str | Path) -> tuple[Any, Any]:
    """The torch model and its converted NNX twin (torch weights transplanted, memory not
    shared), as :func:`verify_trajectory` builds them; the conversion is written to
    ``workdir``. For callers that run many trajectories on one pair (:func:`train_models`)."""
    scratch = TrajectoryResult(model=req.target)  # notes nobody reads here
    path, name, specs, torch_model, _ = build_torch_side(scratch, req)
    jax_path, _ = _JaxSource(req, Path(workdir)).get(path, name)
    jax_model = model_for_training(NnxSide(), scratch, req,
                                   load_converted(jax_path, name, req.build, req.setup), name,
                                   torch_model, specs)
    return torch_model, jax_model


def train_models(torch_model: Any, jax_model: Any, train: TrainSpec, inputs: list[str],
                 *, seed: int = 0, rtol: float = 1e-4, rules: RuleSet | None = None
                 ) -> TrajectoryResult:
    """The trajectory check on models already built (the NNX one with the torch weights):
    both are copied first, so the same pair serves many checks (tests build them once)."""
    from flax import nnx

    r = TrajectoryResult(model=type(torch_model).__name__, rtol=rtol,
                         mode=f"train {train.steps} steps", steps=train.steps,
                         optimizer=train.optimizer, scheduler=train.scheduler, loss=train.loss)
    setup = translate_setup(train)
    r.optax, r.schedule = setup.tx_code, setup.schedule_code
    r.notes += setup.notes
    loss_fn, _ = translate_loss(train.loss, rules)
    req = VerifyRequest(r.model, inputs=tuple(inputs), rtol=rtol, seed=seed, rules=rules)
    train_and_compare(NnxSide(), r, req, nnx.clone(jax_model), copy.deepcopy(torch_model),
                      train, parse_specs(inputs), setup, loss_fn)
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
