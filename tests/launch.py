"""How the tests launch the torch training fixtures.

``fixtures/training/ddp_amp_dataloader.py`` is a torch.distributed script: it expects the
variables ``torchrun`` sets. The tests run every fixture as one process with a world of one
(RANK=0, WORLD_SIZE=1) and a free port for the gloo rendezvous; scripts that do not use
torch.distributed ignore them.

A torch original is run once per test session (``torch_run``): four test files compare with
it (tests/test_training_fixtures.py and the three targets' accuracy tests), and under
``pytest -n 2`` their workers share the one run through a folder of the session's base temp.
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


def torch_run(script: Path, tmp_path_factory, timeout: float = 300) -> dict:
    """Run the torch script ``script`` as a user would (``python script.py`` from an empty
    folder, as a world of one) once per test session and content of the script: the first
    caller runs it, under a lock, and records its exit status, output and the files it wrote;
    the others (in this process or another worker) wait for the record and read it."""
    key = f"{script.stem}-{hashlib.sha256(script.read_bytes()).hexdigest()[:16]}"
    folder = shared_dir(tmp_path_factory) / "torch-runs"
    folder.mkdir(exist_ok=True)
    record = folder / f"{key}.json"
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not record.exists():
            cwd = folder / key
            cwd.mkdir(exist_ok=True)
            done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                                  text=True, timeout=timeout, check=False,
                                  env=compile_once_env(torchrun_env()))
            run = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                   "wrote": sorted(p.name for p in cwd.iterdir())}
            partial = folder / f"{key}.part"
            partial.write_text(json.dumps(run))
            partial.replace(record)
    return json.loads(record.read_text())


def torch_final_accuracy(script: Path, tmp_path_factory, timeout: float = 300) -> float:
    """``final_accuracy`` of the torch original ``script``, run once per session (torch_run):
    it exits 0, writes no files and prints one ``final_accuracy=`` value."""
    run = torch_run(script, tmp_path_factory, timeout)
    assert run["returncode"] == 0, f"{script.name} failed:\n{run['stderr'][-3000:]}"
    assert run["wrote"] == [], f"{script.name} wrote files: {run['wrote']}"
    done = subprocess.CompletedProcess([], 0, run["stdout"], run["stderr"])
    assert_compiles_once(done, script)
    found = FINAL.findall(run["stdout"])
    match = FINAL.search(run["stdout"])
    assert len(found) == 1 and match is not None, run["stdout"][-2000:]
    return float(match["value"])
