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
reshape, a reduction over the batch axis, an unknown function applied to a batched value)
keeps the module batched, with the modules connected to it (:func:`_batched_fallback`): NNX's
batched code, each equinox layer mapped over the leading axes, ``batched = True`` on the
class. What neither form can write is left as it was with a ``# TODO(torch2jax)`` marker and
an error diagnostic. Training code
(optimizers, train and eval steps, loops) is rewritten by equinox_training.py; what it does not
rewrite is put back as the torch source and marked.

This module drives the pass (:func:`convert`, :func:`from_nnx`) and writes each class; the
layer constructors are in equinox_layers.py, ``__init__`` and the class shell in
equinox_init.py, per-example forward code in equinox_forward.py (its layer calls in
equinox_calls.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.finish.removed import bound_names
from torch2jax.passes.common import code, expr, freezable_dataclasses, freeze_dataclass, int_value
from torch2jax.passes.helpers import HELPERS, add_helpers
from torch2jax.report import Diagnostic
from torch2jax.result import ConversionResult, ModuleFlags, TrainStepRecord
from torch2jax.targets import equinox_checkpoints as checkpoints
from torch2jax.targets import equinox_methods as class_methods
from torch2jax.targets import equinox_training as training
from torch2jax.targets.equinox_forward import DRAW_KEY, Forward, _reshape_rank
from torch2jax.targets.equinox_host import HostPools
from torch2jax.targets.equinox_init import (
    NNX_MODULE,
    ClassInfo,
    _after_docstring,
    _annotation,
    _comment_out,
    _dataclass_fields,
    _has_nnx,
    _Identity,
    _Inference,
    _init_of,
    _InitRewriter,
    _is_module_class,
    _key_param,
    _Lambdas,
    _NoNnx,
    _passed_classes,
    _Rename,
    _split_keys,
    _squeeze,
    _uses_nnx,
    direct_init,
    reads_nnx_weight,
)
from torch2jax.targets.equinox_keys import keyed_functions
from torch2jax.targets.equinox_layers import (
    RULE,
    EquinoxError,
    Info,
    Layer,
    _todo,
    batched_form,
    layer_of,
)
from torch2jax.targets.equinox_lines import torch_lines


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
            if _has_nnx(new.body):
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
            # (a module kept batched is written once for whatever its callers pass: its
            # code is the NNX translation's, each layer mapped over the leading axes)
            if not info.batched and [(i.batched, i.rank) for i in info.inputs] != [
                    (i.batched, i.rank) for i in inputs]:
                info.errors.append(f"{name} is called with inputs of different ranks; its "
                                   "per-example code follows the first call")
                info.failed.append(info.errors[-1])
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
        info.failed = fw.failed
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
            # (before the parameters with defaults: callers pass it after the required ones)
            at = next((i for i, p in enumerate(plist) if p.default is not None), len(plist))
            plist.insert(at, cst.Param(cst.Name("state")))
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


def _lists_passed_in(classes: dict[str, ClassInfo], nnx: dict[str, cst.ClassDef],
                     module: cst.Module) -> None:
    """``self.layers = nn.ModuleList(layers)`` with ``layers`` a constructor argument: the
    layers it holds are those of the calls that build the class in the file's other modules
    (``Stack([nn.Linear(8, 8), nn.Linear(8, 8)])``), anywhere in the file, when every such
    call passes a literal list (or a comprehension) of layers of one kind. Any other call,
    or none, leaves the list unknown."""
    for name, c in classes.items():
        init = _init_of(nnx[name], "__init__")
        if init is None:
            continue
        params = [p.name.value for p in init.params.params[1:]]
        for attr, lay in list(c.attrs.items()):
            if lay.kind == "value":  # self.fn = fn: the layers the calls pass as fn
                param = _list_param(init, attr)
                if param is not None and param in params:
                    one = _passed_layers(name, params.index(param), param, module, set(nnx),
                                         single=True)
                    c.attrs[attr] = _one_layer(one) or replace(lay, passed=one is None)
                continue
            if lay.kind != "list" or lay.items:
                continue
            param = _list_param(init, attr)
            if param is None or param not in params:
                continue
            kinds = _passed_layers(name, params.index(param), param, module, set(nnx))
            if kinds is not None and len({(p.kind, p.cls, p.stateful, p.keyed, p.rank)
                                          for p in kinds}) == 1:
                c.attrs[attr] = replace(lay, items={"*": kinds[0]})
            elif kinds is not None and len({batched_form(p) for p in kinds}) == 1:
                c.attrs[attr] = replace(lay, mixed=kinds[0])
            else:  # (a module kept batched calls each through on_batch)
                c.attrs[attr] = replace(lay, passed=True)


def _list_param(init: cst.FunctionDef, attr: str) -> str | None:
    """The parameter ``p`` of ``self.attr = nnx.List(p)`` (or ``list(p)``, or ``p``)."""
    wrapped = m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("List")) | m.Name(
        "list"), args=[m.Arg(value=m.Name(), keyword=None)])
    for a in findall(init, m.Assign(targets=[m.AssignTarget(m.Attribute(
            value=m.Name("self"), attr=m.Name(attr)))])):
        value = a.value
        if m.matches(value, wrapped):
            value = value.args[0].value
        return value.value if isinstance(value, cst.Name) else None
    return None


