"""The timm sweep's time limit (benchmarks/timm_sweep.py): a child is stopped after its
``--timeout`` in CPU seconds, not wall-clock ones, so that a row's "timed out" says the file
needs that much work, not that the shared machine was loaded. Needs timm (the torchvision
tier, as tests/test_timm_sweep.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("timm", exc_type=ImportError)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from timm_sweep import _child

pytestmark = pytest.mark.torchvision


def test_a_child_past_its_cpu_time_is_stopped_and_says_so():
    # importing torch and timm alone takes the child past one CPU second
    result = _child("resnet", "nnx", timeout=1)
    assert result.reason == "timed out after 1 s of CPU time", result.reason
    assert not result.verified
