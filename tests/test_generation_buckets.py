"""The compiled generate() on a growing context (issue 30, passes/generation.py): while the
context is shorter than block_size, the model runs on the smallest window of 8, 16, 32, ...
positions that holds it (one fori_loop per window, all in the one compiled function), then on
the full window. The tokens are those of torch's loop (greedy) and of the full-window route
(sampled, the same key), for any number of new tokens: past the block, a prompt longer than
the first window or than the block. (Fewer tokens than the block make the full window the
final length, so no window loop stops early.) These models' attention allows a key/value cache
(passes/kv_cache_decode.py, tests/test_generation_kv_cache*.py), which would replace the
windows: they are converted with it off."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from launch import compiled_while
from test_generation import CAUSAL_MASK, LAST_POSITION, SCRIPT, TOP_K_PARAM, _load

import torch2jax.convert as convert_module
from torch2jax.convert import convert_source
from torch2jax.passes import generation
from torch2jax.weights import transfer_state_dict

BLOCK = ("block_size = 8\n", "block_size = 32\n")
# (prompt length, new tokens): through the windows 8 and 16, the full window and past the
# block (it slides); a prompt longer than the first window (skipped), then the window 16
CASES = [(3, 40), (12, 30)]


@contextmanager
def _no_cache():
    """Conversions without the key/value cache (the window route)."""
    real = generation.cache_decoding
    generation.cache_decoding = lambda module, source, taken: module
    try:
        yield
    finally:
        generation.cache_decoding = real


def _full_window_code(source: str) -> str:
    """The conversion with the window loops off: the model on the full window from the
    first token (the route before them)."""
    real = convert_module.compile_generation

    def without_windows(*args, imports=None, **kwargs):
        return real(*args, **kwargs)

    convert_module.compile_generation = without_windows
    try:
        with _no_cache():
            return convert_source(source, path="sample.py").code
    finally:
        convert_module.compile_generation = real


def _models(tmp_path, source: str, codes: dict[str, str]):
    from flax import nnx

    tmod = _load(tmp_path, "buckets_torch", source)
    torch.manual_seed(1)
    tm = tmod.GPT().eval()
    out = {"torch": (tmod, tm)}
    for name, code in codes.items():
        jmod = _load(tmp_path, f"buckets_{name}", code)
        jm = jmod.GPT(rngs=nnx.Rngs(0))
        jm.eval()
        transfer_state_dict(tm, jm)
        out[name] = (jmod, jm)
    return out


def _greedy_twice(jmod, jm, prompt, n):
    return [np.asarray(jmod.generate(jm, jnp.asarray(prompt, jnp.int32), n, temperature=1e-6,
                                     top_k=4, key=jax.random.key(i))) for i in range(2)]


@pytest.fixture(scope="module")
def top_k_source():
    source = SCRIPT.replace("MASK", CAUSAL_MASK).replace(*TOP_K_PARAM)
    assert BLOCK[0] in source
    return source.replace(*BLOCK)


@pytest.fixture(scope="module")
def converted(top_k_source):
    with _no_cache():
        return convert_source(top_k_source, path="sample.py")


def test_window_loops_are_written(converted):
    result = converted
    body = result.code.split("def generate(", 1)[1]
    assert "def decode_step(t, carry, window):" in body
    assert "jax.lax.fori_loop(lo, hi, partial(decode_step, window=window), state)" in body
    assert "partial(decode_step, window=width), state)" in body
    assert "from functools import partial\n" in result.code
    assert "TODO" not in result.code
    assert [d.severity for d in result.diagnostics if d.rule == "generation"] == ["info"]


def test_a_partial_of_the_torch_file_keeps_the_full_window(top_k_source):
    """``partial`` bound by the torch file to something else: no window loops (they call
    functools' partial), the full-window route as before."""
    source = top_k_source.replace("import torch.nn as nn\n",
                                  "import torch.nn as nn\nfrom operator import mul as partial\n")
    body = convert_source(source, path="sample.py").code.split("def generate(", 1)[1]
    assert "jax.lax.fori_loop(t0, t0 + max_new_tokens, decode_step, (idx, key))" in body
    assert "partial(decode_step" not in body


@pytest.mark.slow
def test_tokens_match_torch_and_the_full_window_route(top_k_source, converted, tmp_path):
    """Greedy (a tiny temperature, top-k 4): the tokens of torch's loop for each of CASES,
    two calls of the same shapes compiling generate() once. Sampled (temperature 1, top-k 4,
    the same key): the tokens of the full-window route."""
    code = converted.code
    models = _models(tmp_path, top_k_source, {"windows": code,
                                              "full": _full_window_code(top_k_source)})
    rng = np.random.default_rng(0)
    for t0, n in CASES:
        prompt = rng.integers(0, 16, (2, t0))
        tmod, tm = models["torch"]
        want = tmod.generate(tm, torch.tensor(prompt), n, temperature=1e-6, top_k=4).numpy()
        got, compiles = compiled_while(partial(_greedy_twice, *models["windows"], prompt, n))
        assert all(g.shape == (2, t0 + n) and (g == want).all() for g in got), (t0, n, got, want)
        assert len([c for c in compiles if "generate" in c]) == 1, compiles
    prompt = jnp.asarray(rng.integers(0, 16, (2, 3)), jnp.int32)
    sampled = {name: np.asarray(models[name][0].generate(
        models[name][1], prompt, 40, top_k=4, key=jax.random.key(7)))
        for name in ("windows", "full")}
    assert (sampled["windows"] == sampled["full"]).all(), sampled


@pytest.mark.slow
def test_forward_computing_the_last_position(tmp_path):
    """nanoGPT's forward computing only the last position at inference: the window loops
    give it the position to compute in each window; greedy tokens as torch's, from a prompt
    longer than the block (no window loop runs) and through every window."""
    source = (SCRIPT.replace("MASK", CAUSAL_MASK).replace(*LAST_POSITION)
              .replace(*TOP_K_PARAM).replace(*BLOCK))
    with _no_cache():
        code = convert_source(source, path="sample.py").code
    body = code.split("def generate(", 1)[1]
    assert "partial(decode_step, window=window)" in body
    assert "logits, _ = model(idx_cond, last_position=t - 1 - start)" in body
    models = _models(tmp_path, source, {"windows": code})
    rng = np.random.default_rng(1)
    for t0, n in [(40, 3), (1, 34)]:
        prompt = rng.integers(0, 16, (1, t0))
        tmod, tm = models["torch"]
        want = tmod.generate(tm, torch.tensor(prompt), n, temperature=1e-6).numpy()
        jmod, jm = models["windows"]
        got = np.asarray(jmod.generate(jm, jnp.asarray(prompt, jnp.int32), n,
                                       temperature=1e-6, key=jax.random.key(0)))
        assert (got == want).all(), (t0, n, got, want)
