"""Hand-written NNX equivalents of ../torch/models.py, in the shape docs/nnx-output.md fixes."""

from functools import partial

import jax.numpy as jnp
from config import BACKEND, LMConfig
from flax import nnx

assert BACKEND == "jax"


class MLP(nnx.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4, *, rngs: nnx.Rngs):
        self.net = nnx.Sequential(
            nnx.Linear(d_in, hidden, rngs=rngs),
            partial(nnx.gelu, approximate=False),
            nnx.Linear(hidden, d_out, rngs=rngs),
        )
        self.scale = nnx.Param(jnp.ones(d_out))
        self.offset = nnx.Variable(jnp.linspace(-1.0, 1.0, d_out))
        self.deterministic = False

    def __call__(self, x):
        return self.net(x) * self.scale[...] + self.offset[...]


class ConvNet(nnx.Module):
    def __init__(self, channels: int = 3, classes: int = 5, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(channels, 8, kernel_size=(3, 3), padding=((1, 1), (1, 1)), rngs=rngs)
        self.bn = nnx.BatchNorm(8, momentum=0.9, epsilon=1e-05, rngs=rngs)
        self.pool = partial(nnx.max_pool, window_shape=(2, 2), strides=(2, 2))
        self.fc = nnx.Linear(8 * 4 * 4, classes, rngs=rngs)
        self.deterministic = False

    def __call__(self, x):
        x = jnp.moveaxis(x, 1, -1)
        x = self.pool(nnx.relu(self.bn(self.conv(x))))
        x = jnp.moveaxis(x, -1, 1)
        return self.fc(x.reshape(x.shape[0], -1))


class Blocks(nnx.Module):
    def __init__(self, dim: int = 8, depth: int = 2, *, rngs: nnx.Rngs):
        self.blocks = nnx.List(
            [
                nnx.Sequential(
                    nnx.LayerNorm(dim, epsilon=1e-05, rngs=rngs), nnx.Linear(dim, dim, rngs=rngs)
                )
                for _ in range(depth)
            ]
        )
        self.heads = nnx.Dict(
            {"a": nnx.Linear(dim, 2, rngs=rngs), "b": nnx.Linear(dim, 3, rngs=rngs)}
        )
        self.deterministic = False

    def __call__(self, x):
        x = x * 0.01  # small activations: LayerNorm's epsilon matters
        for block in self.blocks:
            x = x + block(x)
        return {"a": self.heads["a"](x), "b": self.heads["b"](x)}


class SeqConv(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(4, 6, kernel_size=(3,), padding=((0, 0),), use_bias=False, rngs=rngs)
        self.norm = nnx.LayerNorm(
            48, epsilon=1e-05, reduction_axes=(-2, -1), feature_axes=(-2, -1), rngs=rngs
        )
        self.deterministic = False

    def __call__(self, x):
        return self.norm(jnp.moveaxis(self.conv(jnp.moveaxis(x, 1, -1)), -1, 1))


class TinyLM(nnx.Module):
    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        self.wte = nnx.Embed(cfg.vocab, cfg.dim, rngs=rngs)
        self.ln = nnx.LayerNorm(cfg.dim, epsilon=1e-05, rngs=rngs)
        self.deterministic = False

    def __call__(self, idx):
        return self.wte.attend(self.ln(self.wte(idx))), None


class ScaledLinear(nnx.Linear):
    def __call__(self, x):
        return super().__call__(x) * 2.0


class UsesSubclass(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.proj = ScaledLinear(6, 3, rngs=rngs)
        self.deterministic = False

    def __call__(self, x):
        return self.proj(x)
