"""The GAN training step (DCGAN shape, two models and two optimizers) for --target nnx and
--target linen, converted and run against torch: the losses of every iteration and the
BatchNorm running statistics of both models agree (G's update once per iteration, D's on its
three forwards; D's gradient is the sum of its two backward losses). On linen each model's
state is its own TrainState."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_training_scripts import _run as run_script

from torch2jax.convert import convert_source

SCRIPT = """\
import torch
import torch.nn as nn
import torch.optim as optim

nz = 3


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(nz, 6, bias=False)
        self.bn = nn.BatchNorm1d(6)
        self.fc2 = nn.Linear(6, 4)

    def forward(self, z):
        return torch.tanh(self.fc2(torch.relu(self.bn(self.fc1(z)))))


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 5, bias=False)
        self.bn = nn.BatchNorm1d(5)
        self.fc2 = nn.Linear(5, 1)

    def forward(self, x):
        h = nn.functional.leaky_relu(self.bn(self.fc1(x)), 0.2)
        return torch.sigmoid(self.fc2(h)).view(-1)


# the weights set by init functions applied from outside (both targets translate them)
def init_g(m):
    if isinstance(m, nn.Linear):
        nn.init.constant_(m.weight, 0.3)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0.05)


def init_d(m):
    if isinstance(m, nn.Linear):
        nn.init.constant_(m.weight, -0.25)
        if m.bias is not None:
            nn.init.constant_(m.bias, 0.1)


netG = Generator()
netG.apply(init_g)
netD = Discriminator()
netD.apply(init_d)
criterion = nn.BCELoss()
# eps=1e-3: Adam's first steps on near-zero gradients would amplify float rounding
optimizerD = optim.Adam(netD.parameters(), lr=0.05, betas=(0.5, 0.999), eps=1e-3)
optimizerG = optim.Adam(netG.parameters(), lr=0.05, betas=(0.5, 0.999), eps=1e-3)
data = torch.linspace(-1.0, 1.0, 32).reshape(8, 4) ** 2
noises = torch.linspace(-2.0, 1.5, 24).reshape(8, nz)
real_label, fake_label = 1.0, 0.0
for epoch in range(3):
    for i in range(0, 8, 4):
        real = data[i:i + 4]
        noise = noises[i:i + 4] * (epoch + 1)
        netD.zero_grad()
        label = torch.full((real.size(0),), real_label)
        output = netD(real)
        errD_real = criterion(output, label)
        errD_real.backward()
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        print(errD.item(), errG.item())
"""

TORCH_STATS = """
for bn in (netG.bn, netD.bn):
    print(bn.running_mean[0].item(), bn.running_var[0].item())
"""
JAX_STATS = """
for bn in (netG.bn, netD.bn):
    print(bn.mean[0].item(), bn.var[0].item())
"""


def _run(code: str, cwd: Path) -> list[float]:
    return [float(x) for x in run_script(code, cwd)]


def _convert(source: str):
    return convert_source(source, path="script.py")


@pytest.fixture(scope="module")
def torch_numbers(tmp_path_factory):
    """torch's losses and statistics (one run, for both targets)."""
    return _run(SCRIPT + TORCH_STATS, tmp_path_factory.mktemp("torch"))


def test_gan_step_matches_torch(tmp_path, torch_numbers):
    result = _convert(SCRIPT)
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == [], errors
    code = result.code
    assert "nnx.vjp(generate, netG" in code and code.count("netG(") == 1
    assert "return errD_real + errD_fake" in code
    want = torch_numbers
    got = _run(code + JAX_STATS, tmp_path)
    assert len(want) == len(got) == 2 * 6 + 4
    for a, b in zip(want, got):
        assert abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-3), (want, got)


def _marked(source: str) -> bool:
    return any(d.rule == "training-loop" and d.severity == "error"
               for d in _convert(source).diagnostics)


def test_other_two_optimizer_shapes_stay_marked():
    # D's gradients never zeroed: they accumulate across iterations
    assert _marked(SCRIPT.replace("        netD.zero_grad()\n", ""))
    # G's gradients zeroed before D's backward of an undetached fake
    assert _marked(SCRIPT.replace("netD(fake.detach())", "netD(fake)").replace(
        "        netG.zero_grad()\n", "").replace(
        "        netD.zero_grad()\n", "        netD.zero_grad()\n        netG.zero_grad()\n"))
    # G run a second time in the G step
    assert _marked(SCRIPT.replace("output = netD(fake)\n", "output = netD(netG(noise))\n"))
    # the G step before the D step's update
    assert _marked(SCRIPT.replace("        optimizerD.step()\n", "").replace(
        "        optimizerG.step()\n", "        optimizerG.step()\n        optimizerD.step()\n"))


# --target linen: each model's state in its own TrainState
LINEN_STATS = """
for state in (netG_state, netD_state):
    print(state.batch_stats["bn"]["mean"][0].item(), state.batch_stats["bn"]["var"][0].item())
"""


def test_gan_step_on_linen_matches_torch(tmp_path, torch_numbers):
    result = convert_source(SCRIPT, path="script.py", target="linen")
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == [] and "TODO" not in result.code, errors
    code = result.code
    # G's forward once, under jax.vjp; model.init on the loop's first batch and noise
    assert "jax.vjp(generate, netG_state.params, has_aux=True)" in code
    assert "noise = noises[0:0 + 4] * (0 + 1)" in code
    want = torch_numbers
    got = _run(code + LINEN_STATS, tmp_path)
    assert len(want) == len(got) == 2 * 6 + 4
    for a, b in zip(want, got):
        assert abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-3), (want, got)


def test_gan_loop_reading_a_model_outside_the_step_stays_marked_on_linen():
    # G called between iterations (in training mode, its state in the TrainState)
    source = SCRIPT.replace("        print(errD.item(), errG.item())\n",
                                  "        print(errD.item(), errG.item())\n"
                                  "        sample = netG(noise)\n")
    result = convert_source(source, path="script.py", target="linen")
    assert any(d.rule == "training-loop" and d.severity == "error"
               for d in result.diagnostics)
