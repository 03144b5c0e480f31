"""Runtime of converted models next to hand-written JAX (NNX, linen, equinox) and PyTorch eager.

For each model (the fixture MLP, CNN and GPT, and a ResNet-18) it times, in one process:

* **converted**: the torch file converted at run time with ``torch2jax.convert.convert_source``,
  the torch weights moved in with ``torch2jax.weights.transfer_state_dict``;
* **reference**: a hand-written idiomatic NNX model in ``benchmarks/reference/`` (channels-last
  for the convolutional models, fed NHWC images; its own random weights, same shapes);
* **torch**: the original model, eager.

Two phases per model: the jit-compiled forward pass (eval mode) and one training step (train
mode, AdamW(lr=1e-3, weight_decay=0.01) and cross-entropy). The JAX sides run under three
calling patterns:

* ``nnx.jit``: what the converter emits (``@nnx.jit def eval_step(model, *inputs)`` and
  ``@nnx.jit def train_step(model, optimizer, x, y)`` with ``nnx.value_and_grad`` and
  ``optimizer.update``, docs/training.md);
* ``split``: ``nnx.split`` once, then a ``jax.jit`` function of the state that ``nnx.merge``\\ s
  inside and returns the new state (donated);
* ``cached``: ``nnx.cached_partial`` of the emitted ``nnx.jit`` function;
* ``tree``: ``nnx.jit(graph=False)``, flax's tree mode (modules flattened as pytrees, no graph
  walk; refuses modules that share a Variable).

Timing is round-robin: every repetition runs each contestant in turn for about ``--slot``
seconds of calls, each call blocked on (``jax.block_until_ready``); compilation and two warm-up
calls are excluded; the table shows the median per-call time over the repetitions.

Threads: XLA reads its flags once, when jax is imported, so each thread setting runs in its own
child process. ``--threads 1`` sets, before importing jax,
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` and
``torch.set_num_threads(1)`` (and ``set_num_interop_threads(1)``); ``--threads all`` leaves XLA
at its default and gives torch ``os.cpu_count()`` threads. The process CPU time over wall time
is printed as a check of what the setting achieved.

    python benchmarks/runtime.py                       # 1 thread, then all threads
    python benchmarks/runtime.py --threads 1 --models mlp gpt --reps 5

Other targets: ``--targets linen equinox`` (default ``nnx``) times, per target, the model
converted with ``convert_source(..., target=...)`` (the torch weights moved in with the
verifier's ``transfer_to_linen`` / ``transfer_to_equinox``) against a hand-written reference of
the same target (``benchmarks/reference/linen_models.py``, ``equinox_models.py``) and torch,
forward and train step, each JAX side called through the eval and train steps that target's
training output uses (see the "linen and equinox" section below). ``--hlo`` prints the
instruction counts of those compiled steps instead of timing them.

    python benchmarks/runtime.py --targets linen equinox
    python benchmarks/runtime.py --threads 1 --targets equinox --hlo

GPU: ``--device cuda`` runs torch on CUDA and JAX on its default backend (which must then be the
GPU; the script refuses otherwise), in one process (the thread settings do not apply), and
synchronizes torch after every call as JAX blocks. ``--batch-scale`` multiplies every batch so
that the GPU has work beyond kernel launches.

    python benchmarks/runtime.py --device cuda --batch-scale 1
    python benchmarks/runtime.py --device cuda --batch-scale 16
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ONE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
MODELS = ("mlp", "cnn", "gpt", "resnet18")
PATTERNS = ("nnx.jit", "split", "cached", "tree")
TARGETS = ("nnx", "linen", "equinox")
TIMED = [0.0, 0.0]  # wall and CPU seconds spent in the timed loops
RUN = {"device": "cpu", "batch_scale": 1}  # set from the command line in child()


# --- models ----------------------------------------------------------------------------------


@dataclass
class Spec:
    torch_file: Path
    name: str
    build: str  # constructor call, evaluated in the module's namespace (rngs= added for NNX)
    batch: int
    shape: tuple[int, ...]  # one example, torch layout
    high: int | None = None  # integer inputs: exclusive bound
    classes: int = 10
    nhwc: bool = False  # the reference takes channels-last images
    dropout: bool = False  # the model has dropout: the linen / equinox train steps take a key


SPECS = {
    "mlp": Spec(ROOT / "fixtures/models/mlp.py", "MLP", "MLP()", 64, (784,)),
    "cnn": Spec(ROOT / "fixtures/models/cnn.py", "CNN", "CNN()", 32, (3, 32, 32), nhwc=True,
                dropout=True),
    "gpt": Spec(ROOT / "fixtures/models/gpt.py", "GPT", "GPT(GPTConfig())", 8, (64,),
                high=128, classes=128),
    "resnet18": Spec(HERE / "models/resnet18.py", "ResNet18", "ResNet18()", 4, (3, 32, 32),
                     nhwc=True),
}
REFERENCE_BUILD = {"mlp": "MLP", "cnn": "CNN", "gpt": "GPT", "resnet18": "ResNet18"}


def _eval(expr: str, namespace: dict, **extra: object) -> object:
    return eval(expr, {**namespace, **extra})  # our own constructor expressions


def build_models(key: str, tmp: Path) -> tuple[object, object, object]:
    """(torch model, converted NNX model with the torch weights, reference NNX model)."""
    from flax import nnx

    from torch2jax.verify.load import load_module
    from torch2jax.weights import transfer_state_dict

    spec = SPECS[key]
    torch_model = build_torch(key)
    jax_module = convert_and_load(key, tmp, "nnx")
    if isinstance(jax_module, str):
        raise SystemExit(jax_module)
    call = spec.build[:-1] + (", " if spec.build[-2] != "(" else "") + "rngs=nnx.Rngs(0))"
    converted = _eval(call, vars(jax_module), nnx=nnx)
    transfer_state_dict(torch_model.cpu(), converted)
    torch_model = torch_model.to(RUN["device"])

    ref_module = load_module(HERE / "reference" / f"{key}.py", prefix="bench_reference")
    reference = getattr(ref_module, REFERENCE_BUILD[key])(rngs=nnx.Rngs(0))

    n_torch = sum(p.numel() for p in torch_model.parameters())
    n_ref = sum(int(v.size) for v in jax_leaves(nnx.state(reference, nnx.Param)))
    n_conv = sum(int(v.size) for v in jax_leaves(nnx.state(converted, nnx.Param)))
    if not n_torch == n_ref == n_conv:
        raise SystemExit(f"{key}: parameter counts differ: torch {n_torch}, converted {n_conv}, "
                         f"reference {n_ref}")
    return torch_model, converted, reference


def build_torch(key: str) -> object:
    """The torch model (seed 0) on the benchmark's device."""
    import torch

    from torch2jax.verify.load import load_module

    spec = SPECS[key]
    torch.manual_seed(0)
    torch_module = load_module(spec.torch_file, prefix="bench_torch")
    return _eval(spec.build, vars(torch_module)).to(RUN["device"])


