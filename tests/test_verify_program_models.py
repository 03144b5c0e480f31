"""``verify --program`` gives every model of the program torch's initial weights, not only
the one its optimizer trains: a frozen teacher of a distillation program
(``tests/data/programs/distill_teacher.py``) computes the student's targets, so the converted
program's losses equal torch's only when both teachers start from the same weights.

Before, the teacher of the converted program kept its own initialisation and every loss
differed from the first step (0.795 against torch's 0.730): a correct conversion failed. And
the teacher frozen by a loop (``for p in teacher.parameters(): p.requires_grad_(False)``)
before the training loop lost the step's definition (``train_step`` unbound, marked): the
loop's translation skipped the bookkeeping of the loops a step is defined before.

Parameters updated through a loop over ``parameters()`` (``tests/data/programs/ema_clip.py``:
WGAN-style clipping, ``p.clamp_(-c, c)``; an EMA, ``ema_p.data = ema_p.data * d + p * (1 - d)``)
were silently not written back (``p = jnp.clip(p, ...)`` rebinds the loop variable) or failed
unmarked (``p.data = ...`` on an array): now the state mapped and written back
(``nnx.update(model, jax.tree.map(...))``); the EMA copy made before the optimizer
(``copy.deepcopy(model)``) gets torch's initial weights in ``verify --program`` too.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("grain")

from program_cases import PROGRAMS, converted_program, edited

from torch2jax.convert import convert_source
from torch2jax.verify.program import verify_program

STEPS = 5  # into the second epoch (4 batches an epoch)


def test_a_frozen_teacher_gets_torchs_weights(tmp_path, monkeypatch):
    program, converted, text = converted_program(tmp_path, monkeypatch, "distill_teacher.py")
    assert "TODO(torch2jax)" not in text and "freeze_parameters(teacher)" in text
    assert text.count("def train_step(") == 1
    # the teacher is called outside the compiled step (its logits are the step's input)
    assert "teacher_logits = eval_step(teacher, inputs)" in text
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert "other models given torch's initial weights: Teacher" in r.notes
    assert len([c for c in r.checks if c.kind == "loss"]) == STEPS


# the EMA copy frozen as DINO's teacher and MoCo's key encoder are, its parameters counted
FROZEN_EMA = ("    ema = copy.deepcopy(model)\n",
              ("    ema = copy.deepcopy(model)\n    for p in ema.parameters():\n"
               "        p.requires_grad_(False)\n"
               "    print(sum(p.numel() for p in ema.parameters()))\n"))


@pytest.mark.parametrize("frozen", [False, True], ids=["ema", "frozen_ema"])
def test_parameters_updated_in_loops_are_written_back(tmp_path, monkeypatch, frozen):
    """Clipping and an EMA written back; with the copy frozen (its parameters FrozenParams,
    not nnx.Param), the EMA still maps its parameters with the model's, and its parameter
    count is torch's (printed, compared)."""
    program, converted, text = converted_program(
        tmp_path, monkeypatch, "ema_clip.py", edited("ema_clip.py", [FROZEN_EMA] if frozen else []))
    assert "TODO(torch2jax)" not in text and ".data" not in text.split('"""', 2)[2]
    which = "nnx.Any(nnx.Param, FrozenParam)" if frozen else "nnx.Param"
    assert "nnx.update(model, jax.tree.map(lambda p: jnp.clip(p, min=-0.3, max=0.3)" in text
    ema_states = (f"nnx.pure(nnx.state(ema_model, {which})), nnx.pure(nnx.state(model, {which}))"
                  if frozen else f"nnx.state(ema_model, {which}), nnx.state(model, {which})")
    assert ema_states in text, text
    assert not frozen or "freeze_parameters(ema)" in text
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    assert any("copy(ies) of the model made before the optimizer" in n for n in r.notes)
    # the EMA's loss is printed each step: compared (the last one is cut at the stop); the
    # frozen copy's parameter count before them
    assert len([c for c in r.checks if c.kind == "print"]) == STEPS - 1 + frozen


def test_a_parameter_loop_that_cannot_be_written_back_is_marked():
    """A loop whose body does more than update its variable: marked, not left to do
    nothing."""
    source = (PROGRAMS / "ema_clip.py").read_text()
    guarded = source.replace("                p.clamp_(-0.3, 0.3)",
                             "                if p.dim() > 1:\n"
                             "                    p.clamp_(-0.3, 0.3)")
    lines = convert_source(guarded, path="ema_clip.py").code.splitlines()
    at = next(i for i, text in enumerate(lines) if text.strip().startswith("for p in"))
    assert "[param-write]" in lines[at - 1], lines[at - 1]


def test_an_ema_written_as_an_in_place_chain_is_written_back():
    """``ema_p.mul_(decay).add_(p.detach(), alpha=1 - decay)``, the form most EMA code has:
    written as the value it leaves (torch's methods in order) and mapped over both states."""
    import jax
    import numpy as np
    from flax import nnx

    source = (PROGRAMS / "ema_clip.py").read_text().replace(
        "        ema_p.data = ema_p.data * decay + p.detach() * (1 - decay)",
        "        ema_p.mul_(decay).add_(p.detach(), alpha=1 - decay)")
    code = convert_source(source, path="ema_clip.py").code
    assert "TODO" not in code and "jax.tree.map(lambda ema_p, p:" in code
    scope: dict = {"__name__": "ema_clip"}
    exec(compile(code, "ema_clip.py", "exec"), scope)  # noqa: S102 - the converter's output
    ema, model = scope["Net"](rngs=nnx.Rngs(0)), scope["Net"](rngs=nnx.Rngs(1))
    before = [np.asarray(a) for a in jax.tree.leaves(nnx.state(ema, nnx.Param))]
    current = [np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]
    scope["update_ema"](ema, model, decay=0.75)
    after = [np.asarray(a) for a in jax.tree.leaves(nnx.state(ema, nnx.Param))]
    for e, p, new in zip(before, current, after):
        np.testing.assert_allclose(new, e * 0.75 + 0.25 * p, rtol=1e-6, atol=1e-7)


