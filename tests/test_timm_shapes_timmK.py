"""Shapes of timm's models (benchmarks/timm_sweep.py, docs/timm-sweep.md, issue 34: torch's
tensor and dtype API reached on JAX values at build), each on a model of our own written that
way, converted, built and checked against torch.

* a fill of a weight reached through a loop over a container's modules (timm's
  swin_transformer_v2 ``_init_respostnorm``: ``for blk in self.blocks:
  nn.init.constant_(blk.norm1.weight, 0)``, the norm built from a ``norm_layer`` handed in):
  the layer's type is not known there, and an elementwise fill does not depend on the
  layout, so the parameter is found at run time (the ``layer_weight`` helper: a kernel, a
  scale, an embedding, or a module of the user's own that keeps torch's name ``weight``). It
  was marked and kept torch's, "'ArrayImpl' object has no attribute 'fill_'".
* ``nn.init.uniform_(self.A, *self.a_init_range)`` (timm's efficientvim ``HSMSSD``): the
  bounds spread from a sequence, ``jax.random.uniform``'s minval and maxval in that order (it
  was marked, "of a computed tensor", and kept torch's: "'ArrayImpl' object has no attribute
  'uniform_'").
* a dtype read from a value the analysis does not know, held by a name (timm's
  efficientvit_mit ``LiteMLA._attn``: ``dtype = v.dtype``, the attention in float32, then
  ``out.to(dtype)``): ``astype(dtype)`` (it was read as ``.to(other_tensor)``,
  ``astype(dtype.dtype)``: "'numpy.dtypes.Float64DType' object has no attribute 'dtype'");
  and ``x.is_floating_point()`` / ``torch.is_floating_point(x)`` (no rule):
  ``jnp.issubdtype(x.dtype, jnp.floating)``.
"""

from __future__ import annotations

import textwrap

import numpy as np
import torch
from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source

RESPOSTNORM = textwrap.dedent('''
    import math

    import torch
    import torch.nn as nn


    class RmsNorm(nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))
            self.bias = nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            return x * self.weight + self.bias


    class Block(nn.Module):
        def __init__(self, dim, norm_layer=nn.LayerNorm):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.norm1 = norm_layer(dim)

        def forward(self, x):
            return x + self.norm1(self.fc(x))


    class Stage(nn.Module):
        def __init__(self, dim, depth=2, norm_layer=nn.LayerNorm):
            super().__init__()
            self.blocks = nn.ModuleList([Block(dim, norm_layer) for _ in range(depth)])
            self.logit_scale = nn.Parameter(torch.empty(dim))
            nn.init.constant_(self.logit_scale, math.log(2))

        def _init_respostnorm(self):
            for blk in self.blocks:
                nn.init.constant_(blk.norm1.bias, 0)
                nn.init.constant_(blk.norm1.weight, 0)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return x * self.logit_scale


    class Net(nn.Module):
        def __init__(self, dim=8):
            super().__init__()
            self.layers = nn.ModuleList([Stage(dim), Stage(dim, norm_layer=RmsNorm)])
            self.init_weights()

        def init_weights(self):
            for bly in self.layers:
                bly._init_respostnorm()

        def forward(self, x):
            for stage in self.layers:
                x = stage(x)
            return x
''')


def test_a_weight_filled_through_a_loop_over_a_containers_modules():
    """Every residual branch is zeroed by the fills, so the built model's output is torch's
    whatever its linear layers drew: the built JAX model is compared with torch's as built, no
    weight transfer (a fill left undone leaves a branch of random weights in)."""
    import jax.numpy as jnp
    from flax import nnx

    result = convert_source(RESPOSTNORM, path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    assert "layer_weight(blk.norm1).value = " in result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(RESPOSTNORM, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    with torch.no_grad():
        want = ns_t["Net"]()(torch.from_numpy(x)).numpy()
    net = ns_j["Net"](rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(net(jnp.asarray(x))), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(want, x * np.log(2) ** 2, rtol=1e-5)  # torch's branches are zero
    # the LayerNorm's scale and the norm of our own's torch-named weight, both set to zero
    np.testing.assert_array_equal(np.asarray(net.layers[0].blocks[1].norm1.scale[...]), 0.0)
    np.testing.assert_array_equal(np.asarray(net.layers[1].blocks[0].norm1.weight[...]), 0.0)


SPREAD_BOUNDS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Ssd(nn.Module):
        def __init__(self, state_dim=4096, a_init_range=(1, 16)):
            super().__init__()
            self.a_init_range = a_init_range
            self.A = nn.Parameter(torch.empty(state_dim))
            self.D = nn.Parameter(torch.zeros(1))
            self.reset_parameters()

        def reset_parameters(self):
            nn.init.uniform_(self.A, *self.a_init_range)
            nn.init.ones_(self.D)

        def forward(self, x):
            return x * -torch.exp(self.A) + self.D
''')


def test_uniform_bounds_spread_from_a_sequence():
    """The drawn parameter's distribution is torch's U(1, 16) (4096 draws: the mean within 4
    standard errors of 8.5, the range filled), and the module computes torch's function of it
    (the parameters copied into torch's module)."""
    import jax.numpy as jnp
    from flax import nnx

    result = convert_source(SPREAD_BOUNDS, path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(SPREAD_BOUNDS, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    ssd = ns_j["Ssd"](rngs=nnx.Rngs(0))
    a = np.asarray(ssd.A[...])
    assert a.shape == (4096,) and a.min() >= 1.0 and a.max() < 16.0
    assert a.min() < 1.1 and a.max() > 15.9
    assert abs(a.mean() - 8.5) < 4 * 15 / np.sqrt(12 * 4096)
    torch_ssd = ns_t["Ssd"]()
    with torch.no_grad():
        torch_ssd.A.copy_(torch.tensor(a))
        x = np.linspace(-1.0, 1.0, 4096, dtype=np.float32)
        want = torch_ssd(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ssd(jnp.asarray(x))), want, rtol=1e-6)


DTYPE_HELD = textwrap.dedent('''
    import torch


    def attn(q, k, v, eps=1e-6):
        dtype = v.dtype
        q, k, v = q.float(), k.float(), v.float()
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + eps)
        return out.to(dtype)


    def f(x, v):
        y = x.float() * 0.5 + (1.0 if x.is_floating_point() else 2.0)
        if torch.is_floating_point(y):
            y = y + 1.0
        return y.to(x.dtype) + attn(v, v, v).sum(-1, keepdim=True)
''')


def test_a_dtype_held_by_a_name_and_the_float_test():
    """Integer input: the cast back to its dtype truncates (torch's and JAX's alike), the float
    test takes the integer branch for ``x`` and the float one for ``y``; the attention casts
    back to its value's dtype."""
    x = np.array([[[1, -3, 2, 1], [4, 1, 0, 7]], [[-1, 2, 5, 1], [3, 3, -2, 1]]], np.int32)
    v = np.random.default_rng(0).uniform(0.5, 1.5, (2, 2, 4)).astype(np.float32)
    result = assert_function_matches_torch(DTYPE_HELD, x, v, rtol=1e-5)
    assert "astype(dtype)" in result.code and "jnp.issubdtype(y.dtype, jnp.floating)" in (
        result.code)