def convert_and_load(key: str, tmp: Path, target: str) -> object:
    """The torch file converted with ``convert_source(..., target=target)`` and imported; a
    message instead when the conversion left errors."""
    from torch2jax.convert import convert_source
    from torch2jax.verify.load import load_module

    spec = SPECS[key]
    out = convert_source(spec.torch_file.read_text(), path=str(spec.torch_file), target=target)
    errors = [d for d in out.diagnostics if d.severity == "error"]
    if errors:
        return (f"{spec.torch_file.name} --target {target}: the conversion left {len(errors)} "
                "errors: " + "; ".join(sorted({d.message for d in errors})))
    converted_file = tmp / f"{key}_{target}_converted.py"
    converted_file.write_text(out.code)
    return load_module(converted_file, prefix=f"bench_converted_{target}")


def jax_leaves(state: object) -> list:
    import jax

    return jax.tree.leaves(state)


def make_batch(spec: Spec, seed: int) -> dict[str, object]:
    """The same batch for every side: torch tensors, JAX arrays (NCHW) and the NHWC copy."""
    import jax.numpy as jnp
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    batch = spec.batch * RUN["batch_scale"]
    shape = (batch, *spec.shape)
    if spec.high is not None:
        x = rng.integers(0, spec.high, shape)
        y = rng.integers(0, spec.classes, shape)
        tx = torch.from_numpy(x)
        jx = jnp.asarray(x, dtype=jnp.int32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, spec.classes, (batch,))
        tx = torch.from_numpy(x)
        jx = jnp.asarray(x)
    jx_ref = jnp.moveaxis(jx, 1, -1) if spec.nhwc else jx
    dev = RUN["device"]
    return {"tx": tx.to(dev), "ty": torch.from_numpy(y).to(dev), "jx": jx, "jx_ref": jx_ref,
            "jy": jnp.asarray(y, dtype=jnp.int32)}


