"""A 1-D convolutional classifier for fixed-length univariate signals.

Style points: the layers live in one nn.Sequential that mixes Conv1d, GroupNorm, activations
and an nn.Flatten() feeding a Linear (so the flattened feature order matters), the input
gets a channel axis with x.unsqueeze(1), outliers are clipped with torch.clamp, and the
functional API is called by its full name torch.nn.functional.
"""

import torch
from torch import nn


class SignalClassifier(nn.Module):
    def __init__(self, length=32, channels=16, num_classes=4, clip=5.0):
        super().__init__()
        self.clip = clip
        self.features = nn.Sequential(
            nn.Conv1d(1, channels // 2, kernel_size=5, padding=2),
            nn.GroupNorm(4, channels // 2),
            nn.SiLU(),
            nn.Conv1d(channels // 2, channels, kernel_size=3, stride=2, padding=1),
            nn.GroupNorm(4, channels),
            nn.SiLU(),
        )
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * (length // 2), 32),
            nn.Tanh(),
            nn.Linear(32, num_classes),
        )

    def forward(self, x):
        # x: (batch, length) raw samples
        x = torch.clamp(x, -self.clip, self.clip)
        x = x.unsqueeze(1)  # (batch, 1, length)
        x = self.features(x)
        return torch.nn.functional.log_softmax(self.head(x), dim=-1)

