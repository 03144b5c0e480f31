"""The compiled generate() decoding with a key/value cache (issue 30, passes/kv_cache_decode.py).

nanoGPT's generate() method over a model whose attention analysis/kv_cache.py proves cacheable:
the prompt runs once, each token then runs the model on the last token alone while the context
fits in the block, and the window slides after. Greedy tokens are torch's (through the cache,
past the block, a run shorter than the block, a prompt longer than it), two calls of the same
shapes compile once, and sampled tokens are the window route's for the same key.
tests/test_generation.py's nanoGPT method tests take this route too (three spellings of the
last-position read, greedy tokens against torch's)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from launch import compiled_while
from test_generation import _load

from torch2jax.convert import convert_source
from torch2jax.passes import generation
from torch2jax.weights import transfer_state_dict

SOURCE = '''import math

import torch
import torch.nn as nn
from torch.nn import functional as F

block_size, vocab_size, n_layer, n_head, n_embd = 8, 16, 2, 2, 16


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
'''

# (prompt length, new tokens): the prompt cached, one position per token to the block, then
# the window slides; fewer tokens than the block. (A prompt longer than the block takes the
# window route: tests/test_generation_buckets.py.)
CASES = [(3, 12), (1, 4)]


@pytest.fixture(scope="module")
def converted():
    return convert_source(SOURCE, path="gpt.py")


@pytest.fixture(scope="module")
def window_route():
    real = generation.cache_decoding
    generation.cache_decoding = lambda module, source, taken: module
    try:
        return convert_source(SOURCE, path="gpt.py").code
    finally:
        generation.cache_decoding = real


def test_the_cached_route_is_written(converted, window_route):
    code = converted.code
    assert "_, state = nnx.fori_loop(t0 + 1, lo, cached_step, (self, state))" in code
    assert "k = jax.lax.dynamic_update_slice_in_dim(self.cached_key[...], k, index, axis=-2)" \
        in code
    assert "pos = start_position + jnp.arange(" in code
    assert "TODO" not in code and "torch2jax" not in code.split("\n", 3)[-1]
    assert "cached_key" not in window_route and "partial(decode_step, window=window)" \
        in window_route


def _models(tmp_path, codes):
    from flax import nnx

    tmod = _load(tmp_path, "kv_torch", SOURCE)
    torch.manual_seed(0)
    tm = tmod.GPT().eval()
    out = {"torch": tm}
    for name, code in codes.items():
        jm = _load(tmp_path, f"kv_{name}", code).GPT(rngs=nnx.Rngs(0))
        jm.eval()
        transfer_state_dict(tm, jm)
        out[name] = jm
    return out


@pytest.mark.slow
def test_tokens_match_torch_and_the_window_route(converted, window_route, tmp_path):
    """Greedy (a tiny temperature, top-k 3): torch's tokens for each of CASES; two calls of
    one shape compile generate() once. Sampled (temperature 1, top-k 3, the same draws): the
    window route's tokens (the cached generate() of the first case's shapes, not compiled again)."""
    models = _models(tmp_path, {"cached": converted.code, "windows": window_route})
    rng = np.random.default_rng(0)
    for t0, n in CASES:
        prompt = rng.integers(0, 16, (2, t0))
        want = models["torch"].generate(torch.tensor(prompt), n, temperature=1e-6,
                                        top_k=3).numpy()
        got, compiles = compiled_while(lambda p=prompt, n=n: [np.asarray(models["cached"].generate(
            jnp.asarray(p, jnp.int32), n, temperature=1e-6, top_k=3)) for _ in range(2)])
        assert all(g.shape == (2, t0 + n) and (g == want).all() for g in got), (t0, n, got, want)
        assert len([c for c in compiles if "generate" in c]) == 1, compiles
    prompt = jnp.asarray(rng.integers(0, 16, (2, 3)), jnp.int32)
    from flax import nnx

    sampled = {}
    for name in ("cached", "windows"):
        models[name].rngs = nnx.Rngs(7)  # the same draws on both routes
        sampled[name] = np.asarray(models[name].generate(prompt, 12, top_k=3))
    assert (sampled["cached"] == sampled["windows"]).all(), sampled


@pytest.mark.parametrize("old, new", [
    # proven, but the cache is written for the tril mask buffer only
    ("""        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
""", "        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"),
    # a local the cache's lines would bind
    ("B, T, C = x.size()\n", "B, T, C = x.size()\n        shape = (B, T, C)\n"),
    # a running sum over positions (causal, so the window route): not cacheable
    ("x = self.ln_f(x)", "x = self.ln_f(x).cumsum(dim=1)"),
])
def test_other_shapes_keep_the_window_route(old, new):
    assert old in SOURCE
    code = convert_source(SOURCE.replace(old, new), path="gpt.py").code
    assert "cached_key" not in code and "start_position" not in code
    assert "partial(decode_step, window=window)" in code
