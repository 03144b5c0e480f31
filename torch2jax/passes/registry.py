"""The registry of rule specials: the :class:`Site` a special reads and the ``special`` decorator.

A rule in ``rules/*.toml`` names a transform with ``special = "name"``. The transforms live in
the ``special*`` modules of this package and in :mod:`torch2jax.passes.special_optim`; they
register themselves here when imported, and :mod:`torch2jax.passes.specials` imports them all.
This module imports none of them, so the registrants depend on it and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from torch2jax.passes.common import (
    BoundArgs,
    Untranslatable,
    arg,
    code,
    expr,
    is_simple,
    try_literal,
)
from torch2jax.ruleset import Rule
from torch2jax.targets import Target, get_target


@dataclass
class Site:
    rule: Rule
    args: BoundArgs
    receiver: cst.BaseExpression | None = None
    unpack: int | None = None  # targets when the call is the value of ``a, b = ...``
    target: str = "nnx"  # the column of the rule tables the site is translated to
    rngs: cst.BaseExpression | None = None  # the rngs expression in scope (layers)
    defined: set[str] = field(default_factory=set)  # top-level names of the file
    notes: list[tuple[str, str]] = field(default_factory=list)  # (severity, message)
    # the layer is applied to one example, (C, *spatial), not a batch (the equinox target)
    per_example: bool = False
    packed: bool = False  # the file packs sequences (pack_padded_sequence): RNNs are helpers
    # arguments that may hold None at run time (self.bias of a LayerNorm built with bias=False)
    optional: frozenset[str] = frozenset()
    # arguments that hold a torch dtype (x.to(other.dtype), x.to(input_dtype)): value analysis
    dtypes: frozenset[str] = frozenset()
    # arguments that hold a tuple or list (kernel_size=patch_size, where patch_size is
    # ``p if isinstance(p, Iterable) else (p, p)``): value analysis
    sequences: frozenset[str] = frozenset()
    # arguments that hold a Python number (torch.Tensor(dim), dim = config.hidden_size):
    # value analysis
    scalars: frozenset[str] = frozenset()
    # arguments that are not literals but hold one of these literals (``mode=self.mode``, set
    # once from a constructor parameter: its default and what the file's constructions pass;
    # analysis/value_choices.py), argument name -> the literals
    choices: dict[str, tuple] = field(default_factory=dict)
    # the rank of tensor arguments where the function's own lines show it (the query, key
    # and value of an attention call: passes/attention_rank.py), argument name -> rank
    ranks: dict[str, int] = field(default_factory=dict)
    # binds an expression to a fresh name and returns the name: a tensor the translation reads
    # twice. The binding is a statement before the current one where that keeps the order and
    # the count of evaluation, else a walrus at the name's first read in the translation
    # (``walrus``, written by the rewriter). None where neither is possible.
    bind: Callable[[cst.BaseExpression, str], cst.Name] | None = None
    # (name, value) bound by ``bind`` as walrus targets (passes/rewrite_calls.py writes them)
    walrus: list[tuple[str, cst.BaseExpression]] = field(default_factory=list)
    # puts a statement before the current one (None where there is no simple statement)
    before: Callable[[cst.BaseStatement], None] | None = None

    def x(self, name: str | None = None) -> cst.BaseExpression:
        """The tensor operated on: the receiver of a method, or the named argument (by default
        the rule's first parameter)."""
        if self.receiver is not None:
            return self.receiver
        name = name or (self.rule.params[0] if self.rule.params else "input")
        node = self.args.get(name)
        if node is None:
            raise Untranslatable(f"{self.rule.torch}: missing argument {name!r}")
        return node

    def get(self, name: str) -> cst.BaseExpression | None:
        return self.args.get(name)

    def once(self, node: cst.BaseExpression, hint: str, what: str) -> cst.BaseExpression:
        """``node`` where the translation reads it more than once: itself when it is a name or
        an attribute chain, else a fresh name bound to it (``bind``: evaluated once, in torch's
        order). ``what`` names it in the refusal where it cannot be bound."""
        if is_simple(node):
            return node
        if self.bind is None:
            raise Untranslatable(f"{what} `{code(node)}` is used more than once in the "
                                 "translation and cannot be bound here: assign it to a name "
                                 "first")
        return self.bind(node, hint)

    def lit(self, name: str):
        """The literal value of an argument, torch's default when absent, ``...`` if not literal."""
        node = self.args.get(name)
        if node is None:
            value = self.rule.defaults.get(name)
            return None if value == "None" else value
        return try_literal(node, ...)

    def note(self, message: str, severity: str = "info") -> None:
        self.notes.append((severity, message))

    @property
    def renders(self) -> Target:
        """The target whose column of the rule tables the site is translated to: the specials
        ask it (targets/__init__.py), not its name."""
        return get_target(self.target)

    def rngs_arg(self) -> list[cst.Arg]:
        return [arg(self.rngs, "rngs")] if self.rngs is not None else []


SPECIALS: dict[str, Callable[[Site], cst.BaseExpression]] = {}


def special(name: str):
    def register(fn: Callable[[Site], cst.BaseExpression]):
        SPECIALS[name] = fn
        return fn

    return register


def tuple_of(node: cst.BaseExpression, n: int, seq: bool = False) -> cst.BaseExpression:
    """``k`` -> ``(k, k)`` for an int literal or a name; tuples pass through; a name that
    holds a list or tuple (``seq``) -> ``tuple(k)`` (static, hashable)."""
    if seq and not isinstance(node, (cst.Tuple, cst.List)):
        return expr("tuple({x})", x=node)
    if isinstance(node, (cst.Tuple, cst.List)):
        items = [code(e.value) for e in node.elements]
    else:
        items = [code(node)] * n
    return expr("(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")")


def pool_window(site: Site, k: cst.BaseExpression, stride: cst.BaseExpression,
                n: int) -> list[cst.Arg]:
    """A pooling layer's ``window_shape=`` and ``strides=`` (the stride given, or the kernel
    size, torch's default); a name holding a list or tuple (mvitv2's ``kernel_skip = [s + 1
    for s in stride_q]``) is ``tuple(kernel_skip)``, static and hashable, and a padding held
    so, one pair per entry (the caller writes any other padding)."""
    named = ("stride" if stride is not k else "kernel_size") in site.sequences
    out = [arg(tuple_of(k, n, "kernel_size" in site.sequences), "window_shape"),
           arg(tuple_of(stride, n, named), "strides")]
    if "padding" in site.sequences:
        out.append(arg(expr("tuple((p, p) for p in {x})", x=site.args.get("padding")), "padding"))
    return out


def spatial_dims(rule_name: str) -> int:
    for n in (1, 2, 3):
        if rule_name.endswith(f"{n}d"):
            return n
    return 2
