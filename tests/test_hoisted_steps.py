"""A train step written inside a function that runs once per epoch (``train_epoch(model,
loader, optimizer, criterion)``) or once per batch (a ``step(model, optimizer, criterion, x,
y)`` helper) is compiled once: it is hoisted to the top level with the names it reads from
that function passed in (``criterion``, a class-weight array, a scalar), statics by
``static_argnames`` (passes/hoist_args.py). Before, the step closed over ``criterion`` and
stayed inside the function, a new function compiled again at every epoch, or at every batch.

Each variant of ``tests/data/programs/epoch_function.py`` is converted, run against torch
with ``verify --program`` (losses, parameters and optimizer state step by step), and run
again with jax's compile log: ``train_step`` compiles once over its 3 epochs of 4 batches."""

from __future__ import annotations

import logging
import runpy

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from program_cases import converted_program, edited

from torch2jax.verify.program import verify_program

HELPER = [
    (("        optimizer.zero_grad()\n        loss = criterion(model(x), y)\n"
      "        loss.backward()\n        optimizer.step()\n        total += loss.item()\n"),
     "        total += step(model, optimizer, criterion, x, y)\n"),
    ("def train_epoch(", ("def step(model, optimizer, criterion, x, y):\n"
                          "    optimizer.zero_grad()\n    loss = criterion(model(x), y)\n"
                          "    loss.backward()\n    optimizer.step()\n    return loss.item()\n"
                          "\n\ndef train_epoch(")),
]
VARIANTS = {
    "criterion_per_epoch": [],
    "criterion_per_batch": HELPER,
    # an array (traced) and a scalar (static) read from the function's parameters
    "weights_and_smoothing": [
        ("import torch.nn as nn\n", "import torch.nn as nn\nimport torch.nn.functional as F\n"),
        ("def train_epoch(model, loader, optimizer, criterion):",
         "def train_epoch(model, loader, optimizer, weights, smoothing):"),
        ("        loss = criterion(model(x), y)\n",
         "        loss = F.cross_entropy(model(x), y, weight=weights, label_smoothing=smoothing)\n"),
        ("    criterion = nn.CrossEntropyLoss()\n",
         "    weights = torch.tensor([1.0, 2.0, 0.5])\n"),
        ("train_epoch(model, loader, optimizer, criterion)",
         "train_epoch(model, loader, optimizer, weights, 0.1)"),
    ],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_per_call_step_compiles_once_and_trains_as_torch(tmp_path, monkeypatch, caplog,
                                                             variant):
    program, converted, text = converted_program(
        tmp_path, monkeypatch, "epoch_function.py",
        edited("epoch_function.py", VARIANTS[variant]))
    assert "TODO(torch2jax)" not in text, text
    assert text.index("def train_step(") < text.index("def train_epoch("), text  # hoisted
    r = verify_program(program, converted, steps=12)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert len([c for c in r.checks if c.kind == "loss"]) == 12
    import jax

    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        runpy.run_path(str(converted), run_name="__main__")
    compiled = [r for r in caplog.records if "Compiling jit(train_step)" in r.getMessage()]
    assert len(compiled) == 1, [r.getMessage()[:80] for r in compiled]
