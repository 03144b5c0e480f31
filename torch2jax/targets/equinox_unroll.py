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


_ENUMERATE = m.For(target=m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())]),
                   iter=m.Call(func=m.Name("enumerate"), args=[m.Arg(keyword=None, star="")]))


def unrolled_loop(fw: Any, s: cst.For, it: cst.BaseExpression, lay: Layer | None
                  ) -> list[cst.BaseStatement] | None:
    """``for layer in self.layers:`` (or ``for i, layer in enumerate(self.layers):``) over a
    literal list whose layers differ in how they are called: the body once per layer (``fw`` is the equinox_forward.Forward writing the ``__call__``); None
    where the layers are called alike in one loop, or are not literal."""
    index = None
    if m.matches(s, _ENUMERATE):
        it, lay = fw.resolve(s.iter.args[0].value)
        index, target = (e.value.value for e in s.target.elements)
    elif isinstance(s.target, cst.Name):
        target = s.target.value
    else:
        return None
    if lay is None or lay.kind != "list" or "*" in lay.items or lay.loop or not lay.items:
        return None
    items = [lay.items.get(str(i)) for i in range(len(lay.items))]
    if any(p is None for p in items):
        return None
    # (enumerate's loop calls its layers as they are: one that takes a state or a key, or
    # layers of several forms, are called each in its form)
    alike = len({_form(p, fw.owner.batched) for p in items}) == 1
    if alike and (index is None or not any(p.stateful or p.keyed for p in items)):
        return None
    if s.orelse is not None or findall(s.body, m.Break() | m.Continue()):
        raise EquinoxError("a loop with break or continue over a list of layers of several "
                           "forms")
    out: list[cst.BaseStatement] = []
    for i, p in enumerate(items):
        kind = f"layer:{target}:{i}"
        fw.loop_layers = {**fw.loop_layers, kind: p}
        fw.env[target] = Info(kind=kind)
        bind = [cst.parse_statement(f"{target} = {code(it)}[{i}]\n")]
        if index is not None and any(n.value == index for n in findall(s.body, m.Name())):
            fw.env[index] = Info()
            bind.insert(0, cst.parse_statement(f"{index} = {i}\n"))
        bind[0] = bind[0].with_changes(leading_lines=s.leading_lines) if i == 0 else bind[0]
        out += [*bind, *fw.block(list(s.body.body))]
    return out
