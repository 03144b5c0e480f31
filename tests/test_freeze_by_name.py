"""A parameter frozen by itself is marked, never dropped. ``for name, p in
backbone.named_parameters(): if "0." in name: p.requires_grad_(False)`` (DETR's backbone
freeze) became ``pass`` inside the converted loop, with no mark: the converted model trained
the parameters torch freezes. The script's ``p.requires_grad = False`` in such a loop became
``True = False``, an output that does not parse. torch's parameter names are not the
converted module's paths, so the choice by name is marked; a loop freezing all of a
module's parameters is still ``freeze_parameters(module)``, run here against torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source

SOURCE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)
        for name, p in self.backbone.named_parameters():
            if "0." in name:
                p.requires_grad_(False)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    model = Net()
    for name, p in model.named_parameters():
        if name.startswith("head"):
            p.requires_grad = False
    print(sum(p.numel() for p in model.parameters() if p.requires_grad))


if __name__ == "__main__":
    main()
'''

BY_NAME = [
    ('''        for name, p in self.backbone.named_parameters():
            if "0." in name:
                p.requires_grad_(False)
''', '''        for p in self.backbone.parameters():
            p.requires_grad_(False)
'''),
    ('''    for name, p in model.named_parameters():
        if name.startswith("head"):
            p.requires_grad = False
''', '''    for p in model.head.parameters():
        p.requires_grad = False
'''),
]


def test_a_parameter_frozen_by_its_name_is_marked_in_a_module_and_a_script():
    r = convert_source(SOURCE)
    marks = [d for d in r.diagnostics if d.rule == "requires_grad"]
    assert len(marks) == 2, [d.message for d in r.diagnostics]
    assert r.code.count("p.requires_grad_(False)") == 1  # kept, under its mark
    assert "p.requires_grad = False" in r.code
    compile(r.code, "<converted>", "exec")


def test_whole_modules_frozen_by_loops_run_as_torch(tmp_path):
    source = SOURCE.replace(*BY_NAME[0]).replace(BY_NAME[1][0], "")
    r = convert_source(source)
    assert not [d for d in r.diagnostics if d.severity == "error"], r.diagnostics
    assert "freeze_parameters(self.backbone)" in r.code
    (tmp_path / "torch_side.py").write_text(source)
    (tmp_path / "jax_side.py").write_text(r.code)
    run = [subprocess.run([sys.executable, str(tmp_path / f)], capture_output=True, text=True,
                          check=True).stdout for f in ("torch_side.py", "jax_side.py")]
    assert run[0] == run[1] == "18\n"  # the head's, the only trainable ones
