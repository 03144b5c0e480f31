"""Compiled generation loops (issue 20, passes/generation.py): a nanoGPT-shaped generate()
becomes one nnx.jit over a fixed-size buffer when the model is causal; any other token loop
calls the jitted forward (one compile per distinct length)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from launch import compiled_while

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
    got, compiles = compiled_while(lambda: [
        np.asarray(jmod.generate(jm, jnp.asarray(prompt, jnp.int32), 14, temperature=1e-6,
                                 key=jax.random.key(i))) for i in range(2)])
    assert all((g == want).all() for g in got), (got, want)
    compiles = [c for c in compiles if "generate" in c]
    assert len(compiles) == 1, compiles


def _greedy(tmp_path, source, code, call, model="GPT", prompt=((1, 2, 3), (4, 5, 6))):
    """Tokens of ``call(module, model, prompt)`` in torch and in the converted code (after a
    weight transfer), and the converted run's compile log."""
    tmod = _load(tmp_path, "gen_torch", source)
    jmod = _load(tmp_path, "gen_nnx", code)
    from flax import nnx

    torch.manual_seed(1)
    tm = getattr(tmod, model)().eval()
    jm = getattr(jmod, model)(rngs=nnx.Rngs(0))
    jm.eval()
    transfer_state_dict(tm, jm)
    want = np.asarray(call(tmod, tm, torch.tensor(prompt)))
    got, compiles = compiled_while(lambda: np.asarray(call(jmod, jm, jnp.asarray(prompt, jnp.int32))))
    assert got.shape == want.shape, (got.shape, want.shape)
    return want, got, compiles


# a tiny temperature makes sampling greedy (the converted draw is the argmax of the same
# logits); 14 new tokens from a prompt of 3 slide the window of 8
def _generate14(mod, model, prompt):
    return mod.generate(model, prompt, 14, temperature=1e-6, **_key(mod.generate))


def _key(fn) -> dict:
    """The converted function's key argument, where it takes one (the torch one does not)."""
    return {"key": jax.random.key(0)} if "key" in inspect.signature(fn).parameters else {}


LAST_POSITION = ("return self.lm_head(x), None",
                 ("if targets is None:\n"
                  "            return self.lm_head(x[:, [-1], :]), None\n"
                  "        return self.lm_head(x), None"))


# nanoGPT's top_k: a parameter defaulting to None, read in the token step
TOP_K_PARAM = ("""def generate(model, idx, max_new_tokens, temperature=1.0):
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
""", """def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")
""")


def test_exact_route_jits_the_forward_once_per_length(tmp_path):
    """A model not known causal: a padded buffer is not exact, so each token's forward is the
    jitted generate_step (the model call and the draw, one nnx.jit), one compile per distinct
    length; noted as info, no TODO, tokens as torch's. generate() also takes ``top_k=None``
    (a static argument of the step, listed before the key: passed by keyword after the
    others, where the converter once wrote an invalid call)."""
    source = SCRIPT.replace("MASK", "").replace(*TOP_K_PARAM)
    call = "idx_next, key = generate_step(idx_cond, model, temperature, key, top_k=top_k)"
    result = convert_source(source, path="sample.py")
    body = result.code.split("def generate(", 1)[1]
    assert "TODO" not in result.code and "fori_loop" not in body
    assert call in body
    assert "eval_step(" not in body
    assert [d.severity for d in result.diagnostics if d.rule == "generation"] == ["info"]
    want, got, compiles = _greedy(tmp_path, source, result.code, _generate14)
    assert (got == want).all(), (got, want)
    forwards = [c for c in compiles if "generate_step" in c]
    assert len(forwards) == 8 - 3 + 1, forwards  # lengths 3..8, then the window slides


def test_free_function_generate_reading_the_last_position(tmp_path):
    """nanoGPT's generate() written as a function ``generate(model, idx, n, temperature,
    top_k)``, the forward computing only the last position at inference (issue 30): one
    nnx.jit over a fixed buffer, the model's forward given the position to compute, as for
    the method; two calls of the same shapes compile once (no per-length compile), tokens as
    torch's greedy ones (top-k 4)."""
    source = SCRIPT.replace("MASK", CAUSAL_MASK).replace(*LAST_POSITION).replace(*TOP_K_PARAM)
    result = convert_source(source, path="sample.py")
    body = result.code.split("def generate(", 1)[1]
    assert "jax.lax.fori_loop(" in body and "generate_step" not in result.code
    assert "logits, _ = model(idx_cond, last_position=t - 1 - start)" in body
    # (and a key/value cache while the context fits: passes/kv_cache_decode.py)
    assert ("def __call__(self, idx, targets=None, *, last_position=None, start_position=0):"
            in result.code and "cached_step" in body)
    assert "TODO" not in result.code

    def run(mod, model, prompt):
        return [mod.generate(model, prompt, 14, temperature=1e-6, top_k=4,
                             **_key(mod.generate)) for _ in range(2)]

    want, got, compiles = _greedy(tmp_path, source, result.code, run)
    assert (got == want).all(), (got, want)
    assert len([c for c in compiles if "generate" in c]) == 1, compiles


