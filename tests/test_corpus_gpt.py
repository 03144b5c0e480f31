"""The GPT program of the shape corpus (tests/corpus/gpt: model.py, train.py, sample.py, in the
shape of popular public GPT training repositories), converted with the CLI and run.

The torch program trains for 30 iterations on a synthetic token stream and prints its losses;
``sample.py`` then loads the checkpoint and prints sampled token sequences (three runs: its
default seed, ``--seed=2``, ``--seed=1337``), and ``train.py --init_from=resume --max_iters=40``
resumes from it. Each target's
conversion of the whole folder must parse and bind every name it reads (ruff F821). Where a
target's converted program runs with zero edits, its printed losses must fall like torch's;
where an idiom is still refused, the refusal is a ``# TODO(torch2jax)`` marker, asserted here at
its exact line (EXPECTED_TODOS), so that a new refusal or a lost marker fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch import assert_compiles_once, compile_once_env
from unbound import undefined_names

CORPUS = Path(__file__).parent / "corpus" / "gpt"
FILES = ("model.py", "train.py", "sample.py")
ITER = re.compile(r"^iter (\d+): loss ([0-9.]+)", re.MULTILINE)
STEP = re.compile(r"^step (\d+): train loss ([0-9.]+), val loss ([0-9.]+)", re.MULTILINE)
SAMPLE = re.compile(r"^sample: ([0-9 ]+)$", re.MULTILINE)
PARAMS = re.compile(r"^number of parameters: ([0-9.]+K)$", re.MULTILINE)
RESUME = ("--init_from=resume", "--max_iters=40")
MARKER = re.compile(r"# TODO\(torch2jax\): .*\[([^\]]+)\]\s*$")

# the start tokens (3) and max_new_tokens (12) of sample.py, num_samples lines
SAMPLE_LEN, NUM_SAMPLES = 3 + 12, 2

# target -> file -> [(line of the marker, rule)] of the converted program
EXPECTED_TODOS: dict[str, dict[str, list[tuple[int, str]]]] = {
    # ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(...): ``with ctx:``
    # is an autocast region enabled when the device is not the CPU (passes/rewrite_loops.py)
    "nnx": {},
    "linen": {
        # (generate's draw is the module's "noise" stream, self.make_rng: translated)
        # (LayerNorm's optional bias, a parameter under a constructor argument's name, is
        # the attribute bias_param: translated)
        # (the init loop over named_parameters() is the c_proj layers' kernel_init, and the
        # constructor's print of the parameter count is removed, warned: translated)
        # (the while loop's micro-steps, its learning rate set by hand, the clip, the
        # checkpoint dict and estimate_loss between updates: translated)
        # the resume branch's torch.load is the orbax PyTree restored, and the optimizer's
        # load_state_dict its state put into the TrainState once it is made
        # (passes/rewrite_linen_resume.py); the model's, loaded from a name the branch binds
        # (state_dict = checkpoint['model'], then unwanted prefixes stripped from its keys),
        # is marked: it would raise unmarked
        "train.py": [(102, "torch-leftover"), (155, "load_state_dict")],
        # (the checkpoint dict is the orbax PyTree restored; model.load_state_dict(
        # state_dict) binds the variables, and model.generate(...) applies them:
        # model.apply(variables, ..., method="generate", rngs={"noise": ...}) for generate's
        # draw; unapplied, a linen module has no layers)
        "sample.py": [(37, "torch-leftover")],
    },
    "equinox": {
        # (the MLP's two linear layers on a value of unknown rank are no longer marked: they
        # map over its leading axes, over_leading, written at the top of the file; the
        # modules whose forward has no per-example form shown are kept batched, unmarked,
        # and train.py's eval_step calls a model of model.py by its `batched`)
        "model.py": [(213, "equinox"), (218, "equinox"), (259, "equinox"),
                     (274, "torch-leftover"), (278, "torch-leftover"), (281, "torch-leftover"),
                     (297, "equinox"),
                     (305, "torch-leftover"), (308, "torch-leftover"), (310, "torch-leftover"),
                     (312, "torch-leftover")],
        # (estimate_loss reads the model as a global: translated, GPT's flags read from
        # model.py's conversion, repo_classes.py; its eval_step at the top)
        # (the resume's checkpoint dict: the orbax PyTree restored, the model's arrays put
        # back, targets/equinox_checkpoints.py); the optimizer's load_state_dict, of an
        # optimizer configure_optimizers returns, is marked
        "train.py": [(99, "torch-leftover"), (164, "equinox"), (221, "training-loop"),
                     (222, "torch.nn.utils.clip_grad_norm_"), (256, "training-loop"),
                     (284, "equinox")],
        # (model.load_state_dict(state_dict): the checkpoint's arrays put back into the model)
        "sample.py": [(38, "torch-leftover")],
    },
}

# the targets whose converted program runs with zero edits (the markers above left in it
# are on lines that the CPU run does not need translated)
RUNS = {"nnx"}

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("RANK", None)
    return env


def _run(folder: Path, script: str, cwd: Path, *args: str, timeout: int = 600) -> str:
    done = subprocess.run([sys.executable, str(folder / script), *args], cwd=cwd,
                          env=compile_once_env(_env()), capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{script}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert_compiles_once(done, folder)  # (issue 20)
    return done.stdout


def _losses(out: str) -> tuple[list[tuple[int, float]], list[tuple[int, float, float]]]:
    iters = [(int(i), float(x)) for i, x in ITER.findall(out)]
    steps = [(int(i), float(a), float(b)) for i, a, b in STEP.findall(out)]
    return iters, steps


def _samples(out: str) -> list[list[int]]:
    return [[int(t) for t in line.split()] for line in SAMPLE.findall(out)]


# sample.py's default seed, and another: the samples of seed 1337 twice and of seed 2 from one
# checkpoint (the sample follows its seed: test_the_converted_sample_follows_its_seed)
SEED, OTHER_SEED = 1337, 2


def _program(folder: Path, cwd: Path) -> tuple[str, list[str], str]:
    """Train, sample (sample.py as written, then --seed=2 and --seed=1337 from the same
    checkpoint) and resume: the output of each."""
    out = _run(folder, "train.py", cwd)
    samples = [_run(folder, "sample.py", cwd, *args)
               for args in ((), (f"--seed={OTHER_SEED}",), (f"--seed={SEED}",))]
    resumed = _run(folder, "train.py", cwd, *RESUME)
    return out, samples, resumed


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory):
    pytest.importorskip("torch")
    out, samples, resumed = _program(CORPUS, tmp_path_factory.mktemp("torch_run"))
    print("torch:", out, *samples, resumed, sep="\n")
    return (_losses(out), _samples(samples[0]), PARAMS.findall(out), _losses(resumed),
            [_samples(s) for s in samples])


_CONVERTED: dict[str, Path] = {}


def _converted(target: str, tmp_path_factory) -> Path:
    if target not in _CONVERTED:
        out = tmp_path_factory.mktemp(f"gpt_{target}")
        done = subprocess.run(
            [sys.executable, "-c", "from torch2jax.cli import app; app()", "convert",
             str(CORPUS), "-o", str(out), "--target", target, "-j", "1"],
            capture_output=True, text=True, timeout=600, check=False)
        # exit 1: TODOs left; 0: all converted
        assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
        _CONVERTED[target] = out
    return _CONVERTED[target]


_RAN: dict[str, tuple[str, list[str], str]] = {}


def _ran(target: str, tmp_path_factory) -> tuple[str, list[str], str]:
    """The target's converted program run as torch_run runs the torch one, once per module
    (test_converted_program and the seed test read the same run)."""
    if target not in _RAN:
        folder = _converted(target, tmp_path_factory)
        _RAN[target] = _program(folder, tmp_path_factory.mktemp(f"run_{target}"))
        print(f"{target}:", _RAN[target][0], *_RAN[target][1], _RAN[target][2], sep="\n")
    return _RAN[target]


def _todos(folder: Path) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    for name in FILES:
        for n, line in enumerate((folder / name).read_text().splitlines(), 1):
            hit = MARKER.search(line)
            if hit:
                found.setdefault(name, []).append((n, hit.group(1)))
    return found


def _resumed_like(first, resumed) -> None:
    """A run resumed from the checkpoint of iteration 30 to 40: it starts at 30 with the
    trained weights (its step-30 evaluation, on other batches, near the first run's) and
    goes on training."""
    (_, steps), (r_iters, r_steps) = first, resumed
    assert [i for i, *_ in r_steps] == [30, 40] and [i for i, _ in r_iters] == [30, 35, 40]
    assert abs(r_steps[0][2] - steps[-1][2]) < 0.3, (steps, r_steps)
    assert r_steps[-1][2] < r_steps[0][2]


def test_torch_program_trains(torch_run):
    (iters, steps), samples, params, resumed, _ = torch_run
    assert params == ["27.52K"]
    _resumed_like((iters, steps), resumed)
    assert [i for i, _ in iters] == [0, 5, 10, 15, 20, 25, 30]
    assert [i for i, *_ in steps] == [0, 10, 20, 30]
    assert iters[-1][1] < iters[0][1] - 1.0  # the stream is learnable: ~4.2 -> ~2.0
    assert steps[-1][2] < steps[0][2] - 1.0
    assert len(samples) == NUM_SAMPLES and all(len(s) == SAMPLE_LEN for s in samples)
    assert all(0 <= t < 64 for s in samples for t in s)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
def test_converted_program(target, torch_run, tmp_path_factory):
    folder = _converted(target, tmp_path_factory)
    for name in FILES:
        code = (folder / name).read_text()
        compile(code, name, "exec")
        # every name read is bound on every target (ruff F821): what a target cannot
        # translate is kept bound and marked, never left to a NameError
        assert undefined_names(code, name) == [], name
        # the torch.amp.autocast(...) branch kept as torch is no call of equinox's autocast
        # helper: no helper that nothing calls is written
        assert "def autocast(" not in code, name
    todos = _todos(folder)
    assert todos == EXPECTED_TODOS.get(target, {}), todos
    if target == "linen":
        sample = (folder / "sample.py").read_text()
        assert "variables = state_dict" in sample and 'method="generate"' in sample
        assert 'rngs={"noise": subkey}' in sample
    if target not in RUNS:
        return  # the refusals are marked at their lines; the program is not run
    (t_iters, t_steps), _, t_params, _, _ = torch_run
    out, (sample, *_), resumed = _ran(target, tmp_path_factory)
    iters, steps = _losses(out)
    samples = _samples(sample)
    assert PARAMS.findall(out) == t_params[:1]  # the parameter count (tied weight once)
    _resumed_like((iters, steps), _losses(resumed))
    # the same schedule of logging; the loss falls like torch's (other initial weights and
    # batches: the curves agree in shape, not digit for digit)
    assert [i for i, _ in iters] == [i for i, _ in t_iters]
    assert [i for i, *_ in steps] == [i for i, *_ in t_steps]
    assert abs(iters[0][1] - t_iters[0][1]) < 0.1  # ln(64) = 4.16 at the start on both
    assert iters[-1][1] < iters[0][1] - 1.0
    assert steps[-1][2] < steps[0][2] - 1.0
    assert abs(steps[-1][2] - t_steps[-1][2]) < 0.5, (steps, t_steps)
    assert len(samples) == NUM_SAMPLES and all(len(s) == SAMPLE_LEN for s in samples)
    assert all(0 <= t < 64 for s in samples for t in s)


@pytest.mark.slow
def test_the_converted_sample_follows_its_seed(torch_run, tmp_path_factory):
    """``sample.py --seed=N`` after a checkpoint restore: the restore puts in what torch's
    ``load_state_dict`` does (parameters and buffers), not the training run's RNG state
    (``model.rngs``, each Dropout's key and count), so the sampled text follows the seed, as
    torch's does: other text for another seed, the same text for the same seed (sample.py
    with its default seed, 1337, then ``--seed=2`` and ``--seed=1337``, each a process that
    restores the checkpoint of the training run)."""
    runs = {"torch": torch_run[4],
            "nnx": [_samples(s) for s in _ran("nnx", tmp_path_factory)[1]]}
    print(runs)
    for name, (one, two, again) in runs.items():
        assert len(one) == NUM_SAMPLES and all(len(s) == SAMPLE_LEN for s in one), name
        assert one != two, name  # the seed drives the sampling
        assert one == again, name  # and only the seed


# -- the idioms of the program, in isolation (fast)

def _nnx(source: str):
    from torch2jax.convert import convert_source
    return convert_source(source, path="m.py")


def test_cross_entropy_target_expression_is_bound_once() -> None:
    source = ("import torch\nimport torch.nn.functional as F\n"
              "def loss_of(logits, targets):\n"
              "    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), "
              "ignore_index=-1)\n"
              "    return loss\n")
    result = _nnx(source)
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    # bound to a name once (a statement before, or a walrus where an earlier call of unknown
    # effect is evaluated first): the target is computed once and read twice
    assert result.code.count("targets.reshape(-1)") == 1
    assert ("    target = targets.reshape(-1)\n" in result.code
            or "(target := targets.reshape(-1))" in result.code)
    torch = pytest.importorskip("torch")
    import numpy as np
    ns: dict = {}
    exec(compile(result.code, "m.py", "exec"), ns)  # noqa: S102 - converted test code
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 5))
    targets[0, 1] = -1
    want = torch.nn.functional.cross_entropy(
        torch.from_numpy(logits).view(-1, 7), torch.from_numpy(targets).view(-1),
        ignore_index=-1).item()
    assert abs(float(ns["loss_of"](logits, targets)) - want) < 1e-5


def test_sdpa_dropout_at_run_time_is_checked_by_an_assert() -> None:
    call = ("    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, "
            "dropout_p={p}, is_causal=True)\n    return y\n")
    head = "import torch.nn.functional as F\ndef attend(q, k, v, rate, training):\n"
    result = _nnx(head + call.format(p="rate if training else 0"))
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "    assert not (rate if training else 0), " in result.code
    assert "jax.nn.dot_product_attention(" in result.code
    refused = _nnx(head + call.format(p="0.1"))
    assert [d.rule for d in refused.diagnostics if d.severity == "error"] == [
        "torch.nn.functional.scaled_dot_product_attention"]
