"""BatchNorm in training mode, end to end on every target: the converted layer normalises a
training batch as torch does and keeps torch's running statistics (the running variance is
updated with the *unbiased* batch variance, n / (n - 1)); the verifier checks one training
forward (``verify --train-mode``) and the running statistics after a trajectory."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.convert import convert_source
from torch2jax.verify.load import load_module
from torch2jax.verify.run import VerifyRequest, randomise_for_verification, verify
from torch2jax.verify.trajectory import TrainSpec, verify_trajectory

# BatchNorm2d with and without affine parameters (channels-last in NNX/linen), BatchNorm1d on
# (N, C) where n = N is small and n / (n - 1) large, dropout that --train-mode switches off
SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.bn_plain = nn.BatchNorm2d(8, affine=False, momentum=0.3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 6)
        self.bn1 = nn.BatchNorm1d(6, eps=1e-3)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = self.pool(self.bn_plain(x))
        x = self.drop(x.flatten(1))
        return self.bn1(self.fc(x))
'''
TARGETS = ("nnx", "linen", "equinox")
INPUT = "float32[4,3,8,8]"
STEPS = 3
BNS = ("bn", "bn_plain", "bn1")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The torch file and its conversion for every target."""
    folder = tmp_path_factory.mktemp("bn_train")
    out = {"torch": folder / "net.py"}
    out["torch"].write_text(SOURCE)
    for target in TARGETS:
        result = convert_source(SOURCE, target=target)
        assert [d for d in result.diagnostics if d.severity == "error"] == [], result.code
        out[target] = folder / f"net_{target}.py"
        out[target].write_text(result.code)
    return out


@pytest.fixture(scope="module")
def torch_net(files: dict[str, Path]) -> torch.nn.Module:
    torch.manual_seed(0)
    net = load_module(files["torch"], prefix="bn_train_torch").Net()
    randomise_for_verification(net, 0)  # running statistics away from 0 / 1
    return net


def _batches() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((4, 3, 8, 8)).astype(np.float32) for _ in range(STEPS)]


def _torch_steps(net: torch.nn.Module) -> tuple[np.ndarray, dict[str, tuple]]:
    net = copy.deepcopy(net)
    net.train()
    net.drop.eval()
    with torch.no_grad():
        for x in _batches():
            out = net(torch.from_numpy(x)).numpy()
    return out, {n: (getattr(net, n).running_mean.numpy(), getattr(net, n).running_var.numpy())
                 for n in BNS}


def _nnx_steps(module, net):
    from flax import nnx

    from torch2jax.weights import transfer_state_dict

    model = module.Net(rngs=nnx.Rngs(0))
    transfer_state_dict(net, model)
    model.train()
    model.drop.eval()
    step = nnx.jit(lambda model, x: model(x))
    for x in _batches():
        out = step(model, jnp.asarray(x))
    return out, {n: (getattr(model, n).mean[...], getattr(model, n).var[...]) for n in BNS}


def _linen_steps(module, net):
    from torch2jax.verify.linen import _thaw, transfer_to_linen

    model = module.Net()
    variables = _thaw(model.init(jax.random.key(0), jnp.asarray(_batches()[0])))
    variables, _ = transfer_to_linen(net, variables)
    stats = variables["batch_stats"]

    @jax.jit
    def step(stats, x):
        # deterministic dropout: the layer's own flag, its mask is not torch's
        out, updates = model.clone(train=True).apply(
            {"params": variables["params"], "batch_stats": stats}, x,
            mutable=["batch_stats"], rngs={"dropout": jax.random.key(0)})
        return out, updates["batch_stats"]

    with _linen_dropout_off():
        for x in _batches():
            out, stats = step(stats, jnp.asarray(x))
    return out, {n: (stats[n]["mean"], stats[n]["var"]) for n in BNS}


def _linen_dropout_off():
    import flax.linen as nn

    from torch2jax.verify.linen import _no_dropout

    return nn.intercept_methods(_no_dropout)


def _equinox_steps(module, net):
    from torch2jax.verify.equinox import (
        batched,
        build_equinox_model,
        train_mode,
        transfer_to_equinox,
    )

    model, state = build_equinox_model(module, "Net", None, None, 0)
    model, state, _ = transfer_to_equinox(net, model, state)
    model, dropouts = train_mode(model)
    assert dropouts == 1
    step = jax.jit(lambda state, x: batched(model, 1)(state, x))
    for x in _batches():
        out, state = step(state, jnp.asarray(x))
    return out, {n: state.get(getattr(model, n).running_stats) for n in BNS}


STEP_FNS = {"nnx": _nnx_steps, "linen": _linen_steps, "equinox": _equinox_steps}


@pytest.mark.parametrize("target", TARGETS)
def test_training_steps_keep_torchs_running_statistics(target: str, files, torch_net) -> None:
    """Three training forwards on both sides: outputs and running mean / variance."""
    want_out, want_stats = _torch_steps(torch_net)
    module = load_module(files[target], prefix=f"bn_train_{target}")
    got_out, got_stats = STEP_FNS[target](module, copy.deepcopy(torch_net))
    np.testing.assert_allclose(np.asarray(got_out), want_out, atol=1e-5, rtol=1e-5)
    for name in BNS:
        for got, want in zip(got_stats[name], want_stats[name], strict=True):
            np.testing.assert_allclose(np.asarray(got), want, atol=1e-6, rtol=1e-6,
                                       err_msg=f"{target} {name}")


