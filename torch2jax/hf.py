"""Modeling files of the installed Hugging Face ``transformers`` (``models/llama/modeling_llama.py``).

Such a file is torch code plus transformers' own machinery: ``PreTrainedModel`` and its init
hooks, ``ACT2FN``, the attention-interface registry, the output dataclasses, masks, kernels
from the hub, and decorators (``@auto_docstring``, ``@can_return_tuple``, ...). The converter
does not convert that machinery (``modeling_utils.py`` alone is thousands of lines of torch
and hub plumbing). It *reduces* the modeling file first (:func:`reduce_modeling`):

* the decorators that do nothing for a JAX model go (``@auto_docstring``,
  ``@use_kernel_forward_from_hub(...)``, ``@use_kernelized_func(...)``);
* the imports of the machinery (``from ...activations import ACT2FN``) are read from
  ``_hf_support.py`` instead, a hand-written JAX module (``torch2jax/transformers_runtime.py``,
  written as it is beside the converted package) with the same names: ``PreTrainedModel`` and
  ``GradientCheckpointingLayer`` as ``nnx.Module`` bases, ``ACT2FN`` of ``jax.nn`` functions,
  ``create_causal_mask``, the output classes as pytrees, ``StaticCache`` and greedy
  ``generate``, the decorators translated (``@use_experts_implementation``: one static-shape
  grouped experts forward for every implementation). What it does not translate it refuses
  at run time with NotImplementedError (KV caches other than ``StaticCache``, output
  capture, RoPE variants other than the default, attention dropout in training, flash and
  flex attention), never silently;
* the functional attention dropout of ``eager_attention_forward``
  (``nn.functional.dropout(w, p=dropout, training=module.training)``, where the callers pass
  ``dropout=0.0`` unless training) becomes ``attention_dropout(w, dropout)`` from the same
  module;
* ``Model._from_config(config)`` of a class of the file is ``Model(config)``;
* ``AutoModel.from_config(config.text_config)`` (and every ``AutoModelFor...``) reads the
  support module's ``AutoModel``, whose ``from_config`` builds the *converted* class that the
  config's ``model_type`` maps to: the package side (``verify/package.py``) converts those
  modeling files too and writes the table of them (``_hf_auto.py``) beside the support module;
* ``load_backbone(config)`` (detection, segmentation, OCR, depth and pose models) reads
  ``_hf_backbone.py`` (``torch2jax/transformers_backbone.py``, written beside the support
  module), whose ``load_backbone`` builds the converted class of ``backbone_config``'s model
  type through the support module's ``AutoBackbone`` (the backbone's file is converted with
  the model's and named in ``_hf_auto.py``); ``BackboneMixin`` and
  ``filter_output_hidden_states`` of a backbone class come from there too;
* ``_init_weights`` methods go (torch initialisation: the converted model starts from flax's
  initialisers; trained weights come with ``torch2jax weights``);
* the classes and functions that no requested class reaches go
  (``LlamaForSequenceClassification`` built on ``GenericForSequenceClassification``).

The configuration classes stay the installed transformers' own (plain Python): the converted
model takes the same ``LlamaConfig`` as torch's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst
import libcst.matchers as m

SUPPORT_MODULE = "_hf_support"
RUNTIME = Path(__file__).with_name("transformers_runtime.py")
# transformers' activations (ACT2FN, ACT2CLS), written beside the support module, which imports them
ACTIVATIONS_MODULE = "_hf_activations"
ACTIVATIONS_RUNTIME = Path(__file__).with_name(f"{ACTIVATIONS_MODULE}.py")
# transformers' backbone machinery (backbone_utils.py), written beside the support module
BACKBONE_MODULE = "_hf_backbone"
BACKBONE_RUNTIME = Path(__file__).with_name("transformers_backbone.py")
BACKBONE_NAMES = {"load_backbone", "BackboneMixin", "filter_output_hidden_states"}
_BACKBONE_SOURCES = ("transformers.backbone_utils", "transformers.utils.backbone_utils")
# decorators that do nothing for a JAX model (documentation, kernels from the hub)
DROPPED_DECORATORS = {"auto_docstring", "use_kernel_forward_from_hub", "use_kernelized_func",
                      "use_kernel_func_from_hub"}
# the support module's names: every import of them from transformers' machinery reads them there
SUPPORT_NAMES = {
    "ACT2FN", "ACT2CLS", "get_activation", "gelu", "gelu_new", "gelu_fast", "gelu_python",
    "gelu_pytorch_tanh", "quick_gelu", "silu", "mish", "Cache", "DynamicCache", "GenerationMixin",
    "create_causal_mask", "create_sliding_window_causal_mask", "GradientCheckpointingLayer",
    "BaseModelOutput", "BaseModelOutputWithPast", "BaseModelOutputWithPastAndCrossAttentions",
    "CausalLMOutputWithPast", "CausalLMOutputWithCrossAttentions",
    "BaseModelOutputWithPoolingAndCrossAttentions", "MaskedLMOutput", "ModelOutput",
    "ROPE_INIT_FUNCTIONS", "dynamic_rope_update", "ALL_ATTENTION_FUNCTIONS", "AttentionInterface",
    "PreTrainedModel",
    "slice_logits_to_keep", "Unpack", "TransformersKwargs", "can_return_tuple", "logging",
    "deprecate_kwarg", "merge_with_config_defaults", "capture_outputs", "check_model_inputs",
    "Conv1D", "attention_dropout", "OutputRecorder", "maybe_autocast", "EncoderDecoderCache",
    "create_bidirectional_mask", "create_bidirectional_sliding_window_mask",
    "create_recurrent_attention_mask", "FlashAttentionKwargs", "apply_chunking_to_forward",
    "torch_int", "is_torchdynamo_compiling", "is_deepspeed_zero3_enabled",
    "use_experts_implementation", "DUMMY_INPUTS", "DUMMY_MASK",
    "compile_compatible_method_lru_cache",
}
# layer classes of the support module (their constructors take rngs)
SUPPORT_LAYERS = {"PreTrainedModel", "GradientCheckpointingLayer", "Conv1D"}
# transformers.modeling_outputs' classes (ImageClassifierOutput, Seq2SeqLMOutput, ...): the
# support module makes each one it is asked for (a ModelOutput, its fields by keyword)
_OUTPUT = re.compile(r"^[A-Z]\w*Output(With\w+)?$")
# transformers' auto classes (AutoModel, AutoModelForCausalLM, ...): the support module's
# stand-ins build the converted class of a config's model_type (``from_config``)
AUTO = re.compile(r"^Auto(Model(For\w+)?|Backbone)$")
AUTO_TABLE = "_hf_auto"
_DROPOUT = re.compile(r"^(nn\.functional|F|torch\.nn\.functional)\.dropout$")


def is_modeling_file(module: str) -> bool:
    """``transformers.models.<name>.modeling_<name>``."""
    parts = module.split(".")
    return (len(parts) == 4 and parts[0] == "transformers" and parts[1] == "models"
            and parts[3].startswith("modeling_"))


def _config_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("configuration_")


def _reached(tree: ast.Module, entry: set[str]) -> set[str] | None:
    """The top-level definitions that the entry classes reach (bases, names in bodies), or None
    when no entry class is defined here (nothing is pruned then)."""
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    todo = [e for e in entry if e in defs]
    if not todo:
        return None
    for node in tree.body:  # module-level statements (not __all__) keep what they name
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)):
            continue
        todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in defs]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in _walk_kept(defs[name]):
            if isinstance(node, ast.Name) and node.id in defs and node.id not in seen:
                todo.append(node.id)
    return seen


def _walk_kept(node: ast.AST):
    """ast.walk, less the ``_init_weights`` methods that the reduction removes (what only they
    call, CLIP's ``_init_child_weight``, goes with them)."""
    stack = [node]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not (
            isinstance(child, ast.FunctionDef) and child.name == "_init_weights"))