WHILE_LOOP = ("    for _ in range(max_new_tokens):\n",
              "    while idx.size(1) < max_new_tokens + 3:\n")
ARGMAX = (("        probs = F.softmax(logits, dim=-1)\n        idx_next = torch.multinomial("
           "probs, num_samples=1)\n"),
          "        idx_next = torch.argmax(logits, dim=-1, keepdim=True)\n")
TOPK = ("        probs = F.softmax(",
        ("        v, _ = torch.topk(logits, min(4, logits.size(-1)))\n"
         "        logits[logits < v[:, [-1]]] = -float(\"Inf\")\n"
         "        probs = F.softmax("))


@pytest.mark.slow
@pytest.mark.parametrize("rewrites", [[WHILE_LOOP], [ARGMAX], [TOPK], [WHILE_LOOP, ARGMAX]],
                         ids=["while", "argmax", "topk", "while+argmax"])
def test_causal_loop_shapes_compile_once(rewrites, tmp_path):
    """The loop by meaning: ``while idx.size(1) < n``, greedy argmax (no key), top-k by
    torch.topk: one compiled generate(), tokens equal to torch's."""
    source = SCRIPT.replace("MASK", CAUSAL_MASK)
    for old, new in rewrites:
        assert old in source
        source = source.replace(old, new)
    result = convert_source(source, path="sample.py")
    assert "jax.lax.fori_loop(" in result.code and "TODO" not in result.code
    want, got, compiles = _greedy(tmp_path, source, result.code, _generate14)
    assert (got == want).all(), (got, want)
    assert len([c for c in compiles if "generate" in c]) == 1, compiles
    assert not [c for c in compiles if "eval_step" in c]


@pytest.mark.slow
@pytest.mark.parametrize("read", ["x[:, [-1], :]", "x[:, -1:, :]", "x[:, -1:]"])
def test_nanogpt_method_reading_the_last_position(read, tmp_path):
    """nanoGPT's own shape: ``model.generate`` a method calling ``self(idx_cond)``, the
    forward computing only the last position (``x[:, [-1], :]`` or a slice) when targets is
    None, the model causal. generate() is one nnx.jit over a fixed buffer (issue 30): the
    forward is given the position to compute, so the padded window is read at the true last
    token; one compile for the whole loop, tokens as torch's."""
    source = SCRIPT.replace("MASK", CAUSAL_MASK).replace(*LAST_POSITION)
    source = source.replace("x[:, [-1], :]", read)
    start = source.index("@torch.no_grad()\ndef generate(model,")
    end = source.index("if __name__", start)
    method = "\n".join("    " + ln if ln.strip() else ln
                       for ln in source[start:end].rstrip().split("\n"))
    method = method.replace("def generate(model,", "def generate(self,").replace(
        "model(idx_cond)", "self(idx_cond)")
    source = source[:start] + source[end:]
    source = source.replace("        return self.lm_head(x), None\n",
                            "        return self.lm_head(x), None\n\n" + method + "\n", 1)
    source = source.replace("out = generate(model, ", "out = model.generate(")
    result = convert_source(source, path="sample.py")
    code = result.code.split("    def generate", 1)[1].split("\ndef ", 1)[0]
    assert "jax.lax.fori_loop(" in code and "TODO" not in result.code
    assert "generate_step" not in result.code

    def run(mod, model, prompt):
        return model.generate(prompt, 14, temperature=1e-6)

    want, got, compiles = _greedy(tmp_path, source, result.code, run)
    assert (got == want).all(), (got, want)
    assert len([c for c in compiles if "generate" in c]) == 1, compiles


RNN = '''import torch
import torch.nn as nn
from torch.nn import functional as F

vocab_size = 12
hidden = 16
torch.manual_seed(0)


class CharRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, x, h):
        out, h = self.rnn(self.embed(x), h)
        return self.head(out), h


@torch.no_grad()
def sample(net, start, n, temperature=1.0):
    x = start
    h = torch.zeros(1, start.size(0), hidden)
    out = [start]
    for i in range(n):
        logits, h = net(x, h)
        probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)
        x = torch.multinomial(probs, num_samples=1)
        out.append(x)
    return torch.cat(out, dim=1)


if __name__ == "__main__":
    model = CharRNN()
    model.eval()
    print("shape", tuple(sample(model, torch.zeros((2, 1), dtype=torch.long), 10).shape))
'''


