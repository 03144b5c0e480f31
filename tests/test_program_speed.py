"""Converted programs run like hand-written JAX (issue 20): one compiled step per iteration.

Every training fixture's loop calls one ``jax.jit`` step of the split/merge form (the model
and optimizer state split once before the loop, donated to each step, written back after
it), not ``nnx.jit``, which walks the module graph in Python on every call. Run as a user
would, the converted GPT fixture compiles its step exactly once (one input shape) and prints
losses that fall like torch's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torch2jax.convert import convert_source

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "fixtures" / "training"
SCRIPTS = sorted(TRAINING.glob("*.py"))
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def converted() -> dict[str, str]:
    return {p.stem: convert_source(p.read_text(), path=str(p)).code for p in SCRIPTS}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_training_step_is_one_jax_jit_of_the_split_state(path: Path, converted) -> None:
    code = converted[path.stem]
    assert re.search(r"@partial\(jax\.jit, static_argnums=0, donate_argnums=1\)\n\s*"
                     r"def train_step\(graphdef, train_state, ", code)
    assert not re.search(r"@nnx\.jit.*\n\s*def train_step", code)
    step = code[code.index("def train_step("):]
    assert "nnx.merge(graphdef, train_state)" in step
    assert re.search(r"graphdef, train_state = nnx\.split\(\(\w+, \w+\)\)", code)
    assert re.search(r"nnx\.update\(\(\w+, \w+\), train_state\)", code)
    # between steps the loop reads only the step's results and the split state
    loop_call = re.findall(r"train_state, [\w, ]+ = train_step\(graphdef, train_state", code)
    assert len(loop_call) == 1


def _run(script: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_converted_gpt_compiles_its_step_once_and_its_loss_falls_like_torch(
        converted, tmp_path: Path) -> None:
    script = tmp_path / "gpt_param_groups.py"
    script.write_text(converted["gpt_param_groups"])
    jax_run = _run(script, tmp_path, JAX_LOG_COMPILES="1")
    compiles = re.findall(r"Compiling jit\(train_step\)", jax_run.stdout + jax_run.stderr)
    assert len(compiles) == 1, compiles  # 300 steps, one batch shape
    torch_run = _run(TRAINING / "gpt_param_groups.py", tmp_path)
    jax_losses = [(int(s), float(v)) for s, v in LOSS.findall(jax_run.stdout)]
    torch_losses = [(int(s), float(v)) for s, v in LOSS.findall(torch_run.stdout)]
    # logged at torch's interval, no more often
    assert [s for s, _ in jax_losses] == [s for s, _ in torch_losses] == list(range(0, 300, 50))
    # different random streams (data and initial weights): the same curve within noise
    for (step, j), (_, t) in zip(jax_losses, torch_losses):
        assert abs(j - t) <= 0.15 + 0.1 * t, (step, j, t)
    assert jax_losses[-1][1] < 0.2 * jax_losses[0][1]
