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
from pathlib import Path

import pytest
from launch import session_run

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


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(THRESHOLDS))
def test_training_script_learns(name: str, tmp_path_factory) -> None:
    # run from an empty folder once per session (tests/launch.py's session_run): the three
    # targets' accuracy tests compare with the same run
    done = session_run(TRAINING / f"{name}.py", tmp_path_factory, TIMEOUT_S)
    assert done["returncode"] == 0, f"{name}.py failed:\n{done['stderr'][-3000:]}"
    lines = done["stdout"].strip().splitlines()
    finals = [line for line in lines if line.startswith("final_accuracy")]
    assert len(finals) == 1 and lines[-1] == finals[0], done["stdout"][-2000:]
    match = FINAL.match(finals[0])
    assert match is not None, finals[0]
    accuracy = float(match["value"])
    assert 0.0 <= accuracy <= 1.0
    assert accuracy >= THRESHOLDS[name], f"{name}: final_accuracy={accuracy}"
    assert done["wrote"] == [], "a training script wrote files"
