"""The embedding layers' helper classes written into converted files (passes/helpers.py
writes them; rules/layers.toml names them): nn.Embedding with a padding_idx and
nn.EmbeddingBag, each an nnx.Embed with torch's call."""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

# nn.Embedding(padding_idx=...) (rules/layers.toml)
helper("Embedding", {"Any", "jax", "jnp", "nnx"}, """
class Embedding(nnx.Embed):
    \"\"\"nn.Embedding(num_embeddings, embedding_dim, padding_idx): an nnx.Embed whose row
    padding_idx starts at zero and never receives a gradient, as torch's: the lookups of
    padding_idx return the row as it is (zero unless set otherwise, by a weight transfer
    say) through jax.lax.stop_gradient, so the row's gradient is exactly zero.\"\"\"

    def __init__(self, num_embeddings: int, features: int, padding_idx: int | None = None, *,
                 rngs: nnx.Rngs, **kwargs: Any) -> None:
        super().__init__(num_embeddings, features, rngs=rngs, **kwargs)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        if padding_idx is not None:
            self.embedding[...] = self.embedding[...].at[padding_idx].set(0)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        out = super().__call__(inputs)
        if self.padding_idx is None:
            return out
        padded = (inputs == self.padding_idx)[..., None]
        return jnp.where(padded, jax.lax.stop_gradient(out), out)
""", targets=("nnx",))

# nn.EmbeddingBag (rules/layers.toml)
helper("EmbeddingBag", {"Any", "jax", "jnp", "nnx"}, """
class EmbeddingBag(nnx.Embed):
    \"\"\"nn.EmbeddingBag: each bag's rows reduced by mode ('sum', 'mean' or 'max'); a 2-d
    input is one bag per row, a 1-d one with offsets has bag i from offsets[i] to the next
    (include_last_offset: the last offset ends the last bag). padding_idx rows are left out,
    per_sample_weights scale the rows; an empty bag is zeros, as torch's.\"\"\"

    def __init__(self, num_embeddings: int, features: int, mode: str = "mean",
                 include_last_offset: bool = False, padding_idx: int | None = None, *,
                 rngs: nnx.Rngs, **kwargs: Any) -> None:
        super().__init__(num_embeddings, features, rngs=rngs, **kwargs)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"EmbeddingBag mode {mode!r}: 'sum', 'mean' or 'max'")
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.mode, self.include_last_offset = mode, include_last_offset
        self.padding_idx = padding_idx

    def __call__(self, inputs: jax.Array, offsets: jax.Array | None = None,
                 per_sample_weights: jax.Array | None = None) -> jax.Array:
        if inputs.ndim == 2:
            bags = inputs.shape[0]
            segments = jnp.repeat(jnp.arange(bags), inputs.shape[1])
            inputs = inputs.reshape(-1)
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights.reshape(-1)
        else:
            starts = offsets[:-1] if self.include_last_offset else offsets
            bags = starts.shape[0]
            segments = jnp.searchsorted(starts, jnp.arange(inputs.shape[0]), side="right") - 1
            if self.include_last_offset:  # (past the last offset: in no bag)
                segments = jnp.where(jnp.arange(len(inputs)) < offsets[-1], segments, -1)
        keep = jnp.ones(inputs.shape, bool) if self.padding_idx is None else (
            inputs != self.padding_idx)
        segments = jnp.where(keep & (segments >= 0), segments, bags)  # bag `bags`: dropped
        rows = super().__call__(inputs)
        if per_sample_weights is not None:
            rows = rows * per_sample_weights[:, None]
        count = jax.ops.segment_sum(jnp.ones(inputs.shape, rows.dtype), segments, bags + 1)
        if self.mode == "max":
            out = jax.ops.segment_max(rows, segments, bags + 1)
            out = jnp.where(count[:, None] > 0, out, 0)
        else:
            out = jax.ops.segment_sum(rows, segments, bags + 1)
            if self.mode == "mean":
                out = out / jnp.maximum(count, 1)[:, None]
        return out[:bags]
""", targets=("nnx",))
