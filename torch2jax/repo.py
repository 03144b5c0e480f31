"""Whole repositories: which classes of which file are ``nn.Module`` subclasses.

:func:`convert_source` sees one file. A class that derives from a module class defined in
another file of the repository (``class Net(Block)`` with ``from .blocks import Block``), or a
layer built from such a class (``self.block = Block(dim)``), is only recognised when the
converter is told which imported names are module classes: ``known_modules``.

This module computes them with a cheap first pass over the repository (Python's ``ast``, no
libcst metadata):

1. every file gets its module name (``pkg/sub/mod.py`` -> ``pkg.sub.mod``, found by walking up
   through the folders that hold an ``__init__.py``; a script outside a package is named by its
   stem, so ``import config`` from a sibling resolves);
2. each module's top-level namespace: its classes (with their bases as written), what its
   imports bind (relative imports resolved against the package, ``__init__`` re-exports and
   ``from .x import *`` followed) and simple aliases (``Alias = Block``);
3. a fixed point over the whole repository: a class is a module class when a base resolves to
   ``torch.nn.Module``, to a torch layer of the rules, or to a module class of the repository;
4. for every file, the names its imports bind to repository module classes, written both as
   the bound name (``B`` for ``from .blocks import Block as B``) and as the qualified name
   libcst gives an attribute use of the import (``.blocks.Block``, ``pkg.blocks.Block``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from torch2jax.analysis.layer_bases import LAYER_BASE
from torch2jax.analysis.torch_api import RANDOM, SEEDS

MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
# in a file's known names: a function of another file that seeds and returns nothing (its
# conversion returns a key), written SEED_FUNCTION + the name the file binds it to
SEED_FUNCTION = "seed-function:"
# in a file's known names: a function of another converted file that builds layers (its
# conversion takes rngs, so a call of it passes them), written RNGS_FUNCTION + the bound name
RNGS_FUNCTION = "rngs-function:"
# in every file's known names when a Dataset of the repository draws from torch's global
# generator (its draws become numpy's global generator's: each torch.manual_seed of the
# program then seeds numpy's too, passes/host_data.py), and when a file seeds torch's global
# generator (the dataset's file then leaves the seeding to it)
# in a file's known names: a field of a class it imports from another file of the package
# annotated as a module class (timm's byobnet ``LayerFn``: ``conv_norm_act: Type[nn.Module] =
# ConvNormAct``, imported by mobilevit), written TYPE_FIELD + the field's name: a call of it
# builds a layer
TYPE_FIELD = "module-type-field:"
HOST_DRAWS = "host-draws:global"
TORCH_SEEDED = "torch-seeded:global"
# ... and when a file shuffles a loader (DataLoader(shuffle=...), RandomSampler) without seeding
# torch itself: its order's seed is then drawn from numpy's global generator (passes/data.py)
SHUFFLES = "host-shuffles:global"
# in a file's known names: a module class it imports by name from another file of the
# repository, written CLASS_FILE + "<bound name>=<path of that file>::<its class name>": the
# equinox target reads that file's class flags (repo_classes.py)
CLASS_FILE = "class-file:"
_GLOBAL_DRAWS = frozenset({"torch.randint", "torch.randperm", "torch.rand", "torch.randn"})
_TORCH_SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed"})


@dataclass
class _Binding:
    """What a top-level name of a module refers to.

    ``kind``: ``module`` (a module of the repository or outside it: ``target`` is its dotted
    name), ``attr`` (``target`` is a module, ``attr`` a name in it), ``class`` (a class
    defined right here: ``attr`` is its name), ``expr`` (an assignment ``Alias = a.B`` in the
    module ``target``: ``attr`` is the dotted expression). ``qualified`` is the name libcst's
    ``QualifiedNameProvider`` reports for the bound name (relative dots kept).
    """

    kind: str
    target: str
    attr: str = ""
    qualified: str = ""


@dataclass
class _Module:
    name: str
    path: Path
    is_package: bool
    bindings: dict[str, _Binding] = field(default_factory=dict)
    classes: dict[str, list[ast.expr]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)
    all_names: list[str] | None = None
    # top-level functions that seed torch and return nothing (def set_seed(s): torch.manual_seed)
    seed_functions: set[str] = field(default_factory=set)
    facts: set[str] = field(default_factory=set)  # HOST_DRAWS, TORCH_SEEDED (host_facts)


@dataclass
class RepoIndex:
    """The result of the first pass: repository module classes and, per file, the names to
    pass to :func:`convert_source` as ``known_modules``."""

    module_classes: set[tuple[str, str]] = field(default_factory=set)  # (module, class)
    known: dict[Path, set[str]] = field(default_factory=dict)
    # per file, its module classes that other files import (they keep torch's layout)
    exported: dict[Path, set[str]] = field(default_factory=dict)

    def known_for(self, path: Path) -> set[str]:
        return self.known.get(path.resolve(), set())

    def exported_from(self, path: Path) -> set[str]:
        return self.exported.get(path.resolve(), set())


def module_name(path: Path) -> tuple[str, bool]:
    """``(dotted module name, is a package __init__)`` of a Python file, following the
    ``__init__.py`` files up from its folder."""
    path = path.resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    d = path.parent
    while (d / "__init__.py").is_file() and d.parent != d:
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts), path.stem == "__init__"


def import_root(path: Path) -> Path:
    """The folder ``path`` is imported from: the parent of its outermost package (for a script
    outside a package, its own folder)."""
    d = path.resolve().parent
    while (d / "__init__.py").is_file() and d.parent != d:
        d = d.parent
    return d


def import_closure(files: Iterable[Path], limit: int = 5000, read=None) -> list[Path]:
    """``files`` and the repository files they import, transitively (relative imports, and
    absolute ones that resolve under each file's import root), with the ``__init__.py`` of
    every package on the way: what the first pass needs to know about a few files.
    ``read``: how a file's bytes are read (an ``OSError`` skips the file)."""
    read = read or (lambda p: p.read_bytes())
    queue = [p.resolve() for p in files]
    seen: set[Path] = set()
    order: list[Path] = []
    while queue and len(order) < limit:
        path = queue.pop(0)
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        order.append(path)
        name, is_package = module_name(path)
        root = import_root(path)
        mod = _Module(name, path, is_package)
        try:
            tree = ast.parse(read(path))
        except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
            continue
        targets: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (_resolve_relative(mod, node.level, node.module) if node.level
                        else node.module or "")
                targets.append(base)
                targets += [f"{base}.{a.name}" if base else a.name for a in node.names
                            if a.name != "*"]
        for dotted in targets:
            parts = [p for p in dotted.split(".") if p]
            for i in range(1, len(parts) + 1):
                stem = root.joinpath(*parts[:i])
                for candidate in (stem / "__init__.py", stem.with_suffix(".py")):
                    if candidate.is_file() and candidate.resolve() not in seen:
                        queue.append(candidate.resolve())
    return order


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _resolve_relative(mod: _Module, level: int, module: str | None) -> str:
    """The absolute module named by ``from <level dots><module> import ...`` inside ``mod``."""
    package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)] if level - 1 <= len(package) else []
    base = ".".join(p for p in package if p)
    if module:
        return f"{base}.{module}" if base else module
    return base


