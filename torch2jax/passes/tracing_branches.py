"""``torch.jit.is_tracing()`` in an ``if``'s test (rules/vision.toml, the "tracing" special).

The query asks whether ``torch.jit.trace`` is recording: the converted code never is, so the
call is ``False`` and the eager path stays (transformers' ``if use_cache and cache is None and
not torch.jit.is_tracing():`` builds the cache the forward returns; ``if not
torch.jit.is_tracing() and num_patches == num_positions ...:`` keeps the position table
without interpolating it). One shape keeps the traced path: an ``if`` headed by the query
(``if torch.jit.is_tracing() [or ...]:``) whose ``else`` keeps a value on ``self`` between calls
(timm's attention-bias cache, ``self.cache[key] = ...``): under jax.jit that memo would hold a
tracer, and both paths compute the same values.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

_SELF_WRITE = m.AssignTarget(target=m.Subscript(value=m.Attribute(value=m.Name("self")))
                             | m.Attribute(value=m.Name("self")))
_NOT_FALSE = m.UnaryOperation(operator=m.Not(), expression=m.Name("False"))


def _is_tracing(rewriter, node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call):
        return False
    rule = rewriter.rules.functions.get(rewriter.q(node.func) or "")
    return rule is not None and rule.special == "tracing"


def _without_not_false(test: cst.BaseExpression) -> cst.BaseExpression:
    """``a and b and not False`` -> ``a and b`` (``and`` groups to the left)."""
    if not (isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And)):
        return test
    left, right = _without_not_false(test.left), test.right
    if m.matches(right, _NOT_FALSE):
        return left
    if m.matches(left, _NOT_FALSE):
        return right
    return test.with_changes(left=left)


def tracing_if(rewriter, original: cst.If, updated: cst.If) -> tuple[cst.If, bool]:
    """``(the if, keep)``: ``keep`` (the body takes the if's place) when the if is headed by
    ``torch.jit.is_tracing()`` and its else keeps a value on ``self``, or its test is ``not
    torch.jit.is_tracing()``; otherwise the if with
    the query's ``False`` taken out of its test where it is a conjunct (``not False``) or the
    left of an ``or``. A test that is the bare query stays ``False`` (the caller drops the
    branch, as for ``torch.jit.is_scripting()``)."""
    test = original.test
    head = test.left if isinstance(test, cst.BooleanOperation) and isinstance(
        test.operator, cst.Or) else test
    if _is_tracing(rewriter, head):
        memo = original.orelse is not None and findall(original.orelse, _SELF_WRITE)
        if memo:
            return updated, True
        if head is not test and m.matches(updated.test, m.BooleanOperation(
                left=m.Name("False"), operator=m.Or())):
            return updated.with_changes(test=updated.test.right), False
        return updated, False
    if not any(_is_tracing(rewriter, c) for c in findall(test, m.Call())):
        return updated, False
    simpler = _without_not_false(updated.test)
    if m.matches(simpler, _NOT_FALSE):  # if not torch.jit.is_tracing(): the body stays
        return updated, True
    return updated.with_changes(test=simpler), False
