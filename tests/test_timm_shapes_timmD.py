"""Shapes of timm's forward passes that failed the sweep (benchmarks/timm_sweep.py,
docs/timm-sweep.md, the fourteenth run, timmD), each on a model of our own written that way,
converted, built and verified against torch (outputs and gradients, in float64, the pass
that decides).

* an in-place method on a value made by arithmetic on the spot (csatv2's ``_denormalize``:
  ``x.mul(self.imagenet_std).add_(self.imagenet_mean) * 255``; ``(x * 2).mul_(3).sub_(y)``):
  nothing else holds the value, so the method is its out-of-place form (it was marked and
  left, "DynamicJaxprTracer has no attribute add_"); an in-place method on a view
  (``x[0].add_(1)``) is not this (the write reaches ``x``). ``_denormalize``'s ``x`` is not
  annotated: ``x.mul(...)``, a method of torch's tensors only (and of no class of the file),
  is ``jnp.multiply`` though the analysis cannot tell what ``x`` is (it was left unmarked,
  "DynamicJaxprTracer has no attribute mul").
* a parameter given to a jitted JAX function (efficientvim: ``torch.sigmoid(self.alpha)``;
  ``self.gate.sigmoid()``, ``torch.softmax(self.bias, -1)``): the function is given the array,
  ``jax.nn.sigmoid(self.alpha[...])`` (given the ``nnx.Param``, "Triggering __jax_array__()
  during abstractification is no longer supported").
* ``nn.Upsample(scale_factor=att_stride, mode="nearest")`` with the factor held by a name, in
  a list with ``nn.Identity()`` built into an ``nn.Sequential`` (cpubone's attention): torch's
  legacy nearest, sizes ``floor(d * f)`` and source index ``floor(dst / f)`` (it was marked,
  "interpolate with a non-literal scale_factor", the Sequential kept torch's, "DynamicJaxprTracer
  has no attribute dim").
* a subclass without an ``__init__`` reading ``self.training`` (timm's
  ``RotaryEmbeddingCat(_RotaryEmbeddingBase)``: ``augment=self.training and self.aug_active``):
  the base's ``__init__`` sets NNX's ``self.deterministic`` (it was "'RotaryEmbeddingCat'
  object has no attribute 'deterministic'"); verified in eval and in train mode.
* ``torch.meshgrid(t, indexing=grid_indexing)`` with ``t`` a list of tensors and the indexing
  a parameter (timm.layers' pos_embed_sincos): ``jnp.meshgrid(*t, indexing=grid_indexing)``
  (it was marked, "torch.meshgrid of one name", and torch's ran on JAX arrays, "expected
  Tensor as element 0 in argument 0").
"""

from __future__ import annotations

import textwrap

from model_cases import verified_file


def _verifies(tmp_path, source: str, entry: str, *inputs: str, train_mode: bool = False,
              float64: bool | None = True):
    """``float64=None``: a model that computes in float32 on purpose (a float32 grid), whose
    float32 pass decides (tests/model_cases.py)."""
    result = verified_file(tmp_path, source, entry, *inputs, float64=float64,
                           train_mode=train_mode)
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None
    return result


INPLACE_ON_ARITHMETIC = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer('std', torch.empty(3, 1, 1), persistent=False)
            self.register_buffer('mean', torch.empty(3, 1, 1), persistent=False)
            self.conv = nn.Conv2d(3, 4, 3)
            self._init_buffers()

        def _init_buffers(self):
            self.std.copy_(torch.tensor([0.25, 0.5, 0.125]).view(3, 1, 1))
            self.mean.copy_(torch.tensor([0.5, 0.375, 0.75]).view(3, 1, 1))

        def _denormalize(self, x):
            return x.mul(self.std).add_(self.mean) * 255

        def forward(self, x):
            y = self._denormalize(x)
            z = (x * 2).mul_(3).sub_(y).div_(torch.add(y, 1).clamp_(min=0.5))
            return self.conv(y + z)
