"""Writes into the weights of a model's layers outside its classes (passes/built_weights.py):
pretrained vectors copied into an embedding and the special tokens' rows zeroed (NLP
tutorials: ``model.embedding.weight.data.copy_(pretrained)``, ``...data[PAD_IDX] =
torch.zeros(D)``), a Linear's and a conv's weights copied in torch's layout, a row of a
Linear's weight set. Before, each line was marked and the converted program failed there
("'Embedding' object has no attribute 'weight'"). The converted program is run, and its
output compared with torch's on the same deterministic weights and input."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source

SOURCE = '''
import torch
import torch.nn as nn

PAD_IDX, UNK_IDX, V, D = 1, 0, 10, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(V, D, padding_idx=PAD_IDX)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 5 * D, 3)

    def forward(self, x):
        h = self.embedding(x).unsqueeze(1)
        h = torch.relu(self.conv(h))
        return self.fc(h.flatten(1))


model = Net()
pretrained = torch.arange(V * D, dtype=torch.float32).reshape(V, D) / 40 - 0.5
model.embedding.weight.data.copy_(pretrained)
model.embedding.weight.data[UNK_IDX] = torch.zeros(D)
model.embedding.weight.data[PAD_IDX] = torch.zeros(D)
model.conv.weight.data.copy_(torch.linspace(-1, 1, 18).reshape(2, 1, 3, 3))
model.conv.bias.data.copy_(torch.tensor([0.1, -0.2]))
with torch.no_grad():
    model.fc.weight.copy_(torch.linspace(-0.5, 0.5, 3 * 2 * 5 * D).reshape(3, 2 * 5 * D))
model.fc.weight.data[1] = torch.linspace(0.3, -0.3, 2 * 5 * D)
model.fc.bias.data.copy_(torch.tensor([0.0, 0.5, -0.5]))
x = torch.tensor([[2, 3, 0, 1, 9], [4, 5, 6, 7, 8]])
out = model(x)
'''


def test_written_weights_give_torchs_output():
    namespace: dict = {}
    exec(compile(SOURCE, "<torch>", "exec"), namespace)  # noqa: S102 - the test's own source
    expected = namespace["out"].detach().numpy()
    result = convert_source(SOURCE, target="nnx")
    assert result.todos == 0, result.code
    code = result.code
    assert "model.embedding.embedding[...] = pretrained" in code
    assert "model.embedding.embedding[UNK_IDX] = jnp.zeros(D)" in code
    assert "model.fc.kernel[:, 1] = " in code
    converted: dict = {}
    exec(compile(code, "<converted>", "exec"), converted)  # noqa: S102 - its conversion
    np.testing.assert_allclose(np.asarray(converted["out"]), expected, rtol=1e-5, atol=1e-6)


def test_an_in_place_op_on_a_built_weight_stays_marked():
    source = SOURCE.replace("model.fc.bias.data.copy_(torch.tensor([0.0, 0.5, -0.5]))",
                            "model.fc.bias.data.add_(1.0)")
    result = convert_source(source, target="nnx")
    assert "TODO(torch2jax)" in result.code and "model.fc.bias.data.add_(1.0)" in result.code


def test_a_copy_used_as_a_value_stays_marked():
    """``w = m.weight.data.copy_(t)`` (the copy's result read): not a statement the write can
    replace; marked, not dropped."""
    source = ("import torch\nimport torch.nn as nn\nm = nn.Linear(2, 2)\n"
              "w = m.weight.data.copy_(torch.ones(2, 2))\n")
    result = convert_source(source, target="nnx")
    assert "TODO(torch2jax)" in result.code and "w = m.weight.data.copy_(" in result.code
