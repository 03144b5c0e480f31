"""General rules the transformers sweep found missing (docs/transformers-sweep.md), each on a
module of our own in the shape the modeling files write it: converted, built with torch's
weights and verified against torch (outputs and gradients)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

NORMS = '''
import torch
from torch import nn


class Contrastive(nn.Module):
    """OWL-ViT's and CLIP-like heads: embeddings divided by their norms, torch.linalg's."""

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(6, 8)
        self.text = nn.Linear(6, 8)

    def forward(self, x, y):
        i = self.image(x)
        t = self.text(y)
        i = i / torch.linalg.norm(i, ord=2, dim=-1, keepdim=True)
        t = t / (torch.linalg.vector_norm(t, dim=[-1], keepdim=True) + 1e-6)
        scale = torch.norm(i, p=2, dim=-1) + torch.linalg.norm(t)
        return (i @ t.T) * scale[:, None]
'''


def _verify(tmp_path: Path, source: str, target: str, *inputs: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs))


def test_linalg_norms_verify(tmp_path) -> None:
    r = _verify(tmp_path, NORMS, "Contrastive", "float32[3,6]", "float32[4,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_a_state_space_cache_flattens_to_its_states() -> None:
    """Mamba's and the hybrids' caches hold LinearAttentionLayers (conv and recurrent states,
    no keys): verify compares those states instead of failing on the missing keys."""
    import types

    import numpy as np

    from torch2jax.verify.common import flatten_output

    conv, rec = np.zeros((1, 4, 3)), np.ones((1, 4, 2))
    state = types.SimpleNamespace(conv_states={0: conv}, recurrent_states={0: rec})
    attention = types.SimpleNamespace(keys=np.ones(2), values=np.zeros(2))
    cache = type("DynamicCache", (), {"layers": [state, attention]})()
    leaves = dict(flatten_output(cache))
    assert list(leaves) == ["output[0]['conv_states'][0]", "output[0]['recurrent_states'][0]",
                            "output[1]['keys']", "output[1]['values']"]
    assert leaves["output[0]['recurrent_states'][0]"] is rec
