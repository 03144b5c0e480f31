"""A DataLoader wrapped in the user's own class (issue 28), converted, run and compared with
torch.

makemore's ``InfiniteDataLoader``: a class that builds ``DataLoader(dataset, sampler=
RandomSampler(dataset, replacement=True, num_samples=int(1e10)), **kwargs)`` and restarts its
iterator on StopIteration, built once with constant keywords. The keywords are written into
the class's loader (passes/loader_classes.py), which the data pass then translates. Both sides
draw their samples from their own generators, so the program fits data on which every sample
agrees (y = 2x + 1 exactly, full convergence): the weights must match torch's to 1e-3, and a
loader that paired the wrong targets or dropped the batch size would not.
"""

from __future__ import annotations

import contextlib
import io

import pytest

pytest.importorskip("torch")
pytest.importorskip("grain")
from unbound import assert_names_bound

from torch2jax.convert import convert_source

INFINITE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Line(Dataset):
    def __init__(self, n):
        self.x = torch.linspace(-1.0, 1.0, n).reshape(n, 1)
        self.y = 2.0 * self.x + 1.0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class InfiniteDataLoader:
    """samples from the dataset with replacement, forever"""

    def __init__(self, dataset, **kwargs):
        train_sampler = torch.utils.data.RandomSampler(dataset, replacement=True,
                                                       num_samples=int(1e10))
        self.train_loader = DataLoader(dataset, sampler=train_sampler, **kwargs)
        self.data_iter = iter(self.train_loader)

    def next(self):
        try:
            batch = next(self.data_iter)
        except StopIteration:  # this will technically only happen after 1e10 samples
            self.data_iter = iter(self.train_loader)
            batch = next(self.data_iter)
        return batch


torch.manual_seed(0)
model = nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
batch_loader = InfiniteDataLoader(Line(32), batch_size=8, pin_memory=True, num_workers=0)
for step in range(300):
    x, y = batch_loader.next()
    assert x.shape == (8, 1)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"{model.weight.reshape(-1)[0].item():.4f} {model.bias[0].item():.4f} {loss.item():.6f}")
'''


def _run(code: str) -> list[float]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "script.py", "exec"), {"__name__": "__main__"})  # noqa: S102
    return [float(w) for w in out.getvalue().split()]


def test_infinite_loader_class_converts_and_trains_like_torch():
    result = convert_source(INFINITE, path="script.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert errors == [], result.code
    assert "TODO(torch2jax)" not in result.code
    assert "import torch" not in result.code
    assert_names_bound(result.code)
    want, got = _run(INFINITE), _run(result.code)
    assert want[:2] == pytest.approx([2.0, 1.0], abs=1e-3)  # torch converged (the premise)
    assert got[:2] == pytest.approx(want[:2], abs=1e-3), (got, want)
    assert got[2] < 1e-5


def test_loader_options_read_where_the_user_wrote_them():
    """The keywords of the class's call are read at the class's DataLoader: the diagnostics
    name the loader's line of the user's file."""
    result = convert_source(INFINITE, path="script.py")
    line = INFINITE.splitlines().index(
        "        self.train_loader = DataLoader(dataset, sampler=train_sampler, **kwargs)") + 1
    notes = [d for d in result.diagnostics if "pin_memory" in d.message]
    assert notes and notes[0].line == line, [(d.line, d.message) for d in result.diagnostics]


WRAPPER = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


class Batches:
    def __init__(self, *args, **kwargs):
        self.loader = DataLoader(*args, **kwargs)

    def __iter__(self):
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)


X = torch.arange(12.0).reshape(6, 2)
loader = Batches(TensorDataset(X, X.sum(1)), batch_size=4)
print(len(loader), [float(y.sum()) for _, y in loader])
z = torch.ones(2)
'''


def test_transparent_wrapper_is_the_loader_and_lines_stay_the_users():
    result = convert_source(WRAPPER, path="script.py")
    assert "TODO(torch2jax)" not in result.code and "class Batches" not in result.code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(WRAPPER, "t.py", "exec"), {})  # noqa: S102
    want = out.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(result.code, "j.py", "exec"), {})  # noqa: S102
    assert out.getvalue() == want


@pytest.mark.parametrize("call", [
    "batch_loader = InfiniteDataLoader(Line(32), batch_size=BATCH)",  # not a constant
    "batch_loader = InfiniteDataLoader(Line(32), **OPTIONS)",
])
def test_options_not_known_stay_marked(call):
    source = INFINITE.replace(
        "batch_loader = InfiniteDataLoader(Line(32), batch_size=8, pin_memory=True, "
        "num_workers=0)", "BATCH = 8\nOPTIONS = {}\n" + call)
    result = convert_source(source, path="script.py")
    assert any("DataLoader(**kwargs)" in d.message for d in result.diagnostics
               if d.severity == "error"), result.diagnostics


def test_diagnostics_after_a_removed_wrapper_name_the_users_lines():
    source = WRAPPER.replace("batch_size=4)", "batch_size=4, shuffle=True)")
    result = convert_source(source, path="script.py")
    line = next(i for i, text in enumerate(source.splitlines(), 1)
                if text.startswith("loader = Batches("))
    notes = [d for d in result.diagnostics if "shuffle" in d.message]
    assert notes and {d.line for d in notes} == {line}, [(d.line, d.message)
                                                           for d in result.diagnostics]
