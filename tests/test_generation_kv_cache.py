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
from kv_sources import with_generate_method
from launch import compiled_while
from test_generation import _load

from torch2jax.convert import convert_source
from torch2jax.passes import generation
from torch2jax.weights import transfer_state_dict

SOURCE = with_generate_method()

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
