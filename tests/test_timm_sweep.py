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

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from timm_sweep import _child

pytestmark = pytest.mark.torchvision

# model files that verify on NNX in docs/timm-sweep.md (small models, fast): senet's
# legacy_seresnet18, the first to verify (the second run; about 100 s on 2 loaded cores), and
# repvit's repvit_m1 (the third run: named Sequential layers, timm's activation lookups)
SAMPLE: list[str] = ["senet", "repvit"]
# a file the sample runs whatever its verdict: the sweep's machinery (entry point, overrides,
# input size, conversion into the mirror package, verify) works end to end on it
SMOKE = "resnet"


@pytest.mark.parametrize("module", SAMPLE)
def test_sweep_sample_verifies(module):
    result = _child(module, "nnx", timeout=240)
    assert result.verified, result.reason
    assert result.max_diff is not None and result.max_diff < 1e-6


def test_sweep_runs_a_file_end_to_end():
    result = _child(SMOKE, "nnx", timeout=400)
    assert result.entry.startswith("test_resnet(") and result.entry.endswith("@32"), result.entry
    assert result.converted, result.reason
    assert not result.reason.startswith(("timed out", "the child failed", "not run")), result.reason
    assert result.verified or result.reason


TRUNC_NORMAL = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from timm.layers import trunc_normal_


    class Net(nn.Module):
        def __init__(self, dim=8, num_classes=3):
            super().__init__()
            self.pos_embed = nn.Parameter(torch.zeros(1, 4, dim))
            self.fc = nn.Linear(dim, num_classes)
            trunc_normal_(self.pos_embed, std=.02)
            self.apply(self._init_weights)

        def _init_weights(self, m):
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                nn.init.zeros_(m.bias)

        def forward(self, x):
            return self.fc(x + self.pos_embed).mean(1)
''')


def test_timms_trunc_normal_is_torchs(tmp_path):
    """timm.layers.trunc_normal_ (49 of timm's model files call it) is torch's
    nn.init.trunc_normal_ to the letter: translated as torch's, its import dropped. It was
    left as timm's, which called .uniform_ on a JAX array when the model was built."""
    (tmp_path / "net.py").write_text(TRUNC_NORMAL)
    result = run_request(VerifyRequest(f"{tmp_path / 'net.py'}::Net", inputs=("float32[2,4,8]",)))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0
