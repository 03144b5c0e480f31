"""Lambdas built in a module's constructor that close over its submodules, as methods.

``m = self.mlp; self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))`` (the minimal
GPT library's MLP) runs in torch: the lambda calls the very layers the module holds. In JAX
the module's parameters are values that transforms (``nnx.grad``, ``jax.jit`` through
``nnx.split``/``merge``, an equinox tree update) replace by new ones; a lambda keeps the layers
it closed over, so the model computes with stale parameters and their gradients are zero:
the forward pass matches torch, training silently does not. The lambda becomes a method that
reads the layers through ``self`` when it is called::

    def mlpf(self, x):
        return self.mlp.dropout(self.mlp.c_proj(self.mlp.act(self.mlp.c_fc(x))))

A lambda that also reads other locals of the constructor cannot move; it is marked.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

CONSTRUCTORS = ("__init__", "setup")
RULE = "lambda-closure"


def lambdas_to_methods(cls: cst.ClassDef, mark: Callable[[str, str], None],
                       subscripted: frozenset[str] = frozenset()
                       ) -> tuple[cst.ClassDef, list[str]]:
    """``cls`` with its constructor's ``self.X = lambda ...`` over submodules moved into
    methods; the names moved. ``mark(attr, message)`` is told about lambdas that cannot
    move. ``subscripted``: attributes holding a dict of submodules that the target indexes
    (linen: ``self.mlp["c_fc"]`` for torch's ``self.mlp.c_fc``)."""
    body = list(cls.body.body)
    at = next((i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef)
               and s.name.value in CONSTRUCTORS), None)
    if at is None:
        return cls, []
    init: cst.FunctionDef = body[at]
    stmts = list(init.body.body)
    if not any((a := _single_assign(st)) is not None and isinstance(a.value, cst.Lambda)
               for st in stmts):
        return cls, []  # (the common case: nothing to look at)
    aliases: dict[str, cst.BaseExpression] = {}  # m = self.mlp
    local_names = {p.name.value for p in _params(init.params)}
    methods: list[cst.FunctionDef] = []
    moved: list[str] = []
    existing = {s.name.value for s in body if isinstance(s, cst.FunctionDef)}
    keep: list[cst.BaseStatement] = []
    marked = False
    for stmt in stmts:
        assign = _single_assign(stmt)
        if assign is not None and isinstance(assign.targets[0].target, cst.Name):
            name = assign.targets[0].target.value
            if _rooted_at_self(assign.value):
                aliases[name] = assign.value
            else:
                aliases.pop(name, None)
            local_names.add(name)
        elif assign is not None and m.matches(assign.targets[0].target, m.Attribute(
                value=m.Name("self"))) and isinstance(assign.value, cst.Lambda):
            attr = assign.targets[0].target.attr.value
            lam: cst.Lambda = assign.value
            free = _free_names(lam) - {p.name.value for p in _params(lam.params)}
            if free & set(aliases) or "self" in free:
                others = free & (local_names - set(aliases))
                if others or attr in existing:
                    message = (f"self.{attr} = lambda closing over submodules and the "
                               f"constructor's {', '.join(sorted(others)) or 'names'}: under "
                               "JAX transforms the submodules' parameters would get no "
                               "gradient; write it as a method that reads them through self")
                    mark(attr, message)
                    marked = True
                    stmt = stmt.with_changes(leading_lines=[*stmt.leading_lines, cst.EmptyLine(
                        comment=cst.Comment(f"# TODO(torch2jax): {message} [{RULE}]"))])
                else:
                    body_expr = lam.body.visit(_Substitute(aliases, subscripted))
                    methods.append(_method(attr, lam, body_expr, stmt))
                    moved.append(attr)
                    continue
        else:
            for name in _assigned_names(stmt):
                aliases.pop(name, None)
                local_names.add(name)
        keep.append(stmt)
    if not methods and not marked:
        return cls, []
    # the aliases only the lambdas read go with them
    still_read: set[str] = set()
    for s in keep:
        a = _single_assign(s)
        still_read |= _free_names(a.value if a is not None and isinstance(
            a.targets[0].target, cst.Name) else s)
    keep = [s for s in keep if not (
        (a := _single_assign(s)) is not None and isinstance(a.targets[0].target, cst.Name)
        and a.targets[0].target.value in aliases
        and a.targets[0].target.value not in still_read)]
    if not keep:
        keep = [cst.SimpleStatementLine([cst.Pass()])]
    body[at] = init.with_changes(body=init.body.with_changes(body=keep))
    blank = [cst.EmptyLine(indent=False)]
    body[at + 1:at + 1] = [fn.with_changes(leading_lines=blank) for fn in methods]
    return cls.with_changes(body=cls.body.with_changes(body=body)), moved


