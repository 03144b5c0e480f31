"""Verify a model file that lives inside an installed package (``torchvision/models/resnet.py``).

Such a file imports its helpers relatively (``from ..ops.misc import Conv2dNormActivation``,
``from ._api import register_model``), so it cannot be run as a loose script:

* the torch side imports it by its dotted name (``torchvision.models.resnet``);
* the JAX side is a *mirror package* under a fresh top-level name (``torchvision_jax_0``) in
  the verifier's temporary directory: the model file converted, the package modules it takes
  layer classes from (names used inside its functions that are ``nn.Module`` subclasses)
  converted too, and every other module it reaches (logging hooks, weight enums, registries)
  copied verbatim, so that they run as in torch, inert, with registries of their own. The
  package's ``__init__`` files are left empty in the mirror: only what the file needs is
  imported. Nothing is downloaded: the builders run with their default ``weights=None``.
  The converted modules are converted after the converted modules they import: the
  functions of a dependency whose conversion takes ``rngs`` (timm's ``create_classifier``)
  are handed to the importer's conversion, which passes ``rngs`` to them.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import itertools
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

from torch2jax.analysis.layer_bases import LAYER_BASE
from torch2jax.hf import (
    AUTO_TABLE,
    BACKBONE_MODULE,
    BACKBONE_RUNTIME,
    SUPPORT_LAYERS,
    is_modeling_file,
    package_of,
    reduce_modeling,
    write_support_modules,
)
from torch2jax.repo import RNGS_FUNCTION, TYPE_FIELD
from torch2jax.verify.package_imports import imported_models

_counter = itertools.count()


@contextlib.contextmanager
def _resolving(path: Path) -> Iterator[str]:
    """Within the block, ``path``'s package is the one its dotted name imports and resolves
    to (yields that name).

    A package of the same name imported from elsewhere (the torch original of an edited copy
    of its conversion: ``original/mingpt`` and ``edited/mingpt``; another model's package of
    the same name verified earlier in the process) is set aside for the block and put back
    afterwards; the modules imported from ``path``'s tree are then not left in
    ``sys.modules``, so the next import of either package finds its own files. Without it,
    ``find_spec`` would find the earlier package's modules in ``sys.modules`` and the mirror
    would convert their files."""
    root, name = package_of(path)  # type: ignore[misc]
    top = name.split(".")[0]
    hidden = {key: sys.modules.pop(key) for key in [
        k for k, m in sys.modules.items()
        if (k == top or k.startswith(top + ".")) and not _under(m, root)]}
    before = set(sys.modules)
    sys.path.insert(0, str(root))
    try:
        yield name
    finally:
        sys.path.remove(str(root))
        if hidden:
            for key in set(sys.modules) - before:
                if key == top or key.startswith(top + "."):
                    del sys.modules[key]
            sys.modules.update(hidden)


def import_package_file(path: Path) -> ModuleType:
    """Import the package module at ``path`` by its dotted name (:func:`_resolving`)."""
    with _resolving(path) as name:
        module = importlib.import_module(name)
    if Path(module.__file__ or "").resolve() != path.resolve():
        raise ImportError(f"{name} resolves to {module.__file__}, not to {path}")
    return module


def _under(module: ModuleType, root: Path) -> bool:
    file = getattr(module, "__file__", None)
    return bool(file) and root.resolve() in Path(file).resolve().parents


def _relative_imports(source: str, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """(absolute module name, imported names) for each relative ``from ... import``."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    top = module.split(".")[0]
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and node.module.split(".")[0] == top):
            # from torchvision.ops import StochasticDepth: the package's own module, absolutely
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names = [a.name for a in node.names]
            if node.module is None:  # from . import sub: the names are submodules
                out += [(f"{target}.{n}", []) for n in names]
            else:
                out.append((target, names))
    return out


