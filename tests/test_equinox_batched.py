"""Batched equinox code where the per-example form is not shown (issue 32, item 1), on a
vision transformer of our own in the shape public ViT files have: an einops ``Rearrange``
patch embedding followed by vector layers in one ``nn.Sequential``, the query, key and value
split by ``map(lambda t: rearrange(...), qkv.chunk(3, dim=-1))``, an output projection that
is ``nn.Sequential(nn.Linear, nn.Dropout)`` or ``nn.Identity()`` by a flag, a class token
repeated to the batch size unpacked from the shape, pooling chosen by a conditional
expression. Each of these was marked on equinox ("a Sequential mixing channel-first and
vector layers", "map on a batched value", "self.to_out is not a layer the equinox target
translated", "IfExp over a batched value", and the batch size ``b`` dropped from the
per-example code, read unbound); the module now keeps torch's batch axis, each equinox layer
mapped over the leading axes, and verifies against torch with either branch of the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("equinox")
pytest.importorskip("einops")

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

SOURCE = '''import torch
from torch import nn
from einops import rearrange, repeat
from einops.layers.torch import Rearrange


class SelfAttention(nn.Module):
    def __init__(self, width, n_heads, head_width, p=0.0):
        super().__init__()
        inner = n_heads * head_width
        self.n_heads = n_heads
        self.scale = head_width ** -0.5
        self.pre_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * inner, bias=False)
        self.softmax = nn.Softmax(dim=-1)
        self.attn_drop = nn.Dropout(p)
        needs_proj = n_heads != 1 or head_width != width
        self.proj = nn.Sequential(nn.Linear(inner, width), nn.Dropout(p)) if needs_proj \\
            else nn.Identity()

    def forward(self, tokens):
        tokens = self.pre_norm(tokens)
        q, k, v = map(lambda a: rearrange(a, "b t (h e) -> b h t e", h=self.n_heads),
                      self.qkv(tokens).chunk(3, dim=-1))
        weights = self.attn_drop(self.softmax(q @ k.transpose(-2, -1) * self.scale))
        mixed = rearrange(weights @ v, "b h t e -> b t (h e)")
        return self.proj(mixed)


class Block(nn.Module):
    def __init__(self, width, n_heads, head_width, hidden, p=0.0):
        super().__init__()
        self.attn = SelfAttention(width, n_heads, head_width, p)
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(),
                                 nn.Dropout(p), nn.Linear(hidden, width))

    def forward(self, tokens):
        tokens = tokens + self.attn(tokens)
        return tokens + self.mlp(tokens)


class TinyViT(nn.Module):
    def __init__(self, side, patch, classes, width, depth, n_heads, head_width, hidden,
                 pooling="token", p=0.0):
        super().__init__()
        n_patches = (side // patch) ** 2
        self.embed = nn.Sequential(
            Rearrange("b c (y py) (x px) -> b (y x) (py px c)", py=patch, px=patch),
            nn.LayerNorm(3 * patch * patch),
            nn.Linear(3 * patch * patch, width),
        )
        self.token = nn.Parameter(torch.randn(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, n_patches + 1, width))
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList([Block(width, n_heads, head_width, hidden, p)
                                     for _ in range(depth)])
        self.pooling = pooling
        self.latent = nn.Identity()
        self.head = nn.Linear(width, classes)

    def forward(self, images):
        tokens = self.embed(images)
        b, t, _ = tokens.shape
        tokens = torch.cat((repeat(self.token, "1 1 d -> b 1 d", b=b), tokens), dim=1)
        tokens = self.drop(tokens + self.positions[:, :t + 1])
        for block in self.blocks:
            tokens = block(tokens)
        pooled = tokens.mean(dim=1) if self.pooling == "mean" else tokens[:, 0]
        return self.head(self.latent(pooled))
'''


@pytest.fixture(scope="module")
def vit_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vit") / "tiny_vit.py"
    path.write_text(SOURCE)
    return path


def test_the_vit_converts_batched_with_no_mark() -> None:
    result = convert_source(SOURCE, path="tiny_vit.py", target="equinox")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    assert result.code.count("batched = True") == 3  # (the three classes, one group)
    assert "eqx.nn.Sequential([eqx.nn.Identity(), eqx.nn.Identity()])" in result.code


@pytest.mark.parametrize(("heads", "head_width", "pooling"),
                         [(2, 8, "token"), (1, 16, "mean")])
def test_the_vit_verifies_on_equinox(vit_file: Path, heads: int, head_width: int,
                                     pooling: str) -> None:
    # (heads 1 of the model's width: the projection is the identity branch)
    build = (f"TinyViT(8, 4, 5, 16, 2, {heads}, {head_width}, 32, pooling={pooling!r}, "
             "p=0.1)")
    r = verify(f"{vit_file}::TinyViT", build=build, inputs=["float32[2,3,8,8]"],
               jax_target="equinox", grad=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.passed, r.mismatch


# layers handed to the constructor as one container (a ModuleList or a Sequential built by
# the caller, stored as it is): the loop's layers are not known here, so per example the loop
# is refused ("a loop over a list of unknown layers") and the module is kept batched, each
# layer called through on_batch (before, ``layer(x)`` ran an equinox Linear, written for one
# vector, on the whole batch)
HANDED = '''import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, layers, width=8):
        super().__init__()
        self.layers = layers
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.out(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stack = Stack(nn.ModuleList([nn.Linear(8, 8), nn.LayerNorm(8)]))
        self.seq = Stack(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)))

    def forward(self, x):
        return self.stack(x) + self.seq(x)
'''


def test_a_loop_over_layers_handed_in_is_called_through_on_batch(tmp_path: Path) -> None:
    result = convert_source(HANDED, path="handed.py", target="equinox")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "x = jnp.tanh(on_batch(layer, x))" in result.code
    path = tmp_path / "handed.py"
    path.write_text(HANDED)
    # (a sequence axis per example: on_batch maps the Linear over both leading axes)
    r = verify(f"{path}::Model", inputs=["float32[3,5,8]"], jax_target="equinox", grad=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.max_abs_diff is not None and r.max_abs_diff <= 1e-5, r.to_json()
    assert r.grad_max_abs_diff is not None and r.grad_max_abs_diff <= 1e-5, r.to_json()
    assert r.passed, r.mismatch


# a module holding BatchNorm whose forward has optional parameters (timm's DLA blocks:
# forward(self, x, shortcut=None, children=None)): ``state`` is taken after the required
# parameters, before those with defaults, and every call passes it there (the conversion
# failed with an internal error: state appended after a parameter with a default)
OPTIONAL = '''import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x, residual=None, scale=1.0):
        out = torch.relu(self.bn(self.conv(x))) * scale
        if residual is not None:
            out = out + residual
        return out


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Block(3)
        self.b = Block(3)
        self.c = Block(3)
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        h = self.a(x)
        h = self.b(h, x, 0.5)
        h = self.c(h, residual=x)
        return self.fc(h.mean(dim=(2, 3)))
'''


def test_state_comes_before_the_optional_parameters(tmp_path: Path) -> None:
    result = convert_source(OPTIONAL, path="optional.py", target="equinox")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "def __call__(self, x, state, residual=None, scale=1.0):" in result.code
    assert "self.b(h, state, x, 0.5)" in result.code
    path = tmp_path / "optional.py"
    path.write_text(OPTIONAL)
    # (train mode: the batch statistics, and the running statistics returned in the state)
    r = verify(f"{path}::Net", inputs=["float32[2,3,6,6]"], jax_target="equinox", grad=True,
               train_mode=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.max_abs_diff is not None and r.max_abs_diff <= 1e-5, r.to_json()
    assert r.grad_max_abs_diff is not None and r.grad_max_abs_diff <= 1e-5, r.to_json()
    assert r.passed, r.mismatch
