"""The torch layer a class derives from through a class of another file.

``class GroupNorm1NoBias(GroupNorm1)`` in one file, ``class GroupNorm1(nn.GroupNorm)`` in
another (timm's metaformer over timm.layers' norm.py): the subclass is a subclass of the torch
layer too, and its ``self.eps = 1e-6`` sets the JAX layer's ``self.epsilon``, as the same two
classes in one file do (analysis/index.py follows local bases). The file importing the base
knows it from its known names: ``LAYER_BASE + "<bound name>=<torch layer>"`` (repo.py for a
repository's files, verify/package.py for a mirror package's modules).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# in a file's known names: a module class it imports from another file that derives from a
# torch layer, written LAYER_BASE + "<bound name>=<qualified torch layer>"
LAYER_BASE = "layer-base:"
CONTAINERS = ("sequential", "module_list", "module_dict")


def imported_layer_bases(known: Iterable[str]) -> dict[str, str]:
    """``{bound name: torch layer}`` from a file's known names."""
    out = {}
    for k in known:
        if k.startswith(LAYER_BASE) and "=" in k:
            name, layer = k.removeprefix(LAYER_BASE).split("=", 1)
            out[name] = layer
    return out


def inherit_imported_layer_bases(classes: Mapping[str, Any], known: Iterable[str],
                                 layers: Mapping[str, Any]) -> None:
    """Set ``layer_base`` of the file's classes that derive (directly, or through the file's
    own classes) from an imported class deriving from a torch layer of ``layers`` (the
    rules' layer table; containers are not layer bases, as in analysis/index.py)."""
    imported = {k: v for k, v in imported_layer_bases(known).items() if v in layers
                and layers[v].special not in CONTAINERS}
    if not imported:
        return

    def base_of(name: str, seen: set[str]) -> str | None:
        info = classes.get(name)
        if info is None or name in seen:
            return None
        seen.add(name)
        if info.layer_base is not None:
            return info.layer_base
        for b in info.bases:
            short = b.rsplit(".", 1)[-1]
            found = imported.get(b) or imported.get(short) or (
                base_of(short, seen) if short in classes else None)
            if found is not None:
                return found
        return None

    for name, info in classes.items():
        if info.layer_base is None:
            info.layer_base = base_of(name, set())