# --- contestants -----------------------------------------------------------------------------


def jax_loss(logits: object, labels: object) -> object:
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).mean()


def jax_optimizer(model: object) -> object:
    import optax
    from flax import nnx

    return nnx.Optimizer(model, optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01),
                         wrt=nnx.Param)


def jax_forward(model: object, x: object, pattern: str) -> Callable[[], object]:
    import jax
    from flax import nnx

    model.eval()
    if pattern == "nnx.jit":
        @nnx.jit
        def eval_step(model, *inputs):
            return model(*inputs)

        return lambda: jax.block_until_ready(eval_step(model, x))
    if pattern == "cached":
        @nnx.jit
        def eval_step2(model, *inputs):
            return model(*inputs)

        cached = nnx.cached_partial(eval_step2, model)
        return lambda: jax.block_until_ready(cached(x))
    if pattern == "tree":
        tree_step = nnx.jit(lambda model, *inputs: model(*inputs), graph=False)
        return lambda: jax.block_until_ready(tree_step(model, x))
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
    return lambda: jax.block_until_ready(forward(state, x))


def jax_train(model: object, x: object, y: object, pattern: str) -> Callable[[], object]:
    import jax
    from flax import nnx

    model.train()
    optimizer = jax_optimizer(model)

    def train_step(model, optimizer, xb, yb):  # the emitted body (docs/training.md)
        def loss_fn(model):
            logits = model(xb)
            loss = jax_loss(logits, yb)
            return loss

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    if pattern == "nnx.jit":
        step = nnx.jit(train_step)
        return lambda: jax.block_until_ready(step(model, optimizer, x, y))
    if pattern == "cached":
        cached = nnx.cached_partial(nnx.jit(train_step), model, optimizer)
        return lambda: jax.block_until_ready(cached(x, y))
    if pattern == "tree":
        tree_step = nnx.jit(train_step, graph=False)
        return lambda: jax.block_until_ready(tree_step(model, optimizer, x, y))
    graphdef, state = nnx.split((model, optimizer))

    @partial_jit
    def pure_step(state, xb, yb):
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, xb, yb)
        return loss, nnx.state((model, optimizer))

    box = [state]

    def run() -> object:
        loss, box[0] = pure_step(box[0], x, y)
        return jax.block_until_ready(loss)

    return run


def partial_jit(fn: Callable) -> Callable:
    import jax

    return jax.jit(fn, donate_argnums=0)


def torch_forward(model: object, x: object) -> Callable[[], object]:
    import torch

    model.eval()

    def run() -> object:
        with torch.no_grad():
            out = model(x)
        _sync()
        return out

    return run


def torch_train(model: object, x: object, y: object) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)

    def run() -> object:
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        _sync()
        return loss

    return run


def _sync() -> None:
    if RUN["device"] == "cuda":
        import torch

        torch.cuda.synchronize()


# --- linen and equinox -----------------------------------------------------------------------
#
# For --targets linen / equinox: the model converted with ``convert_source(..., target=...)``
# and filled with the torch weights by the verifier's own transfer (torch2jax/verify/linen.py,
# equinox.py), and the hand-written reference of the same target
# (benchmarks/reference/linen_models.py, equinox_models.py), each called through the code that
# target's training output uses:
#
# * linen: ``@partial(jax.jit, static_argnums=0) def eval_step(model, variables, *inputs)``;
#   the train step is ``@jax.jit`` of a TrainState (with ``batch_stats`` when the model has
#   BatchNorm), ``jax.value_and_grad`` of ``state.apply_fn`` = ``model.clone(train=True).apply``
#   with ``mutable=["batch_stats"]`` and a dropout key where the model has dropout,
#   ``state.apply_gradients`` (docs/linen-output.md);
# * equinox: the per-example model in ``eqx.nn.inference_mode`` mapped over the batch with
#   ``jax.vmap`` under ``eqx.filter_jit`` (``axis_name="batch"`` and the State unbatched for a
#   model with BatchNorm); the train step is ``@eqx.filter_jit`` of
#   ``eqx.filter_value_and_grad`` of that, one dropout key per example, the optax update of
#   ``eqx.filter(model, eqx.is_array)`` and ``eqx.apply_updates`` (docs/equinox.md).


