"""The transformers sweep's reasons of the JAX forward pass, fourteenth round
(docs/transformers-sweep.md): a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified against torch."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

CONV_GEOMETRY = '''
import torch
from torch import nn
import torch.nn.functional as F


def apply_same_padding(features: torch.Tensor, conv_layer: nn.Conv2d) -> torch.Tensor:
    in_height = int(features.shape[-2])
    in_width = int(features.shape[-1])
    stride_height, stride_width = conv_layer.stride
    kernel_height, kernel_width = conv_layer.kernel_size
    dilation_height, dilation_width = conv_layer.dilation
    if in_height % stride_height == 0:
        pad_h = max(kernel_height - stride_height, 0)
    else:
        pad_h = max(kernel_height - (in_height % stride_height), 0)
    if in_width % stride_width == 0:
        pad_w = max(kernel_width - stride_width, 0)
    else:
        pad_w = max(kernel_width - (in_width % stride_width), 0)
    left, top = pad_w // 2, pad_h // 2
    padding = (left * dilation_width, (pad_w - left) * dilation_width,
               top * dilation_height, (pad_h - top) * dilation_height)
    return F.pad(features, padding, "constant", 0.0)


class ConvLayer(nn.Module):
    def __init__(self, cin, cout, kernel_size, stride=1, dilation=1):
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, kernel_size=kernel_size, stride=stride,
                                     dilation=dilation, bias=False)

    def forward(self, x):
        return self.convolution(apply_same_padding(x, self.convolution))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = ConvLayer(3, 4, 3, stride=2)
        self.b = ConvLayer(4, 5, 3, dilation=2)
        self.head = nn.Linear(self.b.convolution.out_channels, 2)

    def forward(self, x):
        x = self.b(self.a(x))
        return self.head(x.mean((2, 3)))
'''


def test_a_convolutions_stride_and_dilation_read_off_the_layer(tmp_path: Path) -> None:
    """MobileNetV1/V2's "'Conv' object has no attribute 'stride'": TensorFlow's "SAME"
    padding computed from ``conv_layer.stride`` / ``.kernel_size`` / ``.dilation`` of a layer
    handed to a function (annotated ``nn.Conv2d``) reads NNX's ``strides`` and
    ``kernel_dilation``; an odd input size pads unevenly, so a wrong stride or dilation
    changes the output's shape or values. The outputs and every gradient are torch's."""
    path = tmp_path / "model.py"
    path.write_text(CONV_GEOMETRY)
    code = convert_source(CONV_GEOMETRY).code
    assert "conv_layer.strides" in code and "conv_layer.kernel_dilation" in code
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,3,9,7]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


COMPLEX_ROPE = '''
import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.unsqueeze(1)
    return torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.rotary = Rotary(4)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 2, 4).transpose(1, 2)
        positions = torch.arange(s)[None].expand(b, s)
        q = apply_rotary_emb(q, self.rotary(x, positions))
        return q.transpose(1, 2).reshape(b, s, 8)
'''


def test_a_rotary_embedding_through_complex_numbers(tmp_path: Path) -> None:
    """DeepSeek-V2's "polar(): argument 'abs' must be Tensor": its rotary embedding makes
    the frequencies unit complex numbers (``torch.polar``), multiplies the query's pairs read
    as complex numbers (``torch.view_as_complex``) by them and reads the product's parts back
    (``torch.view_as_real``); the outputs and every gradient are torch's."""
    path = tmp_path / "model.py"
    path.write_text(COMPLEX_ROPE)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,5,8]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_a_modeling_files_own_attention_interface() -> None:
    """Doge's "scaled_dot_product_attention(): argument 'query' must be Tensor": a modeling
    file's own ``AttentionInterface()`` (an entry of its own registered on it) is the support
    module's, so that ``get_interface`` hands the converted sdpa (not transformers' torch
    one), the file's own entry, or the eager default; the file's entry stays its own."""
    import pytest

    from torch2jax import transformers_runtime as rt

    def own(*args):
        return args

    def eager(*args):
        return args

    interface = rt.AttentionInterface()
    interface["own_attention"] = own
    assert interface.get_interface("own_attention", eager) is own
    assert interface.get_interface("sdpa", eager) is rt.sdpa_attention_forward
    assert interface.get_interface(None, eager) is rt.sdpa_attention_forward
    assert interface.get_interface("eager", eager) is eager
    assert "own_attention" in interface and "own_attention" not in rt.ALL_ATTENTION_FUNCTIONS
    with pytest.raises(NotImplementedError):
        rt.ALL_ATTENTION_FUNCTIONS.get_interface("own_attention", eager)


