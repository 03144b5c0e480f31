"""Hand-written flax NNX ResNet-18, channels-last, same architecture as
benchmarks/models/resnet18.py (the torch model the benchmark converts)."""

import jax
from flax import nnx


class BasicBlock(nnx.Module):
    def __init__(self, in_channels, channels, stride=1, *, rngs):
        self.conv1 = nnx.Conv(in_channels, channels, (3, 3), strides=stride, padding=1,
                              use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(channels, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.conv2 = nnx.Conv(channels, channels, (3, 3), padding=1, use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(channels, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.project = stride != 1 or in_channels != channels
        if self.project:
            self.shortcut = nnx.Conv(in_channels, channels, (1, 1), strides=stride,
                                     use_bias=False, rngs=rngs)
            self.shortcut_bn = nnx.BatchNorm(channels, momentum=0.9, epsilon=1e-5, rngs=rngs)

    def __call__(self, x):
        y = jax.nn.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.project:
            x = self.shortcut_bn(self.shortcut(x))
        return jax.nn.relu(y + x)


class ResNet18(nnx.Module):
    def __init__(self, num_classes=10, *, rngs):
        self.conv1 = nnx.Conv(3, 64, (7, 7), strides=2, padding=3, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(64, momentum=0.9, epsilon=1e-5, rngs=rngs)
        blocks, in_channels = [], 64
        for i, channels in enumerate((64, 128, 256, 512)):
            for j in range(2):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(in_channels, channels, stride, rngs=rngs))
                in_channels = channels
        self.blocks = nnx.List(blocks)
        self.fc = nnx.Linear(512, num_classes, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.bn1(self.conv1(x)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for block in self.blocks:
            x = block(x)
        return self.fc(x.mean(axis=(1, 2)))
