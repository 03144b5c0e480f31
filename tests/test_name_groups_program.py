"""A text classifier trained as transformers' example scripts train it
(``tests/data/programs/no_decay_groups.py``): parameter groups selected by the parameters'
names (``[p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)]``),
a parameter count over ``p.requires_grad``, a LambdaLR warmup, the best model saved to the
current folder by its validation loss.

Before: the groups were marked ("not selected by a comprehension ... with a condition on the
parameter"), which took the whole training step down with them; the count crashed unmarked on
``p.requires_grad``; and ``verify --program`` ran both programs in the user's folder, so the
torch run overwrote the user's own ``best-model.pt`` (and the converted run's orbax folder then
replaced it). Now ``verify --program`` passes with every tensor's weight decay compared, and
the folder is as it was (tests/test_verify_program.py seeds the decay mask's bugs).
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

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "no_decay_groups.py"
STEPS = 5
SENTINEL = "the user's own checkpoint\n"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("converted")
    convert_tree(PROGRAM, out, "nnx", None)
    return out / PROGRAM.name


@pytest.fixture()
def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "best-model.pt").write_text(SENTINEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_groups_by_name_verify_and_the_folder_is_untouched(converted, user_folder):
    text = converted.read_text()
    assert "requires_grad" not in text and "torch_parameter_name(path)" in text
    r = verify_program(PROGRAM, converted, steps=STEPS)
    assert r.passed, (r.error, [(c.name, c.detail) for c in r.failures()])
    # weight decay where torch decays (by name: not the biases, not LayerNorm.weight), and
    # nowhere else, each tensor's compared
    decayed = {c.name for c in r.checks if c.kind == "decay" and c.detail.startswith("decay")}
    assert decayed == {"embed.weight", "hidden.weight", "head.weight"}
    assert len([c for c in r.checks if c.kind == "decay"]) == 7
    # the printed lines, the parameter count first (over p.requires_grad), are torch's
    prints = [c for c in r.checks if c.kind == "print"]
    assert len(prints) >= 2 and "978 trainable parameters" in prints[0].detail
    # both programs saved best-model.pt in their own copy of the folder, not in it
    assert sorted(p.name for p in user_folder.iterdir()) == ["best-model.pt"]
    assert (user_folder / "best-model.pt").read_text() == SENTINEL


def test_linen_groups_by_name_and_a_draw_in_main(tmp_path: Path):
    """linen: the mask names linen's parameters as torch does (its own torch_parameter_name
    helper), and main's ``torch.randint`` splits the script's key (``global key``, as the
    model's init does) instead of being marked. The count over ``model.parameters()`` stays
    marked (linen's parameters are not on the module): edited as a user would, the program
    runs and learns."""
    import subprocess
    import sys

    import jax
    import jax.numpy as jnp

    from torch2jax.convert import convert_source

    out = tmp_path / "linen"
    out.mkdir()
    result = convert_source(PROGRAM.read_text(), path=PROGRAM.name, target="linen")
    assert [d.rule for d in result.diagnostics if d.severity == "error"] == ["module-api"]
    text = result.code
    assert "global key\n    key, subkey = jax.random.split(key)" in text
    count = "return sum(p.size for p in model.parameters() if p.requires_grad)"
    assert text.count(count) == 1
    (out / PROGRAM.name).write_text(text.replace(count, "return 978"))
    sys.path.insert(0, str(out))
    try:
        import no_decay_groups as converted
    finally:
        sys.path.remove(str(out))
    params = converted.Classifier(40, 16, 2).init(
        jax.random.key(0), jnp.zeros((2, 12), jnp.int32))["params"]
    names = {converted.torch_parameter_name(path) for path, _ in
             jax.tree_util.tree_flatten_with_path(params)[0]}
    assert names == {f"{layer}.{w}" for layer in ("LayerNorm", "hidden", "head")
                     for w in ("weight", "bias")} | {"embed.weight"}
    run = subprocess.run([sys.executable, PROGRAM.name], cwd=out, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    losses = [float(line.split()[3]) for line in run.stdout.splitlines()
              if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0]
