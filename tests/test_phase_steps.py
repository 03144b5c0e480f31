"""A step taken in one mode of a loop body that both modes run, and the program around it:
the shapes of PyTorch's transfer-learning tutorial (``tests/data/programs/finetune_phases.py``)
and of ``run_epoch(model, loader, optimizer, train=True)`` functions
(``tests/data/programs/run_epoch_modes.py``), converted and run against torch with
``verify --program`` (losses, learning rates, every parameter, the optimizer state and the
weight decay of each tensor, step by step).

Before, the tutorial converted with 6 TODOs and could not run: the step under
``with torch.set_grad_enabled(phase == "train")`` / ``if phase == "train"`` was not found (the
loss is computed outside the ``if``; a step in an ``if`` inside a loop was never looked for),
the optimizer over ``model_conv.fc.parameters()`` became ``nnx.Optimizer(model, ...)`` of an
unbound ``model``, the StepLR the function receives as ``scheduler`` counted its steps in an
unbound local, the datasets drawn in a dict comprehension and the loaders built in one were
marked, and a dict of named loaders (``{"train": train_loader, "val": val_loader}``) crashed
unmarked ("'function' object is not iterable": the shuffled loader is a function of the epoch).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("grain")

from torch2jax.convert import convert_source
from torch2jax.verify.program import verify_program
from torch2jax.verify.run import convert_tree

PROGRAMS = Path(__file__).resolve().parent / "data" / "programs"
STEPS = 10  # the tutorial's first epoch (8 steps) and into the second, past a validation


def _converted(tmp_path: Path, source: str, name: str) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    path = tmp_path / "src" / name
    path.write_text(source)
    out = tmp_path / "out"
    assert convert_tree(path, out, "nnx", None) == 0, (out / name).read_text()
    return path, out / name


def _passed(program: Path, converted: Path):
    r = verify_program(program, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    return r


def test_the_tutorial_trains_as_torch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (PROGRAMS / "finetune_phases.py").read_text()
    program, converted = _converted(tmp_path, source, "finetune_phases.py")
    text = converted.read_text()
    # one compiled step, defined once at the top level, for the train branch only
    assert text.count("def train_step(") == 1 and "loss.backward" not in text
    # the optimizer holds the head's parameters only; the frozen backbone is no nnx.Param
    assert 'torch_parameter_name(path).startswith("fc.")' in text
    # the scheduler counts its steps where the function receives it
    assert "scheduler.steps += 1" in text
    # the datasets' draws: one key per element of the comprehension
    assert "jax.random.fold_in(subkey, i)" in text and "enumerate(" in text
    r = _passed(program, converted)
    params = {c.name for c in r.checks if c.kind == "param"}
    # the frozen backbone compared too (unchanged by the steps on both sides)
    assert {"features.0.weight", "features.1.weight", "fc.weight", "fc.bias"} <= params
    assert len([c for c in r.checks if c.kind == "loss"]) == STEPS


def test_run_epoch_trains_as_torch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (PROGRAMS / "run_epoch_modes.py").read_text()
    program, converted = _converted(tmp_path, source, "run_epoch_modes.py")
    text = converted.read_text()
    # the shuffled loader read from the dict is the epoch's, the other a function of it too
    assert 'loaders["train"](epoch)' in text and '"val": lambda epoch: val_loader' in text
    r = _passed(program, converted)
    # the body gets gradients but no optimizer moves it: compared unchanged; only the head
    # has weight decay
    assert {"body.0.weight", "head.weight"} <= {c.name for c in r.checks if c.kind == "param"}
    assert {c.name for c in r.checks if c.kind == "decay"} == {"head.weight", "head.bias"}


# the same programs written differently: the branch written out by hand, the step's condition
# a parameter tested for None, the named loaders in a dict literal, a whole-model optimizer
VARIANT = (
    ('''                optimizer.zero_grad()
                with torch.set_grad_enabled(phase == "train"):
                    outputs = model(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, labels)
                    if phase == "train":
                        loss.backward()
                        optimizer.step()
''', '''                is_train = phase == "train"
                optimizer.zero_grad()
                with torch.set_grad_enabled(is_train):
                    outputs = model(inputs)
                    loss = criterion(outputs, labels)
                    _, preds = torch.max(outputs, 1)
                    if is_train:
                        loss.backward()
                        optimizer.step()
'''),
    ('''dataloaders = {x: DataLoader(image_datasets[x], batch_size=8, shuffle=(x == "train"))
               for x in ["train", "val"]}''', '''train_loader = DataLoader(image_datasets["train"], batch_size=8, shuffle=True)
val_loader = DataLoader(image_datasets["val"], batch_size=8, shuffle=False)
dataloaders = {"train": train_loader, "val": val_loader}'''),
)


def test_a_variant_of_the_tutorial_trains_as_torch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (PROGRAMS / "finetune_phases.py").read_text()
    for old, new in VARIANT:
        assert old in source
        source = source.replace(old, new)
    program, converted = _converted(tmp_path, source, "finetune_variant.py")
    _passed(program, converted)


@pytest.mark.parametrize("test", ["optimizer is not None", "train and not frozen"])
def test_other_conditions_of_a_step_convert(test):
    """The condition is any expression without a call (evaluated once, as before)."""
    source = (PROGRAMS / "run_epoch_modes.py").read_text().replace(
        "        if train:\n            loss.backward()", f"        if {test}:\n"
        "            loss.backward()").replace(
        "def run_epoch(model, loader, optimizer, train=True):",
        "def run_epoch(model, loader, optimizer, train=True, frozen=False):")
    result = convert_source(source, target="nnx")
    assert result.todos == 0, result.code
    assert f"if {test}:\n            loss, logits = train_step(" in result.code


def test_a_dict_of_loaders_read_whole_is_marked():
    """Passed on whole (not read by key), its items would be functions of the epoch where a
    loader is expected: the dict is marked, not left to fail."""
    source = (PROGRAMS / "run_epoch_modes.py").read_text().replace(
        'print(f"{len(loaders[\'train\'])} batches per epoch")', "print(loaders)")
    result = convert_source(source, target="nnx")
    assert "holds loaders shuffled per epoch" in result.code


def test_equinox_sets_the_mode_of_a_step_in_a_mode():
    """equinox: ``model.train() if train else model.eval()`` as a statement sets the model's
    inference flag (it was left as torch's call, an unmarked AttributeError on an equinox
    model); the step in the ``if`` is translated there too (tests/test_phase_steps_targets.py
    runs the program against torch)."""
    source = (PROGRAMS / "run_epoch_modes.py").read_text()
    result = convert_source(source, target="equinox")
    assert "model = eqx.nn.inference_mode(model, not train)" in result.code
    assert "model.train()" not in result.code
    assert result.todos == 0, result.code


def test_a_draw_in_a_comprehension_has_a_key_per_element():
    """``[torch.randn(2) for _ in range(3)]``: one key split for the statement, folded with
    each element's index (passes/comprehension_keys.py); it was marked. Three different draws
    of torch's shape, and the same ones on every run of the program (the script's seed)."""
    import numpy as np

    source = "import torch\ntorch.manual_seed(0)\nx = [torch.randn(2) for _ in range(3)]\n"
    result = convert_source(source, target="nnx")
    assert result.todos == 0, result.code
    draws = []
    for _ in range(2):
        namespace: dict = {}
        exec(compile(result.code, "<converted>", "exec"), namespace)  # noqa: S102 - its conversion
        draws.append([np.asarray(v) for v in namespace["x"]])
    assert [d.shape for d in draws[0]] == [(2,)] * 3
    assert not np.allclose(draws[0][0], draws[0][1]) and not np.allclose(draws[0][1],
                                                                         draws[0][2])
    np.testing.assert_array_equal(np.stack(draws[0]), np.stack(draws[1]))
