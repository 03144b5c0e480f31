"""Bad input never loses data: broken, undecodable, empty, huge, looping, unreadable files each
get a diagnostic naming them while the rest converts; nothing is written outside the output
folder; --in-place is atomic and touches only what changes; converting the output again
changes nothing; mutated sources never crash the converter."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from torch2jax import engine
from torch2jax.cli import app
from torch2jax.convert import ParseError, convert_source

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures" / "models").glob("*.py")) + sorted(
    (ROOT / "fixtures" / "training").glob("*.py"))

GOOD = "import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n"


def _snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        if skip is not None and d.resolve() == skip.resolve():
            dirnames[:] = []
            continue
        for name in filenames + [n for n in dirnames if (d / n).is_symlink()]:
            p = d / name
            if p.is_symlink():
                out[str(p.relative_to(root))] = "link:" + os.readlink(p)
            elif p.is_file():
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[str(p.relative_to(root))] = "special"
    return out


def _broken_tree(src: Path) -> None:
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "good.py").write_text(GOOD)
    (src / "pkg" / "syntax.py").write_text("import torch\ndef f(:\n    pass\n")
    (src / "pkg" / "latin1.py").write_bytes(b"import torch\n# caf\xe9\nx = torch.ones(2)\n")
    (src / "pkg" / "cookie.py").write_bytes(
        b"# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nx = torch.sum(torch.ones(2))\n")
    (src / "pkg" / "badcookie.py").write_bytes(b"# coding: klingon\nimport torch\n")
    (src / "pkg" / "nul.py").write_bytes(b"import torch\n\x00\x00\n")
    (src / "pkg" / "empty.py").write_text("")
    (src / "pkg" / "crlf.py").write_bytes(GOOD.replace("\n", "\r\n").encode())
    (src / "pkg" / "huge.py").write_text(GOOD + "# padding\n" * 2000)
    (src / "pkg" / "loop.py").symlink_to("loop.py")
    (src / "pkg" / "gone.py").symlink_to("nowhere.py")
    (src / "pkg" / "back").symlink_to("..")  # a folder link to its own ancestor
    os.mkfifo(src / "pkg" / "fifo.py")  # reading it would block forever
    (src / "pkg" / "deep.py").write_text("import torch\nx = " + "(" * 500 + "1" + ")" * 500 + "\n")


def test_broken_tree_converts_the_rest_and_names_each_bad_file(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(engine, "MAX_BYTES", 10_000)
    src = tmp_path / "src"
    _broken_tree(src)
    unreadable = src / "pkg" / "secret.py"
    unreadable.write_text(GOOD)
    unreadable.chmod(0)
    out = src / "converted"  # the output folder inside the input tree
    before_src = _snapshot(src)
    before_tmp = sorted(p.name for p in tmp_path.iterdir())
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--allow-overlap",
                              "--report", str(report), "-j", "1"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert _snapshot(src, skip=out) == before_src  # the input is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before_tmp + ["report.json"])
    data = json.loads(report.read_text())
    files = {Path(f["path"]).name: f for f in data["files"]}
    assert files["good.py"]["status"] == "converted"
    assert "jnp.sum(x, axis=1)" in (out / "pkg" / "good.py").read_text()
    assert (out / "pkg" / "empty.py").read_text() == ""
    # CRLF line endings and the latin-1 coding declaration are kept
    assert (out / "pkg" / "crlf.py").read_bytes().count(b"\r\n") >= 4
    cookie = (out / "pkg" / "cookie.py").read_bytes()
    assert b"caf\xe9" in cookie and b"jnp.sum" in cookie

    def why(name: str) -> str:
        f = files[name]
        assert f["status"] == "failed", f
        assert not (out / "pkg" / name).exists()
        (d,) = f["diagnostics"]
        assert d["severity"] == "error" and d["file"] == f["path"]
        return d["rule"] + ": " + d["message"]

    assert why("syntax.py").startswith("parse: not valid Python")
    assert files["syntax.py"]["diagnostics"][0]["line"] in (2, 3)  # where libcst stopped
    assert "not valid UTF-8 and no coding declaration" in why("latin1.py")
    assert "coding declaration" in why("badcookie.py")
    assert "NUL" in why("nul.py")
    assert why("huge.py").startswith("too-large: ")
    assert "symbolic link loop" in why("loop.py")
    assert "broken symbolic link" in why("gone.py")
    assert "not a regular file" in why("fifo.py")
    assert "symbolic link loop" in why("back")
    # deep nesting: converted, or refused with a diagnostic; never a crash
    if files["deep.py"]["status"] != "converted":
        assert why("deep.py").split(":")[0] in ("too-deep", "parse")
    if os.geteuid() != 0:  # root reads anything
        assert "cannot be read" in why("secret.py")
    # every failed file is named in the terminal summary
    for name in ("syntax.py", "latin1.py", "loop.py", "fifo.py"):
        assert name in res.output
    assert not list(src.rglob("*.tmp")) and not list(out.rglob(".*.tmp"))


def test_in_place_is_atomic_and_leaves_bad_and_unchanged_files_alone(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src).mkdir()
    (src / "good.py").write_text(GOOD)
    (src / "plain.py").write_text("x = 1\n")
    (src / "syntax.py").write_text("import torch\ndef f(:\n")
    (src / "cookie.py").write_bytes(b"# coding: latin-1\nimport torch\n# \xe9\n"
                                    b"y = torch.sum(torch.ones(2))\n")
    (src / "link.py").symlink_to("good.py")
    (src / "good.py").chmod(0o640)
    stat = {p.name: p.stat().st_mtime_ns for p in src.iterdir() if not p.is_symlink()}
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    res = runner.invoke(app, ["convert", str(src), "--in-place", "-j", "1"])
    assert res.exit_code == 1  # syntax.py
    assert "jnp.sum" in (src / "good.py").read_text()
    assert (src / "good.py").stat().st_mode & 0o777 == 0o640  # mode kept
    assert b"\xe9" in (src / "cookie.py").read_bytes()  # still latin-1
    assert (src / "link.py").is_symlink() and os.readlink(src / "link.py") == "good.py"
    for name in ("plain.py", "syntax.py"):
        assert (src / name).read_bytes() == before[name]
        assert (src / name).stat().st_mtime_ns == stat[name]
    assert not [p for p in src.iterdir() if p.name.endswith(".tmp")]
    # again: nothing changes any more
    snap = _snapshot(src)
    res = runner.invoke(app, ["convert", str(src), "--in-place", "-j", "1"])
    assert _snapshot(src) == snap


def test_output_folder_equal_to_the_input_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(GOOD)
    res = runner.invoke(app, ["convert", str(tmp_path), "-o", str(tmp_path)])
    assert res.exit_code == 2 and "overwrite the input" in res.output
    assert (tmp_path / "a.py").read_text() == GOOD


def test_open_todos_of_an_earlier_conversion_keep_failing_the_check(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(GOOD + "\n\ndef g(x):\n    return torch.frobnicate(x)\n")
    assert runner.invoke(app, ["convert", str(tmp_path), "--in-place"]).exit_code == 1
    converted = (tmp_path / "m.py").read_text()
    assert "# TODO(torch2jax): no rule for torch.frobnicate [torch.frobnicate]" in converted
    # converting again changes nothing, and the TODO is still reported until it is resolved
    res = runner.invoke(app, ["convert", str(tmp_path), "--in-place"])
    assert res.exit_code == 1 and (tmp_path / "m.py").read_text() == converted
    res = runner.invoke(app, ["check", str(tmp_path / "m.py")])
    assert res.exit_code == 1
    assert "error [torch.frobnicate] left for review: no rule for torch.frobnicate" in res.output
    # the torch import stays while a line still reads torch (no NameError)
    assert "import torch\n" in converted
    handled = converted.replace(
        "    # TODO(torch2jax): no rule for torch.frobnicate [torch.frobnicate]\n", "").replace(
        "torch.frobnicate(x)", "-x").replace("import torch\n", "")
    (tmp_path / "m.py").write_text(handled)
    assert runner.invoke(app, ["check", str(tmp_path / "m.py")]).exit_code == 0


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_converting_the_output_again_changes_nothing(path: Path) -> None:
    first = convert_source(path.read_text(), path=str(path))
    second = convert_source(first.code, path=str(path))
    assert second.code == first.code
    assert [d for d in second.diagnostics if d.severity != "info"] == []


# --- fuzzing: mutated fixture sources and generated programs -------------------------------

SOURCES = [p.read_text() for p in FIXTURES]
TOKENS = ["(", ")", "[", "]", ":", ",", "=", "lambda", "yield", "torch.", "nn.Module", "\t",
          "    ", "\n", "'", '"""', "\\", "#", "@", "async ", "await ", "x.view(", "*", "**",
          "self.", "super().", "del ", "global ", "1e", "0x", "f'{", "import torch\n", "\x0c"]