@pytest.mark.parametrize("target", TARGETS)
def test_verify_train_mode_compares_the_running_statistics(target: str, files) -> None:
    result = verify(f"{files['torch']}::Net", inputs=[INPUT], jax_target=target, grad=True,
                    train_mode=True)
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.mode == "train"
    assert result.max_abs_diff <= 1e-5
    assert result.stats_max_abs_diff is not None and result.stats_max_abs_diff <= 1e-6
    compared = [c for c in result.compared if c.startswith("running statistic")]
    assert len(compared) == 2 * len(BNS)
    assert any("dropout and stochastic depth deterministic" in n for n in result.notes)


def test_verify_train_mode_catches_a_biased_running_variance(files, tmp_path: Path) -> None:
    """The NNX conversion with the helper's n / (n - 1) removed (nnx.BatchNorm's own update)
    normalises like torch but fails on bn1.running_var."""
    code = files["nnx"].read_text()
    biased = code.replace("batch_var * (n / (n - 1))", "batch_var")
    assert biased != code
    edited = tmp_path / "net_biased.py"
    edited.write_text(biased)
    result = verify(f"{files['torch']}::Net", inputs=[INPUT], converted=str(edited),
                    train_mode=True)
    assert result.error is None, result.error
    assert result.max_abs_diff <= 1e-5  # the outputs agree
    assert not result.passed
    assert result.mismatch.startswith("running statistic")
    assert "running_var" in result.mismatch


@pytest.mark.parametrize("target", ("nnx", "linen"))
def test_trajectory_compares_the_running_statistics(target: str, files) -> None:
    req = VerifyRequest(f"{files['torch']}::Net", inputs=(INPUT,), jax_target=target)
    train = TrainSpec("torch.optim.SGD(params, lr=0.01, momentum=0.9)",
                      "F.cross_entropy(output, labels)", labels="int64[4]:6", steps=3)
    result = verify_trajectory(req, train)
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.stats_max_rel_diff is not None and result.stats_max_rel_diff <= 1e-5
    assert sum(c.startswith("running statistic") for c in result.compared) == 2 * len(BNS)


def test_equinox_trajectory_compares_the_running_statistics(files, torch_net) -> None:
    from torch2jax.verify.equinox import train_equinox

    module = load_module(files["equinox"], prefix="bn_train_eqx_traj")
    train = TrainSpec("torch.optim.SGD(params, lr=0.01, momentum=0.9)",
                      "F.cross_entropy(output, labels)", labels="int64[4]:6", steps=3)
    result = train_equinox(torch_net, module, "Net", None, train, [INPUT])
    assert result.passed, result.mismatch
    assert result.stats_max_rel_diff is not None and result.stats_max_rel_diff <= 1e-5
    assert sum(c.startswith("running statistic") for c in result.compared) == 2 * len(BNS)


def test_cli_verify_train_mode(files) -> None:
    res = CliRunner().invoke(app, ["verify", f"{files['torch']}::Net", "--input", INPUT,
                                   "--train-mode", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["passed"] and data["mode"] == "train"
    assert data["stats_max_abs_diff"] <= 1e-6
    res = CliRunner().invoke(app, ["verify", f"{files['torch']}::Net", "--input", INPUT,
                                   "--train-mode", "--optimizer", "torch.optim.SGD(params)",
                                   "--loss", "F.mse_loss(output, labels)"])
    assert res.exit_code == 2


def test_a_file_that_defines_its_own_batchnorm_is_marked_not_shadowed() -> None:
    """The helper is written into the converted file as `BatchNorm`: a file with its own
    `BatchNorm` would call that instead, so the layer is marked."""
    source = SOURCE.replace("class Net(nn.Module):", "class BatchNorm(nn.Module):\n"
                            "    pass\n\n\nclass Net(nn.Module):")
    for target in TARGETS:
        result = convert_source(source, target=target)
        errors = [d.message for d in result.diagnostics if d.severity == "error"]
        assert any("defines its own BatchNorm" in e for e in errors), (target, errors)
        assert "n / (n - 1)" not in result.code  # no helper written in


DROP_PATH_SOURCE = '''
import torch
from torch import nn


class StochasticDepth(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = (torch.rand(x.shape[0], 1) >= self.p).float()
        return x * keep / (1 - self.p)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop_path = StochasticDepth(0.5)

    def forward(self, x):
        return x + self.drop_path(self.bn(self.fc(x)))
'''


def test_stochastic_depth_is_deterministic_in_training_checks(tmp_path: Path) -> None:
    """A module named StochasticDepth (torchvision's reads self.training) is in eval mode on
    both sides: its random training path (drawn from the module's own nnx.Rngs) never runs."""
    path = tmp_path / "drop_path.py"
    path.write_text(DROP_PATH_SOURCE)
    result = verify(f"{path}::Net", inputs=["float32[8,6]"], train_mode=True, grad=True)
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.todos == 0
    assert "jax.random.uniform(self.rngs(), (x.shape[0], 1))" in convert_source(
        DROP_PATH_SOURCE).code  # the module's own stream (tests/test_module_random.py)
    req = VerifyRequest(f"{path}::Net", inputs=("float32[8,6]",))
    train = TrainSpec("torch.optim.SGD(params, lr=0.01)", "F.mse_loss(output, labels)",
                      labels="float32[8,6]", steps=3)
    trained = verify_trajectory(req, train)
    assert trained.error is None, trained.error
    assert trained.passed, trained.mismatch
    assert any("stochastic depth off" in n for n in trained.notes)
