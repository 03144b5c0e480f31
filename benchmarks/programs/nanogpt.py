"""A GPT program in the shape of nanoGPT's train.py and sample.py (issue 30's benchmark).

Training (GPT_MODE=train): gradient accumulation over micro-steps (the next batch fetched
between forward and backward, as nanoGPT does), parameter groups (decay for matrices, none
for vectors), the learning rate computed by get_lr(iter) (warmup then cosine) and set on every
group each iteration, clipping, AdamW(betas=(0.9, 0.95)). Prints ``ms_per_iter=``.
Sampling (GPT_MODE=sample): ``model.generate()`` a method, as in nanoGPT's model.py, whose
forward computes the last position only at inference (``x[:, [-1], :]``), with temperature
and top-k; prints ``tokens_per_s=`` over 2 x max_new_tokens tokens.
"""

import math
import os
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

batch_size = 8
block_size = 32
vocab_size = 48
n_layer = 2
n_head = 4
n_embd = 64
gradient_accumulation_steps = 4
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 20
lr_decay_iters = 200
weight_decay = 0.1
grad_clip = 1.0
max_iters = int(os.environ.get("GPT_MAX_ITERS", "120")) // 2
warmup = 5
log_interval = 20
mode = os.environ.get("GPT_MODE", "train")
num_samples = 2
max_new_tokens = int(os.environ.get("GPT_NEW_TOKENS", "100"))
temperature = 0.8
top_k = 10
seed = 1337
device = os.environ.get("GPT_DEVICE", "cpu")  # the benchmark sets cuda on a GPU

torch.manual_seed(seed)
# a deterministic "text": a counting pattern with a slower drift, vocab_size symbols
data = torch.tensor([(i * 7 + i // 11) % vocab_size for i in range(20000)], dtype=torch.long)
data = data.to(device)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    x, y = x.to(device), y.to(device)
    return x, y


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
        x = self.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        else:
            # inference: the last position only, as nanoGPT's forward does
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        nodecay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optim_groups = [{"params": decay, "weight_decay": weight_decay},
                        {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)

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




def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def train():
    model = GPT()
    model.to(device)
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (0.9, 0.95))
    model.train()
    X, Y = get_batch()
    t0 = time.perf_counter()
    for iter_num in range(max_iters):
        if iter_num == warmup:
            t0 = time.perf_counter()
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % log_interval == 0 or iter_num == max_iters - 1:
            print(f"iter {iter_num} loss {loss.item() * gradient_accumulation_steps:.4f} lr {lr:.2e}")
    print(f"ms_per_iter={(time.perf_counter() - t0) * 1000 / (max_iters - warmup):.3f}")


def sample():
    model = GPT()
    model.to(device)
    model.eval()
    x = torch.zeros((1, 1), dtype=torch.long, device=device)
    with torch.no_grad():
        model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)  # warm-up
        t0 = time.perf_counter()
        for k in range(num_samples):
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
            print("sample", " ".join(str(t) for t in y[0].tolist()[:20]))
        elapsed = time.perf_counter() - t0
    print(f"tokens_per_s={num_samples * max_new_tokens / elapsed:.1f}")


if mode == "train":
    train()
else:
    sample()
