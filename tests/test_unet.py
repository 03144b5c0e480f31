"""The U-Net of tests/data/unet.py, in the common shape (DoubleConv blocks with BatchNorm, MaxPool2d + DoubleConv in a
Sequential, a decoder whose upsampling layer is nn.Upsample or nn.ConvTranspose2d depending on a
constructor flag, F.pad to the skip connection's size, torch.cat on channels) on the NNX and
linen targets: no TODO, then torch2jax.verify on both settings of the flag (outputs, every
parameter's gradient, and in training mode the BatchNorm running statistics).

What it exercises: nn.Upsample is a channels-last layer, so an attribute holding either it or a
transposed convolution is one layout; a linen setup() copies a constructor parameter the torch
constructor reassigns (``if not mid: mid = out``); linen's weight transfer counts a
Sequential's items past the layout transposes the converter put in; a layer bound to a plain
name (at module level or in a function) moves its input and output like ``self.pool`` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

UNET = Path(__file__).resolve().parent / "data" / "unet.py"

NAMED = '''
import torch.nn as nn


pool = nn.MaxPool2d(2)


class NamedLayers(nn.Module):
    """Layers bound to plain names: one at module level, one local to forward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        up = nn.Upsample(scale_factor=2)
        return up(pool(self.conv(x))) - x.mean(1, keepdim=True)
'''

# odd-sized skip connections (12 -> 6 -> 3 -> 6 -> 12 and 10 -> 5 -> 2 -> 4, padded to 5)
# make F.pad do work; height, width and channels all differ, so a wrong axis cannot pass
INPUT = "float32[2,3,12,10]"
SETTINGS = {"transposed conv": {"bilinear": False}, "bilinear": {"bilinear": True}}
TARGETS = ("nnx", "linen")


@pytest.fixture(scope="module")
def named_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("named") / "named.py"
    path.write_text(NAMED)
    return path


@pytest.fixture(scope="module", params=TARGETS)
def converted(request) -> tuple[str, str]:
    result = convert_source(UNET.read_text(), path="unet.py", target=request.param)
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors)
    assert "TODO(torch2jax)" not in result.code
    return request.param, result.code


def test_forms(converted) -> None:
    target, text = converted
    # the upsampling lambda resizes the spatial axes of a channels-last input
    assert "(x.shape[0], *(d * 2 for d in x.shape[1:-1]), x.shape[-1])" in text
    assert "ConvTranspose(" in text
    if target == "linen":
        # the reassigned parameter is a local copy of the field, not the read-only field
        assert "mid_channels = self.mid_channels\n" in text
        assert "self.mid_channels = " not in text


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("train_mode", [False, True], ids=["eval", "train"])
def test_unet_matches_torch(target: str, setting: str, train_mode: bool) -> None:
    result = run_request(VerifyRequest(f"{UNET}::UNet", args=SETTINGS[setting],
                                       inputs=(INPUT,), jax_target=target, grad=True,
                                       train_mode=train_mode, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.todos == 0
    print(f"{target} {setting} {'train' if train_mode else 'eval'}: outputs "
          f"{result.max_abs_diff:.2g}, gradients {result.grad_max_rel_diff:.2g} relative, "
          f"statistics {result.stats_max_abs_diff}")
    grads = [c for c in result.compared if c.startswith("grad ")]
    # every weight: 5 DoubleConv blocks of 6, OutConv's 2, the two transposed convs' 2 each
    assert len(grads) == (32 if SETTINGS[setting]["bilinear"] else 36)
    if train_mode:
        assert result.stats_max_abs_diff is not None and result.stats_max_abs_diff < 1e-5


@pytest.mark.parametrize("target", TARGETS)
def test_layers_bound_to_names_match_torch(named_file: Path, target: str) -> None:
    result = run_request(VerifyRequest(f"{named_file}::NamedLayers", inputs=(INPUT,),
                                       jax_target=target, grad=True, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_local_pooling_layer_in_a_function() -> None:
    source = ("import torch.nn as nn\n\n\n"
              "def f(x):\n    p = nn.MaxPool2d((2, 3))\n    return p(x)\n")
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 9)).astype(np.float32)
    result = assert_function_matches_torch(source, x)
    assert "jnp.moveaxis(p(jnp.moveaxis(x, 1, -1)), -1, 1)" in result.code


def test_a_parameter_shadows_a_module_level_layer() -> None:
    # `pool` here is the caller's function, not the module-level MaxPool2d: no moves
    source = ("import torch\nimport torch.nn as nn\n\npool = nn.MaxPool2d(2)\n\n\n"
              "def f(x, pool=torch.tanh):\n    return pool(x)\n")
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 6)).astype(np.float32)
    result = assert_function_matches_torch(source, x)
    assert "return pool(x)" in result.code
