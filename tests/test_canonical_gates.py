"""The canonical forms' gates (convert.py's ``_CANONICAL_GATES``): a form whose text is not in
the user's source is not run, even after an earlier form changed the tree (each form walks the
whole tree; on timm's 5,300-line vision_transformer.py, ``register_parameter`` rewritten, the
later forms walked it for nothing). The conversion is the same as with every form run, and a
form whose text an earlier rewrite writes (``register_parameter("forward", p)``) still runs."""

from __future__ import annotations

import pytest

from torch2jax import convert
from torch2jax.convert import convert_source
from torch2jax.passes import forward_choice, manual_sgd

# in timm's shape: a register_parameter (module_methods changes the tree), "backwards" in a
# docstring and self.grad_checkpointing (not a manual SGD step), no forward reassigned
SOURCE = '''
import torch
from torch import nn


class Block(nn.Module):
    """Kept for backwards compatibility."""

    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.grad_checkpointing = False
        self.register_parameter("gamma", nn.Parameter(torch.ones(dim)))

    def forward(self, x):
        return self.fc(x) * self.gamma
'''


def _calls(monkeypatch, form) -> list[int]:
    calls: list[int] = []
    original = form.canonicalise

    def spy(module):
        calls.append(1)
        return original(module)

    monkeypatch.setattr(form, "canonicalise", spy)
    return calls


def test_a_form_without_its_text_is_not_run_after_an_earlier_rewrite(monkeypatch):
    every = convert_source(SOURCE, path="block.py")
    with monkeypatch.context() as patch:
        patch.setattr(convert, "_CANONICAL_GATES", {})  # every form walks the tree
        ungated = convert_source(SOURCE, path="block.py")
    assert every.code == ungated.code
    assert "self.gamma = nnx.Param" in every.code  # module_methods did rewrite the tree
    sgd = _calls(monkeypatch, manual_sgd)
    choice = _calls(monkeypatch, forward_choice)
    assert convert_source(SOURCE, path="block.py").code == every.code
    assert (sgd, choice) == ([], [])


@pytest.mark.parametrize(("name", "runs"), [("gamma", False), ("forward", True)])
def test_a_form_runs_where_an_earlier_rewrite_wrote_its_text(monkeypatch, name, runs):
    # self.register_parameter("forward", p) is self.forward = p: forward_choice's text
    choice = _calls(monkeypatch, forward_choice)
    convert_source(SOURCE.replace('"gamma"', f'"{name}"'), path="block.py")
    assert bool(choice) is runs
