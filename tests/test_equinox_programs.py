"""Programs of several files under ``--target equinox`` (issue 32): converted as the CLI
converts a folder (the first pass over the files, then each file with its known names), run,
and compared with torch's printed numbers.

A training script that imports its model class from another file (the corpus GPT's
``train.py`` with ``from model import GPT``) needs to know how that class is called on
equinox: whether it keeps BatchNorm state, takes a dropout key, is kept batched. The converter
reads them from the other file's conversion (repo_classes.py); without them a
function that reads the model as a global (``estimate_loss``) was marked.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

import pytest
from test_training_scripts import _close
from unbound import undefined_names

from torch2jax.convert import convert_source
from torch2jax.repo import index_repository

# a BatchNorm (state) and a dropout layer (a key; p=0 so that both sides compute alike),
# weights set to constants so that torch's and JAX's runs print the same numbers
MODEL = '''import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.0)
        self.fc2 = nn.Linear(6, 3)
        nn.init.constant_(self.fc1.weight, 0.1)
        nn.init.constant_(self.fc1.bias, 0.05)
        nn.init.constant_(self.fc2.weight, -0.1)
        nn.init.constant_(self.fc2.bias, 0.02)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))
'''

# nanoGPT's shape: the model a global of the script, an evaluation function reading it
SCRIPT = '''import torch
import torch.nn.functional as F
from model import Net

torch.manual_seed(0)
x = torch.linspace(-1.0, 1.0, 48).reshape(12, 4) ** 3
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


@torch.no_grad()
def estimate_loss():
    model.eval()
    loss = F.cross_entropy(model(x), y)
    model.train()
    return loss.item()


for step in range(5):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"{loss.item():.8f} {estimate_loss():.8f}")
'''


def _run(code: str, folder: Path) -> list[str]:
    """The program run in this process as ``python script.py`` in ``folder`` would run it
    (its sibling files importable): what it prints, split. (No new interpreter: torch and JAX
    are imported once for the module's tests.)"""
    assert undefined_names(code, "script.py") == []
    out = io.StringIO()
    script = folder / "script.py"
    script.write_text(code)
    sys.path.insert(0, str(folder))
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("model", None)  # (the torch and the JAX side each have their own)
    return out.getvalue().split()


def _convert_folder(files: dict[str, str], folder: Path) -> dict[str, str]:
    """Each file converted for equinox with the known names the CLI's first pass gives it."""
    folder.mkdir()
    paths = {name: folder / name for name in files}
    for name, text in files.items():
        paths[name].write_text(text)
    repo = index_repository(paths.values())
    out = {}
    for name, path in paths.items():
        result = convert_source(files[name], path=str(path), target="equinox",
                                known_modules=set(repo.known_for(path)),
                                public=set(repo.exported_from(path)))
        assert "TODO(torch2jax)" not in result.code, result.code
        out[name] = result.code
    return out


@pytest.mark.slow
def test_global_model_of_an_imported_class(tmp_path: Path) -> None:
    """The model's flags come from model.py: the evaluation function reads it as a global
    (``global model``, inference mode set and unset), with its BatchNorm state, and the
    numbers are torch's."""
    code = _convert_folder({"model.py": MODEL, "script.py": SCRIPT}, tmp_path / "src")
    assert "    global model\n    model = eqx.nn.inference_mode(model)\n" in code["script.py"]
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "jax"
    torch_dir.mkdir()
    jax_dir.mkdir()
    (torch_dir / "model.py").write_text(MODEL)
    (jax_dir / "model.py").write_text(code["model.py"])
    _close(_run(code["script.py"], jax_dir), _run(SCRIPT, torch_dir), rtol=1e-5)


# DCGAN's weights_init applied with model.apply: a function of the file testing the layer's
# class name, torch.nn.init on its weights. With constants (no draw) the numbers are torch's;
# with a normal draw the spread of the output follows the weights' 0.02 (equinox's own
# initialisation gives about 0.1 here)
APPLY_INIT = '''import torch
import torch.nn as nn

torch.manual_seed(0)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.constant_(m.weight, 0.05)
    elif classname.find("BatchNorm") != -1:
        nn.init.constant_(m.weight, 1.5)
        nn.init.zeros_(m.bias)


def normal_init(m):
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(2, 4, 3, 1, 0, bias=False),
                                  nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.Conv2d(4, 8, 3, 1, 1, bias=False))

    def forward(self, x):
        return self.main(x)


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 16, 3, 1, 0, bias=False)
        self.conv = nn.Conv2d(16, 16, 3, 1, 1, bias=False)

    def forward(self, x):
        return self.conv(self.up(x))


net = Net()
net.apply(weights_init)
wide = Head()
wide.apply(normal_init)
x = torch.linspace(-1.0, 1.0, 32).reshape(2, 2, 4, 2)
net.eval()
with torch.no_grad():
    out = net(x)
spread = wide(x)
print(f"{out.sum().item():.6f} {out.abs().sum().item():.6f} {out.pow(2).sum().item():.6f}")
print(f"{spread.std().item():.6f}")
'''


@pytest.mark.slow
def test_apply_of_an_init_function(tmp_path: Path) -> None:
    code = _convert_folder({"script.py": APPLY_INIT}, tmp_path / "src")["script.py"]
    assert "net = jax.tree.map(lambda m: weights_init(m) if isinstance(" in code
    assert "wide = init_layers(normal_init, wide, (eqx.nn.Conv, eqx.nn.ConvTranspose), " \
        "key=subkey)" in code
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "jax"
    torch_dir.mkdir()
    jax_dir.mkdir()
    want, got = _run(APPLY_INIT, torch_dir), _run(code, jax_dir)
    _close(got[:3], want[:3], rtol=1e-5)
    # torch's seeds 0-4 give 0.0053 to 0.0074
    assert 0.5 < float(got[3]) / float(want[3]) < 2.0, (got, want)


# two models, each with its own optimizer, trained in two loops of one scope: equinox's
# optimizer state is an array the script holds, one `opt_state` name per function
TWO_OPTIMIZERS = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x)


