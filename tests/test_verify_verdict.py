"""verify's verdict: float64 decides, float32 rounding through a deep network does not fail.

A 32-block residual conv/BatchNorm network in training mode, checked at a tolerance tighter
than float32 rounding through 32 layers (as torchvision's resnet50 at ``--atol 1e-4 --rtol
1e-3`` is): the float32 pass is outside it, the float64 pass agrees to float64 rounding, and
the verdict passes with the float64 figures as the reason. A mistranslation seeded into the
conversion (another BatchNorm eps, a stride) fails in float64 too, and so the verdict fails;
with ``--no-float64`` nothing tells rounding from a mistranslation, and float32 decides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from rich.console import Console
from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.convert import convert_source
from torch2jax.verify import verify
from torch2jax.verify.cases import print_cases_summary
from torch2jax.verify.run import PassFigures, VerifyResult

DEEP = '''
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return x + F.relu(self.bn(self.conv(x)))


class DeepNet(nn.Module):
    def __init__(self, channels=4, depth=32, classes=3):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.blocks = nn.Sequential(*[Block(channels) for _ in range(depth)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        return self.head(x.mean(dim=(2, 3)))
'''
INPUTS = ["float32[4,3,8,8]"]
# tighter than float32 rounding through 32 blocks (about 1e-7 relative), far above float64's
TIGHT = ["--atol", "1e-8", "--rtol", "1e-8"]
runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deep")
    torch_file = root / "deep.py"
    torch_file.write_text(DEEP)
    code = convert_source(DEEP, path=str(torch_file)).code
    block_bn = "self.bn = BatchNorm(channels, momentum=0.9, epsilon=1e-05, rngs=rngs)"
    assert code.count(block_bn) == 2 and code.count("strides=(2, 2)") == 1, code
    out = {"torch": torch_file}
    for name, text in {
        "right": code,
        "eps": code.replace(block_bn, block_bn.replace("1e-05", "1e-03"), 1),  # the blocks'
        "stride": code.replace("strides=(2, 2)", "strides=(1, 1)"),  # same output shape
    }.items():
        (root / name).mkdir()
        (root / name / "deep.py").write_text(text)
        out[name] = root / name / "deep.py"
    return out


def _cli(files: dict[str, Path], which: str, *extra: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["verify", f"{files['torch']}::DeepNet", "--input", INPUTS[0],
                              "--converted", str(files[which]), "--train-mode", "--json",
                              *TIGHT, *extra])
    return res.exit_code, json.loads(res.stdout)


@pytest.fixture(scope="module")
def right(files: dict[str, Path]) -> tuple[int, dict]:
    return _cli(files, "right")


def _result(data: dict) -> VerifyResult:
    """The VerifyResult that ``--json`` printed."""
    passes = [PassFigures(**p) for p in data["passes"]]
    return VerifyResult(**{**data, "passes": passes})


def test_float32_rounding_through_a_deep_network_passes_on_float64_evidence(right):
    code, data = right
    f32, f64 = data["passes"]
    assert (f32["dtype"], f32["passed"], f64["dtype"], f64["passed"]) == (
        "float32", False, "float64", True)
    assert f32["grad_max_rel_diff"] > 1e-8  # the gradients too are outside the tolerance
    assert f64["max_rel_diff"] < 1e-13 and f64["grad_max_rel_diff"] < 1e-13, f64
    assert code == 0 and data["passed"] and data["error"] is None
    assert data["mismatch"] is None and f32["mismatch"]  # float32's worst stays in its pass
    reason = data["reason"]
    assert reason.startswith("float32 rounding: float32 is outside its tolerance")
    assert "float64 agrees" in reason and "evidence" in reason
    assert f"grad rel {f64['grad_max_rel_diff']:.1e}" in reason  # the float64 figures


def test_the_table_shows_rounding_and_the_reason(right):
    console = Console(record=True, width=80)
    print_cases_summary([_result(right[1])], console)
    text = console.export_text()
    rows = [line for line in text.splitlines() if "float32" in line or "float64" in line]
    assert "rounding" in rows[0] and " pass " in rows[1], text
    assert "deep.py::DeepNet: verdict pass: float32 rounding: float32 is outside" in text
    assert "1 case: 1 passed, 0 failed, 0 could not run" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_seeded_batchnorm_eps_still_fails(files):
    code, data = _cli(files, "eps")
    assert code == 1 and not data["passed"] and data["error"] is None
    assert [p["passed"] for p in data["passes"]] == [False, False]
    assert data["reason"].startswith("float64 differs as well")
    assert data["passes"][1]["max_rel_diff"] > 1e-6


def test_a_seeded_stride_still_fails(files):
    r = verify(f"{files['torch']}::DeepNet", inputs=INPUTS, converted=str(files["stride"]),
               train_mode=True, grad=False)  # default tolerances
    assert r.error is None and not r.passed
    assert r.passes[-1].dtype == "float64" and not r.passes[-1].passed
    assert "float64 differs" in r.reason


def test_float32_only_outside_its_tolerance_fails(files):
    r = verify(f"{files['torch']}::DeepNet", inputs=INPUTS, converted=str(files["right"]),
               train_mode=True, float64=False, atol=1e-8, rtol=1e-8)
    assert r.error is None and not r.passed and [p.dtype for p in r.passes] == ["float32"]
    assert r.reason.startswith("float32 is outside its tolerance")
    assert "float32 decides" in r.reason and "--no-float64" in r.reason
