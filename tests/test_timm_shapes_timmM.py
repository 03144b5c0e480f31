"""Forward passes of timm's model code (docs/timm-sweep.md, issue 34) on models of our own
written that way, converted, built and verified against torch (outputs and gradients,
float64):

* ``x.chunk(len(self.convs) + 1, dim=1)`` where the count does not divide the channels
  (edgenext's SplitTransposeBlock: 10 channels in 4 chunks are 3, 3, 3, 1; 5 in 4 are 2, 2, 1,
  fewer than asked): torch's pieces of ``ceil(size / n)``, the helper ``torch_chunk`` (it was
  ``jnp.split(x, n)``: "array split does not result in an equal division");
* a buffer registered as ``None``, then again with what a method returns, a tensor or ``None``
  (swin_transformer's ``attn_mask``), read by a forward that tests ``mask is not None``: the
  attribute is ``None`` where torch's is (it was ``nnx.Variable(None)``: "'NoneType' object
  has no attribute 'shape'");
* ``nn.AvgPool2d(kernel_size=stride, stride=stride, ceil_mode=True)`` with the sizes held by a
  name (volo's outlook attention), and a max pooling whose stride passes its kernel: the
  overhang of torch's last window computed from the names (it was kept torch's pooling:
  "avg_pool2d(): argument 'input' must be Tensor").
"""

from __future__ import annotations

import textwrap

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

CHUNKS = textwrap.dedent('''
    import math

    import torch
    import torch.nn as nn


    class SplitBlock(nn.Module):
        def __init__(self, dim, num_scales=4):
            super().__init__()
            width = max(int(math.ceil(dim / num_scales)), int(math.floor(dim // num_scales)))
            self.convs = nn.ModuleList(
                [nn.Conv2d(width, width, 3, padding=1, groups=width) for _ in range(num_scales - 1)])

        def forward(self, x):
            spx = x.chunk(len(self.convs) + 1, dim=1)
            spo = []
            sp = spx[0]
            for i, conv in enumerate(self.convs):
                if i > 0 and i < len(spx):
                    sp = sp + spx[i]
                sp = conv(sp)
                spo.append(sp)
            spo.append(spx[-1])
            return torch.cat(spo[:len(spx)], 1)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = SplitBlock(10)
            self.b = nn.Conv2d(10, 5, 1)
            self.c = SplitBlock(5)

        def forward(self, x):
            y = self.a(x)
            z = self.b(y)
            parts = torch.chunk(z, self.c.convs.__len__() + 1, 1)
            return self.c(z).mean((2, 3)) + parts[-1].sum() + len(parts)
''')


def test_chunk_of_a_computed_count_that_does_not_divide(tmp_path):
    out = convert_source(CHUNKS).code
    assert "torch_chunk(" in out
    (tmp_path / "model.py").write_text(CHUNKS)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,10,4,4]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0


OPTIONAL_BUFFER = '''
from typing import Optional

import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, dim)

    def forward(self, x, mask: Optional[torch.Tensor] = None):
        a = self.qkv(x) @ x.transpose(-2, -1)
        if mask is not None:
            nw = mask.shape[0]
            a = (a.view(-1, nw, a.shape[1], a.shape[2]) + mask[None]).view(-1, a.shape[1], a.shape[2])
        return a.softmax(-1) @ x


class Block(nn.Module):
    def __init__(self, dim, shift):
        super().__init__()
        self.shift = shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attn(dim)
        self.register_buffer("attn_mask", None, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        self._init_buffers()

    def _init_buffers(self):
        dtype = self.norm1.weight.dtype
        attn_mask = self.get_attn_mask(dtype=dtype)
        self.register_buffer("attn_mask", attn_mask, persistent=False)

    def get_attn_mask(self, dtype=None):
        if self.shift:
            m = torch.zeros((2, 3, 3), dtype=dtype)
            m[1, :, 1:] = -100.0
            return m
        return None

    def forward(self, x):
        attn_mask = self.attn_mask
        return x + self.attn(self.norm1(x), mask=attn_mask)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(4, False), Block(4, True))

    def forward(self, x):
        return self.blocks(x)
'''


def test_a_buffer_registered_as_none_then_maybe_a_tensor(tmp_path):
    out = convert_source(OPTIONAL_BUFFER).code
    assert "self.attn_mask = nnx.Variable(attn_mask) if attn_mask is not None else None" in out
    (tmp_path / "model.py").write_text(OPTIONAL_BUFFER)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,4]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0


CEIL_POOL = textwrap.dedent('''
    import torch.nn as nn
    import torch.nn.functional as F


    class Net(nn.Module):
        def __init__(self, stride=2, k=2, s=3):
            super().__init__()
            self.pool = nn.AvgPool2d(kernel_size=stride, stride=stride, ceil_mode=True)
            self.max = nn.MaxPool2d(kernel_size=k, stride=s, ceil_mode=True)
            self.k = k
            self.head = nn.Linear(3, 2)

        def forward(self, x):
            x = x * self.head.weight.sum()
            a = self.pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            b = self.max(x.permute(0, 3, 1, 2))
            c = F.avg_pool2d(x.permute(0, 3, 1, 2), self.k, self.k, ceil_mode=True)
            return self.head(a.sum((1, 2)) + b.mean((2, 3)) + c.amax((2, 3)))
''')


def test_ceil_mode_pooling_of_sizes_held_by_names(tmp_path):
    out = convert_source(CEIL_POOL).code
    assert "torch" not in out
    (tmp_path / "model.py").write_text(CEIL_POOL)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,7,5,3]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0
