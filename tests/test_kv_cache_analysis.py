"""analysis/kv_cache.py (issue 30): which decoders are proven to allow a key/value cache.

The proof is syntactic, so it is tested on variants of one program: the spellings of a causal
self-attention it must accept, and each way of mixing positions it must refuse (a refusal
keeps the window route, which is exact for any causal model)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from kv_sources import GPT, SDPA

from torch2jax.analysis.kv_cache import CacheableAttention, cacheable_attention

PROGRAMS = Path(__file__).resolve().parent.parent / "benchmarks" / "programs"


THREE = [('''        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
''', '''        self.query = nn.Linear(n_embd, n_embd)
        self.key = nn.Linear(n_embd, n_embd)
        self.value = nn.Linear(n_embd, n_embd)
'''), ('''        q, k, v = self.c_attn(x).split(n_embd, dim=2)
''', '''        q, k, v = self.query(x), self.key(x), self.value(x)
''')]


def _check(source: str) -> CacheableAttention | None:
    return cacheable_attention(cst.parse_module(source))


def _variant(*edits: tuple[str, str]) -> str:
    source = GPT
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


def test_the_benchmark_programs_are_proven():
    for name in ("nanogpt.py", "gpt_sample.py"):
        found = _check((PROGRAMS / name).read_text())
        assert found == CacheableAttention("CausalSelfAttention", ("c_attn",), "bias", "GPT",
                                           "wpe"), name


@pytest.mark.parametrize("edits, projections, mask", [
    ([], ("c_attn",), "bias"),
    ([SDPA], ("c_attn",), "is_causal"),
    (THREE, ("query", "key", "value"), "bias"),
    ([*THREE, SDPA], ("query", "key", "value"), "is_causal"),
    ([("pos = torch.arange(0, t, dtype=torch.long, device=idx.device)",
       "pos = torch.arange(t, device=idx.device)"),
      ("x[:, [-1], :]", "x[:, -1:]"),
      ("att = F.softmax(att, dim=-1)", "att = att.softmax(dim=-1)")], ("c_attn",), "bias"),
])
def test_causal_self_attention_spellings(edits, projections, mask):
    assert _check(_variant(*edits)) == CacheableAttention(
        "CausalSelfAttention", projections, mask, "GPT", "wpe")


REFUSED = {
    "sdpa without is_causal": [(SDPA[0], "        y = F.scaled_dot_product_attention(q, k, v)\n")],
    "sdpa with a mask as well": [(SDPA[0], ("        y = F.scaled_dot_product_attention("
                                            "q, k, v, attn_mask=None, is_causal=True)\n"))],
    "a mask that is not triangular": [("torch.tril(torch.ones(block_size, block_size))",
                                       "torch.ones(block_size, block_size)")],
    "softmax over the queries": [("F.softmax(att, dim=-1)", "F.softmax(att, dim=-2)")],
    "positions shifted": [("torch.arange(0, t, dtype=torch.long, device=idx.device)",
                           "torch.arange(1, t + 1, device=idx.device)")],
    "positions read twice": [("x = self.wte(idx) + self.wpe(pos)",
                              "x = self.wte(idx) + self.wpe(pos) + pos[:, None]")],
    "a running sum over positions": [("x = self.ln_f(x)", "x = self.ln_f(x).cumsum(dim=1)")],
    "a mean over positions": [("x = self.ln_f(x)", "x = self.ln_f(x - x.mean(dim=1, keepdim=True))")],
    "a convolution layer": [("self.ln_2 = nn.LayerNorm(n_embd)",
                             "self.ln_2 = nn.Conv1d(n_embd, n_embd, 3, padding=1)")],
    "a recurrent layer in a list": [("nn.ModuleList([Block() for _ in range(n_layer)])",
                                     "nn.ModuleList([nn.GRU(n_embd, n_embd) for _ in range(2)])")],
    "token mixing through a transpose": [(
        "x = x + self.proj(F.gelu(self.fc(self.ln_2(x))))",
        "x = x + self.proj(F.gelu(self.fc(self.ln_2(x).transpose(1, 2)))).transpose(1, 2)")],
    "positions flattened into features": [("x = self.ln_f(x)", "x = self.ln_f(x.view(b, -1))")],
    "a shifted slice": [("x = self.ln_f(x)", "x = self.ln_f(x[:, :-1])")],
    "an unknown method": [("x = self.ln_f(x)", "x = self.ln_f(x).flip(1)")],
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_mixing_positions_is_refused(name):
    assert _check(_variant(*REFUSED[name])) is None


def test_two_attentions_or_none_are_refused():
    no_attention = _variant(*THREE, SDPA, (
        "        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)\n",
        "        y = v\n"))
    assert _check(no_attention) is None
    second = GPT.replace("class Block(", GPT[GPT.index("class CausalSelfAttention("):
                                             GPT.index("class Block(")].replace(
        "CausalSelfAttention", "OtherAttention") + "class Block(")
    assert _check(second) is None
