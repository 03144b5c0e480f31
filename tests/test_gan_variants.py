"""A GAN program of our own in the DCGAN example's shape (issue 28), and variants of it: the
weights initialised by ``model.apply(weights_init)`` testing the class name
(``classname.find("Linear") != -1``, ``m.weight.data``), D's two backwards (real batch,
``fake.detach()``) accumulated before ``optimizerD.step()``, ``label.fill_``, host reads
(``D_x = output.mean().item()``) between the backwards, then G's backward through D.

Every program is converted, run, and its printed losses and D outputs compared one by one with
torch's: the initialisation is by constants (through the class-name tests), the data and
noise are fixed, so the two runs compute the same numbers up to float32 rounding. The
variants must also print what the converted original prints.

Also here: several ``backward()`` calls before one ``step()`` outside a loop (a helper), the
gradient of the summed losses; the class-name tests that cannot be told apart in JAX and a
step that would close over a model another optimizer trains stay marked."""

from __future__ import annotations

import pytest
from test_training_scripts import _close, _run

from torch2jax.convert import convert_source

pytestmark = pytest.mark.slow

GAN = """\
import torch
import torch.nn as nn
import torch.optim as optim

nz = 3


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Linear") != -1:
        nn.init.constant_(m.weight.data, 0.25)
        if m.bias is not None:
            nn.init.constant_(m.bias.data, 0.05)
    elif classname.find("BatchNorm") != -1:
        nn.init.constant_(m.weight.data, 1.1)
        nn.init.constant_(m.bias.data, 0)


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


netG = Generator()
netG.apply(weights_init)
netD = Discriminator()
netD.apply(weights_init)
criterion = nn.BCELoss()
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
        D_x = output.mean().item()
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
        D_G_z = output.mean().item()
        optimizerG.step()
        print(errD.item(), errG.item(), D_x, D_G_z)
"""


