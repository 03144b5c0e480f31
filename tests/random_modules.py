"""Random torch modules for the equinox target's property test (tests/test_equinox_random.py):
a hypothesis strategy that writes a module class (sometimes with a block class of its own)
whose forward chains steps drawn from a menu of what model code does to an image batch and
then to a batch of vectors: convolutions, BatchNorm, pooling, Sequentials, a residual block,
LayerNorm over channels between permutes, Linear, ModuleList loops (of one kind of layer or
several), einsums per example and over the batch, softmax, concatenation, slicing,
statistics over the batch axis. Each step keeps track of the shape, so every module drawn
runs in torch on ``float32[B, 3, 6, 6]``."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

SHAPE = "float32[4,3,6,6]"

BLOCK = '''

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.norm = nn.BatchNorm2d(c)

    def forward(self, x):
        return x + torch.relu(self.norm(self.conv(x)))
'''


@dataclass
class _Module:
    init: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    block: bool = False
    n: int = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"


def _image_step(draw, mod: _Module, c: int, hw: int) -> tuple[int, int]:
    kind = draw(st.sampled_from(["conv", "bn", "act", "pool", "seq", "center", "ln", "drop",
                                 "block", "gn"]))
    if kind == "conv":
        out = draw(st.sampled_from([2, 4, 6]))
        n = mod.name("conv")
        mod.init.append(f"self.{n} = nn.Conv2d({c}, {out}, 3, padding=1)")
        mod.body.append(f"x = self.{n}(x)")
        return out, hw
    if kind == "bn":
        n = mod.name("bn")
        mod.init.append(f"self.{n} = nn.BatchNorm2d({c})")
        mod.body.append(f"x = self.{n}(x)")
    elif kind == "act":
        mod.body.append(draw(st.sampled_from(["x = torch.relu(x)", "x = F.gelu(x)",
                                              "x = torch.sigmoid(x) * x"])))
    elif kind == "pool" and hw % 2 == 0:
        n = mod.name("pool")
        mod.init.append(f"self.{n} = nn.MaxPool2d(2)")
        mod.body.append(f"x = self.{n}(x)")
        return c, hw // 2
    elif kind == "seq":
        n = mod.name("seq")
        mod.init.append(f"self.{n} = nn.Sequential(nn.Conv2d({c}, {c}, 3, padding=1), "
                        f"nn.BatchNorm2d({c}), nn.ReLU())")
        mod.body.append(f"x = self.{n}(x)")
    elif kind == "center":  # a statistic over the batch axis
        mod.body.append("x = x - x.mean(dim=0, keepdim=True)")
    elif kind == "ln":  # LayerNorm over the channels, channels-last between permutes
        n = mod.name("ln")
        mod.init.append(f"self.{n} = nn.LayerNorm({c})")
        mod.body.append(f"x = self.{n}(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)")
    elif kind == "drop":
        n = mod.name("drop")
        mod.init.append(f"self.{n} = nn.Dropout(0.0)")
        mod.body.append(f"x = self.{n}(x)")
    elif kind == "block":
        n = mod.name("block")
        mod.block = True
        mod.init.append(f"self.{n} = Block({c})")
        mod.body.append(f"x = self.{n}(x)")
    elif kind == "gn" and c % 2 == 0:
        n = mod.name("gn")
        mod.init.append(f"self.{n} = nn.GroupNorm(2, {c})")
        mod.body.append(f"x = self.{n}(x)")
    return c, hw


def _vector_step(draw, mod: _Module, d: int) -> int:
    kind = draw(st.sampled_from(["linear", "ln", "act", "gram", "scale", "loop", "mixed",
                                 "softmax", "cat", "slice", "center", "seq"]))
    if kind == "linear":
        out = draw(st.sampled_from([3, 4, 8]))
        n = mod.name("fc")
        mod.init.append(f"self.{n} = nn.Linear({d}, {out})")
        mod.body.append(f"x = self.{n}(x)")
        return out
    if kind == "ln":
        n = mod.name("ln")
        mod.init.append(f"self.{n} = nn.LayerNorm({d})")
        mod.body.append(f"x = self.{n}(x)")
    elif kind == "act":
        mod.body.append(draw(st.sampled_from(["x = torch.tanh(x)", "x = F.relu(x)"])))
    elif kind == "gram":  # an einsum over the batch
        mod.body.append('x = x @ torch.einsum("bi,bj->ij", x, x) / x.shape[0]')
    elif kind == "scale":  # an einsum per example
        n = mod.name("scale")
        mod.init.append(f"self.{n} = nn.Parameter(torch.linspace(0.5, 1.5, {d}))")
        mod.body.append(f'x = torch.einsum("bi,i->bi", x, self.{n})')
    elif kind == "loop":
        n = mod.name("layers")
        k = draw(st.integers(1, 3))
        mod.init.append(f"self.{n} = nn.ModuleList([nn.Linear({d}, {d}) for _ in range({k})])")
        mod.body.append(f"for layer in self.{n}:\n            x = torch.relu(layer(x))")
    elif kind == "mixed":  # a loop over layers of two kinds
        n = mod.name("layers")
        mod.init.append(f"self.{n} = nn.ModuleList([nn.Linear({d}, {d}), nn.LayerNorm({d})])")
        mod.body.append(f"for layer in self.{n}:\n            x = layer(x)")
    elif kind == "softmax":
        mod.body.append(draw(st.sampled_from(["x = x.softmax(dim=-1)",
                                              "x = torch.softmax(x, dim=0)"])))
    elif kind == "cat" and d <= 8:
        mod.body.append("x = torch.cat([x, 2 * x], dim=1)")
        return 2 * d
    elif kind == "slice" and d >= 4:
        mod.body.append(f"x = x[:, :{d // 2}]")
        return d // 2
    elif kind == "center":
        mod.body.append("x = x / (x.std(dim=0, keepdim=True) + 1.0)")
    elif kind == "seq":
        n = mod.name("mlp")
        mod.init.append(f"self.{n} = nn.Sequential(nn.Linear({d}, {d}), nn.GELU(), "
                        f"nn.Linear({d}, {d}))")
        mod.body.append(f"x = self.{n}(x)")
    return d


@st.composite
def random_module(draw) -> str:
    """The source of a file holding ``class Net(nn.Module)``, called on ``SHAPE``."""
    mod = _Module()
    c, hw = 3, 6
    for _ in range(draw(st.integers(0, 4))):
        c, hw = _image_step(draw, mod, c, hw)
    if draw(st.booleans()):
        mod.body.append("x = x.mean(dim=(2, 3))")
        d = c
    else:
        mod.body.append("x = torch.flatten(x, 1)")
        d = c * hw * hw
    for _ in range(draw(st.integers(0, 4))):
        d = _vector_step(draw, mod, d)
    mod.init.append(f"self.head = nn.Linear({d}, 3)")  # (a parameter to differentiate)
    mod.body.append("return self.head(x)")
    init = "\n".join(f"        {line}" for line in mod.init)
    body = "\n".join(f"        {line}" for line in mod.body)
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
            + (BLOCK if mod.block else "") + "\n\nclass Net(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n" + init +
            "\n\n    def forward(self, x):\n" + body + "\n")
