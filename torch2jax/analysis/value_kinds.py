"""The kinds of value the analysis in values.py tells apart (the lattice of :class:`Value`)
and what it knows of torch's and Python's names: which calls, methods and attributes give
tensors, scalars, tuples, modules or containers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    TENSOR = "tensor"
    MODULE = "module"
    OPTIMIZER = "optimizer"
    SCHEDULER = "scheduler"
    LOADER = "loader"
    DICT = "dict"
    LIST = "list"
    TUPLE = "tuple"
    SET = "set"
    SCALAR = "scalar"  # numbers, strings, booleans
    NONE = "none"
    CONFIG = "config"  # argparse namespaces, dataclass / ...Config instances
    OBJECT = "object"  # other objects: imported modules, numpy arrays, user objects
    FUNCTION = "function"
    PARAM = "param"  # an argument nothing tells about
    UNKNOWN = "unknown"


NON_TENSOR = frozenset(Kind) - {Kind.TENSOR, Kind.PARAM, Kind.UNKNOWN}
# tensor method names that other objects of training scripts have too, with another meaning
# (wandb.log / logger.log, str.split, numpy's repeat / transpose / view, Module.to): on a value
# whose kind is UNKNOWN they are left as they are and marked, not rewritten
SHARED_METHODS = frozenset({"log", "split", "repeat", "transpose", "view", "to", "type",
                            "index", "count", "copy", "sort", "item", "float", "int", "bool",
                            "long", "half", "double", "max", "min", "sum", "mean", "std",
                            "var", "all", "any", "round", "clip", "prod", "argmax", "argmin",
                            "flatten", "squeeze", "reshape", "size", "numpy", "cpu", "cuda",
                            "detach", "clone", "exp", "abs", "pow", "sign"})


@dataclass(frozen=True)
class Value:
    """A kind, and for containers and iterables the kind of their items (``items`` per
    position for tuples), for objects the file's class they are an instance of."""

    kind: Kind
    item: Value | None = None
    items: tuple[Value, ...] | None = None
    cls: str | None = None
    dtype: bool = False  # a torch dtype (torch.float32, x.dtype)
    layer: str | None = None  # a torch layer built here: its qualified class (torch.nn.Linear)

    def element(self, index: int | None = None) -> Value:
        """An item (``index``: a tuple position), as iteration or unpacking gives it."""
        if self.items is not None and index is not None and 0 <= index < len(self.items):
            return self.items[index]
        if self.item is not None:
            return self.item
        if self.items:
            return _join(list(self.items))
        if self.kind in (Kind.TENSOR, Kind.LOADER):
            return TENSOR  # rows of a tensor, the batch a loader yields
        if self.kind == Kind.MODULE:
            return MODULE  # the layers of a ModuleList / Sequential
        if self.kind in (Kind.PARAM, Kind.UNKNOWN):
            return self
        return UNKNOWN


TENSOR = Value(Kind.TENSOR)
MODULE = Value(Kind.MODULE)
SCALAR = Value(Kind.SCALAR)
NONE = Value(Kind.NONE)
OBJECT = Value(Kind.OBJECT)
UNKNOWN = Value(Kind.UNKNOWN)
PARAM = Value(Kind.PARAM)
FUNCTION = Value(Kind.FUNCTION)
DICT = Value(Kind.DICT)
LIST = Value(Kind.LIST)
CONFIG = Value(Kind.CONFIG)
DTYPE = Value(Kind.OBJECT, dtype=True)
# what numpy calls return (arrays, generators): Python-side objects whose methods give numpy
# values too (np.random.default_rng(seed).integers(0, 64, size=4096), a.astype(np.uint16))
NUMPY = Value(Kind.OBJECT, cls="<numpy>")
_NUMPY_SCALAR_METHODS = {"item"}
_BUSY = Value(Kind.UNKNOWN, cls="<busy>")  # an answer being computed (a cycle): no evidence


