"""Move a torch ``state_dict`` into a flax NNX model built by the converted code.

The mapping is driven by data: each torch layer class has a rule in ``rules/layers.toml`` whose
``weights`` table says, per state_dict entry, which NNX attribute receives it and with which
layout transform (``as_is``, ``transpose``, ``conv``). Nothing here names a layer class, so a
rule file that adds a layer also teaches the transfer (and the verifier) about it.

Paths follow docs/nnx-output.md: the converter keeps attribute names, so torch's
``blocks.1.fc.weight`` is found by walking ``model.blocks[1].fc`` on the NNX side (stepping into
``nnx.Sequential.layers`` on the way) and taking the attribute the rule names (``kernel``).

The same plan serves gradient comparison: :func:`gradient_map` tells, for each torch parameter,
which NNX parameter holds it and which layout transform to apply to torch's gradient.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2jax.ruleset import Rule, RuleSet, builtin_rules

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


_TO_JAX: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "as_is": lambda a: a,
    "transpose": _transpose,
    "conv": _conv_checked(_conv_to_jax),
}
_TO_TORCH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "as_is": lambda a: a,
    "transpose": _transpose,
    "conv": _conv_checked(_conv_to_torch),
}


def apply_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """Transform a torch-layout array into the JAX layout named by a rule."""
    try:
        return _TO_JAX[layout](np.asarray(array))
    except KeyError:
        raise ValueError(f"unknown weight layout {layout!r} (known: {sorted(_TO_JAX)})") from None


def invert_layout(array: np.ndarray, layout: str) -> np.ndarray:
    """Transform a JAX-layout array back into torch's layout (the inverse of apply_layout)."""
    try:
        return _TO_TORCH[layout](np.asarray(array))
    except KeyError:
        raise ValueError(f"unknown weight layout {layout!r} (known: {sorted(_TO_JAX)})") from None


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
        obj = obj.layers  # torch `seq.0` is nnx `seq.layers[0]`
    if isinstance(obj, Mapping):  # nnx.Dict (ModuleDict)
        return obj[name]
    if name.isdigit() and isinstance(obj, Sequence) and not isinstance(obj, str):
        return obj[int(name)]  # nnx.List (ModuleList) and Sequential's layers
    return getattr(obj, name)


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
    """Whether a tensor may be reshaped on the way: flattened or unflattened (a LayerNorm over
    several axes keeps its scale flat in NNX) or given size-1 axes. Any other reshape of equal
    size, such as (2, 8) into (8, 2), would hide a missing transpose."""
    if int(np.prod(source, dtype=np.int64)) != int(np.prod(target, dtype=np.int64)):
        return False
    if len(source) == 1 or len(target) == 1:
        return True
    return [d for d in source if d != 1] == [d for d in target if d != 1]


@dataclass
class TransferPlan:
    """Every state_dict entry's destination and value, worked out before anything is written."""

    mappings: list[ParamMapping]
    values: dict[str, np.ndarray]  # torch name -> value in JAX layout (mapped entries only)
    variables: dict[str, Any]  # torch name -> the NNX variable receiving it
    unset_variables: list[str]
    problems: list[str]


def _target_of(
    key: str, modules: Mapping[str, Any], table: Mapping[type, Rule]
) -> tuple[list[str] | None, str, str | None]:
    """(NNX path components or None when dropped, layout, rule name) for one state_dict key."""
    owner_path, _, attr = key.rpartition(".")
    owner = modules.get(owner_path)
    rule = rule_for_module(owner, table) if owner is not None else None
    prefix = owner_path.split(".") if owner_path else []
    if rule is not None and attr in rule.weights:
        wm = rule.weights[attr]
        if wm.to is None:
            return None, wm.layout, rule.torch
        return [*prefix, *wm.to.split(".")], wm.layout, rule.torch
    # A module's own nn.Parameter / buffer (also on a user subclass of a torch layer):
    # same attribute name, same layout.
    return [*prefix, attr], "as_is", None


