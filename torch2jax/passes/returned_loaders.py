"""Shuffled loaders a function of the file returns, and the names its callers bind them to.

``def get_loaders(bs): ...; return DataLoader(train, bs, shuffle=True), DataLoader(val, bs)``
called as ``train_loader, val_loader = get_loaders(64)``: torch's shuffled loader draws a new
order at every epoch, which a grain pipeline takes from a seed per epoch. The returned loader
becomes a function of the epoch (``lambda epoch: ....shuffle(seed=s + epoch).batch(bs)``), and
the caller's name is a loader shuffled per epoch as if it had been built there
(``for x, y in train_loader`` -> ``train_loader(epoch)``, passes/rewrite_data.py).

Only where every use of the function is such a call, bound to names: a caller that reads the
result in another way would meet a function where it expects a loader, so the loader stays
marked there (passes/data.py's loader_pipeline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall


@dataclass
class ReturnedLoaders:
    # the name a caller binds -> the DataLoader call its function returns there
    bound: dict[str, cst.Call] = field(default_factory=dict)
    # ids of the DataLoader calls written as functions of the epoch
    epoch_calls: set[int] = field(default_factory=set)


def find(module: cst.Module, shuffled_loader: Callable[[cst.Call], bool]) -> ReturnedLoaders:
    """``shuffled_loader``: whether a call is a DataLoader that shuffles."""
    out = ReturnedLoaders()
    for fn in module.body:
        if not isinstance(fn, cst.FunctionDef):
            continue
        returned = _returned(fn, shuffled_loader)
        if not returned:
            continue
        name = fn.name.value
        calls = findall(module, m.Call(func=m.Name(name)))
        reads = [n for n in findall(module, m.Name(name)) if n is not fn.name]
        sites = [_bound_names(module, c) for c in calls]
        if not calls or len(reads) != len(calls) or any(s is None for s in sites):
            continue
        value = fn.body.body[-1].body[0].value
        want = len(value.elements) if isinstance(value, (cst.Tuple, cst.List)) else None
        if any((len(s) if isinstance(s, list) else None) != want for s in sites):
            continue  # a tuple bound to one name, or unpacked into another count
        for s in sites:
            for pos, call in returned.items():
                target = s if pos is None else s[pos]
                if isinstance(target, str):
                    out.bound[target] = call
        out.epoch_calls |= {id(c) for c in returned.values()}
    return out


def _returned(fn: cst.FunctionDef, shuffled_loader) -> dict[int | None, cst.Call]:
    """The shuffled loaders of the function's one ``return``, its last statement: position in
    the returned tuple (None for a bare loader) -> the call."""
    if len(findall(fn, m.Return())) != 1 or not fn.body.body or not m.matches(
            fn.body.body[-1], m.SimpleStatementLine(body=[m.Return()])):
        return {}
    value = fn.body.body[-1].body[0].value
    if isinstance(value, cst.Call):
        return {None: value} if shuffled_loader(value) else {}
    if isinstance(value, (cst.Tuple, cst.List)) and not any(
            isinstance(e, cst.StarredElement) for e in value.elements):
        return {i: e.value for i, e in enumerate(value.elements)
                if isinstance(e.value, cst.Call) and shuffled_loader(e.value)}
    return {}


def _bound_names(module: cst.Module, call: cst.Call) -> list[str | None] | str | None:
    """The names ``a, b = fn(...)`` (a list, None where a target is not a name) or
    ``a = fn(...)`` binds; None when the call is used in another way."""
    for a in findall(module, m.Assign(targets=[m.AssignTarget()])):
        if a.value is not call:
            continue
        target = a.targets[0].target
        if isinstance(target, cst.Name):
            return target.value
        if isinstance(target, (cst.Tuple, cst.List)):
            return [e.value.value if isinstance(e.value, cst.Name) else None
                    for e in target.elements]
    return None
