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

One optimizer over both models' parameters (``Adam(list(encoder.parameters()) +
list(decoder.parameters()))``, the tutorial's other spelling) was marked; it is now
``nnx.Optimizer((encoder, decoder), ...)``, the loss differentiated with respect to both. A
clipping of both models' parameters together is the chain's global norm; each model clipped
apart is marked (before, the loop's two clippings were both given to the first optimizer).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from program_cases import converted_program, edited

from torch2jax.verify.program import verify_program
from torch2jax.verify.run import convert_tree

STEPS = 6  # teacher forcing on and off among them (random.seed(0))

# one optimizer over both models' parameters (a list of both, clipped together by a chain)
ONE_OPTIMIZER = [
    ("import random\n", "import itertools\nimport random\n"),
    ("encoder, decoder, encoder_optimizer, decoder_optimizer, criterion, batch_size=8):",
     "encoder, decoder, optimizer, criterion, batch_size=8):"),
    ("        encoder_optimizer.zero_grad()\n        decoder_optimizer.zero_grad()\n",
     "        optimizer.zero_grad()\n"),
    ("        encoder_optimizer.step()\n        decoder_optimizer.step()\n",
     ("        torch.nn.utils.clip_grad_norm_(\n"
      "            itertools.chain(encoder.parameters(), decoder.parameters()), 0.5)\n"
      "        optimizer.step()\n")),
    (("    encoder_optimizer = optim.Adam(encoder.parameters(), lr=0.01)\n"
      "    decoder_optimizer = optim.Adam(decoder.parameters(), lr=0.01)\n"),
     ("    optimizer = optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), "
      "lr=0.01)\n")),
    ("encoder, decoder, encoder_optimizer, decoder_optimizer, criterion)",
     "encoder, decoder, optimizer, criterion)"),
]


# ... with the batches taken by a while loop (its test, xs.size(0), translated too)
WHILE_LOOP = [
    ("    for start in range(0, xs.size(0), batch_size):\n",
     "    start = 0\n    while start < xs.size(0):\n"),
    ("        total_loss += loss.item()\n",
     "        total_loss += loss.item()\n        start += batch_size\n"),
]


def _variant(replacements) -> str:
    return edited("seq2seq_teacher.py", replacements)


@pytest.mark.parametrize("variant", [[], ONE_OPTIMIZER, ONE_OPTIMIZER + WHILE_LOOP],
                         ids=["tutorial", "one-optimizer", "one-optimizer-while"])
def test_two_models_and_teacher_forcing_run_as_torch(tmp_path, monkeypatch, variant):
    program, converted, text = converted_program(tmp_path, monkeypatch, "seq2seq_teacher.py",
                                                 _variant(variant))
    assert "TODO(torch2jax)" not in text
    assert "static_argnames=('use_teacher_forcing'," in text  # (and the hoisted step's criterion)
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert len([c for c in r.checks if c.kind == "loss"]) == STEPS
    assert any(n.startswith("program draws replayed: 1 of the 1 ") for n in r.notes), r.notes
    assert "other models given torch's initial weights: DecoderRNN" in r.notes
    if variant:
        assert "nnx.Optimizer(\n        (encoder, decoder)," in text
        assert "optimizer.update((encoder, decoder), grads)" in text
        assert "optax.clip_by_global_norm(0.5)" in text


def test_each_models_gradients_clipped_apart_under_one_optimizer_are_marked(tmp_path):
    """Clipping each model's gradients to its own norm is not one clipping of the joint
    optimizer's chain: the optimizer is marked, not given a global norm over both."""
    source = _variant([*ONE_OPTIMIZER[:3], (
        ONE_OPTIMIZER[3][0],
        ("        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 0.5)\n"
         "        torch.nn.utils.clip_grad_norm_(decoder.parameters(), 0.5)\n"
         "        optimizer.step()\n")), *ONE_OPTIMIZER[4:]])
    program = tmp_path / "seq2seq_teacher.py"
    program.write_text(source)
    assert convert_tree(program, tmp_path / "out", "nnx", None) != 0  # (TODOs left)
    text = (tmp_path / "out" / "seq2seq_teacher.py").read_text()
    assert "TODO(torch2jax): the gradients of some of the models the optimizer holds " \
        "clipped apart" in text
    assert "clip_by_global_norm" not in text


def test_only_the_python_values_deciding_the_step_are_static():
    """A name that is an operand of a test is static; one tested with ``is None`` or read
    through an attribute, a subscript or a call (a batch's ``x.shape[0]``, ``len(y)``, static
    under a trace already) stays a traced argument."""
    import libcst as cst

    from torch2jax.passes.training import python_conditions

    body = cst.parse_module(
        "if flag and not other:\n    pass\n"
        "if x.shape[0] > 1 or len(y) > 2:\n    pass\n"
        "if mask is not None:\n    pass\n"
        "z = a if b < 3 else c\n").body
    assert python_conditions(body, ["flag", "other", "x", "y", "mask", "a", "b", "c"]) == [
        "flag", "other", "b"]
