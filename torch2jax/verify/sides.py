"""One JAX side per target, and the two checks that drive it.

The torch side (building the model, randomising its statistics, the inputs, the forward and
backward passes, the training setup, the loss and every training step) is written once, here
and in :mod:`~torch2jax.verify.common` / :mod:`~torch2jax.verify.train_common`. A
:class:`JaxSide` does only what its target's model needs done its own way: build it, load the
torch weights into it, switch its mode, run the forward pass, take the gradients, read its
running statistics, and make a training step. :func:`check_forward` and
:func:`check_trajectory` drive any side through the same sequence, so the stages, the notes
and the verdicts are one code path for every target.

Each target's side lives in its own module (:mod:`~torch2jax.verify.nnx`,
:mod:`~torch2jax.verify.linen`, :mod:`~torch2jax.verify.equinox`), which imports this one;
:mod:`~torch2jax.verify.registry` names them (``SIDES[req.jax_target]``), so that the verifier
never branches on a target's name.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from torch2jax.verify.common import (
    VerifyError,
    VerifyResult,
    compare_arrays,
    compare_expression_inputs,
    compare_grads,
    compare_outputs,
    compare_stats,
    cotangents,
    expression_inputs,
    flatten_output,
    jax_inputs,
    jax_to_numpy,
    stage,
    timed,
    torch_grads,
    torch_inputs,
    torch_to_numpy,
    torch_train_mode,
)
from torch2jax.verify.spec import InputSpec, call_with, parse_spec
from torch2jax.verify.torch_exact import exact_float64
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
    torch_trajectory_mode,
    unalias,
)

StatPairs = list[tuple[str, str, Any, Any]]  # (torch name, JAX name, JAX value, torch value)
ParamPairs = list[tuple[str, str, Any, Any]]  # (torch name, what is compared, JAX, torch)


class Trainer:
    """One target's training step over its model, made by :meth:`JaxSide.train_step`."""

    def step(self, xs: list[Any], labels: Any) -> Any:
        """One optimizer step on a batch; the loss (a JAX scalar)."""
        raise NotImplementedError

    def params(self) -> Any:
        """The trainable parameters (the plateau transform's ``init`` reads their dtypes)."""
        raise NotImplementedError

    def set_learning_rate(self, value: float) -> None:
        """Write ``value`` into the injected ``learning_rate`` hyperparameter
        (ReduceLROnPlateau, stepped on the loss as torch's is)."""
        raise NotImplementedError

    def trained(self) -> tuple[Any, Any]:
        """``(the trained model, what JaxSide.stats reads its running statistics from)``."""
        raise NotImplementedError


class JaxSide:
    """The verifier's operations on one target's converted model. ``model`` is whatever the
    side keeps (an NNX module; a linen module with its variables; an equinox module with its
    State), made by :meth:`build` and passed back to every other method."""

    name: str = ""
    keyword_inputs: bool = False  # NAME=SPEC (keyword) inputs to the forward pass are verified
    build_stage = "building the JAX model"
    forward_stage = "the JAX forward pass"
    grad_stage = "the JAX gradient"
    step_stage = "the JAX training step {step}"

    def build(self, req: Any, module: ModuleType, name: str, sample: list[Any]) -> Any:
        """The model built as the torch one is (``req.args`` / ``req.build``, seeded);
        ``sample``: a batch of JAX inputs, for a target that initialises by tracing."""
        raise NotImplementedError

    def load_weights(self, r: VerifyResult, req: Any, model: Any, torch_model: Any) -> Any:
        """The model holding the torch weights (widened first when ``req.float64``), with a
        note on ``r`` saying what went where; raises WeightTransferError."""
        raise NotImplementedError

    def train_mode(self, r: VerifyResult, model: Any, n_torch: int) -> Any:
        """The model in training mode with dropout-like modules deterministic, noted on ``r``
        (``n_torch``: the torch modules :func:`torch_train_mode` made deterministic)."""
        raise NotImplementedError

    def eval_mode(self, r: VerifyResult, model: Any) -> Any:
        raise NotImplementedError

    def check_float64(self, model: Any, jax_in: list[Any], specs: list[InputSpec]) -> None:
        """:func:`~torch2jax.verify.common.check_float64` on the model's forward pass."""
        raise NotImplementedError

    def forward(self, model: Any, jax_in: list[Any], specs: list[InputSpec]
                ) -> tuple[Any, Any]:
        """``(the output, what the call updated)``: the forward pass under the target's jit."""
        raise NotImplementedError

    def stats(self, req: Any, torch_model: Any, model: Any, updated: Any) -> StatPairs:
        """Each torch running statistic with the JAX side's, after a forward pass or training
        (``updated``: what :meth:`forward` or :meth:`Trainer.trained` returned with it)."""
        raise NotImplementedError

    def grads(self, r: VerifyResult, req: Any, torch_model: Any, model: Any,
              jax_in: list[Any], cots: dict[str, Any], specs: list[InputSpec]
              ) -> tuple[dict, dict]:
        """``(the JAX gradients by path, torch name -> ParamMapping parts)`` of
        ``sum(output * cotangent)``, for :func:`~torch2jax.verify.common.compare_grads`."""
        raise NotImplementedError

    def benchmark(self, r: VerifyResult, torch_model: Any, torch_in: list[Any], model: Any,
                  jax_in: list[Any]) -> None:
        """``--benchmark``: time both forward passes (a side that cannot leaves ``r`` as is)."""

    def trajectory_mode(self, r: TrajectoryResult, model: Any, n_dropout: int,
                        n_drop_path: int) -> Any:
        """The model in training mode for a trajectory, dropout off, noted on ``r``
        (``n_dropout`` / ``n_drop_path``: what :func:`torch_trajectory_mode` switched off)."""
        raise NotImplementedError

    def train_step(self, model: Any, setup: JaxSetup, loss_fn: Callable[..., Any]) -> Trainer:
        raise NotImplementedError

    def param_pairs(self, req: Any, torch_model: Any, model: Any,
                    params_torch: dict[str, np.ndarray], steps: int) -> ParamPairs:
        """Each trainable torch parameter after training with the JAX side's, in one layout."""
        raise NotImplementedError


