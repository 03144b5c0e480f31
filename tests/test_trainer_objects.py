"""A trainer object (issue 28): the model and optimizer held as attributes, stepped in a method.

minGPT's ``Trainer.run`` and many trainers keep ``self.optimizer`` (built in ``__init__`` or in
the method) and step it in a method, with callbacks and per-iteration logging around the step.
The conversion reads the optimizer (and the model it updates) through locals of the stepping
method (passes/optimizer_attributes.py), so the step becomes one jitted step over the trainer's
``nnx.Optimizer``. Each program below is deterministic (weights from ``nn.init.constant_``,
data from ``linspace``): the converted program must print torch's losses, step by step.

Also here: minGPT's ``configure_optimizers`` over a module whitelist (``named_modules()`` x
``named_parameters()`` sorted by ``isinstance(m, whitelist)``) as an optax mask by torch's
parameter names, and a Dataset whose ``__getitem__`` draws from torch's global generator (numpy's
global generator on the host).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_training_scripts import HEADER, _close, _convert, _run

from torch2jax.convert import convert_source

CALLBACKS = """
from collections import defaultdict


class Trainer:
    def __init__(self, model, max_iters):
        self.model = model
        self.max_iters = max_iters
        self.callbacks = defaultdict(list)
        self.iter_num = 0

    def add_callback(self, onevent, callback):
        self.callbacks[onevent].append(callback)

    def trigger_callbacks(self, onevent):
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self):
        model = self.model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
        while True:
            logits = model(X)
            self.loss = F.cross_entropy(logits, Y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            if self.iter_num >= self.max_iters:
                break


def on_batch_end(trainer):
    print(f"{trainer.iter_num} {trainer.loss.item():.8f}")


torch.manual_seed(0)
trainer = Trainer(Net(), 6)
trainer.add_callback("on_batch_end", on_batch_end)
trainer.run()
print(f"{float(torch.sum(trainer.model(X))):.6f}")
"""

TRAINERS = {
    # built in __init__, stepped in a train_step method with clipping; a callback list and a
    # loss history on the trainer
    "built_in_init": """
class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.history = []
        self.callbacks = []

    def add_callback(self, fn):
        self.callbacks.append(fn)

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)
        self.optimizer.step()
        self.history.append(loss.item())
        for fn in self.callbacks:
            fn(self)
        return loss


def log(trainer):
    print(f"{trainer.history[-1]:.8f}")


torch.manual_seed(0)
trainer = Trainer(Net(), 0.1)
trainer.add_callback(log)
for step in range(6):
    trainer.train_step(X, Y)
""",
    # minGPT's shape: built in run() from the model's configure_optimizers, stepped in its
    # loop; the loss kept on the trainer for the callbacks
    "built_in_run": """
def configure_optimizers(model, lr):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)


