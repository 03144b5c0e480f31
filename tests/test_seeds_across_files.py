"""Seeds mean what they meant across files (issue 29 item 3).

A program of three files, in the shape minGPT-like libraries have: ``seeding.py`` defines
``set_seed(seed)`` (Python's and torch's seeds), ``data.py`` a Dataset whose ``__getitem__``
draws from torch's global generator (``torch.randperm``, ``torch.randint``), and ``train.py``
seeds through ``set_seed(args.seed)`` from argparse, then trains a small model on the loader's
batches, printing the first example of each batch and the loss. A variant's Dataset draws
nothing and the script's loader shuffles it: the order is then what the seed decides.

torch's data depend on the seed and only on it. The converted program must do the same: its
Dataset draws from numpy's global generator, which the translation of ``torch.manual_seed``
(in ``set_seed``, another file) seeds too, and its loader reads in the calling thread (a
shuffled loader draws its seed from numpy's global generator in the same way). Each
converted program runs twice per seed: equal outputs for equal seeds, different data for
different seeds, as torch's. The streams are not torch's (numpy's generator is not torch's),
so the converted data are not compared with torch's values, only their properties (a
permutation, digits in range).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torch2jax.convert import convert_source
from torch2jax.verify.program import ProgramResult, _compare_seeds

DATA = {
    # every item drawn from torch's global generator; read in order
    "draws": '''"""A dataset that draws every item from torch's global generator."""

import torch
from torch.utils.data import Dataset


class Shuffles(Dataset):
    def __init__(self, n=5, size=64):
        self.n = n
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        perm = torch.randperm(self.n)
        digits = torch.randint(0, 10, (self.n,), dtype=torch.long)
        return perm, digits
''',
    # items that are a function of their index; the script's loader shuffles them (its
    # order's seed drawn from torch's global generator, in torch)
    "order": '''"""A dataset whose items are a function of their index."""

import torch
from torch.utils.data import Dataset


class Shuffles(Dataset):
    def __init__(self, n=5, size=64):
        self.n = n
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        perm = (torch.arange(self.n) + idx) % self.n
        digits = (torch.arange(self.n) * 0 + idx) % 10
        return perm, digits
''',
}

SEEDING = {
    # Python's and torch's seeds (numpy's comes from torch's translation)
    "torch_only": '''import random

import torch


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
''',
    # minGPT's set_seed: Python's, numpy's, torch's and CUDA's
    "mingpt": '''import random

import numpy as np
import torch


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''',
}

TRAIN = '''import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from data import Shuffles
from seeding import set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()
set_seed(args.seed)

