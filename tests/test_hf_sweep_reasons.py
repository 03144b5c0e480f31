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
        self.altup_projections = nn.ModuleList([nn.Linear(2, 2, bias=False) for _ in range(2)])

    def bias(self, length, device=None):
        if device is None:
            device = self.relative_attention_bias.weight.device
        positions = torch.arange(length, dtype=torch.long, device=device) % 6
        return self.relative_attention_bias(positions)

    def setup(self, batch, device, dtype):
        return torch.zeros(batch, 1, 2, device=device, dtype=dtype)

    def extend(self, x, pos_enc=None):
        if pos_enc is not None:
            if pos_enc.dtype != x.dtype or pos_enc.device != x.device:
                pos_enc = pos_enc.to(dtype=x.dtype, device=x.device)
            return pos_enc
        return torch.zeros_like(x)

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
        out = out + start + self.extend(out, out * 2)
        # Gemma 3n's altup: what an item of a ModuleList returns is a tensor (its .to too)
        for i in range(1, 3):
            altup_proj = self.altup_projections[i - 1](out)
            out = out + altup_proj.to(dtype=out.dtype, device=out.device)
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
    # the float32 pass (logits and every gradient) alone: the rules are dtype-free, CI's time
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs, float64=False))


def test_a_tensors_device_read_as_a_value_verifies_under_jit(tmp_path) -> None:
    r = _verify(tmp_path, DEVICE_READS, "Positions", "float32[2,4,8]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


POOL_OR_NONE = '''
import types

import torch
from torch import nn


class ConvBlock(nn.Module):
    """SuperPoint's (SuperGlue's) block: a pooling layer or None, picked by a flag, called
    after a None test; the layer takes the channels-last layout its convolutions take."""

    def __init__(self, in_channels=3, out_channels=4, add_pooling=True, config=None):
        super().__init__()
        config = config or types.SimpleNamespace(tubelet_size=[1, 2])
        # ViViT's and Qianfan-OCR's kernel_size=tubelet_size (config.tubelet_size, a list):
        # indexed beside, so a sequence, not an int repeated
        tubelet_size = config.tubelet_size
        self.frames = 6 // tubelet_size[0]
        self.conv_a = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2) if add_pooling else None
        self.last = nn.Conv2d(out_channels, out_channels, kernel_size=tubelet_size,
                              stride=tubelet_size)

    def forward(self, hidden_states):
        hidden_states = self.relu(self.conv_a(hidden_states))
        if self.pool is not None:
            hidden_states = self.pool(hidden_states)
        return self.last(hidden_states)
'''


def test_a_pooling_layer_or_none_and_indexed_kernel_sizes_verify(tmp_path) -> None:
    r = _verify(tmp_path, POOL_OR_NONE, "ConvBlock", "float32[2,3,6,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


CACHED = '''
import torch
from torch import nn

from ...modeling_utils import ALL_ATTENTION_FUNCTIONS
from ...pytorch_utils import compile_compatible_method_lru_cache


@compile_compatible_method_lru_cache(maxsize=32)
def patch_centers(height: int, width: int, dtype: torch.dtype, device: torch.device):
    """DINOv3's (EoMT-DINOv3's, EfficientLoFTR's, the DETRs' anchors: 65 files) coordinates,
    cached by transformers for each size."""
    rows = torch.arange(0.5, height, dtype=dtype, device=device) / height
    cols = torch.arange(0.5, width, dtype=dtype, device=device) / width
    return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).flatten(0, 1)


class Rope(nn.Module):
    """With an attention of the MLA kind (DeepSeek-V3's, Mistral 4's, GLM-4-MoE-Lite's):
    queries and keys of 6 per head, values of 4, through transformers' sdpa function."""

    def __init__(self, width=2, heads=2):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.heads, self.scaling, self.is_causal = heads, 6 ** -0.5, True
        self.q_proj = nn.Linear(width, heads * 6)
        self.k_proj = nn.Linear(width, heads * 6)
        self.v_proj = nn.Linear(width, heads * 4)

    @compile_compatible_method_lru_cache(maxsize=1)
    def anchors(self, n: int, dtype: torch.dtype):
        return torch.linspace(0.0, 1.0, n, dtype=dtype)

    def forward(self, x):
        coords = patch_centers(2, 3, dtype=x.dtype, device=x.device)
        h = self.proj(x) * coords + self.anchors(6, x.dtype)[:, None]
        q = self.q_proj(h).view(1, 6, self.heads, 6).transpose(1, 2)
        k = self.k_proj(h).view(1, 6, self.heads, 6).transpose(1, 2)
        v = self.v_proj(h).view(1, 6, self.heads, 4).transpose(1, 2)
        attention = ALL_ATTENTION_FUNCTIONS["sdpa"]
        out, _ = attention(self, q, k, v, None, dropout=0.0, scaling=self.scaling)
        return out.reshape(6, self.heads * 4)
'''
NAME = "transformers.models.rope.modeling_rope"


def test_transformers_method_cache_and_mla_sdpa_under_jit_and_grad(tmp_path) -> None:
    """A cache of the arrays a traced function built leaks them out of their trace (the
    gradient after the forward failed with an UnexpectedTracerError): jax.jit caches the
    compiled computation; the converted file caches nothing. The support module's sdpa takes
    values of another head size than the queries' (jax.nn.dot_product_attention refused)."""
    import importlib
    import sys

    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest
    import torch
    from flax import nnx

    pytest.importorskip("transformers", exc_type=ImportError)
    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling, write_support_modules

    space: dict = {"__name__": NAME, "__package__": NAME.rpartition(".")[0]}
    exec(compile(CACHED, "torch_rope", "exec"), space)  # noqa: S102
    reduced, unknown = reduce_modeling(CACHED, NAME)
    assert unknown == []
    code = convert_source(reduced).code
    assert "TODO(torch2jax)" not in code, code
    package = tmp_path / "t2j_cached"
    (package / "models" / "rope").mkdir(parents=True)
    for folder in (package, package / "models", package / "models" / "rope"):
        (folder / "__init__.py").write_text("")
    write_support_modules(package)
    (package / "models" / "rope" / "modeling_rope.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    try:
        jax_module = importlib.import_module("t2j_cached.models.rope.modeling_rope")
    finally:
        sys.path.remove(str(tmp_path))
    torch.manual_seed(0)
    torch_model = space["Rope"]()
    jax_model = jax_module.Rope(rngs=nnx.Rngs(0))
    for name in ("proj", "q_proj", "k_proj", "v_proj"):
        layer, weights = getattr(jax_model, name), getattr(torch_model, name)
        layer.kernel.value = jnp.asarray(weights.weight.detach().numpy().T)
        layer.bias.value = jnp.array(weights.bias.detach().numpy())
    x = np.random.default_rng(0).standard_normal((6, 2)).astype(np.float32)
    out = torch_model(torch.from_numpy(x))
    out.square().sum().backward()
    forward = nnx.jit(lambda mdl, v: mdl(v))
    np.testing.assert_allclose(np.asarray(forward(jax_model, jnp.asarray(x))),
                               out.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = nnx.jit(nnx.grad(lambda mdl, v: jnp.sum(jnp.square(mdl(v)))))(
        jax_model, jnp.asarray(x))
    for name in ("proj", "q_proj", "k_proj", "v_proj"):
        np.testing.assert_allclose(np.asarray(getattr(grads, name).kernel.value),
                                   getattr(torch_model, name).weight.grad.numpy().T,
                                   rtol=1e-4, atol=1e-6)
    assert jax.tree.leaves(grads)
