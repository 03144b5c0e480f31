"""Normalisation without running statistics, and torch ops under their function names."""

import torch
import torch.nn as nn


class BatchStatsOnly(nn.Module):
    """BatchNorm(track_running_stats=False) uses the batch statistics in eval mode too."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(8, track_running_stats=False)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.bn(x)
        h = torch.sub(h, h.max(1, keepdim=True).values) - torch.div(h, 4)
        return self.fc(h)
