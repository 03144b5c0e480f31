"""``for m in net.modules():`` over a model of a script (not inside a module class): NNX walks
``nnx.iter_modules(net)``; it was left as ``net.modules()``, unmarked, and the converted script
stopped there (AttributeError). linen and equinox mark the loop."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

from torch2jax.convert import convert_source

SCRIPT = '''
import torch
import torch.nn as nn

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))
for m in net.modules():
    if isinstance(m, nn.Linear):
        nn.init.zeros_(m.bias)
n = 0
for m in net.modules():
    if isinstance(m, nn.Linear):
        n += 1
        print("zero bias:", bool((m.bias == 0).all()))
print("linear layers:", n)
'''


def _run(code: str, tmp_path, name: str) -> str:
    (tmp_path / name).write_text(code)
    return subprocess.run([sys.executable, str(tmp_path / name)], capture_output=True,
                          text=True, check=True).stdout


def test_modules_of_a_script_model(tmp_path) -> None:
    result = convert_source(SCRIPT, path="script.py", target="nnx")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "nnx.iter_modules(net)" in result.code
    want = _run(SCRIPT, tmp_path, "script_torch.py")
    assert want.count("zero bias: True") == 2 and "linear layers: 2" in want
    assert _run(result.code, tmp_path, "script_jax.py") == want


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_modules_of_a_script_model_marked_elsewhere(target: str) -> None:
    result = convert_source(SCRIPT, path="script.py", target=target)
    assert any(d.severity == "error" for d in result.diagnostics)
    lines = result.code.splitlines()
    loops = [i for i, t in enumerate(lines) if ("net.modules()" in t or "iter_modules(net)" in t)
             and not t.lstrip().startswith("#")]
    for i in loops:  # every loop left in code is marked (equinox comments them out, marked)
        assert "TODO(torch2jax)" in lines[i - 1], result.code
