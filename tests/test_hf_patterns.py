"""Patterns of transformers' modeling files, written as plain torch (no transformers needed):
a subclass of nn.Embedding with a padding row and a scale (Gemma's scaled word embedding),
rotary buffers set and read under names built at run time (Gemma 3's
``setattr(self, f"{kind}_inv_freq", nn.Buffer(...))``), BERT's ``torch.arange(n).expand((1,
-1))`` and attention class chosen when built, RoBERTa's cumulative sum, converted and verified
against torch (forward and every parameter's gradient). tests/test_transformers.py runs the files
themselves."""

from __future__ import annotations

import re
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = textwrap.dedent('''
    from collections.abc import Iterable

    import torch
    import torch.nn as nn


    class ScaledEmbedding(nn.Embedding):
        def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int,
                     embed_scale: float = 1.0):
            super().__init__(num_embeddings, embedding_dim, padding_idx)
            self.embed_scale = nn.Buffer(torch.tensor(embed_scale), persistent=False)

        def forward(self, input_ids):
            return super().forward(input_ids) * self.embed_scale.to(self.weight.dtype)


    class Rotary(nn.Module):
        def __init__(self, dim: int, kinds=("local", "global")):
            super().__init__()
            for i, kind in enumerate(kinds):
                inv_freq = 1.0 / ((10.0 * (i + 1)) ** (torch.arange(0, dim, 2).float() / dim))
                setattr(self, f"{kind}_inv_freq", nn.Buffer(inv_freq, persistent=False))
                setattr(self, f"{kind}_scaling", 0.5 * (i + 1))

        def forward(self, x, kind):
            inv_freq = getattr(self, f"{kind}_inv_freq")
            scaling = getattr(self, f"{kind}_scaling")
            positions = torch.arange(x.shape[1])
            freqs = positions[:, None].float() * inv_freq.to(device=x.device, dtype=torch.float)
            emb = torch.cat((freqs, freqs), dim=-1)
            return x * emb.cos() * scaling + emb.sin()


    class SelfMix(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            return torch.tanh(self.proj(x))


    class CrossMix(SelfMix):
        def forward(self, x):
            return torch.sigmoid(self.proj(x))


    class Block(nn.Module):
        """BERT's attention block: the class chosen when it is built."""

        def __init__(self, dim: int, cross: bool = False):
            super().__init__()
            mix_class = CrossMix if cross else SelfMix
            self.mix = mix_class(dim)
            # BERT's position ids: a compound expression expanded with -1
            self.position_ids = nn.Buffer(torch.arange(6).expand((1, -1)), persistent=False)

        def forward(self, x):
            positions = self.position_ids[:, : x.shape[1]]
            return self.mix(x) + positions[..., None].float() * 0.1


    class PatchEmbed(nn.Module):
        """ViT's: the kernel a (p, p) pair made from the config's int or pair."""

        def __init__(self, patch_size=2):
            super().__init__()
            patch_size = patch_size if isinstance(patch_size, Iterable) else (patch_size,
                                                                               patch_size)
            self.projection = nn.Conv2d(3, 8, kernel_size=patch_size, stride=patch_size)

        def forward(self, pixels):
            return self.projection(pixels).flatten(2).transpose(1, 2)


    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.patches = PatchEmbed(2)


    class ImageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = Stem()
            self.head = nn.Linear(8, 3)

        def forward(self, pixels):
            # ViT: the dtype of a layer's weight two module classes down
            pixels = pixels.to(self.stem.patches.projection.weight.dtype)
            return self.head(self.stem.patches(pixels)).mean(1)


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = ScaledEmbedding(11, 8, padding_idx=0, embed_scale=8 ** 0.5)
            self.rotary = Rotary(8)
            self.blocks = nn.ModuleList([Block(8), Block(8, cross=True)])
            self.head = nn.Linear(8, 5)

        def forward(self, ids):
            h = self.embed(ids)
            h = self.rotary(h, "local") + self.rotary(h, "global")
            for block in self.blocks:
                h = block(h)
            # RoBERTa's position ids: a cumulative sum over the non-padding tokens
            h = h * torch.cumsum(ids.ne(0).int(), dim=1)[..., None].float()
            return self.head(h)
''')


def test_converts_to_the_padded_embedding_and_known_buffers():
    result = convert_source(SOURCE, path="hf_patterns.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors)
    # the subclass derives from the Embedding helper (the padding row), not nnx.Embed
    assert "class ScaledEmbedding(Embedding):" in result.code
    assert "class Embedding(nnx.Embed):" in result.code
    assert "super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx" in result.code
    assert "self.embed_scale.astype(self.embedding.dtype)" in result.code
    # getattr(self, f"{kind}_inv_freq") is the buffer setattr gave: .to(...) is a cast
    assert "inv_freq.astype(jnp.float32)" in result.code
    # the expanded compound expression is named before its statement; the class chosen at
    # run time gets rngs
    named = re.search(r"\n +(arange\d*) = jnp\.arange\(6\)\n", result.code)
    assert named, result.code
    assert (f"nnx.Variable(jnp.broadcast_to({named[1]}, (1, {named[1]}.shape[-1])))"
            in result.code)
    assert "self.mix = mix_class(dim, rngs=rngs)" in result.code
    assert "jnp.cumsum(" in result.code
    # the pair is passed as it is (not (patch_size, patch_size) of a pair)
    assert "kernel_size=patch_size," in result.code and "strides=patch_size," in result.code
    assert "self.stem.patches.projection.kernel.dtype" in result.code


def test_forward_and_gradients_match(tmp_path):
    path = tmp_path / "hf_patterns.py"
    path.write_text(SOURCE)
    r = run_request(VerifyRequest(f"{path}::Model", inputs=("int64[2,6]:11",), grad=True,
                                  atol=1e-5, rtol=1e-5, float64=False))
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, r.mismatch
    # the embedding's gradient was compared (its padding row is zero on both sides)
    assert any(c.startswith("grad embed.weight") for c in r.compared), r.compared
    r = run_request(VerifyRequest(f"{path}::ImageModel", inputs=("float32[2,3,6,6]",),
                                  grad=True, atol=1e-5, rtol=1e-5, float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, r.mismatch


@pytest.mark.parametrize("call, shape", [
    # ViT's and CLIP's position-embedding interpolation: a size, align_corners=False
    ("F.interpolate(x, size=(5, 7), mode='bicubic', align_corners=False)", (2, 3, 4, 4)),
    ("F.interpolate(x, size=(3, 2), mode='bicubic')", (1, 2, 6, 5)),
    ("F.interpolate(x, size=(6, 9), mode='bicubic', align_corners=True)", (1, 2, 4, 5)),
    ("F.interpolate(x, scale_factor=1.5, mode='bicubic')", (1, 2, 4, 6)),
    ("F.interpolate(x, scale_factor=(2, 0.5), mode='bicubic')", (1, 1, 3, 8)),
])
def test_bicubic_interpolation_matches_torch(call, shape):
    """torch's bicubic (a = -0.75, taps clamped at the border), not jax.image's (a = -0.5)."""
    import numpy as np
    from snippets import assert_function_matches_torch

    source = ("import torch\nimport torch.nn.functional as F\n\n\n"
              f"def f(x):\n    return {call}\n")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    result = assert_function_matches_torch(source, x, rtol=1e-5, atol=1e-5)
    assert re.search(r"resize_bicubic\(\s*x,", result.code), result.code
