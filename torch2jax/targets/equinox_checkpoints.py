"""Checkpoint dicts under equinox: what the NNX pass wrote for ``torch.save({'net':
net.state_dict(), 'optimizer': optimizer.state_dict(), 'epoch': epoch}, path)`` and for the
resume's ``net.load_state_dict(checkpoint['net'])`` (passes/rewrite_checkpoints.py: an orbax
PyTree checkpoint, each state_dict an ``nnx.state(...).to_pure_dict()``), rewritten for an
equinox model before the training pass reads the file.

The checkpoint stays the orbax PyTree NNX writes (a directory at the path); a model's
state_dict in it is the list of the model's arrays (``jax.tree.leaves(eqx.filter(net,
eqx.is_array))``, in the model's own order), an optimizer's the leaves of its optax state;
loading puts them back into the structure of the model (``eqx.combine``) or of the optimizer
state the program built. A model with state (BatchNorm's statistics live in an
``eqx.nn.State`` beside it) or a file with several optimizers is left to the training pass,
which marks what it does not rewrite."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

_RNG_FREE = m.Arg(m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Not")),
                         args=[m.Arg(m.Attribute(value=m.Name("nnx"),
                                                 attr=m.Name("RngState")))]))
_STATE = m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("state")),
                args=[m.Arg(m.Name()), m.ZeroOrOne(_RNG_FREE)])


def _stmt(src: str) -> cst.BaseStatement:
    return cst.parse_statement(src + "\n")


class _Checkpoints(cst.CSTTransformer):
    def __init__(self, optimizers: set[str], opt_state: str) -> None:
        self.optimizers, self.opt_state = optimizers, opt_state
        self.changed = False

    def _leaves(self, state: cst.Call) -> str | None:
        """``nnx.state(net, nnx.Not(nnx.RngState))`` (a model's) or ``nnx.state(optimizer)``
        -> what the equinox program keeps of it, as a pytree; None for anything else."""
        owner = state.args[0].value.value
        if len(state.args) == 2 and owner not in self.optimizers:
            return f"eqx.filter({owner}, eqx.is_array)"
        if len(state.args) == 1 and owner in self.optimizers:
            # (an nnx.Optimizer the file builds, whose state the training pass names; not
            # one a method returns, configure_optimizers, whose state may be left unbound)
            return self.opt_state
        return None

    def leave_Call(self, original_node, updated_node):
        # nnx.state(x, ...).to_pure_dict() -> the leaves, in the pytree's order
        if m.matches(updated_node, m.Call(func=m.Attribute(value=_STATE, attr=m.Name(
                "to_pure_dict")), args=[])):
            tree = self._leaves(updated_node.func.value)
            if tree is not None:
                self.changed = True
                return cst.parse_expression(f"jax.tree.leaves({tree})")
        return updated_node

    def _body(self, body) -> list:
        """``s = nnx.state(x, ...)``, ``s.replace_by_pure_dict(d)``, ``nnx.update(x, s)`` ->
        the leaves of ``d`` put back into ``x``'s structure."""
        out = list(body)
        i = 0
        while i + 2 < len(out):
            a, b, c = out[i:i + 3]
            if m.matches(a, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                    m.Name())], value=_STATE)])):
                name = a.body[0].targets[0].target.value
                state = a.body[0].value
                owner = state.args[0].value.value
                tree = self._leaves(state)
                if tree is not None and m.matches(b, m.SimpleStatementLine(body=[m.Expr(
                        m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name(
                            "replace_by_pure_dict")), args=[m.Arg(keyword=None)]))])) and \
                        m.matches(c, m.SimpleStatementLine(body=[m.Expr(m.Call(
                            func=m.Attribute(value=m.Name("nnx"), attr=m.Name("update")),
                            args=[m.Arg(m.Name(owner)), m.Arg(m.Name(name))]))])):
                    d = cst.Module(body=[]).code_for_node(b.body[0].value.args[0].value)
                    leaves = f"jax.tree.unflatten(\n    jax.tree.structure({tree}), {d})"
                    new = _stmt(f"{self.opt_state} = {leaves}" if tree == self.opt_state
                                else f"{owner} = eqx.combine({leaves}, {owner})")
                    out[i:i + 3] = [new.with_changes(leading_lines=a.leading_lines)]
                    self.changed = True
            i += 1
        return out

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._body(updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._body(updated_node.body))


def rewrite(module: cst.Module, stateful: bool, opt_state: str) -> tuple[cst.Module, bool]:
    """The module with its checkpoint dicts' states in equinox's form, and whether any was
    rewritten. ``stateful``: a model of the file has state beside it (or its class, imported,
    is not known): nothing is rewritten, the training pass marks the NNX forms."""
    if stateful:
        return module, False
    optimizers = {a.targets[0].target.value for a in findall(module, m.Assign(
        targets=[m.AssignTarget(m.Name())], value=m.Call(func=m.Attribute(
            value=m.Name("nnx"), attr=m.Name("Optimizer")))))}
    if len(optimizers) > 1:  # (each would need its own optimizer state)
        return module, False
    pass_ = _Checkpoints(optimizers, opt_state)
    new = module.visit(pass_)
    return (new, True) if pass_.changed else (module, False)
