"""A loop over a literal list of layers of several forms on the equinox target (issue 32,
item 1): ``nn.ModuleList([conv, nn.ReLU(), conv, nn.BatchNorm2d(c)])`` called in a ``for``
loop. Each layer is called in its own form (BatchNorm with the state, a function as it is), the
loop unrolled over the list's known length; per example where the module has that form, kept
batched where it has not. Each is converted, built and checked against torch (outputs and
gradients in float64; BatchNorm's batch statistics in train mode). The loop used to call every
element in the first one's form: an unmarked call without BatchNorm's state, failing at run
time."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch2jax.convert import convert_source
from torch2jax.verify.run import verify

PER_EXAMPLE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)])
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
        return self.head(x.mean(dim=(2, 3)))
'''

# such a list in a module whose forward mixes the examples (no per-example form): batched
BATCHED = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                     nn.ReLU(), nn.Conv2d(4, 4, 1)])
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        x = x - x.mean(dim=0, keepdim=True)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=(2, 3)))
'''

CASES = {"per_example": (PER_EXAMPLE, False), "batched": (BATCHED, True)}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory) -> tuple[str, str, Path]:
    source, _ = CASES[request.param]
    path = tmp_path_factory.mktemp("loops") / "net.py"
    path.write_text(source)
    return request.param, convert_source(source, target="equinox").code, path


def test_each_layer_is_called_in_its_form(case: tuple[str, str, Path]) -> None:
    name, code, _ = case
    assert "TODO(torch2jax)" not in code, code
    assert ("batched = True" in code) == CASES[name][1], code
    assert "for " not in code.split("class Net")[1], code
    assert "layer = self.layers[3]" in code
    # BatchNorm takes and returns the state (per example, or mapped over the batch's axis)
    stateful = "x, state = layer(x, state)" if name == "per_example" else \
        'x, state = jax.vmap(layer, axis_name="batch", in_axes=(0, None), ' \
        "out_axes=(0, None))(x, state)"
    assert stateful in code, code


def test_unrolled_loop_matches_torch_in_train_mode(case: tuple[str, str, Path]) -> None:
    _, _, path = case
    # (the float64 pass only: one compile, and the pass that tells a translation error from
    # float32 noise)
    r = verify(f"{path}::Net", inputs=["float32[3,3,4,4]"], jax_target="equinox", grad=True,
               train_mode=True, float64=True)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, (r.mismatch, r.to_json())


UNIFORM = '''
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(4) for _ in range(3)])
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Dropout(0.1), nn.LayerNorm(4)])

    def forward(self, x):
        for i, blk in enumerate(self.blocks):
            x = blk(x) * (i + 1)
        for i, layer in enumerate(self.layers):
            x = layer(x) + i
        return x
'''


def test_enumerate_binds_the_index_and_a_loop_of_one_form_stays_a_loop() -> None:
    code = convert_source(UNIFORM, target="equinox").code
    assert "TODO(torch2jax)" not in code, code
    assert "for i, blk in enumerate(self.blocks):" in code, code
    assert "i = 1\n        layer = self.layers[1]\n        x = layer(x, key=key) + i" in code, code
