"""A step taken in one mode of a shared loop body, on equinox (issue 32):
``tests/data/programs/run_epoch_modes.py``'s ``run_epoch(model, loader, optimizer,
train=True)``, whose step is taken only ``if train:``, called for both phases of each epoch.

Before, the step in the ``if`` inside the loop stayed marked on equinox (2 TODOs: the
backward() and the step) and the program could not run. Now the NNX form defines the step in
run_epoch before its loop, and the equinox pass hoists it to the top level with the optimizer
run_epoch receives, run_epoch taking and returning the model and the optimizer state.

The converted program is run given torch's data (its ``torch.randn`` draws) and initial
weights, without shuffling: every printed loss and accuracy must be torch's. A variant with
run_epoch's parameters renamed (``net``, ``dl``, ``opt``, ``training``) must print the same.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("equinox")
pytest.importorskip("optax")
pytest.importorskip("grain")

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "run_epoch_modes.py"
BUILT = "model = Net(key=subkey)\n"
_NUMBER = re.compile(r"\d+\.\d+")


def _unshuffled(source: str) -> str:
    out = source.replace("batch_size=16, shuffle=True", "batch_size=16")
    assert out != source
    return out


def _renamed(source: str) -> str:
    start, end = source.index("def run_epoch"), source.index("model = Net()")
    fn = source[start:end]
    for old, new in (("(model, loader, optimizer, train=True)", "(net, dl, opt, training=True)"),
                     ("model.train() if train else model.eval()",
                      "net.train() if training else net.eval()"),
                     ("in loader:", "in dl:"), ("optimizer.", "opt."), ("model(xb)", "net(xb)"),
                     ("if train:", "if training:")):
        assert old in fn, old
        fn = fn.replace(old, new)
    rest = source[end:].replace("train=True)", "training=True)")
    rest = rest.replace("train=False)", "training=False)")
    assert rest.count("training=") == 2
    return source[:start] + fn + rest


def _torch_run(source: str) -> tuple[list[str], dict, list]:
    """torch's run of ``source``: its printed lines, its model's initial weights and its
    ``torch.randn`` draws (the data)."""
    import torch

    draws: list = []
    weights: dict = {}
    randn = torch.randn

    def recording_randn(*args, **kwargs):
        draws.append(randn(*args, **kwargs))
        return draws[-1]

    def record(model):
        weights.update({k: v.detach().numpy().copy() for k, v in model.state_dict().items()})

    marked = source.replace("model = Net()\n", "model = Net()\n_record(model)\n")
    assert marked != source
    buf = io.StringIO()
    torch.randn = recording_randn
    try:
        with contextlib.redirect_stdout(buf):
            space = {"__name__": "__main__", "_record": record}
            exec(compile(marked, "torch_program.py", "exec"), space)  # noqa: S102
    finally:
        torch.randn = randn
    return buf.getvalue().splitlines(), weights, [d.numpy().copy() for d in draws]


def _jax_run(code: str, weights: dict, draws: list) -> list[str]:
    """The converted program run with torch's draws for ``jax.random.normal`` and torch's
    initial weights given to the model it builds."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    pending = list(draws)
    normal = jax.random.normal

    def torch_normal(key, shape, *args, **kwargs):
        data = pending.pop(0)
        assert data.shape == tuple(shape)
        return jnp.asarray(data)

    def torch_weights(model):
        for layer, get in (("body.0", lambda m: m.body.layers[0]),
                           ("body.2", lambda m: m.body.layers[2]), ("head", lambda m: m.head)):
            for leaf in ("weight", "bias"):
                model = eqx.tree_at(lambda m, g=get, f=leaf: getattr(g(m), f), model,
                                    jnp.asarray(weights[f"{layer}.{leaf}"]))
        return model

    assert code.count(BUILT) == 1
    marked = code.replace(BUILT, BUILT + "model = _torch_weights(model)\n")
    buf = io.StringIO()
    jax.random.normal = torch_normal
    try:
        with contextlib.redirect_stdout(buf):
            space = {"__name__": "__main__", "_torch_weights": torch_weights}
            exec(compile(marked, "program.py", "exec"), space)  # noqa: S102 - the output
    finally:
        jax.random.normal = normal
    assert not pending
    return buf.getvalue().splitlines()


@pytest.fixture(scope="module")
def runs() -> dict:
    source = _unshuffled(PROGRAM.read_text())
    codes = {name: convert_source(src, path="run_epoch_modes.py", target="equinox").code
             for name, src in (("program", PROGRAM.read_text()), ("exact", source),
                               ("renamed", _renamed(source)))}
    printed, weights, draws = _torch_run(source)
    return {"code": codes, "torch": printed,
            "jax": {n: _jax_run(codes[n], weights, draws) for n in ("exact", "renamed")},
            "shuffled": _jax_run(codes["program"], weights, draws)}


def test_run_epoch_takes_and_returns_the_model(runs):
    for name, code in runs["code"].items():
        assert "TODO(torch2jax)" not in code, name
        assert "import torch" not in code and "torch2jax" not in code, name
        # the step compiled once, at the top level, given the optimizer run_epoch receives
        assert len(re.findall(r"@eqx.filter_jit\ndef train_step\((model|net), opt_state, "
                              r"(optimizer|opt), xb, yb\):", code)) == 1, name
        assert "backward" not in code, name
    code = runs["code"]["program"]
    assert "def run_epoch(model, opt_state, loader, optimizer, train=True):" in code
    assert ("        if train:\n            model, opt_state, loss, logits = train_step(model, "
            "opt_state, optimizer, xb, yb)\n        else:\n") in code
    assert "return model, opt_state, (total / count, correct / count)" in code
    assert ("model, opt_state, (val_loss, val_acc) = run_epoch(model, opt_state, "
            'loaders["val"](epoch), optimizer, train=False)') in code
    assert "def run_epoch(net, opt_state, dl, opt, training=True):" in runs["code"]["renamed"]


def test_the_converted_run_prints_torchs_losses(runs):
    torch_lines = runs["torch"]
    assert len(torch_lines) == 4 and torch_lines[-1] == "6 batches per epoch"
    for name, lines in runs["jax"].items():
        assert len(lines) == len(torch_lines), (name, lines)
        assert lines[-1] == torch_lines[-1], name
        for ours, theirs in zip(lines[:-1], torch_lines[:-1], strict=True):
            a = [float(x) for x in _NUMBER.findall(ours)]
            b = [float(x) for x in _NUMBER.findall(theirs)]
            assert len(a) == len(b) == 4, (ours, theirs)
            # losses to float32's rounding of the printed digits; accuracies exactly
            assert a[0::2] == pytest.approx(b[0::2], abs=2e-4), (name, ours, theirs)
            assert a[1::2] == b[1::2], (name, ours, theirs)
    assert runs["jax"]["renamed"] == runs["jax"]["exact"]
    # training moved the losses: the train loss falls from the first epoch to the last
    first, last = (float(_NUMBER.findall(x)[0]) for x in (torch_lines[0], torch_lines[2]))
    assert last < first


def test_the_program_as_written_runs(runs):
    """The program with its shuffled loader (grain's order, not torch's): it runs, prints
    torch's lines, and its training loss falls."""
    lines = runs["shuffled"]
    assert len(lines) == 4 and lines[-1] == "6 batches per epoch", lines
    losses = [float(_NUMBER.findall(x)[0]) for x in lines[:-1]]
    assert losses[-1] < losses[0], lines
