"""Converting many files: the repository first pass, worker processes, a progress bar, writing.

The CLI's ``convert`` and ``check`` run through :func:`run`:

1. check the output folder against the inputs (:func:`check_output`): an ``-o`` that is,
   contains or lies inside an input is a usage error before anything is read or written;
2. find the files (:mod:`torch2jax.discover`: ``.gitignore``, ``exclude``, the output folder)
   and, with ``-o``, each file's destination, resolved: one that leaves the output folder
   (through a symbolic link inside it) is refused;
3. a first pass over the files (:mod:`torch2jax.repo`) tells each file which of the names it
   imports are module classes of the repository; files over the size limit are not parsed;
4. the files are converted in ``jobs`` worker processes (:class:`_Workers`, at least one):
   a worker that crashes (libcst's native parser overflows its stack on pathological
   nesting) or runs past the per-file time limit is replaced, and only its file is reported;
5. the main process writes each result as it arrives, through
   :func:`torch2jax.discover.write_atomic`: into the mirror tree (``-o``), in place (only the
   files that change, and only if a file still holds what was read: an edit made during the
   run is kept and the file reported), or nothing (``--diff``, ``--check``). A write error is
   that file's diagnostic. The report lists the files in the order they were found, so it
   does not depend on the number of workers.

A file that cannot be read, decoded or parsed, is too large, too deeply nested, crashes or
stalls the converter gets an ``error`` diagnostic naming it and is not written; every other
file is still converted.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from torch2jax.discover import (
    Changed,
    Exclude,
    ReadError,
    copy_atomic,
    digest,
    find_files,
    read_source_file,
    remove_stale_temps,
    write_atomic,
)
from torch2jax.report import Diagnostic, FileReport, RunReport, display

NOTEBOOK_SUFFIX = ".ipynb"  # Jupyter notebooks: torch2jax/notebook.py

# a file above this size that mentions torch is reported, not converted (libcst would take
# minutes and gigabytes on a multi-megabyte generated file); one that does not is copied
MAX_BYTES = 4_000_000
# Python refuses more than 200 nested brackets ("too many nested parentheses"); libcst's
# native parser crashes on a few thousand: such a file is refused before it is parsed
MAX_BRACKETS = 200
# the default time limit per file, in CPU seconds: TIMEOUT_BASE plus one per TIMEOUT_BYTES
# (the fixtures convert at about 7 KB per CPU-second: a margin of 3 and more). It is
# CPU time, so that a busy machine does not stop files; a worker that uses no CPU and does
# not finish (a hung file system) is stopped after WALL_FACTOR times the limit.
TIMEOUT_BASE = 60.0
TIMEOUT_BYTES = 2048
WALL_FACTOR = 10


def notebook_limit(max_bytes: int) -> int:
    """The size limit of a notebook file: its outputs (images) may be large; its code is held
    to ``max_bytes`` (torch2jax/notebook.py)."""
    return 16 * max_bytes


class UsageError(Exception):
    """A request that must not run (the CLI exits 2); nothing was read or written."""


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Options:
    target: str = "nnx"
    shard: str = "data"  # data parallelism: "data" (batches) or "params" (also the state)
    init: str = "jax"  # parameter initialisation: the JAX library's, or "torch"'s defaults
    rule_dirs: tuple[Path, ...] = ()
    ignore: tuple[str, ...] = ()
    max_bytes: int | None = None  # None: MAX_BYTES
    timeout: float | None = None  # CPU seconds per file; None: TIMEOUT_BASE + size / TIMEOUT_BYTES
    # `check` without --explain: a file that imports torch is reported as such without being
    # converted (see _check_text); one that does not is read for TODO markers only
    check_only: bool = False

    def resolved(self) -> Options:
        """With the module defaults filled in (read in the main process, so that workers
        started by forkserver see the same values)."""
        return replace(self, max_bytes=MAX_BYTES if self.max_bytes is None else self.max_bytes)

    def time_limit(self, size: int) -> float:
        if self.timeout is not None:
            return self.timeout
        return TIMEOUT_BASE + size / TIMEOUT_BYTES


@dataclass
class Outcome:
    """What converting one file gave (sent back from a worker)."""

    path: str
    status: str  # converted | unchanged | failed
    text: str | None = None  # what was read
    encoding: str = "utf-8"
    code: str | None = None  # what to write (converted) or the text again (unchanged)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    digest: str | None = None  # of the bytes read: --in-place writes only over those
    mode: int | None = None  # the source's permission bits, given to what is written
    data: bytes | None = None  # the bytes read, copied as they are when unchanged
    # a notebook: (label, old source, new source) of each changed cell, for --diff
    cells: list[tuple[str, str, str]] | None = None
    files: dict[str, str] = field(default_factory=dict)  # generated beside it (relative path)


_WORKER: dict = {}


def _init_worker(options: Options) -> None:
    from torch2jax.config import load_user_rules
    from torch2jax.ruleset import load_rules

    _WORKER["options"] = options.resolved()
    _WORKER["rules"] = load_user_rules(options.rule_dirs) if options.rule_dirs else load_rules()


def convert_file(path: str, known: frozenset[str] = frozenset(),
                 public: frozenset[str] = frozenset()) -> Outcome:
    """Read and convert one file; never raises (a failure is an ``error`` diagnostic).
    A notebook (``.ipynb``) goes through :mod:`torch2jax.notebook`."""
    if path.endswith(NOTEBOOK_SUFFIX):
        return _convert_notebook(path, known, public)
    options: Options = _WORKER["options"]
    max_bytes = options.max_bytes if options.max_bytes is not None else MAX_BYTES

    def failed(rule: str, message: str, line: int = 1, col: int = 1) -> Outcome:
        return Outcome(path, "failed", diagnostics=[
            Diagnostic(path, line, col, rule, "error", message)])

    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            if _mentions_torch(path):
                return failed("too-large", f"{size:,} bytes, more than the {max_bytes:,} "
                                           "converted per file; not converted")
            return Outcome(path, "unchanged")  # copied as it is, never read whole here
        src = read_source_file(Path(path))
    except ReadError as exc:
        return failed("read", str(exc))
    except OSError as exc:
        return failed("read", f"cannot be read: {exc.strerror or exc}")
    text = src.text
    if options.check_only:
        quick = _check_text(text, path)
        if quick is not None:
            status, diagnostics = quick
            code = text if status == "unchanged" else None
            return Outcome(path, status, text, src.encoding, code, diagnostics, src.digest,
                           src.mode, src.data if status == "unchanged" else None)
    status, code, diagnostics, files = convert_text(text, path, known, public)
    if status == "failed":
        return Outcome(path, "failed", diagnostics=diagnostics)
    if status == "unchanged":
        return Outcome(path, "unchanged", text, src.encoding, text, diagnostics, src.digest,
                       src.mode, src.data)
    return Outcome(path, "converted", text, src.encoding, code, diagnostics, src.digest,
                   src.mode, files=files)


def _convert_notebook(path: str, known: frozenset[str] = frozenset(),
                          public: frozenset[str] = frozenset()):
    """Read and convert one notebook (in a worker); never raises: a failure is an ``error``
    diagnostic. The notebook's code cells are converted as the one module they make
    (:mod:`torch2jax.notebook` joins and splits them)."""
    from torch2jax import notebook as nb_io

    options = _WORKER["options"]
    max_bytes = options.max_bytes if options.max_bytes is not None else MAX_BYTES

    def failed(rule: str, message: str, diagnostics: list[Diagnostic] | None = None) -> Outcome:
        return Outcome(path, "failed", diagnostics=diagnostics or [
            Diagnostic(path, 1, 1, rule, "error", message)])

    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            limit = notebook_limit(max_bytes)
            if st.st_size > limit:
                return failed("too-large", f"{st.st_size:,} bytes, more than the {limit:,} "
                                           "read per notebook; not converted")
            data = fh.read()
    except OSError as exc:
        return failed("read", f"cannot be read: {exc.strerror or exc}")
    mode = st.st_mode & 0o777

    def unchanged(diagnostics: list[Diagnostic]) -> Outcome:
        return Outcome(path, "unchanged", None, "utf-8", None, diagnostics, digest(data), mode,
                       data)

    if b"torch" not in data:  # no torch code, no TODO(torch2jax) marker: nothing to read
        return unchanged([])
    try:
        nb, major, text = nb_io.read_notebook(data)
    except nb_io.NotebookError as exc:
        return failed("notebook", f"{exc}; not converted")
    if not nb_io.is_python(nb):
        return unchanged([])
    joined = nb_io.join(nb_io.code_cells(nb))
    size = len(joined.text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return failed("too-large", f"{size:,} bytes of code, more than the {max_bytes:,} "
                                   "converted per file; not converted")
    status, code, diagnostics, files = convert_text(joined.text, path, known, public)
    # (the diagnostics of generated files, package_models.py, are on their own lines)
    diagnostics = [joined.map(d) if d.file == path else d for d in diagnostics]
    if status == "failed":
        return failed("", "", diagnostics)
    magic = nb_io.magic_diagnostics(joined, path)

    def ordered(ds: list[Diagnostic]) -> list[Diagnostic]:
        return sorted(ds, key=lambda d: (d.cell or 0, d.line, d.column))

    if status == "unchanged":
        return unchanged(ordered(diagnostics + magic))
    try:
        sources = nb_io.split(joined, code)
    except nb_io.NotebookError as exc:
        return failed("notebook", f"{exc}; not converted (please report it)")
    new = copy.deepcopy(nb)
    changes: list[tuple[str, str, str]] = []
    for part, source in zip(joined.parts, sources, strict=True):
        if source == part.source:
            continue
        cell = new.cells[part.cell]
        cell.source = source
        if "outputs" in cell:
            cell.outputs = []
        if "execution_count" in cell:
            cell.execution_count = None
        changes.append((f"{path} [cell {part.cell + 1}]", _with_newline(part.source),
                        _with_newline(source)))
    if not changes:
        return unchanged(ordered(diagnostics + magic))
    try:
        out = nb_io.write_notebook(new, major, text)
    except Exception as exc:  # noqa: BLE001 - nbformat's writer: this notebook, not the run
        return failed("notebook", f"the converted notebook could not be written: {exc!r}; "
                                  "not converted")
    return Outcome(path, "converted", text, "utf-8", out, ordered(diagnostics + magic),
                   digest(data), mode, cells=changes, files=files)


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") or not text else text + "\n"


def _check_text(text: str, path: str) -> tuple[str, list[Diagnostic]] | None:
    """``check``'s answer without converting: ``("converted", [])`` for a file that imports
    torch or torchvision at its top level (what :func:`torch2jax.convert.uses_torch` reads: the
    conversion would rewrite it), ``("unchanged", its open TODO markers)`` for one that does
    not. None where only the conversion can tell: the file does not parse (the conversion
    reports where), is nested too deeply, or imports torch and still holds TODO(torch2jax)
    markers (an earlier conversion that kept a torch line: converting again may change
    nothing). Python's own parser reads the imports: a thousand lines in about 10 ms, and
    neither libcst nor the rewriter is loaded."""
    import ast

    depth = _bracket_depth(text)
    if depth is not None and depth[0] > MAX_BRACKETS:
        return None
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    marked = "TODO(torch2jax)" in text
    if not _imports_torch(tree):
        return "unchanged", _open_todos(text, path) if marked else []
    if marked:
        return None
    return "converted", []


def _imports_torch(tree) -> bool:
    """Whether a module's top-level statements import torch or torchvision: what
    :func:`torch2jax.convert.uses_torch` reads, on Python's tree instead of libcst's."""
    import ast

    from torch2jax.analysis.torch_api import TORCH_PACKAGES

    for node in tree.body:
        if isinstance(node, ast.Import) and any(
                a.name.split(".")[0] in TORCH_PACKAGES for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.split(".")[0] in TORCH_PACKAGES):
            return True
    return False


def convert_text(text: str, path: str, known: frozenset[str] = frozenset(),
                 public: frozenset[str] = frozenset()
                 ) -> tuple[str, str, list[Diagnostic], dict[str, str]]:
    """``(status, code, diagnostics, generated files)`` of one module's source (in a worker:
    the options and rules of :func:`_init_worker`); status ``converted``, ``unchanged`` (code
    is ``text``) or ``failed``. Never raises. The files (package_models.py) go beside the
    converted one, by relative path."""
    from torch2jax.convert import ParseError, convert_source
    from torch2jax.suppress import suppress

    options: Options = _WORKER["options"]

    def failed(rule: str, message: str, line: int = 1, col: int = 1
               ) -> tuple[str, str, list[Diagnostic], dict[str, str]]:
        return "failed", text, [Diagnostic(path, line, col, rule, "error", message)], {}

    depth = _bracket_depth(text)
    if depth is not None and depth[0] > MAX_BRACKETS:
        return failed("too-deep", f"{depth[0]} nested brackets (Python allows {MAX_BRACKETS}); "
                                  "not parsed", depth[1])
    try:
        result = convert_source(text, path=path, target=options.target, rules=_WORKER["rules"],
                                known_modules=set(known), shard=options.shard,
                                init=options.init, public=public)
    except ParseError as exc:
        return failed("parse", *_parse_message(str(exc), path))
    except RecursionError:
        return failed("too-deep", "nested too deeply to be parsed and rewritten")
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop the other files
        return failed("internal", f"internal error while converting: {exc!r}{_where(exc)}; "
                                  "please report it")
    result = suppress(result, text, options.ignore)
    changed = result.uses_torch and result.code != text
    diagnostics = list(result.diagnostics)
    if not changed:
        if "TODO(torch2jax)" in text:
            diagnostics += _open_todos(text, path)
        return "unchanged", text, diagnostics, {}
    return "converted", result.code, diagnostics, result.files


def _mentions_torch(path: str, chunk: int = 1 << 20) -> bool:
    """Whether the file's bytes hold ``torch``, read a megabyte at a time."""
    tail = b""
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            if b"torch" in tail + block[:4] or b"torch" in block:
                return True
            tail = block[-4:]
    return False


