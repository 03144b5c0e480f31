"""Shapes of batched torch code that the equinox target used to refuse (issue 32, item 1): an
einsum, a layer in the NNX translation's channels-last region, a loop over a list of layers
handed to the constructor. Each module is converted to equinox, built, and checked against
torch (outputs and gradients, float32 on CPU, the per-example model under ``jax.vmap``); the
shapes whose per-example meaning cannot be shown stay marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

EINSUM = '''
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.scale = nn.Parameter(torch.ones(d))

    def forward(self, x):
        B, T, C = x.size()
        q = self.q(x)
        k = self.k(x)
        s = torch.einsum("btc,bsc->bts", q, k) / 4.0
        a = s.softmax(dim=-1)
        y = torch.einsum("bts,bsc->btc", a, self.v(x))
        return torch.einsum("...c,c->...c", y, self.scale)
'''

# torch's permute of a channel-first activation, then a Sequential of vector layers
PERMUTE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.mlp = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))

    def forward(self, x):
        x = self.conv(x)
        x = x.permute(0, 2, 3, 1)
        x = self.mlp(x)
        return x.mean(dim=(1, 2))
'''

# a Sequential with dropout inside the NNX translation's channels-last region
CHANNELS_LAST = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.1),
                                  nn.GroupNorm(2, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        x = self.conv(x)
        x = self.body(x)
        return self.head(x.mean(dim=(2, 3)))
'''

# a ModuleList of layers handed to the constructor, looped over in forward
LOOP = '''
import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, layers, width=8):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stack = Stack([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.deep = Stack(layers=[nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        return self.stack(x) + self.deep(x)
'''

# vector layers on a value whose rank per example no line states: mapped over the leading
# axes it has when traced (the over_leading helper)
UNKNOWN_RANK = '''
import torch
import torch.nn as nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.ln = nn.LayerNorm(4)

    def forward(self, x):
        h = x[..., :8]
        return self.ln(torch.tanh(self.fc(h)))
'''

CASES = {
    "einsum": (EINSUM, "Attn", "float32[2,5,16]"),
    "permute": (PERMUTE, "Net", "float32[2,3,6,6]"),
    "channels_last": (CHANNELS_LAST, "Net", "float32[2,3,6,6]"),
    "loop": (LOOP, "Model", "float32[3,8]"),
    "unknown_rank": (UNKNOWN_RANK, "Head", "float32[2,3,5,10]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_formerly_refused_shape_converts_and_matches_torch(case: str, tmp_path: Path) -> None:
    source, name, shape = CASES[case]
    result = convert_source(source, target="equinox")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    path = tmp_path / f"{case}.py"
    path.write_text(source)
    r = verify(f"{path}::{name}", inputs=[shape], jax_target="equinox", grad=True)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.max_abs_diff is not None and r.max_abs_diff <= 1e-5, r.to_json()
    # the gradients of unknown_rank sum over 30 rows per example (values near 40): 1e-4
    # absolute is 8e-7 relative there
    tol = 1e-4 if case == "unknown_rank" else 1e-5
    assert r.grad_max_abs_diff is not None and r.grad_max_abs_diff <= tol, r.to_json()
    assert r.passed, r.mismatch


MIXING = '''
import torch
import torch.nn as nn


class Gram(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.einsum("bi,bj->ij", h, h)
'''


def test_an_einsum_over_the_batch_stays_marked() -> None:
    """``bi,bj->ij`` sums over the batch: no per-example form, so the line is marked."""
    result = convert_source(MIXING, target="equinox")
    line = next(ln for ln in result.code.splitlines() if "einsum" in ln and "TODO" not in ln)
    at = result.code.splitlines().index(line)
    assert "TODO(torch2jax): jnp.einsum that sums over or moves the batch axis" in \
        result.code.splitlines()[at - 1]
    assert any(d.severity == "error" and "einsum" in d.message for d in result.diagnostics)


def test_a_loop_over_layers_of_several_kinds_stays_marked() -> None:
    """One call passes Linear layers, another LayerNorms: the loop body's calls have no
    single per-example form, so the loop is marked."""
    source = LOOP.replace("self.deep = Stack(layers=[nn.Linear(8, 8) for _ in range(3)])",
                          "self.deep = Stack(layers=[nn.LayerNorm(8)])")
    result = convert_source(source, target="equinox")
    assert "# TODO(torch2jax): a loop over a list of unknown layers [equinox]" in result.code
