"""Tensor methods with no rule of their own: a method whose torch function has a rule is that
function of the receiver (``x.mul(y)`` is ``torch.mul(x, y)``); any other method of torch's that
a JAX array lacks is marked on a known tensor instead of left to raise AttributeError where the
converted program runs (analysis/torch_api.py ``TORCH_ONLY_TENSOR_METHODS``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import torch

from torch2jax.analysis.torch_api import TORCH_ONLY_TENSOR_METHODS
from torch2jax.convert import convert_source


def test_the_list_is_torch_tensor_methods_a_jax_array_lacks() -> None:
    torch_methods = {n for n in dir(torch.Tensor)
                     if not n.startswith("_") and callable(getattr(torch.Tensor, n, None))}
    jax_names = set(dir(jnp.zeros(1)))
    assert TORCH_ONLY_TENSOR_METHODS <= torch_methods
    assert not TORCH_ONLY_TENSOR_METHODS & jax_names
    # (a newer torch may add methods: the list covers the installed one's but for a few)
    missing = torch_methods - jax_names - TORCH_ONLY_TENSOR_METHODS
    assert len(missing) <= 10, sorted(missing)


SCRIPT = """\
import torch

x = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
y = torch.linspace(0.5, 2.0, 12).reshape(3, 4)
a = x.mul(y).add(y).sub(0.25).div(y)
b = x.gather(1, torch.tensor([[0], [3], [1]]))
c = x.div(y, rounding_mode="floor")
print(f"{a.sum().item():.6f} {b.sum().item():.6f} {c.sum().item():.6f}")
"""


def _run(code: str, cwd: Path) -> str:
    path = cwd / "script.py"
    path.write_text(code)
    done = subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_method_through_its_torch_function_prints_what_torch_prints(tmp_path: Path) -> None:
    result = convert_source(SCRIPT, path="script.py")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    # (no torch method call is left: each is its jnp function)
    assert not re.search(r"(?<!jnp)\.(mul|add|sub|div|gather)\(", result.code), result.code
    assert _run(result.code, tmp_path) == _run(SCRIPT, tmp_path)


MARKED = """\
import torch

x = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
handle = x.register_hook(lambda g: g * 2)
y = x.index_fill(1, torch.tensor([0, 2]), -1.0)


def log(run, value):
    run.register_hook(value)
"""


def test_torch_only_method_on_a_known_tensor_is_marked() -> None:
    result = convert_source(MARKED, path="script.py")
    marked = [d for d in result.diagnostics if d.rule == "tensor-method"]
    assert [(d.line, d.severity) for d in marked] == [(4, "error"), (5, "error")]
    lines = result.code.splitlines()
    for meth in ("register_hook", "index_fill"):
        at = next(i for i, ln in enumerate(lines) if f"x.{meth}(" in ln and "TODO" not in ln)
        assert lines[at - 1].lstrip().startswith("# TODO(torch2jax)") and \
            "[tensor-method]" in lines[at - 1]
    # an object the analysis cannot type keeps its method unmarked (it may not be a tensor)
    at = next(i for i, ln in enumerate(lines) if "run.register_hook(" in ln)
    assert "TODO" not in lines[at - 1]


def test_backward_is_left_to_the_training_loop_on_every_target() -> None:
    """``loss.backward()`` is the training loop's: the equinox pass goes on from an NNX
    translation that keeps it, so it is not a method to mark."""
    source = (Path(__file__).resolve().parent.parent / "fixtures" / "training"
              / "cnn_sgd_steplr.py").read_text()
    for target in ("nnx", "linen", "equinox"):
        result = convert_source(source, path="train.py", target=target)
        assert [str(d) for d in result.diagnostics if d.severity == "error"] == [], target
