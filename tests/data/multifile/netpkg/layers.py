import torch.nn as nn
import torch.nn.functional as F

from .util import widen


class Mlp(nn.Module):
    def __init__(self, dim: int, out: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, widen(dim))
        self.fc2 = nn.Linear(widen(dim), out or dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ResidualMlp(Mlp):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))
