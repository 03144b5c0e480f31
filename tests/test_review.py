"""Reviewing: the diff (coloured on a terminal, plain otherwise), the JSON report's documented
schema, the terminal summary grouped by rule, the progress bar only on a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.engine import Options, Request, run
from torch2jax.report import Diagnostic, FileReport, RunReport, unified_diff

runner = CliRunner()
GOOD = "import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n"
TODO = "import torch\n\n\ndef g(x):\n    return torch.frobnicate(x)\n"


def test_diff_is_plain_off_a_terminal_and_coloured_on_one(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(GOOD)
    res = runner.invoke(app, ["convert", str(tmp_path), "--diff"])
    assert res.exit_code == 0
    assert "\x1b[" not in res.stdout
    assert f"--- a/{tmp_path / 'a.py'}" in res.stdout
    assert "+    return jnp.sum(x, axis=1)" in res.stdout
    coloured = unified_diff(GOOD, GOOD.replace("torch.sum", "jnp.sum"), "a.py", color=True)
    assert "\x1b[31m-    return torch.sum(x, dim=1)\x1b[0m" in coloured
    assert "\x1b[32m+    return jnp.sum(x, dim=1)\x1b[0m" in coloured
    assert "\x1b[36m@@" in coloured


def test_report_follows_the_documented_schema(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(GOOD)
    (src / "b.py").write_text(TODO)
    (src / "c.py").write_text("x = 1\n")
    (src / "d.py").write_text("import torch\ndef f(:\n")
    report = tmp_path / "r.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "--report",
                              str(report)])
    assert res.exit_code == 1
    data = json.loads(report.read_text())
    assert data["schema"] == "torch2jax-report/1"
    assert data["summary"] == {"files": 4, "converted": 2, "unchanged": 1, "skipped": 0,
                               "failed": 1, "todos": 1, "errors": 2, "warnings": 0}
    assert [Path(f["path"]).name for f in data["files"]] == ["a.py", "b.py", "c.py", "d.py"]
    for f in data["files"]:
        assert set(f) == {"path", "status", "output", "diagnostics"}
        for d in f["diagnostics"]:
            assert set(d) == {"file", "line", "column", "rule", "severity", "message", "cell"}
            assert d["file"] == f["path"]
            assert d["cell"] is None  # a notebook's cell (docs/notebooks.md); null in .py files
    by = {Path(f["path"]).name: f for f in data["files"]}
    assert by["d.py"]["output"] is None
    assert by["c.py"]["output"] == str(tmp_path / "out" / "c.py")


def test_summary_groups_many_findings_by_rule() -> None:
    rep = RunReport([FileReport(f"f{i}.py", "converted", diagnostics=[
        Diagnostic(f"f{i}.py", j + 1, 1, "torch.frob" if j % 3 else "torch.wib", "error", "m")
        for j in range(10)]) for i in range(6)])
    buf = io.StringIO()
    rep.print_summary(Console(file=buf, force_terminal=True, width=200))
    text = buf.getvalue()
    assert "findings by rule" in text and "torch.frob" in text
    assert text.count("f0.py:") <= 2  # grouped: not one row per finding
    assert "TODOs by rule: torch.frob ×36, torch.wib ×24" in text
    buf = io.StringIO()
    rep.print_summary(Console(file=buf, force_terminal=False, width=80))
    assert buf.getvalue().count("error [torch.frob] m") == 36  # plain lines off a terminal


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text(GOOD)
    req = Request(paths=[tmp_path], mode="check", options=Options(), jobs=1)
    buf = io.StringIO()
    run(req, progress_console=Console(file=buf, force_terminal=True))
    assert "converting" in buf.getvalue()
    buf = io.StringIO()
    run(req, progress_console=Console(file=buf, force_terminal=False))
    assert buf.getvalue() == ""
