"""torch's float64 reference where aten rounds to float32 (torch2jax/verify/torch_exact.py):
``F.hardsigmoid``'s backward pass multiplies by a float32 1/6. A right translation of a model
gated by ``nn.Hardsigmoid`` (timm's ``EffectiveSEModule``: vovnet, rdnet) failed the float64
pass by 1e-9 on every gradient behind the gate."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from torch2jax.verify.run import VerifyRequest, run_request
from torch2jax.verify.torch_exact import NOTE, exact_float64

ESE = textwrap.dedent('''
    import torch.nn as nn


    class EffectiveSE(nn.Module):
        def __init__(self, chs):
            super().__init__()
            self.fc = nn.Conv2d(chs, chs, 1)
            self.gate = nn.Hardsigmoid()

        def forward(self, x):
            return x * self.gate(self.fc(x.mean((2, 3), keepdim=True)))


    class Net(nn.Module):
        def __init__(self, chs=8, num_classes=4):
            super().__init__()
            self.conv = nn.Conv2d(3, chs, 3, padding=1)
            self.attn = EffectiveSE(chs)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.attn(self.conv(x).relu()).mean((2, 3)))
''')


def test_a_hardsigmoid_gate_verifies_in_float64(tmp_path):
    (tmp_path / "net.py").write_text(ESE)
    result = run_request(VerifyRequest(f"{tmp_path / 'net.py'}::Net",
                                       inputs=("float32[2,3,6,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert NOTE in result.notes


def _grads(fn, x):
    import torch

    t = torch.tensor(x, requires_grad=True)
    fn(t).sum().backward()
    return t.grad.numpy()


def test_hardsigmoid_alone_is_rounded_by_aten_and_exact_inside():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = np.linspace(-2.9, 2.9, 7)
    notes: list[str] = []
    with exact_float64(True, notes):
        inside = _grads(F.hardsigmoid, x)
        module = _grads(torch.nn.Hardsigmoid(), x)
    np.testing.assert_array_equal(inside, np.full_like(x, 1 / 6))
    np.testing.assert_array_equal(module, inside)
    assert notes == [NOTE]
    # the other activations' float64 gradients agree with their definitions' (JAX's)
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        for t_fn, j_fn in [(F.hardswish, jax.nn.hard_swish), (F.silu, jax.nn.silu),
                           (F.gelu, lambda v: jax.nn.gelu(v, approximate=False)),
                           (F.elu, jax.nn.elu), (F.softplus, jax.nn.softplus),
                           (F.mish, lambda v: v * jnp.tanh(jax.nn.softplus(v)))]:
            ref = np.asarray(jax.vmap(jax.grad(j_fn))(jnp.asarray(x)))
            np.testing.assert_allclose(_grads(t_fn, x), ref, rtol=1e-14, atol=1e-15)
