"""Converter reasons of the transformers sweep's JAX forward (docs/transformers-sweep.md, the
tenth round), each a general rule on a module of our own in the modeling files' shape:
converted, built with torch's weights and verified against torch (outputs and every
parameter's gradient)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from torch2jax.analysis.tensor_calls import tensor_result, torch_only_call
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request


def _verify(tmp_path: Path, source: str, target: str, *inputs: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    # the float32 pass (logits and every gradient) alone: the rules are dtype-free, CI's time
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs, float64=False))


SWEEP_SHAPES = '''
import torch
from torch import nn


class ChannelLayerNorm(nn.LayerNorm):
    def __init__(self, hidden_size, eps=1e-12):
        nn.LayerNorm.__init__(self, normalized_shape=hidden_size, eps=eps)

    def forward(self, x):
        x = x.permute(0, 2, 1)
        x = nn.LayerNorm.forward(self, x)
        return x.permute(0, 2, 1)


class Out:
    def __init__(self, scores, context):
        self.scores, self.context = scores, context


class Store:
    def __init__(self):
        self.keys = None


class Attention(nn.Module):
    def __init__(self, width=8, heads=2):
        super().__init__()
        self.heads, self.size = heads, width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)

    def forward(self, x, store=None):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.size).transpose(1, 2)
        if store is not None and store.keys is not None:
            k = store.keys
        else:
            k = self.k(x).view(b, t, self.heads, self.size).transpose(1, 2)
        a = torch.matmul(q, k.transpose(2, 3)).softmax(-1)
        dtype = q.dtype
        c = torch.matmul(q, k.transpose(-1, -2).to(dtype))
        return Out(a, c)


class Model(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.attn = Attention(width)
        self.head = nn.Linear(10, 3)  # two heads of 5 keys
        self.pre = nn.Linear(width, width)
        self.glu = nn.GLU(dim=1)
        self.kernel = 4
        self.norm = ChannelLayerNorm(width)
        self.block = []
        for _ in range(2):
            self.block += [nn.Linear(width, width)]
        self.block = nn.ModuleList(self.block)

    def forward(self, x):
        outputs = self.attn(x)
        tokens = outputs.scores[:, :, 1:]
        context = outputs.context.to(x.dtype)
        shape = context.size()[:-2] + (context.size(-1) * context.size(-2),)
        context = context.reshape(shape)
        pooled = torch.cat([tokens.mean(dim=(1, 2)), tokens.amax(dim=(1, 2))], dim=-1)
        gated = nn.functional.glu(self.glu(self.pre(x).transpose(1, 2)).transpose(1, 2))
        gated = gated * self.norm(x.transpose(1, 2))[:, 2:4].transpose(1, 2)
        for module in self.block:
            x = module.forward(x)
        pad_total = self.kernel - 1
        pad_beg = pad_total // 2
        pad = nn.ConstantPad1d((pad_beg, pad_total - pad_beg), 0.5)
        gated = gated * pad(x.transpose(1, 2))[:, :2, 2:7].transpose(1, 2)
        return (self.head(pooled) + context.sum(dim=-1, keepdim=True).mean(dim=(1, 2))[:, None]
                + gated.mean(dim=(1, 2))[:, None] + x.mean(dim=(1, 2))[:, None])
'''


def test_the_forward_reasons_of_the_tenth_round(tmp_path) -> None:
    """RoFormer's and XLM's ``k.transpose(2, 3)`` on keys bound from a cache in one branch, MRA's
    ``context_layer.size()[:-2]`` on a function's result, ProphetNet's ``mask.to(x.dtype)``,
    Falcon-Mamba's ``out.transpose(1, 2).to(dtype)``,
    Dinov2's ``patch_tokens.mean(dim=1)`` on a model output's field: numpy's and JAX's methods
    of those names take no ``dim`` and permute a 2-D array's axes, so the calls are torch's.
    And the conformers' ``nn.GLU(dim=1)`` and ``nn.functional.glu``, CANINE's
    ``nn.ConstantPad1d((pad_beg, pad_end), 0)`` built in the forward from computed sizes,
    SqueezeBERT's ``nn.LayerNorm.__init__(self, ...)`` / ``nn.LayerNorm.forward(self, x)`` in
    its subclass of the layer, DAC's ``self.block = []`` grown by ``+=`` and then wrapped in
    ``nn.ModuleList(self.block)``, and SqueezeBERT's ``layer.forward(h)`` over it."""
    r = _verify(tmp_path, SWEEP_SHAPES, "Model", "float32[2,5,8]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


@pytest.mark.parametrize(("call", "torch_only"), [
    ("x.transpose(2, 3)", True),  # numpy raises on it
    ("x.transpose(-1, -2)", True),  # numpy's 2-D swap, as torch's
    ("x.transpose(1, 0)", True),
    ("x.transpose(0, 1)", False),  # numpy keeps a 2-D array's axes, torch swaps them
    ("x.transpose(-2, -1)", False),
    ("x.transpose(a, b)", False),
    ("x.mean(dim=1)", True),
    ("x.sum(-1, keepdim=True)", True),
    ("x.mean(axis=1)", False),
    ("x.mean(1)", False),
    ("x.flatten(1)", True),
    ("x.flatten()", False),
    ("x.split(2, dim=-1)", True),
    ("x.split(*args, dim=-1)", False),
    ("x.size()", True),  # numpy's size is a number
    ("x.size(-1)", True),
    ("x.size(n=2)", False),
    ("x.to(y.dtype)", True),
    ("x.to(torch.long)", True),
    ("x.to(dtype=d)", True),
    ("x.to(device)", False),  # a BatchEncoding's .to too
])
def test_which_arguments_are_a_tensors(call: str, torch_only: bool) -> None:
    node = cst.parse_expression(call)
    assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
    assert torch_only_call(node, node.func.attr.value) is torch_only


def test_a_tensor_methods_result_is_a_tensor() -> None:
    assert tensor_result(cst.parse_expression("x.transpose(1, 2)"))
    assert tensor_result(cst.parse_expression("x.mean(dim=1)"))
    assert not tensor_result(cst.parse_expression("x.size()"))  # a torch.Size
    assert not tensor_result(cst.parse_expression("x.transpose(0, 1)"))
