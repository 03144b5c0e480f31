"""The pieces of the word-level LSTM language model (issue 28, tests/corpus/word_lm), each as a
general rule on a small program of our own in that shape: converted, run, and compared with
torch's numbers.

* ``Tensor.narrow`` / ``torch.narrow``: a slice (``jax.lax.dynamic_slice_in_dim``);
* a stacked ``nn.LSTM`` (``num_layers`` not the literal 1, dropout between layers): the
  ``TorchLSTM`` helper, called as torch's LSTM;
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from torch2jax.convert import convert_source


def _convert(source: str) -> dict:
    result = convert_source(source, path="script.py")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "torch" not in {line.split()[1].split(".")[0] for line in result.code.splitlines()
                           if line.startswith("import ")}, result.code
    scope: dict = {"__name__": "converted"}
    exec(compile(result.code, "converted.py", "exec"), scope)
    return scope


NARROW = '''
import torch


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def window(x, start, length):
    return torch.narrow(x, -1, start, length) + x.narrow(1, -length, length)
'''


def test_narrow_is_a_slice_like_torch():
    ns: dict = {}
    exec(NARROW, ns)
    scope = _convert(NARROW)
    data = np.arange(103, dtype=np.int64)
    want = ns["batchify"](torch.tensor(data), 10).numpy()
    got = np.asarray(scope["batchify"](jax.numpy.asarray(data), 10))
    np.testing.assert_array_equal(got, want)
    x = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32)
    for start, length in [(0, 2), (2, 3), (-4, 4)]:
        want = ns["window"](torch.tensor(x), start, length).numpy()
        got = np.asarray(scope["window"](jax.numpy.asarray(x), start, length))
        np.testing.assert_allclose(got, want, rtol=1e-6)


LSTM = '''
import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, ninp, nhid, nlayers, dropout=0.5, batch_first=False):
        super().__init__()
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=batch_first)
        self.nlayers = nlayers
        self.nhid = nhid

    def forward(self, x, hidden=None):
        output, hidden = self.rnn(x, hidden)
        return output, hidden
'''


def _lstm_weights(jax_lstm, torch_lstm) -> None:
    """torch's per-layer weights into the TorchLSTM helper's layers (the gates' order is
    torch's: the kernels transposed, b_ih + b_hh the hidden-side bias)."""
    sd = {k: v.detach().numpy() for k, v in torch_lstm.state_dict().items()}
    for k, layer in enumerate(jax_lstm.layers):
        layer.cell.dense_i.kernel.value = jax.numpy.asarray(sd[f"weight_ih_l{k}"].T)
        layer.cell.dense_h.kernel.value = jax.numpy.asarray(sd[f"weight_hh_l{k}"].T)
        layer.cell.dense_h.bias.value = jax.numpy.asarray(sd[f"bias_ih_l{k}"]
                                                          + sd[f"bias_hh_l{k}"])


@pytest.mark.parametrize(("nlayers", "batch_first"), [(2, False), (3, True)])
def test_stacked_lstm_matches_torch(nlayers, batch_first):
    ns: dict = {}
    exec(LSTM, ns)
    scope = _convert(LSTM)
    torch.manual_seed(0)
    tmodel = ns["Stack"](5, 6, nlayers, batch_first=batch_first).eval()
    jmodel = scope["Stack"](5, 6, nlayers, batch_first=batch_first, rngs=scope["nnx"].Rngs(0))
    jmodel.eval()
    _lstm_weights(jmodel.rnn, tmodel.rnn)
    shape = (2, 7, 5) if batch_first else (7, 2, 5)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    h0 = np.random.default_rng(2).normal(size=(2, nlayers, 2, 6)).astype(np.float32)
    for hidden in (None, (h0[0], h0[1])):
        with torch.no_grad():
            t_hidden = None if hidden is None else tuple(torch.tensor(h) for h in hidden)
            t_out, (t_h, t_c) = tmodel(torch.tensor(x), t_hidden)
        j_hidden = None if hidden is None else tuple(jax.numpy.asarray(h) for h in hidden)
        j_out, (j_h, j_c) = jmodel(jax.numpy.asarray(x), j_hidden)
        np.testing.assert_allclose(np.asarray(j_out), t_out.numpy(), atol=2e-6)
        np.testing.assert_allclose(np.asarray(j_h), t_h.numpy(), atol=2e-6)
        np.testing.assert_allclose(np.asarray(j_c), t_c.numpy(), atol=2e-6)


def test_stacked_lstm_drops_out_between_layers_in_training():
    """In training mode dropout acts on the layers' outputs but the last: with p = 1 every
    layer but the first reads zeros, so the output is the one of the last layer on zeros."""
    scope = _convert(LSTM)
    jmodel = scope["Stack"](5, 6, 2, dropout=1.0, rngs=scope["nnx"].Rngs(0))
    x = jax.numpy.asarray(np.random.default_rng(1).normal(size=(4, 3, 5)).astype(np.float32))
    jmodel.train()
    out, _ = jmodel(x)
    last = jmodel.rnn.layers[1]
    np.testing.assert_allclose(np.asarray(out), np.asarray(last(jax.numpy.zeros((4, 3, 6)))),
                               atol=1e-6)
    jmodel.eval()
    out, _ = jmodel(x)
    assert not np.allclose(np.asarray(out), np.asarray(last(jax.numpy.zeros((4, 3, 6)))))
