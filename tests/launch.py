"""How the tests launch the torch training fixtures.

``fixtures/training/ddp_amp_dataloader.py`` is a torch.distributed script: it expects the
variables ``torchrun`` sets. The tests run every fixture as one process with a world of one
(RANK=0, WORLD_SIZE=1) and a free port for the gloo rendezvous; scripts that do not use
torch.distributed ignore them.

A script is run once per test session and content (``session_run``): four test files compare
with a fixture's torch run (tests/test_training_fixtures.py and the three targets' accuracy
tests), two with the NNX conversion's (tests/test_training_converted.py and
tests/test_program_speed.py), and under ``pytest -n 2`` their workers share the one run
through a folder of the session's base temp.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

FINAL = re.compile(r"^final_accuracy=(?P<value>[0-9]*\.?[0-9]+)$", re.MULTILINE)
# what JAX_LOG_COMPILES=1 logs for every compile: the function and its argument shapes
COMPILING = re.compile(r"Compiling jit\((?P<name>\w+)\) with global shapes and types "
                       r"(?P<shapes>.*?)\. Argument mapping")


def jitted_functions(code: str) -> set[str]:
    """The names of the functions a program compiles: decorated with a ``jit``
    (``@jax.jit``, ``@nnx.jit(...)``, ``@partial(jax.jit, ...)``, ``@eqx.filter_jit``)."""
    return {n.name for n in ast.walk(ast.parse(code))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any("jit" in ast.unparse(d) for d in n.decorator_list)}


def recompiles(log: str, names: set[str]) -> dict[tuple[str, str], int]:
    """The compiles of the functions ``names`` that ``log`` (a run's stderr with
    JAX_LOG_COMPILES=1) shows more than once for the same argument shapes: a step defined
    anew per epoch, a static argument that changes, a retrace per call. Empty when every
    function compiled once per distinct input shape."""
    seen: dict[tuple[str, str], int] = {}
    for hit in COMPILING.finditer(log):
        if hit["name"] in names:
            key = (hit["name"], hit["shapes"])
            seen[key] = seen.get(key, 0) + 1
    return {(name, shapes[:200]): n for (name, shapes), n in seen.items() if n > 1}


def compiled_while(fn):
    """fn()'s value and jax's "Compiling ..." log messages emitted while it ran (the
    in-process counterpart of recompiles())."""
    import logging

    import jax

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles():
            value = fn()
    finally:
        logger.removeHandler(handler)
    return value, [r.getMessage() for r in records if "Compiling" in r.getMessage()]


def program_functions(*paths: Path) -> set[str]:
    """The jitted functions of the Python files ``paths`` (files or folders)."""
    names: set[str] = set()
    for path in paths:
        for f in ([path] if path.is_file() else sorted(path.rglob("*.py"))):
            names |= jitted_functions(f.read_text())
    return names


def compile_once_env(env: dict[str, str] | None = None) -> dict[str, str]:
    return {**(os.environ if env is None else env), "JAX_LOG_COMPILES": "1"}


def assert_compiles_once(done: subprocess.CompletedProcess, *paths: Path,
                         known: dict[str, int] | None = None) -> None:
    """The run ``done`` (with ``compile_once_env``) of the program in ``paths`` compiled each
    of its jitted functions at most once per distinct input shape (issue 20). ``known``: the
    functions known to compile ``n`` times for one shape, each with its reason at the caller;
    the run must show exactly those."""
    again = recompiles(done.stdout + done.stderr, program_functions(*paths))
    assert {name: n for (name, _), n in again.items()} == (known or {}), (
        f"compiled more than once for the same shapes: {again}")


def torchrun_env() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def final_accuracy(script: Path, cwd: Path, timeout: float = 300,
                   known_recompiles: dict[str, int] | None = None) -> float:
    """Run ``script`` as a user would (``python script.py`` in ``cwd``, as a world of one for
    torch.distributed) and return the one ``final_accuracy=`` value it prints."""
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env=compile_once_env(torchrun_env()))
    assert done.returncode == 0, f"{script.name} failed:\n{done.stderr[-3000:]}"
    assert_compiles_once(done, script, known=known_recompiles)
    found = FINAL.findall(done.stdout)
    match = FINAL.search(done.stdout)
    assert len(found) == 1 and match is not None, done.stdout[-2000:]
    return float(match["value"])


def shared_dir(tmp_path_factory) -> Path:
    """A folder of this test session that every xdist worker sees: the controller's base temp
    (a worker's is a folder in it); without xdist, the process's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def session_record(key: str, tmp_path_factory, make) -> dict:
    """``make(cwd)``'s record (a dict of JSON values) once per test session and ``key``: the
    first caller makes it in an empty folder ``cwd``, under a lock, and writes it down; the
    others (in this process or another xdist worker) wait for the record and read it. A
    caller whose ``make`` raised wrote nothing: the next one makes it again."""
    folder = shared_dir(tmp_path_factory) / "session-records"
    folder.mkdir(exist_ok=True)
    record = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            cwd = folder / key
            cwd.mkdir(exist_ok=True)
            partial = folder / f"{key}.part"
            partial.write_text(json.dumps(make(cwd)))
            partial.replace(record)
    return json.loads(record.read_text())


def session_run(script: Path, tmp_path_factory, timeout: float = 300) -> dict:
    """Run ``script`` as a user would (``python script.py`` from an empty folder, as a world
    of one, JAX_LOG_COMPILES=1) once per test session, name and content of the script
    (session_record): its exit status, output and the files it wrote."""
    def make(cwd: Path) -> dict:
        done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, check=False,
                              env=compile_once_env(torchrun_env()))
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "wrote": sorted(p.name for p in cwd.iterdir())}

    key = f"{script.stem}-{hashlib.sha256(script.read_bytes()).hexdigest()[:16]}"
    return session_record(key, tmp_path_factory, make)


def session_final_accuracy(script: Path, tmp_path_factory, timeout: float = 300) -> float:
    """``final_accuracy`` of ``script`` run once per session (session_run): it exits 0,
    compiles each jitted function once per input shape, writes no files and prints one
    ``final_accuracy=`` value."""
    run = session_run(script, tmp_path_factory, timeout)
    assert run["returncode"] == 0, f"{script.name} failed:\n{run['stderr'][-3000:]}"
    assert run["wrote"] == [], f"{script.name} wrote files: {run['wrote']}"
    done = subprocess.CompletedProcess([], 0, run["stdout"], run["stderr"])
    assert_compiles_once(done, script)
    found = FINAL.findall(run["stdout"])
    match = FINAL.search(run["stdout"])
    assert len(found) == 1 and match is not None, run["stdout"][-2000:]
    return float(match["value"])