''')


def test_an_inplace_method_on_a_value_made_by_arithmetic(tmp_path):
    _verifies(tmp_path, INPLACE_ON_ARITHMETIC, "Net", "float32[2,3,6,6]")


JITTED_ON_PARAMS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, dim=6, state_dim=4):
            super().__init__()
            self.state_dim = state_dim
            self.alpha = nn.Parameter(0.5 * torch.ones(2, dim))
            self.gate = nn.Parameter(torch.linspace(-1, 1, dim))
            self.A = nn.Parameter(torch.linspace(1, 4, state_dim))
            self.proj = nn.Conv1d(dim, 2 * state_dim, 1)
            self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            alpha = torch.sigmoid(self.alpha).view(2, -1, 1, 1)
            x = x + alpha[0] * (self.dwconv(x) - x)
            batch, _, height, width = x.shape
            f = x.flatten(2)
            b, c = torch.split(self.proj(f), [self.state_dim, self.state_dim], dim=1)
            a = (b + self.A.view(1, -1, 1)).softmax(-1) * torch.softmax(self.A, -1)[:, None]
            h = f @ (a * b).transpose(-2, -1)
            y = (h * self.gate.sigmoid().view(1, -1, 1)) @ c
            return alpha[1] * y.reshape(batch, -1, height, width)
''')


def test_a_parameter_given_to_a_jitted_function(tmp_path):
    _verifies(tmp_path, JITTED_ON_PARAMS, "Block", "float32[2,6,4,4]")


NEAREST_BY_A_NAME = textwrap.dedent('''
    import torch.nn as nn


    class Att(nn.Module):
        def __init__(self, dim, att_stride=2, fuse_out_proj=True):
            super().__init__()
            self.down = nn.Conv2d(dim, dim, att_stride, stride=att_stride, groups=dim)
            upsampling = [nn.Upsample(scale_factor=att_stride, mode="nearest")
                          if att_stride > 1 else nn.Identity()]
            if fuse_out_proj:
                upsampling = [nn.Conv2d(dim, dim, kernel_size=1)] + upsampling
            self.upsampling = nn.Sequential(*upsampling)

        def forward(self, x):
            return x + self.upsampling(self.down(x))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.Sequential(Att(4, 2), Att(4, 3, fuse_out_proj=False), Att(4, 1))

        def forward(self, x):
            return self.blocks(x)
''')


def test_nearest_upsampling_by_a_factor_held_by_a_name(tmp_path):
    _verifies(tmp_path, NEAREST_BY_A_NAME, "Net", "float32[2,4,6,6]")


TRAINING_READ_IN_A_SUBCLASS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class _EmbedBase(nn.Module):
        def __init__(self, dim, aug_scale=0.0):
            super().__init__()
            self.dim = dim
            self.aug_scale = aug_scale
            self.register_buffer('bands', torch.linspace(0.5, 2.0, dim // 2), persistent=False)

        def _build(self, n, augment=False):
            t = torch.arange(n, dtype=torch.float32)
            if augment:
                t = t * (1 + self.aug_scale)
            f = t[:, None] * self.bands[None, :]
            return torch.cat([f.sin(), f.cos()], dim=-1)


    class EmbedCat(_EmbedBase):
        def get_embed(self, n):
            return self._build(n, augment=self.training and self.aug_scale > 0)


    class Net(nn.Module):
        def __init__(self, dim=8):
            super().__init__()
            self.proj = nn.Linear(dim, dim)
            self.embed = EmbedCat(dim, aug_scale=0.5)

        def forward(self, x):
            return self.proj(x + self.embed.get_embed(x.shape[1]))
''')


def test_self_training_read_in_a_subclass_without_init(tmp_path):
    _verifies(tmp_path, TRAINING_READ_IN_A_SUBCLASS, "Net", "float32[2,5,8]")
    _verifies(tmp_path, TRAINING_READ_IN_A_SUBCLASS, "Net", "float32[2,5,8]", train_mode=True,
              float64=None)  # (its augmentation builds a float32 table)


MESHGRID_OF_A_LIST = textwrap.dedent('''
    import torch
    import torch.nn as nn


    def build_grid(feat_shape, grid_indexing='ij', dtype=torch.float32):
        t = [torch.arange(s, dtype=torch.int64).to(torch.float32) + 0.5 for s in feat_shape]
        return torch.stack(torch.meshgrid(t, indexing=grid_indexing), dim=-1).to(dtype=dtype)


    class Net(nn.Module):
        def __init__(self, dim=4):
            super().__init__()
            self.proj = nn.Linear(2, dim)

        def forward(self, x):
            g = build_grid((x.shape[1], x.shape[2]), dtype=x.dtype)
            h = build_grid((x.shape[2], x.shape[1]), grid_indexing='xy', dtype=x.dtype)
            return x * self.proj(g + h).sum(-1)[..., None]
''')


def test_meshgrid_of_a_list_with_its_indexing_a_parameter(tmp_path):
    # 3 x 5: 'ij' and 'xy' grids of the transposed sizes agree in shape only where the
    # indexing is honoured
    _verifies(tmp_path, MESHGRID_OF_A_LIST, "Net", "float32[2,3,5,4]", float64=None)  # (float32 grids)
