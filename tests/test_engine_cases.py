"""Engine cases met in code we did not write (timm, torchvision): each converted and run against
torch numerically."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")

from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def _errors(result) -> list[str]:
    return [d.render() for d in result.diagnostics if d.severity == "error"]


@pytest.mark.parametrize("body", [
    "return nn.MaxPool2d(3)(x)",
    "return nn.ReLU()(x)[:, :, 1:, 1:] + nn.AvgPool2d(2, stride=1)(x)",
    "y = nn.MaxPool2d(2, ceil_mode=True)(x)\n    return nn.AdaptiveAvgPool2d(1)(y)",
])
def test_layer_built_and_called_inline_keeps_torch_layout(body):
    """``nn.MaxPool2d(3)(x)`` in a plain function: flax pools channels-last, so the NCHW input
    is moved in and out, as for a pooling attribute of a module (and no partial() is left)."""
    source = HEADER + f"def f(x):\n    {body}\n"
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 9)).astype(np.float32)
    result = assert_function_matches_torch(source, x)
    assert "partial" not in result.code, result.code


FACTORY = HEADER + textwrap.dedent('''
    class Affine(nn.Module):
        def __init__(self, dim, device=None, dtype=None):
            super().__init__()
            dd = {'device': device, 'dtype': dtype}
            self.alpha = nn.Parameter(torch.ones((1, 1, dim), **dd))
            self.beta = nn.Parameter(torch.zeros((1, 1, dim), **dd))

        def forward(self, x):
            return torch.addcmul(self.beta, self.alpha, x)


    class Block(nn.Module):
        """timm's style: torch's factory keywords gathered in a dict and handed on as **dd to
        torch layers, to a layer class held in a parameter and to the project's own modules."""

        def __init__(self, dim, norm_layer=nn.LayerNorm, device=None, dtype=None):
            super().__init__()
            dd = {'device': device, 'dtype': dtype}
            self.norm = norm_layer(dim, **dd)
            self.fc = nn.Linear(dim, dim, **dd)
            self.affine = Affine(dim, **dd)
            self.ls = nn.Parameter(0.5 * torch.ones(dim, **dd))

        def forward(self, x):
            return x + self.ls * self.affine(self.fc(self.norm(x))).addcdiv(x, 2 + x * x)
''')


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("factory") / "factory.py"
    path.write_text(FACTORY)
    return path


def test_factory_keyword_dict_loses_its_device():
    result = convert_source(FACTORY, path="factory.py")
    assert not _errors(result), result.code
    assert "device" not in result.code.split("def __init__(self, dim, norm_layer")[1].split(
        "def __call__")[0].replace("device=None", ""), result.code
    assert "jnp.ones((1, 1, dim), dtype=dtype)" in result.code
    assert "nnx.Linear(dim, dim, rngs=rngs)" in result.code  # a torch layer drops dtype


def test_factory_keyword_dict_verifies(factory_file):
    result = run_request(VerifyRequest(f"{factory_file}::Block", args={"dim": 6},
                                       inputs=("float32[2,3,6]",), grad=True,
                                       atol=1e-5, rtol=1e-5))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert sum(1 for c in result.compared if c.startswith("grad ")) >= 6


JIT_BRANCHES = HEADER + textwrap.dedent('''
    def f(x):
        if torch.jit.is_scripting():
            raise RuntimeError("scripted")
        if torch.jit.is_tracing():
            y = x * 1.0  # the path torch.jit.trace takes: the converted code is never traced so
        else:
            y = x + 0.0  # eager (no memo on self here: the eager path stays)
        if torch.jit.is_scripting():
            z = x * 0
        elif x.sum() > 0:
            z = x * 2
        else:
            z = x * 3
        return y + z
''')


def test_torchscript_only_branches_are_dropped():
    """``if torch.jit.is_scripting():`` is dead in JAX code: the branch goes, its else stays.
    ``torch.jit.is_tracing()`` is False too where the eager path keeps nothing on self (timm's
    memo keeps the traced path: tests/test_timm_shapes_timmA.py)."""
    for sign in (1, -1):
        result = assert_function_matches_torch(JIT_BRANCHES,
                                               sign * np.arange(1, 7, dtype=np.float32))
    assert "False" not in result.code and "raise" not in result.code, result.code
    assert "x * 1.0" not in result.code and "x + 0.0" in result.code, result.code


def test_an_import_already_there_among_others_is_not_repeated():
    """A helper written into the file needs typing.Any, which the file already imports."""
    source = ("from typing import Any, Optional\n\nimport torch\n"
              "from torch.utils.data import TensorDataset, random_split\n\n\n"
              "def halves(x, y):\n    return random_split(TensorDataset(x, y), [0.5, 0.5])\n")
    code = convert_source(source, path="halves.py").code
    assert "def split_fractions(dataset: Any" in code
    assert code.count("from typing import Any") == 1, code
