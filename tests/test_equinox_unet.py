"""The classic U-Net (tests/data/unet.py, the shape of milesial's Pytorch-UNet) on the equinox
target: ``Down`` is a Sequential of a max pool and a block holding BatchNorm (called block by
block, without the NNX pass's layout moves, torch's indices kept), ``Up.up`` is an
``nn.Upsample`` (written for one example) in one branch and an ``nn.ConvTranspose2d`` in the
other, and ``F.pad`` pads the last two axes of a value whose rank the NNX pass did not know.
Run against torch for both branches: outputs, gradients and train-mode statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("equinox")

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

UNET = Path(__file__).resolve().parent / "data" / "unet.py"
INPUT = ["float32[2,3,16,16]"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    result = convert_source(UNET.read_text(), path=str(UNET), target="equinox")
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO" not in result.code
    out = tmp_path_factory.mktemp("unet") / "unet.py"
    out.write_text(result.code)
    return out


def test_unet_translation(converted: Path) -> None:
    code = converted.read_text()
    assert "moveaxis" not in code  # equinox's layers are channel-first
    # Down: the pool and the stateful block, torch's indices
    assert ("self.maxpool_conv = eqx.nn.Sequential([eqx.nn.MaxPool2d(kernel_size=(2, 2), "
            "stride=(2, 2)), DoubleConv(in_channels, out_channels, key=key)])") in code
    assert "maxpool_conv_out = self.maxpool_conv[0](x)" in code
    assert "maxpool_conv_out2, state = self.maxpool_conv[1](maxpool_conv_out, state)" in code
    # Upsample per example (C, H, W)
    assert ("self.up = lambda x: jax.image.scale_and_translate(x, (x.shape[0], "
            "*(d * 2 for d in x.shape[1:])), tuple(range(1, x.ndim))") in code
    # the state after both inputs of Up
    assert "x, state = self.up1(x3, x2, state)" in code
    assert "x = jnp.concatenate([x2, x1], axis=0)" in code


@pytest.mark.parametrize("bilinear", [False, True])
def test_unet_matches_torch(converted: Path, bilinear: bool) -> None:
    r = verify(f"{UNET}::UNet", inputs=INPUT, jax_target="equinox", grad=True, float64=False,
               converted=str(converted), args={"bilinear": bilinear})
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, r.mismatch
    assert r.max_abs_diff < 1e-5 and r.grad_max_rel_diff < 1e-4


@pytest.mark.parametrize("bilinear", [False, True])
def test_unet_train_mode_updates_statistics_like_torch(converted: Path, bilinear: bool) -> None:
    r = verify(f"{UNET}::UNet", inputs=INPUT, jax_target="equinox", grad=True, train_mode=True, float64=False,
               converted=str(converted), args={"bilinear": bilinear})
    assert r.error is None, r.error
    assert r.passed, r.mismatch
    assert r.stats_max_abs_diff is not None and r.stats_max_abs_diff < 1e-5
