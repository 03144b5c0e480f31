"""nanogpt.py written by hand in idiomatic JAX (flax NNX, optax): the twin the converted
program is measured against. Training: numpy batches, the micro-batches of one iteration
stacked and reduced by a jax.lax.scan of the gradient inside one jax.jit step with the clip
and the update (split, donated state); parameter groups as an optax mask; the learning rate an
argument of the step (optax.inject_hyperparams). Sampling: one jax.jit of a fori_loop of
decode steps over a fixed (1, block_size) buffer, the logits read at the last valid position.
"""

import math
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
gradient_accumulation_steps = 4
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 20
lr_decay_iters = 200
weight_decay = 0.1
grad_clip = 1.0
max_iters = int(os.environ.get("GPT_MAX_ITERS", "120")) // 2
warmup = 5
log_interval = 20
mode = os.environ.get("GPT_MODE", "train")
num_samples = 2
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100"))
temperature = 0.8
top_k = 10
seed = 1337

rng = np.random.default_rng(seed)
data = np.array([(i * 7 + i // 11) % vocab_size for i in range(20000)], dtype=np.int32)
offsets = np.arange(block_size)


def get_batches(n):
    ix = rng.integers(0, len(data) - block_size, (n, batch_size))
    return data[ix[..., None] + offsets], data[ix[..., None] + offsets + 1]


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




def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def train():
    model = GPT(nnx.Rngs(seed))

    def decay(params):  # the parameter groups: weight decay on matrices only
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    tx = optax.chain(optax.clip_by_global_norm(grad_clip), optax.inject_hyperparams(
        optax.adamw)(learning_rate, b1=0.9, b2=0.95, weight_decay=weight_decay, mask=decay))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    @jax.jit(donate_argnums=0)
    def train_step(state, xs, ys, lr):
        model, optimizer = nnx.merge(graphdef, state)
        mgraph, params, rest = nnx.split(model, nnx.Param, ...)

        def micro(grads, xy):
            def loss_fn(params):
                logits = nnx.merge(mgraph, params, rest)(xy[0])
                return optax.softmax_cross_entropy_with_integer_labels(logits, xy[1]).mean()

            loss, g = jax.value_and_grad(loss_fn)(params)
            return jax.tree.map(jnp.add, grads, g), loss

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, losses = jax.lax.scan(micro, zeros, (xs, ys))
        grads = jax.tree.map(lambda g: g / gradient_accumulation_steps, grads)
        optimizer.opt_state[1].hyperparams["learning_rate"].value = lr
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), losses.mean()

    t0 = time.perf_counter()
    for iter_num in range(max_iters):
        if iter_num == warmup:
            t0 = time.perf_counter()
        lr = get_lr(iter_num)
        xs, ys = get_batches(gradient_accumulation_steps)
        state, loss = train_step(state, xs, ys, lr)
        if iter_num % log_interval == 0 or iter_num == max_iters - 1:
            print(f"iter {iter_num} loss {loss.item():.4f} lr {lr:.2e}")
    print(f"ms_per_iter={(time.perf_counter() - t0) * 1000 / (max_iters - warmup):.3f}")


@nnx.jit(static_argnums=(2,))
def generate(model, key, steps):
    buf = jnp.zeros((1, block_size), jnp.int32)  # the start token 0 at position 0

    def decode(i, carry):
        buf, t, key, out = carry
        logits = model(buf)
        logits = jax.lax.dynamic_index_in_dim(logits, t - 1, axis=1, keepdims=False)
        logits = logits / temperature
        v, _ = jax.lax.top_k(logits, top_k)
        logits = jnp.where(logits < v[:, -1:], -jnp.inf, logits)
        key, sub = jax.random.split(key)
        tok = jax.random.categorical(sub, logits, axis=-1).astype(jnp.int32)
        placed = jax.lax.dynamic_update_slice(buf, tok[:, None], (0, jnp.minimum(t, block_size - 1)))
        shifted = jnp.concatenate([buf[:, 1:], tok[:, None]], axis=1)
        buf = jnp.where(t < block_size, placed, shifted)
        return buf, jnp.minimum(t + 1, block_size), key, out.at[:, i].set(tok)

    out = jnp.zeros((1, steps), jnp.int32)
    return jax.lax.fori_loop(0, steps, decode, (buf, jnp.int32(1), key, out))[3]


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


if mode == "train":
    train()
else:
    sample()
