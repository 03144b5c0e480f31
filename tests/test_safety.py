"""Never lose a user's file (issue 22): ``-o`` overlapping the input, symbolic links inside the
output folder, files edited during an ``--in-place`` run, files that crash or stall the
parser, write errors, resource bounds, file modes, unreadable folders, undecodable file names,
and ``kill -9`` in the middle of an ``--in-place`` run.

The data-loss tests hash every file outside the intended outputs before and after the run.
The runs that could crash the converter's process go through a subprocess (``_cli``), so that
a crash fails the test instead of killing pytest."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torch2jax.cli import app

runner = CliRunner()
GOOD = "import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n"
USER = "# the user's own file, not part of the input\nimport torch\nx = torch.ones(3)\n"
# libcst's native parser overflows its stack (SIGSEGV) on these; the bracket pre-check does
# not see the first one (no brackets), so only the worker isolation keeps the run alive
SEGFAULT_UNARY = "import torch\nx = torch.ones(2)\ny = " + "-" * 30000 + "1\n"
DEEP_PARENS = "import torch\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\n"
# a few thousand chained + take libcst's Python visitors seconds (quadratic), then fail
SLOW_PLUS = "import torch\nx = torch.ones(2)\ny = " + " + ".join(["x"] * 4000) + "\n"
TEMP = re.compile(r"\.t2j-\d+-\w+\.tmp$")
CLI = [sys.executable, "-c",
       "import sys; from torch2jax.cli import app; sys.argv[0] = 'torch2jax'; app()"]


def _cli(*args: str | Path, cwd: Path | None = None, timeout: float = 240
         ) -> subprocess.CompletedProcess:
    """The command line in its own process: a crash is an exit status, not a dead pytest."""
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _hashes(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    """Every entry under ``root`` (symbolic links not followed): content hash, link target,
    mode; ``skip`` paths (the intended outputs) left out."""
    skipped = {os.path.abspath(p) for p in skip}
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        if os.path.abspath(dirpath) in skipped:
            dirnames[:] = []
            continue
        for name in sorted(filenames + dirnames):
            p = Path(dirpath) / name
            if os.path.abspath(p) in skipped:
                continue
            st = p.lstat()
            key = os.fsencode(p.relative_to(root)).hex()
            if p.is_symlink():
                out[key] = "link:" + os.readlink(p)
            elif p.is_file():
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest() + oct(st.st_mode)
            elif p.is_dir():
                out[key] = "dir" + oct(st.st_mode)
    return out


def _report(path: Path) -> dict[str, dict]:
    return {Path(f["path"]).name: f for f in json.loads(path.read_text())["files"]}


# --- 1. -o overlapping the input ---------------------------------------------------------------

def test_output_folder_containing_the_input_is_refused(tmp_path: Path) -> None:
    """``convert a/sub -o a`` replaced the user's ``a/model.py`` with the converted
    ``a/sub/model.py`` and exited 0."""
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "model.py").write_text(USER)
    (tmp_path / "a" / "sub" / "model.py").write_text(GOOD)
    before = _hashes(tmp_path)
    res = runner.invoke(app, ["convert", str(tmp_path / "a" / "sub"), "-o",
                              str(tmp_path / "a"), "-j", "1"])
    assert res.exit_code == 2, res.output
    assert "contains the input" in res.output
    assert _hashes(tmp_path) == before


def test_output_folder_inside_the_input_is_refused(tmp_path: Path) -> None:
    """``convert b -o b/sub`` overwrote the input ``b/sub/model.py`` with the conversion of
    ``b/model.py``."""
    (tmp_path / "b" / "sub").mkdir(parents=True)
    (tmp_path / "b" / "model.py").write_text(GOOD)
    (tmp_path / "b" / "sub" / "model.py").write_text(USER)
    before = _hashes(tmp_path)
    res = runner.invoke(app, ["convert", str(tmp_path / "b"), "-o", str(tmp_path / "b" / "sub"),
                              "-j", "1"])
    assert res.exit_code == 2, res.output
    assert "inside the input" in res.output and "--allow-overlap" in res.output
    assert _hashes(tmp_path) == before
    # with the flag it is still refused: b/sub/model.py would be replaced
    res = runner.invoke(app, ["convert", str(tmp_path / "b"), "-o", str(tmp_path / "b" / "sub"),
                              "--allow-overlap", "-j", "1"])
    assert res.exit_code == 2, res.output
    assert "would replace" in res.output and "model.py" in res.output
    assert _hashes(tmp_path) == before


def test_overlap_through_symbolic_links_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text(GOOD)
    (src / "m.py").write_text(USER)
    (tmp_path / "alias").symlink_to(src)  # -o alias/pkg is src/pkg by another name
    before = _hashes(tmp_path)
    for args in (["convert", str(src / "pkg"), "-o", str(tmp_path / "alias")],
                 ["convert", str(src), "-o", str(tmp_path / "alias")],
                 ["convert", str(tmp_path / "alias" / "pkg"), "-o", str(src)],
                 ["convert", str(src / "pkg" / "m.py"), "-o", str(src)]):
        res = runner.invoke(app, [*args, "-j", "1"])
        assert res.exit_code == 2, (args, res.output)
        assert _hashes(tmp_path) == before, args


def test_a_report_path_is_never_an_input(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text(GOOD)
    before = _hashes(tmp_path)
    for report in ("src/m.py", "src/new.py"):
        res = runner.invoke(app, ["convert", str(tmp_path / "src"), "--diff", "--report",
                                  str(tmp_path / report)])
        assert res.exit_code == 2 and "overwritten" in res.output, res.output
    assert _hashes(tmp_path) == before


def test_allow_overlap_writes_a_fresh_output_folder_inside_the_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text(GOOD)
    (src / "util.py").write_text("X = 1\n")
    out = src / "converted"
    before = _hashes(tmp_path)
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--allow-overlap", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert "jnp.sum(x, axis=1)" in (out / "pkg" / "m.py").read_text()
    assert (out / "util.py").read_text() == "X = 1\n"
    assert _hashes(tmp_path, skip=(out,)) == before
    # a second run would replace the first one's files, which now lie inside the input
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--allow-overlap", "-j", "1"])
    assert res.exit_code == 2 and "would replace" in res.output


# --- 2. a symbolic link inside OUT ---------------------------------------------------------------

def test_symbolic_links_inside_the_output_folder_are_not_followed_out(tmp_path: Path) -> None:
    src, out, elsewhere = tmp_path / "src", tmp_path / "out", tmp_path / "elsewhere"
    (src / "sub").mkdir(parents=True)
    (src / "deeper" / "x").mkdir(parents=True)
    (src / "sub" / "model.py").write_text(GOOD)
    (src / "deeper" / "x" / "model.py").write_text(GOOD)
    (src / "top.py").write_text(GOOD)
    (src / "user.py").write_text(GOOD)
    elsewhere.mkdir()
    (elsewhere / "model.py").write_text(USER)
    (elsewhere / "user.py").write_text(USER)
    out.mkdir()
    (out / "sub").symlink_to(elsewhere)  # out/sub/model.py is elsewhere/model.py
    (out / "deeper").symlink_to(elsewhere)  # out/deeper/x/ would be made inside elsewhere
    (out / "user.py").symlink_to(elsewhere / "user.py")
    report = tmp_path / "report.json"
    before = _hashes(tmp_path, skip=(out / "top.py", report))
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--report", str(report),
                              "-j", "1"])
    assert res.exit_code == 1, res.output
    assert _hashes(tmp_path, skip=(out / "top.py", report)) == before
    assert not (elsewhere / "x").exists()
    assert "jnp.sum" in (out / "top.py").read_text()
    files = json.loads(report.read_text())["files"]
    failed = sorted(Path(f["path"]).relative_to(src).as_posix() for f in files
                    if f["status"] == "failed")
    assert failed == ["deeper/x/model.py", "sub/model.py", "user.py"]
    for f in files:
        if f["status"] == "failed":
            (d,) = f["diagnostics"]
            assert d["rule"] == "output" and "outside the output folder" in d["message"]


# --- 3. --in-place and concurrent edits ----------------------------------------------------------

def test_write_atomic_refuses_to_replace_a_file_that_changed(tmp_path: Path) -> None:
    from torch2jax.discover import Changed, write_atomic

    p = tmp_path / "m.py"
    p.write_text(GOOD)
    digest = hashlib.sha256(GOOD.encode()).hexdigest()
    p.write_text(GOOD + "# edited by the user\n")
    with pytest.raises(Changed):
        write_atomic(p, "converted\n", expect=digest)
    assert p.read_text() == GOOD + "# edited by the user\n"
    p.unlink()
    with pytest.raises(Changed):
        write_atomic(p, "converted\n", expect=digest)
    assert not p.exists()
    assert os.listdir(tmp_path) == []


def _big_module(n: int) -> str:
    """A torch file that takes the converter a few seconds."""
    parts = ["import torch\nimport torch.nn as nn\n\n"]
    for i in range(n):
        parts.append(f"\nclass Block{i}(nn.Module):\n    def __init__(self, d):\n"
                     f"        super().__init__()\n        self.fc = nn.Linear(d, d)\n\n"
                     f"    def forward(self, x):\n        return torch.relu(self.fc(x)) * {i}\n\n")
    return "".join(parts)


def _wait_for_read(path: Path, atime: int, proc: subprocess.Popen, timeout: float = 120
                   ) -> bool:
    """Wait until ``path`` is read (its atime moves: set below its mtime and ctime, so that
    even a relatime mount records the next read); False if the run ends first."""
    deadline = time.monotonic() + timeout
    while path.stat().st_atime_ns == atime:
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def test_in_place_keeps_an_edit_made_while_the_file_was_converted(tmp_path: Path) -> None:
    """The user saves a file while ``--in-place`` converts it: the edit survives, and the file
    is reported. The test sees each read of the file through its access time: the first is
    the repository pass, the second the worker's; it edits the file right after the second."""
    for attempt in range(3):
        src = tmp_path / f"src{attempt}"
        src.mkdir()
        big = src / "big.py"
        big.write_text(_big_module(40))
        (src / "small.py").write_text(GOOD)
        mtime = big.stat().st_mtime_ns
        old = mtime - 10**12
        os.utime(big, ns=(old, mtime))
        report = tmp_path / f"report{attempt}.json"
        proc = subprocess.Popen([*CLI, "convert", str(src), "--in-place", "-j", "1",
                                 "--report", str(report)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        if not _wait_for_read(big, old, proc):
            proc.kill()
            proc.communicate()
            pytest.skip("this file system does not record reads (noatime)")
        os.utime(big, ns=(old, mtime))  # the repository pass read it: watch for the next read
        if _wait_for_read(big, old, proc):
            with open(big, "a") as fh:
                fh.write("# saved by the user's editor\n")
            break
        proc.communicate()  # the worker read it before the watch was set again: once more
    else:
        pytest.fail("the worker's read of the file was never seen")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err
    assert big.read_text().endswith("# saved by the user's editor\n")
    assert "nnx" not in big.read_text()  # the edited original, not converted
    assert "jnp.sum" in (src / "small.py").read_text()
    files = _report(report)
    (d,) = files["big.py"]["diagnostics"]
    assert files["big.py"]["status"] == "failed" and d["rule"] == "changed"
    assert "changed while it was converted" in d["message"]
    assert not [p for p in src.iterdir() if TEMP.search(p.name)]


# --- 4. one file must not stop the run -----------------------------------------------------------

@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_that_crashes_the_parser_is_reported_and_the_run_goes_on(tmp_path: Path,
                                                                        jobs: str) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "a_good.py").write_text(GOOD)
    (src / "crash.py").write_text(SEGFAULT_UNARY)
    (src / "deep.py").write_text(DEEP_PARENS)
    (src / "z_good.py").write_text(GOOD.replace("sum", "mean"))
    report = tmp_path / "report.json"
    res = _cli("convert", src, "-o", out, "-j", jobs, "--report", report)
    assert res.returncode == 1, res.stderr
    files = _report(report)
    assert files["a_good.py"]["status"] == files["z_good.py"]["status"] == "converted"
    assert "jnp.sum" in (out / "a_good.py").read_text()
    assert "jnp.mean" in (out / "z_good.py").read_text()
    (crash,) = files["crash.py"]["diagnostics"]
    assert files["crash.py"]["status"] == "failed" and crash["rule"] == "crash"
    assert "SIGSEGV" in crash["message"]
    (deep,) = files["deep.py"]["diagnostics"]
    assert files["deep.py"]["status"] == "failed" and deep["rule"] == "too-deep"
    assert "3000 nested brackets" in deep["message"]
    assert not (out / "crash.py").exists() and not (out / "deep.py").exists()
    assert "crash.py" in res.stderr and "deep.py" in res.stderr


def test_write_errors_are_per_file_diagnostics(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    for d in ("a", "b"):
        (src / d).mkdir(parents=True)
        (src / d / "m.py").write_text(GOOD)
        (src / d / "plain.py").write_text("X = 1\n")
    out.mkdir()
    (out / "a").write_text("a file where the folder a/ should go\n")
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--report", str(report),
                              "-j", "1"])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    data = json.loads(report.read_text())["files"]
    status = {Path(f["path"]).relative_to(src).as_posix(): f for f in data}
    for name in ("a/m.py", "a/plain.py"):
        assert status[name]["status"] == "failed"
        (d,) = status[name]["diagnostics"]
        assert d["rule"] == "write" and "not written" in d["message"]
    assert "jnp.sum" in (out / "b" / "m.py").read_text()
    assert (out / "b" / "plain.py").read_text() == "X = 1\n"
    assert (out / "a").read_text() == "a file where the folder a/ should go\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_permission_errors_while_writing_are_per_file_diagnostics(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    for d in ("a", "b"):
        (src / d).mkdir(parents=True)
        (src / d / "m.py").write_text(GOOD)
    (out / "a").mkdir(parents=True)
    (out / "a").chmod(0o500)
    try:
        res = runner.invoke(app, ["convert", str(src), "-o", str(out), "-j", "1"])
    finally:
        (out / "a").chmod(0o700)
    assert res.exit_code == 1 and "[write]" in res.output
    assert "jnp.sum" in (out / "b" / "m.py").read_text()