def _seeds_only(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """``fn`` calls ``torch.manual_seed`` (or ``torch.seed``), draws nothing and returns no
    value: its conversion returns the key it makes (analysis/training.py's seed functions), which
    a caller in another file must then keep."""
    calls = {_dotted(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))
    return bool(calls & SEEDS) and not calls & RANDOM and not returns


def host_facts(tree: ast.Module) -> set[str]:
    """What a file says of the program's host randomness: ``HOST_DRAWS`` when a class whose
    base is a ``...Dataset`` calls ``torch.randint`` / ``randperm`` / ``rand`` / ``randn``
    without a generator, ``TORCH_SEEDED`` when it calls ``torch.manual_seed``."""
    facts: set[str] = set()
    shuffles = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) in _TORCH_SEEDS:
            facts.add(TORCH_SEEDED)
        if isinstance(node, ast.Call):
            name = (_dotted(node.func) or "").rsplit(".", 1)[-1]
            shuffles |= name == "RandomSampler" or name == "DataLoader" and any(
                k.arg == "shuffle" and not (isinstance(k.value, ast.Constant)
                                            and not k.value.value) for k in node.keywords)
        if isinstance(node, ast.ClassDef) and any(
                (_dotted(b) or "").endswith("Dataset") for b in node.bases) and any(
                isinstance(c, ast.Call) and _dotted(c.func) in _GLOBAL_DRAWS
                and not any(k.arg == "generator" for k in c.keywords)
                for c in ast.walk(node)):
            facts.add(HOST_DRAWS)
    if shuffles and TORCH_SEEDED not in facts:
        facts.add(SHUFFLES)
    return facts


def numpy_seeded(facts: set[str]) -> bool:
    """Whether each ``torch.manual_seed`` of a program with these facts seeds numpy's global
    generator too: a dataset draws from it in torch's global generator's place, or a loader
    draws its order's seed from it."""
    return HOST_DRAWS in facts or SHUFFLES in facts


