"""``verify --program`` on a schedule the optimizer itself steps (issue 29): OneCycleLR with
``cycle_momentum`` becomes ``optax.inject_hyperparams`` with the learning rate and SGD's
momentum as schedules of the update count. The program (tests/data/optim/one_cycle.py) reads
its total steps from the command line and ``len(loader)``, steps through a GradScaler and
switches autocast on by the device's type: it converts with no TODO, and its conversion
agrees with torch step by step on the loss, the learning rate and momentum each update used,
the parameters, the momentum buffers and the weight decay. A schedule one step ahead is named
at its first step."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

PROGRAM = Path(__file__).resolve().parent / "data" / "optim" / "one_cycle.py"
STEPS = 5


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_cycle")
    todos = convert_tree(PROGRAM, tmp / "converted", "nnx", None)
    converted = tmp / "converted" / PROGRAM.name
    torch_rec = torch_side(PROGRAM, STEPS, [], tmp / "torch.pkl", cwd=tmp)
    return tmp, todos, converted, torch_rec


def _run(records) -> ProgramResult:
    tmp, _todos, target, torch_rec = records
    jax_rec = jax_side(target, tmp / "torch.pkl", STEPS, [], tmp / f"{target.stem}.pkl",
                       cwd=tmp)
    r = ProgramResult(str(PROGRAM), str(target), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


def test_one_cycle_program_matches_torch_step_by_step(records):
    _tmp, todos, converted, _ = records
    text = converted.read_text()
    assert todos == 0 and "TODO(torch2jax)" not in text
    assert "import torch" not in text
    r = _run(records)
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    kinds = {c.kind for c in r.checks}
    assert {"loss", "lr", "param", "opt_state", "decay"} <= kinds
    assert len([c for c in r.checks if c.kind == "lr"]) == STEPS

