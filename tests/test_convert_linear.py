"""Converting a file visits a number of tree nodes proportional to its size: twice the
classes, about twice the visits. Counted, not timed (speed is measured in
benchmarks/convert_throughput.py). The file has what made the converter quadratic before:
block classes held by attributes of one model (the channels-last analysis searched the whole
module once per holder) and many layers built through one local factory in one constructor
(the layout of each searched the whole constructor)."""

from __future__ import annotations

import textwrap

import libcst as cst
from libcst._nodes.base import CSTNode

from torch2jax.analysis import walk
from torch2jax.convert import convert_source


def _source(n: int) -> str:
    blocks = "\n\n".join(textwrap.dedent(f'''
        class Block{i}(nn.Module):
            def __init__(self, c):
                super().__init__()
                self.conv = nn.Conv2d(c, c, 3, padding=1)
                self.bn = nn.BatchNorm2d(c)

            def forward(self, x):
                return F.relu(self.bn(self.conv(x))) + x
        ''') for i in range(n))
    inits = "\n".join(f"        self.b{i} = Block{i}(8)\n        self.n{i} = norm_layer(8)"
                      for i in range(n))
    calls = "\n".join(f"        x = self.n{i}(self.b{i}(x))" for i in range(n))
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n" + blocks
            + "\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        norm_layer = nn.BatchNorm2d\n        self.stem = nn.Conv2d(3, 8, 3)\n"
            + inits + "\n\n    def forward(self, x):\n        x = self.stem(x)\n" + calls
            + "\n        return x\n")


def _visits(monkeypatch, source: str) -> tuple[int, str]:
    """Node visits (libcst's visits and the walks of analysis/walk.py) of one conversion."""
    count = [0]

    def counted(visit):
        def visit_counted(self, visitor):
            count[0] += 1
            return visit(self, visitor)
        return visit_counted

    class Children(dict):
        def __missing__(self, cls):
            fn = walk._children_function(cls)

            def children(node):
                count[0] += 1
                return fn(node)
            self[cls] = children
            return children

    monkeypatch.setattr(CSTNode, "visit", counted(CSTNode.visit))
    monkeypatch.setattr(cst.Module, "visit", counted(cst.Module.visit))
    monkeypatch.setattr(walk, "_CHILDREN", Children())
    code = convert_source(source, public=set()).code
    return count[0], code


def test_visits_grow_linearly(monkeypatch):
    small, code = _visits(monkeypatch, _source(15))
    large, _ = _visits(monkeypatch, _source(30))
    # the analyses this file exercises did their work: blocks channels-last, norm_layer's
    # layout known
    block = code[code.index("class Block3("):code.index("class Block4(")]
    assert "moveaxis" not in block
    assert "self.n3 = norm_layer(8, rngs=rngs)" in code and code.count("moveaxis") == 2
    assert large / small < 2.3, (small, large)  # (quadratic work: 3.3 before)
