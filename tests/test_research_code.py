"""Research model code as it is written (issue 34): einops layers and functions, the value
kinds that flow through ``map(lambda ...)`` and comprehensions over ``chunk`` / ``split`` /
``unbind``, ... Each module below is converted, built and verified against torch (forward and
every parameter's gradient, ``torch2jax.verify``).
"""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("einops")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = textwrap.dedent('''
    import einops
    import torch
    import torch.nn as nn
    from einops import rearrange


    class SplitHeads(nn.Module):
        """The heads split three ways: map(lambda) over chunk, a comprehension over split,
        unbind of a rearranged tensor."""

        def __init__(self, dim=8, heads=2):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, dim * 3)

        def forward(self, x):
            qkv = self.qkv(x)
            q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h=self.heads),
                          qkv.chunk(3, dim=-1))
            q2, k2, v2 = [einops.rearrange(t, 'b n (h d) -> b h n d', h=self.heads)
                          for t in qkv.split(8, dim=-1)]
            q3, k3, v3 = rearrange(qkv, 'b n (three h d) -> three b h n d', three=3,
                                   h=self.heads).unbind(0)
            a = (q @ k.transpose(-1, -2)).softmax(dim=-1) @ v
            b = (q2 @ k2.transpose(-1, -2)).softmax(dim=-1) @ v2
            c = (q3 @ k3.transpose(-1, -2)).softmax(dim=-1) @ v3
            return (a + b * 2 + c * 3).sum(dim=1)
''')

MODELS = {
    "SplitHeads": "float32[2,5,8]",
}


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("research") / "research_models.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def converted():
    return convert_source(SOURCE, path="research_models.py")


def test_kinds_flow_through_map_comprehensions_and_unbind(converted):
    # k, k2, k3 were "not known to be a tensor": their .transpose was left as torch's
    assert not [d for d in converted.diagnostics if d.rule == "unknown-receiver"], \
        converted.diagnostics
    for name in ("k", "k2", "k3"):
        assert f"jnp.swapaxes({name}, -1, -2)" in converted.code


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_match(source_file, name):
    result = run_request(VerifyRequest(f"{source_file}::{name}", inputs=(MODELS[name],),
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.todos == 0
    assert any(c.startswith("grad ") for c in result.compared)