def source_facts(text: str) -> set[str]:
    """:func:`host_facts` of a file's text (none when ``ast`` cannot parse it)."""
    try:
        return host_facts(ast.parse(text))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()


def _collect(mod: _Module, tree: ast.Module) -> None:
    mod.facts = host_facts(tree)
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and _seeds_only(stmt):
            mod.seed_functions.add(stmt.name)
        if isinstance(stmt, ast.ClassDef):
            mod.classes[stmt.name] = list(stmt.bases)
            mod.bindings[stmt.name] = _Binding("class", mod.name, stmt.name, stmt.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    mod.bindings[alias.asname] = _Binding("module", alias.name, "", alias.name)
                else:
                    top = alias.name.split(".")[0]
                    mod.bindings[top] = _Binding("module", top, "", top)
        elif isinstance(stmt, ast.ImportFrom):
            written = "." * stmt.level + (stmt.module or "")
            absolute = (_resolve_relative(mod, stmt.level, stmt.module) if stmt.level
                        else stmt.module or "")
            for alias in stmt.names:
                if alias.name == "*":
                    mod.star_imports.append(absolute)
                    continue
                local = alias.asname or alias.name
                q = f"{written}.{alias.name}" if written and not written.endswith(".") else (
                    f"{written}{alias.name}")
                mod.bindings[local] = _Binding("attr", absolute, alias.name, q)
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name) and target.id == "__all__" and isinstance(
                    stmt.value, (ast.List, ast.Tuple)):
                mod.all_names = [e.value for e in stmt.value.elts
                                 if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            elif isinstance(target, ast.Name) and (src := _dotted(stmt.value)) is not None:
                # Alias = Block / Alias = blocks.Block: resolved like the expression
                mod.bindings[target.id] = _Binding("expr", mod.name, src, target.id)


class _Resolver:
    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules

    def name_in(self, module: str, name: str, seen: frozenset = frozenset()) -> str | None:
        """What ``module.name`` is: ``"repo:<module>:<class>"`` for a class of the repository,
        ``"mod:<dotted>"`` for a module, or the dotted external name (``torch.nn.Linear``)."""
        key = (module, name)
        if key in seen:
            return None
        seen = seen | {key}
        mod = self.modules.get(module)
        if mod is None:
            # a submodule of a repository package, or a name outside the repository
            if f"{module}.{name}" in self.modules:
                return f"mod:{module}.{name}"
            return f"{module}.{name}" if module else name
        b = mod.bindings.get(name)
        if b is None:
            if f"{module}.{name}" in self.modules:
                return f"mod:{module}.{name}"
            for star in mod.star_imports:
                src = self.modules.get(star)
                if src is not None and (src.all_names is None or name in src.all_names) and (
                        name in src.bindings or src.star_imports):
                    found = self.name_in(star, name, seen)
                    if found is not None:
                        return found
            return None
        return self.binding(b, seen)

    def binding(self, b: _Binding, seen: frozenset = frozenset()) -> str | None:
        if b.kind == "class":
            return f"repo:{b.target}:{b.attr}"
        if b.kind == "module":
            return f"mod:{b.target}" if b.target in self.modules else b.target
        if b.kind == "expr":
            key = ("expr", b.target, b.attr)
            return None if key in seen else self.expr_in(b.target, b.attr, seen | {key})
        return self.name_in(b.target, b.attr, seen)

    def expr_in(self, module: str, dotted: str, seen: frozenset = frozenset()) -> str | None:
        """Resolve a dotted expression (``nn.Module``, ``blocks.Block``) written in ``module``."""
        head, *rest = dotted.split(".")
        cur = self.name_in(module, head, seen)
        for part in rest:
            if cur is None:
                return None
            if cur.startswith("mod:"):
                cur = self.name_in(cur[4:], part)
            elif cur.startswith("repo:"):
                return None  # an attribute of a class: not a class we know
            else:
                cur = f"{cur}.{part}"
        if cur is not None and cur.startswith("mod:") and cur[4:] not in self.modules:
            return cur[4:]
        return cur


def index_repository(files: Iterable[Path], torch_layers: Iterable[str] = (),
                     read=None) -> RepoIndex:
    """First pass over ``files`` (all the Python files being converted). ``torch_layers``:
    qualified torch layer names (``rules.layers``) whose subclasses are module classes too.
    Files that cannot be read or parsed are skipped here (the conversion reports them)."""
    read = read or (lambda p: p.read_bytes())
    modules: dict[str, _Module] = {}
    by_path: dict[Path, _Module] = {}
    for path in files:
        try:
            tree = ast.parse(read(path))
        except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
            continue
        name, is_package = module_name(path)
        mod = _Module(name, path.resolve(), is_package)
        _collect(mod, tree)
        # two files with one module name (scripts in unrelated folders): the first one wins
        modules.setdefault(name, mod)
        by_path[mod.path] = mod
    resolver = _Resolver(modules)
    layers = set(torch_layers) | MODULE_BASES

    # classes: resolve every base once, then a fixed point
    bases: dict[tuple[str, str], list[str]] = {}
    for mod in by_path.values():
        for cls, exprs in mod.classes.items():
            resolved = []
            for e in exprs:
                d = _dotted(e)
                r = resolver.expr_in(mod.name, d) if d else None
                if r is not None:
                    resolved.append(r)
            bases[(mod.name, cls)] = resolved
    module_classes: set[tuple[str, str]] = set()
    changed = True
    while changed:
        changed = False
        for key, rs in bases.items():
            if key in module_classes:
                continue
            for r in rs:
                if r in layers or (r.startswith("repo:") and tuple(r[5:].split(":", 1))
                                   in module_classes):
                    module_classes.add(key)
                    changed = True
                    break

    index = RepoIndex(module_classes=module_classes)
    imported: set[tuple[str, str]] = set()
    facts = set().union(*(mod.facts for mod in by_path.values()))  # the whole program's
    for path, mod in by_path.items():
        known: set[str] = set(facts)
        for local, b in mod.bindings.items():
            if b.kind == "class":
                continue  # classes of the file itself: the converter sees them
            if b.kind == "attr" and b.attr in getattr(modules.get(b.target), "seed_functions",
                                                      ()):
                known.add(SEED_FUNCTION + local)  # from .utils import set_seed
            r = resolver.binding(b)
            if r is None:
                continue
            if r.startswith("repo:"):
                target = tuple(r[5:].split(":", 1))
                if target in module_classes:
                    known |= {local, b.qualified}
                    imported.add(target)
                    layer = _layer_base(target, bases, set(torch_layers))
                    if layer is not None:  # class Norm(nn.GroupNorm), subclassed here
                        known.add(f"{LAYER_BASE}{local}={layer}")
                    if target[0] in modules:
                        known.add(f"{CLASS_FILE}{local}={modules[target[0]].path}::{target[1]}")
            elif r.startswith("mod:") or (b.kind == "module" and r in modules):
                # a module of the repository bound to a name: its module classes as attributes
                modname = r.removeprefix("mod:")
                for sub_mod, cls in _reachable(resolver, modname, module_classes):
                    known.add(f"{b.qualified}{sub_mod}.{cls}")
                    imported.add((modname + sub_mod, cls))
        if mod.star_imports:
            # from .parts import *: the module classes that name resolves to there
            for target in module_classes:
                cls = target[1]
                if cls in mod.bindings or cls.startswith("_"):
                    continue
                if resolver.name_in(mod.name, cls) == f"repo:{target[0]}:{target[1]}":
                    known.add(cls)
                    imported.add(target)
        index.known[path] = {k for k in known if k}
    for path, mod in by_path.items():
        index.exported[path] = {cls for name, cls in imported if name == mod.name}
    return index


def _layer_base(key: tuple[str, str], bases: dict[tuple[str, str], list[str]],
                layers: set[str]) -> str | None:
    """The torch layer of ``layers`` the repository class ``key`` derives from, directly or
    through the repository's classes; None if none."""
    seen: set[tuple[str, str]] = set()
    work = [key]
    while work:
        key = work.pop()
        if key in seen:
            continue
        seen.add(key)
        for r in bases.get(key, []):
            if r in layers:
                return r
            if r.startswith("repo:"):
                work.append(tuple(r[5:].split(":", 1)))
    return None


def _reachable(resolver: _Resolver, modname: str,
               module_classes: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(".sub" path, class)`` for the module classes reachable as attributes of the module
    ``modname`` (its own names, and those of its submodules in the repository)."""
    out: list[tuple[str, str]] = []
    for mod_name, cls in sorted(module_classes):
        if mod_name == modname or mod_name.startswith(modname + "."):
            sub = mod_name[len(modname):]
            out.append((sub, cls))
    mod = resolver.modules.get(modname)
    if mod is not None:  # re-exports: names of the module bound to module classes elsewhere
        for local in list(mod.bindings):
            r = resolver.name_in(modname, local)
            if r and r.startswith("repo:") and tuple(r[5:].split(":", 1)) in module_classes:
                out.append(("", local))
    return out
