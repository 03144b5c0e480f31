"""Input specifications for ``torch2jax verify --input``: ``DTYPE[D0,D1,...]`` or, for integer
inputs, ``DTYPE[D0,...]:HIGH`` with an exclusive upper bound (token ids, class labels).

One spec draws one random array with numpy; the same array is then handed to torch and to JAX,
so the two sides see identical inputs whatever their own random number generators do.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

import numpy as np

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "int": "int64",
    "long": "int64",
}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8")
DTYPES = (*FLOAT_DTYPES, *INT_DTYPES, "bool")

_SPEC = re.compile(r"^\s*(\w+)\s*\[([^\]]*)\]\s*(?::\s*(\S+))?\s*$")


@dataclass(frozen=True)
class InputSpec:
    """A random input: its dtype name (numpy/torch spelling), shape and, for ints, bound."""

    dtype: str
    shape: tuple[int, ...]
    high: int | None = None
    name: str | None = None  # NAME=SPEC: passed as the keyword argument NAME
    # --input-expr: a Python expression each side evaluates (its value is the input), not a
    # random array; ``dtype`` is then "expr" and ``shape`` empty
    expr: str | None = None

    def __str__(self) -> str:
        if self.expr is not None:
            return f"{self.name}={self.expr}" if self.name else self.expr
        dims = ",".join(str(d) for d in self.shape)
        bound = f":{self.high}" if self.high is not None else ""
        named = f"{self.name}=" if self.name else ""
        return f"{named}{self.dtype}[{dims}]{bound}"

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    def sample(self, rng: np.random.Generator) -> np.ndarray | None:
        """Draw the array. Floats are standard normal, drawn in float32 (float64 for float64)
        and cast by each side, because numpy cannot hold bfloat16 for torch. None for an
        expression (each side evaluates it once the models are built)."""
        if self.expr is not None:
            return None
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype in INT_DTYPES:
            return rng.integers(0, self.high or 1, size=self.shape).astype(self.dtype)
        draw = rng.standard_normal(self.shape)
        return draw.astype("float64" if self.dtype == "float64" else "float32")


_NAMED = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(.*)$")


def parse_spec(text: str) -> InputSpec:
    """Parse ``float32[2,3,32,32]`` / ``int64[2,16]:100`` / ``attention_mask=int64[2,16]:2``
    (a keyword argument); a bad spec raises ValueError."""
    named = _NAMED.match(text)
    if named:
        return replace(parse_spec(named.group(2)), name=named.group(1))
    m = _SPEC.match(text)
    if not m:
        raise ValueError(
            f"bad input spec {text!r}: expected DTYPE[D0,D1,...], e.g. float32[2,3,32,32], "
            "or DTYPE[...]:HIGH for integers, e.g. int64[2,16]:100"
        )
    dtype = _ALIASES.get(m.group(1), m.group(1))
    if dtype not in DTYPES:
        raise ValueError(f"bad input spec {text!r}: unknown dtype {m.group(1)!r} ({DTYPES})")
    dims = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
    if not all(d.isdigit() for d in dims):
        raise ValueError(f"bad input spec {text!r}: dimensions must be non-negative integers")
    high = _parse_bound(text, dtype, m.group(3))
    return InputSpec(dtype, tuple(int(d) for d in dims), high)


def _parse_bound(text: str, dtype: str, raw: str | None) -> int | None:
    if dtype not in INT_DTYPES:
        if raw is not None:
            raise ValueError(f"bad input spec {text!r}: only integer inputs take a :HIGH bound")
        return None
    if raw is None:
        raise ValueError(
            f"bad input spec {text!r}: integer inputs need an exclusive upper bound, "
            f"e.g. {dtype}[2,16]:100 for ids in [0, 100)"
        )
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"bad input spec {text!r}: the bound must be a positive integer")
    if int(raw) - 1 > np.iinfo(dtype).max:
        raise ValueError(f"bad input spec {text!r}: {raw} does not fit {dtype}")
    return int(raw)


def parse_input_expr(text: str) -> InputSpec:
    """``EXPR`` (a positional input) or ``NAME=EXPR`` (a keyword input) of ``--input-expr``,
    e.g. ``hidden=model.init_hidden(2)``; ValueError when it is not a Python expression."""
    import ast

    named = _NAMED.match(text)
    name, expr = (named.group(1), named.group(2).strip()) if named and not \
        named.group(2).startswith("=") else (None, text.strip())
    try:
        ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"--input-expr {text!r}: not a Python expression ({exc.msg}); write "
                         "EXPR or NAME=EXPR, e.g. hidden=model.init_hidden(2)") from None
    return InputSpec("expr", (), None, name, expr)


def parse_specs(texts: list[str] | tuple[str, ...], exprs: list[str] | tuple[str, ...] = ()
                ) -> list[InputSpec]:
    """The ``--input`` specs, then the ``--input-expr`` ones: positional inputs first (the
    specs', then the expressions'), keyword inputs after them."""
    specs = [parse_spec(t) for t in texts]
    if exprs:
        if any(a.name and not b.name for a, b in itertools.pairwise(specs)):
            raise ValueError("input specs: positional inputs come before NAME=SPEC ones")
        extra = [parse_input_expr(t) for t in exprs]
        specs = ([s for s in specs if not s.name] + [s for s in extra if not s.name]
                 + [s for s in specs if s.name] + [s for s in extra if s.name])
    names = [s.name for s in specs if s.name]
    if len(set(names)) != len(names):
        raise ValueError(f"input specs: a keyword given twice ({', '.join(names)})")
    if any(a.name and not b.name for a, b in itertools.pairwise(specs)):
        raise ValueError("input specs: positional inputs come before NAME=SPEC ones")
    return specs


def call_with(fn, xs: list, specs: list[InputSpec] | None):
    """``fn`` applied to the inputs ``xs`` of ``specs``: positional, then NAME=SPEC ones as
    keywords."""
    if specs is None:
        return fn(*xs)
    args = [x for x, s in zip(xs, specs, strict=True) if not s.name]
    kwargs = {s.name: x for x, s in zip(xs, specs, strict=True) if s.name}
    return fn(*args, **kwargs)
