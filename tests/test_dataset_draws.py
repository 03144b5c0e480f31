"""A Dataset that draws from torch's global generator in ``__init__`` (synthetic data made in
the program, the super-resolution corpus script's shape, issue 28), converted and run.

The dataset is built and read on the host (grain reads it one element at a time), so its
draws are numpy's global generator's, seeded where the program seeds torch, even where
the rest of the method is ``jnp`` code (``F.avg_pool2d`` is off the numpy table of
passes/host_data.py). They used to be refused as a "random draw in a method". The two sides
draw different patterns, so the programs are compared by their metrics: the converted
program's held-out error within a band of torch's (torch's, seeds 0-2: 0.0158, 0.0124, 0.0198;
the conversion's: 0.0089, its default initialisers being flax's), and its training loss
falling as torch's does.
"""

from __future__ import annotations

import contextlib
import io
import re

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("grain")
from unbound import assert_names_bound

from torch2jax.convert import convert_source

PROGRAM = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Patterns(Dataset):
    def __init__(self, count, factor, size=8):
        coords = torch.linspace(0.0, 1.0, size)
        yy, xx = torch.meshgrid(coords, coords, indexing="ij")
        freq = torch.rand(count, 2, 1, 1) * 4.0
        target = 0.5 + 0.25 * torch.sin(freq[:, 0] * xx) + 0.25 * torch.cos(freq[:, 1] * yy)
        self.target = target.unsqueeze(1)
        self.input = F.avg_pool2d(self.target, factor)

    def __len__(self):
        return self.target.shape[0]

    def __getitem__(self, index):
        return self.input[index], self.target[index]


class Net(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1, 1)
        self.conv2 = nn.Conv2d(8, factor ** 2, 3, 1, 1)
        self.shuffle = nn.PixelShuffle(factor)

    def forward(self, x):
        return self.shuffle(self.conv2(torch.relu(self.conv1(x))))


if __name__ == "__main__":
    torch.manual_seed(0)
    train_loader = DataLoader(Patterns(256, 2), batch_size=32, shuffle=True)
    test_loader = DataLoader(Patterns(64, 2), batch_size=64)
    model = Net(2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(6):
        total = 0.0
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            total += loss.item()
            loss.backward()
            optimizer.step()
        print(f"loss {total / len(train_loader):.6f}")
    with torch.no_grad():
        for x, y in test_loader:
            print(f"mse {F.mse_loss(model(x), y).item():.6f}")
'''

_DRAW = "torch.rand(count, 2, 1, 1) * 4.0"
# the program, rewritten without changing what it computes (issue 28, testing by variants)
VARIANTS = {
    "as written": [],
    "seeded by a flag": [("    torch.manual_seed(0)\n", (
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--seed', type=int, default=0)\n"
        "    args = parser.parse_args([])\n"
        "    torch.manual_seed(args.seed)\n"))],
    "the size as a tuple": [(_DRAW, "torch.rand((count, 2, 1, 1)) * 4.0")],
    "the size by keyword": [(_DRAW, "torch.rand(size=(count, 2, 1, 1)) * 4.0")],
    "drawn in float64, then cast": [
        (_DRAW, "torch.rand(count, 2, 1, 1, dtype=torch.float64).float() * 4.0")],
    "a random flip in __getitem__ too": [(
        "        return self.input[index], self.target[index]\n",
        ("        if torch.rand(1).item() < 0.5:\n"
         "            return self.input[index].flip(-1), self.target[index].flip(-1)\n"
         "        return self.input[index], self.target[index]\n"))],
}


def _variant(name: str) -> str:
    source = PROGRAM
    for before, after in VARIANTS[name]:
        assert before in source, before
        source = source.replace(before, after)
    return source


def _run(code: str, name: str = "__main__") -> tuple[dict[str, list[float]], dict]:
    out = io.StringIO()
    ns: dict = {"__name__": name}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "script.py", "exec"), ns)  # noqa: S102 - the test's own program
    found: dict[str, list[float]] = {}
    for key, value in re.findall(r"(loss|mse) ([0-9.]+)", out.getvalue()):
        found.setdefault(key, []).append(float(value))
    return found, ns


def _convert(source: str) -> str:
    result = convert_source(source, path="script.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert errors == [], result.code
    assert "TODO(torch2jax)" not in result.code
    assert "import torch" not in result.code and "from torch" not in result.code
    assert_names_bound(result.code)
    return result.code


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dataset_draws_are_host_numpy(variant):
    """The dataset converts with no TODO; its arrays are numpy float32 of torch's shapes, its
    patterns in torch's range, and the draws advance one stream (two datasets differ)."""
    source = _variant(variant)
    code = _convert(source)
    assert "np.random.seed(" in code and "host_rng" not in code
    _, ns_t = _run(source, "program")
    _, ns_j = _run(code, "program")
    want, a, b = ns_t["Patterns"](16, 2), ns_j["Patterns"](16, 2), ns_j["Patterns"](16, 2)
    for name in ("input", "target"):
        got = getattr(a, name)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32, type(got)
        assert got.shape == tuple(getattr(want, name).shape)
        assert 0.0 <= got.min() and got.max() <= 1.0
    assert not np.array_equal(a.target, b.target)
    x, y = a[3]
    assert isinstance(x, np.ndarray) and x.shape == (1, 4, 4) and y.shape == (1, 8, 8)


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dataset_draws_program_trains_like_torch(variant):
    source = _variant(variant)
    want, _ = _run(source)
    got, _ = _run(_convert(source))
    assert len(got["loss"]) == len(want["loss"]) == 6 and len(got["mse"]) == 1, got
    assert got["loss"][-1] < 0.25 * got["loss"][0], got  # it learns
    assert want["mse"][0] / 3 < got["mse"][0] < want["mse"][0] * 3, (got, want)
