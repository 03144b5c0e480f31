"""A small GPT sampling program in the shape of nanoGPT's sample.py (issue 20's benchmark).

The model of gpt_train.py, built from the seed (no checkpoint), generates max_new_tokens
tokens one at a time with temperature and top-k, as nanoGPT's generate() does: the context is
cropped to block_size, the last position's logits sampled with torch.multinomial, the token
appended with torch.cat. It prints ``tokens_per_s=`` over the whole generation.
"""

import math
import os
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

batch_size = 1
block_size = 32
vocab_size = 48
n_layer = 2
n_head = 4
n_embd = 64
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100"))
temperature = 0.8
top_k = int(os.environ.get("GPT_TOP_K", "10")) or None  # 0: no top-k
seed = 1337
device = os.environ.get("GPT_DEVICE", "cpu")  # the benchmark sets cuda on a GPU

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
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
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
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None):
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= block_size else idx[:, -block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("Inf")
        probs = F.softmax(logits, dim=-1)
        idx_next = torch.multinomial(probs, num_samples=1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


model = GPT()
model.to(device)
model.eval()
start = torch.zeros((batch_size, 1), dtype=torch.long, device=device)
# warm up with the timed run's shapes, as the JAX twin does (a compiled generate() compiles
# once per length of its output)
generate(model, start, max_new_tokens, temperature=temperature, top_k=top_k)
t0 = time.perf_counter()
out = generate(model, start, max_new_tokens, temperature=temperature, top_k=top_k)
tokens = out[0].tolist()
elapsed = time.perf_counter() - t0
print("sample", " ".join(str(t) for t in tokens[:20]))
print(f"tokens_per_s={max_new_tokens * batch_size / elapsed:.1f}")
