"""The common long tail of classification scripts (issue 28), converted and run against torch.

Each program is in the shape public code writes it; the torch program and its conversion
run in this process (the model's weights from ``nn.init.constant_``, the data from
``linspace``, so both sides compute the same numbers) and must print the same values.
"""

from __future__ import annotations

import contextlib
import io
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("optax")
from snippets import assert_function_matches_torch
from unbound import assert_names_bound

from torch2jax.convert import convert_source

HEADER = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        nn.init.constant_(self.fc.weight, 0.1)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return self.fc(x)


X = torch.linspace(-1.0, 1.0, 32).reshape(8, 4)
Y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
"""


def _convert(source: str, bound: bool = True) -> str:
    result = convert_source(source, path="script.py")
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == [], (errors, result.code)
    assert "TODO(torch2jax)" not in result.code, result.code
    if bound:  # (pyflakes reads a loop-carried name as unbound)
        assert_names_bound(result.code)
    return result.code


def _run(code: str) -> tuple[list[str], dict]:
    """Runs ``code`` as a script: the words it prints and its namespace."""
    out = io.StringIO()
    ns: dict = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "script.py", "exec"), ns)  # noqa: S102 - the test's own program
    return out.getvalue().split(), ns


def _close(a: list[str], b: list[str], rtol: float = 2e-5) -> None:
    assert len(a) == len(b) and a, (a, b)
    for x, y in zip(a, b):
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            assert x == y, (a, b)
            continue
        assert abs(fx - fy) <= rtol * max(abs(fx), abs(fy), 1e-3), (a, b)


def _same_as_torch(body: str, bound: bool = True) -> str:
    source = HEADER + body
    code = _convert(source, bound)
    want, _ = _run(source)
    got, _ = _run(code)
    _close(got, want)
    return code


# --------------------------------------------------------------------------------------------
# 1. an argument a rule reads twice is bound to a fresh name, evaluated once
# --------------------------------------------------------------------------------------------


def test_label_smoothing_on_a_model_call_trains_like_torch():
    """``F.cross_entropy(model(xb), yb, label_smoothing=0.1)``: the logits are read twice (the
    class count for one_hot): ``logits = model(xb)`` goes on the line before, in the step."""
    code = _same_as_torch("""
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(3):
    loss = F.cross_entropy(model(X), Y, label_smoothing=0.1)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(loss.item())
""")
    assert "logits = model(X)" in code


def test_expressions_read_twice_are_evaluated_once_in_order():
    """Where a statement before the expression would change the order (a call evaluated
    first), in a comprehension, a lambda or a branch, the binding is a walrus at the first
    read; the compound argument runs exactly as often as in torch."""
    source = """
import torch
import torch.nn.functional as F

calls = []


def scaled(a, k):
    calls.append(k)
    return a * k


def f(a, y, b):
    l1 = b.sum() + F.cross_entropy(scaled(a, 2.0), y, label_smoothing=0.1)
    l2 = [F.cross_entropy(scaled(a, k), y, label_smoothing=0.1) for k in (1.0, 3.0)]
    g = lambda z: F.cross_entropy(scaled(z, 0.5), y, label_smoothing=0.2)
    l3 = F.cross_entropy(scaled(a, 4.0), y, label_smoothing=0.1) if y.sum() > 0 else b.sum()
    l4 = F.nll_loss(F.log_softmax(a, 1), y.view(-1), ignore_index=0, weight=b.abs() + 0.5)
    l5 = F.binary_cross_entropy_with_logits(scaled(a, 5.0), (a > 0).float(),
                                            pos_weight=b.abs() + 1)
    l6 = F.mse_loss(a, a.flip(0), weight=b.abs().expand(6, 5) + 1)
    return torch.stack([l1, l2[0], l2[1], g(a), l3, l4, l5, l6])
"""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    y = np.array([1, 0, 4, 2, 0, 3])
    b = rng.standard_normal(5).astype(np.float32)
    result = convert_source(source, path="<snippet>")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    assert "(logits := scaled(a, 2.0))" in result.code  # b.sum() is evaluated first
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    want = ns_t["f"](torch.from_numpy(a), torch.from_numpy(y), torch.from_numpy(b)).numpy()
    import jax.numpy as jnp
    got = np.asarray(ns_j["f"](jnp.asarray(a), jnp.asarray(y), jnp.asarray(b)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert ns_j["calls"] == ns_t["calls"] == [2.0, 1.0, 3.0, 4.0, 5.0, 0.5]


def test_a_compound_input_of_a_shape_reading_rule_is_bound():
    """Rules that read a tensor's shape beside it (F.normalize, torch.sort, flatten of a
    range, split into size-n chunks, pixel_shuffle, interpolate) take a computed input, and
    a convolution a computed padding."""
    source = """