LSTM = (("        self.rnn = nn.GRU(hidden, hidden, batch_first=True)\n",
         "        self.rnn = nn.LSTM(hidden, hidden, batch_first=True)\n"),
        ("    h = torch.zeros(1, start.size(0), hidden)\n",
         "    h = (torch.zeros(1, start.size(0), hidden), torch.zeros(1, start.size(0), hidden))\n"))
TOKEN_LOOP_VARIANTS = {
    "gru": [],
    "lstm": list(LSTM),  # a tuple state carried
    # the list starts empty, the loop counts with a name it does not read
    "empty list": [("    out = [start]\n", "    out = []\n"),
                   ("    for i in range(n):\n", "    for _step in range(n):\n")],
    # greedy decoding by argmax: no key to carry
    "argmax": [(("        probs = F.softmax(logits[:, -1, :] / temperature, dim=-1)\n"
                 "        x = torch.multinomial(probs, num_samples=1)\n"),
                ("        x = torch.argmax(logits[:, -1, :] / temperature, dim=-1, "
                 "keepdim=True)\n"))],
}


def _rnn_variant(name):
    source = RNN
    for old, new in TOKEN_LOOP_VARIANTS[name]:
        assert old in source, old
        source = source.replace(old, new)
    return source


def _sample10(mod, model, prompt):
    return mod.sample(model, prompt, 10, temperature=1e-6, **_key(mod.sample))


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(TOKEN_LOOP_VARIANTS))
def test_char_rnn_sampled_one_token_at_a_time(variant, tmp_path):
    """A char-level RNN sampled one token at a time with a carried hidden state (issue 30):
    sample() is one nnx.jit whose token loop is a jax.lax.scan (no per-token call from
    Python), compiled once for two calls; tokens as torch's under greedy sampling."""
    source = _rnn_variant(variant)
    result = convert_source(source, path="rnn.py")
    assert "TODO" not in result.code, result.code
    fn = result.code.split("def sample(", 1)[1].split("\nif __name__", 1)[0]
    assert "jax.lax.scan(sample_token" in fn and "sample_step" not in result.code
    assert "eval_step(" not in fn
    notes = [d.message for d in result.diagnostics if d.rule == "generation"]
    assert len(notes) == 1 and "jax.lax.scan" in notes[0], notes

    def run(mod, model, prompt):  # two calls, with different keys where there is one
        out = _sample10(mod, model, prompt)
        if "key" in inspect.signature(mod.sample).parameters:
            out2 = mod.sample(model, prompt, 10, temperature=1e-6, key=jax.random.key(7))
            np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))  # greedy
        return out

    model = "CharRNN"
    want, got, compiles = _greedy(tmp_path, source, result.code, run, model=model,
                                  prompt=((1,), (5,)))
    assert (got == want).all(), (got, want)
    assert len([c for c in compiles if "jit(sample)" in c]) == 1, compiles
    assert not [c for c in compiles if "eval_step" in c or "sample_step" in c], compiles


@pytest.mark.slow
def test_char_rnn_sample_method_is_one_scan(tmp_path):
    """The sampler a method of the model (``model.sample(start, n)``, drawing from the
    module's nnx.Rngs once converted): the method is one nnx.jit with a jax.lax.scan, the
    model's state (its Rngs' count) carried out, so a second call draws on; greedy tokens
    as torch's, one compile for two calls."""
    start = RNN.index("@torch.no_grad()\ndef sample(")
    end = RNN.index("if __name__", start)
    method = "\n".join("    " + ln if ln.strip() else ln
                       for ln in RNN[start:end].rstrip().split("\n"))
    method = method.replace("def sample(net, ", "def sample(self, ").replace(
        "net(x, h)", "self(x, h)")
    source = RNN[:start] + RNN[end:]
    source = source.replace("        return self.head(out), h\n",
                            "        return self.head(out), h\n\n" + method + "\n", 1)
    source = source.replace("print(\"shape\", tuple(sample(model, ",
                            "print(\"shape\", tuple(model.sample(")
    result = convert_source(source, path="rnn.py")
    assert "TODO" not in result.code, result.code
    body = result.code.split("    def sample(self", 1)[1]
    assert "jax.lax.scan(sample_token" in body and "self.rngs()" in body
    assert "sample_step" not in result.code

    def run(mod, model, prompt):
        return model.sample(prompt, 10, temperature=1e-6)

    want, got, compiles = _greedy(tmp_path, source, result.code, run, model="CharRNN",
                                  prompt=((1,), (5,)))
    assert (got == want).all(), (got, want)
    assert len([c for c in compiles if "jit(sample)" in c]) == 1, compiles
    jmod = _load(tmp_path, "method_again", result.code)
    from flax import nnx

    jm = jmod.CharRNN(rngs=nnx.Rngs(0))
    jm.eval()
    prompt = jnp.zeros((2, 1), jnp.int32)
    first, second = (np.asarray(jm.sample(prompt, 12)) for _ in range(2))
    assert first.shape == (2, 13) and not (first == second).all()  # the draws go on


