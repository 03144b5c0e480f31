"""The converted sibling of ../torch/config.py (must not be confused with it)."""

from dataclasses import dataclass

BACKEND = "jax"


@dataclass
class LMConfig:
    vocab: int = 50
    dim: int = 16
