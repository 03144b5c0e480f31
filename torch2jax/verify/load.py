"""Import a Python file by path, the way ``python FILE.py`` would see its siblings.

The torch original and its converted JAX twin usually sit in different directories but have
sibling modules with the same names (``model.py`` importing ``config.py``). Each load puts the
file's directory first on ``sys.path``, hides same-named modules imported from elsewhere, and
afterwards forgets the siblings it imported, so the JAX side never picks up a torch sibling
cached by the torch load (and the reverse).

A model file is often a training script too. Importing it runs its top level, which
:func:`script_guard` keeps harmless: the file is imported under a name of its own (never
``__main__``, so an ``if __name__ == "__main__":`` block does not run), ``sys.argv`` holds the
file alone (an ``argparse`` parse at the top level reads its defaults, not verify's own
arguments), and every network connection fails at once with ``OSError`` (a download at the top
level, guarded by ``try``, falls back at once instead of hanging or fetching gigabytes). A
package the script imports unguarded at its top level but that is not installed (``import
requests``, ``import wandb``) gets a stand-in (:func:`stand_ins`) whose functions raise
``ModuleNotFoundError`` when called, with a warning: the model can be checked as long as it does
not need the package itself.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import socket
import sys
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

_counter = itertools.count()


class LoadError(RuntimeError):
    """The file or the name in it could not be loaded; the message says which and why."""


def split_target(target: str) -> tuple[Path, str]:
    """``path/to/file.py::Name`` -> (Path, "Name")."""
    path, sep, name = target.rpartition("::")
    if not sep or not path or not name.isidentifier():
        raise LoadError(f"bad target {target!r}: expected FILE.py::Name, e.g. models/mlp.py::MLP")
    return Path(path), name


def _module_file(module: Any) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _local_names(directory: Path) -> set[str]:
    names = {p.stem for p in directory.glob("*.py")}
    names |= {p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
    return names


def _is_under(module: Any, directory: Path) -> bool:
    file = _module_file(module)
    return file is not None and directory in file.parents


@contextmanager
def sibling_imports(directory: Path) -> Iterator[None]:
    """Make ``directory`` the first import location for the duration of the block."""
    directory = directory.resolve()
    hidden = {
        name: sys.modules.pop(name)
        for name in _local_names(directory)
        if name in sys.modules and not _is_under(sys.modules[name], directory)
    }
    before = set(sys.modules)
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        sys.path.remove(str(directory))
        for name in set(sys.modules) - before:
            if _is_under(sys.modules[name], directory):
                del sys.modules[name]
        sys.modules.update(hidden)


class NetworkBlocked(OSError):
    """A network connection attempted while verify imported a file (:func:`script_guard`)."""


_INET = (socket.AF_INET, socket.AF_INET6)


@contextmanager
def script_guard(path: Path) -> Iterator[None]:
    """For the import of ``path``: ``sys.argv == [path]``, and no network (a connection
    raises :class:`NetworkBlocked` at once; local Unix sockets still work). Both are restored
    afterwards."""
    argv = sys.argv
    saved = {name: getattr(socket.socket, name) for name in ("connect", "connect_ex")}
    getaddrinfo = socket.getaddrinfo

    def refuse(what: object) -> NetworkBlocked:
        return NetworkBlocked(f"network access is blocked while torch2jax verify imports "
                              f"{path} (it tried to reach {what})")

    def connect(sock: socket.socket, address: object) -> None:
        if sock.family in _INET:
            raise refuse(address)
        saved["connect"](sock, address)

    def connect_ex(sock: socket.socket, address: object) -> int:
        if sock.family in _INET:
            raise refuse(address)
        return saved["connect_ex"](sock, address)

    def no_lookup(host: object, *args: object, **kwargs: object) -> object:
        raise refuse(host)

    sys.argv = [str(path)]
    socket.socket.connect, socket.socket.connect_ex = connect, connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = no_lookup  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.argv = argv
        socket.socket.connect, socket.socket.connect_ex = saved["connect"], saved["connect_ex"]  # type: ignore[method-assign]
        socket.getaddrinfo = getaddrinfo


def load_module(path: str | Path, *, prefix: str = "torch2jax_verify") -> ModuleType:
    """Execute the file at ``path`` as a fresh module with a unique name and return it.

    The module stays registered in ``sys.modules`` under that name because dataclasses and
    pickling look classes up there.
    """
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"{path}: no such file")
    from torch2jax.verify.package import import_package_file, package_of

    if package_of(path) is not None:  # relative imports: import it by its dotted name
        try:
            with script_guard(path):
                return import_package_file(path)
        except (Exception, SystemExit) as exc:
            raise LoadError(f"importing {path} failed: {_where(exc, path)}") from exc
    absent: list[str] = []  # packages not installed that get a stand-in (stand_ins)
    while True:
        name = f"{prefix}_{path.stem}_{next(_counter)}"
        spec = importlib.util.spec_from_file_location(name, path.resolve())
        if spec is None or spec.loader is None:
            raise LoadError(f"{path}: cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        with sibling_imports(path.parent), script_guard(path), stand_ins(absent):
            try:
                spec.loader.exec_module(module)
            except BaseException as exc:
                del sys.modules[name]
                if isinstance(exc, KeyboardInterrupt):
                    raise
                missing = _missing_top_level_import(exc, path, absent)
                if missing is None:
                    raise LoadError(f"importing {path} failed: {_where(exc, path)}") from exc
                warnings.warn(f"{path}: {missing} is not installed; verify imports it as a "
                              "stand-in whose functions raise ModuleNotFoundError when called",
                              stacklevel=2)
                absent.append(missing)
                continue
        return module


# never replaced by a stand-in: verify itself needs them, a model without them cannot be checked
_NEEDED = frozenset({"torch", "jax", "jaxlib", "flax", "numpy", "optax", "equinox"})


def _missing_top_level_import(exc: BaseException, path: Path, absent: list[str]) -> str | None:
    """The package that ``exc`` says is not installed, when the file imports it at its top
    level outside any ``try`` (a guarded import handles its absence itself) and it is not one
    of those verify needs; else None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    if top in absent or top in _NEEDED:
        return None
    try:
        body = ast.parse(path.read_text()).body
    except (SyntaxError, ValueError, OSError):
        return None
    for stmt in body:
        if isinstance(stmt, ast.Import) and any(a.name.split(".")[0] == top for a in stmt.names):
            return top
        if isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module and \
                stmt.module.split(".")[0] == top:
            return top
    return None