def _one_layer(passed: list[Layer] | None) -> Layer | None:
    """The layer an attribute holds when the calls of its class pass it (``Residual(
    LinearAttention(...))``, ``Residual(Attention(...))``): the layer they all pass, or the
    module classes of the file they pass (one ``module`` layer, the others ``alts``)."""
    if not passed:
        return None
    if len({(p.kind, p.cls, p.stateful, p.keyed, p.rank) for p in passed}) == 1:
        return passed[0]
    if all(p.kind == "module" and not p.alts for p in passed):
        classes = tuple(dict.fromkeys(p.cls for p in passed))
        return Layer("module", cls=classes[0], alts=classes[1:])
    return None


def _passed_layers(cls: str, index: int, param: str, module: cst.Module, names: set[str],
                   single: bool = False) -> list[Layer] | None:
    """The layers that the calls ``cls(...)`` of the file pass as the argument ``param``
    (positional ``index``), each call a literal list or a comprehension (``single``: one
    layer); None otherwise."""
    found: list[Layer] = []
    calls = findall(module, m.Call(func=m.Name(cls)))
    # the class used otherwise than called (a subclass, a partial, passed as a value) may be
    # built with other layers
    if len(findall(module, m.Name(cls))) != len(calls) + 1:
        return None
    for call in calls:
        pos = [a for a in call.args if a.keyword is None]
        if any(a.star for a in call.args):
            return None
        kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        value = kw.get(param, pos[index].value if index < len(pos) else None)
        if single:
            elements = [value] if isinstance(value, cst.Call) else None
            if elements is None:
                return None
        elif isinstance(value, (cst.List, cst.Tuple)) and value.elements:
            elements = [e.value for e in value.elements]
        elif isinstance(value, cst.ListComp):
            elements = [value.elt]
        else:
            return None
        for e in elements:
            if isinstance(e, cst.StarredElement):
                return None
            try:
                _, lay = layer_of(e, names)
            except EquinoxError:
                return None
            if lay.kind in ("value", "list", "dict", "seq"):
                return None
            found.append(lay)
    return found or None


def _keys_needed(classes: dict[str, ClassInfo]) -> None:
    changed = True
    for c in classes.values():
        c.stateful = any(a.stateful or a.kind == "bn" for a in _all_layers(c))
        # a forward that draws (NNX's self.rngs()) takes a key, in inference mode too
        c.draws = bool(findall(c.node, DRAW_KEY))
        c.keyed = c.draws or any(a.keyed or a.kind == "dropout" for a in _all_layers(c))
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
                    if sub.draws and not c.draws:
                        c.draws = changed = True
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
        stack += list(a.items.values()) + ([a.mixed] if a.mixed is not None else [])


