"""Which names of a function hold module classes, read from its syntax (the indexer and the
rewriter ask): a class from a lookup (``act_layer = get_act_layer(name)``, ``module_cls =
get_attn(kind)``), one unpacked from a returned tuple (``stage_fn, stage_args =
_get_stage_fn(stage_args)``, timm's cspnet), a loop target taking the items of a parameter
(``for block_fn, n in zip(block_fns, depths)``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.layer_lists import built_layout
from torch2jax.analysis.walk import walk


def looked_up_activation(fn: cst.FunctionDef, call: cst.Call) -> bool:
    """``act_layer(**kwargs)`` / ``act_layer(inplace=inplace)`` of a local that ``fn`` assigns
    from a call (timm's create_act_layer: ``act_layer = get_act_layer(name)``): an activation
    class from a lookup, which is a JAX function after conversion, or a module class."""
    if not isinstance(call.func, cst.Name):
        return False
    n = call.func.value
    if not ("activation" in n or n.endswith("act_layer")) or n in {
            p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}:
        return False
    if not all(a.star == "**" or (a.keyword and a.keyword.value == "inplace")
               for a in call.args):
        return False
    assigns = [a for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Name(n))]))]
    return bool(assigns) and all(isinstance(a.value, cst.Call) for a in assigns)


def looked_up_class(fn: cst.FunctionDef, call: cst.Call) -> bool:
    """``module_cls(channels, **kwargs)`` of a local named for a class that ``fn`` assigns
    from a call (timm's create_attn: ``module_cls = get_attn(attn_type)``): a module class
    from a lookup, built."""
    if not isinstance(call.func, cst.Name) or not call.func.value.endswith(("_cls", "_class")):
        return False
    n = call.func.value
    if n in {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}:
        return False
    assigns = [a for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Name(n))]))]
    return bool(assigns) and all(isinstance(a.value, cst.Call) for a in assigns)


def tuple_class_returns(fn: cst.FunctionDef, returned: list) -> dict[int, set[str]]:
    """{i: names} where every value ``fn`` returns is a tuple whose item i is a class name
    (capitalised), directly or through a local that ``fn`` assigns only such names to
    (cspnet's ``_get_stage_fn``: ``stage_fn = CrossStage3`` ... ``return stage_fn,
    stage_args``)."""
    if not returned or not all(isinstance(v, cst.Tuple) for v in returned):
        return {}
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Name())])):
        assigned.setdefault(a.targets[0].target.value, []).append(a.value)

    def names(v: cst.BaseExpression) -> set[str] | None:
        if not isinstance(v, cst.Name):
            return None
        if v.value in assigned:
            values = assigned[v.value]
            if all(isinstance(x, cst.Name) and x.value[:1].isupper() for x in values):
                return {x.value for x in values}
            return None
        return {v.value} if v.value[:1].isupper() else None

    out: dict[int, set[str]] = {}
    for i in range(min(len(v.elements) for v in returned)):
        found = [names(v.elements[i].value) for v in returned]
        if all(f is not None for f in found):
            out[i] = set().union(*found)
    return out


def unpacked_classes(fn: cst.FunctionDef, tuple_returns: dict[str, dict[int, set[str]]],
                     classes: Collection[str] | None = None) -> set[str]:
    """Names ``fn`` binds by unpacking a call of such a function at a class position
    (``stage_fn, stage_args = _get_stage_fn(stage_args)``), where the classes are all in
    ``classes`` (when given)."""
    out = set()
    for a in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Tuple() | m.List())],
                                    value=m.Call(func=m.Name()))):
        table = tuple_returns.get(a.value.func.value, {})
        for i, e in enumerate(a.targets[0].target.elements):
            if i in table and isinstance(e.value, cst.Name) and (
                    classes is None or table[i] <= set(classes)):
                out.add(e.value.value)
    return out


def param_loop_targets(fn: cst.FunctionDef) -> dict[str, str]:
    """{loop target: the parameter whose items it takes} in ``fn``: ``for block_fn in
    block_fns``, ``for block_fn, n in zip(block_fns, depths)``, ``for i, (b, n) in
    enumerate(zip(block_fns, depths))``."""
    params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    found: dict[str, str] = {}

    def pair(target: cst.BaseExpression, it: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name) and isinstance(it, cst.Name):
            if it.value in params:
                found[target.value] = it.value
        elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(it, cst.Call) and (
                isinstance(it.func, cst.Name) and not any(a.keyword or a.star for a in it.args)):
            items = [e.value for e in target.elements]
            args = [a.value for a in it.args]
            if it.func.value == "zip" and len(items) == len(args):
                for t, a in zip(items, args):
                    pair(t, a)
            elif it.func.value == "enumerate" and len(items) == 2 and len(args) == 1:
                pair(items[1], args[0])

    for node in walk(fn.body, False):
        if isinstance(node, cst.For):
            pair(node.target, node.iter)
    return found


def nchw_branch_convs(built: dict, fid: int, torch_convs: set[int]) -> list[str]:
    """The locals of function ``fid`` given a channels-last conv in one branch and layers of
    torch's layout (or any) in the others (timm's ``_create_fc``: ``fc = nn.Conv2d(c, n, 1)``
    where ``use_conv``, else ``nn.Linear`` or ``nn.Identity``; dla's classifier). ``built``:
    (function, local) -> [(layout, the conv built there or None)]. Their convs join
    ``torch_convs`` (the NCHW Conv2d helper), so that the local, and what returns it, takes
    torch's layout whichever branch built it."""
    names = []
    for (f, name), assigns in built.items():
        convs = _branch_convs(assigns)
        if f == fid and convs:
            torch_convs.update(id(c) for c in convs)
            names.append(name)
    return names


def _branch_convs(assigns: list) -> list[cst.Call]:
    """The convs (or poolings) of a local's assignments ``[(layout, conv or None)]`` when they
    are channels-last, built in some branches, and the others build layers of torch's layout
    (or any); else []."""
    convs = [conv for _, conv in assigns if conv is not None]
    if convs and len(convs) < len(assigns) and all(
            layout == "channels_last" for layout, conv in assigns if conv is not None
    ) and {layout for layout, conv in assigns if conv is None} <= {"torch", "any"}:
        return convs
    return []


def local_function(fns: list[cst.FunctionDef], name: str) -> bool:
    """``name`` is a function defined (``def``) inside one of the enclosing functions ``fns``
    (timm's swin_transformer_v2_cr: ``def _extra_norm(index)`` in a stage's ``__init__``,
    called as ``extra_norm=_extra_norm(index)``): a closure, not a layer class handed in; it
    takes ``rngs`` where it builds layers (the indexer's functions taking them, keyed
    ``Class.name`` in a class as the class's methods are)."""
    return any(m.findall(fn.body, m.FunctionDef(name=m.Name(name))) for fn in fns)


def holds_drawing_function(fns: list[cst.FunctionDef], name: str, draws: Collection[str],
                           takes_rngs: Collection[str]) -> bool:
    """``name`` is a function that draws (``draws``: the file's), or a local of the innermost
    of ``fns`` given only functions taking ``rngs`` (``takes_rngs``: the file's and those
    imported), re-bound in a partial of itself (timm's hieradet_sam2: ``init_fn =
    init_weight_jax if weight_init == 'jax' else init_weight_vit``, then ``init_fn =
    partial(init_fn, classifier_name='head.fc')`` and ``named_apply(init_fn, self)``): a
    partial of it binds the rngs, for the calls made elsewhere."""
    if name in draws:
        return True
    if not fns:
        return False
    options: list[cst.BaseExpression] = []
    for assign in m.findall(fns[-1], m.Assign(targets=[m.AssignTarget(m.Name(name))])):
        value = assign.value
        if m.matches(value, m.Call(func=m.Name("partial") | m.Attribute(attr=m.Name(
                "partial")), args=[m.Arg(m.Name(name), keyword=None), m.ZeroOrMore()])):
            continue
        options += [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
    return bool(options) and all(isinstance(o, cst.Name) and o.value in takes_rngs
                                 for o in options)


def class_lookups(module: cst.Module, is_class: Callable[[cst.BaseExpression], bool]) -> set[str]:
    """The file's top-level functions whose every return is an item of a literal list or tuple
    of classes (``is_class``: a torch layer class, a module class of the file; timm's hiera:
    ``def conv_nd(n): return [nn.Identity, nn.Conv1d, nn.Conv2d, nn.Conv3d][n]``), whose
    result a call builds at once (``conv_nd(2)(dim_in, dim_out, kernel_size=3)``)."""
    out = set()
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef):
            continue
        returns = m.findall(fn, m.Return())
        if returns and all(isinstance(r.value, cst.Subscript) and isinstance(
                r.value.value, (cst.List, cst.Tuple)) and r.value.value.elements and all(
                    is_class(e.value) for e in r.value.value.elements) for r in returns):
            out.add(fn.name.value)
    return out


def param_default(fn: cst.FunctionDef, name: str) -> str | None:
    """The name a parameter of ``fn`` defaults to (``= InvertedResidual``)."""
    for p in (*fn.params.params, *fn.params.kwonly_params):
        if p.name.value == name and isinstance(p.default, cst.Name):
            return p.default.value
    return None


def builder_instance(fns: list[cst.FunctionDef], name: str, rngs_functions: Collection[str]
                     ) -> bool:
    """``name`` is a local of the innermost function assigned an instance of a class whose
    ``__call__`` takes rngs (a builder object, timm's ``builder = EfficientNetBuilder(...)``
    then ``self.blocks = nn.Sequential(*builder(stem_size, block_args))``): calling it builds
    layers."""
    return bool(fns) and any(
        isinstance(node, cst.Assign) and len(node.targets) == 1
        and m.matches(node.targets[0].target, m.Name(name))
        and m.matches(node.value, m.Call(func=m.Name()))
        and f"{node.value.func.value}.__call__" in rngs_functions
        for node in walk(fns[-1].body, False))


def spread_of_builder(meta, index, value: cst.BaseExpression) -> bool:
    """``value`` calls a builder object (:func:`builder_instance`) of the enclosing function:
    ``nn.Sequential(*builder(stem_size, block_args))``, its stages built by another module of
    the package, whose layers keep torch's layout (NCHW) as every class of those modules."""
    fns = getattr(meta, "_fn_stack", None) or []
    builders = set(index.rngs_functions) | set(getattr(meta, "imported_builders", ()))
    return m.matches(value, m.Call(func=m.Name())) and builder_instance(
        fns, value.func.value, builders)


def forwards_kwargs(fn: cst.FunctionDef, call: cst.Call, callees: Collection[str]) -> bool:
    """``call`` hands ``fn``'s ``**kwargs`` on (``**kwargs``, ``**dict(args, **kwargs)``) to
    one of ``callees`` (the file's functions taking ``**kwargs`` and no rngs): in timm's
    vision_transformer_hybrid, ``vit_tiny_r_s16_p8_224(pretrained=False, **kwargs)`` builds a
    backbone (so it takes the rngs its caller gave in its kwargs) and calls
    ``_create_vision_transformer_hybrid(..., **dict(model_args, **kwargs))``, whose kwargs reach
    ``build_model_with_cfg(VisionTransformer, **kwargs)``: the rngs go on with the kwargs."""
    if not m.matches(call.func, m.Name()) or call.func.value not in callees:
        return False
    return _spreads_kwargs(fn, call)


def hands_class_kwargs(fn: cst.FunctionDef, call: cst.Call, classes: Collection[str],
                       local: Collection[str]) -> bool:
    """``call`` of a function not of the file (``local``: the file's functions, the module
    classes and functions known to take rngs) hands one of the module ``classes`` and ``fn``'s
    ``**kwargs`` on: timm's ``build_model_with_cfg(VisionTransformer, variant, pretrained,
    **kwargs)`` in vitamin's ``_create_vitamin``, which builds a backbone itself (so its rngs
    are its own keyword, no longer in the kwargs): the builder does ``model_cls(**kwargs)``,
    the rngs go on with the kwargs."""
    if not m.matches(call.func, m.Name()) or call.func.value in local:
        return False
    return any(m.matches(a.value, m.Name(m.MatchIfTrue(lambda n: n in classes)))
               for a in call.args if not a.star) and _spreads_kwargs(fn, call)


def _spreads_kwargs(fn: cst.FunctionDef, call: cst.Call) -> bool:
    """``call`` spreads ``fn``'s ``**kwargs`` (``**kwargs``, ``**dict(args, **kwargs)``)."""
    star = fn.params.star_kwarg
    if star is None:
        return False
    spread = m.Name(star.name.value)
    return any(a.star == "**" and (m.matches(a.value, spread) or m.matches(a.value, m.Call(
        func=m.Name("dict"), args=[m.ZeroOrMore(), m.Arg(value=spread, star="**"),
                                   m.ZeroOrMore()]))) for a in call.args)


def local_function_options(fn: cst.FunctionDef, name: str) -> set[str]:
    """The names that ``fn`` assigns its local (or parameter) ``name``: ``init_fn = init_fn or
    _init_weight_goog`` (timm's efficientnet_init_weights), ``fn = a if cond else b``, ``fn =
    a``; the local itself left out. Empty for a name ``fn`` does not assign. (One walk of
    ``fn`` for all its names: a call of a name asks for each call.)"""
    return _function_options(fn).get(name, set())


@functools.lru_cache(maxsize=256)
def _function_options(fn: cst.FunctionDef) -> dict[str, set[str]]:
    """``local_function_options`` of every name ``fn`` assigns (nodes are immutable and
    hashed by identity: a cache per function)."""
    table: dict[str, set[str]] = {}
    for assign in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Name())])):
        name = assign.targets[0].target.value
        out = table.setdefault(name, set())
        todo = [assign.value]
        while todo:
            value = todo.pop()
            if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
                todo += [value.left, value.right]
            elif isinstance(value, cst.IfExp):
                todo += [value.body, value.orelse]
            elif isinstance(value, cst.Name) and value.value != name:
                out.add(value.value)
    return table


