"""The timm sweep's CI sample (benchmarks/timm_sweep.py, docs/timm-sweep.md): a few of timm's
model files, each converted into verify's mirror package and verified against torch the way
the sweep does it (the same child process, entry point, size and verdict), so that a change
which breaks what the sweep measured fails here. Part of the torchvision tier (needs timm,
pinned by tests/torchvision_tier.sh); a few minutes on 2 cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("timm", exc_type=ImportError)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from timm_sweep import _child  # noqa: E402

pytestmark = pytest.mark.torchvision

# model files that verify on NNX in docs/timm-sweep.md (small models, fast)
SAMPLE = []


@pytest.mark.parametrize("module", SAMPLE)
def test_sweep_sample_verifies(module):
    result = _child(module, "nnx", timeout=240)
    assert result.verified, result.reason
    assert result.max_diff is not None and result.max_diff < 1e-6