class _Absent:
    """What a stand-in package holds: any attribute is another ``_Absent``; calling one
    raises ``ModuleNotFoundError``."""

    def __init__(self, what: str, package: str) -> None:
        self._what, self._package = what, package

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in_attribute(f"{self._what}.{attr}", attr, self._package)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ModuleNotFoundError(f"{self._what}: {self._package} is not installed (torch2jax "
                                  "verify imported a stand-in for it)", name=self._package)

    def __repr__(self) -> str:
        return f"<stand-in for {self._what}: {self._package} is not installed>"


def _stand_in_attribute(what: str, attr: str, package: str) -> Any:
    # ``except requests.RequestException:`` must catch what the stand-in raises
    if attr.endswith(("Error", "Exception")):
        return ModuleNotFoundError
    return _Absent(what, package)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a stand-in module for ``packages`` and their submodules."""

    def __init__(self, packages: list[str]) -> None:
        self.packages = packages

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.packages:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> ModuleType:
        stub = ModuleType(spec.name, "stand-in: not installed")
        package = spec.name.split(".")[0]
        stub.__getattr__ = _Absent(spec.name, package).__getattr__  # type: ignore[method-assign]
        return stub

    def exec_module(self, module: ModuleType) -> None:
        return None


@contextmanager
def stand_ins(packages: list[str]) -> Iterator[None]:
    """A stand-in module for each of ``packages`` (not installed) and their submodules during
    the block: ``import requests`` succeeds, ``requests.get(url)`` raises
    ModuleNotFoundError. Forgotten afterwards."""
    if not packages:
        yield
        return
    finder = _StandInFinder(packages)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.split(".")[0] in packages]:
            if isinstance(sys.modules[name].__spec__ and sys.modules[name].__spec__.loader,
                          _StandInFinder):
                del sys.modules[name]


def _where(exc: BaseException, path: Path) -> str:
    """``Type: message (line N: source)`` for the deepest frame in ``path``."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):  # argparse with a required argument, say
        text = (f"the file's top level exited (SystemExit: {exc.code}); it is imported with "
                "sys.argv holding the file alone, so an argparse parse sees no arguments: "
                "give its options defaults")
    target = str(path.resolve())
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == target]
    if isinstance(exc, SyntaxError) or not frames:
        return text
    return f"{text} (line {frames[-1].lineno}: {(frames[-1].line or '').strip()})"


def find_name(module: ModuleType, name: str, path: str | Path) -> Any:
    """``module.name``, or a LoadError that lists the classes the file does define."""
    try:
        return getattr(module, name)
    except AttributeError:
        classes = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and getattr(v, "__module__", None) == module.__name__
        )
        hint = f"; it defines {', '.join(classes)}" if classes else ""
        raise LoadError(f"{path} has no {name!r}{hint}") from None
