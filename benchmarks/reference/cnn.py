"""Hand-written flax NNX reference for fixtures/models/cnn.py, channels-last throughout.

Takes NHWC images (B, 32, 32, 3); the flatten before fc1 is in NHWC order, which only permutes
fc1's input rows relative to the torch model (same shapes, same cost).
"""

import jax
from flax import nnx


class CNN(nnx.Module):
    def __init__(self, num_classes=10, dropout=0.25, *, rngs):
        self.conv1 = nnx.Conv(3, 16, (3, 3), padding=1, rngs=rngs)
        self.bn1 = nnx.BatchNorm(16, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, (3, 3), padding=1, rngs=rngs)
        self.bn2 = nnx.BatchNorm(32, momentum=0.9, epsilon=1e-5, rngs=rngs)
        self.fc1 = nnx.Linear(8 * 8 * 32, 64, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.fc2 = nnx.Linear(64, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(jax.nn.relu(self.bn1(self.conv1(x))), (2, 2), (2, 2))
        x = nnx.max_pool(jax.nn.relu(self.bn2(self.conv2(x))), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = self.dropout(jax.nn.relu(self.fc1(x)))
        return self.fc2(x)