# --- 5. bounds: size before the first pass, time per file ----------------------------------------

def test_a_huge_file_is_not_parsed_by_the_first_pass(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "huge.py").write_bytes(b"import torch\n" + b"x = torch.ones(2)\n" * 3_000_000)
    (src / "good.py").write_text(GOOD)
    assert (src / "huge.py").stat().st_size > 50_000_000
    parsed: list[int] = []
    real_parse = ast.parse

    def parse(source, *args, **kwargs):
        parsed.append(len(source))
        if len(source) > 4_000_000:
            raise AssertionError("the first pass parses a 50 MB file")
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", parse)
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "-j", "1",
                              "--report", str(report)])
    assert res.exit_code == 1, res.output
    assert parsed and max(parsed) < 4_000_000
    files = _report(report)
    assert files["huge.py"]["diagnostics"][0]["rule"] == "too-large"
    assert files["good.py"]["status"] == "converted"


def test_a_file_that_takes_too_long_is_stopped_and_reported(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "a_good.py").write_text(GOOD)
    (src / "slow.py").write_text(SLOW_PLUS)
    (src / "z_good.py").write_text(GOOD)
    report = tmp_path / "report.json"
    start = time.monotonic()
    res = _cli("convert", src, "-o", out, "-j", "1", "--timeout", "1", "--report", report)
    assert time.monotonic() - start < 30
    assert res.returncode == 1, res.stderr
    files = _report(report)
    (d,) = files["slow.py"]["diagnostics"]
    assert files["slow.py"]["status"] == "failed" and d["rule"] == "timeout"
    assert "more than 1 s of CPU time" in d["message"]
    assert files["a_good.py"]["status"] == files["z_good.py"]["status"] == "converted"
    assert (out / "z_good.py").exists() and not (out / "slow.py").exists()


