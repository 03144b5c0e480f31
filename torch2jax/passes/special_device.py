"""Device queries and device objects (rules/functions.toml, "devices")."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, code, expr, try_literal
from torch2jax.passes.registry import Site, special

GPU_TEST = 'jax.default_backend() == "gpu"'


@special("gpu_backend")
def gpu_backend(site: Site) -> cst.BaseExpression:
    """``torch.cuda.is_available()``: the default backend is a GPU."""
    return expr(GPU_TEST)


@special("bf16_backend")
def bf16_backend(site: Site) -> cst.BaseExpression:
    """``torch.cuda.is_bf16_supported()``: the default backend is an accelerator."""
    return expr('jax.default_backend() in ("gpu", "tpu")')


@special("synchronize")
def synchronize(site: Site) -> cst.BaseExpression:
    """``torch.cuda.synchronize()``: wait for every array dispatched so far (JAX's dispatch
    is asynchronous on every backend)."""
    return expr(site.rule.jax)


def _one_device(node: cst.BaseExpression, index: cst.BaseExpression | None) -> str:
    """A string literal naming a torch device -> a JAX device expression."""
    name = try_literal(node, ...)
    if not isinstance(name, str):
        raise Untranslatable("torch.device of a computed name: JAX places arrays itself; "
                             "pick the device with jax.devices(platform)[index] if you need "
                             "one", rule="torch.device")
    kind, _, number = name.partition(":")
    platform = {"cuda": "gpu", "cpu": "cpu"}.get(kind)
    if platform is None:
        raise Untranslatable(f"torch.device({name!r}): no JAX backend of that name",
                             rule="torch.device")
    at = number or (code(index) if index is not None else "0")
    return f'jax.devices("{platform}")[{at}]'


@special("device")
def device(site: Site) -> cst.BaseExpression:
    """``torch.device(...)`` -> a JAX device (see the rule's notes)."""
    kind, index = site.get("type"), site.get("index")
    if kind is None:
        raise Untranslatable("torch.device without a type", rule="torch.device")
    if isinstance(kind, cst.IfExp):
        body, orelse = (try_literal(b, ...) for b in (kind.body, kind.orelse))
        if (body, orelse) == ("cuda", "cpu") and index is None and code(kind.test) in (
                GPU_TEST, f"({GPU_TEST})"):
            return expr("jax.devices()[0]")  # the default backend's first device
        return cst.IfExp(test=kind.test, body=expr(_one_device(kind.body, index)),
                         orelse=expr(_one_device(kind.orelse, index)))
    return expr(_one_device(kind, index))


def device_default_functions(module: cst.Module) -> dict[str, tuple[bool, int | None]]:
    """The functions and methods of the file (by name) that take a ``device`` parameter: whether
    it has a default (``def compute_bias(self, q, k, device=None)``), and its position among the
    arguments a call passes (after ``self`` for a method; None where it is keyword-only or the
    file's functions of that name disagree). What the converted body does with it is nothing
    (JAX places arrays itself; the converter drops ``device=`` from the array constructors and
    the device bookkeeping)."""
    found: dict[str, tuple[bool, int | None]] = {}
    for stmt in module.body:
        defs = [(stmt, False)] if isinstance(stmt, cst.FunctionDef) else [
            (s, True) for s in stmt.body.body if isinstance(s, cst.FunctionDef)
        ] if isinstance(stmt, cst.ClassDef) else []
        for fn, method in defs:
            params = [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]
            device = [p for p in params if p.name.value == "device"]
            if not device:
                continue
            positional = [*fn.params.posonly_params, *fn.params.params]
            static = any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod"
                         for d in fn.decorators)
            if method and not static:
                positional = positional[1:]
            index = positional.index(device[0]) if device[0] in positional else None
            default, known = found.get(fn.name.value, (True, index))
            found[fn.name.value] = (default and device[0].default is not None,
                                    index if known == index else None)
    return found


def _device_read(node: cst.BaseExpression, is_tensor) -> bool:
    """``x.device``: of a tensor, or of whatever the analysis cannot tell (Kosmos-2's
    ``inputs_embeds``, a parameter nothing annotates); what it is does not matter, since it is
    given to a ``device`` parameter that the converted callee does not use."""
    return isinstance(node, cst.Attribute) and node.attr.value == "device" and (
        is_tensor(node.value) or not isinstance(node.value, (cst.Call, cst.Subscript)))


def drop_device_argument(original: cst.Call, updated: cst.Call,
                         names: dict[str, tuple[bool, int | None]], is_tensor,
                         is_module=lambda node: False) -> cst.Call:
    """``self.compute_bias(q, k, device=query.device)``, a function of the file whose
    ``device`` has a default: the argument goes (a traced JAX array has no device; the
    callee's converted body does not use it); where the parameter has no default
    (``def get_attn_mask(self, height, width, dtype, device)``), or the device is passed by
    position (Funnel's ``self.get_position_embeds(seq_len, x.dtype, x.device)``), it is given
    None. A layer of the file called (``self.position_embeddings(shape, x.device)``) is its
    ``forward``. Only when the value is a ``.device`` read (:func:`_device_read`)."""
    func = original.func
    name = (func.value if isinstance(func, cst.Name) else func.attr.value
            if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
            and func.value.value == "self" else None)
    if name not in names and name is not None and isinstance(func, cst.Attribute) and (
            is_module(func)):
        name = "forward"
    if name not in names or len(updated.args) != len(original.args):
        return updated
    has_default, index = names[name]
    none = set()
    if index is not None and len(original.args) > index and all(
            a.keyword is None and not a.star for a in original.args[:index + 1]) and (
            _device_read(original.args[index].value, is_tensor)):
        none.add(index)
    drop = [i for i, a in enumerate(original.args)
            if a.keyword is not None and a.keyword.value == "device"
            and _device_read(a.value, is_tensor)]
    if not has_default:
        none.update(drop)
        drop = []
    if not drop and not none:
        return updated
    args = [a.with_changes(value=cst.Name("None")) if i in none else a
            for i, a in enumerate(updated.args) if i not in drop]
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(args=args)
