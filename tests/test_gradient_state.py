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
import textwrap

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

# the backward in a helper called from the loop, the step in the loop: .grad as an
# accumulator on NNX (passes/held_steps.py _free_step); linen and equinox mark it
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


def _renamed(source: str) -> str:
    """The helper's parameters named apart from the globals it is given, zero_grad() in the
    helper, and clipping in the caller's loop just before the step."""
    return (source.replace("def compute(model, xb, yb):", "def compute(net, xb, yb):")
            .replace("F.cross_entropy(model(xb), yb)", "F.cross_entropy(net(xb), yb)")
            .replace("    loss.backward()\n", "    optimizer.zero_grad()\n    loss.backward()\n")
            .replace("    optimizer.zero_grad()\n    loss = compute", "    loss = compute")
            .replace("    optimizer.step()\n", "    torch.nn.utils.clip_grad_norm_("
                     "model.parameters(), 0.05)\n    optimizer.step()\n"))


@pytest.mark.parametrize("variant", ["as written", "renamed"])
def test_a_backward_in_a_helper_with_the_step_in_the_loop_prints_torchs_numbers(variant):
    source = BACKWARD_IN_HELPER if variant == "as written" else _renamed(BACKWARD_IN_HELPER)
    assert source.count("clip_grad_norm_") == (variant == "renamed")
    result = convert_source(source, path="s.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "def grad_step(" in result.code and "def apply_grads(" in result.code
    assert v.same_output(v.run_source(result.code), v.run_source(source), 2e-5) is None


def test_a_helper_given_another_model_than_the_optimizers_is_marked() -> None:
    source = BACKWARD_IN_HELPER.replace(
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nother = Net()\n").replace(
        "compute(model, X", "compute(other, X")
    result = convert_source(source, path="s.py")
    assert "def apply_grads(" not in result.code
    assert "# TODO(torch2jax)" in result.code and "loss.backward()" in result.code


@pytest.mark.parametrize("target", ["linen", "equinox"])
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


# nanoGPT's loop (issue 30): the outermost loop of its scope sets the learning rate, collects
# the micro-batches and steps; the model is read after the loop. The state is split once
# before the loop, donated to one jax.jit step with the learning rate its argument, written
# back after it. The loop in a function that builds the model (train.py's shape), at the top
# level, without a learning rate set; and two variants that read the model between steps (in
# the loop, through a helper reading it as a global), which keep the nnx.jit step.
ONE_LOOP = HEADER + """
def main():
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    for it in range(6):
        lr = 0.1 * 0.5 ** it
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        i = (it % 2) * 4
        for micro in range(2):
            part = slice(i + micro * 2, i + micro * 2 + 2)
            loss = F.cross_entropy(model(X[part]), Y[part])
            (loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"{loss.item():.8f}")
    print(f"{model.fc.weight.sum().item():.8f}")


main()
"""
_TOP = HEADER + textwrap.dedent(ONE_LOOP[len(HEADER):].replace("def main():\n", "").replace(
    "\n\nmain()\n", ""))
ONE_LOOP_VARIANTS = {
    "in_function": (ONE_LOOP, True),
    "top_level_no_lr": ("\n".join(line for line in _TOP.splitlines() if not re.match(
        r"\s*(lr =|for param_group|param_group\[)", line)) + "\n", True),
    "reads_model_in_loop": (ONE_LOOP.replace(
        '        print(f"{loss.item():.8f}")\n',
        '        print(f"{loss.item():.8f} {model.fc.bias.sum().item():.6f}")\n'), False),
    "helper_reads_global_model": (_TOP.replace("for it in range(6):", "def report():\n"
                                               "    print(f\"{model.fc.bias[0].item():.6f}\")"
                                               "\n\n\nfor it in range(6):").replace(
        '    print(f"{loss.item():.8f}")\n', '    print(f"{loss.item():.8f}")\n    report()\n'),
        False),
}


@pytest.mark.parametrize("name", ONE_LOOP_VARIANTS)
def test_micro_steps_of_the_outermost_loop_step_the_split_state(name) -> None:
    source, split = ONE_LOOP_VARIANTS[name]
    torch_lines = v.run_source(source)
    result = convert_source(source, path="s.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "TODO(torch2jax)" not in result.code
    code = result.code
    assert ("graphdef, train_state = nnx.split((model, optimizer))" in code) is split, code
    if split:
        lr = ", lr" if "param_group" in source else ""
        assert re.search(r"@partial\(jax\.jit, donate_argnums=0\)\n\s*def accum_step\("
                         rf"train_state, batches{lr}\):", code), code
        assert "@nnx.jit" not in code and "opt_state" in code if lr else "@nnx.jit" not in code
        assert code.count("nnx.update((model, optimizer), train_state)") == 1
    else:
        assert "@nnx.jit" in code and "def accum_step(model, optimizer, " in code
    jax_lines, compiles = compiled_while(lambda: v.run_source(code))
    assert v.same_output(jax_lines, torch_lines, 2e-5) is None, (jax_lines, torch_lines)
    assert len([c for c in compiles if "jit(accum_step)" in c]) == 1, compiles
