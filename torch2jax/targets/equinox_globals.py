"""Functions of a script that read the model as a global (``def train(epoch): ... model(x)``,
called per epoch from the top level), under the equinox target.

torch mutates the model, its optimizer and the random state in place; an equinox model is an
immutable pytree, and the optimizer's state and the key are arrays the step returns. A function
that rebinds them (the train step's results, ``model = eqx.nn.inference_mode(model)``,
``key, dropout_key = jax.random.split(key)``) declares them ``global``: the script's names are
rebound, as torch's objects were changed, and the function keeps the signature its callers use.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall


class _OwnScope(cst.CSTVisitor):
    """The names a function binds in its own scope (not in the functions, lambdas and classes
    defined in it, whose names it binds), and those it declares ``global``."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.declared: set[str] = set()

    def _targets(self, node: cst.CSTNode) -> None:
        self.bound |= {n.value for n in findall(node, m.Name())}

    def visit_FunctionDef(self, node) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_ClassDef(self, node) -> bool:
        self.bound.add(node.name.value)
        return False

    def visit_Lambda(self, node) -> bool:
        return False

    def visit_AssignTarget(self, node) -> None:
        self._targets(node.target)

    def visit_AugAssign(self, node) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node) -> None:
        self._targets(node.target)

    def visit_For(self, node) -> None:
        self._targets(node.target)

    def visit_AsName(self, node) -> None:
        self._targets(node.name)

    def visit_CompFor(self, node) -> None:
        self._targets(node.target)

    def visit_NamedExpr(self, node) -> None:
        self._targets(node.target)

    def visit_Global(self, node) -> None:
        self.declared |= {n.name.value for n in node.names}


def own_scope(body: cst.CSTNode, params: list[str] | tuple[str, ...] = ()
              ) -> tuple[set[str], set[str]]:
    """(the names bound in the function's own scope, its parameters included, less those it
    declares global; the names it declares global)."""
    v = _OwnScope()
    body.visit(v)
    return (v.bound | set(params)) - v.declared, v.declared


def read_globals(fn: cst.FunctionDef, names: set[str], params: list[str]) -> set[str]:
    """Which of the top-level ``names`` the function reads as globals: read in it (in its own
    body or a function defined in it) and not bound in its own scope."""
    local, _ = own_scope(fn.body, params)
    read = {n.value for n in findall(fn.body, m.Name())}
    return (read & names) - local


def declare_globals(fn: cst.FunctionDef, candidates: set[str]) -> cst.FunctionDef:
    """``global a, b`` at the top of ``fn`` for the ``candidates`` its own scope rebinds (after
    a docstring), joined with a ``global`` statement it already has."""
    bound, declared = own_scope(fn.body)
    names = sorted((candidates & bound) - declared)
    if not names:
        return fn
    body = list(fn.body.body)
    at = 1 if body and m.matches(body[0], m.SimpleStatementLine(
        body=[m.Expr(m.SimpleString() | m.ConcatenatedString())])) else 0
    stmt = cst.parse_statement(f"global {', '.join(names)}\n")
    if at < len(body):
        stmt = stmt.with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[])
    body.insert(at, stmt)
    return fn.with_changes(body=fn.body.with_changes(body=body))
