"""char_rnn_sample.py written by hand in idiomatic JAX (flax NNX): the twin the converted
sampling program is measured against. The whole sampling is one jax.jit: a jax.lax.scan over
the tokens carrying the character, the hidden state of each layer and the key, a GRU cell per
layer and jax.random.categorical."""

import os
import time

import jax
import jax.numpy as jnp
from flax import nnx

vocab_size = 65
n_embd = 64
hidden_size = 128
num_layers = 1
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100")) * 2
temperature = 0.8
seed = 1337


class CharRNN(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(vocab_size, n_embd, rngs=rngs)
        self.cells = nnx.List([nnx.GRUCell(n_embd if i == 0 else hidden_size, hidden_size,
                                           rngs=rngs) for i in range(num_layers)])
        self.head = nnx.Linear(hidden_size, vocab_size, rngs=rngs)

    def step(self, x, h):  # one character (batch,), the states (layers, batch, hidden)
        y = self.embed(x)
        new = []
        for cell, hl in zip(self.cells, h):
            hl, y = cell(hl, y)
            new.append(hl)
        return self.head(y), jnp.stack(new)


@nnx.jit(static_argnums=(2,))
def sample(model, key, n):
    def body(carry, _):
        x, h, key = carry
        logits, h = model.step(x, h)
        key, sub = jax.random.split(key)
        x = jax.random.categorical(sub, logits / temperature, axis=-1)
        return (x, h, key), x

    h = jnp.zeros((num_layers, 1, hidden_size))
    _, chars = jax.lax.scan(body, (jnp.zeros((1,), jnp.int32), h, key), length=n)
    return chars.T


model = CharRNN(nnx.Rngs(seed))
key = jax.random.key(seed)
sample(model, key, max_new_tokens).block_until_ready()  # compile (the same shapes)
t0 = time.perf_counter()
out = sample(model, jax.random.fold_in(key, 1), max_new_tokens)
tokens = out[0].tolist()
elapsed = time.perf_counter() - t0
print("sample", " ".join(str(t) for t in tokens[:20]))
print(f"tokens_per_s={max_new_tokens / elapsed:.1f}")
