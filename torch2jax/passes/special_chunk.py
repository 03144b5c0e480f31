"""``torch.chunk`` / ``x.chunk(n, dim)`` (rules/functions.toml, rules/methods.toml).

torch's chunk cuts into pieces of ``ceil(size / n)``: the last one smaller where ``n`` does not
divide the size, and fewer than ``n`` pieces where the size runs out first (7 channels in 4
chunks: 2, 2, 2, 1; 5 in 4: 2, 2, 1). ``jnp.split(x, n)`` gives equal pieces only and raises
otherwise. A literal count (``qkv.chunk(3, dim=-1)``) stays ``jnp.split(x, 3, axis=...)``, what a
JAX engineer writes (it raises, not silently wrong, where the size does not divide); a count
computed from the model (edgenext's ``x.chunk(len(self.convs) + 1, dim=1)``) becomes the helper
``torch_chunk``, whose split points come from the static shape.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, py, try_literal
from torch2jax.passes.helper_registry import helper
from torch2jax.passes.registry import Site, special

helper("torch_chunk", {"jnp"}, '''
def torch_chunk(x, chunks: int, axis: int = 0) -> list:
    """torch's chunk: pieces of ceil(size / chunks) along axis, the last one smaller (and fewer
    than chunks pieces where the size runs out first)."""
    size = x.shape[axis]
    step = max(-(-size // chunks), 1)
    return jnp.split(x, list(range(step, size, step)), axis=axis)
''')


@special("chunk")
def chunk(site: Site) -> cst.BaseExpression:
    n = site.args.get("chunks")
    if n is None:
        raise Untranslatable("chunk without a count")
    d = site.args.get("dim")
    axis = arg(d if d is not None else py(0), "axis")
    if isinstance(try_literal(n, ...), int):
        site.note("jnp.split raises when the size is not divisible by chunks; torch.chunk then "
                  "returns smaller (or fewer) chunks", "info")
        return call("jnp.split", arg(site.x()), arg(n), axis)
    return call("torch_chunk", arg(site.x()), arg(n), axis)