def test_a_worker_that_hangs_without_using_cpu_is_stopped(tmp_path: Path) -> None:
    """The CPU limit cannot see a worker that waits (a hung file system): the wall-clock
    limit, ten times the CPU limit, stops it. A FIFO stands in (opening it blocks)."""
    from torch2jax.engine import Options, convert_iter

    fifo = tmp_path / "hang.py"
    os.mkfifo(fifo)
    good = tmp_path / "good.py"
    good.write_text(GOOD)
    tasks = [(str(fifo), frozenset(), frozenset()), (str(good), frozenset(), frozenset())]
    start = time.monotonic()
    results = dict(convert_iter(tasks, Options(timeout=0.5), jobs=1))
    assert time.monotonic() - start < 60
    (d,) = results[0].diagnostics
    assert results[0].status == "failed" and d.rule == "timeout" and "more than 5 s" in d.message
    assert results[1].status == "converted" and "jnp.sum" in results[1].code


# --- 6. smaller defects ------------------------------------------------------------------------

def test_written_files_keep_the_source_mode(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    (src / "run.py").write_text("#!/usr/bin/env python\n" + GOOD)
    (src / "run.py").chmod(0o755)
    (src / "lib.py").write_text("X = 1\n")
    (src / "lib.py").chmod(0o640)
    (src / "private.py").write_text(GOOD)
    (src / "private.py").chmod(0o600)
    (src / "shared.py").write_text(GOOD)
    (src / "shared.py").chmod(0o664)
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "-j", "1"])
    assert res.exit_code == 0, res.output
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == {"run.py": 0o755, "lib.py": 0o640, "private.py": 0o600, "shared.py": 0o664}
    assert "jnp.sum" in (out / "run.py").read_text()
    res = runner.invoke(app, ["convert", str(src), "--in-place", "-j", "1"])
    assert res.exit_code == 0, res.output
    modes = {p.name: p.stat().st_mode & 0o777 for p in src.iterdir()}
    assert modes == {"run.py": 0o755, "lib.py": 0o640, "private.py": 0o600, "shared.py": 0o664}
    assert "jnp.sum" in (src / "shared.py").read_text()