import torch
import torch.nn.functional as F


def f(x):
    n = F.normalize(x * 2, dim=1)
    s, i = torch.sort(x + 1, dim=1)
    flat = (x - 1).reshape(2, 3, 4).flatten(0, 1)
    parts = torch.split(x * 3, 2, dim=1)
    up = F.interpolate((x + 2).reshape(1, 2, 3, 4), scale_factor=2, mode="nearest")
    shuffled = F.pixel_shuffle((x * 4).reshape(1, 4, 3, 2), 2)
    k = 3
    conv = F.conv2d(x.reshape(1, 1, 6, 4), torch.ones(2, 1, k, k), padding=(k - 1) // 2)
    return (n.sum() + s.sum() + i.sum() + flat.sum() + parts[1].sum() + up.sum()
            + shuffled.sum() + conv.sum())
"""
    x = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    assert_function_matches_torch(source, x, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# 2. parameters iterated through zip; clone copies
# --------------------------------------------------------------------------------------------


def test_parameters_in_zip_and_a_cloned_snapshot_survive_the_train_step():
    """``before = [p.detach().clone() ...]`` holds copies (``jnp.copy``): the donated train
    step deletes the model's arrays, never the snapshot; ``zip(model.parameters(), before)``
    in a generator expression reads the trained parameters."""
    code = _same_as_torch("""
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
before = [p.detach().clone() for p in model.parameters()]
first = next(model.parameters()).dtype
for step in range(2):
    loss = F.cross_entropy(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
moved = sum(float((p - q).abs().sum()) for p, q in zip(model.parameters(), before))
print(round(moved, 5), float(sum(q.sum() for q in before)), first == torch.float32)
""")
    assert "jnp.copy(" in code and "zip(jax.tree.leaves(nnx.state(model, nnx.Param))" in code


# --------------------------------------------------------------------------------------------
# 3. common calls: norm, nelement, flip, synchronize, SummaryWriter, torch.save in a function
# --------------------------------------------------------------------------------------------


def test_norm_nelement_flip_match_torch():
    source = """
import torch


def f(x: torch.Tensor):
    return torch.stack([x.norm(), x.norm(dim=1).sum(), x.norm(p=1, dim=(0, 1)),
                        x.norm(3, -1, keepdim=True).sum(), x.norm(p="fro"),
                        x.norm(float("inf"), 0).sum(), torch.norm(x, dim=0).sum(),
                        x.flip(0)[0, 1], x.flip(0, 1)[0, 1], x.flip(dims=[1])[1, 0],
                        torch.flip(x, [0])[0, 2], torch.tensor(float(x.nelement()))])
"""
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    assert_function_matches_torch(source, x, rtol=1e-5, atol=1e-6)


class _Writer:
    """A recording SummaryWriter (tensorboard and tensorboardX are not test dependencies)."""

    def __init__(self, log_dir=None, **kwargs):
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        _Writer.last = self

    def add_scalar(self, tag, value, step=None):
        self.scalars.append((tag, float(value), step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_timing_and_tensorboard_logging_run_without_torch(monkeypatch):
    """A loop timed with ``torch.cuda.synchronize()`` and logged with torch's SummaryWriter:
    the converted program waits with ``jax.block_until_ready(jax.live_arrays())``, logs with
    tensorboardX's SummaryWriter (same API, no torch) and imports no torch: it runs with
    torch made unimportable."""
    source = HEADER + """
import time
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("runs/exp")
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(3):
    t0 = time.perf_counter()
    loss = F.cross_entropy(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    writer.add_scalar("train/loss", loss.item(), step)
    print(loss.item(), elapsed >= 0)
writer.close()
"""
    code = _convert(source)
    assert "jax.block_until_ready(jax.live_arrays())" in code
    assert "tensorboardX.SummaryWriter(\"runs/exp\")" in code
    assert "import torch" not in code and "from torch" not in code
    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = _Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", board)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # no CUDA here
    want, _ = _run(source)
    logged = _Writer.last.scalars
    monkeypatch.setitem(sys.modules, "tensorboardX", types.SimpleNamespace(
        SummaryWriter=_Writer))
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import torch fails from here on
    got, _ = _run(code)
    _close(got, want)
    assert _Writer.last.closed and _Writer.last.log_dir == "runs/exp"
    assert [(t, s) for t, _, s in _Writer.last.scalars] == [(t, s) for t, _, s in logged]
    _close([str(v) for _, v, _ in _Writer.last.scalars], [str(v) for _, v, _ in logged])


OPTIONAL_BOARD = """
import argparse

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:  # tensorboard is optional: no event files without it
    SummaryWriter = None

parser = argparse.ArgumentParser()
parser.add_argument("--log-dir", default="")
args = parser.parse_args(ARGS)
writer = SummaryWriter(log_dir=args.log_dir) if SummaryWriter is not None and args.log_dir \\
    else None
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(3):
    loss = F.cross_entropy(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if writer is not None:
        writer.add_scalar("Loss/train", loss.item(), step)
        writer.flush()
    print(loss.item())
"""


@pytest.mark.parametrize("log_dir", ["", "runs/exp"])
@pytest.mark.parametrize("installed", [False, True])
def test_optional_tensorboard_import_needs_no_torch(monkeypatch, installed, log_dir):
    """makemore's optional writer (``try: from torch.utils.tensorboard import SummaryWriter``
    / ``except ImportError: SummaryWriter = None``, then a writer only where it imported and
    the program asks for one): the optional import is of tensorboardX's SummaryWriter (the
    same API, no torch), the program's own fallback stays, and nothing imports torch. With
    tensorboardX absent or the flag off it runs without a writer; with both it logs what
    torch's writer logs."""
    source = HEADER + OPTIONAL_BOARD.replace("ARGS", repr(["--log-dir", log_dir] if log_dir
                                                          else []))
    code = _convert(source)
    assert "    from tensorboardX import SummaryWriter\n" in code
    assert "import torch" not in code and "from torch" not in code
    board = types.ModuleType("torch.utils.tensorboard")
    board.SummaryWriter = _Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", board if installed else None)
    _Writer.last = None
    want, _ = _run(source)
    logged = _Writer.last.scalars if _Writer.last is not None else None
    assert (logged is not None) == (installed and bool(log_dir))  # (the premise)
    _Writer.last = None
    monkeypatch.setitem(sys.modules, "tensorboardX", types.SimpleNamespace(
        SummaryWriter=_Writer) if installed else None)
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.")]:
        monkeypatch.setitem(sys.modules, name, None)  # import torch fails from here on
    got, _ = _run(code)
    _close(got, want)
    if logged is None:
        assert _Writer.last is None
    else:
        assert _Writer.last.log_dir == log_dir
        assert [(t, s) for t, _, s in _Writer.last.scalars] == [(t, s) for t, _, s in logged]
        _close([str(v) for _, v, _ in _Writer.last.scalars], [str(v) for _, v, _ in logged])


def test_checkpoint_dict_saved_inside_a_function_round_trips(tmp_path, monkeypatch):
    """``torch.save({"model": model.state_dict(), "config": config, ...}, path)`` in a
    function: an orbax PyTree checkpoint of the dict (state_dicts as nnx.state pure dicts),
    which the converted ``torch.load`` + ``load_state_dict`` restore."""
    body = """
def save(model, config, path):
    torch.save({"model": model.state_dict(), "config": config, "step": 3}, path)


def load(model, path):
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    return checkpoint["config"], checkpoint["step"]


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(2):
    loss = F.cross_entropy(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
save(model, {"lr": 0.5, "layers": 2}, "ckpt")
other = Net()
config, step = load(other, "ckpt")
print(config["lr"], config["layers"], step, float((other(X) ** 2).sum()), float((model(X) ** 2).sum()))
"""
    source = HEADER + body
    code = _convert(source)
    assert "ocp.PyTreeCheckpointer().save(" in code
    (tmp_path / "torch").mkdir()
    (tmp_path / "jax").mkdir()
    monkeypatch.chdir(tmp_path / "torch")
    want, _ = _run(source)
    monkeypatch.chdir(tmp_path / "jax")
    got, _ = _run(code)
    _close(got, want)
    assert got[3] == got[4] and want[3] == want[4]  # the trained weights were restored


# --------------------------------------------------------------------------------------------
# 4. a loop-carried name read before its assignment
# --------------------------------------------------------------------------------------------


def test_a_loop_carried_tensor_read_before_its_assignment_is_a_tensor():
    """``prev.sum().item()`` at the top of the loop body, ``prev`` assigned further down:
    every assignment of ``prev`` in its scope binds a tensor, so it is one."""
    code = _same_as_torch("""
for i in range(3):
    if i > 0:
        print(i, prev.sum().item(), prev.norm().item(), prev.nelement())
    prev = X * i + 1
""", bound=False)
    assert "prev.sum().item()" in code


def test_the_loss_read_at_the_top_of_a_training_loop_is_the_previous_steps():
    """``print(loss.item())`` at the top of the loop body reads the loss of the step before
    (``loss`` is a tensor: every assignment binds one); the statement stays before the train
    step call, not after it."""
    code = _same_as_torch("""
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(4):
    if step > 0:
        print(step, loss.item())
    loss = F.cross_entropy(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
""", bound=False)
    assert code.index("print(step, loss.item())") < code.index("loss = train_step(")
