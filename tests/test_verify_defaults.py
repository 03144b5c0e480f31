"""verify's defaults: gradients compared, and a float64 pass after the float32 one.

A residual MLP in the shape GPT code writes it (pre-LayerNorm blocks, an exact-GELU MLP,
weights drawn with std 0.02) is converted by the real converter; copies of the conversion are
then edited by hand the way a wrong default would read: GELU's tanh approximation for the exact
GELU, another LayerNorm eps. float32 noise at the float32 tolerance hides both; the float64
pass, at a tolerance near float64 rounding, does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.convert import convert_source
from torch2jax.verify import verify
from torch2jax.verify.cases import run_cases
from torch2jax.verify.run import ATOL, ATOL64, RTOL, RTOL64, PassFigures, VerifyResult

RESIDUAL_MLP = '''
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)
        nn.init.normal_(self.c_fc.weight, mean=0.0, std=0.02)
        nn.init.normal_(self.c_fc.bias, mean=0.0, std=0.02)
        nn.init.normal_(self.c_proj.weight, mean=0.0, std=0.02)
        nn.init.normal_(self.c_proj.bias, mean=0.0, std=0.02)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class ResidualMLP(nn.Module):
    def __init__(self, dim=16, depth=2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)
'''
INPUTS = ["float32[4,16]"]
runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("residual")
    torch_file = root / "residual.py"
    torch_file.write_text(RESIDUAL_MLP)
    code = convert_source(RESIDUAL_MLP, path=str(torch_file)).code
    assert "jax.nn.gelu(" in code and "approximate=False" in code, code
    assert code.count("epsilon=1e-05") == 2, code
    out = {"torch": torch_file}
    for name, text in {
        "right": code,
        "gelu_tanh": code.replace("approximate=False", "approximate=True"),
        "eps": code.replace("epsilon=1e-05", "epsilon=1e-06", 1),  # the first block's only
    }.items():
        (root / name).mkdir()
        (root / name / "residual.py").write_text(text)
        out[name] = root / name / "residual.py"
    return out


def _verify(files: dict[str, Path], which: str, **kwargs) -> VerifyResult:
    return verify(f"{files['torch']}::ResidualMLP", inputs=INPUTS,
                  converted=str(files[which]), **kwargs)


@pytest.fixture(scope="module")
def default(files: dict[str, Path]) -> dict[str, VerifyResult]:
    """Each conversion verified with the defaults (no grad=, no float64=)."""
    return {which: _verify(files, which) for which in ("right", "gelu_tanh", "eps")}


def _figures(p: PassFigures) -> str:
    return f"{p.dtype}: out rel {p.max_rel_diff:.1e}, grad rel {p.grad_max_rel_diff:.1e}"


def test_a_right_conversion_passes_both_passes_with_gradients(default):
    r = default["right"]
    assert r.passed and r.error is None, (r.error, r.mismatch)
    f32, f64 = r.passes
    assert (f32.dtype, f32.atol, f32.rtol) == ("float32", ATOL, RTOL)
    assert (f64.dtype, f64.atol, f64.rtol) == ("float64", ATOL64, RTOL64)
    assert f32.passed and f64.passed
    assert r.grad_max_abs_diff is not None  # gradients by default
    assert f64.grad_max_rel_diff is not None
    # float64 agrees to float64 rounding, four orders of magnitude inside its tolerance
    assert f64.max_rel_diff < 1e-14 and f64.grad_max_rel_diff < 1e-14, _figures(f64)
    assert 1e-9 < f32.max_rel_diff < 1e-5, _figures(f32)
    assert r.float64_skipped is None
    data = r.to_json()
    assert [p["dtype"] for p in data["passes"]] == ["float32", "float64"]


@pytest.mark.parametrize("which", ["gelu_tanh", "eps"])
def test_a_default_below_float32_noise_fails_in_float64(files, default, which):
    """GELU's approximation and a LayerNorm eps: today's float32 check passes them, the
    default float64 pass does not."""
    float32_only = _verify(files, which, float64=False)
    assert float32_only.passed, float32_only.mismatch  # float32 noise hides it
    assert [p.dtype for p in float32_only.passes] == ["float32"]
    r = default[which]
    assert r.error is None and not r.passed
    f32, f64 = r.passes
    assert f32.passed and not f64.passed, (_figures(f32), _figures(f64))
    # the difference is the same in both dtypes: far above float64 rounding
    assert f64.max_rel_diff > 1e-8 and f64.max_rel_diff > 1e5 * default["right"].passes[1].max_rel_diff
    assert r.mismatch.startswith("float64: ")
    assert any("float32 agrees within its tolerance but float64 does not" in n for n in r.notes)


def test_grad_false_and_float64_only(files):
    r = _verify(files, "right", grad=False, float64=True)
    assert r.passed and r.grad_max_abs_diff is None
    assert [p.dtype for p in r.passes] == ["float64"]
    assert (r.dtype, r.atol, r.rtol) == ("float64", ATOL64, RTOL64)


def test_the_command_line_defaults_and_opt_outs(files):
    target = f"{files['torch']}::ResidualMLP"
    base = ["verify", target, "--input", INPUTS[0], "--converted", str(files["gelu_tanh"]),
            "--json"]
    res = runner.invoke(app, base)
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert [(p["dtype"], p["passed"]) for p in data["passes"]] == [("float32", True),
                                                                  ("float64", False)]
    assert data["grad_max_abs_diff"] is not None
    res = runner.invoke(app, [*base, "--no-float64", "--grad"])  # --grad: accepted, a no-op
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [p["dtype"] for p in data["passes"]] == ["float32"]
    assert data["grad_max_abs_diff"] is not None
    res = runner.invoke(app, [*base, "--no-float64", "--no-grad"])
    assert res.exit_code == 0 and json.loads(res.stdout)["grad_max_abs_diff"] is None
    res = runner.invoke(app, [*base, "--float64", "--atol64", "1e-3", "--rtol64", "1e-3"])
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and [p["dtype"] for p in data["passes"]] == ["float64"]
    assert data["atol"] == 1e-3


def test_cases_files_take_the_same_defaults_and_opt_out_per_case(files, tmp_path):
    cases = tmp_path / "cases.toml"
    target = f"{files['torch']}::ResidualMLP"
    cases.write_text(f'''
[[case]]
name = "default"
target = "{target}"
converted = "{files['eps']}"
inputs = {json.dumps(INPUTS)}

[[case]]
name = "float32 only, no gradients"
target = "{target}"
converted = "{files['eps']}"
inputs = {json.dumps(INPUTS)}
float64 = false
grad = false
''')
    default, opted_out = run_cases(cases)
    assert [p.dtype for p in default.passes] == ["float32", "float64"]
    assert not default.passed and default.grad_max_abs_diff is not None
    assert [p.dtype for p in opted_out.passes] == ["float32"]
    assert opted_out.passed and opted_out.grad_max_abs_diff is None


def test_a_float32_computation_inside_the_jax_side_is_found():
    """jax.nn.dot_product_attention keeps its softmax in float32 even under x64 (flax's
    MultiHeadAttention calls it): the float64 pass could only report that rounding, so it does
    not run, and says why, instead of failing a right translation."""
    import jax
    import jax.numpy as jnp

    from torch2jax.verify.common import Float32Inside, check_float64

    with jax.enable_x64(True):
        q = jnp.ones((2, 5, 4, 4), dtype=jnp.float64)
        check_float64(lambda q: jax.nn.softmax(q @ jnp.swapaxes(q, -1, -2)), q)  # float64 only
        with pytest.raises(Float32Inside, match="_dot_product_attention_core called from"):
            check_float64(lambda q: jax.nn.dot_product_attention(q, q, q), q)