@dataclass
class Side:
    forward: Callable[[], object]
    train: Callable[[], object]
    params: int  # trainable parameter count
    lower: dict[str, Callable[[], object]]  # phase -> the step lowered on the benchmark's args


def target_sides(target: str, key: str, torch_model: object, batch: dict, tmp: Path
                 ) -> tuple[dict[str, Side], list[str]]:
    """{"converted": Side, "reference": Side} for linen or equinox (no "converted" when the
    conversion left errors), and notes for the table."""
    from torch2jax.verify.load import load_module

    spec = SPECS[key]
    build = {"linen": linen_side, "equinox": equinox_side}[target]
    ref_module = load_module(HERE / "reference" / f"{target}_models.py",
                             prefix=f"bench_ref_{target}")
    sides = {"reference": build(vars(ref_module), REFERENCE_BUILD[key] + "()", None,
                                batch["jx_ref" if target == "linen" else "jx"], batch["jy"],
                                spec)}
    notes = []
    module = convert_and_load(key, tmp, target)
    if isinstance(module, str):
        notes.append(module)
    else:
        sides["converted"] = build(vars(module), spec.build, torch_model, batch["jx"],
                                   batch["jy"], spec)
    n_torch = sum(p.numel() for p in torch_model.parameters())
    extra = sum(b.numel() for n, b in torch_model.named_buffers()
                if n.rsplit(".", 1)[-1] not in ("running_mean", "running_var",
                                                "num_batches_tracked"))
    for name, side in sides.items():
        if side.params == n_torch + extra and extra:
            notes.append(f"{key} {name}: {extra} more array elements than torch's parameters "
                         "(torch's non-BatchNorm buffers, held as model arrays)")
        elif side.params != n_torch:
            raise SystemExit(f"{key} {target}: parameter counts differ: torch {n_torch}, "
                             f"{name} {side.params}")
    return sides, notes


def linen_side(namespace: dict, build: str, torch_model: object | None, x: object, y: object,
               spec: Spec) -> Side:
    import functools
    from typing import Any

    import jax
    from flax.training import train_state

    from torch2jax.verify.linen import _thaw, transfer_to_linen

    model = _eval(build, namespace)
    variables = _thaw(jax.jit(lambda x: model.init(jax.random.key(0), x))(x[:1]))
    if torch_model is not None:
        variables, _ = transfer_to_linen(torch_model, variables)
    n_params = sum(int(v.size) for v in jax.tree.leaves(variables["params"]))

    @functools.partial(jax.jit, static_argnums=0)
    def eval_step(model, variables, *inputs):
        return model.apply(variables, *inputs)

    stats = "batch_stats" in variables

    class TrainState(train_state.TrainState):
        batch_stats: Any = None

    trained = model.clone(train=True) if "train" in type(model).__dataclass_fields__ else model
    state = TrainState.create(apply_fn=trained.apply, params=variables["params"],
                              tx=adamw(), batch_stats=variables.get("batch_stats"))
    rngs = (lambda k: {"dropout": k}) if spec.dropout else (lambda k: {})

    @jax.jit
    def train_step(state, xb, yb, dropout_key):
        def loss_fn(params):
            if stats:
                logits, updates = state.apply_fn(
                    {"params": params, "batch_stats": state.batch_stats}, xb,
                    rngs=rngs(dropout_key), mutable=["batch_stats"])
                return jax_loss(logits, yb), updates
            return jax_loss(state.apply_fn({"params": params}, xb, rngs=rngs(dropout_key)),
                            yb), None

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        if stats:
            return state.apply_gradients(grads=grads, batch_stats=updates["batch_stats"]), loss
        return state.apply_gradients(grads=grads), loss

    box = [state, jax.random.key(1)]

    def train() -> object:
        box[1], dropout_key = jax.random.split(box[1])
        box[0], loss = train_step(box[0], x, y, dropout_key)
        return jax.block_until_ready(loss)

    return Side(lambda: jax.block_until_ready(eval_step(model, variables, x)), train, n_params,
                {"forward": lambda: eval_step.lower(model, variables, x),
                 "train": lambda: train_step.lower(state, x, y, jax.random.key(1))})


