"""A sequence-to-sequence program (``tests/data/programs/seq2seq_teacher.py``, the shape of
PyTorch's seq2seq tutorial) converted and run against torch with ``verify --program``.

Three things stood between it and a user's first run:

- teacher forcing decided per batch (``use_teacher_forcing = random.random() < ratio``) and
  tested inside the loss crashed the compiled step unmarked (a traced bool in an ``if``): a
  name the step's Python control flow tests is now a static argument of the step
  (``static_argnames``), one compilation per value, as one writes it by hand;
- ``verify --program`` counted every ``nnx.Optimizer.update`` as a step: with an encoder's and
  a decoder's optimizer it compared torch's step 2 with JAX's step 1. The first optimizer's
  updates are the steps now, as on the torch side;
- the data drawn by ``torch.randint`` outside any model differed from the JAX program's draws,
  so the losses differed from the first step: the program's draws outside the model's
  forward (and outside module constructors) are replayed in order, where kind, bounds and
  shape agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from torch2jax.verify.program import verify_program
from torch2jax.verify.run import convert_tree

PROGRAMS = Path(__file__).resolve().parent / "data" / "programs"
STEPS = 6  # teacher forcing on and off among them (random.seed(0))

# the updates in the other order, the gradients cleared after them
REORDERED = (
    "        encoder_optimizer.step()\n        decoder_optimizer.step()\n",
    ("        decoder_optimizer.step()\n        encoder_optimizer.step()\n"
     "        encoder_optimizer.zero_grad()\n        decoder_optimizer.zero_grad()\n"))


@pytest.mark.parametrize("variant", [None, REORDERED], ids=["tutorial", "reordered"])
def test_two_models_two_optimizers_and_teacher_forcing_run_as_torch(tmp_path, monkeypatch,
                                                                     variant):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    source = (PROGRAMS / "seq2seq_teacher.py").read_text()
    if variant is not None:
        assert variant[0] in source
        source = source.replace(variant[0], variant[1])
    program = tmp_path / "src" / "seq2seq_teacher.py"
    program.write_text(source)
    out = tmp_path / "out"
    assert convert_tree(program, out, "nnx", None) == 0
    converted = out / "seq2seq_teacher.py"
    text = converted.read_text()
    assert "TODO(torch2jax)" not in text
    assert "static_argnames=('use_teacher_forcing',)" in text
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert len([c for c in r.checks if c.kind == "loss"]) == STEPS
    assert any(n.startswith("program draws replayed: 1 of the 1 ") for n in r.notes), r.notes
    assert "other models given torch's initial weights: DecoderRNN" in r.notes
