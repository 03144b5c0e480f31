"""The training-script fixtures (fixtures/training/) are real PyTorch programs that learn.

Each script is run as a user would run it (``python script.py``, no arguments) from an empty
working directory. It must exit 0, write no files, and end with exactly one
``final_accuracy=<float>`` line reaching the threshold below.

Thresholds: the accuracy each script reached with its seed replaced by 0..4 (torch 2.13, CPU),
minus a margin that leaves room for the converted JAX scripts, which draw different random data
and initial weights from their own PRNG. Chance level is far below every threshold (1/4 for the
two 4-class tasks, 1/16 for the next-token task, 1/2 for the binary one), so a script that stops
learning fails.

    script                 seeds 0..4                     threshold
    mlp_adamw_cosine       0.9595 .. 0.9644               0.93
    cnn_sgd_steplr         0.9941 .. 0.9980               0.97
    gpt_param_groups       1.0000 (all five)              0.97
    seeds_in_helper        0.9590 .. 0.9620               0.93
    ddp_amp_dataloader     0.9380 (seed 0, one process)   0.91
                           0.9424 (torchrun, 2 processes)

ddp_amp_dataloader is a torch.distributed script: it runs as a world of one process
(tests/launch.py sets what torchrun would).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch import torchrun_env

pytest.importorskip("torch")

TRAINING = Path(__file__).resolve().parent.parent / "fixtures" / "training"
THRESHOLDS = {
    "mlp_adamw_cosine": 0.93,
    "cnn_sgd_steplr": 0.97,
    "gpt_param_groups": 0.97,
    "seeds_in_helper": 0.93,
    "ddp_amp_dataloader": 0.91,
}
FINAL = re.compile(r"^final_accuracy=(?P<value>[0-9]*\.?[0-9]+)$")
TIMEOUT_S = 180


def test_every_training_fixture_has_a_threshold() -> None:
    assert sorted(p.stem for p in TRAINING.glob("*.py")) == sorted(THRESHOLDS)


@pytest.fixture(scope="module")
def run_script(tmp_path_factory: pytest.TempPathFactory):
    """Run a script once per module (later calls reuse the result), from an empty directory.

    The scripts run one after another: torch uses every core, and running them side by side
    made each one several times slower.
    """
    cache: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def run(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        if name not in cache:
            cwd = tmp_path_factory.mktemp(name)
            done = subprocess.run(
                [sys.executable, str(TRAINING / f"{name}.py")],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
                env=torchrun_env(),
            )
            cache[name] = (done, cwd)
        return cache[name]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(THRESHOLDS))
def test_training_script_learns(name: str, run_script) -> None:
    done, cwd = run_script(name)
    assert done.returncode == 0, f"{name}.py failed:\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    finals = [line for line in lines if line.startswith("final_accuracy")]
    assert len(finals) == 1 and lines[-1] == finals[0], done.stdout[-2000:]
    match = FINAL.match(finals[0])
    assert match is not None, finals[0]
    accuracy = float(match["value"])
    assert 0.0 <= accuracy <= 1.0
    assert accuracy >= THRESHOLDS[name], f"{name}: final_accuracy={accuracy}"
    assert list(cwd.iterdir()) == [], "a training script wrote files"
