"""A loop over a literal list of layers of several forms (``nn.ModuleList([conv, nn.ReLU(),
conv, nn.BatchNorm2d(c)])``, ``for layer in self.layers: x = layer(x)``), unrolled.

Each equinox layer is called in its own form (per example: a BatchNorm takes and returns the
state, dropout a key; in a module kept batched: each mapped over the leading axes as
``LayerCalls.batched_call`` writes it), so one loop body cannot call them all alike. The
list's length is known (the layers are literal), so the body is written once per layer, after
``layer = self.layers[i]``. The loop used to take every element for the first one's form: a
call missing the state or the key, an error at run time that no mark announced.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code
from torch2jax.targets.equinox_layers import EquinoxError, Info, Layer, batched_form


def _form(p: Layer, batched: bool) -> tuple:
    return batched_form(p) if batched else (p.kind, p.cls, p.alts, p.stateful, p.keyed,
                                             p.rank, p.kind == "lambda" and code(p.node))


def unrolled_loop(fw: Any, s: cst.For, it: cst.BaseExpression, lay: Layer | None
                  ) -> list[cst.BaseStatement] | None:
    """``for layer in self.layers:`` over a literal list whose layers differ in how they are
    called: the body once per layer (``fw`` is the equinox_forward.Forward writing the
    ``__call__``); None where the layers are called alike (one loop) or are not literal."""
    if lay is None or lay.kind != "list" or not isinstance(s.target, cst.Name) or \
            "*" in lay.items or lay.loop or not lay.items:
        return None
    items = [lay.items.get(str(i)) for i in range(len(lay.items))]
    if any(p is None for p in items) or len({_form(p, fw.owner.batched) for p in items}) == 1:
        return None
    if s.orelse is not None or findall(s.body, m.Break() | m.Continue()):
        raise EquinoxError("a loop with break or continue over a list of layers of several "
                           "forms")
    name = s.target.value
    out: list[cst.BaseStatement] = []
    for i, p in enumerate(items):
        kind = f"layer:{name}:{i}"
        fw.loop_layers = {**fw.loop_layers, kind: p}
        fw.env[name] = Info(kind=kind)
        bind = cst.parse_statement(f"{name} = {code(it)}[{i}]\n")
        out += [bind.with_changes(leading_lines=s.leading_lines) if i == 0 else bind,
                *fw.block(list(s.body.body))]
    return out
