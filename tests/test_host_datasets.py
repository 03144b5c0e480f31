"""A Dataset's methods run on the host in numpy (passes/host_data.py): each element is numpy,
equal to torch's element, with torch's view semantics, and the whole program still trains.

On the old route ``__getitem__`` was ``jnp`` code: every element was a device array built op by
op, and an indexed write through a view (``y = cat[1:]; y[:2] = -1``, which changes ``cat`` and
so ``x = cat[:-1]`` in torch) became a functional ``.at[].set`` copy that left ``x`` as it was.
"""

from __future__ import annotations

import numpy as np
import pytest

from torch2jax.convert import convert_source

SOURCE = '''
import torch
from torch.utils.data import Dataset


class CharDataset(Dataset):
    def __init__(self, data, block_size):
        chars = sorted(list(set(data)))
        self.stoi = {ch: i for i, ch in enumerate(chars)}
        self.block_size = block_size
        self.data = data

    def __len__(self):
        return len(self.data) - self.block_size

    def __getitem__(self, idx):
        chunk = self.data[idx:idx + self.block_size + 1]
        dix = [self.stoi[s] for s in chunk]
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        return x, y


class AdditionDataset(Dataset):
    def __init__(self, ndigit=2):
        self.ndigit = ndigit
        g = torch.Generator()
        g.manual_seed(1337)
        self.ixes = torch.randperm(100, generator=g)

    def __len__(self):
        return self.ixes.nelement()

    def __getitem__(self, idx):
        nd = self.ndigit
        idx = self.ixes[idx].item()
        a, b = idx // 10, idx % 10
        render = f"%0{nd}d" % a + f"%0{nd}d" % b + (f"%0{nd + 1}d" % (a + b))[::-1]
        dix = [int(s) for s in render]
        x = torch.tensor(dix[:-1], dtype=torch.long)
        y = torch.tensor(dix[1:], dtype=torch.long)
        y[:nd * 2 - 1] = -1
        return x, y


class SortDataset(Dataset):
    def __init__(self, length=6):
        self.length = length
        g = torch.Generator().manual_seed(0)
        self.inputs = torch.randint(0, 3, (50, length), generator=g)

    def __len__(self):
        return self.inputs.shape[0]

    def __getitem__(self, idx):
        inp = self.inputs[idx]
        sol = torch.sort(inp)[0]
        cat = torch.cat((inp, sol), dim=0)
        x = cat[:-1].clone()
        y = cat[1:].clone()
        y[:self.length - 1] = -1
        return x, y


class ViewDataset(Dataset):
    def __init__(self):
        self.inputs = torch.arange(40).reshape(10, 4)

    def __len__(self):
        return self.inputs.size(0)

    def __getitem__(self, idx):
        cat = torch.cat((self.inputs[idx], self.inputs[idx].flip(0)), dim=0)
        x = cat[:-1]
        y = cat[1:]
        y[:2] = -1  # a view of cat: x sees the write too
        return x.float() / 2, y.unsqueeze(0).view(-1), torch.zeros(2)


class NoisyDataset(Dataset):
    """A draw off the numpy table (randn_like; torch.randn from the global generator is on
    it, from numpy's global generator): left to the rewriter (which marks it)."""
    def __init__(self):
        self.x = torch.arange(6.0)

    def __len__(self):
        return 6

    def __getitem__(self, idx):
        return self.x[idx] + torch.randn_like(self.x[idx])
'''


