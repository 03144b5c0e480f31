"""Move a torch ``state_dict`` into a flax NNX model built by the converted code.

The mapping is driven by data: each torch layer class has a rule in ``rules/layers.toml`` whose
``weights`` table says, per state_dict entry, which NNX attribute receives it and with which
layout transform (``as_is``, ``transpose``, ``conv``). Nothing here names a layer class, so a
rule file that adds a layer also teaches the transfer (and the verifier) about it. An entry may
be split into equal chunks along torch's axis 0 that go to several NNX parameters (layout
``transpose[1/3]``: the second third, transposed), and several entries may be added into one
parameter (``sum``); :func:`export_state_dict` goes back.

Paths follow docs/nnx-output.md: the converter keeps attribute names, so torch's
``blocks.1.fc.weight`` is found by walking ``model.blocks[1].fc`` on the NNX side (stepping into
``nnx.Sequential.layers`` on the way) and taking the attribute the rule names (``kernel``).

The same plan serves gradient comparison: :func:`gradient_map` tells, for each torch parameter,
which NNX parameter holds it and which layout transform to apply to torch's gradient.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2jax.ruleset import Rule, RuleSet, WeightMap, builtin_rules, weight_source

NnxPath = tuple[Any, ...]  # str attribute names and int list indices, as nnx.iter_graph gives


class WeightTransferError(ValueError):
    """The torch state_dict and the NNX model do not correspond one to one.

    ``problems`` lists every mismatch found (not just the first), so that one run shows
    everything the converted model gets wrong.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"weight transfer failed ({len(self.problems)} problems):\n{lines}")


# --- layout transforms ------------------------------------------------------------------------
# torch -> JAX. Each is a permutation of axes, so the same function maps torch *gradients* onto
# JAX gradients; the inverse maps JAX parameters back to torch.


def _conv_to_jax(a: np.ndarray) -> np.ndarray:
    # (O, I, *k) -> (*k, I, O)
    return np.transpose(a, (*range(2, a.ndim), 1, 0))


def _conv_to_torch(a: np.ndarray) -> np.ndarray:
    # (*k, I, O) -> (O, I, *k)
    return np.transpose(a, (a.ndim - 1, a.ndim - 2, *range(a.ndim - 2)))


def _transpose(a: np.ndarray) -> np.ndarray:
    if a.ndim != 2:
        raise ValueError(f"layout 'transpose' expects a 2-D tensor, got shape {a.shape}")
    return a.T


def _conv_checked(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def apply(a: np.ndarray) -> np.ndarray:
        if a.ndim < 3:
            raise ValueError(f"layout 'conv' expects a tensor with >= 3 dims, got {a.shape}")
        return fn(a)

    return apply


def _flip_swap(a: np.ndarray) -> np.ndarray:
    """A transposed convolution's weight, torch's ``(in, out, *k)`` <-> equinox's ``(out, in,
    *k)`` flipped along the kernel axes (equinox convolves the dilated input with it). Its own
    inverse."""
    return np.flip(a, axis=tuple(range(2, a.ndim))).swapaxes(0, 1)


_TO_JAX: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "as_is": lambda a: a,
    "transpose": _transpose,
    "conv": _conv_checked(_conv_to_jax),
    "flip_swap": _conv_checked(_flip_swap),
}
_TO_TORCH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "as_is": lambda a: a,
    "transpose": _transpose,
    "conv": _conv_checked(_conv_to_torch),
    "flip_swap": _conv_checked(_flip_swap),
}


def split_layout(layout: str) -> tuple[str, tuple[int, int] | None]:
    """``"transpose[1/3]"`` -> ``("transpose", (1, 3))``; ``"conv"`` -> ``("conv", None)``."""
    base, bracket, rest = layout.partition("[")
    if not bracket:
        return layout, None
    i, _, n = rest.rstrip("]").partition("/")
    if not (i.isdigit() and n.isdigit() and rest.endswith("]") and int(i) < int(n)):
        raise ValueError(f"bad weight layout {layout!r} (want NAME or NAME[i/n])")
    return base, (int(i), int(n))


