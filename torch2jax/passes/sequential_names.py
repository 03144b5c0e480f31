"""A script's ``nn.Sequential`` held by a name, indexed: ``model[0]``, ``model[-1]``,
``model[1:]``.

torch's Sequential is a list of its layers; NNX's is not subscriptable, its list of layers is
``.layers`` (a module's ``self.layers[0]`` is rewritten by ``rewrite_attributes``). A name of
the file bound once, to an ``nn.Sequential(...)`` call, is read the same way outside classes:
``model[0]`` -> ``model.layers[0]`` (and ``model[0] = layer`` assigns into that list), a slice
-> ``nnx.Sequential(*model.layers[1:])``, a Sequential as torch's slice is; iterated or
measured (``for layer in model``, ``len(model)``): ``model.layers``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider


def sequential_names(rw, module: cst.Module) -> set[str]:
    """The names the file binds once, to an ``nn.Sequential(...)`` call (NNX only)."""
    if not rw.target.stateful_modules or rw.target.intermediate:
        return set()
    counts: dict[str, int] = {}
    built: set[str] = set()
    for a in m.findall(module, m.Assign() | m.AugAssign() | m.AnnAssign()):
        targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
        for t in targets:
            for n in _bound(t):
                counts[n.value] = counts.get(n.value, 0) + 1
            if isinstance(t, cst.Name) and isinstance(a, cst.Assign) and isinstance(
                    a.value, cst.Call) and rw.q(a.value.func) == "torch.nn.Sequential":
                built.add(t.value)
    for node in m.findall(module, m.For() | m.CompFor() | m.Param() | m.FunctionDef()
                          | m.ClassDef() | m.AsName()):
        # (a loop variable, a parameter, a function or an import of the same name is another
        # value)
        bound = node.target if isinstance(node, (cst.For, cst.CompFor)) else node.name
        for n in _bound(bound):
            counts[n.value] = counts.get(n.value, 0) + 1
    return {n for n in built if counts.get(n) == 1}


def _bound(target: cst.BaseExpression) -> list[cst.Name]:
    """The names an assignment target binds (not those of an item or attribute it sets)."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for e in target.elements for n in _bound(e.value)]
    if isinstance(target, cst.StarredElement):
        return _bound(target.value)
    return []


def indexed_sequential(rw, original: cst.Subscript, updated: cst.Subscript
                       ) -> cst.BaseExpression | None:
    """``model[i]`` / ``model[a:b]`` of such a name, outside classes; None otherwise."""
    if not (isinstance(original.value, cst.Name) and original.value.value in rw.sequential_names
            and not rw.current_class and len(updated.slice) == 1):
        return None
    layers = updated.with_changes(value=cst.Attribute(updated.value, cst.Name("layers")))
    if isinstance(updated.slice[0].slice, cst.Slice):
        rw.need("nnx")
        return cst.parse_expression("nnx.Sequential(*X)").visit(_Fill(layers))
    return layers


_ITERATING = ("len", "enumerate", "list", "tuple", "reversed", "zip", "iter")


def iterated_sequential(rw, original: cst.Name, parent: cst.CSTNode | None
                        ) -> cst.BaseExpression | None:
    """Such a name iterated (``for layer in model``, a comprehension) or measured
    (``len(model)``, ``enumerate(model)``): its layers, ``model.layers``."""
    if original.value not in rw.sequential_names or rw.current_class:
        return None
    iterated = isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original
    if isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star:
        outer = rw.get_metadata(ParentNodeProvider, parent, None)
        iterated = isinstance(outer, cst.Call) and m.matches(
            outer.func, m.OneOf(*(m.Name(n) for n in _ITERATING)))
    return cst.Attribute(cst.Name(original.value), cst.Name("layers")) if iterated else None


class _Fill(cst.CSTTransformer):
    def __init__(self, value: cst.BaseExpression) -> None:
        super().__init__()
        self.value = value

    def leave_Name(self, original_node, updated_node):
        return self.value if updated_node.value == "X" else updated_node
