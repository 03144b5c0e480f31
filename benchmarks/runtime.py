"""Runtime of converted models next to hand-written flax NNX and PyTorch eager.

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


SPECS = {
    "mlp": Spec(ROOT / "fixtures/models/mlp.py", "MLP", "MLP()", 64, (784,)),
    "cnn": Spec(ROOT / "fixtures/models/cnn.py", "CNN", "CNN()", 32, (3, 32, 32), nhwc=True),
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
    import torch
    from flax import nnx

    from torch2jax.convert import convert_source
    from torch2jax.verify.load import load_module
    from torch2jax.weights import transfer_state_dict

    spec = SPECS[key]
    torch.manual_seed(0)
    torch_module = load_module(spec.torch_file, prefix="bench_torch")
    torch_model = _eval(spec.build, vars(torch_module))
    if RUN["device"] != "cpu":
        torch_model = torch_model.to(RUN["device"])

    out = convert_source(spec.torch_file.read_text(), path=str(spec.torch_file))
    errors = [d for d in out.diagnostics if d.severity == "error"]
    if errors:
        raise SystemExit(f"{spec.torch_file}: the conversion left {len(errors)} errors")
    converted_file = tmp / f"{key}_converted.py"
    converted_file.write_text(out.code)
    jax_module = load_module(converted_file, prefix="bench_converted")
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
    results = {}
    with tempfile.TemporaryDirectory(prefix="torch2jax-bench-") as tmp:
        for key in args.models:
            t0 = time.perf_counter()
            results[key] = run_model(key, args.reps, args.slot, Path(tmp))
            print(f"{key}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    wall, cpu = TIMED
    if args.device == "cuda":
        print_table(results, f"GPU ({torch.cuda.get_device_name()}), batch x{args.batch_scale}")
        return
    print_table(results, f"{args.threads} (torch {torch.get_num_threads()}, "
                         f"CPU time / wall time in the timed loops {cpu / wall:.2f}, {os.cpu_count()} cores)")


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", choices=("1", "all", "both"), default="both")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--reps", type=int, default=5, help="round-robin repetitions")
    parser.add_argument("--slot", type=float, default=0.05,
                        help="seconds of calls per contestant per repetition")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: torch on CUDA, JAX on its GPU backend, one process")
    parser.add_argument("--batch-scale", type=int, default=1, help="multiply every batch")
    args = parser.parse_args()
    if args.threads != "both" or args.device == "cuda":
        child(args)
        return
    import jax
    import torch

    print(f"jax {jax.__version__}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"backend {jax.default_backend()}")
    for threads in ("1", "all"):
        cmd = [sys.executable, __file__, "--threads", threads, "--reps", str(args.reps),
               "--slot", str(args.slot), "--batch-scale", str(args.batch_scale),
               "--models", *args.models]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
