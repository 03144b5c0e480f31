"""The silent breakages of issue 17, one test each: code as GPT training repositories, minimal
GPT libraries and the MNIST example write it, converted and (where it can run) executed.
Each test fails on the converter before the fix: a NameError, or wrong code with no marker.
"""

from __future__ import annotations

import textwrap

from test_training_scripts import _run
from unbound import assert_names_bound

from torch2jax.convert import convert_source


def _convert(source: str, target: str = "nnx"):
    result = convert_source(textwrap.dedent(source), path="script.py", target=target)
    assert_names_bound(result.code)
    return result


def _errors(result) -> list[str]:
    return [f"{d.rule}: {d.message}" for d in result.diagnostics if d.severity == "error"]


# --------------------------------------------------------------------------------------------
# statements removed although later lines read what they bind
# --------------------------------------------------------------------------------------------

DEVICE_STRINGS = """
import torch

device = 'cuda' if torch.cuda.is_available() else 'cpu'
device_type = 'cuda' if 'cuda' in device else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float32'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
x = torch.ones(2, 3, dtype=ptdtype)
print(device, device_type, dtype, str(x.dtype).split('.')[-1])
"""


def test_device_and_dtype_strings_read_later_are_kept_translated(tmp_path) -> None:
    """GPT-training-script shape: device, device_type and dtype were deleted while later lines
    read them (NameError). They stay, with JAX's answers to the torch queries, unmarked."""
    result = _convert(DEVICE_STRINGS)
    assert _errors(result) == []
    assert "torch" not in result.code
    assert 'jax.default_backend() == "gpu"' in result.code
    want = _run(textwrap.dedent(DEVICE_STRINGS), tmp_path)
    assert _run(result.code, tmp_path) == want == ["cpu", "cpu", "float32", "float32"]


DEVICE_OBJECT = """
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(3, 2).to(device)
x = torch.ones(4, 3, device=device)
print("rows", model(x.to(device)).shape[0], "device", device is not None)
"""


def test_device_object_read_later_becomes_a_jax_device(tmp_path) -> None:
    """MNIST-example shape: `device = torch.device(...)` was deleted while a later line reads
    it. It becomes the default backend's first device; the .to(device) moves go."""
    result = _convert(DEVICE_OBJECT)
    assert _errors(result) == []
    assert "device = jax.devices()[0]\n" in result.code
    assert ".to(" not in result.code and "device=" not in result.code
    assert _run(result.code, tmp_path) == ["rows", "4", "device", "True"]


def test_device_nobody_reads_still_goes() -> None:
    source = DEVICE_OBJECT.replace(', "device", device is not None', "")
    result = _convert(source)
    assert "device" not in result.code
    assert _errors(result) == []


PARAM_GROUPS = """
import inspect
import torch
import torch.nn as nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.fc = nn.Linear(8, 10)

    def forward(self, idx):
        return self.fc(self.emb(idx))

    def configure_optimizers(self, weight_decay, learning_rate, device_type):
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in params.items() if p.dim() >= 2]
        no_decay = [p for n, p in params.items() if p.dim() < 2]
        groups = [
            {'params': decay, 'weight_decay': weight_decay},
            {'params': no_decay, 'weight_decay': 0.0},
        ]
        print(f"decayed tensors: {len(decay)}, not decayed: {len(no_decay)}")
        fused = 'fused' in inspect.signature(torch.optim.AdamW).parameters
        extra = dict(fused=True) if fused and device_type == 'cuda' else dict()
        optimizer = torch.optim.AdamW(groups, lr=learning_rate, **extra)
        return optimizer
"""


def test_param_group_block_stays_when_its_optimizer_is_not_translated() -> None:
    """The block that builds the parameter groups was deleted although the optimizer that
    reads it (AdamW(groups, **extra): not translated) stays: a NameError. It stays as it
    was, and so does the print that reads it."""
    result = _convert(PARAM_GROUPS)
    for line in ("params = {name: p for name, p in self.named_parameters()",
                 "decay = [p for n, p in params.items() if p.ndim >= 2]",
                 "groups = [", 'print(f"decayed tensors:'):
        assert line in result.code, line
    assert "removed-but-read" not in result.code
    assert any(e.startswith("torch.optim.AdamW:") for e in _errors(result))


def test_param_group_block_goes_with_its_translated_optimizer() -> None:
    """With an optimizer that is translated, the groups become optax masks and the block
    that computed them goes (nothing else reads it)."""
    source = PARAM_GROUPS.replace(", **extra)", ")").replace(
        "        fused = 'fused' in inspect.signature(torch.optim.AdamW).parameters\n", "").replace(
        "        extra = dict(fused=True) if fused and device_type == 'cuda' else dict()\n", "")
    result = _convert(source)
    assert _errors(result) == [], _errors(result)
    assert "named_parameters" not in result.code and "groups = [" not in result.code


SCALER_READ = """
import torch

scaler = torch.cuda.amp.GradScaler(enabled=False)
print(scaler.is_enabled())
"""


def test_grad_scaler_read_later_is_kept_and_marked(tmp_path) -> None:
    """A GradScaler a later line reads is kept (its torch import too) and marked; the info
    note that claimed its removal is not printed."""
    result = _convert(SCALER_READ)
    assert "scaler = torch.cuda.amp.GradScaler(enabled=False)" in result.code
    assert not any("GradScaler removed" in d.message for d in result.diagnostics)
    assert {d.rule for d in result.diagnostics if d.severity == "error"} >= {
        "removed-but-read"}
    assert _run(result.code, tmp_path) == ["False"]