def _chunk(a: np.ndarray, part: tuple[int, int]) -> np.ndarray:
    i, n = part
    if a.ndim == 0 or a.shape[0] % n:
        raise ValueError(f"a tensor of shape {a.shape} does not split into {n} equal parts "
                         "along axis 0")
    size = a.shape[0] // n
    return a[i * size:(i + 1) * size]


def apply_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """Transform a torch-layout array into the JAX layout named by a rule (with ``[i/n]``:
    chunk ``i`` of ``n`` along axis 0 first)."""
    base, part = split_layout(layout)
    try:
        fn = _TO_JAX[base]
    except KeyError:
        raise ValueError(f"unknown weight layout {layout!r} (known: {sorted(_TO_JAX)})") from None
    array = np.asarray(array)
    return fn(_chunk(array, part) if part else array)


def invert_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """Transform a JAX-layout array back into torch's layout (the inverse of apply_layout; for
    a part ``[i/n]``, torch's chunk: :func:`join_parts` puts the chunks together)."""
    base, _ = split_layout(layout)
    try:
        return _TO_TORCH[base](np.asarray(array))
    except KeyError:
        raise ValueError(f"unknown weight layout {layout!r} (known: {sorted(_TO_JAX)})") from None


def join_parts(chunks: Sequence[np.ndarray]) -> np.ndarray:
    """The torch tensor whose ``[i/n]`` parts are ``chunks`` (in order)."""
    return np.concatenate([np.asarray(c) for c in chunks], axis=0)


# --- rules by class ---------------------------------------------------------------------------


def _resolve_qualified(name: str) -> Any | None:
    """``torch.nn.Linear`` -> the class, importing the longest module prefix that exists."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def layer_rules_by_class(rules: RuleSet) -> dict[type, Rule]:
    """Map each torch layer class that a rule names (aliases included) to its rule."""
    table: dict[type, Rule] = {}
    for name, rule in rules.layers.items():
        cls = _resolve_qualified(name)
        if isinstance(cls, type):
            table[cls] = rule
    return table


def rule_for_module(module: Any, table: Mapping[type, Rule]) -> Rule | None:
    """The rule of the module's class, or of the nearest torch layer class it derives from."""
    for cls in type(module).__mro__:
        if cls in table:
            return table[cls]
    return None


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamMapping:
    """Where one torch state_dict entry goes.

    ``status``: ``mapped`` (copied into ``nnx_path``), ``tied`` (shares storage with
    ``tied_to``, which carries the value; the NNX model has one parameter for both) or
    ``dropped`` (the rule maps it to nothing, e.g. ``num_batches_tracked``).
    """

    torch_name: str
    status: str
    nnx_path: NnxPath | None = None
    layout: str = "as_is"
    rule: str | None = None  # the layer rule applied; None: a module's own parameter/buffer
    tied_to: str | None = None
    torch_shape: tuple[int, ...] = ()
    nnx_shape: tuple[int, ...] = ()
    summed_into: str | None = None  # sum: the slot (torch name[part]) whose variable holds it

    @property
    def slot(self) -> str:
        """The torch name, with the part when the entry is split (``in_proj_weight[1/3]``)."""
        _, part = split_layout(self.layout)
        return self.torch_name if part is None else f"{self.torch_name}[{part[0]}/{part[1]}]"

    @property
    def nnx_name(self) -> str:
        return format_nnx_path(self.nnx_path) if self.nnx_path is not None else ""


