"""benchmarks/programs.py's compile-cost line: CompileClock counts a program's XLA compiles
and sums the time it spent tracing, lowering and compiling, from jax's monitoring events.
Counts only; no assertion on a time beyond its being spent (speed is measured in
benchmarks/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def programs():
    spec = importlib.util.spec_from_file_location("bench_programs", ROOT / "benchmarks/programs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_jitted_function_with_a_nested_jit_is_one_compile_per_shape(programs) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    clock = programs.CompileClock(cpu_time=True)
    try:
        inner = jax.jit(lambda x: jnp.tanh(x) * 3)
        outer = jax.jit(lambda x: inner(x) + inner(x * 2).sum())
        outer(np.ones((3, 7), np.float32)).block_until_ready()
        assert clock.compiles == 1 and clock.seconds > 0
        first = clock.seconds
        outer(
            np.zeros((3, 7), np.float32)
        ).block_until_ready()  # the same shape: nothing traced again
        assert (clock.compiles, clock.seconds) == (1, first)
        outer(np.ones((5, 7), np.float32)).block_until_ready()
        assert clock.compiles == 2 and clock.seconds > first
        clock.reset()
        assert (clock.compiles, clock.seconds) == (0, 0.0)
    finally:
        clock.close()


def test_a_run_reports_its_metric_and_the_clock_its_compiles(programs, tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(
        "import jax, jax.numpy as jnp\n"
        "step = jax.jit(lambda x: x @ x.T)\n"
        "for n in (4, 6, 4):\n"
        "    step(jnp.ones((n, 11))).block_until_ready()\n"
        "print('tokens_per_s=123.5')\n"
    )
    clock = programs.CompileClock(cpu_time=False)
    try:
        value, err = programs._run(script, {}, cpu_time=True, compile_clock=clock)
        assert (value, err) == (123.5, "")
        assert clock.compiles >= 2  # the two shapes (and jnp.ones' own, if not yet compiled)
        compiles = clock.compiles
        value, _ = programs._run(script, {}, compile_clock=clock)  # new function objects
        assert value == 123.5 and clock.compiles == 2 <= compiles
    finally:
        clock.close()
