"""Shapes of timm's model code that failed the sweep while building the JAX model
(benchmarks/timm_sweep.py, docs/timm-sweep.md, the thirteenth run's timmB part), each on a
model of our own written that way, converted, built and compared with torch:

* ``m.reset_parameters()`` of a torch norm layer in an ``isinstance`` branch of an init
  function applied over the model (timm's efficientvim ``_init_weights``: ``elif
  isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm1d)): m.reset_parameters()``):
  the ``reset_norm_parameters`` helper (scale ones, bias zeros, running mean zeros and
  variance ones); flax's norms have no such method ("'LayerNorm' object has no attribute
  'reset_parameters'").
"""

from __future__ import annotations

import textwrap

import numpy as np
import torch

from torch2jax.convert import convert_source

NORM_RESET = textwrap.dedent('''
    from functools import partial

    import torch
    import torch.nn as nn


    class Scale(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.alpha = nn.Parameter(torch.full((dim,), 4.0))

        def reset_parameters(self):
            nn.init.constant_(self.alpha, 0.5)

        def forward(self, x):
            return x * self.alpha


    class Net(nn.Module):
        def __init__(self, chs=4, needs_reset=True):
            super().__init__()
            self.bn = nn.BatchNorm2d(chs)
            self.norm = nn.LayerNorm(chs)
            self.bn1 = nn.BatchNorm1d(chs)
            self.gn = nn.GroupNorm(2, chs)
            self.scale = Scale(chs)
            with torch.no_grad():
                self.bn.weight.fill_(2.0)
                self.norm.weight.fill_(2.0)
                self.bn1.bias.fill_(0.25)
                self.gn.weight.fill_(2.0)
            self.apply(partial(self._init_weights, needs_reset=needs_reset))

        def _init_weights(self, m, needs_reset=True):
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm1d)):
                m.reset_parameters()
            elif needs_reset and hasattr(m, 'reset_parameters'):
                m.reset_parameters()

        def forward(self, x):
            x = self.gn(self.bn(x)).sum((2, 3))
            return self.scale(self.bn1(self.norm(x)))
''')


def _built(source: str):
    result = convert_source(source, path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    return result, ns_t, ns_j


def test_norm_reset_parameters_in_an_applied_init():
    """The norms hold no drawn weight: the built models are compared as built, in eval mode,
    no weight transfer (a reset left undone keeps the fills, 2.0 and 0.25, and the running
    statistics); the GroupNorm is not in the isinstance tuple and keeps its fills, the module
    of our own is reset by its own method."""
    import jax.numpy as jnp
    from flax import nnx

    result, ns_t, ns_j = _built(NORM_RESET)
    assert "reset_norm_parameters(m)" in result.code
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 5)).astype(np.float32)
    for needs_reset in (True, False):
        torch_net = ns_t["Net"](needs_reset=needs_reset).eval()
        with torch.no_grad():
            want = torch_net(torch.from_numpy(x)).numpy()
        net = ns_j["Net"](needs_reset=needs_reset, rngs=nnx.Rngs(0))
        net.eval()
        np.testing.assert_allclose(np.asarray(net(jnp.asarray(x))), want, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(np.asarray(net.gn.scale[...]), 2.0)
        np.testing.assert_array_equal(np.asarray(net.scale.alpha[...]),
                                      0.5 if needs_reset else 4.0)
    # the running statistics, set on both sides, reset by the init function called again
    with torch.no_grad():
        torch_net.bn.running_mean.fill_(0.5)
        torch_net.bn1.running_var.fill_(3.0)
    net.bn.mean[...] = jnp.full_like(net.bn.mean[...], 0.5)
    net.bn1.var[...] = jnp.full_like(net.bn1.var[...], 3.0)
    for torch_norm, norm in ((torch_net.bn, net.bn), (torch_net.bn1, net.bn1)):
        torch_net._init_weights(torch_norm)
        net._init_weights(norm, rngs=nnx.Rngs(1))
        np.testing.assert_array_equal(np.asarray(norm.mean[...]),
                                      torch_norm.running_mean.numpy())
        np.testing.assert_array_equal(np.asarray(norm.var[...]),
                                      torch_norm.running_var.numpy())
