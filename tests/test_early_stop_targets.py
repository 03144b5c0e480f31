"""An early-stopping script written the common way (tests/data/programs/early_stop_helpers.py:
a module-level ``nn.Sequential`` model, a ``TensorDataset`` split by ``random_split`` with a
seeded Generator, a shuffled loader, AdamW, the step in a ``train_one_epoch(net, loader, opt)``
helper, an ``evaluate`` helper under ``torch.no_grad``, the best weights kept with
``copy.deepcopy(model.state_dict())`` and loaded back, a patience counter), and variants that
compute the same (the model as a class; the step inline, or in a helper defined after its
caller ``main()``; the epoch loop as a ``while``; ``@torch.no_grad()`` as a decorator),
converted on the three targets (issue 32). Each converted program has no TODO and prints
torch's numbers.

The weights start from constants (``model.apply(init_weights)``) and every example is the
same row, so the split and the shuffles, drawn from different generators on the two sides,
give both the same batches. The rate is high enough that the validation loss rises twice:
the loop stops early and loads back weights that are not the last ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("grain")
variants = pytest.importorskip("variants")

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "early_stop_helpers.py"
SOURCE = PROGRAM.read_text()

SEQUENTIAL = "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))\n"
CLASS = '''class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


model = MLP()
'''
WITH = '''def evaluate(net, loader):
    net.eval()
    with torch.no_grad():
        return sum(criterion(net(xb), yb).item() for xb, yb in loader) / len(loader)
'''
DECORATED = '''@torch.no_grad()
def evaluate(net, loader):
    net.eval()
    return sum(criterion(net(xb), yb).item() for xb, yb in loader) / len(loader)
'''
HELPER = SOURCE[SOURCE.index("def train_one_epoch("):SOURCE.index("best, best_state")].rstrip() + "\n"
CALL = "    train_loss = train_one_epoch(model, train_loader, optimizer)\n"
INLINE = '''    model.train()
    total = 0.0
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    train_loss = total / len(train_loader)
'''
RUN = SOURCE[SOURCE.index("best, best_state"):]


def _replace(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def as_class(source: str) -> str:
    return _replace(source, SEQUENTIAL, CLASS)


def decorated(source: str) -> str:
    return _replace(source, WITH, DECORATED)


def while_loop(source: str) -> str:
    source = _replace(source, "for epoch in range(8):\n", "epoch = 0\nwhile epoch < 8:\n")
    return _replace(source, "\nmodel.load_state_dict(", "\n    epoch += 1\nmodel.load_state_dict(")


def inline(source: str) -> str:
    return _replace(_replace(source, "\n\n" + HELPER, ""), CALL, INLINE)


def helper_after(source: str) -> str:
    """The loop in ``main()``, the helper defined after it, ``main()`` called last."""
    run = source[source.index("best, best_state"):]
    body = "".join("    " + line if line.strip() else line for line in run.splitlines(True))
    head = _replace(source[:source.index("best, best_state")], HELPER + "\n\n", "")
    return (head + "def main():\n" + body + "\n\n" + HELPER
            + '\n\nif __name__ == "__main__":\n    main()\n')


# each form at least once (model, step, loop, no_grad), on the targets this file is about
# (NNX runs the script as written)
VARIANTS = {
    "as_written": (),
    "class_inline_while": (as_class, inline, while_loop),
    "sequential_after_decorated": (helper_after, decorated),
}
CASES = [("as_written", "nnx"), *((name, target) for name in VARIANTS
                                  for target in ("linen", "equinox"))]


def _variant(name: str) -> str:
    source = SOURCE
    for transform in VARIANTS[name]:
        source = transform(source)
    return source


@pytest.fixture(scope="module")
def torch_lines() -> dict[str, list[str]]:
    lines = {name: variants.run_source(_variant(name)) for name in VARIANTS}
    first = lines["as_written"]
    vals = [float(line.split()[-1]) for line in first[:-1]]
    # stopped early (8 epochs asked), the weights loaded back not the last epoch's
    assert len(vals) < 8 and min(vals) < vals[-1] and float(first[-1].split()[-1]) == min(vals)
    for name, got in lines.items():  # (the variants compute the same: a generator check)
        assert variants.same_output(got, first, 1e-5) is None, name
    return lines


@pytest.mark.slow
@pytest.mark.parametrize(("name", "target"), CASES)
def test_the_early_stop_script_runs_converted_with_torchs_numbers(torch_lines, name, target):
    source = _variant(name)
    code = convert_source(source, path=PROGRAM.name, target=target).code
    assert "TODO(torch2jax)" not in code, code
    if target == "linen":  # the best weights: the TrainState's, put back into it
        assert 'state = state.replace(params=best_state["params"])' in code
    if target == "equinox":
        assert "eqx.combine(best_state, model)" in code
    got = variants.run_source(code)
    assert variants.same_output(got, torch_lines[name], 2e-3) is None, (got, torch_lines[name])


# the module-level Sequential with dropout (a tabular script's): on equinox it takes a key per
# example when trained, and inference mode turns the dropout off in the evaluation
DROPOUT = SOURCE.replace(SEQUENTIAL, "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), "
                         "nn.Dropout(0.2), nn.Linear(16, 1))\n")


def test_a_sequential_with_dropout_on_equinox():
    code = convert_source(DROPOUT, path=PROGRAM.name, target="equinox").code
    assert "TODO(torch2jax)" not in code, code
    assert "eqx.nn.Dropout(0.2)" in code and "eqx.nn.Sequential([" in code
    assert "jax.vmap(net)(xb, key=jax.random.split(key, xb.shape[0]))" in code
    assert "net = eqx.nn.inference_mode(net)\n" in code
