"""A forward whose own argument is named ``key`` (attention's ``forward(self, query, key,
value)``, the annotated Transformer's ``MultiHeadedAttention``), in a module that draws
(dropout): the equinox translation's random key is ``key`` too. The converted ``__call__``
took two arguments of that name, a SyntaxError the converter reported as an internal error,
and the file was not converted. The argument is now ``key_`` in its method, and the module
verifies against torch. A file whose calls of a submodule pass ``key=`` by keyword (it may be
torch's MultiheadAttention) keeps the name, and is still not converted (the CLI reports it).
""" 

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("equinox")

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

SOURCE = '''import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.key = nn.Linear(d, d)
        self.query = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, query, key, value):
        q, k = self.query(query), self.key(key)
        w = self.drop(torch.sigmoid((q * k).sum(-1, keepdim=True)))
        return w * value


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attn = Attention(d)

    def forward(self, x, memory):
        return x + self.attn(x, memory, memory)
'''


def test_an_argument_named_key_verifies_on_equinox(tmp_path: Path):
    result = convert_source(SOURCE, path="attn.py", target="equinox")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "def __call__(self, query, key_, value, *, key=None)" in result.code
    assert "self.key(key_)" in result.code  # (the layer attribute keeps its name)
    path = tmp_path / "attn.py"
    path.write_text(SOURCE)
    r = verify(f"{path}::Block", build="Block(4)", inputs=["float32[3,4]", "float32[3,4]"],
               jax_target="equinox", grad=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.passed, r.mismatch


def test_a_file_passing_key_by_keyword_keeps_the_name():
    source = SOURCE.replace("self.attn(x, memory, memory)",
                            "self.attn(x, key=memory, value=memory)")
    with pytest.raises(SyntaxError):  # (as before: reported as an internal error, not written)
        convert_source(source, path="attn.py", target="equinox")
