"""The equinox target: the NNX translation of a file, rewritten into idiomatic equinox.

The rules describe torch once and the rewrite pass emits NNX; this pass takes that output
(before channels-last moves are fused) and turns it into equinox (docs/equinox.md):

* a module class becomes ``class Name(eqx.Module):`` with one annotated field per attribute
  set in ``__init__`` (static configuration as ``eqx.field(static=True)``), and
  ``__init__(..., *, key)`` splits ``key`` for the layers and submodules it builds;
* forward code becomes **per-example** (unbatched) code, the equinox idiom: the caller maps the
  model over the batch with ``jax.vmap``. Explicit dimensions of batched values move down by
  one (``axis=2`` -> ``axis=1``), the batch size disappears from reshapes
  (``x.reshape(x.shape[0], -1)`` -> ``x.reshape(-1)``, ``B, T, C = x.shape`` -> ``T, C =
  x.shape``), and layers that take one vector (Linear, Embedding, LayerNorm) are mapped with
  ``jax.vmap`` over the leading axes that remain (a sequence axis). equinox's convolutions,
  pooling and BatchNorm are channel-first, so NCHW code keeps its layout (no moves);
* BatchNorm becomes the ``BatchNorm`` helper of passes/helpers.py (an ``eqx.nn.StatefulLayer``
  with torch's running statistics), ``BatchNorm(..., axis_name="batch")``: modules that
  hold one take and return an ``eqx.nn.State``; Dropout takes an explicit ``key=`` per call,
  split from the ``key`` that ``__call__`` receives (``None`` in inference mode).

What cannot be shown to keep its meaning per example (the batch size used other than in a
reshape, a reduction over the batch axis, an unknown function applied to a batched value) is
left as it was with a ``# TODO(torch2jax)`` marker and an error diagnostic. Training code
(optimizers, train and eval steps, loops) is rewritten by equinox_training.py; what it does not
rewrite is put back as the torch source and marked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.finish.removed import bound_names
from torch2jax.passes.common import (
    Untranslatable,
    code,
    expr,
    freezable_dataclasses,
    freeze_dataclass,
    int_value,
    is_identity_lambda,
    is_simple,
    one_line,
    try_literal,
)
from torch2jax.passes.helpers import add_helpers
from torch2jax.targets import equinox_training as training

RULE = "equinox"
KEY = "__key{}__"  # placeholders for per-call keys, named once a function is done

# NNX layers (as the rules emit them) -> equinox layers and how their arguments translate
CONV_KW = {"strides": "stride", "kernel_dilation": "dilation", "feature_group_count": "groups",
           "use_bias": "use_bias", "padding": "padding", "kernel_size": "kernel_size"}
ELEMENTWISE_PREFIXES = ("jax.nn.", "jnp.")
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
        if name == "nnx.Linear":
            extra = [(k, kw.pop(k)) for k in ("use_bias",) if k in kw]
            if kw:
                raise EquinoxError(f"nnx.Linear argument {min(kw)} has no equinox form")
            return _call("eqx.nn.Linear", pos, [*extra, ("key", cst.Name("__needs_key__"))]), \
                Layer("linear")
        if name == "nnx.Conv":
            size = kw.get("kernel_size")
            size = size.elements if isinstance(size, cst.Tuple) else None
            if size is None or not 1 <= len(size) <= 3:
                raise EquinoxError("a convolution whose kernel size is not a tuple")
            out = []
            for k, v in kw.items():
                if k not in CONV_KW:
                    raise EquinoxError(f"nnx.Conv argument {k} has no equinox form")
                if k == "padding" and isinstance(try_literal(v, None), str) and \
                        try_literal(v) not in ("SAME", "VALID"):
                    raise EquinoxError(f"conv padding {code(v)}")
                out.append((CONV_KW[k], v))
            return _call(f"eqx.nn.Conv{len(size)}d", pos, [*out, ("key", cst.Name(
                "__needs_key__"))]), Layer("conv", rank=len(size) + 1)
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
        if name == "nnx.LayerNorm":
            out = []
            for k, new in (("epsilon", "eps"), ("use_bias", "use_bias"),
                           ("use_scale", "use_weight")):
                if k in kw:
                    out.append((new, kw.pop(k)))
            if kw:
                raise EquinoxError(f"nnx.LayerNorm argument {min(kw)} (a LayerNorm over "
                                   "several dims?) has no equinox form yet")
            return _call("eqx.nn.LayerNorm", pos, out), Layer("layernorm")
        if name == "nnx.Embed":
            if kw:
                raise EquinoxError(f"nnx.Embed argument {min(kw)}")
            return _call("eqx.nn.Embedding", pos, [("key", cst.Name("__needs_key__"))]), \
                Layer("embedding")
        if name == "nnx.Dropout":
            rate = pos[0] if pos else kw.pop("rate", None)
            if rate is None or kw:
                raise EquinoxError("nnx.Dropout arguments")
            return _call("eqx.nn.Dropout", [rate], []), Layer("dropout", keyed=True)
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
        if name == "nnx.GroupNorm":
            return _group_norm(pos, kw)
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
            node, cst.Call) or text.startswith("partial(jax.nn."):
        return node, Layer("fn")
    return node, Layer("value")


def _group_norm(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """nnx.GroupNorm(C, num_groups=G, epsilon=e) -> eqx.nn.GroupNorm(G, C, eps=e): channel
    first, any number of spatial axes."""
    groups = kw.pop("num_groups", None)
    if groups is None or len(pos) != 1:
        raise EquinoxError("GroupNorm without its group and channel counts")
    out = [("eps", kw.pop("epsilon", cst.Float("1e-05")))]
    scale, bias = kw.pop("use_scale", None), kw.pop("use_bias", None)
    if scale is not None or bias is not None:
        if scale is None or bias is None or code(scale) != code(bias):
            raise EquinoxError("GroupNorm with a scale but no shift (or the reverse)")
        out.append(("channelwise_affine", scale))
    if kw:
        raise EquinoxError(f"nnx.GroupNorm argument {min(kw)} has no equinox form")
    return _call("eqx.nn.GroupNorm", [groups, pos[0]], out), Layer("groupnorm")


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
    """nnx.RNN(nnx.OptimizedLSTMCell(I, H)) (torch's LSTM, batch_first=True) ->
    eqx.nn.LSTMCell(I, H), scanned over the sequence by the lstm_scan helper;
    nnx.RNN(TorchGRUCell(I, H)) (torch's GRU) -> the TorchGRUCell helper, scanned by gru_scan."""
    cell = code(pos[0].func) if len(pos) == 1 and isinstance(pos[0], cst.Call) else None
    kind = {"nnx.OptimizedLSTMCell": "lstm", "TorchGRUCell": "gru"}.get(cell)
    if try_literal(kw.pop("time_major", None), False) is not False:
        raise EquinoxError(f"{(kind or 'an RNN').upper()} with batch_first=False: its batch is "
                           "axis 1, and the equinox model is mapped over axis 0 (batch_first="
                           "True is translated)")
    if kw or kind is None:
        raise EquinoxError("an nnx.RNN that is not torch's LSTM or GRU")
    new, _ = SEQUENCE_LAYERS[cell](_pos(pos[0]), _kw(pos[0]))
    return new, Layer(kind)


def _lstm_cell(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """nnx.OptimizedLSTMCell(I, H) -> eqx.nn.LSTMCell(I, H): gates in torch's order i, f, g,
    o; its one bias is torch's b_ih + b_hh."""
    kw.pop("rngs", None)
    if kw or len(pos) != 2:
        raise EquinoxError("an LSTM cell with other arguments than its sizes")
    return _call("eqx.nn.LSTMCell", pos, [("key", cst.Name("__needs_key__"))]), \
        Layer("lstmcell")


def _gru_cell(pos: list, kw: dict) -> tuple[cst.Call, Layer]:
    """TorchGRUCell(I, H) (NNX's helper) -> TorchGRUCell(I, H, key=...), equinox's helper: torch's
    parameters, one example."""
    kw.pop("rngs", None)
    if kw or len(pos) != 2:
        raise EquinoxError("a GRU cell with other arguments than its sizes")
    return _call("TorchGRUCell", pos, [("key", cst.Name("__needs_key__"))]), Layer("grucell")


SEQUENCE_LAYERS = {"nnx.MultiHeadAttention": _attention, "nnx.RNN": _rnn,
                   "nnx.OptimizedLSTMCell": _lstm_cell, "TorchGRUCell": _gru_cell}


# ---------------------------------------------------------------------------- __init__
class _InitRewriter(cst.CSTTransformer):
    """Rewrites layer constructors in ``__init__`` (or a builder function) and records the
    layers stored on ``self``; ``key=`` sites are numbered, the splits placed afterwards."""

    def __init__(self, classes: set[str], keyed_classes: set[str],
                 builders: dict[str, Layer] | None = None, methods: dict[str, Layer] | None
                 = None, passed: dict[str, tuple[str, ...] | str] | None = None,
                 per_example: Collection[str] = ()) -> None:
        super().__init__()
        self.classes = classes
        # code (whitespace dropped) of the NNX pass's layers written for one example
        self.per_example = per_example
        self.builders = builders or {}
        self.methods = methods or {}  # builder methods, called as self.name(...)
        # parameters bound to classes of the file (see _passed_classes), or why not known
        self.passed = passed or {}
        self.loop = 0
        self.returned: Layer | None = None
        self.keyed_classes = keyed_classes
        self.attrs: dict[str, Layer] = {}
        self.values: dict[int, Layer] = {}  # id of new node -> layer
        # every node this pass returns stays alive until it ends: `values` is keyed by id, and
        # a freed node's id could be given to a later node
        self._kept: list[cst.CSTNode] = []
        self.local: dict[str, Layer] = {}  # local names bound to layers (lists of layers)
        self.errors: list[str] = []
        self.sites = 0
        self.identities: set[str] = set()  # attributes that are an identity in some branch

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        self._kept.append(result)
        return result

    def visit_For(self, node: cst.For) -> None:
        self.loop += 1

    def leave_For(self, original_node, updated_node):
        self.loop -= 1
        return updated_node

    def visit_While(self, node: cst.While) -> None:
        self.loop += 1

    def leave_While(self, original_node, updated_node):
        self.loop -= 1
        return updated_node

    def visit_Call(self, node: cst.Call) -> bool:
        # nnx.RNN(cell): the whole is one equinox layer (or, refused, stays as NNX wrote it)
        return not m.matches(node.func, m.Attribute(value=m.Name("nnx"), attr=m.Name("RNN")))

    def leave_Call(self, original_node, updated_node):
        try:
            new, lay = layer_of(updated_node, self.classes)
        except EquinoxError as exc:
            self.errors.append(exc.message)
            return updated_node
        if lay.kind == "module" and not lay.bare:
            new = new.with_changes(args=[*new.args[:-1], new.args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))] if new.args
                else [], )
            new = new.with_changes(args=[*new.args, cst.Arg(cst.Name("__needs_key__"),
                                         keyword=cst.Name("key"), equal=cst.AssignEqual(
                                             cst.SimpleWhitespace(""),
                                             cst.SimpleWhitespace("")))])
        if lay.kind == "seq":
            new = self._sequential(updated_node)
        if lay.kind in ("list", "dict"):
            pos = _pos(updated_node)
            orig = pos[0] if pos else None
            inner = self.values.get(id(orig)) if orig is not None else None
            if (inner is None or inner.kind == "value") and isinstance(orig, cst.Call) and \
                    code(orig.func) == "dict":
                inner = self._dict_layer(orig)
            new = orig.visit(_Dedent()) if orig is not None else (
                cst.List([]) if lay.kind == "list" else cst.Dict([]))
            lay = inner or lay
        if lay.kind == "value" and isinstance(updated_node.func, cst.Name) and \
                updated_node.func.value in self.builders:
            lay = self.builders[updated_node.func.value]
        func = updated_node.func
        if lay.kind == "value" and m.matches(func, m.Attribute(value=m.Name("self"))) and \
                func.attr.value in self.methods:
            lay = self.methods[func.attr.value]
        if lay.kind == "value" and isinstance(func, cst.Name) and func.value in self.passed:
            # a class handed in as an argument (`block(in_planes, planes, rngs=rngs)`)
            got = self.passed[func.value]
            if isinstance(got, str):
                self.errors.append(got)
            else:
                lay = Layer("module", cls=got[0], alts=got[1:])
        if isinstance(new, cst.Call) and any(
                a.keyword is not None and a.keyword.value == "rngs" for a in new.args):
            # a layer-building helper, a class passed as an argument, super().__init__:
            # they take the key that converted constructors take
            new = new.with_changes(args=[
                a.with_changes(keyword=cst.Name("key"), value=cst.Name("__needs_key__"))
                if a.keyword is not None and a.keyword.value == "rngs" else a
                for a in new.args])
        if (lay.kind == "module" and not lay.bare) or "__needs_key__" in code(new):
            self.sites += 1
        self.values[id(new)] = lay
        return new

    def _sequential(self, node: cst.Call) -> cst.Call:
        if any(a.star for a in node.args):
            (star,) = [a for a in node.args if a.star]
            return cst.Call(cst.parse_expression("eqx.nn.Sequential"), [cst.Arg(star.value)])
        # the NNX pass's moves to channels-last and back around its channels-last layers:
        # equinox's layers are channel-first (and the layers keep torch's indices)
        args = [a for a in node.args if not _is_layout_move(a.value)]
        for a in args:
            if self._is_per_example(a.value):
                self.values[id(a.value)] = Layer("resize", node=a.value)
        elements = [cst.Element(self._wrap_fn(a.value)) for a in args]
        inner = cst.List(elements)
        self.values[id(inner)] = Layer("list", items={
            str(i): self.values.get(id(a.value)) or (Layer("fn") if code(a.value).startswith(
                ("jax.nn.", "partial(jax.nn.")) else Layer("value"))
            for i, a in enumerate(args)})
        return cst.Call(cst.parse_expression("eqx.nn.Sequential"), [cst.Arg(inner)])

    def _is_per_example(self, value: cst.BaseExpression) -> bool:
        """nn.Upsample's lambda, which the NNX pass wrote for one example (C, *spatial)."""
        return isinstance(value, cst.Lambda) and _squeeze(code(value)) in self.per_example

    def _wrap_fn(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if self.values.get(id(value), Layer("value")).kind in ("fn", "resize") or code(value).startswith(
                ("jax.nn.", "partial(jax.nn.")):
            return expr("eqx.nn.Lambda({f})", f=value)
        return value

    def leave_List(self, original_node, updated_node):
        lays = [self.values.get(id(e.value)) for e in updated_node.elements]
        new = updated_node
        kinds = [lay for lay in lays if lay is not None]
        if kinds:
            self.values[id(new)] = Layer("list", cls=kinds[0].cls if kinds[0].kind == "module"
                                         else "", items={str(i): k for i, k in enumerate(lays)
                                                         if k is not None})
        return new

    def leave_Dict(self, original_node, updated_node):
        # {"a": layer, ...}, the mapping a ModuleDict is built from: its layers by key
        items = {}
        for e in updated_node.elements:
            key = try_literal(e.key, None) if isinstance(e, cst.DictElement) else None
            lay = self.values.get(id(e.value)) if isinstance(key, str) else None
            if lay is None and isinstance(key, str) and code(e.value).startswith(
                    ELEMENTWISE_PREFIXES):
                lay = Layer("fn")
            if lay is not None:
                items[key] = lay
        if items:
            self.values[id(updated_node)] = Layer("dict", items=items)
        return updated_node

    def leave_ListComp(self, original_node, updated_node):
        lay = self.values.get(id(updated_node.elt))
        if lay is not None:
            self.values[id(updated_node)] = Layer("list", cls=lay.cls, items={"*": lay})
        return updated_node

    def leave_Expr(self, original_node, updated_node):
        # layers.append(fn): a function in a list of layers is wrapped in eqx.nn.Lambda
        v = updated_node.value
        if m.matches(v, m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg()])):
            a = v.args[0].value
            lay = self.values.get(id(a))
            if lay is None and code(a).startswith(("jax.nn.", "partial(jax.nn.")):
                lay = Layer("fn")
            if lay is not None and isinstance(v.func.value, cst.Name):
                lst = self.local.setdefault(v.func.value.value, Layer("list"))
                lst.items[str(len(lst.items))] = lay
                lst.loop = lst.loop or self.loop > 0
            if lay is not None and lay.kind == "fn":
                v = v.with_changes(args=[v.args[0].with_changes(value=self._wrap_fn(a))])
                return updated_node.with_changes(value=v)
        return updated_node

    def _dict_layer(self, value: cst.Call) -> Layer:
        return Layer("dict", items={a.keyword.value: self.values[id(a.value)] for a in value.args
                                    if a.keyword is not None and id(a.value) in self.values})

    def leave_Return(self, original_node, updated_node):
        if updated_node.value is not None:
            self.returned = self._seq_layer(updated_node.value) or self.values.get(
                id(updated_node.value))
        return updated_node

    def _seq_layer(self, value: cst.BaseExpression) -> Layer | None:
        # a call, not an expression that starts with one (`eqx.nn.Sequential(...) if c else x`)
        if not (isinstance(value, cst.Call) and code(value).startswith("eqx.nn.Sequential(")):
            return None
        inner = value.args[0].value if value.args else None
        src = self.local.get(inner.value) if isinstance(inner, cst.Name) else \
            self.values.get(id(inner))
        parts = list(src.items.values()) if src else []
        return Layer("seq", items={str(i): p for i, p in enumerate(parts)},
                     stateful=any(p.stateful for p in parts), keyed=any(p.keyed for p in parts),
                     loop=bool(src) and (src.loop or "*" in src.items))

    def leave_Assign(self, original_node, updated_node):
        target = updated_node.targets[0].target
        value = updated_node.value
        lay = self.values.get(id(value))
        if isinstance(value, cst.Call) and code(value.func) == "dict" and not (
                lay is not None and lay.kind == "dict"):
            lay = self._dict_layer(value)
            self.values[id(value)] = lay
        if code(value).startswith("eqx.nn.Sequential("):
            lay = self._seq_layer(value)
        if isinstance(value, cst.Lambda):
            lay = Layer("resize" if self._is_per_example(value) else "lambda", node=value)
        if lay is None and isinstance(value, cst.Attribute) and code(value).startswith(
                ELEMENTWISE_PREFIXES):
            lay = Layer("fn")  # a function stored as an attribute: `self.act = jax.nn.relu`
        if isinstance(target, cst.Attribute) and m.matches(target.value, m.Name("self")):
            name, lay = target.attr.value, lay or Layer("value")
            before = self.attrs.setdefault(name, lay)
            # assigned in several branches (`self.downsample = nn.Sequential(...)` or
            # `nn.Identity()` / None): the layer is what the forward pass calls
            if _placeholder(before) and not _placeholder(lay):
                self.attrs[name] = lay
            if _is_identity(value) or before.kind in ("lambda", "seq") and _placeholder(before):
                self.identities.add(name)
        elif isinstance(target, cst.Name) and lay is not None:
            self.local[target.value] = lay
        return updated_node


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _is_layout_move(node: cst.BaseExpression) -> bool:
    """``lambda x: jnp.moveaxis(x, 1, -1)`` or ``lambda x: jnp.moveaxis(x, -1, 1)``: the NNX
    pass's layout moves between its channels-last layers and torch-layout ones."""
    if not (isinstance(node, cst.Lambda) and len(node.params.params) == 1):
        return False
    x = node.params.params[0].name.value
    return _squeeze(code(node.body)) in (f"jnp.moveaxis({x},1,-1)", f"jnp.moveaxis({x},-1,1)")


