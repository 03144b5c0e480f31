"""Numerical verification of converted models against their torch originals."""

from torch2jax.verify.load import LoadError, load_module, split_target
from torch2jax.verify.run import VerifyError, VerifyResult, verify
from torch2jax.verify.spec import InputSpec, parse_spec

__all__ = [
    "InputSpec",
    "LoadError",
    "VerifyError",
    "VerifyResult",
    "load_module",
    "parse_spec",
    "split_target",
    "verify",
]