def build_and_load(side: JaxSide, r: VerifyResult, req: Any, module: ModuleType, name: str,
                   torch_model: Any, sample: list[Any]) -> Any:
    """The side's model built and holding the torch weights."""
    from torch2jax.weights import WeightTransferError

    with stage(side.build_stage):
        model = side.build(req, module, name, sample)
    try:
        with timed("the weight transfer"):
            return side.load_weights(r, req, model, torch_model)
    except WeightTransferError as exc:
        raise VerifyError(str(exc)) from None


def check_forward(side: JaxSide, r: VerifyResult, req: Any, module: ModuleType, name: str,
                  torch_model: Any, specs: list[InputSpec],
                  torch_namespace: dict[str, Any] | None = None) -> None:
    """Build the side's model, load the torch weights, compare the forward pass (and, as
    ``req`` asks, gradients, running statistics, a benchmark) into ``r``. ``torch_namespace``:
    the torch file's globals, where ``--input-expr`` inputs are evaluated on the torch side
    (the converted file's, ``module``, on the JAX side)."""
    import torch

    rng = np.random.default_rng(req.seed)
    arrays = [s.sample(rng) for s in specs]
    torch_in = torch_inputs(arrays, specs)
    jax_in = jax_inputs(arrays, specs)
    model = build_and_load(side, r, req, module, name, torch_model, jax_in)
    if req.train_mode:
        model = side.train_mode(r, model, torch_train_mode(torch_model))
    else:
        model = side.eval_mode(r, model)
    if any(s.expr is not None for s in specs):  # now that both models are built
        torch_in = expression_inputs(torch_in, specs, torch_namespace or {}, torch_model,
                                     bool(req.float64), "torch")
        jax_in = expression_inputs(jax_in, specs, vars(module), model, bool(req.float64),
                                   "JAX", torch_in)
        compare_expression_inputs(r, torch_in, jax_in, specs)
    r.compared += [f"input[{i}] {s}" for i, s in enumerate(specs)]
    if req.float64:  # before torch's pass, which may not run in float64 (grouped_mm)
        with stage("the JAX forward pass traced in float64"):
            side.check_float64(model, jax_in, specs)
    # where gradients are compared, a first call with autograd on: a tensor the model keeps
    # from its first call (timm's eval-mode attention-bias cache) stays tied to its
    # parameters, as in training, not a constant whose gradient torch's backward pass would
    # find zero. The outputs compared are those of inference, under no_grad (torch's
    # TransformerEncoder takes its nested-tensor fast path there, with other values at padded
    # positions than its autograd path's)
    with stage("the torch forward pass"):
        if req.grad and not req.train_mode:  # (in training mode a call moves BatchNorm's
            call_with(torch_model, torch_in, specs)  # statistics) (output and graph dropped)
        with torch.no_grad():
            torch_out = call_with(torch_model, torch_in, specs)
    torch_leaves = [(k, torch_to_numpy(v)) for k, v in flatten_output(torch_out)]
    del torch_out  # (its graph)
    with stage(side.forward_stage):
        jax_out, updated = side.forward(model, jax_in, specs)
    jax_leaves = [(k, jax_to_numpy(v)) for k, v in flatten_output(jax_out)]
    out = compare_outputs(jax_leaves, torch_leaves, r)
    r.max_abs_diff, r.max_rel_diff = out.abs, out.rel
    r.passed, r.mismatch = out.ok, out.first_failure
    if req.train_mode:  # before the gradients: torch's backward pass runs the model again
        compare_stats(r, side.stats(req, torch_model, model, updated), "after the forward pass")
    if req.benchmark and out.shapes_match:
        with stage("the benchmark"):
            side.benchmark(r, torch_model, torch_in, model, jax_in)
    if not (req.grad and out.shapes_match):
        if req.grad:
            r.notes.append("gradients not compared: the outputs differ in structure or shape")
        return
    cots = cotangents(torch_leaves, req.seed)
    if not cots:
        raise VerifyError("--grad: the model has no floating-point output to differentiate")
    with stage("the torch backward pass"), exact_float64(bool(req.float64), r.notes):
        tg = torch_grads(torch_model, torch_in, cots, specs)
    with stage(side.grad_stage):
        jg, mapping = side.grads(r, req, torch_model, model, jax_in, cots, specs)
    g = compare_grads(jg, tg, mapping, r)
    r.grad_max_abs_diff, r.grad_max_rel_diff = g.abs, g.rel
    r.passed = r.passed and g.ok
    r.mismatch = r.mismatch or g.first_failure


