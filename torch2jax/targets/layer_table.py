"""Layers built from the rule tables: the ``linen = {...}`` / ``equinox = {...}`` tables of a
``[[layer]]`` in ``rules/*.toml`` (:class:`torch2jax.ruleset.TargetLayer`).

The linen and equinox targets start from the NNX constructor the rule emits
(``nnx.LayerNorm(32, epsilon=1e-05, rngs=rngs)``); :func:`construct` turns it into the target's
constructor by the table: which arguments it keeps, in which order and under which names,
which it drops, which it adds. A layer whose mapping is not a table (BatchNorm's running
average flag, Sequential, attention, recurrent cells) stays a named branch of its target.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import libcst as cst

from torch2jax.passes.common import Untranslatable, code, try_literal
from torch2jax.ruleset import Rule, RuleError, TargetLayer, builtin_rules


@dataclass(frozen=True)
class Built:
    """A target constructor's parts: the class, positionals and keywords, in order."""

    spec: TargetLayer
    pos: list[cst.BaseExpression]
    kw: list[tuple[str, cst.BaseExpression]]
    rank: int | None = None  # the class's n (spec.rank): n spatial axes

    @property
    def cls(self) -> str:
        """The class written: the table's, or its rank's (``eqx.nn.Conv2d``)."""
        return self.spec.cls if self.rank is None else f"{self.spec.cls}{self.rank}d"


@cache
def tables(target: str) -> dict[str, tuple[Rule, TargetLayer]]:
    """NNX constructor -> (the rule, its ``target`` table), over the built-in rules."""
    out: dict[str, tuple[Rule, TargetLayer]] = {}
    for rule in builtin_rules().layers.values():
        spec = rule.target_layers.get(target)
        if spec is None:
            continue
        nnx = rule.targets["nnx"]
        if nnx in out and out[nnx][1] != spec:
            raise RuleError(f"{rule.source}: {nnx} has two different {target} tables "
                            f"({out[nnx][0].torch}, {rule.torch})")
        out.setdefault(nnx, (rule, spec))
    return out


def classes(target: str) -> dict[str, str]:
    """NNX layer class -> the target's class, for the layers with a table."""
    return {nnx: spec.cls for nnx, (_, spec) in tables(target).items()}


def construct(node: cst.Call, target: str, fields: dict[str, str] | None = None,
              error: type[Untranslatable] = Untranslatable) -> Built | None:
    """The target constructor for the NNX layer constructor ``node`` by its table; None when
    the layer has no table for ``target``. ``fields``: the values of the ``{name}``
    placeholders of ``add``. Raises ``error`` for an argument the target has no form for."""
    name = code(node.func)
    found = tables(target).get(name)
    if found is None:
        return None
    rule, spec = found
    pos = [a.value for a in node.args if a.keyword is None and not a.star]
    if len(pos) + sum(1 for a in node.args if a.keyword is not None) != len(node.args):
        raise error(f"{name} with unpacked arguments has no {target} form")
    kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    kw.pop("rngs", None)
    rank = None
    if spec.rank:
        size = kw.get(spec.rank)
        if not isinstance(size, cst.Tuple) or not 1 <= len(size.elements) <= 3:
            raise error(f"{name} whose {spec.rank} is not a tuple of 1 to 3 sizes")
        rank = len(size.elements)
    for k, allowed in spec.strings.items():
        value = try_literal(kw.get(k), None)
        if isinstance(value, str) and value not in allowed:
            raise error(f"{name} {k}={code(kw[k])} has no {target} form")
    if spec.args is None:
        out_pos = pos
    else:
        if len(pos) > len(rule.nnx_params):
            raise error(f"{name} with {len(pos)} positional arguments")
        bound = dict(zip(rule.nnx_params, pos))
        for p in rule.nnx_params[len(pos):]:
            if p in kw:
                bound[p] = kw.pop(p)
        missing = [a for a in spec.args if a not in bound]
        if missing:
            raise error(f"{name} without its {missing[0]}")
        out_pos = [bound.pop(a) for a in spec.args]
        # the others, unless dropped, are the target's keywords (first, in NNX's order)
        kw = {**{p: v for p, v in bound.items() if p not in spec.drop}, **kw}
    for d in spec.drop:
        kw.pop(d, None)
    if spec.keywords is None:
        out_kw = list(kw.items())
    else:
        out_kw = []
        merged: dict[str, list[str]] = {}  # target keyword -> the NNX keywords it takes
        for old, new in spec.keywords.items():
            merged.setdefault(new, []).append(old)
        for new, olds in merged.items():
            given = [kw.pop(old) for old in olds if old in kw]
            if not given:
                continue
            if len(given) != len(olds) or len({code(v) for v in given}) > 1:
                raise error(f"{name} with {' and '.join(olds)} not the same: {spec.cls} has "
                            f"one {new} for them")
            out_kw.append((new, given[0]))
        if kw:
            raise error(f"{name} argument {min(kw)} {spec.refuse or f'has no {target} form'}")
    for k, text in spec.add.items():
        out_kw.append((k, cst.parse_expression(text.format(**(fields or {})))))
    return Built(spec, out_pos, out_kw, rank)
