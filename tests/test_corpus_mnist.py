"""The MNIST-example program shape (tests/corpus/mnist/main.py), converted by the CLI and run.

argparse options with defaults, loader options in a dict (``DataLoader(ds, **train_kwargs)``,
updated under a CUDA condition), ``train(args, model, device, loader, optimizer, epoch)``
with ``len(loader.dataset)`` in its log line, ``test()`` with a summed loss and an argmax
accuracy, Adadelta with StepLR, and a ``--save-model`` checkpoint. The torch program and its
conversion each train on synthetic 28x28 digits (``--tiny``: 1280 images; here 4 epochs of
batches of 32, 160 Adadelta steps).

Tolerance: the two sides draw different data and initial weights (torch's and JAX's random
streams and default initialisers differ), so the numbers are not compared one by one. Each
side (torch, the NNX, linen and equinox conversions; equinox: the dropout keys threaded into
``train``, F.max_pool2d as eqx.nn.MaxPool2d per example) must start near chance (first train loss within
0.35 of ln 10), end with a last train loss below its first, a final test loss below half of
ln 10 (1.15) and a test accuracy of at least 80%. Adadelta's slow start makes the epoch at
which the loss takes off depend on the initial weights: measured (first train loss -> final
test loss), torch 2.31 -> 0.012 (100%), NNX 2.47 -> 0.022 (100%), linen 2.35 -> 0.80 (96%),
equinox 2.32 -> 0.0066 (100%).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch import assert_compiles_once, compile_once_env
from unbound import assert_names_bound

CORPUS = Path(__file__).parent / "corpus" / "mnist"
ARGS = ["--tiny", "--log-interval", "10", "--batch-size", "32", "--epochs", "4"]
TRAIN = re.compile(r"Train Epoch: (\d+) \[(\d+)/(\d+) \((\d+)%\)\]\tLoss: ([0-9.]+)")
TEST = re.compile(r"Test set: Average loss: ([0-9.]+), Accuracy: (\d+)/(\d+) \((\d+)%\)")

pytestmark = pytest.mark.slow


def _run(script: Path, cwd: Path, *extra: str) -> str:
    done = subprocess.run([sys.executable, str(script), *ARGS, *extra], cwd=cwd,
                          capture_output=True, text=True, timeout=600, check=False,
                          env=compile_once_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert_compiles_once(done, script)  # (issue 20)
    return done.stdout


def _parse(out: str) -> tuple[list[tuple[int, int, int, float]], list[tuple[float, int, int]]]:
    train = [(int(e), int(seen), int(total), float(loss))
             for e, seen, total, _, loss in TRAIN.findall(out)]
    test = [(float(loss), int(right), int(total)) for loss, right, total, _ in TEST.findall(out)]
    return train, test


def _convert(target: str, out: Path) -> subprocess.CompletedProcess:
    """``torch2jax convert`` (the installed command) in a subprocess."""
    cli = [sys.executable, "-c", "from torch2jax.cli import app; app()"]
    return subprocess.run([*cli, "convert", str(CORPUS), "-o", str(out), "--target", target],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> str:
    pytest.importorskip("torch")
    return _run(CORPUS / "main.py", tmp_path_factory.mktemp("torch"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """target -> (the CLI's result, the converted main.py)."""
    cache: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def get(target: str):
        if target not in cache:
            out = tmp_path_factory.mktemp(target)
            cache[target] = (_convert(target, out), out / "main.py")
        return cache[target]
    return get


def _check_learns(out: str) -> tuple[float, float]:
    train, test = _parse(out)
    # 40 batches of 32 per epoch, every 10th logged
    assert len(train) == 4 * 4 and len(test) == 4, out
    assert [t[:3] for t in train[:4]] == [(1, i * 320, 1280) for i in range(4)], train
    assert all(t[2] == 200 for t in test), test
    first, last = train[0][3], train[-1][3]
    assert abs(first - math.log(10)) < 0.35, train
    assert last < first, train
    final_loss, right, total = test[-1]
    assert final_loss < 0.5 * math.log(10), test
    assert right / total >= 0.8, test
    return first, final_loss


@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
def test_mnist_runs_unedited(torch_run, converted, tmp_path, target):
    done, path = converted(target)
    assert done.returncode == 0, done.stdout + done.stderr  # no TODOs left
    code = path.read_text()
    assert "TODO(torch2jax)" not in code
    assert_names_bound(code, "main.py")
    _check_learns(torch_run)
    _check_learns(_run(path, tmp_path, "--save-model"))
    assert (tmp_path / "mnist_cnn.pt").is_dir()  # the orbax checkpoint of the parameters
