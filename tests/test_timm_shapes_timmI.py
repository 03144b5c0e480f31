"""Shapes of timm's models (benchmarks/timm_sweep.py, docs/timm-sweep.md, issue 34: the torch
tensor API reached on JAX values at build and in the forward pass), each on a model of our own
written that way, converted, built and verified against torch (outputs and gradients).

* ``nn.Unfold`` and ``F.fold`` (timm's volo ``OutlookAttention``: the value's k x k
  neighbourhoods as columns, weighted, folded back; tnt's pixel embedding: ``nn.Unfold`` of
  the image into patches): torch's im2col and col2im, in its channel order (they were marked
  and left torch's, "im2col(): argument 'input' must be Tensor").
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


OUTLOOK = textwrap.dedent('''
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class OutlookAttention(nn.Module):
        def __init__(self, dim, num_heads=2, kernel_size=3, padding=1, stride=2):
            super().__init__()
            self.num_heads, self.kernel_size = num_heads, kernel_size
            self.padding, self.stride = padding, stride
            self.scale = (dim // num_heads) ** -0.5
            self.v = nn.Linear(dim, dim, bias=False)
            self.attn = nn.Linear(dim, kernel_size ** 4 * num_heads)
            self.proj = nn.Linear(dim, dim)
            self.unfold = nn.Unfold(kernel_size=kernel_size, padding=padding, stride=stride)
            self.pool = nn.AvgPool2d(kernel_size=stride, stride=stride)

        def forward(self, x):
            B, H, W, C = x.shape
            v = self.v(x).permute(0, 3, 1, 2)
            h, w = math.ceil(H / self.stride), math.ceil(W / self.stride)
            v = self.unfold(v).reshape(
                B, self.num_heads, C // self.num_heads, self.kernel_size * self.kernel_size,
                h * w).permute(0, 1, 4, 3, 2)
            attn = self.pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            attn = self.attn(attn).reshape(
                B, h * w, self.num_heads, self.kernel_size * self.kernel_size,
                self.kernel_size * self.kernel_size).permute(0, 2, 1, 3, 4)
            attn = (attn * self.scale).softmax(dim=-1)
            x = (attn @ v).permute(0, 1, 4, 3, 2).reshape(
                B, C * self.kernel_size * self.kernel_size, h * w)
            x = F.fold(x, output_size=(H, W), kernel_size=self.kernel_size,
                       padding=self.padding, stride=self.stride)
            return self.proj(x.permute(0, 2, 3, 1))


    class Net(nn.Module):
        def __init__(self, dim=8, patch=2, num_classes=3):
            super().__init__()
            self.stem = nn.Conv2d(3, dim, 3, padding=1)
            # tnt's pixel embedding: the image's patches as columns
            self.patches = nn.Unfold(kernel_size=patch, stride=patch)
            self.embed = nn.Linear(dim * patch * patch, dim)
            self.outlook = OutlookAttention(dim)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            B, _, H, W = x.shape
            x = self.patches(self.stem(x)).transpose(1, 2)
            x = self.embed(x).reshape(B, H // 2, W // 2, -1)
            return self.head(self.outlook(x).mean((1, 2)))
''')


def test_unfold_and_fold_in_torchs_channel_order(tmp_path):
    result = _verifies(tmp_path, OUTLOOK, "Net", "float32[2,3,8,12]")
    assert result.todos == 0
