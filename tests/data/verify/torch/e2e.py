"""Models the real converter handles end to end (verify converts them on the fly)."""

import torch
import torch.nn.functional as F
from config import LMConfig
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, channels: int = 3, classes: int = 5):
        super().__init__()
        self.conv = nn.Conv2d(channels, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


class TinyLM(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.dim)
        self.ln = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        return self.lm_head(self.ln(self.wte(idx))), None
