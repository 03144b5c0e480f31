"""torch's ``ceil_mode=True`` pooling (``nn.MaxPool2d`` / ``nn.AvgPool2d`` and ``F.max_pool2d`` /
``F.avg_pool2d``, passes/special.py's ``pool`` and ``pool_function``): flax's pooling with the
right padding of the last window's overhang, computed from the static shape of the input."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, code, try_literal
from torch2jax.passes.registry import Site, tuple_of


def _ints(node: cst.BaseExpression | None, n: int, name: str) -> tuple[int, ...]:
    value = try_literal(node, ...) if node is not None else 0
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if isinstance(value, (tuple, list)) and len(value) == n and all(
            isinstance(v, int) for v in value):
        return tuple(value)
    raise Untranslatable(f"pooling with ceil_mode=True and a non-literal {name}: the padding "
                         "of the last window is computed from it")


def _sizes(node: cst.BaseExpression | None, n: int, name: str) -> tuple[int | str, ...]:
    """A literal size per axis, or the name (an attribute) that holds an int: its code, the
    same on every axis (volo's ``nn.AvgPool2d(kernel_size=stride, stride=stride,
    ceil_mode=True)``)."""
    if isinstance(node, (cst.Name, cst.Attribute)) and not isinstance(
            try_literal(node, ...), (int, tuple, list)):
        return (code(node),) * n
    return _ints(node, n, name)


def _overhang(k: int | str, s: int | str, p: int, d: str) -> str:
    """How far torch's last ceil_mode window reaches past the symmetric padding ``p`` of an
    axis of length ``d``. torch takes ``ceil((d + 2p - k) / s) + 1`` windows, dropping the last
    one when it would start in the right padding: without that rule the overhang is
    ``(k - 2p - d) % s``; the rule can only bind when ``s > k - p``, and then the right
    padding is the value congruent to ``p`` + that overhang modulo ``s`` in ``[k - s, k)``."""
    if isinstance(k, str) or isinstance(s, str):  # held by names: the test runs at build time
        if p == 0:
            return f"(({k} - {d}) % {s} if {s} <= {k} else {k} - 1 - ({d} - 1) % {s})"
        return (f"(({k} - {2 * p} - {d}) % {s} if {s} <= {k} - {p} "
                f"else {k} - {1 + p} - ({p - 1} + {d}) % {s})")
    if s <= k - p:
        return f"({k - 2 * p} - {d}) % {s}" if k != 2 * p else f"-{d} % {s}"
    shift = f"({p - 1} + {d})" if p != 1 else d
    return f"{k - 1 - p} - {shift} % {s}"


def ceil_pool(site: Site, n: int, k_node, s_node, x: str, first: int,
               source: str | None = None, target: str | None = None) -> str:
    """torch's ceil_mode=True pooling of ``x`` (spatial axes ``first`` .. ``first + n - 1``)
    as flax's pooling with per-axis right padding, written with the static shape of ``x``.
    Max pooling pads with -inf (flax's max_pool does). Average pooling divides by the part of
    each window inside the input and its symmetric padding (torch counts that padding with
    count_include_pad=True, never the overhang): that padding becomes zeros (jnp.pad) and the
    overhang is left out of the count with count_include_pad=False. ``source``: the
    channels-last value pooled when ``x`` (whose shape is read) is channels-first; ``target``:
    the pooling function, when not the rule's."""
    ps = _ints(site.args.get("padding"), n, "padding")
    ks, ss = _sizes(k_node, n, "kernel_size"), _sizes(s_node, n, "stride")
    target = target or site.rule.targets.get(site.target) or site.rule.jax or ""
    avg = not target.endswith("max_pool")
    include_pad = avg and site.lit("count_include_pad") is not False and any(ps)

    def side(k: int, s: int, p: int, d: str) -> str:
        lo = 0 if include_pad else p
        hi = _overhang(k, s, p, d)
        return f"({lo}, {hi})" if include_pad or p == 0 else f"({p}, {p} + {hi})"

    if len(set(zip(ks, ss, ps))) == 1:
        padding = (f"tuple({side(ks[0], ss[0], ps[0], 'd')} for d in "
                   f"{x}.shape[{first}:{first + n}])")
    else:
        padding = "(" + ", ".join(side(k, s, p, f"{x}.shape[{first + i}]") for i, (k, s, p)
                                  in enumerate(zip(ks, ss, ps))) + ("," if n == 1 else "") + ")"
    source = source or x
    if include_pad:
        source = f"jnp.pad({source}, ((0, 0), {', '.join(f'({p}, {p})' for p in ps)}, (0, 0)))"
    window = f"window_shape={code(tuple_of(k_node, n))}, strides={code(tuple_of(s_node, n))}"
    return (f"{target}({source}, {window}, padding={padding}"
            + (", count_include_pad=False" if avg else "") + ")")
