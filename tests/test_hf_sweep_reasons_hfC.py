"""The transformers sweep's reasons of the JAX build and forward pass, thirteenth round
(docs/transformers-sweep.md): a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified against torch."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

MIXED_LIST = '''
import torch
from torch import nn


class ChannelsFirstNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class Stage(nn.Module):
    """ConvNeXt's stage: a list of a channels-first norm and a strided convolution (or an
    empty list), called in a loop over the list."""

    def __init__(self, cin, cout, stride=2):
        super().__init__()
        if cin != cout or stride > 1:
            self.down = nn.ModuleList([ChannelsFirstNorm(cin),
                                       nn.Conv2d(cin, cout, kernel_size=stride, stride=stride)])
        else:
            self.down = nn.ModuleList()

    def forward(self, x):
        for layer in self.down:
            x = layer(x)
        return x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([Stage(3, 4), Stage(4, 4, stride=1)])

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return x
'''


def test_a_module_list_of_a_channels_first_layer_and_a_convolution(tmp_path: Path) -> None:
    """ConvNeXt / PP-LCNet's "conv_general_dilated feature_group_count must divide lhs
    feature dimension size" (and the "calls a container mixing channels-last and other
    layers" mark): the convolution of a literal ModuleList whose other items run in torch's
    layout is the NCHW Conv2d helper, so the loop over the list runs in torch's layout; the
    outputs and every gradient are torch's. Linen marks it (its nn.Conv is channels-last)."""
    path = tmp_path / "model.py"
    path.write_text(MIXED_LIST)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[1,3,4,4]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4
    linen = convert_source(MIXED_LIST, target="linen")
    assert "TODO(torch2jax): torch.nn.Conv2d among torch-layout layers" in linen.code


MASK_SET = '''
import torch
from torch import nn


class Model(nn.Module):
    """Granite Speech / Kimi-K2.5's placeholder tokens zeroed before the embedding, wav2vec2's
    padded frames zeroed through a mask spread over the features, and a clamp written as a
    masked assignment."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.audio_token_id = 3

    def forward(self, input_ids, attention_mask):
        is_audio_idx = input_ids == self.audio_token_id
        llm_input_ids = input_ids.clone()
        llm_input_ids[is_audio_idx] = 0
        hidden = self.embed(llm_input_ids)
        expand = attention_mask.bool().unsqueeze(-1).repeat(1, 1, hidden.shape[2])
        hidden[~expand] = 0
        hidden[hidden < -0.5] = -0.5
        return hidden
'''


def test_a_boolean_mask_assignment_of_a_number_is_a_where(tmp_path: Path) -> None:
    """Granite Speech, Kimi-K2.5, Higgs Audio's "NonConcreteBooleanIndexError" under jax.jit:
    ``x[mask] = 0`` with a boolean mask (a comparison, ``~`` of a mask, a name bound to one)
    is ``jnp.where``, the mask given ``x``'s trailing axes where it has fewer; the outputs and
    the embedding's gradient are torch's, with placeholder tokens and padding in the inputs."""
    path = tmp_path / "model.py"
    path.write_text(MASK_SET)
    converted = convert_source(MASK_SET)
    assert ".at[" not in converted.code and converted.code.count("jnp.where(") == 3
    r = run_request(VerifyRequest(target=f"{path}::Model", float64=False, inputs=(
        "int64[2,7]:6", "attention_mask=int64[2,7]:2")))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4