def _merged(deps: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """One entry per module, its names joined (nextvit imports from timm.layers twice: the
    second import's names must not replace the first's); a star import stays its own."""
    out: dict[tuple[str, bool], list[str]] = {}
    for dep, names in deps:
        have = out.setdefault((dep, names == ["*"]), [])
        have += [n for n in names if n not in have]
    return [(dep, names) for (dep, _), names in out.items()]


def _names_in_functions(source: str) -> set[str]:
    """Names read inside function bodies (where layers are built and called), and the base
    classes named by the file's classes."""
    used = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ClassDef):  # class MLPBlock(MLP): a layer class too
            used |= {b.id for b in node.bases if isinstance(b, ast.Name)}
    # a module-level table the functions read (timm's _NORM_ACT_MAP = dict(batchnorm=
    # BatchNormAct2d, ...), and a set made from it): the names in it are used too
    tables = [(t.id, {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)})
              for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)]
    changed = True
    while changed:
        changed = False
        for name, reads in tables:
            if name in used and not reads <= used:
                used |= reads
                changed = True
    # from .factory import create_fc as linear: create_fc is used where linear is
    return used | {a.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) for a in node.names if a.asname in used}


def _layer_classes(module_name: str, names: list[str], used: set[str]) -> set[str]:
    """The imported names that the importer uses inside its functions and that are nn.Module
    classes of that module (so the module is converted, and they are user module classes)."""
    import torch

    try:
        original = importlib.import_module(module_name)
    except ImportError:
        return set()
    if names == ["*"]:  # from ._efficientnet_blocks import * (timm's _efficientnet_builder)
        names = list(getattr(original, "__all__", None) or (
            n for n in vars(original) if not n.startswith("_")))
    found = set()
    for name in names:
        value = getattr(original, name, None)
        if name in used and isinstance(value, type) and issubclass(value, torch.nn.Module):
            found.add(name)
    return found


def _layer_bases(module_name: str, names: set[str]) -> set[str]:
    """``LAYER_BASE + "name=torch.nn.X"`` for the classes ``names`` of that module that derive
    from a torch layer (timm.layers' ``GroupNorm1(nn.GroupNorm)``): their subclasses in the
    importer are subclasses of the layer (analysis/layer_bases.py)."""
    import torch

    original = importlib.import_module(module_name)
    found = set()
    for name in names:
        for base in getattr(getattr(original, name, None), "__mro__", ())[1:]:
            if base.__module__.startswith("torch.nn.") and base is not torch.nn.Module:
                found.add(f"{LAYER_BASE}{name}=torch.nn.{base.__name__}")
                break
    return found


def _layer_functions(module_name: str, names: list[str], used: set[str]) -> set[str]:
    """The imported names that the importer uses inside its functions and that are functions
    of the package whose module uses ``torch.nn`` (timm.layers' get_act_layer, returning layer
    classes; create_conv2d, building a layer) or computes with torch (``ndgrid``): their
    module is converted, not copied, so that what they return is JAX (they are not module classes: ``known`` does not name them).
    A private module's functions (``_api``, ``_builder``) are the package's machinery."""
    import inspect

    try:
        original = importlib.import_module(module_name)
    except ImportError:
        return set()
    top = module_name.split(".")[0]
    found = set()
    for name in names:
        value = getattr(original, name, None)
        home = getattr(value, "__module__", "") or ""
        if name in used and _builder_class(value, home, top):
            found.add(name)  # a builder object's class (or a class holding layer classes)
            continue
        if not (name in used and inspect.isfunction(value) and home.startswith(top + ".")):
            continue
        if home.rpartition(".")[2].startswith("_") and not _walks_modules(value):
            continue  # the package's machinery (_api, _utils, _builder: registries, weight
            # enums, argument helpers) is copied and runs inert; a function that walks the
            # model it is given (timm's named_apply: module.named_children()) runs on the
            # converted model, so its module is converted (so one walking named_modules())
        if _builds_layers(home) or _computes_with_torch(value):
            found.add(name)
    return found


