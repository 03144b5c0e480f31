"""Hand-written flax NNX reference for fixtures/models/gpt.py (GPTConfig defaults).

Pre-LayerNorm blocks, fused QKV projection, causal attention through
jax.nn.dot_product_attention, exact GELU, LM head tied to the token embedding (Embed.attend).
Dropout is 0.0 in the fixture's config, so the reference has no dropout layers.
"""

import jax
import jax.numpy as jnp
from flax import nnx


class Attention(nnx.Module):
    def __init__(self, n_embd, n_head, *, rngs):
        self.n_head = n_head
        self.qkv = nnx.Linear(n_embd, 3 * n_embd, rngs=rngs)
        self.proj = nnx.Linear(n_embd, n_embd, rngs=rngs)

    def __call__(self, x):
        b, t, c = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3, self.n_head, c // self.n_head), 3, axis=2)
        y = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], is_causal=True)
        return self.proj(y.reshape(b, t, c))


class Block(nnx.Module):
    def __init__(self, n_embd, n_head, *, rngs):
        self.ln_1 = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)
        self.attn = Attention(n_embd, n_head, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)
        self.fc = nnx.Linear(n_embd, 4 * n_embd, rngs=rngs)
        self.proj = nnx.Linear(4 * n_embd, n_embd, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(jax.nn.gelu(self.fc(self.ln_2(x)), approximate=False))


class GPT(nnx.Module):
    def __init__(self, block_size=64, vocab_size=128, n_layer=2, n_head=2, n_embd=32, *, rngs):
        self.wte = nnx.Embed(vocab_size, n_embd, rngs=rngs)
        self.wpe = nnx.Embed(block_size, n_embd, rngs=rngs)
        self.blocks = nnx.List([Block(n_embd, n_head, rngs=rngs) for _ in range(n_layer)])
        self.ln_f = nnx.LayerNorm(n_embd, epsilon=1e-5, rngs=rngs)

    def __call__(self, idx):
        x = self.wte(idx) + self.wpe(jnp.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.wte.attend(self.ln_f(x))
