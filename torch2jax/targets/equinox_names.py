"""Names the equinox translation needs for itself.

Equinox passes random keys as ``key``: a module's ``__call__`` that draws (dropout) gains
``*, key=None``, and its callers pass ``key=``. A method of the torch file whose own argument
is called ``key`` (attention's ``forward(self, query, key, value, mask=None)``) would then
take two arguments of that name. Such an argument is renamed ``key_`` in its method, in the
torch source the translation starts from, where no call of a submodule in the file passes
``key=`` by keyword (``self.attn(q, key=k, value=v)``: it may be torch's own
MultiheadAttention; those files keep the name)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

KEY = "key"
RENAMED = "key_"


class _Rename(cst.CSTTransformer):
    """``key`` -> ``key_`` where it names a variable (not an attribute, not a keyword)."""

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value=RENAMED) if updated_node.value == KEY else \
            updated_node

    def leave_Attribute(self, original_node, updated_node):
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node, updated_node):
        return updated_node.with_changes(keyword=original_node.keyword)


def _takes_key(fn: cst.FunctionDef) -> bool:
    params = fn.params
    return any(p.name.value == KEY for p in (*params.posonly_params, *params.params,
                                             *params.kwonly_params))


def free_key_name(source: str) -> str:
    """``source`` with each method of its classes that takes an argument ``key`` taking it
    as ``key_`` (the source itself where none does, or where it cannot be done)."""
    if "key" not in source:
        return source
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError:
        return source  # (reported by the conversion itself)
    if findall(module, m.Call(func=m.Attribute(value=m.Name("self") | m.Attribute()), args=[
            m.ZeroOrMore(), m.Arg(keyword=m.Name(KEY)), m.ZeroOrMore()])) or RENAMED in {
            n.value for n in findall(module, m.Name())}:
        return source
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and any(
                isinstance(s, cst.FunctionDef) and _takes_key(s) for s in stmt.body.body):
            stmt = stmt.with_changes(body=stmt.body.with_changes(body=[
                s.visit(_Rename()) if isinstance(s, cst.FunctionDef) and _takes_key(s) else s
                for s in stmt.body.body]))
        body.append(stmt)
    return module.with_changes(body=body).code
