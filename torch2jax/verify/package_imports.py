"""The models a transformers modeling file imports from another modeling file (DPR's
``from ..bert.modeling_bert import BertModel``, SAM3's ``from ..clip import
CLIPTextModelWithProjection``): verify's mirror package converts that file too, with those
classes kept, and the importer builds them as converted classes (with ``rngs``), so that
their weights are NNX variables like the importer's own."""

from __future__ import annotations

import ast
import importlib
import importlib.util

from torch2jax.hf import is_modeling_file


def _relative(module: str, home: str) -> str:
    """``home`` as a relative import from the module file ``module`` (both under one top)."""
    here = module.split(".")[:-1]
    there = home.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def imported_models(source: str, module: str) -> tuple[str, dict[str, set[str]], set[str]]:
    """(``source`` with each such import made from the model's own modeling file, {that
    file's module: the classes imported from it}, the local names they are bound to).

    An import is taken whole or not at all: every name it imports must be a module class
    (``torch.nn.Module``) defined in one other modeling file, and one of them a model
    (``PreTrainedModel``); any other import (a function, a layer shared with the importer's
    torch code) stays the original module's."""
    import torch
    from transformers import PreTrainedModel

    package = module.rpartition(".")[0]
    lines = source.splitlines(keepends=True)
    homes: dict[str, set[str]] = {}
    local: set[str] = set()
    edits = []
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ImportFrom) and node.level and node.module):
            continue
        name = importlib.util.resolve_name("." * node.level + node.module, package)
        try:
            original = importlib.import_module(name)
        except ImportError:
            continue
        values = [getattr(original, a.name, None) for a in node.names]
        wheres = {getattr(v, "__module__", "") for v in values}
        if len(wheres) != 1 or not all(isinstance(v, type) and issubclass(v, torch.nn.Module)
                                       for v in values) or not any(
                issubclass(v, PreTrainedModel) for v in values):
            continue
        (where,) = wheres
        if not is_modeling_file(where) or where == module:
            continue
        homes.setdefault(where, set()).update(v.__name__ for v in values)
        local.update(a.asname or a.name for a in node.names)
        if where != name:  # a package's re-export: imported from its modeling file instead
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "")
                              for a in node.names)
            edits.append((node.lineno, node.end_lineno or node.lineno,
                          f"from {_relative(module, where)} import {names}\n"))
    for first, last, line in reversed(edits):
        lines[first - 1:last] = [line]
    return "".join(lines), homes, local
