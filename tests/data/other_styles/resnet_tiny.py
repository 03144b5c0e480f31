"""A tiny ResNet written with direct imports from torch.nn.

Style points: layer classes imported by name, a helper function that returns a
conv-batchnorm-activation Sequential, residual blocks that subclass a user-defined base
class, an Identity shortcut when the shapes already match, and a torch.flatten head.
"""

import torch
from torch.nn import (
    AdaptiveAvgPool2d,
    BatchNorm2d,
    Conv2d,
    Identity,
    Linear,
    Module,
    ReLU,
    Sequential,
)


def conv_bn_act(in_channels, out_channels, kernel_size=3, stride=1, act=True):
    """Conv (no bias, the BatchNorm has one) -> BatchNorm -> optional ReLU."""
    padding = kernel_size // 2
    return Sequential(
        Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False),
        BatchNorm2d(out_channels),
        ReLU(inplace=True) if act else Identity(),
    )


class ResidualBlock(Module):
    """Base class: out = relu(residual(x) + shortcut(x)); subclasses build the two branches."""

    def __init__(self):
        super().__init__()
        self.act = ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.residual(x) + self.shortcut(x))


class BasicBlock(ResidualBlock):
    expansion = 1

    def __init__(self, in_channels, channels, stride=1):
        super().__init__()
        out_channels = channels * self.expansion
        self.residual = Sequential(
            conv_bn_act(in_channels, channels, 3, stride=stride),
            conv_bn_act(channels, out_channels, 3, act=False),
        )
        if stride != 1 or in_channels != out_channels:
            self.shortcut = conv_bn_act(in_channels, out_channels, 1, stride=stride, act=False)
        else:
            self.shortcut = Identity()


class TinyResNet(Module):
    def __init__(self, block, layers, num_classes=10, width=8):
        super().__init__()
        self.stem = conv_bn_act(3, width, 3)
        stages = []
        in_channels = width
        for i, num_blocks in enumerate(layers):
            channels = width * 2**i
            stride = 1 if i == 0 else 2
            for j in range(num_blocks):
                stages.append(block(in_channels, channels, stride if j == 0 else 1))
                in_channels = channels * block.expansion
        self.stages = Sequential(*stages)
        self.pool = AdaptiveAvgPool2d(1)
        self.fc = Linear(in_channels, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.stages(x)
        x = self.pool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)