def check_trajectory(side: JaxSide, r: TrajectoryResult, req: Any, train: TrainSpec,
                     module: ModuleType, name: str, torch_model: Any, specs: list[InputSpec],
                     setup: JaxSetup, loss_fn: Callable[..., Any]) -> None:
    """Build the side's model with the torch weights, train both ``train.steps`` steps and
    compare into ``r`` (:func:`train_and_compare`)."""
    model = model_for_training(side, r, req, module, name, torch_model, specs)
    train_and_compare(side, r, req, model, torch_model, train, specs, setup, loss_fn)


def model_for_training(side: JaxSide, r: VerifyResult, req: Any, module: ModuleType,
                       name: str, torch_model: Any, specs: list[InputSpec]) -> Any:
    """The side's model holding the torch weights, with torch's tensors given memory of their
    own (:func:`~torch2jax.verify.train_common.unalias`): ready to train side by side."""
    rng = np.random.default_rng(req.seed)
    sample = jax_inputs([s.sample(rng) for s in specs], specs)
    model = build_and_load(side, r, req, module, name, torch_model, sample)
    unalias(torch_model)
    return model


def train_and_compare(side: JaxSide, r: TrajectoryResult, req: Any, model: Any,
                      torch_model: Any, train: TrainSpec, specs: list[InputSpec],
                      setup: JaxSetup, loss_fn: Callable[..., Any]) -> None:
    """Train the torch model and the side's model (both already holding the same weights, in
    place) for ``train.steps`` steps on the same batches; compare every step's loss, every
    parameter and the running statistics at the end into ``r``."""
    import jax

    model = side.trajectory_mode(r, model, *torch_trajectory_mode(torch_model))
    trainer = side.train_step(model, setup, loss_fn)
    plateau_state = None
    if setup.plateau is not None:
        plateau_state = setup.plateau.init(trainer.params())
    label_spec = parse_spec(train.labels) if train.labels else None
    loss_torch = torch_loss(train.loss)
    opt, sched = torch_setup(train, torch_model)
    rng = np.random.default_rng(req.seed + 3)
    torch_losses: list[float] = []
    jax_losses: list[float] = []
    for step in range(train.steps):
        arrays = [s.sample(rng) for s in specs]
        label_arr = label_spec.sample(rng) if label_spec else None
        t_in = torch_inputs(arrays, specs)
        t_lab = torch_inputs([label_arr], [label_spec])[0] if label_spec else None
        torch_losses.append(torch_step(torch_model, opt, sched, loss_torch, t_in, t_lab,
                                       train.clip_grad_norm, step))
        j_in = jax_inputs(arrays, specs)
        j_lab = jax_inputs([label_arr], [label_spec])[0] if label_spec else None
        with stage(side.step_stage.format(step=step)):
            jloss = trainer.step(j_in, j_lab)
            if setup.plateau is not None:
                value = -jloss if setup.negate_metric else jloss
                _, plateau_state = setup.plateau.update(None, plateau_state, value=value)
                trainer.set_learning_rate(setup.base_lr * plateau_state.scale)
        jax_losses.append(float(jax.device_get(jloss)))
    params_torch = {n: p.detach().cpu().float().numpy().copy()
                    for n, p in torch_model.named_parameters()}
    trained, updated = trainer.trained()
    traj = Trajectory(torch_losses, jax_losses)
    r.losses_torch, r.losses_jax = traj.losses_torch, traj.losses_jax
    rels = [relative_loss_diff(a, b)
            for a, b in zip(traj.losses_jax, traj.losses_torch, strict=True)]
    worst_step = int(np.argmax(rels)) if rels else 0
    loss_rel = rels[worst_step] if rels else 0.0
    r.loss_max_rel_diff = loss_rel
    p_abs, p_rel, worst = 0.0, -1.0, None
    for name, compared, got, ref in side.param_pairs(req, torch_model, trained, params_torch,
                                                      r.steps):
        if ref.shape != got.shape and ref.size == got.size:
            ref = ref.reshape(got.shape)
        d = compare_arrays(got, ref, r.atol, r.rtol)
        r.compared.append(compared)
        p_abs = max(p_abs, d.abs)
        if d.rel > p_rel:
            p_rel, worst = d.rel, name
    settle_trajectory(r, traj, loss_rel, worst_step, p_abs, p_rel, worst)
    compare_stats(r, side.stats(req, torch_model, trained, updated), f"after {r.steps} steps")
