"""``net.apply(init_fn)`` on a model, outside its class (the DCGAN tutorial's
``netG.apply(weights_init)``): the NNX translation runs the translated init function on every
submodule (``nnx.iter_modules``) with one ``nnx.Rngs`` split from the function's key. An init
function that picks layers by ``m.__class__.__name__`` instead of ``isinstance`` cannot say
which NNX name (kernel, scale, embedding) a weight has: it is marked, not guessed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
nnx = pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source

SOURCE = '''
import torch
import torch.nn as nn


def init_weights(m):
    if isinstance(m, nn.Conv2d):
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.constant_(m.bias, 0.5)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3)
        self.bn = nn.BatchNorm2d(32)

    def forward(self, x):
        return self.bn(self.conv(x))


def build():
    torch.manual_seed(0)
    net = Net()
    net.apply(init_weights)
    return net
'''

CLASSNAME = '''
import torch.nn as nn


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)


def build(net):
    net.apply(weights_init)
'''


def test_apply_runs_the_init_function_on_every_layer() -> None:
    result = convert_source(SOURCE, path="net.py")
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    assert "init_rngs = nnx.Rngs(subkey)" in result.code
    assert "for _, module in nnx.iter_modules(net):" in result.code
    ns: dict = {}
    exec(compile(result.code, "net.py", "exec"), ns)  # noqa: S102 - the converter's output
    net = ns["build"]()
    kernel = np.asarray(net.conv.kernel[...])
    assert kernel.shape == (3, 3, 16, 32)
    # N(0, 0.02) over 4608 weights (flax's default would be lecun_normal: std 1/12 here)
    assert abs(kernel.std() - 0.02) < 0.002 and abs(kernel.mean()) < 0.002
    np.testing.assert_array_equal(np.asarray(net.conv.bias[...]), 0.0)
    scale = np.asarray(net.bn.scale[...])
    assert abs(scale.mean() - 1.0) < 0.02 and 0.005 < scale.std() < 0.04
    np.testing.assert_array_equal(np.asarray(net.bn.bias[...]), 0.5)


def test_classname_dispatch_is_marked() -> None:
    result = convert_source(CLASSNAME, path="gan.py")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("layer type is not known" in e for e in errors), errors
    assert "TODO(torch2jax)" in result.code
