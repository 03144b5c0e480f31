"""torch.utils.checkpoint: checkpointed functions become nnx.remat / nn.remat of a function
taking the module (closures, methods, layers) or jax.checkpoint (pure functions), and the models
still match torch: forward and gradients in eval mode, and a training trajectory in train mode
(BatchNorm statistics updated inside the rematerialised functions)."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request
from torch2jax.verify.trajectory import TrainSpec, verify_trajectory

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torch.utils.checkpoint as cp
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential


    def gated(x, y):
        return torch.tanh(x) * torch.sigmoid(y)


    class DenseLayer(nn.Module):
        """densenet's _DenseLayer with memory_efficient=True (the requires_grad test left out)."""

        def __init__(self, cin: int, growth: int):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv1 = nn.Conv2d(cin, 2 * growth, kernel_size=1, bias=False)
            self.norm2 = nn.BatchNorm2d(2 * growth)
            self.conv2 = nn.Conv2d(2 * growth, growth, kernel_size=3, padding=1, bias=False)

        def bn_function(self, inputs):
            concated = torch.cat(inputs, 1)
            return self.conv1(self.relu1(self.norm1(concated)))

        def call_checkpoint_bottleneck(self, input):
            def closure(*inputs):
                return self.bn_function(inputs)

            return cp.checkpoint(closure, *input, use_reentrant=False)

        def forward(self, input):
            prev = [input] if isinstance(input, torch.Tensor) else input
            out = self.call_checkpoint_bottleneck(prev)
            out = checkpoint(self.tail, out, use_reentrant=False)
            return checkpoint(gated, out, out * 2, use_reentrant=False)

        def tail(self, x):
            return self.conv2(F.relu(self.norm2(x)))


    class DenseBlock(nn.Module):
        def __init__(self, n: int = 2, cin: int = 3, growth: int = 4):
            super().__init__()
            self.layers = nn.ModuleList([DenseLayer(cin + i * growth, growth) for i in range(n)])
            c = cin + n * growth
            self.convs = nn.ModuleList([nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)])
            self.seq = nn.Sequential(nn.Conv2d(c, c, 1), nn.BatchNorm2d(c), nn.ReLU(),
                                     nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))
            self.mlp = nn.Sequential(nn.Linear(c, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 5))
            self.head = nn.Linear(5, 5)

        def forward(self, x):
            features = [x]
            for layer in self.layers:
                features.append(layer(features))
            y = torch.cat(features, 1)
            for conv in self.convs:
                y = checkpoint(conv, y, use_reentrant=False)
            y = checkpoint_sequential(self.seq, 2, y, use_reentrant=False)
            y = checkpoint(lambda t: t.mean((2, 3)), y, use_reentrant=False)
            y = checkpoint_sequential(self.mlp, 3, y, use_reentrant=False)
            return checkpoint(self.head, y, use_reentrant=False)
''')


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("remat") / "remat_models.py"
    path.write_text(SOURCE)
    return path


def test_forms():
    code = convert_source(SOURCE, path="remat_models.py").code
    assert "def closure(self, *inputs):" in code
    assert "nnx.remat(closure)(self, *input)" in code
    assert "nnx.remat(type(self).tail)(self, out)" in code
    assert "jax.checkpoint(gated)(out, out * 2)" in code
    assert "jax.checkpoint(lambda t: t.mean(axis=(2, 3)))(y)" in code
    assert "nnx.remat(lambda m, *xs: m(*xs))(self.head, y)" in code
    # channels-last layers checkpointed: the input moved as their calls move it
    assert ("jnp.moveaxis(nnx.remat(lambda m, *xs: m(*xs))(conv, jnp.moveaxis(y, 1, -1)), -1, 1)"
            in code)
    assert "checkpoint_sequential(self.seq, 2, jnp.moveaxis(y, 1, -1))" in code
    assert "def checkpoint_sequential(" in code  # the helper, written into the file
    linen = convert_source(SOURCE, path="remat_models.py", target="linen")
    assert "nn.remat(closure)(self, *input)" in linen.code


# linen: nn.remat for the closure, the method and the layers; checkpoint_sequential is marked
@pytest.mark.parametrize("target, model", [("nnx", "DenseBlock"), ("linen", "DenseLayer")])
def test_forward_and_gradients_match(source_file, target, model):
    build = "DenseLayer(3, 4)" if model == "DenseLayer" else None
    result = run_request(VerifyRequest(f"{source_file}::{model}", build=build,
                                       inputs=("float32[2,3,6,6]",), jax_target=target,
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_training_trajectory_matches(source_file):
    """Train mode: every BatchNorm normalises with batch statistics and updates its running
    ones inside nnx.remat; 5 SGD steps, losses and final parameters compared.

    The running statistics differ by design: torch's checkpoint runs the function again in the
    backward pass, and a BatchNorm inside folds its batch statistics in a second time (checked
    below on torch alone); nnx.remat folds them once."""
    result = verify_trajectory(
        VerifyRequest(f"{source_file}::DenseBlock", inputs=("float32[4,3,6,6]",),
                      atol=1e-5, rtol=1e-4),
        TrainSpec("torch.optim.SGD(params, lr=0.05, momentum=0.9)",
                  "F.cross_entropy(output, labels)", "int64[4]:5", steps=5))
    assert result.error is None, result.error
    # losses and parameters pass (they are compared first); only the statistics differ
    assert result.param_max_abs_diff is not None and result.param_max_abs_diff < 1e-5
    assert not result.passed and result.mismatch.startswith("running statistic"), result.mismatch


def test_torch_checkpoint_updates_batchnorm_statistics_twice():
    """The torch behaviour the translation does not copy (see the diagnostic it writes)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    x = torch.randn(4, 3, requires_grad=True)
    plain, ckpt = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    plain(x).sum().backward()
    checkpoint(ckpt, x, use_reentrant=False).sum().backward()
    torch.testing.assert_close(ckpt.running_mean, plain.running_mean * 1.9)  # 0.9 * m + m
    messages = [d.message for d in convert_source(SOURCE, path="remat_models.py").diagnostics]
    assert any("twice per training step" in msg for msg in messages)
