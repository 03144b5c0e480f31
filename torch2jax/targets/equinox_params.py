"""A model's parameters read outside its class, under the equinox target: the NNX form
``jax.tree.leaves(nnx.state(model, nnx.Param))`` (torch's ``model.parameters()``, a
parameter count ``sum(p.numel() for p in model.parameters() if p.requires_grad)``) is the
model's floating-point arrays, ``eqx.filter(model, eqx.is_inexact_array)``, for a model with
no state beside it (BatchNorm's running statistics are arrays of the model's eqx.nn.State,
not of the model, but an equinox model with state holds their initial values too: left
marked). ``if p.requires_grad`` over them is dropped: every one of them is trained (the NNX
form's nnx.Param)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code

_LEAVES = m.Call(args=[m.Arg(m.Call(func=m.Attribute(
        value=m.Name("eqx"), attr=m.Name("filter")), args=[
            m.Arg(m.Name()), m.Arg(m.Attribute(value=m.Name("eqx"),
                                               attr=m.Name("is_inexact_array")))]))])


def param_arrays(call: cst.Call, stateless: set[str]) -> cst.BaseExpression | None:
    """``nnx.state(model, nnx.Param)`` of a model in ``stateless`` (the models of the scope
    with no state) -> ``eqx.filter(model, eqx.is_inexact_array)``; None otherwise."""
    if not m.matches(call, m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("state")),
                                  args=[m.Arg(m.Name(), keyword=None), m.Arg(m.Attribute(
                                      value=m.Name("nnx"), attr=m.Name("Param")),
                                      keyword=None)])):
        return None
    model = call.args[0].value.value
    if model not in stateless:
        return None
    return cst.parse_expression(f"eqx.filter({model}, eqx.is_inexact_array)")


class TrainedFlag(cst.CSTTransformer):
    """``for p in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)) if
    p.requires_grad`` -> without the condition (the module's docstring)."""

    def leave_CompFor(self, original_node, updated_node):
        it = updated_node.iter
        if not (m.matches(it, _LEAVES) and code(it.func) in ("jax.tree.leaves",
                                                              "jax.tree_util.tree_leaves")):
            return updated_node
        if not isinstance(updated_node.target, cst.Name):
            return updated_node
        name = updated_node.target.value
        ifs = [c for c in updated_node.ifs if not m.matches(c.test, m.Attribute(
            value=m.Name(name), attr=m.Name("requires_grad")))]
        return updated_node.with_changes(ifs=ifs)