@pytest.fixture(scope="module")
def sides():
    result = convert_source(SOURCE, path="datasets.py")
    ns_t: dict = {}
    ns_j: dict = {}
    exec(SOURCE, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    return result, ns_t, ns_j


def _same(got, want) -> None:
    assert isinstance(got, np.ndarray), type(got)  # numpy on the host, not a device array
    np.testing.assert_array_equal(got, want.numpy())
    assert got.dtype == want.numpy().dtype


@pytest.mark.parametrize("name,args,shared", [
    ("CharDataset", ("hello world, hello jax", 5), None),
    ("AdditionDataset", (2,), "ixes"),
    ("SortDataset", (6,), "inputs"),
    ("ViewDataset", (), None),
])
def test_dataset_elements_are_numpy_equal_to_torch(sides, name, args, shared) -> None:
    _, ns_t, ns_j = sides
    dt, dj = ns_t[name](*args), ns_j[name](*args)
    if shared:  # the random draws differ by design: give both the torch draw
        setattr(dj, shared, getattr(dt, shared).numpy())
    assert len(dj) == len(dt)
    for i in range(len(dt)):
        for got, want in zip(dj[i], dt[i], strict=True):
            _same(got, want)


def test_view_write_reaches_the_other_view(sides) -> None:
    _, ns_t, ns_j = sides
    x_t = ns_t["ViewDataset"]()[3][0]
    x_j = ns_j["ViewDataset"]()[3][0]
    assert (x_t.numpy()[1:3] == -0.5).all()  # torch: y[:2] = -1 wrote x[1:3]
    np.testing.assert_array_equal(x_j, x_t.numpy())


def test_generator_becomes_a_seeded_numpy_generator(sides) -> None:
    result, _, ns_j = sides
    assert "np.random.default_rng(1337)" in result.code
    a, b = ns_j["AdditionDataset"](), ns_j["AdditionDataset"]()
    np.testing.assert_array_equal(a.ixes, b.ixes)  # seeded: the same order on every run
    assert sorted(a.ixes.tolist()) == list(range(100))
    s = ns_j["SortDataset"]()
    assert s.inputs.shape == (50, 6) and s.inputs.min() >= 0 and s.inputs.max() < 3


def test_methods_off_the_table_keep_the_jnp_route(sides) -> None:
    result, _, _ = sides
    noisy = result.code[result.code.index("class NoisyDataset"):]
    assert "np." not in noisy.split("def __getitem__")[1]
    assert "TODO(torch2jax)" in noisy.split("def __getitem__")[1]
    # the numpy methods were written anew: no diagnostic is left inside them
    lines = {d.line for d in result.diagnostics}
    first = SOURCE.count("\n", 0, SOURCE.index("class NoisyDataset")) + 1
    assert lines and all(line >= first for line in lines), result.diagnostics


PROGRAM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Ramps(Dataset):
    """Features computed in __getitem__ from a fixed table, as a user's Dataset does."""

    def __init__(self, n):
        self.t = torch.arange(n, dtype=torch.float32) / n
        self.labels = torch.arange(n) % 3

    def __len__(self):
        return self.t.shape[0]

    def __getitem__(self, idx):
        t = self.t[idx]
        x = torch.stack([t, t * t, 1.0 - t, 0.5 * t])
        return x, self.labels[idx]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def held_out(n):
    t = torch.arange(n, dtype=torch.float32) / n + 0.01
    return TensorDataset(torch.stack([t, t * t, 1.0 - t, 0.5 * t], dim=1), torch.arange(n) % 3)


def loader_of(data):
    return DataLoader(data, batch_size=8)


def evaluate(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x), y).item()
    return total


def train(model, loader, epochs):
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model
'''


EVAL_VARIANTS = {  # the evaluation loop, rewritten without changing what it computes
    "as written": [],
    "no_grad decorator": [(
        ("def evaluate(model, loader):\n    model.eval()\n    total = 0.0\n"
         "    with torch.no_grad():\n        for x, y in loader:\n"
         "            total += F.cross_entropy(model(x), y).item()\n"),
        ("@torch.no_grad()\ndef evaluate(model, loader):\n    model.eval()\n    total = 0.0\n"
         "    for x, y in loader:\n        total += F.cross_entropy(model(x), y).item()\n"))],
    "inference_mode": [("    with torch.no_grad():\n", "    with torch.inference_mode():\n")],
    "named logits": [("            total += F.cross_entropy(model(x), y).item()\n",
                      ("            logits = model(x)\n"
                       "            loss = F.cross_entropy(logits, y)\n"
                       "            total += loss.item()\n"))],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(EVAL_VARIANTS))
def test_dataset_program_trains_as_torch_with_host_batches(variant) -> None:
    """A Dataset-shaped program (issue 30): the converted Dataset's elements and a
    TensorDataset's rows are numpy (host), the loader's batches numpy collated once per batch;
    from the same weights the program trains to torch's held-out loss, and the evaluation
    loop (model.eval(), torch.no_grad() over a loader) calls a forward compiled once."""
    import jax
    import torch
    from flax import nnx
    from launch import compiled_while

    from torch2jax.weights import transfer_state_dict

    source = PROGRAM
    for before, after in EVAL_VARIANTS[variant]:
        assert before in source, before
        source = source.replace(before, after)
    result = convert_source(source, path="program.py")
    assert "TODO" not in result.code, result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    data_j, held_j = ns_j["Ramps"](48), ns_j["held_out"](16)
    for element in (data_j[5], held_j[5]):
        assert all(isinstance(v, np.ndarray | np.generic) for v in element), element
    _same(data_j[5][0], ns_t["Ramps"](48)[5][0])
    batch = next(iter(ns_j["loader_of"](data_j)))
    assert all(isinstance(v, np.ndarray) for v in batch) and batch[0].shape == (8, 4)
    assert not any(isinstance(v, jax.Array) for v in batch)

    torch.manual_seed(0)
    tm = ns_t["Net"]()
    jm = ns_j["Net"](rngs=nnx.Rngs(0))
    transfer_state_dict(tm, jm)
    ns_t["train"](tm, ns_t["loader_of"](ns_t["Ramps"](48)), 3)
    ns_j["train"](jm, ns_j["loader_of"](data_j), 3)
    want = ns_t["evaluate"](tm, ns_t["loader_of"](ns_t["held_out"](16)))
    got, compiles = compiled_while(lambda: ns_j["evaluate"](jm, ns_j["loader_of"](held_j)))
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert len([c for c in compiles if "jit(eval_step)" in c]) == 1, compiles
    again, compiles = compiled_while(lambda: ns_j["evaluate"](jm, ns_j["loader_of"](held_j)))
    assert again == got and not compiles, compiles  # the eval forward is compiled, cached
