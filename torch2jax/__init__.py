"""torch2jax: rewrite PyTorch source code as JAX (flax NNX) and verify it numerically."""

from torch2jax.convert import ConversionResult, convert_source

__all__ = ["ConversionResult", "convert_source"]
__version__ = "0.1.0"
