"""Convert one source file: parse -> analyse -> rewrite -> fix imports.

This is the library entry point; the CLI, the verifier and the tests call
:func:`convert_source`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import children
from torch2jax.analysis.host import find_host_draws
from torch2jax.analysis.host_generators import find_numpy_generators
from torch2jax.analysis.index import Indexer, qualified, share_names
from torch2jax.analysis.layer_bases import inherit_imported_layer_bases
from torch2jax.analysis.metadata import ALL as METADATA
from torch2jax.analysis.metadata import FileMetadata
from torch2jax.analysis.torch_api import TORCH_PACKAGES
from torch2jax.analysis.training import TrainingIndexer
from torch2jax.analysis.values import ValueFacts
from torch2jax.analysis.walk import findall, visit
from torch2jax.finish.invariants import check_output, input_facts
from torch2jax.finish.noop import DropNoopAssigns
from torch2jax.passes import (
    base_calls,
    data_inits,
    forward_choice,
    grad_mode_branches,
    list_builders,
    loader_classes,
    local_lambdas,
    manual_sgd,
    module_casts,
    module_methods,
    open_checkpoints,
    optimizer_attributes,
    param_writes,
    scaler_params,
    step_closures,
    trainable_params,
)
from torch2jax.passes.data import DataIndexer
from torch2jax.passes.generation import compile_generation
from torch2jax.passes.helpers import add_helpers, defined_names
from torch2jax.passes.layout_blocks import channels_last_blocks
from torch2jax.passes.layout_fuse import FuseLayoutMoves
from torch2jax.passes.rewrite import TorchToJax
from torch2jax.repo import (
    HOST_DRAWS,
    RNGS_FUNCTION,
    SEED_FUNCTION,
    TORCH_SEEDED,
    TYPE_FIELD,
    numpy_seeded,
    source_facts,
)
from torch2jax.report import Diagnostic
from torch2jax.result import ConversionResult
from torch2jax.ruleset import RuleSet, load_rules
from torch2jax.suppress import suppress
from torch2jax.targets import target_or_translation

IMPORT_LINES = {
    "jax": "import jax",
    "jnp": "import jax.numpy as jnp",
    "np": "import numpy as np",
    "partial": "from functools import partial",
    "os": "import os",
    "grain": "import grain",
    "sharding": "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P",
    "optax": "import optax",
    "ocp": "import orbax.checkpoint as ocp",
    "tensorboardX": "import tensorboardX",
    "nnx": "from flax import nnx",
    "linen": "import flax.linen as nn",
    "Any": "from typing import Any",
    "NamedTuple": "from typing import NamedTuple",
    "dataclasses": "import dataclasses",
    "train_state": "from flax.training import train_state",
    "serialization": "from flax import serialization",
    "einops": "import einops",
    "inspect": "import inspect",
}
# the names the converter's own imports bind -> their IMPORT_LINES key (NamedSharding -> sharding)
OWN_NAMES = {name.strip().split(" as ")[-1]: key for key, line in IMPORT_LINES.items()
             for name in line.split("import ", 1)[-1].split(",")}
IMPORT_ORDER = ["dataclasses", "inspect", "os", "Any", "NamedTuple", "partial", "grain", "np", "jax", "jnp", "sharding",
                "optax", "ocp", "tensorboardX", "nnx", "linen", "train_state", "serialization",
                "einops"]

# the rewrites of the torch source before the analysis, in order (each returns the module it
# was given when it changes nothing)
_CANONICAL_FORMS = (loader_classes, scaler_params, step_closures, optimizer_attributes,
                    trainable_params, manual_sgd, param_writes,
                    grad_mode_branches,
                    open_checkpoints, local_lambdas, data_inits, base_calls, list_builders,
                    module_methods, forward_choice)

# text without which a canonical form finds nothing to rewrite, checked on the user's source:
# each form walks the whole tree to find out otherwise. The forms only move and rewrite the
# source's own text, so text the source lacks is not in the tree an earlier form changed either
# (what they write besides: torch.nn.init calls, optimizer steps, and module_methods' self.NAME = p
# of register_parameter("NAME", p), in forward_choice's gate)
_CANONICAL_GATES = {
    optimizer_attributes: re.compile(r"\bstep\b"),  # self.<optimizer>.step()
    # (a p.grad read after a .backward() call: "backwards" or self.grad_checkpointing is not)
    manual_sgd: re.compile(r"\A(?=[\s\S]*\bbackward\b)(?=[\s\S]*\bgrad\b)"),
    local_lambdas: re.compile(r"\blambda\b"),
    grad_mode_branches: re.compile(r"\bbackward\b"),
    param_writes: re.compile(r"\.parameters\(\)[\s\S]*\b(?:mul|add|sub|div|lerp|copy)_\("),
    step_closures: re.compile(r"\.step\(\s*(?:closure\s*=\s*)?[A-Za-z_]"),  # opt.step(closure)
    trainable_params: re.compile(r"\.requires_grad\b"),  # filter(lambda p: p.requires_grad, ..)
    module_methods: re.compile(r"\bregister_parameter\b"),
    base_calls: re.compile(r"\.\w+\(\s*self\b"),  # nn.LayerNorm.__init__(self, ...)
    # nn.ModuleList(self.block), or a plain list's modules registered with add_module
    list_builders: re.compile(r"ModuleList\(\s*self\.|\badd_module\b"),
    # self.forward = self.forward_slicing (the target may be parenthesized, continued), or
    # self.register_parameter("forward", p), which module_methods writes so
    forward_choice: re.compile(r"\bforward\b(?:[\s)\\]|#[^\n]*)*=(?!=)|"
                               r"\bregister_parameter\s*\(\s*[rRuU]?[\"']forward[\"']"),
    # (the forms' own tests of the text, without generating it again)
    data_inits: re.compile(re.escape(".data.")),
    open_checkpoints: re.compile(re.escape("open(")),
    scaler_params: re.compile("GradScaler"),
}


class ParseError(Exception):
    """The file is not valid Python; the message names the file and line."""





def _reads_children(indexer: Indexer) -> Indexer:
    """The indexer, reading ``*list(backbone.children())[a:b]`` through analysis/children.py."""

    def layouts(ix, cls, v, root, fn):
        return children.children_layouts(
            children.IndexView(ix, cls, lambda n: qualified(ix, n)), v, root, fn)

    indexer.children_layouts = layouts
    return indexer

def uses_torch(module: cst.Module) -> bool:
    """Whether the file imports torch or torchvision (its data transforms) at its top level."""
    for node in module.body:
        for stmt in getattr(node, "body", []) if isinstance(node, cst.SimpleStatementLine) else []:
            if isinstance(stmt, cst.Import) and any(
                    cst.Module([]).code_for_node(a.name).split(".")[0] in TORCH_PACKAGES
                    for a in stmt.names):
                return True
            if isinstance(stmt, cst.ImportFrom) and stmt.module is not None and (
                    cst.Module([]).code_for_node(stmt.module).split(".")[0] in TORCH_PACKAGES):
                return True
    return False


def _builds_known(module: cst.Module, known: Collection[str]) -> bool:
    """Whether a file that imports no torch calls a module class or a builder function of
    another converted file (timm's create_conv2d, calling create_conv2d_pad and MixedConv2d):
    those calls take rngs, so the file is converted too; likewise a file that names such a
    class (a table of them)."""
    names = {k.removeprefix(RNGS_FUNCTION) for k in known
             if k.isidentifier() or k.startswith(RNGS_FUNCTION)}
    if names and any(isinstance(c.func, cst.Name) and c.func.value in names
                     for c in findall(module, m.Call())):
        return True
    # a lookup of converted layer classes (timm's create_norm_act.py: _NORM_ACT_MAP =
    # dict(batchnorm=BatchNormAct2d, ...), get_norm_act_layer) checks the classes it is
    # handed: an activation class is a JAX function there
    classes = {k for k in known if k.isidentifier()}
    return bool(classes) and any(n.value in classes for n in findall(module, m.Name()))


def _channel_first(rules: RuleSet) -> RuleSet:
    """The rules of the NNX translation the equinox pass starts from: nn.Upsample's lambda
    (channels-last in the NNX and linen translations, between channels-last convolutions)
    takes the channel-first input, as equinox's layers do."""
    layers = {k: replace(r, layout="torch") if r.special == "upsample" else r
              for k, r in rules.layers.items()}
    return RuleSet(layers=layers, functions=rules.functions, methods=rules.methods)


def convert_source(
    source: str,
    *,
    path: str = "<string>",
    target: str = "nnx",
    rules: RuleSet | None = None,
    known_modules: set[str] | None = None,
    fuse_layout: bool = True,
    shard: str = "data",
    init: str = "jax",
    public: Collection[str] | None = (),
    follow_packages: bool = True,
) -> ConversionResult:
    """Rewrite PyTorch ``source`` for ``target``. Never raises on untranslatable code: it is
    marked ``# TODO(torch2jax)`` and reported. Raises :class:`ParseError` on invalid Python.
    ``init="torch"`` gives the layers torch's default initialisation (passes/torch_init.py);
    equinox's own defaults already are torch's for Linear, Conv and Embedding.

    ``public``: the module classes that code outside this file builds and calls (other files
    import them, a verifier calls one): they keep torch's NCHW interface, while the other
    classes of the file may pass channels-last images between them (passes/layout_blocks.py).
    None when that is not known: every class keeps torch's interface.

    ``follow_packages``: models built from an installed package (``torchvision.models.
    resnet18()``) are converted from its code into :attr:`ConversionResult.files`
    (package_models.py)."""
    rules = rules or load_rules()
    spec = target_or_translation(target)
    if follow_packages and spec.follows_packages:
        from torch2jax.package_models import prepare

        followed = prepare(source, path=path, target=target, convert=convert_source,
                           layers=rules.layers)
        if followed is not None:
            result = convert_source(followed.source, path=path, target=target, rules=rules,
                                    known_modules={*(known_modules or ()), *followed.known},
                                    fuse_layout=fuse_layout, shard=shard, init=init,
                                    public=public, follow_packages=False)
            code, diagnostics, generated, files = followed.finish(result.code,
                                                                  result.diagnostics)
            result = suppress(replace(result, code=code, diagnostics=diagnostics), source)
            return replace(result, diagnostics=result.diagnostics + generated, files=files)
    # the NNX translation that the equinox pass rewrites: train steps stay where the loop is
    hoist_steps = not spec.intermediate
    if spec.rewrites_translation_of:  # a pass over the NNX translation (targets/equinox.py)
        from torch2jax.repo_classes import ImportedFlags
        from torch2jax.targets.equinox import from_nnx
        from torch2jax.targets.equinox_names import free_key_name

        # (a forward's own argument named key: key_, the target's random key being key)
        translated = free_key_name(source)
        nnx = convert_source(translated, path=path, rules=_channel_first(rules),
                             known_modules=known_modules, fuse_layout=False,
                             target=spec.rewrites_translation_of)
        if not nnx.uses_torch:
            return nnx
        # how the module classes it imports from other files are called there
        imported = ImportedFlags(known_modules or (), target, rules.layers,
                                 functools.partial(convert_source, rules=rules, init=init,
                                                   shard=shard))
        return suppress(_finish(from_nnx(nnx, translated, path, imported), nnx, path, source,
                                known_modules or ()), source)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise ParseError(f"{path}:{exc.raw_line}:{exc.raw_column}: not valid Python: "
                         f"{exc.message}") from None
    if not uses_torch(module) and not _builds_known(module, known_modules or ()):
        return ConversionResult(code=source, uses_torch=False)
    canonical = module
    for step in _CANONICAL_FORMS:
        gate = _CANONICAL_GATES.get(step)
        if gate is not None and not gate.search(source):
            continue  # (the text the form needs is not in the file: no walk of a long file)
        canonical = step.canonicalise(canonical)
    # a line the canonical form moved (a wrapper class removed): reported at the user's line
    lines = (loader_classes.line_map(module.code, canonical.code)
             if canonical is not module else {})
    module = canonical
    wrapper = FileMetadata(module)
    wrapper.resolve_many(METADATA)  # every visitor's below, in two rounds
    diagnostics: list[Diagnostic] = []

    def report(line: int, col: int, rule: str, severity: str, message: str) -> None:
        diagnostics.append(Diagnostic(path, lines.get(line, line), col, rule, severity,
                                      message))

    # two passes: the first learns what layer-building helper functions return, the second
    # uses it for the attributes they build (when every helper returns torch's layout, the
    # second pass would compute the first one's index again: it is skipped)
    names: dict = {}  # qualified names: the visitors below read the same metadata
    builders = frozenset(k.removeprefix(RNGS_FUNCTION) for k in known_modules or ()
                         if k.startswith(RNGS_FUNCTION))
    first = share_names(names, _reads_children(Indexer(rules, set(known_modules or ()),
                                                       imported_builders=builders)))
    visit(wrapper, first)
    index = first.finish()
    # (so does the file's use of layer classes as values: a layout decided before a later
    # line showed the factory to be channels-first would be stale)
    if any(layout != "torch" for layout in index.fn_returns.values()) or index.factory_layouts:
        indexer = share_names(names, _reads_children(Indexer(
            rules, set(known_modules or ()), index.fn_returns, index.factory_layouts,
            imported_builders=builders)))
        visit(wrapper, indexer)
        index = indexer.finish()
    # module classes imported from other files of the repository: what they build takes rngs
    index.module_classes |= {k for k in known_modules or () if k.isidentifier()}
    inherit_imported_layer_bases(index.classes, known_modules or (), rules.layers)
    index.type_fields = {k.removeprefix(TYPE_FIELD) for k in known_modules or ()
                         if k.startswith(TYPE_FIELD)}  # (fields of imported classes, repo.py)
    # helper names the converter must not emit (not the torch imports it removes:
    # `from torch.nn import Embedding` leaves the name to the Embedding helper)
    index.defined = defined_names(module, torch_imports=False)
    index.outside_callers = public is None
    data_indexer = share_names(names, DataIndexer(index.module_classes))
    visit(wrapper, data_indexer)
    data_indexer.index.shard = shard
    data_indexer.index.host = find_host_draws(wrapper)
    facts = source_facts(module.code) | set(known_modules or ())  # (repo.py)
    data_indexer.index.global_host_draws = HOST_DRAWS in facts
    data_indexer.index.torch_seeded = TORCH_SEEDED in facts
    data_indexer.index.numpy_seeded = numpy_seeded(facts)
    data_indexer.index.numpy_generators = find_numpy_generators(wrapper, index.module_classes)
    training_indexer = share_names(names, TrainingIndexer(
        index.module_classes, index.rngs_functions,
        data_indexer.index.own_key_draws() | data_indexer.index.host.draws
        | set(data_indexer.index.numpy_generators.draws),
        step_keys=spec.train_state and ("Dropout" in source or "dropout" in source),
        keys_in_apply=spec.train_state,
        imported_seeds=frozenset(k.removeprefix(SEED_FUNCTION) for k in known_modules or ()
                                 if k.startswith(SEED_FUNCTION))))
    visit(wrapper, training_indexer)
    training = training_indexer.finish()
    # a function that seeds builds its models from its own key, not from an rngs argument
    index.rngs_functions -= training.self_keyed
    transformer = share_names(names, TorchToJax(
        rules, index, spec, path, report, training, uses_train=_uses_train_mode(source),
        data=data_indexer.index, torch_init=init == "torch", hoist_steps=hoist_steps,
        values=ValueFacts(wrapper, index.module_classes, lambda q: q in rules.layers)))
    new = wrapper.visit(transformer)
    if hoist_steps:  # (not in the NNX translation the equinox pass rewrites: equinox's
        # Linear, Conv and Embedding draw torch's distributions)
        _note_initialisation(transformer, training, spec.name, source, report)
    new = spec.finish_module(new).visit(DropNoopAssigns())
    if spec.stateful_modules and hoist_steps:  # (passes/generation.py writes NNX)
        new = compile_generation(new, module, source, report,
                                 tree_mode=not data_indexer.index.aliasing,
                                 imports=transformer.imports_needed)
    if fuse_layout:  # (the equinox target keeps torch's layout between modules)
        if public is not None:
            new = channels_last_blocks(new, set(public))
        new = new.visit(FuseLayoutMoves())
    new, helper_imports = add_helpers(new, spec.name)
    new = _add_imports(new, transformer.imports_needed | helper_imports)
    if transformer.x64:  # a module cast to float64 (passes/module_casts.py)
        new = new.with_changes(body=module_casts.with_x64(list(new.body)))
    diagnostics[:] = [d for d in diagnostics if not any(
        lo <= d.line <= hi for lo, hi in transformer.rewritten_lines)]
    diagnostics.sort(key=lambda d: (d.line, d.column))
    result = ConversionResult(code=new.code, diagnostics=diagnostics,
                              per_example=transformer.per_example_code,
                              train_steps=tuple(transformer.train_steps),
                              eval_step=transformer.eval_step,
                              facts=input_facts(wrapper, TORCH_PACKAGES),
                              removed=transformer.removed, failed=transformer.failed_sites,
                              optimizer_names=_optimizer_names(transformer))
    if not hoist_steps:  # the NNX translation the equinox pass goes on from: checked there
        return result
    return suppress(_finish(result, result, path, source, known_modules or ()), source)


def _finish(result: ConversionResult, rewrite: ConversionResult, path: str,
            source: str, known: Collection[str] = ()) -> ConversionResult:
    """The output invariants (finish/invariants.py) on a converted file; ``rewrite`` is the
    rewrite's own result (for equinox, the NNX translation the target started from).
    ``known``: the module classes converted elsewhere (a package's model, followed): their
    imports are rewritten after this check, so reading them is not torch."""
    if rewrite.facts is None:
        return result
    code, diagnostics = check_output(result.code, result.diagnostics, rewrite.facts, path,
                                     source, rewrite.removed, _add_imports, OWN_NAMES,
                                     rewrite.failed, known, set(rewrite.optimizer_names))
    if code is result.code and diagnostics is result.diagnostics:
        return result
    return replace(result, code=code, diagnostics=diagnostics)


def _note_initialisation(rewrite: TorchToJax, training, target: str, source: str,
                         report) -> None:
    """A program that trains a model from its initial weights (an optimizer, no weights
    loaded) on flax: flax's default initialisers (lecun_normal kernels, zero biases, N(0,
    1/dim) embeddings) are not torch's, so the converted training starts elsewhere than
    torch's; ``--init torch`` writes torch's. Said once, at the first such layer."""
    if rewrite.jax_init_layer is None or not training.optimizers or any(
            word in source for word in ("load_state_dict", "from_pretrained", "torch.load")):
        return
    line, col, layer = rewrite.jax_init_layer
    report(line, col, "initialisation", "warning",
           f"{layer} keeps {target}'s default initialisation (flax's lecun_normal kernels, zero "
           "biases), not torch's, and this file trains from the initial weights: training "
           "starts from other statistics than torch's. `torch2jax convert --init torch` "
           "writes torch's initialisers")


def _optimizer_names(rewrite: TorchToJax) -> frozenset[str]:
    """The names the training analysis knows to hold an optimizer (and their aliases)."""
    sites = rewrite.training.optimizer_names
    return frozenset({*sites, *(a for site in sites.values() for a in site.aliases)})


def _uses_train_mode(source: str) -> bool:
    """Whether the file's modules behave differently in training (a linen ``train`` field)."""
    return any(word in source for word in ("BatchNorm", "Dropout", "dropout", ".training"))


def _from_names(node: cst.CSTNode) -> tuple[str, set[tuple[str, str]]] | None:
    """``from m import a, b as c`` -> ("m", {("a", "a"), ("b", "c")})."""
    if not isinstance(node, cst.ImportFrom) or node.relative or node.module is None or \
            isinstance(node.names, cst.ImportStar):
        return None
    empty = cst.Module([])
    return empty.code_for_node(node.module), {
        (empty.code_for_node(a.name), empty.code_for_node(a.asname.name) if a.asname
         else empty.code_for_node(a.name)) for a in node.names}


@functools.cache
def _import_names() -> dict[str, tuple[str, set[tuple[str, str]]] | None]:
    """``_from_names`` of each of IMPORT_LINES."""
    return {key: _from_names(cst.parse_statement(line).body[0])
            for key, line in IMPORT_LINES.items()}


def _existing_imports(module: cst.Module) -> set[str]:
    have = set()
    wanted = _import_names()
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for s in stmt.body:
            text = cst.Module([]).code_for_node(s).strip()
            found = _from_names(s)
            for key, line in IMPORT_LINES.items():
                # the same line, or a from-import of the same names among others
                # (from typing import Any, Optional has Any)
                if text == line or (found is not None and wanted[key] is not None
                                    and found[0] == wanted[key][0]
                                    and wanted[key][1] <= found[1]):
                    have.add(key)
    return have


def _add_imports(module: cst.Module, needed: set[str]) -> cst.Module:
    needed = {OWN_NAMES.get(n, n) for n in needed}  # (the names they bind, for the finish)
    text = module.code
    # a name noted while rewriting a part that a later rewrite replaced (partial(nnx.max_pool,
    # ...)(x) -> nnx.max_pool(x, ...)) needs no import
    have = _existing_imports(module) if needed else set()
    missing = [k for k in IMPORT_ORDER if k in needed and k not in have
               and re.search(rf"\b{IMPORT_LINES[k].split()[-1]}\b", text)]
    if not missing:
        return module
    body = list(module.body)
    insert_at = 0
    for i, stmt in enumerate(body):
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])) and i == 0:
            insert_at = 1
        elif m.matches(stmt, m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])) or m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
            insert_at = i + 1
        else:
            break
    lines: list[str] = []
    for k in missing:  # from typing import Any, NamedTuple: one line of a module's names
        head, sep, names = IMPORT_LINES[k].partition(" import ")
        if head == "from typing" and lines and lines[-1].startswith(head + sep):
            lines[-1] += ", " + names
        else:
            lines.append(IMPORT_LINES[k])
    new_stmts = [cst.parse_statement(line + "\n") for line in lines]
    # keep a blank line between the stdlib block and the jax imports when there is one
    body[insert_at:insert_at] = new_stmts
    return module.with_changes(body=body)
