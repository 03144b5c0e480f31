"""``model.named_modules()`` of a converted model outside an optimizer's parameter groups (timm's
``efficientnet_init_weights``: ``for n, m in model.named_modules(): init_fn(m, n)``): the
``torch_named_modules`` helper, torch's walk over the NNX module, the root under ``""`` then
every submodule once, depth first in torch's registration order, under its dotted path of
torch's names (passes/helpers.py ``torch_named_children``). Activation layers are JAX functions
here, not modules, so they are not walked: said by an info diagnostic. Called from
passes/rewrite_calls.py, which groups an optimizer's parameters by these names itself.

``module.get_submodule("layers.3.block.1")`` (Mimi's encoder finds its convolutions by the
paths it recorded): the ``torch_get_submodule`` helper, each name looked up among the
children ``torch_named_children`` gives under torch's names."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.helper_registry import helper

helper("torch_named_modules", {"Any"}, '''
def torch_named_modules(module: Any, prefix: str = "") -> Any:
    """torch's module.named_modules() of an NNX module: the module itself under prefix, then
    each submodule once, depth first in torch's order, under its dotted path (a Sequential's,
    a List's or a Dict's items by index or key; activation layers, JAX functions here, are
    not modules)."""
    seen = set()

    def walk(node, path):
        if id(node) in seen:
            return
        seen.add(id(node))
        yield path, node
        for name, child in torch_named_children(node):
            yield from walk(child, f"{path}.{name}" if path else name)

    yield from walk(module, prefix)
''', targets=("nnx",))


helper("torch_get_submodule", {"Any"}, '''
def torch_get_submodule(module: Any, target: str) -> Any:
    """torch's module.get_submodule(target) of an NNX module: each name of the dotted path
    looked up among the children under torch's names (torch_named_children)."""
    for name in target.split(".") if target else ():
        children = dict(torch_named_children(module))
        if name not in children:
            raise AttributeError(f"{type(module).__name__} has no submodule {name!r}")
        module = children[name]
    return module
''', targets=("nnx",))


def submodule_call(visitor, original: cst.Call, updated: cst.Call) -> cst.Call | None:
    """``torch_get_submodule(model, path)`` for ``model.get_submodule(path)`` of a module
    (NNX), else None."""
    target = visitor.target
    if not (m.matches(original, m.Call(func=m.Attribute(attr=m.Name("get_submodule")),
                                       args=[m.Arg(keyword=None, star="")]))
            and target.stateful_modules and not target.setup_modules
            and not target.intermediate and visitor._is_module_expr(original.func.value)):
        return None
    return cst.Call(cst.Name("torch_get_submodule"), [cst.Arg(updated.func.value),
                                                     cst.Arg(updated.args[0].value)])


def named_modules_walk(visitor, original: cst.Call, updated: cst.Call) -> cst.Call:
    """``torch_named_modules(model)`` for ``model.named_modules()``."""
    visitor.diag(original, "torch.nn.Module.named_modules", "info",
                 "named_modules() of a converted model: the torch_named_modules helper (its "
                 "modules in torch's order under torch's names; activation layers are JAX "
                 "functions, not modules)")
    return cst.Call(cst.Name("torch_named_modules"), [cst.Arg(updated.func.value)])
