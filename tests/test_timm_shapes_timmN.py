"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's weight transfer, each on a model of our own written that way, converted, built and
verified against torch (outputs and gradients, float32 then float64).

* a subclass of ``nn.GroupNorm`` with its own forward, ``F.group_norm`` over its own attributes
  (timm's ``GroupNorm1``: ``super().__init__(1, num_channels, **kwargs)``, metaformer's norm):
  it derives from ``nnx.GroupNorm``, the call is the base's on channels-last input, so the
  weight and bias transfer to its scale and bias (it was kept a torch subclass, "norm1 has no
  'scale'"), built directly and through a ``norm_layer`` default argument;
* ``F.group_norm`` itself on a module's own parameters: the ``torch_group_norm`` helper.
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

GROUP_NORM = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class GroupNorm1(nn.GroupNorm):
        def __init__(self, num_channels, **kwargs):
            super().__init__(1, num_channels, **kwargs)
            self.fast_norm = False

        def forward(self, x):
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


    class Scale(nn.Module):
        def __init__(self, dim, init_value=1.0):
            super().__init__()
            self.scale = nn.Parameter(init_value * torch.ones(dim))

        def forward(self, x):
            return x * self.scale.view(-1, 1, 1)


    class Block(nn.Module):
        def __init__(self, dim, norm_layer=GroupNorm1):
            super().__init__()
            self.norm1 = norm_layer(dim)
            self.conv = nn.Conv2d(dim, dim, 3, padding=1)
            self.res_scale1 = Scale(dim, 0.5)
            self.norm2 = GroupNorm1(dim)
            self.gamma = nn.Parameter(torch.randn(dim))
            self.beta = nn.Parameter(torch.randn(dim))

        def forward(self, x):
            x = self.res_scale1(x) + self.conv(self.norm1(x))
            x = self.norm2(x)
            return F.group_norm(x, 2, self.gamma, self.beta, 1e-5)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)
            self.blocks = nn.Sequential(Block(8), Block(8))

        def forward(self, x):
            return self.blocks(self.stem(x)).mean((2, 3))
''')


def test_group_norm_subclass_and_functional(tmp_path):
    (tmp_path / "model.py").write_text(GROUP_NORM)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,7,6]",)))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert len(result.passes) == 2  # float32 and float64
