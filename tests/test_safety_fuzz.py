"""Fuzzing the file handling of ``convert`` (issue 22): generated trees mixing valid torch
files and notebooks, broken, undecodable, binary, deeply nested and parser-crashing files,
odd names and modes, symbolic links (to files, to folders outside, broken, looping), converted with ``-o``
folders that may overlap the input or hold symbolic links out of it, or ``--in-place``.

Every example checks:

* no file outside the output folder changes (with ``--in-place``: no file but the converted
  inputs), and nothing at all when the run is refused (exit 2); no temporary file is left;
* every input is either written (converted: its conversion, which parses; unchanged: its
  bytes; either with its mode) or reported with a diagnostic, and appears in the report once.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from torch2jax.cli import app

runner = CliRunner()

CONTENTS = {
    "torch": b"import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n",
    "module": b"import torch.nn as nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n"
              b"        super().__init__()\n        self.fc = nn.Linear(2, 2)\n\n"
              b"    def forward(self, x):\n        return self.fc(x)\n",
    "todo": b"import torch\nx = torch.frobnicate(1)\n",
    "plain": b"X = 1\n",
    "empty": b"",
    "broken": b"import torch\ndef f(:\n    pass\n",
    "latin1": b"import torch\n# caf\xe9\n",
    "cookie": b"# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nx = torch.ones(2)\n",
    "binary": b"import torch\n\x00\x01\x02\n",
    "deep": b"import torch\nx = " + b"(" * 3000 + b"1" + b")" * 3000 + b"\n",
    "crash": b"import torch\nx = " + b"-" * 30000 + b"1\n",  # libcst's parser: SIGSEGV
    "notebook": json.dumps({"cells": [{"cell_type": "code", "execution_count": None,
                                       "id": "c1", "metadata": {}, "outputs": [],
                                       "source": ["import torch\n", "x = torch.ones(2)\n"]}],
                            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode(),
}
FOLDERS = ["", "pkg", "pkg/sub", "odd dir", "\u00e9t\u00e9", "-dash"]
NAMES = ["m.py", "model.py", "a b.py", "-x.py", "\u00e9.py", os.fsdecode(b"caf\xe9.py"),
         ".hidden.py", "__init__.py", "new\nline.py", "x.py", "nb.ipynb"]
MODES = [0o644, 0o755, 0o600, 0o444, 0o640]
OUTS = ["fresh", "existing", "same", "inside-new", "inside-existing", "contains", "alias",
        "in-place"]


@st.composite
def scenarios(draw) -> dict:
    files = draw(st.lists(st.tuples(
        st.sampled_from(FOLDERS), st.sampled_from(NAMES),
        st.sampled_from(list(CONTENTS)),
        st.sampled_from(MODES)), min_size=1, max_size=7, unique_by=lambda t: (t[0], t[1])))
    links = draw(st.lists(st.tuples(
        st.sampled_from(["file", "outside-file", "outside-dir", "broken", "loop", "ancestor"]),
        st.sampled_from(FOLDERS), st.sampled_from(["l.py", "link.py", "ext"])),
        max_size=3, unique_by=lambda t: (t[1], t[2])))
    return {"files": files, "links": links, "out": draw(st.sampled_from(OUTS)),
            "allow_overlap": draw(st.booleans()), "jobs": draw(st.sampled_from(["1", "2"]))}


def _snapshot(base: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            key = os.path.relpath(p, base)
            st_ = p.lstat()
            if p.is_symlink():
                out[key] = ("link", os.readlink(p))
            elif p.is_file():
                out[key] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(),
                            st_.st_mode & 0o777)
            elif p.is_dir():
                out[key] = ("dir",)
    return out


def _build(base: Path, sc: dict) -> tuple[Path, list[Path]]:
    src, outside = base / "src", base / "outside"
    src.mkdir()
    outside.mkdir()
    (outside / "user.py").write_bytes(b"# the user's file outside the input\nimport torch\n")
    (outside / "m.py").write_bytes(b"# another one\n")
    for folder, name, kind, mode in sc["files"]:
        (src / folder).mkdir(parents=True, exist_ok=True)
        p = src / folder / name
        p.write_bytes(CONTENTS[kind])
        p.chmod(mode)
    for kind, folder, name in sc["links"]:
        (src / folder).mkdir(parents=True, exist_ok=True)
        link = src / folder / name
        if os.path.lexists(link):
            continue
        target = {"file": next(iter(src.rglob("*.py")), src / "none.py"),
                  "outside-file": outside / "user.py", "outside-dir": outside,
                  "broken": base / "nowhere.py", "loop": link, "ancestor": src}[kind]
        link.symlink_to(target)
    return src, [src]


def _out_folder(base: Path, src: Path, how: str) -> Path | None:
    if how == "fresh":
        return base / "out"
    if how == "existing":  # holds a user file and a symbolic link out of it
        (base / "out").mkdir()
        (base / "out" / "notes.txt").write_text("kept\n")
        (base / "out" / "pkg").symlink_to(base / "outside")
        (base / "out" / "x.py").symlink_to(base / "outside" / "user.py")
        return base / "out"
    if how == "same":
        return src
    if how == "inside-new":
        return src / "converted"
    if how == "inside-existing":
        (src / "pkg").mkdir(exist_ok=True)
        return src / "pkg"
    if how == "contains":
        return base
    if how == "alias":
        (base / "alias").symlink_to(src)
        return base / "alias"
    return None  # in-place


def _inputs(src: Path, out: Path | None) -> set[str]:
    """The .py paths the run must account for: files and links to them, not in ``out``,
    folders behind symbolic links not entered."""
    skip = os.path.realpath(out) if out is not None else None
    found = set()
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        dirnames[:] = [d for d in dirnames
                       if os.path.realpath(Path(dirpath) / d) != skip]
        for name in filenames + dirnames:
            if name.endswith((".py", ".ipynb")):
                found.add(str(Path(dirpath) / name))
    return found


def _inside(key: str, folder: str) -> bool:
    return folder == "." or key == folder or key.startswith(folder + os.sep)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(scenarios())
def test_no_file_outside_the_output_changes_and_every_input_is_accounted_for(sc: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        src, paths = _build(base, sc)
        out = _out_folder(base, src, sc["out"])
        report = base / "report.json"
        args = ["convert", *map(str, paths), "--report", str(report), "-j", sc["jobs"]]
        args += ["--in-place"] if out is None else ["-o", str(out)]
        if sc["allow_overlap"] and out is not None:
            args.append("--allow-overlap")
        inputs = _inputs(src, out)
        before = _snapshot(base)
        res = runner.invoke(app, args)
        after = _snapshot(base)
        try:
            _check(base, src, out, sc, res, before, after, inputs, report)
        finally:
            for p in base.rglob("*"):  # let the folder be removed whatever the modes
                if not p.is_symlink():
                    p.chmod(0o755 if p.is_dir() else 0o644)


def _parses(path: str, data: bytes) -> None:
    """A written conversion is valid: a Python module, or a notebook's JSON."""
    if path.endswith(".ipynb"):
        json.loads(data)
    else:
        ast.parse(data)