def _is_identity(node: cst.CSTNode | None) -> bool:
    """``lambda x: x`` or an empty Sequential: NNX's translations of ``nn.Identity()``."""
    if isinstance(node, cst.Call):
        return m.matches(node, m.Call(func=m.Attribute(value=m.Attribute(
            value=m.Name("eqx"), attr=m.Name("nn")), attr=m.Name("Sequential")), args=[
                m.Arg(m.List(elements=[]))]))
    return is_identity_lambda(node)


def _placeholder(lay: Layer) -> bool:
    """A value (``None``) or an identity: another branch's layer decides the calls."""
    return lay.kind == "value" or lay.kind == "lambda" and _is_identity(lay.node) or \
        lay.kind == "seq" and not lay.items


class _Identity(cst.CSTTransformer):
    """``self.downsample = lambda x: x`` in the branch where another sets a layer that takes
    ``state`` or ``key``: an identity called the same way (``eqx.nn.Sequential([])`` passes
    the state through, ``eqx.nn.Identity()`` takes ``key``)."""

    def __init__(self, names: set[str], replacement: str) -> None:
        self.names = names
        self.replacement = replacement

    def leave_Assign(self, original_node, updated_node):
        t = updated_node.targets[0].target
        if m.matches(t, m.Attribute(value=m.Name("self"))) and t.attr.value in self.names \
                and _is_identity(updated_node.value):
            return updated_node.with_changes(value=expr(self.replacement))
        return updated_node


def _dataclass_fields(module: cst.Module) -> dict[str, str]:
    """``name -> annotation`` of the fields of the file's dataclasses, where unambiguous."""
    seen: dict[str, set[str]] = {}
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef):
            continue
        for s in cls.body.body:
            if m.matches(s, m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name())])):
                a = s.body[0]
                seen.setdefault(a.target.value, set()).add(code(a.annotation.annotation))
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


STATIC_TYPES = {"int", "float", "bool", "str", "tuple"}


def _annotation(value: cst.BaseExpression, lay: Layer, params: dict[str, cst.Param],
                dataclass_fields: dict[str, str]) -> tuple[str, bool]:
    """The field annotation for ``self.x = value`` and whether the field is static."""
    text = code(value)
    if lay.kind == "value" and isinstance(value, cst.Name) and value.value in ("True", "False"):
        return "bool", False  # `inference`: eqx.nn.inference_mode replaces it (not static)
    if lay.kind == "value" and isinstance(value, cst.Call) and text.startswith("eqx.nn."):
        return text.split("(")[0], False
    if lay.kind == "value" and isinstance(value, cst.Lambda):
        return "Callable", True
    if lay.kind in ("linear", "conv", "bn", "layernorm", "embedding", "dropout", "pool",
                    "groupnorm", "mha", "lstm", "lstmcell", "gru", "grucell"):
        if not text.startswith("eqx.nn."):  # built by a helper function
            return lay.cls or "eqx.Module", False
        return text.split("(")[0], False
    if lay.kind == "seq":
        return "eqx.nn.Sequential", False
    if lay.kind == "module":
        return "eqx.Module" if lay.alts else lay.cls, False
    if lay.kind == "list":
        return "list", False
    if lay.kind == "dict":
        return "dict", False
    if lay.kind in ("buffer", "param"):
        return "jax.Array", False
    if lay.kind in ("fn", "lambda", "resize"):
        return "Callable", True
    if isinstance(value, cst.Name) and value.value in params:
        p = params[value.value]
        if p.annotation is not None:
            ann = code(p.annotation.annotation)
            return ann, ann in STATIC_TYPES
        lit = try_literal(p.default, ...) if p.default is not None else ...
        t = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple"}.get(
            type(lit))
        if t:
            return t, True
        return "Any", False
    if isinstance(value, cst.Attribute) and value.attr.value in dataclass_fields:
        ann = dataclass_fields[value.attr.value]
        return ann, ann in STATIC_TYPES
    lit = try_literal(value, ...)
    t = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple"}.get(type(lit))
    if t:
        return t, True
    return "Any", False


def _split_keys(body: list[cst.BaseStatement], sites: int) -> list[cst.BaseStatement]:
    """Name the ``__needs_key__`` sites: one site takes ``key``; sites in straight-line code
    take ``key1, key2, ... = jax.random.split(key, n)``; sites in a loop or a comprehension
    split the key they are given (``key, subkey = jax.random.split(key)``)."""
    counter = [0]
    loop_sites = [0]

    class Count(cst.CSTVisitor):
        def __init__(self) -> None:
            self.loop = 0

        def visit_For(self, node):
            self.loop += 1

        def leave_For(self, node):
            self.loop -= 1

        def visit_While(self, node):
            self.loop += 1

        def leave_While(self, node):
            self.loop -= 1

        def visit_Name(self, node):
            if node.value == "__needs_key__" and self.loop:
                loop_sites[0] += 1

    mod = cst.Module(body=body)
    mod.visit(Count())
    sequential = loop_sites[0] > 0

    class Name(cst.CSTTransformer):
        def __init__(self) -> None:
            self.loop = 0

        def leave_Name(self, original_node, updated_node):
            if updated_node.value != "__needs_key__":
                return updated_node
            counter[0] += 1
            return cst.Name(KEY.format(counter[0]))

    mod = mod.visit(Name())
    n = counter[0]
    text_names = [KEY.format(i + 1) for i in range(n)]
    # comprehensions: [X(key=K) for _ in range(n)]
    mod = mod.visit(_CompKeys(set(text_names)))
    if n == 0:
        return list(mod.body)
    if not sequential:
        names = ["key"] if n == 1 else [f"key{i + 1}" for i in range(n)]
        renamed = mod.visit(_Rename(dict(zip(text_names, names, strict=True))))
        out = list(renamed.body)
        if n > 1:
            out.insert(_after_docstring(out), cst.parse_statement(
                f"{', '.join(names)} = jax.random.split(key, {n})\n"))
        return out
    # sequential: before each statement that uses a key, split off a subkey; the last use
    # outside any loop takes the key itself
    return _sequential_keys(list(mod.body), set(text_names))


class _Dedent(cst.CSTTransformer):
    """Continuation lines of an unwrapped ``nnx.Dict(dict(...))`` move out one level."""

    def leave_ParenthesizedWhitespace(self, original_node, updated_node):
        last = updated_node.last_line.value
        if last.startswith("    "):
            return updated_node.with_changes(last_line=cst.SimpleWhitespace(last[4:]))
        return updated_node


def _has_nnx(node: cst.CSTNode) -> bool:
    return any(m.matches(a.value, m.Name("nnx")) for a in findall(node, m.Attribute())) or \
        bool(findall(node, m.Name("rngs")))


class _NoNnx(cst.CSTTransformer):
    MESSAGE = "no equinox translation yet (shown as its NNX translation)"

    def __init__(self) -> None:
        super().__init__()
        self.any = False

    def leave_Annotation(self, original_node, updated_node):
        if _has_nnx(updated_node):
            self.any = True
            return updated_node.with_changes(annotation=cst.Name("Any"))
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if _has_nnx(updated_node):
            return _todo(_comment_out(updated_node), self.MESSAGE)
        return updated_node

    def on_leave(self, original_node, updated_node):
        updated = super().on_leave(original_node, updated_node)
        if isinstance(updated, cst.BaseCompoundStatement) and _has_nnx(updated):
            return _todo(_comment_out(updated), self.MESSAGE)
        return updated


class _Lambdas(cst.CSTTransformer):
    def __init__(self, lambdas: dict[str, cst.Lambda]) -> None:
        super().__init__()
        self.lambdas = lambdas

    def leave_Assign(self, original_node, updated_node):
        t = updated_node.targets[0].target
        if m.matches(t, m.Attribute(value=m.Name("self"))) and t.attr.value in self.lambdas \
                and isinstance(updated_node.value, cst.Lambda):
            return updated_node.with_changes(value=self.lambdas[t.attr.value])
        return updated_node


class _Inference(cst.CSTTransformer):
    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node, m.Attribute(value=m.Name("self"), attr=m.Name(
                "deterministic"))):
            return updated_node.with_changes(attr=cst.Name("inference"))
        return updated_node

    def leave_Comment(self, original_node, updated_node):
        if updated_node.value == "# flipped by .train()/.eval()":
            return updated_node.with_changes(value="# set by eqx.nn.inference_mode")
        return updated_node


class _Rename(cst.CSTTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value=self.names.get(updated_node.value,
                                                              updated_node.value))


class _CompKeys(cst.CSTTransformer):
    """``[Block(c, key=K) for _ in range(n)]`` -> ``[Block(c, key=k) for k in
    jax.random.split(K, n)]``."""

    def __init__(self, placeholders: set[str]) -> None:
        super().__init__()
        self.placeholders = placeholders

    def leave_ListComp(self, original_node, updated_node):
        used = [p for p in self.placeholders if p in code(updated_node.elt)]
        f = updated_node.for_in
        if len(used) != 1 or f.inner_for_in is not None or f.ifs:
            return updated_node
        if not (m.matches(f.target, m.Name("_")) and m.matches(
                f.iter, m.Call(func=m.Name("range"), args=[m.Arg()]))):
            return updated_node
        n = f.iter.args[0].value
        elt = updated_node.elt.visit(_Rename({used[0]: "k"}))
        return updated_node.with_changes(elt=elt, for_in=f.with_changes(
            target=cst.Name("k"), iter=expr("jax.random.split({k}, {n})", k=used[0], n=n)))


def _after_docstring(body: list) -> int:
    if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        return 1
    return 0


def _sequential_keys(body: list[cst.BaseStatement], placeholders: set[str],
                     in_loop: bool = False) -> list[cst.BaseStatement]:
    def uses(s: cst.CSTNode) -> list[str]:
        text = code(s)
        return sorted(p for p in placeholders if p in text)

    # the last statement outside loops that uses a key takes `key` itself
    last = max((i for i, s in enumerate(body) if uses(s)), default=None)
    out: list[cst.BaseStatement] = []
    for i, s in enumerate(body):
        used = uses(s)
        if not used:
            out.append(s)
            continue
        if isinstance(s, (cst.For, cst.While)):
            inner = _sequential_keys(list(s.body.body), placeholders, True)
            out.append(s.with_changes(body=s.body.with_changes(body=inner)))
            continue
        if isinstance(s, cst.BaseCompoundStatement):
            raise EquinoxError("layers built inside a compound statement other than a loop")
        if i == last and len(used) == 1 and not in_loop:
            out.append(_rename_stmt(s, {used[0]: "key"}))
            continue
        if len(used) == 1:
            out.append(cst.parse_statement("key, subkey = jax.random.split(key)\n"))
            out.append(_rename_stmt(s, {used[0]: "subkey"}))
        else:
            names = [f"subkey{j + 1}" for j in range(len(used))]
            out.append(cst.parse_statement(
                f"key, {', '.join(names)} = jax.random.split(key, {len(used) + 1})\n"))
            out.append(_rename_stmt(s, dict(zip(used, names, strict=True))))
    return out


def _rename_stmt(s: cst.BaseStatement, names: dict[str, str]) -> cst.BaseStatement:
    return s.visit(_Rename(names))