def _join(values: Iterable[Value]) -> Value:
    """The kind of a value that is one of ``values``. ``None`` and a number are absorbed by
    a tensor (``loss = None`` ... ``loss = F.mse_loss(...)``; ``total = 0`` ... ``total +
    loss``); otherwise different kinds are UNKNOWN."""
    found = [v for v in values if v is not _BUSY]
    kinds = {v.kind for v in found} - {Kind.NONE}
    if not found:
        return _BUSY
    if not kinds:
        return NONE
    if len(kinds) == 1:
        kind = kinds.pop()
        same = [v for v in found if v.kind == kind]
        first = same[0]
        return first if all(v == first for v in same) else Value(kind)
    if kinds == {Kind.TENSOR, Kind.SCALAR}:
        return TENSOR
    if kinds == {Kind.TENSOR, Kind.LIST} and all(
            v.item in (TENSOR, _BUSY) for v in found if v.kind == Kind.LIST):
        # a loader's batch, then the same batch moved: batch = [t.to(device) for t in batch]
        return Value(Kind.LIST, item=TENSOR)
    if kinds <= {Kind.TENSOR, Kind.PARAM}:
        return TENSOR
    if Kind.PARAM in kinds and len(kinds - {Kind.PARAM}) == 1:
        (kind,) = kinds - {Kind.PARAM}
        return next(v for v in found if v.kind == kind)
    return UNKNOWN


# ---- what torch calls return --------------------------------------------------------------
_TORCH_NOT_TENSOR_PREFIXES = (
    "torch.cuda.", "torch.backends.", "torch.distributed.", "torch.utils.", "torch.amp.",
    "torch.jit.", "torch.onnx.", "torch.hub.", "torch.multiprocessing.", "torch.testing.",
    "torch.profiler.", "torch.compiler.", "torch._dynamo.", "torch.mps.", "torch.autograd.",
    "torch.set_", "torch.get_", "torch.is_", "torch.use_", "torch.are_")
_TORCH_OBJECTS = {
    "torch.device", "torch.dtype", "torch.Generator", "torch.finfo", "torch.iinfo",
    "torch.no_grad", "torch.enable_grad", "torch.inference_mode", "torch.autocast",
    "torch.set_grad_enabled", "torch.manual_seed", "torch.compile",
}
TORCH_DTYPES = {f"torch.{n}" for n in (
    "float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16",
    "int32", "int64", "uint8", "int", "long", "short", "bool", "complex64", "complex128",
    "cfloat", "cdouble", "float8_e4m3fn", "float8_e5m2")}
_TORCH_SCALARS = {"torch.numel", "torch.seed", "torch.initial_seed"}
_TORCH_TUPLES = {"torch.chunk", "torch.split", "torch.unbind", "torch.tensor_split",
                 "torch.meshgrid", "torch.sort", "torch.topk", "torch.max", "torch.min",
                 "torch.median", "torch.mode", "torch.kthvalue", "torch.unique",
                 "torch.broadcast_tensors", "torch.Size"}
# progress bars that wrap an iterable and yield its elements
_PROGRESS_BARS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm",
                  "tqdm.rich.tqdm"}
_PYTHON_SCALAR_MODULES = ("math.", "time.", "os.", "random.", "json.", "re.", "sys.",
                          "string.", "datetime.", "shutil.", "glob.", "pathlib.", "logging.",
                          "pickle.", "inspect.", "argparse.", "itertools.", "functools.",
                          "collections.", "typing.", "dataclasses.", "contextlib.", "copy.")

# ---- what methods return --------------------------------------------------------------------
_TENSOR_SCALAR_METHODS = {"item", "tolist", "dim", "ndimension", "numel", "nelement",
                          "element_size", "is_contiguous", "is_floating_point", "data_ptr",
                          "get_device", "is_complex", "stride", "storage_offset"}
_TENSOR_TUPLE_METHODS = {"chunk", "split", "unbind", "tensor_split", "sort", "topk", "unique",
                         "max", "min", "median", "mode", "kthvalue"}
_TENSOR_TUPLE_WITH_DIM = {"max", "min", "median", "mode"}  # tuples only when given a dim
_TENSOR_ATTRS = {"T": TENSOR, "mT": TENSOR, "H": TENSOR, "mH": TENSOR, "data": TENSOR,
                 "grad": TENSOR, "real": TENSOR, "imag": TENSOR, "shape": Value(
                     Kind.TUPLE, item=SCALAR), "ndim": SCALAR, "dtype": DTYPE,
                 "device": OBJECT, "requires_grad": SCALAR, "is_cuda": SCALAR,
                 "layout": OBJECT, "itemsize": SCALAR, "nbytes": SCALAR}
