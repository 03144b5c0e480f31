"""Emitters: how each JAX target declares modules, parameters, buffers and RNG state.

The passes ask the emitter instead of branching on the target.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Emitter:
    name: str
    module_base: str  # base class of converted modules
    rngs_type: str  # annotation of the rngs parameter
    param: str  # nn.Parameter -> this constructor
    buffer: str  # register_buffer -> this constructor
    imports: tuple[str, ...]


NNX = Emitter(
    name="nnx",
    module_base="nnx.Module",
    rngs_type="nnx.Rngs",
    param="nnx.Param",
    buffer="nnx.Variable",
    imports=("from flax import nnx",),
)

LINEN = Emitter(
    name="linen",
    module_base="nn.Module",
    rngs_type="",
    param="self.param",
    buffer="",
    imports=("import flax.linen as nn",),
)

# equinox is a pass over the NNX translation (targets/equinox.py), not an emitter of the passes
EQUINOX = Emitter(
    name="equinox",
    module_base="eqx.Module",
    rngs_type="",
    param="",
    buffer="",
    imports=("import equinox as eqx",),
)

TARGETS = {"nnx": NNX, "linen": LINEN, "equinox": EQUINOX}


def get_emitter(name: str) -> Emitter:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; available: {', '.join(sorted(TARGETS))}"
        ) from None
