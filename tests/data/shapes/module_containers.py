"""Layers kept in a ModuleList grown in a loop and in ModuleDicts, as transformer code writes
them."""

import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, dim, depth):
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(depth):
            self.layers.append(nn.Linear(dim, dim))
        self.norms = nn.ModuleDict({"pre": nn.LayerNorm(dim), "post": nn.LayerNorm(dim)})

    def forward(self, x):
        x = self.norms["pre"](x)
        for layer in self.layers:
            x = torch.relu(layer(x))
            x = self.norms["post"](x)
        return x


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = nn.LayerNorm(n)
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, n, depth):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n),
            h=nn.ModuleList([Block(n) for _ in range(depth)]),
            ln_f=nn.LayerNorm(n),
        ))
        self.lm_head = nn.Linear(n, vocab, bias=False)

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)