_BRACKET = re.compile(r"[][(){}]")


def _bracket_depth(text: str) -> tuple[int, int] | None:
    """``(deepest bracket nesting, its line)``, counted by Python's tokenizer (brackets in
    strings and comments do not count); None when it cannot tokenize the text. A file with
    few brackets is not tokenized: it cannot nest deeper than it has brackets."""
    import io
    import tokenize

    if len(_BRACKET.findall(text)) <= 2 * MAX_BRACKETS:
        return (0, 1)
    depth = deepest = 0
    line = 1
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.OP:
                if tok.string in "([{":
                    depth += 1
                    if depth > deepest:
                        deepest, line = depth, tok.start[0]
                elif tok.string in ")]}":
                    depth -= 1
    except (tokenize.TokenError, SyntaxError):
        return None
    return deepest, line


def _open_todos(text: str, path: str) -> list[Diagnostic]:
    """The ``# TODO(torch2jax): ... [rule]`` markers an earlier conversion left in ``text``:
    converted code with open TODOs is not done (``check`` and the exit status say so)."""
    from torch2jax.suppress import TODO

    out = []
    for i, line in enumerate(text.splitlines(), 1):
        mt = TODO.match(line)
        if mt:
            out.append(Diagnostic(path, i, line.index("#") + 1, mt.group("rule"), "error",
                                  f"left for review: {mt.group('msg')}"))
    return out


