"""torch's packed sequences in converted NLP scripts (rules/sequence.toml): the common shape
(an Embedding, ``nn.utils.rnn.pack_padded_sequence(embedded, lengths.to('cpu'),
batch_first=True, enforce_sorted=False)``, an LSTM called on it, ``pad_packed_sequence``, then
``hidden[-1]`` or ``torch.cat((hidden[-2], hidden[-1]), dim=1)``). The converted file keeps
the batch padded with its lengths (the PackedSequence helper) and runs its LSTMs and GRUs as
the TorchLSTM / TorchGRU helpers with seq_lengths: each sequence's final state is its state at
its own last step, the reverse direction starts there, the padded steps of the output are
padding_value. Verified against torch (outputs, h_n / c_n, gradients) on a batch of unequal
lengths: LSTM and GRU, one and two layers, one and two directions, batch first and time major,
enforce_sorted both ways, an initial state, padding_value and total_length."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source
from torch2jax.verify.program import verify_program
from torch2jax.verify.run import VerifyRequest, run_request

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "sentiment_packed.py"

SOURCE = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Classifier(nn.Module):  # Embedding -> packed (Bi)LSTM -> Linear on the last states
        def __init__(self, vocab, dim, hidden, classes, layers, bidirectional, pad=0):
            super().__init__()
            self.embedding = nn.Embedding(vocab, dim, padding_idx=pad)
            self.lstm = nn.LSTM(dim, hidden, layers, bidirectional=bidirectional,
                                batch_first=True)
            self.fc = nn.Linear(hidden * 2 if bidirectional else hidden, classes)

        def forward(self, ids, lengths):
            embedded = self.embedding(ids)
            packed = nn.utils.rnn.pack_padded_sequence(embedded, lengths.to('cpu'),
                                                       batch_first=True, enforce_sorted=False)
            packed_out, (hidden, cell) = self.lstm(packed)
            output, output_lengths = nn.utils.rnn.pad_packed_sequence(packed_out,
                                                                      batch_first=True)
            if self.lstm.bidirectional:
                hidden = torch.cat((hidden[-2], hidden[-1]), dim=1)
            else:
                hidden = hidden[-1]
            return self.fc(hidden), output, cell


    class TimeMajorGRU(nn.Module):  # (T, N, E) packed, padded back to total_length
        def __init__(self, dim, hidden, layers, bidirectional):
            super().__init__()
            self.gru = nn.GRU(dim, hidden, layers, bidirectional=bidirectional)

        def forward(self, x, lengths, h0):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, h = self.gru(packed, h0)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0])
            return out, h


    class Sorted(nn.Module):  # enforce_sorted=True (torch's default): decreasing lengths
        def __init__(self, dim, hidden):
            super().__init__()
            self.gru = nn.GRU(dim, hidden, batch_first=True)
            self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)

        def forward(self, x, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
            out, h = self.gru(packed)
            out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, padding_value=-1.0)
            out2, (h2, c2) = self.lstm(packed)
            out2, _ = nn.utils.rnn.pad_packed_sequence(out2, batch_first=True)
            return out, h, out2, h2, c2


    class Rest(nn.Module):  # the GRUs and the sorted batch (linen: no Embedding(padding_idx))
        def __init__(self):
            super().__init__()
            self.gru = TimeMajorGRU(4, 4, 2, True)
            self.sorted = Sorted(4, 4)

        def forward(self, x, h0):
            # x (N=4, 7, 4): padded to 7 past lengths 5, 2, 4, 1 (time major for the GRU)
            return (self.gru(x.transpose(0, 1), torch.tensor([5, 2, 4, 1]), h0),
                    self.sorted(x[:, :5], torch.tensor([5, 4, 2, 1])))


    class All(nn.Module):
        def __init__(self):
            super().__init__()
            self.uni = Classifier(20, 4, 4, 3, 1, False)  # (2 layers, 2 directions: PROGRAM)
            self.rest = Rest()

        def forward(self, ids, x, h0):
            lengths = torch.tensor([5, 2, 4, 1])  # of ids' 5 steps: the rest is padding
            return self.uni(ids, lengths), self.rest(x, h0)
''')

# ids (N=4, 5) drawn at random, padding included (a padded step that reached an output or a
# state would not verify); x (4, 7, 4); h0 (2 layers * 2 directions, N, H=4) drawn at random
INPUTS = ("int64[4,5]:20", "float32[4,7,4]", "float32[4,4,4]")


def _verify(tmp_path, root: str, inputs: tuple[str, ...], target: str) -> None:
    path = tmp_path / "packed.py"
    path.write_text(SOURCE)
    result = run_request(VerifyRequest(f"{path}::{root}", inputs=inputs, grad=True,
                                       jax_target=target, atol=1e-5, rtol=1e-5,
                                       float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert any(c.startswith("grad rest.gru.gru.weight_hh_l1_reverse") for c in result.compared
               ) or root != "All", result.compared


def test_packed_rnns_verify_against_torch_nnx(tmp_path):
    _verify(tmp_path, "All", INPUTS, "nnx")


def test_packed_rnns_verify_against_torch_linen(tmp_path):
    _verify(tmp_path, "Rest", INPUTS[1:], "linen")


def test_packed_conversion_reads_as_written():
    result = convert_source(SOURCE, path="m.py")
    code = result.code
    assert "TODO(torch2jax)" not in code
    # the one-layer LSTM too is the helper (it takes the PackedSequence); the calls as written
    assert "self.lstm = TorchLSTM(" in code and "self.lstm = nnx.RNN" not in code
    assert "self.gru = TorchGRU(dim, hidden, batch_first=True, rngs=rngs)" in code
    assert "packed_out, (hidden, cell) = self.lstm(packed)" in code
    assert "packed = pack_padded_sequence(embedded, lengths, batch_first=True)" in code
    assert "out, _ = pad_packed_sequence(out, total_length=x.shape[0])" in code
    assert "class PackedSequence(NamedTuple):" in code and "import torch" not in code
    # the output's time axis differs from torch's without total_length: warned there only
    warned = [d.line for d in result.diagnostics if d.severity == "warning"
              and "pad_packed_sequence" in d.message]
    assert len(warned) == 3, result.diagnostics


def test_packed_sequences_are_marked_on_equinox():
    result = convert_source(SOURCE, path="m.py", target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("pack_padded_sequence: translated for the NNX and linen targets only" in e
               for e in errors), errors
    assert "class PackedSequence" not in result.code


def test_a_sentiment_classifier_trains_as_torch(tmp_path, monkeypatch):
    """PROGRAM (an Embedding, pack_padded_sequence, a 2-layer BiLSTM, its last states of both
    directions, Adam): converted, it trains as torch's (losses, parameters and Adam's state
    after each step, from torch's initial weights)."""
    monkeypatch.chdir(tmp_path)
    r = verify_program(PROGRAM, steps=3)
    assert r.error is None, r.error
    assert r.passed, [(c.name, c.detail) for c in r.failures()]
    assert {c.kind for c in r.checks} >= {"loss", "param", "opt_state"}
