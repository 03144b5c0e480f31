"""The key/value cache of a compiled generate() for the other shapes of issue 30: a free
function ``generate(model, idx, ...)`` over a forward computing every position
(benchmarks/programs/gpt_sample.py's shape, read at ``logits[:, t - 1 - start]`` by the window
route and at the one position of a cached step), and ``F.scaled_dot_product_attention(q, k, v,
is_causal=True)`` without a mask buffer (the cache of generate()'s length, an explicit mask
while decoding).

The code of both; then, one model having all three (one compile per route, within CI's time):
greedy tokens (a tiny temperature, top-k 3) are torch's, from a prompt of 3 through the cache
and past the block; sampled tokens (the same key) are the window route's; two calls of one shape
compile generate() once. (The tril mask's cache is checked on tokens by
tests/test_generation_kv_cache.py, a free function reading the last position by
tests/test_generation.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from kv_sources import BUFFER, GPT, SDPA, with_generate_function
from launch import compiled_while
from test_generation import _load

from torch2jax.convert import convert_source
from torch2jax.passes import generation
from torch2jax.weights import transfer_state_dict

FUNCTION = with_generate_function()
FUSED = with_generate_function(GPT.replace(*SDPA).replace(*BUFFER))


def _window_route(source: str) -> str:
    real = generation.cache_decoding
    generation.cache_decoding = lambda module, source, taken: module
    try:
        return convert_source(source, path="gpt.py").code
    finally:
        generation.cache_decoding = real


@pytest.fixture(scope="module")
def fused():
    return {"cached": convert_source(FUSED, path="gpt.py").code, "windows": _window_route(FUSED)}


def test_the_cached_route_is_written_for_a_function():
    code = convert_source(FUNCTION, path="gpt.py").code
    assert "if t0 < width and isinstance(model, GPT):" in code
    assert "_, state = nnx.fori_loop(t0 + 1, lo, cached_step, (model, state))" in code
    # the cached step reads its one position; the window its position of t - 1
    assert "logits = logits[:, -1, :] / temperature" in code
    assert "logits = logits[:, t - 1 - start, :] / temperature" in code
    assert "TODO" not in code and "torch2jax" not in code.split("\n", 3)[-1]


def test_the_cached_route_is_written_for_fused_attention(fused):
    code = fused["cached"]
    assert "mask = jnp.arange(k.shape[-2]) <= index + jnp.arange(q.shape[-2])[:, None]" in code
    assert "is_causal=mask is None,\n" in code and "            layer.cache_size = width\n" in code
    assert "logits = logits[:, t - 1 - start, :] / temperature" in code
    assert "TODO" not in code and "torch2jax" not in code.split("\n", 3)[-1]
    assert "cached_key" not in fused["windows"]


@pytest.mark.slow
def test_tokens_match_torch_and_the_window_route(fused, tmp_path):
    from flax import nnx

    tmod = _load(tmp_path, "kvfused_torch", FUSED)
    torch.manual_seed(0)
    tm = tmod.GPT().eval()
    mods = {name: _load(tmp_path, f"kvfused_{name}", code) for name, code in fused.items()}
    models = {}
    for name, mod in mods.items():
        models[name] = mod.GPT(rngs=nnx.Rngs(0))
        models[name].eval()
        transfer_state_dict(tm, models[name])
    prompt = np.random.default_rng(0).integers(0, 16, (2, 3))
    p = jnp.asarray(prompt, jnp.int32)

    def generate(name, seed, **kw):
        return np.asarray(mods[name].generate(models[name], p, 12, top_k=3,
                                              key=jax.random.key(seed), **kw))

    want = tmod.generate(tm, torch.tensor(prompt), 12, temperature=1e-6, top_k=3).numpy()
    got, compiles = compiled_while(lambda: [generate("cached", i, temperature=1e-6)
                                            for i in range(2)])
    assert all(g.shape == (2, 15) and (g == want).all() for g in got), (got, want)
    assert len([c for c in compiles if "generate" in c]) == 1, compiles
    sampled = {name: generate(name, 7) for name in ("cached", "windows")}
    assert (sampled["cached"] == sampled["windows"]).all(), sampled
    assert not (sampled["cached"] == want).all()  # (the draws are not the greedy tokens)
