"""Layer lists as the index reads them: the items of a spread literal, the layout a built
layer takes, the layouts of several layers combined (analysis/index.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import libcst as cst
import libcst.matchers as m

from torch2jax.ruleset import Rule


def spread_literals(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """``nn.Sequential(*[conv, norm, act])``: the items of a spread literal list or tuple as
    arguments of their own, so that each has its layout (the rewriter writes them so)."""
    out: list[cst.Arg] = []
    for a in args:
        if a.star == "*" and isinstance(a.value, (cst.List, cst.Tuple)) and not any(
                isinstance(e, cst.StarredElement) for e in a.value.elements):
            out.extend(cst.Arg(e.value, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
                " "))) for e in a.value.elements)
        else:
            out.append(a)
    if len(out) == len(args) and all(x is y for x, y in zip(out, args)):
        return out
    return [*out[:-1], out[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)] if out else out


def built_layout(rule: Rule, node: cst.Call, factory_dicts: Collection[str] = ()) -> str:
    """The activation layout of the layer ``node`` builds with ``rule``: the rule's, but a
    convolution or pooling layer given ``**kwargs`` is the Conv2d / MaxPool2d / AvgPool2d
    helper class, in torch's layout (not one given only ``**dd``, a dict of factory
    keywords: ``factory_dicts``)."""
    if rule.special in ("conv", "pool") and any(a.star and not (
            a.star == "**" and isinstance(a.value, cst.Name) and a.value.value in factory_dicts)
            for a in node.args):
        return "torch"
    return rule.layout


def is_factory_dict(node: cst.BaseExpression) -> bool:
    """``{"device": device, "dtype": dtype}`` (either key or both, nothing else)."""
    return isinstance(node, cst.Dict) and bool(node.elements) and all(
        isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)
        and e.key.evaluated_value in ("device", "dtype") for e in node.elements)


def ordered_dict_items(a: cst.Arg, is_dict) -> cst.BaseExpression | None:
    """The layers a lone Sequential argument holds by name: ``OrderedDict(pairs)`` -> ``pairs``,
    a local OrderedDict of layers (``layers["a"] = ...``) -> ``layers``; else None."""
    if a.star or a.keyword:
        return None
    v = a.value
    if (m.matches(v, m.Call(func=m.Name("OrderedDict") | m.Attribute(attr=m.Name("OrderedDict"))))
            and len(v.args) == 1 and not v.args[0].star):
        return v.args[0].value
    if isinstance(v, cst.Name) and is_dict(v.value):
        return v
    return None


def combine(layouts: list[str]) -> str:
    """The layout of a list of layers whose order is not known statically."""
    kinds = set(layouts) - {"any"}
    if not kinds:
        return "any"
    if len(kinds) == 1:
        return kinds.pop()
    return "mixed"


def filtered_literal(node: cst.BaseExpression) -> cst.List | cst.Tuple | None:
    """The literal of ``filter(None, [conv, aa if use_aa else None, norm, act])`` (timm's
    ResNet stem pool: the layers given, in order, less those that are None), or None."""
    if m.matches(node, m.Call(func=m.Name("filter"), args=[
            m.Arg(m.Name("None"), keyword=None, star=""),
            m.Arg(m.List() | m.Tuple(), keyword=None, star="")])) and not any(
                isinstance(e, cst.StarredElement) for e in node.args[1].value.elements):
        return node.args[1].value
    return None


def self_slice(value: cst.BaseExpression, attr: str) -> bool:
    """``self.head = self.head[:n]`` (timm's selecsls pruning its head): the attribute keeps
    the layers it held, and their layout."""
    return m.matches(value, m.Subscript(value=m.Attribute(value=m.Name("self"),
                                                          attr=m.Name(attr))))


def list_layout(layouts: list[str]) -> str:
    """A list of layers in both layouts whose items are all known is normalized (its
    channels-last items get transposes where they are put in): torch's layout. So is a
    filtered literal spread into a Sequential (``filter(None, [conv, aa, norm, act])``): the
    rewrite puts transposes between its items (passes/filtered_layers.py; a transpose next to
    a None left out keeps the order right whichever items are there)."""
    layout = combine(layouts)
    return "torch" if layout == "mixed" and "mixed" not in layouts else layout


def literal_list_layout(items: Sequence[cst.BaseExpression], of, is_conv,
                        torch_convs: set[int]) -> str:
    """The layout of the items of a literal ``nn.ModuleList([...])``, iterated or indexed later
    (``for layer in self.down: x = layer(x)``; ConvNeXt's downsampling: a channels-first norm,
    then a convolution). ``of``: (the index's ``Layouts.of``, the scope's local lists). Where
    the only channels-last items are convolutions built in place (``is_conv``), they become
    the NCHW Conv{n}d helper (their ids added to ``torch_convs``) and the list runs in torch's
    layout whatever the order of the calls; else the items' layouts combined (``mixed`` where
    they differ)."""
    layouts = [of[0](e, of[1]) for e in items]
    layout = combine(layouts)
    convs = [e for e, lay in zip(items, layouts) if lay == "channels_last"]
    if layout == "mixed" and "mixed" not in layouts and all(
            isinstance(e, cst.Call) and is_conv(e) for e in convs):
        torch_convs.update(id(e) for e in convs)
        return "torch"
    return layout


def _summed_items(v: cst.BaseExpression) -> list[cst.BaseExpression] | None:
    """The layers of ``[conv] + [Block(d) for _ in range(n)] + ([norm] if last else [])``
    (lists, comprehensions and choices of them added up), or None."""
    if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add) or isinstance(
            v, cst.IfExp):
        a = _summed_items(v.left if isinstance(v, cst.BinaryOperation) else v.body)
        b = _summed_items(v.right if isinstance(v, cst.BinaryOperation) else v.orelse)
        return None if a is None or b is None else a + b
    if isinstance(v, cst.List) and not any(isinstance(e, cst.StarredElement)
                                           for e in v.elements):
        return [e.value for e in v.elements]
    return [v.elt] if isinstance(v, cst.ListComp) else None


def literal_layout(layouts, v: cst.BaseExpression, scope_lists, qualified) -> str | None:
    """The layout of the layers of a literal spread where their order is not kept
    (``nn.Sequential(OrderedDict([("conv0", nn.Conv2d(...)), ("norm0", norm_layer(c)),
    ("pool0", nn.MaxPool2d(3, 2, 1))]))``, timm's densenet stem), or of a local list of them
    added up (csatv2's ``layers = [conv] + [Block(...) for ...] + [LayerNorm2d(d)]``, then
    ``nn.Sequential(*layers)``; None for another value): torch's when its only
    channels-last items are convolutions or poolings built in place, which become the NCHW
    Conv2d / MaxPool2d helpers (``torch_convs``), as in an OrderedDict filled by name.
    ``layouts``: the index's Layouts; ``qualified``: analysis/index.py's."""
    if isinstance(v, cst.BinaryOperation):
        items = _summed_items(v)
        if items is None or not items:
            return None
        v = cst.List([cst.Element(x) for x in items])
    elif not isinstance(v, (cst.List, cst.Tuple)):
        return None
    got = [layouts.of(e.value, scope_lists) for e in v.elements]
    layout = combine(got)
    if layout != "mixed" or "mixed" in got:
        return layout
    built = []
    for e in v.elements:
        call = e.value.elements[1].value if isinstance(e.value, cst.Tuple) and len(
            e.value.elements) == 2 else e.value
        rule = layouts.rules.layers.get(qualified(layouts.meta, call.func) or "") if isinstance(
            call, cst.Call) else None
        if rule is not None and rule.special in ("conv", "pool") and (
                built_layout(rule, call, layouts.index.factory_dicts) == "channels_last"):
            built.append(call)
    if built and len(built) == got.count("channels_last"):
        layouts.index.torch_convs.update(id(c) for c in built)
        return "torch"
    return layout
