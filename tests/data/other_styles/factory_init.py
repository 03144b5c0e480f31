"""torchvision-style building blocks: a norm-layer factory, an init loop over self.modules()."""

from typing import Callable, Optional

import torch.nn as nn
from torch import Tensor


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class Stem(nn.Module):
    def __init__(self, width: int = 16, num_classes: int = 5,
                 norm_layer: Optional[Callable[..., nn.Module]] = None) -> None:
        super().__init__()
        if norm_layer is None:
            norm_layer = nn.BatchNorm2d
        self.conv1 = conv3x3(3, width)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width, stride=2)
        self.bn2 = norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.fc = nn.Linear(width, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))
