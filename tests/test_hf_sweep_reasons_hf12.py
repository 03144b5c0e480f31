"""Converter reasons of the transformers sweep's JAX forward under jit (docs/transformers-sweep.md,
the twelfth round: torch's tensor API left on a traced value), each a general rule on a module
of our own in the modeling files' shape: converted, built with torch's weights and verified
against torch (outputs and every parameter's gradient)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

SWEEP_SHAPES = '''
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


def hard_softmax(logits, dim):
    y_soft = logits.softmax(dim)
    index = y_soft.max(dim, keepdim=True)[1]
    y_hard = torch.zeros_like(logits, memory_format=torch.legacy_contiguous_format).scatter_(
        dim, index, 1.0)
    return y_hard - y_soft.detach() + y_soft


def scaled_kernel(query, scale):
    initial_dtype = query.dtype
    query = query.to(torch.float32) * scale
    return query.to(initial_dtype)


KERNELS = {"scaled": scaled_kernel}


class MeanScaler(nn.Module):
    def __init__(self):
        super().__init__()
        self.dim = 1
        self.keepdim = True

    def forward(self, data, observed_indicator):
        denominator = observed_indicator.sum(self.dim, keepdim=self.keepdim)
        denominator = denominator.clamp_min(1.0)
        loc = (data * observed_indicator).sum(self.dim, keepdim=self.keepdim) / denominator
        return data - loc


class Model(nn.Module):
    def __init__(self, width=6):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.weight = nn.Parameter(torch.randn(4, width))
        self.scaler = MeanScaler()

    def forward(self, x):
        h = self.proj(x)
        positions = torch.arange(x.shape[1])
        first = positions[0] == 0
        if not torch.jit.is_scripting() and first:
            logger.warning("the first position")
        if (h > 100.0).any():
            logger.warning_once("large activations")
        if h.is_cuda and h.dtype == torch.float16:
            logits = torch.mm(h.reshape(-1, h.shape[-1]), self.weight.t())
        else:
            logits = nn.functional.linear(h.reshape(-1, h.shape[-1]).float(), self.weight)
        hard = hard_softmax(logits, -1) + hard_softmax(logits.reshape(x.shape[0], -1, 4), 1).reshape(-1, 4)
        scaled = self.scaler(h, (x > 0).float())
        capped = torch.clamp_max(scaled, 0.5) + torch.clamp_min(h, -0.25)
        patches = h.unfold(dimension=-2, size=3, step=2)  # (batch, windows, width, 3)
        picked = logits.gather(-1, torch.topk(logits, 2, dim=-1).indices)
        tops = torch.sum(logits.topk(2, dim=0).values) + torch.sum(picked)
        return (hard.sum(-1).reshape(x.shape[:-1]) + capped.mean(-1)
                + patches.pow(2).sum(dim=(1, 2, 3))[:, None] + tops + torch.mean(KERNELS["scaled"](h, 2.0), -1))
'''


def test_the_tensor_api_left_on_a_traced_value(tmp_path: Path) -> None:
    """PatchTST's and PatchTSMixer's ``denominator.clamp_min(1.0)`` (and torch.clamp_min /
    torch.clamp_max), Kolibri's ``hidden_states.is_cuda`` in the test of a GPU fast path (the
    program's backend, as torch.cuda.is_available()), GroupViT's hard softmax
    ``torch.zeros_like(logits).scatter_(dim, index, 1.0)`` with the dim passed down (a
    Python int where traced), PatchTST's patches ``x.unfold(dimension=-2, size=p, step=s)``:
    each was left as torch's and raised on the traced array. BailingHybrid's
    ``x.to(initial_dtype)`` in a kernel the analysis cannot follow (a dtype's name, not another
    tensor's). DeepSeek-V3.2's ``torch.topk(scores, k, dim=-1).indices`` (jax.lax.top_k
    returns a list). And CSM's ``if ... and
    input_ids_are_first_codebook: logger.warning(...)``: an ``if`` that only logs, on a traced
    test, goes."""
    path = tmp_path / "model.py"
    path.write_text(SWEEP_SHAPES)
    # the float32 pass (logits and every gradient) alone: the rules are dtype-free, CI's time
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,5,6]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_only_a_warning_on_a_traced_test_goes() -> None:
    """The guards that Python answers stay: ``x is None``, a shape's comparison, a config's."""
    out = convert_source('''
import logging

from torch import nn

logger = logging.getLogger(__name__)


class Checks(nn.Module):
    def __init__(self):
        super().__init__()
        self.limit = 3

    def forward(self, h, mask=None):
        if mask is None:
            logger.warning("no mask")
        if h.ndim == 3 and self.limit > 2:
            logger.warning_once("three axes")
        if (h > 100.0).any():
            logger.warning_once("large activations")
        if (h < 0).all():
            logger.info("all negative")
        elif h.ndim == 2:
            logger.info("two axes")
        return h
''', path="checks.py").code
    assert 'logger.warning("no mask")' in out and 'logger.warning_once("three axes")' in out
    assert 'logger.info("all negative")' in out  # an if with an else stays as written
    assert "large activations" not in out
    assert 'logger.info("two axes")' in out


def test_a_causal_mask_made_without_the_skip_is_torchs() -> None:
    """DeepSeek-V3.2's, AXK2's indexer reads the mask it asks for with
    ``allow_is_causal_skip=False``: sdpa's plain causal mask is made then, not left to sdpa."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask as torch_mask

    from torch2jax.transformers_runtime import create_causal_mask

    config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_hidden_layers=1,
                         intermediate_size=8, vocab_size=16)
    config._attn_implementation = "sdpa"
    for skip in (True, False):
        want = torch_mask(config=config, inputs_embeds=torch.zeros(2, 5, 8), attention_mask=None,
                          cache=None, allow_is_causal_skip=skip)
        got = create_causal_mask(config, jnp.zeros((2, 5, 8)), None, None,
                                 allow_is_causal_skip=skip)
        assert (want is None) == (got is None) == skip
        if want is not None:
            np.testing.assert_array_equal(np.asarray(got), want.numpy())
