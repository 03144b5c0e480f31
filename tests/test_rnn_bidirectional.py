"""nn.LSTM(bidirectional=True) (rules/sequence.toml): the TorchLSTM helper (passes/helpers_rnn.py) with a reverse
nnx.RNN / nn.RNN per layer (reverse=True, keep_order=True), outputs concatenated on the feature
axis, h_n and c_n in torch's order (layer 0 forward, layer 0 reverse, layer 1 forward, ...), and
torch's ``weight_ih_l0_reverse`` etc. moved into the reverse layers. Verified against torch
(outputs and gradients) on nnx and linen; equinox keeps the mark. nn.GRU alike (TorchGRU), stacked
or bidirectional."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Tagger(nn.Module):  # a BiLSTM tagger: Embedding -> 2-layer BiLSTM -> Linear
        def __init__(self, vocab=20, dim=8, hidden=6, tags=5):
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True,
                                bidirectional=True)
            self.fc = nn.Linear(2 * hidden, tags)

        def forward(self, tokens):
            out, _ = self.lstm(self.emb(tokens))
            return self.fc(out)


    class SeqFirst(nn.Module):  # one time-major layer, torch's (out, (h, c)) returned
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(5, 4, bidirectional=True)

        def forward(self, x, h0, c0):
            out, (h, c) = self.rnn(x, (h0, c0))
            return out, (h, c)


    class GRUs(nn.Module):  # the GRU alike: stacked and bidirectional, then time-major
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(8, 6, num_layers=2, batch_first=True, bidirectional=True)
            self.gru1 = nn.GRU(12, 4, bidirectional=True)

        def forward(self, x, h0):
            out, h = self.gru(x)
            out2, h2 = self.gru1(out.transpose(0, 1), h0)
            return out2.sum(0) + h.sum(0).sum(-1, keepdim=True), h2


    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.tagger = Tagger()
            self.seq = SeqFirst()
            self.grus = GRUs()

        def forward(self, tokens, x, h0, c0):
            grus = self.grus(self.tagger.emb(tokens), h0[:, :2])
            return self.tagger(tokens), self.seq(x, h0, c0), grus
''')

# tokens (N=2, L=7); x (L=7, N=3, I=5); an initial state (h0, c0) of (2 directions, N, H),
# drawn at random: a state dropped or read in another order does not verify (the GRUs read
# h0[:, :2] as theirs)
INPUTS = ("int64[2,7]:20", "float32[7,3,5]", "float32[2,3,4]", "float32[2,3,4]")


@pytest.mark.parametrize("target", ["nnx", "linen"])
def test_bidirectional_lstm_verifies_against_torch(tmp_path, target):
    path = tmp_path / "bilstm.py"
    path.write_text(SOURCE)
    result = run_request(VerifyRequest(f"{path}::Both", inputs=INPUTS, grad=True,
                                       jax_target=target, atol=1e-5, rtol=1e-5,
                                       float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_bidirectional_lstm_is_the_helper_and_equinox_keeps_the_mark():
    code = convert_source(SOURCE, path="m.py").code
    assert "self.rnn = TorchLSTM(5, 4, bidirectional=True, rngs=rngs)" in code
    result = convert_source(SOURCE, path="m.py", target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    # (the equinox pass's own TorchLSTM is one direction: targets/equinox_lstm.py)
    assert "LSTM argument bidirectional has no equinox form" in errors, errors
    lines = result.code.splitlines()
    at = next(i for i, line in enumerate(lines) if "TorchLSTM(5, 4, bidirectional=True" in line)
    assert lines[at].lstrip().startswith("#") and "TODO(torch2jax)" in lines[at + 1]
