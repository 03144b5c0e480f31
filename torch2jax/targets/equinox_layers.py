"""The equinox target's layers: NNX layer constructors (as the rules emit them) -> equinox.

The shared vocabulary of the equinox pass (targets/equinox.py): what is known of a value in
per-example code (:class:`Info`), of an attribute of a module (:class:`Layer`), the error that
leaves a statement as it was with a TODO (:class:`EquinoxError`), and :func:`layer_of`, which
turns one NNX layer constructor into its equinox constructor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from torch2jax.passes.common import Untranslatable, code, one_line, try_literal
from torch2jax.targets import layer_table

RULE = "equinox"
KEY = "__key{}__"  # placeholders for per-call keys, named once a function is done

ELEMENTWISE_PREFIXES = ("jax.nn.", "jnp.")
# layers the NNX pass writes as functions that hold per example as they are: activations, and
# the padding layers' lambdas (they pad the trailing, spatial, axes only: passes/special_vision.py)
FUNCTION_LAYERS = ("jax.nn.", "partial(jax.nn.", "lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - ")


def is_function_layer(text: str, prefixes: tuple[str, ...] = FUNCTION_LAYERS) -> bool:
    """Whether ``text`` (an expression's code, however it is laid out) starts with one of
    ``prefixes``."""
    squeezed = "".join(text.split())
    return squeezed.startswith(tuple("".join(p.split()) for p in prefixes))
# jnp functions that act element by element (a batched operand needs nothing)
ELEMENTWISE_JNP = {"exp", "log", "tanh", "sqrt", "abs", "maximum", "minimum", "where", "clip",
                   "sin", "cos", "square", "power", "sign", "log1p", "expm1", "rsqrt",
                   "reciprocal", "floor", "ceil", "round", "logical_not", "isnan", "isfinite",
                   "erf", "sigmoid", "asarray"}
AXIS_REDUCTIONS = {"sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin",
                   "softmax", "log_softmax", "logsumexp", "cumsum", "cumprod", "all", "any",
                   "norm", "flip", "split", "concatenate", "stack", "expand_dims", "squeeze",
                   "standardize", "one_hot", "take_along_axis", "roll"}
JNP_POSITIONAL_AXES = {"swapaxes": (1, 2), "moveaxis": (1, 2), "expand_dims": (1,),
                       "squeeze": (1,), "flip": (1,), "roll": (2,)}
# helpers of torch2jax/passes/helpers.py that work on the last axes of their first argument
TRAILING_AXES_HELPERS = {"adaptive_avg_pool", "adaptive_max_pool"}
# reductions that drop their axes (unless keepdims)
RANK_REDUCTIONS = {"sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin", "all",
                   "any", "logsumexp", "norm"}
VECTOR_LAYERS = {"linear": 1, "layernorm": 1, "embedding": 0}  # rank of one example's input


def batched_form(lay: Layer) -> tuple:
    """How a module kept batched calls the layer (equinox_calls.LayerCalls.batched_call):
    layers of one form are called alike."""
    if lay.kind in VECTOR_LAYERS:
        return ("over_leading", VECTOR_LAYERS[lay.kind])
    if lay.kind in ("conv", "pool", "groupnorm", "resize", "fn") or channel_first_seq(lay):
        return ("vmap",)
    return (lay.kind, lay.cls, lay.alts, lay.stateful, lay.keyed)


def einops_ranks(node: cst.CSTNode | None) -> tuple[int | None, int] | None:
    """The ranks in and out of ``lambda t: einops.rearrange(t, "c (h p) w -> (c p) h w")``
    (an einops layer, per example: passes/rewrite_layers.py): its pattern's groups on each
    side; ``(None, 1)`` for nn.Flatten's ``lambda x: x.reshape(-1)``; None for another
    function or an ellipsis."""
    if isinstance(node, cst.Lambda) and "".join(code(node).split()) == "lambdax:x.reshape(-1)":
        return None, 1
    if not (isinstance(node, cst.Lambda) and isinstance(node.body, cst.Call) and code(
            node.body.func) in ("einops.rearrange", "einops.reduce") and len(node.body.args) > 1):
        return None
    pattern = try_literal(node.body.args[1].value, None)
    if not isinstance(pattern, str) or "..." in pattern or pattern.count("->") != 1:
        return None
    sides = [re.sub(r"\([^)]*\)", "g", side).split() for side in pattern.split("->")]
    return len(sides[0]), len(sides[1])


def channel_first_seq(lay: Layer) -> bool:
    """A Sequential of channel-first layers and per-example functions that takes neither state
    nor a key: on a batch it is mapped over the batch as a whole, like a convolution."""
    parts = [lay.items.get(str(i)) for i in range(len(lay.items))]
    return lay.kind == "seq" and bool(parts) and not (lay.keyed or lay.stateful or lay.loop) \
        and all(p is not None and p.kind in ("conv", "pool", "groupnorm", "fn", "resize")
                for p in parts) and any(p.kind != "fn" for p in parts)


@dataclass
class Info:
    """What is known about a value in forward code."""

    batched: bool = False  # its first axis (in torch) is the batch axis
    rank: int | None = None  # rank of one example (batched) or of the value (unbatched)
    kind: str = "value"  # value | shape | batch_size | module:<Class> | layer:<kind>
    lead_one: bool = False  # unbatched, leading axis known to be 1 (a broadcast buffer)
    channels_last: bool = False  # inside the NNX pass's channels-last region (moves dropped)
    is_input: bool = False  # an input of the model: its rank is what its first layer takes
    # x.reshape(-1, V) of a batched x: in torch its first axis is the batch merged with the
    # example's first axis; per example that axis alone (its rows are the example's rows)
    merged: bool = False
    elements: tuple[Info, ...] = ()  # a tuple's elements, when each is known


@dataclass
class Layer:
    kind: str  # linear conv bn layernorm embedding dropout pool seq list dict module fn buffer
    cls: str = ""  # module class name, for kind == "module"; element class for list/dict
    items: dict[str, Layer] = field(default_factory=dict)  # dict entries
    rank: int | None = None  # buffers: rank; seq: rank of the first layer's input
    lead_one: bool = False
    stateful: bool = False
    keyed: bool = False
    node: cst.Lambda | None = None  # kind == "lambda": the function
    # kind == "module" built from a class passed in: the other classes passed at some sites
    alts: tuple[str, ...] = ()
    # seq / list: its layers were appended in a loop (how many is not known here)
    loop: bool = False
    bare: bool = False  # kind == "module" of a class with no constructor: built without a key
    # kind == "list" of layers of several kinds that one batched call form fits (a module
    # kept batched calls them in a loop; per example they stay unknown): one of them
    mixed: Layer | None = None
    # kind == "value" stored from a constructor argument that no call in the file shows (a
    # model handed in), kind == "list" of layers handed in that no call shows or of several
    # call forms: a module kept batched calls them through the on_batch helper
    passed: bool = False


# recurrent layer kinds -> torch's names (for messages)
RNN_NAMES = {"lstm": "LSTM", "lstmcell": "LSTMCell", "gru": "GRU", "grucell": "GRUCell"}


class EquinoxError(Untranslatable):
    pass


def _todo(stmt: cst.BaseStatement, message: str) -> cst.BaseStatement:
    line = cst.EmptyLine(comment=cst.Comment(f"# TODO(torch2jax): {one_line(message)} [{RULE}]"))
    return stmt.with_changes(leading_lines=[*stmt.leading_lines, line])


def _name(node: cst.BaseExpression) -> str:
    return code(node)


def _kw(node: cst.Call) -> dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in node.args if a.keyword is not None}


def _pos(node: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in node.args if a.keyword is None and not a.star]


def _call(func: str, pos: list, kw: list[tuple[str, cst.BaseExpression]]) -> cst.Call:
    parts = [code(p) for p in pos] + [f"{k}={code(v)}" for k, v in kw]
    return cst.parse_expression(f"{func}({', '.join(parts)})")


# ---------------------------------------------------------------------------- layers
def layer_of(node: cst.BaseExpression, classes: set[str]) -> tuple[cst.BaseExpression, Layer]:
    """:func:`_layer_of`, with the equinox class of a layer noted (for annotations)."""
    new, lay = _layer_of(node, classes)
    if isinstance(new, cst.Call) and code(new.func).startswith("eqx.nn.") and not lay.cls:
        lay.cls = code(new.func)
    return new, lay


def _layer_of(node: cst.BaseExpression, classes: set[str]) -> tuple[cst.BaseExpression, Layer]:
    """An NNX constructor -> the equinox constructor (``key=`` left to the caller: a
    ``__needs_key__`` keyword marks where) and what it is."""
    if isinstance(node, cst.Call):
        name = code(node.func)
        pos, kw = _pos(node), _kw(node)
        kw.pop("rngs", None)
        built = layer_table.construct(node, "equinox", error=EquinoxError)
        if built is not None:  # a layer with an equinox table in its rule
            spec = built.spec
            key = [("key", cst.Name("__needs_key__"))] if spec.key else []
            # a class by the kernel's rank (convolutions): one example is (C, *spatial)
            rank = built.rank + 1 if built.rank is not None else None
            return _call(built.cls, built.pos, [*built.kw, *key]), Layer(
                spec.kind or "module", keyed=spec.kind == "dropout", rank=rank)
        if name == "BatchNorm":  # the NNX helper -> the equinox one (passes/helpers.py)
            out = [("axis_name", cst.SimpleString('"batch"'))]
            if "epsilon" in kw:
                out.append(("eps", kw.pop("epsilon")))
            scale, bias = kw.pop("use_scale", None), kw.pop("use_bias", None)
            if scale is not None or bias is not None:
                if scale is None or bias is None or code(scale) != code(bias):
                    raise EquinoxError("BatchNorm with a scale but no shift (or the reverse)")
                out.append(("channelwise_affine", scale))
            out.append(("momentum", kw.pop("momentum", cst.Float("0.99"))))
            if "axis" in kw and code(kw["axis"]) == "1":
                del kw["axis"]  # BatchNorm1d: channels first, the equinox layer's axis 0
            if kw:
                raise EquinoxError(f"BatchNorm argument {min(kw)} has no equinox form")
            return _call("BatchNorm", pos, out), Layer("bn", cls="BatchNorm", stateful=True)
        if name == "nnx.BatchNorm":
            raise EquinoxError("BatchNorm with track_running_stats=False has no equinox form yet")
        if name == "partial" and pos and code(pos[0]) in ("nnx.max_pool", "nnx.avg_pool"):
            which = "Max" if code(pos[0]) == "nnx.max_pool" else "Avg"
            window = try_literal(kw.pop("window_shape", None), None)
            if not isinstance(window, tuple):
                raise EquinoxError("pooling window is not a literal tuple")
            out = [("kernel_size", cst.parse_expression(repr(window)))]
            strides = kw.pop("strides", None)
            out.append(("stride", strides if strides is not None else cst.parse_expression(
                repr((1,) * len(window)))))
            padding = kw.pop("padding", None)
            if padding is not None:
                if isinstance(try_literal(padding, None), str):
                    if try_literal(padding) != "VALID":
                        raise EquinoxError(f"pooling padding {code(padding)}")
                else:
                    out.append(("padding", padding))
            include = kw.pop("count_include_pad", None)
            if include is not None and try_literal(include, None) is not True:
                raise EquinoxError("average pooling that excludes the padding from the count: "
                                   "eqx.nn.AvgPool divides by the window size")
            if kw:
                raise EquinoxError(f"pooling argument {min(kw)}")
            return _call(f"eqx.nn.{which}Pool{len(window)}d", [], out), \
                Layer("pool", rank=len(window) + 1)
        if name in SEQUENCE_LAYERS:
            return SEQUENCE_LAYERS[name](pos, kw)
        if name == "nnx.ConvTranspose":
            return _conv_transpose(pos, kw)
        if name == "nnx.Sequential":
            return node, Layer("seq")  # the caller rebuilds it (its elements are known there)
        if name in ("nnx.List", "nnx.Dict"):
            return node, Layer("list" if name == "nnx.List" else "dict")
        if name in ("nnx.Variable", "nnx.BatchStat", "nnx.Cache"):
            return pos[0], Layer("buffer")
        if name == "nnx.Param":
            return pos[0], Layer("param")
        if name in classes:
            bare = not any(a.keyword and a.keyword.value == "rngs" for a in node.args)
            return node.with_changes(args=[*[a for a in node.args if not (
                a.keyword and a.keyword.value == "rngs")]]), Layer("module", cls=name,
                                                                   bare=bare)
        if name.startswith("nnx.") and name[4:5].isupper():  # (functions: _NoNnx marks them)
            raise EquinoxError(f"{name} has no equinox translation yet")
    text = code(node)
    if text.startswith(("jax.nn.", "partial(jax.nn.", "jnp.")) and not isinstance(
            node, cst.Call) or is_function_layer(text, FUNCTION_LAYERS[1:]):
        return node, Layer("fn")
    return node, Layer("value")


def _conv_transpose(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """nnx.ConvTranspose(..., padding=((lo, hi), ...), transpose_kernel=True) ->
    eqx.nn.ConvTransposeNd with torch's own arguments: equinox's padding and output_padding
    are torch's (lo = d*(k-1) - p, hi = lo + output_padding in the NNX form)."""
    size = try_literal(kw.pop("kernel_size", None), None)
    pads = try_literal(kw.pop("padding", None), None)
    dil = try_literal(kw.pop("kernel_dilation", None), None) or (1,) * len(size or ())
    if not isinstance(size, tuple) or not isinstance(pads, tuple) or len(pads) != len(size):
        raise EquinoxError("a transposed convolution without literal sizes")
    if try_literal(kw.pop("transpose_kernel", None), None) is not True:
        raise EquinoxError("a transposed convolution without transpose_kernel=True")
    padding = tuple(d * (k - 1) - lo for k, d, (lo, _) in zip(size, dil, pads, strict=True))
    extra = tuple(hi - lo for lo, hi in pads)
    out = [("kernel_size", cst.parse_expression(repr(size)))]
    if "strides" in kw:
        out.append(("stride", kw.pop("strides")))
    out.append(("padding", cst.parse_expression(repr(padding))))
    if any(extra):
        out.append(("output_padding", cst.parse_expression(repr(extra))))
    if any(d != 1 for d in dil):
        out.append(("dilation", cst.parse_expression(repr(dil))))
    if "use_bias" in kw:
        out.append(("use_bias", kw.pop("use_bias")))
    if kw:
        raise EquinoxError(f"nnx.ConvTranspose argument {min(kw)} has no equinox form")
    return _call(f"eqx.nn.ConvTranspose{len(size)}d", pos, [
        *out, ("key", cst.Name("__needs_key__"))]), Layer("conv", rank=len(size) + 1)


def _attention(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """nnx.MultiHeadAttention(num_heads=H, in_features=E, in_kv_features=K, ...) ->
    eqx.nn.MultiheadAttention(H, E, K, K, use_*_bias=...): equinox's biases are off by
    default, torch's on; the output size is E, as torch's."""
    heads, embed = kw.pop("num_heads", None), kw.pop("in_features", None)
    if heads is None or embed is None or pos:
        raise EquinoxError("MultiHeadAttention without num_heads and in_features")
    kdim = kw.pop("in_kv_features", None)
    bias = kw.pop("use_bias", cst.Name("True"))
    out = [(f"use_{p}_bias", bias) for p in ("query", "key", "value", "output")]
    rate = kw.pop("dropout_rate", None)
    if rate is not None:
        out.append(("dropout_p", rate))
    for k, ok in (("decode", False), ("broadcast_dropout", False)):
        if k in kw and try_literal(kw.pop(k), None) is not ok:
            raise EquinoxError(f"MultiHeadAttention({k}=...) has no equinox form")
    if kw:
        raise EquinoxError(f"nnx.MultiHeadAttention argument {min(kw)} has no equinox form")
    sizes = [heads, embed, *([kdim, kdim] if kdim is not None else [])]
    return _call("eqx.nn.MultiheadAttention", sizes, [*out, ("key", cst.Name(
        "__needs_key__"))]), Layer("mha", keyed=rate is not None)


def _rnn(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """nnx.RNN(TorchLSTMCell(I, H)) (torch's LSTM, batch_first=True) -> the TorchLSTMCell
    helper, scanned over the sequence by lstm_scan; nnx.RNN(TorchGRUCell(I, H)) (torch's GRU) ->
    the TorchGRUCell helper, scanned by gru_scan."""
    cell = code(pos[0].func) if len(pos) == 1 and isinstance(pos[0], cst.Call) else None
    kind = {"TorchLSTMCell": "lstm", "TorchGRUCell": "gru"}.get(cell)
    if try_literal(kw.pop("time_major", None), False) is not False:
        raise EquinoxError(f"{(kind or 'an RNN').upper()} with batch_first=False: its batch is "
                           "axis 1, and the equinox model is mapped over axis 0 (batch_first="
                           "True is translated)")
    if kw or kind is None:
        raise EquinoxError("an nnx.RNN that is not torch's LSTM or GRU")
    new, _ = SEQUENCE_LAYERS[cell](_pos(pos[0]), _kw(pos[0]))
    return new, Layer(kind)


def _lstm_cell(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """TorchLSTMCell(I, H) (NNX's helper) -> TorchLSTMCell(I, H, key=...), equinox's helper:
    torch's four tensors (eqx.nn.LSTMCell sums b_ih + b_hh), one example, called as
    eqx.nn.LSTMCell."""
    kw.pop("rngs", None)
    if kw or len(pos) != 2:
        raise EquinoxError("an LSTM cell with other arguments than its sizes")
    return _call("TorchLSTMCell", pos, [("key", cst.Name("__needs_key__"))]), \
        Layer("lstmcell")


def _gru_cell(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """TorchGRUCell(I, H) (NNX's helper) -> TorchGRUCell(I, H, key=...), equinox's helper: torch's
    parameters, one example."""
    kw.pop("rngs", None)
    if kw or len(pos) != 2:
        raise EquinoxError("a GRU cell with other arguments than its sizes")
    return _call("TorchGRUCell", pos, [("key", cst.Name("__needs_key__"))]), Layer("grucell")


def _stacked_lstm(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """TorchLSTM(I, H, L, ...) (NNX's helper, torch's stacked nn.LSTM) -> the equinox helper
    of targets/equinox_lstm.py, its arguments as given: called on the batch (a module that
    holds it is kept batched), a key for its dropout between layers."""
    kw.pop("rngs", None)
    if set(kw) - {"input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout"}:
        raise EquinoxError(f"LSTM argument {min(kw)} has no equinox form")
    rate = kw.get("dropout", pos[5] if len(pos) > 5 else None)
    keyed = rate is not None and try_literal(rate, None) not in (0, 0.0)
    return _call("TorchLSTM", pos, [*kw.items(), ("key", cst.Name("__needs_key__"))]), \
        Layer("torchlstm", cls="TorchLSTM", keyed=keyed)


SEQUENCE_LAYERS = {"nnx.MultiHeadAttention": _attention, "nnx.RNN": _rnn,
                   "TorchLSTMCell": _lstm_cell, "TorchGRUCell": _gru_cell,
                   "TorchLSTM": _stacked_lstm}


def _kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(
        cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _fix_commas(call: cst.Call) -> cst.Call:
    args = list(call.args)
    for i, a in enumerate(args):
        args[i] = a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                                 if i < len(args) - 1 else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)