def holds_rngs_function(fn: cst.FunctionDef, call: cst.Call, takes_rngs: Collection[str]) -> bool:
    """``init_fn(m, n)`` of a local that ``fn`` may give a function taking ``rngs`` (it draws:
    ``init_fn = init_fn or _init_weight_goog``), or another one (a function the caller passed,
    which may not take them): called through ``call_with_rngs``."""
    return isinstance(call.func, cst.Name) and bool(
        local_function_options(fn, call.func.value) & set(takes_rngs))


def note_local_layer(builder, name: str, value: cst.Call, rule) -> None:
    """``name = layer(...)`` in a function (``final_conv = nn.Conv2d(...)``, put into a
    Sequential later): its layout, like a list's, and in ``builder._local_layers`` with the
    conv or pooling built there, for nchw_branch_convs. A local Sequential takes and returns
    NCHW itself (densenet's ``stem_pool``: ``nn.MaxPool2d(...)`` in one branch,
    ``nn.Sequential(pool, aa_layer(...))`` in the other): a branch of torch's layout there."""
    if rule.special in ("module_list", "module_dict"):
        return
    fid = id(builder._fn_stack[-1])
    layout = "torch" if rule.special == "sequential" else built_layout(
        rule, value, builder.index.factory_dicts)
    if rule.special != "sequential":
        builder._lists[fid][name] = [layout]
    assigns = builder._local_layers.setdefault((fid, name), [])
    assigns.append((layout, value if rule.special in ("conv", "pool") else None))
    convs = _branch_convs(assigns)
    if convs:  # known now, for a Sequential given the local below the branches
        builder.index.torch_convs.update(id(c) for c in convs)
        builder._lists[fid][name] = ["torch"]


def is_classmethod(fn: cst.FunctionDef) -> bool:
    return any(m.matches(d.decorator, m.Name("classmethod")) for d in fn.decorators)


def dotted(node: cst.BaseExpression) -> str:
    """``a.b.c`` as text (``?`` for a part that is no name)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{dotted(node.value)}.{node.attr.value}"
    return "?"