class _LayerDictToDict(cst.CSTTransformer):
    def leave_Name(self, original_node, updated_node):
        return expr("nnx.Dict") if updated_node.value == "LayerDict" else updated_node


# definitions the NNX pass wrote: they go
NNX_HELPER_CLASSES = ("LayerDict", "BatchNorm", "TorchGRUCell", "TorchLSTMCell", "TorchLSTM")


def _without_nnx_helpers(module: cst.Module) -> cst.Module:
    """The NNX pass's helper classes go: LayerDict (an nnx.Dict in insertion order) is read as
    the nnx.Dict this pass translates (into a dict); BatchNorm and TorchGRUCell calls stay, for the
    equinox helpers of those names that :func:`convert` writes in."""
    module = module.with_changes(body=[s for s in module.body if not (
        isinstance(s, cst.ClassDef) and s.name.value in NNX_HELPER_CLASSES)])
    return module.visit(_LayerDictToDict())


def convert(nnx_code: str, torch_source: str, per_example: Collection[str] = (),
            train_steps: tuple[TrainStepRecord, ...] = (), eval_step: str | None = None,
            imported: Mapping[str, ModuleFlags] | None = None
            ) -> tuple[str, list[tuple[int, str]], list[tuple[str, str]],
                       dict[str, ModuleFlags]]:
    """NNX code -> equinox code. Returns the code, ``(line, message)`` of each TODO this
    pass added, ``(class, message)`` of the input ranks it took from a first layer, and how
    each module class of the file is called (ModuleFlags, for the files importing it).
    ``per_example``: the code of the NNX pass's layers written for one example
    (ConversionResult.per_example); ``train_steps`` and ``eval_step``: the steps the NNX
    pass wrote (ConversionResult.train_steps, ConversionResult.eval_step); ``imported``: the
    flags of module classes the file imports from other files of the repository, where the
    converter read them (repo_classes.py)."""
    imported = {} if imported is None else imported
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
    _lists_passed_in(f.classes, {c.name.value: c for c in module.body
                                 if isinstance(c, cst.ClassDef) and c.name.value in f.classes},
                     module)
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
    _batched_fallback(f, used)
    body = []
    needs_callable = needs_any = False
    frozen = freezable_dataclasses(module) if _stores_objects(f) else set()
    torch_defs = {s.name.value: s for s in torch_module.body
                  if isinstance(s, (cst.FunctionDef, cst.ClassDef))}
    module = _init_function_loops(module, f)  # model.apply(weights_init)
    # def main(*, rngs: nnx.Rngs) -> def main(*, key) (equinox_keys.py)
    module = keyed_functions(module, set(f.builders))
    # training code (optimizer, train and eval steps, loops): equinox_training.py
    rest = [s for s in module.body if not _is_import(s) and not isinstance(s, cst.ClassDef)
            and not (isinstance(s, cst.FunctionDef) and s.name.value in f.builders)]
    flags: dict[str, tuple[bool, bool] | None] = {n: (c.stateful, c.keyed)
                                                   for n, c in f.classes.items()}
    # classes imported from the other files: Class(..., rngs=nnx.Rngs(k)) -> Class(..., key=k)
    # (the flags of a class imported are read only for those the file builds: each costs
    # the conversion of its file, repo_classes.py)
    built = {c.func.value for c in findall(module, m.Call(func=m.Name(), args=[
        m.ZeroOrMore(), m.Arg(keyword=m.Name("rngs")), m.ZeroOrMore()]))}
    outside = {n: imported[n] for n in _imported_names(module) & built
               if n not in flags and n in imported}
    flags.update({n: (outside[n].stateful, outside[n].keyed) if n in outside else None
                  for n in _imported_names(module) if n not in flags})
    # checkpoint dicts of the model's and the optimizer's states (equinox_checkpoints.py;
    # a model with state, its own class or one imported, is left: marked)
    module, rewritten = checkpoints.rewrite(module, any(
        v[0] if v is not None else n in built for n, v in flags.items()), training.OPT_STATE)
    if rewritten:
        rest = [s for s in module.body if not _is_import(s) and not isinstance(s, cst.ClassDef)
                and not (isinstance(s, cst.FunctionDef) and s.name.value in f.builders)]
    ctx = training.TrainingContext(
        batch_reduced={n: c.reduced for n, c in f.classes.items()
                       if n not in used and c.reduced},
        optimizer_methods={n: frozenset(s.name.value for s in c.node.body.body if isinstance(
            s, cst.FunctionDef) and class_methods.optimizer_method(s) is not None)
            for n, c in f.classes.items()},
        layer_of=_training_layer, train_steps=tuple(train_steps), eval_step=eval_step,
        batched=frozenset(n for n, c in f.classes.items() if c.batched) | frozenset(
            n for n, g in outside.items() if g.batched),
        draws=frozenset(n for n, c in f.classes.items() if c.draws) | frozenset(
            n for n, g in outside.items() if g.draws),
        builders={n: layer.cls for n, (_, layer) in f.builders.items()
                  if layer.kind == "module" and layer.cls in f.classes})
    translated = dict(zip(map(id, rest), training.translate(rest, flags, ctx), strict=True))
    for s in module.body:
        if isinstance(s, cst.ClassDef) and s.name.value in f.classes:
            new, callable_, any_ = _emit_class(f.classes[s.name.value], f,
                                               ctx.optimizer_methods)
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
            elif any(_has_nnx(n) for n in done):
                body.append(_torch_back(s, torch_defs))
            else:
                body += done
        elif isinstance(s, cst.ClassDef) and not _nnx_module_class(s) and _has_nnx(s) and \
                not _has_nnx(host := s.visit(HostPools())):
            body.append(host)  # host-side code (a Dataset's arrays): equinox_host.py
        elif _has_nnx(s) and not _is_import(s):
            body.append(_torch_back(s, torch_defs))
        else:
            body.append(s)
    if class_methods.INIT_FN in f.needs:
        at = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef))
        body.insert(at, cst.parse_statement(class_methods.INIT_SRC).with_changes(
            leading_lines=body[at].leading_lines))
        body[at + 1] = body[at + 1].with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)
    # nothing NNX is left: annotations naming NNX classes become Any, other leftovers are
    # commented out and marked
    guard = _NoNnx()
    body = [s if _is_import(s) else s.visit(guard) for s in body if not _nnx_helper(s)]
    needs_any |= guard.any
    module, _ = add_helpers(module.with_changes(body=body), "equinox")  # lstm_scan, BatchNorm
    module = _imports(module, needs_callable, needs_any)
    text = module.code
    todos = [(i + 1, line.split("TODO(torch2jax): ", 1)[1])
             for i, line in enumerate(text.splitlines())
             if f"[{RULE}]" in line and "# TODO(torch2jax): " in line]
    assumed = [(name, _assumed_ranks(name, c.assumed)) for name, c in f.classes.items()
               if name not in used and c.assumed]
    return text, todos, assumed, {n: ModuleFlags(c.stateful, c.keyed, c.batched, c.draws)
                                  for n, c in f.classes.items()}