# the same fine-tuning in other spellings: the backbone frozen as a module, the trainable
# parameters listed by a comprehension, or given as parameter groups with their own lrs
FINETUNE_VARIANTS = {
    "filter": [],
    "comprehension_groups": [
        ("    for param in model.backbone.parameters():\n        param.requires_grad = False\n",
         "    model.backbone.requires_grad_(False)\n"),
        (("    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.5,\n"
          "                          momentum=0.9, weight_decay=1e-2)\n"),
         ("    opt = torch.optim.AdamW([\n"
          "        {'params': [p for p in model.head.parameters() if p.requires_grad], 'lr': 0.05},\n"
          "        {'params': filter(lambda p: p.requires_grad, model.backbone.parameters())},\n"
          "    ], lr=0.01, weight_decay=0.1)\n")),
    ],
    # the trainable list bound to a name, the step in a helper, a while loop
    "named_list_helper_while": [
        (("    opt = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.5,\n"
          "                          momentum=0.9, weight_decay=1e-2)\n"),
         ("    params = [p for p in model.parameters() if p.requires_grad]\n"
          "    opt = torch.optim.SGD(params, lr=0.5, momentum=0.9, weight_decay=1e-2)\n")),
        (("    for step in range(6):\n        opt.zero_grad()\n"
          "        loss = F.cross_entropy(model(x), y)\n        loss.backward()\n"
          "        opt.step()\n        print(f\"step {step} loss {loss.item():.4f}\")\n"),
         ("    step = 0\n    while step < 6:\n        loss = train_step(model, opt, x, y)\n"
          "        print(f\"step {step} loss {loss:.4f}\")\n        step += 1\n")),
        ("def main():\n",
         ("def train_step(model, opt, x, y):\n    model.train()\n    opt.zero_grad()\n"
          "    loss = F.cross_entropy(model(x), y)\n    loss.backward()\n    opt.step()\n"
          "    return loss.item()\n\n\ndef main():\n")),
    ],    # the backbone's layers reached by index through the model (model.backbone[0]), its
    # weight read in torch's layout, a slice of it called, its length
    "indexed_backbone": [
        ("    for param in model.backbone.parameters():\n        param.requires_grad = False\n",
         ("    model.backbone[0].requires_grad_(False)\n"
          "    for param in model.backbone[-1].parameters():\n"
          "        param.requires_grad = False\n"
          "    print(len(model.backbone), tuple(model.backbone[2].weight.shape))\n")),
        ("        opt.step()\n",
         ("        opt.step()\n        first = model.backbone[0]\n"
          "        print(f\"features {model.backbone[:2](x).sum().item():.4f} \"\n"
          "              f\"{first.weight.sum().item():.4f}\")\n")),
    ],
}


@pytest.mark.parametrize("variant", sorted(FINETUNE_VARIANTS))
def test_a_frozen_backbone_fine_tunes_like_torch(tmp_path, monkeypatch, variant):
    """``filter(lambda p: p.requires_grad, model.parameters())`` (or the comprehension) given
    to the optimizer is the model's parameters (the frozen ones are FrozenParams, which
    ``wrt=nnx.Param`` leaves), the trainable count is the nnx.Params' and the total counts the
    frozen ones: printed counts and the losses of each step equal torch's, the frozen
    backbone's weights unchanged and the decay applied to the head only."""
    program, converted, text = converted_program(
        tmp_path, monkeypatch, "finetune_frozen.py",
        edited("finetune_frozen.py", FINETUNE_VARIANTS[variant]))
    assert "TODO(torch2jax)" not in text and "freeze_parameters(model.backbone" in text, text
    r = verify_program(program, converted, steps=6)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    prints = [c for c in r.checks if c.kind == "print"]
    assert any("trainable 51 of 467" in p.detail for p in prints), prints
    assert len([c for c in r.checks if c.kind == "loss"]) == 6


def test_parameter_counts_of_a_file_that_freezes():
    """In a file that freezes, ``model.parameters()`` holds the FrozenParams too;
    ``if p.requires_grad`` keeps the nnx.Params, and ``if not p.requires_grad`` (which would
    read ``not True``) is marked. The counts, run: torch's. The script's Sequential indexed
    (``model[0].requires_grad_(False)``), sliced, assigned into, iterated and measured reads
    NNX's list of layers (``model.layers``), as torch's list (before: not subscriptable)."""
    import numpy as np

    source = ("import torch.nn as nn\n"
              "model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 4))\n"
              "model[0].requires_grad_(False)\n"
              "total = sum(p.numel() for p in model.parameters())\n"
              "trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)\n"
              "frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)\n"
              # a script's Sequential indexed, sliced, grown and measured as torch's list
              "tail = model[1:]\n"
              "model[-1] = nn.Linear(3, 5)\n"
              "sizes = [layer.out_features for layer in model] + [len(model)]\n")
    code = convert_source(source, path="counts.py").code
    lines = code.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("frozen = "))
    assert "[requires_grad]" in lines[at - 1], lines[at - 1]
    scope: dict = {}
    exec(compile(code, "counts.py", "exec"), scope)  # noqa: S102 - the converter's output
    assert (scope["total"], scope["trainable"]) == (6 + 3 + 12 + 4, 12 + 4)
    assert scope["sizes"] == [3, 5, 2]
    assert scope["tail"](np.ones((1, 3), np.float32)).shape == (1, 4)
