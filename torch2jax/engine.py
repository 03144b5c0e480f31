"""Converting many files: the repository first pass, worker processes, a progress bar, writing.

The CLI's ``convert`` and ``check`` run through :func:`run`:

1. find the files (:mod:`torch2jax.discover`: ``.gitignore``, ``exclude``, the output folder);
2. a first pass over all of them (:mod:`torch2jax.repo`) tells each file which of the names it
   imports are module classes of the repository;
3. the files are converted in ``jobs`` worker processes (one per core by default); results
   come back in the order the files were found, so the output and the report do not depend
   on the number of workers;
4. the main process writes: into the mirror tree (``-o``), in place (only the files that
   change, atomically), or nothing (``--diff``, ``--check``).

A file that cannot be read, decoded or parsed, or is too large, gets an ``error`` diagnostic
naming it and is not written; every other file is still converted.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from torch2jax.discover import (
    Exclude,
    ReadError,
    copy_atomic,
    find_files,
    read_python,
    write_atomic,
)
from torch2jax.report import Diagnostic, FileReport, RunReport

# a file above this size that mentions torch is reported, not converted (libcst would take
# minutes and gigabytes on a multi-megabyte generated file); one that does not is copied
MAX_BYTES = 4_000_000


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


@dataclass
class Outcome:
    """What converting one file gave (sent back from a worker)."""

    path: str
    status: str  # converted | unchanged | failed
    text: str | None = None
    encoding: str = "utf-8"
    code: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)


_WORKER: dict = {}


def _init_worker(options: Options) -> None:
    from torch2jax.config import load_user_rules
    from torch2jax.ruleset import load_rules

    _WORKER["options"] = options
    _WORKER["rules"] = load_user_rules(options.rule_dirs) if options.rule_dirs else load_rules()


def convert_file(path: str, known: frozenset[str] = frozenset(),
                 public: frozenset[str] = frozenset()) -> Outcome:
    """Read and convert one file; never raises (a failure is an ``error`` diagnostic)."""
    from torch2jax.convert import ParseError, convert_source
    from torch2jax.suppress import suppress

    options: Options = _WORKER["options"]
    max_bytes = options.max_bytes if options.max_bytes is not None else MAX_BYTES

    def failed(rule: str, message: str, line: int = 1, col: int = 1) -> Outcome:
        return Outcome(path, "failed", diagnostics=[
            Diagnostic(path, line, col, rule, "error", message)])

    try:
        size = os.path.getsize(path)
        text, encoding = read_python(Path(path))
    except ReadError as exc:
        return failed("read", str(exc))
    except OSError as exc:
        return failed("read", f"cannot be read: {exc.strerror or exc}")
    if size > max_bytes and "torch" in text:
        return failed("too-large", f"{size:,} bytes, more than the {max_bytes:,} converted "
                                   "per file; not converted")
    if size > max_bytes:
        return Outcome(path, "unchanged", text, encoding, text)
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
    if not changed and "TODO(torch2jax)" in text:
        diagnostics += _open_todos(text, path)
    return Outcome(path, "converted" if changed else "unchanged", text, encoding, result.code,
                   diagnostics)


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


def _worker_call(args: tuple[str, frozenset[str], frozenset[str]]) -> Outcome:
    return convert_file(*args)


def convert_all(tasks: list[tuple[str, frozenset[str], frozenset[str]]], options: Options,
                jobs: int, progress: Callable[[], None] | None = None) -> list[Outcome]:
    """Convert every ``(path, known_modules, public classes)``; results in the order of
    ``tasks``."""
    jobs = max(1, min(jobs, len(tasks)))
    if jobs == 1:
        _init_worker(options)
        out = []
        for t in tasks:
            out.append(convert_file(*t))
            if progress:
                progress()
        return out
    results: list[Outcome | None] = [None] * len(tasks)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=_mp_context(),
                             initializer=_init_worker, initargs=(options,)) as pool:
        # largest files first, so that no big file starts last and runs alone at the end
        order = sorted(range(len(tasks)), key=lambda i: -_size(tasks[i][0]))
        futures = {pool.submit(_worker_call, tasks[i]): i for i in order}
        from concurrent.futures import as_completed

        for fut in as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker died (out of memory, killed)
                path = tasks[i][0]
                results[i] = Outcome(path, "failed", diagnostics=[Diagnostic(
                    path, 1, 1, "internal", "error", f"the worker converting it died: {exc!r}")])
            if progress:
                progress()
    return [r for r in results if r is not None]


@dataclass
class Request:
    paths: list[Path]
    mode: str  # out | in-place | diff | check
    out: Path | None = None
    options: Options = field(default_factory=Options)
    jobs: int = 1
    excludes: tuple[Exclude, ...] = ()
    use_gitignore: bool = True


def run(req: Request, show_diff: Callable[[str, str, str], None] | None = None,
        progress_console=None) -> RunReport:
    """Find, convert and write; the report lists the files in the order they were found."""
    from torch2jax.repo import index_repository
    from torch2jax.ruleset import load_rules

    found = find_files(req.paths, exclude_dirs=[req.out], excludes=req.excludes,
                       use_gitignore=req.use_gitignore)
    rules = load_rules(tuple(str(d) for d in req.options.rule_dirs))
    repo = index_repository(_with_context(req, [f for f, _ in found.files]), rules.layers)
    tasks = [(str(f), frozenset(repo.known_for(f)), frozenset(repo.exported_from(f)))
             for f, _ in found.files]
    outcomes = _with_progress(tasks, req, progress_console)

    run = RunReport()
    dests: dict[Path, str] = {}
    out_root = req.out.resolve() if req.out is not None else None
    for (src, rel), oc in zip(found.files, outcomes):
        report = FileReport(path=str(src), status=oc.status, diagnostics=list(oc.diagnostics))
        run.files.append(report)
        if oc.status == "failed" or req.mode in ("check",) or oc.code is None:
            continue
        if req.mode == "diff":
            if oc.status == "converted" and show_diff is not None:
                show_diff(oc.text or "", oc.code, str(src))
            continue
        if req.mode == "in-place":
            if oc.status != "converted":
                continue
            if src.is_symlink():
                report.status = "skipped"
                report.diagnostics.append(Diagnostic(
                    str(src), 1, 1, "symlink", "warning",
                    "a symbolic link; not rewritten in place (convert its target)"))
                continue
            write_atomic(src, oc.code, oc.encoding)
            report.output = str(src)
            continue
        assert out_root is not None
        dest = (out_root / rel)
        real_dest = Path(os.path.abspath(dest))
        if out_root not in real_dest.parents or real_dest == src.resolve():
            report.status = "failed"
            report.diagnostics.append(Diagnostic(str(src), 1, 1, "output", "error",
                                                 f"would be written to {dest}, over its input "
                                                 "or outside the output folder; not written"))
            continue
        if real_dest in dests:
            report.status = "failed"
            report.diagnostics.append(Diagnostic(
                str(src), 1, 1, "output", "error",
                f"{dest} is already the output of {dests[real_dest]}; not written"))
            continue
        dests[real_dest] = str(src)
        if oc.status == "converted":
            write_atomic(dest, oc.code, oc.encoding)
        else:
            copy_atomic(src, dest)
        report.output = str(req.out / rel)
    for p in found.problems:
        status = "failed" if p.severity == "error" else "skipped"
        run.files.append(FileReport(path=str(p.path), status=status, diagnostics=[
            Diagnostic(str(p.path), 1, 1, "discover", p.severity, p.message)]))
    return run


def _with_context(req: Request, files: list[Path]) -> list[Path]:
    """The files to index in the first pass: those converted, plus, for files named one by
    one (pre-commit passes the staged files), the files of the repository they import
    (transitively), so that a base class defined in an unstaged file is still known."""
    from torch2jax.repo import import_closure

    explicit = [p for p in req.paths if p.is_file()]
    if not explicit:
        return files
    seen = {f.resolve() for f in files}
    return list(files) + [f for f in import_closure(explicit) if f not in seen]


def _with_progress(tasks, req: Request, console) -> list[Outcome]:
    if console is None or not console.is_terminal or len(tasks) < 2:
        return convert_all(tasks, req.options, req.jobs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("converting"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("convert", total=len(tasks))
        return convert_all(tasks, req.options, req.jobs, lambda: bar.advance(task))
