"""Jupyter notebooks: converted as one module in cell order, split back into their cells, run.

The notebooks are written here with nbformat, in the shapes of public PyTorch tutorials: an
install line and ``%matplotlib inline`` first, an imports cell, a model cell, a data cell, an
optimizer cell, a training loop (under ``%%time``), an evaluation cell and a plot cell, with
markdown between them. The converted notebook is executed top to bottom with nbclient on the
test environment's own kernel, and the test reads what its cells print.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from textwrap import dedent

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.notebook import NotebookError, join, split

runner = CliRunner()
CLI = [sys.executable, "-c",
       "import sys; from torch2jax.cli import app; sys.argv[0] = 'torch2jax'; app()"]
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

# the tutorial: (cell type, source); the outputs of cells 5 and 9 are an earlier run's
TUTORIAL = [
    ("markdown", dedent("""\
        # A small CNN on random images

        The shape of the PyTorch tutorials: model, optimizer, training loop and evaluation in
        cells of their own.""")),
    ("code", "%matplotlib inline\n!echo ready"),
    ("code", dedent("""\
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import matplotlib.pyplot as plt

        torch.manual_seed(0)""")),
    ("markdown", "## The model"),
    ("code", dedent("""\
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
                self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
                self.fc = nn.Linear(16 * 4 * 4, 2)

            def forward(self, x):
                x = F.max_pool2d(F.relu(self.conv1(x)), 2)
                x = F.max_pool2d(F.relu(self.conv2(x)), 2)
                x = torch.flatten(x, 1)
                return self.fc(x)""")),
    ("code", dedent("""\
        images = torch.randn(64, 1, 16, 16)
        labels = (images.mean(dim=(1, 2, 3)) > 0).long()
        model = Net()
        print(tuple(model(images).shape))""")),
    ("markdown", "## Training"),
    ("code", dedent("""\
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        criterion = nn.CrossEntropyLoss()""")),
    ("code", dedent("""\
        %%time
        losses = []
        for epoch in range(40):
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if epoch % 10 == 0:
                print(f"epoch {epoch}: loss {loss.item():.4f}")
        print(f"final loss {losses[-1]:.4f}")""")),
    ("code", dedent("""\
        model.eval()
        with torch.no_grad():
            predictions = model(images).argmax(dim=1)
        accuracy = (predictions == labels).float().mean().item()
        print(f"accuracy {accuracy:.2f}")""")),
    ("code", dedent("""\
        fig, ax = plt.subplots()
        ax.plot(losses)
        ax.set_xlabel("epoch")
        fig.savefig("losses.png")
        print(len(ax.lines[0].get_ydata()))""")),
]
CHANGED = {2, 4, 5, 7, 8, 9}  # the code cells that hold torch code (positions in TUTORIAL)


def _notebook(cells: list[tuple[str, str]], minor: int = 5):
    nb = new_notebook(cells=[new_code_cell(src) if kind == "code" else new_markdown_cell(src)
                             for kind, src in cells])
    nb.nbformat_minor = minor
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["custom"] = {"kept": True}
    return nb


def _tutorial():
    nb = _notebook(TUTORIAL)
    # an earlier run's outputs: kept on an unchanged cell, cleared on a changed one
    nb.cells[1].outputs = [new_output("stream", text="ready\n")]
    nb.cells[1].execution_count = 1
    nb.cells[5].outputs = [new_output("stream", text="(64, 2)\n")]
    nb.cells[5].execution_count = 3
    nb.cells[4].metadata["tags"] = ["model"]
    return nb


def _write(nb, path: Path) -> Path:
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The tutorial notebook and its conversion (``-o``), with the JSON report."""
    base = tmp_path_factory.mktemp("nb")
    src = base / "src"
    src.mkdir()
    _write(_tutorial(), src / "cnn.ipynb")
    report = base / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(base / "out"), "--report",
                              str(report)])
    assert res.exit_code == 0, res.output
    return src / "cnn.ipynb", base / "out" / "cnn.ipynb", json.loads(report.read_text())