def _builder_class(value: object, home: str, top: str) -> bool:
    """A class of the package that is not a module but whose methods build module classes of
    its module (timm's ``EfficientNetBuilder``, its ``__call__`` building the model's blocks),
    or whose fields hold them (byobnet's ``LayerFn``): its module is converted (copied, it
    would build the converted classes without rngs, or hold torch's)."""
    import inspect
    import textwrap

    import torch

    if not (inspect.isclass(value) and home.startswith(top + ".")
            and not issubclass(value, torch.nn.Module)):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(value)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return False
    space = vars(sys.modules.get(home) or importlib.import_module(home))
    return any(isinstance(n, ast.Name) and isinstance(space.get(n.id), type)
               and issubclass(space[n.id], torch.nn.Module) for n in ast.walk(tree))


def _type_fields(source: str, module: str, is_package: bool,
                 reexported: dict[str, dict[str, str]]) -> set[str]:
    """The fields annotated as module classes of the plain classes the module imports from the
    package (timm's byobnet ``LayerFn``: ``conv_norm_act: Type[nn.Module] = ConvNormAct``,
    imported by mobilevit, which calls ``layers.conv_norm_act(...)``), as known names."""
    import inspect
    import textwrap

    import torch

    found = set()
    for _, home, attr in _imported_functions(source, module, is_package, reexported):
        try:
            value = getattr(importlib.import_module(home), attr, None)
            tree = ast.parse(textwrap.dedent(inspect.getsource(value))) if inspect.isclass(
                value) and not issubclass(value, torch.nn.Module) else None
        except (ImportError, OSError, TypeError, SyntaxError):
            continue
        found |= {TYPE_FIELD + line.target.id for line in (tree.body[0].body if tree else ())
                  if isinstance(line, ast.AnnAssign) and isinstance(line.target, ast.Name)
                  and re.search(r"\bType\[.*Module\b", ast.unparse(line.annotation))}
    return found


def _computes_with_torch(fn: object) -> bool:
    """Whether the package function computes with torch tensors (timm.layers' ``ndgrid`` is
    ``torch.meshgrid(..., indexing='ij')``, called while building a model to compute its
    buffers): its module copied, it would be handed the converted model's JAX arrays. Not
    a function that only asks torch about the run (``torch.jit.is_scripting()``,
    ``torch.compiler.is_exporting()``)."""
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
               and n.value.id == "torch" and n.attr not in ("jit", "compiler", "fx")
               and not n.attr.startswith("_") for n in ast.walk(tree))


def _walks_modules(fn: object) -> bool:
    """Whether the function reads a module's children (``module.named_children()``) or walks
    its modules (``model.named_modules()``: timm's efficientnet_init_weights)."""
    import inspect

    try:
        source = inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    return bool(re.search(r"\.((named_)?children|named_modules)\(\)", source))


def _builds_layers(module: str, seen: set[str] | None = None) -> bool:
    """Whether the package module uses ``torch.nn``, or imports from the package a layer
    class or a function of such a module (timm's create_conv2d.py imports no torch: its
    create_conv2d calls create_conv2d_pad and MixedConv2d)."""
    import inspect

    import torch

    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    try:
        file, is_package = _source_of(module)
        source = file.read_text()
    except (ImportError, OSError):
        return False
    if "torch.nn" in source or "import nn" in source:
        return True
    top = module.split(".")[0]
    for dep, names in _relative_imports(source, module, is_package):
        if names == ["*"] and _builds_layers(dep, seen):
            return True  # from .activations import *: its torch and layer classes
        try:
            original = importlib.import_module(dep)
        except ImportError:
            continue
        for name in names:
            value = getattr(original, name, None)
            if isinstance(value, type) and issubclass(value, torch.nn.Module):
                return True
            home = getattr(value, "__module__", "") or ""
            if inspect.isfunction(value) and home.startswith(top + ".") and _builds_layers(
                    home, seen):
                return True
    return False


