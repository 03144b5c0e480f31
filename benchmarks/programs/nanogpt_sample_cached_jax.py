"""nanogpt.py's sampling (GPT_MODE=sample) written by hand in idiomatic JAX with a key/value
cache: the cached-decoder twin (issue 30) the converted nanoGPT sampling is measured against,
beside the fixed-buffer twin (nanogpt_jax.py). The model and the decoder are
gpt_sample_cached_jax.py's (nanoGPT's sizes are the same): while the context is shorter than
block_size, each step runs the model on the new token only, its keys and values written into a
per-layer cache; once the context is full the window slides and each step runs the model on it.
As nanogpt.py's sample(): two samples of max_new_tokens tokens, top-k 10, temperature 0.8."""

import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

batch_size = 1
block_size = 32
vocab_size = 48
n_layer = 2
n_head = 4
n_embd = 64
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100"))
temperature = 0.8
top_k = 10
num_samples = 2
seed = 1337


class CausalSelfAttention(nnx.Module):
    def __init__(self, rngs):
        self.c_attn = nnx.Linear(n_embd, 3 * n_embd, rngs=rngs)
        self.c_proj = nnx.Linear(n_embd, n_embd, rngs=rngs)

    def __call__(self, x):
        B, T, C = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        q, k, v = (t.reshape(B, T, n_head, C // n_head) for t in (q, k, v))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(C // n_head).astype(x.dtype)
        att = jnp.where(jnp.tril(jnp.ones((T, T), bool)), att, -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, axis=-1), v)
        return self.c_proj(y.reshape(B, T, C))


class Block(nnx.Module):
    def __init__(self, rngs):
        self.ln_1 = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)
        self.attn = CausalSelfAttention(rngs)
        self.ln_2 = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)
        self.c_fc = nnx.Linear(n_embd, 4 * n_embd, rngs=rngs)
        self.mlp_proj = nnx.Linear(4 * n_embd, n_embd, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(jax.nn.gelu(self.c_fc(self.ln_2(x)), approximate=False))


class GPT(nnx.Module):
    def __init__(self, rngs):
        self.wte = nnx.Embed(vocab_size, n_embd, rngs=rngs)
        self.wpe = nnx.Embed(block_size, n_embd, rngs=rngs)
        self.h = nnx.List([Block(rngs) for _ in range(n_layer)])
        self.ln_f = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)
        self.lm_head = nnx.Linear(n_embd, vocab_size, use_bias=False, rngs=rngs)

    def __call__(self, idx):
        x = self.wte(idx) + self.wpe(jnp.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))



def decode_one(model, tok, pos, cache):
    """The logits of token ``tok`` (batch,) at position ``pos``, the earlier positions' keys and
    values read from ``cache`` (per layer: (k, v), each (batch, block_size, heads, head
    size)); returns the logits and the cache with this position written."""
    B = tok.shape[0]
    x = model.wte(tok[:, None]) + model.wpe(pos[None, None])
    new = []
    for block, (kc, vc) in zip(model.h, cache):
        attn = block.attn
        h = block.ln_1(x)
        q, k, v = jnp.split(attn.c_attn(h), 3, axis=-1)
        q, k, v = (t.reshape(B, 1, n_head, n_embd // n_head) for t in (q, k, v))
        kc = jax.lax.dynamic_update_slice(kc, k, (0, pos, 0, 0))
        vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
        att = jnp.einsum("bqhd,bkhd->bhqk", q, kc) / jnp.sqrt(n_embd // n_head).astype(x.dtype)
        att = jnp.where(jnp.arange(block_size) <= pos, att, -jnp.inf)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(att, axis=-1), vc)
        x = x + attn.c_proj(y.reshape(B, 1, n_embd))
        x = x + block.mlp_proj(jax.nn.gelu(block.c_fc(block.ln_2(x)), approximate=False))
        new.append((kc, vc))
    return model.lm_head(model.ln_f(x))[:, 0], new


@nnx.jit(static_argnums=(2,))
def generate(model, key, steps):
    buf = jnp.zeros((batch_size, block_size), jnp.int32)  # the start token 0 at position 0
    shape = (batch_size, block_size, n_head, n_embd // n_head)
    cache = [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(n_layer)]

    def decode(i, carry):
        buf, t, key, out, cache = carry
        # steps 0 .. block_size - 1 add a position (the last token at t - 1); from step
        # block_size on the window has slid: the model runs on all of it
        last = jax.lax.dynamic_index_in_dim(buf, t - 1, axis=1, keepdims=False)
        logits, cache = jax.lax.cond(i < block_size,
                                     lambda: decode_one(model, last, t - 1, cache),
                                     lambda: (model(buf)[:, -1], cache))
        logits = logits / temperature
        if top_k is not None:
            v, _ = jax.lax.top_k(logits, top_k)
            logits = jnp.where(logits < v[:, -1:], -jnp.inf, logits)
        key, sub = jax.random.split(key)
        tok = jax.random.categorical(sub, logits, axis=-1).astype(jnp.int32)
        placed = jax.lax.dynamic_update_slice(buf, tok[:, None], (0, jnp.minimum(t, block_size - 1)))
        shifted = jnp.concatenate([buf[:, 1:], tok[:, None]], axis=1)
        buf = jnp.where(t < block_size, placed, shifted)
        return buf, jnp.minimum(t + 1, block_size), key, out.at[:, i].set(tok), cache

    out = jnp.zeros((batch_size, steps), jnp.int32)
    return jax.lax.fori_loop(0, steps, decode, (buf, jnp.int32(1), key, out, cache))[3]


def sample():
    model = GPT(nnx.Rngs(seed))
    key = jax.random.key(seed)
    generate(model, key, max_new_tokens).block_until_ready()  # compile (the same shapes)
    t0 = time.perf_counter()
    for k in range(num_samples):
        key, sub = jax.random.split(key)
        y = generate(model, sub, max_new_tokens)
        print("sample", " ".join(str(t) for t in [0] + y[0].tolist()[:19]))
    elapsed = time.perf_counter() - t0
    print(f"tokens_per_s={num_samples * max_new_tokens / elapsed:.1f}")


sample()
