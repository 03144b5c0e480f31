"""Micro-step gradient accumulation on ``--target linen`` (targets/linen_accum.py).

nanoGPT's training loop, reduced to constant weights and tests/test_training_scripts.py's data:
``while True`` around a learning rate set by hand, micro-steps whose next batch is drawn after
the forward and before ``backward()``, a guarded clip, one ``step()``, ``break`` after
``max_iters``; with it the glue around the loop that NNX translates (an evaluation function
reading the module's model, a checkpoint dict, nanoGPT's init loop over named_parameters(), a
parameter count). Linen rebinds the TrainState after the micro-steps. The converted script
must print torch's evaluation losses, learning rates and losses (each update's last
micro-step) and the parameter count, number for number. The ``for`` form (``micro_steps_clip``)
runs in tests/test_training_linen.py's parametrized script test.
"""

from __future__ import annotations

from pathlib import Path

from test_training_scripts import HEADER, _close, _run

from torch2jax.convert import convert_source

WHILE_MICRO_STEPS = """
import math
import os
import tempfile


class Block(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.c_proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.c_proj(x))


class Tiny(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.block = Block(scale)
        self.fc = nn.Linear(4, 3)
        self.apply(self._init_weights)
        # nanoGPT's scaled init of the residual projections, drawn last
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.constant_(p, 0.03 * scale)
        print("number of parameters: %.2fK" % (self.get_num_params() / 1e3,))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.constant_(module.weight, 0.1)
            nn.init.zeros_(module.bias)

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x):
        return self.fc(self.block(x))


out_dir = tempfile.mkdtemp()
grad_clip = 0.05  # (active: the gradients' norm is about 0.1)
accum = 2
max_iters = 3
model = Tiny(2.0)
# SGD: Adam would scale the block's gradients, zero up to rounding, to whole steps
optimizer = torch.optim.SGD(model.parameters(), lr=2.0, momentum=0.9, weight_decay=0.05)
raw_model = model


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = F.cross_entropy(model(X), Y)
    model.train()
    return out


def get_lr(it):
    return 2.0 * 0.5 * (1.0 + math.cos(math.pi * it / max_iters))


i = 0
xb, yb = X[0:4], Y[0:4]
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr
    if iter_num % 2 == 0:
        val = estimate_loss()
        print(f"{val.item():.8f}")
        checkpoint = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                      'iter_num': iter_num}
        torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))
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
print(raw_model.get_num_params())
"""


def test_linen_training_glue_prints_what_torch_prints(tmp_path: Path) -> None:
    """The while loop's micro-steps, its learning rate set by hand and its clip; the
    evaluation function that reads the module's model (estimate_loss) between updates; the
    checkpoint dict saved in the loop (orbax); the init loop over named_parameters()
    (constant, so the numbers agree); a parameter count read through an alias of the model
    (raw_model) after training. The count printed by the constructor is removed on linen
    (warned): torch's line of it is left out of the comparison."""
    source = HEADER + WHILE_MICRO_STEPS
    result = convert_source(source, path="script.py", target="linen")
    assert [str(d) for d in result.diagnostics if d.severity == "error"] == []
    assert any(d.severity == "warning" and "parameter count" in d.message
               for d in result.diagnostics)
    assert "apply_gradients(grads=grads)" in result.code and ".backward()" not in result.code
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "linen"
    torch_dir.mkdir()
    jax_dir.mkdir()
    expected = _run(source, torch_dir)
    assert expected[:3] == ["number", "of", "parameters:"], expected
    _close(_run(result.code, jax_dir), expected[4:])


EVAL_BEFORE_TRAINING = """
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


@torch.no_grad()
def estimate_loss():
    return F.cross_entropy(model(X), Y)


print(estimate_loss().item())
for step in range(3):
    loss = F.cross_entropy(model(X), Y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(estimate_loss().item())
"""


def test_an_evaluation_before_the_variables_exist_is_marked() -> None:
    """estimate_loss() reads the module's variables: called before the training loop binds
    them, the call is marked (it would raise a NameError); in the loop, the variables of the
    update are bound before it."""
    result = convert_source(HEADER + EVAL_BEFORE_TRAINING, path="script.py", target="linen")
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert [(d.rule, d.line) for d in errors] == [("linen", HEADER.count("\n") + 11)], errors
    lines = result.code.splitlines()
    marked = [i for i, ln in enumerate(lines) if "TODO(torch2jax): estimate_loss()" in ln]
    assert len(marked) == 1 and lines[marked[0] + 1] == "print(estimate_loss().item())"
    loop = lines.index("for step in range(3):")
    assert lines[loop + 2:loop + 4] == ['    variables = {"params": state.params}',
                                        "    print(estimate_loss().item())"], lines[loop:]
