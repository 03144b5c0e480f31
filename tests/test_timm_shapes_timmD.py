"""Shapes of timm's forward passes that failed the sweep (benchmarks/timm_sweep.py,
docs/timm-sweep.md, the fourteenth run, timmD), each on a model of our own written that way,
converted, built and verified against torch (outputs and gradients, in float64, the pass
that decides).

* an in-place method on a value made by arithmetic on the spot (csatv2's ``_denormalize``:
  ``x.mul(self.imagenet_std).add_(self.imagenet_mean) * 255``; ``(x * 2).mul_(3).sub_(y)``):
  nothing else holds the value, so the method is its out-of-place form (it was marked and
  left, "DynamicJaxprTracer has no attribute add_"); an in-place method on a view
  (``x[0].add_(1)``) is not this (the write reaches ``x``).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch in float64
    (forward and gradients) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs,
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
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

        def _denormalize(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul(self.std).add_(self.mean) * 255

        def forward(self, x):
            y = self._denormalize(x)
            z = (x * 2).mul_(3).sub_(y).div_(torch.add(y, 1).clamp_(min=0.5))
            return self.conv(y + z)
''')


def test_an_inplace_method_on_a_value_made_by_arithmetic(tmp_path):
    _verifies(tmp_path, INPLACE_ON_ARITHMETIC, "Net", "float32[2,3,6,6]")