def test_cells_keep_their_place_ids_metadata_and_magics(converted) -> None:
    src, out, report = converted
    before = nbformat.read(str(src), as_version=nbformat.NO_CONVERT)
    after = nbformat.read(str(out), as_version=nbformat.NO_CONVERT)
    assert report["files"][0]["status"] == "converted"
    assert (after.nbformat, after.nbformat_minor) == (4, 5)
    assert after.metadata == before.metadata
    assert [c.id for c in after.cells] == [c.id for c in before.cells]
    assert [c.cell_type for c in after.cells] == [c.cell_type for c in before.cells]
    for i, (a, b) in enumerate(zip(before.cells, after.cells, strict=True)):
        assert a.metadata == b.metadata
        if a.cell_type == "markdown" or i not in CHANGED:
            assert b == a, i  # source, outputs and execution count as they were
            continue
        assert b.source != a.source, i
        assert b.outputs == [] and b.execution_count is None, i
        assert "torch" not in b.source, (i, b.source)
    # the IPython lines, verbatim where they were
    assert after.cells[1].source == "%matplotlib inline\n!echo ready"
    assert after.cells[8].source.startswith("%%time\nlosses = []\n")
    # the imports and helpers the conversion adds go into the cell of the torch imports
    imports = after.cells[2].source
    assert "import jax\n" in imports and "from flax import nnx" in imports
    assert "import optax" in imports and "import matplotlib.pyplot as plt" in imports
    assert all("import jax" not in after.cells[i].source for i in CHANGED - {2})
    # names of one cell are known in the next: Net (cell 5) is built with rngs, the optimizer
    # (cell 8) wraps the model of cell 6, the loop (cell 9) is a jitted train step
    assert "class Net(nnx.Module)" in after.cells[4].source
    assert "Net(rngs=" in after.cells[5].source
    assert "nnx.Optimizer(model" in after.cells[7].source
    assert "def train_step(" in after.cells[8].source


def test_diff_is_cell_by_cell_and_writes_nothing(tmp_path: Path) -> None:
    path = _write(_tutorial(), tmp_path / "cnn.ipynb")
    data = path.read_bytes()
    res = runner.invoke(app, ["convert", str(path), "--diff"])
    assert res.exit_code == 0, res.output
    labels = re.findall(r"^--- a/(.*)$", res.stdout, re.MULTILINE)
    assert labels == [f"{path} [cell {i + 1}]" for i in sorted(CHANGED)]
    assert re.findall(r"^\+\+\+ b/(.*)$", res.stdout, re.MULTILINE) == labels
    assert "-optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)\n" in res.stdout
    assert '"cell_type"' not in res.stdout  # cell sources, not the notebook's JSON
    assert path.read_bytes() == data


