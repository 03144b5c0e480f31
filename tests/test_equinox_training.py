"""The training-script fixtures under ``--target equinox``: idiomatic equinox that learns as well
as the torch original.

Each script in fixtures/training/ that converts with no TODO imports neither torch, torch2jax
nor flax, matches its committed expected output (fixtures/expected/equinox/training/), builds
its model with ``key=`` (``eqx.nn.make_with_state`` with BatchNorm), trains it with an
``eqx.filter_jit`` step of ``eqx.filter_value_and_grad`` and ``eqx.apply_updates``, and, run
as a user would run it (``python script.py`` in an empty folder), reaches the torch original's
final accuracy within 0.03 (the margin tests/test_training_converted.py uses for NNX: the
converted script draws its own data and initial weights from JAX's PRNG). What is not
translated is marked, never emitted as NNX code. The emitted train step follows torch for 10 steps from the same
weights (trajectories), and the deterministic scripts of tests/test_training_scripts.py print
torch's numbers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from launch import final_accuracy, session_final_accuracy

from torch2jax.convert import convert_source
from torch2jax.verify.trajectory import TrainSpec

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "fixtures" / "training"
EXPECTED = ROOT / "fixtures" / "expected" / "equinox" / "training"
SCRIPTS = sorted(TRAINING.glob("*.py"))
MARKED: set[str] = set()  # what still has TODOs under equinox (docs/equinox.md)
CLEAN = [p for p in SCRIPTS if p.stem not in MARKED]
WITHIN = 0.03
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def converted() -> dict[str, object]:
    return {p.stem: convert_source(p.read_text(), path=str(p), target="equinox")
            for p in SCRIPTS}


def _imports(code: str) -> set[str]:
    tree = ast.parse(code)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module}


def _live(code: str) -> str:
    return "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("#"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_converts_to_expected(path: Path, converted) -> None:
    result = converted[path.stem]
    errors = [d for d in result.diagnostics if d.severity == "error"]
    markers = result.code.count("TODO(torch2jax)")
    if path.stem in MARKED:
        assert errors and markers == len(errors)
    else:
        assert errors == [] and markers == 0, [str(d) for d in errors]
    assert not _imports(_live(result.code)) & {"torch", "torch2jax", "flax"}
    assert "nnx" not in _live(result.code) and "rngs" not in _live(result.code)
    assert result.code == (EXPECTED / path.name).read_text()


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
def test_idiomatic_equinox_training(path: Path, converted) -> None:
    code = converted[path.stem].code
    tree = ast.parse(code)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert {"eqx.filter_value_and_grad", "eqx.apply_updates", "eqx.filter", "jax.vmap",
            "eqx.nn.inference_mode", "jax.random.key", "jax.random.split"} <= calls
    assert "optimizer.init(eqx.filter(model, eqx.is_array))" in code
    steps = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
             and n.name in ("train_step", "eval_step")]
    assert len(steps) == 2
    assert all([ast.unparse(d) for d in s.decorator_list] == ["eqx.filter_jit"] for s in steps)
    assert ".backward()" not in code and ".train()" not in code and ".eval()" not in code


def test_batchnorm_state_and_dropout_keys(converted) -> None:
    code = converted["cnn_sgd_steplr"].code
    assert "model, state = eqx.nn.make_with_state(SmallCNN)(key=subkey)" in code
    assert ('jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))'
            '(train_x_batch, state, key=jax.random.split(key, train_x_batch.shape[0]))') in code
    assert "key, dropout_key = jax.random.split(key)" in code
    assert ("model, state, opt_state, loss = train_step(model, state, opt_state, "
            "train_x[idx], train_y[idx], dropout_key)") in code
    # the scheduler writes the learning rate into inject_hyperparams' state
    assert 'opt_state.hyperparams["learning_rate"] = jnp.float32(scheduler(scheduler_steps))' \
        in code
    assert "def evaluate(model, state, images, labels):" in code


def test_a_helper_that_trains_returns_the_model(converted) -> None:
    code = converted["seeds_in_helper"].code
    assert "model = train(model, x_train, y_train, key=subkey)" in code
    assert "    return model\n" in code


def test_autocast_region_computes_in_bfloat16(converted) -> None:
    code = converted["ddp_amp_dataloader"].code
    assert "jax.vmap(autocast(model, jnp.bfloat16))(autocast(x, jnp.bfloat16))" in code
    assert "set_attributes" not in code


def _autocast_use(code: str) -> tuple[bool, bool]:
    """Whether ``code`` defines the autocast helper at its top level, and whether it calls
    the bare name ``autocast`` (torch.amp.autocast(...) is an attribute, not that call)."""
    tree = ast.parse(code)
    defined = any(isinstance(n, ast.FunctionDef) and n.name == "autocast" for n in tree.body)
    called = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "autocast" for n in ast.walk(tree))
    return defined, called


def test_autocast_helper_written_exactly_where_called(converted) -> None:
    uses = {stem: _autocast_use(result.code) for stem, result in converted.items()}
    assert uses["ddp_amp_dataloader"] == (True, True)
    assert all(defined == called for defined, called in uses.values()), uses


# nanoGPT's context chosen at run time: the torch.amp.autocast branch is kept (marked); the
# train step computes in float32, so nothing calls the autocast helper
LEFTOVER_AUTOCAST = '''from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


device_type = 'cpu'
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
x = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 32
y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
for step in range(6):
    with ctx:
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"{loss.item():.6f}")
'''


def test_leftover_autocast_context_writes_no_helper(tmp_path: Path) -> None:
    from test_training_scripts import _run

    result = convert_source(LEFTOVER_AUTOCAST, path="script.py", target="equinox")
    assert "torch.amp.autocast(device_type=device_type" in result.code  # kept, marked
    assert _autocast_use(result.code) == (False, False)
    assert "def autocast" not in result.code
    assert "def train_step(model, opt_state):" in result.code
    losses = [float(v) for v in _run(result.code, tmp_path)]
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.01, losses  # it runs and learns


TRAINS_AND_RETURNS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def fit(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    model = Net()
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    print(fit(model, x, y))
'''


def test_a_helper_that_trains_and_returns_a_value() -> None:
    """It returns the model before its value; a call inside an expression, whose caller
    cannot rebind the model, is marked."""
    result = convert_source(TRAINS_AND_RETURNS, target="equinox")
    assert "    return model, losses\n" in result.code
    assert "called inside an expression: its caller cannot rebind the model" in result.code
    assert any(d.severity == "error" for d in result.diagnostics)
    assert "nnx" not in _live(result.code)
    ast.parse(result.code)
    source = TRAINS_AND_RETURNS.replace("print(fit(model, x, y))",
                                        "losses = fit(model, x, y)\n    print(losses)")
    result = convert_source(source, target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "    model, losses = fit(model, x, y)\n" in result.code


# the common shape of a script: main() builds the model (BatchNorm), the optimizer and a
# scheduler and calls, once per epoch, a train function that receives them and an evaluation
# function under @torch.no_grad(); one batch per epoch (the shuffled order changes no loss),
# weights from nn.init.constant_, so torch and JAX print the same numbers
TRAIN_FUNCTION_PER_EPOCH = '''import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)
        self.fc2 = nn.Linear(6, 3)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.constant_(module.weight, 0.1)
            nn.init.constant_(module.bias, 0.05)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def train(model, loader, optimizer, scheduler):
    model.train()
    total, correct, n = 0.0, 0, 0
    for xb, yb in loader:
        optimizer.zero_grad()
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        loss.backward()
        optimizer.step()
        total += loss.item() * yb.size(0)
        correct += (out.argmax(1) == yb).sum().item()
        n += yb.size(0)
    scheduler.step()
    return total / n, correct / n


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    total, n = 0.0, 0
    for xb, yb in loader:
        total += F.cross_entropy(model(xb), yb, reduction="sum").item()
        n += yb.size(0)
    return total / n


def main():
    torch.manual_seed(0)
    x = torch.linspace(-1.0, 1.0, 48).reshape(12, 4) ** 3
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    train_loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    test_loader = DataLoader(TensorDataset(x, y), batch_size=4)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6)
    for epoch in range(6):
        loss, acc = train(model, train_loader, optimizer, scheduler)
        test_loss = evaluate(model, test_loader)
        print(f"{loss:.8f} {acc:.4f} {test_loss:.8f} {scheduler.get_last_lr()[0]:.8f}")


if __name__ == "__main__":
    main()
'''


def test_train_function_per_epoch_shape() -> None:
    result = convert_source(TRAIN_FUNCTION_PER_EPOCH, path="script.py", target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    code = result.code
    assert "TODO" not in code and "nnx" not in _live(code)
    # the step at the top level, given the optax transform: compiled once, not every epoch
    assert "@eqx.filter_jit\ndef train_step(model, state, opt_state, optimizer, xb, yb):" in code
    assert "def train(model, state, opt_state, loader, optimizer, scheduler):" in code
    assert ("        model, state, opt_state, loss, out = train_step(model, state, opt_state, "
            "optimizer, xb, yb)") in code
    assert '    opt_state.hyperparams["learning_rate"] = jnp.float32(scheduler(' \
        'scheduler.steps))' in code
    assert "    return model, state, opt_state, (total / n, correct / n)\n" in code
    assert "def evaluate(model, state, loader):" in code
    assert "eval_step(model, state, xb)" in code
    assert "    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))\n" in code
    assert ("        model, state, opt_state, (loss, acc) = train(model, state, opt_state, "
            "train_loader(epoch), optimizer, scheduler)") in code
    assert "test_loss = evaluate(model, state, test_loader)" in code


@pytest.mark.slow
def test_train_function_per_epoch_trains_like_torch(tmp_path: Path) -> None:
    """Training loss, accuracy, evaluation loss (BatchNorm's running statistics, threaded
    through train's return) and the cosine learning rate, every epoch, as torch prints them."""
    from test_training_scripts import _close, _run

    code = convert_source(TRAIN_FUNCTION_PER_EPOCH, path="script.py", target="equinox").code
    torch_dir, jax_dir = tmp_path / "torch", tmp_path / "jax"
    torch_dir.mkdir()
    jax_dir.mkdir()
    torch_out = _run(TRAIN_FUNCTION_PER_EPOCH, torch_dir)
    jax_out = _run(code, jax_dir)
    _close(jax_out, torch_out)
    losses = [float(x) for x in jax_out[0::4]]
    assert losses[-1] < losses[0] - 0.03, losses  # it learns


@pytest.mark.slow
@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
def test_converted_script_reaches_torch_accuracy(path: Path, converted, tmp_path: Path,
                                                 tmp_path_factory) -> None:
    script = tmp_path / path.name
    script.write_text(converted[path.stem].code)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # the data-parallel step's model and optimizer state are replicated over the mesh before
    # the loop, as the step returns them: one compile (before, the first call took them on
    # one device and the second compiled again for the replicated output)
    jax_acc = final_accuracy(script, run_dir, TIMEOUT_S)
    # (the torch original runs once per session: four files compare with it)
    torch_acc = session_final_accuracy(path, tmp_path_factory, TIMEOUT_S)
    print(f"{path.stem}: torch {torch_acc:.4f}  equinox {jax_acc:.4f}")
    assert abs(jax_acc - torch_acc) <= WITHIN, (torch_acc, jax_acc)
    assert list(run_dir.iterdir()) == [], "a training script wrote files"


# --- trajectories: the equinox train step against torch, 10 steps --------------------------

TRAJECTORIES = {
    "mlp-adamw-cosine-clip": ("mlp", {"in_features": 6, "hidden_sizes": [8], "num_classes": 3},
                              ["float32[4,6]"], TrainSpec(
        optimizer="torch.optim.AdamW(params, lr=1e-2, weight_decay=1e-2)",
        scheduler="torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)",
        clip_grad_norm=0.5, loss="F.cross_entropy(output, labels)", labels="int64[4]:3")),
    "mlp-sgd-nesterov-steplr": ("mlp", {"in_features": 6, "hidden_sizes": [8],
                                        "num_classes": 3}, ["float32[4,6]"], TrainSpec(
        optimizer="torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, "
                  "weight_decay=5e-4)",
        scheduler="torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.3)",
        loss="F.cross_entropy(output, labels, label_smoothing=0.1)", labels="int64[4]:3")),
    # ReduceLROnPlateau stepped on each step's loss, as on NNX and linen (one shared loop)
    "mlp-sgd-plateau-clip": ("mlp", {"in_features": 6, "hidden_sizes": [8], "num_classes": 3},
                             ["float32[4,6]"], TrainSpec(
        optimizer="torch.optim.SGD(params, lr=0.1, momentum=0.9)",
        scheduler="torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)",
        clip_grad_norm=1.0, loss="F.cross_entropy(output, labels)", labels="int64[4]:3")),
    # BatchNorm in training mode (batch statistics over the vmapped batch), dropout off
    "cnn-sgd-momentum": ("cnn", {"num_classes": 4}, ["float32[4,3,32,32]"], TrainSpec(
        optimizer="torch.optim.SGD(params, lr=0.01, momentum=0.9)",
        loss="F.cross_entropy(output, labels)", labels="int64[4]:4")),
}


@pytest.fixture(scope="module")
def equinox_models(tmp_path_factory) -> dict[str, tuple[object, object]]:
    from torch2jax.verify.load import load_module

    out = tmp_path_factory.mktemp("equinox_models")
    models = {}
    for stem in ("mlp", "cnn"):
        src = ROOT / "fixtures" / "models" / f"{stem}.py"
        (out / src.name).write_text(convert_source(src.read_text(), path=str(src),
                                                   target="equinox").code)
        models[stem] = (load_module(src), load_module(out / src.name, prefix="eqx_traj"))
    return models


@pytest.mark.parametrize("key", sorted(TRAJECTORIES))
def test_equinox_train_step_follows_torch_for_10_steps(key: str, equinox_models) -> None:
    import torch

    from torch2jax.verify.equinox import train_equinox

    stem, args, inputs, spec = TRAJECTORIES[key]
    torch_module, eqx_module = equinox_models[stem]
    name = stem.upper()
    torch.manual_seed(0)
    torch_model = getattr(torch_module, name)(**args)
    r = train_equinox(torch_model, eqx_module, name, args, spec, inputs,
                      rtol=1e-5)
    print(f"{key}: loss rel {r.loss_max_rel_diff:.2e}  param rel {r.param_max_rel_diff:.2e}")
    assert len(r.losses_torch) == 10 and r.compared
    assert r.loss_max_rel_diff <= 1e-5, (r.losses_torch, r.losses_jax)
    assert r.param_max_rel_diff <= 1e-5, r.worst_param


# --- deterministic scripts (tests/test_training_scripts.py): the same numbers as torch -----


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw_cosine_clip", "sgd_nesterov_steplr_per_epoch",
                                  "adam_lambda_warmup", "sgd_plateau",
                                  "accumulate_rmsprop_exponential",
                                  "train_function_per_epoch"])