@dataclass
class TransferReport:
    """What :func:`transfer_state_dict` did, entry by entry.

    ``unset_variables`` are NNX variables other than parameters that received nothing (buffers
    registered with ``persistent=False`` in torch are not in the state_dict, and normalisation
    statistics of a layer that does not track them); they keep their constructed values.
    """

    mappings: list[ParamMapping] = field(default_factory=list)
    unset_variables: list[str] = field(default_factory=list)

    def by_status(self, status: str) -> list[ParamMapping]:
        return [m for m in self.mappings if m.status == status]

    @property
    def mapped(self) -> list[ParamMapping]:
        return self.by_status("mapped")

    @property
    def tied(self) -> list[ParamMapping]:
        return self.by_status("tied")

    @property
    def dropped(self) -> list[ParamMapping]:
        return self.by_status("dropped")

    def summary(self) -> str:
        parts = [f"{len(self.mapped)} tensors transferred"]
        if self.tied:
            parts.append(f"{len(self.tied)} tied")
        if self.dropped:
            parts.append(f"{len(self.dropped)} dropped")
        if self.unset_variables:
            parts.append(f"{len(self.unset_variables)} NNX variables kept as constructed")
        return ", ".join(parts)


def format_nnx_path(path: NnxPath) -> str:
    return ".".join(str(p) for p in path)


def _nnx() -> Any:
    from flax import nnx  # deferred: `convert` must work without flax installed

    return nnx


def _step(obj: Any, name: str) -> Any:
    """One torch path component on the NNX side (see docs/nnx-output.md)."""
    nnx = _nnx()
    if isinstance(obj, nnx.Sequential):
        # torch `seq.0` is nnx `seq.layers[0]`, not counting the layout transposes the
        # converter put between channels-last and channels-first layers
        obj = [f for f in obj.layers if not _is_layout_transpose(f)]
    if isinstance(obj, Mapping):  # nnx.Dict (ModuleDict)
        return obj[name]
    if name.isdigit() and isinstance(obj, Sequence) and not isinstance(obj, str):
        return obj[int(name)]  # nnx.List (ModuleList) and Sequential's layers
    return getattr(obj, name)


def _is_layout_transpose(f: Any) -> bool:
    """``lambda x: jnp.moveaxis(x, 1, -1)``, as the converter writes them into Sequentials."""
    code_obj = getattr(f, "__code__", None)
    return (getattr(f, "__name__", "") == "<lambda>" and code_obj is not None
            and "moveaxis" in code_obj.co_names)


def _positional(components: list[str], modules: Mapping[str, Any]) -> list[str]:
    """torch's names of a Sequential's children as their positions: nnx.Sequential keeps its
    children in a list, in torch's order (a Sequential built from an OrderedDict, or filled
    with add_module, names them: regnet's ``trunk_output.block1.block1-0.f.a.0.weight``)."""
    import torch  # deferred like flax

    out = list(components)
    for i in range(len(out) - 1):
        owner = modules.get(".".join(components[:i]))
        if isinstance(owner, torch.nn.Sequential) and not out[i].isdigit():
            names = list(owner._modules)
            if out[i] in names:
                out[i] = str(names.index(out[i]))
    return out


def _find_variable(model: Any, components: list[str]) -> tuple[Any, str | None]:
    """Walk ``components`` from ``model``; return (variable, None) or (None, why not)."""
    obj = model
    for i, name in enumerate(components):
        try:
            obj = _step(obj, name)
        except (AttributeError, KeyError, IndexError, TypeError):
            where = ".".join(components[:i]) or "the model"
            return None, f"{where} has no {name!r}"
    if not isinstance(obj, _nnx().Variable):
        return None, f"{'.'.join(components)} is a {type(obj).__name__}, not an nnx.Variable"
    return obj, None


def _to_numpy(tensor: Any) -> np.ndarray:
    import torch  # deferred like flax

    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; the NNX variable's dtype decides
        t = t.float()
    # a copy: jnp.asarray may otherwise share torch's CPU buffer, and a later in-place torch
    # update (optimizer.step()) would change the JAX weights too
    return t.numpy().copy()


def _storage_key(tensor: Any) -> tuple | None:
    """Identity of the memory a tensor views; equal keys mean tied weights."""
    if tensor.numel() == 0:
        return None
    return (
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tuple(tensor.shape),
        tuple(tensor.stride()),
    )


