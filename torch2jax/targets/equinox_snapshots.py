"""In-memory copies of a model's weights on equinox (an early stop's best weights).

``best = copy.deepcopy(model.state_dict())`` (or ``model.state_dict()``, or ``{k: v.clone()
for k, v in model.state_dict().items()}``) keeps the weights; ``model.load_state_dict(best)``
puts them back. An equinox model is an immutable pytree, so the copy is its arrays
(``eqx.filter(model, eqx.is_array)``, with the model's ``state`` where it has one: torch's
state_dict holds the buffers too) and the restore combines them with the model as it is now
(``eqx.combine(best, model)``): its other leaves, such as the inference flags that
``model.eval()`` set, stay as they are, as torch's load_state_dict leaves the mode alone.
Only for a name whose every use is one of these (analysis/accumulate.py find_memory_states)
and a model this scope can rebind (not a parameter of the function: its caller would not
see the new binding)."""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

# (Scope: equinox_training.py's Scope, which imports this module: its models, params,
# snapshots and flags(model) are what is read here)
Scope = Any

STATE = "state"  # the name of a model's eqx.nn.State (equinox_training.py reads it here)


def _tree(scope: Scope, model: str) -> str:
    return f"({model}, {STATE})" if scope.flags(model)[0] else model


def _copy_of(scope: Scope, name: str, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """``eqx.filter(model, eqx.is_array)`` for a copy of ``model.state_dict()`` bound to
    the snapshot ``name``; None where that is not what it is."""
    owners = {c.func.value.value for c in findall(value, m.Call(func=m.Attribute(
        value=m.Name(), attr=m.Name("state_dict")), args=[]))}
    if name not in scope.snapshots or len(owners) != 1 or not owners <= set(
            scope.models) - scope.params:
        return None
    model = owners.pop()
    if name == STATE and scope.flags(model)[0]:
        return None  # (the name of the model's own state)
    return cst.parse_expression(f"eqx.filter({_tree(scope, model)}, eqx.is_array)")


def snapshot(scope: Scope, small: cst.Assign) -> list[cst.BaseStatement] | None:
    """``best = <a copy of model.state_dict()>`` (or one element of a tuple assignment) ->
    ``best = eqx.filter(model, eqx.is_array)``: the weights, a snapshot (jax arrays are
    immutable)."""
    if len(small.targets) != 1:
        return None
    target, value = small.targets[0].target, small.value
    if isinstance(target, cst.Name):
        new = _copy_of(scope, target.value, value)
        return None if new is None else [cst.SimpleStatementLine(body=[small.with_changes(
            value=new, semicolon=cst.MaybeSentinel.DEFAULT)])]
    if not (isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)):
        return None
    elements, done = [], False
    for t, v in zip(target.elements, value.elements, strict=True):
        new = _copy_of(scope, t.value.value, v.value) if isinstance(t.value, cst.Name) else None
        if new is None and findall(v.value, m.Call(func=m.Attribute(attr=m.Name(
                "state_dict")))):
            return None
        done |= new is not None
        elements.append(v if new is None else v.with_changes(value=new))
    return [cst.SimpleStatementLine(body=[small.with_changes(
        value=value.with_changes(elements=elements), semicolon=cst.MaybeSentinel.DEFAULT)])
    ] if done else None


def restore(scope: Scope, call: cst.Call) -> list[cst.BaseStatement] | None:
    """``model.load_state_dict(best)`` of such a snapshot -> ``model = eqx.combine(best,
    model)``."""
    if not (m.matches(call, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name(
            "load_state_dict")), args=[m.Arg(m.Name(), keyword=None)]))
            and call.args[0].value.value in scope.snapshots):
        return None
    model = call.func.value.value
    if model in scope.params or (call.args[0].value.value == STATE and scope.flags(model)[0]):
        return None
    tree = _tree(scope, model)
    return [cst.parse_statement(
        f"{tree.strip('()')} = eqx.combine({call.args[0].value.value}, {tree})\n")]
