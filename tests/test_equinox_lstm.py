"""torch's stacked nn.LSTM under ``--target equinox`` (targets/equinox_lstm.py; issue 32, the
corpus word_lm): the TorchLSTM helper (torch's four tensors per layer under torch's names,
scanned over time, called on the batch), a forward taking several arguments (the tokens and
the initial states, the batch on axis 1), and a Linear head tied to the Embedding under a
constructor flag. Verified against torch: outputs and gradients, the weights carried over by
torch's names (the corpus program runs the untied form, tests/test_corpus_programs.py)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = '''
import torch
import torch.nn as nn


class LM(nn.Module):
    def __init__(self, ntoken=10, nhid=6, nlayers=2, tie=True):
        super().__init__()
        self.emb = nn.Embedding(ntoken, nhid)
        self.rnn = nn.LSTM(nhid, nhid, nlayers, dropout=0.2)
        self.head = nn.Linear(nhid, ntoken)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, tokens, h0, c0):
        out, (h, c) = self.rnn(self.emb(tokens), (h0, c0))
        return self.head(out * c[-1]) + self.head(h).sum(0)
'''

def test_stacked_lstm_lm_matches_torch(tmp_path: Path) -> None:
    result = convert_source(SOURCE, path="lm.py", target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert errors == [] and "TODO" not in result.code, errors
    assert "class TorchLSTM(eqx.Module)" in result.code and "batched = True" in result.code
    path = tmp_path / "lm.py"
    path.write_text(SOURCE)
    got = run_request(VerifyRequest(f"{path}::LM", inputs=("int64[7,2]:10", "float32[2,2,6]",
                                                            "float32[2,2,6]"),
                                    jax_target="equinox", grad=True, float64=False))
    assert got.error is None, got.error
    assert got.max_abs_diff <= 1e-5 and got.grad_max_abs_diff <= 1e-5, got.to_json()
    assert got.passed, got.mismatch