def _init_function_loops(module: cst.Module, f: EquinoxFile) -> cst.Module:
    """``model.apply(weights_init)`` of a function of the file, at the top level or in a
    function's body (equinox_methods.py's init_function_loops): ``model = init_layers(...)``,
    and the function in its equinox form."""
    fns = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}

    def rewrite(fns):
        body, loops = class_methods.init_function_loops(list(module.body), fns)
        for i, s in enumerate(body):
            if isinstance(s, cst.FunctionDef):
                inner, u = class_methods.init_function_loops(list(s.body.body), fns)
                if u:
                    body[i] = s.with_changes(body=s.body.with_changes(body=inner))
                    loops += u
        return body, loops
    body, loops = rewrite(fns)
    # a function also used otherwise (called on one layer: NNX's in place, equinox's
    # returning the layer) stays NNX, marked
    names = [n.value for n in findall(module, m.Name())]
    used = {fn for fn in loops if names.count(fn) - 1 == loops.count(fn)}
    if set(loops) != used:
        body, _ = rewrite({n: fn for n, fn in fns.items() if n in used})
    if not used:
        return module
    if any(findall(s, m.Call(func=m.Name(class_methods.INIT_FN))) for s in body):
        f.needs.add(class_methods.INIT_FN)
    return module.with_changes(body=[
        class_methods.init_method(s, method=False) if isinstance(s, cst.FunctionDef) and
        s.name.value in used else s for s in body])


