"""The layers the equinox and linen targets translate beyond the model fixtures'
(MultiheadAttention, LSTM and LSTMCell, GRU and GRUCell, GroupNorm, RMSNorm, ConvTranspose2d,
adaptive pooling whose size does not divide, a Linear's weight read in forward code): small torch
modules converted with ``--target equinox`` and ``--target linen``, no TODO, then
torch2jax.verify on each (the torch weights transferred, outputs and every parameter's
gradient compared, float32 on CPU, at the NNX tolerances). What each layer becomes:
docs/equinox.md, docs/linen-output.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request
from torch2jax.weights import apply_layout, invert_layout

SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.fc(y)


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.register_buffer("causal", torch.triu(torch.ones(5, 5, dtype=torch.bool), 1))

    def forward(self, x, pad):
        causal = self.causal
        padding = pad < -0.5
        y, _ = self.attn(x, x, x, attn_mask=causal, key_padding_mask=padding, need_weights=False)
        return y


class Cross(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, kdim=8, vdim=8, batch_first=True)

    def forward(self, q, kv):
        return self.attn(q, kv, kv, need_weights=False)[0]


class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 6, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y)


class Last(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 6, batch_first=True)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        return self.fc(h[-1]) + c[-1].sum(-1, keepdim=True) + y.mean(1)[:, :3]


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(5, 6)
        self.cell2 = nn.LSTMCell(5, 6)

    def forward(self, x):
        h, c = self.cell(x)
        h2, c2 = self.cell2(x, (h, c))
        return h2 * c2


class GRURec(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 6, batch_first=True)
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        y, h = self.gru(x)
        return self.fc(h[-1]) + y.mean(1)[:, :2]


class GRUOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(5, 6, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


class GRUCells(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(5, 6)
        self.cell2 = nn.GRUCell(5, 6)

    def forward(self, x):
        h = self.cell(x)
        return self.cell2(x, h)


class Vision(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(4, 8)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.pool = nn.AdaptiveAvgPool2d((3, 5))
        self.fc = nn.Linear(4 * 15, 2)

    def forward(self, x):
        x = torch.relu(self.gn(self.conv(x)))
        x = self.pool(self.up(x))
        return self.fc(x.flatten(1))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.out = nn.Linear(6, 4)

    def forward(self, x):
        h = torch.tanh(F.linear(x, self.fc.weight, self.fc.bias))
        return h @ self.out.weight.T


class TiedEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.proj = nn.Linear(6, 6)

    def forward(self, idx):
        h = self.proj(self.emb(idx))
        return h @ self.emb.weight.T + F.linear(h, self.proj.weight).sum(-1, keepdim=True)


class OptBiasNorm(nn.Module):
    # nanoGPT's LayerNorm: a parameter under the name of a constructor argument, made only
    # when it is true (linen: the attribute bias_param, the parameter's path still "bias")
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, ndim))
        self.bias = nn.Parameter(torch.linspace(-0.3, 0.2, ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class Rms(nn.Module):
    def __init__(self):
        super().__init__()
        self.with_bias = OptBiasNorm(6, True)
        self.without = OptBiasNorm(6, False)
        self.fc = nn.Linear(6, 8)
        self.norm = nn.RMSNorm(8, eps=1e-6)
        self.bare = nn.RMSNorm(8, eps=None, elementwise_affine=False)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        # small activations: an epsilon off by 10x (flax's or equinox's default) shows
        x = self.without(self.with_bias(x))
        return self.out(self.bare(self.norm(0.01 * self.fc(x))))


class Sizes(nn.Module):
    def __init__(self, sizes=[8, 6]):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, sizes[0]), nn.Linear(sizes[0], sizes[1])])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x
'''

CASES = {
    "Attn": ["float32[2,5,16]"],
    "Masked": ["float32[2,5,16]", "float32[2,5]"],
    "Cross": ["float32[2,5,16]", "float32[2,4,8]"],
    "Rec": ["float32[2,7,5]"],
    "Last": ["float32[2,7,5]"],
    "Cell": ["float32[3,5]"],
    "GRURec": ["float32[2,7,5]"],
    "GRUOut": ["float32[2,7,5]"],
    "GRUCells": ["float32[3,5]"],
    "Vision": ["float32[2,3,6,6]"],
    "Tied": ["float32[3,8]"],
    "TiedEmb": ["int64[4]:10"],
    "Sizes": ["float32[3,4]"],
    "Rms": ["float32[3,6]"],
}
TARGETS = ("equinox", "linen")


@pytest.fixture(scope="module")
def source_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("layers") / "layers.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module", params=TARGETS)
def converted(request) -> tuple[str, str]:
    result = convert_source(SOURCE, path="layers.py", target=request.param)
    assert [d for d in result.diagnostics if d.severity == "error"] == [], result.code
    assert "TODO" not in result.code and "nnx" not in result.code
    return request.param, result.code


def test_equinox_and_linen_forms(converted) -> None:
    target, code = converted
    if target == "equinox":
        # equinox's attention biases are off by default, torch's on
        assert "eqx.nn.MultiheadAttention(4, 16, use_query_bias=True, use_key_bias=True, " \
            "use_value_bias=True, use_output_bias=True, key=key1)" in code
        assert "mask=jnp.broadcast_to(jnp.logical_and(~causal, ~padding), " \
            "(x.shape[0], x.shape[0]))" in code
        # torch's four LSTM tensors in a helper cell (eqx.nn.LSTMCell sums the biases)
        assert "self.lstm = TorchLSTMCell(5, 6, key=key1)" in code
        assert "class TorchLSTMCell(eqx.Module)" in code
        assert "y, (h, c) = lstm_scan(self.lstm, x)" in code and "jax.lax.scan" in code
        assert "h2, c2 = self.cell2(x, (h, c))" in code
        # torch's GRU parameters and initialisation in a helper cell, scanned by gru_scan
        assert "self.gru = TorchGRUCell(5, 6, key=key1)" in code
        assert "class TorchGRUCell(eqx.Module)" in code
        assert "y, h = gru_scan(self.gru, x)" in code
        assert "h = self.cell(x, jnp.zeros(self.cell.hidden_size, x.dtype))" in code
        assert "self.gn = eqx.nn.GroupNorm(4, 8, eps=1e-05)" in code
        assert "eqx.nn.ConvTranspose2d(8, 4, kernel_size=(3, 3), stride=(2, 2), " \
            "padding=(1, 1), output_padding=(1, 1), key=key2)" in code
        # equinox's AdaptiveAvgPool bins differently: torch's binning helper per example
        assert "lambda x: adaptive_avg_pool(x, (3, 5))" in code
        assert "eqx.nn.AdaptiveAvgPool" not in code
        # equinox's Linear weight is torch's (out, in)
        assert "x @ self.fc.weight.T + self.fc.bias" in code
        # torch's RMSNorm has no bias, equinox's does unless use_bias=False
        assert "self.norm = eqx.nn.RMSNorm(8, eps=1e-6, use_bias=False)" in code
        assert "self.bare = eqx.nn.RMSNorm(8, eps=float(jnp.finfo(jnp.float32).eps), " \
            "use_weight=False, use_bias=False)" in code
        assert "return h @ self.out.weight.T\n" in code
    else:
        assert "self.attn = nn.MultiHeadDotProductAttention(num_heads=4)" in code
        # an nn.OptimizedLSTMCell with fused dense_i / dense_h, each biased (torch's b_ih, b_hh)
        assert "self.lstm = nn.RNN(TorchLSTMCell(6))" in code
        assert "self.cell = TorchLSTMCell(6)" in code and ".features)" in code
        assert "class TorchLSTMCell(nn.OptimizedLSTMCell)" in code
        # an nn.GRUCell with fused, biased dense_i / dense_h (torch's b_hn)
        assert "self.gru = nn.RNN(TorchGRUCell(6))" in code
        assert "class TorchGRUCell(nn.GRUCell)" in code
        assert "self.gn = nn.GroupNorm(num_groups=4, epsilon=1e-05)" in code
        assert "self.norm = nn.RMSNorm(epsilon=1e-6)" in code
        assert "self.bare = nn.RMSNorm(epsilon=float(jnp.finfo(jnp.float32).eps), " \
            "use_scale=False)" in code
        assert "nn.ConvTranspose(\n            4,\n            kernel_size=(3, 3),\n" \
            "            strides=(2, 2),\n            padding=((1, 2), (1, 2)),\n" \
            "            transpose_kernel=True,\n        )" in code
        # nn.Dense makes its kernel when called: a Linear whose weight is read is made in setup
        assert "self.fc = ReadableDense(8, 6)" in code and "class ReadableDense" in code
        # a list default is no dataclass field default, and not hashable
        assert "sizes: tuple = (8, 6)" in code
        assert 'self.bias_param = self.param("bias", lambda key: jnp.linspace(-0.3, stop=0.2, ' \
            'num=self.ndim)) if self.bias else None' in code


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", CASES)
def test_layer_matches_torch(source_file: Path, target: str, name: str) -> None:
    result = run_request(VerifyRequest(f"{source_file}::{name}", inputs=tuple(CASES[name]),
                                       jax_target=target, grad=True, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5, result.to_json()
    assert result.grad_max_abs_diff is not None and result.grad_max_abs_diff <= 1e-5
    assert result.passed, result.mismatch


def test_rms_norm_nnx_matches_torch(source_file: Path) -> None:
    """torch.nn.RMSNorm (eps=1e-6, and eps=None without weight) on the NNX target, which the
    two above do not run: outputs and gradients against torch."""
    result = run_request(VerifyRequest(f"{source_file}::Rms", inputs=tuple(CASES["Rms"]),
                                       jax_target="nnx", grad=True, float64=False))
    assert result.error is None and result.todos == 0, result.to_json()
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5, result.to_json()
    assert result.passed, result.mismatch


BATCH_SECOND = '''
import torch
import torch.nn as nn


class Seq(nn.Module):
    def __init__(self, tie=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4)
        self.lstm = nn.LSTM(16, 6)
        self.gru = nn.GRU(6, 6)
        self.deep = nn.LSTM(6, 6, 2, dropout=0.2)
        self.emb = nn.Embedding(10, 6)
        self.head = nn.Linear(6, 10)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, x, h0, tokens):
        y, _ = self.attn(x, x, x, need_weights=False)
        out, _ = self.lstm(y)
        out, h = self.gru(out, h0)
        deep, (h2, c2) = self.deep(out + self.emb(tokens),
                                   (torch.cat((h, h)), torch.cat((h0, h))))
        return self.head(out * h[-1] + deep * c2[-1] + h2.sum(0))
'''


def test_equinox_marks_sequence_layers_with_the_batch_on_axis_1() -> None:
    """torch's (L, N, E) layout (batch_first=False) puts the batch on axis 1; the equinox model
    is mapped over axis 0: marked, never mistranslated."""
    result = convert_source(BATCH_SECOND, target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("MultiheadAttention with batch_first=False" in e for e in errors), errors
    assert any("LSTM with batch_first=False" in e for e in errors), errors
    assert any("GRU with batch_first=False" in e for e in errors), errors


def test_linen_sequence_layers_with_the_batch_on_axis_1(tmp_path: Path) -> None:
    """linen keeps torch's (L, N, E) layout (time_major=True): the GRU's initial state too.
    An LSTM of two layers with dropout between them is the TorchLSTM helper written for linen
    (layers_0, layers_1: nn.RNN(TorchLSTMCell)), called as torch's with (h_0, c_0),
    torch's layer k weights in layers_k; a Linear head with a bias tied to an Embedding
    under a constructor condition is the TiedDense helper (issue 32: the corpus word_lm)."""
    path = tmp_path / "seq.py"
    path.write_text(BATCH_SECOND)
    code = convert_source(BATCH_SECOND, target="linen").code
    assert "self.deep = TorchLSTM(6, 2, dropout=0.2, deterministic=not self.train)" in code
    # a head with a bias tied under a constructor condition: nn.Dense's variables, the
    # table passed as its kernel when tied
    assert "self.head = TiedDense(10)" in code
    assert "self.emb.embedding if self.tie else None,\n" in code
    result = run_request(VerifyRequest(f"{path}::Seq", inputs=("float32[7,2,16]",
                                                                "float32[1,2,6]",
                                                                "int64[7,2]:10"),
                                       jax_target="linen", grad=True, float64=False))
    assert result.error is None, result.error
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5, result.to_json()
    assert result.passed, result.mismatch


def test_linen_gpt_module_is_hashable_and_jits_static() -> None:
    """The GPT fixture's linen module holds its config: the dataclass is frozen, so the module
    hashes and ``jax.jit(model.apply, static_argnums=0)`` works."""
    import jax
    import jax.numpy as jnp

    code = convert_source((Path(__file__).resolve().parent.parent / "fixtures" / "models" /
                           "gpt.py").read_text(), target="linen").code
    assert "@dataclass(frozen=True)\nclass GPTConfig:" in code
    ns: dict = {}
    exec(compile(code, "gpt_linen.py", "exec"), ns)  # noqa: S102 - the converter's output
    model = ns["GPT"](ns["GPTConfig"]())
    x = jnp.zeros((2, 16), jnp.int32)
    variables = model.init(jax.random.key(0), x)
    out = jax.jit(lambda mdl, v, x: mdl.apply(v, x), static_argnums=0)(model, variables, x)
    assert out.shape == (2, 16, 128)


def test_transposed_conv_layout_is_its_own_inverse() -> None:
    """torch's ConvTranspose weight (in, out, *k) -> equinox's (out, in, *k), flipped."""
    w = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    eqx_w = apply_layout(w, "flip_swap")
    assert eqx_w.shape == (3, 2, 4, 5)
    np.testing.assert_array_equal(eqx_w[1, 0], w[0, 1, ::-1, ::-1])
    np.testing.assert_array_equal(invert_layout(eqx_w, "flip_swap"), w)