def equinox_side(namespace: dict, build: str, torch_model: object | None, x: object,
                 y: object, spec: Spec) -> Side:
    import equinox as eqx
    import jax

    from torch2jax.verify.equinox import build_equinox_model, takes_state, transfer_to_equinox

    model, state = build_equinox_model(_Namespace(namespace), build.split("(")[0], None, build,
                                       seed=0)
    if torch_model is not None:
        model, state, _ = transfer_to_equinox(torch_model, model, state)
    n_params = sum(int(v.size) for v in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))
    stateful = takes_state(model)
    if stateful:
        @eqx.filter_jit
        def eval_step(model, state, *inputs):
            return jax.vmap(lambda *xs: model(*xs, state)[0], axis_name="batch")(*inputs)

        inference = eqx.nn.inference_mode(model)
        forward = lambda: jax.block_until_ready(eval_step(inference, state, x))
        lower_forward = lambda: eval_step.lower(inference, state, x)
    else:
        @eqx.filter_jit
        def eval_step(model, *inputs):
            return jax.vmap(model)(*inputs)

        inference = eqx.nn.inference_mode(model)
        forward = lambda: jax.block_until_ready(eval_step(inference, x))
        lower_forward = lambda: eval_step.lower(inference, x)

    tx = adamw()
    model = eqx.nn.inference_mode(model, False)
    opt_state = tx.init(eqx.filter(model, eqx.is_array))

    def keys(key, xb):
        return {"key": jax.random.split(key, xb.shape[0])} if spec.dropout else {}

    @eqx.filter_jit
    def train_step(model, state, opt_state, xb, yb, key):
        if stateful:
            def loss_fn(model, state):
                logits, state = jax.vmap(model, axis_name="batch", in_axes=(0, None),
                                         out_axes=(0, None))(xb, state, **keys(key, xb))
                return jax_loss(logits, yb), state

            (loss, state), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model, state)
        else:
            def loss_fn(model):
                return jax_loss(jax.vmap(model)(xb, **keys(key, xb)), yb)

            loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = tx.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, opt_state, loss

    box = [model, state, opt_state, jax.random.key(1)]

    def train() -> object:
        box[3], key = jax.random.split(box[3])
        box[0], box[1], box[2], loss = train_step(box[0], box[1], box[2], x, y, key)
        return jax.block_until_ready(loss)

    return Side(forward, train, n_params, {
        "forward": lower_forward,
        "train": lambda: train_step.lower(model, state, opt_state, x, y, jax.random.key(1))})


class _Namespace:
    """A module-like view of a dict (build_equinox_model reads ``vars(module)``)."""

    def __init__(self, namespace: dict) -> None:
        self.__dict__.update(namespace)


def adamw() -> object:
    import optax

    return optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01)


def run_target(target: str, key: str, reps: int, slot: float, tmp: Path
               ) -> tuple[dict[str, dict[str, float]], list[str]]:
    import copy

    spec = SPECS[key]
    torch_model = build_torch(key)
    batch = make_batch(spec, seed=0)
    sides, notes = target_sides(target, key, torch_model, batch, tmp)
    fwd = {"torch": torch_forward(torch_model, batch["tx"])}
    fwd.update({name: side.forward for name, side in sides.items()})
    results = {"forward": round_robin(fwd, reps, slot)}
    train = {"torch": torch_train(copy.deepcopy(torch_model), batch["tx"], batch["ty"])}
    train.update({name: side.train for name, side in sides.items()})
    results["train"] = round_robin(train, reps, slot)
    return results, notes


