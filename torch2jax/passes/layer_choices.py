"""The literals a layer's flag argument may hold where it is a constructor parameter passed on
(``nn.LSTM(input_size, hidden_size, num_layers, bias=bias)`` inside a module class whose
``bias=True`` the file's constructions of it do not override): the layer specials read them
from ``Site.choices`` (an LSTM's or GRU's bias, which the converted cells always have)."""

from __future__ import annotations

from typing import Any

import libcst as cst

from torch2jax.analysis.value_choices import param_name_choices
from torch2jax.passes.common import bind
from torch2jax.ruleset import Rule

# the layer arguments looked up this way: flags whose other value the special refuses
_FLAGS = ("bias",)


def layer_choices(rewriter: Any, original: cst.Call, rule: Rule) -> dict[str, tuple]:
    """``{argument: literals}`` for the flag arguments of ``rule`` that ``original`` passes as
    a parameter of the enclosing class's ``__init__`` (empty where none is)."""
    if rewriter.values is None or rule.special not in ("lstm", "lstm_cell", "gru",
                                                       "gru_cell"):
        return {}
    given = bind(original.args, rule.params)
    out = {}
    for name in _FLAGS:
        node = given.get(name)
        found = param_name_choices(rewriter.values, node, rewriter.current_class) if (
            node is not None) else None
        if found is not None:
            out[name] = found
    return out
