"""benchmarks/runtime.py --targets linen / equinox: the per-target plumbing (conversion, weight
transfer, hand-written reference, the emitted eval and train steps) builds and runs the fixture
MLP for one repetition. No assertion on the times: speed is measured in benchmarks/."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _runtime():
    spec = importlib.util.spec_from_file_location("bench_runtime", ROOT / "benchmarks/runtime.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the script's dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_runtime_target_mlp_one_rep(target: str, tmp_path: Path) -> None:
    runtime = _runtime()
    results, notes = runtime.run_target(target, "mlp", reps=1, slot=1e-4, tmp=tmp_path)
    assert notes == []
    for phase in ("forward", "train"):
        assert set(results[phase]) == {"torch", "converted", "reference"}
        assert all(math.isfinite(t) and t > 0 for t in results[phase].values())
