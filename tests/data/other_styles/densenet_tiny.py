"""A tiny DenseNet-style network.

Style points: `from torch.nn import functional as F`, a ModuleList built by a list
comprehension and iterated in forward, feature maps concatenated on the channel axis
(torch.cat(..., dim=1)), GroupNorm, and global average pooling written as x.mean(dim=(2, 3)).
"""

import torch
import torch.nn as nn
from torch.nn import functional as F


class DenseLayer(nn.Module):
    """GroupNorm -> ReLU -> 3x3 conv producing `growth` new channels."""

    def __init__(self, in_channels, growth, groups=4):
        super().__init__()
        self.norm = nn.GroupNorm(groups, in_channels)
        self.conv = nn.Conv2d(in_channels, growth, kernel_size=3, padding=1, bias=False)

    def forward(self, x):
        return self.conv(F.relu(self.norm(x)))


class TinyDenseNet(nn.Module):
    def __init__(self, in_channels=3, stem_channels=8, growth=8, num_layers=3, num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, stem_channels, kernel_size=3, padding=1)
        self.layers = nn.ModuleList(
            [DenseLayer(stem_channels + i * growth, growth) for i in range(num_layers)]
        )
        out_channels = stem_channels + num_layers * growth
        self.norm = nn.GroupNorm(4, out_channels)
        self.classifier = nn.Linear(out_channels, num_classes)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = torch.cat([x, layer(x)], dim=1)
        x = F.relu(self.norm(x))
        x = x.mean(dim=(2, 3))
        return self.classifier(x)