def test_deterministic_script_trains_like_torch(name: str, tmp_path: Path,
                                                tmp_path_factory) -> None:
    """Weights from ``self.apply(self._init_weights)`` with constant initialisers (init_layers
    and ``eqx.tree_at`` on the equinox side), data from ``linspace``: the converted equinox
    script prints the losses and learning rates torch prints."""
    from test_training_scripts import HEADER, SCRIPTS, _close, _run, _run_torch

    source = HEADER + SCRIPTS[name]
    result = convert_source(source, path="script.py", target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "@eqx.filter_jit" in result.code and "init_layers(self._init_weights" in result.code
    jax_dir = tmp_path / "jax"
    jax_dir.mkdir()
    # (the torch run is test_training_scripts.py's: once per session)
    _close(_run(result.code, jax_dir), _run_torch(source, tmp_path_factory))


def test_gpt_weight_initialisation_and_optimizer_method(converted, tmp_path: Path) -> None:
    """gpt_param_groups: ``self.apply(self._init_weights)`` re-initialises every Linear and
    Embedding (normal, std 0.02; zero biases) through init_layers, and configure_optimizers
    returns the optax transform whose mask decays the matrices only."""
    import equinox as eqx
    import jax
    import numpy as np

    from torch2jax.verify.load import load_module

    path = tmp_path / "gpt_param_groups.py"
    path.write_text(converted["gpt_param_groups"].code)
    mod = load_module(path, prefix="eqx_gpt")
    model = mod.GPT(16, 16, 48, 4, 2, key=jax.random.key(0))
    is_layer = lambda x: isinstance(x, (eqx.nn.Linear, eqx.nn.Embedding))
    layers = [x for x in jax.tree.leaves(model, is_leaf=is_layer) if is_layer(x)]
    assert len(layers) == 2 + 2 * 4  # wte, wpe; per block c_attn, c_proj and two MLP Linears
    for layer in layers:
        assert abs(float(np.std(np.asarray(layer.weight))) - 0.02) < 0.003
        if isinstance(layer, eqx.nn.Linear):
            assert not np.asarray(layer.bias).any()
    tx = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95))
    assert tx.init(eqx.filter(model, eqx.is_array)).hyperparams["learning_rate"] == \
        np.float32(3e-3)


TWO_STATEFUL_MODELS = """
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(self.fc(x))


def main():
    torch.manual_seed(0)
    teacher = Net()
    student = Net()
    x = torch.randn(8, 4)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        loss = F.mse_loss(student(x), teacher(x).detach())
        loss.backward()
        optimizer.step()
"""


def test_two_models_with_state_in_one_function_are_marked() -> None:
    """One ``state`` name per function: a second BatchNorm model's state would silently replace
    the first's, so the function is marked instead."""
    result = convert_source(TWO_STATEFUL_MODELS, path="two.py", target="equinox")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("two models with BatchNorm state in one function (student and teacher)" in e
               for e in errors), errors
    assert "TODO(torch2jax)" in result.code
