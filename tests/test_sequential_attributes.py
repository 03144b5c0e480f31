"""A module's ``nn.Sequential`` attribute indexed outside its class (``model.features[0]``):
torch's items where the translation holds them (run against torch in
test_verify_program_models.py's ``indexed_backbone`` variant), marked where the translation's
items are channels-last convolutions (a script calling them with NCHW arrays would be
silently wrong)."""

from __future__ import annotations

from torch2jax.convert import convert_source

SOURCE = """import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


model = Net()
stem = model.features[0]
width = model.head[0].weight.shape[0]
depth = len(model.head)
"""


def test_channels_last_items_are_marked_and_torch_items_read():
    lines = convert_source(SOURCE, path="net.py").code.splitlines()
    stem = next(i for i, line in enumerate(lines) if line.startswith("stem = "))
    assert "TODO(torch2jax)" in lines[stem - 1] and "channels-last" in lines[stem - 1], lines
    assert lines[stem] == "stem = model.features[0]"
    assert "width = model.head.layers[0].kernel[...].T.shape[0]" in lines, lines
    assert "depth = len(model.head.layers)" in lines, lines