def _params(params: cst.Parameters) -> list[cst.Param]:
    out = [*params.posonly_params, *params.params, *params.kwonly_params]
    for p in (params.star_arg, params.star_kwarg):
        if isinstance(p, cst.Param):
            out.append(p)
    return out


def _single_assign(stmt: cst.CSTNode) -> cst.Assign | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
            stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1:
        return stmt.body[0]
    return None


def _rooted_at_self(node: cst.BaseExpression) -> bool:
    while isinstance(node, (cst.Attribute, cst.Subscript)):
        node = node.value
    return m.matches(node, m.Name("self"))


def _assigned_names(stmt: cst.CSTNode) -> set[str]:
    return {n.target.value for n in _walk(stmt) if isinstance(n, cst.AssignTarget)
            and isinstance(n.target, cst.Name)}


def _walk(node: cst.CSTNode):
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _free_names(node: cst.CSTNode) -> set[str]:
    """Every Name read in ``node`` (attribute names and keywords aside)."""
    out = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Attribute):
            stack.append(n.value)
            continue
        if isinstance(n, cst.Arg):
            stack.append(n.value)
            continue
        if isinstance(n, cst.Name):
            out.add(n.value)
            continue
        stack.extend(n.children)
    return out


class _Substitute(cst.CSTTransformer):
    """The constructor's aliases (``m``) replaced by what they hold (``self.mlp``)."""

    def __init__(self, aliases: dict[str, cst.BaseExpression],
                 subscripted: frozenset[str]) -> None:
        super().__init__()
        self.aliases = aliases
        self.subscripted = subscripted

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return True

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name):
        return self.aliases.get(original_node.value, updated_node)

    def visit_Arg(self, node: cst.Arg) -> bool:
        return True

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg):
        # a keyword's name is a Name node too: keep it
        if original_node.keyword is not None:
            return updated_node.with_changes(keyword=original_node.keyword)
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute):
        if isinstance(original_node.value, cst.Name) and m.matches(
                self.aliases.get(original_node.value.value), m.Attribute(
                    value=m.Name("self"))) and self.aliases[
                        original_node.value.value].attr.value in self.subscripted:
            return cst.Subscript(value=updated_node.value, slice=[cst.SubscriptElement(
                cst.Index(cst.SimpleString(f'"{original_node.attr.value}"')))])
        return updated_node.with_changes(attr=original_node.attr)


def _method(name: str, lam: cst.Lambda, body: cst.BaseExpression,
            stmt: cst.BaseStatement) -> cst.FunctionDef:
    params = lam.params.with_changes(params=[cst.Param(cst.Name("self")),
                                             *lam.params.params])
    comment = stmt.trailing_whitespace.comment if isinstance(
        stmt, cst.SimpleStatementLine) else None
    ret = cst.SimpleStatementLine(
        body=[cst.Return(body.with_changes(lpar=[], rpar=[]) if hasattr(body, "lpar")
                         else body)],
        trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  ") if comment else cst.SimpleWhitespace(""),
            comment=comment))
    return cst.FunctionDef(name=cst.Name(name), params=_clean(params),
                           body=cst.IndentedBlock(body=[ret]))


def _clean(params: cst.Parameters) -> cst.Parameters:
    """Parameters with the default spacing of a def (a lambda's are written tight)."""
    items = list(params.params)
    fixed = [p.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
             if i < len(items) - 1 else p.with_changes(comma=cst.MaybeSentinel.DEFAULT)
             for i, p in enumerate(items)]
    return params.with_changes(params=fixed)