def _replace(source: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in source, old
        source = source.replace(old, new, 1)
    return source


# the two D losses summed before one backward (a new label tensor for the fake batch: torch's
# BCELoss keeps its target for the backward, so label.fill_ before it would fail in torch)
SUMMED = _replace(
    GAN, ("        errD_real.backward()\n", ""),
    ("        label.fill_(fake_label)\n",
     "        label = torch.full((real.size(0),), fake_label)\n"),
    ("        errD_fake.backward()\n        errD = errD_real + errD_fake\n",
     "        errD = errD_real + errD_fake\n        errD.backward()\n"))

# the class name read other ways, the optimizer's zero_grad instead of the model's
NAMES = _replace(
    GAN, ('    classname = m.__class__.__name__\n    if classname.find("Linear") != -1:',
          '    if "Linear" in type(m).__name__:'),
    ('    elif classname.find("BatchNorm") != -1:',
     '    elif type(m).__name__.startswith("BatchNorm"):'),
    ("        netD.zero_grad()\n", "        optimizerD.zero_grad()\n"))

D_STEP = """

def train_d(real, fake):
    netD.zero_grad()
    label = torch.full((real.size(0),), real_label)
    output = netD(real)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    optimizerD.step()
    return errD_real + errD_fake, D_x
"""
# D's step moved into a function called with the fake batch
D_FUNCTION = _replace(
    GAN, ("real_label, fake_label = 1.0, 0.0\n", "real_label, fake_label = 1.0, 0.0\n" + D_STEP),
    (GAN[GAN.index("        netD.zero_grad()\n"):GAN.index("        netG.zero_grad()\n")],
     ("        fake = netG(noise)\n        errD, D_x = train_d(real, fake)\n"
      "        label = torch.full((real.size(0),), real_label)\n")))

VARIANTS = {
    "summed": SUMMED,
    "names": NAMES,
    # G's backward slice (fake = netG(noise)) crosses D's step: G's forward carried to it
    "d_step_in_function": D_FUNCTION,
}


def _converted(source: str) -> str:
    result = convert_source(source, path="script.py")
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == [], errors
    assert "TODO(torch2jax)" not in result.code
    return result.code


@pytest.fixture(scope="module")
def gan_runs(tmp_path_factory):
    """(torch's output, the converted program's output) of the GAN program."""
    return (_run(GAN, tmp_path_factory.mktemp("torch")),
            _run(_converted(GAN), tmp_path_factory.mktemp("jax")))


def test_gan_program_matches_torch(gan_runs):
    torch_out, jax_out = gan_runs
    assert len(torch_out) == 4 * 6
    _close(torch_out, jax_out)


def test_gan_weights_init_by_class_name():
    code = _converted(GAN)
    # the class names of the JAX layers differ from torch's: the test is an isinstance of
    # the JAX classes of the torch classes it selects, and m.weight is the kernel / scale
    assert "isinstance(m, nnx.Linear)" in code and "isinstance(m, nnx.BatchNorm)" in code
    assert "m.kernel.value = jnp.full_like(m.kernel.value, 0.25)" in code
    assert "m.scale.value = jnp.full_like(m.scale.value, 1.1)" in code


@pytest.mark.parametrize("variant", list(VARIANTS.values()), ids=list(VARIANTS))
def test_gan_variant_matches(gan_runs, tmp_path, variant):
    torch_out, jax_out = gan_runs
    torch_dir = tmp_path / "torch"
    torch_dir.mkdir()
    # the variant is a torch program that prints what the original prints (the generator is
    # checked), and its conversion prints what the converted original prints
    _close(torch_out, _run(variant, torch_dir))
    _close(jax_out, _run(_converted(variant), tmp_path))


# two backward() calls into one step, in a helper (no loop around them): torch sums .grad
TWO_BACKWARDS = """\
import torch
import torch.nn as nn


def init(m):
    if type(m).__name__ == "Linear":
        nn.init.constant_(m.weight, 0.1)
        nn.init.zeros_(m.bias)


model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
model.apply(init)
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
crit = nn.CrossEntropyLoss()


def train_two(x1, y1, x2, y2):
    opt.zero_grad()
    out = model(x1)
    loss = crit(out, y1)
    loss.backward()
    first = loss.item()
    out = model(x2 * 2.0)
    loss = crit(out, y2)
    loss.backward()
    opt.step()
    return first, loss.item()


x = torch.linspace(-1, 1, 64).reshape(16, 4) ** 3
y = torch.arange(16) % 3
for epoch in range(6):
    a, b = train_two(x[:8], y[:8], x[8:], y[8:])
    print(a, b)
"""


def test_two_backwards_in_a_helper_are_summed(tmp_path):
    code = _converted(TWO_BACKWARDS)
    assert "loss_sum = loss_1 + loss" in code
    want = _run(TWO_BACKWARDS, tmp_path)
    assert len(want) == 12 and float(want[-1]) < float(want[1])  # it learns
    _close(want, _run(code, tmp_path))


# the same two backwards written in the loop body (a variant: the helper inlined)
TWO_IN_LOOP = _replace(
    TWO_BACKWARDS,
    (TWO_BACKWARDS[TWO_BACKWARDS.index("\n\ndef train_two"):TWO_BACKWARDS.index("\n\nx = ")], ""),
    ("    a, b = train_two(x[:8], y[:8], x[8:], y[8:])\n    print(a, b)\n",
     ("    opt.zero_grad()\n    out = model(x[:8])\n    loss = crit(out, y[:8])\n"
     "    loss.backward()\n    first = loss.item()\n    out = model(x[8:] * 2.0)\n"
     "    loss = crit(out, y[8:])\n    loss.backward()\n    opt.step()\n"
     "    if epoch % 2 == 0 or epoch == 5:\n        print(first, loss.item())\n")))


def test_two_backwards_in_a_loop_are_summed(tmp_path):
    code = _converted(TWO_IN_LOOP)
    assert "loss_sum = loss_1 + loss" in code
    want = _run(TWO_BACKWARDS, tmp_path)
    got = _run(code, tmp_path)
    _close([want[i] for i in (0, 1, 4, 5, 8, 9, 10, 11)], got)


def _errors(source: str) -> list[str]:
    result = convert_source(source, path="script.py")
    return [d.message for d in result.diagnostics if d.severity == "error"]


def test_class_name_tests_that_jax_cannot_tell_apart_stay_marked():
    two_convs = GAN.replace("nn.Linear(nz, 6, bias=False)", "nn.Conv1d(nz, 6, 1)").replace(
        "nn.Linear(4, 5, bias=False)", "nn.Conv2d(4, 5, 1)").replace(
        'classname.find("Linear") != -1', 'classname.find("Conv2d") != -1')
    # Conv1d and Conv2d are both nnx.Conv
    assert any("does not select Conv1d" in e for e in _errors(two_convs))
    # a ReLU layer is a function in JAX: nothing to walk
    relu = GAN.replace("torch.relu(self.bn(", "nn.ReLU()(self.bn(").replace(
        'classname.find("BatchNorm") != -1', '"ReLU" in classname')
    assert any("selects ReLU, which is no module class" in e for e in _errors(relu))


def test_g_forward_recorded_until_the_backward_that_crosses_d_step():
    """G's forward runs once, under nnx.vjp, before D's step; G's step differentiates the
    loss with respect to fake through the netD it receives and pulls that back."""
    code = _converted(D_FUNCTION)
    assert "fake, fake_vjp = forward_netG(netG, noise)" in code
    assert "(grads,) = fake_vjp(fake_grad)" in code
    assert code.count("netG(noise)") == 1  # one forward of G, in forward_netG


# D's gradients zeroed after its step instead of before its backwards: torch's next D step
# then adds what G's backward put into netD's .grad, which no fused D step computes
D_ZEROED_LATE = _replace(
    D_FUNCTION, ("def train_d(real, fake):\n    netD.zero_grad()\n", "def train_d(real, fake):\n"),
    ("    optimizerD.step()\n    return", "    optimizerD.step()\n    optimizerD.zero_grad()\n    return"))
# G's gradients zeroed before D's step in a function that reads fake undetached (its backward
# reaches G; torch would then free G's graph before errG.backward())
G_ZEROED_EARLY = _replace(
    D_FUNCTION, ("        fake = netG(noise)\n", "        netG.zero_grad()\n        fake = netG(noise)\n"),
    ("        netG.zero_grad()\n        label.fill_", "        label.fill_"),
    ("output = netD(fake.detach())", "output = netD(fake * 1.0)"))


@pytest.mark.parametrize("source", [D_ZEROED_LATE, G_ZEROED_EARLY], ids=["d_late", "g_early"])
def test_a_step_closing_over_a_model_another_optimizer_trains_is_marked(source):
    assert any("reads netD, which another optimizer trains" in e for e in _errors(source))
