"""Shapes of timm's forward passes (benchmarks/timm_sweep.py, docs/timm-sweep.md, the ninth
run: forward and dtypes), each on a model of our own written that way, converted, built and
verified against torch (outputs and gradients).

* a split by sizes held in an attribute, unpacked (timm's inception_next and mambaout:
  ``self.split_indexes = (in_chs - 3 * gc, gc, gc, gc)``, then ``x_id, x_hw, x_w, x_h =
  torch.split(x, self.split_indexes, dim=1)``): the attribute holds a tuple of sizes, not a
  chunk size (it was read as one, "'tuple' object cannot be interpreted as an integer").
* a dtype's properties (timm's pos_embed_sincos ``_freq_buffer_dtype``, qwen3_vit: ``if
  dtype.is_floating_point and torch.finfo(dtype).bits < 32``, of ``dtype`` or
  ``torch.get_default_dtype()``): ``jnp.issubdtype(dtype, jnp.floating)`` (it was left, "type
  object 'float32' has no attribute 'is_floating_point'").
* ``F.interpolate`` by a scale factor held by a name (timm's coat: ``interpolate(self, x,
  scale_factor: float, size)``, called with ``factor`` and ``1.0 / factor``; bilinear,
  ``recompute_scale_factor=False``): output sizes ``floor(d * f)``, mapped with ``f`` as
  torch does (it was marked and left torch's, "DynamicJaxprTracer has no attribute dim"); and
  ``nn.Upsample(scale_factor=stride, mode='bilinear')`` so (efficientformer_v2).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch (forward and
    gradients, float32 then float64) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


SPLIT_UNPACKED = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class InceptionMixer(nn.Module):
        def __init__(self, in_chs, branch_ratio=0.25):
            super().__init__()
            gc = int(in_chs * branch_ratio)
            self.dwconv_hw = nn.Conv2d(gc, gc, 3, padding=1, groups=gc)
            self.dwconv_w = nn.Conv2d(gc, gc, (1, 3), padding=(0, 1), groups=gc)
            self.dwconv_h = nn.Conv2d(gc, gc, (3, 1), padding=(1, 0), groups=gc)
            self.split_indexes = (in_chs - 3 * gc, gc, gc, gc)

        def forward(self, x):
            x_id, x_hw, x_w, x_h = torch.split(x, self.split_indexes, dim=1)
            return torch.cat(
                (x_id, self.dwconv_hw(x_hw), self.dwconv_w(x_w), self.dwconv_h(x_h)), dim=1)


    class GatedMlp(nn.Module):
        def __init__(self, dim, hidden, conv_channels):
            super().__init__()
            self.fc1 = nn.Linear(dim, 2 * hidden)
            self.split_indices = [hidden, hidden - conv_channels, conv_channels]
            self.fc2 = nn.Linear(hidden, dim)

        def forward(self, x):
            g, i, c = self.fc1(x).split(self.split_indices, dim=-1)
            return self.fc2(g.sigmoid() * torch.cat((i, c.tanh()), dim=-1))


    class Net(nn.Module):
        def __init__(self, chs=10, num_classes=3):
            super().__init__()
            self.stem = nn.Conv2d(3, chs, 3, padding=1)
            self.mixer = InceptionMixer(chs)
            self.mlp = GatedMlp(chs, 6, 2)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            x = self.mixer(self.stem(x)).permute(0, 2, 3, 1)
            return self.head(self.mlp(x).mean((1, 2)))
''')


def test_a_split_by_sizes_held_in_an_attribute_unpacked(tmp_path):
    result = _verifies(tmp_path, SPLIT_UNPACKED, "Net", "float32[2,3,6,6]")
    assert result.todos == 0


DTYPE_PROPERTIES = textwrap.dedent('''
    from typing import Optional

    import torch
    import torch.nn as nn


    def _buffer_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
        """At least float32 (a half dtype's positions would round)."""
        if dtype is None:
            dtype = torch.get_default_dtype()
        if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
            return torch.float32
        return dtype


    class Net(nn.Module):
        def __init__(self, dim=8, num_classes=3, dtype=None):
            super().__init__()
            bdtype = _buffer_dtype(dtype)
            self.fc = nn.Linear(dim, num_classes)
            self.pos = nn.Parameter(torch.linspace(0.0, 1.0, dim, dtype=bdtype))
            self.complex_input = bdtype.is_complex

        def forward(self, x):
            if x.dtype.is_floating_point and not self.complex_input:
                x = x + self.pos
            return self.fc(x)
''')


def test_a_dtypes_properties_are_jax_dtype_tests(tmp_path):
    result = _verifies(tmp_path, DTYPE_PROPERTIES, "Net", "float32[2,8]")
    assert result.todos == 0


INTERPOLATE_BY_A_NAME = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class FactorAtt(nn.Module):
        def __init__(self, dim=4, factor=2.0):
            super().__init__()
            self.factor = factor
            self.proj = nn.Linear(dim, dim)

        def interpolate(self, x, scale_factor: float, size):
            B, N, C = x.shape
            H, W = size
            cls_token, img_tokens = x[:, :1, :], x[:, 1:, :]
            img_tokens = img_tokens.transpose(1, 2).reshape(B, C, H, W)
            img_tokens = F.interpolate(img_tokens, scale_factor=scale_factor,
                                       recompute_scale_factor=False, mode="bilinear",
                                       align_corners=False)
            img_tokens = img_tokens.reshape(B, C, -1).transpose(1, 2)
            return torch.cat((cls_token, img_tokens), dim=1)

        def forward(self, x, size):
            up = self.interpolate(x, scale_factor=self.factor, size=size)
            down = self.interpolate(x, scale_factor=1.0 / self.factor, size=size)
            return self.proj(up).mean(1) + self.proj(down).mean(1)


    class Attention2d(nn.Module):  # efficientformer_v2's stride-2 attention
        def __init__(self, dim=4, stride=2):
            super().__init__()
            self.conv = nn.Conv2d(dim, dim, 3, stride=stride, padding=1)
            self.upsample = nn.Upsample(scale_factor=stride, mode="bilinear")

        def forward(self, x):
            return self.upsample(self.conv(x))


    class Net(nn.Module):
        def __init__(self, dim=4, num_classes=3):
            super().__init__()
            self.att = FactorAtt(dim)
            self.att2d = Attention2d(dim)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            B, N, C = x.shape
            grid = self.att2d(x[:, 1:].transpose(1, 2).reshape(B, C, 6, 6)).mean((2, 3))
            return self.head(self.att(x[:, :26], (5, 5)) + grid)
''')


def test_interpolate_by_a_scale_factor_held_by_a_name(tmp_path):
    result = _verifies(tmp_path, INTERPOLATE_BY_A_NAME, "Net", "float32[2,37,4]")
    assert result.todos == 0
