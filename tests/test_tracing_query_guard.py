"""``if not torch.jit.is_scripting() and not torch.jit.is_tracing(): _log_api_usage_once(f)``
(torchvision's utils, before every drawing function): the guard's body is an API-usage log,
which the conversion removes; keeping the untraced path left an ``if`` with no statement and
the conversion of the whole file failed (IndexError), so every torchvision model that verify
mirrors failed to convert. The function must convert and run."""

from __future__ import annotations

import pytest

pytest.importorskip("jax")

from torch2jax.convert import convert_source

SOURCE = '''
import torch


def _log_api_usage_once(obj):
    torch._C._log_api_usage_once(f"{obj.__module__}.{obj.__name__}")


def scale(x: torch.Tensor, k: float) -> torch.Tensor:
    if not torch.jit.is_scripting() and not torch.jit.is_tracing():
        _log_api_usage_once(scale)
    return x * k
'''


def test_a_logging_guard_with_nothing_left_converts_and_runs():
    import jax.numpy as jnp

    r = convert_source(SOURCE)
    namespace: dict = {}
    exec(compile(r.code, "<converted>", "exec"), namespace)  # noqa: S102 - our output
    out = namespace["scale"](jnp.ones(3), 2.0)
    assert out.tolist() == [2.0, 2.0, 2.0]
