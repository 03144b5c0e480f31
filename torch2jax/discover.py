"""Find the Python files to convert, read them safely, write results atomically.

What is found: every ``*.py`` file and Jupyter notebook (``*.ipynb``) under the given folders,
in sorted order, less

* the usual tool folders (``.git``, ``.venv``, ``__pycache__``, ``build``,
  ``.ipynb_checkpoints``, ...),
* the output folder when it sits inside the input,
* what the ``.gitignore`` files of the enclosing git work tree ignore (gitignore semantics
  through the ``pathspec`` library: nested ``.gitignore`` files, negation, folder patterns),
* the ``exclude`` patterns (gitignore syntax; those of ``[tool.torch2jax]`` relative to the
  ``pyproject.toml``, those of ``--exclude`` relative to each folder being converted).

Files named explicitly are taken even when a ``.gitignore`` ignores them (as ``git add`` and
linters do), but ``exclude`` still applies to them. Symbolic links to folders are not followed
(a warning, or an error for a link loop); a file link is read through; a broken link, a link
loop or something that is not a regular file (a FIFO would block the reader) is a problem
reported for that path, never a crash, and so is a folder that cannot be read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist",
             ".ipynb_checkpoints"}
SUFFIXES = (".py", ".ipynb")  # Python files and Jupyter notebooks (torch2jax/notebook.py)


class ReadError(Exception):
    """A file could not be read or decoded; the message says why (the caller names the file)."""


@dataclass(frozen=True)
class Problem:
    """A path found but not converted: ``severity`` error (exit status 1) or warning."""

    path: Path
    severity: str
    message: str


@dataclass
class Discovery:
    files: list[tuple[Path, Path]] = field(default_factory=list)  # (file, path under its root)
    problems: list[Problem] = field(default_factory=list)


@dataclass(frozen=True)
class Exclude:
    """gitignore-style ``patterns`` matched against paths relative to ``base`` (None: relative
    to the folder being converted)."""

    patterns: tuple[str, ...]
    base: Path | None = None

    def spec(self) -> pathspec.GitIgnoreSpec:
        return pathspec.GitIgnoreSpec.from_lines(self.patterns)


class _Ignores:
    """The ``.gitignore`` files (from the git work tree's root down) and ``exclude`` specs."""

    def __init__(self, excludes: Iterable[Exclude], use_gitignore: bool) -> None:
        self.excludes = [(e.base.resolve() if e.base else None, e.spec())
                         for e in excludes if e.patterns]
        self.use_gitignore = use_gitignore
        self._git_cache: dict[Path, list[tuple[Path, pathspec.GitIgnoreSpec]]] = {}

    def _gitignores(self, folder: Path) -> list[tuple[Path, pathspec.GitIgnoreSpec]]:
        """The ``.gitignore`` specs that apply inside ``folder`` (outermost first)."""
        if folder in self._git_cache:
            return self._git_cache[folder]
        parent = folder.parent
        top = (folder / ".git").exists() or parent == folder
        specs = [] if top else list(self._gitignores(parent))
        gi = folder / ".gitignore"
        if gi.is_file() and _in_git_tree(folder):
            try:
                lines = gi.read_text(encoding="utf-8", errors="replace").splitlines()
                specs.append((folder, pathspec.GitIgnoreSpec.from_lines(lines)))
            except OSError:
                pass
        self._git_cache[folder] = specs
        return specs

    def ignored(self, path: Path, is_dir: bool, root: Path | None = None,
                explicit: bool = False) -> bool:
        real = Path(os.path.abspath(path))
        for base, spec in self.excludes:
            base = base or (Path(os.path.abspath(root)) if root is not None else None)
            rel = _relative(real, base) if base is not None else None
            if rel is not None and spec.match_file(rel + ("/" if is_dir else "")):
                return True
        if explicit or not self.use_gitignore:
            return False
        verdict = False
        for base, spec in self._gitignores(real.parent):
            rel = _relative(real, base)
            if rel is None:
                continue
            res = spec.check_file(rel + ("/" if is_dir else ""))
            if res.include is not None:
                verdict = res.include
        return verdict


def _relative(path: Path, base: Path) -> str | None:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return None


def _in_git_tree(folder: Path) -> bool:
    for d in (folder, *folder.parents):
        if (d / ".git").exists():
            return True
    return False


def find_files(paths: Iterable[Path], exclude_dirs: Iterable[Path | None] = (),
               excludes: Iterable[Exclude] = (), use_gitignore: bool = True) -> Discovery:
    """Every Python file and notebook to convert under ``paths`` (see the module
    docstring)."""
    excluded = {p.resolve() for p in exclude_dirs if p is not None}
    ignores = _Ignores(excludes, use_gitignore)
    out = Discovery()
    seen: set[Path] = set()
    for root in paths:
        if root.is_symlink() and not root.exists():
            out.problems.append(Problem(root, "error", _link_problem(root)))
            continue
        if root.is_file() or (root.exists() and not root.is_dir()):
            if ignores.ignored(root, False, root.parent, explicit=True):
                continue
            _add_file(root, Path(root.name), out, seen)
            continue
        def unreadable(exc: OSError, root: Path = root) -> None:
            where = Path(exc.filename) if exc.filename else root
            out.problems.append(Problem(where, "error", f"folder cannot be read: "
                                        f"{exc.strerror or exc}; its files are not converted"))

        for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=False):
            d = Path(dirpath)
            keep = []
            for n in sorted(dirnames):
                sub = d / n
                if n in SKIP_DIRS or n.endswith(".egg-info"):
                    continue
                if sub.is_symlink():
                    if not ignores.ignored(sub, True, root):
                        out.problems.append(_dir_link_problem(sub))
                    continue
                if sub.resolve() in excluded or ignores.ignored(sub, True, root):
                    continue
                keep.append(n)
            dirnames[:] = keep
            for name in sorted(filenames):
                if not name.endswith(SUFFIXES):
                    continue
                f = d / name
                if ignores.ignored(f, False, root):
                    continue
                _add_file(f, f.relative_to(root), out, seen)
    return out