def _reshape_allowed(source: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor may be reshaped on the way: axes flattened or unflattened in place (a
    LayerNorm over several axes keeps its scale flat in NNX; attention splits a feature axis
    into (heads, head_dim)) or size-1 axes added or removed. Each axis of one side must be the
    product of consecutive axes of the other: any other reshape of equal size, such as (2, 8)
    into (8, 2), would hide a missing transpose."""
    if int(np.prod(source, dtype=np.int64)) != int(np.prod(target, dtype=np.int64)):
        return False
    a = [d for d in source if d != 1]
    b = [d for d in target if d != 1]
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            i, j = i + 1, j + 1
            continue
        small, big, k = (b, a[i], j) if a[i] > b[j] else (a, b[j], i)
        prod = 1
        while k < len(small) and prod < big:
            prod *= small[k]
            k += 1
        if prod != big:
            return False
        if small is b:
            i, j = i + 1, k
        else:
            i, j = k, j + 1
    return i == len(a) and j == len(b)


@dataclass
class TransferPlan:
    """Every state_dict entry's destination and value, worked out before anything is written.

    ``values`` and ``variables`` are keyed by slot: the torch name, with ``[i/n]`` for the
    parts of a split entry (:attr:`ParamMapping.slot`); a sum is in its first entry's slot."""

    mappings: list[ParamMapping]
    values: dict[str, np.ndarray]  # slot -> value in JAX layout (mapped entries only)
    variables: dict[str, Any]  # slot -> the NNX variable receiving it
    unset_variables: list[str]
    problems: list[str]


@dataclass(frozen=True)
class _Target:
    components: list[str] | None  # NNX path components; None: dropped
    layout: str  # with the part: "transpose[0/3]"
    rule: str | None
    sum: bool = False
    # where the entry goes when ``components`` is not in the model: a stacked recurrent layer
    # (the TorchLSTM helper of an LSTM whose num_layers is not the literal 1) keeps layer k's
    # weights under layers.k
    fallback: list[str] | None = None


# a recurrent layer's per-layer entry (weight_ih_l1, bias_hh_l0): the name and the layer; its
# reverse direction's (weight_ih_l0_reverse) goes to the helper's reverse_layers.k
_LAYER_ENTRY = re.compile(r"(\w+?_l)(\d+)(_reverse)?")


def _rule_entries(rule: Rule, attr: str) -> list[WeightMap]:
    """The ``weights`` entries of ``rule`` for the torch name ``attr`` (several when split)."""
    if attr in rule.weights:
        return [rule.weights[attr]]
    return [wm for key, wm in rule.weights.items() if weight_source(key) == attr]


def _target_of(key: str, rule_at: Callable[[str], Rule | None]) -> list[_Target]:
    """Where one state_dict key goes: one target, or one per part of a split entry.

    ``rule_at(prefix)`` is the layer rule of the module at the dotted ``prefix`` (None: no
    rule, or no module). The outermost module with a rule naming the rest of the key decides:
    MultiheadAttention's rule maps ``out_proj.weight``, which its inner Linear's rule would map
    elsewhere."""
    parts = key.split(".")
    for cut in range(len(parts)):
        rule = rule_at(".".join(parts[:cut]))
        if rule is None:
            continue
        rest = ".".join(parts[cut:])
        entries = _rule_entries(rule, rest)
        layer = _LAYER_ENTRY.fullmatch(rest)
        if layer is not None and not entries or layer is not None and layer[2] == "0":
            # layer k of a stacked recurrent layer: the rule's layer-0 entry under layers.k
            stacked = _rule_entries(rule, f"{layer[1]}0")
            if stacked and not entries:
                held = "reverse_layers" if layer[3] else "layers"
                return [_Target([*parts[:cut], held, layer[2], *wm.to.split(".")],
                                wm.transfer_layout, rule.torch, wm.sum)
                        for wm in stacked if wm.to is not None]
            if entries:
                return [_Target(None if wm.to is None else [*parts[:cut], *wm.to.split(".")],
                                wm.transfer_layout, rule.torch, wm.sum,
                                None if wm.to is None else [*parts[:cut], "layers", "0",
                                                            *wm.to.split(".")])
                        for wm in entries]
        if entries:
            return [_Target(None if wm.to is None else [*parts[:cut], *wm.to.split(".")],
                            wm.transfer_layout, rule.torch, wm.sum) for wm in entries]
    owner_path, _, attr = key.rpartition(".")
    # A module's own nn.Parameter / buffer (also on a user subclass of a torch layer):
    # same attribute name, same layout.
    return [_Target([*owner_path.split("."), attr] if owner_path else [attr], "as_is", None)]


@dataclass(frozen=True)
class _Source:
    """What the plan reads from the weights' side: a torch module (:func:`plan_transfer`) or
    arrays by state_dict name (:func:`plan_array_transfer`), so that both follow one plan."""

    state: Mapping[str, Any]  # state_dict key -> tensor or array
    rule_at: Callable[[str], Rule | None]  # dotted module path -> its layer rule
    positional: Callable[[list[str]], list[str]]  # torch path components -> NNX ones
    to_numpy: Callable[[Any], np.ndarray]
    groups: list[list[str]]  # keys holding one value (tied), each key in exactly one group
    what: str = "torch tensor"  # how messages name an entry


def plan_transfer(torch_module: Any, nnx_model: Any, rules: RuleSet | None = None) -> TransferPlan:
    """Work out every state_dict entry's destination without touching the NNX model."""
    table = layer_rules_by_class(rules or builtin_rules())
    modules = dict(torch_module.named_modules(remove_duplicate=False))
    state = torch_module.state_dict(keep_vars=True)

    def rule_at(prefix: str) -> Rule | None:
        owner = modules.get(prefix)
        return rule_for_module(owner, table) if owner is not None else None

    groups: dict[Any, list[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(_storage_key(tensor) or ("unique", key), []).append(key)
    return _plan(_Source(state, rule_at, lambda c: _positional(c, modules), _to_numpy,
                         list(groups.values())), nnx_model)


def nnx_layer_rules(rules: RuleSet) -> dict[type, Rule | None]:
    """Each flax NNX layer class that a layer rule builds (``nnx = "nnx.Linear"``) and that
    rule; None for a class that rules with different ``weights`` tables build (ambiguous)."""
    nnx = _nnx()
    table: dict[type, Rule | None] = {}
    for rule in rules.layers.values():
        target = rule.targets.get("nnx") or ""
        if not rule.weights or not target.startswith("nnx.") or not target[4:].isidentifier():
            continue
        cls = getattr(nnx, target[4:], None)
        if not isinstance(cls, type):
            continue
        if cls in table and (table[cls] is None or table[cls].weights != rule.weights):
            table[cls] = None
        else:
            table[cls] = rule
    return table


def plan_array_transfer(arrays: Mapping[str, Any], nnx_model: Any,
                        rules: RuleSet | None = None, ties: Mapping[str, str] | None = None,
                        what: str = "checkpoint tensor",
                        torch_rules: Mapping[str, str] | None = None) -> TransferPlan:
    """:func:`plan_transfer` for arrays by torch state_dict name (a safetensors file read with
    ``safetensors.numpy``), without torch: the layer rule of an entry is the one whose flax
    class the NNX model holds at the entry's module path (``model.layers.0.q_proj`` is an
    ``nnx.Linear``, so its ``weight`` is transposed into ``kernel``); a module of the converted
    file holds its own parameters under torch's names. ``ties`` maps a key to the key whose
    value it shares (transformers' ``_tied_weights_keys``): the NNX model has one parameter for
    both, and a file holding both must hold equal values. ``torch_rules`` names the layer
    rule of a module path where the torch side knows it (verify --program's recorded model),
    for a layer whose converted class is a helper of the file (``TorchLSTM``)."""
    ruleset = rules or builtin_rules()
    table = nnx_layer_rules(ruleset)
    nnx = _nnx()

    def rule_at(prefix: str) -> Rule | None:
        if torch_rules and prefix in torch_rules and torch_rules[prefix] in ruleset.layers:
            return ruleset.layers[torch_rules[prefix]]
        obj = nnx_model
        for name in prefix.split(".") if prefix else ():
            try:
                obj = _step(obj, name)
            except (AttributeError, KeyError, IndexError, TypeError):
                return None
        if not isinstance(obj, nnx.Module):
            return None
        for cls in type(obj).__mro__:
            if cls in table:
                return table[cls]
        return None

    groups: dict[str, list[str]] = {}
    for key in arrays:
        root = key
        seen = {root}
        while ties and root in ties and ties[root] not in seen:
            root = ties[root]
            seen.add(root)
        groups.setdefault(root, []).append(key)
    problems = []
    for keys in groups.values():
        first = np.asarray(arrays[keys[0]])
        for other in keys[1:]:
            value = np.asarray(arrays[other])
            if value.shape != first.shape or not np.array_equal(value, first):
                problems.append(f"{keys[0]} and {other} are tied in the model but hold "
                                "different values in the checkpoint")
    plan = _plan(_Source(arrays, rule_at, list, lambda a: np.asarray(a), list(groups.values()),
                         what), nnx_model)
    plan.problems[:0] = problems
    return plan


def _plan(source: _Source, nnx_model: Any) -> TransferPlan:
    """The plan of :func:`plan_transfer` and :func:`plan_array_transfer`."""
    nnx = _nnx()
    paths = {id(v): tuple(p) for p, v in nnx.iter_graph(nnx_model) if isinstance(v, nnx.Variable)}
    state = source.state

    mappings: dict[str, ParamMapping] = {}  # torch key -> its (first) mapping
    part_maps: dict[str, list[ParamMapping]] = {}  # torch key -> its mappings, one per part
    values: dict[str, np.ndarray] = {}
    variables: dict[str, Any] = {}
    problems: list[str] = []
    receivers: dict[int, tuple[str, bool]] = {}  # id(nnx variable) -> (slot filling it, sum)

    for keys in source.groups:
        unresolved: list[tuple[str, str | None, str]] = []
        carrier: str | None = None
        filled: dict[int, tuple[str, str]] = {}  # id(variable) -> (key, layout) of this tensor
        for key in keys:
            tensor = state[key]
            shape = tuple(tensor.shape)
            targets = _target_of(key, source.rule_at)
            resolved = []
            for t in targets:
                if t.components is None:
                    mappings[key] = ParamMapping(key, "dropped", None, t.layout, t.rule,
                                                 torch_shape=shape)
                    continue
                var, why = _find_variable(nnx_model, source.positional(t.components))
                if var is None and t.fallback is not None:
                    var, _ = _find_variable(nnx_model, t.fallback)
                if var is None:
                    unresolved.append((key, t.rule, why or ""))
                    break
                resolved.append((t, var))
            else:
                if len(resolved) == 1 and id(resolved[0][1]) in filled and (
                        filled[id(resolved[0][1])][1] == resolved[0][0].layout):
                    # one tensor under two names (BERT's decoder.bias and predictions.bias),
                    # one variable on the NNX side too: the second name is tied to the first
                    first = filled[id(resolved[0][1])][0]
                    mappings[key] = ParamMapping(key, "tied", mappings[first].nnx_path,
                                                 mappings[first].layout, resolved[0][0].rule,
                                                 tied_to=first, torch_shape=shape)
                    continue
                for t, var in resolved:
                    m = _plan_one(key, tensor, t, var, paths, receivers, mappings, values,
                                  variables, problems, source.to_numpy)
                    if m is not None:
                        part_maps.setdefault(key, []).append(m)
                        filled.setdefault(id(var), (key, t.layout))
                if key in part_maps:
                    carrier = carrier or key
        for key, rule, why in unresolved:
            if carrier is not None and len(part_maps[carrier]) == 1:
                mappings[key] = ParamMapping(
                    key,
                    "tied",
                    mappings[carrier].nnx_path,
                    mappings[carrier].layout,
                    rule,
                    tied_to=carrier,
                    torch_shape=tuple(state[key].shape),
                )
            else:
                mapped_by = f" (rule {rule})" if rule else ""
                problems.append(f"{source.what.split()[0]} {key}{mapped_by} has no NNX "
                                f"counterpart: {why}")

    unset: list[str] = []
    for path, var in nnx.iter_graph(nnx_model):
        if not isinstance(var, nnx.Variable) or id(var) in receivers:
            continue
        if isinstance(var, nnx.Param):
            problems.append(f"NNX parameter {format_nnx_path(path)} receives no {source.what}")
        elif not isinstance(var, nnx.RngState):
            unset.append(format_nnx_path(path))

    ordered = [m for k in state for m in (part_maps.get(k) or
                                           ([mappings[k]] if k in mappings else []))]
    return TransferPlan(ordered, values, variables, unset, problems)


def _plan_one(key: str, tensor: Any, t: _Target, var: Any, paths: dict[int, NnxPath],
              receivers: dict[int, tuple[str, bool]], mappings: dict[str, ParamMapping],
              values: dict[str, np.ndarray], variables: dict[str, Any],
              problems: list[str], to_numpy: Callable[[Any], np.ndarray] | None = None
              ) -> ParamMapping | None:
    """Plan one (part of a) state_dict entry into ``var``; None when it does not fit."""
    shape = tuple(tensor.shape)
    components = t.components or []
    try:
        value = apply_layout((to_numpy or _to_numpy)(tensor), t.layout)
    except ValueError as exc:
        problems.append(f"{key}: {exc}")
        return None
    path = paths.get(id(var), tuple(components))
    _, part = split_layout(t.layout)
    slot = key if part is None else f"{key}[{part[0]}/{part[1]}]"
    first = receivers.get(id(var))
    if first is not None and not (t.sum and first[1]):
        problems.append(f"NNX {format_nnx_path(path)} receives both {first[0]} and {slot}")
        return None
    if first is None:
        receivers[id(var)] = (slot, t.sum)  # also when it does not fit: one complaint is enough
    target_shape = tuple(var.shape)
    if value.shape != target_shape:
        if not _reshape_allowed(value.shape, target_shape):
            problems.append(
                f"{key}: shape {shape} (after {t.layout!r}: {value.shape}) does not fit "
                f"NNX {format_nnx_path(path)} of shape {target_shape}"
            )
            return None
        value = value.reshape(target_shape)
    m = ParamMapping(key, "mapped", path, t.layout, t.rule, torch_shape=shape,
                     nnx_shape=target_shape, summed_into=first[0] if first else None)
    mappings.setdefault(key, m)
    if first is not None:  # a sum: add into the first entry's value
        if first[0] in values:
            values[first[0]] = values[first[0]] + value
        return m
    values[slot] = value
    variables[slot] = var
    return m


def transfer_state_dict(
    torch_module: Any, nnx_model: Any, rules: RuleSet | None = None
) -> TransferReport:
    """Copy ``torch_module.state_dict()`` (parameters and buffers) into ``nnx_model`` in place.

    Raises :class:`WeightTransferError` listing every torch entry without an NNX counterpart,
    every NNX parameter left without a value and every shape that does not fit; the NNX model
    is only modified when there is no such problem.
    """
    import jax.numpy as jnp

    plan = plan_transfer(torch_module, nnx_model, rules)
    if plan.problems:
        raise WeightTransferError(plan.problems)
    for slot, var in plan.variables.items():
        var.set_value(jnp.asarray(plan.values[slot], dtype=var.dtype))
    return TransferReport(plan.mappings, plan.unset_variables)


def transfer_arrays(arrays: Mapping[str, Any], nnx_model: Any, rules: RuleSet | None = None,
                    ties: Mapping[str, str] | None = None) -> TransferReport:
    """:func:`transfer_state_dict` for arrays by torch state_dict name, without torch (see
    :func:`plan_array_transfer`); raises :class:`WeightTransferError` before writing anything
    when an entry has no NNX counterpart, a parameter receives nothing or a shape differs."""
    import jax.numpy as jnp

    plan = plan_array_transfer(arrays, nnx_model, rules, ties)
    if plan.problems:
        raise WeightTransferError(plan.problems)
    for slot, var in plan.variables.items():
        var.set_value(jnp.asarray(plan.values[slot], dtype=var.dtype))
    return TransferReport(plan.mappings, plan.unset_variables)


def gradient_map(
    torch_module: Any, nnx_model: Any, rules: RuleSet | None = None
) -> dict[str, ParamMapping]:
    """For each trainable torch parameter (``named_parameters()`` names), its NNX parameter.

    Apply ``apply_layout(grad, mapping.layout)`` (then reshape to ``mapping.nnx_shape``) to a
    torch gradient to compare it with the JAX gradient at ``mapping.nnx_path``. A tied parameter
    is reported under the name torch gives it, pointing at the one NNX parameter that holds it.
    """
    return {name: parts[0] for name, parts in gradient_parts(torch_module, nnx_model,
                                                               rules).items()}


def gradient_parts(
    torch_module: Any, nnx_model: Any, rules: RuleSet | None = None
) -> dict[str, list[ParamMapping]]:
    """As :func:`gradient_map`, with every part of a split parameter: MultiheadAttention's
    ``in_proj_weight`` has three, one per NNX query/key/value kernel (``layout`` ends in
    ``[i/n]``, so ``apply_layout(grad, m.layout)`` gives that part). :func:`gradient_map`
    keeps the first part of each. A summed parameter (a rule's ``sum = true`` entries) has
    the gradient of the NNX parameter holding the sum."""
    plan = plan_transfer(torch_module, nnx_model, rules)
    if plan.problems:
        raise WeightTransferError(plan.problems)
    return trainable_parts(torch_module, plan.mappings)


def trainable_parts(torch_module: Any, mappings: Sequence[ParamMapping]
                    ) -> dict[str, list[ParamMapping]]:
    """For each trainable torch parameter (``requires_grad``, not dropped), the mappings of
    a transfer plan that hold it; a tied parameter has those of the one it is tied to."""
    by_key: dict[str, list[ParamMapping]] = {}
    for m in mappings:
        by_key.setdefault(m.torch_name, []).append(m)
    result: dict[str, list[ParamMapping]] = {}
    for name, param in torch_module.named_parameters():
        ms = by_key.get(name)
        if ms is None or not param.requires_grad or ms[0].status == "dropped":
            continue
        if ms[0].status == "tied":
            ms = by_key[ms[0].tied_to or name]
        result[name] = ms
    return result


def export_state_dict(
    torch_module: Any, nnx_model: Any, rules: RuleSet | None = None
) -> dict[str, np.ndarray]:
    """The NNX model's parameters as a torch ``state_dict`` (numpy arrays; the reverse of
    :func:`transfer_state_dict`, with the same plan). Split entries are joined; of summed
    entries the first receives the sum and the others zeros (the NNX model holds only the sum:
    the torch forward is the same). Dropped entries keep the torch module's value; tied ones
    repeat their carrier's."""
    plan = plan_transfer(torch_module, nnx_model, rules)
    if plan.problems:
        raise WeightTransferError(plan.problems)
    state = torch_module.state_dict()
    pieces: dict[str, list[np.ndarray]] = {}
    out: dict[str, np.ndarray] = {}
    for m in plan.mappings:
        if m.status == "dropped":
            out[m.torch_name] = _to_numpy(state[m.torch_name])
            continue
        if m.status != "mapped":
            continue
        torch_part = np.broadcast_to(np.zeros((), np.float32), m.torch_shape)
        jax_shape = apply_layout(torch_part, m.layout).shape  # before the reshape into NNX
        if m.summed_into is None:
            value = np.asarray(plan.variables[m.slot][...]).reshape(jax_shape)
        else:
            value = np.zeros(jax_shape, np.asarray(plan.variables[m.summed_into][...]).dtype)
        pieces.setdefault(m.torch_name, []).append(invert_layout(value, m.layout))
    for name, chunks in pieces.items():
        out[name] = chunks[0] if len(chunks) == 1 else join_parts(chunks)
    for m in plan.mappings:
        if m.status == "tied" and m.tied_to in out:
            out[m.torch_name] = out[m.tied_to]
    return {k: out[k] for k in state if k in out}