@st.composite
def mutated(draw) -> str:
    src = draw(st.sampled_from(SOURCES)).splitlines(keepends=True)
    start = draw(st.integers(0, max(0, len(src) - 1)))
    # a window of the file, dedented so that most windows still parse
    lines = textwrap.dedent("".join(src[start:start + draw(st.integers(1, 40))])).splitlines(
        keepends=True)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "swap", "truncate"]))
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "insert":
            line = lines[i]
            j = draw(st.integers(0, len(line)))
            lines[i] = line[:j] + draw(st.sampled_from(TOKENS)) + line[j:]
        elif op == "swap" and len(lines) > 1:
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        else:
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
    return "import torch\nimport torch.nn as nn\n" + "".join(lines)


def _no_crash(source: str) -> None:
    try:
        result = convert_source(source)
    except ParseError:
        return
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return  # libcst's grammar is more lenient than Python's; nothing to compare
    ast.parse(result.code)  # what comes out of valid Python is still Python


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(mutated())
def test_mutated_sources_never_crash(source: str) -> None:
    _no_crash(source)


try:
    import hypothesmith
except ImportError:  # pragma: no cover - hypothesmith is optional
    hypothesmith = None


@pytest.mark.skipif(hypothesmith is None, reason="hypothesmith is not installed")
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.builds(lambda s: "import torch\n" + s, hypothesmith.from_node()
                 if hypothesmith else st.just("")))
def test_generated_programs_never_crash(source: str) -> None:
    _no_crash(source)
