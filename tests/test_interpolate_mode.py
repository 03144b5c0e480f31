"""``F.interpolate(x, scale_factor=2, mode=self.mode)`` with ``self.mode`` set once from a
constructor parameter with a literal default (a U-Net's ``Up`` block): the method picked at run
time among the modes the file shows (the default and the literals its constructions pass), an
assert before the statement for any other; marked where the file does not show the mode."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

UP = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Up(nn.Module):
        def __init__(self, cin, cout, mode="bilinear"):
            super().__init__()
            self.mode = mode
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)

        def forward(self, x, skip):
            x = F.interpolate(x, scale_factor=2, mode=self.mode{align})
            return self.conv(torch.cat([x, skip], dim=1))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.up1 = Up(6, 4)  # the default, bilinear
            self.up2 = Up(6, 3, {mode})

        def forward(self, x, s1, s2):
            return self.up2(self.up1(x, s1), s2)
''')
INPUTS = ("float32[2,4,3,5]", "float32[2,2,6,10]", "float32[2,2,12,20]")


def test_a_mode_read_from_self_verifies_against_torch(tmp_path):
    path = tmp_path / "unet_up.py"
    path.write_text(UP.format(mode='mode="nearest"', align=""))
    result = run_request(VerifyRequest(f"{path}::Net", inputs=INPUTS, grad=True, atol=1e-5,
                                       rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_a_mode_the_file_does_not_show_stops_the_program():
    code = convert_source(UP.format(mode='mode="nearest"', align=""), path="m.py").code
    ns: dict = {}
    exec(compile(code, "m.py", "exec"), ns)  # noqa: S102 - the converter's output
    import jax.numpy as jnp
    from flax import nnx

    up = ns["Up"](4, 3, mode="bicubic", rngs=nnx.Rngs(0))
    with pytest.raises(AssertionError, match="bilinear, nearest"):
        up(jnp.zeros((1, 4, 3, 5)), jnp.zeros((1, 2, 6, 10)))


@pytest.mark.parametrize(("mode", "align", "why"), [
    ("mode=cfg_mode", "", "non-literal mode"),  # not a literal: the mode is not known
    ('mode="area"', "", "'area'"),  # a mode the rule does not translate
    ('mode="nearest"', ", align_corners=True", "'nearest'"),  # torch raises for nearest
])
def test_a_mode_that_cannot_be_translated_keeps_the_mark(mode, align, why):
    src = UP.format(mode=mode, align=align).replace("def __init__(self):",
                                                    "def __init__(self, cfg_mode='nearest'):")
    result = convert_source(src, path="m.py")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("interpolate" in e and why in e for e in errors), errors
    assert "F.interpolate(x, scale_factor=2, mode=self.mode" in result.code