def test_in_place_then_check(tmp_path: Path) -> None:
    path = _write(_tutorial(), tmp_path / "cnn.ipynb")
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 1
    assert f"{path}: holds PyTorch code that torch2jax would convert" in res.output
    res = runner.invoke(app, ["convert", str(path), "--in-place"])
    assert res.exit_code == 0, res.output
    done = path.read_bytes()
    assert b"torch" not in done
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["convert", str(path), "--in-place", "--report",
                              str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["status"] == "unchanged"
    assert path.read_bytes() == done


@pytest.mark.slow
def test_converted_notebook_runs_top_to_bottom(converted, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    _, out, _ = converted
    nb = nbformat.read(str(out), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    def printed(i: int) -> str:
        text = "".join(o.get("text", "") for o in nb.cells[i].outputs
                       if o.output_type == "stream")
        return text.replace("\r\n", "\n")  # a shell line's output comes through a terminal

    assert printed(1) == "ready\n"
    assert printed(5) == "(64, 2)\n"
    train = printed(8)
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([\d.]+)", train)]
    final = float(re.search(r"final loss ([\d.]+)", train).group(1))
    assert len(losses) == 4 and losses[0] > 0.5, train
    assert final < 0.5 * losses[0], train  # the loss falls
    assert "Wall time" in train  # %%time ran the converted loop
    accuracy = float(re.search(r"accuracy ([\d.]+)", printed(9)).group(1))
    assert accuracy >= 0.8, printed(9)
    assert printed(10) == "40\n"
    png = (tmp_path / "losses.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_todo_lands_in_its_cell_and_diagnostics_name_the_cell(tmp_path: Path) -> None:
    nb = _notebook([
        ("code", "!pip install torch torchvision\n%load_ext autoreload"),
        ("markdown", "Helpers"),
        ("code", "import torch"),
        ("code", "def total(x):\n    return torch.sum(x, dim=1)"),
        ("code", "def odd(x):\n    y = total(x)\n    return torch.frobnicate(y)"),
        ("code", "%timeit torch.ones(3)"),
        ("code", "%%bash\npip list | grep torch"),
    ])
    path = _write(nb, tmp_path / "nb.ipynb")
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(path), "--in-place", "--report", str(report)])
    assert res.exit_code == 1, res.output  # a TODO is left
    after = nbformat.read(str(path), as_version=4)
    todo = "# TODO(torch2jax): no rule for torch.frobnicate [torch.frobnicate]"
    assert [todo in c.source for c in after.cells] == [False, False, False, False, True, False,
                                                      False]
    assert after.cells[4].source.splitlines()[2].strip() == todo
    assert after.cells[3].source == "def total(x):\n    return jnp.sum(x, axis=1)"
    assert after.cells[0].source == "!pip install torch torchvision\n%load_ext autoreload"
    assert after.cells[5].source == "%timeit torch.ones(3)"
    assert after.cells[6].source == "%%bash\npip list | grep torch"
    assert f"{path}:cell 5:3:12: error [torch.frobnicate] no rule for torch.frobnicate" in \
        res.output
    diags = json.loads(report.read_text())["files"][0]["diagnostics"]
    where = [(d["cell"], d["line"], d["column"], d["rule"], d["severity"]) for d in diags]
    assert where == [(1, 1, 1, "notebook-magic", "warning"),
                     (5, 3, 12, "torch.frobnicate", "error"),
                     (6, 1, 1, "notebook-magic", "warning"),
                     (7, 1, 1, "notebook-magic", "warning")]
    assert "`!pip install torch torchvision` names torch" in diags[0]["message"]
    # converted again: the marker is reported again, in its cell, until it is resolved
    res = runner.invoke(app, ["check", str(path)])
    assert res.exit_code == 1
    assert f"{path}:cell 5:3:5: error [torch.frobnicate] left for review" in res.output


def test_folders_find_notebooks_like_python_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / ".gitignore").write_text("scratch.ipynb\n")
    (src / ".ipynb_checkpoints").mkdir()
    torch_nb = _notebook([("code", "import torch\nx = torch.ones(2)")])
    for name in ("a.ipynb", "scratch.ipynb", ".ipynb_checkpoints/a-checkpoint.ipynb",
                 "skip.ipynb"):
        _write(torch_nb, src / name)
    (src / "m.py").write_text("import torch\nx = torch.zeros(2)\n")
    _write(_notebook([("markdown", "no code")]), src / "plain.ipynb")
    report = tmp_path / "r.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "--exclude",
                              "skip.ipynb", "--report", str(report)])
    assert res.exit_code == 0, res.output
    files = {Path(f["path"]).name: f["status"] for f in json.loads(report.read_text())["files"]}
    assert files == {"a.ipynb": "converted", "m.py": "converted", "plain.ipynb": "unchanged"}
    out = nbformat.read(str(tmp_path / "out" / "a.ipynb"), as_version=4)
    assert out.cells[0].source == "import jax.numpy as jnp\nx = jnp.ones((2,))"
    assert (tmp_path / "out" / "plain.ipynb").read_bytes() == (src / "plain.ipynb").read_bytes()


def test_nbformat_version_and_json_indentation_are_kept(tmp_path: Path) -> None:
    # nbformat 4.4 (no cell ids), written by an editor that indents by 2
    nb = _notebook([("code", "import torch\nx = torch.ones(2)"), ("code", "print(x)")],
                   minor=4)
    for c in nb.cells:
        del c["id"]
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(nb, indent=2, sort_keys=True) + "\n")
    res = runner.invoke(app, ["convert", str(path), "--in-place"])
    assert res.exit_code == 0, res.output
    text = path.read_text()
    assert text.startswith('{\n  "cells": [\n') and text.endswith("}\n")
    data = json.loads(text)
    assert (data["nbformat"], data["nbformat_minor"]) == (4, 4)
    assert all("id" not in c for c in data["cells"])
    assert "".join(data["cells"][0]["source"]) == "import jax.numpy as jnp\nx = jnp.ones((2,))"
    # nbformat 3 (worksheets, "input") stays nbformat 3
    v3 = nbformat.v3
    old = v3.new_notebook(worksheets=[v3.new_worksheet(cells=[
        v3.new_code_cell(input="import torch\ny = torch.zeros(3)"), v3.new_text_cell(
            "markdown", source="text")])])
    path3 = tmp_path / "v3.ipynb"
    path3.write_text(nbformat.writes(old, version=3))
    res = runner.invoke(app, ["convert", str(path3), "--in-place"])
    assert res.exit_code == 0, res.output
    data = json.loads(path3.read_text())
    assert data["nbformat"] == 3
    cells = data["worksheets"][0]["cells"]
    assert "".join(cells[0]["input"]) == "import jax.numpy as jnp\ny = jnp.zeros((3,))"
    assert cells[1]["cell_type"] == "markdown"