class Trainer:
    def __init__(self, model, max_iters):
        self.model = model
        self.max_iters = max_iters
        self.callbacks = {}
        self.iter_num = 0

    def set_callback(self, event, fn):
        self.callbacks[event] = fn

    def run(self):
        model = self.model
        self.optimizer = configure_optimizers(model, 0.05)
        model.train()
        while True:
            logits = model(X)
            self.loss = F.cross_entropy(logits, Y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            self.optimizer.step()
            self.last_loss = self.loss.item()
            self.callbacks["on_batch_end"](self)
            self.iter_num += 1
            if self.iter_num >= self.max_iters:
                break


def on_batch_end(trainer):
    print(f"{trainer.iter_num} {trainer.last_loss:.8f}")


torch.manual_seed(0)
trainer = Trainer(Net(), 6)
trainer.set_callback("on_batch_end", on_batch_end)
trainer.run()
""",
    # minGPT's callbacks: add_callback / trigger_callbacks call each with the trainer, which
    # reads trainer.loss.item() (the loss the run loop keeps, a tensor). Nothing in the loop
    # reads the model or the optimizer but the step: their state stays split, and is written
    # back after the loop (the model's output read there)
    "callbacks": CALLBACKS,
}


def _torch(source: str, tmp_path: Path) -> list[str]:
    pytest.importorskip("torch")
    path = tmp_path / "torch_script.py"
    path.write_text(source)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_a_trainer_object_steps_like_torch(name: str, tmp_path: Path) -> None:
    source = HEADER + TRAINERS[name]
    code = _convert(source)  # no error: nothing marked
    assert "nnx.Optimizer(" in code and ".backward(" not in code and "torch" not in code
    if name == "callbacks":  # the loop reads the model only through the step: split state
        assert "graphdef, train_state = nnx.split((model, optimizer))" in code
        assert "train_state, loss = train_step(train_state)" in code
    want = _torch(source, tmp_path)
    got = _run(code, tmp_path)
    assert len(want) >= 6
    _close(got, want)
    # the method is called at every step: its jitted step is defined once, at the top level,
    # and compiled once (a step defined inside the method would compile at every call)
    done = subprocess.run([sys.executable, str(tmp_path / "script.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "JAX_LOG_COMPILES": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    compiles = re.findall(r"Compiling jit\((train_step\w*)\)", done.stderr)
    assert len(compiles) == 1, compiles


def test_an_optimizer_attribute_reassigned_in_the_stepping_method_stays_marked() -> None:
    """Two assignments of ``self.optimizer`` in the method that steps it: which object a step
    reads depends on the order at run time, so no local stands for it: the step stays marked
    (never a step of an optimizer the trainer no longer holds)."""
    source = HEADER + textwrap.dedent("""\
        class Trainer:
            def run(self, model, lrs):
                self.optimizer = torch.optim.SGD(model.parameters(), lr=lrs[0])
                for lr in lrs:
                    self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
                    self.optimizer.zero_grad()
                    F.cross_entropy(model(X), Y).backward()
                    self.optimizer.step()
        """)
    result = convert_source(source, path="s.py")
    lines = result.code.splitlines()
    step = next(i for i, line in enumerate(lines) if line.strip() == "self.optimizer.step()")
    assert "TODO(torch2jax)" in lines[step - 1], lines[step - 1]


# minGPT's configure_optimizers over a whitelist, in a model of its own: a Sequential-free
# model with Linear, LayerNorm and Embedding layers, two AdamW groups by name
_WHITELIST = """
import json
import torch
import torch.nn as nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(2)])
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 5, bias=False)

    def configure_optimizers(self, lr, weight_decay):
        decay, no_decay = set(), set()
        whitelist = (torch.nn.Linear,)
        blacklist = (torch.nn.LayerNorm, torch.nn.Embedding)
        for mn, m in self.named_modules():
            for pn, p in m.named_parameters():
                fpn = '%s.%s' % (mn, pn) if mn else pn
                if pn.endswith('bias'):
                    no_decay.add(fpn)
                elif pn.endswith('weight') and isinstance(m, whitelist):
                    decay.add(fpn)
                elif pn.endswith('weight') and isinstance(m, blacklist):
                    no_decay.add(fpn)
        param_dict = {pn: p for pn, p in self.named_parameters()}
        groups = [
            {"params": [param_dict[pn] for pn in sorted(decay)], "weight_decay": weight_decay},
            {"params": [param_dict[pn] for pn in sorted(no_decay)], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=lr)


model = Tiny()
optimizer = model.configure_optimizers(0.01, 0.5)
"""
_WHITELIST_TORCH = """
for p in model.parameters():
    p.grad = torch.zeros_like(p)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(1.0)
optimizer.step()
moved = sorted(n for n, p in model.named_parameters() if not torch.all(p == 1.0))
print(json.dumps(moved))
"""
_WHITELIST_JAX = """
import jax.numpy as jnp
nnx.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))
optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
print(json.dumps(sorted(torch_parameter_name(path) for path, p in flat
                        if not bool(jnp.all(p == 1.0)))))
"""


def test_a_whitelist_configure_optimizers_decays_the_tensors_torch_decays(tmp_path) -> None:
    """Stepped once with zero gradients from all-ones weights, only weight decay moves a
    parameter: the same tensors move on both sides (the three Linear weights; not the
    biases, the LayerNorm or the Embedding)."""
    result = convert_source(_WHITELIST, path="tiny.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "isinstance(module, nnx.Module)" in result.code  # the walk over NNX's modules
    assert "(nnx.LayerNorm, nnx.Embed)" in result.code
    want = _torch(_WHITELIST + _WHITELIST_TORCH, tmp_path)
    path = tmp_path / "jax_side.py"
    path.write_text(result.code + _WHITELIST_JAX)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = done.stdout.split()
    assert got == want
    assert want == ['["blocks.0.weight",', '"blocks.1.weight",', '"head.weight"]']


_DRAWING_DATASET = """
import torch
from torch.utils.data import Dataset