def _check(base, src, out, sc, res, before, after, inputs, report) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        res.exception, res.output)
    assert "Traceback" not in res.output
    assert not [k for k in after if ".t2j-" in k], "a temporary file was left"
    if res.exit_code == 2:  # refused: nothing read into outputs, nothing written
        assert sc["out"] in ("same", "inside-new", "inside-existing", "contains", "alias"), (
            res.output)
        assert after == before, res.output
        return
    assert res.exit_code in (0, 1), res.output
    assert sc["out"] not in ("same", "alias"), "an -o equal to the input was accepted"
    overlap = sc["out"] in ("inside-new", "inside-existing", "contains")
    if overlap:
        assert sc["allow_overlap"], "an overlapping -o was accepted without --allow-overlap"
    entries = json.loads(report.read_text(encoding="utf-8"))["files"]
    by_path: dict[str, dict] = {}
    for e in entries:
        assert e["path"] not in by_path, f"{e['path']} reported twice"
        by_path[e["path"]] = e
    missing = inputs - set(by_path)
    assert not missing, f"inputs neither converted nor reported: {missing}"
    changed_ok: set[str] = {os.path.relpath(report, base)}
    out_rel = os.path.relpath(os.path.realpath(out), os.path.realpath(base)) if out else None
    for path, e in by_path.items():
        if e["status"] in ("failed", "skipped"):
            assert e["diagnostics"], e
            assert e["output"] is None or e["status"] == "skipped", e
            continue
        src_path = Path(path)
        data = src_path.read_bytes()
        mode = src_path.stat().st_mode & 0o777
        if out is None:  # in place
            if e["status"] == "converted":
                changed_ok.add(os.path.relpath(src_path, base))
                assert e["output"] == path
                _parses(path, data)
            continue
        written = Path(e["output"])
        assert written.is_file() and not written.is_symlink(), e
        assert _inside(os.path.relpath(os.path.realpath(written), os.path.realpath(base)),
                       out_rel), e
        assert written.stat().st_mode & 0o777 == mode, e
        if e["status"] == "unchanged":
            assert written.read_bytes() == data, e
        else:
            assert written.read_bytes() != data, e
            _parses(path, written.read_bytes())
    for key, value in before.items():
        if key in changed_ok:
            continue
        if out_rel is not None and not overlap and _inside(key, out_rel):
            continue  # an earlier file in a separate output folder may be replaced
        assert after.get(key) == value, f"{key} changed: {value} -> {after.get(key)}"
    for key in set(after) - set(before):
        assert out_rel is not None and _inside(key, out_rel) or key in changed_ok, (
            f"{key} was created outside the output folder")
