"""``convert --init torch``: torch's default parameter initialisation, written into the layers.

flax initialises a Linear or Conv kernel with lecun_normal and its bias with zeros; torch draws
both from U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (the weight through kaiming_uniform_(a=sqrt(5)),
whose bound sqrt(6 / ((1 + 5) * fan_in)) is that of variance_scaling(1/3, "fan_in",
"uniform"), sqrt(3 * scale / fan_in)). flax's variance_scaling reads fan_in from the kernel's
in axis (-2) times its receptive field (the axes before it): for a Conv kernel
(*k, in/groups, out) that is torch's in/groups * prod(k); for a ConvTranspose kernel, which the
translation builds in torch's conv layout (*k, out, in), torch's out * prod(k). A bias
initializer is called with the bias' shape only, so its fan_in is written into the call:
``torch_uniform_init(fan_in)`` (a helper written into the converted file).

LSTM / LSTMCell, GRU / GRUCell: every weight and bias U(-1/sqrt(H), 1/sqrt(H)); the
TorchLSTMCell and TorchGRUCell helpers keep torch's two biases apart, so each is one draw.

Embedding: N(0, 1). MultiheadAttention: xavier_uniform over the packed (3E, E) in_proj matrix
(variance_scaling(0.5, "fan_avg", "uniform") on each (E, E) part; kdim: one xavier per part),
zero biases, out_proj torch's Linear weight. Normalisation layers: ones and zeros in both.
"""

from __future__ import annotations

import math

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import BoundArgs, arg, code, expr, try_literal
from torch2jax.ruleset import Rule

KAIMING = 'jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")'


