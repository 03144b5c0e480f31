"""A checkpoint dict resumed, in pytorch-cifar's shape (tests/data/programs/cifar_resume.py:
``torch.save({'net': net.state_dict(), 'acc': acc, 'epoch': epoch}, path)`` from test(epoch)
when the accuracy improves, and under ``if args.resume:`` before the optimizer is built,
``checkpoint = torch.load(path); net.load_state_dict(checkpoint['net']); best_acc =
checkpoint['acc']; start_epoch = checkpoint['epoch']``; issue 32), and the variant that also
saves ``optimizer.state_dict()`` and loads it back after the optimizer is built.

Before: NNX translated it; linen and equinox left three or four TODOs (torch.load,
torch.save, the loads into a trained model). Now both write the checkpoint as NNX does (an
orbax PyTree). On linen the model's state_dict is its linen variables, the optimizer's the
TrainState's optimizer state as flax's state dict, and the resume reads them into
``resumed_variables`` / ``resumed_opt_state`` (None unless the resume ran), put into the
TrainState once it is made. On equinox the model's state_dict is the list of its arrays, the
optimizer's the leaves of its optax state, put back into their structures where torch loads
them. A run of two epochs and a resumed run to three print torch's losses and accuracies (the
weights start from constants; the resumed run starts from the saved epoch, and with the
optimizer's state its momentum).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("equinox")
pytest.importorskip("orbax.checkpoint")
pytest.importorskip("grain")
variants = pytest.importorskip("variants")

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "cifar_resume.py"
SOURCE = PROGRAM.read_text()
OPTIMIZER = 'optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)\n'


def with_optimizer(source: str) -> str:
    """The resume after the optimizer is built, restoring its state too; the dict saved
    holds the optimizer's state_dict (and is named ``ckpt``)."""
    start, end = source.index("\nif args.resume:") + 1, source.index("criterion = ")
    block = source[start:end].replace(
        '    net.load_state_dict(checkpoint["net"])\n',
        '    net.load_state_dict(checkpoint["net"])\n'
        '    optimizer.load_state_dict(checkpoint["optimizer"])\n')
    source = source[:start] + source[end:]
    assert source.count(OPTIMIZER) == 1
    source = source.replace(OPTIMIZER, OPTIMIZER + "\n" + block.rstrip() + "\n")
    old = '        state = {\n            "net": net.state_dict(),\n'
    assert source.count(old) == 1
    source = source.replace(old, '        ckpt = {\n            "net": net.state_dict(),\n'
                                 '            "optimizer": optimizer.state_dict(),\n')
    return source.replace("torch.save(state,", "torch.save(ckpt,")


VARIANTS = {"as_written": SOURCE, "with_optimizer": with_optimizer(SOURCE)}
RUNS = ([], ["--resume", "--epochs", "3"])


def _runs(code: str, folder: Path) -> list[str]:
    """The program run twice in ``folder`` (the checkpoint the first writes, the second
    resumes from): the lines both print."""
    lines = []
    old_argv, old_cwd = sys.argv, os.getcwd()
    folder.mkdir()
    try:
        os.chdir(folder)
        for argv in RUNS:
            out = io.StringIO()
            sys.argv = ["program.py", *argv]
            with contextlib.redirect_stdout(out), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(code, "program.py", "exec"), {"__name__": "__main__"})  # noqa: S102
            lines += out.getvalue().splitlines()
    finally:
        os.chdir(old_cwd)
        sys.argv = old_argv
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="module")
def torch_lines(tmp_path_factory) -> dict[str, list[str]]:
    lines = {name: _runs(source, tmp_path_factory.mktemp("torch") / name)
             for name, source in VARIANTS.items()}
    for got in lines.values():  # resumed: the second run starts from the saved epoch
        assert got.count("==> Resuming from checkpoint..") == 1
        assert got[got.index("==> Resuming from checkpoint..") + 1] == "Epoch: 0", got
    # the optimizer's momentum restored: its resumed first epoch differs
    assert lines["as_written"][-9:] != lines["with_optimizer"][-9:]
    return lines


# (equinox's model-only form is the with_optimizer variant's first half: not run twice)
@pytest.mark.parametrize(("name", "target"), [("as_written", "linen"),
                                              ("with_optimizer", "linen"),
                                              ("with_optimizer", "equinox")])
def test_a_resumed_checkpoint_dict_runs_converted(torch_lines, name, target, tmp_path):
    code = convert_source(VARIANTS[name], path=PROGRAM.name, target=target).code
    assert "TODO(torch2jax)" not in code, code
    if target == "linen":
        assert 'state = state.replace(params=resumed_variables["params"])' in code
    else:  # the model's arrays saved as a list, put back into its structure
        assert '"net": jax.tree.leaves(eqx.filter(net, eqx.is_array)),' in code
        assert "net = eqx.combine(jax.tree.unflatten(" in code
    got = _runs(code, tmp_path / "jax")
    assert variants.same_output(got, torch_lines[name], 1e-5) is None, (got, torch_lines[name])