# ---------------------------------------------------------------------------- forward
class Forward:
    """Per-example translation of one ``__call__``."""

    def __init__(self, owner: ClassInfo, classes: dict[str, ClassInfo],
                 analyse: Callable[[str, list[Info]], Info | None]) -> None:
        self.owner = owner
        self.classes = classes
        self.analyse = analyse
        self.env: dict[str, Info] = {}
        self.hoisted: list[cst.BaseStatement] = []
        self.key_sites: list[str] = []  # placeholders in order
        self.loop_depth = 0
        self.fresh = 0
        self.returns: list[Info] = []
        self.reduced: dict[int, str] = {}  # returned batch losses: output index -> mean | sum
        self.callees: list[tuple[str, list[Info]]] = []
        self.loop_layers: dict[str, Layer] = {}  # loop names over lists of layers
        self.loops: set[int] = set()  # ids of the loops of loop_over

    # --- keys and state
    def key(self) -> cst.Name:
        name = KEY.format(len(self.key_sites) + 1)
        self.key_sites.append(name if not self.loop_depth else name + "loop")
        return cst.Name(self.key_sites[-1])

    def stateful_call(self, call: cst.Call) -> cst.Name:
        self.fresh += 1
        tmp = f"__out{self.fresh}__"
        state_arg = cst.Arg(cst.Name("state"))
        # after the positional arguments: a converted module's __call__ takes state last
        n = next((i for i, a in enumerate(call.args) if a.keyword is not None or a.star),
                 len(call.args))
        call = call.with_changes(args=[*call.args[:n], state_arg, *call.args[n:]]) \
            if call.args else call
        call = _fix_commas(call)
        self.hoisted.append(cst.parse_statement(f"{tmp}, state = {code(call)}\n"))
        return cst.Name(tmp)

    # --- layers
    def resolve(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Layer | None]:
        """``self.a`` / ``self.d.k`` / a loop name -> the equinox expression and its layer."""
        if isinstance(node, cst.Name):
            info = self.env.get(node.value)
            if info is not None and info.kind.startswith("layer:"):
                return node, self._layer_from_kind(info.kind)
            return node, None
        if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
            return node, self.owner.attrs.get(node.attr.value)
        if isinstance(node, cst.Attribute):
            base, lay = self.resolve(node.value)
            if lay is not None and lay.kind == "dict":
                key = node.attr.value
                return cst.Subscript(base, [cst.SubscriptElement(cst.Index(
                    cst.SimpleString(f'"{key}"')))]), lay.items.get(key)
            return node, None
        if isinstance(node, cst.Subscript):
            base, lay = self.resolve(node.value)
            if lay is not None and lay.kind == "list":
                return node.with_changes(value=base), lay.items.get("*") or next(
                    iter(lay.items.values()), None)
            key = try_literal(node.slice[0].slice.value, None) if len(node.slice) == 1 and \
                isinstance(node.slice[0].slice, cst.Index) else None
            if lay is not None and lay.kind == "dict" and isinstance(key, str):
                return node.with_changes(value=base), lay.items.get(key)  # self.heads["a"]
        return node, None

    def _layer_from_kind(self, kind: str) -> Layer | None:
        return self.loop_layers.get(kind)

    def call_layer(self, func: cst.BaseExpression, lay: Layer, node: cst.Call) -> tuple[
            cst.BaseExpression, Info]:
        if lay.kind == "mha":
            return self.call_attention(func, lay, node)
        if lay.kind in RNN_NAMES:
            raise EquinoxError(f"an {RNN_NAMES[lay.kind]} call in another form than torch's "
                               "(output, state) unpacked")
        args = [a for a in node.args]
        if (len(args) != 1 or args[0].keyword or args[0].star) and lay.kind != "module":
            raise EquinoxError(f"a {lay.kind} layer called with several arguments")
        values = [self.ev(a.value) for a in args]
        new_args = [a.with_changes(value=v[0]) for a, v in zip(args, values, strict=True)]
        infos = [v[1] for v in values]
        x = infos[0] if infos else Info()
        if lay.kind in VECTOR_LAYERS:
            need = VECTOR_LAYERS[lay.kind]
            if x.channels_last:
                raise EquinoxError(f"a {lay.kind} layer inside a channels-last region")
            if x.rank is None and not x.is_input and x.batched:
                raise EquinoxError(f"a {lay.kind} layer applied to a value whose rank is not "
                                   "known here")
            rank = x.rank if x.rank is not None else need
            self._fix_input_rank(args[0].value, rank, lay.kind)
            if rank < need:
                raise EquinoxError(f"a {lay.kind} layer applied to a value of rank {rank}")
            f: cst.BaseExpression = func
            for _ in range(rank - need):
                f = expr("jax.vmap({f})", f=f)
            out = Info(x.batched, rank + (1 if lay.kind == "embedding" else 0))
            return cst.Call(f, new_args), out
        if lay.kind in ("conv", "pool"):
            if x.rank is not None and x.rank != lay.rank:
                raise EquinoxError(f"a {lay.kind} layer applied to a value of rank {x.rank} "
                                   f"per example (it takes {lay.rank}: channels first)")
            self._fix_input_rank(args[0].value, lay.rank)
            return cst.Call(func, new_args), Info(x.batched, lay.rank,
                                                  channels_last=x.channels_last)
        if lay.kind == "groupnorm":  # channel first, any number of spatial axes
            return cst.Call(func, new_args), Info(x.batched, x.rank,
                                                  channels_last=x.channels_last)
        if lay.kind == "bn":
            if not x.batched:
                raise EquinoxError("BatchNorm on a value that is not per example")
            return self.stateful_call(cst.Call(func, new_args)), Info(
                True, x.rank, channels_last=x.channels_last)
        if lay.kind == "resize":  # (written for one example: channel-first, any rank)
            return cst.Call(func, new_args), Info(x.batched, x.rank,
                                                  channels_last=x.channels_last)
        channel_first = lay.kind == "seq" and bool(lay.items) and all(
            p.kind in ("conv", "bn", "pool", "fn", "resize") for p in lay.items.values())
        if x.channels_last and lay.kind not in ("fn", "dropout") and not channel_first:
            raise EquinoxError(f"a {lay.kind} layer inside a channels-last region")
        if lay.kind == "dropout":
            call = cst.Call(func, [*new_args, _kwarg("key", self.key())])
            return _fix_commas(call), replace(x)
        if lay.kind == "fn":
            return cst.Call(func, new_args), replace(x)
        if lay.kind == "lambda" and isinstance(func, cst.Attribute):
            return cst.Call(func, new_args), self.call_lambda(func.attr.value, lay.node, infos)
        if lay.kind == "seq":
            first = lay.items.get("0")
            if first is None or any(p.kind == "value" for p in lay.items.values()):
                raise EquinoxError("a Sequential whose layers are not known here")
            vmaps = 0
            if first.kind in VECTOR_LAYERS and x.rank is not None and \
                    x.rank > VECTOR_LAYERS[first.kind]:
                # a sequence of vectors: map the whole Sequential over the leading axes
                if lay.keyed or lay.stateful or not all(
                        p.kind in ("linear", "fn", "layernorm") for p in lay.items.values()):
                    raise EquinoxError("a Sequential with dropout or state applied to a "
                                       f"sequence (rank {x.rank} per example)")
                vmaps = x.rank - VECTOR_LAYERS[first.kind]
            if any(p.kind in ("conv", "pool", "bn") for p in lay.items.values()) and any(
                    p.kind in VECTOR_LAYERS for p in lay.items.values()):
                raise EquinoxError("a Sequential mixing channel-first and vector layers")
            if any(p.kind == "module" for p in lay.items.values()):
                if lay.loop:
                    return self.loop_over(func, lay, new_args[0].value, x)
                return self.unroll(func, lay, new_args[0].value, x)
            rank = x.rank
            if rank is None and first is not None and first.kind in VECTOR_LAYERS:
                if not x.is_input:
                    raise EquinoxError("a Sequential applied to a value whose rank is not "
                                       "known here")
                rank = VECTOR_LAYERS[first.kind]
                self._fix_input_rank(args[0].value, rank, first.kind)
            for _ in range(vmaps):
                func = expr("jax.vmap({f})", f=func)
            call = cst.Call(func, new_args)
            if lay.keyed:
                call = _fix_commas(call.with_changes(args=[*call.args, _kwarg("key",
                                                                              self.key())]))
            out = Info(x.batched, rank, channels_last=x.channels_last)
            if channel_first and x.rank is None:
                out.rank = next((p.rank for p in lay.items.values()
                                 if p.kind in ("conv", "pool") and p.rank), None)
                if out.rank is not None and x.is_input:
                    self._fix_input_rank(args[0].value, out.rank)
            if lay.stateful:
                return self.stateful_call(call), out
            return call, out
        if lay.kind == "module":
            sub = self.classes[lay.cls]
            self.callees.append((lay.cls, infos))
            out = self.analyse(lay.cls, infos)
            call = cst.Call(func, new_args)
            if sub.keyed:
                call = _fix_commas(call.with_changes(args=[*call.args, _kwarg("key",
                                                                              self.key())]))
            if sub.stateful:
                return self.stateful_call(call), out or Info(x.batched)
            return call, out or Info(x.batched)
        raise EquinoxError(f"{code(func)} is not a layer the equinox target translated")

    def unroll(self, func: cst.BaseExpression, lay: Layer, value: cst.BaseExpression,
               x: Info) -> tuple[cst.BaseExpression, Info]:
        """A Sequential holding the file's own modules, called block by block
        (``self.layer1[0](x, state)``, ...): ``eqx.nn.Sequential`` passes its state only to
        ``StatefulLayer``s and a key to every layer, which converted modules are not written
        for."""
        for i in range(len(lay.items)):
            p = lay.items.get(str(i))
            if p is None:
                raise EquinoxError("a Sequential whose layers are not known here")
            if not isinstance(value, cst.Name):
                self.fresh += 1
                tmp = f"__out{self.fresh}__"
                self.hoisted.append(cst.parse_statement(f"{tmp} = {code(value)}\n"))
                value = cst.Name(tmp)
            self.env[value.value] = x
            item = cst.Subscript(func, [cst.SubscriptElement(cst.Index(cst.Integer(str(i))))])
            value, x = self.call_layer(item, p, cst.Call(item, [cst.Arg(value)]))
        return value, x

    def loop_over(self, func: cst.BaseExpression, lay: Layer, value: cst.BaseExpression,
                  x: Info) -> tuple[cst.BaseExpression, Info]:
        """A Sequential of the file's own modules built in a loop (how many is not known
        here), all of one class: a loop over its layers, ``for block in self.layer1.layers:
        x, state = block(x, state)`` (a key split off per iteration where they take one)."""
        parts = list(lay.items.values())
        first = parts[0]
        if any(p.kind != "module" or (p.cls, p.alts) != (first.cls, first.alts)
               for p in parts):
            raise EquinoxError("a Sequential built in a loop from layers of different "
                               "classes: how many of each it holds is not known here")
        if not (isinstance(value, cst.Name) and value.value.startswith("__out")):
            self.fresh += 1  # the loop rebinds a temporary, not a name of the function
            tmp = f"__out{self.fresh}__"
            self.hoisted.append(cst.parse_statement(f"{tmp} = {code(value)}\n"))
            value = cst.Name(tmp)
        call = _init_of(self.owner.node, "__call__")
        taken = {n.value for n in findall(call, m.Name())} if call is not None else set()
        name, i = "block", 1
        while name in taken:
            i += 1
            name = f"block{i}"
        self.env[value.value] = x
        outer, self.hoisted = self.hoisted, []
        self.loop_depth += 1
        try:
            out, info = self.call_layer(cst.Name(name), first, cst.Call(cst.Name(name), [
                cst.Arg(value)]))
        finally:
            self.loop_depth -= 1
            inner, self.hoisted = self.hoisted, outer
        if isinstance(out, cst.Name) and inner and code(inner[-1]).startswith(out.value + ","):
            inner[-1] = _rename_stmt(inner[-1], {out.value: value.value})
        else:
            inner.append(cst.parse_statement(f"{value.value} = {code(out)}\n"))
        loop = cst.For(cst.Name(name), expr("{f}.layers", f=func), cst.IndentedBlock(inner))
        self.hoisted.append(loop)
        self.loops.add(id(loop))
        return value, info

    def sequence_input(self, node: cst.BaseExpression, what: str) -> cst.BaseExpression:
        """A (L, E) sequence per example: torch's (N, L, E), batch first."""
        if m.matches(node, m.Call(func=m.Attribute(value=m.Name("jnp"),
                                                   attr=m.Name("moveaxis")))):
            raise EquinoxError(f"{what} with batch_first=False: its batch is axis 1, and the "
                               "equinox model is mapped over axis 0 (batch_first=True is "
                               "translated)")
        new, info = self.ev(node)
        if not info.batched or info.rank not in (None, 2):
            raise EquinoxError(f"{what} applied to a value that is not a sequence per example")
        self._fix_input_rank(node, 2)
        return new

    def call_attention(self, func: cst.BaseExpression, lay: Layer, node: cst.Call) -> tuple[
            cst.BaseExpression, Info]:
        """NNX ``attn(q, k, v, mask=M)`` (batch first) -> ``attn(q, k, v, mask=M')`` per
        example: equinox takes all three, and a (L, S) mask (True = attend, as flax's)."""
        pos = [a.value for a in node.args if a.keyword is None and not a.star]
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if len(pos) + len(kw) != len(node.args) or set(kw) - {"mask"} or not 1 <= len(pos) <= 3:
            raise EquinoxError("MultiheadAttention called with other arguments")
        qkv = [self.sequence_input(p, "MultiheadAttention") for p in pos]
        qkv += [qkv[-1]] * (3 - len(qkv))
        args = [cst.Arg(v) for v in qkv]
        if "mask" in kw:
            args.append(_kwarg("mask", self.attention_mask(kw["mask"], qkv[0], qkv[1])))
        if lay.keyed:
            args.append(_kwarg("key", self.key()))
        return _fix_commas(cst.Call(func, args)), Info(True, 2)

    def attention_mask(self, node: cst.BaseExpression, q: cst.BaseExpression,
                       k: cst.BaseExpression) -> cst.BaseExpression:
        """The NNX pass's mask (``~attn_mask``, ``~key_padding_mask[..., None, None, :]``,
        both joined by ``jnp.logical_and``) for one example: torch's (L, S) attn_mask is
        shared by the examples, a key padding mask is the example's (S,) row, broadcast."""
        parts = list(node.args) if m.matches(node, m.Call(func=m.Attribute(
            value=m.Name("jnp"), attr=m.Name("logical_and")))) else [cst.Arg(node)]
        out, padded = [], False
        for part in (a.value for a in parts):
            if m.matches(part, m.UnaryOperation(operator=m.BitInvert(), expression=m.IfExp())):
                value, info = self.ev(part.expression.orelse)
                if info.batched or info.rank == 3:
                    raise EquinoxError("a (N * num_heads, L, S) attn_mask: the batch is merged "
                                       "with the heads (a (L, S) mask is translated)")
                out.append(expr("~{m}", m=value))
            elif m.matches(part, m.UnaryOperation(operator=m.BitInvert(), expression=m.Subscript(
                    slice=[m.SubscriptElement(m.Index(m.Ellipsis())), m.ZeroOrMore()]))):
                value, info = self.ev(part.expression.value)
                if not info.batched:
                    raise EquinoxError("a key_padding_mask that is not per example")
                out.append(expr("~{m}", m=value))
                padded = True
            else:
                raise EquinoxError("a MultiheadAttention mask in an unknown form")
        mask = out[0] if len(out) == 1 else expr("jnp.logical_and({a}, {b})", a=out[0],
                                                 b=out[1])
        if not padded:
            return mask
        if not (is_simple(q) and is_simple(k)):
            raise EquinoxError("a key_padding_mask with a compound query or key (assign them "
                               "to names first)")
        return expr("jnp.broadcast_to({m}, ({q}.shape[0], {k}.shape[0]))", m=mask, q=q, k=k)

    def lstm(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's LSTM call forms -> ``lstm_scan(self.lstm, x)``, torch's ``(output, (h_n,
        c_n))`` for one example: ``(rnn(x), None)`` (the output alone used) and
        ``(lambda carry, out: ...)(*rnn(x, return_carry=True))``. None: not an LSTM call."""
        if m.matches(node, m.Tuple(elements=[m.Element(m.Call()), m.Element(m.Name("None"))])):
            call = node.elements[0].value
        elif m.matches(node, m.Call(func=m.Lambda(), args=[m.Arg(star="*", value=m.Call())])):
            call = node.args[0].value
        else:
            return None
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind not in ("lstm", "gru"):
            return None
        what = RNN_NAMES[lay.kind]
        kw = {a.keyword.value for a in call.args if a.keyword is not None}
        if kw - {"return_carry"} or len(call.args) != 1 + len(kw):
            raise EquinoxError(f"an {what} called with a state: torch's is (num_layers, N, H), "
                               "the batch on axis 1 (the zero state is translated)")
        x = self.sequence_input(call.args[0].value, what)
        state = Info(True, 2, kind="layers_first")
        if lay.kind == "lstm":
            state = Info(True, kind="tuple", elements=(state, state))
        # the whole torch structure, whichever parts the NNX form kept
        return expr(f"{lay.kind}_scan({{f}}, {{x}})", f=func, x=x), Info(
            True, kind="tuple", elements=(Info(True, 2), state))

    def lstm_cell(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's ``cell((c, h), x)[0][::-1]`` -> equinox's ``cell(x, (h, c))``, torch's
        ``(h', c')``; without torch's hx, zeros of one example's hidden size."""
        if not m.matches(node, m.Subscript(
                value=m.Subscript(value=m.Call(args=[m.Arg(m.Tuple()), m.Arg()]),
                                  slice=[m.SubscriptElement(m.Index(m.Integer("0")))]),
                slice=[m.SubscriptElement(m.Slice(lower=None, upper=None))])):
            return None
        call = node.value.value
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind != "lstmcell":
            return None
        x, info = self.ev(call.args[1].value)
        if not info.batched or info.rank not in (None, 1):
            raise EquinoxError("an LSTMCell applied to a value that is not a vector per example")
        self._fix_input_rank(call.args[1].value, 1)
        c, h = (e.value for e in call.args[0].value.elements)
        if code(c) == code(h) and code(c).startswith("jnp.zeros((*"):
            zero = expr("jnp.zeros({f}.hidden_size, {x}.dtype)", f=func, x=x)
            state = [zero, zero]
        else:
            state = []
            for v in (h, c):
                new, i = self.ev(v)
                if not i.batched or i.rank not in (None, 1):
                    raise EquinoxError("an LSTMCell state that is not a vector per example")
                state.append(new)
        return expr("{f}({x}, ({h}, {c}))", f=func, x=x, h=state[0], c=state[1]), Info(
            True, kind="tuple", elements=(Info(True, 1), Info(True, 1)))

    def gru_cell(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's ``cell(h, x)[0]`` -> equinox's ``cell(x, h)``, torch's h'; without torch's
        hx, zeros of one example's hidden size."""
        if not m.matches(node, m.Subscript(
                value=m.Call(args=[m.Arg(keyword=None), m.Arg(keyword=None)]),
                slice=[m.SubscriptElement(m.Index(m.Integer("0")))])):
            return None
        call = node.value
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind != "grucell":
            return None
        x, info = self.ev(call.args[1].value)
        if not info.batched or info.rank not in (None, 1):
            raise EquinoxError("a GRUCell applied to a value that is not a vector per example")
        self._fix_input_rank(call.args[1].value, 1)
        h = call.args[0].value
        if code(h).startswith("jnp.zeros((*"):
            h = expr("jnp.zeros({f}.hidden_size, {x}.dtype)", f=func, x=x)
        else:
            h, i = self.ev(h)
            if not i.batched or i.rank not in (None, 1):
                raise EquinoxError("a GRUCell state that is not a vector per example")
        return expr("{f}({x}, {h})", f=func, x=x, h=h), Info(True, 1)

    def call_lambda(self, attr: str, lam: cst.Lambda, infos: list[Info]) -> Info:
        """``self.pool = lambda x: jnp.mean(x, axis=(2, 3), keepdims=True)``: its body is
        translated for the values it is called with (one translation for all calls)."""
        params = lam.params.params
        if len(params) != len(infos) or lam.params.star_arg not in (
                cst.MaybeSentinel.DEFAULT, None) or lam.params.kwonly_params:
            raise EquinoxError(f"self.{attr}: a lambda called with other arguments")
        sub = Forward(self.owner, self.classes, self.analyse)
        for p, i in zip(params, infos, strict=True):
            sub.env[p.name.value] = replace(i)
        body, out = sub.ev(lam.body)
        if sub.hoisted or sub.key_sites:
            raise EquinoxError(f"self.{attr}: a lambda that calls layers")
        new = lam.with_changes(body=body)
        prev = self.owner.lambdas.get(attr)
        if prev is not None and code(prev) != code(new):
            raise EquinoxError(f"self.{attr}: a lambda called with values of other ranks")
        self.owner.lambdas[attr] = new
        return out

    def _fix_input_rank(self, node: cst.BaseExpression, rank: int, kind: str = "") -> None:
        """A model input whose rank a layer decided: later uses agree with it."""
        for n in findall(node, m.Name()) if not isinstance(node, cst.Name) else [node]:
            info = self.env.get(n.value)
            if info is not None and info.is_input and info.rank is None:
                self.env[n.value] = replace(info, rank=rank)
                if kind:
                    self.owner.assumed.append((n.value, rank, kind))

    # --- expressions
    def ev(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Info]:
        if isinstance(node, cst.Name):
            info = self.env.get(node.value, Info())
            if info.kind == "layers_first":
                raise EquinoxError(f"torch's LSTM state {node.value} is (num_layers, N, H), the "
                                   f"batch on axis 1: only its layers ({node.value}[-1]) are "
                                   "translated")
            return node, info
        translated = self.lstm(node) if isinstance(node, (cst.Tuple, cst.Call)) else \
            (self.lstm_cell(node) or self.gru_cell(node)) if isinstance(node, cst.Subscript) \
            else None
        if translated is not None:
            return translated
        if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return node, Info(rank=0)
        if isinstance(node, cst.Attribute):
            if node.attr.value == "shape":
                inner, info = self.ev(node.value)
                return node.with_changes(value=inner), Info(kind="shape", batched=info.batched,
                                                            rank=info.rank)
            weight = self.weight_read(node)
            if weight is not None:
                return weight, Info()
            if node.attr.value == "T":
                inner, info = self.ev(node.value)
                if info.batched:
                    raise EquinoxError(".T of a batched value")
                return node.with_changes(value=inner), info
            new, lay = self.resolve(node)
            if lay is not None and lay.kind == "buffer":
                return new, Info(rank=lay.rank, lead_one=lay.lead_one)
            if m.matches(node.value, m.Name("self")):
                return new, Info()
            inner, info = self.ev(node.value)
            if info.batched:
                raise EquinoxError(f"the attribute .{node.attr.value} of a batched value")
            return node.with_changes(value=inner), Info()
        if isinstance(node, cst.Subscript):
            return self.subscript(node)
        if isinstance(node, cst.BinaryOperation):
            left, li = self.ev(node.left)
            right, ri = self.ev(node.right)
            left, right, info = self.broadcast(left, li, right, ri,
                                               isinstance(node.operator, cst.MatrixMultiply))
            return node.with_changes(left=left, right=right), info
        if isinstance(node, cst.Comparison):
            if all(isinstance(c.operator, (cst.Is, cst.IsNot)) and m.matches(
                    c.comparator, m.Name("None")) for c in node.comparisons):
                return node, Info(rank=0)  # `targets is None`: decided when tracing
            left, li = self.ev(node.left)
            comps = []
            info = li
            for c in node.comparisons:
                right, ri = self.ev(c.comparator)
                left, right, info = self.broadcast(left, li, right, ri, False)
                comps.append(c.with_changes(comparator=right))
            return node.with_changes(left=left, comparisons=comps), info
        if isinstance(node, cst.UnaryOperation):
            inner, info = self.ev(node.expression)
            return node.with_changes(expression=inner), info
        if isinstance(node, cst.Call):
            return self.call(node)
        if isinstance(node, (cst.Tuple, cst.List)):
            elts, infos = [], []
            for e in node.elements:
                if isinstance(e, cst.StarredElement):
                    raise EquinoxError("a starred element in a forward pass")
                v, info = self.ev(e.value)
                infos.append(info)
                elts.append(e.with_changes(value=v))
            # batched values together (outputs, operands of concatenate/stack)
            return node.with_changes(elements=elts), Info(any(i.batched for i in infos),
                                                          kind="tuple", elements=tuple(infos))
        # anything else: fine when nothing in it is batched
        for n in findall(node, m.Name()):
            if self.env.get(n.value, Info()).batched:
                raise EquinoxError(f"{type(node).__name__} over a batched value")
        return node, Info()

    def weight_read(self, node: cst.Attribute) -> cst.BaseExpression | None:
        """A layer's weight read in forward code: NNX's ``fc.kernel`` is torch's weight
        transposed (``fc.kernel.T`` torch's weight), an ``nnx.Embed``'s ``embedding`` torch's
        weight. equinox keeps torch's layout: ``fc.weight.T`` / ``fc.weight``."""
        transposed = node.attr.value == "T"
        read = node.value if transposed else node
        if not isinstance(read, cst.Attribute) or read.attr.value not in ("kernel", "embedding"):
            return None
        base, lay = self.resolve(read.value)
        kinds = {"kernel": "linear", "embedding": "embedding"}
        if lay is None or lay.kind != kinds[read.attr.value]:
            return None
        weight = cst.Attribute(base, cst.Name("weight"))
        if lay.kind == "embedding":
            return cst.Attribute(weight, cst.Name("T")) if transposed else weight
        return weight if transposed else cst.Attribute(weight, cst.Name("T"))

    def broadcast(self, left, li: Info, right, ri: Info, matmul: bool):
        if li.merged or ri.merged or li.kind.startswith("batch_") and li.kind != "batch_size" \
                or ri.kind.startswith("batch_") and ri.kind != "batch_size":
            raise EquinoxError("arithmetic on a batch loss or on rows that merge the batch")
        if li.kind == "batch_size" or ri.kind == "batch_size":
            raise EquinoxError("arithmetic on the batch size")
        if li.channels_last or ri.channels_last:
            raise EquinoxError("arithmetic inside a channels-last region of the NNX translation")
        batched = li.batched or ri.batched
        if not batched:
            rank = None if li.rank is None or ri.rank is None else max(li.rank, ri.rank)
            hi = li if (li.rank or 0) >= (ri.rank or 0) else ri
            lead = hi.lead_one and rank is not None and (min(li.rank, ri.rank) < rank)
            return left, right, Info(rank=rank, lead_one=lead)
        b, u = (li, ri) if li.batched else (ri, li)
        if b.batched and u.batched:
            rank = None if li.rank is None or ri.rank is None else max(li.rank, ri.rank)
            return left, right, Info(True, rank)
        # an unbatched operand as long as the batched one *with* its batch axis: its leading
        # axis faced the batch; when it is known to be 1 (a broadcast buffer), drop it
        if u.rank is not None and b.rank is not None and u.rank > b.rank and not matmul:
            if u.rank == b.rank + 1 and u.lead_one:
                if li.batched:
                    right = _drop_lead(right)
                else:
                    left = _drop_lead(left)
            else:
                raise EquinoxError("an unbatched operand whose leading axis meets the batch "
                                   "axis")
        elif u.rank is None and not matmul and b.rank is None:
            pass
        rank = b.rank if u.rank is None or b.rank is None else max(b.rank, min(u.rank, b.rank))
        return left, right, Info(True, rank)

    def subscript(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info]:
        if isinstance(node.value, cst.Name) and self.env.get(
                node.value.value, Info()).kind == "layers_first" and len(node.slice) == 1 and \
                isinstance(try_literal(node.slice[0].slice.value, None) if isinstance(
                    node.slice[0].slice, cst.Index) else None, int):
            return node, Info(True, 1)  # h_n[-1]: one layer, (N, H) in torch
        value, info = self.ev(node.value)
        index = try_literal(node.slice[0].slice.value, None) if len(node.slice) == 1 and \
            isinstance(node.slice[0].slice, cst.Index) else None
        if info.elements and isinstance(index, int) and -len(info.elements) <= index < len(
                info.elements):  # an element of a layer's outputs: (out, weights)[0]
            return node.with_changes(value=value), info.elements[index]
        if info.kind == "shape":
            (el,) = node.slice
            i = int_value(el.slice.value) if isinstance(el.slice, cst.Index) else None
            if info.batched:
                if i == 0:
                    return node.with_changes(value=value), Info(kind="batch_size")
                if i is None:
                    raise EquinoxError("a computed index into the shape of a batched value")
                if i > 0:
                    el = el.with_changes(slice=cst.Index(cst.Integer(str(i - 1))))
                return node.with_changes(value=value, slice=[el]), Info(rank=0)
            return node.with_changes(value=value), Info(rank=0)
        elements = list(node.slice)
        for e in elements:
            if isinstance(e.slice, cst.Index):
                _, ii = self.ev(e.slice.value)
                if ii.batched:
                    raise EquinoxError("indexing with a batched value")
        if info.merged:
            raise EquinoxError("indexing rows that merge the batch with another axis")
        if not info.batched:
            if info.lead_one and info.rank is not None:
                return node.with_changes(value=value), Info(rank=info.rank,
                                                            lead_one=_keeps_lead(elements))
            return node.with_changes(value=value), Info()
        first = elements[0].slice
        if isinstance(first, cst.Index) and m.matches(first.value, m.Ellipsis()):
            return node.with_changes(value=value), Info(True, None)
        if not (isinstance(first, cst.Slice) and first.lower is None and first.upper is None
                and first.step is None):
            raise EquinoxError("indexing the batch axis")
        rest = elements[1:]
        if not rest:
            return value, info
        rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return node.with_changes(value=value, slice=rest), Info(True, None)

    def call(self, node: cst.Call) -> tuple[cst.BaseExpression, Info]:
        func = node.func
        func_new, lay = self.resolve(func)
        if lay is not None:
            return self.call_layer(func_new, lay, node)
        name = code(func)
        # tied embedding head (NNX: wte.attend(x)) -> x @ wte.weight.T
        if isinstance(func, cst.Attribute) and func.attr.value == "attend":
            emb, elay = self.resolve(func.value)
            if elay is not None and elay.kind == "embedding":
                x, info = self.ev(node.args[0].value)
                return expr("{x} @ {w}.weight.T", x=x, w=emb), Info(info.batched, info.rank)
        # methods of arrays
        if isinstance(func, cst.Attribute) and not _is_library(func) and \
                name not in ("nnx.max_pool", "nnx.avg_pool"):
            recv, info = self.ev(func.value)
            method = func.attr.value
            if not info.batched:
                args = [a.with_changes(value=self.ev_unbatched(a.value)) for a in node.args]
                rank = None
                if method == "reshape":
                    rank = _reshape_rank(node)
                return node.with_changes(func=func.with_changes(value=recv), args=args), Info(
                    rank=rank, lead_one=method == "reshape" and rank is not None and
                    int_value(node.args[0].value) == 1)
            if info.merged:
                if method in ("mean", "sum") and not node.args:
                    # the batch loss over every row: per example the mean (sum) over its
                    # rows; the caller takes the mean (sum) over the batch, the same value as
                    # torch's when every example has as many rows
                    return node.with_changes(func=func.with_changes(value=recv)), Info(
                        True, 0, kind=f"batch_{method}")
                raise EquinoxError(f".{method}() of rows that merge the batch with another "
                                   "axis")
            if method == "reshape":
                return self.reshape(node, recv, info)
            if method in ("astype",):
                return node.with_changes(func=func.with_changes(value=recv)), info
            if method in AXIS_REDUCTIONS:
                args = self.shift_axes(node, kw_axes=("axis",), pos_axes=(0,))
                rank = info.rank
                if method in RANK_REDUCTIONS:
                    rank = _reduced_rank(node, info.rank, 0)
                return node.with_changes(func=func.with_changes(value=recv), args=args), \
                    Info(True, rank)
            raise EquinoxError(f"the method .{method}() of a batched value")
        if name == "jnp.pad":
            padded = self.pad(node)
            if padded is not None:
                return padded
        args = [(a, *self.ev(a.value)) for a in node.args]
        if any(i.merged for _, _, i in args):
            if name.startswith("optax.") and all(i.merged for _, _, i in args if i.batched):
                # optax's losses are per row (they reduce the class axis only): per example,
                # over its own rows, with the axes as written
                return node.with_changes(args=[a.with_changes(value=v) for a, v, _ in args]), \
                    Info(True, None, merged=True)
            raise EquinoxError(f"{name} of rows that merge the batch with another axis")
        if name == "jnp.moveaxis" and len(args) == 3 and args[0][2].batched:
            # the NNX pass's moves to channels-last and back: equinox layers are channel-first
            src, dst = int_value(args[1][1]), int_value(args[2][1])
            x = args[0][2]
            if (src, dst) == (1, -1) and not x.channels_last:
                return args[0][1], replace(x, channels_last=True)
            if (src, dst) == (-1, 1) and x.channels_last:
                return args[0][1], replace(x, channels_last=False)
        if name in ("nnx.max_pool", "nnx.avg_pool") and args and args[0][2].batched and \
                args[0][2].channels_last:
            pooled = self.pool(node, args[0][1], args[0][2], name)
            if pooled is not None:
                return pooled
        if name in TRAILING_AXES_HELPERS and args and args[0][2].batched and not any(
                i.batched for _, _, i in args[1:]):
            # helpers over the last axes (adaptive pooling): the same call per example
            return node.with_changes(args=[a.with_changes(value=v) for a, v, _ in args]), \
                replace(args[0][2])
        short = name.split(".")[-1]
        elementwise = (name.startswith("jax.nn.") and short not in AXIS_REDUCTIONS) or (
            name.startswith("jnp.") and short in ELEMENTWISE_JNP)
        if any(i.channels_last for _, _, i in args) and not (elementwise and len(args) == 1):
            raise EquinoxError(f"{name} inside a channels-last region of the NNX translation")
        batched = [info for _, _, info in args if info.batched]
        new_args = [a.with_changes(value=v) for a, v, _ in args]
        call = node.with_changes(args=new_args)
        if not batched:
            rank = None
            if name == "jnp.arange":
                rank = 1
            return call, Info(rank=rank)
        first = args[0][2] if args else Info()
        short = name.split(".")[-1]
        if name.startswith("jax.nn.") or (name.startswith("jnp.") and short in ELEMENTWISE_JNP) \
                or (self.owner.attrs.get(name[5:]) is not None and name.startswith("self.")
                    and self.owner.attrs[name[5:]].kind == "fn"):
            if short in AXIS_REDUCTIONS:
                call = call.with_changes(args=self.shift_axes(call, ("axis",), ()))
                return call, Info(True, first.rank)
            # operands broadcast against each other: an unbatched one as long as a batched
            # one with its batch axis had its leading axis facing the batch
            ranks = [i.rank for _, _, i in args if i.batched]
            rank = None if None in ranks else max(ranks)
            fixed = []
            for a, v, i in args:
                if a.keyword is None and not i.batched and i.rank is not None and \
                        rank is not None and i.rank > rank:
                    if i.rank == rank + 1 and i.lead_one:
                        v = _drop_lead(v)
                    else:
                        raise EquinoxError("an unbatched operand whose leading axis meets the "
                                           "batch axis")
                fixed.append(a.with_changes(value=v))
            return call.with_changes(args=fixed), Info(True, rank, channels_last=any(
                i.channels_last for _, _, i in args))
        if name.startswith("jnp.") and (short in AXIS_REDUCTIONS or short in
                                        JNP_POSITIONAL_AXES):
            if not first.batched:
                raise EquinoxError(f"{name} with a batched operand that is not the first")
            call = call.with_changes(args=self.shift_axes(
                call, ("axis", "axis1", "axis2", "source", "destination"),
                JNP_POSITIONAL_AXES.get(short, ())))
            rank = first.rank
            if short in ("concatenate", "stack") and first.kind == "tuple":
                # the rank of the values joined (known for one of them: the same for all)
                ranks = {e.rank for e in first.elements if e.batched and e.rank is not None}
                rank = ranks.pop() if len(ranks) == 1 else None
                if rank is not None and short == "stack":
                    rank += 1
            if short in ("expand_dims",) and rank is not None:
                rank += 1
            elif short in ("squeeze",) and rank is not None:
                rank -= 1
            elif short in RANK_REDUCTIONS:
                rank = _reduced_rank(node, rank, 1)
            return call, Info(True, rank)
        if name == "jnp.transpose" and first.batched:
            axes = try_literal(node.args[1].value if len(node.args) > 1 else None, None)
            if not isinstance(axes, tuple) or not axes or axes[0] != 0:
                raise EquinoxError("a transpose that moves the batch axis")
            new = tuple(a - 1 for a in axes[1:])
            return call.with_changes(args=[new_args[0], new_args[1].with_changes(
                value=cst.parse_expression(repr(new)))]), Info(True, len(new))
        if name == "jax.lax.collapse" and first.batched:
            return self.collapse(node, new_args, first)
        raise EquinoxError(f"{name} on a batched value (its per-example form is not known)")

    def pad(self, node: cst.Call) -> tuple[cst.BaseExpression, Info] | None:
        """``jnp.pad(x, widths)`` of a batched x, one pair per axis: per example without the
        batch axis's pair. The NNX pass writes ``[(0, 0), (0, 0), (a, b), ...]``, or
        ``[(0, 0)] * (x.ndim - k) + [(a, b), ...]`` where x's rank is not known (k pairs for the
        last k axes, whatever the rank: the same per example). None: x is not batched."""
        if len(node.args) < 2 or any(a.star for a in node.args[:2]) or \
                node.args[1].keyword is not None or not isinstance(node.args[0].value, cst.Name):
            return None
        x, info = self.ev(node.args[0].value)
        if not info.batched:
            return None
        widths = node.args[1].value
        zero = m.Tuple(elements=[m.Element(m.Integer("0")), m.Element(m.Integer("0"))])
        name = node.args[0].value.value
        if m.matches(widths, m.BinaryOperation(
                left=m.BinaryOperation(left=m.List(elements=[m.Element(zero)]),
                                       operator=m.Multiply(),
                                       right=m.BinaryOperation(
                                           left=m.Attribute(value=m.Name(name),
                                                            attr=m.Name("ndim")),
                                           operator=m.Subtract(), right=m.Integer())),
                operator=m.Add(), right=m.List())):
            if int_value(widths.left.right.right) != len(widths.right.elements):
                raise EquinoxError("jnp.pad of a batched value with widths in an unknown form")
            pairs = widths.right
            new = widths
        elif isinstance(widths, (cst.List, cst.Tuple)) and len(widths.elements) >= 2 and \
                not any(isinstance(e, cst.StarredElement) for e in widths.elements):
            if not m.matches(widths.elements[0].value, zero):
                raise EquinoxError("jnp.pad that pads the batch axis")
            pairs = widths.with_changes(elements=widths.elements[1:])
            new = pairs
            if info.rank is None:
                self._fix_input_rank(node.args[0].value, len(pairs.elements))
        else:
            raise EquinoxError("jnp.pad of a batched value with widths in an unknown form")
        for n in findall(pairs, m.Name()):
            if self.env.get(n.value, Info()).batched:
                raise EquinoxError("jnp.pad widths computed from a batched value")
        rest = [a.with_changes(value=self.ev_unbatched(a.value)) for a in node.args[2:]]
        return node.with_changes(args=[node.args[0].with_changes(value=x),
                                       node.args[1].with_changes(value=new), *rest]), \
            Info(True, info.rank, channels_last=info.channels_last)

    def pool(self, node: cst.Call, x: cst.BaseExpression, info: Info, name: str
             ) -> tuple[cst.BaseExpression, Info] | None:
        """``nnx.max_pool(x, window_shape=W, strides=S)`` (F.max_pool2d between the NNX pass's
        moves to channels-last and back, which this pass drops: ``x`` is channel-first per
        example) -> ``eqx.nn.MaxPool2d(kernel_size=W, stride=S)(x)``. None: another form."""
        kw = {a.keyword.value: a.value for a in node.args[1:] if a.keyword is not None}
        if len(node.args) - 1 != len(kw) or set(kw) - {"window_shape", "strides", "padding"}:
            return None
        window = try_literal(kw.get("window_shape"), None)
        strides = try_literal(kw["strides"], None) if "strides" in kw else window
        padding = try_literal(kw.get("padding", cst.SimpleString('"VALID"')), None)
        if not isinstance(window, tuple) or not 1 <= len(window) <= 3 or \
                not isinstance(strides, tuple) or padding != "VALID":
            return None
        which = "Max" if name == "nnx.max_pool" else "Avg"
        layer = f"eqx.nn.{which}Pool{len(window)}d(kernel_size={window!r}, stride={strides!r})"
        return expr(layer + "({x})", x=x), info

    def collapse(self, node: cst.Call, args: list[cst.Arg], first: Info
                 ) -> tuple[cst.BaseExpression, Info]:
        """``jax.lax.collapse(x, 1)`` (torch.flatten(x, 1)) of a batched x: ``jnp.ravel(x)`` per
        example; other literal axes move down by one."""
        bounds = [try_literal(a.value, None) for a in node.args[1:3]]
        if not bounds or not all(isinstance(b, int) and b >= 1 for b in bounds):
            raise EquinoxError("jax.lax.collapse of the batch axis (or of computed axes)")
        if len(bounds) == 1 and bounds[0] == 1:
            return expr("jnp.ravel({x})", x=args[0].value), Info(True, 1)
        shifted = [args[0], *(a.with_changes(value=cst.Integer(str(b - 1)))
                              for a, b in zip(args[1:3], bounds))]
        rank = None if first.rank is None or len(bounds) == 1 else \
            first.rank - 1 - (bounds[1] - bounds[0]) + 1
        return expr("jax.lax.collapse({x})", x=args[0].value).with_changes(args=shifted), \
            Info(True, rank)

    def ev_info(self, node: cst.BaseExpression) -> Info | None:
        try:
            return self.ev(node)[1]
        except EquinoxError:
            return None

    def ev_unbatched(self, node: cst.BaseExpression) -> cst.BaseExpression:
        new, info = self.ev(node)
        if info.batched:
            raise EquinoxError("a batched value as an argument")
        return new

    def shift_axes(self, node: cst.Call, kw_axes: tuple[str, ...], pos_axes: tuple[int, ...]
                   ) -> list[cst.Arg]:
        out = []
        pos_i = -1
        for a in node.args:
            if a.keyword is None:
                pos_i += 1
            target = (a.keyword is not None and a.keyword.value in kw_axes) or (
                a.keyword is None and pos_i in pos_axes)
            if target:
                a = a.with_changes(value=_shift(a.value))
            out.append(a)
        return out

    def reshape(self, node: cst.Call, recv: cst.BaseExpression, info: Info
                ) -> tuple[cst.BaseExpression, Info]:
        args = list(node.args)
        if len(args) == 1 and isinstance(args[0].value, cst.Tuple):
            els = [e.value for e in args[0].value.elements]
        else:
            els = [a.value for a in args]
        if not els:
            raise EquinoxError("reshape without a shape")
        _, first = self.ev(els[0])
        if try_literal(els[0], None) == -1 and not info.merged:
            # logits.reshape(-1, V) before a loss over every row: per example its own rows
            rest = [self.ev_unbatched(e) for e in els[1:]]
            new = cst.Call(cst.Attribute(recv, cst.Name("reshape")),
                           [cst.Arg(cst.parse_expression("-1")), *[cst.Arg(v) for v in rest]])
            return _fix_commas(new), Info(True, None, merged=True)
        if first.kind != "batch_size":
            raise EquinoxError("a reshape whose first size is not the batch size")
        rest = []
        for e in els[1:]:
            v, i = self.ev(e)
            if i.batched or i.kind == "batch_size":
                raise EquinoxError("the batch size inside a reshape")
            rest.append(v)
        if not rest:
            raise EquinoxError("a reshape to the batch size alone")
        new = cst.Call(cst.Attribute(recv, cst.Name("reshape")), [cst.Arg(v) for v in rest])
        return _fix_commas(new), Info(True, len(rest))

    # --- statements
    def block(self, stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def stmt(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        try:
            return self._stmt(s)
        except EquinoxError as exc:
            self.hoisted = []
            return [_todo(s, exc.message)]

    def _stmt(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        if isinstance(s, cst.SimpleStatementLine):
            if len(s.body) != 1:
                raise EquinoxError("several statements on one line")
            small = s.body[0]
            if isinstance(small, cst.Expr) and isinstance(small.value, (
                    cst.SimpleString, cst.ConcatenatedString)):
                return [s]
            if isinstance(small, (cst.Pass, cst.Assert)):
                if isinstance(small, cst.Assert):
                    for n in findall(small, m.Name()):
                        if self.env.get(n.value, Info()).batched:
                            raise EquinoxError("an assert on a batched value")
                return [s]
            if isinstance(small, cst.Return):
                if small.value is None:
                    raise EquinoxError("a forward pass that returns nothing")
                v, info = self.ev(small.value)
                self.returns.append(info)
                outs = small.value.elements if isinstance(small.value, cst.Tuple) else ()
                for i, e in enumerate(outs):
                    kind = self.env.get(e.value.value, Info()).kind if isinstance(
                        e.value, cst.Name) else ""
                    if kind in ("batch_mean", "batch_sum"):
                        self.reduced[i] = kind[len("batch_"):]
                if info.merged or info.kind in ("batch_mean", "batch_sum") and not outs:
                    raise EquinoxError("a forward pass that returns a batch loss alone")
                new = small.with_changes(value=v)
                if self.owner.stateful:
                    new = small.with_changes(value=cst.Tuple([cst.Element(v), cst.Element(
                        cst.Name("state"))], lpar=[], rpar=[]))
                return self._flush(s.with_changes(body=[new]))
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                return self.assign(s, small)
            if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                left, li = self.ev(small.target)
                right, ri = self.ev(small.value)
                _, _, info = self.broadcast(left, li, right, ri, False)
                self.env[small.target.value] = info
                return self._flush(s.with_changes(body=[small.with_changes(value=right)]))
            if isinstance(small, cst.Expr):
                v, info = self.ev(small.value)
                return self._flush(s.with_changes(body=[small.with_changes(value=v)]))
            raise EquinoxError(f"{type(small).__name__} in a forward pass")
        if isinstance(s, cst.For):
            return self.for_loop(s)
        if isinstance(s, cst.If):
            test, info = self.ev(s.test)
            if info.batched:
                raise EquinoxError("a branch on a batched value")
            body = self.block(list(s.body.body))
            orelse = s.orelse
            if isinstance(orelse, cst.Else):
                orelse = orelse.with_changes(body=orelse.body.with_changes(
                    body=self.block(list(orelse.body.body))))
            elif orelse is not None:
                raise EquinoxError("elif in a forward pass")
            return self._flush(s.with_changes(test=test, body=s.body.with_changes(body=body),
                                              orelse=orelse))
        raise EquinoxError(f"{type(s).__name__} in a forward pass")

    def _flush(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        hoisted, self.hoisted = self.hoisted, []
        return [*hoisted, s]

    def assign(self, s: cst.SimpleStatementLine, small: cst.Assign) -> list[cst.BaseStatement]:
        target = small.targets[0].target
        value, info = self.ev(small.value)
        if isinstance(target, cst.Tuple):
            names = [e.value for e in target.elements]
            if info.kind == "shape":
                if not all(isinstance(n, cst.Name) for n in names):
                    raise EquinoxError("unpacking a shape into something other than names")
                infos = [Info(rank=0) for _ in names]
                if info.batched:
                    infos[0] = Info(kind="batch_size")
                    kept = names[1:]
                    if not kept:
                        raise EquinoxError("unpacking only the batch size")
                    for n, i in zip(names, infos, strict=True):
                        self.env[n.value] = i
                    if info.rank is None:
                        # the rank of one example is now known from the unpacking
                        self._set_rank(small.value, len(kept))
                    if len(kept) == 1:
                        new = small.with_changes(targets=[small.targets[0].with_changes(
                            target=kept[0])], value=cst.Subscript(value, [
                                cst.SubscriptElement(cst.Index(cst.Integer("0")))]))
                    else:
                        new = small.with_changes(targets=[small.targets[0].with_changes(
                            target=target.with_changes(elements=[
                                e for e in target.elements[1:]]))], value=value)
                        els = list(new.targets[0].target.elements)
                        els[-1] = els[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                        new = new.with_changes(targets=[new.targets[0].with_changes(
                            target=new.targets[0].target.with_changes(elements=els))])
                    return self._flush(s.with_changes(body=[new]))
                for n, i in zip(names, infos, strict=True):
                    self.env[n.value] = i
                return self._flush(s.with_changes(body=[small.with_changes(value=value)]))
            self.unpack(target, info)
            return self._flush(s.with_changes(body=[small.with_changes(value=value)]))
        if not isinstance(target, cst.Name):
            raise EquinoxError("assigning to something other than a name")
        self.env[target.value] = info
        new = small.with_changes(value=value)
        chain = self._chain(value, target.value)
        if chain:
            # x = bn(conv(x)) -> x, state = bn(conv(x), state); a Sequential of modules,
            # unrolled: x, state = self.layer1[0](x, state); x, state = self.layer1[1](...)
            names = dict.fromkeys(chain, target.value)
            done = [_rename_stmt(h, names) for h in self.hoisted[-len(chain):]]
            del self.hoisted[-len(chain):]
            if not isinstance(value, cst.Name):  # x = f(__out__): x = f(x)
                done.append(_rename_stmt(s.with_changes(body=[new]), names))
            return [*self._flush(done[0]), *done[1:]]
        if isinstance(value, cst.Name) and self.hoisted and id(self.hoisted[-1]) in self.loops:
            # x = self.layer1(x): the loop over its layers rebinds x itself
            return self._loop_into(s.with_changes(body=[new]), value.value, target.value)
        if self.hoisted and len(self.hoisted) == 1:
            tmp = code(self.hoisted[0]).split(",")[0].strip()
            rest_names = {n.value for n in findall(value, m.Name())}
            if target.value not in rest_names:
                h = self.hoisted.pop()
                return [_rename_stmt(h, {tmp: target.value}),
                        _rename_stmt(s.with_changes(body=[new]), {tmp: target.value})]
        return self._flush(s.with_changes(body=[new]))

    def _loop_into(self, s: cst.SimpleStatementLine, tmp: str, target: str
                   ) -> list[cst.BaseStatement]:
        """The temporary of a loop of :meth:`loop_over` named ``target``, where ``target``
        is not read from where the temporary is set on: ``x = x`` goes."""
        at = next(i for i, h in enumerate(self.hoisted) if code(h).startswith((
            tmp + ",", tmp + " =")))
        later = {n.value for h in self.hoisted[at + 1:] for n in findall(h, m.Name())}
        if target in later:
            return self._flush(s)
        done = []
        for h in self.hoisted:
            h = _rename_stmt(h, {tmp: target})
            if not m.matches(h, m.SimpleStatementLine(body=[m.Assign(
                    targets=[m.AssignTarget(m.Name(target))], value=m.Name(target))])):
                done.append(h)
        self.hoisted = []
        return done

    def _chain(self, value: cst.BaseExpression, target: str) -> list[str]:
        """The temporaries of the last hoisted statements when they form one chain ending in
        ``value``, each statement reading the one before it and no other temporary, cut
        where a statement reads ``target``: they can all be named ``target``."""
        chain: list[str] = []
        names = {n.value for n in findall(value, m.Name())} | (
            {value.value} if isinstance(value, cst.Name) else set())
        temps = [n for n in names if n.startswith("__out")]
        if target in names or len(temps) != 1:
            return []
        name = temps[0]
        for h in reversed(self.hoisted):
            if not name.startswith("__out") or not code(h).startswith((name + ",",
                                                                       name + " =")):
                break
            chain.append(name)
            reads = {n.value for n in findall(h.body[0].value, m.Name())}
            temps = {n for n in reads if n.startswith("__out")}
            if target in reads or len(temps) != 1:
                break
            name = temps.pop()
        return chain[::-1]

    def unpack(self, target: cst.Tuple, info: Info) -> None:
        """``a, (b, c) = value``: each name gets its element's info when the tuple's elements
        are known (a layer's outputs), else the tuple's (``q, k, v = split(...)``)."""
        names = [e.value for e in target.elements]
        known = len(info.elements) == len(names)
        for i, n in enumerate(names):
            part = info.elements[i] if known else replace(info, kind="value", elements=())
            if isinstance(n, cst.Tuple):
                self.unpack(n, part)
            elif isinstance(n, cst.Name):
                self.env[n.value] = part
            else:
                raise EquinoxError("unpacking into something other than names")

    def _set_rank(self, shape_expr: cst.BaseExpression, rank: int) -> None:
        if isinstance(shape_expr, cst.Attribute) and isinstance(shape_expr.value, cst.Name):
            name = shape_expr.value.value
            if name in self.env:
                self.env[name] = replace(self.env[name], rank=rank)

    def dict_loop(self, s: cst.For) -> list[cst.BaseStatement] | None:
        """``for name, layer in self.heads.items():`` (or ``.values()``) over a ModuleDict of
        layers of one kind: a loop over its keys in torch's order, written out, since jax
        rebuilds a dict attribute with its keys sorted."""
        if not m.matches(s.iter, m.Call(func=m.Attribute(attr=m.Name("items") | m.Name(
                "values")), args=[])):
            return None
        base, lay = self.resolve(s.iter.func.value)
        if lay is None or lay.kind != "dict":
            return None
        items = list(lay.items.values())
        if not items or len({(p.kind, p.cls, p.stateful, p.keyed) for p in items}) != 1:
            raise EquinoxError("a loop over a ModuleDict whose layers are not all of one kind")
        if s.iter.func.attr.value == "items":
            if not m.matches(s.target, m.Tuple([m.Element(m.Name()), m.Element(m.Name())])):
                raise EquinoxError("a loop over ModuleDict.items() not unpacked into two names")
            key, layer = (e.value.value for e in s.target.elements)
        elif isinstance(s.target, cst.Name):
            key, layer = f"{s.target.value}_key", s.target.value
        else:
            raise EquinoxError("a loop over ModuleDict.values() not bound to one name")
        keys = "(" + ", ".join(f'"{k}"' for k in lay.items) + ("," if len(lay.items) == 1
                                                              else "") + ")"
        kind = f"layer:{layer}"
        self.loop_layers = {**self.loop_layers, kind: items[0]}
        self.env[layer] = Info(kind=kind)
        self.env[key] = Info()
        self.loop_depth += 1
        body = self.block(list(s.body.body))
        self.loop_depth -= 1
        bind = cst.parse_statement(f"{layer} = {code(base)}[{key}]\n")
        return [s.with_changes(target=cst.Name(key), iter=cst.parse_expression(keys),
                               body=s.body.with_changes(body=[bind, *body]))]

    def for_loop(self, s: cst.For) -> list[cst.BaseStatement]:
        done = self.dict_loop(s)
        if done is not None:
            return done
        it, lay = self.resolve(s.iter)
        if lay is None or lay.kind != "list" or not isinstance(s.target, cst.Name):
            _, info = self.ev(s.iter)
            if info.batched:
                raise EquinoxError("a loop over a batched value")
            self.loop_depth += 1
            body = self.block(list(s.body.body))
            self.loop_depth -= 1
            return [s.with_changes(body=s.body.with_changes(body=body))]
        element = lay.items.get("*") or next(iter(lay.items.values()), None)
        if element is None:
            raise EquinoxError("a loop over a list of unknown layers")
        kind = f"layer:{s.target.value}"
        self.loop_layers = {**self.loop_layers, kind: element}
        self.env[s.target.value] = Info(kind=kind)
        self.loop_depth += 1
        body = self.block(list(s.body.body))
        self.loop_depth -= 1
        return [s.with_changes(iter=it, body=s.body.with_changes(body=body))]


def _is_library(func: cst.BaseExpression) -> bool:
    """``jnp.x`` / ``jax.nn.x`` / ``math.x``: a function of a library, not a method."""
    while isinstance(func, cst.Attribute):
        func = func.value
    return isinstance(func, cst.Name) and func.value in ("jnp", "jax", "math", "np", "eqx",
                                                           "optax")


def _kwarg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value, keyword=cst.Name(name), equal=cst.AssignEqual(
        cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _fix_commas(call: cst.Call) -> cst.Call:
    args = list(call.args)
    for i, a in enumerate(args):
        args[i] = a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                                 if i < len(args) - 1 else cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=args)


def _shift(node: cst.BaseExpression) -> cst.BaseExpression:
    """An axis of a batched value -> the same axis of one example."""
    value = try_literal(node, None)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            raise EquinoxError("an operation over the batch axis (axis 0)")
        return cst.parse_expression(repr(value - 1 if value > 0 else value))
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        if 0 in value:
            raise EquinoxError("an operation over the batch axis (axis 0)")
        return cst.parse_expression(repr(tuple(v - 1 if v > 0 else v for v in value)))
    raise EquinoxError(f"a computed axis ({code(node)}) of a batched value")


def _reduced_rank(node: cst.Call, rank: int | None, axis_pos: int) -> int | None:
    """The per-example rank after a reduction of a batched value (``x.mean(axis=(2, 3))``,
    ``jnp.sum(x, 1)``): one less per literal axis, unchanged with ``keepdims=True``; None
    where not known. Without an axis the reduction takes the batch axis too: refused."""
    kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    pos = [a.value for a in node.args if a.keyword is None]
    axis = kw.get("axis", pos[axis_pos] if len(pos) > axis_pos else None)
    if axis is None or m.matches(axis, m.Name("None")):
        raise EquinoxError("a reduction over every axis of a batched value (the batch "
                           "included)")
    keep = try_literal(kw["keepdims"], None) if "keepdims" in kw else False
    if keep is None or rank is None:
        return None
    if keep:
        return rank
    axes = try_literal(axis, None)
    n = 1 if isinstance(axes, int) else len(axes) if isinstance(axes, tuple) else None
    return rank - n if n is not None else None


def _drop_lead(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, cst.Comparison) and isinstance(node.left, cst.Subscript) and all(
            isinstance(try_literal(c.comparator, None), (int, float)) for c in node.comparisons):
        return node.with_changes(left=_drop_lead(node.left))
    if isinstance(node, cst.Subscript):
        first = node.slice[0].slice
        if isinstance(first, cst.Slice) and first.lower is None and first.upper is None:
            return node.with_changes(slice=[node.slice[0].with_changes(
                slice=cst.Index(cst.Integer("0"))), *node.slice[1:]])
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Subscript(node, [cst.SubscriptElement(cst.Index(cst.Integer("0")))])


def _keeps_lead(elements) -> bool:
    first = elements[0].slice
    return isinstance(first, cst.Slice) and first.lower is None and first.upper is None


def _reshape_rank(node: cst.Call) -> int | None:
    if len(node.args) == 1 and isinstance(node.args[0].value, cst.Tuple):
        return len(node.args[0].value.elements)
    return len(node.args) or None


# ---------------------------------------------------------------------------- classes
@dataclass
class ClassInfo:
    name: str
    node: cst.ClassDef
    attrs: dict[str, Layer] = field(default_factory=dict)
    stateful: bool = False
    keyed: bool = False
    inputs: list[Info] | None = None  # per-example description of __call__'s arguments
    output: Info | None = None
    new_call: cst.FunctionDef | None = None
    errors: list[str] = field(default_factory=list)
    lambdas: dict[str, cst.Lambda] = field(default_factory=dict)  # per-example forms
    init_methods: set[str] = field(default_factory=set)  # applied by init_layers
    reduced: dict[int, str] = field(default_factory=dict)  # see Forward.reduced
    identities: set[str] = field(default_factory=set)  # see _InitRewriter.identities
    # builder methods (``*, rngs`` in NNX, called as ``self.name(...)`` in ``__init__``),
    # rewritten like ``__init__``
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    # inputs of __call__ whose per-example rank no line states, taken from the first layer
    # applied to them: (parameter, rank, layer kind)
    assumed: list[tuple[str, int, str]] = field(default_factory=list)


def _is_module_class(cls: cst.ClassDef, classes: set[str]) -> bool:
    return any(code(b.value) in ("nnx.Module", *classes) for b in cls.bases)


def _init_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for s in cls.body.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == name:
            return s
    return None


def _bind(params: list[cst.Param], call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """The argument each parameter takes at ``call`` (its default where none is given);
    None where the call unpacks arguments."""
    if any(a.star for a in call.args):
        return None
    pos, kw = _pos(call), _kw(call)
    out = {}
    for i, p in enumerate(params):
        name = p.name.value
        if i < len(pos):
            out[name] = pos[i]
        elif name in kw:
            out[name] = kw[name]
        elif p.default is not None:
            out[name] = p.default
    return out


def _passed_classes(sites: list[cst.Call], params: list[cst.Param], classes: set[str],
                    what: str, known: dict[str, tuple[str, ...] | str] | None = None
                    ) -> dict[str, tuple[str, ...] | str]:
    """For each parameter: the module classes of the file that ``sites`` (the calls that
    build ``what``) pass to it, first seen first, or why they are not known (a call passes
    something else, or nothing builds ``what``). ``known``: what the caller's own
    parameters are bound to (``self._make_layer(block, ...)`` in ``__init__``)."""
    out: dict[str, tuple[str, ...] | str] = {}
    for p in params:
        name = p.name.value
        found: list[str] = []
        why = "" if sites else f"the class `{name}` is not known: nothing in this file " \
            f"builds {what}"
        for call in sites:
            bound = _bind(params, call)
            arg = bound.get(name) if bound is not None else None
            got = known.get(arg.value) if known and isinstance(arg, cst.Name) else None
            if isinstance(got, str):
                why = got
            elif got is not None:
                found += got
            elif isinstance(arg, cst.Name) and arg.value in classes:
                found.append(arg.value)
            else:
                why = f"the class `{name}` is not known: {what} is built with " + (
                    f"`{code(arg)}` for it" if arg is not None else "arguments unpacked") + \
                    ", not a module class of this file"
            if why:
                break
        out[name] = why or tuple(dict.fromkeys(found))
    return out


def _key_param(fn: cst.FunctionDef, default_none: bool) -> cst.FunctionDef:
    """``*, rngs: nnx.Rngs`` -> ``*, key`` (``key=None`` for ``__call__``)."""
    params = fn.params
    kw = [p for p in params.kwonly_params if p.name.value != "rngs"]
    key = cst.Param(cst.Name("key"), default=cst.Name("None") if default_none else None,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
                    if default_none else cst.MaybeSentinel.DEFAULT)
    star = params.star_arg
    if not isinstance(star, cst.Param):
        star = cst.ParamStar()
    plain = list(params.params)
    if plain:
        plain[-1] = plain[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
            " ")))
    kw = [p.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
          for p in kw]
    return fn.with_changes(params=params.with_changes(params=plain, star_arg=star,
                                                      kwonly_params=[*kw, key]))


class EquinoxFile:
    def __init__(self, module: cst.Module, torch_module: cst.Module,
                 per_example: Collection[str] = ()) -> None:
        self.module = module
        self.torch_module = torch_module
        self.per_example = {_squeeze(c) for c in per_example}
        self.errors: list[str] = []
        names = {c.name.value for c in module.body if isinstance(c, cst.ClassDef)}
        found: set[str] = set()
        changed = True
        while changed:  # subclasses of converted module classes are module classes too
            changed = False
            for c in module.body:
                if isinstance(c, cst.ClassDef) and c.name.value not in found and \
                        _is_module_class(c, found):
                    found.add(c.name.value)
                    changed = True
        self.class_names = found
        self.classes: dict[str, ClassInfo] = {}
        self.dataclass_fields = _dataclass_fields(module)
        self.needs: set[str] = set()
        self.builders: dict[str, tuple[cst.FunctionDef, Layer]] = {}
        del names

    # -- phase 1: constructors
    def init(self, cls: cst.ClassDef) -> ClassInfo:
        # torch's self.training: NNX keeps a `deterministic` attribute flipped by .eval();
        # equinox's is an `inference` field, which eqx.nn.inference_mode sets
        cls = cls.visit(_Inference())
        info = ClassInfo(cls.name.value, cls)
        init = _init_of(cls, "__init__")
        if init is None:
            return info
        builders = {k: v[1] for k, v in self.builders.items()}
        sites = findall(self.torch_module, m.Call(func=m.Name(info.name)))
        passed = _passed_classes(sites, list(init.params.params[1:]), self.class_names,
                                 info.name)
        methods, method_attrs = self.builder_methods(info, init, passed)
        rw = _InitRewriter(self.class_names, set(), builders, methods, passed,
                           self.per_example)
        new_init = init.visit(rw)
        info.attrs = rw.attrs
        for k, v in method_attrs.items():  # `self.in_planes = ...` in a builder method
            info.attrs.setdefault(k, v)
        info.identities = rw.identities
        info.errors += rw.errors
        # buffers: rank and a leading 1 from `.reshape(1, ...)`
        for s in init.body.body:
            for a in findall(s, m.Assign(targets=[m.AssignTarget(m.Attribute(
                    value=m.Name("self")))])):
                name = a.targets[0].target.attr.value
                lay = info.attrs.get(name)
                if lay is None or lay.kind != "buffer":
                    continue
                v = a.value.args[0].value if isinstance(a.value, cst.Call) and a.value.args \
                    else a.value
                if m.matches(v, m.Call(func=m.Attribute(attr=m.Name("reshape")))):
                    lay.rank = _reshape_rank(v)
                    lay.lead_one = int_value(v.args[0].value) == 1
        info.node = cls.with_changes(body=cls.body.with_changes(body=[
            new_init if s is init else s for s in cls.body.body]))
        info.init_sites = rw.sites  # type: ignore[attr-defined]
        return info

    def builder_methods(self, info: ClassInfo, init: cst.FunctionDef,
                        passed: dict[str, tuple[str, ...] | str]
                        ) -> tuple[dict[str, Layer], dict[str, Layer]]:
        """The methods that build layers (``*, rngs`` in NNX) and that ``__init__`` calls as
        ``self.name(...)``, rewritten like a builder function (``*, key``) into
        ``info.methods``: the layer each returns, and the attributes they set. A class
        handed to a method (``block``) is the one the instantiation sites of the class
        pass (:func:`_passed_classes`)."""
        builders = {k: v[1] for k, v in self.builders.items()}
        methods: dict[str, Layer] = {}
        attrs: dict[str, Layer] = {}
        for s in info.node.body.body:
            if not isinstance(s, cst.FunctionDef) or s.name.value in ("__init__", "__call__") \
                    or not any(p.name.value == "rngs" for p in s.params.kwonly_params):
                continue
            name = s.name.value
            sites = findall(init, m.Call(func=m.Attribute(value=m.Name("self"),
                                                              attr=m.Name(name))))
            if not sites:
                continue
            rw = _InitRewriter(self.class_names, set(), builders, methods, _passed_classes(
                sites, list(s.params.params[1:]), self.class_names, f"self.{name}", passed),
                self.per_example)
            new = s.visit(rw)
            if "nnx." in code(new.body) or "rngs" in code(new.body):
                continue  # (marked where the class is written)
            try:
                body = _split_keys(list(new.body.body), rw.sites)
            except EquinoxError as exc:
                info.errors.append(exc.message)
                continue
            info.errors += rw.errors
            info.methods[name] = _key_param(new, default_none=False).with_changes(
                body=new.body.with_changes(body=body))
            methods[name] = rw.returned or Layer("value")
            for k, v in rw.attrs.items():
                attrs.setdefault(k, v)
        return methods, attrs

    def analyse(self, name: str, inputs: list[Info]) -> Info | None:
        info = self.classes[name]
        if info.inputs is not None:
            if [(i.batched, i.rank) for i in info.inputs] != [(i.batched, i.rank)
                                                              for i in inputs]:
                info.errors.append(f"{name} is called with inputs of different ranks; its "
                                   "per-example code follows the first call")
            return info.output
        info.inputs = inputs
        self.forward(info)
        return info.output

    def forward(self, info: ClassInfo) -> None:
        fn = _init_of(info.node, "__call__")
        if fn is None:
            return
        fw = Forward(info, self.classes, self.analyse)
        params = [p for p in fn.params.params[1:]]
        for p, i in zip(params, info.inputs or [Info(True)] * len(params), strict=False):
            fw.env[p.name.value] = replace(i)
        for p in params[len(info.inputs or params):]:
            fw.env[p.name.value] = Info(True)
        body = fw.block(list(fn.body.body))
        if info.inputs is not None:
            # a model input whose rank a layer decided (channel-first conv: 3): later calls
            # compare with it (a U-Net's block called on the input, then on pooled values)
            info.inputs = [replace(i, rank=fw.env[p.name.value].rank) if i.is_input and
                           i.rank is None and p.name.value in fw.env and
                           fw.env[p.name.value].is_input else i
                           for p, i in zip(params, info.inputs, strict=False)]
        info.output = fw.returns[0] if fw.returns else None
        info.reduced = fw.reduced
        # keys: one site takes `key`; several are split up front (None stays None)
        body = _name_call_keys(body, fw.key_sites)
        new = fn.with_changes(body=fn.body.with_changes(body=body))
        new = _name_temporaries(new)
        if info.stateful:
            plist = list(new.params.params)
            plist.append(cst.Param(cst.Name("state")))
            plist = [p.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                     for p in plist[:-1]] + [plist[-1]]
            new = new.with_changes(params=new.params.with_changes(params=plist))
        if info.keyed:
            new = _key_param(new, default_none=True)
        info.new_call = new


def _name_temporaries(fn: cst.FunctionDef) -> cst.FunctionDef:
    """``__out3__, state = self.downsample(x, state)`` -> ``downsample_out, state = ...``: the
    temporaries of stateful calls named after the layer called, clear of the function's
    names."""
    taken = {n.value for n in findall(fn, m.Name())}
    names: dict[str, str] = {}
    for a in findall(fn, m.Assign()):
        t = a.targets[0].target
        first = t.elements[0].value if isinstance(t, cst.Tuple) else t
        if not (isinstance(first, cst.Name) and first.value.startswith("__out")):
            continue
        func = a.value.func if isinstance(a.value, cst.Call) else None
        while isinstance(func, cst.Subscript):
            func = func.value
        base = f"{func.attr.value}_out" if isinstance(func, cst.Attribute) else "out"
        name, i = base, 1
        while name in taken:
            i += 1
            name = f"{base}{i}"
        taken.add(name)
        names[first.value] = name
    return fn.visit(_Rename(names)) if names else fn


def _name_call_keys(body: list[cst.BaseStatement], sites: list[str]) -> list[cst.BaseStatement]:
    if not sites:
        return body
    top = [s for s in sites if not s.endswith("loop")]
    loops = [s for s in sites if s.endswith("loop")]
    names: dict[str, str] = {}
    mod = cst.Module(body=body)
    header: list[cst.BaseStatement] = []
    outer = top + (["__loopkey__"] if loops else [])
    if len(outer) == 1:
        names[outer[0]] = "key"
    else:
        for i, s in enumerate(outer):
            names[s] = f"key{i + 1}"
        nones = ", ".join(["None"] * len(outer))
        header.append(cst.parse_statement(
            f"{', '.join(names[s] for s in outer)} = ({nones}) if key is None else "
            f"jax.random.split(key, {len(outer)})\n"))
    if loops:
        lk = names["__loopkey__"]
        sub = ["subkey"] if len(loops) == 1 else [f"subkey{i + 1}" for i in range(len(loops))]
        for s, n in zip(loops, sub, strict=True):
            names[s] = n
        nones = ", ".join(["None"] * (len(loops) + 1))
        split = cst.parse_statement(
            f"{lk}, {', '.join(sub)} = ({nones}) if {lk} is None else "
            f"jax.random.split({lk}{'' if len(loops) == 1 else f', {len(loops) + 1}'})\n")
        mod = mod.visit(_LoopSplit(set(loops), split))
    mod = mod.visit(_Rename(names))
    out = list(mod.body)
    at = _after_docstring(out)
    return [*out[:at], *header, *out[at:]]


class _LoopSplit(cst.CSTTransformer):
    """The first line of a loop whose body uses loop keys splits them off."""

    def __init__(self, placeholders: set[str], split: cst.BaseStatement) -> None:
        super().__init__()
        self.placeholders = placeholders
        self.split = split

    def leave_For(self, original_node, updated_node):
        text = code(updated_node.body)
        if any(p in text for p in self.placeholders):
            return updated_node.with_changes(body=updated_node.body.with_changes(
                body=[self.split, *updated_node.body.body]))
        return updated_node


def _keys_needed(classes: dict[str, ClassInfo]) -> None:
    changed = True
    for c in classes.values():
        c.stateful = any(a.stateful or a.kind == "bn" for a in _all_layers(c))
        c.keyed = any(a.keyed or a.kind == "dropout" for a in _all_layers(c))
    while changed:
        changed = False
        for c in classes.values():
            for a in _all_layers(c):
                for sub in (classes[n] for n in (a.cls, *a.alts)
                            if a.kind == "module" and n in classes):
                    if sub.stateful and not c.stateful:
                        c.stateful = changed = True
                    if sub.keyed and not c.keyed:
                        c.keyed = changed = True
    for c in classes.values():
        for a in _all_layers(c):
            takes = {(classes[n].stateful, classes[n].keyed) for n in (a.cls, *a.alts)
                     if n in classes}
            if a.alts and len(takes) > 1:
                c.errors.append(f"the classes passed in for one layer ({', '.join((a.cls, *a.alts))}"
                                ") differ in taking state or a key: the forward pass is "
                                "written for one")


def _takes(lay: Layer, classes: dict[str, ClassInfo]) -> tuple[bool, bool]:
    """Whether calling the layer takes ``state`` and whether it takes ``key``."""
    if lay.kind == "module" and lay.cls in classes:
        return classes[lay.cls].stateful, classes[lay.cls].keyed
    stateful, keyed = lay.stateful or lay.kind == "bn", lay.keyed or lay.kind == "dropout"
    for p in lay.items.values():
        s, k = _takes(p, classes)
        stateful, keyed = stateful or s, keyed or k
    return stateful, keyed


def _all_layers(c: ClassInfo):
    stack = list(c.attrs.values())
    while stack:
        a = stack.pop()
        yield a
        stack += list(a.items.values())


class _LayerDictToDict(cst.CSTTransformer):
    def leave_Name(self, original_node, updated_node):
        return expr("nnx.Dict") if updated_node.value == "LayerDict" else updated_node


# definitions the NNX pass wrote: they go
NNX_HELPER_CLASSES = ("LayerDict", "BatchNorm", "TorchGRUCell")


def _without_nnx_helpers(module: cst.Module) -> cst.Module:
    """The NNX pass's helper classes go: LayerDict (an nnx.Dict in insertion order) is read as
    the nnx.Dict this pass translates (into a dict); BatchNorm and TorchGRUCell calls stay, for the
    equinox helpers of those names that :func:`convert` writes in."""
    module = module.with_changes(body=[s for s in module.body if not (
        isinstance(s, cst.ClassDef) and s.name.value in NNX_HELPER_CLASSES)])
    return module.visit(_LayerDictToDict())


def convert(nnx_code: str, torch_source: str, per_example: Collection[str] = ()
            ) -> tuple[str, list[tuple[int, str]], list[tuple[str, str]]]:
    """NNX code -> equinox code. Returns the code, ``(line, message)`` of each TODO this
    pass added, and ``(class, message)`` of the input ranks it took from a first layer.
    ``per_example``: the code of the NNX pass's layers written for one example
    (ConversionResult.per_example)."""
    module = _without_nnx_helpers(cst.parse_module(nnx_code))
    torch_module = cst.parse_module(torch_source)
    f = EquinoxFile(module, torch_module, per_example)
    for s in module.body:
        if isinstance(s, cst.FunctionDef) and any(p.name.value == "rngs"
                                                  for p in s.params.kwonly_params):
            built = _builder(s, f)
            if built is not None:
                f.builders[s.name.value] = built
    for c in module.body:
        if isinstance(c, cst.ClassDef) and c.name.value in f.class_names:
            f.classes[c.name.value] = f.init(c)
    _keys_needed(f.classes)
    # the classes no other class uses are the models: their inputs are batched, rank unknown
    used = {n for c in f.classes.values() for a in _all_layers(c) if a.kind == "module"
            for n in (a.cls, *a.alts)}
    for name, c in f.classes.items():
        if name not in used:
            f.analyse(name, [Info(True, is_input=True) for _ in _call_params(c.node)])
    for name, c in f.classes.items():
        if c.inputs is None:
            f.analyse(name, [Info(True, is_input=True) for _ in _call_params(c.node)])
    body = []
    needs_callable = needs_any = False
    frozen = freezable_dataclasses(module) if _stores_objects(f) else set()
    torch_defs = {s.name.value: s for s in torch_module.body
                  if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
    # training code (optimizer, train and eval steps, loops): equinox_training.py
    rest = [s for s in module.body if not _is_import(s) and not isinstance(s, cst.ClassDef)
            and not (isinstance(s, cst.FunctionDef) and s.name.value in f.builders)]
    flags: dict[str, tuple[bool, bool] | None] = {n: (c.stateful, c.keyed)
                                                   for n, c in f.classes.items()}
    # classes imported from the other files: Class(..., rngs=nnx.Rngs(k)) -> Class(..., key=k)
    flags.update({n: None for n in _imported_names(module) if n not in flags})
    training.BATCH_REDUCED.clear()
    training.BATCH_REDUCED.update({n: c.reduced for n, c in f.classes.items()
                                   if n not in used and c.reduced})
    training.OPTIMIZER_METHODS.clear()
    training.LAYER_OF = _training_layer
    for n, c in f.classes.items():
        training.OPTIMIZER_METHODS[n] = {s.name.value for s in c.node.body.body if isinstance(
            s, cst.FunctionDef) and training.optimizer_method(s) is not None}
    translated = dict(zip(map(id, rest), training.translate(rest, flags), strict=True))
    for s in module.body:
        if isinstance(s, cst.ClassDef) and s.name.value in f.classes:
            new, callable_, any_ = _emit_class(f.classes[s.name.value], f)
            needs_callable |= callable_
            needs_any |= any_
            body.append(new)
        elif isinstance(s, cst.ClassDef) and s.name.value in frozen:
            body.append(freeze_dataclass(s))
        elif isinstance(s, cst.FunctionDef) and s.name.value in f.builders:
            body.append(f.builders[s.name.value][0])
        elif id(s) in translated:
            done = translated[id(s)]
            if isinstance(done, str):
                body.append(_torch_back(s, torch_defs, done))
            elif any("nnx." in code(n) or "rngs" in code(n) for n in done):
                body.append(_torch_back(s, torch_defs))
            else:
                body += done
        elif ("nnx." in code(s) or "rngs" in code(s)) and not _is_import(s):
            body.append(_torch_back(s, torch_defs))
        else:
            body.append(s)
    if training.INIT_FN in f.needs:
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef))
        body.insert(at, cst.parse_statement(training.INIT_SRC).with_changes(
            leading_lines=body[at].leading_lines))
        body[at + 1] = body[at + 1].with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)
    # nothing NNX is left: annotations naming NNX classes become Any, other leftovers are
    # commented out and marked
    guard = _NoNnx()
    body = [s if _is_import(s) else s.visit(guard) for s in body]
    needs_any |= guard.any
    module, _ = add_helpers(module.with_changes(body=body), "equinox")  # lstm_scan, BatchNorm
    module = _imports(module, needs_callable, needs_any)
    text = module.code
    todos = [(i + 1, line.split("TODO(torch2jax): ", 1)[1])
             for i, line in enumerate(text.splitlines())
             if f"[{RULE}]" in line and "# TODO(torch2jax): " in line]
    assumed = [(name, _assumed_ranks(name, c.assumed)) for name, c in f.classes.items()
               if name not in used and c.assumed]
    return text, todos, assumed


def _assumed_ranks(name: str, assumed: list[tuple[str, int, str]]) -> str:
    """The warning for a model whose input ranks were taken from its first layers."""
    ranks = {0: "a scalar (one index)", 1: "a vector"}
    params = ", ".join(p for p, _, _ in assumed)
    taken = ", ".join(ranks.get(r, f"of rank {r}") for _, r, _ in assumed)
    kinds = ", ".join(k for _, _, k in assumed)
    return (f"{name}({params}): no line states the shape of {params}; each example is taken "
            f"to be {taken}, as the first layer it meets ({kinds}) takes it, and the model "
            "maps over the batch axis only. For more axes per example (a (B, T) batch of "
            f"sequences) unpack its shape in forward (b, t = {assumed[0][0]}.size()) and "
            "convert again, or map the model over them with jax.vmap")


def _builder(fn: cst.FunctionDef, f: EquinoxFile) -> tuple[cst.FunctionDef, Layer] | None:
    """A function that builds layers (``*, rngs``): its layers in equinox, ``*, key``. None
    when anything NNX is left in it."""
    rw = _InitRewriter(f.class_names, set(), {k: v[1] for k, v in f.builders.items()},
                       per_example=f.per_example)
    new = fn.visit(rw)
    if rw.errors or "nnx." in code(new.body) or "rngs" in code(new.body):
        return None
    try:
        body = _split_keys(list(new.body.body), rw.sites)
    except EquinoxError:
        return None
    return _key_param(new, default_none=False).with_changes(body=new.body.with_changes(
        body=body)), rw.returned or Layer("value")


def _stores_objects(f: EquinoxFile) -> bool:
    """Whether a module keeps a constructor argument of unknown type (a config object)."""
    for c in f.classes.values():
        init = _init_of(c.node, "__init__")
        if init is None:
            continue
        params = {p.name.value for p in init.params.params[1:]}
        for a in findall(init, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self")))], value=m.Name())):
            if a.value.value in params and c.attrs.get(a.targets[0].target.attr.value,
                                                       Layer("value")).kind == "value":
                return True
    return False


def _training_layer(node: cst.Call) -> tuple[cst.BaseExpression, str] | str:
    """:func:`layer_of` for equinox_training (a layer built outside a module): the equinox
    constructor and the layer's kind, or why there is none."""
    try:
        new, lay = layer_of(node, set())
    except EquinoxError as exc:
        return exc.message
    return new, lay.kind


def _imported_names(module: cst.Module) -> set[str]:
    """The names ``from x import A [as B]`` statements of the module bind."""
    names = set()
    for s in module.body:
        if m.matches(s, m.SimpleStatementLine(body=[m.ImportFrom()])) and \
                not isinstance(s.body[0].names, cst.ImportStar):
            names |= {(a.asname.name if a.asname else a.name).value for a in s.body[0].names
                      if isinstance((a.asname.name if a.asname else a.name), cst.Name)}
    return names


def _is_import(s: cst.BaseStatement) -> bool:
    return m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))


def _torch_back(s: cst.BaseStatement, torch_defs: dict, why: str = "") -> cst.BaseStatement:
    """Training code this pass does not translate: the torch original, marked."""
    msg = (f"training code with no equinox translation: {why}" if why else
           "no equinox translation: a module class whose base class is not a module class "
           "of this file" if isinstance(s, cst.ClassDef) and _nnx_module_class(s) else
           "training code with no equinox translation: a class that is not a module (a "
           "trainer) holding NNX constructs this pass does not rewrite; the torch class"
           if isinstance(s, cst.ClassDef) else
           "training code with no equinox translation (NNX constructs this pass does not "
           "rewrite)")
    if isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value in torch_defs:
        return _todo(torch_defs[s.name.value], msg)
    return _todo(_comment_out(s), msg)


def _nnx_module_class(cls: cst.ClassDef) -> bool:
    """Whether the NNX translation made ``cls`` a module class (an ``nnx.Module`` base, or a
    constructor taking ``rngs``); a plain class (a trainer) is not one."""
    init = _init_of(cls, "__init__")
    return any(code(b.value) == "nnx.Module" for b in cls.bases) or (
        bool(cls.bases) and init is not None and any(
            p.name.value == "rngs" for p in (*init.params.params, *init.params.kwonly_params)))


def _comment_out(s: cst.BaseStatement) -> cst.BaseStatement:
    lines = cst.Module(body=[s]).code.rstrip("\n").splitlines()
    comments = [cst.EmptyLine(comment=cst.Comment("# " + ln if ln.strip() else "#"))
                for ln in lines]
    return cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=comments)


def _untranslated_init_line(s: cst.BaseStatement, rest: list[cst.BaseStatement],
                            torch_init: cst.FunctionDef | None) -> cst.BaseStatement:
    """A statement of ``__init__`` that this pass does not translate: shown as its NNX
    translation, commented out and marked; when a later statement reads a name it binds,
    torch's statement binding the same names is kept instead (marked), so that nothing is
    left unbound."""
    names = bound_names(s)
    read = {n.value for r in rest for n in findall(r, m.Name())} & names
    if read and torch_init is not None:
        same = [t for t in torch_init.body.body if bound_names(t) == names]
        if len(same) == 1:
            kept = same[0].with_changes(leading_lines=s.leading_lines)
            return _todo(kept, "no equinox translation yet: the torch statement is kept, as "
                         f"later lines read {', '.join(sorted(read))}")
    return _todo(_comment_out(s), "no equinox translation yet (shown as its NNX translation)")


def _call_params(cls: cst.ClassDef) -> list[cst.Param]:
    fn = _init_of(cls, "__call__")
    return list(fn.params.params[1:]) if fn is not None else []


def _emit_class(c: ClassInfo, f: EquinoxFile) -> tuple[cst.ClassDef, bool, bool]:
    cls = c.node
    for name in c.identities:
        stateful, keyed = _takes(c.attrs[name], f.classes)
        if stateful or keyed:
            cls = cls.visit(_Identity({name}, "eqx.nn.Sequential([])" if stateful
                                      else "eqx.nn.Identity()"))
    init = _init_of(cls, "__init__")
    torch_cls = next((t for t in f.torch_module.body if isinstance(t, cst.ClassDef)
                      and t.name.value == c.name), None)
    fields: list[cst.BaseStatement] = []
    needs_callable = needs_any = False
    body = list(cls.body.body)
    if init is not None:
        params = {p.name.value: p for p in init.params.params[1:]}
        seen: dict[str, list[tuple[str, bool]]] = {}
        for s in init.body.body:
            for a in findall(s, m.Assign(targets=[m.AssignTarget(m.Attribute(
                    value=m.Name("self")))])):
                name = a.targets[0].target.attr.value
                lay = c.attrs.get(name, Layer("value")) if name not in seen else Layer("value")
                seen.setdefault(name, []).append(_annotation(a.value, lay, params,
                                                             f.dataclass_fields))
        for fn in c.methods.values():  # attributes a builder method sets (and __init__ not)
            mparams = {p.name.value: p for p in fn.params.params[1:]}
            for a in findall(fn, m.Assign(targets=[m.AssignTarget(m.Attribute(
                    value=m.Name("self")))])):
                name = a.targets[0].target.attr.value
                if name not in seen:
                    seen[name] = [_annotation(a.value, c.attrs.get(name, Layer("value")),
                                              mparams, f.dataclass_fields)]
        for name, anns in seen.items():
            # assigned in several places with different types: Any
            ann, static = anns[0] if len(set(anns)) == 1 else ("Any", False)
            needs_callable |= ann == "Callable"
            needs_any |= ann == "Any"
            tail = " = eqx.field(static=True)" if static else ""
            fields.append(cst.parse_statement(f"{name}: {ann}{tail}\n"))
        # self.apply(self._init_weights): init_layers over the fields set before it
        methods = {s.name.value: s for s in cls.body.body if isinstance(s, cst.FunctionDef)}
        new_body, assigned = [], []
        for s in init.body.body:
            loop = training.init_loop(s, list(assigned), methods)
            if loop is not None:
                c.init_methods.add(code(loop).split("(self.", 1)[1].split(",", 1)[0])
                f.needs.add(training.INIT_FN)
                s = loop
            for a in findall(s, m.AssignTarget(m.Attribute(value=m.Name("self")))):
                name = a.target.attr.value
                if name not in assigned and c.attrs.get(name, Layer("value")).kind not in (
                        "value", "buffer", "param", "fn", "lambda"):
                    assigned.append(name)  # the fields that hold layers
            new_body.append(s)
        torch_init = _init_of(torch_cls, "__init__") if torch_cls is not None else None
        new_body = [_untranslated_init_line(s, new_body[i + 1:], torch_init)
                    if "nnx." in code(s) else s for i, s in enumerate(new_body)]
        try:
            new_body = _split_keys(new_body, getattr(c, "init_sites", 0))
        except EquinoxError as exc:
            c.errors.append(exc.message)
        if c.lambdas:
            new_body = [s.visit(_Lambdas(c.lambdas)) for s in new_body]
        new_init = _key_param(init, default_none=False).with_changes(
            body=init.body.with_changes(body=new_body))
        if c.errors:
            new_init = _todo(new_init, "; ".join(dict.fromkeys(c.errors)))
        body = [new_init if s is init else s for s in body]
    torch_methods = {t.name.value: t for t in (torch_cls.body.body if torch_cls else [])
                     if isinstance(t, cst.FunctionDef)}
    for i, s in enumerate(body):
        if isinstance(s, cst.FunctionDef) and s.name.value in c.init_methods:
            body[i] = training.init_method(s)
        elif isinstance(s, cst.FunctionDef) and s.name.value in c.methods:
            body[i] = c.methods[s.name.value]
        elif isinstance(s, cst.FunctionDef) and s.name.value in training.OPTIMIZER_METHODS.get(
                c.name, ()):
            body[i] = training.optimizer_method(s)
        elif isinstance(s, cst.FunctionDef) and s.name.value not in ("__init__", "__call__") \
                and "nnx." in code(s):
            msg = ("a method that the NNX translation rewrites (weight initialisation, "
                   "optimizer set-up) has no equinox translation yet: the torch method")
            body[i] = _todo(torch_methods[s.name.value], msg) if s.name.value in \
                torch_methods else _todo(_comment_out(s), msg)
    call = _init_of(cls, "__call__")
    if call is not None and c.new_call is not None:
        body = [c.new_call if s is call else s for s in body]
    at = _after_docstring(body)
    if fields:
        first = body[at] if at < len(body) else None
        if first is not None:  # (its TODO comments kept)
            body[at] = first.with_changes(leading_lines=[cst.EmptyLine(indent=False), *(
                line for line in first.leading_lines if line.comment is not None)])
        body = [*body[:at], *fields, *body[at:]]
    bases = [b.with_changes(value=cst.parse_expression("eqx.Module"))
             if code(b.value) == "nnx.Module" else b for b in cls.bases]
    return cls.with_changes(bases=bases, body=cls.body.with_changes(body=body)), \
        needs_callable, needs_any


def _imports(module: cst.Module, needs_callable: bool, needs_any: bool) -> cst.Module:
    body = []
    text = module.code
    uses_partial = "partial(" in text.replace("from functools import partial", "")
    uses_jnp = "jnp." in text
    uses_jax = "jax." in text.replace("import jax.numpy", "")
    # (the NNX pass's LayerDict helper, dropped here, was what used Any)
    uses_any = needs_any or re.search(r"\bAny\b", text.replace("from typing import Any", ""))
    added = False
    for s in module.body:
        line = code(s).strip() if isinstance(s, cst.SimpleStatementLine) else ""
        if line == "from flax import nnx":
            if not added:
                body.append(cst.parse_statement("import equinox as eqx\n"))
                added = True
            continue
        if line == "from functools import partial" and not uses_partial:
            continue
        if line == "import jax.numpy as jnp" and not uses_jnp:
            continue
        if line == "from typing import Any" and not uses_any:
            continue
        if line == "import jax" and not uses_jax:
            continue
        if line == "import jax" and not added:
            body.append(s)
            continue
        body.append(s)
    extra = []
    if needs_callable:
        extra.append("from collections.abc import Callable")
    if needs_any and "from typing import Any" not in text:
        extra.append("from typing import Any")
    for used, line in ((uses_jax, "import jax"), (uses_jnp, "import jax.numpy as jnp")):
        if used and not any(code(s).strip() == line for s in body
                            if isinstance(s, cst.SimpleStatementLine)):
            extra.append(line)
    if extra or not added:
        at = 0
        for i, s in enumerate(body):
            if _is_import(s):
                at = i + 1
        if not added:
            extra.append("import equinox as eqx")
        body[at:at] = [cst.parse_statement(e + "\n") for e in extra]
    # `import jax` and friends: keep them together, equinox after jax
    return module.with_changes(body=_order_imports(body))


ORDER = ["dataclasses", "os", "from collections.abc import Callable", "from typing import Any",
         "from functools import partial", "import numpy as np", "import jax",
         "import jax.numpy as jnp", "import optax", "import equinox as eqx"]


def _order_imports(body: list) -> list:
    """The imports the converter manages go in one block in a fixed order."""
    managed = [s for s in body if isinstance(s, cst.SimpleStatementLine) and code(s).strip() in
               ORDER]
    if not managed:
        return body
    first = body.index(managed[0])
    rest = [s for s in body if s not in managed]
    ordered = sorted(managed, key=lambda s: ORDER.index(code(s).strip()))
    ordered = [s.with_changes(leading_lines=[]) for s in ordered]
    ordered[0] = ordered[0].with_changes(leading_lines=managed[0].leading_lines)
    idx = rest.index(body[first + len(managed)]) if first + len(managed) < len(body) and \
        body[first + len(managed)] in rest else len(rest)
    # put the block where the first managed import was
    head = [s for s in rest[:idx] if body.index(s) < first]
    tail = [s for s in rest if s not in head]
    return [*head, *ordered, *tail]


def from_nnx(nnx: object, source: str, path: str) -> object:
    """The converter's entry: a ConversionResult for NNX -> one for equinox. The NNX pass's
    diagnostics are kept (their TODO lines stay in the code); this pass adds its own."""
    from torch2jax.report import Diagnostic
    from torch2jax.result import ConversionResult

    text, todos, assumed = convert(nnx.code, source, getattr(nnx, "per_example", ()))
    diags = list(nnx.diagnostics) + [Diagnostic(path, line, 0, RULE, "error", msg.rsplit(
        f" [{RULE}]", 1)[0]) for line, msg in todos]
    lines = source.splitlines()
    for name, message in assumed:  # a warning at the torch class
        at = next((i + 1 for i, line in enumerate(lines)
                   if line.lstrip().startswith(f"class {name}(")), 1)
        diags.append(Diagnostic(path, at, 1, RULE, "warning", message))
    return ConversionResult(code=text, diagnostics=diags)
