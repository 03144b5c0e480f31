"""Converting a small torch snippet and running it next to its conversion (the tests' own
sources, exec'd on both sides)."""

from __future__ import annotations

import numpy as np
import torch

from torch2jax.convert import convert_source


def assert_function_matches_torch(source: str, *xs: np.ndarray, name: str = "f",
                                  rtol: float = 1e-6, atol: float = 1e-6):
    """Convert ``source`` (no error diagnostics allowed), call ``name`` on ``xs`` in torch and in
    the converted code, and compare the outputs. Returns the conversion result."""
    import jax.numpy as jnp

    result = convert_source(source, path="<snippet>")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    want = ns_t[name](*(torch.from_numpy(x) for x in xs)).numpy()
    got = np.asarray(ns_j[name](*(jnp.asarray(x) for x in xs)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return result