def test_an_unreadable_folder_is_reported(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    (src / "locked" / "m.py").write_text(GOOD)
    (src / "good.py").write_text(GOOD)
    locked = os.path.abspath(src / "locked")
    if os.geteuid() == 0:  # root reads any folder: make this one fail as it would for a user
        real = os.scandir

        def scandir(path="."):
            if os.path.abspath(path) == locked:
                raise PermissionError(13, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(os, "scandir", scandir)
    (src / "locked").chmod(0)
    try:
        report = tmp_path / "report.json"
        res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "-j", "1",
                                  "--report", str(report)])
    finally:
        (src / "locked").chmod(0o755)
    assert res.exit_code == 1, res.output
    files = _report(report)
    (d,) = files["locked"]["diagnostics"]
    assert files["locked"]["status"] == "failed"
    assert d["severity"] == "error" and "cannot be read" in d["message"]
    assert files["good.py"]["status"] == "converted"


def test_a_report_names_files_whose_names_are_not_utf8(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    name = os.fsdecode(b"caf\xe9.py")
    (src / name).write_text(GOOD)
    report = tmp_path / "report.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out"), "-j", "1",
                              "--report", str(report)])
    assert res.exit_code == 0, res.output
    (entry,) = json.loads(report.read_text(encoding="utf-8"))["files"]
    assert os.fsencode(entry["path"]).endswith(b"/caf\xe9.py")  # round-trips to the bytes
    assert "\\udce9" in report.read_text(encoding="utf-8")
    assert "jnp.sum" in (tmp_path / "out" / name).read_text()
    res = runner.invoke(app, ["convert", str(src / name), "--diff"])
    assert res.exit_code == 0 and "caf\\xe9.py" in res.output


