"""A model file of a test's own, verified against torch: the one step the shape tests
(``tests/test_timm_shapes*.py``) each take."""

from __future__ import annotations

from pathlib import Path

from torch2jax.verify.run import VerifyRequest, run_request


def verified_file(tmp_path: Path, source: str, entry: str, *inputs: str,
                  float64: bool | None = True, train_mode: bool = False):
    """``source`` written as ``model.py``, its class ``entry`` verified against torch
    (outputs and gradients; float64 by default) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs,
                                       float64=float64, train_mode=train_mode))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result