def _batched_fallback(f: EquinoxFile, used: set[str]) -> None:
    """The modules whose forward has a statement with no per-example form shown, with the
    modules they call and those that call them: their forward keeps torch's batch axis, as
    the NNX translation has it (``ClassInfo.batched``), each equinox layer mapped over the
    leading axes. A group of modules stays per example (its statements marked) when its
    batched form has marks too."""
    calls = {n: {k for a in _all_layers(c) if a.kind == "module"
                 for k in (a.cls, *a.alts) if k in f.classes} for n, c in f.classes.items()}
    done: set[str] = set()
    for start in [n for n, c in f.classes.items() if c.failed]:
        if start in done:
            continue
        group, todo = set(), [start]
        while todo:  # the modules connected to it, callers and callees
            n = todo.pop()
            if n in group:
                continue
            group.add(n)
            todo += [k for k in calls[n] if k not in group]
            todo += [k for k, v in calls.items() if n in v and k not in group]
        done |= group
        saved = {n: replace(f.classes[n], errors=list(f.classes[n].errors),
                            assumed=list(f.classes[n].assumed)) for n in group}
        for n in group:
            c = f.classes[n]
            c.batched, c.inputs, c.output, c.new_call = True, None, None, None
            c.fw_methods = {}
            c.reduced, c.assumed, c.failed = {}, [], []
            c.errors = [e for e in c.errors if "is called with inputs of different" not in e]
        order = sorted(group, key=lambda n: n in used)  # the models first
        for n in order:
            if f.classes[n].inputs is None:
                f.analyse(n, [Info() for _ in _call_params(f.classes[n].node)])
        if any(f.classes[n].failed for n in group):
            f.classes.update(saved)


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
    if rw.errors or _has_nnx(new.body):
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


def _nnx_helper(stmt) -> bool:
    """A helper function the NNX translation wrote whose equinox form differs (the key paths
    of an equinox model are its fields): dropped, add_helpers writes the equinox one."""
    forms = HELPERS.get(stmt.name.value, {}) if isinstance(stmt, cst.FunctionDef) else {}
    return "equinox" in forms and "nnx" in forms and forms["equinox"] != forms["nnx"]


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


class _ParamLeaves(cst.CSTTransformer):
    """``nnx.state(self, nnx.Param)`` (NNX's ``self.parameters()``) in a method of a module
    with no buffers -> ``eqx.filter(self, eqx.is_inexact_array)``, and torch's
    ``self.parameters()`` its leaves: its parameters are its floating-point arrays
    (``next(self.parameters())`` read for its dtype)."""

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node, m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name(
                "state")), args=[m.Arg(m.Name("self")), m.Arg(m.Attribute(value=m.Name("nnx"),
                                                                          attr=m.Name("Param")))])):
            return cst.parse_expression("eqx.filter(self, eqx.is_inexact_array)")
        if m.matches(updated_node, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(
                "parameters")), args=[])):  # (torch's, left by the NNX pass)
            return cst.parse_expression(
                "iter(jax.tree.leaves(eqx.filter(self, eqx.is_inexact_array)))")
        return updated_node


