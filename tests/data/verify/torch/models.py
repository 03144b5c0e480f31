"""Small torch models covering each mapping the weight transfer knows (tests only)."""

import torch
import torch.nn.functional as F
from config import BACKEND, LMConfig
from torch import nn

assert BACKEND == "torch"


class MLP(nn.Module):
    """Sequential, exact GELU, a module's own nn.Parameter and a buffer."""

    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))
        self.scale = nn.Parameter(torch.ones(d_out))
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, d_out))

    def forward(self, x):
        return self.net(x) * self.scale + self.offset


class ConvNet(nn.Module):
    """Conv2d + BatchNorm2d + pooling on NCHW images, flattened into a Linear."""

    def __init__(self, channels: int = 3, classes: int = 5):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class Blocks(nn.Module):
    """ModuleList of Sequential(LayerNorm, Linear), ModuleDict heads, a dict output."""

    def __init__(self, dim: int = 8, depth: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim)) for _ in range(depth)]
        )
        self.heads = nn.ModuleDict({"a": nn.Linear(dim, 2), "b": nn.Linear(dim, 3)})

    def forward(self, x):
        x = x * 0.01  # small activations: LayerNorm's epsilon matters
        for block in self.blocks:
            x = x + block(x)
        return {"a": self.heads["a"](x), "b": self.heads["b"](x)}


class SeqConv(nn.Module):
    """Conv1d (no bias) and a LayerNorm over two axes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, bias=False)
        self.norm = nn.LayerNorm((6, 8))

    def forward(self, x):
        return self.norm(self.conv(x))


class TinyLM(nn.Module):
    """Embedding with the LM head tied to it; returns (logits, None) like nanoGPT."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.ln = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(self.ln(self.wte(idx))), None


class ScaledLinear(nn.Linear):
    """A user subclass of a torch layer: the Linear rule applies to its weight and bias."""

    def forward(self, x):
        return super().forward(x) * 2.0


class UsesSubclass(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = ScaledLinear(6, 3)

    def forward(self, x):
        return self.proj(x)