def test_a_tied_heads_weight_read_as_a_kernel() -> None:
    """Falcon-Mamba's "'_TiedHead' object has no attribute 'kernel'": the forward reads the
    tied head's weight (``self.lm_head.weight.dtype``, NNX's ``kernel``); the tied head's
    kernel is the embedding table transposed, the Linear it stands for."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from torch2jax import transformers_runtime as rt

    embed = nnx.Embed(5, 3, rngs=nnx.Rngs(0))
    head = rt._TiedHead(embed)
    x = jnp.arange(6.0).reshape(2, 3)
    assert head.kernel.shape == (3, 5) and head.kernel.dtype == embed.embedding[...].dtype
    np.testing.assert_allclose(x @ head.kernel, head(x), rtol=1e-6)
    np.testing.assert_allclose(head.kernel, np.asarray(embed.embedding[...]).T)


UNFLATTEN = '''
import torch
from torch import nn


def rotate_queries_or_keys(x, pos):
    d = x.size(-1)
    omega = torch.arange(d // 2, dtype=x.dtype) / (d / 2.0)
    freq = pos.unsqueeze(-1) * (1.0 / 10000**omega)
    emb_sin = freq.sin().repeat(1, 1, 2)
    emb_cos = freq.cos().repeat(1, 1, 2)
    y = x.unflatten(-1, (-1, 2))
    y1, y2 = y.unbind(dim=-1)
    y = torch.stack((-y2, y1), dim=-1).flatten(-2)
    return x * emb_cos + y * emb_sin


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).unflatten(2, (3, 8)).unbind(2)
        pos = torch.arange(s, dtype=x.dtype)[None].expand(b, s)
        q, k = rotate_queries_or_keys(q, pos), rotate_queries_or_keys(k, pos)
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
'''


def test_unflatten_of_a_tensor_the_converter_does_not_know(tmp_path: Path) -> None:
    """V-JEPA 2's "DynamicJaxprTracer has no attribute unflatten": ``x.unflatten(dim, sizes)``
    (a method only torch's tensors have, so on a parameter the converter knows nothing of too)
    is a reshape splitting the axis; the outputs and every gradient are torch's."""
    path = tmp_path / "model.py"
    path.write_text(UNFLATTEN)
    assert ".unflatten" not in convert_source(UNFLATTEN).code
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,5,8]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_a_dynamic_caches_mask_sizes_as_transformers() -> None:
    """Bloom's "'DynamicCache' object has no attribute 'get_mask_sizes'": the support
    module's cache answers transformers' ``get_mask_sizes(query_length, layer_idx)`` as
    transformers' own cache does, after the same updates (a layer updated, one not yet)."""
    import jax.numpy as jnp
    import torch
    from transformers.cache_utils import DynamicCache as TorchCache

    from torch2jax import transformers_runtime as rt

    ours, theirs = rt.DynamicCache(), TorchCache()
    for length in (3, 2):
        ours.update(jnp.zeros((1, 2, length, 4)), jnp.zeros((1, 2, length, 4)), 0)
        theirs.update(torch.zeros(1, 2, length, 4), torch.zeros(1, 2, length, 4), 0)
        for layer in (0, 1):
            assert ours.get_mask_sizes(4, layer) == tuple(
                int(v) for v in theirs.get_mask_sizes(4, layer))
    assert ours.get_mask_sizes(4, 0) == (9, 0)