class _TiedHead(cst.CSTTransformer):
    """``del self.decoder.kernel`` (NNX's translation of a Linear's weight tied to an
    embedding's, ``self.decoder.weight = self.encoder.weight``; the forward pass reads
    ``hasattr(self.decoder, "kernel")``) -> ``self.decoder = eqx.tree_at(lambda m: m.weight,
    self.decoder, None)``: the decoder has no weight of its own, the forward pass reads the
    embedding's (equinox_forward.py)."""

    def __init__(self, attrs: dict) -> None:
        self.attrs = attrs

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not m.matches(updated_node, m.SimpleStatementLine(body=[m.Del(m.Attribute(
                value=m.Attribute(value=m.Name("self"), attr=m.Name()), attr=m.Name("kernel")))])):
            return updated_node
        name = updated_node.body[0].target.value.attr.value
        if self.attrs.get(name, Layer("value")).kind != "linear":
            return updated_node
        return cst.parse_statement(f"self.{name} = eqx.tree_at(lambda m: m.weight, self.{name}, "
                                   "None)\n").with_changes(leading_lines=updated_node.leading_lines)


def _nnx_module_class(cls: cst.ClassDef) -> bool:
    """Whether the NNX translation made ``cls`` a module class (an ``nnx.Module`` base, or a
    constructor taking ``rngs``); a plain class (a trainer) is not one."""
    init = _init_of(cls, "__init__")
    return any(m.matches(b.value, NNX_MODULE) for b in cls.bases) or (
        bool(cls.bases) and init is not None and any(
            p.name.value == "rngs" for p in (*init.params.params, *init.params.kwonly_params)))


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


def _emit_class(c: ClassInfo, f: EquinoxFile, optimizer_methods: Mapping[str, frozenset[str]]
                ) -> tuple[cst.ClassDef, bool, bool]:
    """The equinox class of ``c``; ``optimizer_methods``: class -> its methods that return
    the optax transform (TrainingContext.optimizer_methods)."""
    cls = c.node
    for name in c.identities:
        stateful, keyed = _takes(c.attrs[name], f.classes)
        if stateful or keyed:
            cls = cls.visit(_Identity({name}, "eqx.nn.Sequential([])" if stateful
                                      else "eqx.nn.Identity()"))
    cls = _without_module_stream(cls)
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
            loop = class_methods.init_loop(s, list(assigned), methods)
            if loop is not None:
                c.init_methods.add(code(loop).split("(self.", 1)[1].split(",", 1)[0])
                f.needs.add(class_methods.INIT_FN)
                s = loop
            s = direct_init(s, c.attrs) or s  # nn.init.constant_(self.fc.weight, 0.1)
            s = s.visit(_TiedHead(c.attrs))  # del self.decoder.kernel (a tied decoder)
            for a in findall(s, m.AssignTarget(m.Attribute(value=m.Name("self")))):
                name = a.target.attr.value
                if name not in assigned and c.attrs.get(name, Layer("value")).kind not in (
                        "value", "buffer", "param", "fn", "lambda"):
                    assigned.append(name)  # the fields that hold layers
            new_body.append(s)
        torch_init = _init_of(torch_cls, "__init__") if torch_cls is not None else None
        new_body = [_untranslated_init_line(s, new_body[i + 1:], torch_init)
                    if _uses_nnx(s) or reads_nnx_weight(s, c.attrs) else s
                    for i, s in enumerate(new_body)]
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
        if isinstance(s, cst.FunctionDef) and s.name.value not in ("__init__", "__call__") and \
                not any(a.kind == "buffer" for a in c.attrs.values()):
            s = body[i] = s.visit(_ParamLeaves())  # next(self.parameters()), for its dtype
        if isinstance(s, cst.FunctionDef) and s.name.value in c.init_methods:
            body[i] = class_methods.init_method(s)
        elif isinstance(s, cst.FunctionDef) and s.name.value in c.methods:
            body[i] = c.methods[s.name.value]
        elif isinstance(s, cst.FunctionDef) and s.name.value in optimizer_methods.get(
                c.name, ()):
            body[i] = class_methods.optimizer_method(s)
        elif isinstance(s, cst.FunctionDef) and s.name.value in c.fw_methods:
            # a method the forward pass calls, written like it (Forward.call_method)
            fn, sites = c.fw_methods[s.name.value]
            fn = fn.with_changes(body=fn.body.with_changes(body=_name_call_keys(
                list(fn.body.body), sites)))
            body[i] = _key_param(fn, default_none=True) if sites else fn
        elif isinstance(s, cst.FunctionDef) and s.name.value not in ("__init__", "__call__") \
                and ("nnx." in code(s) or findall(s, DRAW_KEY) or reads_nnx_weight(s, c.attrs)):
            # (an NNX variable read, self.wpe.embedding: equinox's layers name it weight)
            # (a substring test, kept for byte-identical output: it also takes a method whose
            # translation mentions nnx only in a TODO comment for the torch method)
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
    if c.batched:
        at = _after_docstring(body) + len(fields)
        marker = cst.parse_statement("batched = True\n").with_changes(leading_lines=[
            cst.EmptyLine(indent=False), *(cst.EmptyLine(comment=cst.Comment(f"# {line}"))
                                           for line in BATCHED_NOTE)])
        body = [*body[:at], marker, *body[at:]]
    bases = [b.with_changes(value=cst.parse_expression("eqx.Module"))
             if m.matches(b.value, NNX_MODULE) else b for b in cls.bases]
    return cls.with_changes(bases=bases, body=cls.body.with_changes(body=body)), \
        needs_callable, needs_any


