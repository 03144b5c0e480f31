"""torch2jax: rewrite PyTorch source code as JAX (flax NNX) and verify it numerically."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch2jax.convert import convert_source
    from torch2jax.result import ConversionResult

__all__ = ["ConversionResult", "convert_source"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # (loaded on first use: the CLI's check and --help need neither libcst nor the rewriter)
    if name == "convert_source":
        from torch2jax.convert import convert_source

        return convert_source
    if name == "ConversionResult":
        from torch2jax.result import ConversionResult

        return ConversionResult
    raise AttributeError(f"module 'torch2jax' has no attribute {name!r}")
