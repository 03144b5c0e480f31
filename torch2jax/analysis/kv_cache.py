"""Whether a decoder's attention can be given a key/value cache (issue 30): the proof half.

A token loop over a causal decoder recomputes every position of its window at every token.
With a cache, the prompt is run once and each new token runs the model on one position, its
keys and values written into a buffer of ``block_size`` positions and its query attending to
the positions written so far. That is the same computation only when:

* the file's one cross-position operation is a causal self-attention: q, k and v projected
  from the input (one ``Linear`` split in three along the feature axis, or three ``Linear``
  layers), heads made with ``view`` / ``reshape`` and ``transpose(1, 2)``, then either
  ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` or ``q @ k.transpose(-2, -1)``
  scaled, ``masked_fill`` with a ``tril`` buffer sliced ``[:, :, :T, :T]``, a softmax over the
  last axis, ``@ v``;
* everything else in every ``forward`` of the file works position by position: the layers it
  calls (``Linear``, ``LayerNorm``, ``Embedding``, ``Dropout``, activations, the file's own
  modules, a ``ModuleList`` of them iterated), arithmetic, and an allow-list of tensor methods
  (no ``cumsum``, convolution, recurrent layer, pooling over positions, ``mean`` over the
  sequence, ...); a subscript is the mask's slice or the last-position read (``x[:, [-1], :]``,
  ``x[:, -1:]``);
* positions reach the model only as ``torch.arange(t)`` / ``torch.arange(0, t)`` indexing an
  ``nn.Embedding`` (or not at all): with a cache, the new token's position is the cache index.

The check is syntactic and conservative: anything it does not recognise answers None, and the
window route (``passes/generation.py``) stays. ``cacheable_attention`` returns what a cached
decoder needs to know; ``passes/kv_cache_decode.py`` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

# layers whose call works on each position alone (the file's own module classes also count)
_POSITIONWISE_LAYERS = {"Linear", "LayerNorm", "Embedding", "Dropout", "GELU", "ReLU", "SiLU",
                        "Tanh", "Sigmoid", "Identity", "RMSNorm"}
_CONTAINERS = {"ModuleList", "ModuleDict", "Sequential"}
# tensor methods and functions that keep positions apart (given the axes checked below)
_METHODS = {"size", "view", "reshape", "transpose", "contiguous", "split", "chunk",
            "masked_fill", "softmax", "float", "type_as", "to"}
_FUNCTIONS = {"softmax", "gelu", "relu", "silu", "tanh", "sigmoid", "dropout", "sqrt", "arange",
              "cross_entropy", "scaled_dot_product_attention", "tril", "ones"}


@dataclass(frozen=True)
class CacheableAttention:
    attention: str  # the class whose forward is the causal self-attention
    projections: tuple[str, ...]  # its q/k/v Linear attributes: one (split in three) or three
    mask: str  # "is_causal" or the name of the tril buffer
    model: str  # the class that makes the positions ("" when no class does)
    position_embedding: str  # the Embedding attribute indexed by the positions ("" if none)


def _name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


def _module_classes(source: cst.Module) -> dict[str, cst.ClassDef]:
    out = {}
    for cls in source.body:
        if isinstance(cls, cst.ClassDef) and any(_name(b.value) == "Module" for b in cls.bases):
            out[cls.name.value] = cls
    return out


def _method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    found = [f for f in cls.body.body if isinstance(f, cst.FunctionDef) and f.name.value == name]
    return found[0] if len(found) == 1 else None


def _layers(cls: cst.ClassDef, classes: set[str]) -> dict[str, str] | None:
    """``self.x = nn.Layer(...)`` of ``__init__`` -> {attribute: layer class}; None when an
    attribute is a layer that mixes positions or one not known."""
    init = _method(cls, "__init__")
    out: dict[str, str] = {}
    if init is None:
        return out
    for assign in m.findall(init, m.Assign(targets=[m.AssignTarget(m.Attribute(
            value=m.Name("self")))])):
        value = assign.value
        if not isinstance(value, cst.Call):
            continue
        kind = _name(value.func)
        if kind in _CONTAINERS:
            inner = {_name(c.func) for c in m.findall(value, m.Call())} - {kind, "range"}
            if not inner or not inner <= (_POSITIONWISE_LAYERS | classes):
                return None
        elif kind not in _POSITIONWISE_LAYERS | classes:
            if kind[:1].isupper():
                return None  # a layer of another kind (Conv1d, GRU, MultiheadAttention, ...)
            continue
        out[assign.targets[0].target.attr.value] = kind
    return out


def _tril_buffers(cls: cst.ClassDef) -> set[str]:
    out = set()
    for call in m.findall(cls, m.Call(func=m.Attribute(attr=m.Name("register_buffer")))):
        if len(call.args) >= 2 and isinstance(call.args[0].value, cst.SimpleString) \
                and m.findall(call.args[1], m.Call(func=m.Attribute(attr=m.Name("tril")))):
            out.add(call.args[0].value.evaluated_value)
    return out


_ALL = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))
_UPTO = m.SubscriptElement(m.Slice(lower=None, upper=m.Name(), step=None))
_MINUS_ONE = m.UnaryOperation(m.Minus(), m.Integer("1"))
_LAST = m.Subscript(slice=[_ALL, m.SubscriptElement(m.Index(_MINUS_ONE | m.List(
    [m.Element(_MINUS_ONE)])) | m.Slice(lower=_MINUS_ONE, upper=None, step=None)),
    m.ZeroOrMore(_ALL)])


def _int(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value)
    if m.matches(node, m.UnaryOperation(m.Minus(), m.Integer())):
        return -int(node.expression.value)
    return None


def _axes_ok(call: cst.Call, name: str) -> bool:
    """The axis arguments of a position-keeping method: a split / chunk / softmax along the
    last (feature) axis of a (B, T, C) or (B, H, T, T) tensor, a transpose of heads and
    positions (1, 2) or of the last two axes (keys)."""
    args = {a.keyword.value if a.keyword else i: a.value for i, a in enumerate(call.args)}
    if name in ("split", "chunk"):
        return _int(args.get("dim", args.get(1))) in (2, -1)
    if name == "softmax":
        functional = isinstance(call.func, cst.Name) or _name(call.func.value) in ("F", "torch")
        return _int(args.get("dim", args.get(1 if functional else 0))) == -1
    if name == "transpose":
        pair = sorted(_int(args.get(i)) or 0 for i in (0, 1))
        return pair in ([1, 2], [-2, -1])
    return True


def _time_name(fn: cst.FunctionDef) -> str:
    """``T`` of ``B, T, C = x.size()`` (or ``.shape``) in ``fn``; "" when not unpacked so."""
    for assign in m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Tuple())])):
        names = [e.value for e in assign.targets[0].target.elements]
        if len(names) == 3 and all(isinstance(n, cst.Name) for n in names) and m.matches(
                assign.value, m.Call(func=m.Attribute(attr=m.Name("size")), args=[])
                | m.Attribute(attr=m.Name("shape"))):
            return names[1].value
    return ""


def _positionwise(fn: cst.FunctionDef, layers: dict[str, str], masks: set[str],
                  attention: bool) -> bool:
    """Every call and subscript of ``fn`` keeps positions apart (module docstring), outside
    the attention core that ``_attention_core`` checks (``attention``: this is its class).
    Outside that class nothing is transposed and a reshape only flattens the logits for the
    loss; inside it, a reshape keeps the positions axis (``view(B, T, ...)``)."""
    loops = {f.target.value for f in m.findall(fn, m.For(target=m.Name(), iter=m.Attribute(
        value=m.Name("self"))))}
    losses = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("cross_entropy"))))
    in_loss = {id(c) for loss in losses for c in m.findall(loss, m.Call())}
    time = _time_name(fn)
    for call in m.findall(fn, m.Call()):
        func = call.func
        if m.matches(func, m.Attribute(value=m.Name("self"))):
            if func.attr.value not in layers:
                return False
            continue
        name = _name(func)
        if isinstance(func, cst.Name) and name in loops:
            continue  # the iterated blocks of a ModuleList (checked as classes)
        if name in ("view", "reshape") and id(call) not in in_loss and not (
                attention and len(call.args) >= 3 and m.matches(call.args[1].value,
                                                                m.Name(time))):
            return False
        if name == "transpose" and not attention:
            return False
        if isinstance(func, cst.Attribute) and _name(func.value) in ("F", "torch", "math") \
                and name in _FUNCTIONS:
            if name == "scaled_dot_product_attention" and not attention:
                return False
            if not _axes_ok(call, name):
                return False
            continue
        if name in _METHODS and _axes_ok(call, name):
            continue
        if isinstance(func, cst.Name) and name in ("range", "len", "min", "float", "int"):
            continue
        return False
    mask = m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.OneOf(
        *(m.Name(b) for b in masks))), slice=[_ALL, _ALL, _UPTO, _UPTO]) if masks else None
    for sub in m.findall(fn, m.Subscript()):
        if m.matches(sub, _LAST) or (attention and mask is not None and m.matches(sub, mask)):
            continue
        return False
    return True


def _attention_core(fn: cst.FunctionDef, layers: dict[str, str], masks: set[str]
                    ) -> tuple[tuple[str, ...], str] | None:
    """The causal self-attention of ``fn`` -> (the q/k/v projections, the mask) or None."""
    linears = [a for a, k in layers.items() if k == "Linear"]
    projected = [c.func.attr.value for c in m.findall(fn, m.Call(func=m.Attribute(
        value=m.Name("self"), attr=m.OneOf(*(m.Name(a) for a in linears))))) ] if linears else []
    sdpa = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("scaled_dot_product_attention"))))
    matmuls = m.findall(fn, m.BinaryOperation(operator=m.MatrixMultiply()))
    if sdpa:
        if len(sdpa) != 1 or matmuls or not any(
                a.keyword is not None and a.keyword.value == "is_causal"
                and m.matches(a.value, m.Name("True")) for a in sdpa[0].args) or any(
                a.keyword is not None and a.keyword.value == "attn_mask" for a in sdpa[0].args):
            return None
        mask = "is_causal"
    else:
        fills = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("masked_fill"))))
        if len(matmuls) != 2 or len(fills) != 1 or not masks:
            return None
        used = [b for b in masks if m.findall(fills[0], m.Attribute(value=m.Name("self"),
                                                                    attr=m.Name(b)))]
        if len(used) != 1 or not m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("softmax")))):
            return None
        # q @ k.transpose(-2, -1) then att @ v
        if not any(m.findall(mm.right, m.Call(func=m.Attribute(attr=m.Name("transpose"))))
                   for mm in matmuls):
            return None
        mask = used[0]
    splits = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("split") | m.Name("chunk"))))
    # the output projection is the last Linear called; q, k, v come from the ones before it
    if len(projected) == 2 and len(splits) == 1:
        return (projected[0],), mask
    if len(projected) == 4 and not splits:
        return tuple(projected[:3]), mask
    return None


def _positions(fn: cst.FunctionDef, layers: dict[str, str]) -> str | None:
    """The Embedding ``fn`` indexes with ``torch.arange(t)`` / ``torch.arange(0, t)``
    ("" when ``fn`` makes no positions); None for positions made another way."""
    aranges = m.findall(fn, m.Call(func=m.Attribute(attr=m.Name("arange"))))
    if not aranges:
        return ""
    if len(aranges) != 1:
        return None
    args = [a for a in aranges[0].args if a.keyword is None]
    if not (len(args) == 1 or (len(args) == 2 and _int(args[0].value) == 0)):
        return None
    assigned = m.findall(fn, m.Assign(targets=[m.AssignTarget(m.Name())],
                                      value=m.Call(func=m.Attribute(attr=m.Name("arange")))))
    if len(assigned) != 1:
        return None
    pos = assigned[0].targets[0].target.value
    reads = [n for n in m.findall(fn, m.Name(pos))]
    uses = m.findall(fn, m.Call(func=m.Attribute(value=m.Name("self")),
                                args=[m.Arg(m.Name(pos))]))
    embeds = [u.func.attr.value for u in uses if layers.get(u.func.attr.value) == "Embedding"]
    if len(embeds) != 1 or len(reads) != 2:  # the assignment and the one lookup
        return None
    return embeds[0]


def cacheable_attention(source: cst.Module) -> CacheableAttention | None:
    """What a cached decoder of the file's model needs (module docstring), or None when the
    file's modules are not proven to be a causal self-attention decoder."""
    classes = _module_classes(source)
    found: list[tuple[str, tuple[str, ...], str]] = []
    model, embedding = "", ""
    for name, cls in classes.items():
        forward = _method(cls, "forward")
        layers = _layers(cls, set(classes))
        if forward is None or layers is None:
            return None
        masks = _tril_buffers(cls)
        core = _attention_core(forward, layers, masks)
        if core is None and (m.findall(forward, m.BinaryOperation(operator=m.MatrixMultiply()))
                             or m.findall(forward, m.Call(func=m.Attribute(
                                 attr=m.Name("scaled_dot_product_attention"))))):
            return None  # attention of another shape
        if not _positionwise(forward, layers, masks, core is not None):
            return None
        if core is not None:
            found.append((name, *core))
        positions = _positions(forward, layers)
        if positions is None:
            return None
        if positions:
            if model:
                return None
            model, embedding = name, positions
    if len(found) != 1:
        return None
    attention, projections, mask = found[0]
    return CacheableAttention(attention, projections, mask, model, embedding)