# attributes and methods of nn.Module instances
_MODULE_METHODS: dict[str, Value] = {
    "parameters": Value(Kind.OBJECT, item=TENSOR), "buffers": Value(Kind.OBJECT, item=TENSOR),
    "named_parameters": Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(SCALAR, TENSOR))),
    "named_buffers": Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(SCALAR, TENSOR))),
    "modules": Value(Kind.OBJECT, item=MODULE), "children": Value(Kind.OBJECT, item=MODULE),
    "named_modules": Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(SCALAR, MODULE))),
    "named_children": Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(SCALAR, MODULE))),
    "state_dict": Value(Kind.DICT, item=TENSOR), "load_state_dict": OBJECT,
    "to": MODULE, "cuda": MODULE, "cpu": MODULE, "train": MODULE, "eval": MODULE,
    "float": MODULE, "half": MODULE, "double": MODULE, "bfloat16": MODULE,
    "requires_grad_": MODULE, "apply": MODULE, "zero_grad": NONE, "register_buffer": NONE,
    "register_parameter": NONE, "add_module": NONE, "extra_repr": SCALAR,
    # transformers' PreTrainedModel: the embedding layers and the towers it holds (modules of
    # no class the analysis knows: not the receiver's)
    **dict.fromkeys(("get_input_embeddings", "get_output_embeddings", "get_decoder",
                     "get_encoder"), Value(Kind.MODULE, cls="<submodule>")),
}
_MODULE_PARAM_ATTRS = {"weight", "bias", "running_mean", "running_var", "in_proj_weight",
                       "in_proj_bias", "weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                       "bias_hh_l0", "pos_embedding", "cls_token"}
# a name used with these attributes is that kind (tensors have none of them)
_USE_EVIDENCE: dict[str, Kind] = {
    **{a: Kind.MODULE for a in ("eval", "train", "parameters", "named_parameters",
                                "state_dict", "load_state_dict", "modules", "children",
                                "named_modules", "named_children", "register_buffer",
                                "apply", "buffers")},
    **{a: Kind.OPTIMIZER for a in ("param_groups",)},
    **{a: Kind.DICT for a in ("items", "keys", "values", "get", "update", "setdefault",
                              "popitem")},
    **{a: Kind.LIST for a in ("append", "extend", "insert")},
    **{a: Kind.SCALAR for a in ("startswith", "endswith", "format", "join", "lower",
                                "upper", "strip", "rstrip", "lstrip", "encode", "isdigit")},
}
_OPTIMIZER_ATTRS: dict[str, Value] = {
    "param_groups": Value(Kind.LIST, item=Value(Kind.DICT)),
    "state_dict": Value(Kind.DICT), "state": Value(Kind.DICT), "defaults": Value(Kind.DICT),
}
# a method on a value of an unknown kind that only these kinds have
_ANY_RECEIVER_METHODS: dict[str, Value] = {
    "state_dict": DICT, "param_groups": Value(Kind.LIST, item=DICT), "parse_args": CONFIG,
    "items": Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(SCALAR, UNKNOWN))),
    "keys": Value(Kind.OBJECT, item=SCALAR), "get_last_lr": Value(Kind.LIST, item=SCALAR),
    # a transformers model's (a tower built by AutoModel.from_config)
    **{m: _MODULE_METHODS[m] for m in ("get_input_embeddings", "get_output_embeddings",
                                       "get_decoder", "get_encoder")},
}
# tensor methods whose first argument is a boolean tensor mask
_MASK_METHODS = {"masked_fill", "masked_fill_", "masked_scatter", "masked_scatter_",
                 "masked_select"}
_DICT_METHODS = {"items", "keys", "values", "get", "pop", "setdefault", "copy", "update"}
_BUILTIN_CALLS: dict[str, Value] = {
    **{f"builtins.{n}": SCALAR for n in (
        "len", "int", "float", "str", "bool", "repr", "format", "hash", "id", "ord", "chr",
        "isinstance", "issubclass", "hasattr", "callable", "round", "input", "bin", "hex")},
    "builtins.dict": DICT, "builtins.vars": DICT, "builtins.globals": DICT,
    "builtins.locals": DICT, "collections.OrderedDict": DICT,
    "collections.defaultdict": DICT, "builtins.list": LIST, "builtins.sorted": LIST,
    "builtins.tuple": Value(Kind.TUPLE), "builtins.set": Value(Kind.SET),
    "builtins.frozenset": Value(Kind.SET), "builtins.range": Value(Kind.OBJECT, item=SCALAR),
    "builtins.print": NONE, "builtins.open": OBJECT,
    "builtins.type": OBJECT, "builtins.object": OBJECT, "builtins.super": OBJECT,
    "argparse.ArgumentParser": OBJECT, "types.SimpleNamespace": CONFIG,
    "argparse.Namespace": CONFIG,
}