def _moved_layer_classes(package: str, classes: set[str]) -> dict[str, str]:
    """{class: submodule} for the layer classes a package re-exports from a submodule of its
    own (torchvision.ops.StochasticDepth is torchvision.ops.stochastic_depth's)."""
    try:
        _, is_package = _source_of(package)
        original = importlib.import_module(package)
    except ImportError:
        return {}
    if not is_package:
        return {}
    moved = {}
    for name in classes:
        home = getattr(getattr(original, name, None), "__module__", "") or ""
        if home.startswith(package + ".") and "." not in home[len(package) + 1:]:
            moved[name] = home[len(package) + 1:]
    return moved


def _reduced(source: str, module: str, entries: dict[str, set[str] | None],
             model_types: set[str] | None
             ) -> tuple[str, list[str], set[str], dict[tuple[str, str], tuple[str, str]]]:
    """The modeling file ``module`` reduced to the classes ``entries`` wants of it and those
    of its own that its auto classes build (Gemma3Model's ``AutoModel.from_config(
    config.text_config)``, a Gemma3TextModel: added to ``entries`` before the file is
    converted, not after, which converted the file a second time): ``(source, the machinery
    names with no JAX counterpart, the auto classes it uses, _auto_models' table)``."""
    while True:
        used: set[str] = set()
        reduced, unknown = reduce_modeling(source, module, entries.get(module), used)
        found = _auto_models(module, used, model_types or set()) if used else {}
        wanted = entries.get(module)
        kept = {n.name for n in ast.parse(reduced).body if isinstance(n, ast.ClassDef)}
        own = {cls for sub, cls in found.values() if sub == module} - kept
        if wanted is None or own <= wanted:  # (a class the reduction cannot keep: as is)
            return reduced, unknown, used, found
        entries[module] = wanted | own


def _auto_models(module_name: str, autos: set[str], types: set[str]
                 ) -> dict[tuple[str, str], tuple[str, str]]:
    """{(auto class, model_type): (modeling module, class)} for the sub-configs that the
    default configs of ``module_name``'s models hold (LlavaConfig's text_config, a LlamaConfig):
    the classes ``AutoModel.from_config(config.text_config)`` builds there, as transformers'
    own auto mappings name them; and those of the model ``types`` given."""
    import transformers
    from transformers import PretrainedConfig, PreTrainedModel
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    original = importlib.import_module(module_name)
    configs = {c.config_class for c in vars(original).values() if isinstance(c, type)
               and issubclass(c, PreTrainedModel) and isinstance(c.config_class, type)}
    types = set(types)

    def walk(config, depth: int = 0) -> None:
        for value in vars(config).values():
            if isinstance(value, PretrainedConfig) and depth < 4:
                # transformers' auto classes map the config's class (MimiEncoderConfig's
                # "mimi_encoder", where the instance says "mimi")
                types.update((value.model_type, type(value).model_type))
                walk(value, depth + 1)

    for config_class in configs:
        # a model building its whole config with an auto class (ShieldGemma2's Gemma3)
        types.add(config_class.model_type)
        with contextlib.suppress(Exception):  # a config whose defaults do not build: none
            walk(config_class())
    table = {}
    for auto in autos:
        names = getattr(getattr(transformers, auto, None), "_model_mapping", None)
        for model_type in types:
            name = getattr(names, "_model_mapping", {}).get(model_type)
            name = name[0] if isinstance(name, (list, tuple)) else name
            try:
                package = importlib.import_module(
                    f"transformers.models.{model_type_to_module_name(model_type)}")
                # (a class of another model's package: ShieldGemma2's Gemma3 model)
                cls = (getattr(package, name, None) or getattr(transformers, name)) if name \
                    else None
            except (ImportError, AttributeError):
                continue
            if cls is not None and is_modeling_file(cls.__module__):
                table[(auto, model_type)] = (cls.__module__, name)
    return table


