"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's build, each on a model of our own written that way, converted, built and verified
against torch (outputs and gradients, in float64, the pass that decides).

* an annotated attribute first set to ``None``, a parameter later in a branch (hiera's and
  naflexvit's ``self.pos_embed: Optional[nn.Parameter] = None``): the ``None`` is marked
  ``nnx.data`` (NNX made the attribute static, then refused the parameter);
* an attribute first set to ``None``, a pooling layer later in a branch (hieradet_sam2's
  ``self.pool = None``, then ``nn.MaxPool2d(...)``): a function on the JAX side, so the
  ``None`` stays static (it was ``nnx.data(None)``, the function then a leaf of the state);
* a function decorated ``@torch.fx.wrap`` (timm's ``_freq_buffer_dtype``, eva's rope): the
  decorator, a torch.fx tracing hint, is dropped (it was kept, with ``import torch`` and a
  TODO), and the function's ``dtype.is_floating_point`` is ``jnp.issubdtype``.
"""

from __future__ import annotations

import textwrap

from model_cases import verified_file

from torch2jax.convert import convert_source

ANNOTATED_NONE_THEN_PARAMETER = textwrap.dedent('''
    from typing import Optional

    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, dim=4, sep=False):
            super().__init__()
            self.proj = nn.Linear(dim, dim)
            self.pos_embed: Optional[nn.Parameter] = None
            self.pos_embed_spatial: Optional[torch.Tensor] = None
            if sep:
                self.pos_embed_spatial = nn.Parameter(torch.zeros(1, 3, dim))
            else:
                self.pos_embed = nn.Parameter(torch.zeros(1, 3, dim))
            if self.pos_embed is not None:
                nn.init.trunc_normal_(self.pos_embed, std=0.02)

        def forward(self, x):
            if self.pos_embed is not None:
                x = x + self.pos_embed
            else:
                x = x + self.pos_embed_spatial
            return self.proj(x)
''')


def test_an_annotated_none_then_a_parameter(tmp_path):
    result = verified_file(tmp_path, ANNOTATED_NONE_THEN_PARAMETER, "Net", "float32[2,3,4]")
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


POOL_OR_NONE = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, dim, q_stride=None):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.pool = None
            if q_stride:
                self.pool = nn.MaxPool2d(kernel_size=q_stride, stride=q_stride)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):  # x: B, H, W, C
            shortcut = x
            x = self.proj(self.norm(x))
            if self.pool is not None:
                shortcut = self.pool(shortcut.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
                x = self.pool(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            return shortcut + x


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(4), Block(4, q_stride=2), Block(4)])

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return x
''')


def test_an_attribute_none_or_a_pooling_layer(tmp_path):
    # hieradet_sam2's self.pool = None, then nn.MaxPool2d(...) in a branch: a function on the
    # JAX side, so the None stays static (it was nnx.data(None), then the function a leaf of
    # the model's state, which jax.jit refused)
    result = verified_file(tmp_path, POOL_OR_NONE, "Net", "float32[2,4,4,4]")
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


FX_WRAPPED_DTYPE = textwrap.dedent('''
    from typing import Optional

    import torch
    import torch.nn as nn


    def register_notrace_function(fn):
        return fn


    @torch.fx.wrap
    @register_notrace_function
    def _freq_buffer_dtype(dtype: Optional[torch.dtype]) -> torch.dtype:
        if dtype is None:
            dtype = torch.get_default_dtype()
        if dtype.is_floating_point and torch.finfo(dtype).bits < 32:
            return torch.float32
        return dtype


    class Net(nn.Module):
        def __init__(self, dim=4, device=None, dtype=None):
            super().__init__()
            bands = torch.arange(1, dim + 1, device=device, dtype=_freq_buffer_dtype(dtype))
            self.register_buffer('bands', bands, persistent=False)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            return self.proj(torch.sin(x * self.bands.to(x.dtype)))
''')


def test_an_fx_wrapped_dtype_helper(tmp_path):
    code = convert_source(FX_WRAPPED_DTYPE, path="model.py").code
    assert "torch" not in code.replace("torch2jax", ""), code
    result = verified_file(tmp_path, FX_WRAPPED_DTYPE, "Net", "float32[2,3,4]")
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None
