"""gpt_train.py written by hand in idiomatic JAX (flax NNX, optax): the twin the converted
program is measured against. Same data, model shape, optimizer and logging; numpy batches
on the host, one jax.jit step over the split state, donated."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

batch_size = 8
block_size = 32
vocab_size = 48
n_layer = 2
n_head = 4
n_embd = 64
learning_rate = 1e-3
max_iters = int(os.environ.get("GPT_MAX_ITERS", "120"))
warmup = 10
log_interval = 20
seed = 1337

rng = np.random.default_rng(seed)
data = np.array([(i * 7 + i // 11) % vocab_size for i in range(20000)], dtype=np.int32)
offsets = np.arange(block_size)


def get_batch():
    ix = rng.integers(0, len(data) - block_size, batch_size)
    return data[ix[:, None] + offsets], data[ix[:, None] + offsets + 1]


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


model = GPT(nnx.Rngs(seed))
tx = optax.chain(optax.clip_by_global_norm(1.0),
                 optax.adamw(learning_rate, weight_decay=0.1))
optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
graphdef, state = nnx.split((model, optimizer))


@jax.jit(donate_argnums=0)
def train_step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
        logits = model(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss


t0 = time.perf_counter()
for it in range(max_iters):
    if it == warmup:
        t0 = time.perf_counter()
    xb, yb = get_batch()
    state, loss = train_step(state, xb, yb)
    if it % log_interval == 0 or it == max_iters - 1:
        print(f"iter {it} loss {loss.item():.4f}")
print(f"ms_per_iter={(time.perf_counter() - t0) * 1000 / (max_iters - warmup):.3f}")