def _dependencies_first(root: str, plans: dict, modes: dict[str, str]) -> list[str]:
    """Every planned module, the converted ones after the converted modules they import
    (depth first from ``root``; a cycle is cut where it closes)."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(module: str) -> None:
        seen.add(module)
        if modes.get(module) == "convert":
            for dep in plans[module][3]:
                if dep in plans and dep not in seen:
                    visit(dep)
        order.append(module)

    for module in [root, *plans]:
        if module in plans and module not in seen:
            visit(module)
    return order


def _imported_functions(source: str, module: str, is_package: bool,
                        reexported: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    """(the name bound, the module that defines it, its name there) for each name a
    ``from ... import`` of the package binds; a name a package re-exports from a converted
    submodule of it is that submodule's (from timm.layers import create_classifier)."""
    package = module if is_package else module.rpartition(".")[0]
    top = module.split(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.module is None and not node.level:
            continue
        if node.level:
            home = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        elif node.module.split(".")[0] == top:
            home = node.module
        else:
            continue
        for a in node.names:
            where = reexported.get(home, {}).get(a.name)
            out.append((a.asname or a.name, f"{home}.{where}" if where else home, a.name))
    return out


def _imports_from_home(source: str, module: str, is_package: bool, converted: set[str]) -> str:
    """``source`` with each name it imports from a converted module of the package that is a
    torch function there, imported from its home instead (deit's ``from .vision_transformer
    import VisionTransformer, trunc_normal_``): the converted module no longer binds it (its
    import is dropped, its calls translated), while the importer's calls translate alike; and
    one of timm's initialisers imported relatively from its own module (``from .weight_init
    import trunc_normal_``), imported by its absolute name, which the converter knows."""
    import inspect

    from torch2jax.analysis.index import SAME_AS

    package = module if is_package else module.rpartition(".")[0]
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ImportFrom) and (node.level or node.module)):
            continue
        home = (importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level else node.module)
        if node.module is None:
            continue
        try:
            original = importlib.import_module(home)
        except ImportError:
            continue
        moved, kept = [], []
        for a in node.names:
            value = getattr(original, a.name, None)
            where = getattr(value, "__module__", None) or ""
            torch_fn = (inspect.isfunction(value) or inspect.isbuiltin(value)) and (
                where.split(".")[0] == "torch" or f"{where}.{a.name}" in SAME_AS)
            # (timm.layers' pos_embed_rel.py: from .weight_init import trunc_normal_, its
            # own home imported relatively: absolute, the name is torch's initialiser)
            elsewhere = where != home and home in converted or (
                node.level and f"{where}.{a.name}" in SAME_AS)
            if torch_fn and elsewhere and getattr(value, "__name__", None) == a.name:
                moved.append(f"from {where} import {a.name}"
                             + (f" as {a.asname}" if a.asname else ""))
            else:
                kept.append(a.name + (f" as {a.asname}" if a.asname else ""))
        if moved:
            dots = "." * node.level
            stmts = ([f"from {dots}{node.module} import {', '.join(kept)}"] if kept else []) \
                + moved
            edits.append((node.lineno, node.end_lineno or node.lineno, stmts))
    for first, last, stmts in reversed(edits):
        lines[first - 1:last] = [s + "\n" for s in stmts]
    return "".join(lines)


def _star_torch_imports(source: str, module: str, is_package: bool) -> str:
    """``source`` with the torch modules its star imports of the package bind written out
    after them (timm's create_act.py: ``from .activations import *`` binds ``torch`` and
    ``nn``, and its table reads ``nn.ReLU``): the converter reads a file's imports, so a file
    whose torch comes through a star import is converted as one that imports it."""
    package = module if is_package else module.rpartition(".")[0]
    top = module.split(".")[0]
    lines = source.splitlines(keepends=True)
    edits, written = [], set()
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == ["*"]):
            continue
        home = (importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if node.level else node.module or "")
        if home.split(".")[0] != top:
            continue
        try:
            original = importlib.import_module(home)
        except ImportError:
            continue
        names = getattr(original, "__all__", None) or [
            n for n in vars(original) if not n.startswith("_")]
        stmts = []
        for name in names:
            value = getattr(original, name, None)
            full = getattr(value, "__name__", "") if isinstance(value, ModuleType) else ""
            if full.split(".")[0] != "torch":
                continue
            parent, _, leaf = full.rpartition(".")
            stmt = (f"import {full}" if name == full else
                    f"from {parent} import {leaf} as {name}" if parent else
                    f"import {full} as {name}")
            if stmt not in written:
                written.add(stmt)
                stmts.append(stmt)
        if stmts:
            edits.append((node.end_lineno or node.lineno, stmts))
    for last, stmts in reversed(edits):
        lines[last:last] = [s + "\n" for s in sorted(stmts)]
    return "".join(lines)


