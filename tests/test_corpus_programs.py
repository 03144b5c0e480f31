"""Programs of our own in the shapes public code uses (issue 28), converted by the CLI with no
hand edits and run: each must print metrics near torch's.

tests/corpus/<name>/main.py, all on synthetic data made in the program:
  * makemore: a model picked by --type (bigram | mlp | rnn), an infinite loader class, an
    optional tensorboard SummaryWriter, evaluation, a checkpoint of the best model, sampling;
  * word_lm: a word-level LSTM language model (truncated BPTT, detached hidden state,
    clip_grad_norm_, a hand-written SGD update, lr divided by 4 on a plateau, perplexity),
    also with --tied (the decoder tied to the encoder's table);
  * vae: a VAE (reparameterisation with randn_like, BCE + KL);
  * dcgan: a DCGAN (two optimizers, detach, BCELoss);
  * superres: sub-pixel super-resolution (PixelShuffle, MSE, PSNR).

Tolerance: the two sides draw different data, weights and noise (torch's and JAX's random
streams and default initialisers differ), so the numbers are not compared one by one; each
program's check compares the converted program's final metric with torch's within a band
stated per check. The bands were set from one torch run per program (and, for the VAE, one
converted run: test loss torch 77.84, NNX 77.79); the spread between torch runs of different
seeds has not been measured yet, so a band may need widening once it is. A combination that does not run converted yet is an xfail (strict) naming the
converter gap.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).parent / "corpus"
pytestmark = pytest.mark.slow


def _floats(pattern: str, out: str) -> list[float]:
    return [float(v) for v in re.findall(pattern, out)]


def _vae(torch_out: str, jax_out: str) -> None:
    # the test loss per example (BCE summed over 144 pixels + KL): torch 77.8; the blobs'
    # noise floor keeps it above ~70, a model that does not learn stays above ~95
    want = _floats(r"Test set loss: ([0-9.]+)", torch_out)
    got = _floats(r"Test set loss: ([0-9.]+)", jax_out)
    epochs = _floats(r"Average loss: ([0-9.]+)", jax_out)
    assert len(got) == 1 and len(epochs) == 5, jax_out
    assert epochs[-1] < epochs[0], jax_out
    assert abs(got[0] - want[0]) < 0.1 * want[0], (torch_out, jax_out)


def _superres(torch_out: str, jax_out: str) -> None:
    # PSNR of the upscaled test patterns: torch 26.4 dB; bicubic-free nets that do not learn
    # stay near 10 dB
    want = _floats(r"Avg. PSNR: ([0-9.]+)", torch_out)[0]
    got = _floats(r"Avg. PSNR: ([0-9.]+)", jax_out)
    losses = _floats(r"Avg. Loss: ([0-9.]+)", jax_out)
    assert len(got) == 1 and len(losses) == 6, jax_out
    assert losses[-1] < 0.25 * losses[0], jax_out
    assert abs(got[0] - want) < 4.0, (torch_out, jax_out)


def _dcgan(torch_out: str, jax_out: str) -> None:
    # a GAN has no loss that falls; both sides must stay in the adversarial regime: the mean
    # Loss_D within 0.4 of torch's, every D(x) and D(G(z)) a probability
    line = r"Loss_D: ([0-9.]+) Loss_G: ([0-9.]+) D\(x\): ([0-9.]+)"
    want = re.findall(line, torch_out)
    got = re.findall(line, jax_out)
    assert len(got) == len(want) == 6, jax_out
    mean = lambda rows: sum(float(r[0]) for r in rows) / len(rows)
    assert abs(mean(got) - mean(want)) < 0.4, (torch_out, jax_out)
    assert all(0.0 < float(r[2]) < 1.0 for r in got), jax_out


def _word_lm(torch_out: str, jax_out: str) -> None:
    # the Markov chain's entropy bounds the perplexity below by ~2.45: torch reaches ~3.7
    # (NNX 4.06), 3.2 tied (NNX 3.46); a model that does not learn stays near the vocabulary's 40
    want = _floats(r"test ppl\s+([0-9.]+)", torch_out)[0]
    got = _floats(r"test ppl\s+([0-9.]+)", jax_out)
    valid = _floats(r"valid ppl\s+([0-9.]+)", jax_out)
    assert len(got) == 1 and len(valid) == 4, jax_out
    assert abs(got[0] - want) < 0.25 * want, (torch_out, jax_out)


def _makemore(torch_out: str, jax_out: str) -> None:
    line = r"step (\d+) train loss: ([0-9.]+) test loss: ([0-9.]+)"
    want = re.findall(line, torch_out)
    got = re.findall(line, jax_out)
    assert [r[0] for r in got] == [r[0] for r in want] == ["100", "200"], jax_out
    assert abs(float(got[-1][2]) - float(want[-1][2])) < 0.3, (torch_out, jax_out)
    assert len(re.findall(r"^sample: [a-z]*$", jax_out, re.MULTILINE)) == 5, jax_out


PROGRAMS = {
    "vae": ([], _vae),
    "superres": ([], _superres),
    "dcgan": ([], _dcgan),
    "word_lm": ([], _word_lm),
    "word_lm-tied": (["--tied"], _word_lm),  # the decoder tied to the encoder's table
    "makemore-bigram": (["--type", "bigram"], _makemore),
    "makemore-mlp": (["--type", "mlp"], _makemore),
    "makemore-rnn": (["--type", "rnn"], _makemore),
}

# the combinations that do not run converted yet, each with the converter gap it meets (every
# program runs on NNX)
GAPS: dict[tuple[str, str], str] = {
}


def _folder(program: str) -> str:
    return program.split("-")[0]


def _run(script: Path, cwd: Path, args: list[str]) -> str:
    done = subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def torch_out(tmp_path_factory):
    pytest.importorskip("torch")
    cache: dict[str, str] = {}

    def get(program: str) -> str:
        if program not in cache:
            args, _ = PROGRAMS[program]
            cache[program] = _run(CORPUS / _folder(program) / "main.py",
                                  tmp_path_factory.mktemp("torch"), args)
        return cache[program]
    return get


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(folder, target) -> (the CLI's result, the converted main.py)."""
    cache: dict[tuple[str, str], tuple[subprocess.CompletedProcess, Path]] = {}

    def get(folder: str, target: str):
        if (folder, target) not in cache:
            out = tmp_path_factory.mktemp(f"{folder}-{target}")
            cli = [sys.executable, "-c", "from torch2jax.cli import app; app()"]
            done = subprocess.run([*cli, "convert", str(CORPUS / folder), "-o", str(out),
                                   "--target", target], capture_output=True, text=True,
                                  timeout=300, check=False)
            cache[folder, target] = (done, out / "main.py")
        return cache[folder, target]
    return get


def _cases():
    for target in ("nnx", "linen", "equinox"):
        for program in PROGRAMS:
            gap = GAPS.get((program, target))
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
            yield pytest.param(program, target, marks=marks, id=f"{program}-{target}")


@pytest.mark.parametrize(("program", "target"), list(_cases()))
def test_program_runs_unedited(torch_out, converted, tmp_path, program, target):
    done, path = converted(_folder(program), target)
    assert done.returncode == 0, done.stdout + done.stderr  # no TODOs left
    code = path.read_text()
    assert "TODO(torch2jax)" not in code
    args, check = PROGRAMS[program]
    check(torch_out(program), _run(path, tmp_path, args))
