"""Load and validate the declarative rule files (``rules/*.toml``).

Three tables, one per kind of torch API:

``[[layer]]``     an ``nn.Module`` class built in ``__init__`` (``torch.nn.Linear``): the JAX
                  constructor per target, argument renames, defaults written out explicitly,
                  the weight layout transforms the verifier and ``weights`` command apply.
``[[function]]``  a function (``torch.sum``, ``torch.nn.functional.relu``).
``[[method]]``    a tensor method (``x.view``, ``x.sum``).

A rule that is not a plain rename names a ``special`` transform: a Python function registered
in :mod:`torch2jax.passes.special` (tf_upgrade_v2 style: special cases are named functions
registered in the table, not ``if`` chains in the engine).

Every rule carries ``[[...examples]]`` (``torch`` source, expected ``jax`` source and the
``inputs`` to run both with); the test-suite converts and executes each of them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

WEIGHT_LAYOUTS = ("as_is", "transpose", "conv")
LAYOUTS = ("torch", "any", "channels_last")


class RuleError(ValueError):
    """A rule file is malformed; the message names the file and the rule."""


@dataclass(frozen=True)
class WeightMap:
    """How one torch tensor of a layer (or one part of it) becomes one parameter of the JAX
    layer.

    A ``weights`` key may name a part of a tensor: ``in_proj_weight[1/3]`` is the second of
    three equal chunks along torch's axis 0 (MultiheadAttention's packed q/k/v projection goes
    to three NNX parameters). ``sum = true`` on several tensors mapped to the same parameter
    adds them (a rule file's; the built-in rules keep each torch tensor apart); going back, the first
    of them receives the sum and the others zeros.
    """

    to: str | None  # None: dropped (e.g. BatchNorm's num_batches_tracked)
    layout: str = "as_is"
    part: tuple[int, int] | None = None  # (i, n): chunk i of n along torch's axis 0
    sum: bool = False

    @property
    def transfer_layout(self) -> str:
        """The layout with the part: what :func:`torch2jax.weights.apply_layout` takes."""
        return self.layout if self.part is None else f"{self.layout}[{self.part[0]}/{self.part[1]}]"


WEIGHT_KEY = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?:\[(?P<i>\d+)/(?P<n>\d+)\])?$")


def weight_source(key: str) -> str:
    """The torch state_dict name a ``weights`` key stands for (``in_proj_weight[0/3]`` ->
    ``in_proj_weight``)."""
    return key.split("[", 1)[0]


@dataclass(frozen=True)
class Subclass:
    """How a user's subclass of a torch layer (``class LayerNorm2d(nn.LayerNorm)`` with its
    own ``forward``) reads the layer it extends, once it derives from the JAX layer instead.

    ``functional`` is the torch function that is the layer's own forward; a call of it with
    ``self.<name>`` for every parameter named in ``reads`` (``F.layer_norm(x,
    self.normalized_shape, self.weight, self.bias, self.eps)``) is ``super().__call__(x)``.
    ``attrs`` gives the JAX layer's name for the torch attributes read elsewhere (``eps`` ->
    ``epsilon``; the weights table's as-is parameters are added); any other torch attribute
    (the rule's params and weights) read in the subclass is marked."""

    functional: str
    reads: tuple[str, ...]
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetLayer:
    """How the linen or equinox target builds a layer from its NNX constructor (as the rule
    emits it): a ``linen = {...}`` / ``equinox = {...}`` table of a ``[[layer]]``.

    ``cls``       the target's constructor (``nn.Dense``, ``eqx.nn.LayerNorm``)
    ``args``      the target's positional arguments, by the NNX parameter names of the rule's
                  ``nnx_params`` (bound from the NNX call's positionals or keywords; one it
                  does not take and ``drop`` does not drop is a keyword); None: the NNX
                  positionals as they are
    ``keywords``  NNX keyword -> the target's keyword, in the target's order; any other NNX
                  keyword not in ``drop`` has no target form (the line is marked). None: every
                  NNX keyword passes through, in its order
    ``drop``      NNX arguments the target does without (linen infers input sizes)
    ``add``       keywords always written last, as source text (``{train}``: the expression
                  that says whether the module trains, linen)
    ``key``       equinox: the constructor takes ``key=``
    ``kind``      equinox: what the layer is for the per-example forward code (linear,
                  layernorm, embedding, dropout, ...: targets/equinox_layers.py's Layer)
    ``weights``   NNX variable -> the target layer's parameter, where the names differ
                  (equinox's LayerNorm ``weight`` is NNX's ``scale``)
    ``refuse``    what the mark says after "<NNX class> argument <name>" when an NNX keyword
                  has no target form (default: "has no <target> form")
    ``rank``      the NNX keyword whose literal tuple's length n (1 to 3) picks the class:
                  ``cls`` + ``"{n}d"`` (``eqx.nn.Conv`` -> ``eqx.nn.Conv2d``; ``cls`` is their
                  base class, which isinstance tests name); the per-example input has n + 1
                  axes (channels first)
    ``strings``   NNX keyword -> the strings the target takes for it (``padding``: SAME,
                  VALID); another literal string there is marked

    Two NNX keywords that ``keywords`` maps to one target keyword (GroupNorm's use_scale and
    use_bias -> channelwise_affine) must both be given, with the same value.
    """

    cls: str
    args: tuple[str, ...] | None = None
    keywords: dict[str, str] | None = None
    drop: tuple[str, ...] = ()
    add: dict[str, str] = field(default_factory=dict)
    key: bool = False
    kind: str = ""
    weights: dict[str, str] = field(default_factory=dict)
    refuse: str = ""
    rank: str = ""
    strings: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Example:
    torch: str
    jax: str
    inputs: dict[str, str] = field(default_factory=dict)
    target: str = "nnx"
    runnable: bool = True


@dataclass(frozen=True)
class Rule:
    """One mapping. ``kind`` is ``layer``, ``function`` or ``method``."""

    kind: str
    torch: str  # qualified torch name, or the method name for methods
    id: str
    jax: str | None = None  # target callable (functions, methods); per target for layers
    targets: dict[str, str] = field(default_factory=dict)  # layer: target -> constructor
    params: tuple[str, ...] = ()  # torch's positional parameter order
    rename: dict[str, str] = field(default_factory=dict)  # torch kwarg -> jax kwarg
    defaults: dict[str, Any] = field(default_factory=dict)  # torch defaults (for layers)
    emit: dict[str, Any] = field(default_factory=dict)  # always emitted jax kwargs
    drop: tuple[str, ...] = ()  # torch args without meaning in JAX (inplace, device, ...)
    special: str | None = None  # name of a transform in passes.special
    layout: str = "torch"  # what activation layout the JAX op wants
    weights: dict[str, WeightMap] = field(default_factory=dict)
    notes: str = ""  # the semantic difference, shown by `torch2jax explain`
    examples: tuple[Example, ...] = ()
    source: str = ""  # file the rule came from
    method_of: str | None = None  # methods: how to call in jax ("method" or "function")
    # layers: a transform of the layer's *call* (``self.attn(q, k, v)``), registered in
    # passes.special's CALLS, given the constructor's and the call's bound arguments;
    # call_params is the torch forward's parameter order
    call: str | None = None
    call_params: tuple[str, ...] = ()
    subclass: Subclass | None = None  # layers: how a user's subclass of it is translated
    # layers: the NNX constructor's positional parameters (names the target tables use)
    nnx_params: tuple[str, ...] = ()
    # layers: per-target construction tables (linen, equinox), see TargetLayer
    target_layers: dict[str, TargetLayer] = field(default_factory=dict)


@dataclass
class RuleSet:
    layers: dict[str, Rule] = field(default_factory=dict)
    functions: dict[str, Rule] = field(default_factory=dict)
    methods: dict[str, Rule] = field(default_factory=dict)

    def all(self) -> list[Rule]:
        return [*self.layers.values(), *self.functions.values(), *self.methods.values()]

    def lookup(self, name: str) -> Rule | None:
        """Find a rule by torch name, rule id or (for methods) ``Tensor.name``."""
        for table in (self.layers, self.functions, self.methods):
            if name in table:
                return table[name]
        for rule in self.all():
            if rule.id == name or rule.torch.rsplit(".", 1)[-1] == name:
                return rule
        if name.startswith(("torch.Tensor.", "Tensor.")):
            return self.methods.get(name.rsplit(".", 1)[-1])
        return None

    def merge(self, other: RuleSet) -> None:
        """Rules of ``other`` (a user's rule directory) extend or override these."""
        self.layers.update(other.layers)
        self.functions.update(other.functions)
        self.methods.update(other.methods)


_KNOWN_KEYS = {
    "torch", "id", "jax", "nnx", "linen", "equinox", "params", "rename", "defaults", "emit",
    "drop", "special", "layout", "weights", "notes", "examples", "aliases", "family", "call",
    "call_params", "subclass", "nnx_params",
}
_TARGET_LAYER_KEYS = {"class", "args", "keywords", "drop", "add", "key", "kind", "weights",
                      "refuse", "rank", "strings"}


def _parse_target_layer(table: dict[str, Any], nnx_params: tuple[str, ...],
                        where: str) -> TargetLayer:
    unknown = set(table) - _TARGET_LAYER_KEYS
    if unknown or "class" not in table:
        raise RuleError(f"{where}: a target table takes class (required) and "
                        f"{sorted(_TARGET_LAYER_KEYS - {'class'})}; unknown: {sorted(unknown)}")
    args = table.get("args")
    for a in args or ():
        if a not in nnx_params:
            raise RuleError(f"{where}: target argument {a!r} is not in nnx_params")
    return TargetLayer(
        cls=table["class"], args=tuple(args) if args is not None else None,
        keywords=dict(table["keywords"]) if "keywords" in table else None,
        drop=tuple(table.get("drop", ())), add=dict(table.get("add", {})),
        key=bool(table.get("key", False)), kind=table.get("kind", ""),
        weights=dict(table.get("weights", {})), refuse=table.get("refuse", ""),
        rank=table.get("rank", ""),
        strings={k: tuple(v) for k, v in table.get("strings", {}).items()})



def _parse_weights(table: dict[str, Any], where: str) -> dict[str, WeightMap]:
    weights: dict[str, WeightMap] = {}
    parts: dict[str, list[tuple[int, int]]] = {}
    for name, spec in table.items():
        if isinstance(spec, str):
            spec = {"to": spec}
        key = WEIGHT_KEY.match(name)
        if key is None:
            raise RuleError(f"{where}: weight key {name!r} is not NAME or NAME[i/n]")
        part = (int(key["i"]), int(key["n"])) if key["i"] is not None else None
        if part is not None:
            parts.setdefault(key["name"], []).append(part)
        to = spec.get("to")
        wl = spec.get("layout", "as_is")
        if wl not in WEIGHT_LAYOUTS:
            raise RuleError(f"{where}: weight {name!r} layout must be one of {WEIGHT_LAYOUTS}")
        unknown = set(spec) - {"to", "layout", "sum"}
        if unknown:
            raise RuleError(f"{where}: weight {name!r}: unknown keys {sorted(unknown)}")
        weights[name] = WeightMap(to=to or None, layout=wl, part=part,
                                  sum=bool(spec.get("sum", False)))
    for source, got in parts.items():
        n = got[0][1]
        if source in weights or sorted(got) != [(i, n) for i in range(n)]:
            raise RuleError(f"{where}: the parts of weight {source!r} must be exactly "
                            f"{source}[0/{n}] .. {source}[{n - 1}/{n}]")
    return weights


def _parse_subclass(table: dict[str, Any] | None, weights: dict[str, WeightMap],
                    where: str) -> Subclass | None:
    if table is None:
        return None
    unknown = set(table) - {"functional", "reads", "attrs"}
    if unknown or "functional" not in table:
        raise RuleError(f"{where}: [layer.subclass] takes functional, reads and attrs")
    attrs = {k: w.to for k, w in weights.items()
             if w.to and w.layout == "as_is" and w.part is None and not w.sum}
    attrs.update(table.get("attrs", {}))
    return Subclass(functional=table["functional"], reads=tuple(table.get("reads", ())),
                    attrs=attrs)


def _parse_rule(kind: str, raw: dict[str, Any], source: str) -> list[Rule]:
    where = f"{source}: [[{kind}]] {raw.get('torch', '?')!r}"
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise RuleError(f"{where}: unknown keys {sorted(unknown)}")
    if "torch" not in raw:
        raise RuleError(f"{where}: missing 'torch'")
    layout = raw.get("layout", "torch")
    if layout not in LAYOUTS:
        raise RuleError(f"{where}: layout must be one of {LAYOUTS}, not {layout!r}")
    weights = _parse_weights(raw.get("weights", {}), where)
    examples = []
    for ex in raw.get("examples", []):
        if "torch" not in ex or "jax" not in ex:
            raise RuleError(f"{where}: every example needs 'torch' and 'jax'")
        examples.append(
            Example(
                torch=ex["torch"],
                jax=ex["jax"],
                inputs=dict(ex.get("inputs", {})),
                target=ex.get("target", "nnx"),
                runnable=ex.get("runnable", True),
            )
        )
    targets = {t: raw[t] for t in ("nnx", "linen", "equinox") if isinstance(raw.get(t), str)}
    nnx_params = tuple(raw.get("nnx_params", ()))
    target_layers = {t: _parse_target_layer(raw[t], nnx_params, f"{where} {t}")
                     for t in ("linen", "equinox") if isinstance(raw.get(t), dict)}
    if target_layers and (kind != "layer" or "nnx" not in targets):
        raise RuleError(f"{where}: linen/equinox tables are for layers with an nnx constructor")
    if kind == "layer" and not targets and not raw.get("special"):
        raise RuleError(f"{where}: a layer rule needs a target constructor (nnx = ...) or special")
    if kind != "layer" and not raw.get("jax") and not raw.get("special"):
        raise RuleError(f"{where}: needs 'jax' or 'special'")
    base = Rule(
        kind=kind,
        torch=raw["torch"],
        id=raw.get("id", raw["torch"]),
        jax=raw.get("jax"),
        targets=targets,
        params=tuple(raw.get("params", ())),
        rename=dict(raw.get("rename", {})),
        defaults=dict(raw.get("defaults", {})),
        emit=dict(raw.get("emit", {})),
        drop=tuple(raw.get("drop", ())),
        special=raw.get("special"),
        layout=layout,
        weights=weights,
        notes=raw.get("notes", "").strip(),
        examples=tuple(examples),
        source=source,
        call=raw.get("call"),
        call_params=tuple(raw.get("call_params", ())),
        subclass=_parse_subclass(raw.get("subclass"), weights, where),
        nnx_params=nnx_params,
        target_layers=target_layers,
    )
    rules = [base]
    # aliases: other torch names with exactly the same JAX translation (torch.bmm -> jnp.matmul)
    for alias in raw.get("aliases", ()):
        rules.append(
            Rule(**{**base.__dict__, "torch": alias, "id": alias, "examples": ()})  # type: ignore[arg-type]
        )
    # family: torch names whose JAX name is their own short name in the same namespace
    # (torch.log -> jnp.log, like torch.exp -> jnp.exp)
    for member in raw.get("family", ()):
        short = member.rsplit(".", 1)[-1]
        jax = base.jax
        if jax:
            jax = jax.rsplit(".", 1)[0] + "." + short if "." in jax.lstrip(".") else (
                "." + short if jax.startswith(".") else short)
        targets = {t: v.rsplit(".", 1)[0] + "." + short for t, v in base.targets.items()}
        rules.append(Rule(**{**base.__dict__, "torch": member, "id": member, "jax": jax,
                             "targets": targets, "examples": ()}))  # type: ignore[arg-type]
    return rules


def parse_rule_text(text: str, source: str) -> RuleSet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{source}: not valid TOML: {exc}") from None
    rs = RuleSet()
    tables = {"layer": rs.layers, "function": rs.functions, "method": rs.methods}
    for key in data:
        if key not in tables:
            raise RuleError(f"{source}: unknown table [[{key}]] (use layer, function or method)")
    for kind, table in tables.items():
        for raw in data.get(kind, []):
            for rule in _parse_rule(kind, raw, source):
                if rule.torch in table and table[rule.torch].source == source:
                    raise RuleError(f"{source}: {kind} {rule.torch!r} is defined twice")
                table[rule.torch] = rule
    return rs


def _builtin_rule_files() -> list[tuple[str, str]]:
    here = Path(__file__).resolve().parent.parent / "rules"
    if here.is_dir():  # source checkout or editable install
        return [(f"rules/{p.name}", p.read_text()) for p in sorted(here.glob("*.toml"))]
    pkg = resources.files("torch2jax.rules")
    return [
        (f"rules/{p.name}", p.read_text())
        for p in sorted(pkg.iterdir(), key=lambda p: p.name)
        if p.name.endswith(".toml")
    ]


@cache
def builtin_rules() -> RuleSet:
    rs = RuleSet()
    for source, text in _builtin_rule_files():
        rs.merge(parse_rule_text(text, source))
    return rs


def load_rules(extra_dirs: tuple[str, ...] = ()) -> RuleSet:
    """The built-in rules, extended or overridden by ``*.toml`` files in ``extra_dirs``."""
    rs = RuleSet()
    rs.merge(builtin_rules())
    for d in extra_dirs:
        for p in sorted(Path(d).glob("*.toml")):
            rs.merge(parse_rule_text(p.read_text(), str(p)))
    return rs
