"""The verifier's JAX side of each target, by the target's name (``--target``): what
:mod:`torch2jax.verify.run` and :mod:`torch2jax.verify.trajectory` look up once instead of
branching on the name. :mod:`torch2jax.verify.sides` defines the interface they implement."""

from __future__ import annotations

from torch2jax.verify.equinox import EquinoxSide
from torch2jax.verify.linen import LinenSide
from torch2jax.verify.nnx import NnxSide
from torch2jax.verify.sides import JaxSide

SIDES: dict[str, JaxSide] = {side.name: side for side in (NnxSide(), LinenSide(), EquinoxSide())}