class _Reduce(cst.CSTTransformer):
    def __init__(self, module: str, keep: set[str] | None, defined: set[str]) -> None:
        self.level = module.count(".")  # transformers.models.llama.modeling_llama: ...
        self.package = module.rpartition(".")[0]
        self.keep, self.defined = keep, defined
        self.depth = 0
        self.used: set[str] | None = None  # the second pass: the names the code reads
        self.support: list[str] = []
        self.backbone: list[str] = []  # the names read from BACKBONE_MODULE
        self.unknown: list[tuple[str, str]] = []  # (module, name) of the machinery not supported
        self.autos: set[str] = set()  # the auto classes the file builds sub-models with
        self.init_alias = ""  # from ... import initialization as init: "init"

    def _absolute(self, node: cst.ImportFrom) -> str:
        dots = len(node.relative)
        mod = cst.Module([]).code_for_node(node.module) if node.module else ""
        if dots == 0:
            return mod
        base = self.package.split(".")
        base = base[: len(base) - dots + 1]
        return ".".join(base + ([mod] if mod else []))

    def _keep_only(self, updated: cst.ImportFrom, source: str, keep: list[cst.ImportAlias]):
        """The import with only ``keep`` (names the support modules do not provide: recorded
        as unknown), or removed when none is left."""
        self.unknown += [(source, cst.Module([]).code_for_node(a.name)) for a in keep]
        if not keep:
            return cst.RemoveFromParent()
        return updated.with_changes(names=[a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                           for a in keep])

    def leave_ImportFrom(self, original, updated):
        if self.used is None:
            return updated
        source = self._absolute(original)
        if not source.startswith("transformers") or isinstance(updated.names, cst.ImportStar):
            return updated
        if source == "transformers" and [cst.Module([]).code_for_node(a.name)
                                         for a in updated.names] == ["initialization"]:
            # from ... import initialization as init: torch.nn.init's functions (transformers'
            # skip the tensors it marks initialised, which a model being built has none of)
            return updated.with_changes(relative=[], module=cst.Attribute(
                cst.Name("torch"), cst.Name("nn")), names=[cst.ImportAlias(
                    cst.Name("init"), asname=None if self.init_alias == "init"
                    else updated.names[0].asname)])
        autos = source in ("transformers", "transformers.models.auto",
                           "transformers.models.auto.modeling_auto")
        if source.startswith("transformers.models.") and not autos and (
                _config_module(source) or source.count(".") >= 3) and not source.rsplit(
                    ".", 1)[-1].startswith("generation_"):
            return updated  # the configuration (plain Python), another model's files
        keep, moved = [], []
        if source in _BACKBONE_SOURCES:
            # load_backbone(config): the converted backbone class, built by the support
            # module's AutoBackbone (the table of the converted files names it)
            for alias in updated.names:
                name = alias.name.value if isinstance(alias.name, cst.Name) else ""
                if (alias.asname.name.value if alias.asname else name) not in self.used:
                    continue
                if name in BACKBONE_NAMES:
                    self.backbone.append(cst.Module([]).code_for_node(alias))
                    if name == "load_backbone":
                        self.autos.add("AutoBackbone")
                else:
                    keep.append(alias)
            return self._keep_only(updated, source, keep)
        if source.startswith("transformers.models.") and source.rsplit(".", 1)[-1].startswith(
                "generation_"):
            # WhisperGenerationMixin (generation_whisper.py, torch's generate loop): the
            # support module's GenerationMixin, whose generate refuses what it does not
            # translate
            for alias in updated.names:
                name = alias.name.value if isinstance(alias.name, cst.Name) else ""
                local = alias.asname.name.value if alias.asname else name
                if local not in self.used:
                    continue
                if name.endswith("GenerationMixin"):
                    self.support.append(f"GenerationMixin as {local}")
                else:
                    keep.append(alias)
            return self._keep_only(updated, source, keep)
        for alias in updated.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else ""
            if (alias.asname.name.value if alias.asname else name) not in self.used:
                continue  # used only by what the reduction removed
            auto = autos and AUTO.match(name)
            (moved if name in SUPPORT_NAMES or auto or (source == "transformers.modeling_outputs"
                                                        and _OUTPUT.match(name))
             else keep).append(alias)
            if auto:
                self.autos.add(name)
        self.support += [a.name.value for a in moved]
        for alias in keep:
            self.unknown.append((source, cst.Module([]).code_for_node(alias.name)))
        if not keep:
            return cst.RemoveFromParent()
        return updated.with_changes(names=[a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                           for a in keep])

    def leave_Decorator(self, original, updated):
        target = updated.decorator
        if isinstance(target, cst.Call):
            target = target.func
        if isinstance(target, cst.Name) and target.value in DROPPED_DECORATORS:
            return cst.RemoveFromParent()
        return updated

    def leave_Call(self, original, updated):
        if (m.matches(updated.func, m.Attribute(value=m.Name(), attr=m.Name("_from_config")))
                and updated.func.value.value in self.defined and len(updated.args) == 1
                and not updated.args[0].keyword and not updated.args[0].star):
            # CLIPTextModel._from_config(text_config): the class built from the config (what
            # transformers' _from_config does, less its dtype and attention options)
            return updated.with_changes(func=updated.func.value)
        func = cst.Module([]).code_for_node(updated.func)
        if self.init_alias and func == f"{self.init_alias}.copy_" and len(updated.args) == 2 \
                and not any(a.keyword or a.star for a in updated.args):
            # init.copy_(self.A_log, value): torch.nn.init has no copy_; the tensor's own
            return cst.Call(func=cst.Attribute(updated.args[0].value, cst.Name("copy_")),
                            args=[updated.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        if not _DROPOUT.match(func):
            return updated
        args = {a.keyword.value if a.keyword else i: a.value for i, a in enumerate(updated.args)}
        x, p = args.get(0, args.get("input")), args.get(1, args.get("p"))
        training = args.get(2, args.get("training"))
        if x is None or p is None or not (isinstance(training, cst.Attribute)
                                          and training.attr.value == "training"
                                          and isinstance(training.value, cst.Name)
                                          and training.value.value == "module"):
            return updated
        self.support.append("attention_dropout")
        return cst.Call(func=cst.Name("attention_dropout"),
                        args=[cst.Arg(x), cst.Arg(p)])

    def visit_ClassDef(self, node) -> None:
        self.depth += 1

    def visit_FunctionDef(self, node) -> None:
        self.depth += 1

    def leave_ClassDef(self, original, updated):
        self.depth -= 1
        if self.depth == 0 and self.keep is not None and original.name.value not in self.keep:
            return cst.RemoveFromParent()  # a top-level definition that nothing asked for
        return updated

    def leave_FunctionDef(self, original, updated):
        if self.depth == 2 and original.name.value == "_init_weights":
            self.depth -= 1
            return cst.RemoveFromParent()  # torch initialisation (flax's initialisers here)
        return self.leave_ClassDef(original, updated)

    def leave_Assign(self, original, updated):
        # __all__: the names kept
        if (self.keep is not None and len(updated.targets) == 1
                and isinstance(updated.targets[0].target, cst.Name)
                and updated.targets[0].target.value == "__all__"
                and isinstance(updated.value, (cst.List, cst.Tuple))):
            elements = [e for e in updated.value.elements
                        if not (isinstance(e.value, cst.SimpleString)
                                and e.value.evaluated_value in self.defined
                                and e.value.evaluated_value not in self.keep)]
            return updated.with_changes(value=updated.value.with_changes(elements=elements))
        return updated


def reduce_modeling(source: str, module: str, entry: set[str] | None = None,
                    autos: set[str] | None = None) -> tuple[str, list[str]]:
    """The modeling file ``source`` of ``module`` reduced for conversion (see the module doc);
    returns (source, the machinery names that have no JAX counterpart here). ``entry``: the
    classes wanted (the others that none of them reaches are dropped); None keeps all.
    ``autos``, when given, receives the auto classes (``AutoModel``) the reduced file uses."""
    tree = ast.parse(source)
    keep = _reached(tree, set(entry)) if entry else None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    reducer = _Reduce(module, keep, defined)
    alias = re.search(r"^from \.\.\. import initialization as (\w+)$", source, re.MULTILINE)
    reducer.init_alias = alias.group(1) if alias else ""
    reduced = cst.parse_module(source).visit(reducer)
    reducer.used = {n.id for n in ast.walk(ast.parse(reduced.code)) if isinstance(n, ast.Name)}
    reduced = reduced.visit(reducer)
    code = reduced.code
    unknown = [f"{m}.{n}" for m, n in reducer.unknown]
    if autos is not None:
        autos |= reducer.autos
    names = sorted(set(reducer.support))
    dots = "." * module.count(".")
    if names:
        line = f"from {dots}{SUPPORT_MODULE} import {', '.join(names)}\n"
        code = _insert_import(code, line)
    backbone = sorted({n.rstrip(", ") for n in reducer.backbone})
    if backbone:
        code = _insert_import(code, f"from {dots}{BACKBONE_MODULE} import {', '.join(backbone)}\n")
    if unknown:
        note = "".join(f"# TODO(torch2jax): {u} has no JAX counterpart in {SUPPORT_MODULE} "
                       "(torch2jax/transformers_runtime.py): the converted file still imports "
                       "it from transformers\n" for u in unknown)
        code = _insert_import(code, note)
    return code, unknown


def _insert_import(code: str, line: str) -> str:
    """``line`` after the file's last top-level import."""
    tree = ast.parse(code)
    last = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            last = node.end_lineno or node.lineno
    lines = code.splitlines(keepends=True)
    return "".join(lines[:last]) + line + "".join(lines[last:])


def runtime_source() -> str:
    return RUNTIME.read_text(encoding="utf-8")


def write_support_modules(folder: Path) -> None:
    """The support modules a converted modeling file imports, written into the package
    ``folder``: ``_hf_support.py`` (transformers_runtime.py) and the activations it imports."""
    (folder / f"{SUPPORT_MODULE}.py").write_text(runtime_source(), encoding="utf-8")
    (folder / f"{ACTIVATIONS_MODULE}.py").write_text(
        ACTIVATIONS_RUNTIME.read_text(encoding="utf-8"), encoding="utf-8")


def package_of(path: Path) -> tuple[Path, str] | None:
    """(the directory holding the top-level package, dotted module name), or None when
    ``path`` is not inside a package (its directory has no ``__init__.py``)."""
    path = path.resolve()
    directory = path.parent
    if not (directory / "__init__.py").is_file():
        return None
    parts = [] if path.name == "__init__.py" else [path.stem]
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return directory, ".".join(parts)
