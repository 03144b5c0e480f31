"""ResNet-style models on the equinox target: an ``nn.Sequential`` of the file's own blocks that
hold BatchNorm (state) or Dropout (keys) is called block by block, the state threaded through
(``eqx.nn.Sequential`` would hand the state only to ``StatefulLayer``s), and a shortcut that is
an ``nn.Identity()`` in one branch and a Sequential with BatchNorm in the other is an identity
that passes the state through. The same file on NNX, where an identity assigned before a layer
made the attribute static. Every model is run against torch: outputs and gradients, a
train-mode forward with running statistics, and a training trajectory."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("equinox")

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, verify
from torch2jax.verify.trajectory import TrainSpec, verify_trajectory

ROOT = Path(__file__).resolve().parent.parent

SOURCE = '''
import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class DropBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(F.relu(self.conv(x)))


class Net(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                                  nn.ReLU())
        self.layer1 = nn.Sequential(Block(8, 8), Block(8, 8))
        self.layer2 = nn.Sequential(Block(8, 16, 2), DropBlock(16), nn.ReLU())
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))
'''

INPUT = ["float32[4,3,8,8]"]


@pytest.fixture(scope="module")
def net_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("resnet") / "blocks.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def equinox_code() -> str:
    result = convert_source(SOURCE, path="blocks.py", target="equinox")
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    return result.code


def test_sequential_of_stateful_blocks_is_called_block_by_block(equinox_code: str) -> None:
    assert "TODO" not in equinox_code
    call = equinox_code.split("class Net(eqx.Module):", 1)[1].split("def __call__", 1)[1]
    assert call.splitlines()[1:8] == [
        "        x, state = self.stem(x, state)",
        "        x, state = self.layer1[0](x, state)",
        "        x, state = self.layer1[1](x, state)",
        "        x, state = self.layer2[0](x, state)",
        "        x = self.layer2[1](x, key=key)",  # the Dropout block takes a key, no state
        "        x = self.layer2[2](x)",
        "        return self.head(x.mean(axis=(1, 2))), state",  # per-example axes
    ]
    # the Sequentials are still built as eqx.nn.Sequential (indexable, weights by path)
    assert "self.layer1 = eqx.nn.Sequential([Block(8, 8, key=key2), Block(8, 8, key=key3)])" \
        in equinox_code


def test_identity_branch_of_a_stateful_shortcut_passes_the_state(equinox_code: str) -> None:
    block = equinox_code.split("class Block(eqx.Module):", 1)[1].split("\nclass ", 1)[0]
    assert "    shortcut: eqx.nn.Sequential\n" in block
    assert "        self.shortcut = eqx.nn.Sequential([])\n" in block
    assert "shortcut_out, state = self.shortcut(x, state)" in block
    assert "return jax.nn.relu(out + shortcut_out), state" in block


def test_identity_before_a_layer_stays_a_module_in_nnx() -> None:
    code = convert_source(SOURCE, path="blocks.py").code
    assert "self.shortcut = nnx.Sequential()\n" in code  # not `lambda x: x` (static in NNX)


@pytest.mark.parametrize("target", ["equinox", "nnx", "linen"])
def test_resnet_style_model_matches_torch(net_file: Path, target: str) -> None:
    r = verify(f"{net_file}::Net", inputs=INPUT, jax_target=target, grad=True)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, r.mismatch
    assert r.max_abs_diff < 1e-5 and r.grad_max_rel_diff < 1e-4


def test_resnet_style_model_train_mode_updates_statistics_like_torch(net_file: Path) -> None:
    r = verify(f"{net_file}::Net", inputs=INPUT, jax_target="equinox", train_mode=True)
    assert r.error is None, r.error
    assert r.passed, r.mismatch
    assert r.stats_max_abs_diff is not None and r.stats_max_abs_diff < 1e-5
    # 4 BatchNorms in layer1's blocks + 3 in layer2[0] (its shortcut's) + the stem's
    assert any("running statistics of 8 BatchNorm layers" in n for n in r.notes), r.notes


def test_resnet_style_model_trains_like_torch_on_equinox(net_file: Path) -> None:
    """``verify --target equinox --optimizer ...`` runs the equinox trajectory (it used to
    build the NNX model and fail on ``rngs=``)."""
    req = VerifyRequest(target=f"{net_file}::Net", inputs=tuple(INPUT), jax_target="equinox")
    r = verify_trajectory(req, TrainSpec("torch.optim.SGD(params, lr=0.05, momentum=0.9)",
                                         "F.cross_entropy(output, labels)", "int64[4]:5",
                                         steps=5))
    assert r.error is None, r.error
    assert r.target == "equinox" and len(r.losses_jax) == 5
    assert r.passed, (r.mismatch, r.worst_param)
    assert r.loss_max_rel_diff < 1e-5 and r.param_max_rel_diff < 1e-4
    assert r.stats_max_abs_diff is not None and r.stats_max_abs_diff < 1e-5


def test_benchmark_resnet18_converts_to_equinox() -> None:
    path = ROOT / "benchmarks" / "models" / "resnet18.py"
    result = convert_source(path.read_text(), path=str(path), target="equinox")
    assert "TODO" not in result.code
    assert "x, state = self.layer4[1](x, state)" in result.code
    assert "self.downsample = eqx.nn.Sequential([])" in result.code


@pytest.mark.parametrize("target", ["equinox", "nnx", "linen"])
def test_float64_verification_agrees_to_double_rounding(net_file: Path, target: str) -> None:
    """``verify --float64``: torch ``.double()``, JAX under ``jax.enable_x64`` with the model's
    float32 arrays widened. The translation then agrees with torch to float64 rounding (float32
    agreement is about 1e-7), which is how a float32 gradient mismatch at a ReLU kink is told
    from a translation error (docs/verification.md)."""
    import jax.numpy as jnp

    r = verify(f"{net_file}::Net", inputs=INPUT, jax_target=target, grad=True, train_mode=True,
               float64=True)
    assert r.error is None, r.error
    assert r.passed and r.dtype == "float64"
    assert r.max_abs_diff < 1e-12 and r.grad_max_rel_diff < 1e-12
    assert r.stats_max_abs_diff < 1e-12
    assert jnp.ones(1).dtype == jnp.float32  # x64 was enabled only inside the check


def test_float64_is_refused_for_trajectories(net_file: Path) -> None:
    req = VerifyRequest(target=f"{net_file}::Net", inputs=tuple(INPUT), float64=True)
    r = verify_trajectory(req, TrainSpec("torch.optim.SGD(params, lr=0.05)",
                                         "F.cross_entropy(output, labels)", "int64[4]:5",
                                         steps=1))
    assert not r.passed and "float64" in (r.error or "")


# kuangliu's CIFAR ResNet: a builder method called from __init__ that builds the block class the
# model is constructed with, as many blocks as a list argument says
CIFAR_SOURCE = '''
import torch
from torch import nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, num_classes=5):
        super().__init__()
        self.in_planes = 8
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = self._make_layer(block, 8, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 16, num_blocks[1], stride=2)
        self.linear = nn.Linear(16 * block.expansion, num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for s in strides:
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        return self.linear(out)


def ResNetTiny(num_classes=5):
    return ResNet(BasicBlock, [1, 2], num_classes=num_classes)
'''


@pytest.fixture(scope="module")
def cifar_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cifar") / "cifar_resnet.py"
    path.write_text(CIFAR_SOURCE)
    return path


def test_builder_method_with_a_class_passed_in_converts() -> None:
    result = convert_source(CIFAR_SOURCE, path="cifar_resnet.py", target="equinox")
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    code = result.code
    assert "TODO" not in code
    resnet = code.split("class ResNet(eqx.Module):", 1)[1]
    # fields: in_planes (set in __init__ and the method) static; the stages Sequentials
    assert "    in_planes: int = eqx.field(static=True)\n" in resnet
    assert "    layer1: eqx.nn.Sequential\n    layer2: eqx.nn.Sequential\n" in resnet
    assert "self.layer1 = self._make_layer(block, 8, num_blocks[0], stride=1, key=key2)" \
        in resnet
    # the method takes a key and splits one off per block it builds
    method = resnet.split("    def _make_layer", 1)[1].split("    def __call__", 1)[0]
    assert method.splitlines()[0] == "(self, block, planes, num_blocks, stride, *, key):"
    assert "            key, subkey = jax.random.split(key)\n" \
        "            layers.append(block(self.in_planes, planes, s, key=subkey))\n" \
        "            self.in_planes = planes * block.expansion\n" in method
    assert "        return eqx.nn.Sequential(layers)\n" in method
    # how many blocks a stage holds is not known here: a loop over its layers
    assert "        for block in self.layer1.layers:\n" \
        "            out, state = block(out, state)\n" \
        "        for block in self.layer2.layers:\n" \
        "            out, state = block(out, state)\n" in resnet
    assert "def ResNetTiny(num_classes=5, *, key):" in code


@pytest.mark.parametrize("build", ["ResNet(BasicBlock, [1, 2])", "ResNetTiny()"])
def test_builder_method_resnet_matches_torch(cifar_file: Path, build: str) -> None:
    r = verify(f"{cifar_file}::ResNet", inputs=INPUT, jax_target="equinox", grad=True,
               build=build)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, r.mismatch
    assert r.max_abs_diff < 1e-5 and r.grad_max_rel_diff < 1e-4
    # bn1, layer1's block (2), layer2's two blocks (2 + 2, the first's shortcut 1): all built
    assert any("running statistics of 8 BatchNorm layers" in n for n in r.notes), r.notes


def test_builder_method_resnet_train_mode_updates_statistics_like_torch(
        cifar_file: Path) -> None:
    r = verify(f"{cifar_file}::ResNet", inputs=INPUT, jax_target="equinox", train_mode=True,
               build="ResNetTiny()")
    assert r.error is None, r.error
    assert r.passed, r.mismatch
    assert r.max_abs_diff < 1e-5
    assert r.stats_max_abs_diff is not None and r.stats_max_abs_diff < 1e-5


def _with_sites(*sites: str) -> str:
    return CIFAR_SOURCE.split("\ndef ResNetTiny", 1)[0] + "".join(
        f"\n\ndef build{i}(block):\n    return {s}\n" for i, s in enumerate(sites))


BOTTLENECK = """

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, self.expansion * planes, 3, stride=stride, padding=1)
        self.bn2 = nn.BatchNorm2d(self.expansion * planes)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class DropBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(F.relu(self.conv(x)))
