"""The pre-commit hooks of .pre-commit-hooks.yaml, run for real: ``pre-commit try-repo`` on
this repository against a temporary git repository holding a staged PyTorch file.

try-repo clones this repository at HEAD (plus its uncommitted tracked changes) and installs
it into a fresh virtualenv with pip, so this needs git, pre-commit and the package index:
slow, and skipped when git or pre-commit is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCH = "import torch\n\n\ndef total(x):\n    return torch.sum(x, dim=1)\n"
UNTRANSLATABLE = TORCH + "\n\ndef odd(x):\n    return torch.frobnicate(x)\n"
CONVERTED = "import jax.numpy as jnp\n\n\ndef total(x):\n    return jnp.sum(x, axis=1)\n"
# notebooks: the same code over two cells, with a markdown cell and a magic between them
TORCH_CELLS = ["import torch", "def total(x):\n    return torch.sum(x, dim=1)"]
CONVERTED_CELLS = ["import jax.numpy as jnp", "def total(x):\n    return jnp.sum(x, axis=1)"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"), GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", PRE_COMMIT_COLOR="never")
    env.pop("GIT_DIR", None)
    env.pop("GIT_INDEX_FILE", None)
    return env


def _git(work: Path, *args: str, env: dict[str, str]) -> None:
    subprocess.run(["git", *args], cwd=work, env=env, check=True, capture_output=True)


def _notebook(path: Path, cells: list[str]) -> None:
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(cells[0]), new_markdown_cell("The sum"),
                             new_code_cell("%matplotlib inline\n" + cells[1])])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, str(path))


def _cells(path: Path) -> list[str]:
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _try_repo(work: Path, hook: str, files: list[str], env: dict[str, str]):
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", str(ROOT), hook,
                           "--files", *files], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


def test_pre_commit_hooks_flag_torch_and_pass_converted(tmp_path: Path) -> None:
    pytest.importorskip("pre_commit")
    env = _env(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    _git(work, "init", "-q", env=env)
    (work / "model.py").write_text(UNTRANSLATABLE)
    (work / "done.py").write_text(CONVERTED)
    (work / "inplace.py").write_text(TORCH)
    _notebook(work / "model.ipynb", TORCH_CELLS)
    _notebook(work / "done.ipynb", CONVERTED_CELLS)
    _notebook(work / "inplace.ipynb", TORCH_CELLS)
    torch_notebook = (work / "model.ipynb").read_bytes()
    _git(work, "add", "model.py", "done.py", "inplace.py", "model.ipynb", "done.ipynb",
         "inplace.ipynb", env=env)

    # the check hook: a staged PyTorch file or notebook fails with its diagnostics ...
    res = _try_repo(work, "torch2jax", ["model.py", "done.py", "model.ipynb", "done.ipynb"],
                    env)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "torch2jax check" in out and "Failed" in out
    assert "model.py: holds PyTorch code that torch2jax would convert" in out
    # (the file is not converted to answer: --explain prints what the conversion leaves)
    assert "`torch2jax check --explain` lists what it would leave for review" in out
    assert "torch.frobnicate" not in out
    assert "model.ipynb: holds PyTorch code that torch2jax would convert" in out
    assert "done.py:" not in out and "done.ipynb:" not in out
    assert (work / "model.py").read_text() == UNTRANSLATABLE  # check writes nothing
    assert (work / "model.ipynb").read_bytes() == torch_notebook

    # ... a converted file and a converted notebook pass ...
    res = _try_repo(work, "torch2jax", ["done.py", "done.ipynb"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Passed" in res.stdout

    # ... and the in-place hook converts them (pre-commit fails: files were modified)
    res = _try_repo(work, "torch2jax-convert-in-place", ["inplace.py", "inplace.ipynb"], env)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (work / "inplace.py").read_text() == CONVERTED
    assert _cells(work / "inplace.ipynb") == [
        CONVERTED_CELLS[0], "%matplotlib inline\n" + CONVERTED_CELLS[1]]
