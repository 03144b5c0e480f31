"""Hand-written flax linen references for benchmarks/runtime.py --targets linen: the fixture
MLP, CNN and GPT and the benchmark ResNet-18, the same shapes as the NNX references next to
this file (benchmarks/reference/{mlp,cnn,gpt,resnet18}.py) and as the torch models.

Written as the flax examples write linen: ``@nn.compact``, channels-last images (the CNN and
the ResNet take NHWC), ``nn.BatchNorm(use_running_average=not self.train)`` with its statistics
in ``batch_stats``, ``nn.Dropout(deterministic=not self.train)``. The train/eval switch is a
``train`` field, as in the converted modules, so that one train step (``model.clone(train=True)
.apply``) serves both.
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    hidden_sizes: Sequence[int] = (1024, 512)
    num_classes: int = 10
    train: bool = False

    @nn.compact
    def __call__(self, x):
        for h in self.hidden_sizes:
            x = jax.nn.relu(nn.Dense(h)(x))
        return nn.Dense(self.num_classes)(x)


def _bn(train):
    return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)


class CNN(nn.Module):
    num_classes: int = 10
    dropout: float = 0.25
    train: bool = False

    @nn.compact
    def __call__(self, x):  # (B, 32, 32, 3)
        for channels in (16, 32):
            x = nn.Conv(channels, (3, 3), padding=1)(x)
            x = nn.max_pool(jax.nn.relu(_bn(self.train)(x)), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not self.train)(jax.nn.relu(nn.Dense(64)(x)))
        return nn.Dense(self.num_classes)(x)


class Block(nn.Module):
    n_embd: int
    n_head: int

    @nn.compact
    def __call__(self, x):
        b, t, c = x.shape
        qkv = nn.Dense(3 * c)(nn.LayerNorm(epsilon=1e-5)(x))
        q, k, v = jnp.split(qkv.reshape(b, t, 3, self.n_head, c // self.n_head), 3, axis=2)
        y = jax.nn.dot_product_attention(q[:, :, 0], k[:, :, 0], v[:, :, 0], is_causal=True)
        x = x + nn.Dense(c)(y.reshape(b, t, c))
        h = jax.nn.gelu(nn.Dense(4 * c)(nn.LayerNorm(epsilon=1e-5)(x)), approximate=False)
        return x + nn.Dense(c)(h)


class GPT(nn.Module):
    block_size: int = 64
    vocab_size: int = 128
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    train: bool = False  # no dropout (the fixture's config has dropout 0.0)

    @nn.compact
    def __call__(self, idx):
        wte = nn.Embed(self.vocab_size, self.n_embd)
        x = wte(idx) + nn.Embed(self.block_size, self.n_embd)(jnp.arange(idx.shape[1]))
        for _ in range(self.n_layer):
            x = Block(self.n_embd, self.n_head)(x)
        return wte.attend(nn.LayerNorm(epsilon=1e-5)(x))  # LM head tied to the embedding


class BasicBlock(nn.Module):
    channels: int
    stride: int = 1
    train: bool = False

    @nn.compact
    def __call__(self, x):
        s = (self.stride, self.stride)
        y = nn.Conv(self.channels, (3, 3), s, padding=1, use_bias=False)(x)
        y = jax.nn.relu(_bn(self.train)(y))
        y = _bn(self.train)(nn.Conv(self.channels, (3, 3), padding=1, use_bias=False)(y))
        if self.stride != 1 or x.shape[-1] != self.channels:
            x = _bn(self.train)(nn.Conv(self.channels, (1, 1), s, use_bias=False)(x))
        return jax.nn.relu(y + x)


class ResNet18(nn.Module):
    num_classes: int = 10
    train: bool = False

    @nn.compact
    def __call__(self, x):  # (B, H, W, 3)
        x = nn.Conv(64, (7, 7), (2, 2), padding=3, use_bias=False)(x)
        x = jax.nn.relu(_bn(self.train)(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for i, channels in enumerate((64, 128, 256, 512)):
            for j in range(2):
                x = BasicBlock(channels, 2 if i > 0 and j == 0 else 1, self.train)(x)
        return nn.Dense(self.num_classes)(x.mean(axis=(1, 2)))