"""


def test_block_classes_that_differ_between_sites() -> None:
    """ResNet18 with BasicBlock and ResNet50 with Bottleneck: both take the state and no key,
    so one forward pass fits both; a block that takes a key (Dropout) and no state does not."""
    source = _with_sites("ResNet(BasicBlock, [1, 1])",
                         "ResNet(block=Bottleneck, num_blocks=[2, 2])") + BOTTLENECK
    result = convert_source(source, path="m.py", target="equinox")
    assert "TODO" not in result.code
    assert "for block in self.layer2.layers:\n            out, state = block(out, state)\n" \
        in result.code
    source = _with_sites("ResNet(BasicBlock, [1, 1])", "ResNet(DropBlock, [2, 2])") + \
        BOTTLENECK
    result = convert_source(source, path="m.py", target="equinox")
    messages = [d.message for d in result.diagnostics if d.severity == "error"]
    assert "the classes passed in for one layer (BasicBlock, DropBlock) differ in taking " \
        "state or a key: the forward pass is written for one" in messages, messages


def test_block_class_not_known_is_marked() -> None:
    for source, why in [
            (_with_sites("ResNet(block, [1, 1])"),
             ("the class `block` is not known: ResNet is built with `block` for it, not a "
              "module class of this file")),
            (CIFAR_SOURCE.split("\ndef ResNetTiny", 1)[0],
             "the class `block` is not known: nothing in this file builds ResNet")]:
        result = convert_source(source, path="m.py", target="equinox")
        messages = [d.message for d in result.diagnostics if d.severity == "error"]
        assert why in messages, messages
        # and the forward pass does not guess how to call the stages
        assert "a Sequential whose layers are not known here" in messages
