"""Shapes of timm's models (benchmarks/timm_sweep.py, docs/timm-sweep.md, issue 34: the torch
tensor API reached on JAX values at build and in the forward pass), each on a model of our own
written that way, converted, built and verified against torch (outputs and gradients).

* ``nn.Unfold`` and ``F.fold`` (timm's volo ``OutlookAttention``: the value's k x k
  neighbourhoods as columns, weighted, folded back; tnt's pixel embedding: ``nn.Unfold`` of
  the image into patches): torch's im2col and col2im, in its channel order (they were marked
  and left torch's, "im2col(): argument 'input' must be Tensor").
* a tensor written into a layer's weight at build (timm's convit ``local_init``:
  ``self.v.weight.data.copy_(torch.eye(self.dim))``, ``self.pos_proj.weight.data[:, -1] = -1``,
  ``self.pos_proj.weight.data *= locality_strength``): the flax parameter rebound in its own
  layout (they were marked and left, "'ArrayImpl' object has no attribute 'copy_'"; torch.eye
  had no rule). Every parameter is set, not drawn, so the built JAX model must compute torch's
  outputs with its own parameters, no weight transfer.
* layers called in a comprehension over a ModuleList (timm's selective_kernel, sknet:
  ``[op(x_split[i]) for i, op in enumerate(self.paths)]``; ``[op(x) for op in self.paths]``
  alone too): the comprehension's ``for`` is bound before its element, so the channels-last
  convolutions are called between transposes (they were called on the channels-first input:
  a shape error, or wrong values where channels and width agree).
* constants of a transform computed at build (timm's csatv2 DCT kernels): factory keywords
  gathered as ``dd = dict(device=device, dtype=dtype)`` and passed as ``**dd`` (the literal
  ``{"device": ..., "dtype": ...}`` was known, the ``dict(...)`` call was not: the calls were
  marked and left torch's, "copy requires ndarray or scalar arguments, got torch.Tensor"),
  ``torch.eye``, ``torch.fft.fft``, ``torch.linalg.inv`` and ``torch.pi``.
* ``F.interpolate(t, size=n, mode="linear")`` with ``n`` a number held by a name (timm's
  vision_transformer_sam ``get_rel_pos``: ``max_rel_dist = int(2 * max(q, k) - 1)``): every
  spatial axis' size (it was unpacked as a tuple of sizes, ``*max_rel_dist``).
"""

from __future__ import annotations

import textwrap

import numpy as np
import torch
from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source
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


LAYER_WEIGHT_WRITES = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, dim=4, strength=0.5):
            super().__init__()
            self.dim = dim
            self.v = nn.Linear(dim, dim)
            self.pos = nn.Linear(dim, 3)
            self.conv = nn.Conv2d(2, 3, (2, 3))
            self.local_init(strength)

        def local_init(self, strength):
            self.v.weight.data.copy_(torch.eye(self.dim))
            self.v.bias.data.copy_(torch.arange(self.dim) / 4.0)
            self.pos.weight.data.copy_(torch.arange(self.dim) / 8.0)  # a row, broadcast
            self.pos.weight.data[:, -1] = -1
            self.pos.weight.data[1] += 0.25
            self.pos.weight.data *= strength
            self.pos.weight.data *= torch.tensor([1.0, 2.0, 3.0])[:, None]
            self.pos.bias.data.copy_(torch.tensor(0.5))
            self.conv.weight.data.copy_(torch.arange(36.0).reshape(3, 2, 2, 3) / 36)
            self.conv.weight.data[2, 1, 0] = 0.0
            self.conv.bias.data.copy_(torch.ones(3))

        def forward(self, x, img):
            return self.pos(self.v(x)), self.conv(img)
''')


def test_tensors_written_into_layer_weights_at_build():
    import jax.numpy as jnp
    from flax import nnx

    result = convert_source(LAYER_WEIGHT_WRITES, path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(LAYER_WEIGHT_WRITES, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    img = rng.standard_normal((2, 2, 5, 6)).astype(np.float32)
    with torch.no_grad():
        want = ns_t["Net"]()(torch.from_numpy(x), torch.from_numpy(img))
    got = ns_j["Net"](rngs=nnx.Rngs(0))(jnp.asarray(x), jnp.asarray(img))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)


SELECTIVE_KERNEL = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class SelectiveKernel(nn.Module):
        def __init__(self, in_channels, kernel_size=(3, 5)):
            super().__init__()
            self.num_paths = len(kernel_size)
            self.in_channels = in_channels
            dilation = [(k - 1) // 2 for k in kernel_size]
            self.paths = nn.ModuleList([
                nn.Conv2d(in_channels // self.num_paths, in_channels, 3, padding=d, dilation=d)
                for d in dilation])

        def forward(self, x):
            x_split = torch.split(x, self.in_channels // self.num_paths, 1)
            x_paths = [op(x_split[i]) for i, op in enumerate(self.paths)]
            return torch.stack(x_paths, dim=1).sum(1)


    class Net(nn.Module):
        def __init__(self, chs=4):
            super().__init__()
            self.sk = SelectiveKernel(chs)
            self.heads = nn.ModuleList([nn.Conv2d(chs, 2, 1) for _ in range(2)])

        def forward(self, x):
            x = self.sk(x)
            return torch.cat([head(x) for head in self.heads], dim=1)
''')


def test_layers_called_in_a_comprehension_over_a_module_list(tmp_path):
    result = _verifies(tmp_path, SELECTIVE_KERNEL, "Net", "float32[2,4,4,4]")
    assert result.todos == 0


DCT_CONSTANTS = textwrap.dedent('''
    import torch


    def dct2_matrix(n, device=None, dtype=None):
        dd = dict(device=device, dtype=dtype)
        eye = torch.eye(n, **dd)
        v = torch.cat([eye, eye.flip([1])], dim=-1)
        v = torch.fft.fft(v, dim=-1)[:, :n]
        k = torch.tensor(-1j, dtype=torch.complex64) * torch.pi * torch.arange(n)[None, :]
        v = (v * torch.exp(k / (n * 2))).real
        v[:, 0] = v[:, 0] * torch.sqrt(torch.tensor(1 / (n * 4), **dd))
        v[:, 1:] = v[:, 1:] * torch.sqrt(torch.tensor(1 / (n * 2), **dd))
        return v


    def f(x):
        return x @ torch.linalg.inv(dct2_matrix(x.shape[-1]))
''')


def test_transform_constants_built_with_factory_keywords():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    result = assert_function_matches_torch(DCT_CONSTANTS, x, rtol=1e-4, atol=1e-5)
    assert "torch" not in result.code.replace("torch2jax", "")


RESIZED_TABLE = textwrap.dedent('''
    import torch
    import torch.nn.functional as F


    def f(table):
        length = int(2 * max(3, 4) - 1)
        resized = F.interpolate(table.reshape(1, table.shape[0], -1).permute(0, 2, 1),
                                size=length, mode="linear")
        return resized.reshape(-1, length).permute(1, 0)
''')


def test_interpolate_to_a_size_held_by_a_name():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    assert_function_matches_torch(RESIZED_TABLE, x, rtol=1e-5, atol=1e-6)