# ---- transformers' machinery that modeling files use on tensors ------------------------------
# a KV cache (``past_key_values: Cache | None``, ``isinstance(c, EncoderDecoderCache)``) and one
# of its layers (``cache.layers[i]``): objects of no class of the file, named by a class name
# that no file class has (a dot)
CACHE = Value(Kind.OBJECT, cls="<transformers.Cache>")
CACHE_LAYER = Value(Kind.OBJECT, cls="<transformers.CacheLayer>")
# ``ACT2FN[name]`` / ``get_activation(name)``: a function of a tensor that gives a tensor
ACTIVATION = Value(Kind.FUNCTION, cls="<transformers.activation>")
# ``ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)`` / ``ALL_ATTENTION_FUNCTIONS[impl]``: an
# attention function, which returns the attention output (a tensor) and its weights (a tensor,
# or None where the implementation computes none)
ATTENTION = Value(Kind.FUNCTION, cls="<transformers.attention>")
ATTENTION_RESULT = Value(Kind.TUPLE, items=(TENSOR, UNKNOWN))
# ``ACT2CLS[name]``: the activation's class, which built (``ACT2CLS[name]()``) is an activation
ACTIVATION_CLASS = Value(Kind.FUNCTION, cls="<transformers.activation_class>")
LIBRARY_METHODS: dict[tuple[str | None, str], Value] = {
    (CACHE.cls, "update"): Value(Kind.TUPLE, items=(TENSOR, TENSOR)),  # the keys and values
    (CACHE.cls, "get_seq_length"): SCALAR, (CACHE.cls, "get_max_cache_shape"): SCALAR,
    (CACHE.cls, "get_query_offset"): SCALAR, (CACHE.cls, "is_recording_past"): SCALAR,
    (CACHE.cls, "has_previous_state"): SCALAR,
    # a state-space layer's convolution and recurrent states (Mamba's, the hybrids')
    **{(CACHE.cls, m): TENSOR for m in ("update_conv_state", "get_conv_state",
                                        "update_recurrent_state", "get_recurrent_state")},
}
LIBRARY_ATTRS: dict[tuple[str | None, str], Value] = {
    (CACHE.cls, "self_attention_cache"): CACHE, (CACHE.cls, "cross_attention_cache"): CACHE,
    (CACHE.cls, "layers"): Value(Kind.LIST, item=CACHE_LAYER),
    (CACHE.cls, "is_updated"): DICT, (CACHE_LAYER.cls, "keys"): TENSOR,
    (CACHE_LAYER.cls, "values"): TENSOR,
}


def library_class(name: str) -> Value | None:
    """An instance of transformers' class ``name`` (the last part of a qualified name
    imported from a library other than torch), where the analysis knows the class."""
    return CACHE if name.endswith("Cache") and name[:1].isupper() else None


# transformers' mask functions (masking_utils): the attention mask, a tensor; and the support
# module's attention_dropout, which the reduction writes for an attention function's
# ``dropout(w, p, training=module.training)`` (hf.py): the weights, a tensor
MASK_FUNCTIONS = frozenset({"create_causal_mask", "create_sliding_window_causal_mask",
                            "create_bidirectional_mask", "create_chunked_causal_mask",
                            "create_bidirectional_sliding_window_mask", "attention_dropout"})


def library_function(qualified: str) -> Value | None:
    """What a library name not called yet is: ``ACT2FN`` (indexed) / ``get_activation``, and
    ``ALL_ATTENTION_FUNCTIONS`` (indexed)."""
    last = qualified.rsplit(".", 1)[-1]
    if last == "ALL_ATTENTION_FUNCTIONS" and not qualified.startswith("torch."):
        return ATTENTION
    if last == "ACT2CLS" and not qualified.startswith("torch."):
        return ACTIVATION_CLASS
    return ACTIVATION if last in ("ACT2FN", "get_activation") and (
        not qualified.startswith("torch.")) else None
# the fields of transformers' model outputs (ModelOutput dataclasses) read from what a module
# call gave, which the analysis takes for a tensor (``self.vision_tower(x).pooler_output``):
# no tensor has these attributes
OUTPUT_FIELDS: dict[str, Value] = {
    **dict.fromkeys(("last_hidden_state", "pooler_output", "logits", "image_embeds",
                     "text_embeds", "audio_embeds", "image_hidden_states", "start_logits",
                     "end_logits", "encoder_last_hidden_state", "prediction_logits"), TENSOR),
    **dict.fromkeys(("hidden_states", "attentions", "cross_attentions",
                     "encoder_hidden_states", "decoder_hidden_states", "encoder_attentions",
                     "decoder_attentions", "feature_maps"), Value(Kind.TUPLE, item=TENSOR)),
    "past_key_values": CACHE,
}
