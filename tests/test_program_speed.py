"""Converted programs run like hand-written JAX (issue 20): one compiled step per iteration.

Every training fixture's loop calls one ``jax.jit`` step of the split/merge form (the model
and optimizer state split once before the loop, donated to each step, written back after
it), not ``nnx.jit``, which walks the module graph in Python on every call. Run as a user
would, the converted GPT fixture compiles its step exactly once (one input shape) and prints
losses that fall like torch's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch import assert_compiles_once, compile_once_env, session_run

from torch2jax.convert import convert_source

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "fixtures" / "training"
SCRIPTS = sorted(TRAINING.glob("*.py"))
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def converted() -> dict[str, str]:
    return {p.stem: convert_source(p.read_text(), path=str(p)).code for p in SCRIPTS}


# the training loop of each fixture: one loop (the split once, the step closing over its
# graphdef) or an epoch loop around the step loop (the split once per epoch: the graphdef, a
# static argument, follows model.train() / model.eval() between epochs)
SINGLE_LOOP = {"gpt_param_groups", "seeds_in_helper"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_training_step_is_one_jax_jit_of_the_split_state(path: Path, converted) -> None:
    code = converted[path.stem]
    split = re.search(r"graphdef, train_state = nnx\.split\(\(\w+, \w+\)\)", code)
    assert split
    assert not re.search(r"@nnx\.jit.*\n\s*def train_step", code)
    step = code[code.index("def train_step("):]
    assert "nnx.merge(graphdef, train_state)" in step
    assert re.search(r"nnx\.update\(\(\w+, \w+\), train_state\)", code)
    if path.stem in SINGLE_LOOP:
        # defined after the split, closing over graphdef: nothing for jax.jit to hash per call
        assert re.search(r"@partial\(jax\.jit, donate_argnums=0\)\n\s*"
                         r"def train_step\(train_state, ", code)
        assert split.start() < code.index("def train_step(")
        call = r"train_state, [\w, ]+ = train_step\(train_state, "
    else:
        assert re.search(r"@partial\(jax\.jit, static_argnums=0, donate_argnums=1\)\n\s*"
                         r"def train_step\(graphdef, train_state, ", code)
        call = r"train_state, [\w, ]+ = train_step\(graphdef, train_state, "
    # between steps the loop reads only the step's results and the split state
    assert len(re.findall(call, code)) == 1


def _run(script: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False,
                          env=compile_once_env({**os.environ, "OMP_NUM_THREADS": "1", **env}))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_compiles_once(done, script)
    return done


def _session_run(script: Path, tmp_path_factory) -> subprocess.CompletedProcess:
    run = session_run(script, tmp_path_factory)
    assert run["returncode"] == 0, run["stderr"][-3000:]
    done = subprocess.CompletedProcess([], 0, run["stdout"], run["stderr"])
    assert_compiles_once(done, script)
    return done


@pytest.mark.slow
def test_converted_gpt_compiles_its_step_once_and_its_loss_falls_like_torch(
        converted, tmp_path: Path, tmp_path_factory) -> None:
    script = tmp_path / "gpt_param_groups.py"
    script.write_text(converted["gpt_param_groups"])
    # the runs of tests/test_training_converted.py, once per session (JAX_LOG_COMPILES=1)
    jax_run = _session_run(script, tmp_path_factory)
    compiles = re.findall(r"Compiling jit\(train_step\)", jax_run.stdout + jax_run.stderr)
    assert len(compiles) == 1, compiles  # 300 steps, one batch shape
    torch_run = _session_run(TRAINING / "gpt_param_groups.py", tmp_path_factory)
    jax_losses = [(int(s), float(v)) for s, v in LOSS.findall(jax_run.stdout)]
    torch_losses = [(int(s), float(v)) for s, v in LOSS.findall(torch_run.stdout)]
    # logged at torch's interval, no more often
    assert [s for s, _ in jax_losses] == [s for s, _ in torch_losses] == list(range(0, 300, 50))
    # different random streams (data and initial weights): the same curve within noise
    for (step, j), (_, t) in zip(jax_losses, torch_losses):
        assert abs(j - t) <= 0.15 + 0.1 * t, (step, j, t)
    assert jax_losses[-1][1] < 0.2 * jax_losses[0][1]


# ------------------------------------------------------------------ host-side batch indices
PROGRAM = ROOT / "benchmarks" / "programs" / "gpt_train.py"


def test_batch_indices_are_drawn_on_the_host() -> None:
    code = convert_source(PROGRAM.read_text(), path=str(PROGRAM)).code
    assert "host_rng = np.random.default_rng(seed)\n" in code
    assert "    ix = host_rng.integers(0, len(data) - block_size, size=(batch_size,))\n" in code
    # the data only feeds the batches: a numpy array, gathered by a numpy index
    assert ("data = np.asarray([(i * 7 + i // 11) % vocab_size for i in range(20000)], "
            "dtype=np.int32)\n") in code
    assert "    x = data[ix[:, None] + np.arange(block_size)]\n" in code
    assert "    y = data[(ix + 1)[:, None] + np.arange(block_size)]\n" in code
    assert "jax.random.randint" not in code and "jnp.take" not in code
    # the model's initialisation keeps its JAX key
    assert "rngs=nnx.Rngs(subkey)" in code
    # one loop: the step is defined after the split and closes over its graphdef
    assert ("graphdef, train_state = nnx.split((model, optimizer))\n\n\n"
            "@partial(jax.jit, donate_argnums=0)\ndef train_step(train_state, xb, yb):\n"
            "    model, optimizer = nnx.merge(graphdef, train_state)\n") in code
    assert "    train_state, loss = train_step(train_state, xb, yb)\n" in code


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_no_fixture_draws_batch_indices_with_jax_random(path: Path, converted) -> None:
    code = converted[path.stem]
    assert "jax.random.permutation" not in code
    if "torch.randperm" in path.read_text():
        assert "host_rng.permutation(" in code


SNIPPET = '''import torch
import torch.nn as nn

SEED = 3
torch.manual_seed(SEED)
data = torch.arange(100)


def batch():
    ix = torch.randint(0, 90, (4,))
    start = torch.randint(0, 10, (4, 1))
    noise = torch.randn(4, 8)
    kept = torch.randint(0, 90, (4,))
    return torch.stack([data[i:i + 8] for i in ix]) + start, noise, kept * 2
'''


def test_draws_that_reach_values_keep_jax_keys() -> None:
    code = convert_source(SNIPPET).code
    assert "ix = host_rng.integers(0, 90, size=(4,))" in code
    # the rows of a stack of equal slices are one gather with a host-side index
    assert ("return jnp.take(data, ix[:, None] + np.arange(8), axis=0) + start, noise, "
            "kept * 2") in code
    # start and kept are data (arithmetic kept in the result), noise is noise
    assert "start = jax.random.randint(" in code
    assert "kept = jax.random.randint(" in code
    assert "noise = jax.random.normal(" in code
    assert "host_rng = np.random.default_rng(SEED)" in code


SPLITS = '''import torch

torch.manual_seed(7)
block_size = 8
data = torch.tensor([(i * 5) % 23 for i in range(200)], dtype=torch.long)
n = int(0.9 * len(data))
train_data = data[:n]
val_data = data[n:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (4,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + block_size + 1] for i in ix])
    return x, y
'''


def test_data_that_only_feeds_batches_stays_on_the_host(tmp_path: Path) -> None:
    """The character-level shape (a train/val split, the split chosen per call): the token
    tensor and its slices are numpy, every batch one numpy gather of the drawn rows."""
    code = convert_source(SPLITS).code
    assert ("data = np.asarray([(i * 5) % 23 for i in range(200)], dtype=np.int32)\n"
            in code)
    assert "    x = data[ix[:, None] + np.arange(block_size)]\n" in code
    assert "    y = data[(ix + 1)[:, None] + np.arange(block_size)]\n" in code
    assert "jnp.take" not in code and "jnp.stack" not in code
    import runpy

    import numpy as np

    (tmp_path / "converted.py").write_text(code)
    ns = runpy.run_path(str(tmp_path / "converted.py"))

    x, y = ns["get_batch"]("train")
    assert isinstance(x, np.ndarray) and x.dtype == np.int32 and x.shape == (4, 8)
    # the rows the script's generator drew, read back from the same stream
    rows = np.random.default_rng(7).integers(0, 180 - 8, (4,))
    tokens = np.array([(i * 5) % 23 for i in range(180)])
    np.testing.assert_array_equal(x, np.stack([tokens[r:r + 8] for r in rows]))
    np.testing.assert_array_equal(y, np.stack([tokens[r + 1:r + 9] for r in rows]))
    xv, _ = ns["get_batch"]("val")
    assert xv.shape == (4, 8) and set(xv.ravel()) <= {(i * 5) % 23 for i in range(180, 200)}


def test_data_read_by_anything_else_stays_a_jax_array() -> None:
    for extra in ("print(data.sum())\n", "data = data * 2\n", "scale = data.float().mean()\n"):
        code = convert_source(SPLITS + extra).code
        assert "data = jnp.asarray([(i * 5) % 23 for i in range(200)], dtype=jnp.int32)" in code
        assert not re.search(r"\bnp\.asarray\(", code)
        # the rows are still one gather with a host-side index
        assert "x = jnp.take(data, ix[:, None] + np.arange(block_size), axis=0)" in code


def test_a_seed_the_converter_cannot_place_keeps_jax_random() -> None:
    source = SNIPPET.replace("torch.manual_seed(SEED)", "torch.manual_seed(int(input()))")
    code = convert_source(source).code
    assert "host_rng" not in code
    assert "ix = jax.random.randint(" in code


@pytest.mark.slow
def test_converted_gpt_program_runs_with_host_batches_and_one_compile(tmp_path: Path) -> None:
    script = tmp_path / "gpt_train.py"
    script.write_text(convert_source(PROGRAM.read_text(), path=str(PROGRAM)).code)
    env = {"GPT_MAX_ITERS": "41", "JAX_LOG_COMPILES": "1"}
    jax_run = _run(script, tmp_path, **env)
    torch_run = _run(PROGRAM, tmp_path, GPT_MAX_ITERS="41")
    compiles = re.findall(r"Compiling jit\(train_step\)", jax_run.stdout + jax_run.stderr)
    assert len(compiles) == 1, compiles
    iters = re.compile(r"^iter (\d+) loss ([0-9.]+)$", re.MULTILINE)
    jax_losses = [float(v) for _, v in iters.findall(jax_run.stdout)]
    torch_losses = [float(v) for _, v in iters.findall(torch_run.stdout)]
    assert [s for s, _ in iters.findall(jax_run.stdout)] == ["0", "20", "40"]
    assert len(torch_losses) == 3
    # both start near log(vocab_size) = 3.87 and fall well below it by iteration 40
    for losses in (jax_losses, torch_losses):
        assert abs(losses[0] - 3.87) < 0.6 and losses[-1] < 0.5 * losses[0], losses


SAMPLE = ROOT / "benchmarks" / "programs" / "gpt_sample.py"


@pytest.mark.slow
def test_converted_sampling_program_compiles_generate_once(tmp_path: Path) -> None:
    """The sampling benchmark, converted: its warm-up and timed generate() calls share one
    compile (the same prompt and length), and it prints the tokens it drew."""
    script = tmp_path / "gpt_sample.py"
    code = convert_source(SAMPLE.read_text(), path=str(SAMPLE)).code
    assert "jax.block_until_ready(generate(model, start, max_new_tokens" in code
    script.write_text(code)
    done = _run(script, tmp_path, GPT_NEW_TOKENS="12", GPT_TOP_K="5")
    log = done.stdout + done.stderr
    assert len(re.findall(r"Compiling jit\(generate\)", log)) == 1
    tokens = re.search(r"^sample ((?:\d+ ?)+)$", done.stdout, re.MULTILINE)
    assert tokens and len(tokens[1].split()) == 13  # the start token and 12 drawn
    assert all(0 <= int(t) < 48 for t in tokens[1].split())
    assert re.search(r"^tokens_per_s=[0-9.]+$", done.stdout, re.MULTILINE)


CHAR_RNN = ROOT / "benchmarks" / "programs" / "char_rnn_sample.py"


@pytest.mark.slow
def test_converted_char_rnn_program_compiles_sample_once(tmp_path: Path) -> None:
    """The char-level GRU benchmark (issue 30), converted: sample() is one nnx.jit whose token
    loop is a jax.lax.scan, so its warm-up and timed calls share one compile and no step is
    called per token; it prints the characters it drew."""
    script = tmp_path / "char_rnn_sample.py"
    code = convert_source(CHAR_RNN.read_text(), path=str(CHAR_RNN)).code
    assert "jax.lax.scan(" in code and "jax.block_until_ready(sample(model, " in code
    # the characters joined from the scan's stacked output in one reshape, not n slices
    assert "    chars = chars_scanned\n    return jnp.concatenate(chars, axis=1)" in code
    assert "chars.extend(" not in code
    script.write_text(code)
    done = _run(script, tmp_path, GPT_NEW_TOKENS="6")
    log = done.stdout + done.stderr
    assert len(re.findall(r"Compiling jit\(sample\)", log)) == 1, log[-3000:]
    assert not re.findall(r"Compiling jit\((sample_step|eval_step)\)", log)
    tokens = re.search(r"^sample ((?:\d+ ?)+)$", done.stdout, re.MULTILINE)
    assert tokens and len(tokens[1].split()) == 12  # GPT_NEW_TOKENS * 2 drawn
    assert all(0 <= int(t) < 65 for t in tokens[1].split())
    assert re.search(r"^tokens_per_s=[0-9.]+$", done.stdout, re.MULTILINE)


NANOGPT = ROOT / "benchmarks" / "programs" / "nanogpt.py"


@pytest.mark.slow
def test_converted_nanogpt_sampling_compiles_generate_once(tmp_path: Path) -> None:
    """nanoGPT's sample.py shape (issue 30), converted: the forward computes the last position
    only at inference, and generate() is still one nnx.jit over a fixed buffer (the forward
    told which position to compute), so the warm-up and the timed calls share one compile:
    no per-length compile, no step called per token."""
    script = tmp_path / "nanogpt.py"
    code = convert_source(NANOGPT.read_text(), path=str(NANOGPT)).code
    assert "jax.lax.fori_loop(" in code and "generate_step" not in code
    # the warm-up method call, its result dropped, is waited for: its work would otherwise
    # run inside the timed calls (torch's loop has finished when the call returns)
    assert "    jax.block_until_ready(model.generate(x, max_new_tokens, " in code
    assert code.count("block_until_ready") == 1
    script.write_text(code)
    done = _run(script, tmp_path, GPT_MODE="sample", GPT_NEW_TOKENS="40")
    log = done.stdout + done.stderr
    assert len(re.findall(r"Compiling jit\(generate\)", log)) == 1, log[-3000:]
    assert not re.findall(r"Compiling jit\((generate_step|eval_step)\)", log)
    samples = re.findall(r"^sample ((?:\d+ ?)+)$", done.stdout, re.MULTILINE)
    assert len(samples) == 2 and all(len(t.split()) == 20 for t in samples)
    assert all(0 <= int(t) < 48 for s in samples for t in s.split())
    assert re.search(r"^tokens_per_s=[0-9.]+$", done.stdout, re.MULTILINE)


@pytest.mark.slow
def test_converted_nanogpt_training_is_one_compiled_step_per_iteration(tmp_path: Path) -> None:
    """nanoGPT's train.py shape (issue 30), converted: the micro-batches (drawn by get_batch on
    the host, the next one fetched between forward and backward) are collected by the loop,
    and one step scans their gradients, clips and updates, compiled once: no gradient step
    per micro-step, no separate update. The step is the twin's form: a jax.jit of the state
    split once before the loop, donated, the learning rate get_lr() gives an argument (no
    nnx.jit, no eager write into the optimizer state per iteration). The loss it logs is the
    last micro-step's times k, as torch's, from the same starting point (log(vocab_size))."""
    script = tmp_path / "nanogpt.py"
    code = convert_source(NANOGPT.read_text(), path=str(NANOGPT)).code
    assert "jax.lax.scan(" in code and "def apply_grads(" not in code
    assert "    graphdef, train_state = nnx.split((model, optimizer))\n\n" \
           "    @partial(jax.jit, donate_argnums=0)\n" \
           "    def accum_step(train_state, batches, lr):\n" in code
    assert "        train_state, loss = accum_step(train_state, jax.tree.map(" in code
    assert code.count("opt_state.hyperparams") == 1 and "@nnx.jit\ndef accum" not in code
    script.write_text(code)
    done = _run(script, tmp_path, GPT_MODE="train", GPT_MAX_ITERS="14")
    log = done.stdout + done.stderr
    assert len(re.findall(r"Compiling jit\(accum_step\)", log)) == 1, log[-3000:]
    assert not re.findall(r"Compiling jit\((grad_step|apply_grads)\)", log)
    iters = re.compile(r"^iter (\d+) loss ([0-9.]+) lr", re.MULTILINE)
    losses = iters.findall(done.stdout)
    assert [i for i, _ in losses] == ["0", "6"], done.stdout
    assert all(abs(float(loss) - 3.87) < 0.6 for _, loss in losses), losses


def test_the_compile_count_sees_a_step_compiled_again(tmp_path: Path) -> None:
    """The check the program runs above go through: a step defined anew in every epoch
    compiles again for the same shapes, and the log shows it."""
    script = tmp_path / "again.py"
    script.write_text("import jax\nimport jax.numpy as jnp\n\nfor epoch in range(3):\n"
                      "    @jax.jit\n    def step(x):\n        return x * 2\n\n"
                      "    step(jnp.ones(4))\n    step(jnp.ones(5))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=True, env=compile_once_env())
    with pytest.raises(AssertionError, match=r"step.*: 3"):
        assert_compiles_once(done, script)
    script.write_text(script.read_text().replace("for epoch in range(3):\n", "if True:\n"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=True, env=compile_once_env())
    assert_compiles_once(done, script)  # two shapes, one compile each


@pytest.mark.slow
def test_converted_mingpt_trainer_is_one_compiled_step_on_the_split_state(tmp_path: Path) -> None:
    """minGPT's Trainer shape (issue 30), converted: the run loop (a while loop with next() /
    StopIteration, callbacks given the trainer) reads the model and the optimizer only through
    the step, so the step is the twin's form, a jax.jit of their state split once before the
    loop and donated, written back after it; the callback's trainer.loss.item() is the step's
    loss (nothing marked). One compile; the loss falls from about log(3)."""
    program = NANOGPT.parent / "mingpt_trainer.py"
    result = convert_source(program.read_text(), path=str(program))
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    code = result.code
    assert "        graphdef, train_state = nnx.split((model, optimizer))\n\n" \
           "        @partial(jax.jit, donate_argnums=0)\n" \
           "        def train_step(train_state, x, y):\n" in code
    assert "            train_state, loss = train_step(train_state, x, y)\n" in code
    assert "        nnx.update((model, optimizer), train_state)\n" in code
    script = tmp_path / "mingpt_trainer.py"
    script.write_text(code)
    done = _run(script, tmp_path, GPT_MAX_ITERS="21")
    log = done.stdout + done.stderr
    assert len(re.findall(r"Compiling jit\(train_step\)", log)) == 1, log[-3000:]
    losses = re.findall(r"^iter (\d+) loss ([0-9.]+)$", done.stdout, re.MULTILINE)
    assert [i for i, _ in losses] == ["0", "20"], done.stdout
    assert abs(float(losses[0][1]) - 1.0986) < 0.5 and float(losses[1][1]) < float(
        losses[0][1]), losses
