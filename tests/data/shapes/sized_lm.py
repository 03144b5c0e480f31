"""A language model whose layers sit in a ModuleDict and a ModuleList, with its input's
shape stated in forward, as GPT code does (b, t = idx.size())."""

import torch.nn as nn


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class SizedLM(nn.Module):
    def __init__(self, vocab, n, depth):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n),
            h=nn.ModuleList([Block(n) for _ in range(depth)]),
            ln_f=nn.LayerNorm(n),
        ))
        self.lm_head = nn.Linear(n, vocab, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)
