"""End to end: every fixture converts with no TODO and no torch import, matches its committed
expected output, and the converted model computes what the torch model computes (forward and
gradients, float32 on CPU, through the verifier)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torch2jax.convert import convert_source
from torch2jax.verify.cases import load_cases
from torch2jax.verify.run import run_request

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
OTHER = Path(__file__).resolve().parent / "data" / "other_styles"
MODELS = sorted((FIXTURES / "models").glob("*.py"))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_fixture_converts_to_expected_nnx(path: Path) -> None:
    result = convert_source(path.read_text(), path=str(path))
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    tree = ast.parse(result.code)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert "torch" not in imported
    assert "torch2jax" not in imported
    expected = (FIXTURES / "expected" / "nnx" / path.name).read_text()
    assert result.code == expected


def _cases(path: Path):
    return [pytest.param(c, id=c.name) for c in load_cases(path)]


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(FIXTURES / "cases.toml") + _cases(OTHER / "cases.toml"))
def test_converted_model_matches_torch(case) -> None:
    assert case.request.grad, "every fixture case compares gradients"
    result = run_request(case.request)
    assert result.error is None, result.error
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5, result.to_json()
    assert result.grad_max_abs_diff is not None and result.grad_max_abs_diff <= 1e-5
    assert result.passed