def hlo_counts(lowered: object) -> dict[str, int]:
    """Instruction counts of the optimized (compiled) HLO module: every instruction of every
    computation, and the transposes, copies and fusions among them."""
    import re

    lowered = getattr(lowered, "lowered", lowered)  # equinox's Lowered wraps jax's
    text = lowered.compile().as_text()
    ops = re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = \S+ ([\w\-]+)\(", text, re.MULTILINE)
    return {"instructions": len(ops), "transposes": ops.count("transpose"),
            "copies": ops.count("copy"), "fusions": ops.count("fusion")}


def print_hlo(target: str, models: list[str], tmp: Path) -> None:
    """--hlo: the compiled programs of the converted and reference steps (no timing)."""
    print(f"\n## {target}: optimized HLO of the forward and train steps\n")
    print("| model | phase | side | instructions | transposes | copies | fusions |")
    print("|---|---|---|---|---|---|---|")
    for key in models:
        torch_model = build_torch(key)
        sides, _ = target_sides(target, key, torch_model, make_batch(SPECS[key], 0), tmp)
        for phase in ("forward", "train"):
            for name, side in sides.items():
                c = hlo_counts(side.lower[phase]())
                print(f"| {key} | {phase} | {name} | {c['instructions']} | {c['transposes']} "
                      f"| {c['copies']} | {c['fusions']} |", flush=True)


def print_target_table(target: str, all_results: dict, notes: list[str], threads: str) -> None:
    print(f"\n## {target}, threads: {threads}\n")
    print("| model | phase | torch ms | converted ms | reference ms | converted/reference "
          "| torch/converted | torch/reference |")
    print("|---|---|---|---|---|---|---|---|")
    for key, phases in all_results.items():
        for phase, t in phases.items():
            tor, ref = t["torch"], t["reference"]
            if "converted" in t:
                conv = t["converted"]
                c = f"{conv:.3f} | {ref:.3f} | {conv / ref:.2f} | {tor / conv:.2f}"
            else:
                c = f"not converted | {ref:.3f} | - | -"
            print(f"| {key} | {phase} | {tor:.3f} | {c} | {tor / ref:.2f} |")
    for note in notes:
        print(f"\n* {note}")


# --- timing ----------------------------------------------------------------------------------


def round_robin(fns: dict[str, Callable[[], object]], reps: int, slot: float) -> dict[str, float]:
    """Median per-call milliseconds of each function, the functions interleaved."""
    calls = {}
    for name, fn in fns.items():  # compile and warm up, then size the slot
        fn()
        fn()
        t0 = time.perf_counter()
        fn()
        calls[name] = max(1, round(slot / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    wall0, cpu0 = time.perf_counter(), _cpu_seconds()
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:  # rotate the order
            fn, n = fns[name], calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e3)
    TIMED[0] += time.perf_counter() - wall0
    TIMED[1] += _cpu_seconds() - cpu0
    return {name: statistics.median(v) for name, v in times.items()}


def run_model(key: str, reps: int, slot: float, tmp: Path) -> dict[str, dict[str, float]]:
    import copy

    spec = SPECS[key]
    torch_model, converted, reference = build_models(key, tmp)
    batch = make_batch(spec, seed=0)
    results = {}
    fwd = {"torch": torch_forward(torch_model, batch["tx"])}
    for p in PATTERNS:
        fwd[f"converted {p}"] = jax_forward(fresh(converted), batch["jx"], p)
        fwd[f"reference {p}"] = jax_forward(fresh(reference), batch["jx_ref"], p)
    results["forward"] = round_robin(fwd, reps, slot)
    train = {"torch": torch_train(copy.deepcopy(torch_model), batch["tx"], batch["ty"])}
    for p in PATTERNS:
        train[f"converted {p}"] = jax_train(fresh(converted), batch["jx"], batch["jy"], p)
        train[f"reference {p}"] = jax_train(fresh(reference), batch["jx_ref"], batch["jy"], p)
    results["train"] = round_robin(train, reps, slot)
    return results


def fresh(model: object) -> object:
    """A copy of ``model`` with its own buffers (the split pattern donates its state)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda a: jnp.array(a, copy=True), state))


def print_table(all_results: dict[str, dict[str, dict[str, float]]], threads: str) -> None:
    print(f"\n## threads: {threads}\n")
    print("| model | phase | torch ms | converted ms | reference ms | converted/reference "
          "| torch/converted | converted split ms | converted cached ms | reference split ms "
          "| split conv/ref | converted tree ms | reference tree ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, phases in all_results.items():
        for phase, t in phases.items():
            conv, ref, tor = t["converted nnx.jit"], t["reference nnx.jit"], t["torch"]
            print(f"| {key} | {phase} | {tor:.3f} | {conv:.3f} | {ref:.3f} | {conv / ref:.2f} "
                  f"| {tor / conv:.2f} | {t['converted split']:.3f} "
                  f"| {t['converted cached']:.3f} | {t['reference split']:.3f} "
                  f"| {t['converted split'] / t['reference split']:.2f} "
                  f"| {t['converted tree']:.3f} | {t['reference tree']:.3f} |")


def child(args: argparse.Namespace) -> None:
    RUN["device"], RUN["batch_scale"] = args.device, args.batch_scale
    if args.device == "cuda":
        import jax
        import torch

        if jax.default_backend() != "gpu" or not torch.cuda.is_available():
            raise SystemExit(f"--device cuda: jax backend {jax.default_backend()}, "
                             f"torch cuda {torch.cuda.is_available()}")
        print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}, torch "
              f"{torch.__version__} on {torch.cuda.get_device_name()}", file=sys.stderr)
    if args.threads == "1":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + ONE_THREAD_XLA).strip()
    import torch

    if args.threads == "1":
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    else:
        torch.set_num_threads(os.cpu_count() or 1)
    sys.path.insert(0, str(ROOT))
    if args.hlo:
        with tempfile.TemporaryDirectory(prefix="torch2jax-bench-") as tmp:
            for target in args.targets:
                if target != "nnx":
                    print_hlo(target, args.models, Path(tmp))
        return
    for target in args.targets:
        results, notes = {}, []
        TIMED[:] = [0.0, 0.0]
        with tempfile.TemporaryDirectory(prefix="torch2jax-bench-") as tmp:
            for key in args.models:
                t0 = time.perf_counter()
                if target == "nnx":
                    results[key] = run_model(key, args.reps, args.slot, Path(tmp))
                else:
                    results[key], more = run_target(target, key, args.reps, args.slot, Path(tmp))
                    notes += more
                print(f"{target} {key}: {time.perf_counter() - t0:.1f} s", file=sys.stderr,
                      flush=True)
        wall, cpu = TIMED
        if args.device == "cuda":
            threads = f"GPU ({torch.cuda.get_device_name()}), batch x{args.batch_scale}"
        else:
            threads = (f"{args.threads} (torch {torch.get_num_threads()}, CPU time / wall time "
                       f"in the timed loops {cpu / wall:.2f}, {os.cpu_count()} cores)")
        if target == "nnx":
            print_table(results, threads)
        else:
            print_target_table(target, results, notes, threads)


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", choices=("1", "all", "both"), default="both")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=["nnx"],
                        help="converted code and hand-written reference of these targets")
    parser.add_argument("--reps", type=int, default=5, help="round-robin repetitions")
    parser.add_argument("--slot", type=float, default=0.05,
                        help="seconds of calls per contestant per repetition")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: torch on CUDA, JAX on its GPU backend, one process")
    parser.add_argument("--batch-scale", type=int, default=1, help="multiply every batch")
    parser.add_argument("--hlo", action="store_true",
                        help="linen / equinox: print the compiled programs' instruction counts "
                        "instead of timing")
    args = parser.parse_args()
    if args.threads != "both" or args.hlo or args.device == "cuda":
        child(args)
        return
    import jax
    import torch

    print(f"jax {jax.__version__}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"backend {jax.default_backend()}")
    for threads in ("1", "all"):
        cmd = [sys.executable, __file__, "--threads", threads, "--reps", str(args.reps),
               "--slot", str(args.slot), "--batch-scale", str(args.batch_scale),
               "--models", *args.models, "--targets", *args.targets]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
