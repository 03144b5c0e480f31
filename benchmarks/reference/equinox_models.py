"""Hand-written equinox references for benchmarks/runtime.py --targets equinox: the fixture
MLP, CNN and GPT and the benchmark ResNet-18, the same shapes as the NNX references next to
this file and as the torch models.

Written as the equinox examples write models: ``eqx.Module``\\ s of ``eqx.nn`` layers, each
model **per example** (channels-first ``(C, H, W)`` images, ``(T,)`` token sequences), mapped
over the batch by the caller with ``jax.vmap``, and inside the GPT over the sequence with
``jax.vmap(layer)``. That is equinox's own convention (its layers take one example, its
BatchNorm reads the batch through ``axis_name``), and it is the form the converter emits, so
the comparison isolates what the converter writes inside the model. BatchNorm is
``eqx.nn.BatchNorm(mode="batch", axis_name="batch")`` (batch statistics in training, as torch)
with its running statistics in an ``eqx.nn.State``; models with state are built with
``eqx.nn.make_with_state`` and called ``model(x, state) -> (out, state)``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp


def _bn(channels):
    return eqx.nn.BatchNorm(channels, axis_name="batch", momentum=0.9, eps=1e-5, mode="batch")


class MLP(eqx.Module):
    layers: list

    def __init__(self, in_features=784, hidden_sizes=(1024, 512), num_classes=10, *, key):
        sizes = (in_features, *hidden_sizes, num_classes)
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [eqx.nn.Linear(a, b, key=k) for a, b, k in zip(sizes, sizes[1:], keys)]

    def __call__(self, x, *, key=None):
        for layer in self.layers[:-1]:
            x = jax.nn.relu(layer(x))
        return self.layers[-1](x)


class CNN(eqx.Module):
    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: eqx.nn.BatchNorm
    fc1: eqx.nn.Linear
    dropout: eqx.nn.Dropout
    fc2: eqx.nn.Linear
    pool: eqx.nn.MaxPool2d

    def __init__(self, num_classes=10, dropout=0.25, *, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv1 = eqx.nn.Conv2d(3, 16, 3, padding=1, key=k1)
        self.bn1 = _bn(16)
        self.conv2 = eqx.nn.Conv2d(16, 32, 3, padding=1, key=k2)
        self.bn2 = _bn(32)
        self.fc1 = eqx.nn.Linear(32 * 8 * 8, 64, key=k3)
        self.dropout = eqx.nn.Dropout(dropout)
        self.fc2 = eqx.nn.Linear(64, num_classes, key=k4)
        self.pool = eqx.nn.MaxPool2d(2, 2)

    def __call__(self, x, state, *, key=None):  # x: (3, 32, 32)
        x, state = self.bn1(self.conv1(x), state)
        x = self.pool(jax.nn.relu(x))
        x, state = self.bn2(self.conv2(x), state)
        x = self.pool(jax.nn.relu(x))
        x = self.dropout(jax.nn.relu(self.fc1(x.reshape(-1))), key=key)
        return self.fc2(x), state


class Block(eqx.Module):
    ln_1: eqx.nn.LayerNorm
    qkv: eqx.nn.Linear
    proj: eqx.nn.Linear
    ln_2: eqx.nn.LayerNorm
    fc: eqx.nn.Linear
    fc_proj: eqx.nn.Linear
    n_head: int = eqx.field(static=True)

    def __init__(self, n_embd, n_head, *, key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.ln_1 = eqx.nn.LayerNorm(n_embd, eps=1e-5)
        self.qkv = eqx.nn.Linear(n_embd, 3 * n_embd, key=k1)
        self.proj = eqx.nn.Linear(n_embd, n_embd, key=k2)
        self.ln_2 = eqx.nn.LayerNorm(n_embd, eps=1e-5)
        self.fc = eqx.nn.Linear(n_embd, 4 * n_embd, key=k3)
        self.fc_proj = eqx.nn.Linear(4 * n_embd, n_embd, key=k4)
        self.n_head = n_head

    def __call__(self, x):  # x: (T, C)
        t, c = x.shape
        qkv = jax.vmap(self.qkv)(jax.vmap(self.ln_1)(x))
        q, k, v = jnp.split(qkv.reshape(t, 3, self.n_head, c // self.n_head), 3, axis=1)
        y = jax.nn.dot_product_attention(q[:, 0], k[:, 0], v[:, 0], is_causal=True)
        x = x + jax.vmap(self.proj)(y.reshape(t, c))
        h = jax.nn.gelu(jax.vmap(self.fc)(jax.vmap(self.ln_2)(x)), approximate=False)
        return x + jax.vmap(self.fc_proj)(h)


class GPT(eqx.Module):
    wte: eqx.nn.Embedding
    wpe: eqx.nn.Embedding
    blocks: list
    ln_f: eqx.nn.LayerNorm

    def __init__(self, block_size=64, vocab_size=128, n_layer=2, n_head=2, n_embd=32, *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.wte = eqx.nn.Embedding(vocab_size, n_embd, key=k1)
        self.wpe = eqx.nn.Embedding(block_size, n_embd, key=k2)
        self.blocks = [Block(n_embd, n_head, key=k) for k in jax.random.split(k3, n_layer)]
        self.ln_f = eqx.nn.LayerNorm(n_embd, eps=1e-5)

    def __call__(self, idx, *, key=None):  # idx: (T,)
        x = self.wte.weight[idx] + self.wpe.weight[jnp.arange(idx.shape[0])]
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.ln_f)(x) @ self.wte.weight.T  # LM head tied to the embedding


class BasicBlock(eqx.Module):
    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    conv2: eqx.nn.Conv2d
    bn2: eqx.nn.BatchNorm
    shortcut: eqx.nn.Conv2d | None
    shortcut_bn: eqx.nn.BatchNorm | None

    def __init__(self, in_channels, channels, stride=1, *, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(in_channels, channels, 3, stride, padding=1, use_bias=False,
                                   key=k1)
        self.bn1 = _bn(channels)
        self.conv2 = eqx.nn.Conv2d(channels, channels, 3, padding=1, use_bias=False, key=k2)
        self.bn2 = _bn(channels)
        if stride != 1 or in_channels != channels:
            self.shortcut = eqx.nn.Conv2d(in_channels, channels, 1, stride, use_bias=False,
                                          key=k3)
            self.shortcut_bn = _bn(channels)
        else:
            self.shortcut = self.shortcut_bn = None

    def __call__(self, x, state):
        y, state = self.bn1(self.conv1(x), state)
        y, state = self.bn2(self.conv2(jax.nn.relu(y)), state)
        if self.shortcut is not None:
            x, state = self.shortcut_bn(self.shortcut(x), state)
        return jax.nn.relu(y + x), state


class ResNet18(eqx.Module):
    conv1: eqx.nn.Conv2d
    bn1: eqx.nn.BatchNorm
    pool: eqx.nn.MaxPool2d
    blocks: list
    fc: eqx.nn.Linear

    def __init__(self, num_classes=10, *, key):
        keys = jax.random.split(key, 10)
        self.conv1 = eqx.nn.Conv2d(3, 64, 7, 2, padding=3, use_bias=False, key=keys[0])
        self.bn1 = _bn(64)
        self.pool = eqx.nn.MaxPool2d(3, 2, padding=1)
        blocks, in_channels = [], 64
        for i, channels in enumerate((64, 128, 256, 512)):
            for j in range(2):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(in_channels, channels, stride, key=keys[1 + 2 * i + j]))
                in_channels = channels
        self.blocks = blocks
        self.fc = eqx.nn.Linear(512, num_classes, key=keys[9])

    def __call__(self, x, state, *, key=None):  # x: (3, H, W)
        x, state = self.bn1(self.conv1(x), state)
        x = self.pool(jax.nn.relu(x))
        for block in self.blocks:
            x, state = block(x, state)
        return self.fc(x.mean(axis=(1, 2))), state
