"""A model built by a function of the file and moved on the way, as CIFAR-shaped scripts write
it (``def ResNet18(): return ResNet(BasicBlock, [2, 2, 2, 2])``; ``net = ResNet18()``;
``net = net.to(device)``), trained by ``train(epoch)`` reading it as a global.

Before, equinox left the whole training code marked ("net is not a model this pass knows the
class of": the function's result was not known to be a model, 14 TODOs on the CIFAR-shaped
script), and linen's ``test(epoch)`` read a key it was never given once the model was built
as ``Net().to(device)`` (an unmarked crash). Each target now prints torch's training loss,
accuracy, evaluation loss and learning rate every epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from test_equinox_training import TRAIN_FUNCTION_PER_EPOCH
from test_training_scripts import _close, _run

from torch2jax.convert import convert_source

# the equinox test's script, with the model built by a function and moved to the device,
# and trained and evaluated by functions of the epoch that read the globals
SCRIPT = TRAIN_FUNCTION_PER_EPOCH.replace(
    "def train(model, loader, optimizer, scheduler):",
    "def build_net():\n    return Net()\n\n\ndef train(model, loader, optimizer, scheduler):",
).replace("    model = Net()\n", "    model = build_net()\n    model = model.to(device)\n").replace(
    "def main():", 'device = "cuda" if torch.cuda.is_available() else "cpu"\n\n\ndef main():')


@pytest.fixture(scope="module")
def torch_out(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    assert "model = build_net()" in SCRIPT and "model.to(device)" in SCRIPT
    return _run(SCRIPT, tmp_path_factory.mktemp("torch"))


@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
def test_a_built_model_trains_like_torch(target: str, torch_out, tmp_path: Path) -> None:
    result = convert_source(SCRIPT, path="script.py", target=target)
    assert "TODO(torch2jax)" not in result.code, [
        d.message for d in result.diagnostics if d.severity == "error"]
    _close(_run(result.code, tmp_path), torch_out)
