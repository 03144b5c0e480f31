"""Training trajectories: every translated optimizer and scheduler, 10 steps against torch.

One tiny MLP (fixtures/models/mlp.py, converted by torch2jax) is built per module; each check
trains copies of it on both sides from the same transplanted weights and the same batches,
then compares the loss of every step and every parameter at the end (float32, CPU): the worst
relative difference must stay within 1e-5. The measured differences are printed at the end of
the module (``pytest -s``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("optax")

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.verify.cases import load_cases, run_cases
from torch2jax.verify.run import VerifyRequest
from torch2jax.verify.trajectory import TrainSpec, build_models, train_models, verify_trajectory

ROOT = Path(__file__).resolve().parent.parent
MLP = f"{ROOT / 'fixtures' / 'models' / 'mlp.py'}::MLP"
MLP_ARGS = {"in_features": 6, "hidden_sizes": [8], "num_classes": 3}
INPUTS = ["float32[4,6]"]
MSE = "((output - labels) ** 2).mean()"
CE = "F.cross_entropy(output, labels)"
TOL = 1e-5

MEASURED: dict[str, tuple[float, float]] = {}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    req = VerifyRequest(MLP, args=MLP_ARGS, inputs=tuple(INPUTS))
    return build_models(req, tmp_path_factory.mktemp("converted"))


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    if MEASURED:
        width = max(len(k) for k in MEASURED)
        print(f"\n{'setup':<{width}}  loss rel   param rel")
        for key, (loss, param) in MEASURED.items():
            print(f"{key:<{width}}  {loss:.2e}  {param:.2e}")


def _check(pair, key: str, train: TrainSpec):
    torch_model, jax_model = pair
    r = train_models(torch_model, jax_model, train, INPUTS)
    MEASURED[key] = (r.loss_max_rel_diff, r.param_max_rel_diff)
    assert len(r.losses_torch) == train.steps
    assert r.loss_max_rel_diff <= TOL, (r.mismatch, r.optax, r.losses_torch, r.losses_jax)
    assert r.param_max_rel_diff <= TOL, (r.worst_param, r.optax)
    return r


OPTIMIZERS = {
    "SGD": "torch.optim.SGD(params, lr=0.1)",
    "SGD momentum": "torch.optim.SGD(params, lr=0.1, momentum=0.9)",
    "SGD nesterov+wd": "torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, "
                       "weight_decay=0.05)",
    "SGD dampening": "torch.optim.SGD(params, lr=0.1, momentum=0.9, dampening=0.5)",
    "SGD maximize": "torch.optim.SGD(params, lr=0.01, momentum=0.5, maximize=True)",
    "Adam": "torch.optim.Adam(params, lr=0.01)",
    "Adam wd (L2)": "torch.optim.Adam(params, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)",
    "Adam amsgrad": "torch.optim.Adam(params, lr=0.01, weight_decay=0.1, amsgrad=True)",
    "Adam decoupled": "torch.optim.Adam(params, lr=0.01, weight_decay=0.1, "
                      "decoupled_weight_decay=True)",
    "AdamW": "torch.optim.AdamW(params, lr=0.01)",
    "AdamW amsgrad": "torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, amsgrad=True)",
    "RMSprop": "torch.optim.RMSprop(params, lr=0.01)",
    "RMSprop centered+wd": "torch.optim.RMSprop(params, lr=0.01, weight_decay=0.1, "
                           "centered=True)",
    "RMSprop momentum": "torch.optim.RMSprop(params, lr=0.01, momentum=0.9)",
    "RMSprop centered+momentum": "torch.optim.RMSprop(params, lr=0.01, momentum=0.5, "
                                 "centered=True)",
    "Adagrad": "torch.optim.Adagrad(params, lr=0.1)",
    "Adagrad lr_decay+wd+init": "torch.optim.Adagrad(params, lr=0.1, lr_decay=0.1, "
                                "weight_decay=0.1, initial_accumulator_value=0.5)",
    "Adamax": "torch.optim.Adamax(params, lr=0.01, weight_decay=0.1)",
    "RAdam": "torch.optim.RAdam(params, lr=0.01)",
    "RAdam decoupled wd": "torch.optim.RAdam(params, lr=0.01, weight_decay=0.1, "
                          "decoupled_weight_decay=True)",
    "Adadelta": "torch.optim.Adadelta(params, lr=1.0, weight_decay=0.1)",
}


@pytest.mark.slow
@pytest.mark.parametrize("key", list(OPTIMIZERS))
def test_optimizer_trajectory(pair, key: str) -> None:
    _check(pair, key, TrainSpec(OPTIMIZERS[key], MSE, "float32[4,3]"))


@pytest.mark.slow
@pytest.mark.parametrize(("key", "optimizer", "clip"), [
    ("SGD + clip_grad_norm", "torch.optim.SGD(params, lr=0.1, momentum=0.9)", 0.05),
    ("Adam + clip_grad_norm", "torch.optim.Adam(params, lr=0.01)", 0.05),
])
def test_clipping_trajectory(pair, key: str, optimizer: str, clip: float) -> None:
    _check(pair, key, TrainSpec(optimizer, CE, "int64[4]:3", clip_grad_norm=clip))


SGD_M = "torch.optim.SGD(params, lr=0.1, momentum=0.9)"
SCHEDULERS = {
    "StepLR": (SGD_M, "lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)"),
    "MultiStepLR (repeated)": (SGD_M, "lr_scheduler.MultiStepLR(optimizer, [2, 5, 5], 0.5)"),
    "ExponentialLR": (SGD_M, "lr_scheduler.ExponentialLR(optimizer, gamma=0.8)"),
    "CosineAnnealingLR past T_max": (
        SGD_M, "lr_scheduler.CosineAnnealingLR(optimizer, T_max=4, eta_min=0.01)"),
    "LinearLR (defaults)": (SGD_M, "lr_scheduler.LinearLR(optimizer)"),
    "ConstantLR (defaults)": (SGD_M, "lr_scheduler.ConstantLR(optimizer)"),
    "OneCycleLR SGD (momentum cycled)": (
        "torch.optim.SGD(params, lr=0.1)",
        "lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)"),
    "OneCycleLR Adam (beta1 cycled)": (
        "torch.optim.Adam(params, lr=0.01, weight_decay=0.1)",
        "lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=12, three_phase=True)"),
    "OneCycleLR linear, no cycling": (
        SGD_M, ("lr_scheduler.OneCycleLR(optimizer, 0.1, total_steps=10, "
               "anneal_strategy='linear', cycle_momentum=False, pct_start=0.25)")),
    "SequentialLR": (
        SGD_M, ("lr_scheduler.SequentialLR(optimizer, [lr_scheduler.LinearLR(optimizer, 0.1, "
               "total_iters=3), lr_scheduler.CosineAnnealingLR(optimizer, 7)], milestones=[3])")),
    "LambdaLR": (
        SGD_M, ("lr_scheduler.LambdaLR(optimizer, lambda e: min(1.0, (e + 1) / 4) * "
               "math.cos(math.pi * e / 20) if e < 6 else 0.5 ** (e // 3))")),
    "PolynomialLR": (SGD_M, "lr_scheduler.PolynomialLR(optimizer, total_iters=8, power=2.0)"),
    "ReduceLROnPlateau": (
        "torch.optim.SGD(params, lr=0.1)",
        "lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5, cooldown=1)"),
    "RMSprop momentum + StepLR": (
        "torch.optim.RMSprop(params, lr=0.01, momentum=0.9)",
        "lr_scheduler.StepLR(optimizer, 3, gamma=0.3)"),
    "Adagrad lr_decay + ExponentialLR": (
        "torch.optim.Adagrad(params, lr=0.1, lr_decay=0.1)",
        "lr_scheduler.ExponentialLR(optimizer, 0.9)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", list(SCHEDULERS))
def test_scheduler_trajectory(pair, key: str) -> None:
    optimizer, scheduler = SCHEDULERS[key]
    steps = 12 if "total_steps=12" in scheduler else 10
    _check(pair, key, TrainSpec(optimizer, MSE, "float32[4,3]", scheduler, steps=steps))


@pytest.mark.slow
def test_plateau_really_reduces(pair) -> None:
    """The plateau case is only a test if torch did cut the learning rate."""
    optimizer, scheduler = SCHEDULERS["ReduceLROnPlateau"]
    torch_model, _ = pair
    import copy

    from torch2jax.verify.train_common import torch_setup

    opt, sched = torch_setup(TrainSpec(optimizer, MSE, None, scheduler), copy.deepcopy(
        torch_model))
    for value in (1.0, 2.0, 3.0):
        sched.step(value)
    assert opt.param_groups[0]["lr"] < 0.1


@pytest.mark.slow
def test_batchnorm_and_dropout_model(tmp_path) -> None:
    """BatchNorm in training mode on both sides (batch statistics, running averages), the
    Dropout switched off: the CNN fixture trains the same. (SGD, not Adam: the conv biases
    before a BatchNorm get gradients that are float32 noise, and Adam rescales noise into
    full-size steps that differ between the frameworks; measured 4e-2 on conv2.bias.)"""
    req = VerifyRequest(f"{ROOT / 'fixtures' / 'models' / 'cnn.py'}::CNN",
                        args={"num_classes": 3}, inputs=("float32[2,3,32,32]",))
    train = TrainSpec("torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)", CE,
                      "int64[2]:3", steps=3)
    r = verify_trajectory(req, train)
    assert r.error is None, r.error
    MEASURED["CNN (BatchNorm, Dropout) SGD"] = (r.loss_max_rel_diff, r.param_max_rel_diff)
    assert any("dropout disabled" in n and "1 torch Dropout" in n for n in r.notes), r.notes
    assert r.passed and r.loss_max_rel_diff <= TOL and r.param_max_rel_diff <= TOL, r.to_json()


# --------------------------------------------------------------------------------------------
# mismatches are caught, refusals are errors
# --------------------------------------------------------------------------------------------


def test_optax_defaults_are_caught(pair) -> None:
    """optax.adamw's own weight decay (1e-4) instead of torch's 0.01 shows in 10 steps."""
    torch_model, jax_model = pair
    train = TrainSpec("torch.optim.AdamW(params, lr=0.05)", MSE, "float32[4,3]",
                      optax="optax.adamw(0.05)")
    r = train_models(torch_model, jax_model, train, INPUTS)
    assert not r.passed and r.param_max_rel_diff > 1e-4, r.to_json()
    good = train_models(torch_model, jax_model, TrainSpec(
        "torch.optim.AdamW(params, lr=0.05)", MSE, "float32[4,3]"), INPUTS)
    assert good.passed


@pytest.mark.parametrize(("train", "why"), [
    (TrainSpec("torch.optim.NAdam(params)", MSE, "float32[4,3]"), "momentum-decay"),
    (TrainSpec("torch.optim.LBFGS(params)", MSE, "float32[4,3]"), "not one of"),
    (TrainSpec("torch.optim.SGD(params, lr=0.1)", "output.sum(", None), "not a Python"),
    (TrainSpec("torch.optim.SGD(params, lr=0.1)", MSE, "float32[4,3]", steps=0),
     "at least one step"),
    (TrainSpec("torch.optim.SGD(params, lr=0.1)", MSE, "float32[4,3]",
               "lr_scheduler.StepLR(optimizer, 2, last_epoch=3)"), "last_epoch"),
])
def test_what_cannot_be_translated_is_an_error(train: TrainSpec, why: str) -> None:
    req = VerifyRequest(MLP, args=MLP_ARGS, inputs=tuple(INPUTS))
    r = verify_trajectory(req, train)
    assert r.error is not None and why in r.error, r.error


# --------------------------------------------------------------------------------------------
# the command line and the cases file
# --------------------------------------------------------------------------------------------

ARGS = ["verify", MLP, "--args", json.dumps(MLP_ARGS), "--input", INPUTS[0]]
TORCH_MODELS = ROOT / "tests" / "data" / "verify" / "torch" / "models.py"
WRONG = ROOT / "tests" / "data" / "verify" / "nnx" / "wrong.py"


def test_cli_trajectory_passes_and_reports_json() -> None:
    result = CliRunner().invoke(app, [
        *ARGS, "--optimizer", ("optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, "
        "weight_decay=5e-4)"), "--scheduler", ("lr_scheduler.StepLR(optimizer, step_size=2, "
        "gamma=0.5)"), "--loss", "F.cross_entropy(output, labels, label_smoothing=0.1)",
        "--labels", "int64[4]:3", "--clip-grad-norm", "1.0", "--steps", "6", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["passed"] and data["steps"] == 6 and len(data["losses_jax"]) == 6
    assert data["param_max_rel_diff"] <= TOL and data["loss_max_rel_diff"] <= TOL
    assert data["optax"].startswith("optax.chain(optax.clip_by_global_norm(1.0)")
    assert any("dropout disabled" in n for n in data["notes"])


def test_cli_table_output() -> None:
    result = CliRunner().invoke(app, [*ARGS, "--optimizer", "torch.optim.Adam(params)",
                                      "--loss", MSE, "--labels", "float32[4,3]",
                                      "--steps", "3"])
    assert result.exit_code == 0, result.output
    assert "training trajectory: 3 steps" in result.output and "optax.adam(" in result.output


@pytest.mark.parametrize(("extra", "code"), [
    (["--optimizer", "torch.optim.RMSprop(params)", "--optax", "optax.rmsprop(0.01)"], 1),
    (["--optimizer", "torch.optim.NAdam(params)"], 2),
    # a hand-written transform for an optimizer we refuse still runs: optax.nadam is not NAdam
    (["--optimizer", "torch.optim.NAdam(params, lr=0.01)", "--optax", "optax.nadam(0.01)"], 1),
    (["--scheduler", "lr_scheduler.StepLR(optimizer, 2)"], 2),  # no --optimizer
])
def test_cli_mismatch_and_errors(extra: list[str], code: int) -> None:
    loss = [] if "--scheduler" in extra else ["--loss", MSE, "--labels", "float32[4,3]"]
    result = CliRunner().invoke(app, [*ARGS, *extra, *loss, "--steps", "5"])
    assert result.exit_code == code, result.output


def test_cli_a_wrong_conversion_fails_the_trajectory() -> None:
    """wrong.py's MLP uses GELU's tanh approximation: the trajectories drift apart."""
    result = CliRunner().invoke(app, [
        "verify", f"{TORCH_MODELS}::MLP", "--input", "float32[4,8]", "--converted", str(WRONG),
        "--optimizer", "torch.optim.SGD(params, lr=0.5)", "--loss", MSE,
        "--labels", "float32[4,4]", "--json"])
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["loss_max_rel_diff"] > 1e-5


def test_cases_file_train_table(tmp_path) -> None:
    cases = tmp_path / "cases.toml"
    cases.write_text(
        "[[case]]\nname = 'mlp'\n"
        f"target = '{MLP}'\n"
        "args = { in_features = 6, hidden_sizes = [8], num_classes = 3 }\n"
        "inputs = ['float32[4,6]']\n"
        "[case.train]\noptimizer = 'torch.optim.AdamW(params, lr=0.01)'\n"
        f"loss = '{CE}'\nlabels = 'int64[4]:3'\nscheduler = "
        "'lr_scheduler.CosineAnnealingLR(optimizer, 5)'\nsteps = 4\n")
    assert load_cases(cases)[0].train.steps == 4
    forward, trained = run_cases(cases)
    assert forward.mode == "eval" and forward.passed
    assert trained.mode == "train 4 steps" and trained.passed, trained.to_json()
    (tmp_path / "bad.toml").write_text(cases.read_text().replace("steps = 4", "step = 4"))
    with pytest.raises(ValueError, match="unknown keys in \\[case.train\\]"):
        load_cases(tmp_path / "bad.toml")


def test_fixture_cases_carry_a_training_case() -> None:
    cases = load_cases(ROOT / "fixtures" / "cases.toml")
    trained = [c for c in cases if c.train is not None]
    assert [c.name for c in trained] == ["mlp"]
    assert trained[0].train.scheduler and trained[0].train.clip_grad_norm == 1.0


@pytest.mark.parametrize("loss", [
    "F.cross_entropy(output[0].flatten(0, 1), labels.flatten())",
    "F.cross_entropy(output[0].flatten(0, 1), labels.flatten(), label_smoothing=0.1)",
    ("F.mse_loss(F.normalize(output[0].flatten(0, 1) + 1, dim=-1), "
     "F.one_hot(labels.flatten(), 5).float())"),
])
def test_loss_of_compound_operands_is_bound_by_the_verifier(loss: str) -> None:
    """`--loss` is one expression: where a rule needs an operand as a name, it is bound to a
    fresh name (by the converter's rules now, and by the verifier's own binding where a rule
    still asks for a name); the converted loss computes torch's value (on main: refused,
    "assign it to a name first")."""
    import jax.numpy as jnp

    from torch2jax.verify.train_common import torch_loss, translate_loss

    jax_loss, text = translate_loss(loss)
    assert "torch" not in text
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g)
    labels = torch.randint(0, 5, (2, 3), generator=g)
    expected = float(torch_loss(loss)((logits, None), labels))
    got = float(jax_loss((jnp.asarray(logits.numpy()), None), jnp.asarray(labels.numpy())))
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_loss_parts_are_bound_in_evaluation_order_and_never_when_conditional() -> None:
    from torch2jax.verify.train_common import bind_operands

    assert bind_operands("F.cross_entropy(output[0].flatten(0, 1), labels.view(-1))") == (
        [("_loss0", "output[0]"), ("_loss1", "_loss0.flatten(0, 1)"),
         ("_loss2", "labels.view(-1)")], "F.cross_entropy(_loss1, _loss2)")
    assert bind_operands("F.mse_loss(output, labels)") is None  # nothing compound
    assert bind_operands("F.mse_loss(output[0] if labels.dim() else output, labels)") is None
    assert bind_operands("sum(F.mse_loss(o.flatten(0, 1), labels) for o in output)") is None
    bindings, _ = bind_operands("F.l1_loss(_loss0.flatten(0, 1), labels.abs())")
    assert [name for name, _ in bindings] == ["_loss1", "_loss2"]  # a taken name is skipped
