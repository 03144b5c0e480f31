"""`verify --benchmark`: the forward times and their ratio reach the result, the JSON and the
text output. No assertion on the times themselves: speed is measured in benchmarks/, not here.

The conversion is the hand-written tests/data/verify/nnx/models.py (``converted=``), so these
tests do not depend on the converter.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.verify import verify
from torch2jax.verify.benchmark import round_robin, summary_line

DATA = Path(__file__).parent / "data" / "verify"
TARGET = f"{DATA / 'torch' / 'models.py'}::MLP"
CONVERTED = str(DATA / "nnx" / "models.py")


def _check_fields(data: dict) -> None:
    assert data["jax_ms"] > 0 and data["torch_ms"] > 0
    assert math.isclose(data["speed_ratio"], data["torch_ms"] / data["jax_ms"], rel_tol=1e-9)


def test_benchmark_fields_in_result_and_json():
    r = verify(TARGET, inputs=["float32[4,8]"], converted=CONVERTED, benchmark=True)
    assert r.error is None and r.passed, r.to_json()
    _check_fields(json.loads(r.dumps()))
    assert any(n.startswith("benchmark (forward") for n in r.notes)
    assert summary_line(r).endswith(f"speed ratio (torch/JAX) {r.speed_ratio:.2f}")


def test_no_benchmark_no_times():
    r = verify(TARGET, inputs=["float32[4,8]"], converted=CONVERTED)
    data = r.to_json()
    assert data["jax_ms"] is None and data["torch_ms"] is None and data["speed_ratio"] is None
    assert summary_line(r) is None


def test_cli_benchmark_json_and_text():
    args = ["verify", TARGET, "--input", "float32[4,8]", "--converted", CONVERTED, "--benchmark"]
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    _check_fields(json.loads(out.stdout))
    text = CliRunner().invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "speed ratio (torch/JAX)" in text.output


def test_round_robin_interleaves_and_excludes_warmup():
    log: list[str] = []
    fns = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    medians = round_robin(fns, reps=3, slot=0.0, warmup=2)
    assert set(medians) == {"a", "b"} and all(v >= 0 for v in medians.values())
    # 2 warm-up + 1 sizing call each, then one call per repetition, the order rotated
    assert log == ["a"] * 3 + ["b"] * 3 + ["a", "b", "b", "a", "a", "b"]