x = torch.linspace(-1.0, 1.0, 24).reshape(6, 4)
y = torch.linspace(0.0, 1.0, 6).reshape(6, 1)
a = Net()
b = Net()
opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
for step in range(4):
    loss_a = F.mse_loss(a(x), y)
    opt_a.zero_grad()
    loss_a.backward()
    opt_a.step()
for step in range(4):
    loss_b = F.mse_loss(b(x), y)
    opt_b.zero_grad()
    loss_b.backward()
    opt_b.step()
'''


def test_two_optimizers_in_one_scope_are_marked() -> None:
    """The second optimizer's state replaced the first's under one name, unmarked: b's loop
    then stepped with a's momentum (its losses 0.054, 0.005, 0.105 where torch's are 0.163,
    0.049, 0.001), and both loops' steps, of one name, were written for b. Now the second
    optimizer is marked and each loop's step is its own."""
    result = convert_source(TWO_OPTIMIZERS, path="two.py", target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("two optimizers in one function (opt_a and opt_b)" in e for e in errors), errors
    assert "def train_step(a, opt_state):" in result.code
    assert "    a, opt_state = train_step(a, opt_state)" in result.code or \
        "    a, opt_state, " in result.code


# DCGAN's evaluation: the generator (per example) evaluated, the discriminator (kept batched:
# its .view(-1, 1).squeeze(1)) only built here. The one eval_step takes the generator's form
EVAL_ONE_OF_TWO = '''import torch
import torch.nn as nn


class Gen(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)
        nn.init.constant_(self.fc.weight, 0.3)
        nn.init.constant_(self.fc.bias, -0.1)

    def forward(self, z):
        return torch.tanh(self.bn(self.fc(z)))


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x):
        return self.fc(x).view(-1, 1).squeeze(1)


torch.manual_seed(0)
netG = Gen()
netD = Critic()
z = torch.linspace(-1.0, 1.0, 6).reshape(2, 3)
netG.eval()
with torch.no_grad():
    sample = netG(z)
print(f"{sample.sum().item():.6f} {sample.pow(2).sum().item():.6f}")
'''


@pytest.mark.slow
def test_eval_step_of_the_evaluated_model(tmp_path: Path) -> None:
    """The eval_step was refused ("models kept batched and models per example share one
    eval_step") as soon as the file built one model of each form."""
    code = _convert_folder({"script.py": EVAL_ONE_OF_TWO}, tmp_path / "src")["script.py"]
    assert "class Critic" in code and "    batched = True\n" in code
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "jax"
    torch_dir.mkdir()
    jax_dir.mkdir()
    _close(_run(code, jax_dir), _run(EVAL_ONE_OF_TWO, torch_dir), rtol=1e-5)


def test_init_function_also_called_on_one_layer_is_marked() -> None:
    """Its equinox form returns the layer, where NNX's (and torch's) changes it in place: a
    direct call, whose result is not kept, would leave the layer as it was. Marked."""
    source = APPLY_INIT.replace("wide.apply(normal_init)\n",
                                "wide.apply(normal_init)\nnormal_init(nn.Conv2d(2, 2, 3))\n")
    result = convert_source(source, path="script.py", target="equinox")
    assert "init_layers(normal_init" not in result.code
    assert "TODO(torch2jax)" in result.code
    assert "net = jax.tree.map(lambda m: weights_init(m)" in result.code  # (the other one)
