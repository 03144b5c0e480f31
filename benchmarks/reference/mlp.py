"""Hand-written flax NNX reference for fixtures/models/mlp.py: 784 -> 1024 -> 512 -> 10, ReLU."""

import itertools

import jax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, in_features=784, hidden_sizes=(1024, 512), num_classes=10, *, rngs):
        sizes = (in_features, *hidden_sizes)
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])
        self.head = nnx.Linear(sizes[-1], num_classes, rngs=rngs)

    def __call__(self, x):
        for layer in self.hidden:
            x = jax.nn.relu(layer(x))
        return self.head(x)
