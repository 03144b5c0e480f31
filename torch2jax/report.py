"""Diagnostics: what the converter did not (or could not) translate, and how it is shown."""

from __future__ import annotations

import difflib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (rich is imported where a summary is printed: `check` starts faster)
    from rich.console import Console

SEVERITIES = ("info", "warning", "error")
STATUSES = ("converted", "unchanged", "skipped", "failed")
SCHEMA = "torch2jax-report/1"  # docs/reviewing.md describes it


def display(path: str) -> str:
    """A file name for the terminal: bytes of a name that are not valid UTF-8 (held as
    surrogates, PEP 383) shown as ``\\xNN`` escapes, so that printing never fails."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return path


@dataclass(frozen=True)
class Diagnostic:
    """One finding at one place in one file.

    ``severity``: ``info`` (a translation worth knowing about), ``warning`` (translated, check by
    hand), ``error`` (not translated: a ``# TODO(torch2jax)`` marks the line).

    ``cell``: in a notebook, the 1-based position of the cell among all the notebook's cells
    (markdown cells counted), ``line`` and ``column`` then count within that cell; None in a
    Python file and for problems of a whole notebook.
    """

    file: str
    line: int
    column: int
    rule: str
    severity: str
    message: str
    cell: int | None = None

    @property
    def location(self) -> str:
        """``file:line:col``, or ``notebook.ipynb:cell N:line:col``."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{display(self.file)}:{cell}{self.line}:{self.column}"

    def render(self) -> str:
        return f"{self.location}: {self.severity} [{self.rule}] {self.message}"


@dataclass
class FileReport:
    path: str
    status: str  # converted | unchanged | skipped | failed
    output: str | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def todos(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "error")


@dataclass
class RunReport:
    files: list[FileReport] = field(default_factory=list)

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return [d for f in self.files for d in f.diagnostics]

    @property
    def exit_code(self) -> int:
        failed = any(f.status == "failed" for f in self.files)
        return 1 if failed or any(d.severity == "error" for d in self.diagnostics) else 0

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "summary": {
                "files": len(self.files),
                **{s: 0 for s in STATUSES},
                **Counter(f.status for f in self.files),
                "todos": self.todos,
                "errors": sum(1 for d in self.diagnostics if d.severity == "error"),
                "warnings": sum(1 for d in self.diagnostics if d.severity == "warning"),
            },
            "files": [
                {
                    "path": f.path,
                    "status": f.status,
                    "output": f.output,
                    "diagnostics": [asdict(d) for d in f.diagnostics],
                }
                for f in self.files
            ],
        }

    def write_json(self, path: str | Path) -> None:
        """UTF-8 JSON, written atomically. A file name that is not valid UTF-8 keeps each of
        its undecodable bytes as a ``\\udcNN`` escape (PEP 383): Python's ``json.load`` and
        ``os.fsencode`` give the original bytes back."""
        from torch2jax.discover import write_atomic

        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"
        # a lone surrogate can only stand inside a JSON string, where \\udcNN is its escape
        write_atomic(Path(path), text.encode("utf-8", "backslashreplace"))

    @property
    def todos(self) -> int:
        """Untranslated constructs left marked ``# TODO(torch2jax)`` in the written files."""
        return sum(f.todos for f in self.files if f.status != "failed")

    def print_summary(self, console: Console, limit: int = 40) -> None:
        """What is left for review. On a terminal, a table of every warning and error (one row
        per rule when there are more than ``limit``); otherwise one ``file:line:col:`` line
        each. Then the failed files, the TODO count per rule and the file totals."""
        from rich.table import Table

        shown = [d for d in self.diagnostics if d.severity != "info"]
        if shown and not console.is_terminal:
            for d in shown:
                console.print(d.render(), highlight=False, markup=False, soft_wrap=True)
        elif shown and len(shown) <= limit:
            table = Table(title="Left for review", show_lines=False)
            for col in ("location", "severity", "rule", "message"):
                table.add_column(col, overflow="fold")
            for d in shown:
                table.add_row(d.location, d.severity, d.rule, d.message)
            console.print(table)
        elif shown:
            table = Table(title=f"Left for review: {len(shown)} findings by rule "
                                "(--report FILE.json lists each)", show_lines=False)
            for col in ("rule", "severity", "count", "files", "first", "message"):
                table.add_column(col, overflow="fold")
            groups: dict[tuple[str, str], list[Diagnostic]] = {}
            for d in shown:
                groups.setdefault((d.rule, d.severity), []).append(d)
            order = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
            for (rule, severity), ds in order:
                first = ds[0]
                table.add_row(rule, severity, str(len(ds)), str(len({d.file for d in ds})),
                              first.location,
                              first.message)
            console.print(table)
        failed = [f for f in self.files if f.status == "failed"]
        if failed:
            console.print(f"Not converted ({len(failed)}): "
                          + ", ".join(display(f.path) for f in failed),
                          highlight=False, markup=False, soft_wrap=True)
        by_rule = Counter(d.rule for f in self.files if f.status != "failed"
                          for d in f.diagnostics if d.severity == "error")
        if by_rule:
            console.print(
                "TODOs by rule: " + ", ".join(f"{r} ×{n}" for r, n in by_rule.most_common()),
                highlight=False, markup=False, soft_wrap=True)
        counts = Counter(f.status for f in self.files)
        parts = [f"{n} {s}" for s, n in sorted(counts.items())]
        console.print(f"{plural(len(self.files), 'file')}: " + ", ".join(parts)
                      + f"; {plural(self.todos, 'TODO')}", highlight=False)

def plural(n: int, word: str) -> str:
    """``1 file``, ``2 files``, ``0 files``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_COLORS = {"+++": "\x1b[1m", "---": "\x1b[1m", "@@": "\x1b[36m", "+": "\x1b[32m",
           "-": "\x1b[31m"}


def unified_diff(old: str, new: str, name: str, color: bool = False) -> str:
    """A unified diff of one file (``a/NAME`` -> ``b/NAME``), coloured with ANSI codes when
    ``color`` (removed lines red, added green, hunk headers cyan, file headers bold)."""
    lines = list(difflib.unified_diff(old.splitlines(keepends=True),
                                      new.splitlines(keepends=True),
                                      fromfile=f"a/{name}", tofile=f"b/{name}"))
    lines = [ln if ln.endswith("\n") else ln + "\n\\ No newline at end of file\n"
             for ln in lines]
    if not color:
        return "".join(lines)
    out = []
    for ln in lines:
        prefix = next((p for p in _COLORS if ln.startswith(p)), None)
        if prefix is None:
            out.append(ln)
        else:
            body = ln.rstrip("\n")
            out.append(f"{_COLORS[prefix]}{body}\x1b[0m" + ln[len(body):])
    return "".join(out)
