"""``verify --program`` compares the optimizer state of optimizers beyond Adam and SGD: each
torch slot against the optax state the converted program keeps (RMSprop centered with momentum:
``square_avg``, ``grad_avg``, ``momentum_buffer`` against ``scale_by_stddev``'s ``nu`` and
``mu`` and ``trace``; Adagrad's ``sum`` against the converter's own transformation's bare
state; Adamax's ``exp_avg``, ``exp_inf`` against ``mu``, ``nu``). A momentum changed in the
converted text is named by its slot and the step it first shows at."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

PROGRAM = Path(__file__).resolve().parent / "data" / "optim" / "state_slots.py"
STEPS = 2
SLOTS = {"rmsprop": {"square_avg", "grad_avg", "momentum_buffer"}, "adagrad": {"sum"},
         "adamax": {"exp_avg", "exp_inf"}}
TENSORS = ("0.weight", "0.bias", "2.weight", "2.bias")


def run(tmp: Path, optimizer: str, *edits: tuple[str, str]) -> ProgramResult:
    convert_tree(PROGRAM, tmp / "converted", "nnx", None)
    converted = tmp / "converted" / PROGRAM.name
    text = converted.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    converted.write_text(text)
    torch_rec = torch_side(PROGRAM, STEPS, [optimizer], tmp / "torch.pkl", cwd=tmp)
    jax_rec = jax_side(converted, tmp / "torch.pkl", STEPS, [optimizer], tmp / "jax.pkl",
                       cwd=tmp)
    r = ProgramResult(str(PROGRAM), str(converted), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", sorted(SLOTS))
def test_every_slot_is_compared(tmp_path, optimizer):
    r = run(tmp_path, optimizer)
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    assert {c.name for c in r.checks if c.kind == "opt_state"} == {
        f"{t} {s}" for t in TENSORS for s in SLOTS[optimizer]}
    assert not any(n.startswith("optimizer state not compared") for n in r.notes)


@pytest.mark.slow
def test_a_different_momentum_is_named_at_its_slot_and_step(tmp_path):
    """optax's trace is the gradient itself after one step, whatever its decay: the momentum
    buffer differs from step 2, and only it and what follows from it."""
    r = run(tmp_path, "rmsprop", ("optax.trace(decay=0.9)", "optax.trace(decay=0.5)"))
    failed = r.failures("opt_state")
    assert {c.name for c in failed} == {f"{t} momentum_buffer" for t in TENSORS}
    assert {c.step for c in failed} == {2}
    assert not r.failures("loss")
