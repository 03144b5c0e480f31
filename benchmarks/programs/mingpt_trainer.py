"""A GPT program in the shape of minGPT's demo (projects/sort): a Dataset, a Trainer class
(issue 30's benchmark).

The Dataset draws a problem in ``__getitem__`` with torch.randint (a sequence of digits and
its sorted copy; the targets of the prompt positions -1, ignored by the loss). The Trainer
builds AdamW, a DataLoader over a RandomSampler with replacement, and runs a ``while True``
loop that refills the iterator on StopIteration, with clipping and an ``on_batch_end``
callback. It prints ``ms_per_iter=`` over the iterations after the first warmup ones: data,
step and callback included.
"""

import math
import os
import time
from collections import defaultdict

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

length = 6
num_digits = 3
vocab_size = num_digits
block_size = length * 2 - 1
n_layer = 2
n_head = 4
n_embd = 64
max_iters = int(os.environ.get("GPT_MAX_ITERS", "120"))
warmup = 10
seed = 1337
device = os.environ.get("GPT_DEVICE", "cpu")  # the benchmark sets cuda on a GPU

torch.manual_seed(seed)


class SortDataset(Dataset):
    def __init__(self, length=6, num_digits=3):
        self.length = length
        self.num_digits = num_digits

    def __len__(self):
        return 10000

    def __getitem__(self, idx):
        inp = torch.randint(self.num_digits, size=(self.length,), dtype=torch.long)
        sol = torch.sort(inp)[0]
        cat = torch.cat((inp, sol), dim=0)
        x = cat[:-1].clone()
        y = cat[1:].clone()
        y[:self.length - 1] = -1
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
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss




class TrainerConfig:
    def __init__(self, **kwargs):
        self.batch_size = 64
        self.learning_rate = 5e-4
        self.betas = (0.9, 0.95)
        self.weight_decay = 0.1
        self.grad_norm_clip = 1.0
        self.max_iters = None
        self.num_workers = 0
        for k, v in kwargs.items():
            setattr(self, k, v)


class Trainer:
    def __init__(self, config, model, train_dataset):
        self.config = config
        self.model = model.to(device)
        self.train_dataset = train_dataset
        self.callbacks = defaultdict(list)
        self.iter_num = 0

    def add_callback(self, onevent, callback):
        self.callbacks[onevent].append(callback)

    def trigger_callbacks(self, onevent):
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self):
        model, config = self.model, self.config
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                           betas=config.betas, weight_decay=config.weight_decay)
        train_loader = DataLoader(
            self.train_dataset,
            sampler=torch.utils.data.RandomSampler(self.train_dataset, replacement=True,
                                                   num_samples=int(1e10)),
            shuffle=False, batch_size=config.batch_size, num_workers=config.num_workers)
        model.train()
        self.iter_num = 0
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            batch = [t.to(device) for t in batch]
            x, y = batch
            logits, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            if config.max_iters is not None and self.iter_num >= config.max_iters:
                break


timer = {}


def batch_end_callback(trainer):
    if trainer.iter_num == warmup:
        timer["t0"] = time.perf_counter()
    if trainer.iter_num % 20 == 0:
        print(f"iter {trainer.iter_num} loss {trainer.loss.item():.4f}")


model = GPT()
trainer = Trainer(TrainerConfig(max_iters=max_iters), model, SortDataset(length, num_digits))
trainer.add_callback("on_batch_end", batch_end_callback)
trainer.run()
print(f"ms_per_iter={(time.perf_counter() - timer['t0']) * 1000 / (max_iters - warmup - 1):.3f}")