def _home_of(module: str, name: str) -> str:
    """The module that defines the function ``module.name`` (a package re-exports it)."""
    try:
        value = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return module
    return getattr(value, "__module__", None) or module


def _rngs_functions(code: str) -> set[str]:
    """The top-level functions of a converted module whose signature takes ``rngs``."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    takes = [(node.name, node) for node in tree.body if isinstance(node, ast.FunctionDef)]
    # (and a builder class's __call__: builder(stem_size, block_args) passes them)
    takes += [(f"{node.name}.__call__", fn) for node in tree.body
              if isinstance(node, ast.ClassDef) and not node.bases for fn in node.body
              if isinstance(fn, ast.FunctionDef) and fn.name == "__call__"]
    # (and any class's other methods, as "*.reset_parameters": a caller's self.attn.
    # reset_parameters() of a layer whose class it does not know passes them where taken)
    takes += [(f"*.{fn.name}", fn) for node in tree.body if isinstance(node, ast.ClassDef)
              for fn in node.body if isinstance(fn, ast.FunctionDef)
              and fn.name not in ("__init__", "__call__")]
    return {name for name, fn in takes if "rngs" in {
        a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]}}


def _source_of(module_name: str) -> tuple[Path, bool]:
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ImportError(f"{module_name}: no Python source")
    return Path(spec.origin), spec.submodule_search_locations is not None


_ALIAS = """# the original module, unconverted (verify's mirror package)
import importlib
import sys

sys.modules[__name__] = importlib.import_module("{original}")
"""

_PACKAGE = """# verify's mirror of the package {original}: its modules here are converted or copied;
# any other name is the original package's
import importlib as _importlib
import sys as _sys
import types as _types
from pathlib import Path as _Path


# layer classes the original package re-exports from a converted submodule of it
_REEXPORTED = {reexported!r}


class _Package(_types.ModuleType):
    def __setattr__(self, name, value):
        if name in _REEXPORTED and isinstance(value, _types.ModuleType):
            return  # the submodule create_attn, named like the function it re-exports:
            # the package's create_attn stays the function (__getattr__)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name):
    here = _Path(__file__).parent
    if name in _REEXPORTED:
        return getattr(_importlib.import_module(__name__ + "." + _REEXPORTED[name]), name)
    if (here / (name + ".py")).is_file() or (here / name / "__init__.py").is_file():
        return _importlib.import_module(__name__ + "." + name)
    return getattr(_importlib.import_module("{original}"), name)
