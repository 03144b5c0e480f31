"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep's weight transfer, each on a model of our own written that way, converted, built and
verified against torch (outputs and gradients, in float64, the pass that decides: the
float32 pass would double the tests' time).

* a subclass of ``nn.GroupNorm`` with its own forward, ``F.group_norm`` over its own attributes
  (timm's ``GroupNorm1``: ``super().__init__(1, num_channels, **kwargs)``, metaformer's norm):
  it derives from ``nnx.GroupNorm``, the call is the base's on channels-last input, so the
  weight and bias transfer to its scale and bias (it was kept a torch subclass, "norm1 has no
  'scale'"), built directly and through a ``norm_layer`` default argument;
* ``F.group_norm`` itself on a module's own parameters: the ``torch_group_norm`` helper;
* an ``nn.LSTM`` built with ``bias=bias``, a constructor parameter whose default ``True`` no
  construction in the file overrides, in a subclass whose base holds an identity in its place
  (sequencer's ``LSTM2d(RNN2dBase)``, bidirectional, over the rows and the columns of an NHWC
  map): the LSTM is translated (it was kept torch's, "bias=False ... always has trainable
  biases", and none of its weights transferred); a class built with ``bias=False`` keeps it
  marked.
"""

from __future__ import annotations

import textwrap

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

GROUP_NORM = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class GroupNorm1(nn.GroupNorm):
        def __init__(self, num_channels, **kwargs):
            super().__init__(1, num_channels, **kwargs)
            self.fast_norm = False

        def forward(self, x):
            return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


    class Scale(nn.Module):
        def __init__(self, dim, init_value=1.0):
            super().__init__()
            self.scale = nn.Parameter(init_value * torch.ones(dim))

        def forward(self, x):
            return x * self.scale.view(-1, 1, 1)


    class Block(nn.Module):
        def __init__(self, dim, norm_layer=GroupNorm1):
            super().__init__()
            self.norm1 = norm_layer(dim)
            self.conv = nn.Conv2d(dim, dim, 3, padding=1)
            self.res_scale1 = Scale(dim, 0.5)
            self.norm2 = GroupNorm1(dim)
            self.gamma = nn.Parameter(torch.randn(dim))
            self.beta = nn.Parameter(torch.randn(dim))

        def forward(self, x):
            x = self.res_scale1(x) + self.conv(self.norm1(x))
            x = self.norm2(x)
            return F.group_norm(x, 2, self.gamma, self.beta, 1e-5)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)
            self.blocks = nn.Sequential(Block(8), Block(8))

        def forward(self, x):
            return self.blocks(self.stem(x)).mean((2, 3))
''')


def test_group_norm_subclass_and_functional(tmp_path):
    (tmp_path / "model.py").write_text(GROUP_NORM)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,7,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


LSTM_2D = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class RNNIdentity(nn.Module):
        def forward(self, x):
            return x, None


    class RNN2dBase(nn.Module):
        def __init__(self, input_size, hidden_size, num_layers=1, bias=True, bidirectional=True):
            super().__init__()
            self.output_size = 2 * hidden_size if bidirectional else hidden_size
            self.fc = nn.Linear(2 * self.output_size, input_size)
            self.rnn_v = RNNIdentity()
            self.rnn_h = RNNIdentity()

        def forward(self, x):
            B, H, W, C = x.shape
            v = x.permute(0, 2, 1, 3).reshape(-1, H, C)
            v, _ = self.rnn_v(v)
            v = v.reshape(B, W, H, -1).permute(0, 2, 1, 3)
            h = x.reshape(-1, W, C)
            h, _ = self.rnn_h(h)
            h = h.reshape(B, H, W, -1)
            return self.fc(torch.cat([v, h], dim=-1))


    class LSTM2d(RNN2dBase):
        def __init__(self, input_size, hidden_size, num_layers=1, bias=True, bidirectional=True):
            super().__init__(input_size, hidden_size, num_layers, bias, bidirectional)
            self.rnn_v = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True,
                                 bias=bias, bidirectional=bidirectional)
            self.rnn_h = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True,
                                 bias=bias, bidirectional=bidirectional)


    class Net(nn.Module):
        def __init__(self, layers=1):
            super().__init__()
            self.rnn = LSTM2d(4, 3, num_layers=layers)
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.rnn(x)).mean((1, 2))
''')


def test_lstm_bias_from_constructor_parameter(tmp_path):
    (tmp_path / "model.py").write_text(LSTM_2D)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,5,4]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


def test_lstm_bias_false_somewhere_stays_marked(tmp_path):
    source = LSTM_2D.replace("LSTM2d(4, 3, num_layers=layers)",
                             "LSTM2d(4, 3, num_layers=layers, bias=False)")
    out = convert_source(source)
    assert "bias=False): the converted LSTM cell" in out.code
