"""Tables of names at a file's top level (``_block_registry = dict(basic=BasicBlock, ...)``,
``NORMS = {"layer": LayerNorm}``): calling an item of one calls one of its names."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m


def named_tables(module: cst.Module) -> dict[str, set[str]]:
    """The names the file binds at its top level to a dict, list or tuple of names, each
    table's names (``_block_registry = dict(basic=BasicBlock, edge=EdgeBlock)``, ``NORMS =
    {"layer": LayerNorm}``): what calling an item of the table may call."""
    tables: dict[str, set[str]] = {}
    for stmt in module.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
                and isinstance(stmt.body[0].targets[0].target, cst.Name)):
            continue
        items = table_items(stmt.body[0].value)
        if items and all(isinstance(v, cst.Name) for v in items):
            tables[stmt.body[0].targets[0].target.value] = {v.value for v in items}
    return tables


def table_items(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values of a table written ``{k: v, ...}``, ``dict(k=v, ...)``, ``[v, ...]`` or
    ``(v, ...)``; [] for anything else (a spread, a comprehension, another call)."""
    if isinstance(value, cst.Dict):
        items = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    elif isinstance(value, (cst.List, cst.Tuple)):
        items = [e.value for e in value.elements if isinstance(e, cst.Element)]
    elif m.matches(value, m.Call(func=m.Name("dict"))) and all(
            a.keyword is not None and not a.star for a in value.args):
        return [a.value for a in value.args]
    else:
        return []
    return items if len(items) == len(value.elements) else []


def method_on_parameter(node: cst.Call, fn: cst.FunctionDef) -> str | None:
    """The method name of ``module.init_weights(scheme=scheme)``, ``module`` a parameter of
    ``fn`` (timm's ``_init_weights`` over the model's modules) or a child ``self.x``: a call of
    whichever class's method of that name (not ``forward``); None for any other call."""
    if node.func.attr.value in ("forward", "__call__") if isinstance(
            node.func, cst.Attribute) else True:
        return None
    if m.matches(node.func.value, m.Attribute(value=m.Name("self"), attr=m.Name())):
        return node.func.attr.value  # a child's: self.encoder._init_weights(self.head)
    if not m.matches(node.func, m.Attribute(value=m.Name())) or node.func.value.value == "self":
        return None
    params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    # for attn in (self.attn, self.attn_last): attn.reset_parameters() (timm's byobnet)
    children = [m.AtLeastN(m.Element(m.Attribute(value=m.Name("self"))), n=1)]
    params |= {f.target.value for f in m.findall(fn, m.For(target=m.Name(), iter=m.Tuple(
        elements=children) | m.List(elements=children)))}
    return node.func.attr.value if node.func.value.value in params else None
