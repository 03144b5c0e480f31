"""Numerical verification of converted models against their torch originals."""

from torch2jax.verify.cases import load_cases, print_cases_summary, run_cases
from torch2jax.verify.load import LoadError, load_module, split_target
from torch2jax.verify.run import VerifyError, VerifyResult, verify
from torch2jax.verify.spec import InputSpec, parse_spec

__all__ = [
    "InputSpec",
    "LoadError",
    "VerifyError",
    "VerifyResult",
    "load_cases",
    "load_module",
    "parse_spec",
    "print_cases_summary",
    "run_cases",
    "split_target",
    "verify",
]
