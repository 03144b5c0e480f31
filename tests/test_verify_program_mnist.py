"""``verify --program`` on the MNIST-shaped corpus script (``tests/corpus/mnist/main.py``).

Its labels never go through the model: ``F.nll_loss(model(data), target)``. The harness
replays whole batches at the loader boundary (torch's ``DataLoader`` batches in place of the
grain batches the converted program draws), so the labels the converted loss reads are torch's.
The converted script, as converted, agrees with torch (Adadelta's ``square_avg`` and
``acc_delta`` against optax's ``e_g`` and ``e_x``, a StepLR schedule, two printed lines); each
bug seeded into its text is named by the step and the tensor, rate or seed call where it first
shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_verify_program import kinds

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("grain")

from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

ROOT = Path(__file__).resolve().parents[1]
MNIST = ROOT / "tests" / "corpus" / "mnist" / "main.py"
STEPS = 3
ARGS = ["--tiny", "--batch-size", "16", "--log-interval", "1"]
TENSORS = {f"{layer}.{w}" for layer in ("conv1", "conv2", "fc1", "fc2")
           for w in ("weight", "bias")}


@pytest.fixture(scope="module")
def mnist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("mnist")
    convert_tree(MNIST, tmp / "converted", "nnx", None)
    converted = (tmp / "converted" / MNIST.name).read_text()
    torch_rec = torch_side(MNIST, STEPS, ARGS, tmp / "torch.pkl", cwd=tmp)
    return tmp, converted, torch_rec


def run(mnist: tuple[Path, str, dict], name: str, *edits: tuple[str, str]) -> ProgramResult:
    """The converted script with ``edits`` (old, new: each old text once), from torch's start."""
    tmp, converted, torch_rec = mnist
    for old, new in edits:
        assert converted.count(old) == 1, old
        converted = converted.replace(old, new)
    folder = tmp / name
    folder.mkdir()
    (folder / MNIST.name).write_text(converted)
    jax_rec = jax_side(folder / MNIST.name, tmp / "torch.pkl", STEPS, ARGS,
                       tmp / f"{name}.pkl", cwd=tmp)
    r = ProgramResult(str(MNIST), str(folder), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


def test_the_mnist_script_agrees_with_its_labels_replayed(mnist):
    r = run(mnist, "as_converted")
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    # 3 losses and rates, 8 tensors with Adadelta's two slots each, one seed, two log lines
    assert kinds(r) == {"loss": STEPS, "lr": STEPS, "param": 8, "opt_state": 16, "decay": 8,
                        "seed": 1, "print": 2}
    assert {c.name for c in r.checks if c.kind == "opt_state"} == {
        f"{t} {slot}" for t in TENSORS for slot in ("square_avg", "acc_delta")}
    assert "batches replayed: 6 arrays over 3 batches the converted program drew (3 torch " \
           "DataLoader batches)" in r.notes
    assert not any(n.startswith("optimizer state not compared") for n in r.notes)


def test_the_labels_are_the_loss_s_own(mnist):
    """The labels shifted by one class in the converted training step: the loss of step 1 is
    named (the images reaching the model are torch's either way)."""
    r = run(mnist, "labels_shifted",
            ("train_step(model, optimizer, data, jnp.expand_dims(target, 1))",
             "train_step(model, optimizer, data, jnp.expand_dims((target + 1) % 10, 1))"))
    assert [(c.name, c.step) for c in r.failures("loss")][:1] == [("loss 1", 1)]
    assert {c.step for c in r.failures("param")} == {1}
    assert not r.failures("lr") and not r.failures("seed")


@pytest.mark.slow
def test_the_mnist_schedule_one_step_ahead_and_the_wrong_seed(mnist):
    """StepLR's first rate taken one step late (0.7 from the start) and the key made from
    another seed, seeded together: the rate of every step is named, the parameters from step
    1, the seed call before it; the first loss (before any update) still agrees."""
    r = run(mnist, "schedule_seed",
            ('hyperparams["learning_rate"].value = jnp.float32(scheduler(0))',
             'hyperparams["learning_rate"].value = jnp.float32(scheduler(1))'),
            ("jax.random.key(args.seed)", "jax.random.key(args.seed + 1)"))
    assert [(c.name, c.detail) for c in r.failures("lr")] == [
        (f"step {s} group 0", "torch 1, JAX 0.7") for s in range(1, STEPS + 1)]
    assert {c.name for c in r.failures("param")} == TENSORS
    assert {c.step for c in r.failures("param")} == {1}
    [seed] = r.failures("seed")
    assert seed.detail == "torch torch.manual_seed(1), JAX jax.random.key(2), before step 1"
    assert not [c for c in r.failures("loss") if c.step == 1]