TRAIN_SCRIPT = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.bn = nn.BatchNorm1d(d)

    def forward(self, x):
        return self.bn(self.fc(x))


torch.manual_seed(0)
model = Net(3)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.ones(8, 3), torch.zeros(8, 3)
x[::2] = 2.0
for step in range(20):
    loss = ((model(x) - y) ** 2).mean()
    if step == 0:
        print(f"first={loss.item():.6f}")
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"last={loss.item():.6f}")
"""


@pytest.mark.slow
def test_equinox_converts_a_small_training_script(tmp_path: Path) -> None:
    """``--target equinox`` raised an internal error (IndexError in the equinox training
    translation) on this ordinary script; it converts now, and the result trains."""
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    res = _cli("convert", tmp_path / "train.py", "--target", "equinox", "-o", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "internal" not in res.stderr
    results = {}
    for name, script in (("torch", tmp_path / "train.py"), ("equinox", tmp_path / "out" /
                                                            "train.py")):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=300, check=False, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        values = dict(re.findall(r"^(first|last)=([0-9.]+)$", done.stdout, re.MULTILINE))
        results[name] = {k: float(v) for k, v in values.items()}
    # both start from a loss of about 1 (BatchNorm normalises the layer's output whatever
    # its initial weights) and fall
    for r in results.values():
        assert r["first"] == pytest.approx(1.0, abs=0.01), results
        assert r["last"] < 0.5 * r["first"], results


# --- kill -9 during --in-place -------------------------------------------------------------------

def _tiny(i: int) -> str:
    return f"import torch\nx{i} = torch.ones({i % 7 + 1})\n"


def _kill_after_writes(proc: subprocess.Popen, work: Path, originals: dict[Path, bytes],
                      target: int, timeout: float = 300) -> None:
    """``kill -9`` the run (and its workers) as soon as ``target`` files are rewritten: a
    random moment among the writes, wherever they fall in the run. Each rename into a folder
    changes that folder's mtime, so only changed folders are read again."""
    folders = sorted({p.parent for p in (work / k for k in originals)})
    seen = {d: d.stat().st_mtime_ns for d in folders}
    done: dict[Path, int] = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        for d in folders:
            mtime = d.stat().st_mtime_ns
            if mtime != seen[d]:
                seen[d] = mtime
                done[d] = sum(1 for p in d.glob("*.py")
                              if p.read_bytes() != originals[p.relative_to(work)])
        if sum(done.values()) >= target:
            break
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the main process and its workers
    proc.wait()


