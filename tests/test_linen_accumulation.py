"""Micro-step gradient accumulation on ``--target linen`` (targets/linen_accum.py).

nanoGPT's training loop, reduced to the constant-weight classifier of
tests/test_training_scripts.py: ``while True`` around a learning rate set by hand, micro-steps
whose next batch is drawn after the forward and before ``backward()``, a guarded clip, one
``step()``, ``break`` after ``max_iters``. NNX translates it; linen rebinds the TrainState
after the micro-steps. The converted script must print torch's losses (each update's last
micro-step) and learning rates, number for number. The ``for`` form (``micro_steps_clip``)
runs in tests/test_training_linen.py's parametrized script test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_training_scripts import HEADER, _close, _run

from torch2jax.convert import convert_source

WHILE_MICRO_STEPS = """
import math
grad_clip = 0.3
accum = 2
max_iters = 3
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.05)


def get_lr(it):
    return 0.1 * 0.5 * (1.0 + math.cos(math.pi * it / max_iters))


i = 0
xb, yb = X[0:4], Y[0:4]
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr
    for micro_step in range(accum):
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        loss = loss / accum
        i = (i + 4) % 8
        xb, yb = X[i:i + 4], Y[i:i + 4]
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"{lr:.8f} {loss.item() * accum:.8f}")
    iter_num += 1
    if iter_num > max_iters:
        break
"""


@pytest.mark.parametrize("body", [WHILE_MICRO_STEPS], ids=["while_lr_micro_clip"])
def test_linen_micro_steps_print_what_torch_prints(body: str, tmp_path: Path) -> None:
    source = HEADER + body
    result = convert_source(source, path="script.py", target="linen")
    assert [str(d) for d in result.diagnostics if d.severity == "error"] == []
    assert "apply_gradients(grads=grads)" in result.code and ".backward()" not in result.code
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "linen"
    torch_dir.mkdir()
    jax_dir.mkdir()
    _close(_run(result.code, jax_dir), _run(source, torch_dir))
