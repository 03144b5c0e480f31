"""The command line contract: exit codes, what is written where, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from torch2jax.cli import app

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

GOOD = "import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n"
UNTRANSLATABLE = "import torch\n\n\ndef f(x):\n    return torch.frobnicate(x)\n"
PLAIN = "def g():\n    return 1\n"


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "good.py").write_text(GOOD)
    (src / "pkg" / "plain.py").write_text(PLAIN)
    return src


def test_convert_mirror_tree(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "pkg" / "good.py").read_text() == (
        "import jax.numpy as jnp\n\n\ndef f(x):\n    return jnp.sum(x, axis=1)\n")
    assert (out / "pkg" / "plain.py").read_text() == PLAIN  # copied through unchanged
    assert (src / "pkg" / "good.py").read_text() == GOOD  # input untouched


def test_the_totals_are_singular_for_one(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.py").write_text(GOOD)
    (src / "todo.py").write_text(UNTRANSLATABLE)
    res = runner.invoke(app, ["convert", str(src / "good.py"), "-o", str(tmp_path / "a")])
    assert "1 file: 1 converted; 0 TODOs" in res.output, res.output
    res = runner.invoke(app, ["convert", str(src / "todo.py"), "-o", str(tmp_path / "b")])
    assert "1 file: 1 converted; 1 TODO" in res.output, res.output
    res = runner.invoke(app, ["convert", str(src), "--diff"])
    assert "2 files: 2 converted; 1 TODO" in res.output, res.output


def test_init_torch_writes_torchs_initializers(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.py").write_text("import torch.nn as nn\n\n\nclass M(nn.Module):\n"
                              "    def __init__(self):\n        super().__init__()\n"
                              "        self.fc = nn.Linear(4, 3)\n")
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "--init", "torch"])
    assert res.exit_code == 0, res.output
    assert "bias_init=torch_uniform_init(4)" in (tmp_path / "out" / "m.py").read_text()
    res = runner.invoke(app, ["convert", str(src), "--diff", "--init", "kaiming"])
    assert res.exit_code == 2 and "--init kaiming" in res.output


def test_todo_and_parse_error_exit_1_other_files_still_written(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    (src / "pkg" / "bad.py").write_text("import torch\ndef f(:\n")
    (src / "pkg" / "todo.py").write_text(UNTRANSLATABLE)
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--report", str(report)])
    assert res.exit_code == 1
    assert (out / "pkg" / "good.py").exists()
    assert not (out / "pkg" / "bad.py").exists()
    todo = (out / "pkg" / "todo.py").read_text()
    assert "# TODO(torch2jax): no rule for torch.frobnicate" in todo
    data = json.loads(report.read_text())
    by_path = {Path(f["path"]).name: f for f in data["files"]}
    assert by_path["bad.py"]["status"] == "failed"
    assert by_path["bad.py"]["diagnostics"][0]["line"] == 2
    rules = [d["rule"] for d in by_path["todo.py"]["diagnostics"]]
    assert rules == ["torch.frobnicate"]
    assert "Traceback" not in res.output


def test_diff_writes_nothing(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    res = runner.invoke(app, ["convert", str(src), "--diff"])
    assert res.exit_code == 0
    assert "+    return jnp.sum(x, axis=1)" in res.stdout
    assert (src / "pkg" / "good.py").read_text() == GOOD


def test_in_place_rewrites_only_changed_files(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    plain = src / "pkg" / "plain.py"
    before = plain.stat().st_mtime_ns
    res = runner.invoke(app, ["convert", str(src), "--in-place"])
    assert res.exit_code == 0
    assert "jnp.sum" in (src / "pkg" / "good.py").read_text()
    assert plain.stat().st_mtime_ns == before
    assert not list(src.rglob("*.tmp"))
    # converting the converted code again changes nothing
    res = runner.invoke(app, ["convert", str(src), "--check"])
    assert res.exit_code == 0


def test_check_flags_torch_code(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    res = runner.invoke(app, ["check", str(src / "pkg" / "good.py")])
    assert res.exit_code == 1
    res = runner.invoke(app, ["check", str(src / "pkg" / "plain.py")])
    assert res.exit_code == 0


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["convert", str(tmp_path / "missing"), "-o", "x"]).exit_code == 2
    assert runner.invoke(app, ["convert", str(tmp_path)]).exit_code == 2  # no output mode
    assert runner.invoke(app, ["verify", "nothing-here"]).exit_code == 2


def test_output_folder_inside_input_is_not_reconverted(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    out = src / "converted"
    assert runner.invoke(app, ["convert", str(src), "-o", str(out)]).exit_code == 2
    assert not out.exists()
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--allow-overlap"])
    assert res.exit_code == 0, res.output
    assert (out / "pkg").is_dir() and not (out / "converted").exists()
    # a second run would replace files inside the input: refused (tests/test_safety.py)
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--allow-overlap"])
    assert res.exit_code == 2 and not (out / "converted").exists()


def test_verify_json_reports_the_comparison(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "models" / "mlp.py", tmp_path / "mlp.py")
    res = runner.invoke(app, ["verify", f"{tmp_path / 'mlp.py'}::MLP", "--args",
                              '{"hidden_sizes": [16]}', "--input", "float32[2,784]", "--grad",
                              "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["passed"] is True
    assert data["target"] == "nnx"
    assert data["max_abs_diff"] < 1e-5
    assert data["grad_max_abs_diff"] < 1e-5
    assert data["device"]


def test_rules_and_explain() -> None:
    res = runner.invoke(app, ["rules"])
    assert res.exit_code == 0 and "torch.nn.Linear" in res.stdout
    res = runner.invoke(app, ["explain", "nn.BatchNorm2d"])
    assert res.exit_code == 0
    assert "momentum" in res.stdout and "running_var -> var" in res.stdout
    assert runner.invoke(app, ["explain", "torch.nope"]).exit_code == 2
    # layouts in brackets are printed, not eaten as console markup
    assert "kernel [transpose]" in runner.invoke(app, ["explain", "torch.nn.Linear"]).output


def test_check_answers_without_converting_and_explain_converts(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import torch\n\n\ndef f(x):\n    return torch.frobnicate(x)\n")
    res = runner.invoke(app, ["check", str(tmp_path / "m.py")])
    assert res.exit_code == 1
    assert "m.py: holds PyTorch code that torch2jax would convert (`torch2jax check " in res.output
    assert "frobnicate" not in res.output  # not converted: its TODOs are not known
    res = runner.invoke(app, ["check", "--explain", str(tmp_path / "m.py")])
    assert res.exit_code == 1
    assert "m.py:5:12: error [torch.frobnicate] no rule for torch.frobnicate" in res.output
    assert (tmp_path / "m.py").read_text().startswith("import torch\n")  # nothing written


def test_quick_check_agrees_with_the_converter_on_which_files_use_torch() -> None:
    """check's reading of the imports (Python's parser) against convert's (libcst's), on every
    Python file of the fixtures, the test data and programs, and the benchmarks."""
    import ast

    import libcst as cst

    from torch2jax.convert import uses_torch
    from torch2jax.engine import _imports_torch

    root = Path(__file__).resolve().parents[1]
    files = [p for d in ("fixtures", "tests", "benchmarks") for p in (root / d).rglob("*.py")]
    assert len(files) > 100
    torch_files = 0
    for p in files:
        text = p.read_text(encoding="utf-8")
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError:
            continue
        quick = _imports_torch(ast.parse(text))
        assert quick == uses_torch(module), p
        torch_files += quick
    assert torch_files > 30
