"""An ``if`` that only logs, on a test that reads a tensor (CSM's ``if not
is_torchdynamo_compiling() and input_ids_are_first_codebook: logger.warning(...)``, a
``warnings.warn`` under ``if (x > 100).any():``): under jax.jit the test is a traced value that
Python cannot branch on, and the branch computes nothing, so the statement goes (an info
diagnostic says so). Called by :meth:`torch2jax.passes.rewrite.TorchToJax.leave_If` with the
transformer as ``t``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code

# the calls that only report: logging's and warnings' (transformers' logger.warning_once)
_REPORTS = frozenset({"debug", "info", "warning", "warning_once", "warn", "error",
                      "warning_advice", "info_once"})
_REPORTERS = frozenset({"logger", "logging", "warnings", "log", "_logger"})


def _reports(statement: cst.BaseStatement) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(m.matches(s, m.Expr(value=m.Call(func=m.Attribute(
        value=m.Name(), attr=m.Name())))) and s.value.func.attr.value in _REPORTS
        and s.value.func.value.value in _REPORTERS for s in statement.body)


def _reads_a_tensor(t, test: cst.BaseExpression) -> bool:
    """One of the test's operands (through ``and``, ``or``, ``not``) is a tensor: a traced
    boolean under jax.jit (``x is None``, ``x.ndim == 3`` are not)."""
    if isinstance(test, cst.BooleanOperation):
        return _reads_a_tensor(t, test.left) or _reads_a_tensor(t, test.right)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _reads_a_tensor(t, test.expression)
    if isinstance(test, cst.Comparison) and any(isinstance(c.operator, (
            cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in test.comparisons):
        return False  # (x is None: Python's answer)
    return t.values.is_tensor(test)


def traced_log_guard(t, original_node: cst.If) -> bool:
    """Whether ``original_node`` is an ``if`` (no ``else``) whose body only logs or warns
    and whose test reads a tensor: then it goes, with an info diagnostic."""
    if original_node.orelse is not None or t.values is None:
        return False
    body = original_node.body
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    if not statements or not all(_reports(s) for s in statements):
        return False
    if not _reads_a_tensor(t, original_node.test):
        return False
    t.diag(original_node, "traced-log-guard", "info",
           f"if {code(original_node.test)}: a warning on a traced value, dropped (jax.jit "
           "cannot branch on it, and the branch computes nothing)")
    return True
