"""The most common reasons of the transformers sweep (docs/transformers-sweep.md), each a
general rule on a module of our own in the modeling files' shape: converted, built with
torch's weights and verified against torch (outputs and every parameter's gradient)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

DEVICE_READS = '''
import torch
from torch import nn


def patch_coordinates(height: int, width: int, dtype: torch.dtype, device: torch.device):
    """DINOv3's and Sapiens2's helper: a device passed in and handed on to torch.arange."""
    rows = torch.arange(0.5, height, dtype=dtype, device=device) / height
    cols = torch.arange(0.5, width, dtype=dtype, device=device) / width
    return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).flatten(0, 1)


class Positions(nn.Module):
    """A tensor's ``.device`` read as a value, as the sweep's rows read it: bound and handed to
    a helper (LayoutLMv3, DINOv3, Sapiens2), a layer weight's device chosen by a condition
    (LongT5), passed positionally (RecurrentGemma) and compared (FastSpeech2-Conformer); then
    the tensor methods and spread sizes the same rows stopped at next."""

    def __init__(self, width=8):
        super().__init__()
        self.relative_attention_bias = nn.Embedding(6, 2)
        self.proj = nn.Linear(width, 2)
        self.register_buffer("table", torch.ones(4, 2), persistent=False)

    def bias(self, length, device=None):
        if device is None:
            device = self.relative_attention_bias.weight.device
        positions = torch.arange(length, dtype=torch.long, device=device) % 6
        return self.relative_attention_bias(positions)

    def setup(self, batch, device, dtype):
        return torch.zeros(batch, 1, 2, device=device, dtype=dtype)

    def forward(self, pixel_values):
        device = pixel_values.device
        coords = patch_coordinates(2, 2, dtype=torch.float32, device=device)
        target_device = (
            self.relative_attention_bias.weight.device
            if self.relative_attention_bias.weight.device.type != "meta"
            else None
        )
        table = self.table
        if table.dtype != pixel_values.dtype or table.device != pixel_values.device:
            table = table.to(dtype=pixel_values.dtype, device=pixel_values.device)
        start = self.setup(pixel_values.shape[0], pixel_values.device, pixel_values.dtype)
        out = self.proj(pixel_values) + coords * table + self.bias(4, device=target_device)
        out = out + start
        # DINOv3's ``angles.tile(2)``, PEGASUS-X's ``torch.ones(*x.shape[:-1], ...)`` and the
        # MLA attentions' keys (Mistral 4, GLM-4-MoE-Lite, Youtu): ``new_empty`` of spread
        # sizes, filled through ``copy_`` of two slices
        angles = coords.tile(2)
        mask = torch.ones(
            *pixel_values.shape[:-1], dtype=pixel_values.dtype, device=pixel_values.device
        )
        key_states = out.new_empty(*out.shape[:-1], 2 + angles.shape[-1])
        key_states[..., :2].copy_(out)
        key_states[..., 2:].copy_(angles * mask[..., None])
        return key_states
'''


def _verify(tmp_path: Path, source: str, target: str, *inputs: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs))


def test_a_tensors_device_read_as_a_value_verifies_under_jit(tmp_path) -> None:
    r = _verify(tmp_path, DEVICE_READS, "Positions", "float32[2,4,8]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4