def plan_transfer(torch_module: Any, nnx_model: Any, rules: RuleSet | None = None) -> TransferPlan:
    """Work out every state_dict entry's destination without touching the NNX model."""
    nnx = _nnx()
    table = layer_rules_by_class(rules or builtin_rules())
    modules = dict(torch_module.named_modules(remove_duplicate=False))
    paths = {id(v): tuple(p) for p, v in nnx.iter_graph(nnx_model) if isinstance(v, nnx.Variable)}
    state = torch_module.state_dict(keep_vars=True)

    groups: dict[Any, list[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(_storage_key(tensor) or ("unique", key), []).append(key)

    mappings: dict[str, ParamMapping] = {}
    values: dict[str, np.ndarray] = {}
    variables: dict[str, Any] = {}
    problems: list[str] = []
    receivers: dict[int, str] = {}  # id(nnx variable) -> torch key that fills it

    for keys in groups.values():
        unresolved: list[tuple[str, str | None, str]] = []
        carrier: str | None = None
        for key in keys:
            tensor = state[key]
            components, layout, rule = _target_of(key, modules, table)
            shape = tuple(tensor.shape)
            if components is None:
                mappings[key] = ParamMapping(key, "dropped", None, layout, rule, torch_shape=shape)
                continue
            var, why = _find_variable(nnx_model, components)
            if var is None:
                unresolved.append((key, rule, why or ""))
                continue
            try:
                value = apply_layout(_to_numpy(tensor), layout)
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
                continue
            path = paths.get(id(var), tuple(components))
            if id(var) in receivers:
                problems.append(
                    f"NNX {format_nnx_path(path)} receives both {receivers[id(var)]} and {key}"
                )
                continue
            receivers[id(var)] = key  # also when it does not fit: one complaint is enough
            target_shape = tuple(var.shape)
            if value.shape != target_shape:
                if not _reshape_allowed(value.shape, target_shape):
                    problems.append(
                        f"{key}: shape {shape} (after {layout!r}: {value.shape}) does not fit "
                        f"NNX {format_nnx_path(path)} of shape {target_shape}"
                    )
                    continue
                value = value.reshape(target_shape)
            mappings[key] = ParamMapping(
                key, "mapped", path, layout, rule, torch_shape=shape, nnx_shape=target_shape
            )
            values[key] = value
            variables[key] = var
            carrier = carrier or key
        for key, rule, why in unresolved:
            if carrier is not None:
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
                problems.append(f"torch {key}{mapped_by} has no NNX counterpart: {why}")

    unset: list[str] = []
    for path, var in nnx.iter_graph(nnx_model):
        if not isinstance(var, nnx.Variable) or id(var) in receivers:
            continue
        if isinstance(var, nnx.Param):
            problems.append(f"NNX parameter {format_nnx_path(path)} receives no torch tensor")
        elif not isinstance(var, nnx.RngState):
            unset.append(format_nnx_path(path))

    ordered = [mappings[k] for k in state if k in mappings]
    return TransferPlan(ordered, values, variables, unset, problems)


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
    for key, var in plan.variables.items():
        var.set_value(jnp.asarray(plan.values[key], dtype=var.dtype))
    return TransferReport(plan.mappings, plan.unset_variables)


def gradient_map(
    torch_module: Any, nnx_model: Any, rules: RuleSet | None = None
) -> dict[str, ParamMapping]:
    """For each trainable torch parameter (``named_parameters()`` names), its NNX parameter.

    Apply ``apply_layout(grad, mapping.layout)`` (then reshape to ``mapping.nnx_shape``) to a
    torch gradient to compare it with the JAX gradient at ``mapping.nnx_path``. A tied parameter
    is reported under the name torch gives it, pointing at the one NNX parameter that holds it.
    """
    plan = plan_transfer(torch_module, nnx_model, rules)
    if plan.problems:
        raise WeightTransferError(plan.problems)
    by_key = {m.torch_name: m for m in plan.mappings}
    result: dict[str, ParamMapping] = {}
    for name, param in torch_module.named_parameters():
        m = by_key.get(name)
        if m is None or not param.requires_grad or m.status == "dropped":
            continue
        if m.status == "tied":
            m = by_key[m.tied_to or name]
        result[name] = m
    return result
