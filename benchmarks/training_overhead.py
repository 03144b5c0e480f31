"""Overhead of the emitted training loops around their jit-compiled step.

Runs each converted training script in fixtures/expected/nnx/training/ (or the files given)
as ``__main__`` in this process, with light instrumentation and no change to the script:

* **compilations**: ``jax_log_compiles`` is switched on and the "Compiling NAME" records are
  counted per function name (``train_step`` and ``eval_step`` compiled more than once per
  input shape would be retracing);
* **host syncs**: calls of the ``jax.Array`` methods that copy a value to the host
  (``.item()``, ``float()``, ``bool()``, f-string formatting, ``np.asarray``, ``tolist``)
  from the first ``train_step`` call on (the evaluation after training included);
* **time per step**: the mean interval between consecutive ``train_step`` calls as the script
  runs them (from the third call on, so compilation is excluded), next to the time of the same
  compiled step called back to back on the last batch it saw (the best of 5 blocks of
  ``--repeat``/5 calls, each block blocked on at its end). The difference is what the loop spends outside the step: eager JAX ops on the
  host (batch gathers, key splits, schedules), Python, and syncs.

    python benchmarks/training_overhead.py
    python benchmarks/training_overhead.py fixtures/expected/nnx/training/gpt_param_groups.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import runpy
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYNC_METHODS = ("item", "tolist", "__array__", "__float__", "__int__", "__bool__", "__index__",
                "__format__")
SCRIPTS = sorted((ROOT / "fixtures/expected/nnx/training").glob("*.py"))


class CompileCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Compiling "):
            name = msg.split()[1]  # jit(train_step)
            self.counts[name.removeprefix("jit(").removesuffix(")")] += 1


def measure(script: Path, repeat: int) -> dict:
    import jax
    import jax._src.array as jax_array
    from flax import nnx

    calls: list[float] = []
    last: dict = {}
    syncs = {"in_loop": 0, "depth": 0}
    originals = {name: getattr(jax_array.ArrayImpl, name) for name in SYNC_METHODS}

    def counting(method):
        def wrapper(self, *args, **kwargs):
            if calls and not syncs["depth"]:
                syncs["in_loop"] += 1
            syncs["depth"] += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                syncs["depth"] -= 1

        return wrapper

    real_jit, real_jax_jit = nnx.jit, jax.jit

    def instrument(real, functional: bool):
        """``real`` (nnx.jit, or jax.jit for the functional form) with train_step timed."""

        def jit(fun=None, **kw):
            if fun is None:
                return lambda f: jit(f, **kw)
            jitted = real(fun, **kw)
            if getattr(fun, "__name__", "") != "train_step":
                return jitted

            def wrapper(*args):
                calls.append(time.perf_counter())
                out = jitted(*args)
                last["fn"], last["args"], last["out"] = jitted, args, out
                last["functional"] = functional
                return out

            return wrapper

        return jit

    handler = CompileCounter()
    loggers = [logging.getLogger("jax")]  # the records of jax._src.* propagate to it
    for lg in loggers:
        lg.addHandler(handler)
    for name, method in originals.items():
        setattr(jax_array.ArrayImpl, name, counting(method))
    nnx.jit = instrument(real_jit, False)
    jax.jit = instrument(real_jax_jit, True)
    out = io.StringIO()
    try:
        with jax.log_compiles(True), contextlib.redirect_stdout(out):
            t0 = time.perf_counter()
            runpy.run_path(str(script), run_name="__main__")
            total = time.perf_counter() - t0
    finally:
        nnx.jit, jax.jit = real_jit, real_jax_jit
        for name, method in originals.items():
            setattr(jax_array.ArrayImpl, name, method)
        for lg in loggers:
            lg.removeHandler(handler)
    steps = len(calls)
    loop_syncs = syncs["in_loop"] if steps else 0
    interval = (calls[-1] - calls[2]) / (steps - 3) * 1e3 if steps > 4 else float("nan")
    fn, args = last["fn"], last["args"]
    if last["functional"]:
        # train_step(graphdef, state, *batch) -> (state, loss, ...): the state was donated,
        # so each call takes the state the previous one returned
        box = [last["out"][0]]

        def step():
            out = fn(args[0], box[0], *args[2:])
            box[0] = out[0]
            return out[1]
    else:
        def step():
            return fn(*args)
    jax.block_until_ready(step())
    blocks = []
    for _ in range(5):  # the best of 5 blocks: the machine may be shared
        t0 = time.perf_counter()
        for _ in range(repeat // 5):
            loss = step()
        jax.block_until_ready(loss)
        blocks.append((time.perf_counter() - t0) / (repeat // 5) * 1e3)
    bare = min(blocks)
    return {
        "script": script.name, "steps": steps, "total_s": total,
        "compiles": {k: v for k, v in handler.counts.items() if k in ("train_step", "eval_step")},
        "eager_compiles": sum(v for k, v in handler.counts.items()
                              if k not in ("train_step", "eval_step")),
        "syncs_per_step": loop_syncs / max(steps, 1), "loop_ms": interval, "step_ms": bare,
        "output_tail": out.getvalue().strip().splitlines()[-1:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scripts", nargs="*", type=Path, default=SCRIPTS)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print("| script | steps | train_step / eval_step compiles | other compiles | host syncs "
          "per step in the loop | loop ms/step | bare step ms | outside the step |")
    print("|---|---|---|---|---|---|---|---|")
    for script in args.scripts:
        r = measure(script, args.repeat)
        c = r["compiles"]
        print(f"| {r['script']} | {r['steps']} | {c.get('train_step', 0)} / "
              f"{c.get('eval_step', 0)} | {r['eager_compiles']} | {r['syncs_per_step']:.2f} "
              f"| {r['loop_ms']:.3f} | {r['step_ms']:.3f} "
              f"| {r['loop_ms'] - r['step_ms']:+.3f} ms ({r['loop_ms'] / r['step_ms']:.2f}x) |",
              flush=True)


if __name__ == "__main__":
    main()
