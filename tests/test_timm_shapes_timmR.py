"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's forward pass or build, each on a model of our own written that way, converted, built
and verified against torch (outputs and gradients, in float64, the pass that decides).

* ``F.adaptive_avg_pool2d(x, output_size)`` where ``output_size`` is a local tuple computed in
  the forward (vgg's ``ConvMlp``: ``(max(k, x.shape[-2]), max(k, x.shape[-1]))``): the helper
  is given the tuple (it was given ``(output_size, output_size)``, "'tuple' object cannot be
  interpreted as an integer"); and its ``act_layer(True)``, an activation class given as a
  parameter, built with torch's ``inplace`` positionally: the parameter itself, a function
  now (it was kept as ``act_layer(True)``, the function called on ``True``);
* ``torch.empty(self.normalized_shape)`` where the attribute holds a tuple (timm's ``RmsNorm``:
  ``self.normalized_shape = tuple(normalized_shape)``): ``jnp.empty`` is given the tuple (it
  was given ``(self.normalized_shape,)``, "Shapes must be 1D sequences of concrete values");
* a buffer registered as ``None``, then as a tensor or ``None`` (swin's ``attn_mask``), given
  to a submodule's call as it is: ``None`` stays ``None`` (it was read as ``None[...]``).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

POOL_TO_AT_LEAST = textwrap.dedent('''
    import numbers

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class RmsNorm(nn.Module):
        def __init__(self, channels, eps=1e-6, affine=True):
            super().__init__()
            normalized_shape = channels
            if isinstance(normalized_shape, numbers.Integral):
                normalized_shape = (normalized_shape,)
            self.normalized_shape = tuple(normalized_shape)
            self.eps = eps
            if affine:
                self.weight = nn.Parameter(torch.empty(self.normalized_shape))
            else:
                self.register_parameter('weight', None)
            self.reset_parameters()

        def reset_parameters(self):
            if self.weight is not None:
                nn.init.ones_(self.weight)

        def forward(self, x):
            dims = tuple(range(-len(self.normalized_shape), 0))
            x = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + self.eps)
            if self.weight is not None:
                x = x * self.weight
            return x


    class ConvMlp(nn.Module):
        def __init__(self, in_features=4, out_features=6, kernel_size=4, act_layer=nn.ReLU):
            super().__init__()
            self.input_kernel_size = kernel_size
            self.fc1 = nn.Conv2d(in_features, out_features, kernel_size, bias=True)
            self.act1 = act_layer(True)

        def forward(self, x):
            if x.shape[-2] < self.input_kernel_size or x.shape[-1] < self.input_kernel_size:
                output_size = (max(self.input_kernel_size, x.shape[-2]),
                               max(self.input_kernel_size, x.shape[-1]))
                x = F.adaptive_avg_pool2d(x, output_size)
            return self.act1(self.fc1(x) - 0.1)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            self.mlp = ConvMlp()
            self.norm = RmsNorm(6)
            self.norm2 = RmsNorm(6, affine=False)

        def forward(self, x):
            y = self.mlp(self.stem(x)).flatten(2).transpose(1, 2)
            return self.norm2(self.norm(y) * 2.0)
''')


def test_pooled_to_a_computed_tuple_and_empty_of_a_tuple_attribute(tmp_path):
    (tmp_path / "model.py").write_text(POOL_TO_AT_LEAST)
    # 5 x 3: the width (3 < 4) is pooled up to 4 (overlapping bins), the height kept
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,5,3]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


OPTIONAL_MASK = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Attn(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.qkv = nn.Linear(dim, dim)

        def forward(self, x, mask=None):
            a = self.qkv(x) @ x.transpose(-1, -2)
            if mask is not None:
                num_win = mask.shape[0]
                a = a.view(-1, num_win, x.shape[1], x.shape[1]) + mask.unsqueeze(0)
                a = a.view(-1, x.shape[1], x.shape[1])
            return a.softmax(-1) @ x


    class Block(nn.Module):
        def __init__(self, dim, shift=0):
            super().__init__()
            self.shift = shift
            self.norm1 = nn.LayerNorm(dim)
            self.attn = Attn(dim)
            self.register_buffer("attn_mask", None, persistent=False)
            self._init_buffers()

        def _init_buffers(self):
            attn_mask = self.get_attn_mask(dtype=self.norm1.weight.dtype)
            self.register_buffer("attn_mask", attn_mask, persistent=False)

        def get_attn_mask(self, dtype=None):
            if self.shift:
                m = torch.zeros((2, 4, 4), dtype=dtype)
                m[:, :, :2] = -100.0
                return m
            return None

        def forward(self, x):
            return x + self.attn(self.norm1(x), mask=self.attn_mask)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Block(8), Block(8, shift=1))

        def forward(self, x):
            return self.blocks(x).mean(1)
''')


def test_a_buffer_of_none_or_a_mask_given_to_a_submodule(tmp_path):
    # swin's attn_mask: registered as None, then as get_attn_mask()'s tensor or None, and given
    # to the attention as it is (None stays None: it was read as None[...])
    (tmp_path / "model.py").write_text(OPTIONAL_MASK)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,4,8]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None
