"""A sibling module: the converted twin in ../nnx/ has one with the same name."""

from dataclasses import dataclass

BACKEND = "torch"


@dataclass
class LMConfig:
    vocab: int = 50
    dim: int = 16