def _link_problem(path: Path) -> str:
    try:
        path.resolve(strict=True)
    except RuntimeError:
        return "symbolic link loop; not read"
    except OSError as exc:
        if getattr(exc, "errno", None) == 40:  # ELOOP
            return "symbolic link loop; not read"
        return f"broken symbolic link (to {os.readlink(path)}); not read"
    return "symbolic link could not be followed; not read"


def _dir_link_problem(link: Path) -> Problem:
    try:
        target = link.resolve(strict=True)
    except (RuntimeError, OSError):
        return Problem(link, "error", "symbolic link loop (or broken link) to a folder; "
                                      "not followed")
    parent = link.parent.resolve()
    if target == parent or target in parent.parents:
        return Problem(link, "error", "symbolic link loop (it points to a folder that contains "
                                      "it); not followed")
    return Problem(link, "warning", "symbolic link to a folder; not followed (convert the "
                                    "target folder itself)")


def _add_file(f: Path, rel: Path, out: Discovery, seen: set[Path]) -> None:
    if f.is_symlink():
        try:
            real = f.resolve(strict=True)
        except (RuntimeError, OSError):
            out.problems.append(Problem(f, "error", _link_problem(f)))
            return
    else:
        real = f.resolve()
    if not real.is_file():
        out.problems.append(Problem(f, "error", "not a regular file; not read"))
        return
    # a file reached twice (a folder given twice, or inside another one given) is converted
    # once; a symbolic link to a file is an entry of its own (its target is still converted
    # under its own name: --in-place rewrites the target, not the link)
    key = Path(os.path.abspath(f)) if f.is_symlink() else real
    if key in seen:
        return
    seen.add(key)
    out.files.append((f, rel))


def discover(paths: Iterable[Path], exclude_dirs: Iterable[Path | None] = ()) -> list[
        tuple[Path, Path]]:
    """(file, path relative to its root) for every ``.py`` and ``.ipynb`` file under
    ``paths``."""
    return find_files(paths, exclude_dirs).files


def read_python(path: Path) -> tuple[str, str]:
    """``(text, encoding)``: the file decoded as Python does (PEP 263 coding cookie or BOM,
    else UTF-8), line endings kept as they are. Raises :class:`ReadError`."""
    src = read_source_file(path)
    return src.text, src.encoding


