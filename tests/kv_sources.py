"""The nanoGPT model the key/value-cache tests share (issue 30): tests/test_kv_cache_analysis.py
checks the proof on its variants, tests/test_generation_kv_cache.py converts it with a
compiled generate() and compares tokens with torch's.

``GPT`` is the model alone (its forward reads the last position when no targets are given);
``with_generate_method`` adds nanoGPT's generate() method; ``with_generate_function`` instead
makes the forward compute every position and adds a free function ``generate(model, ...)``
reading ``logits[:, -1, :]`` of them (benchmarks/programs/gpt_sample.py's shape)."""

from __future__ import annotations

GPT = '''import math

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
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.proj(F.gelu(self.fc(self.ln_2(x))))
        return x


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
'''

# the attention's core written with torch's fused causal attention instead
SDPA = ('''        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
''', '''        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
''')

# the tril buffer, which the fused attention does not need
BUFFER = ('''        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))
''', "")

# the body of nanoGPT's generate(), written for a method (``self``)
_LOOP = '''        for _ in range(max_new_tokens):
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

_LAST_POSITION = '''        x = self.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss
'''
_EVERY_POSITION = '''        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
'''


def with_generate_method(source: str = GPT) -> str:
    return source + ('''
    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
''' + _LOOP)


def with_generate_function(source: str = GPT) -> str:
    assert _LAST_POSITION in source
    loop = "\n".join(line[4:] for line in _LOOP.split("\n")).replace("self(", "model(")
    return source.replace(_LAST_POSITION, _EVERY_POSITION) + ('''

@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
''' + loop)
