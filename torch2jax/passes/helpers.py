"""Module-level helper functions that converted code may call.

Some torch operations have no one-line JAX equivalent that reads well (adaptive pooling with
bins that overlap). The transforms emit a call to a plainly named function instead, and
:func:`add_helpers` writes that function's definition into the converted file, after its
imports, so that the output runs without torch2jax. A helper is added only when the converted
file calls it and does not define that name itself.
"""

from __future__ import annotations

import libcst as cst

# name -> (source, names it needs imported: keys of torch2jax.convert.IMPORT_LINES)
HELPERS: dict[str, tuple[str, set[str]]] = {}


def helper(name: str, imports: set[str], source: str) -> None:
    HELPERS[name] = (source.strip() + "\n", imports)


_ADAPTIVE = '''
def adaptive_{kind}_pool(x: jax.Array, output_size: tuple[int | None, ...]) -> jax.Array:
    """torch's adaptive {kind} pooling over the last len(output_size) axes of x.

    Output i of an axis of length n pools x[floor(i * n / out) : ceil((i + 1) * n / out)]:
    neighbouring bins overlap when out does not divide n. Pooling a box is pooling each of its
    axes in turn; None keeps an axis as it is.
    """
    first = x.ndim - len(output_size)
    for axis, out in enumerate(output_size, start=first):
        n = x.shape[axis]
        if out is None or out == n:
            continue
        bins = [
            jax.lax.slice_in_dim(x, i * n // out, -(-(i + 1) * n // out), axis=axis).{reduce}(
                axis=axis, keepdims=True
            )
            for i in range(out)
        ]
        x = jnp.concatenate(bins, axis=axis)
    return x
'''
helper("adaptive_avg_pool", {"jax", "jnp"}, _ADAPTIVE.format(kind="avg", reduce="mean"))
helper("adaptive_max_pool", {"jax", "jnp"}, _ADAPTIVE.format(kind="max", reduce="max"))


# equinox (torch2jax/targets/equinox.py): torch's LSTM (batch_first=True) on one example
helper("lstm_scan", {"jax", "jnp"}, '''
def lstm_scan(cell, xs: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """torch's one-layer LSTM on one sequence xs (L, I), from zero states, with an
    eqx.nn.LSTMCell (torch's gates, i f g o, and b_ih + b_hh as its bias): the outputs (L, H)
    and torch's (h_n, c_n), each (1, H) (one layer)."""
    zeros = jnp.zeros(cell.hidden_size, xs.dtype)

    def step(state, x):
        h, c = cell(x, state)
        return (h, c), h

    (h, c), out = jax.lax.scan(step, (zeros, zeros), xs)
    return out, (h[None], c[None])
''')


# linen (torch2jax/targets/linen.py): a Linear whose weight the forward code reads
helper("ReadableDense", {"linen", "Any"}, '''
class ReadableDense(nn.Module):
    """nn.Dense(features) with its kernel (in_features, features) and bias made in setup(), so
    that forward code can read them (torch's F.linear(x, self.fc.weight)); the same variables
    as nn.Dense's."""

    in_features: int
    features: int
    use_bias: bool = True
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros

    def setup(self):
        self.kernel = self.param("kernel", self.kernel_init, (self.in_features, self.features))
        self.bias = self.param("bias", self.bias_init, (self.features,)) if self.use_bias else None

    def __call__(self, x):
        y = x @ self.kernel
        return y if self.bias is None else y + self.bias
''')


_CONV = '''
class Conv{n}d(nnx.Conv):
    """nn.Conv{n}d where its arguments are the callers' (conv_layer=nn.Conv{n}d handed around,
    nn.Conv{n}d(cin, cout, **kwargs)): torch's arguments and its channels-first input and output
    around an nnx.Conv (kernel (*k, in, out), zero padding)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = True,
        *,
        rngs: nnx.Rngs,
    ) -> None:
        def spatial(v):
            return (v,) * {n} if isinstance(v, int) else tuple(v)

        super().__init__(
            in_channels,
            out_channels,
            kernel_size=spatial(kernel_size),
            strides=spatial(stride),
            padding=padding.upper() if isinstance(padding, str) else [(p, p) for p in spatial(padding)],
            kernel_dilation=spatial(dilation),
            feature_group_count=groups,
            use_bias=bias,
            rngs=rngs,
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.moveaxis(super().__call__(jnp.moveaxis(x, 1, -1)), -1, 1)
'''
for _n in (1, 2, 3):
    helper(f"Conv{_n}d", {"jax", "jnp", "nnx"}, _CONV.format(n=_n))


