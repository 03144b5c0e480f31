"""Compiled generation loops (issue 20, passes/generation.py): a nanoGPT-shaped generate()
becomes one nnx.jit over a fixed-size buffer when the model is causal, and stays eager and
marked when it is not."""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torch2jax.convert import convert_source
from torch2jax.weights import transfer_state_dict

SCRIPT = '''import math

import torch
import torch.nn as nn
from torch.nn import functional as F

block_size = 8
vocab_size = 16
n_embd = 16
n_head = 2
seed = 0
torch.manual_seed(seed)


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
        MASK
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.ln = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        x = x + self.attn(self.ln(x))
        return self.lm_head(x), None


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0):
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


if __name__ == "__main__":
    model = GPT()
    model.eval()
    out = generate(model, torch.zeros((2, 3), dtype=torch.long), 12, temperature=0.8)
    print("shape", tuple(out.shape))
    print("in_vocab", bool(((out >= 0) & (out < vocab_size)).all()))
'''
CAUSAL_MASK = 'att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))'


def _load(tmp_path, name: str, code: str):
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def causal():
    source = SCRIPT.replace("MASK", CAUSAL_MASK)
    return source, convert_source(source, path="sample.py")


def test_causal_loop_becomes_one_jit(causal):
    _, result = causal
    code = result.code
    assert '@nnx.jit(static_argnames=("max_new_tokens",))' in code
    assert "jax.lax.fori_loop(" in code and "jnp.concatenate" not in code
    assert "eval_step(model" not in code.split("def generate", 1)[1]
    assert [d.rule for d in result.diagnostics if d.rule == "generation"] == ["generation"]


def test_converted_script_runs(causal, tmp_path):
    _, result = causal
    path = tmp_path / "sample_jax.py"
    path.write_text(result.code)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[:2] == ["shape (2, 15)", "in_vocab True"]


@pytest.mark.slow
def test_greedy_tokens_match_torch_and_compile_once(causal, tmp_path):
    source, result = causal
    tmod = _load(tmp_path, "sample_torch", source)
    jmod = _load(tmp_path, "sample_nnx", result.code)
    from flax import nnx

    torch.manual_seed(1)
    tm = tmod.GPT().eval()
    jm = jmod.GPT(rngs=nnx.Rngs(0))
    transfer_state_dict(tm, jm)
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    # a tiny temperature makes sampling greedy; 14 new tokens slide the window of 8
    want = tmod.generate(tm, torch.tensor(prompt), 14, temperature=1e-6).numpy()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            got = [np.asarray(jmod.generate(jm, jnp.asarray(prompt, jnp.int32), 14,
                                            temperature=1e-6, key=jax.random.key(i)))
                   for i in range(2)]
    finally:
        logger.removeHandler(handler)
    assert all((g == want).all() for g in got), (got, want)
    compiles = [r for r in records if "generate" in r.getMessage()
                and "Compiling" in r.getMessage()]
    assert len(compiles) == 1, [r.getMessage() for r in compiles]


def test_non_causal_loop_stays_eager_and_marked(tmp_path):
    source = SCRIPT.replace("MASK", "")
    result = convert_source(source, path="sample.py")
    body = result.code.split("def generate", 1)[1]
    assert "TODO(torch2jax): not compiled" in body and "fori_loop" not in body
    assert any(d.rule == "generation" and d.severity == "warning" for d in result.diagnostics)
    path = tmp_path / "sample_jax.py"
    path.write_text(result.code)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[:2] == ["shape (2, 15)", "in_vocab True"]


def test_model_reading_only_the_last_position_stays_eager():
    # nanoGPT's forward computes the last position's logits only at inference: the logits at
    # the end of a padded window would be the padding's
    source = SCRIPT.replace("MASK", CAUSAL_MASK).replace(
        "return self.lm_head(x), None", "return self.lm_head(x[:, [-1], :]), None")
    result = convert_source(source, path="sample.py")
    assert "fori_loop" not in result.code and "jnp.concatenate" in result.code
    assert [d.severity for d in result.diagnostics if d.rule == "generation"] == ["warning"]


def test_generate_method_draws_one_key_and_runs(tmp_path):
    source = SCRIPT.replace("MASK", CAUSAL_MASK)
    start = source.index("@torch.no_grad()\ndef generate(model,")
    source = source[:start] + source[source.index("if __name__", start):]
    method = (
        "    @torch.no_grad()\n"
        "    def generate(self, idx, max_new_tokens, temperature=1.0):\n"
        "        for _ in range(max_new_tokens):\n"
        "            idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]\n"
        "            logits, _ = self(idx_cond)\n"
        "            logits = logits[:, -1, :] / temperature\n"
        "            probs = F.softmax(logits, dim=-1)\n"
        "            idx_next = torch.multinomial(probs, num_samples=1)\n"
        "            idx = torch.cat((idx, idx_next), dim=1)\n"
        "        return idx\n\n\n")
    source = source.replace("\n\nif __name__", "\n" + method + "if __name__").replace(
        "out = generate(model, ", "out = model.generate(")
    result = convert_source(source, path="sample.py")
    method_code = result.code.split("    def generate", 1)[1].split("\ndef ", 1)[0]
    assert "jax.lax.fori_loop(" in method_code and "self.rngs()" in method_code
    path = tmp_path / "sample_jax.py"
    path.write_text(result.code)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[:2] == ["shape (2, 15)", "in_vocab True"]


def test_a_discarded_compiled_call_is_waited_for():
    """A warm-up ``generate(...)`` whose result is dropped: torch's loop has finished when it
    returns, the compiled one runs asynchronously, so its work would be timed with whatever
    follows. The converted statement blocks on the result; a call whose value is kept does
    not."""
    source = SCRIPT.replace("MASK", CAUSAL_MASK).replace(
        '    out = generate(', '    generate(model, torch.zeros((2, 3), dtype=torch.long), 12)\n'
        '    out = generate(')
    code = convert_source(source, path="sample.py").code
    assert ("    jax.block_until_ready(generate(model, jnp.zeros((2, 3), dtype=jnp.int32), 12, "
            "key=subkey))\n") in code
    assert code.count("block_until_ready") == 1
