"""The equinox target on random modules (tests/random_modules.py): every module drawn converts
without an internal error, and what converts unmarked computes torch's outputs and gradients
(per example where that form was shown, batched otherwise: ``batched = True``).

The measurement of issue 32 runs the same property at 400 examples, conversion only::

    T2J_RANDOM_MODULES=400 T2J_RANDOM_VERIFY=0 pytest tests/test_equinox_random.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from random_modules import SHAPE, random_module

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

EXAMPLES = int(os.environ.get("T2J_RANDOM_MODULES", "6"))
VERIFY = os.environ.get("T2J_RANDOM_VERIFY", "1") != "0"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(random_module())
def test_random_module_converts_and_matches_torch(tmp_path_factory, source: str) -> None:
    result = convert_source(source, path="net.py", target="equinox")  # (raises: internal)
    if "TODO(torch2jax)" in result.code or not VERIFY:
        return
    path = Path(tmp_path_factory.mktemp("random")) / "net.py"
    path.write_text(source)
    r = verify(f"{path}::Net", inputs=[SHAPE], jax_target="equinox", grad=True)
    assert r.error is None, (source, r.error)
    assert r.passed, (source, r.mismatch, r.to_json())


GRAM_AND_LOOP = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.LayerNorm(4)])

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = x - x.mean(dim=0, keepdim=True)
        x = x.mean(dim=(2, 3))
        for layer in self.layers:
            x = layer(x)
        return x @ torch.einsum("bi,bj->ij", x, x)
'''


def test_the_drawn_menu_covers_the_batched_form() -> None:
    """A module of the menu's batch-mixing steps converts batched, unmarked, and matches
    torch in training mode too (BatchNorm's batch statistics through jax.vmap's axis)."""
    result = convert_source(GRAM_AND_LOOP, path="net.py", target="equinox")
    assert "TODO(torch2jax)" not in result.code
    assert "batched = True" in result.code
    assert "over_leading(layer, x, 1)" in result.code


@pytest.mark.parametrize("train_mode", [False, True])
def test_batched_module_with_batchnorm_matches_torch(train_mode: bool, tmp_path: Path) -> None:
    path = tmp_path / "net.py"
    path.write_text(GRAM_AND_LOOP)
    r = verify(f"{path}::Net", inputs=[SHAPE], jax_target="equinox", grad=True,
               train_mode=train_mode)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, (r.mismatch, r.to_json())
