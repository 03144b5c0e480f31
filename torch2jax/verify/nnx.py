"""Verification for the flax NNX target (the default): the model built with
``rngs=nnx.Rngs(seed)``, the torch ``state_dict`` copied in (:mod:`torch2jax.weights`), the
forward pass under ``jax.jit``, gradients with ``jax.grad`` of the split state, BatchNorm
statistics, and the training trajectory (``nnx.Optimizer``, one ``nnx.jit`` step per batch).
The NNX :class:`~torch2jax.verify.sides.JaxSide`; :mod:`torch2jax.verify.sides` drives it.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator
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
    flatten_output,
    torch_stats,
    train_mode_note,
    widen,
)
from torch2jax.verify.load import find_name
from torch2jax.verify.sides import JaxSide, ParamPairs, StatPairs, Trainer
from torch2jax.verify.spec import InputSpec, call_with
from torch2jax.verify.train_common import JaxSetup, TrajectoryResult

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
            # a class: its __init__'s (an nnx.Module's metaclass shows (*args, **kwargs))
            params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters
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
    """Set the ``dtype`` (and ``param_dtype``) attributes that read float32 on the model's NNX layers to float64:
    the rest of torch's ``.double()``. A layer that fixes its compute dtype at construction
    (``nnx.Embed``: ``dtype or embedding.dtype``) would otherwise cast the widened parameters
    back to float32. Returns the number of layers changed."""
    import jax.numpy as jnp
    from flax import nnx

    changed = 0
    for _, module in nnx.iter_modules(model):
        widened = False
        # param_dtype too: a recurrent cell builds its zero carry in it (initialize_carry)
        for attr in ("dtype", "param_dtype"):
            value = getattr(module, attr, None)
            try:
                is_f32 = value is not None and jnp.dtype(value) == jnp.float32
            except TypeError:
                is_f32 = False
            if is_f32:
                setattr(module, attr, jnp.float64)
                widened = True
        changed += widened
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


class NnxTrainer(Trainer):
    """``nnx.Optimizer`` over the parameters, one ``nnx.jit`` step of ``nnx.value_and_grad``
    and ``optimizer.update`` per batch; the model is trained in place."""

    def __init__(self, model: Any, setup: JaxSetup, loss_fn: Callable[..., Any]) -> None:
        from flax import nnx

        self.model = model
        self.optimizer = nnx.Optimizer(model, setup.tx, wrt=nnx.Param)

        @nnx.jit
        def train_step(model: Any, optimizer: Any, xs: list[Any], labels: Any) -> Any:
            def loss_of(model: Any) -> Any:
                return loss_fn(model(*xs), labels)

            loss, grads = nnx.value_and_grad(loss_of)(model)
            optimizer.update(model, grads)
            return loss

        self._step = train_step

    def step(self, xs: list[Any], labels: Any) -> Any:
        return self._step(self.model, self.optimizer, xs, labels)

    def params(self) -> Any:
        from flax import nnx

        return nnx.state(self.model, nnx.Param)

    def set_learning_rate(self, value: float) -> None:
        import jax.numpy as jnp

        slot = self.optimizer.opt_state.hyperparams["learning_rate"]
        slot.value = jnp.asarray(value, slot.value.dtype)

    def trained(self) -> tuple[Any, Any]:
        return self.model, None


class NnxSide(JaxSide):
    name = "nnx"
    keyword_inputs = True
    build_stage = "building the JAX model"
    forward_stage = "the JAX forward pass (under jax.jit)"
    grad_stage = "the JAX gradient (jax.grad under jax.jit)"
    step_stage = "the JAX training step {step} (nnx.jit)"

    def build(self, req: Any, module: ModuleType, name: str, sample: list[Any]) -> Any:
        return build_nnx_model(module, name, req.args, req.build, req.seed)

    def load_weights(self, r: VerifyResult, req: Any, model: Any, torch_model: Any) -> Any:
        from torch2jax.weights import transfer_state_dict

        if req.float64:
            from flax import nnx

            nnx.update(model, widen(nnx.state(model)))
            widened = widen_nnx_dtypes(model)
            if widened:
                r.notes.append(f"float64: the compute dtype of {widened} NNX layers (fixed to "
                               "float32 at construction, as nnx.Embed does) widened too")
        r.notes.append(transfer_state_dict(torch_model, model, req.rules).summary())
        return model

    def train_mode(self, r: VerifyResult, model: Any, n_torch: int) -> Any:
        r.notes.append(train_mode_note(n_torch, f"{_nnx_train_mode(model)} NNX modules in "
                                                "eval mode"))
        return model

    def eval_mode(self, r: VerifyResult, model: Any) -> Any:
        model.eval()
        return model

    def check_float64(self, model: Any, jax_in: list[Any], specs: list[InputSpec]) -> None:
        from flax import nnx

        graphdef, state = nnx.split(model)
        check_float64(lambda st, xs: call_with(nnx.merge(graphdef, st), xs, specs), state,
                      jax_in)

    def forward(self, model: Any, jax_in: list[Any], specs: list[InputSpec]
                ) -> tuple[Any, Any]:
        return _jax_forward(model, jax_in, specs), None

    def stats(self, req: Any, torch_model: Any, model: Any, updated: Any) -> StatPairs:
        return nnx_stat_pairs(torch_model, model, req.rules)

    def grads(self, r: VerifyResult, req: Any, torch_model: Any, model: Any,
              jax_in: list[Any], cots: dict[str, Any], specs: list[InputSpec]
              ) -> tuple[dict, dict]:
        from torch2jax.weights import gradient_parts

        mapping = gradient_parts(torch_model, model, req.rules)
        with _autograd_on(model, r):
            return _jax_grads(model, jax_in, cots, specs), mapping

    def benchmark(self, r: VerifyResult, torch_model: Any, torch_in: list[Any], model: Any,
                  jax_in: list[Any]) -> None:
        from torch2jax.verify.benchmark import benchmark_forward

        benchmark_forward(r, torch_model, torch_in, model, jax_in)

    def trajectory_mode(self, r: TrajectoryResult, model: Any, n_dropout: int,
                        n_drop_path: int) -> Any:
        r.notes += nnx_trajectory_mode(model, n_dropout, n_drop_path)
        return model

    def train_step(self, model: Any, setup: JaxSetup, loss_fn: Callable[..., Any]) -> Trainer:
        return NnxTrainer(model, setup, loss_fn)

    def param_pairs(self, req: Any, torch_model: Any, model: Any,
                    params_torch: dict[str, np.ndarray], steps: int) -> ParamPairs:
        from flax import nnx

        from torch2jax.weights import apply_layout, gradient_map

        params_jax = {tuple(path): np.asarray(v.get_value())
                      for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
        pairs = []
        for name, m in gradient_map(torch_model, model, req.rules).items():
            got = params_jax.get(tuple(m.nnx_path))
            if got is None:
                raise VerifyError(f"the JAX model has no parameter for {name} ({m.nnx_name})")
            compared = f"param {name} -> {m.nnx_name} ({m.layout}) after {steps} steps"
            pairs.append((name, compared, got, apply_layout(params_torch[name], m.layout)))
        return pairs


def nnx_trajectory_mode(model: Any, n_dropout: int, n_drop_path: int) -> list[str]:
    """The NNX model in training mode for a trajectory: nnx.Dropout at rate 0, the converted
    drop-path modules in eval mode (the torch side's counterpart,
    :func:`~torch2jax.verify.train_common.torch_trajectory_mode`, switched off ``n_dropout``
    Dropout and ``n_drop_path`` drop-path modules); returns the notes."""
    from flax import nnx

    model.train()
    n_jax = n_off = 0  # nnx.Dropout set to rate 0 here / at rate 0 already (dropout=0.0)
    for _, mod in nnx.iter_graph(model):
        if isinstance(mod, nnx.Dropout) and mod.rate:
            mod.rate = 0.0
            n_jax += 1
        elif isinstance(mod, nnx.Dropout):
            n_off += 1
    drop_paths = [m for _, m in nnx.iter_modules(model) if type(m).__name__ in DROP_PATH_CLASSES]
    for mod in drop_paths:
        mod.eval()
    n_paths = n_drop_path + len(drop_paths)
    notes = [("training mode on both sides; BatchNorm uses batch statistics and updates its "
             "running averages")]
    if n_dropout or n_jax:
        notes.append(f"dropout disabled for the trajectory: {n_dropout} torch Dropout modules "
                     f"and {n_jax} nnx.Dropout set to p=0 (random masks cannot agree)")
    if n_paths:
        notes.append(f"stochastic depth off for the trajectory: {n_paths} drop-path "
                     "modules (torch and JAX) in eval mode")
    if n_off:
        notes.append(f"{n_off} nnx.Dropout modules at rate 0 already (built with dropout "
                     "0.0): nothing to disable there")
    if not (n_dropout or n_jax or n_paths or n_off):
        notes.append("dropout disabled for the trajectory (no Dropout modules found; "
                     "functional dropout in forward() is not switched off)")
    return notes