@pytest.mark.slow
def test_char_rnn_scan_draws_from_torchs_distribution(tmp_path):
    """Sampling, not only greedy decoding: 4000 rows from one start token, the first drawn
    token's frequencies against the probabilities torch's model gives (the same weights),
    within 5 standard errors per token; torch's own multinomial passes the same check."""
    result = convert_source(RNN, path="rnn.py")
    tmod = _load(tmp_path, "dist_torch", RNN)
    jmod = _load(tmp_path, "dist_nnx", result.code)
    from flax import nnx

    torch.manual_seed(3)
    tm = tmod.CharRNN().eval()
    jm = jmod.CharRNN(rngs=nnx.Rngs(0))
    jm.eval()
    transfer_state_dict(tm, jm)
    rows = 4000
    start = np.full((rows, 1), 4)
    with torch.no_grad():
        logits, _ = tm(torch.tensor(start[:1]), torch.zeros(1, 1, tmod.hidden))
        p = torch.softmax(logits[0, -1] / 0.7, dim=-1).numpy()
    got = np.asarray(jmod.sample(jm, jnp.asarray(start, jnp.int32), 3, temperature=0.7,
                                 key=jax.random.key(11)))
    want = tmod.sample(tm, torch.tensor(start), 3, temperature=0.7).numpy()
    bound = 5 * np.sqrt(p * (1 - p) / rows) + 1e-3
    for tokens in (got, want):
        freq = np.bincount(tokens[:, 1], minlength=len(p)) / rows
        assert (np.abs(freq - p) < bound).all(), (freq, p)
    assert (got[:, 0] == 4).all() and got.shape == want.shape


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


def test_an_evaluation_loop_taking_an_argmax_is_no_token_loop(tmp_path):
    """An accuracy loop draws nothing back into the model: it keeps the file's eval step for
    the model call, gets no token step and no generation note, and computes torch's count."""
    source = '''import torch
import torch.nn as nn

torch.manual_seed(0)


@torch.no_grad()
def evaluate(model, xs, ys):
    correct = 0
    for i in range(xs.size(0)):
        logits = model(xs[i])
        pred = torch.argmax(logits, dim=-1)
        correct += int((pred == ys[i]).sum())
    return correct


if __name__ == "__main__":
    model = nn.Linear(4, 3)
    print("correct", evaluate(model, torch.randn(5, 2, 4), torch.randint(0, 3, (5, 2))))
'''
    result = convert_source(source, path="acc.py")
    assert not [d for d in result.diagnostics if d.rule == "generation"]
    assert "evaluate_step" not in result.code
    tmod = _load(tmp_path, "acc_torch", source)
    jmod = _load(tmp_path, "acc_nnx", result.code)
    from flax import nnx

    tm = torch.nn.Linear(4, 3)
    jm = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    transfer_state_dict(tm, jm)
    xs, ys = np.random.default_rng(0).normal(size=(5, 2, 4)), np.array([[0, 1]] * 5)
    want = tmod.evaluate(tm, torch.tensor(xs, dtype=torch.float32), torch.tensor(ys))
    assert jmod.evaluate(jm, jnp.asarray(xs, jnp.float32), jnp.asarray(ys)) == want


def test_tied_weights_keep_the_loop_eager_with_a_warning(tmp_path):
    """Modules sharing a Variable (the head tied to the embedding) put flax in graph mode,
    where a jitted token step compiled again for the same shapes on nanoGPT's model: the
    loop stays as written, with a warning, and still samples."""
    source = SCRIPT.replace("MASK", "").replace(
        "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n",
        "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
        "        self.wte.weight = self.lm_head.weight\n")
    result = convert_source(source, path="sample.py")
    assert "generate_step" not in result.code and "fori_loop" not in result.code
    assert [d.severity for d in result.diagnostics if d.rule == "generation"] == ["warning"]
    path = tmp_path / "sample_jax.py"
    path.write_text(result.code)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    assert out.split("\n")[:2] == ["shape (2, 15)", "in_vocab True"]