@pytest.mark.slow
def test_kill_9_during_in_place_leaves_every_file_whole(tmp_path: Path) -> None:
    """``kill -9`` at random points of an ``--in-place`` run over 200 files (10 trials): every
    file is its original or its full conversion. No temporary file is left, except that a
    kill in the instant (two system calls) between naming the written file and renaming it
    over the original leaves that one file, ``.NAME.t2j-PID-RANDOM.tmp``; the next run over
    the folder finishes the job and removes it (see also
    test_a_run_removes_the_temporary_files_killed_runs_left)."""
    template = tmp_path / "template"
    for i in range(200):
        (template / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (template / f"d{i % 10}" / f"m{i:03}.py").write_text(_tiny(i))
    originals = {p.relative_to(template): p.read_bytes() for p in template.rglob("*.py")}
    done = tmp_path / "done"
    shutil.copytree(template, done)
    res = _cli("convert", done, "--in-place", "-j", "2")
    assert res.returncode == 0, res.stderr
    converted = {p.relative_to(done): p.read_bytes() for p in done.rglob("*.py")}
    assert all(converted[k] != originals[k] for k in originals)
    rng = random.Random(22)
    seen = {"original": 0, "converted": 0}
    again = [tmp_path / "t9"]
    for trial in range(10):
        work = tmp_path / f"t{trial}"
        shutil.copytree(template, work)
        proc = subprocess.Popen([*CLI, "convert", str(work), "--in-place", "-j", "2"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        _kill_after_writes(proc, work, originals, rng.randint(1, 199))
        names = [p for p in work.rglob("*") if p.is_file()]
        leftovers = [p.name for p in names if not p.name.endswith(".py")]
        assert len(leftovers) <= 1 and all(TEMP.search(n) for n in leftovers), leftovers
        if leftovers and work not in again:
            again.append(work)
        names = [p for p in names if p.name.endswith(".py")]
        assert len(names) == 200
        for p in names:
            data = p.read_bytes()
            key = p.relative_to(work)
            assert data in (originals[key], converted[key]), key
            seen["original" if data == originals[key] else "converted"] += 1
    assert seen["original"] and seen["converted"], seen  # the kills hit the middle of runs
    # the next run over a killed tree finishes the job and leaves nothing else
    for work in again:
        res = _cli("convert", work, "--in-place", "-j", "2")
        assert res.returncode == 0, res.stderr
        assert {p.relative_to(work): p.read_bytes()
                for p in work.rglob("*") if p.is_file()} == converted


def test_a_run_removes_the_temporary_files_killed_runs_left(tmp_path: Path) -> None:
    """What a ``kill -9`` between naming a temporary file and renaming it leaves: the next run
    writing to that folder removes it, but not one of a live process, nor other files."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.py").write_text(GOOD)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = src / f".m.py.t2j-{int(dead.stdout)}-0a1b2c3d.tmp"
    stale.write_text("half of a conversion")
    live = src / f".m.py.t2j-{os.getpid()}-0a1b2c3d.tmp"  # this process runs: not removed
    live.write_text("another run's file")
    user = src / ".m.py.t2j-notes.tmp"
    user.write_text("a user's file that only looks like ours")
    res = runner.invoke(app, ["convert", str(src), "--in-place", "-j", "1"])
    assert res.exit_code == 0, res.output
    assert not stale.exists() and live.exists() and user.exists()
    assert "jnp.sum" in (src / "m.py").read_text()
