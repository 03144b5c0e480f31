"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's numerical comparison or weight transfer, each on a model of our own written that way,
converted, built and verified against torch.

* a Fourier position encoding computed in float32 on purpose (edgenext's and xcit's
  ``PositionalEncodingFourier``: ``mask.cumsum(1, dtype=torch.float32)``, a power, ``sin``,
  then ``.to(weight.dtype)``): torch's float64 model computes it in float32 too, and torch's
  float32 ``sin`` and ``pow`` differ from XLA's by a few ulps, so the float64 pass reported
  float32 rounding as a difference (1.4e-7 relative, over its 1e-10); the JAX side's float64
  trace now names the float32 arithmetic it was not given (verify/common.py's
  ``check_float64``) and the float32 pass decides, as for a softmax kept in float32.
"""

from __future__ import annotations

import textwrap

import pytest

from torch2jax.verify.run import VerifyRequest, run_request

FOURIER = textwrap.dedent('''
    import math

    import torch
    import torch.nn as nn


    class PositionalEncodingFourier(nn.Module):
        def __init__(self, hidden_dim=4, dim=6, temperature=10000.):
            super().__init__()
            self.token_projection = nn.Conv2d(hidden_dim * 2, dim, kernel_size=1)
            self.scale = 2 * math.pi
            self.temperature = temperature
            self.hidden_dim = hidden_dim

        def forward(self, shape):
            dtype = self.token_projection.weight.dtype
            inv_mask = ~torch.zeros(shape).to(dtype=torch.bool)
            y_embed = inv_mask.cumsum(1, dtype=torch.float32)
            x_embed = inv_mask.cumsum(2, dtype=torch.float32)
            y_embed = y_embed / (y_embed[:, -1:, :] + 1e-6) * self.scale
            x_embed = x_embed / (x_embed[:, :, -1:] + 1e-6) * self.scale
            dim_t = torch.arange(self.hidden_dim, dtype=torch.int64).to(torch.float32)
            dim_t = self.temperature ** (
                2 * torch.div(dim_t, 2, rounding_mode='floor') / self.hidden_dim)
            pos_x = x_embed[:, :, :, None] / dim_t
            pos_y = y_embed[:, :, :, None] / dim_t
            pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()),
                                dim=4).flatten(3)
            pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()),
                                dim=4).flatten(3)
            pos = torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)
            return self.token_projection(pos.to(dtype))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 6, 3, padding=1)
            self.pos = PositionalEncodingFourier()

        def forward(self, x):
            B, _, H, W = x.shape
            return self.conv(x) + self.pos((B, H, W))
''')


def test_a_position_encoding_computed_in_float32_on_purpose(tmp_path):
    (tmp_path / "model.py").write_text(FOURIER)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[1,3,5,7]",)))
    assert result.error is None, result.error
    assert result.passed, result.reason
    # the float32 pass decided, its gradients compared too; float64 was not run, and why
    assert [p.dtype for p in result.passes] == ["float32"], result.passes
    assert result.grad_max_abs_diff is not None
    assert "computes in float32 even in float64" in (result.float64_skipped or "")
    assert "model.py" in result.float64_skipped


def test_float32_values_moved_but_not_rounded_keep_the_float64_pass():
    import jax
    import jax.numpy as jnp

    from torch2jax.verify.common import Float32Inside, check_float64

    with jax.enable_x64(True):
        x = jnp.linspace(0.0, 1.0, 8, dtype=jnp.float64)

        def exact(x):  # float32 integers, sliced and widened: no rounding
            steps = jnp.arange(8).astype(jnp.float32)[::-1]
            return x * steps.astype(jnp.float64)

        def rounded(x):  # a float32 sine of float32 positions: float32 rounding
            steps = jnp.arange(8).astype(jnp.float32) / 3.0
            return x * jnp.sin(steps)

        check_float64(exact, x)
        with pytest.raises(Float32Inside, match="computes in float32 even in float64"):
            check_float64(rounded, x)
