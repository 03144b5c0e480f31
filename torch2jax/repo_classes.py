"""How the module classes a file imports from other files of the repository are called on a
target whose training code needs it (equinox: ``from model import GPT`` in a training script).

The training code of the importing file needs them: whether the model keeps BatchNorm state
(``model(x, state)``), takes a dropout key, is called on the batch as it is, draws in its
forward pass. They are facts of the equinox form of the other file, so that file is
converted (its own first pass over the files it imports included), and the flags come from
its result (``ConversionResult.module_flags``): what the class is, not a guess from its
torch source. Each file is converted once per process; a file that imports, through others,
the file being read is not followed (its classes stay unknown, and what needs them is marked).
Not a module of ``targets/``, which keep no state: the cache of converted files is this one's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path

from torch2jax.repo import CLASS_FILE, import_closure, index_repository
from torch2jax.result import ConversionResult, ModuleFlags

# (path, modification time, target) -> the file's module classes -> flags
_CACHE: dict[tuple[Path, float, str], dict[str, ModuleFlags]] = {}
_READING: set[Path] = set()  # the files being converted for their flags (a cycle stops)


def class_files(known: Collection[str]) -> dict[str, tuple[Path, str]]:
    """The bound name -> (the file defining the class, its name there), from the known
    names the first pass gave the file (repo.py's CLASS_FILE entries)."""
    out = {}
    for k in known:
        if k.startswith(CLASS_FILE):
            local, _, rest = k.removeprefix(CLASS_FILE).partition("=")
            path, _, cls = rest.rpartition("::")
            if local and path and cls:
                out[local] = (Path(path), cls)
    return out


class ImportedFlags(Mapping[str, ModuleFlags]):
    """The flags of the classes in ``known`` (a file's known names) that another file of the
    repository defines, as ``convert`` (convert_source, with the rules) makes them for
    ``target``; a class whose file cannot be read or converted has none. Read when asked for:
    only the classes the file builds cost the other file's conversion."""

    def __init__(self, known: Collection[str], target: str, layers: Collection[str],
                 convert: Callable[..., ConversionResult]) -> None:
        self.files = class_files(known)
        self.target, self.layers, self.convert = target, layers, convert

    def __getitem__(self, name: str) -> ModuleFlags:
        if name not in self.files:
            raise KeyError(name)
        path, cls = self.files[name]
        flags = _file_flags(path, self.target, self.layers, self.convert)
        if cls not in flags:
            raise KeyError(name)
        return flags[cls]

    def __iter__(self) -> Iterator[str]:
        return (n for n in self.files if n in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _file_flags(path: Path, target: str, layers: Collection[str],
                convert: Callable[..., ConversionResult]) -> dict[str, ModuleFlags]:
    try:
        key = (path, path.stat().st_mtime, target)
        if key in _CACHE:
            return _CACHE[key]
        if path in _READING:
            return {}
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    _READING.add(path)
    try:
        repo = index_repository(import_closure([path]), layers)
        result = convert(text, path=str(path), target=target,
                         known_modules=set(repo.known_for(path)),
                         public=set(repo.exported_from(path)) or None)
        flags = dict(result.module_flags)
    except Exception:  # noqa: BLE001 - that file's own conversion reports its failure
        flags = {}
    finally:
        _READING.discard(path)
    _CACHE[key] = flags
    return flags