def test_not_a_notebook_or_not_python_is_reported_or_kept(tmp_path: Path) -> None:
    (tmp_path / "broken.ipynb").write_text('{"cells": [ torch')
    bad = _notebook([("code", "import torch")])
    bad.cells[0]["bogus"] = 1
    _write(bad, tmp_path / "invalid.ipynb")
    r_nb = _notebook([("code", "library(torch)\nx <- torch_randn(2)")])
    r_nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    r_nb.metadata["language_info"] = {"name": "R"}
    _write(r_nb, tmp_path / "r.ipynb")
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(tmp_path), "--check", "--report", str(report)])
    assert res.exit_code == 1
    files = {Path(f["path"]).name: f for f in json.loads(report.read_text())["files"]}
    assert files["broken.ipynb"]["status"] == "failed"
    assert files["broken.ipynb"]["diagnostics"][0]["message"].startswith(
        "not a notebook: not JSON")
    assert files["invalid.ipynb"]["status"] == "failed"
    assert "not a valid notebook (nbformat)" in files["invalid.ipynb"]["diagnostics"][0][
        "message"]
    assert files["r.ipynb"]["status"] == "unchanged"


def test_parse_error_names_the_cell(tmp_path: Path) -> None:
    path = _write(_notebook([("code", "import torch"), ("markdown", "m"),
                             ("code", "x = torch.ones(2)\ndef f(:\n    pass")]),
                  tmp_path / "nb.ipynb")
    res = runner.invoke(app, ["convert", str(path), "--diff"])
    assert res.exit_code == 1
    # the line libcst's parser names, counted in the cell (the message's position too)
    mt = re.search(rf"{re.escape(str(path))}:cell 3:(\d+):\d+: error \[parse\] not valid "
                   r"Python: .* error at (\d+):\d+", res.output)
    assert mt and int(mt.group(1)) in (2, 3) and int(mt.group(2)) in (2, 3), res.output


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_other_targets_split_back(tmp_path: Path, target: str) -> None:
    path = _write(_tutorial(), tmp_path / "cnn.ipynb")
    report = tmp_path / "r.json"
    runner.invoke(app, ["convert", str(path), "--in-place", "--target", target, "--report",
                        str(report)])
    entry = json.loads(report.read_text())["files"][0]
    assert entry["status"] == "converted", entry
    assert all(d["rule"] != "notebook" for d in entry["diagnostics"])
    after = nbformat.read(str(path), as_version=4)
    assert after.cells[1].source == "%matplotlib inline\n!echo ready"
    assert after.cells[8].source.startswith("%%time\n")
    assert "_t2j" not in path.read_text()


# --- masking and splitting ---------------------------------------------------------------------

MAGIC_CELL = """!pip install torch
files = !ls
%load_ext autoreload
torch.nn.Linear?
s = '''
%not a magic: inside a string
'''
z = (7
% 2)
if z:
    %time y = z
!echo a \\
  b
print(z)  # a comment?"""


def test_masking_finds_the_ipython_lines_and_round_trips() -> None:
    joined = join([(0, MAGIC_CELL), (1, "%%time\nx = 1"), (2, "%%bash\necho hi")])
    found = [(m.part, m.line, m.text) for m in joined.magics]
    assert found == [(0, 1, "!pip install torch"), (0, 2, "files = !ls"),
                     (0, 3, "%load_ext autoreload"), (0, 4, "torch.nn.Linear?"),
                     (0, 11, "    %time y = z"), (0, 12, "!echo a \\\n  b"),
                     (1, 1, "%%time")]
    assert joined.kept == [(2, "%%bash\necho hi")]  # not Python: not in the module at all
    compile(joined.text, "<joined>", "exec")  # the masked module is Python
    assert joined.text.count("\n") == 2 + MAGIC_CELL.count("\n") + 1 + 2
    assert split(joined, joined.text) == [MAGIC_CELL, "%%time\nx = 1"]
    # lines map back to their cells
    assert joined.locate(joined.parts[1].marker_line + 2) == (1, 2)
    assert joined.locate(joined.parts[1].marker_line) is None


