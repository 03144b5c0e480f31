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


_BUILT = ("batch_loader = InfiniteDataLoader(Line(32), batch_size=8, pin_memory=True, "
          "num_workers=0)")
# the infinite loader's construction, rewritten without changing what it computes (issue 28,
# testing by variants): each must convert with no TODO and train as torch does
LOADER_VARIANTS = {
    "a module constant": [(_BUILT, ("BATCH = 8\nbatch_loader = InfiniteDataLoader("
                                    "Line(32), batch_size=BATCH)"))],
    "an argparse attribute": [(_BUILT, (
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--batch-size', type=int, default=8)\n"
        "args = parser.parse_args([])\n"
        "batch_loader = InfiniteDataLoader(Line(32), batch_size=args.batch_size, "
        "num_workers=0)"))],
    "a config attribute, built in a function": [(_BUILT, (
        "class Config:\n    batch_size = 8\n\n\n"
        "def make_loader(dataset, config):\n"
        "    return InfiniteDataLoader(dataset, batch_size=config.batch_size)\n\n\n"
        "batch_loader = make_loader(Line(32), Config())"))],
    "built twice with different sizes": [(_BUILT, (
        "batch_loader = InfiniteDataLoader(Line(32), batch_size=8)\n"
        "other = InfiniteDataLoader(Line(16), batch_size=4)\n"
        "assert other.next()[0].shape == (4, 1)"))],
    "options in a dict": [(_BUILT, (
        "OPTIONS = {'batch_size': 8, 'num_workers': 0}\n"
        "batch_loader = InfiniteDataLoader(Line(32), **OPTIONS)"))],
    "literal keywords in the class": [
        ("    def __init__(self, dataset, **kwargs):", "    def __init__(self, dataset):"),
        ("DataLoader(dataset, sampler=train_sampler, **kwargs)",
         "DataLoader(dataset, sampler=train_sampler, batch_size=8)"),
        (_BUILT, "batch_loader = InfiniteDataLoader(Line(32))")],
    "under the main guard, sized by a flag": [(
        INFINITE[INFINITE.index("torch.manual_seed(0)"):],
        "if __name__ == '__main__':\n    import argparse\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--batch-size', '-b', type=int, default=8)\n"
        "    args = parser.parse_args([])\n"
        + "".join(f"    {line}\n" if line else "\n" for line in INFINITE[
            INFINITE.index("torch.manual_seed(0)"):].replace(
                _BUILT, "batch_loader = InfiniteDataLoader(Line(32), "
                        "batch_size=args.batch_size)").splitlines()))],
}


def _variant(name: str) -> str:
    source = INFINITE
    for before, after in LOADER_VARIANTS[name]:
        assert before in source, before
        source = source.replace(before, after)
    return source


@pytest.mark.parametrize("variant", list(LOADER_VARIANTS))
def test_infinite_loader_variants_train_like_torch(variant):
    """Options that are not constants (a name, an argparse or config attribute, a loader
    built in a function, twice, or under the main guard) are keyword-only parameters of the
    class's ``__init__``, handed to its loader: the batch size is a value on the host."""
    source = _variant(variant)
    result = convert_source(source, path="script.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert errors == [], result.code
    assert "TODO(torch2jax)" not in result.code
    assert "import torch" not in result.code
    assert_names_bound(result.code)
    want, got = _run(source), _run(result.code)
    assert want[:2] == pytest.approx([2.0, 1.0], abs=1e-3)
    assert got[:2] == pytest.approx(want[:2], abs=1e-3), (got, want)
    assert got[2] < 1e-5


@pytest.mark.parametrize("options", [
    "OPTIONS = {}",  # no option: nothing to hand on
    "OPTIONS = {'batch_size': 4}\nOPTIONS['batch_size'] = 8",  # changed after it was built
    "OPTIONS = dict(BASE, batch_size=8)",  # keys the file does not show
])
def test_options_not_known_stay_marked(options):
    source = INFINITE.replace(_BUILT, f"BASE = {{}}\n{options}\nbatch_loader = "
                                      "InfiniteDataLoader(Line(32), **OPTIONS)")
    result = convert_source(source, path="script.py")
    assert any("DataLoader(**kwargs)" in d.message for d in result.diagnostics
               if d.severity == "error"), result.diagnostics


def test_a_parameter_would_shadow_a_name_init_reads():
    """``batch_size=B`` where ``__init__`` reads a global ``batch_size`` of its own: a
    parameter of that name would change what it reads, so the loader stays marked."""
    source = INFINITE.replace(
        "        self.data_iter = iter(self.train_loader)\n",
        "        self.data_iter = iter(self.train_loader)\n        self.size = batch_size\n", 1,
    ).replace(_BUILT, "batch_size = 8\nbatch_loader = InfiniteDataLoader(Line(32), "
                      "batch_size=batch_size + 0)")
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