helper("Linear", {"jnp", "nnx"}, '''
class Linear(nnx.Linear):
    """nn.Linear for code that hands the layer class around as a value (linear_layer=nn.Linear):
    torch's arguments over an nnx.Linear (bias= is use_bias=, dtype= the parameters' dtype;
    device= has no meaning: JAX places arrays by sharding)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, rngs: nnx.Rngs) -> None:
        super().__init__(in_features, out_features, use_bias=bias,
                         param_dtype=jnp.float32 if dtype is None else dtype, rngs=rngs)
''')


helper("split_fractions", {"Any"}, '''
def split_fractions(dataset: Any, fractions: list[float]) -> list[Any]:
    """torch.utils.data.random_split's fractions over an already shuffled dataset: int(n * f)
    items each, the remainder handed out one at a time from the first split on."""
    n = len(dataset)
    lengths = [int(n * f) for f in fractions]
    for i in range(n - sum(lengths)):
        lengths[i % len(lengths)] += 1
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [dataset[start:start + length] for start, length in zip(starts, lengths)]
''')


helper("NamedSequential", {"Any", "nnx"}, '''
class NamedSequential(nnx.Sequential):
    """nn.Sequential(OrderedDict(...)): the layers run in order (layers[i]) and are also
    attributes by their names (self.heads.head)."""

    def __init__(self, layers: dict[str, Any]) -> None:
        super().__init__(*layers.values())
        for name, layer in layers.items():
            setattr(self, name, layer)
''')


helper("LayerDict", {"Any", "nnx"}, '''
class LayerDict(nnx.Dict):
    """nn.ModuleDict: layers by name (self[name], self.name) that iterate in the order they
    were added, as torch's do (an nnx.Dict iterates its attributes, which come back sorted by
    name from nnx.split / nnx.jit: "layer10" before "layer2")."""

    def __init__(self, layers: dict[str, Any] | None = None) -> None:
        self._order: tuple[str, ...] = ()
        for name, layer in (layers or {}).items():
            self[name] = layer

    def __setitem__(self, name: str, layer: Any) -> None:
        super().__setitem__(name, layer)
        if name not in self._order:
            self._order = (*self._order, name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._order = tuple(n for n in self._order if n != name)

    def __iter__(self):
        return iter(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order
''')


def namespace() -> dict:
    """Every helper defined, with the imports they use (for tests that evaluate one converted
    expression on its own)."""
    from typing import Any

    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import nnx

    ns: dict = {"jax": jax, "jnp": jnp, "nnx": nnx, "nn": nn, "Any": Any}
    for source, _ in HELPERS.values():
        exec(compile(source, "<torch2jax helper>", "exec"), ns)  # noqa: S102 - our own source
    return ns


class _Names(cst.CSTVisitor):
    def __init__(self) -> None:
        self.used: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in HELPERS:
            self.used.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # nnx.Linear is not the Linear helper
        return False


def _defined(module: cst.Module) -> set[str]:
    names = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for s in stmt.body:
                if isinstance(s, cst.Assign):
                    names |= {t.target.value for t in s.targets if isinstance(t.target, cst.Name)}
                elif isinstance(s, (cst.Import, cst.ImportFrom)) and not isinstance(
                        s.names, cst.ImportStar):
                    names |= {(a.asname.name.value if a.asname else cst.Module([]).code_for_node(
                        a.name).split(".")[0]) for a in s.names
                        if not a.asname or isinstance(a.asname.name, cst.Name)}
    return names


def add_helpers(module: cst.Module) -> tuple[cst.Module, set[str]]:
    """``module`` with the definitions of the helpers it calls, and the imports they need."""
    visitor = _Names()
    module.visit(visitor)
    wanted = sorted(visitor.used - _defined(module))
    if not wanted:
        return module, set()
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) or (
                    i == 0 and isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
                for s in stmt.body):
            at = i + 1
        else:
            break
    imports: set[str] = set()
    defs = []
    for name in wanted:
        source, needs = HELPERS[name]
        imports |= needs
        parsed = cst.parse_module(source).body[0]
        defs.append(parsed.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
    if at < len(body):
        lines = list(body[at].leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *lines])
    body[at:at] = defs
    return module.with_changes(body=body), imports
