"""torch's float64 reference where torch itself rounds to float32 (the float64 pass).

aten's CPU kernel of ``hardsigmoid``'s backward pass multiplies by a float32 constant one
sixth (``1.0f / 6.0f``) in float64 too: its gradient is 0.1666666716..., 3e-8 relative from
1/6, and every gradient behind an ``nn.Hardsigmoid`` (timm's ``EffectiveSEModule`` gate)
inherits that rounding, eight orders of magnitude above a right translation's float64
difference. In the float64 pass torch's backward runs with ``F.hardsigmoid`` computed as its
definition, ``clamp(x + 3, 0, 6) / 6`` (the forward values agree with aten's to float64
rounding), whose gradient is exact. The other activations of ``torch.nn.functional`` were
measured exact in float64 (tests/test_verify_torch_exact.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NOTE = ("float64: torch's hardsigmoid computed as clamp(x + 3, 0, 6) / 6 in the backward "
        "pass (aten's CPU backward multiplies by a float32 1/6, 3e-8 relative)")


@contextlib.contextmanager
def exact_float64(enabled: bool, notes: list[str]) -> Iterator[None]:
    """Inside, ``F.hardsigmoid`` on a float64 tensor is its definition (module docstring);
    ``notes`` gets :data:`NOTE` where it was called. Nothing changes unless ``enabled``."""
    if not enabled:
        yield
        return
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    called = []

    class _Exact(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is F.hardsigmoid and args and getattr(args[0], "dtype", None) == (
                    torch.float64):
                called.append(True)
                x = args[0]
                inplace = kwargs.get("inplace", args[1] if len(args) > 1 else False)
                if inplace:
                    return x.add_(3.0).clamp_(0.0, 6.0).div_(6.0)
                return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0
            return func(*args, **kwargs)

    with _Exact():
        yield
    if called and NOTE not in notes:
        notes.append(NOTE)
