"""mingpt_trainer.py written by hand in idiomatic JAX (flax NNX, optax): the twin the
converted program is measured against. The Dataset stays on the host: ``__getitem__`` draws
with a numpy Generator and returns numpy arrays, a batch is collated with np.stack and moved
to the device once by the step call; the Trainer's step is one jax.jit over the split,
donated state (clip, AdamW, the loss ignoring the targets -1).
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

length = 6
num_digits = 3
vocab_size = num_digits
block_size = length * 2 - 1
n_layer = 2
n_head = 4
n_embd = 64
max_iters = int(os.environ.get("GPT_MAX_ITERS", "120"))
warmup = 10
seed = 1337
batch_size = 64


class SortDataset:
    def __init__(self, length=6, num_digits=3, seed=0):
        self.length = length
        self.num_digits = num_digits
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return 10000

    def __getitem__(self, idx):
        inp = self.rng.integers(0, self.num_digits, self.length)
        cat = np.concatenate([inp, np.sort(inp)]).astype(np.int32)
        x, y = cat[:-1].copy(), cat[1:].copy()
        y[:self.length - 1] = -1
        return x, y


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




class Trainer:
    def __init__(self, model, train_dataset, max_iters):
        self.model = model
        self.train_dataset = train_dataset
        self.max_iters = max_iters
        self.rng = np.random.default_rng(seed)

    def batches(self):
        while True:
            ix = self.rng.integers(0, len(self.train_dataset), batch_size)
            xs, ys = zip(*(self.train_dataset[i] for i in ix))
            yield np.stack(xs), np.stack(ys)

    def run(self):
        tx = optax.chain(optax.clip_by_global_norm(1.0),
                         optax.adamw(5e-4, b1=0.9, b2=0.95, weight_decay=0.1))
        optimizer = nnx.Optimizer(self.model, tx, wrt=nnx.Param)
        graphdef, state = nnx.split((self.model, optimizer))

        @jax.jit(donate_argnums=0)
        def train_step(state, x, y):
            model, optimizer = nnx.merge(graphdef, state)

            def loss_fn(model):
                logits = model(x)
                valid = y != -1
                losses = optax.softmax_cross_entropy_with_integer_labels(
                    logits, jnp.where(valid, y, 0))
                return jnp.sum(losses * valid) / jnp.maximum(valid.sum(), 1)

            loss, grads = nnx.value_and_grad(loss_fn)(model)
            optimizer.update(model, grads)
            return nnx.state((model, optimizer)), loss

        t0 = time.perf_counter()
        for it, (x, y) in zip(range(self.max_iters), self.batches()):
            state, loss = train_step(state, x, y)
            if it == warmup:
                t0 = time.perf_counter()
            if (it + 1) % 20 == 0:
                print(f"iter {it + 1} loss {loss.item():.4f}")
        nnx.update((self.model, optimizer), state)
        return (time.perf_counter() - t0) * 1000 / (self.max_iters - warmup - 1)


model = GPT(nnx.Rngs(seed))
ms = Trainer(model, SortDataset(length, num_digits), max_iters).run()
print(f"ms_per_iter={ms:.3f}")
