"""A reason the transformers sweep found under the previous release (5.23.0;
docs/transformers-sweep-5.23.md): a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified against torch (outputs and every
gradient)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

NO_GRAD = '''
import torch
from torch import nn


class Attention(nn.Module):
    """LayoutLMv3's shape before transformers 5.24: the relative-position bias is read out of
    its table under torch.no_grad(), so the table gets no gradient from it."""

    def __init__(self, dim=8, buckets=6, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.rel_pos_bias = nn.Linear(buckets, heads, bias=False)

    def bias(self, t):
        pos = torch.arange(t)
        rel = (pos[None, :] - pos[:, None]).clamp(-2, 3) + 2
        with torch.no_grad():
            table = self.rel_pos_bias.weight.t()[rel].permute(2, 0, 1)
            scale = self.out.weight.norm()
        return table.contiguous() * scale

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) + self.bias(t), dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, t, d)) + self.rel_pos_bias.weight.sum()
'''


def test_a_forwards_no_grad_block_stops_the_gradient(tmp_path: Path) -> None:
    """LayoutLMv3 under 5.23.0: "float64 differs as well: grad ...rel_pos_bias.weight: jax
    -0.0022 vs torch 0". The ``with torch.no_grad():`` block in the forward was dropped, so JAX
    differentiated through what torch does not; each tensor the block binds is
    ``jax.lax.stop_gradient(...)`` now: the outputs and every gradient are torch's (the table
    still gets the gradient of its read outside the block)."""
    path = tmp_path / "model.py"
    path.write_text(NO_GRAD)
    code = convert_source(NO_GRAD).code
    assert code.count("jax.lax.stop_gradient(") == 2, code
    r = run_request(VerifyRequest(target=f"{path}::Attention", inputs=("float32[2,5,8]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4
