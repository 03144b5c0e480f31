"""More of the transformers sweep's most common reasons (docs/transformers-sweep.md), each a
general rule on a module of our own in the modeling files' shape: converted, built with
torch's weights and verified against torch (outputs and every parameter's gradient)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

LAYER_NORM_VALUES = '''
import torch
from torch import nn

AliasLayerNorm = nn.LayerNorm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


NORM2FN = {"layer_norm": nn.LayerNorm, "rms_norm": RMSNorm}


class ChannelsNorm(nn.LayerNorm):
    def __init__(self, *args, data_format="channels_last", **kwargs):
        super().__init__(*args, **kwargs)
        self.data_format = data_format

    def forward(self, features):
        if self.data_format == "channels_first":
            features = features.permute(0, 2, 3, 1)
            features = super().forward(features)
            features = features.permute(0, 3, 1, 2)
        else:
            features = super().forward(features)
        return features


class Norms(nn.Module):
    """nn.LayerNorm as a value, called with torch's keywords: LayoutLM's alias, InternVL's
    (Qianfan-OCR's) table of norm classes, DINOv3-ConvNeXt's subclass built with
    ``*args, **kwargs``; eps differs from every default, so a dropped eps shows."""

    def __init__(self, width=8):
        super().__init__()
        self.a = AliasLayerNorm(width, eps=0.5)
        self.b = NORM2FN["layer_norm"](width, eps=0.25, elementwise_affine=True)
        self.r = NORM2FN["rms_norm"](width, eps=0.125)
        self.c = ChannelsNorm(width, eps=0.75, data_format="channels_first")
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        y = self.r(self.b(self.proj(self.a(x))))
        return self.c(y.permute(0, 3, 1, 2))
'''


def _verify(tmp_path: Path, source: str, target: str, *inputs: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    # the float32 pass (logits and every gradient) alone: the rules are dtype-free, CI's time
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs, float64=False))


def test_layer_norm_as_a_value_takes_torchs_keywords(tmp_path) -> None:
    r = _verify(tmp_path, LAYER_NORM_VALUES, "Norms", "float32[2,3,3,8]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


PARAMETER_OR_NONE = '''
import torch
from torch import nn


class Positions(nn.Module):
    """SAM-HQ's (DeepSeek-VL-hybrid's, PP-FormulaNet's) ``self.pos_embed = None``, then a
    parameter if a flag is set: NNX makes an attribute first set to None static."""

    def __init__(self, width=8, use_abs_pos=True):
        super().__init__()
        self.pos_embed = None
        if use_abs_pos:
            self.pos_embed = nn.Parameter(torch.linspace(-1.0, 1.0, 3 * width).view(1, 3, width))
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        x = self.proj(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed * x
        return x
'''


def test_a_parameter_first_set_to_none_is_data(tmp_path) -> None:
    r = _verify(tmp_path, PARAMETER_OR_NONE, "Positions", "float32[2,3,8]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


VALUE_CHECKS = '''
import torch
from torch import nn


def get_masks(slen, lengths):
    """XLM's (Flaubert's): a check of the lengths' values, then shapes of Python ints."""
    alen = torch.arange(slen, dtype=torch.long, device=lengths.device)
    assert lengths.max().item() <= slen
    torch._assert(lengths.min().item() >= 0, "negative lengths")  # the same, torch's form
    mask = alen < lengths[:, None]
    bs = lengths.size(0)
    assert mask.size() == (bs, slen)
    return mask


class Masked(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        bs, slen = x.size(0), x.size(1)
        # torchvision's ViT: torch._assert of a shape (an assert statement, kept)
        torch._assert(x.dim() == 3, f"Expected (batch_size, seq_length, hidden_dim) got {x.shape}")
        lengths = (x[..., 0] > 0).sum(dim=1).long()
        assert lengths.size(0) == bs
        mask = get_masks(slen, lengths)
        return self.proj(x) * mask[..., None].to(x.dtype)
'''


def test_a_check_of_array_values_is_left_out_under_jit(tmp_path) -> None:
    r = _verify(tmp_path, VALUE_CHECKS, "Masked", "float32[2,5,4]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


SHAPE_SUMS = '''
import torch
from torch import nn


class Boxes(nn.Module):
    """LiLT's ``torch.zeros(input_shape + (4,))``: a shape plus a tuple is a shape, not one
    size; so are a slice of sizes, a tuple repeated and LayoutLMv3's
    ``tuple(list(input_shape) + [4])``; ``expand(input_shape)``."""

    def __init__(self):
        super().__init__()
        self.box = nn.Linear(4, 3)

    def forward(self, input_ids, bbox=None):
        input_shape = input_ids.size()
        batch_size, seq_length = input_shape
        if bbox is None:
            bbox = torch.zeros(input_shape + (4,), dtype=torch.long, device=input_ids.device)
        boxes = torch.zeros(tuple(list(input_shape) + [4]), dtype=torch.long)
        ones = torch.ones(input_ids.shape[:-1] + (1,) * 2) + boxes.sum()
        tiles = torch.ones((2,) * 2)
        # Reformer's positions: expand(a name holding a shape)
        positions = torch.arange(seq_length, dtype=torch.float32).unsqueeze(0).expand(input_shape)
        out = self.box(bbox.float() + input_ids[..., None] + positions[..., None])
        return out * ones + tiles.sum()
'''


def test_a_shape_plus_a_tuple_is_a_shape(tmp_path) -> None:
    r = _verify(tmp_path, SHAPE_SUMS, "Boxes", "float32[2,5]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
