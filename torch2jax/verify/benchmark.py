"""Forward-pass timing for ``torch2jax verify --benchmark``.

Both models have already been built, given the same weights and compared; this module times
their forward passes on the same inputs:

* torch: the model in eval mode under ``torch.no_grad()``, eager;
* JAX: ``nnx.split`` once, then a ``jax.jit`` function of the state that ``nnx.merge``\\ s the
  model and calls it (the verifier's own calling pattern), each call blocked on with
  ``jax.block_until_ready``.

Timing is round-robin: after compilation and warm-up calls (not timed), each repetition runs
the torch side and the JAX side in turn, each for about ``slot`` seconds of calls; the reported
times are the medians over the repetitions of the mean per-call time. ``speed_ratio`` is
``torch_ms / jax_ms``: above 1, the JAX model is faster.

The numbers describe this process on this machine: torch uses ``torch.get_num_threads()``
threads and XLA its own default (set ``XLA_FLAGS`` before the run to change it); the JAX side
runs on the verifier's device, torch on the CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REPS = 7
SLOT_S = 0.05
WARMUP = 2


@dataclass
class ForwardTiming:
    jax_ms: float
    torch_ms: float
    reps: int

    @property
    def speed_ratio(self) -> float:
        return self.torch_ms / self.jax_ms


def round_robin(
    fns: dict[str, Callable[[], Any]], reps: int = REPS, slot: float = SLOT_S,
    warmup: int = WARMUP,
) -> dict[str, float]:
    """Median per-call milliseconds of each function (each call must block until its result
    is ready), the functions interleaved and the order rotated every repetition; ``warmup``
    calls first (compilation included), then one timed call sizes each one's slot."""
    calls = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        t0 = time.perf_counter()
        fn()
        calls[name] = max(1, round(slot / max(time.perf_counter() - t0, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            fn, n = fns[name], calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def time_forward(
    torch_model: Any, torch_inputs: list[Any], jax_model: Any, jax_inputs: list[Any],
    reps: int = REPS, slot: float = SLOT_S,
) -> ForwardTiming:
    import jax
    import torch
    from flax import nnx

    graphdef, state = nnx.split(jax_model)

    @jax.jit
    def forward(state: Any, xs: list[Any]) -> Any:
        return nnx.merge(graphdef, state)(*xs)

    def run_jax() -> Any:
        return jax.block_until_ready(forward(state, jax_inputs))

    def run_torch() -> Any:
        with torch.no_grad():
            return torch_model(*torch_inputs)

    medians = round_robin({"jax": run_jax, "torch": run_torch}, reps, slot)
    return ForwardTiming(medians["jax"], medians["torch"], reps)


def benchmark_forward(
    r: Any, torch_model: Any, torch_inputs: list[Any], jax_model: Any, jax_inputs: list[Any]
) -> None:
    """Time both forward passes and record ``jax_ms``, ``torch_ms``, ``speed_ratio`` and a
    note on ``r`` (a :class:`~torch2jax.verify.run.VerifyResult`)."""
    import torch

    t = time_forward(torch_model, torch_inputs, jax_model, jax_inputs)
    r.jax_ms, r.torch_ms, r.speed_ratio = t.jax_ms, t.torch_ms, t.speed_ratio
    r.notes.append(
        f"benchmark (forward, median of {t.reps} round-robin repetitions, compile and warm-up "
        f"excluded): JAX {t.jax_ms:.3f} ms on {r.device}, torch {t.torch_ms:.3f} ms eager on "
        f"cpu with {torch.get_num_threads()} threads; torch/JAX = {t.speed_ratio:.2f}"
    )


def summary_line(r: Any) -> str | None:
    """The text output's line for a benchmarked result (None when it was not benchmarked)."""
    if getattr(r, "speed_ratio", None) is None:
        return None
    label = r.name or r.model
    return (f"{label}: forward JAX {r.jax_ms:.3f} ms, torch {r.torch_ms:.3f} ms, "
            f"speed ratio (torch/JAX) {r.speed_ratio:.2f}")
