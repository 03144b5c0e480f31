"""pytorch/examples' ImageNet checkpointing (tests/data/programs/save_checkpoint_helper.py):
``save_checkpoint({...state_dict()...}, is_best)`` whose body is ``torch.save(state,
filename)`` and ``shutil.copyfile(filename, 'model_best.pth.tar')``. Before, the save was
marked ("no rule for torch.save") and the copy would have failed on orbax's directory; now the
dict every call gives is saved as an orbax PyTree, the copy is a copytree, and the converted
program resumes from the best checkpoint as torch's does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("orbax.checkpoint")

from torch2jax.convert import convert_source

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "save_checkpoint_helper.py"


def _run(folder: Path, source: str) -> list[str]:
    (folder / PROGRAM.name).write_text(source)
    run = subprocess.run([sys.executable, PROGRAM.name], cwd=folder, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.splitlines()


def test_a_helper_saves_the_checkpoint_dict_and_the_best_is_copied(tmp_path: Path):
    result = convert_source(PROGRAM.read_text(), path=PROGRAM.name)
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    assert "shutil.copytree(filename" in result.code
    (tmp_path / "torch").mkdir()
    (tmp_path / "jax").mkdir()
    want = _run(tmp_path / "torch", PROGRAM.read_text())
    got = _run(tmp_path / "jax", result.code)
    assert want == got == ["resumed at epoch 2 linear", "the best model restored: True"]
    assert (tmp_path / "jax" / "model_best.pth.tar").is_dir()
