"""The folders ``verify --program`` runs the two programs in: each side gets its own copy of
the current folder, so that what a program writes (a checkpoint over the user's own
``model.pt``, an orbax folder where torch wrote a file) lands in the copy, and neither side
reads what the other wrote.

The copy holds the folder's files (so a program reads its data and configs as it would) up to
a budget; past it, and for the files too large to copy, it holds symbolic links to them.
Hidden folders (``.git``), virtual environments and caches are linked whole. A linked file
that a program rewrites is the user's own: :func:`changed_links` names those after the run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

FILE_LIMIT = 64 << 20  # a larger file is linked, not copied
TOTAL_LIMIT = 256 << 20  # bytes copied per side
COUNT_LIMIT = 5000  # files copied per side
_LINKED_DIRS = {"__pycache__", "node_modules", "site-packages", "wandb", "mlruns"}


@dataclass
class Scratch:
    root: Path  # the copy of the folder
    source: Path  # the folder copied
    links: dict[Path, tuple[int, int]] = field(default_factory=dict)  # link -> (mtime, size)
    copied: int = 0
    copied_bytes: int = 0

    def place(self, path: Path) -> Path:
        """``path``'s counterpart in the copy (itself when outside the folder)."""
        resolved = path.resolve()
        try:
            return self.root / resolved.relative_to(self.source)
        except ValueError:
            return resolved


def _linked_whole(entry: os.DirEntry) -> bool:
    return entry.name.startswith(".") or entry.name in _LINKED_DIRS or os.path.exists(
        os.path.join(entry.path, "pyvenv.cfg"))


def _link(s: Scratch, src: str, dst: Path) -> None:
    os.symlink(src, dst)
    try:
        st = os.stat(src)
        if not os.path.isdir(src):
            s.links[dst] = (st.st_mtime_ns, st.st_size)
    except OSError:
        pass


def _mirror(s: Scratch, src: str, dst: Path) -> None:
    dst.mkdir(exist_ok=True)
    try:
        entries = sorted(os.scandir(src), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        target = dst / entry.name
        if str(s.root) == entry.path or str(s.root).startswith(entry.path + os.sep):
            continue  # (the copies themselves, where the temporary folder is inside)
        if entry.is_symlink():
            _link(s, os.path.realpath(entry.path), target)
        elif entry.is_dir():
            if _linked_whole(entry) or s.copied >= COUNT_LIMIT:
                _link(s, entry.path, target)
            else:
                _mirror(s, entry.path, target)
        elif entry.is_file():
            size = entry.stat().st_size
            if size <= FILE_LIMIT and s.copied_bytes + size <= TOTAL_LIMIT and \
                    s.copied < COUNT_LIMIT:
                shutil.copy2(entry.path, target)
                s.copied += 1
                s.copied_bytes += size
            else:
                _link(s, entry.path, target)


def scratch_folder(source: Path, root: Path) -> Scratch:
    """A copy of ``source`` at ``root`` for one side's run."""
    s = Scratch(root, source.resolve())
    _mirror(s, str(s.source), root)
    return s


def changed_links(s: Scratch) -> list[str]:
    """The linked files (the user's own) whose size or time changed during the run."""
    out = []
    for link, (mtime, size) in s.links.items():
        try:
            st = os.stat(link)
        except OSError:
            continue
        if (st.st_mtime_ns, st.st_size) != (mtime, size):
            out.append(str(link.relative_to(s.root)))
    return out