"""


def convert_package_file(
    path: Path, out_dir: Path, convert: Callable[[Path, set[str]], tuple[str, int]],
    entry: set[str] | None = None, alias: str | None = None,
    model_types: set[str] | None = None,
) -> tuple[Path, int]:
    """Write the mirror package for ``path`` under ``out_dir``; return (the converted file's
    path in it, the number of TODOs the conversions left). ``convert(file, known)`` gives
    (JAX source, TODO count); ``known`` names the module classes the file imports from
    converted modules (their constructors take ``rngs``). ``alias``: the mirror's top-level
    name (default: ``<top>_jax_<n>``, new in this process). ``model_types``: transformers
    model types that ``AutoModel.from_config`` may build besides those of the default configs
    (the sub-models of the model verify builds)."""
    with _resolving(path):
        return _convert_package_file(path, out_dir, convert, entry, alias, model_types)


def _convert_package_file(
    path: Path, out_dir: Path, convert: Callable[[Path, set[str]], tuple[str, int]],
    entry: set[str] | None, alias: str | None, model_types: set[str] | None,
) -> tuple[Path, int]:
    found = package_of(path)
    assert found is not None
    _, name = found
    top = name.split(".")[0]
    alias = alias or f"{top}_jax_{next(_counter)}"
    rank = {"alias": 0, "copy": 1, "convert": 2}
    modes: dict[str, str] = {}
    reexported: dict[str, dict[str, str]] = {}  # package -> {layer class: its submodule}
    work = [(name, "convert")]
    counts: dict[str, int] = {}  # the TODOs of each converted module
    forwarded: set[str] = set()
    entries: dict[str, set[str] | None] = {name: entry}  # the classes wanted of a modeling file
    kept: dict[str, set[str]] = {}  # the classes a converted modeling file's reduction kept
    autos: dict[tuple[str, str], tuple[str, str]] = {}  # AutoModel.from_config's table

    def target_of(module: str, is_package: bool) -> Path:
        rel = module.split(".")[1:]
        base = out_dir.joinpath(alias, *rel)
        return base / "__init__.py" if is_package else base.with_suffix(".py")

    plans: dict[str, tuple[Path, bool, str, list, set[str]]] = {}
    while work:
        module, mode = work.pop()
        if module in modes and rank[modes[module]] >= rank[mode]:
            continue
        try:
            file, is_package = _source_of(module)
        except ImportError:
            continue
        if is_package and mode != "convert":
            # the mirror's own __init__ (below) forwards to the original package: from
            # timm.data import IMAGENET_DEFAULT_MEAN, with nothing of timm.data converted
            forwarded.add(module)
            continue
        modes[module] = mode
        source = file.read_text()
        if mode == "convert" and is_modeling_file(module):
            # a transformers modeling file: reduced, its machinery from _hf_support (hf.py)
            target = target_of(module, is_package)
            target.parent.mkdir(parents=True, exist_ok=True)
            source, models, imported = imported_models(source, module)
            source, unknown, used, found = _reduced(source, module, entries, model_types)
            kept[module] = {n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}
            target.write_text(source)
            # load_backbone(config) builds a converted model: it takes rngs
            builds = {RNGS_FUNCTION + "load_backbone"} if "AutoBackbone" in used else set()
            code, n = convert(target, set(SUPPORT_LAYERS) | used | builds | imported)
            counts[module] = n + len(unknown)  # (a file converted again counts once)
            target.write_text(code)
            write_support_modules(out_dir / alias)
            (out_dir / alias / f"{BACKBONE_MODULE}.py").write_text(BACKBONE_RUNTIME.read_text())
            work += [(dep, "alias") for dep, _ in _relative_imports(source, module, is_package)]
            # AutoModel.from_config(config.text_config): the modeling files of the sub-models
            # converted too (only their classes built there), and named in the table
            autos.update(found)
            # (and the models it imports from other modeling files: DPR's BertModel)
            wants = [*sorted(set(found.values())),
                     *((sub, cls) for sub, classes in models.items() for cls in classes)]
            for sub, cls in wants:
                wanted = entries.get(sub, set())
                if wanted is None or (sub in entries and cls in wanted) or cls in kept.get(
                        sub, ()):  # (its reduction kept the class: LlavaNextModel, which
                    continue  # LlavaNextForConditionalGeneration builds) converted already
                # (Qwen3VLModel's AutoModel.from_config(config.vision_config) builds a class
                # of its own file: the file again, with that class kept)
                entries[sub] = wanted | {cls}
                modes.pop(sub, None)
                work.append((sub, "convert"))
            plans.pop(module, None)
            continue
        used = _names_in_functions(source) if mode == "convert" else set()
        deps = _merged(_relative_imports(source, module, is_package))
        layers: dict[str, set[str]] = {}
        functions: dict[str, set[str]] = {}
        for dep, names in deps if mode == "convert" else ():
            layers[dep] = layers.get(dep, set()) | _layer_classes(dep, names, used)
            functions[dep] = functions.get(dep, set()) | _layer_functions(dep, names, used)
        after = [dep for dep, _ in deps]  # the modules converted before this one
        for dep, classes in layers.items():
            moved = _moved_layer_classes(dep, classes | functions[dep])
            if moved:  # from ..ops import StochasticDepth: convert ops/stochastic_depth.py
                reexported.setdefault(dep, {}).update(moved)
                work += [(f"{dep}.{sub}", "convert") for sub in set(moved.values())]
                after += [f"{dep}.{sub}" for sub in set(moved.values())]
        plans[module] = (file, is_package, source, after, set().union(
            *layers.values(), *(_layer_bases(dep, names) for dep, names in layers.items())))
        if mode == "alias":
            continue
        for dep, names in deps:
            if mode == "convert":
                wanted = layers[dep] | functions[dep]
                convert_dep = wanted and not (wanted <= set(reexported.get(dep, {})))
                # from .activations import *: its layer classes are the importer's (a table
                # of them: timm's create_act.py)
                convert_dep = convert_dep or (names == ["*"] and _builds_layers(dep))
                work.append((dep, "convert" if convert_dep else "copy"))
            else:
                work.append((dep, "alias"))
    # the converted modules, each after the converted modules it imports (a cycle is cut
    # where it closes), so that the builder functions of a dependency whose conversion takes
    # rngs are known to its importers: create_classifier(..., rngs=rngs)
    builders: dict[str, set[str]] = {}  # converted module -> its functions that take rngs
    for module in _dependencies_first(name, plans, modes):
        file, is_package, source, deps, known = plans[module]
        target = target_of(module, is_package)
        target.parent.mkdir(parents=True, exist_ok=True)
        if modes[module] == "convert":
            known = known | {RNGS_FUNCTION + local for local, home, attr in _imported_functions(
                source, module, is_package, reexported)
                if attr in builders.get(home, set()) | builders.get(_home_of(home, attr), set())} | {
                RNGS_FUNCTION + f"{local}.__call__" for local, home, attr in _imported_functions(
                    source, module, is_package, reexported)
                if f"{attr}.__call__" in builders.get(home, set())} | {
                RNGS_FUNCTION + f for done in builders.values() for f in done
                if f.startswith("*.")} | _type_fields(
                source, module, is_package, reexported)
            homed = _imports_from_home(source, module, is_package,
                                       {k for k, v in modes.items() if v == "convert"})
            homed = _star_torch_imports(homed, module, is_package)
            if homed != source:  # read from the file as the mirror holds it
                target.write_text(homed)
            code, n = convert(target if homed != source else file, known)
            counts[module] = n
            builders[module] = _rngs_functions(code)
            # the package's own modules imported absolutely come from the mirror too
            code = re.sub(rf"^(\s*)from {top}(\.[\w.]+)? import", rf"\1from {alias}\2 import",
                          code, flags=re.MULTILINE)
        elif modes[module] == "copy":  # runs as in torch, with registries of its own
            code = source
        else:
            code = _ALIAS.format(original=module)
        target.write_text(code)
    if autos:
        rows = "".join(f"    ({a!r}, {t!r}): ({mod.split('.', 1)[1]!r}, {cls!r}),\n"
                       for (a, t), (mod, cls) in sorted(autos.items()))
        (out_dir / alias / f"{AUTO_TABLE}.py").write_text(
            "# the converted classes that AutoModel.from_config builds here, by the config's "
            "model_type\n# (written by torch2jax with the converted modeling files)\n"
            f"MODELS = {{\n{rows}}}\n")
    # every package directory of the mirror forwards the names it does not hold itself
    package = out_dir / alias
    for module in forwarded:
        target_of(module, True).parent.mkdir(parents=True, exist_ok=True)
    for directory in [package, *(p for p in package.rglob("*") if p.is_dir())]:
        init = directory / "__init__.py"
        if not init.exists():
            original = ".".join([top, *directory.relative_to(package).parts])
            init.write_text(_PACKAGE.format(original=original,
                                            reexported=reexported.get(original, {})))
    return target_of(name, path.name == "__init__.py"), sum(counts.values())