class Digits(Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return 1000

    def __getitem__(self, idx):
        while True:
            x = torch.randint(3, size=(self.length,), dtype=torch.long)
            if torch.rand(1).item() < 0.5 or x.unique().nelement() > 1:
                break
        noise = torch.randn(self.length)
        return x, torch.sort(x)[0], noise


torch.manual_seed(0)
data = Digits(6)
items = [data[i] for i in range(400)]
xs = torch.stack([x for x, _, _ in items])
print(xs.dtype == torch.int64, int(xs.min()), int(xs.max()), xs.shape[1])
print(all(bool((torch.sort(x)[0] == s).all()) for x, s, _ in items))
noise = torch.stack([n for _, _, n in items])
print(f"{abs(float(noise.mean())):.1f} {float(noise.std()):.1f} {noise.dtype}")
"""


def test_a_global_draw_in_getitem_is_numpy_on_the_host(tmp_path) -> None:
    """``torch.randint`` / ``torch.rand`` / ``torch.randn`` without a generator in a Dataset's
    ``__getitem__``: drawn by numpy's global generator (seeded where the program seeds torch,
    tests/test_seeds_across_files.py), not a JAX key per item. The draws have torch's ranges,
    shapes and dtypes."""
    result = convert_source(_DRAWING_DATASET, path="data.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    code = result.code
    assert "np.random.seed(0)\nkey = jax.random.key(0)" in code  # torch.manual_seed(0)
    assert "np.random.randint(0, 3, size=(self.length,), dtype=np.int64)" in code
    assert "np.random.random(1).astype(np.float32)" in code
    assert "np.random.standard_normal(self.length).astype(np.float32)" in code
    assert "jax.random" not in code.split("def __getitem__")[1].split("\n\n")[0]
    getitem = code.split("def __getitem__")[1].split("\n\n")[0]
    assert "np.sort(x, axis=-1)" in getitem and "argsort" not in getitem  # torch.sort(x)[0]
    want = _torch(_DRAWING_DATASET, tmp_path)
    assert _run(code, tmp_path) == want[:-1] + ["float32"]  # torch.float32 / float32
    # a program that never seeds: a fixed stream (seeded 0 at import), said
    unseeded = convert_source(_DRAWING_DATASET.replace("torch.manual_seed(0)\n", ""),
                              path="data.py")
    assert "np.random.seed(0)  # torch's global generator is never seeded" in unseeded.code
    assert any(d.severity == "info" and "seeded with 0" in d.message
               for d in unseeded.diagnostics), unseeded.diagnostics


# what a callback may do that keeps the trainer's step the nnx.jit one (its state not split:
# the model and the optimizer are read between steps, outside the step)
_READS = {
    "the trainer's model": ('print(f"{trainer.iter_num} {trainer.loss.item():.8f}")',
                            'print(f"{float(torch.sum(trainer.model(X))):.8f}")'),
    "the global model": ('print(f"{trainer.iter_num} {trainer.loss.item():.8f}")',
                         'print(f"{float(torch.sum(net(X))):.8f}")'),
    "the trainer's optimizer": ('print(f"{trainer.iter_num} {trainer.loss.item():.8f}")',
                                'print(trainer.optimizer is not None)'),
    "the trainer passed on": ('print(f"{trainer.iter_num} {trainer.loss.item():.8f}")',
                              'show(trainer)'),
    "a lambda registered": ('trainer.add_callback("on_batch_end", on_batch_end)',
                            'trainer.add_callback("on_batch_end", lambda t: print(t.model))'),
    "a list of the trainer's holding the model": (
        "        self.iter_num = 0\n",
        "        self.iter_num = 0\n        self.kept = []\n        self.kept.append(model)\n",
        'print(f"{trainer.iter_num} {trainer.loss.item():.8f}")', "print(trainer.kept)"),
    "the loop's condition": ("        while True:", "        while model.training:"),
    "the model put among the callbacks": (
        "        self.callbacks[onevent].append(callback)\n",
        ("        self.callbacks[onevent].append(callback)\n"
         "        self.callbacks['x'].append(self.model)\n")),
}


def _callback_variant(what: str) -> str:
    edits = _READS[what]
    source = CALLBACKS.replace("trainer = Trainer(Net(), 6)", "net = Net()\n"
                               "trainer = Trainer(net, 6)")
    for old, new in zip(edits[::2], edits[1::2]):
        assert old in source
        source = source.replace(old, new, 1)
    return HEADER + source + "\n\ndef show(t):\n    print(t.model)\n"


@pytest.mark.parametrize("what", sorted(_READS))
def test_a_callback_that_reads_the_model_keeps_the_step_on_the_objects(what: str) -> None:
    """A callback the run loop calls with the trainer that reads the model or the optimizer
    (through the trainer, as a global, or wherever the trainer is passed on), or one that is
    not a function of the file, or the loop's own condition reading the model: the loop does
    not keep their state split (it would read donated arrays); the step is the nnx.jit one,
    on the objects (its numbers: the other trainers above)."""
    code = convert_source(_callback_variant(what), path="script.py").code
    assert "nnx.split((model, optimizer))" not in code
    assert re.search(r"@nnx\.jit.*\n\s*def train_step\(model, optimizer", code)
