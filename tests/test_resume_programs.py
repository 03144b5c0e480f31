"""A published-shape training script resumed from its checkpoint (tests/data/programs/
resume_spirals.py): the converted program runs with no TODO, and after a run of 4 epochs and a
--resume run to 6 it prints the epochs and learning rates torch prints. The scheduler's
``state_dict()`` / ``load_state_dict()`` carry its count (a resumed run without it would start
the schedule again at 3e-3), and the loader's shuffle seed comes from the ``set_seed(0)``
helper's argument. The losses are not compared: the two sides draw their initial weights from
different generators."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from test_longtail import HEADER  # (the tiny classifier with constant weights)

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "resume_spirals.py"
METRICS = re.compile(r"^\{'epoch'.*\}$", re.MULTILINE)


def _runs(script: Path, cwd: Path) -> list[dict]:
    out = []
    for args in ([], ["--epochs", "6", "--resume"]):
        done = subprocess.run([sys.executable, str(script), *args], cwd=cwd, text=True, check=False,
                              capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        out += [ast.literal_eval(line) for line in METRICS.findall(done.stdout)]
    return out


def test_resumed_run_prints_torchs_epochs_and_learning_rates(tmp_path):
    result = convert_source(PROGRAM.read_text(), path=PROGRAM.name)
    assert "TODO(torch2jax)" not in result.code
    assert "seed=0 + epoch" in result.code  # set_seed(0)'s argument, not its parameter
    (tmp_path / "torch").mkdir()
    (tmp_path / "jax").mkdir()
    converted = tmp_path / "jax" / PROGRAM.name
    converted.write_text(result.code)
    theirs = _runs(PROGRAM, tmp_path / "torch")
    ours = _runs(converted, tmp_path / "jax")
    assert [m["epoch"] for m in theirs] == [0, 1, 2, 3, 4, 5]
    assert [m["epoch"] for m in ours] == [m["epoch"] for m in theirs]
    assert [m["lr"] for m in ours] == pytest.approx([m["lr"] for m in theirs], rel=1e-6)


# an early stop keeping the best weights in memory (copy.deepcopy(model.state_dict()) in a
# tuple assignment, None at first, loaded back after the loop): the model's nnx.state as a
# pure dict, put back with nnx.update. The rate is high enough that the validation loss
# rises after its best epoch, so the weights loaded back are not the last ones.
EARLY_STOP = "import copy\n" + HEADER + """XV, YV = X.flip(0) * 0.5, torch.tensor([1, 0, 2, 1, 0, 2, 1, 0])


def evaluate(model):
    model.eval()
    with torch.no_grad():
        return F.cross_entropy(model(XV), YV).item()


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
best_val, best_state, bad = float("inf"), None, 0
for epoch in range(8):
    model.train()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), Y)
    loss.backward()
    optimizer.step()
    val = evaluate(model)
    print(f"{epoch} {val:.6f}")
    if val < best_val:
        best_val, best_state, bad = val, copy.deepcopy(model.state_dict()), 0
    else:
        bad += 1
        if bad >= 3:
            break
model.load_state_dict(best_state)
print(f"best {evaluate(model):.6f} {best_val:.6f}")
"""


# the forms of a copy of the weights kept in memory: each translates on NNX (the model's
# nnx.state as a pure dict) and on equinox (eqx.filter(model, eqx.is_array), put back with
# eqx.combine), and the converted program prints torch's numbers
SNAPSHOTS = {
    "deepcopy": "copy.deepcopy(model.state_dict())",
    "clone": "{k: v.clone() for k, v in model.state_dict().items()}",
    "detach-clone": "{name: t.detach().cpu().clone() for name, t in model.state_dict().items()}",
}


@pytest.fixture(scope="module")
def early_stop_torch_lines():
    v = pytest.importorskip("variants")
    lines = v.run_source(EARLY_STOP)
    best, last = float(lines[-1].split()[1]), float(lines[-2].split()[1])
    assert last - best > 0.05  # the weights loaded back are not the last epoch's
    return lines


@pytest.mark.parametrize("target", ["nnx", "equinox"])
@pytest.mark.parametrize("form", sorted(SNAPSHOTS))
def test_an_early_stop_keeps_and_loads_the_best_weights_in_memory(early_stop_torch_lines, form,
                                                                   target):
    v = pytest.importorskip("variants")
    source = EARLY_STOP.replace("copy.deepcopy(model.state_dict())", SNAPSHOTS[form])
    result = convert_source(source, path="s.py", target=target)
    assert "TODO(torch2jax)" not in result.code, result.code
    if target == "nnx":
        assert ".to_pure_dict()" in result.code and "nnx.update(model" in result.code
    else:
        assert "eqx.filter(model, eqx.is_array)" in result.code
        assert "model = eqx.combine(best_state, model)" in result.code
    assert v.same_output(v.run_source(result.code), early_stop_torch_lines, 1e-5) is None


def test_a_state_dict_read_by_its_keys_is_marked():
    # a state dict whose flat keys the program reads is not this one: marked
    keyed = EARLY_STOP.replace("model.load_state_dict(best_state)\n",
                               "print(sorted(best_state))\nmodel.load_state_dict(best_state)\n")
    code = convert_source(keyed, path="s.py").code
    assert "copy.deepcopy(model.state_dict())" in code
    assert "# TODO(torch2jax): model.state_dict() read as a dict" in code
    # ... on equinox and linen too, the line that reads it and the one that loads it (they
    # crashed unmarked; linen translates the early stop that does not read the keys:
    # tests/test_early_stop_targets.py)
    for target, source in (("equinox", keyed), ("linen", keyed)):
        lines = convert_source(source, path="s.py", target=target).code.splitlines()
        for text in ("copy.deepcopy(model.state_dict())", "model.load_state_dict(best_state)"):
            at = next(i for i, line in enumerate(lines) if text in line)
            assert lines[at - 1].lstrip().startswith("# TODO(torch2jax):"), (target, text)