def _where(exc: BaseException) -> str:
    """`` (at torch2jax/passes/rewrite.py:157 in on_leave)``: the innermost frame of ours."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}torch2jax{os.sep}" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    rel = f.filename[f.filename.rindex(f"{os.sep}torch2jax{os.sep}") + 1:]
    return f" (at {rel}:{f.lineno} in {f.name})"


def _parse_message(text: str, path: str) -> tuple[str, int, int]:
    """``(message, line, column)`` of a ParseError's ``PATH:LINE:COL: message`` (the
    column 0-based there, 1-based in diagnostics)."""
    line, col, message = (text.removeprefix(f"{path}:").split(":", 2) + ["", "", ""])[:3]
    if line.isdigit() and col.isdigit():
        return message.strip(), int(line), int(col) + 1
    return text, 1, 1


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _mp_context():
    """``fork`` (cheapest) unless the process has loaded a library that runs threads (JAX,
    torch: forking them can deadlock), then ``forkserver``, whose server process forks the
    workers from a clean single-threaded state with the converter imported once."""
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    if "fork" in methods and not any(m in sys.modules for m in _THREADED):
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch2jax.convert"])
        return ctx
    return mp.get_context("spawn")


_THREADED = ("jax", "torch", "tensorflow", "numba")

Task = tuple[str, frozenset[str], frozenset[str]]


def _worker_main(conn, options: Options, inherited: list) -> None:
    """A worker: converts the files it is sent, one at a time, until told to stop or until
    the main process goes away."""
    for c in inherited:  # the main process's ends of the other workers' pipes (fork)
        with contextlib.suppress(OSError):
            c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the main process; it stops us
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource  # a crash must not leave a core file in the user's folder

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    _init_worker(options)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task, limit = message
        _limit_cpu(limit)
        try:
            outcome = convert_file(*task)
        except BaseException as exc:  # noqa: BLE001 - MemoryError and the like: report it
            outcome = Outcome(task[0], "failed", diagnostics=[Diagnostic(
                task[0], 1, 1, "internal", "error", f"internal error while converting: {exc!r}; "
                "please report it")])
        try:
            conn.send(outcome)
        except (OSError, ValueError):
            return


def _limit_cpu(seconds: float) -> None:
    """Let this process use ``seconds`` more CPU time (RLIMIT_CPU): past it, the kernel sends
    SIGXCPU, which ends the worker; the main process reports the file as a ``timeout``."""
    try:
        import resource
    except ImportError:  # not POSIX: the main process's wall-clock limit still applies
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + seconds)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


# files sent ahead to a worker: it starts the next one while the main process writes
PREFETCH = 2


@dataclass
class _Worker:
    process: object
    conn: object
    queue: deque = field(default_factory=deque)  # tasks sent, in order; the first one runs
    deadline: float = 0.0  # wall clock, for the first task


class _Workers:
    """``jobs`` worker processes, each converting one file at a time (with the next ones
    already sent). A worker that dies (a crash in libcst's native code, the out-of-memory
    killer) or overruns its file's time limit is replaced: the file it was converting is
    reported, the files sent ahead go to another worker."""

    def __init__(self, options: Options, jobs: int) -> None:
        self.options = options
        self.jobs = jobs
        self.ctx = _mp_context()
        self.workers: list[_Worker] = []
        self.limits: dict[int, float] = {}

    def _start(self) -> _Worker:
        import gc

        fork = self.ctx.get_start_method() == "fork"
        parent, child = self.ctx.Pipe(duplex=True)
        inherited = [w.conn for w in self.workers] + [parent] if fork else []
        process = self.ctx.Process(target=_worker_main, args=(child, self.options, inherited),
                                   daemon=True, name="torch2jax-worker")
        if fork:  # the child's garbage collector then leaves the inherited objects alone
            gc.freeze()  # (no copy-on-write of the whole heap); the parent's is unchanged
        try:
            process.start()
        finally:
            if fork:
                gc.unfreeze()
        child.close()
        worker = _Worker(process, parent)
        self.workers.append(worker)
        return worker

    def _retire(self, worker: _Worker, pending: deque) -> None:
        """Stop ``worker``; the tasks it still had go back to the front of ``pending``."""
        self.workers.remove(worker)
        pending.extendleft(reversed(worker.queue))
        worker.queue.clear()
        with contextlib.suppress(OSError):
            worker.conn.close()
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join()

    def run(self, tasks: list[Task], order: list[int]) -> Iterator[tuple[int, Outcome]]:
        """``(index, outcome)`` for every task, in the order they finish."""
        from multiprocessing.connection import wait

        pending = deque(order)
        try:
            for _ in range(min(self.jobs, len(pending))):
                self._fill(self._start(), tasks, pending)
            while any(w.queue for w in self.workers):
                busy = [w for w in self.workers if w.queue]
                timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                             timeout)
                for w in busy:
                    done = self._collect(w, ready, tasks)
                    if done is None:
                        continue
                    index, outcome, alive = done
                    yield index, outcome
                    if not alive:
                        self._retire(w, pending)
                        if not pending:
                            continue
                        w = self._start()
                    self._fill(w, tasks, pending)
        finally:
            for w in list(self.workers):
                with contextlib.suppress(OSError, ValueError):
                    w.conn.send(None)
            for w in list(self.workers):
                w.process.join(timeout=1)
                self._retire(w, pending)

    def _fill(self, w: _Worker, tasks: list[Task], pending: deque) -> None:
        while pending and len(w.queue) < PREFETCH:
            index = pending.popleft()
            limit = self.limits[index] = self.options.time_limit(_size(tasks[index][0]))
            if not w.queue:
                w.deadline = time.monotonic() + WALL_FACTOR * limit
            w.queue.append(index)
            try:
                w.conn.send((tasks[index], limit))
            except (OSError, ValueError):
                return  # it died already: its sentinel says so

    def _collect(self, w: _Worker, ready: list, tasks: list[Task]
                 ) -> tuple[int, Outcome, bool] | None:
        """``(task, outcome, worker still usable)`` when ``w`` is done with its first task."""
        index = w.queue[0]
        path = tasks[index][0]
        limit = self.limits[index]
        if w.conn in ready or w.process.sentinel in ready:
            # EOF, or a message cut short by the worker's death: it crashed on this file
            with contextlib.suppress(Exception):
                if w.conn.poll():
                    outcome = w.conn.recv()
                    w.queue.popleft()
                    if w.queue:  # the worker has started the next one
                        w.deadline = time.monotonic() + WALL_FACTOR * self.limits[w.queue[0]]
                    return index, outcome, w.process.is_alive()
            w.process.join(timeout=5)
            w.queue.popleft()
            if w.process.exitcode == -getattr(signal, "SIGXCPU", 0):
                return index, _timed_out(path, f"{limit:g} s of CPU time"), False
            return index, _died(path, w.process.exitcode), False
        if time.monotonic() >= w.deadline:
            w.queue.popleft()
            return index, _timed_out(path, f"{WALL_FACTOR * limit:g} s"), False
        return None


def _timed_out(path: str, what: str) -> Outcome:
    return Outcome(path, "failed", diagnostics=[Diagnostic(
        path, 1, 1, "timeout", "error",
        f"converting it took more than {what} (--timeout); stopped, not converted")])


def _died(path: str, exitcode: int | None) -> Outcome:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = f"the converter's process crashed on it ({name})"
        if name == "SIGSEGV":
            why += ", likely libcst's parser on very deep nesting"
        elif name == "SIGKILL":
            why += ", likely out of memory"
    else:
        why = f"the converter's process exited ({exitcode}) while converting it"
    return Outcome(path, "failed", diagnostics=[Diagnostic(
        path, 1, 1, "crash", "error", f"{why}; not converted")])


def convert_all(tasks: list[Task], options: Options, jobs: int,
                progress: Callable[[], None] | None = None) -> list[Outcome]:
    """Convert every ``(path, known_modules, public classes)``; results in the order of
    ``tasks``."""
    results: list[Outcome | None] = [None] * len(tasks)
    for i, outcome in convert_iter(tasks, options, jobs):
        results[i] = outcome
        if progress:
            progress()
    return [r for r in results if r is not None]


def convert_iter(tasks: list[Task], options: Options, jobs: int
                 ) -> Iterator[tuple[int, Outcome]]:
    """``(index, outcome)`` for every task as the workers finish them (largest files first,
    so that no big file starts last and runs alone at the end)."""
    if not tasks:
        return iter(())
    order = sorted(range(len(tasks)), key=lambda i: -_size(tasks[i][0]))
    return _Workers(options.resolved(), max(1, min(jobs, len(tasks)))).run(tasks, order)


@dataclass
class Request:
    paths: list[Path]
    mode: str  # out | in-place | diff | check
    explain: bool = False  # check: convert each torch file and report its diagnostics
    out: Path | None = None
    options: Options = field(default_factory=Options)
    jobs: int = 1
    excludes: tuple[Exclude, ...] = ()
    use_gitignore: bool = True
    allow_overlap: bool = False  # -o inside or around an input, when nothing would be replaced


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _overlap(paths: list[Path], out: Path) -> tuple[str, Path] | None:
    """How ``out`` overlaps an input, symbolic links resolved: ``("is", p)``,
    ``("inside", p)`` or ``("contains", p)``."""
    real_out = _real(out)
    for p in paths:
        real = _real(p)
        if real == real_out:
            return "is", p
        if real in real_out.parents:
            return "inside", p
        if real_out in real.parents:
            return "contains", p
    return None


def check_output(req: Request) -> None:
    """Refuse (:class:`UsageError`) an output folder that is, contains or lies inside an input
    (unless ``allow_overlap``; :func:`run` then checks that nothing would be replaced), or is
    not a folder. Reads and writes nothing."""
    if req.mode != "out" or req.out is None:
        return
    out = req.out
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"-o {display(str(out))} exists and is not a folder")
    found = _overlap(req.paths, out)
    if found is None:
        return
    how, p = found
    o, i = display(str(out)), display(str(p))
    if how == "is":
        raise UsageError(f"-o {o} is the input {i}: the output would overwrite the input")
    if req.allow_overlap:
        return
    where = "lies inside the input" if how == "inside" else "contains the input"
    raise UsageError(f"-o {o} {where} {i}: converted files could replace files there; choose "
                     "an output folder apart from the input, or pass --allow-overlap (accepted "
                     "only when no converted file would replace an existing one)")


@dataclass
class _Dest:
    path: Path | None  # where the file goes, its folder resolved inside the output folder
    problem: str | None = None


def _destinations(files: list[tuple[Path, Path]], out: Path, check_existing: bool
                  ) -> list[_Dest]:
    """Each file's destination under ``out``: its folder resolved (symbolic links followed);
    one that leaves ``out``, or that another file already goes to, is refused."""
    real_out = _real(out)
    taken: dict[Path, Path] = {}
    dests = []
    existing: list[str] = []
    for src, rel in files:
        problem = None
        folder = _real(real_out / rel.parent)
        dest = folder / rel.name
        if folder != real_out and real_out not in folder.parents:
            problem = (f"would be written to {display(str(out / rel))}, which a symbolic link "
                       "takes outside the output folder; not written")
        elif os.path.islink(dest) and real_out not in _real(dest).parents:
            problem = (f"{display(str(out / rel))} is a symbolic link outside the output "
                       "folder; not written")
        elif dest in taken:
            problem = (f"{display(str(out / rel))} is already the output of "
                       f"{display(str(taken[dest]))}; not written")
        else:
            taken[dest] = src
            if check_existing and os.path.lexists(dest):
                existing.append(display(str(out / rel)))
        dests.append(_Dest(None if problem else dest, problem))
    if existing:
        more = f" and {len(existing) - 5} more" if len(existing) > 5 else ""
        raise UsageError("--allow-overlap: converted files would replace existing files: "
                         + ", ".join(existing[:5]) + more + "; nothing was written (remove "
                         "them, or choose an output folder apart from the input)")
    return dests


def run(req: Request, show_diff: Callable[[str, str, str], None] | None = None,
        progress_console=None) -> RunReport:
    """Find, convert and write; the report lists the files in the order they were found.
    Raises :class:`UsageError` (nothing read or written) for an ``-o`` that overlaps the
    input (see :func:`check_output`)."""
    from torch2jax.repo import index_repository
    from torch2jax.ruleset import load_rules

    check_output(req)
    options = req.options.resolved()
    if req.mode == "check" and not req.explain:
        options = replace(options, check_only=True)
    found = find_files(req.paths, exclude_dirs=[req.out], excludes=req.excludes,
                       use_gitignore=req.use_gitignore)
    dests: list[_Dest] = []
    if req.mode == "out":
        assert req.out is not None
        dests = _destinations(found.files, req.out,
                              check_existing=_overlap(req.paths, req.out) is not None)
    rules = load_rules(tuple(str(d) for d in options.rule_dirs))
    repo = index_repository(_with_context(req, [f for f, _ in found.files], options),
                            rules.layers, read=_bounded_reader(options))
    reports = [FileReport(path=str(src), status="failed") for src, _ in found.files]
    tasks: list[Task] = []
    task_file: list[int] = []
    for i, (f, _) in enumerate(found.files):
        if dests and dests[i].problem is not None:
            reports[i].diagnostics.append(Diagnostic(str(f), 1, 1, "output", "error",
                                                     dests[i].problem))
            continue
        tasks.append((str(f), frozenset(repo.known_for(f)), frozenset(repo.exported_from(f))))
        task_file.append(i)
    writer = _Writer(req)
    diffs: dict[int, Outcome] = {}
    generated: set[str] = set()  # generated files (package_models.py) already reported
    for t, oc in _with_progress(tasks, req, options, progress_console):
        i = task_file[t]
        src = found.files[i][0]
        # the diagnostics of a generated file, the same for every file that uses it, once
        own = [d for d in oc.diagnostics if d.file == str(src) or d.file not in generated]
        generated |= {d.file for d in oc.diagnostics if d.file != str(src)}
        report = reports[i] = FileReport(path=str(src), status=oc.status, diagnostics=own)
        if oc.status == "failed" or req.mode == "check":
            continue
        if req.mode == "diff":
            if oc.status == "converted":
                diffs[i] = oc
                for rel, code in oc.files.items():  # new files: shown whole
                    diffs[-len(diffs) - 1] = Outcome(str(src.parent / rel), "converted", "",
                                                     code=code)
            continue
        writer.write(src, dests[i].path if dests else None, oc, report)
    if show_diff is not None:
        for i in sorted(diffs, key=lambda i: (i < 0, abs(i))):
            if diffs[i].cells is not None:  # a notebook: one diff per changed cell
                for label, old, new in diffs[i].cells:
                    show_diff(old, new, label)
            else:  # (negative keys: generated files, shown whole after the others)
                show_diff(diffs[i].text or "", diffs[i].code or "",
                          str(found.files[i][0]) if i >= 0 else diffs[i].path)
    result = RunReport(files=reports)
    for p in found.problems:
        status = "failed" if p.severity == "error" else "skipped"
        result.files.append(FileReport(path=str(p.path), status=status, diagnostics=[
            Diagnostic(str(p.path), 1, 1, "discover", p.severity, p.message)]))
    return result


class _Writer:
    """Writes results as they arrive: atomically, with the source's mode; in place only over
    the content that was read; a failure is the file's diagnostic, never the run's end."""

    def __init__(self, req: Request) -> None:
        self.req = req
        self.real_out = _real(req.out) if req.out is not None else None
        self.cleaned: set[Path] = set()
        self.written: set[Path] = set()

    def _clean(self, folder: Path) -> None:
        if folder not in self.cleaned:
            self.cleaned.add(folder)
            remove_stale_temps(folder)

    def write(self, src: Path, dest: Path | None, oc: Outcome, report: FileReport) -> None:
        try:
            if self.req.mode == "in-place":
                self._in_place(src, oc, report)
            else:
                assert dest is not None
                self._out(src, dest, oc, report)
            if oc.files and report.status == "converted":
                for problem in self._generated(dest.parent if dest is not None else src.parent,
                                               oc.files):
                    report.diagnostics.append(Diagnostic(str(src), 1, 1, "write", "error",
                                                         problem))
        except Changed as exc:
            report.status = "failed"
            report.diagnostics.append(Diagnostic(
                str(src), 1, 1, "changed", "error",
                f"{exc.strerror}; left as it is, not rewritten (run the conversion again)"))
        except OSError as exc:
            report.status = "failed"
            where = display(exc.filename) if isinstance(exc.filename, str) else ""
            why = exc.strerror or str(exc)
            report.diagnostics.append(Diagnostic(
                str(src), 1, 1, "write", "error",
                f"could not be written: {why}{f' ({where})' if where else ''}; not written"))

    def _generated(self, folder: Path, files: dict[str, str]) -> list[str]:
        """The converted model code of installed packages, beside the converted file
        (package_models.py): written once per run and folder, never over a file that
        torch2jax did not generate."""
        from torch2jax.package_models import GENERATED

        problems = []
        for rel, code in files.items():
            path = _real(folder) / rel
            if path in self.written:
                continue
            self.written.add(path)
            if os.path.lexists(path):
                old = path.read_text(encoding="utf-8", errors="replace")
                if old == code:
                    continue
                if not old.startswith(GENERATED):
                    problems.append(f"{display(str(path))} exists and was not generated by "
                                    "torch2jax: the converted model code the file imports was "
                                    "not written there")
                    continue
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, code)
        return problems

    def _in_place(self, src: Path, oc: Outcome, report: FileReport) -> None:
        if oc.status != "converted" or oc.code is None:
            return
        if src.is_symlink():
            report.status = "skipped"
            report.diagnostics.append(Diagnostic(
                str(src), 1, 1, "symlink", "warning",
                "a symbolic link; not rewritten in place (convert its target)"))
            return
        self._clean(src.parent)
        write_atomic(src, oc.code, oc.encoding, mode=oc.mode, expect=oc.digest)
        report.output = str(src)

    def _out(self, src: Path, dest: Path, oc: Outcome, report: FileReport) -> None:
        assert self.real_out is not None and self.req.out is not None
        folder = dest.parent
        # made only now, and checked again: a symbolic link placed since the plan is refused
        os.makedirs(folder, exist_ok=True)
        real = _real(folder)
        if real != self.real_out and self.real_out not in real.parents:
            report.status = "failed"
            report.diagnostics.append(Diagnostic(
                str(src), 1, 1, "output", "error",
                f"would be written to {display(str(dest))}, which a symbolic link takes "
                "outside the output folder; not written"))
            return
        self._clean(real)
        if oc.status == "converted" and oc.code is not None:
            write_atomic(real / dest.name, oc.code, oc.encoding, mode=oc.mode)
        elif oc.data is not None:
            write_atomic(real / dest.name, oc.data, mode=oc.mode)
        else:  # a large file without torch: copied as it is
            copy_atomic(src, real / dest.name)
        report.output = str(self.req.out / Path(os.path.relpath(dest, self.real_out)))


def _bounded_reader(options: Options) -> Callable[[Path], str | bytes]:
    """The first pass's reader: a file over the size limit is not read (nor parsed); a
    Python file is read through :func:`read_source_file` (the one place a source is read); a
    notebook is read as the one module its code cells make (torch2jax/notebook.py). Any
    failure is an ``OSError``, which skips the file there (its conversion reports it)."""
    limit = options.max_bytes if options.max_bytes is not None else MAX_BYTES

    def read(path: Path) -> str | bytes:
        notebook = str(path).endswith(NOTEBOOK_SUFFIX)
        if os.stat(path).st_size > (notebook_limit(limit) if notebook else limit):
            raise OSError(f"{path}: over the size limit")
        if notebook:
            from torch2jax.notebook import python_source

            with open(path, "rb") as fh:
                data = fh.read()
            return python_source(data, limit)  # OSError when it is not a readable notebook
        try:
            return read_source_file(path).text
        except ReadError as exc:
            raise OSError(str(exc)) from None

    return read


def _with_context(req: Request, files: list[Path], options: Options) -> list[Path]:
    """The files to index in the first pass: those converted, plus, for files named one by
    one (pre-commit passes the staged files), the files of the repository they import
    (transitively), so that a base class defined in an unstaged file is still known."""
    from torch2jax.repo import import_closure

    explicit = [p for p in req.paths if p.is_file()]
    if not explicit:
        return files
    seen = {f.resolve() for f in files}
    return list(files) + [f for f in import_closure(explicit, read=_bounded_reader(options))
                          if f not in seen]


def _with_progress(tasks: list[Task], req: Request, options: Options, console
                   ) -> Iterator[tuple[int, Outcome]]:
    if console is None or not console.is_terminal or len(tasks) < 2:
        yield from convert_iter(tasks, options, req.jobs)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("converting"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("convert", total=len(tasks))
        for item in convert_iter(tasks, options, req.jobs):
            yield item
            bar.advance(task)