_FORK = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Attribute(value=m.Name("self"), attr=m.Name("rngs")))],
    value=m.Call(func=m.Attribute(value=m.Name("rngs"), attr=m.Name("fork"))))])


def _without_module_stream(cls: cst.ClassDef) -> cst.ClassDef:
    """NNX's ``self.rngs = rngs.fork()`` (the module's own stream, for draws at call time)
    goes: the equinox forward pass takes a key instead (Forward.draw); a method that still
    draws from it is marked where the class is written."""
    init = _init_of(cls, "__init__")
    if init is None or not any(m.matches(s, _FORK) for s in init.body.body):
        return cls
    new = init.with_changes(body=init.body.with_changes(body=[
        s for s in init.body.body if not m.matches(s, _FORK)]))
    return cls.with_changes(body=cls.body.with_changes(body=[
        new if s is init else s for s in cls.body.body]))


# the comment above ``batched = True`` in a module kept batched
BATCHED_NOTE = ("called on a batch, not per example: its forward keeps torch's batch axis",
                "(no per-example form of it was shown), each equinox layer mapped over the",
                "leading axes")


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


def from_nnx(nnx: ConversionResult, source: str, path: str,
             imported: Mapping[str, ModuleFlags] | None = None) -> ConversionResult:
    """The converter's entry: a ConversionResult for NNX -> one for equinox. The NNX pass's
    diagnostics are kept (their TODO lines stay in the code); this pass adds its own.
    ``imported``: the flags of the module classes it imports (:func:`convert`)."""
    text, todos, assumed, flags = convert(nnx.code, source, nnx.per_example, nnx.train_steps,
                                          nnx.eval_step, imported)
    # (their lines in ``text`` are neither the torch file's nor the finished file's)
    lines = torch_lines(text, source, f"[{RULE}]")
    if len(lines) != len(todos):  # (a TODO comment not before a statement)
        lines = [1] * len(todos)
    diags = list(nnx.diagnostics) + [Diagnostic(path, line, 0, RULE, "error", msg.rsplit(
        f" [{RULE}]", 1)[0]) for line, (_, msg) in zip(lines, todos, strict=True)]
    lines = source.splitlines()
    for name, message in assumed:  # a warning at the torch class
        at = next((i + 1 for i, line in enumerate(lines)
                   if line.lstrip().startswith(f"class {name}(")), 1)
        diags.append(Diagnostic(path, at, 1, RULE, "warning", message))
    return ConversionResult(code=text, diagnostics=diags, module_flags=flags)
