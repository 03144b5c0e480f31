"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's build, each on a model of our own written that way, converted, built and verified
against torch (outputs and gradients, in float64, the pass that decides).

* an annotated attribute first set to ``None``, a parameter later in a branch (hiera's and
  naflexvit's ``self.pos_embed: Optional[nn.Parameter] = None``): the ``None`` is marked
  ``nnx.data`` (NNX made the attribute static, then refused the parameter).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

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
    (tmp_path / "model.py").write_text(ANNOTATED_NONE_THEN_PARAMETER)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,4]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None
