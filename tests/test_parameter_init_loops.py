"""Initialisers applied to every parameter of a model in a loop, as the annotated
Transformer's ``make_model`` and PyTorch's tutorials write them::

    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)

Before, the loop was marked ("only Linear and Conv kernels have torch's fans in JAX's layout")
and kept as torch code, so the converted builder crashed. Now it walks the model's nnx.Param
variables and writes each one, with torch's fans: a transposed Linear or Conv kernel on its
last two axes, a parameter in torch's layout (an Embedding's table, a module's own 3-d
nn.Parameter) on axes 1 and 0. Each variant is checked against torch's own draws on the same
shapes: the bound (exact) and the spread (statistically) of every parameter.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source

MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(300, 40)
        self.conv = nn.Conv2d(20, 30, 3)
        self.proj = nn.Linear(40, 70)
        self.own = nn.Parameter(torch.empty(30, 50, 4))

    def forward(self, ids, img):
        return self.proj(self.embed(ids)).sum() + self.conv(img).sum() + self.own.sum()


def make_model():
    model = Net()
    LOOP
    return model
'''
VARIANTS = {
    "xavier_uniform": "for p in model.parameters():\n        if p.dim() > 1:\n"
                      "            nn.init.xavier_uniform_(p)",
    "xavier_normal_else_zeros": "for p in model.parameters():\n        if p.dim() > 1:\n"
                                "            nn.init.xavier_normal_(p, gain=2.0)\n"
                                "        else:\n            nn.init.zeros_(p)",
    "data_uniform": "for param in model.parameters():\n        param.data.uniform_(-0.08, 0.08)",
    "normal_by_size": "for p in model.parameters():\n        if len(p.shape) >= 2 and "
                      "p.numel() > 1000:\n            nn.init.normal_(p, mean=0.0, std=0.02)",
}


def _torch_params(loop: str) -> dict[int, np.ndarray]:
    namespace: dict = {}
    exec(compile(MODEL.replace("LOOP", loop), "<model>", "exec"), namespace)  # noqa: S102
    torch.manual_seed(0)
    return {p.numel(): p.detach().numpy() for p in namespace["make_model"]().parameters()}


def _jax_params(loop: str) -> dict[int, np.ndarray]:
    import jax
    from flax import nnx

    result = convert_source(MODEL.replace("LOOP", loop), path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "nnx.iter_graph(model)" in result.code
    namespace: dict = {}
    exec(compile(result.code, "<converted>", "exec"), namespace)  # noqa: S102
    model = namespace["make_model"](rngs=nnx.Rngs(0))
    return {int(np.prod(v.shape)): np.asarray(v) for v in
            jax.tree.leaves(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_loop_initialises_as_torch(variant):
    loop = VARIANTS[variant]
    ref, got = _torch_params(loop), _jax_params(loop)
    assert sorted(ref) == sorted(got)  # one parameter of each size
    for size, t in ref.items():
        j = got[size]
        t_std, j_std = float(t.std()), float(j.std())
        t_max = float(np.abs(t).max())
        if variant == "xavier_uniform" and t.ndim > 1:
            fan_in = t.shape[1] * math.prod(t.shape[2:])
            fan_out = t.shape[0] * math.prod(t.shape[2:])
            bound = math.sqrt(6 / (fan_in + fan_out))
            assert t_max <= bound and np.abs(j).max() <= bound * (1 + 1e-6)
            assert np.abs(j).max() > 0.95 * bound
        if variant == "xavier_normal_else_zeros" and t.ndim == 1:
            assert not j.any() and not t.any()
            continue
        if variant == "data_uniform":
            assert np.abs(j).max() <= 0.08 + 1e-7
        if variant == "normal_by_size" and t.size <= 1000:
            continue  # torch's and flax's own defaults: not the loop's
        if variant == "xavier_uniform" and t.ndim == 1:
            continue  # biases: not the loop's
        # the same distribution: the spreads agree within the sampling error
        assert abs(j_std - t_std) < 0.08 * t_std, (size, t_std, j_std)