def test_split_refuses_a_moved_or_dropped_marker() -> None:
    joined = join([(0, "import torch\n%time x = 1"), (1, "y = 2"), (3, "z = 3")])
    lines = joined.text.split("\n")
    markers = [i for i, ln in enumerate(lines) if "_c" in ln and joined.tag in ln]
    magic = next(i for i, ln in enumerate(lines) if f"{joined.tag}_m0" in ln)

    def attempt(new: list[str]) -> None:
        with pytest.raises(NotebookError):
            split(joined, "\n".join(new))

    swapped = list(lines)
    swapped[markers[1]], swapped[markers[2]] = swapped[markers[2]], swapped[markers[1]]
    attempt(swapped)
    attempt([ln for i, ln in enumerate(lines) if i != markers[2]])  # dropped
    indented = list(lines)
    indented[markers[1]] = "    " + indented[markers[1]]
    attempt(indented)
    moved = [ln for i, ln in enumerate(lines) if i != magic]  # the magic to the next cell
    moved.insert(markers[1], lines[magic])
    attempt(moved)
    attempt([ln for i, ln in enumerate(lines) if i != magic])  # dropped
    attempt([*lines, lines[magic]])  # doubled
    attempt(lines + [f"x = '{joined.tag}_c1'"])  # the tag somewhere else


def test_without_nbformat_a_torch_notebook_fails_naming_the_extra(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    (fake / "nbformat").mkdir(parents=True)
    (fake / "nbformat" / "__init__.py").write_text("raise ImportError('not installed')\n")
    src = tmp_path / "src"
    src.mkdir()
    _write(_notebook([("code", "import torch\nx = torch.ones(2)")]), src / "torch.ipynb")
    _write(_notebook([("code", "x = 1")]), src / "plain.ipynb")
    (src / "m.py").write_text("import torch\nx = torch.zeros(2)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fake), *filter(None, [os.environ.get("PYTHONPATH")])]))
    res = subprocess.run([*CLI, "convert", str(src), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (f"{src / 'torch.ipynb'}:1:1: error [notebook] reading a notebook needs nbformat: "
            "pip install nbformat (the extra torch2jax-port[notebook]); not converted"
            ) in res.stderr
    assert (tmp_path / "out" / "m.py").read_text() == "import jax.numpy as jnp\nx = jnp.zeros((2,))\n"
    assert (tmp_path / "out" / "plain.ipynb").read_bytes() == (src / "plain.ipynb").read_bytes()
    assert not (tmp_path / "out" / "torch.ipynb").exists()


def test_split_comments_out_an_ipython_line_the_conversion_commented_out() -> None:
    joined = join([(0, "import torch\nfor i in range(2):\n    %time x = i\n    print(x)")])
    lines = joined.text.split("\n")
    # the loop commented out, as the equinox pass does with code it cannot translate
    start = next(i for i, ln in enumerate(lines) if ln.startswith("for "))
    code = "\n".join([*lines[:start], *("# " + ln for ln in lines[start:start + 3]), "pass",
                      *lines[start + 3:]])
    assert split(joined, code) == [
        "import torch\n# for i in range(2):\n#     %time x = i\n#     print(x)\npass"]


def test_ignore_comments_and_blank_lines_in_cells(tmp_path: Path) -> None:
    path = _write(_notebook([
        ("code", "\nimport torch\n\n"),
        ("code", "def odd(x):\n    return torch.frobnicate(x)  # torch2jax: ignore[torch.frob*]"),
        ("code", "y = torch.ones(2)"),
    ]), tmp_path / "nb.ipynb")
    res = runner.invoke(app, ["convert", str(path), "--in-place"])
    assert res.exit_code == 0, res.output
    assert "TODO" not in path.read_text()
    cells = [c.source for c in nbformat.read(str(path), as_version=4).cells]
    # the blank lines around kept; torch's import stays: the ignored line still reads torch
    assert cells[0] == "\nimport torch\nimport jax.numpy as jnp\n\n"
    assert cells[1] == "def odd(x):\n    return torch.frobnicate(x)  # torch2jax: ignore[torch.frob*]"
    assert cells[2] == "y = jnp.ones((2,))"
