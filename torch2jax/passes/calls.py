"""Transforms of a layer's *call*, for layers whose forward differs from the JAX module's.

A ``[[layer]]`` rule describes the constructor; ``call = "name"`` (with ``call_params``, the
torch forward's parameter order) names one of these for the calls ``self.attn(q, k, v)`` of an
attribute built by that rule. ``nn.MultiheadAttention`` takes (L, N, E) inputs and returns
``(output, weights)``; ``nnx.MultiHeadAttention`` takes batch-first inputs and returns the
output: the call is rewritten, not only the constructor.

Each transform takes a :class:`CallSite` and returns the JAX expression, or raises
:class:`~torch2jax.passes.common.Untranslatable`. The rewriter applies them when a call's callee
is ``self.<attr>`` and the attribute's rule has ``call`` (``TorchToJax._rule_call``); the
constructor's arguments come from the file index (``ClassInfo.attr_ctor``).
``ENGINE_TRANSLATES_CALLS`` False would flag these layers' constructors instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from torch2jax.passes.common import BoundArgs
from torch2jax.ruleset import Rule
from torch2jax.targets import Target, get_target

ENGINE_TRANSLATES_CALLS = True


@dataclass
class CallSite:
    rule: Rule
    func: cst.BaseExpression  # the callee as it stays in the output: ``self.attn``
    ctor: BoundArgs  # the constructor's arguments (torch source), bound to rule.params
    args: BoundArgs  # the call's arguments, bound to rule.call_params
    # the assignment targets when the call is unpacked (``out, _ = self.attn(...)``), as
    # source text, or the index when it is subscripted (``self.attn(...)[0]``)
    unpack: tuple[str, ...] | None = None
    index: int | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)  # (severity, message)
    target: str = "nnx"  # nnx | linen (the modules' attribute names can differ)
    packed: bool = False  # the file packs sequences (pack_padded_sequence): RNNs are helpers

    @property
    def renders(self) -> Target:
        """The target the call is translated for (targets/__init__.py)."""
        return get_target(self.target)

    def lit(self, name: str):
        """A call argument's literal value, None when absent, ``...`` if not a literal."""
        return self.args.literal(name)

    def ctor_lit(self, name: str):
        """A constructor argument's literal value (the rule's default when absent)."""
        node = self.ctor.get(name)
        if node is None:
            value = self.rule.defaults.get(name)
            return None if value == "None" else value
        return self.ctor.literal(name)

    def unused(self, i: int) -> bool:
        """Whether element ``i`` of the returned tuple is certainly not used: the call is
        subscripted with another index, or unpacked into ``_``-names there."""
        if self.index is not None:
            return self.index != i
        if self.unpack is None or i >= len(self.unpack):
            return False
        names = [n for n in self.unpack[i].replace("(", " ").replace(")", " ").replace(
            ",", " ").split() if n]
        return bool(names) and all(n.startswith("_") for n in names)


CALLS: dict[str, Callable[[CallSite], cst.BaseExpression]] = {}


def call_transform(name: str):
    def register(fn: Callable[[CallSite], cst.BaseExpression]):
        CALLS[name] = fn
        return fn

    return register
