"""torch's implicit gradient state (issue 28): ``backward()`` accumulates into ``.grad``,
``zero_grad()`` resets it, ``optimizer.step()`` applies it.

Micro-step accumulation is translated wherever its loop stands (nested in the epoch loop, in a
helper function, a ``while``), with ``(loss / k).backward()``: the converted program must print
torch's numbers. A ``backward()`` or a ``step()`` no translation recognises is marked on every
target (finish/grad_state.py), never left to fail at run time (``ArrayImpl has no attribute
backward``).
"""

from __future__ import annotations

import re

import pytest
import variants as v
from launch import compiled_while
from test_training_scripts import HEADER

from torch2jax.convert import convert_source

# micro-steps in a helper that receives the model and the optimizer, the batch indexed by
# the epoch loop's counter, zero_grad at the end of the step, clipping of the sum under a
# condition (nanoGPT's ``if grad_clip != 0.0``), the learning rate set at each step
MICRO_IN_HELPER = HEADER + """
grad_clip = 0.2
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)


def train_one_step(model, optimizer, xb, yb, k):
    for micro in range(k):
        part = slice(micro * 2, micro * 2 + 2)
        loss = F.cross_entropy(model(xb[part]), yb[part])
        (loss / k).backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


for epoch in range(3):
    for i in range(0, 8, 4):
        for param_group in optimizer.param_groups:
            param_group["lr"] = 0.2 * 0.5 ** (epoch + i / 8)
        loss = train_one_step(model, optimizer, X[i:i + 4], Y[i:i + 4], 2)
        print(f"{loss.item():.8f}")
print(f"{model.fc.weight.sum().item():.8f}")
"""

# the backward in a helper called from the loop, the step in the loop: not translated yet
BACKWARD_IN_HELPER = HEADER + """
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def compute(model, xb, yb):
    loss = F.cross_entropy(model(xb), yb)
    loss.backward()
    return loss


for i in range(0, 8, 4):
    optimizer.zero_grad()
    loss = compute(model, X[i:i + 4], Y[i:i + 4])
    optimizer.step()
    print(f"{loss.item():.8f}")
"""


@pytest.mark.slow
def test_micro_steps_in_a_helper_print_torchs_numbers() -> None:
    torch_lines = v.run_source(MICRO_IN_HELPER)
    result = convert_source(MICRO_IN_HELPER, path="s.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "TODO(torch2jax)" not in result.code
    # one compiled step (issue 30): the loop collects the micro-batches, a jax.lax.scan
    # sums their gradients and the update applies the sum, in one nnx.jit
    assert "def accum_step(" in result.code and "jax.lax.scan(" in result.code
    assert "def grad_step(" not in result.code and "def apply_grads(" not in result.code
    assert result.code.count("@nnx.jit") == 1
    jax_lines, compiles = compiled_while(lambda: v.run_source(result.code))
    assert v.same_output(jax_lines, torch_lines, 2e-5) is None, (jax_lines, torch_lines)
    # defined at the top level (the helper reads nothing local to it): compiled once over
    # the 6 steps, not at every call of the helper, and no step called per micro-step
    assert len([c for c in compiles if "jit(accum_step)" in c]) == 1, compiles
    assert not [c for c in compiles if "jit(grad_step)" in c or "jit(apply_grads)" in c]


@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
def test_a_backward_no_translation_recognises_is_marked(target) -> None:
    result = convert_source(BACKWARD_IN_HELPER, path="s.py", target=target)
    lines = result.code.splitlines()
    calls = [i for i, line in enumerate(lines) if not line.lstrip().startswith("#")
             and re.search(r"\.backward\(|optimizer\.step\(\)|\.zero_grad\(", line)]
    assert any(".backward(" in lines[i] for i in calls), result.code
    for i in calls:
        assert lines[i - 1].strip().startswith("# TODO(torch2jax):"), (lines[i], result.code)
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert any(d.line == 30 for d in errors), errors  # loss.backward(), the input's line


# torch keeps the last micro-step's gradients only (zero_grad inside the loop), or never
# clears them: not a sum from zero, so not the accumulating translation; marked
ZERO_INSIDE = HEADER + """
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(0, 8, 4):
    for micro in range(2):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X[i:i + 4]), Y[i:i + 4])
        loss.backward()
    optimizer.step()
"""
NEVER_CLEARED = ZERO_INSIDE.replace("        optimizer.zero_grad()\n", "")


@pytest.mark.parametrize("source", [ZERO_INSIDE, NEVER_CLEARED], ids=["inside", "never"])
def test_micro_steps_that_do_not_sum_from_zero_are_marked(source) -> None:
    result = convert_source(source, path="s.py")
    lines = result.code.splitlines()
    back = next(i for i, line in enumerate(lines) if line.strip() == "loss.backward()")
    assert lines[back - 1].strip().startswith("# TODO(torch2jax):"), result.code
    assert "grad_step" not in result.code
