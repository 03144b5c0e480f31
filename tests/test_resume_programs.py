"""A published-shape training script resumed from its checkpoint (tests/data/programs/
resume_spirals.py): the converted program runs with no TODO, and after a run of 4 epochs and a
--resume run to 6 it prints the epochs and learning rates torch prints. The scheduler's
``state_dict()`` / ``load_state_dict()`` carry its count (a resumed run without it would start
the schedule again at 3e-3), and the loader's shuffle seed comes from the ``set_seed(0)``
helper's argument. The losses are not compared: the two sides draw their initial weights from
different generators."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "resume_spirals.py"
METRICS = re.compile(r"^\{'epoch'.*\}$", re.MULTILINE)


def _runs(script: Path, cwd: Path) -> list[dict]:
    out = []
    for args in ([], ["--epochs", "6", "--resume"]):
        done = subprocess.run([sys.executable, str(script), *args], cwd=cwd, text=True, check=False,
                              capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        out += [ast.literal_eval(line) for line in METRICS.findall(done.stdout)]
    return out


def test_resumed_run_prints_torchs_epochs_and_learning_rates(tmp_path):
    result = convert_source(PROGRAM.read_text(), path=PROGRAM.name)
    assert "TODO(torch2jax)" not in result.code
    assert "seed=0 + epoch" in result.code  # set_seed(0)'s argument, not its parameter
    (tmp_path / "torch").mkdir()
    (tmp_path / "jax").mkdir()
    converted = tmp_path / "jax" / PROGRAM.name
    converted.write_text(result.code)
    theirs = _runs(PROGRAM, tmp_path / "torch")
    ours = _runs(converted, tmp_path / "jax")
    assert [m["epoch"] for m in theirs] == [0, 1, 2, 3, 4, 5]
    assert [m["epoch"] for m in ours] == [m["epoch"] for m in theirs]
    assert [m["lr"] for m in ours] == pytest.approx([m["lr"] for m in theirs], rel=1e-6)
