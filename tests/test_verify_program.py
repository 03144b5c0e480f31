"""``verify --program``: the torch program and its converted program, run side by side.

The program is the nanoGPT-shaped fixture (two AdamW parameter groups, decay for tensors of
rank 2 or more, a LambdaLR warmup-cosine schedule, gradient clipping, prints). Its torch side
runs once (two optimizer steps); the converted program then runs from the torch side's start,
as converted and with a bug seeded into the converted text: the weight-decay mask off, the
weight decay halved, the schedule one step ahead, a print dropped. The right conversion passes
every comparison; each seeded bug is reported as a mismatch naming what differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "fixtures" / "training" / "gpt_param_groups.py"
STEPS = 2
# the tensors of rank >= 2: torch's decay group (wte and lm_head are one tied tensor)
DECAYED = {"wte.weight", "wpe.weight"} | {
    f"h.{i}.{name}.weight" for i in range(2)
    for name in ("attn.c_attn", "attn.c_proj", "mlp.0", "mlp.2")}


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("program")
    convert_tree(PROGRAM, tmp / "converted", "nnx", None)
    converted = (tmp / "converted" / PROGRAM.name).read_text()
    torch_rec = torch_side(PROGRAM, STEPS, [], tmp / "torch.pkl")
    return tmp, converted, torch_rec


def run(sides: tuple[Path, str, dict], name: str, *edits: tuple[str, str]) -> ProgramResult:
    """The converted program with ``edits`` (old, new: each old text once) run from the torch
    side's start, compared with the torch side."""
    tmp, converted, torch_rec = sides
    for old, new in edits:
        assert converted.count(old) == 1, old
        converted = converted.replace(old, new)
    path = tmp / f"{name}.py"
    path.write_text(converted)
    jax_rec = jax_side(path, tmp / "torch.pkl", STEPS, [], tmp / f"{name}.pkl")
    r = ProgramResult(str(PROGRAM), str(path), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


def kinds(r: ProgramResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in r.checks:
        out[c.kind] = out.get(c.kind, 0) + 1
    return out


def test_the_conversion_computes_what_the_program_computes(sides):
    r = run(sides, "as_converted")
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    # every kind was compared: 2 losses, 2 steps x 2 groups of lr, 28 parameters (the tied
    # lm_head is wte), their Adam moments, the decay probe, the two printed lines
    assert kinds(r) == {"loss": STEPS, "lr": 2 * STEPS, "param": 28, "opt_state": 56,
                        "decay": 28, "print": 2}
    decayed = {c.name for c in r.checks if c.kind == "decay" and c.detail.startswith("decay")}
    assert decayed == DECAYED
    assert "inputs replayed: 4 arrays over 2 torch forward calls" in r.notes


def test_decay_off_schedule_ahead_and_a_dropped_print_are_each_named(sides):
    """Three bugs seeded at once, each seen by its own comparison (one JAX run, for CI
    time): the decay mask matches no tensor, the schedule is one step ahead after the first
    step, the loss print is gone."""
    r = run(sides, "three_bugs", ("lambda p: p.ndim >= 2", "lambda p: p.ndim >= 3"),
            ("scheduler(scheduler_steps))", "scheduler(scheduler_steps + 1))"),
            ('print(f"step {step} loss {loss.item():.4f}")', "pass"))
    assert not r.passed
    assert {c.name for c in r.failures("decay")} == DECAYED
    assert all("in torch only" in c.detail for c in r.failures("decay"))
    # step 1 runs at the initial rate (set before the loop), step 2 at the schedule's
    assert [c.name for c in r.failures("lr")] == ["step 2 group 0", "step 2 group 1"]
    assert [c.name for c in r.failures("print")] == ["line 2"]
    # the losses come before each update: the second step's rate shows in the parameters only
    assert not r.failures("loss") and r.failures("param")


def test_a_different_weight_decay_is_caught(sides):
    r = run(sides, "wd_half", ("weight_decay=weight_decay,", "weight_decay=weight_decay * 0.5,"))
    assert {c.name for c in r.failures("decay")} == DECAYED
    assert "decay torch 0.1, JAX 0.05" in r.failures("decay")[0].detail
    # a decay of lr * wd * p (1e-5 p per step here) is invisible in two steps' losses and
    # parameters: the probe is what sees it
    assert not r.failures("lr") and not r.failures("print")
    assert not r.failures("loss") and not r.failures("param")


def test_cli_program_mode(tmp_path):
    result = CliRunner().invoke(app, ["verify", "--program", str(PROGRAM), "--steps", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["passed"] and data["steps"] == 1
    assert {c["kind"] for c in data["checks"]} == {"loss", "lr", "param", "opt_state", "decay",
                                                    "print"}
