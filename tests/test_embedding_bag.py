"""nn.EmbeddingBag (the text classification tutorial's model): the EmbeddingBag helper class
(passes/helpers.py) verified against torch, outputs and gradients, in each mode, over a flat
input with offsets (an empty bag among them) and over a 2-d input with a padding_idx."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = textwrap.dedent("""
    import torch
    from torch import nn


    class TextClassificationModel(nn.Module):
        def __init__(self, vocab_size, embed_dim, num_class, mode="mean"):
            super(TextClassificationModel, self).__init__()
            self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False, mode=mode)
            self.fc = nn.Linear(embed_dim, num_class)

        def forward(self, text, offsets):
            embedded = self.embedding(text, offsets)
            return self.fc(embedded)


    class PaddedBags(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(20, 6, mode="mean", padding_idx=0)

        def forward(self, x):
            return self.bag(x).tanh()
""")
# bag 1 is empty; each side's array (the setup runs in the torch file and in the converted one)
OFFSETS = ("import numpy as np\nOFFSETS = (jnp.asarray if 'jnp' in globals() else "
           "torch.as_tensor)(np.array([0, 3, 3, 7, 9]))")


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bags") / "text_models.py"
    path.write_text(SOURCE)
    return path


def test_embedding_bag_is_the_helper_class():
    code = convert_source(SOURCE, path="m.py").code
    assert "class EmbeddingBag(nnx.Embed):" in code
    assert "EmbeddingBag(vocab_size, embed_dim, mode=mode, rngs=rngs)" in code
    assert "TODO(torch2jax)" not in code
    linen = convert_source(SOURCE, path="m.py", target="linen").code
    assert "# TODO(torch2jax): torch.nn.EmbeddingBag has no linen translation" in linen


@pytest.mark.parametrize("mode", ["mean", "sum", "max"])
def test_bags_over_offsets_match_torch(source_file, mode):
    result = run_request(VerifyRequest(
        f"{source_file}::TextClassificationModel", build=f"TextClassificationModel(30, 8, 3, "
        f"{mode!r})", inputs=("int64[12]:30",), input_exprs=("OFFSETS",),
        setup=OFFSETS, grad=True,
        atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert any(c.startswith("grad ") for c in result.compared)


def test_bags_of_rows_leave_out_the_padding(source_file):
    # ids in [0, 4): about a quarter of them are the padding row, left out of each mean
    result = run_request(VerifyRequest(f"{source_file}::PaddedBags", inputs=("int64[3,5]:4",),
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_a_one_element_draw_converts_to_a_number(tmp_path):
    # the tutorial-style synthetic data: int(torch.randint(0, n, (1,), generator=g)); torch
    # converts any one-element tensor, JAX a 0-d array only (it raised TypeError, unmarked)
    import runpy

    source = textwrap.dedent("""
        import torch


        def make(n, seed=0):
            g = torch.Generator().manual_seed(seed)
            out = []
            for _ in range(n):
                label = int(torch.randint(0, 4, (1,), generator=g))
                scale = float(torch.rand(1, generator=g))
                out.append((label, scale))
            return out


        DATA = make(5)
    """)
    code = convert_source(source, path="data.py").code
    assert "TODO(torch2jax)" not in code and ".item()" in code
    path = tmp_path / "data.py"
    path.write_text(code)
    data = runpy.run_path(str(path))["DATA"]
    assert len(data) == 5
    assert all(type(a) is int and 0 <= a < 4 and type(b) is float and 0 <= b < 1
               for a, b in data)
