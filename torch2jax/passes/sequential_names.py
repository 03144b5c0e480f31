"""A script's ``nn.Sequential`` held by a name, indexed: ``model[0]``, ``model[-1]``,
``model[1:]``.

torch's Sequential is a list of its layers; NNX's is not subscriptable, its list of layers is
``.layers`` (a module's ``self.layers[0]`` is rewritten by ``rewrite_attributes``). A name of
the file bound once, to an ``nn.Sequential(...)`` call, is read the same way outside classes:
``model[0]`` -> ``model.layers[0]`` (and ``model[0] = layer`` assigns into that list), a slice
-> ``nnx.Sequential(*model.layers[1:])``, a Sequential as torch's slice is; iterated or
measured (``for layer in model``, ``len(model)``): ``model.layers``.

The same for a Sequential attribute of a module of the file, read through a name the file
binds once to an instance of it (``model = Net()``, ``.to(device)`` allowed):
``model.backbone[2]`` -> ``model.backbone.layers[2]``. One whose items run channels-last (the
translation holds NHWC convolutions, and transposes around them) is marked there: its items
are not torch's.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes.sequential_items import sequential_elem_layout


def sequential_names(rw, module: cst.Module) -> dict[str, str | None]:
    """The names the file binds once, to an ``nn.Sequential(...)`` call, and the Sequential
    attributes (``model.backbone``) of names it binds once to an instance of one of its
    modules (NNX only), each with the layout of its items (None: a plain name's, torch's)."""
    if not rw.target.stateful_modules or rw.target.intermediate:
        return {}
    counts: dict[str, int] = {}
    built: set[str] = set()
    instances: dict[str, str] = {}
    for a in m.findall(module, m.Assign() | m.AugAssign() | m.AnnAssign()):
        targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
        for t in targets:
            for n in _bound(t):
                counts[n.value] = counts.get(n.value, 0) + 1
            if isinstance(t, cst.Name) and isinstance(a, cst.Assign) and isinstance(
                    a.value, cst.Call) and rw.q(a.value.func) == "torch.nn.Sequential":
                built.add(t.value)
            elif isinstance(t, cst.Name) and isinstance(a, cst.Assign) and (
                    cls := _module_class(rw, a.value)):
                instances[t.value] = cls
    for node in m.findall(module, m.For() | m.CompFor() | m.Param() | m.FunctionDef()
                          | m.ClassDef() | m.AsName()):
        # (a loop variable, a parameter, a function or an import of the same name is another
        # value)
        bound = node.target if isinstance(node, (cst.For, cst.CompFor)) else node.name
        for n in _bound(bound):
            counts[n.value] = counts.get(n.value, 0) + 1
    found: dict[str, str | None] = {n: None for n in built if counts.get(n) == 1}
    for name, cls in instances.items():
        info = rw.index.classes[cls]
        if counts.get(name) != 1 or info.container:
            continue
        for attr, rule in info.attr_rule.items():
            if rule == "torch.nn.Sequential":
                found[f"{name}.{attr}"] = sequential_elem_layout(rw, info, attr) or "mixed"
    return found


_MOVES = m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda") | m.Name("cpu")))


def _module_class(rw, value: cst.BaseExpression) -> str | None:
    """The module class of the file that ``value`` builds: ``Net(...)``, ``Net().to(d)``."""
    while m.matches(value, _MOVES):
        value = value.func.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and (
            value.func.value in rw.index.module_classes and value.func.value in rw.index.classes):
        return value.func.value
    return None


def _held(rw, node: cst.BaseExpression, original: cst.BaseExpression) -> bool:
    """``node`` (a name, or ``name.attr``) is such a Sequential whose items are torch's;
    one whose items run channels-last is marked here."""
    if isinstance(node, cst.Name):
        key = node.value
    elif m.matches(node, m.Attribute(value=m.Name(), attr=m.Name())):
        key = f"{node.value.value}.{node.attr.value}"
    else:
        return False
    if key not in rw.sequential_names or rw.current_class:
        return False
    if rw.sequential_names[key] in (None, "torch", "any"):
        return True
    rw.diag(original, "torch.nn.Sequential", "error",
            f"{key} indexed or iterated outside its class: its translation holds "
            "channels-last layers (and the transposes around them), not torch's items")
    return False


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
    if len(updated.slice) != 1 or not _held(rw, original.value, original):
        return None
    layers = updated.with_changes(value=cst.Attribute(updated.value, cst.Name("layers")))
    if isinstance(updated.slice[0].slice, cst.Slice) and not _uses(
            rw, original, rw.get_metadata(ParentNodeProvider, original, None)):
        # (a slice iterated or measured: the layers themselves)
        rw.need("nnx")
        return cst.parse_expression("nnx.Sequential(*X)").visit(_Fill(layers))
    return layers


_ITERATING = ("len", "enumerate", "list", "tuple", "reversed", "zip", "iter")


def iterated_sequential(rw, original: cst.Name | cst.Attribute, parent: cst.CSTNode | None,
                        updated: cst.BaseExpression | None = None
                        ) -> cst.BaseExpression | None:
    """Such a name (or attribute) iterated (``for layer in model``, a comprehension) or
    measured (``len(model)``, ``enumerate(model)``): its layers, ``model.layers``."""
    if isinstance(original, cst.Attribute):
        parent = rw.get_metadata(ParentNodeProvider, original, None)
        if not (_uses(rw, original, parent) and _held(rw, original, original)):
            return None
        return cst.Attribute(updated or original, cst.Name("layers"))
    if original.value not in rw.sequential_names or rw.current_class or not _uses(
            rw, original, parent):
        return None
    return cst.Attribute(cst.Name(original.value), cst.Name("layers"))


def _uses(rw, original: cst.BaseExpression, parent: cst.CSTNode | None) -> bool:
    """``original`` is iterated or measured (a quick check before the layout's mark)."""
    if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star:
        outer = rw.get_metadata(ParentNodeProvider, parent, None)
        return isinstance(outer, cst.Call) and m.matches(
            outer.func, m.OneOf(*(m.Name(n) for n in _ITERATING)))
    return False


class _Fill(cst.CSTTransformer):
    def __init__(self, value: cst.BaseExpression) -> None:
        super().__init__()
        self.value = value

    def leave_Name(self, original_node, updated_node):
        return self.value if updated_node.value == "X" else updated_node
