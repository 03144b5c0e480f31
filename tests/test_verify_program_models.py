"""``verify --program`` gives every model of the program torch's initial weights, not only
the one its optimizer trains: a frozen teacher of a distillation program
(``tests/data/programs/distill_teacher.py``) computes the student's targets, so the converted
program's losses equal torch's only when both teachers start from the same weights.

Before, the teacher of the converted program kept its own initialisation and every loss
differed from the first step (0.795 against torch's 0.730): a correct conversion failed. And
the teacher frozen by a loop (``for p in teacher.parameters(): p.requires_grad_(False)``)
before the training loop lost the step's definition (``train_step`` unbound, marked): the
loop's translation skipped the bookkeeping of the loops a step is defined before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("grain")

from torch2jax.verify.program import verify_program
from torch2jax.verify.run import convert_tree

PROGRAMS = Path(__file__).resolve().parent / "data" / "programs"
STEPS = 5  # into the second epoch (4 batches an epoch)


def test_a_frozen_teacher_gets_torchs_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    program = tmp_path / "src" / "distill_teacher.py"
    program.write_text((PROGRAMS / "distill_teacher.py").read_text())
    out = tmp_path / "out"
    assert convert_tree(program, out, "nnx", None) == 0
    converted = out / "distill_teacher.py"
    text = converted.read_text()
    assert "TODO(torch2jax)" not in text and "freeze_parameters(teacher)" in text
    assert text.count("def train_step(") == 1
    # the teacher is called outside the compiled step (its logits are the step's input)
    assert "teacher_logits = eval_step(teacher, inputs)" in text
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert "other models given torch's initial weights: Teacher" in r.notes
    assert len([c for c in r.checks if c.kind == "loss"]) == STEPS