loader = DataLoader(Shuffles(), batch_size=8, shuffle=SHUFFLE)
model = nn.Linear(5, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
for perm, digits in loader:
    print("perm", perm[0].tolist(), "digits", digits[0].tolist())
    optimizer.zero_grad()
    loss = F.cross_entropy(model(perm.float()), digits[:, 0])
    loss.backward()
    optimizer.step()
    print(f"loss {loss.item():.4f}")
    step += 1
    if step == args.steps:
        break
'''

EXAMPLE = re.compile(r"perm \[([0-9, ]+)\] digits \[([0-9, ]+)\]")


def _write(folder: Path, seeding: str, data: str = "draws") -> Path:
    folder.mkdir(parents=True)
    (folder / "data.py").write_text(DATA[data])
    (folder / "seeding.py").write_text(seeding)
    (folder / "train.py").write_text(TRAIN.replace("SHUFFLE", str(data == "order")))
    return folder


def _convert(src: Path, out: Path) -> list[str]:
    """``torch2jax convert`` (the installed command) of the folder; its notes' messages."""
    cli = [sys.executable, "-c", "from torch2jax.cli import app; app()"]
    report = out.parent / "report.json"
    done = subprocess.run([*cli, "convert", str(src), "-o", str(out), "--report", str(report)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("data.py", "seeding.py", "train.py"):
        assert "TODO(torch2jax)" not in (out / name).read_text(), name
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            found.extend([node["message"]] if isinstance(node.get("message"), str) else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(report.read_text()))
    return found


def _run(folder: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-W", "ignore", "train.py", *args], cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _data(out: str) -> list[tuple[list[int], list[int]]]:
    """The printed examples (the data order), checked to be what the Dataset draws."""
    examples = [([int(v) for v in p.split(",")], [int(v) for v in d.split(",")])
                for p, d in EXAMPLE.findall(out)]
    assert len(examples) == 3, out
    for perm, digits in examples:
        assert sorted(perm) == list(range(5)) and all(0 <= d < 10 for d in digits), out
    return examples


@pytest.mark.slow
@pytest.mark.parametrize(("seeding", "data"), [
    ("torch_only", "draws"), ("mingpt", "draws"), ("torch_only", "order")])
def test_the_seed_of_another_file_drives_the_data(seeding: str, data: str,
                                                  tmp_path: Path) -> None:
    """``draws``: the Dataset's own draws; ``order``: the loader's shuffle (in the script,
    which does not seed torch itself)."""
    pytest.importorskip("torch")
    src = _write(tmp_path / "torch", SEEDING[seeding], data)
    torch_1, torch_2 = _run(src, "--seed", "1"), _run(src, "--seed", "2")
    assert _data(torch_1) != _data(torch_2)  # torch: the seed decides the data
    _convert(src, tmp_path / "jax")
    runs = {s: [_run(tmp_path / "jax", "--seed", s) for _ in range(2)] for s in ("1", "2")}
    assert runs["1"][0] == runs["1"][1]  # the same seed: the same data and losses
    assert runs["2"][0] == runs["2"][1]
    assert _data(runs["1"][0]) != _data(runs["2"][0])  # another seed: other data


@pytest.mark.slow
def test_a_program_that_never_seeds_keeps_a_fixed_stream(tmp_path: Path) -> None:
    """No seed anywhere: the converted stream stays fixed, as it was (numpy's global
    generator seeded 0 where the dataset's file is imported), and a note says so; torch's
    would differ at every run."""
    pytest.importorskip("torch")
    unseeded = SEEDING["torch_only"].replace("    torch.manual_seed(seed)\n", "")
    src = _write(tmp_path / "torch", unseeded)
    report = _convert(src, tmp_path / "jax")
    first, second = (_run(tmp_path / "jax", "--seed", s) for s in ("1", "2"))
    assert first == second and _data(first)
    assert any("seeded with 0" in note for note in report), report


def test_a_seed_computed_by_a_call_is_marked_not_repeated() -> None:
    """``torch.manual_seed(int(time.time()))`` in a program whose dataset draws from numpy's
    global generator: evaluated twice, the call could give numpy and JAX two seeds, so numpy
    is not seeded with it and the line is marked."""
    source = DATA["draws"] + (
        "\n\nimport time\n\ntorch.manual_seed(int(time.time()))\n"
        "print(Shuffles()[0][1].tolist())\n")
    result = convert_source(source, path="data.py")
    assert "np.random.seed(" not in result.code
    assert "key = jax.random.key(int(time.time()))" in result.code
    assert any(d.severity == "error" and "computed by a call" in d.message
               for d in result.diagnostics), result.diagnostics
    assert "# TODO(torch2jax): the seed is computed by a call" in result.code


def test_the_seed_check_compares_numpy_seeds_by_name_and_value() -> None:
    """``verify --program``'s seed check for such a program: torch's ``manual_seed(s)`` is the
    converted ``np.random.seed(s)`` then ``jax.random.key(s)``. A converted program that
    seeds numpy with another value, or not at all, fails at that seed."""
    torch_seeds = [("random.seed", 7, 1), ("torch.manual_seed", 7, 1)]
    right = [("random.seed", 7, 1), ("np.random.seed", 7, 1), ("jax.random.key", 7, 1)]
    other = [("random.seed", 7, 1), ("np.random.seed", 8, 1), ("jax.random.key", 7, 1)]
    unseeded = [("random.seed", 7, 1), ("jax.random.key", 7, 1)]

    def failures(jax_seeds: list[tuple]) -> list[str]:
        r = ProgramResult("p.py", "", "nnx", 1)
        _compare_seeds(r, torch_seeds, jax_seeds, numpy_too=True)
        return [c.detail for c in r.failures("seed")]

    assert failures(right) == []
    assert failures(other) == [
        "torch torch.manual_seed(7), JAX np.random.seed(8), before step 1"]
    assert failures(unseeded) == [
        "torch torch.manual_seed(7), JAX jax.random.key(7), before step 1",
        "torch torch.manual_seed(7), JAX none, before step 1"]