@dataclass(frozen=True)
class Source:
    """One Python file as read: its bytes, their text, and what writing it back needs."""

    data: bytes
    text: str
    encoding: str
    mode: int  # the permission bits (0o755 for an executable script)

    @property
    def digest(self) -> str:
        return digest(self.data)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_source_file(path: Path) -> Source:
    """The one place a source file is read: its bytes decoded as Python does (PEP 263 coding
    cookie or BOM, else UTF-8), line endings kept as they are. Raises :class:`ReadError`."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode & 0o777
            data = fh.read()
    except OSError as exc:
        raise ReadError(f"cannot be read: {exc.strerror or exc}") from None
    try:
        encoding, _ = tokenize.detect_encoding(iter(data.splitlines(keepends=True)).__next__)
    except SyntaxError as exc:
        raise ReadError(f"bad coding declaration: {exc.msg}") from None
    except StopIteration:
        encoding = "utf-8"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        if encoding in ("utf-8", "utf-8-sig"):
            raise ReadError(
                f"not valid UTF-8 and no coding declaration (PEP 263): byte "
                f"0x{data[exc.start]:02x} at offset {exc.start}") from None
        raise ReadError(f"does not decode as its declared {encoding}: {exc.reason} at offset "
                        f"{exc.start}") from None
    if encoding == "utf-8-sig":
        text = text.removeprefix("\ufeff")
    if "\x00" in text:
        raise ReadError("holds NUL bytes (binary, not Python source)")
    return Source(data, text, encoding, mode)


def read_source(path: Path) -> str:
    """The file's text, decoded as Python does (PEP 263 coding cookie, else UTF-8)."""
    return read_python(path)[0]


# --- writing -------------------------------------------------------------------------------------
#
# Every output goes through write_atomic: the new content is written to a temporary file in the
# destination's folder, given its mode, flushed to disk, and renamed over the destination, so a
# reader (or a run killed at any moment) sees the old file or the new one, never a partial one.
# On Linux the temporary file has no name while it is written (O_TMPFILE); it is named
# ``.NAME.t2j-PID-RANDOM.tmp`` only for the instant between linking it into the folder and the
# rename. A run killed in that instant leaves that one file; later runs remove such files of
# dead processes from the folders they write to (remove_stale_temps).

TEMP_NAME = re.compile(r"^\..*\.t2j-(?P<pid>\d+)-[0-9a-f]+\.tmp$", re.DOTALL)


class Changed(OSError):
    """The destination no longer holds what was read from it: it was edited or deleted while
    it was converted (``--in-place``); it is left as it is."""


def _temp_name(folder: Path, name: str) -> Path:
    return folder / f".{name[:180]}.t2j-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _unnamed_temp(folder: Path) -> int | None:
    """A file descriptor of an unnamed file in ``folder`` (Linux O_TMPFILE), or None where the
    system or the file system has none."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, flag | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None  # a file system without O_TMPFILE (NFS, some FUSE)
        raise


def _link_unnamed(fd: int, name: Path) -> None:
    """Give the O_TMPFILE file ``fd`` the name ``name``: linkat(2) through /proc/self/fd with
    AT_SYMLINK_FOLLOW (os.link uses linkat only when given a folder descriptor)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(fd), name, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _unchanged(path: Path, expect: str) -> None:
    try:
        with open(path, "rb") as fh:
            now = fh.read()
    except FileNotFoundError:
        raise Changed(errno.ENOENT, "it was deleted while it was converted") from None
    if digest(now) != expect:
        raise Changed(errno.EBUSY, "it changed while it was converted")


def write_atomic(path: Path, data: str | bytes, encoding: str = "utf-8", *,
                 mode: int | None = None, expect: str | None = None) -> None:
    """The one place an output is written: ``data`` (text is encoded with ``encoding``,
    newlines as they are) replaces ``path`` atomically, with ``mode`` (default: the mode of
    the file it replaces, else 0o644). ``expect``: the digest of what was read from ``path``;
    when its content differs now (an edit during the run), :class:`Changed` is raised and the
    file is left as it is. Other failures raise ``OSError``; no temporary file stays behind."""
    path = Path(path)
    payload = data.encode(encoding) if isinstance(data, str) else data
    if mode is None:
        try:
            mode = os.lstat(path).st_mode & 0o777
        except OSError:
            mode = 0o644
    folder = path.parent
    fd = _unnamed_temp(folder)
    tmp: Path | None = None
    if fd is None:
        tmp = _temp_name(folder, path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
        if expect is not None:
            _unchanged(path, expect)
        if tmp is None:
            tmp = _temp_name(folder, path.name)
            _link_unnamed(fd, tmp)
        os.replace(tmp, path)
        tmp = None
    finally:
        os.close(fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def copy_atomic(src: Path, dest: Path, mode: int | None = None) -> None:
    """Copy ``src``'s bytes to ``dest`` atomically, with ``src``'s mode unless ``mode``."""
    with open(src, "rb") as fh:
        data = fh.read()
        if mode is None:
            mode = os.fstat(fh.fileno()).st_mode & 0o777
    write_atomic(dest, data, mode=mode)


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temporary files that killed runs left in ``folder`` (``.NAME.t2j-PID-*.tmp``
    of processes that no longer run); returns them."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = TEMP_NAME.match(entry.name)
        if m is None or _alive(int(m["pid"])):
            continue
        with contextlib.suppress(OSError):
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
