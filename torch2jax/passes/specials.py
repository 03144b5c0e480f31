"""Every rule special, registered: import :data:`SPECIALS` from here.

Each ``special*`` module registers its transforms in :mod:`torch2jax.passes.registry` when it is
imported; this module imports them all, so that the registry is complete wherever it is read
(the rewriter, the user-rule check). Nothing imports this module back.
"""

from __future__ import annotations

from torch2jax.passes import (  # noqa: F401  (each import registers its transforms)
    special,  # layers, tensor functions and methods
    special_batch_norm,  # F.batch_norm without running statistics
    special_casts,  # x.to(dtype), x.type(dtype)
    special_chunk,  # torch.chunk, x.chunk
    special_complex,  # torch.polar, view_as_complex, view_as_real
    special_device,  # device queries and objects
    special_group_norm,  # F.group_norm
    special_index,  # index_add, scatter_add, topk, histc, repeat_interleave
    special_losses,  # losses
    special_optim,  # optimizers and schedulers outside a training script
    special_packed,  # pack_padded_sequence, pad_packed_sequence
    special_sequence,  # attention and recurrent layers
    special_tensors,  # linalg norms, legacy constructors, F.embedding
    special_unfold,  # F.unfold, F.fold and their layers
    special_vision,  # vision layers and functions
)
from torch2jax.passes.registry import SPECIALS, Site

__all__ = ["SPECIALS", "Site"]
