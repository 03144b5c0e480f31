"""Find the Python files to convert, read them safely, write results atomically."""

from __future__ import annotations

import os
import tempfile
import tokenize
from collections.abc import Iterable
from pathlib import Path

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist"}


def discover(paths: Iterable[Path], exclude_dirs: Iterable[Path] = ()) -> list[tuple[Path, Path]]:
    """(file, path relative to its root) for every ``.py`` file under ``paths``.

    Folders listed in ``exclude_dirs`` (the output folder when it sits inside the input) and
    the usual tool folders are skipped; symlinked folders are not followed (no loops).
    """
    excluded = {p.resolve() for p in exclude_dirs if p is not None}
    found: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    for root in paths:
        if root.is_file():
            found.append((root, Path(root.name)))
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            d = Path(dirpath)
            dirnames[:] = sorted(
                n for n in dirnames
                if n not in SKIP_DIRS and (d / n).resolve() not in excluded
                and not n.endswith(".egg-info")
            )
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                f = d / name
                real = f.resolve()
                if real in seen:
                    continue
                seen.add(real)
                found.append((f, f.relative_to(root)))
    return found


def read_source(path: Path) -> str:
    """The file's text, decoded as Python does (PEP 263 coding cookie, else UTF-8)."""
    with open(path, "rb") as fh:
        encoding, _ = tokenize.detect_encoding(fh.readline)
    return path.read_text(encoding=encoding)


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