def calculate_gain(nonlinearity, param=None) -> float | None:
    """torch.nn.init.calculate_gain's table (None where the nonlinearity is not a literal
    name of it): 1 for linear, convolutions and sigmoid, 5/3 for tanh, sqrt(2) for relu,
    sqrt(2 / (1 + slope^2)) for leaky_relu (slope 0.01 by default), 3/4 for selu."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                        "conv_transpose2d", "conv_transpose3d", "sigmoid"):
        return 1.0
    table = {"tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 3.0 / 4}
    if nonlinearity in table:
        return table[nonlinearity]
    if nonlinearity == "leaky_relu" and (param is None or isinstance(param, (int, float))
                                         and not isinstance(param, bool)):
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    return None


def _kw(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword and a.keyword.value == name), None)


def _atom(node: cst.BaseExpression) -> str:
    simple = (cst.Name, cst.Attribute, cst.Integer, cst.Call, cst.Subscript)
    return code(node) if isinstance(node, simple) else f"({code(node)})"


def _product(factors: list[cst.BaseExpression]) -> cst.BaseExpression:
    """``a * b * ...``, folded to one number where every factor is a literal int."""
    values = [try_literal(f, ...) for f in factors]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        total = 1
        for v in values:
            total *= v
        return cst.Integer(str(total))
    return expr(" * ".join(_atom(f) for f in factors))


def _conv_fan_in(out: cst.Call, b: BoundArgs, channels: str) -> cst.BaseExpression | None:
    """in/groups * prod(k) (ConvTranspose: out * prod(k)), from torch's arguments and the
    kernel size the translation wrote out as a tuple."""
    kernel, per_group = _kw(out, "kernel_size"), b.get(channels)
    if per_group is None or not isinstance(kernel, cst.Tuple):
        return None
    groups = b.get("groups")
    if groups is not None and try_literal(groups, ...) != 1:
        values = try_literal(per_group, ...), try_literal(groups, ...)
        per_group = (cst.Integer(str(values[0] // values[1]))
                     if all(isinstance(v, int) for v in values)
                     else expr(f"{_atom(per_group)} // {_atom(groups)}"))
    return _product([per_group, *(e.value for e in kernel.elements)])


def initialisation_differs(rule: Rule) -> bool:
    """Whether flax's default initialisation of ``rule``'s layer is not torch's (what
    ``initialised`` writes for ``--init torch``)."""
    return rule.torch == "torch.nn.Linear" or rule.special in (
        "conv", "conv_transpose", "embedding", "multihead_attention", "lstm", "lstm_cell", "gru",
        "gru_cell")


def initialised(rule: Rule, b: BoundArgs, out: cst.Call) -> tuple[cst.Call, str | None]:
    """``out`` (the JAX layer built by ``rule`` from torch's arguments ``b``) with the keyword
    arguments that give it torch's default initialisation, and why they could not be written
    (None when they were, or when the JAX library's own initialisation is torch's:
    normalisation layers, PReLU)."""
    if rule.torch == "torch.nn.Linear":
        fan_in = b.get("in_features")
        if fan_in is None:
            return out, "in_features is not given"
        return with_initializers(out, _weight_and_bias(b, fan_in)), None
    if rule.special in ("conv", "conv_transpose"):
        channels = "out_channels" if rule.special == "conv_transpose" else "in_channels"
        fan_in = _conv_fan_in(out, b, channels)
        if fan_in is None:
            return out, f"the fan-in (from {channels} and the kernel size) is not known"
        return with_initializers(out, _weight_and_bias(b, fan_in)), None
    if rule.special == "embedding":
        return with_initializers(out, [arg(expr("jax.nn.initializers.normal(1.0)"),
                                           "embedding_init")]), None
    if rule.special == "multihead_attention":
        # packed: xavier over (3E, E), each (E, E) part's fans are E and E: scale 4E / (2 * 2E)
        scale = "1.0" if _kw(out, "in_kv_features") is not None else "0.5"
        return with_initializers(out, [
            arg(expr(f'jax.nn.initializers.variance_scaling({scale}, "fan_avg", "uniform")'),
                "kernel_init"),
            arg(expr(KAIMING), "out_kernel_init")]), None
    if rule.special in ("lstm", "lstm_cell", "gru", "gru_cell"):
        hidden = b.get("hidden_size")
        if hidden is None:
            return out, "hidden_size is not given"
        if rule.special.endswith("cell"):
            return _recurrent_cell(out, hidden), None
        return out.with_changes(args=[out.args[0].with_changes(
            value=_recurrent_cell(out.args[0].value, hidden)), *out.args[1:]]), None
    return out, None


def _weight_and_bias(b: BoundArgs, fan_in: cst.BaseExpression) -> list[cst.Arg]:
    args = [arg(expr(KAIMING), "kernel_init")]
    if b.literal("bias", True) is not False:
        args.append(arg(expr(f"torch_uniform_init({code(fan_in)})"), "bias_init"))
    return args


def _recurrent_cell(cell: cst.Call, hidden_size: cst.BaseExpression) -> cst.Call:
    """Every weight and bias U(-1/sqrt(H), 1/sqrt(H)), one draw each."""
    init = expr(f"torch_uniform_init({code(hidden_size)})")
    return with_initializers(cell, [arg(init, "kernel_init"), arg(init, "recurrent_kernel_init"),
                                    arg(init, "bias_init")])


def with_initializers(out: cst.Call, extra: list[cst.Arg]) -> cst.Call:
    """``out`` with ``extra`` keyword arguments before its ``rngs=``."""
    args = list(out.args)
    at = next((i for i, a in enumerate(args) if a.keyword and a.keyword.value == "rngs"),
              len(args))
    args[at:at] = extra
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return out.with_changes(args=[a.with_changes(comma=comma if i < len(args) - 1 else
                                                 cst.MaybeSentinel.DEFAULT)
                                  for i, a in enumerate(args)])


def weight_of_a_sublayer(t: cst.BaseExpression | None, rw=None, statement=None) -> bool:
    """``self.conv3.bn.weight`` / ``self.norm.weight`` / ``blk.norm1.weight`` (a
    ``torch.nn.init`` fill's tensor) still named ``weight`` after the rewrite: a layer held by
    a module (``self``'s, or one of a loop over a container's modules, ``for blk in
    self.blocks``) whose type the file does not show (built in another module, by a class
    handed in), whose parameter the ``layer_weight`` helper finds at run time. Not
    ``self.weight`` (the class's own), nor ``m.weight`` of a loop over modules, which tests the
    type by name (marked)."""
    if not (isinstance(t, cst.Attribute) and t.attr.value == "weight"
            and isinstance(t.value, cst.Attribute)):
        return False
    node = t.value
    while isinstance(node, cst.Attribute):
        node = node.value
    if not isinstance(node, cst.Name):
        return False
    if node.value == "self" or rw is None:
        return node.value == "self"
    # the variable of a loop over a container of the module (for blk in self.blocks), not
    # one over every module (for m in self.modules(): m.bn2.weight is tested by type there,
    # and its reads, m.bn2.weight is not None, are torch's names)
    from torch2jax.analysis.metadata import ParentNodeProvider

    parent = statement
    while (parent := rw.get_metadata(ParentNodeProvider, parent, None)) is not None and (
            not isinstance(parent, cst.FunctionDef)):
        over = parent.iter if isinstance(parent, cst.For) else None
        target = parent.target if isinstance(parent, cst.For) else None
        if m.matches(over, m.Call(func=m.Name("enumerate"), args=[m.Arg(keyword=None)])) and (
                m.matches(target, m.Tuple(elements=[m.Element(), m.Element(m.Name())]))):
            # for layer_id, layer in enumerate(self.blocks) (timm's beit fix_init_weight)
            over, target = over.args[0].value, target.elements[1].value
        if isinstance(target, cst.Name) and target.value == node.value:
            return isinstance(over, cst.Attribute) and isinstance(
                over.value, cst.Name) and over.value.value == "self"
    return False


def spread_bounds(fn: str, b: BoundArgs) -> bool:
    """``nn.init.uniform_(self.A, *self.a_init_range)`` (timm's efficientvim): the bounds
    spread from one sequence, in torch's order (a, b), which is ``jax.random.uniform``'s
    (minval, maxval) after the shape and dtype."""
    return (fn == "uniform_" and len(b.star) == 1 and b.star[0].star == "*"
            and set(b.named) == {"tensor"} and not b.extra_positional)


def uniform_bounds(b: BoundArgs) -> str:
    """``jax.random.uniform``'s minval and maxval from ``uniform_``'s bound arguments (torch's
    defaults 0 and 1), or its spread sequence (:func:`spread_bounds`)."""
    if b.star:
        return "*" + code(b.star[0].value)
    a, hi = b.get("a"), b.get("b")
    return f"{code(a) if a is not None else '0.0'}, {code(hi) if hi is not None else '1.0'}"
