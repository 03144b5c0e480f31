"""The rewrite: torch API -> JAX API, module classes -> NNX modules, in one libcst traversal.

Concerns are kept in separate methods (imports, module classes, layer construction, calls
through the rule tables, activation layout, in-place updates, device code, TODO marking);
the traversal is shared so that qualified names are resolved once per file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from torch2jax.analysis import accumulate as acc
from torch2jax.analysis import host as ha
from torch2jax.analysis import values as vk
from torch2jax.analysis.index import FileIndex, Layouts, ordered_dict_items, qualified
from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.analysis.training import (
    CLIPS,
    DROPPED_SEEDS,
    RANDOM,
    SEEDS,
    TrainingIndex,
)
from torch2jax.analysis.walk import NoAttributeHooks, findall, walk
from torch2jax.finish import removed as rmv
from torch2jax.passes import closures, torch_init
from torch2jax.passes import data as dt
from torch2jax.passes import gan_step as gan
from torch2jax.passes import remat as rm
from torch2jax.passes import training as tr
from torch2jax.passes.calls import CALLS, CallSite
from torch2jax.passes.common import (
    Untranslatable,
    add_kwonly_param,
    arg,
    bind,
    call,
    code,
    expr,
    int_value,
    is_identity_lambda,
    needs_parens,
    one_line,
    py,
    try_literal,
    wrap_long_statement,
)
from torch2jax.passes.helpers import HELPERS
from torch2jax.passes.layout_fuse import FROM_CHANNELS_LAST as _FROM_CL
from torch2jax.passes.registry import spatial_dims
from torch2jax.passes.special import batch_norm_helper
from torch2jax.passes.special_device import device_default_functions, drop_device_argument
from torch2jax.passes.specials import SPECIALS, Site
from torch2jax.ruleset import Rule, RuleSet, weight_source
from torch2jax.targets import Emitter
from torch2jax.targets import linen as linen_target
from torch2jax.targets import linen_training as lt

_IMPORT_NAME = re.compile(r"\b(jnp|jax|nnx|partial|np|optax|ocp|grain|os)\b(?=[.(])")


DTYPES = {
    "float32": "jnp.float32", "float": "jnp.float32", "float16": "jnp.float16",
    "half": "jnp.float16", "bfloat16": "jnp.bfloat16", "float64": "jnp.float64",
    "double": "jnp.float64", "int64": "jnp.int32", "long": "jnp.int32", "int32": "jnp.int32",
    "int": "jnp.int32", "int16": "jnp.int16", "int8": "jnp.int8", "uint8": "jnp.uint8",
    "bool": "jnp.bool_", "complex64": "jnp.complex64",
}

GRAD_MODES = {"torch.no_grad", "torch.inference_mode", "torch.enable_grad",
              "torch.set_grad_enabled", "torch.autograd.set_grad_enabled",
              "torch.autograd.grad_mode.no_grad"}
INPLACE_OPS = {"add_": "+", "sub_": "-", "mul_": "*", "div_": "/"}
# out-of-place methods whose result dtype is not the receiver's (x.eq_(y) keeps x's dtype)
_INPLACE_DTYPE = {"eq", "ne", "logical_not", "lt", "le", "gt", "ge"}
# Method names that are also common on non-tensors: rewritten only with tensor-like evidence.
AMBIGUOUS_METHODS = {"split", "index", "count", "copy", "sort", "type", "int", "float", "bool",
                     "item", "to", "max", "min", "sum", "all", "any", "round", "log", "exp"}


@dataclass
class Pending:
    todos: list[tuple[str, str]] = field(default_factory=list)  # (rule, message)
    keys: tr.StatementKeys = field(default_factory=tr.StatementKeys)  # subkeys it draws
    before: list[cst.BaseStatement] = field(default_factory=list)  # statements to put first
    after: list[cst.BaseStatement] = field(default_factory=list)  # statements to put after
    # diagnostics reported inside the statement, and the small statements it lost: what a
    # removed statement's placeholder needs (finish/removed.py)
    reported: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    removed: list[cst.BaseSmallStatement] = field(default_factory=list)
    translated: str | None = None  # removed, but its rewritten form is a translation


def _apply_loop(model: str, fn: str, rngs: str | None) -> cst.BaseStatement:
    """torch's ``model.apply(fn)``: ``fn`` on every submodule, children before their parent
    (nnx.iter_modules' order, as torch's apply), given ``rngs`` when it draws."""
    extra = f", rngs={rngs}" if rngs else ""
    return cst.parse_statement(f"for _, module in nnx.iter_modules({model}):\n"
                               f"    {fn}(module{extra})\n")


class TorchToJax(NoAttributeHooks, cst.CSTTransformer):
    METADATA_DEPENDENCIES = (ScopeProvider, PositionProvider, ParentNodeProvider)

    def __init__(self, rules: RuleSet, index: FileIndex, emitter: Emitter, path: str,
                 report, training: TrainingIndex | None = None, uses_train: bool = False,
                 data: dt.DataIndex | None = None, torch_init: bool = False,
                 hoist_steps: bool = True, for_equinox: bool = False,
                 values: vk.ValueFacts | None = None) -> None:
        super().__init__()
        self.values = values  # what kind of value an expression of the file holds
        # the NNX translation that targets/equinox.py rewrites: every equinox layer is
        # channel-first and per example, so a container mixing channels-last and other
        # layers is called as it is, and nn.Upsample's lambda is written per example
        self.for_equinox = for_equinox
        self.per_example_code: set[str] = set()  # (code of what was written per example)
        self.torch_init = torch_init  # convert --init torch (passes/torch_init.py)
        self.hoist_steps = hoist_steps  # a per-epoch train function's step to the top level
        self.rules = rules
        self.index = index
        self.emitter = emitter
        self.path = path
        self.report = report  # callable(line, col, rule, severity, message)
        self.imports_needed: set[str] = set()
        self._pending: list[Pending] = []
        self._class_stack: list[str] = []
        self._fn_stack: list[cst.FunctionDef] = []
        self._variable_attrs: dict[str, set[str]] = {}  # class -> its parameters and buffers
        self._rngs_scope: list[bool] = []
        self._param_names: list[set[str]] = []
        self._unpack: dict[int, int] = {}
        self._loop_layouts: list[dict[str, str]] = []
        self._locals_cache: dict[int, set[str]] = {}  # function id -> the names it binds
        self._device_names: set[str] = set()
        # factory keyword dicts, dd = {"device": device, "dtype": dtype} -> their dtype value
        self._factory_dicts: dict[str, cst.BaseExpression | None] = {}
        self.layouts: Layouts | None = None
        self.torch_used_after = False
        self.training = training or TrainingIndex()
        self.linen = emitter.name == "linen"
        self.uses_train = uses_train  # linen: modules get a `train` field
        self._key_scopes: list[tr.KeyScope] = [tr.KeyScope()]
        self._for_stack: list[cst.For] = []
        self._while_stack: list[cst.While] = []
        self._while_clips: dict[int, tuple[cst.CSTNode, str]] = {}  # loop id -> (clip, rule)
        self._hoist: list[cst.BaseStatement] = []
        # train steps moved to the top level, before the function they were built in
        self._module_hoist: list[tuple[str, cst.BaseStatement]] = []
        self._module_names: set[str] = set()
        self._file_functions: set[str] = set()  # the file's top-level functions
        self._passed_schedulers: set[str] = set()  # see visit_Module
        self._in_expr_scope = 0  # lambdas and comprehensions: no statement to split keys in
        self._fstring_quotes: list[str] = []
        self._eval_step = False  # an eval step is defined at the top of the file
        self._host_rng = False  # host-side draws use host_rng (analysis/host.py)
        self._depth = 0  # indentation level of the statement being rewritten
        self._in_annotation = 0
        # self.<attr> read by a layer subclass's call of its own functional (super().__call__)
        self._own_reads: set[int] = set()
        # a subclass of nn.Embedding whose super().__init__ passes a padding_idx: it derives
        # from the Embedding helper (passes/helpers.py), not nnx.Embed
        self._padded_embedding_subclasses: set[str] = set()
        self._own_calls: set[int] = set()  # those calls (F.layer_norm over self's attributes)
        # model.weight of a layer built outside a module, read as an array (its .data goes)
        self._weight_reads: set[int] = set()
        self._opt_lr: dict[str, cst.BaseExpression] = {}  # optimizer var -> its lr expression
        self._deferred: dict[str, cst.BaseSmallStatement] = {}  # scheduler -> optimizer stmt
        self._schedules: dict[str, object] = {}  # scheduler var -> translated Schedule
        self._plateaus: dict[str, object] = {}  # ReduceLROnPlateau vars
        self.data = data or dt.DataIndex()
        self._autocast_models: set[str] = set()  # models called in an autocast region
        # linen training code (targets/linen_training.py)
        self._lt_after_state: list[cst.BaseStatement] = []  # run once the TrainState exists
        self._lt_post: list[cst.BaseStatement] = []  # after the outermost training loop
        self._lt_trainers: set[str] = set()  # helpers that train the model they receive
        self._lt_evaluators: dict[str, int] = {}  # helpers that call it: model param index
        # helpers called once per epoch with the model and the optimizer of their caller
        self._lt_epoch: dict[str, lt.EpochFunction] = {}
        self._lt_state_made: set[int] = set()  # callers (id, 0: module) that made the state
        self._lt_batch_stats = False
        self._lt_dropout = False
        self._lt_train_state_class = False
        self._lt_marked = False  # the loop was recognised but marked
        self._lt_blank: int | None = None  # a removed statement's blank line goes on
        self._lt_inits: dict[str, dict[str, dict]] = {}  # class -> torch layer -> initializers
        self._lt_init_fns: set[tuple[str, str]] = set()  # (class, init function) removed
        self._lt_dtype_classes: set[str] = set()  # autocast: classes with a dtype field
        self._lt_autocast: dict[str, str] = {}  # model -> the dtype its training step uses
        self._class_inits: dict[str, bool] = {}  # class -> it defines __init__
        # class -> (attribute, rate) of the nnx.Dropout layers its F.dropout calls became
        self._dropouts: dict[str, list[tuple[str, cst.BaseExpression]]] = {}
        # class -> its self.training reads, and those that went into an nnx.Dropout attribute
        self._training_reads: dict[str, int] = {}
        self._training_hoisted: dict[str, int] = {}
        # enclosing function (id) -> its nested defs checkpointed with the module passed in
        self._remat_closures: dict[int, set[str]] = {}
        # enclosing function -> the names it assigns a module class to (_module_class_locals)
        self._class_locals: dict[cst.FunctionDef, set[str]] = {}
        # removed statements whose names may still be read: put back or dropped when the file
        # is finished (finish/removed.py), keyed by their placeholder's number
        self.removed: dict[int, rmv.Removed] = {}
        self.failed_sites: set[int] = set()  # optimizer sites whose translation failed
        self._indent = "    "
        self._acc = acc.Accumulation()  # micro-step gradient accumulation (nnx)
        self._top_steps: list[cst.FunctionDef] = []  # steps defined after the imports
        self._lr_loops: dict[int, tuple[str, cst.BaseExpression]] = {}  # param_groups lr
        self._file_names: set[str] = set()  # every name the file writes (fresh names)
        # checkpoint dicts: names assigned {..., 'model': m.state_dict()} (saved), names
        # assigned torch.load(path) and read by key (loaded)
        self._ckpt_dicts: set[str] = set()
        self._ckpt_loads: set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        self._indent = node.default_indent
        self._file_names = {n.value for n in findall(node, m.Name())}
        if self.emitter.name == "nnx" and not self.for_equinox:
            t = self.training
            self._lr_loops = acc.find_lr_loops(node)
            self._ckpt_dicts, self._ckpt_loads = acc.find_checkpoint_dicts(node)
            for opt, _ in self._lr_loops.values():
                if opt in t.optimizer_names:
                    t.optimizer_names[opt].lr_set = True
            self._acc = acc.find_micro_steps(
                node, {n: t.model_of(n) for n in t.optimizer_names if t.model_of(n)},
                t.model_vars, self.data.scalers)
        self._file_functions = {s.name.value for s in node.body if isinstance(s, cst.FunctionDef)}
        self._device_functions = device_default_functions(node)
        self._module_names = _module_names(node)
        # schedulers stepped in a function that receives them (train(model, loader, optimizer,
        # scheduler)): their step count travels with the schedule, `scheduler.steps`
        self._passed_schedulers = {
            c.func.value.value for f in findall(node, m.FunctionDef()) for c in findall(
                f, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("step")), args=[]))
            if c.func.value.value in {p.name.value for p in f.params.params}}
        if not self.linen:
            return
        source = node.code
        self._lt_batch_stats = "BatchNorm" in source
        self._lt_dropout = "Dropout" in source or "dropout" in source
        # helpers whose optimizer is over a model they receive: they return its variables
        params: dict[str, set[str]] = {}
        for stmt in node.body:
            if isinstance(stmt, cst.FunctionDef):
                params[stmt.name.value] = {p.name.value for p in stmt.params.params}
        for site in self.training.optimizers.values():
            if site.function in params and site.model in params[site.function]:
                self._lt_trainers.add(site.function)
        optimizers = {n: self.training.model_of(n) for n in self.training.optimizer_names}
        self._lt_epoch = lt.epoch_functions(
            node, {n: v for n, v in optimizers.items() if v}, self._lt_trainers)
        if self.training.optimizers:  # the variables exist where a model was trained
            self._lt_evaluators = lt.model_functions(node, self._model_names(),
                                                     self._lt_trainers | set(self._lt_epoch))
        self._lt_find_init_functions(node)
        self._lt_find_autocast_classes(node)

    def _lt_find_autocast_classes(self, node: cst.Module) -> None:
        """Model classes called in an autocast region (and the classes they build) get a
        ``dtype`` field handed to their layers, as in the flax examples."""
        classes = {c.name.value: c for c in node.body if isinstance(c, cst.ClassDef)}
        called: set[str] = set()
        for w in findall(node, m.With()):
            if any((self.q(i.item.func if isinstance(i.item, cst.Call) else i.item) or "")
                   in dt.AUTOCASTS for i in w.items):
                called |= {c.func.value for c in findall(w.body, m.Call(func=m.Name()))}
        called &= self._model_names()
        roots: set[str] = set()
        for a in findall(node, m.Assign(targets=[m.AssignTarget(m.Name())])):
            if a.targets[0].target.value in called:
                roots |= {c.func.value for c in findall(a.value, m.Call(func=m.Name()))
                          if c.func.value in self.index.module_classes}

        def built(name: str) -> None:
            if name in self._lt_dtype_classes or name not in classes:
                return
            self._lt_dtype_classes.add(name)
            for c in findall(classes[name], m.Call(func=m.Name())):
                if c.func.value in self.index.module_classes:
                    built(c.func.value)
        for r in roots:
            built(r)

    def _lt_find_init_functions(self, node: cst.Module) -> None:
        """``self.apply(self._init_weights)`` in a constructor: linen layers take their
        initializers when they are built, so the init function's torch.nn.init calls become
        ``kernel_init=`` / ``embedding_init=`` arguments of the layers of that class and of
        the classes it builds; the statement and the function are removed."""
        classes = {c.name.value: c for c in node.body if isinstance(c, cst.ClassDef)}

        def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
            return next((f for f in cls.body.body if isinstance(f, cst.FunctionDef)
                         and f.name.value == name), None)

        def built(name: str, seen: set[str]) -> set[str]:
            if name in seen or name not in classes:
                return seen
            seen.add(name)
            init = method(classes[name], "__init__")
            for c in findall(init, m.Call(func=m.Name())) if init is not None else []:
                if c.func.value in self.index.module_classes:
                    built(c.func.value, seen)
            return seen

        for name, cls in classes.items():
            init = method(cls, "__init__")
            if init is None:
                continue
            for c in findall(init, m.Call(func=m.Attribute(value=m.Name("self"),
                                                             attr=m.Name("apply")))):
                if len(c.args) != 1 or not m.matches(c.args[0].value, m.Attribute(
                        value=m.Name("self"))):
                    continue
                fn = method(cls, c.args[0].value.attr.value)
                if fn is None:
                    continue
                try:
                    specs = lt.init_specs(fn, self.q)
                except Untranslatable:
                    continue  # marked where it is
                for reached in built(name, set()):
                    merged = self._lt_inits.setdefault(reached, {})
                    for layer, inits in specs.items():
                        merged.setdefault(layer, {}).update(inits)
                self._lt_init_fns.add((name, fn.name.value))

    # ------------------------------------------------------------------ helpers
    def q(self, node: cst.CSTNode) -> str | None:
        return qualified(self, node)

    def pos(self, node: cst.CSTNode) -> tuple[int, int]:
        try:
            p = self.get_metadata(PositionProvider, node)
            return p.start.line, p.start.column + 1
        except KeyError:
            return 0, 0

    def diag(self, node, rule: str, severity: str, message: str) -> None:
        message = one_line(message)
        line, col = self.pos(node)
        self.report(line, col, rule, severity, message)
        if self._pending:
            self._pending[-1].reported.append((line, col, rule, severity, message))
        if severity == "error" and self._pending:
            self._pending[-1].todos.append((rule, message))

    def need(self, *names: str) -> None:
        self.imports_needed.update(names)

    def _note_imports(self, node: cst.CSTNode | None) -> None:
        if not isinstance(node, cst.CSTNode):
            return
        for name in _IMPORT_NAME.findall(code(node)):
            self.need(name)

    @property
    def current_class(self) -> str | None:
        return self._class_stack[-1] if self._class_stack else None

    def in_module_class(self) -> bool:
        return self.current_class in self.index.module_classes

    def rngs_expr(self, node) -> cst.BaseExpression:
        if self._rngs_scope and self._rngs_scope[-1]:
            return cst.Name("rngs")
        if self._key_scopes[-1].has_key and not self._in_expr_scope and self._pending:
            self.need("nnx", "jax")
            return call("nnx.Rngs", arg(self._pending[-1].keys.take()))
        self.diag(node, "rngs", "info", "layer built outside a module: seeded with nnx.Rngs(0)")
        self.need("nnx")
        return expr("nnx.Rngs(0)")

    # ------------------------------------------------------------------ statements / TODOs
    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._pending.append(Pending())
        if isinstance(node, cst.IndentedBlock):
            self._depth += 1
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        if isinstance(original_node, cst.IndentedBlock):
            self._depth -= 1
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, (cst.Assign, cst.AnnAssign, cst.Import, cst.ImportFrom)
                      ) and isinstance(result, cst.RemovalSentinel) and self._pending:
            self._pending[-1].removed.append(updated_node)
        if self.linen and self._lt_blank is not None and self._lt_blank == self._depth and \
                isinstance(result, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self._lt_blank = None
            if not result.leading_lines:
                result = result.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            pending = self._pending.pop()
            if self._pending:  # a removed block knows what was reported inside it
                self._pending[-1].reported.extend(pending.reported)
            if id(original_node) in self.training.removed:
                return self._placeholder(original_node, updated_node, pending) or \
                    cst.RemoveFromParent()
            if not pending.before and not pending.after and (
                    isinstance(result, cst.RemovalSentinel) or (isinstance(
                        result, cst.SimpleStatementLine) and not result.body)):
                return self._placeholder(original_node, updated_node, pending) or result
            if isinstance(result, cst.SimpleStatementLine) and not result.deep_equals(
                    original_node):
                result = wrap_long_statement(result, 4 * self._depth)
            if pending.todos and isinstance(result, (cst.SimpleStatementLine,
                                                     cst.BaseCompoundStatement)):
                # (converting converted code again: its open TODOs are not written twice)
                present = {ll.comment.value for ll in result.leading_lines if ll.comment}
                comments = [
                    cst.EmptyLine(comment=cst.Comment(f"# TODO(torch2jax): {msg} [{rule}]"))
                    for rule, msg in dict.fromkeys(pending.todos)
                    if f"# TODO(torch2jax): {msg} [{rule}]" not in present
                ]
                result = result.with_changes(leading_lines=[*result.leading_lines, *comments])
            pending.before = [wrap_long_statement(b, 4 * self._depth) if isinstance(
                b, cst.SimpleStatementLine) else b for b in pending.before]
            pending.after = [wrap_long_statement(b, 4 * self._depth) if isinstance(
                b, cst.SimpleStatementLine) else b for b in pending.after]
            split = pending.keys.split_statement()
            if split is not None:
                self.need("jax")
                pending.before.append(split)
            if isinstance(result, cst.FlattenSentinel):
                result = cst.FlattenSentinel([*pending.before, *result.nodes, *pending.after])
            elif (pending.before or pending.after) and isinstance(
                    result, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                if pending.before:
                    # the statement's comments and blank lines go above what comes before it
                    first = pending.before[0]
                    pending.before[0] = first.with_changes(leading_lines=result.leading_lines)
                    result = result.with_changes(leading_lines=[])
                result = cst.FlattenSentinel([*pending.before, result, *pending.after])
            elif pending.after and isinstance(result, cst.RemovalSentinel):
                result = cst.FlattenSentinel(pending.after)
        return result

    def _placeholder(self, original, updated, pending: Pending
                     ) -> cst.SimpleStatementLine | None:
        """A removed statement that binds names something reads (or that belongs to an
        optimizer translation that may yet fail): a placeholder, and what to put back in its
        place if the finished file needs it (finish/removed.py)."""
        names = rmv.bound_names(original)
        part_of = self.training.removed_for.get(id(original))
        scope = self.get_metadata(ScopeProvider, original, None)
        if part_of is None and (not names or scope is None or not any(
                a.references for n in names for a in scope.assignments[n])):
            return None
        if isinstance(original, cst.SimpleStatementLine):
            if not pending.removed:
                if not updated.body:
                    return None
                pending.removed = list(updated.body)
            body = list(pending.removed)
            body[-1] = body[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            stmt = cst.SimpleStatementLine(body=body)
        else:
            stmt = updated.with_changes(leading_lines=[])
        empty = cst.Module([], default_indent=self._indent)
        key = len(self.removed)
        line, col = self.pos(original)
        imports = isinstance(original, cst.SimpleStatementLine) and all(
            isinstance(s, (cst.Import, cst.ImportFrom)) for s in original.body)
        self.removed[key] = rmv.Removed(
            names=frozenset(names), line=line, column=col, reported=list(pending.reported),
            translated=pending.translated if not pending.todos else None, part_of=part_of,
            imports=imports,
            statement=empty.with_changes(body=[stmt]).code,
            leading="".join(empty.code_for_node(ll) for ll in original.leading_lines),
            todos="".join(f"# TODO(torch2jax): {msg} [{rule}]\n"
                          for rule, msg in pending.todos))
        return rmv.placeholder(key, imports)

    # ------------------------------------------------------------------ imports
    def _dropped_import(self, module: str) -> bool:
        """torch's imports go; torchvision.transforms' when all its uses have numpy classes."""
        return module.split(".")[0] == "torch" or self.data.transforms_translated and (
            module == "torchvision.transforms" or module.startswith(dt.TRANSFORM_MODULES))

    def leave_Import(self, original_node, updated_node):
        keep = [a for a in updated_node.names if not self._dropped_import(code(a.name))]
        if not keep:
            return cst.RemoveFromParent()
        return updated_node.with_changes(names=_fix_commas(keep))

    def leave_ImportFrom(self, original_node, updated_node):
        mod = code(updated_node.module) if updated_node.module else ""
        if self._dropped_import(mod):
            return cst.RemoveFromParent()
        if mod == "torchvision" and isinstance(updated_node.names, (list, tuple)):
            keep = [a for a in updated_node.names
                    if not self._dropped_import(f"torchvision.{code(a.name)}")]
            if not keep:
                return cst.RemoveFromParent()
            return updated_node.with_changes(names=_fix_commas(keep))
        return updated_node

    # ------------------------------------------------------------------ classes
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_stack.append(node.name.value)
        # self.x = nn.Parameter(...) / self.register_buffer("x", ...) anywhere in the class
        # (define_relative_position_bias_table) or in its bases of this file
        names = set().union(*(self._variable_attrs.get(b.value.value, set())
                              for b in node.bases if isinstance(b.value, cst.Name)))
        for a in findall(node, m.Assign(targets=[m.AssignTarget(target=m.Attribute(
                value=m.Name("self")))], value=m.Call())):
            if self.q(a.value.func) in ("torch.nn.Parameter", "torch.nn.parameter.Parameter",
                                        "torch.nn.Buffer", "torch.nn.parameter.Buffer"):
                names.add(a.targets[0].target.attr.value)
        for c in findall(node, m.Call(func=m.Attribute(value=m.Name("self"),
                                                          attr=m.Name("register_buffer")))):
            if c.args and isinstance(c.args[0].value, cst.SimpleString):
                names.add(c.args[0].value.evaluated_value)
        self._variable_attrs[node.name.value] = names
        self._class_inits[node.name.value] = any(
            isinstance(f, cst.FunctionDef) and f.name.value == "__init__" for f in node.body.body)

    def leave_ClassDef(self, original_node, updated_node):
        name = self._class_stack.pop()
        if name not in self.index.module_classes:
            return self._dataset_class(original_node, updated_node)
        updated_node = self._lambda_methods(original_node, updated_node)
        info = self.index.classes[name]
        bases = []
        for b, ob in zip(updated_node.bases, original_node.bases):
            q = self.q(ob.value)
            if q in ("torch.nn.Module", "torch.nn.modules.module.Module"):
                bases.append(b.with_changes(value=expr(self.emitter.module_base)))
                self.need("linen" if self.linen else "nnx")
            elif (q in self.rules.layers and self.rules.layers[q].special in (
                    "sequential", "module_dict", "module_list") and not self.linen):
                # class ConvNormActivation(nn.Sequential): super().__init__(*layers) fills it;
                # class _DenseBlock(nn.ModuleDict): a dict of layers in insertion order
                special = self.rules.layers[q].special
                bases.append(b.with_changes(value=expr(
                    "LayerDict" if special == "module_dict"
                    else self.rules.layers[q].targets["nnx"])))
                self.need("nnx")
            elif q in self.rules.layers and q == info.layer_base and (
                    self._layer_subclass_rule(name) is not None):
                # class LayerNorm2d(nn.LayerNorm): the JAX layer, with the subclass's methods
                base = ("Embedding" if name in self._padded_embedding_subclasses
                        else self.rules.layers[q].targets["nnx"])
                bases.append(b.with_changes(value=expr(base)))
                self.need("nnx")
            elif q in self.rules.layers:
                self.diag(ob, "module-subclass", "error",
                          f"subclass of the torch layer {q}: its parameters and forward are "
                          "not translated")
                bases.append(b)
            else:
                bases.append(b)
        body = list(updated_node.body.body)
        has_init = any(isinstance(s, cst.FunctionDef) and s.name.value == "__init__"
                       for s in body)
        # (not when every self.training read became an nnx.Dropout, which has its own flag,
        # and no class of the file derives from this one)
        hoisted_all = (self._training_hoisted.get(name, 0) == self._training_reads.get(name, 0)
                       and self._training_hoisted.get(name, 0) > 0 and not any(
                           c.module_base == name for c in self.index.classes.values()))
        if (info.uses_training and info.module_base == "torch" and has_init and not self.linen
                and not hoisted_all):
            body = [self._add_training_flag(s) if isinstance(s, cst.FunctionDef)
                    and s.name.value == "__init__" else s for s in body]
        new = updated_node.with_changes(
            bases=bases, body=updated_node.body.with_changes(body=body))
        new = self._add_dropouts(name, new)
        if self.linen:
            try:
                is_base = any(c.module_base == name for c in self.index.classes.values())
                new = linen_target.readable_dense(new, self._linear_inputs(info))
                new, needs = linen_target.to_setup(
                    new, self.uses_train and info.module_base == "torch", kw_only=is_base)
                self.need(*needs)
                if name in self._lt_dtype_classes:
                    new = lt.add_dtype_field(new)
                    self.need("Any")
            except Untranslatable as exc:
                self.diag(original_node, "linen", "error", exc.message)
        return new

    def _linear_inputs(self, info) -> dict[str, cst.BaseExpression]:
        """self.x -> the input size of its torch ``nn.Linear(in, out)``."""
        out = {}
        for attr, layer in info.attr_rule.items():
            rule = self.rules.layers.get(layer)
            ctor = info.attr_ctor.get(attr)
            if layer == "torch.nn.Linear" and rule is not None and ctor is not None:
                size = bind(ctor.args, rule.params).get("in_features")
                if size is not None:
                    out[attr] = size
        return out

    def _dataset_class(self, original_node, updated_node):
        """class Points(Dataset): -> class Points: (grain reads __len__ and __getitem__)."""
        keep = []
        for b, ob in zip(updated_node.bases, original_node.bases):
            q = self.q(ob.value)
            if q in dt.DATASET_BASES:
                continue
            if q in dt.ITERABLE_BASES:
                continue  # a plain iterable: its loader is an IterableLoader
            keep.append(b)
        if len(keep) == len(updated_node.bases):
            return updated_node
        self.need("jax")
        updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=[
            dt.host_arrays(st) if isinstance(st, cst.FunctionDef) and st.name.value == "__init__"
            else st for st in updated_node.body.body]))
        if not keep:
            return updated_node.with_changes(bases=[], lpar=cst.MaybeSentinel.DEFAULT,
                                             rpar=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(bases=_fix_commas(keep))

    def _add_training_flag(self, fn: cst.FunctionDef) -> cst.FunctionDef:
        stmt = cst.parse_statement("self.deterministic = False  # flipped by .train()/.eval()")
        body = list(fn.body.body)
        i = 0
        while i < len(body) and _is_docstring(body[i]):
            i += 1
        body.insert(i, stmt)
        return fn.with_changes(body=fn.body.with_changes(body=body))

    # ------------------------------------------------------------------ functions
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._fn_stack.append(node)
        key = f"{self.current_class}.{node.name.value}" if self.current_class else node.name.value
        is_init = self.in_module_class() and node.name.value == "__init__"
        self._rngs_scope.append(is_init or key in self.index.rngs_functions)
        self._param_names.append({p.name.value for p in node.params.params}
                                 | {p.name.value for p in node.params.kwonly_params})
        self._loop_layouts.append({})
        free = self.current_class is None
        name = node.name.value
        takes_key = free and name in self.training.key_functions
        self._key_scopes.append(tr.KeyScope(
            has_key=takes_key, takes_key=takes_key,
            seeds_here=free and name in self.training.seed_functions))
        if self.linen and (self.current_class, name) in self._lt_init_fns:
            return False  # its initializers went to the layers; removed in leave_FunctionDef
        return None

    def leave_FunctionDef(self, original_node, updated_node):
        self._fn_stack.pop()
        takes_rngs = self._rngs_scope.pop()
        self._param_names.pop()
        self._loop_layouts.pop()
        keys = self._key_scopes.pop()
        if any(self.q(d.decorator) in _OVERLOADS for d in original_node.decorators):
            # @torch.jit._overload_method stubs (signatures for TorchScript): the definition
            # that follows them is the method
            return cst.RemoveFromParent()
        if self.in_module_class() and original_node.name.value in _STATE_DICT_HOOKS:
            self.diag(original_node, "module-hook", "info",
                      f"{original_node.name.value} removed: a hook of torch's state_dict "
                      "loading (torch2jax's weight transfer maps the torch names itself)")
            return cst.RemoveFromParent()
        node = self._remat_closures_take_self(original_node, updated_node)
        info = self.index.classes.get(self.current_class or "")
        if (self.in_module_class() and original_node.name.value == "__init__" and info
                and info.module_base == "torch" and info.container == "sequential"
                and not self.linen):
            self._fn_stack.append(original_node)
            try:
                if self._sequential_children():
                    node = self._sequential_from_attributes(node)
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or "torch.nn.Sequential", "error",
                          exc.message)
            finally:
                self._fn_stack.pop()
        if original_node.name.value == "__init__" and self._module_rngs():
            # the stream forward's draws take their keys from (_subkey)
            body = list(node.body.body)
            body.append(cst.parse_statement("self.rngs = rngs.fork()\n"))
            node = node.with_changes(body=node.body.with_changes(body=body))
        if keys.takes_key:
            self.need("jax")
            node = tr.add_key_param(node)
        if keys.seeds_here:
            try:
                node = tr.return_key(node)
            except Untranslatable as exc:
                self.diag(original_node, "seed", "error", exc.message)
        if self.in_module_class() and node.name.value == "forward":
            node = node.with_changes(name=cst.Name("__call__"))
        if self.linen and not self._class_stack and not self._fn_stack:
            node = self._lt_function(node)
        if self.linen and (self.current_class, node.name.value) in self._lt_init_fns:
            return cst.RemoveFromParent()
        if takes_rngs and self.linen and self.uses_train and not self.in_module_class():
            # a layer-building helper: says whether the layers it builds train
            node = add_kwonly_param(node, linen_target.TRAIN, "bool", "False")
        if takes_rngs and not self.linen:
            self.need("nnx")
            node = add_kwonly_param(node, "rngs", self.emitter.rngs_type)
        # @torch.no_grad() decorators
        decos = [d for d, od in zip(node.decorators, original_node.decorators)
                 if not (self.q(od.decorator) or "").startswith(("torch.no_grad",
                                                                 "torch.inference_mode"))
                 and not (isinstance(od.decorator, cst.Call)
                          and (self.q(od.decorator.func) or "").startswith(
                              ("torch.no_grad", "torch.inference_mode", "torch.jit")))
                 and not (self.q(od.decorator) or "").startswith("torch.jit")]
        no_grad = any((self.q(od.decorator.func if isinstance(od.decorator, cst.Call) else
                              od.decorator) or "").startswith(("torch.no_grad",
                                                               "torch.inference_mode"))
                      for od in original_node.decorators)
        if no_grad and not self._class_stack and not self._fn_stack and not self.linen and (
                self.emitter.name == "nnx"):
            # @torch.no_grad() def evaluate(model, loader): its model calls go through the
            # jit-compiled eval step, as in a `with torch.no_grad():` block
            jitted = tr.JitModelCalls(self._model_names())
            node = node.with_changes(body=node.body.visit(jitted))
            if jitted.count:
                self._eval_step = True
                self.need("nnx")
        node = node.with_changes(decorators=decos)
        ep = self._lt_epoch.get(node.name.value) if self.linen and not self._class_stack and \
            not self._fn_stack else None
        if ep is not None and ep.module_step is not None:
            # the train step of a function run once per epoch, compiled once
            return cst.FlattenSentinel([ep.module_step.with_changes(
                leading_lines=node.leading_lines), node.with_changes(
                leading_lines=[cst.EmptyLine(indent=False)] * 2)])
        return node

    # ------------------------------------------------------------------ statements
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0].target, (cst.Tuple, cst.List)):
            self._unpack[id(node.value)] = len(node.targets[0].target.elements)

    def leave_Assign(self, original_node, updated_node):
        if self.linen and not self.in_module_class() and len(original_node.targets) == 1 and \
                m.matches(original_node.value, m.Call(func=m.Name())) and \
                original_node.value.func.value in self._lt_epoch:
            return self._lt_epoch_call(original_node.value, updated_node.value,
                                       updated_node.targets[0].target)
        data = self._data_assign(original_node, updated_node)
        if data is not None:
            return data
        site = self.training.statements.get(id(original_node))
        if site is not None:
            try:
                return self._training_assign(original_node, updated_node, site)
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or site.qualname, "error", exc.message)
                self.failed_sites.add(id(site))
                return updated_node
        target = original_node.targets[0].target if len(original_node.targets) == 1 else None
        if target is not None and (self.q(target) or "").startswith("torch.backends."):
            self.diag(original_node, "torch.backends", "info",
                      f"{code(target)} removed: no JAX counterpart (XLA is deterministic "
                      "on CPU; see XLA flags for GPU)")
            return cst.RemoveFromParent()
        # tied weights: the JAX side shares one table
        if (isinstance(target, cst.Attribute) and target.attr.value == "weight"
                and isinstance(original_node.value, cst.Attribute)
                and original_node.value.attr.value == "weight" and self.in_module_class()):
            info = self.index.classes[self.current_class]
            if not info.tied_heads:
                self.diag(original_node, "tied-weights", "error",
                          "weight tying other than a bias-free Linear head with an Embedding")
                return updated_node
            self.diag(original_node, "tied-weights", "info",
                      "tied weights: the head calls the embedding's attend()")
            return cst.RemoveFromParent()
        if m.matches(target, m.Attribute(value=m.Name("self"))) and self.in_module_class():
            info = self.index.classes[self.current_class]
            if target.attr.value in info.tied_heads:
                return cst.RemoveFromParent()
            if m.matches(original_node.value, m.Name("None")) and self._holds_layer(
                    target.attr.value):
                # self.proj = None, a layer later (or in a branch): NNX makes an attribute
                # first set to None static unless it is marked as data
                self.need("nnx")
                return updated_node.with_changes(value=expr("nnx.data(None)"))
            if not self.linen and is_identity_lambda(updated_node.value) and \
                    target.attr.value in info.real_layer_attrs:
                # self.shortcut = nn.Identity(), a layer in another branch: an empty
                # nnx.Sequential (it returns its input) keeps the attribute a module
                self.need("nnx")
                return updated_node.with_changes(value=expr("nnx.Sequential()"))
        factory = _factory_dict(updated_node.value) if isinstance(target, cst.Name) else None
        if factory is not None:
            # dd = {"device": device, "dtype": dtype}, handed on as **dd: JAX places arrays by
            # sharding, so the device entry goes (an NNX layer would refuse device=)
            self._factory_dicts[target.value] = factory.get("dtype")
            if "device" in factory:
                self.diag(original_node, "factory-kwargs", "info",
                          f"{target.value}: the device entry is dropped (JAX places arrays by "
                          "sharding); torch layers built with it take no dtype either")
                kept = [e for e in updated_node.value.elements
                        if e.key.evaluated_value != "device"]
                if kept:
                    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return updated_node.with_changes(value=updated_node.value.with_changes(
                    elements=kept))
            return updated_node
        # device bookkeeping: device = torch.device(...), device = x.device
        if isinstance(target, cst.Name) and _is_device_expr(original_node.value, self):
            # removed unless a later line still reads it (then put back: finish/removed.py)
            self._device_names.add(target.value)
            if not isinstance(original_node.value, cst.Attribute):
                self._pending[-1].translated = (
                    f"{target.value}: a later line reads this device selection: kept, "
                    "translated")
            return cst.RemoveFromParent()
        # x[i] = v -> x = x.at[i].set(v) (not into an OrderedDict of layers, nor a list)
        if isinstance(target, cst.Subscript) and len(updated_node.targets) == 1 and not (
                isinstance(target.value, cst.Name) and self._fn_stack
                and (Layouts(self.rules, self, self.index).is_ordered_dict(target.value.value)
                     or _python_list(self._fn_stack[-1], target.value.value))
        ) and not self._layer_container(target.value):
            kind = self._array_target(target.value)
            if kind == "python":  # config['vocab_size'] = 50257, param_group['lr'] = lr
                return updated_node
            if kind == "unsure":
                self.diag(original_node, "indexed-update", "error",
                          f"{code(target.value)}[...] = ...: {code(target.value)} is not known "
                          "to be an array (JAX arrays are immutable: x = x.at[i].set(v)) or a "
                          "Python container: left as it is")
                return updated_node
            return self._indexed_update(original_node, updated_node.targets[0].target,
                                        "set", updated_node.value)
        # self.x = nn.Parameter(...) handled in calls; register_buffer in leave_Expr
        return updated_node

    def leave_AnnAssign(self, original_node, updated_node):
        # self.AuxLogits: Optional[nn.Module] = None, a layer later (inception_v3)
        if (m.matches(original_node.target, m.Attribute(value=m.Name("self")))
                and m.matches(original_node.value, m.Name("None")) and self.in_module_class()
                and self._holds_layer(original_node.target.attr.value)):
            self.need("nnx")
            return updated_node.with_changes(value=expr("nnx.data(None)"))
        return updated_node

    def _holds_layer(self, attr: str) -> bool:
        """``self.<attr>`` of the current module class is assigned a layer somewhere: a torch
        layer or module class, or a call of a module class held in a local of this function
        (``inception_aux = inception_blocks[6]``)."""
        if self.linen:
            return False
        info = self.index.classes[self.current_class]
        if attr in info.module_attrs:
            return True
        return bool(self._fn_stack and info.built_by.get(attr, set())
                    & self._module_class_locals())

    def _in_removed_line(self, node: cst.CSTNode) -> bool:
        """``node`` sits in a statement the training pass removes (the parameter-group
        bookkeeping of a configure_optimizers: ``if p.requires_grad``)."""
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            node = self.get_metadata(ParentNodeProvider, node, None)
        return node is not None and id(node) in self.training.removed

    def _layer_container(self, node: cst.BaseExpression) -> bool:
        """``self.heads`` holding a ModuleDict / ModuleList (``self.heads["a"] = layer``), or
        ``self`` in a subclass of one."""
        info = self.index.classes.get(self.current_class or "")
        if info is None:
            return False
        if m.matches(node, m.Name("self")):
            return info.container in ("module_dict", "module_list")
        return m.matches(node, m.Attribute(value=m.Name("self"))) and info.attr_rule.get(
            node.attr.value) in ("torch.nn.ModuleDict", "torch.nn.ModuleList")

    def leave_If(self, original_node, updated_node):
        """``if torch.jit.is_scripting(): ...`` is dead in JAX code (the query is False): the
        branch goes, its ``else`` (if any) stays in its place."""
        test = original_node.test
        rule = self.rules.functions.get(self.q(test.func) or "") if isinstance(
            test, cst.Call) else None
        if rule is None or rule.special != "false" or not m.matches(updated_node.test,
                                                                   m.Name("False")):
            return updated_node
        other = updated_node.orelse
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if isinstance(parent, cst.If) and parent.orelse is original_node:
            # an elif: its place takes an elif or an else, not statements
            return cst.RemoveFromParent() if other is None else other
        if other is None:
            return cst.RemoveFromParent()
        if isinstance(other, cst.If):  # elif: it becomes the if
            return other.with_changes(leading_lines=updated_node.leading_lines)
        body = list(other.body.body)
        if body:
            body[0] = body[0].with_changes(leading_lines=[*updated_node.leading_lines,
                                                          *body[0].leading_lines])
        return cst.FlattenSentinel(body)

    def leave_AugAssign(self, original_node, updated_node):
        if isinstance(updated_node.target, cst.Subscript) and self._array_target(
                original_node.target.value) == "python":
            return updated_node  # counts[name] += 1 on a dict
        if isinstance(updated_node.target, cst.Subscript):
            ops = {cst.AddAssign: "add", cst.SubtractAssign: "subtract",
                   cst.MultiplyAssign: "multiply", cst.DivideAssign: "divide"}
            op = ops.get(type(updated_node.operator))
            if op is None:
                self.diag(original_node, "indexed-update", "error",
                          "indexed augmented assignment with this operator")
                return updated_node
            return self._indexed_update(original_node, updated_node.target, op,
                                        updated_node.value)
        return updated_node

    def _data_assign(self, original_node: cst.Assign, updated_node: cst.Assign):
        """Samplers and scalers (consumed where they are used) and per-epoch loaders."""
        target = original_node.targets[0].target if len(original_node.targets) == 1 else None
        if not isinstance(target, cst.Name) or not isinstance(original_node.value, cst.Call):
            return None
        q = self.q(original_node.value.func) or ""
        name = target.value
        if q in dt.SAMPLERS and name in self.data.samplers or (
                q in dt.BATCH_SAMPLERS and name in self.data.batch_samplers):
            return cst.RemoveFromParent()  # read by the DataLoader that uses it
        if self.data.seeded_draw(name):
            # g = torch.Generator().manual_seed(s), read by torch.randn(..., generator=g)
            self.need("jax")
            return updated_node.with_changes(value=expr(
                "jax.random.key({s})", s=self.data.generators[name]))
        if self._consumed_generator(name):
            return cst.RemoveFromParent()  # its seed is the shuffle seed of what reads it
        if q in dt.SCALERS:
            self.diag(original_node, q, "info", "GradScaler removed: the autocast region "
                      "computes in bfloat16, which needs no loss scaling")
            return cst.RemoveFromParent()
        site = self.data.loaders.get(name)
        if q in dt.LOADERS and site is not None and site.shuffled:
            try:
                expanded, warnings = dt.expand_loader_kwargs(
                    original_node.value, updated_node.value, self.get_metadata)
                pipeline, notes = dt.loader_pipeline(original_node.value, expanded, self.q,
                                                     self.data, "epoch")
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or q, "error", exc.message)
                return None
            for note in notes:
                self.diag(original_node, q, "info", note)
            for note in warnings:
                self.diag(original_node, q, "warning", note)
            self.need("grain")
            blank = [cst.EmptyLine(indent=False)]
            self._pending[-1].after.append(dt.loader_function(name, "epoch", pipeline, blank))
            return cst.RemoveFromParent()
        return None

    def _indexed_update(self, original, target: cst.Subscript, op: str, value):
        base = target.value
        if not isinstance(base, cst.Name):
            self.diag(original, "indexed-update", "error",
                      "assignment into an indexed attribute or expression: JAX arrays are "
                      "immutable; rebind the array with .at[...].set(...)")
            return cst.Assign(targets=[cst.AssignTarget(target)], value=value) if op == "set" \
                else cst.AugAssign(target=target, operator=cst.AddAssign(), value=value)
        index = cst.Subscript(value=expr("{b}.at", b=base), slice=target.slice)
        new = call(expr("{i}." + op, i=index), arg(value))
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(base.value))], value=new)

    def leave_Expr(self, original_node, updated_node):
        value = original_node.value
        handled = self._accumulation_statement(original_node)
        if handled is not None:
            return handled
        if self.linen and not self.in_module_class():
            handled = self._lt_statement(original_node, updated_node)
            if handled is not None:
                return handled
        handled = self._torch_machinery_statement(original_node, updated_node)
        if handled is not None:
            return handled
        if (self.in_module_class() and self.index.classes[self.current_class].container
                == "module_dict" and m.matches(value, m.Call(func=m.Attribute(
                    value=m.Name("self"), attr=m.Name("add_module"))))
                and m.matches(updated_node.value, m.Call(func=m.Name("setattr")))):
            # self.add_module(name, layer) in a ModuleDict subclass: self[name] = layer
            _, key, layer = updated_node.value.args
            return cst.Assign(targets=[cst.AssignTarget(cst.Subscript(
                value=cst.Name("self"), slice=[cst.SubscriptElement(cst.Index(key.value))]))],
                value=layer.value)
        handled = self._data_statement(original_node, updated_node)
        if handled is not None:
            return handled
        handled = self._training_statement(original_node, updated_node)
        if handled is not None:
            return handled
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            meth = value.func.attr.value
            recv = value.func.value
            # self.register_buffer("name", tensor) -> self.name = nnx.Variable(tensor)
            if meth == "register_buffer" and m.matches(recv, m.Name("self")):
                new_call = updated_node.value
                b = bind(new_call.args, ("name", "tensor", "persistent"))
                name = try_literal(b.get("name"), ...)
                if not isinstance(name, str) or b.get("tensor") is None:
                    self.diag(original_node, "register_buffer", "error",
                              "register_buffer with a computed name")
                    return updated_node
                if self.linen:  # a constant computed in setup()
                    return cst.Assign(targets=[cst.AssignTarget(expr(f"self.{name}"))],
                                      value=b.get("tensor"))
                self.need("nnx")
                return cst.Assign(
                    targets=[cst.AssignTarget(expr(f"self.{name}"))],
                    value=call(self.emitter.buffer, arg(b.get("tensor"))))
            if meth in ("to", "cuda", "cpu", "train", "eval", "zero_grad") and \
                    self._is_module_expr(recv) and meth in ("to", "cuda", "cpu"):
                return cst.RemoveFromParent()
            # x.add_(y) -> x = x + y
            if meth.endswith("_") and not meth.startswith("_") and self._tensorlike(recv):
                return self._inplace(original_node, updated_node, meth)
        if isinstance(updated_node.value, (cst.Name, cst.Attribute)) and isinstance(
                value, cst.Call):
            # a device move used as a statement (model.to(device)) left only its receiver
            return cst.RemoveFromParent()
        return updated_node

    def leave_Return(self, original_node, updated_node):
        site = self.training.statements.get(id(original_node))
        if site is None or updated_node.value is None:
            return updated_node
        try:
            if not self.linen:
                self._nnx_only("optimizers")
            return updated_node.with_changes(
                value=self._optimizer(original_node, updated_node.value, site))
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or site.qualname, "error", exc.message)
            self.failed_sites.add(id(site))
            return updated_node

    def _drop_noop_kwargs(self, value: cst.Call) -> cst.Call:
        """``AdamW(groups, lr=lr, **extra_args)`` with ``extra_args = dict(fused=True) if
        use_fused else dict()`` in the same function: the dict only holds torch's kernel
        choices (fused, foreach, capturable), which optax has no counterpart for."""
        fn = self._fn_stack[-1] if self._fn_stack else None
        args = list(value.args)
        for a in value.args:
            if a.star != "**" or not isinstance(a.value, cst.Name) or fn is None:
                continue
            binds = [x.value for x in findall(fn, m.Assign(targets=[m.AssignTarget(
                target=m.Name(a.value.value))]))]
            if len(binds) != 1:
                continue
            parts = [binds[0].body, binds[0].orelse] if isinstance(
                binds[0], cst.IfExp) else [binds[0]]
            if all(m.matches(p, m.Call(func=m.Name("dict"))) and all(
                    x.keyword is not None and x.keyword.value in _KERNEL_CHOICES
                    for x in p.args) or m.matches(p, m.Dict()) and all(
                    isinstance(e, cst.DictElement) and try_literal(e.key, None)
                    in _KERNEL_CHOICES for e in p.elements) for p in parts):
                args.remove(a)
        if len(args) == len(value.args):
            return value
        return value.with_changes(args=_fix_commas(args))

    def _nnx_only(self, what: str) -> None:
        if self.emitter.name != "nnx":
            raise Untranslatable(f"{what}: translated for --target nnx so far "
                                 f"({self.emitter.name} is planned)", rule="target")

    def _training_assign(self, original_node, updated_node, site):
        from torch2jax.analysis.training import SchedulerSite

        if not self.linen:
            self._nnx_only("optimizers and schedulers")
        if isinstance(site, SchedulerSite):
            return self._scheduler(original_node, updated_node, site)
        value = self._optimizer(original_node, updated_node.value, site)
        new = updated_node.with_changes(value=value)
        sched = site.scheduler
        if sched is not None and sched.inline:
            self._deferred[sched.name] = new
            return cst.RemoveFromParent()
        return new

    def _optimizer(self, original_node, value: cst.Call, site) -> cst.BaseExpression:
        try:
            from torch2jax.training import optim
        except ImportError:  # pragma: no cover - the package is part of torch2jax
            raise Untranslatable(f"no translation for {site.qualname}") from None
        value = self._drop_noop_kwargs(value)
        opt = optim.translate_optimizer(value, site.qualname)
        overrides: dict[str, cst.BaseExpression] = {}
        mask = None
        if site.groups is not None:
            overrides, mask = tr.group_mask(site.groups, opt)
            self.diag(original_node, "param-groups", "info",
                      "parameter groups became an optax mask; the statements that only "
                      "built the groups were removed")
        elif site.groups_problem:
            raise Untranslatable(site.groups_problem, rule="param-groups")
        sched = site.scheduler
        inline = bool(sched is not None and sched.per_update and sched.scope == site.scope
                      and site.name is not None
                      and not sched.qualname.endswith("ReduceLROnPlateau"))
        if sched is not None:
            sched.inline = inline
        if site.name:  # (aliases in other scopes read the lr from the optimizer)
            self._opt_lr[site.name] = opt.lr
        # the learning rate set by hand (param_groups), or the optimizer returned to another
        # file (configure_optimizers), whose loop may set it: an injected hyperparameter
        inject = (sched is not None and not inline) or sched is None and (
            site.lr_set or site.returned and not site.aliases)
        clip = site.clip
        if inject and clip is not None:
            # the injected hyperparameters must be the outermost state: clip inside
            tx = opt.build(lr=cst.Name("learning_rate"), overrides=overrides, mask=mask)
        else:
            tx = opt.build(lr=cst.Name(sched.name) if inline else None, overrides=overrides,
                           mask=mask, inject=inject)
        if clip is not None:
            kind, limit = clip
            tx = (optim.with_clipping(tx, max_norm=limit) if kind == "norm"
                  else optim.with_clipping(tx, clip_value=limit))
        if site.accumulate is not None:
            if inject:
                raise Untranslatable("gradient accumulation with a learning rate set outside "
                                     "the update (scheduler stepped per epoch)",
                                     rule="accumulation")
            # torch sums the gradients of the k backward() calls (the loss is usually divided
            # by k already): MultiSteps without averaging
            tx = expr("optax.MultiSteps({tx}, every_k_schedule={k}, use_grad_mean=False)",
                      tx=tx, k=site.accumulate)
            self.diag(original_node, "accumulation", "info",
                      "gradient accumulation became optax.MultiSteps: the update is applied "
                      "every k steps, with the sum of the k gradients (torch differs when an "
                      "epoch's batch count is not a multiple of k and the counter restarts)")
        if clip is not None:
            if inject:
                lr = overrides.get("lr", opt.lr)
                tx = expr("optax.inject_hyperparams(lambda learning_rate: {tx})"
                          "(learning_rate={lr})", tx=tx, lr=lr)
        for severity, msg in opt.notes:
            self.diag(original_node, site.qualname, severity, msg)
        model = site.model or "model"
        if self.linen:  # the optax transform; the TrainState is made before the loop
            self.need("optax")
            self._note_imports(tx)
            return tx
        self.need("nnx", "optax")
        out = tr.optimizer_object(model, tx)
        self._note_imports(out)
        return out

    def _scheduler(self, original_node, updated_node, sched):
        from torch2jax.training import optim

        base = self._opt_lr.get(sched.optimizer or "")
        before: list[cst.BaseStatement] = []
        if base is None and sched.part:
            raise Untranslatable("a scheduler combined by another one, on an optimizer built "
                                 "elsewhere", rule=sched.qualname)
        if base is None:
            # the optimizer was built elsewhere (configure_optimizers): read its lr
            base_name = f"{sched.name}_base_lr"
            before.append(cst.parse_statement(
                f"{base_name} = {self._lr_slot(sched.optimizer)}\n"))
            base = cst.Name(base_name)
        schedule = optim.translate_scheduler(updated_node.value, sched.qualname, base,
                                             lambda e: self._schedules.get(code(e)))
        if schedule.plateau is not None:
            return self._plateau(original_node, updated_node, sched, schedule, base, before)
        if schedule.fn is None:
            raise Untranslatable(f"{sched.qualname}: no schedule", rule=sched.qualname)
        self._schedules[sched.name] = schedule
        for severity, msg in schedule.notes:
            self.diag(original_node, sched.qualname, severity, msg)
        new = updated_node.with_changes(value=schedule.fn)
        self._note_imports(schedule.fn)
        after: list[cst.BaseSmallStatement] = []
        if sched.part:
            pass
        elif sched.inline:
            deferred = self._deferred.pop(sched.name, None)
            if deferred is not None:
                after.append(deferred)
        elif sched.optimizer:
            # the optimizer's learning rate is a hyperparameter set where step() was called
            after.append(cst.parse_statement(f"{self._steps(sched.name)} = 0\n").body[0])
            after.append(cst.parse_statement(
                f"{self._lr_slot(sched.optimizer)} = jnp.float32({sched.name}(0))\n").body[0])
            self.need("jnp")
            self.diag(original_node, sched.qualname, "info",
                      "scheduler stepped other than after every optimizer step: the learning "
                      "rate is an optax.inject_hyperparams hyperparameter set at each step()")
        if self.linen and not sched.inline and not sched.part and sched.optimizer:
            # the learning rate lives in the TrainState's optimizer state: set once it exists
            self._lt_after_state.extend([*before, *(cst.SimpleStatementLine(body=[a])
                                                    for a in after)])
            before, after = [], []
        if self._pending:
            self._pending[-1].before.extend(before)
            if after:
                self._pending[-1].after.extend(cst.SimpleStatementLine(body=[a]) for a in after)
        return new

    def _lr_slot(self, optimizer: str, quote: str = '"') -> str:
        return lt.lr_slot(quote) if self.linen else tr.lr_slot(optimizer, quote)

    def _pending_line_comments(self) -> list[cst.EmptyLine]:
        return []

    def _checkpoint_call(self, node: cst.Call) -> tuple[str, str, cst.BaseExpression] | None:
        """``torch.save(M.state_dict(), path)`` -> ("save", M, path);
        ``M.load_state_dict(torch.load(path, ...))`` -> ("load", M, path); as statements."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        q = self.q(node.func)
        if q == "torch.save" and isinstance(parent, cst.Expr) and len(node.args) >= 2 and \
                m.matches(node.args[0].value, m.Call(func=m.Attribute(
                    value=m.Name(), attr=m.Name("state_dict")), args=[])):
            return "save", node.args[0].value.func.value.value, node.args[1].value
        if q == "torch.load" and isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if (m.matches(outer, m.Call(func=m.Attribute(value=m.Name(),
                                                          attr=m.Name("load_state_dict"))))
                    and len(outer.args) == 1 and node.args and isinstance(
                        self.get_metadata(ParentNodeProvider, outer, None), cst.Expr)):
                return "load", outer.func.value.value, node.args[0].value
        return None

    def _stateful(self, node: cst.BaseExpression) -> bool:
        """A model or an optimizer (its state is an nnx.state)."""
        if not isinstance(node, cst.Name):
            return False
        t = self.training
        if node.value in t.model_vars or node.value in t.optimizer_names or (
                node.value in self._acc.foreign):
            return True
        return self.values is not None and self.values.kind(node) in (
            vk.Kind.MODULE, vk.Kind.OPTIMIZER)

    def _checkpoint_dict_call(self, original_node: cst.Call):
        """Checkpoint dicts (analysis/accumulate.py find_checkpoint_dicts), nnx:
        ``m.state_dict()`` in the dict -> its nnx.state as a pure dict; ``torch.load(path)``
        -> the orbax PyTree restored."""
        if self.linen or self.for_equinox or self.emitter.name != "nnx" or not (
                self._ckpt_dicts or self._ckpt_loads):
            return None
        func = original_node.func
        if m.matches(func, m.Attribute(attr=m.Name("state_dict"))) and not original_node.args \
                and self._stateful(func.value) and isinstance(self.get_metadata(
                    ParentNodeProvider, original_node, None), cst.DictElement):
            self.need("nnx")
            return expr(f"nnx.state({code(func.value)}).to_pure_dict()")
        if self.q(func) == "torch.load" and original_node.args and m.matches(
                self.get_metadata(ParentNodeProvider, original_node, None),
                m.Assign(targets=[m.AssignTarget(target=m.Name())])):
            target = self.get_metadata(ParentNodeProvider, original_node, None).targets[0]
            if target.target.value not in self._ckpt_loads:
                return None
            self.need("os", "ocp")
            self.diag(original_node, "torch.load", "info",
                      "torch.load of a checkpoint dict -> the orbax PyTree checkpoint (a "
                      "directory at that path) that the converted torch.save writes; "
                      "state_dicts in it are nnx.state pure dicts")
            return expr(f"ocp.PyTreeCheckpointer().restore(os.path.abspath("
                        f"{code(original_node.args[0].value)}))")
        return None

    def _parameters_call(self, original_node: cst.Call):
        """NNX: a model's ``parameters()`` iterated (counting: ``sum(p.numel() for p in
        model.parameters())``) -> the arrays of its nnx.Param state; ``named_parameters()``
        iterated by a for loop -> its nnx.Param variables with torch's dotted names (a layer's
        ``kernel`` / ``embedding`` / ``scale`` is torch's ``weight``)."""
        func = original_node.func
        if self.linen or self.for_equinox or self.emitter.name != "nnx" or \
                original_node.args or not m.matches(func, m.Attribute(
                    value=m.Name(), attr=m.Name("parameters") | m.Name("named_parameters"))):
            return None
        owner = func.value.value
        if not (owner == "self" and self.in_module_class() or owner in
                self.training.model_vars or self.values is not None and self.values.kind(
                    func.value) == vk.Kind.MODULE):
            return None
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        self.need("nnx", "jax")
        if func.attr.value == "parameters" and isinstance(parent, (cst.CompFor, cst.For)) \
                and parent.iter is original_node:
            return expr(f"jax.tree.leaves(nnx.state({owner}, nnx.Param))")
        if func.attr.value == "named_parameters" and isinstance(parent, cst.For) and \
                parent.iter is original_node:
            return cst.parse_expression(
                f"((\".\".join(map(str, (*path[:-1], {{'kernel': 'weight', 'embedding': "
                f"'weight', 'scale': 'weight'}}.get(path[-1], "
                f"path[-1])))), p) for path, p in nnx.iter_graph({owner}) "
                f"if isinstance(p, nnx.Param))")
        return None

    def _checkpoint_dict_statement(self, original_node: cst.Expr):
        value = original_node.value
        if self.linen or self.for_equinox or self.emitter.name != "nnx" or not isinstance(
                value, cst.Call):
            return None
        if self.q(value.func) == "torch.save" and len(value.args) >= 2 and isinstance(
                value.args[0].value, cst.Name) and value.args[0].value.value in self._ckpt_dicts:
            self.need("os", "ocp")
            self.diag(original_node, "torch.save", "info",
                      "torch.save of a checkpoint dict -> an orbax PyTree checkpoint (a "
                      "directory at that path); its state_dicts are nnx.state pure dicts")
            return cst.Expr(expr(
                f"ocp.PyTreeCheckpointer().save(os.path.abspath({code(value.args[1].value)}), "
                f"{value.args[0].value.value}, force=True)"))
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(),
                                                    attr=m.Name("load_state_dict")),
                                   args=[m.Arg(keyword=None)])) and not m.matches(
                value.args[0].value, m.Call()) and self._stateful(value.func.value) and (
                self._ckpt_loads):
            owner = value.func.value.value
            state = f"{owner}_state"
            self.need("nnx")
            self._pending[-1].after.extend(cst.parse_statement(line) for line in (
                f"{state}.replace_by_pure_dict({code(value.args[0].value)})\n",
                f"nnx.update({owner}, {state})\n"))
            self.diag(original_node, "load_state_dict", "info",
                      f"{owner}.load_state_dict(d) -> its nnx.state with the checkpoint's pure "
                      "dict put in, then nnx.update")
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(state))],
                              value=expr(f"nnx.state({owner})"))
        return None

    def _checkpoint_statement(self, original_node: cst.Expr):
        value = original_node.value
        if self.emitter.name not in ("nnx", "linen"):
            return None
        handled = self._checkpoint_dict_statement(original_node)
        if handled is not None:
            return handled
        site = None
        if self.q(value.func) == "torch.save":
            site = self._checkpoint_call(value)
        elif m.matches(value, m.Call(func=m.Attribute(attr=m.Name("load_state_dict")),
                                     args=[m.Arg(m.Call())])):
            site = self._checkpoint_call(value.args[0].value)
        if site is None:
            return None
        kind, model, path = site
        p = code(path)
        if self.linen:
            return self._lt_checkpoint(original_node, kind, model, p)
        if kind == "save":
            inner = f"checkpointer.save(os.path.abspath({p}), nnx.state({model}), force=True)"
        else:
            inner = (f"nnx.update({model}, checkpointer.restore(os.path.abspath({p}), "
                     f"nnx.state({model})))")
        self.need("nnx")
        return self._orbax(original_node, kind, inner, "the model's nnx.state")

    def _lt_checkpoint(self, original_node, kind: str, model: str, p: str):
        """torch.save(model.state_dict(), path) -> an orbax checkpoint of the trained
        variables, where they are known: after the training loop, or read from the state
        after each epoch's training call."""
        scope = id(self._fn_stack[-1]) if self._fn_stack else 0
        if model not in self._model_names() or (self._for_stack and scope not in (
                self._lt_state_made)) or (self._fn_stack and self._fn_stack[0].name.value
                                          in self._lt_epoch):
            self.diag(original_node, f"torch.{kind}", "error",
                      f"torch.{kind} of {model}'s state_dict in the training loop or in a "
                      "function run once per epoch: checkpoint the TrainState's variables by "
                      "hand (orbax)")
            return None
        if kind == "save":
            inner = f"checkpointer.save(os.path.abspath({p}), {lt.VARIABLES}, force=True)"
        else:
            inner = (f"{lt.VARIABLES} = checkpointer.restore(os.path.abspath({p}), "
                     f"{lt.VARIABLES})")
        return self._orbax(original_node, kind, inner, f"{model}'s variables")

    def _orbax(self, original_node, kind: str, inner: str, what: str):
        """The statement becomes ``with ocp.StandardCheckpointer() as checkpointer: inner``."""
        block = cst.parse_statement(f"with ocp.StandardCheckpointer() as checkpointer:\n"
                                    f"    {inner}\n")
        self.need("os", "ocp")
        self.diag(original_node, f"torch.{kind}", "info",
                  f"{'saves' if kind == 'save' else 'restores'} an orbax checkpoint (a "
                  f"directory at that path) of {what}")
        self._pending[-1].after.append(block)
        return cst.RemoveFromParent()

    def leave_For(self, original_node, updated_node):
        updated_node = self._loader_loop(original_node, updated_node)
        return self._leave_for(original_node, self._modules_loop(original_node, updated_node))

    def _loader_loop(self, original_node, updated_node):
        """for x, y in loader: -> for x, y in loader(epoch): (a loader shuffled per epoch), also
        where the loop wraps it: enumerate(loader), tqdm(loader), zip(loader, ...)."""
        outer = [f.target.value for f in self._for_stack[:-1] if isinstance(f.target, cst.Name)]
        return updated_node.with_changes(iter=self._epoch_loaders(
            updated_node.iter, outer[-1] if outer else "0"))

    def _epoch_loaders(self, it: cst.BaseExpression, epoch: str) -> cst.BaseExpression:
        """``it`` with each loader shuffled per epoch, bare or an argument of the calls that wrap
        it, called with ``epoch``."""
        if isinstance(it, cst.Name) and it.value in self.data.loaders and (
                self.data.loaders[it.value].shuffled) and not self._shadowed(it.value):
            return expr(f"{it.value}({epoch})")
        if isinstance(it, cst.Call):
            return it.with_changes(args=[a.with_changes(value=self._epoch_loaders(a.value, epoch))
                                         for a in it.args])
        return it

    def _per_call_trainer(self, optimizer: str) -> bool:
        """The loop is in a top-level function that receives the optimizer (``def train(model,
        loader, optimizer, scheduler)``, called once per epoch)."""
        return len(self._fn_stack) == 1 and not self._class_stack and self._shadowed(optimizer)

    def _shadowed(self, name: str) -> bool:
        """``name`` is a parameter of the function being rewritten (``def train(model, loader)``
        receives the epoch's loader, whatever the caller's loader is called)."""
        return bool(self._fn_stack) and name in {
            p.name.value for p in (*self._fn_stack[-1].params.params,
                                   *self._fn_stack[-1].params.kwonly_params)}

    def leave_CompFor(self, original_node, updated_node):
        """[x for epoch in range(n) for x in loader]: loader(epoch), as in a for statement."""
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        outer = [f.target.value for f in self._for_stack if isinstance(f.target, cst.Name)]
        if isinstance(parent, cst.CompFor) and isinstance(parent.target, cst.Name):
            outer.append(parent.target.value)
        return updated_node.with_changes(iter=self._epoch_loaders(
            updated_node.iter, outer[-1] if outer else "0"))

    def _modules_loop(self, original_node, updated_node):
        """for m in self.modules(): -> for _, m in nnx.iter_modules(self): (also of a
        submodule: for m in self.mlp.modules(), swin's init)"""
        owner = m.Name("self") | m.Attribute(value=m.Name("self"))
        if (self.emitter.name == "nnx" and self.in_module_class()
                and m.matches(original_node.iter, m.Call(func=m.Attribute(
                    value=owner, attr=m.Name("modules")), args=[]))
                and isinstance(original_node.target, cst.Name)):
            self.need("nnx")
            return updated_node.with_changes(
                target=cst.Tuple([cst.Element(cst.Name("_")),
                                  cst.Element(original_node.target)], lpar=[], rpar=[]),
                iter=expr("nnx.iter_modules({o})", o=original_node.iter.func.value))
        return updated_node

    def _is_statement_call(self, node: cst.Call) -> bool:
        return isinstance(self.get_metadata(ParentNodeProvider, node, None), cst.Expr)

    def _isinstance(self, original: cst.Call, updated: cst.Call):
        """isinstance(m, nn.Linear) -> isinstance(m, nnx.Linear)."""
        if len(original.args) != 2:
            return updated
        kinds = original.args[1].value
        elems = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
        out = []
        for e in elems:
            q = self.q(e)
            if q is None or not q.startswith("torch."):
                out.append(e)
                continue
            if q == "torch.Tensor":
                # an array rather than a list of them (densenet's _DenseLayer takes either);
                # jax.Array also matches the tracers of jit and grad
                self.need("jax")
                out.append(expr("jax.Array"))
                continue
            rule = self.rules.layers.get(q)
            target = rule.targets.get(self.emitter.name) if rule else None
            if not target or not re.fullmatch(r"nnx\.[A-Z]\w*", target):
                raise Untranslatable(f"isinstance check against {q}: no single JAX class",
                                     rule="isinstance")
            out.append(expr(target))
        new_kinds = out[0] if len(out) == 1 else cst.Tuple([cst.Element(e) for e in out])
        return updated.with_changes(args=[updated.args[0], updated.args[1].with_changes(
            value=new_kinds)])

    def _narrowed_layer(self, node: cst.CSTNode, name: str) -> list[str] | None:
        """The torch layer ``name`` is known to be at ``node`` (inside an
        ``if isinstance(name, nn.Linear):`` body)."""
        child, parent = node, self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None:
            elems = _isinstance_of(parent.test, name) if isinstance(parent, cst.If) else None
            if child is getattr(parent, "body", None) and elems is not None:
                names = {self.q(e) for e in elems}
                layers = sorted(n for n in names if n in self.rules.layers)
                if len(layers) != len(names) or not layers:
                    return None
                return layers
            child, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        return None

    def _model_apply(self, original_node: cst.Expr, updated_node: cst.Expr):
        """``net.apply(init_weights)`` on a model, outside its class: ``init_weights`` on every
        submodule (nnx.iter_modules: children before their parent, as torch's apply), with one
        nnx.Rngs from the function's key when the init function draws."""
        fn = updated_node.value.args[0].value.value
        model = updated_node.value.func.value.value
        if self.linen or self.emitter.name != "nnx":
            self.diag(original_node, "target", "error", f"{model}.apply(init function): "
                      f"translated for --target nnx so far")
            return updated_node
        if fn not in self.index.defined:
            self.diag(original_node, "init", "error", f"{model}.apply({fn}): {fn} is not a "
                      "function of this file, so its translation is not known")
            return updated_node
        self.need("nnx")
        takes_rngs = fn in self.index.rngs_functions
        loop = _apply_loop(model, fn, "init_rngs" if takes_rngs else None)
        if not takes_rngs:
            self._pending[-1].after.append(loop.with_changes(
                leading_lines=self._pending_line_comments()))
            return cst.RemoveFromParent()
        try:
            key = self._subkey(original_node)  # (its split goes before this line)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or "random", "error", exc.message)
            return updated_node
        self._pending[-1].after.append(loop)
        return cst.Assign(targets=[cst.AssignTarget(cst.Name("init_rngs"))],
                          value=expr("nnx.Rngs({k})", k=key))

    def _init_statement(self, original_node: cst.Expr, updated_node: cst.Expr, q: str):
        """torch.nn.init.normal_(module.weight, std=0.02) -> module.kernel.value = ..."""
        fn = q.rsplit(".", 1)[-1]
        new_call = updated_node.value
        params = {"normal_": ("tensor", "mean", "std"), "uniform_": ("tensor", "a", "b"),
                  "zeros_": ("tensor",), "ones_": ("tensor",), "constant_": ("tensor", "val"),
                  "trunc_normal_": ("tensor", "mean", "std", "a", "b")}
        fans = {"kaiming_normal_": ("tensor", "a", "mode", "nonlinearity"),
                "kaiming_uniform_": ("tensor", "a", "mode", "nonlinearity"),
                "xavier_normal_": ("tensor", "gain"), "xavier_uniform_": ("tensor", "gain")}
        if fn in fans:
            return self._fan_init(new_call, fn, fans[fn], q)
        if fn not in params:
            raise Untranslatable(f"{q}: structured initialisers are not translated; set the "
                                 "layer's kernel_init instead", rule=q)
        b = bind(new_call.args, params[fn])
        t = b.get("tensor")
        if b.star or t is None or not isinstance(t, (cst.Attribute, cst.Name)):
            raise Untranslatable(f"{q} of a computed tensor", rule=q)
        if isinstance(t, cst.Attribute) and (t.attr.value == "data" or (
                t.attr.value == "weight" and not m.matches(t.value, m.Name("self")))):
            # m.weight where m's layer type is not known (a test of m.__class__.__name__,
            # not isinstance): NNX names it kernel, scale or embedding by type
            raise Untranslatable(f"{q} of {code(t)}: the layer type is not known here (NNX "
                                 "names a weight kernel, scale or embedding by layer type); "
                                 "test it with isinstance(m, nn.Conv2d) and so on", rule=q)
        v = expr("{t}.value", t=t)
        shape = f"{code(v)}.shape, {code(v)}.dtype"
        g = lambda n, d: code(b.get(n)) if b.get(n) is not None else d
        if fn in ("normal_", "uniform_", "trunc_normal_") and not (
                self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        key = "rngs.params()"
        if fn == "normal_":
            value = f"{g('mean', '0.0')} + {g('std', '1.0')} * jax.random.normal({key}, {shape})"
        elif fn == "uniform_":
            value = f"jax.random.uniform({key}, {shape}, {g('a', '0.0')}, {g('b', '1.0')})"
        elif fn == "trunc_normal_":
            mean, std = g("mean", "0.0"), g("std", "1.0")
            lo, hi = g("a", "-2.0"), g("b", "2.0")
            value = (f"{mean} + {std} * jax.random.truncated_normal({key}, ({lo} - {mean}) / "
                     f"{std}, ({hi} - {mean}) / {std}, {shape})")
        elif fn == "zeros_":
            value = f"jnp.zeros_like({code(v)})"
        elif fn == "ones_":
            value = f"jnp.ones_like({code(v)})"
        else:
            value = f"jnp.full_like({code(v)}, {g('val', '0.0')})"
        self.need("jax", "jnp")
        return cst.Assign(targets=[cst.AssignTarget(v)], value=cst.parse_expression(value))

    def _plateau(self, original_node, updated_node, sched, schedule, base, before):
        """ReduceLROnPlateau: optax's transform keeps the scale in its state; the script steps
        it with the metric where torch did and sets the injected learning rate from it."""
        if sched.inline or sched.part or not sched.optimizer:
            raise Untranslatable("ReduceLROnPlateau stepped with every update or combined with "
                                 "another scheduler", rule=sched.qualname)
        self._schedules[sched.name] = schedule
        for severity, msg in schedule.notes:
            self.diag(original_node, sched.qualname, severity, msg)
        base_code = code(base)
        if not isinstance(base, cst.Name):
            base_code = f"{sched.name}_base_lr"
            before.append(cst.parse_statement(f"{base_code} = {code(base)}\n"))
        self._note_imports(schedule.plateau)
        after = [cst.parse_statement(f"{sched.name}_state = {sched.name}.init(None)\n")]
        if self._pending:
            self._pending[-1].before.extend(before)
            self._pending[-1].after.extend(after)
        self._plateaus[sched.name] = (schedule, base_code)
        return updated_node.with_changes(value=schedule.plateau)

    def _fan_init(self, new_call: cst.Call, fn: str, params: tuple[str, ...], q: str):
        """kaiming_* / xavier_*: jax.nn.initializers.variance_scaling, whose fans (in axis -2,
        out axis -1, the rest receptive field) are torch's for NNX Linear and Conv kernels."""
        import math

        b = bind(new_call.args, params)
        t = b.get("tensor")
        if not m.matches(t, m.Attribute(attr=m.Name("kernel"))):
            raise Untranslatable(f"{q} of {code(t) if t is not None else '?'}: only Linear and "
                                 "Conv kernels have torch's fans in JAX's layout", rule=q)
        if not (self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        if fn.startswith("kaiming"):
            mode = b.literal("mode", "fan_in")
            nl = b.literal("nonlinearity", "leaky_relu")
            a = b.literal("a", 0)
            gains = {"relu": 2.0, "linear": 1.0, "sigmoid": 1.0, "conv1d": 1.0, "conv2d": 1.0,
                     "conv3d": 1.0, "tanh": 25.0 / 9.0, "selu": 9.0 / 16.0}
            if nl == "leaky_relu" and isinstance(a, (int, float)):
                scale = 2.0 / (1 + a * a)
            elif nl in gains:
                scale = gains[nl]
            else:
                raise Untranslatable(f"{q} with nonlinearity={nl!r}, a={a!r}", rule=q)
            if mode not in ("fan_in", "fan_out"):
                raise Untranslatable(f"{q} with mode={mode!r}", rule=q)
        else:
            gain = b.literal("gain", 1.0)
            if not isinstance(gain, (int, float)):
                raise Untranslatable(f"{q} with a computed gain", rule=q)
            scale, mode = float(gain) ** 2, "fan_avg"
        dist = "normal" if fn.endswith("normal_") else "uniform"
        v = code(t) + ".value"
        scale_text = repr(round(scale, 12)) if not math.isclose(scale, 2.0) else "2.0"
        self.need("jax")
        return cst.Assign(targets=[cst.AssignTarget(expr(v))], value=expr(
            f'jax.nn.initializers.variance_scaling({scale_text}, "{mode}", "{dist}")('
            f"rngs.params(), {v}.shape, {v}.dtype)"))

    def _all_gather(self, original: cst.Expr, call: cst.Call, q: str):
        """all_gather(out, x) in a world of one process: ``out`` receives ``x`` alone."""
        b = bind(call.args, ("out", "value"))
        out, value = b.get("out"), b.get("value")
        if out is None or value is None or q.endswith("_into_tensor") and not isinstance(
                out, cst.Name):
            self.diag(original, q, "error", f"{q.rsplit('.', 1)[1]} with arguments that are "
                      "not (output, value)")
            return None
        self.diag(original, q, "info", f"{q.rsplit('.', 1)[1]}() over a world of one process: "
                  "the JAX script is one program, so the value is already the global one")
        if q.endswith("_into_tensor"):
            return cst.Assign([cst.AssignTarget(out)], value)
        return cst.Assign([cst.AssignTarget(expr("{o}[:]", o=out))],
                          cst.List([cst.Element(value)]))

    def _data_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """torch.distributed calls, sampler epochs and GradScaler calls used as statements."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        q = self.q(value.func) or ""
        if q in dt.DIST_DROPPED:
            self.diag(original_node, q, "info", f"{q.rsplit('.', 1)[1]}() removed: a "
                      "collective over a world of one process (the JAX script is one "
                      "program; XLA adds the collectives its sharded computations need)")
            return cst.RemoveFromParent()
        if q in dt.DEVICE_DROPPED:
            self.diag(original_node, q, "info", f"{q}() removed: JAX puts arrays on the "
                      "default device (jax.devices() lists the others)")
            return cst.RemoveFromParent()
        if q in dt.DIST_GATHERS:
            return self._all_gather(original_node, updated_node.value, q)
        if q == dt.DIST_INIT:
            self.need("os", "jax")
            self.diag(original_node, q, "info", "init_process_group -> "
                      "jax.distributed.initialize() on several hosts; one host needs nothing")
            self._pending[-1].after.append(dt.distributed_init())
            return cst.RemoveFromParent()
        func = value.func
        if not isinstance(func, cst.Attribute):
            return None
        meth = func.attr.value
        recv = func.value
        if isinstance(recv, cst.Name) and meth == "manual_seed" and self._consumed_generator(
                recv.value):
            return cst.RemoveFromParent()
        if isinstance(recv, cst.Name) and recv.value in self.data.samplers and (
                meth == "set_epoch"):
            return cst.RemoveFromParent()  # the loader's shuffle seed adds the epoch
        if isinstance(recv, cst.Name) and recv.value in self.data.scalers:
            if meth in ("update", "unscale_"):
                return cst.RemoveFromParent()
            if meth == "step" and value.args:
                return updated_node.with_changes(value=cst.Call(func=cst.Attribute(
                    value=updated_node.value.args[0].value, attr=cst.Name("step"))))
            return None
        # scaler.scale(loss).backward() -> loss.backward()
        if meth == "backward" and m.matches(recv, m.Call(func=m.Attribute(
                value=m.Name(), attr=m.Name("scale")))) and recv.func.value.value in (
                self.data.scalers) and recv.args:
            inner = updated_node.value.func.value.args[0].value
            return updated_node.with_changes(value=updated_node.value.with_changes(
                func=cst.Attribute(value=inner, attr=cst.Name("backward"))))
        return None

    def _torch_machinery_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """``torch.fx.wrap("f")`` (registers f as a leaf for torch.fx tracing): removed;
        ``torch._assert(cond, msg)`` (an assert that torch.fx can trace): ``assert cond, msg``
        (shapes are static under jax.jit, so the conditions torchvision writes stay checked)."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        q = self.q(value.func)
        if q == "torch.fx.wrap":
            self.diag(original_node, q, "info", "torch.fx.wrap(...) removed: a torch.fx tracing "
                      "hint")
            return cst.RemoveFromParent()
        if q == "torch._assert" and len(updated_node.value.args) in (1, 2):
            args = updated_node.value.args
            return cst.Assert(test=args[0].value, msg=args[1].value if len(args) == 2 else None)
        return None

    def _training_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """Seeding, gradient bookkeeping and scheduler steps used as statements."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        q = self.q(value.func)
        t = self.training
        checkpoint = self._checkpoint_statement(original_node)
        if checkpoint is not None:
            return checkpoint
        if (q or "").endswith("._log_api_usage_once") or m.matches(
                value.func, m.Name("_log_api_usage_once")):
            return cst.RemoveFromParent()  # torch's usage logging
        if q and q.startswith("torch.nn.init."):
            try:
                self._nnx_only("torch.nn.init")
                return self._init_statement(original_node, updated_node, q)
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or q, "error", exc.message)
                return updated_node
        if (m.matches(value, m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("apply")),
                                    args=[m.Arg(m.Attribute(value=m.Name("self")))]))
                and self.in_module_class()):
            # self.apply(self._init_weights): every submodule, children first, then self
            if self.linen and (self.current_class, code(value.args[0].value.attr)) in (
                    self._lt_init_fns):
                self.diag(original_node, "init", "info", "self.apply(init function) -> the "
                          "layers' kernel_init / bias_init / embedding_init arguments")
                return cst.RemoveFromParent()
            if self.emitter.name != "nnx":
                self.diag(original_node, "target", "error", "self.apply(init_fn): translated "
                          f"for --target nnx so far ({self.emitter.name} is planned)")
                return updated_node
            fn = code(updated_node.value.args[0].value)
            self.need("nnx")
            loop = _apply_loop("self", fn, "rngs" if self._rngs_scope and self._rngs_scope[-1]
                               else None)
            self._pending[-1].after.append(loop.with_changes(
                leading_lines=self._pending_line_comments()))
            return cst.RemoveFromParent()
        if (m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("apply")),
                                    args=[m.Arg(m.Name())]))
                and value.func.value.value in self.training.model_vars
                and not self.in_module_class()):
            return self._model_apply(original_node, updated_node)
        if q in SEEDS:
            if q == "torch.seed" or not updated_node.value.args:
                self.diag(original_node, q, "error", "torch.seed() draws a non-deterministic "
                          "seed: pass one to jax.random.key")
                return updated_node
            self._key_scopes[-1].has_key = True
            self.need("jax")
            return tr.seed_statement(updated_node.value.args[0].value)
        if q in GRAD_MODES:
            self.diag(original_node, q, "info", f"{q}() removed: JAX only differentiates what "
                      "runs inside jax.grad / nnx.value_and_grad")
            return cst.RemoveFromParent()
        if q in DROPPED_SEEDS:
            self.diag(original_node, q, "info", f"{q} removed: JAX's random streams are "
                      "explicit keys and deterministic on every backend")
            return cst.RemoveFromParent()
        if q in CLIPS:
            if any(site.clip is not None for site in t.optimizers.values()):
                return cst.RemoveFromParent()  # folded into the optimizer's chain
            if (self._while_stack and not self._for_stack and CLIPS[q] == "norm"
                    and self.emitter.name == "nnx"):
                # decided where the loop is left: clipped inside its train step, or marked
                self._while_clips[id(self._while_stack[-1])] = (original_node, q)
                return updated_node
            self.diag(original_node, q, "error", "gradient clipping outside a recognised "
                      "training step: chain optax.clip_by_global_norm before the optimizer")
            return updated_node
        if isinstance(value.func, cst.Name) and value.func.value in t.seed_functions:
            self._key_scopes[-1].has_key = True
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(tr.KEY))],
                              value=updated_node.value)
        if not (isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Name)):
            return None
        recv, meth = value.func.value.value, value.func.attr.value
        if meth == "zero_grad" and (recv in t.optimizer_names or any(
                recv == s.model for s in t.optimizers.values())):
            return cst.RemoveFromParent()  # JAX computes fresh gradients every step
        if meth == "backward" and not self._for_stack and not self._while_stack:
            self.diag(original_node, "training-loop", "error",
                      "backward() outside a loop that steps an optimizer: write the step "
                      "as nnx.value_and_grad + optimizer.update")
            return updated_node
        sched = t.scheduler_names.get(recv)
        if meth == "step" and sched is not None:
            return self._scheduler_step(original_node, updated_node, sched)
        return None

    def _scheduler_step(self, original_node, updated_node, sched):
        if sched.inline:
            return cst.RemoveFromParent()  # the schedule is a function of the update count
        plateau, base_code = self._plateaus.get(sched.name, (None, None))
        if plateau is not None:
            args = updated_node.value.args
            if len(args) != 1 or args[0].keyword is not None and args[0].keyword.value != \
                    "metrics":
                self.diag(original_node, sched.qualname, "error",
                          "ReduceLROnPlateau.step() without the metric")
                return updated_node
            metric = args[0].value
            value = expr("-{m}", m=metric) if plateau.negate_metric else metric
            self._pending[-1].before.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(expr(f"_, {sched.name}_state"))],
                value=expr(f"{sched.name}.update(None, {sched.name}_state, value={{v}})",
                           v=value))]))
            return cst.parse_statement(
                f"{self._lr_slot(sched.optimizer)} = jnp.float32({base_code} * "
                f"{sched.name}_state.scale)\n").body[0]
        if original_node.value.args or sched.optimizer is None:
            self.diag(original_node, sched.qualname, "error",
                      "scheduler.step() with an argument (a metric or an epoch)")
            return updated_node
        count = self._steps(sched.name)
        self._pending[-1].before.append(cst.parse_statement(f"{count} += 1\n"))
        # a strong float32: a weak-typed value would make the jitted step compile again
        self.need("jnp")
        return cst.parse_statement(
            f"{self._lr_slot(sched.optimizer)} = jnp.float32({sched.name}({count}))\n").body[0]

    def _steps(self, scheduler: str) -> str:
        """The count of a scheduler's step() calls: a local, or an attribute of the schedule
        function where a function it is passed to steps it."""
        if scheduler in self._passed_schedulers:
            return f"{scheduler}.steps"
        return f"{scheduler}_steps"

    def _inplace_rule(self, call: cst.Call) -> Rule | None:
        """``x.masked_fill_(m, v)`` as a statement on a name: the rule of ``masked_fill``
        (the statement becomes ``x = jnp.where(m, v, x)``, see :meth:`_inplace`); not for the
        methods whose in-place form keeps the receiver's dtype (``eq_``, ``ne_``)."""
        meth = call.func.attr.value
        if (not meth.endswith("_") or meth.startswith("_") or meth[:-1] in _INPLACE_DTYPE
                or meth in ("zero_", "fill_", *INPLACE_OPS)
                or not isinstance(call.func.value, cst.Name)
                or not isinstance(self.get_metadata(ParentNodeProvider, call, None), cst.Expr)):
            return None
        return self.rules.methods.get(meth[:-1])

    def _inplace(self, original_node, updated_node, meth: str):
        call_node = original_node.value
        recv = call_node.func.value
        new_value = updated_node.value  # the rewritten call, if a rule matched the base name
        if isinstance(recv, (cst.Subscript, cst.Attribute)) and meth in (
                "zero_", "fill_", *INPLACE_OPS):
            indexed = self._inplace_indexed(original_node, updated_node, meth)
            if indexed is not None:
                return indexed
        if not isinstance(recv, cst.Name):
            self.diag(original_node, "inplace", "error",
                      f"in-place {meth} on an expression: JAX arrays are immutable")
            return updated_node
        if meth in INPLACE_OPS and call_node.args:
            new_value = expr("{x} " + INPLACE_OPS[meth] + " {y}", x=recv,
                             y=updated_node.value.args[0].value if isinstance(
                                 updated_node.value, cst.Call) else call_node.args[0].value)
        elif meth == "zero_":
            new_value = expr("jnp.zeros_like({x})", x=recv)
        elif meth == "fill_" and call_node.args:
            new_value = expr("jnp.full_like({x}, {v})", x=recv, v=call_node.args[0].value)
        elif isinstance(new_value, cst.Call) and code(new_value.func).endswith(meth):
            self.diag(original_node, "inplace", "error", f"in-place method {meth}")
            return updated_node
        self._note_imports(new_value)
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(recv.value))], value=new_value)

    def _inplace_indexed(self, original_node, updated_node, meth: str):
        """``qkv_bias[n : 2 * n].zero_()`` -> ``qkv_bias = qkv_bias.at[n : 2 * n].set(0)``; on a
        layer's bias in a module (``self.qkv.bias[n : 2 * n].data.zero_()``) the parameter's
        value is rebound."""
        call_node = original_node.value
        recv = call_node.func.value
        if m.matches(recv, m.Attribute(attr=m.Name("data"))):
            recv = recv.value
        if not isinstance(recv, cst.Subscript) or not isinstance(updated_node.value, cst.Call) \
                or not isinstance(updated_node.value.func, cst.Attribute):
            return None
        base = recv.value
        if isinstance(base, cst.Name):
            target = cst.Name(base.value)
            current = target
        elif (m.matches(base, m.Attribute(value=m.Attribute(value=m.Name("self")),
                                          attr=m.Name("bias")))
              and self.in_module_class()):
            # the layer's bias keeps its name and layout in NNX
            target = expr("{b}.value", b=base)
            current = target
        else:
            return None
        args = updated_node.value.args
        if meth == "zero_":
            op, value = "set", py(0)
        elif meth == "fill_" and args:
            op, value = "set", args[0].value
        elif meth in INPLACE_OPS and args:
            op = {"add_": "add", "sub_": "subtract", "mul_": "multiply", "div_": "divide"}[meth]
            value = args[0].value
        else:
            return None
        index = cst.Subscript(value=expr("{c}.at", c=current), slice=recv.slice)
        return cst.Assign(targets=[cst.AssignTarget(target)],
                          value=call(expr("{i}." + op, i=index), arg(value)))

    def leave_With(self, original_node, updated_node):
        items = [(oi, ui) for oi, ui in zip(original_node.items, updated_node.items)]
        keep = []
        for oi, ui in items:
            item = oi.item
            fn = item.func if isinstance(item, cst.Call) else item
            q = self.q(fn) or ""
            if q.startswith(("torch.no_grad", "torch.inference_mode", "torch.enable_grad",
                             "torch.autograd.set_grad_enabled")):
                continue
            if q in dt.AUTOCASTS and isinstance(item, cst.Call) and len(items) == 1:
                if self.linen:
                    return self._lt_autocast_region(original_node, updated_node, item, q)
                return self._autocast(original_node, updated_node, item, q)
            keep.append(ui)
        if len(keep) == len(items):
            return updated_node
        if not keep:
            # outside of a differentiated function a no_grad block is plain code; the model
            # calls in it (evaluation) go through one jit-compiled eval step
            body = list(updated_node.body.body)
            if not self.in_module_class() and self.linen and not self.training.optimizers:
                # no model is trained in this file, so no `variables` are bound here: the
                # model calls stay as written, marked
                body = self._lt_unapplied(original_node.body.body, body)
            elif not self.in_module_class() and self.linen:
                jitted = tr.JitModelCalls(self._model_names(), extra=(lt.VARIABLES,))
                body = [b.visit(jitted) for b in body]
                if jitted.count:
                    self._eval_step = True
                    self.need("jax", "partial")
            if not self.in_module_class() and self.emitter.name == "nnx":
                models = self._model_names()
                jitted = tr.JitModelCalls(models)
                body = [b.visit(jitted) for b in body]
                if jitted.count:
                    self._eval_step = True
                    self.need("nnx")
            if body and updated_node.leading_lines:
                body[0] = body[0].with_changes(
                    leading_lines=[*updated_node.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel(body)
        return updated_node.with_changes(items=_fix_commas(keep))

    LT_UNAPPLIED = ("the linen model called outside a train step, in a file that binds none of "
                    "its variables (it is trained elsewhere): left as written; pass its "
                    "variables in and call model.apply(variables, ...)")

    def _lt_unapplied(self, original: list, body: list) -> list:
        """linen: model calls in an evaluation block of a file that trains no model are marked
        at their lines (``eval_step(model, variables, ...)`` would read unbound variables)."""
        models = self._model_names()
        pattern = m.Call(func=m.Name(value=m.MatchIfTrue(lambda v: v in models)))
        found = [c for s in original for c in findall(s, pattern)]
        if not found:
            return body
        for c in found:
            self.report(*self.pos(c), "linen", "error", self.LT_UNAPPLIED)
        comment = cst.EmptyLine(comment=cst.Comment(
            f"# TODO(torch2jax): {self.LT_UNAPPLIED} [linen]"))

        class Mark(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original_node, updated_node):
                if not findall(updated_node, pattern):
                    return updated_node
                return updated_node.with_changes(
                    leading_lines=[*updated_node.leading_lines, comment])
        return [s.visit(Mark()) for s in body]

    def _autocast(self, original_node, updated_node, item: cst.Call, q: str):
        """with torch.autocast(...): the model computes in bfloat16 for these statements."""
        try:
            dtype, notes = dt.autocast_dtype(item, q)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or q, "error", exc.message)
            return updated_node
        for note in notes:
            self.diag(original_node, q, "warning", note)
        body = list(updated_node.body.body)
        if not dtype:  # enabled=False
            return cst.FlattenSentinel(body)
        models = self._model_names()
        called: list[str] = []
        new_body = []
        for stmt in body:
            if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Assign)
                    and dt.is_model_call(stmt.body[0].value, models)):
                a = stmt.body[0]
                called.append(a.value.func.value)
                # torch runs the loss (and softmax, norms, reductions) of a low-precision
                # output in float32
                stmt = stmt.with_changes(body=[a.with_changes(value=dt.cast_output(a.value))])
            new_body.append(stmt)
        if not called:
            self.diag(original_node, q, "error", "autocast region without a model call "
                      "assigned to a name: no dtype policy emitted")
            return updated_node
        self.need("jnp")
        self.diag(original_node, q, "info", f"autocast -> {', '.join(sorted(set(called)))} "
                  f"computes in {dtype.removeprefix('jnp.')} (flax layers' dtype) with "
                  "float32 parameters; outputs cast to float32")
        before = [dt.set_dtype(name, dtype) for name in dict.fromkeys(called)]
        after = [dt.set_dtype(name, "None") for name in dict.fromkeys(called)]
        if updated_node.leading_lines:
            before[0] = before[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel([*before, *new_body, *after])

    def _accumulation_statement(self, original_node: cst.Expr):
        """The statements after a micro-step loop (analysis/accumulate.py): the optimizer's
        step applies the summed gradients, clipping clips them, zero_grad goes."""
        site = self._acc.steps.get(id(original_node))
        if site is not None:
            if id(site.loop) not in self._acc.done:
                return None
            return cst.parse_statement(
                f"{site.optimizer}.update({site.model}, {ACC_GRADS})\n").body[0]
        site = self._acc.clips.get(id(original_node))
        if site is not None:
            if id(site.loop) not in self._acc.done:
                return None
            local = self.training.optimizer_names.get(site.optimizer)
            if local is not None and local.clip is not None:
                return cst.RemoveFromParent()  # already in the optimizer's chain
            self.need("optax")
            return cst.parse_statement(
                f"{ACC_GRADS}, _ = optax.clip_by_global_norm({code(site.max_norm)}).update("
                f"{ACC_GRADS}, optax.EmptyState())\n").body[0]
        if id(original_node) in self._acc.dropped:
            return cst.RemoveFromParent()
        return None

    def _lr_loop(self, original_node, node):
        """``for g in optimizer.param_groups: g['lr'] = lr`` -> the optimizer's injected
        learning rate (an optax.inject_hyperparams hyperparameter in its state)."""
        if id(original_node) not in self._lr_loops:
            return None
        opt, _ = self._lr_loops[id(original_node)]
        value = node.body.body[0].body[0].value
        site = self.training.optimizer_names.get(opt)
        if site is not None and not site.external:
            if id(site) in self.failed_sites or site.scheduler is not None:
                return None
            where = "built with optax.inject_hyperparams"
        elif site is not None or opt in self._acc.foreign:
            source = self._acc.foreign.get(opt) or f"{site.model}.configure_optimizers"
            where = (f"returned by {source}, built with "
                     "optax.inject_hyperparams where torch2jax converts an optimizer that a "
                     "function returns to another file")
        else:
            return None
        self.diag(original_node, "param_groups", "info",
                  f"param_groups learning rate -> {opt}'s injected learning_rate (the optimizer "
                  f"is {where})")
        return cst.parse_statement(f"{tr.lr_slot(opt)} = {code(value)}\n").with_changes(
            leading_lines=node.leading_lines)

    def _micro_step_loop(self, original_node, node):
        """``for micro_step in range(k): ... loss.backward()`` then ``optimizer.step()``: a
        jit-compiled gradient step per micro-step, the gradients summed in the loop."""
        site = self._acc.loops.get(id(original_node))
        if site is None or self._fn_stack or self._class_stack:
            return None
        body = list(node.body.body)
        loop_names = tr.loop_assigned_names(original_node)
        step = tr.build_train_step(body, optimizer=site.optimizer, model=site.model,
                                   loop_names=loop_names, step_name="grad_step",
                                   tree_mode=not self.data.aliasing, grads_out=ACC_MICRO)
        if step is None:
            return None
        i = next(i for i, b in enumerate(step.body) if b is step.call)
        add = cst.parse_statement(
            f"{ACC_GRADS} = {ACC_MICRO} if {ACC_GRADS} is None else jax.tree.map(jnp.add, "
            f"{ACC_GRADS}, {ACC_MICRO})\n")
        new_body = [*step.body[:i + 1], add, *step.body[i + 1:]]
        self.need("nnx", "jax", "jnp")
        self._top_steps.append(step.function)
        self._acc.done.add(id(original_node))
        self.diag(original_node, "accumulation", "info",
                  f"gradient accumulation: grad_step computes each micro-step's gradients "
                  f"(jit-compiled), summed in the loop as torch sums .grad; "
                  f"{site.optimizer}.update applies the sum once after the loop")
        init = cst.parse_statement(f"{ACC_GRADS} = None\n").with_changes(
            leading_lines=node.leading_lines)
        return cst.FlattenSentinel([init, node.with_changes(
            leading_lines=[], body=node.body.with_changes(body=new_body))])

    def _leave_for(self, original_node, updated_node):
        self._for_stack.pop()
        node = updated_node
        micro = self._micro_step_loop(original_node, node) if self._acc.loops else None
        if micro is not None:
            return micro
        lr_loop = self._lr_loop(original_node, node) if self._lr_loops else None
        if lr_loop is not None:
            return lr_loop
        t = self.training
        body = list(node.body.body)
        surround: tuple[list, list] | None = None  # a functional step: split / update
        linen_body = self._lt_loop(original_node, node, body) if self.linen else None
        if linen_body is not None:
            node = node.with_changes(body=node.body.with_changes(body=linen_body))
        gan_body = self._gan_loop(original_node, body) if self.emitter.name == "nnx" else None
        if gan_body is not None:
            node = node.with_changes(body=node.body.with_changes(body=gan_body))
        for name in t.optimizer_names if self.emitter.name == "nnx" and gan_body is None else ():
            model = t.model_of(name)
            if model is None:
                continue
            outer = self._for_stack[0] if self._for_stack else original_node
            loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
            site = t.optimizer_names[name]
            kwargs = {"optimizer": name, "model": model, "loop_names": loop_names,
                      "step_name": "train_step", "accumulate": site.accumulate is not None}
            step = tr.build_train_step(body, functional=True, **kwargs) if (
                self.data.functional_ok(model, self.index.module_classes,
                                        self._scalar_param)) else None
            around = tr.functional_loop(step, model, name) if step is not None else None
            if around is None:  # the loop reads the model between steps: the nnx.jit step
                step = tr.build_train_step(body, tree_mode=not self.data.aliasing, **kwargs)
            else:
                self.need("jax", "partial")
            module_hoist = step is not None and self.hoist_steps and self._per_call_trainer(
                name) and not _free_names(step.function) - (self._module_names | STEP_GLOBALS)
            if around is not None and not module_hoist and not self._for_stack and (
                    not self._while_stack):
                # the outermost loop of its scope: the split runs once, just before it, and
                # the step defined after the split closes over the graphdef (a static argument
                # would be hashed by jax.jit on every call)
                closed = tr.build_train_step(body, functional=True, closure=True, **kwargs)
                closed_around = (tr.functional_loop(closed, model, name)
                                 if closed is not None else None)
                if closed_around is not None:
                    step, around = closed, closed_around
            if step is not None:
                self.need("nnx")
                new_body = around[1] if around is not None else step.body
                batch = dt.loop_names(original_node.target)
                if self.data.distributed and batch and isinstance(original_node.iter, (
                        cst.Name, cst.Call)):
                    # the batch is split over the devices; the replicated parameters follow
                    self.need("jax", "sharding")
                    self._hoist.extend(dt.mesh_statements())
                    if self.data.shard == "params":
                        self._hoist.extend(dt.shard_state(model, name))
                    elif around is not None:
                        self._hoist.extend(dt.replicate_state(model, name))
                    new_body = [dt.shard_batch(batch), *new_body]
                if module_hoist:
                    # train(model, loader, optimizer) runs once per epoch: a step defined in it
                    # would be a new function, compiled again, at every call
                    self._module_hoist.append((self._fn_stack[0].name.value, step.function))
                elif not step.closure:
                    self._hoist.append(step.function)
                node = node.with_changes(body=node.body.with_changes(body=new_body))
                if around is not None:
                    surround = (around[0], around[2])
                if step.closure:  # defined after the split it closes over
                    blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
                    surround = ([*around[0], step.function.with_changes(leading_lines=blank)],
                                around[2])
                break
        else:
            if linen_body is None and gan_body is None and any(
                    tr._is_method_stmt(s, None, "backward")
                                          for s in body) and not self._lt_marked:
                self.diag(original_node, "training-loop", "error",
                          "training loop not recognised (one loss.backward() and one "
                          "optimizer.step() in the same loop body): write the step as "
                          "nnx.value_and_grad + optimizer.update" if self.emitter.name == "nnx"
                          else "training loop not recognised (one loss.backward() and one "
                          "optimizer.step() in the same loop body): write the step as "
                          "jax.value_and_grad + state.apply_gradients" if self.linen
                          else f"training loops: translated for --target nnx so far "
                          f"({self.emitter.name} is planned)")
        self._lt_marked = False
        pre, post = surround if surround is not None else ([], [])
        if self.linen and not self._for_stack and self._lt_post:
            post, self._lt_post = [*post, *self._lt_post], []
        if not self._for_stack and self._hoist:
            hoisted, self._hoist = self._hoist, []
            blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
            lines = list(node.leading_lines)
            while lines and lines[0].comment is None:
                lines.pop(0)
            hoisted = [h.with_changes(leading_lines=blank) if i == 0 or isinstance(
                h, cst.BaseCompoundStatement) or isinstance(hoisted[i - 1],
                                                            cst.BaseCompoundStatement)
                else h for i, h in enumerate(hoisted)]
            if pre:
                pre = [pre[0].with_changes(leading_lines=[*blank, *lines]), *pre[1:]]
                node = node.with_changes(leading_lines=_after(pre, blank))
            else:
                node = node.with_changes(leading_lines=[*blank, *lines])
            return cst.FlattenSentinel([*hoisted, *pre, node, *post])
        if pre:
            blank = [cst.EmptyLine(indent=False)] * (1 if self._fn_stack else 2)
            pre = [pre[0].with_changes(leading_lines=node.leading_lines), *pre[1:]]
            return cst.FlattenSentinel([*pre, node.with_changes(
                leading_lines=_after(pre, blank)), *post])
        return node

    def _scalar_param(self, param: cst.Param) -> bool:
        """A constructor parameter known to receive a number, string or bool: hashable, so
        a module keeping it as an attribute can still be a static argument of jax.jit."""
        return self.values is not None and self.values.param_kind(param) == vk.Kind.SCALAR

    def _gan_loop(self, original_node, body) -> list | None:
        """A GAN iteration (passes/gan_step.py): the loop's new body, the step hoisted."""
        t = self.training
        orig = list(original_node.body.body)
        stepped = [n for n in t.optimizer_names if t.model_of(n) is not None and any(
            tr._is_method_stmt(s, {n}, "step") for s in orig)]
        if len(stepped) != 2 or self.data.aliasing:
            return None
        first = min(stepped, key=lambda n: next(i for i, s in enumerate(orig)
                                                if tr._is_method_stmt(s, {n}, "step")))
        d_opt = first
        g_opt = stepped[1] if stepped[0] == first else stepped[0]
        d_model, g_model = t.model_of(d_opt), t.model_of(g_opt)
        if d_model == g_model or not gan.check_gan_source(
                orig, d_opt=d_opt, d_model=d_model, g_opt=g_opt, g_model=g_model):
            return None
        outer = self._for_stack[0] if self._for_stack else original_node
        loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
        step = gan.build_gan_step(body, d_opt=d_opt, d_model=d_model, g_opt=g_opt,
                                  g_model=g_model, loop_names=loop_names,
                                  used_outside=gan.names_outside(outer, original_node),
                                  step_name="train_step", tree_mode=True)
        if step is None:
            return None
        self.need("nnx")
        self._hoist.append(step.function)
        self.diag(original_node, "training-loop", "info",
                  f"GAN step: {d_opt} (on {d_model}) then {g_opt} (on {g_model}) in one "
                  f"jit-compiled step; {g_model}'s forward runs once, under nnx.vjp")
        return step.body

    # ------------------------------------------------------------------ linen training
    def _lt_loop(self, original_node, updated_node, body):
        """A training loop under --target linen (targets/linen_training.py): the loop's new
        body; the step, model.init and the TrainState go before the outermost loop."""
        t = self.training
        ep = self._lt_epoch.get(self._fn_stack[0].name.value) if len(
            self._fn_stack) == 1 and not self._class_stack else None
        pairs = [(ep.optimizer, ep.model)] if ep is not None else [
            (n, t.model_of(n)) for n in t.optimizer_names]
        for name, model in pairs:
            if model is None:
                continue
            outer = self._for_stack[0] if self._for_stack else original_node
            loop_names = tr.loop_assigned_names(outer) | tr.loop_assigned_names(original_node)
            site = t.optimizer_names.get(name)
            try:
                step = lt.build_step(body, optimizer=name, model=model, loop_names=loop_names,
                                     step_name="train_step", batch_stats=self._lt_batch_stats,
                                     dropout=self._lt_dropout, accumulate=site is not None
                                     and site.accumulate is not None)
                if ep is not None and step is not None:
                    if self._lt_dropout and not self._key_scopes[-1].has_key:
                        raise Untranslatable(
                            f"no key in {ep.name} for the dropout keys: {ep.name} runs once "
                            "per epoch with the TrainState its caller makes; pass it a key",
                            rule="training-loop")
                    return self._lt_epoch_loop(ep, step, body, original_node, updated_node,
                                               loop_names)
                if step is not None and not self._key_scopes[-1].has_key and len(
                        self._key_scopes) == 1:
                    # torch's global RNG was never seeded: a root key, as for random draws
                    self._key_scopes[0].root_needed = self._key_scopes[0].has_key = True
                    self.need("jax")
                    self.diag(original_node, "random", "warning",
                              "model.init without torch.manual_seed: a root key "
                              "jax.random.key(0) is added at the top of the file")
                if step is not None and not self._key_scopes[-1].has_key:
                    raise Untranslatable("no key in this scope for model.init and the dropout "
                                         "keys: seed with torch.manual_seed or pass one",
                                         rule="training-loop")
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or "training-loop", "error", exc.message)
                self._lt_marked = True
                return None
            if step is None:
                continue
            sample = lt.sample_inputs(step, body, updated_node, self._for_stack, loop_names)
            if sample is None:
                self.diag(original_node, "training-loop", "error",
                          "no sample input for model.init: the model's inputs are not a "
                          "batch gathered from an array, a loader's batch or a helper's "
                          "result")
            stmts, inputs = sample if sample is not None else ([], None)
            init = self._lt_init(model, name, inputs)
            depth = 4 * (self._depth - len(self._for_stack))  # the outermost loop's
            init = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                    else st for st in init]
            new_body = step.body
            batch = dt.loop_names(original_node.target)
            if self.data.distributed and batch and isinstance(original_node.iter, (
                    cst.Name, cst.Call)):
                # the batch is split over the devices; the replicated parameters follow
                self.need("jax", "sharding")
                self._hoist.extend(dt.mesh_statements())
                new_body = [dt.shard_batch(batch), *new_body]
                # the TrainState replicated before the first call, as the step returns it
                # (left on one device, the first call compiled the step a second time)
                init = [*init, *cst.parse_module(
                    f"{lt.STATE} = jax.device_put({lt.STATE}, NamedSharding(mesh, P()))"
                    "  # replicated, as the step returns it\n").body]
            self._hoist.extend([step.function, *stmts, *init, *self._lt_after_state])
            self._lt_after_state = []
            self._lt_post.append(lt.final_variables(self._lt_batch_stats))
            return new_body
        return None

    def _lt_epoch_loop(self, ep, step, body, original_node, updated_node, loop_names):
        """The training loop of a function called once per epoch: its step, and what its
        caller's model.init sample is made from; the caller makes the TrainState."""
        ep.step, ep.body, ep.loop = step, body, updated_node
        ep.outer, ep.loop_names = list(self._for_stack), loop_names
        self.need("jax", "optax", "train_state")
        fn = self._fn_stack[0]
        taken = self._file_functions | {e.module_step.name.value for e in self._lt_epoch.values()
                                        if e.module_step is not None}
        if step.function.name.value not in taken and not (
                lt.free_names(step.function) & lt.local_names(fn)):
            # it reads nothing of the function: defined once, before it (one compilation)
            ep.module_step = step.function
        else:
            self._hoist.append(step.function)
        self.diag(original_node, "training-loop", "info",
                  f"{ep.name} runs once per epoch: its caller makes the variables and the "
                  f"TrainState once; {ep.name} takes the state"
                  f"{'' if ep.drop_model else ' (after the model)'} in place of the "
                  "optimizer and returns it first")
        return step.body

    def _lt_epoch_call(self, original: cst.Call, updated: cst.Call,
                       target: cst.BaseExpression | None) -> cst.Assign:
        """``loss, acc = train(model, loader, optimizer, scheduler)`` ->
        ``state, (loss, acc) = train(loader, state, scheduler)``; the caller's first such call
        makes the variables and the TrainState before its outermost loop; the variables are
        read from the state after every call."""
        ep = self._lt_epoch[original.func.value]
        scope = id(self._fn_stack[-1]) if self._fn_stack else 0
        if scope not in self._lt_state_made:
            self._lt_state_made.add(scope)
            stmts = self._lt_epoch_state(ep, original, updated)
            depth = 4 * (self._depth - len(self._for_stack))
            stmts = [wrap_long_statement(st, depth) if isinstance(st, cst.SimpleStatementLine)
                     else st for st in stmts]
            if self._for_stack:
                self._hoist.extend(stmts)
            else:
                self._pending[-1].before.extend(stmts)
        self._pending[-1].after.append(lt.final_variables(self._lt_batch_stats))
        return cst.Assign(targets=[cst.AssignTarget(lt.with_state_target(target))],
                          value=updated.with_changes(args=ep.call_args(updated)))

    def _lt_epoch_state(self, ep, original: cst.Call, updated: cst.Call):
        """model.init on a sample of the loader the call passes, and the TrainState."""
        b = ep.bound(original)
        model, optimizer = b[ep.model].value, b[ep.optimizer].value
        if not self._key_scopes[-1].has_key and len(self._key_scopes) == 1:
            self._key_scopes[0].root_needed = self._key_scopes[0].has_key = True
            self.diag(original, "random", "warning", "model.init without torch.manual_seed: "
                      "a root key jax.random.key(0) is added at the top of the file")
        elif not self._key_scopes[-1].has_key:
            self.diag(original, "training-loop", "error", "no key in this scope for "
                      "model.init: seed with torch.manual_seed or pass one")
        sample = None
        if ep.step is not None and ep.loop is not None:
            values = ep.bound(updated) or {}
            loop = ep.loop.with_changes(iter=lt.bind_names(ep.loop.iter, values))
            outer = [*self._for_stack, *(ep.outer or [])]
            names = set(ep.loop_names or ()) | (tr.loop_assigned_names(self._for_stack[0])
                                                if self._for_stack else set())
            step = replace(ep.step, model_args=[
                lt.bind_names(a, values) for a in ep.step.model_args])
            sample = lt.sample_inputs(step, ep.body, loop, outer, names)
            if sample is not None:
                stmts, inputs = sample
                inner = lt.local_names(ep.fn) - set(ep.params) if ep.fn is not None else set()
                used = {n.value for x in [*stmts, *inputs] for n in findall(x, m.Name())}
                used -= {n for st in stmts for n in tr.names_of(st).assigned}
                sample = (stmts, inputs) if not used & inner else None
        if sample is None:
            self.diag(original, "training-loop", "error",
                      f"no sample input for model.init: {ep.name} is defined after its caller"
                      if ep.step is None else f"no sample input for model.init: the inputs "
                      f"of {ep.name}'s model are not a batch of a loader or an array it "
                      "receives")
        stmts, inputs = sample if sample is not None else ([], None)
        init = self._lt_init(model, optimizer, inputs)
        after, self._lt_after_state = self._lt_after_state, []
        return [*stmts, *init, *after]

    def _lt_init(self, model: str, optimizer: str, inputs) -> list[cst.BaseStatement]:
        """``model.init`` and the TrainState over ``optimizer`` (targets/linen_training.py)."""
        self.need("jax", "optax", "train_state")
        if self._lt_batch_stats:
            self._lt_train_state_class = True
            self.need("Any")
        return lt.init_statements(model, optimizer, inputs, uses_train=self.uses_train,
                                  batch_stats=self._lt_batch_stats,
                                  dtype=self._lt_autocast.get(model))

    def _lt_autocast_region(self, original_node, updated_node, item: cst.Call, q: str):
        """with torch.autocast(...) in a training loop: the training step applies a clone of
        the model with ``dtype=jnp.bfloat16`` (its layers compute in bfloat16, the parameters
        stay float32); the outputs are cast to float32 as torch does for the loss."""
        try:
            dtype, notes = dt.autocast_dtype(item, q)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or q, "error", exc.message)
            return updated_node
        body = list(updated_node.body.body)
        if not dtype:
            return cst.FlattenSentinel(body)
        models = self._model_names()
        called: list[str] = []
        new_body = []
        for stmt in body:
            if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                    and isinstance(stmt.body[0], cst.Assign)
                    and dt.is_model_call(stmt.body[0].value, models)):
                a = stmt.body[0]
                called.append(a.value.func.value)
                stmt = stmt.with_changes(body=[a.with_changes(value=dt.cast_output(a.value))])
            new_body.append(stmt)
        if not called or not self._for_stack or not self._lt_dtype_classes:
            self.diag(original_node, q, "error", "autocast region outside a training loop, or "
                      "without a model call assigned to a name: give the model a dtype by "
                      "hand (model.clone(dtype=jnp.bfloat16))")
            return updated_node
        for note in notes:
            self.diag(original_node, q, "warning", note)
        for name in called:
            self._lt_autocast[name] = dtype
        self.need("jnp")
        self.diag(original_node, q, "info", f"autocast -> the training step applies "
                  f"{', '.join(sorted(set(called)))}.clone(dtype={dtype}) (flax layers' "
                  "dtype) with float32 parameters; outputs cast to float32")
        if updated_node.leading_lines and new_body:
            new_body[0] = new_body[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(new_body)

    def _lt_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        f = value.func
        if (isinstance(f, cst.Attribute) and f.attr.value in ("train", "eval")
                and isinstance(f.value, cst.Name) and f.value.value in self._model_names()
                and not value.args):
            # a linen module has no mode: model.apply reads its `train` field
            line = self.get_metadata(ParentNodeProvider, original_node, None)
            if isinstance(line, cst.SimpleStatementLine) and line.leading_lines and all(
                    ln.comment is None for ln in line.leading_lines):
                self._lt_blank = self._depth  # the next statement keeps the blank line
            return cst.RemoveFromParent()
        if isinstance(f, cst.Name) and f.value in self._lt_epoch:
            return self._lt_epoch_call(value, updated_node.value, None)
        if isinstance(f, cst.Name) and f.value in self._lt_trainers:
            # the helper trains the model it receives: it returns the model's variables
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(lt.VARIABLES))],
                              value=updated_node.value)
        return None

    def _lt_function(self, node: cst.FunctionDef) -> cst.FunctionDef:
        name = node.name.value
        if name in self._lt_evaluators:
            i = self._lt_evaluators[name]
            # its model calls (a @torch.no_grad() evaluation) apply the variables under jit
            jitted = tr.JitModelCalls({node.params.params[i].name.value}, extra=(lt.VARIABLES,))
            node = node.with_changes(body=node.body.visit(jitted))
            if jitted.count:
                self._eval_step = True
                self.need("jax", "partial")
            node = lt.add_variables_param(node, i)
        if name in self._lt_epoch:
            node = lt.takes_state(node, self._lt_epoch[name])
        if name in self._lt_trainers and not lt.returns(node):
            body = [*node.body.body, cst.parse_statement(f"return {lt.VARIABLES}\n")]
            node = node.with_changes(body=node.body.with_changes(body=body))
        return node

    def _lt_pass_variables(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        i = self._lt_evaluators[original.func.value]
        args = list(updated.args)
        if len(args) <= i or any(a.keyword or a.star for a in args[:i + 1]):
            return updated
        args.insert(i + 1, arg(cst.Name(lt.VARIABLES)))
        return updated.with_changes(args=_fix_commas(args))

    def visit_While(self, node: cst.While) -> None:
        self._while_stack.append(node)

    def leave_While(self, original_node, updated_node):
        """``while True:`` around a train step (a minGPT-style Trainer.run: next(data_iter),
        forward, backward, clip, step, callbacks, break after max_iters): the step becomes a
        jitted function defined just before the loop."""
        self._while_stack.pop()
        clip = self._while_clips.pop(id(original_node), None)
        t = self.training
        body = list(updated_node.body.body)
        if self.emitter.name != "nnx" or self._for_stack:
            if not self._for_stack and any("backward()" in code(s) for s in body):
                self.diag(original_node, "training-loop", "error",
                          f"a train step in a while loop: translated for --target nnx only "
                          f"so far ({self.emitter.name} is planned)")
            return self._unclipped(updated_node, clip)
        clip_stmt = next((s for s in body if clip is not None and "clip_grad_norm_(" in code(s)),
                         None)
        for name in t.optimizer_names:
            model = t.model_of(name)
            if model is None or not any(tr._is_method_stmt(s, {name}, "step") for s in body):
                continue
            step = tr.build_train_step(body, optimizer=name, model=model,
                                       loop_names=tr.loop_assigned_names(original_node),
                                       step_name="train_step", clip=clip_stmt,
                                       tree_mode=not self.data.aliasing)
            if step is None:
                break
            self.need("nnx")
            if clip_stmt is not None:
                self.need("optax")
            blank = [cst.EmptyLine(indent=False)]
            fn = step.function.with_changes(leading_lines=blank)
            loop = updated_node.with_changes(body=updated_node.body.with_changes(body=step.body),
                                             leading_lines=blank)
            return cst.FlattenSentinel([fn, loop])
        if any(tr._is_method_stmt(s, None, "backward") for s in body) or any(
                "backward()" in code(s) for s in body):
            self.diag(original_node, "training-loop", "error",
                      "training loop not recognised (one loss.backward() and one "
                      "optimizer.step() in the same loop body): write the step as "
                      "nnx.value_and_grad + optimizer.update")
        return self._unclipped(updated_node, clip)

    def _unclipped(self, node, clip):
        if clip is not None:
            self.diag(clip[0], clip[1], "error", "gradient clipping outside a recognised "
                      "training step: chain optax.clip_by_global_norm before the optimizer")
        return node

    def visit_For(self, node: cst.For) -> None:
        self._for_stack.append(node)
        self._bind_loop_layout(node.target, node.iter)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_loop_layout(node.target, node.iter)  # [blk(x) for blk in self.blocks]

    def _bind_loop_layout(self, target: cst.BaseExpression, it: cst.BaseExpression) -> None:
        """A loop over a container of layers: calls of its loop variable take the layout of
        the container's elements."""
        info = self.index.classes.get(self.current_class or "")
        if info is None or not self._loop_layouts:
            return
        layout = None
        if m.matches(it, m.Attribute(value=m.Name("self"))):
            # for layer in self.layers
            layout = info.elem_layout.get(it.attr.value)
        elif m.matches(it, m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self")),
                                                   attr=m.Name("items") | m.Name("values")),
                                  args=[])):
            # for name, layer in self.heads.items() / for layer in self.heads.values()
            layout = info.elem_layout.get(it.func.value.attr.value)
        elif info.self_elem_layout and (m.matches(it, m.Name("self")) or (
                info.container == "module_dict" and m.matches(it, m.Call(func=m.Attribute(
                    value=m.Name("self"), attr=m.Name("items") | m.Name("values")), args=[])))):
            # a ModuleList / ModuleDict subclass running its layers: for layer in self,
            # for name, layer in self.items(), for layer in self.values()
            layout = info.self_elem_layout
        if m.matches(it, m.Call(func=m.Attribute(attr=m.Name("items")))):
            target = (target.elements[1].value if m.matches(target, m.Tuple(
                elements=[m.Element(), m.Element()])) else None)
        if layout and isinstance(target, cst.Name):
            self._loop_layouts[-1][target.value] = layout

    def _group_lr(self, node: cst.Subscript) -> cst.BaseExpression | None:
        """``optimizer.param_groups[0]["lr"]`` read: the learning rate the next update uses."""
        if not (m.matches(node, m.Subscript(value=m.Subscript(value=m.Attribute(
                value=m.Name(), attr=m.Name("param_groups"))))) and len(node.slice) == 1
                and try_literal(getattr(node.slice[0].slice, "value", None), ...) == "lr"):
            return None
        name = node.value.value.value.value
        site = self.training.optimizer_names.get(name)
        if site is None:
            return None
        sched = site.scheduler
        if sched is not None and sched.inline:
            step = f"{lt.STATE}.step" if self.linen else f"{name}.step.value"
            return expr(f"{sched.name}({step})")
        if sched is not None:
            quote = self._string_quote()
            return expr(self._lr_slot(name, quote))
        lr = self._opt_lr.get(name)
        return lr

    def leave_Subscript(self, original_node, updated_node):
        if (self._in_annotation and self.q(original_node.value) in _FINAL
                and len(updated_node.slice) == 1
                and isinstance(updated_node.slice[0].slice, cst.Index)):
            # dynamic_img_pad: torch.jit.Final[bool] (a TorchScript constant): the type itself
            return updated_node.slice[0].slice.value
        lr = self._group_lr(original_node)
        if lr is not None:
            return lr
        # [x][0], left by a rewrite that returns a one-element list (get_last_lr()[0])
        if (isinstance(updated_node.value, cst.List) and len(updated_node.value.elements) == 1
                and not isinstance(original_node.value, cst.List)
                and len(updated_node.slice) == 1
                and m.matches(updated_node.slice[0].slice, m.Index(value=m.Integer("0")))):
            return updated_node.value.elements[0].value
        return updated_node

    # ------------------------------------------------------------------ annotations
    def visit_Annotation(self, node) -> None:
        self._in_annotation += 1

    def leave_Annotation(self, original_node, updated_node):
        self._in_annotation -= 1
        return updated_node

    def _annotation_type(self, original: cst.BaseExpression) -> cst.BaseExpression | None:
        """A torch type named in an annotation (``Tensor``, ``nn.Conv2d``), in JAX terms."""
        q = self.q(original)
        if not q or not q.startswith("torch.") or q in _FINAL:
            return None
        if q in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.BoolTensor",
                 "torch.nn.parameter.Parameter", "torch.nn.Parameter"):
            self.need("jax")
            return expr("jax.Array")
        if q in ("torch.nn.Module", "torch.nn.modules.module.Module"):
            self.need("nnx")
            return expr(self.emitter.module_base)
        if q in _ANNOTATION_TYPES:  # device: torch.device, dtype: torch.dtype
            self.need(_ANNOTATION_TYPES[q].split(".")[0])
            return expr(_ANNOTATION_TYPES[q])
        rule = self.rules.layers.get(q)
        target = rule.targets.get("nnx") if rule else None
        if target and re.fullmatch(r"nnx\.[A-Z]\w*", target):
            if self.linen:
                if target in linen_target.CLASSES:
                    self.need("linen")
                    return expr(linen_target.CLASSES[target])
            else:
                self.need("nnx")
                return expr(target)
        self.diag(original, "annotation", "error", f"type annotation {q}: no JAX type")
        return None

    def leave_Name(self, original_node, updated_node):
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if self._in_annotation and not isinstance(parent, cst.Attribute):
            return self._annotation_type(original_node) or updated_node
        if not isinstance(parent, cst.Attribute):
            if self._tensor_type_value(original_node, parent):
                self.need("jax")
                return expr("jax.Array")
            return self._layer_class_value(original_node) or updated_node
        return updated_node

    def _tensor_type_value(self, original: cst.Name, parent: cst.CSTNode | None) -> bool:
        """``Tensor`` (from torch) as a value outside annotations: a namedtuple's
        ``__annotations__ = {"logits": Tensor, "aux": Optional[Tensor]}`` (googlenet). Not an
        import, a construction or an isinstance check (handled there)."""
        if self.q(original) not in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor"):
            return False
        if isinstance(parent, (cst.ImportAlias, cst.Call)):
            return False
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            return not m.matches(outer, m.Call(func=m.Name("isinstance")))
        return True

    def _layer_class_value(self, original: cst.BaseExpression) -> cst.BaseExpression | None:
        """``norm_layer = nn.BatchNorm2d``: a torch layer class used as a value (a factory)."""
        q = self.q(original)
        rule = self.rules.layers.get(q or "")
        if rule is None or self._in_annotation:
            return None
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if isinstance(parent, cst.Call) and parent.func is original:
            return None  # a construction: handled as a call
        if isinstance(parent, cst.Arg) and isinstance(
                self.get_metadata(ParentNodeProvider, parent, None), cst.ClassDef):
            return None  # a base class: handled with the class
        if isinstance(parent, cst.Arg) and not parent.keyword:
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if (isinstance(outer, cst.Call) and outer.args and outer.args[0] is parent
                    and self.q(outer.func) == "functools.partial"
                    and rule.special in ("batch_norm", "layer_norm")):
                return None  # partial(nn.LayerNorm, eps=1e-6): translated as a whole
        if isinstance(parent, (cst.Arg, cst.Element)):
            grand = self.get_metadata(ParentNodeProvider, parent, None)
            while isinstance(grand, (cst.Tuple, cst.Element)):
                grand = self.get_metadata(ParentNodeProvider, grand, None)
            if isinstance(grand, cst.Call) and m.matches(grand.func, m.Name("isinstance")):
                return None
            if isinstance(grand, cst.Arg):
                grand = self.get_metadata(ParentNodeProvider, grand, None)
                if isinstance(grand, cst.Call) and m.matches(grand.func, m.Name("isinstance")):
                    return None
        if rule.special == "batch_norm" and "BatchNorm" in self.index.defined:
            self.diag(original, rule.id, "error", f"{q} as a value: the file defines its own "
                      "BatchNorm, the name of the converter's BatchNorm helper class: rename it")
            return None
        if rule.special == "batch_norm" and self.linen:
            self.need("partial", "linen")
            return expr(f"partial(BatchNorm, use_running_average=not {self._linen_train()}, "
                        "momentum=0.9, epsilon=1e-05)")
        if rule.special == "batch_norm" and self.emitter.name == "nnx":
            self.need("partial", "nnx")
            if self.index.factory_layouts == {rule.layout}:
                # its calls (norm_layer(planes)) are known to want channels-last input
                return expr("partial(BatchNorm, momentum=0.9, epsilon=1e-05)")
            # normalises over every axis but 1: right for NCHW/NCL input without a transpose
            self.diag(original, rule.id, "info", f"{q} as a value: a BatchNorm factory on "
                      "axis 1 (channels first), so that it fits wherever it is used")
            return expr("partial(BatchNorm, axis=1, momentum=0.9, epsilon=1e-05)")
        if rule.special == "layer_norm" and self.emitter.name == "nnx" and not self.linen:
            # norm_layer: Callable[..., nn.Module] = nn.LayerNorm, called with the normalized
            # size (swin's PatchMerging): torch's epsilon, flax's default being 1e-6
            self.need("partial", "nnx")
            return expr("partial(nnx.LayerNorm, epsilon=1e-05)")
        if rule.special == "conv" and self.emitter.name == "nnx" and not self.linen:
            # conv_layer: Callable[..., nn.Module] = nn.Conv2d, called with Conv2d's arguments
            # wherever the value goes: a helper class with that signature and torch's layout
            return cst.Name(f"Conv{spatial_dims(rule.torch)}d")
        if rule.special == "pool" and self.emitter.name == "nnx" and not self.linen:
            # aa_layer = nn.AvgPool2d, called with torch's arguments (kernel_size, stride, ...):
            # a helper class with that signature on NCHW input
            return cst.Name(q.rsplit(".", 1)[1])
        if rule.torch == "torch.nn.Linear" and self.emitter.name == "nnx" and not self.linen:
            # linear_layer = nn.Linear, called with torch's arguments (bias=): a helper class
            # with that signature over nnx.Linear
            return cst.Name("Linear")
        if rule.special == "layer_norm" and self.emitter.name == "nnx" and not self.linen:
            # norm_layer = nn.LayerNorm, called with the normalized size as nnx.LayerNorm is;
            # torch's eps (1e-5) written out, flax's default is 1e-6
            self.need("partial", "nnx")
            return expr("partial(nnx.LayerNorm, epsilon=1e-05)")
        activation = _activation_value(rule)
        if activation is not None and not self.linen:
            # activation_layer = nn.ReLU6: the function itself; the calls of a parameter
            # defaulting to an activation class (activation_layer(inplace=True)) give it back
            self._note_imports(activation)
            return activation
        self.diag(original, rule.id, "error", f"the layer class {q} used as a value")
        return None

    def _function_value(self, original, rule: Rule) -> cst.BaseExpression | None:
        """``act = F.relu`` / ``interpolate = torch.nn.functional.interpolate``: a torch function
        used as a value, not called. A plain rename is its JAX function (with the keywords the
        rule always writes); one whose arguments are translated per call cannot be: the JAX
        function is named so that the module still imports, and marked."""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if (isinstance(parent, cst.Call) and parent.func is original) or isinstance(
                parent, cst.Attribute):
            return None
        target = rule.jax
        if not target or not _is_dotted_text(target):
            return None
        self._note_imports(expr(target))
        if rule.special == "gelu":  # torch's default is the exact erf form
            self.need("partial")
            return expr(f"partial({target}, approximate=False)")
        if rule.special is None and not rule.rename and set(rule.drop) <= {"inplace"}:
            if rule.emit:
                self.need("partial")
                return expr(f"partial({target}, " + ", ".join(
                    f"{k}={v!r}" for k, v in rule.emit.items()) + ")")
            return expr(target)
        self.diag(original, rule.id, "error",
                  f"{rule.torch} used as a value: its arguments are translated per call, and "
                  f"calls through this name are not; {target} takes other arguments")
        return expr(target)

    def _string_quote(self) -> str:
        """A quote character that may be written inside the f-string being rewritten."""
        return "'" if self._fstring_quotes and '"' in self._fstring_quotes[-1] else '"'

    def visit_FormattedString(self, node) -> None:
        self._fstring_quotes.append(node.start)

    def leave_FormattedString(self, original_node, updated_node):
        self._fstring_quotes.pop()
        return updated_node

    def visit_Lambda(self, node) -> None:
        self._in_expr_scope += 1

    def leave_Lambda(self, original_node, updated_node):
        self._in_expr_scope -= 1
        return updated_node

    def visit_ListComp(self, node) -> None:
        self._in_expr_scope += 1

    # -- lists of layers in both layouts
    def _normalized_list(self, target: cst.BaseExpression) -> bool:
        return bool(isinstance(target, cst.Name) and self._fn_stack and (
            id(self._fn_stack[-1]), target.value) in self.index.normalized_lists)

    def _torch_layout_items(self, originals: list[cst.BaseExpression],
                            updated: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
        """The items put into a normalized list, channels-last ones between transposes."""
        layouts = Layouts(self.rules, self, self.index)
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if fid == id(self._fn_stack[-1])}
        items = [layouts.of(o, scope) for o in originals]
        return [a.value for a in self._insert_transposes([arg(u) for u in updated], items)]

    def leave_List(self, original_node, updated_node):
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        target = None
        if isinstance(parent, (cst.Assign, cst.AnnAssign, cst.AugAssign)) and (
                parent.value is original_node):
            target = parent.targets[0].target if isinstance(parent, cst.Assign) else parent.target
        elif isinstance(parent, cst.Arg):
            call_node = self.get_metadata(ParentNodeProvider, parent, None)
            if m.matches(call_node, m.Call(func=m.Attribute(attr=m.Name("extend")))):
                target = call_node.func.value
        if target is None or not self._normalized_list(target) or any(
                isinstance(e, cst.StarredElement) for e in original_node.elements):
            return updated_node
        elements = list(updated_node.elements)
        values = self._torch_layout_items([e.value for e in original_node.elements],
                                          [e.value for e in elements])
        if len(values) == len(elements):
            return updated_node
        # the inserted transposes are separated like the list's items (without the comments)
        sep = next((e.comma for e in elements if isinstance(e.comma, cst.Comma)
                    and e is not elements[-1]), None) or cst.Comma(
            whitespace_after=cst.SimpleWhitespace(" "))
        if isinstance(sep.whitespace_after, cst.ParenthesizedWhitespace):
            sep = sep.with_changes(whitespace_after=sep.whitespace_after.with_changes(
                first_line=cst.TrailingWhitespace(), empty_lines=[]))
        by_value = {id(e.value): e for e in elements}
        out = [by_value.get(id(v)) or cst.Element(v, comma=sep) for v in values]
        if out[-1] is not elements[-1]:  # a transpose last: it takes the trailing comma
            i = out.index(elements[-1])
            out[i] = elements[-1].with_changes(comma=sep)
            out[-1] = out[-1].with_changes(comma=elements[-1].comma)
        return updated_node.with_changes(elements=out)

    def _normalized_append(self, original, updated):
        """``layers.append(conv)`` of a channels-last layer into a normalized list: extend it
        with the layer between transposes."""
        values = self._torch_layout_items([original.args[0].value], [updated.args[0].value])
        if len(values) == 1:
            return updated
        return updated.with_changes(
            func=updated.func.with_changes(attr=cst.Name("extend")),
            args=[arg(cst.List([cst.Element(v, comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))) for v in values[:-1]]
                + [cst.Element(values[-1])]))])

    def leave_ListComp(self, original_node, updated_node):
        self._in_expr_scope -= 1
        return updated_node

    def visit_GeneratorExp(self, node) -> None:
        self._in_expr_scope += 1

    def leave_GeneratorExp(self, original_node, updated_node):
        self._in_expr_scope -= 1
        return updated_node

    def visit_DictComp(self, node) -> None:
        self._in_expr_scope += 1

    def leave_DictComp(self, original_node, updated_node):
        self._in_expr_scope -= 1
        return updated_node

    # ------------------------------------------------------------------ randomness
    def _subkey(self, node) -> cst.BaseExpression:
        if self._in_expr_scope:
            raise Untranslatable("random draw inside a lambda or comprehension: each draw "
                                 "needs its own key; make it a loop", rule="random")
        scope = self._key_scopes[-1]
        if not scope.has_key:
            if len(self._key_scopes) == 1:
                scope.root_needed = scope.has_key = True
                self.diag(node, "random", "warning",
                          "random draw without torch.manual_seed: a root key "
                          "jax.random.key(0) is added at the top of the file")
            elif self._module_rngs():
                # a module's own random numbers at call time (a VAE's reparameterisation):
                # from the nnx.Rngs that __init__ keeps, whose state advances at every draw
                self.need("jax")
                return expr("self.rngs()")
            else:
                raise Untranslatable("random draw in a method: pass a key to it (or keep an "
                                     "nnx.Rngs on the module)", rule="random")
        self.need("jax")
        return self._pending[-1].keys.take()

    def _module_rngs(self) -> bool:
        """In a method of an NNX module class that draws random numbers outside __init__
        (the class keeps ``self.rngs = rngs.fork()``). Not for linen, whose modules draw
        with make_rng and a key given to apply, nor for the NNX translation the equinox
        target starts from."""
        return (not self.linen and not self.for_equinox and self.in_module_class()
                and self.current_class in self.training.method_draws)

    def leave_Module(self, original_node, updated_node):
        if self._top_steps:
            body = list(updated_node.body)
            i = 0
            while i < len(body) and (m.matches(body[i], m.SimpleStatementLine(
                    body=[m.Import() | m.ImportFrom()])) or (i == 0 and m.matches(
                    body[i], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])))):
                i += 1
            blank = [cst.EmptyLine(indent=False)] * 2
            steps = [f.with_changes(leading_lines=blank) for f in self._top_steps]
            if i < len(body):
                body[i] = body[i].with_changes(leading_lines=[*blank, *[
                    ln for ln in body[i].leading_lines if ln.comment is not None]])
            updated_node = updated_node.with_changes(body=[*body[:i], *steps, *body[i:]])
        if self._module_hoist:
            updated_node = updated_node.with_changes(body=_insert_before_functions(
                list(updated_node.body), self._module_hoist))
        if self._host_rng:
            updated_node = updated_node.with_changes(body=self._with_host_rng(
                original_node, list(updated_node.body)))
        if not self._key_scopes[0].root_needed and not self._eval_step and not (
                self._lt_train_state_class):
            return updated_node
        body = list(updated_node.body)
        i = 0
        while i < len(body) and (m.matches(body[i], m.SimpleStatementLine(
                body=[m.Import() | m.ImportFrom()])) or (i == 0 and m.matches(
                body[i], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])))):
            i += 1
        if self._lt_train_state_class:
            body.insert(i, lt.train_state_class())
            if i < len(body) - 1:
                body[i + 1] = body[i + 1].with_changes(leading_lines=[
                    cst.EmptyLine(indent=False), cst.EmptyLine(indent=False),
                    *[ln for ln in body[i + 1].leading_lines if ln.comment is not None]])
        if self._eval_step:
            body.insert(i, lt.eval_step_function() if self.linen
                        else tr.eval_step_function(tree_mode=not self.data.aliasing))
            if i < len(body) - 1:
                body[i + 1] = body[i + 1].with_changes(leading_lines=[
                    cst.EmptyLine(indent=False), cst.EmptyLine(indent=False),
                    *[ln for ln in body[i + 1].leading_lines if ln.comment is not None]])
        if self._key_scopes[0].root_needed:
            body.insert(i, tr.root_key_statement())
            self.need("jax")
        return updated_node.with_changes(body=body)

    def _with_host_rng(self, original_node, body: list) -> list:
        """``host_rng = np.random.default_rng(SEED)`` after the statement that binds the seed
        (after the imports for a literal seed): the generator of the host-side draws."""
        host = self.data.host
        stmt = cst.parse_statement(
            f"{ha.GENERATOR} = np.random.default_rng({code(host.seed)})\n")
        at = None
        if isinstance(host.seed, cst.Name):
            binds = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                m.Name(host.seed.value))]) | m.AnnAssign(target=m.Name(host.seed.value))])
            at = next((i + 1 for i in range(len(body) - 1, -1, -1)
                       if m.matches(body[i], binds)), None)
            # after the block of constants the seed is defined in
            while at is not None and at < len(body) and isinstance(
                    body[at], cst.SimpleStatementLine) and m.matches(
                    body[at].body[0], m.Assign() | m.AnnAssign()) and not any(
                    ln.comment is None for ln in body[at].leading_lines):
                at += 1
        if at is None:
            at = 0
            while at < len(body) and (m.matches(body[at], m.SimpleStatementLine(
                    body=[m.Import() | m.ImportFrom()])) or (at == 0 and m.matches(
                    body[at], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])))):
                at += 1
            stmt = stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        return [*body[:at], stmt, *body[at:]]

    def _model_names(self) -> set[str]:
        t = self.training
        names = {"model", "net"} | set(t.alias_models.values())
        names |= {s.model for s in t.optimizers.values() if s.model and s.model != "self"}
        names |= t.model_vars
        return names

    # ------------------------------------------------------------------ attributes
    def leave_Attribute(self, original_node, updated_node):
        renamed = self._layer_attribute(original_node, updated_node)
        if renamed is not None:
            return renamed
        if original_node.attr.value == "data" and id(original_node.value) in self._weight_reads:
            return updated_node.value  # model.weight.data: the array read above
        weight = self._built_layer_weight(original_node, updated_node)
        if weight is not None:
            return weight
        if self.current_class is not None and self._layer_subclass_rule(
                self.current_class) is not None:
            mapped = self._layer_subclass_attribute(original_node, updated_node)
            if mapped is not None:
                return mapped
        if (original_node.attr.value == "module" and isinstance(original_node.value, cst.Name)
                and original_node.value.value in self.data.wrapped):
            return updated_node.value  # DDP(model).module: the model itself
        if original_node.attr.value in ("dataset", "sampler", "batch_size") and (
                self.values is not None and self.values.kind(original_node.value)
                == vk.Kind.LOADER):
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            holder = self.get_metadata(ParentNodeProvider, parent, None)
            if (original_node.attr.value == "dataset" and self.data.dataset_length_known()
                    and isinstance(parent, cst.Arg) and isinstance(holder, cst.Call)
                    and m.matches(holder, m.Call(func=m.Name("len"), args=[m.Arg(keyword=None,
                                                                                star="")]))):
                # len(loader.dataset): the examples before .batch(...)
                return expr("{l}.parents[0]", l=updated_node.value)
            self.diag(original_node, "torch.utils.data.DataLoader", "error",
                      f"{code(original_node)}: the loader is a grain pipeline, which has no "
                      f".{original_node.attr.value}: read it from what the loader was built "
                      "from")
        if (original_node.attr.value == "forward" and self.in_module_class()
                and m.matches(original_node.value, m.Call(func=m.Name("super")))):
            return updated_node.with_changes(attr=cst.Name("__call__"))  # super().forward(x)
        if self._in_annotation and not isinstance(
                self.get_metadata(ParentNodeProvider, original_node, None), cst.Attribute):
            # the whole dotted name (torch.nn.Module), not its prefix (torch.nn)
            mapped = self._annotation_type(original_node)
            if mapped is not None:
                return mapped
        if not isinstance(self.get_metadata(ParentNodeProvider, original_node, None),
                          cst.Attribute):
            factory = self._layer_class_value(original_node)
            if factory is not None:
                return factory
        q = self.q(original_node)
        if q in self.rules.functions and not self._in_annotation:
            value = self._function_value(original_node, self.rules.functions[q])
            if value is not None:
                return value
        if q and q.startswith("torch."):
            short = q[len("torch."):]
            if short in DTYPES:
                if short in ("int64", "long"):
                    self.diag(original_node, "dtype", "info",
                              "torch.int64 becomes jnp.int32 (JAX's default integer width)")
                self.need("jnp")
                return expr(DTYPES[short])
            if q in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor"):
                self.need("jax")
                return expr("jax.Array")
        if (original_node.attr.value == "requires_grad" and self.in_module_class()
                and not isinstance(self.get_metadata(ParentNodeProvider, original_node, None),
                                   cst.AssignTarget)
                and not self._in_removed_line(original_node)):
            # densenet's any_requires_grad (behind memory_efficient=False)
            self.diag(original_node, "requires_grad", "error",
                      "x.requires_grad: JAX arrays carry no such flag (jax.grad differentiates "
                      "with respect to the arguments it is given)")
        if m.matches(original_node, m.Attribute(value=m.Name("self"), attr=m.Name("training"))) \
                and self.in_module_class():
            self._training_reads[self.current_class] = self._training_reads.get(
                self.current_class, 0) + 1
            return expr(f"self.{linen_target.TRAIN}" if self.linen else "not self.deterministic")
        if self.linen and m.matches(original_node.value, m.Attribute(value=m.Name("self"))) \
                and self.in_module_class() and self.index.classes[
                    self.current_class].attr_rule.get(original_node.value.attr.value) == \
                "torch.nn.ModuleDict":
            # a linen dict of submodules is indexed: self.transformer["wte"]
            return cst.Subscript(value=updated_node.value, slice=[cst.SubscriptElement(
                cst.Index(cst.SimpleString(f'"{original_node.attr.value}"')))])
        if original_node.attr.value in ("values", "indices") and isinstance(
                updated_node.value, cst.Tuple) and len(updated_node.value.elements) == 2:
            # x.max(dim).values / .indices after max(dim) became (max, argmax)
            return updated_node.value.elements[
                0 if original_node.attr.value == "values" else 1].value
        if (original_node.attr.value == "param_groups" and isinstance(original_node.value, cst.Name)
                and original_node.value.value in self.training.optimizer_names):
            outer = self.get_metadata(ParentNodeProvider, original_node, None)
            outer = self.get_metadata(ParentNodeProvider, outer, None) if outer else None
            outer2 = self.get_metadata(ParentNodeProvider, outer, None) if outer else None
            read = isinstance(outer, cst.Subscript) and self._group_lr(outer) is not None and \
                not isinstance(outer2, cst.AssignTarget) or id(self.get_metadata(
                    ParentNodeProvider, original_node, None)) in self._lr_loops
            if not read:
                self.diag(original_node, "param_groups", "error",
                          "optimizer.param_groups used other than to read the learning rate: "
                          "build the optimizer with optax.inject_hyperparams and set "
                          "opt_state.hyperparams['learning_rate']")
        if isinstance(original_node.value, (cst.Name, cst.Attribute)) and (
                original_node.attr.value in ("weight", "bias")):
            # (isinstance(m, nn.Linear) / isinstance(self.heads.head, nn.Linear) above)
            layers = self._narrowed_layer(original_node, code(original_node.value))
            if layers:
                # several classes (isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))): only when
                # they name this weight alike
                tos = {getattr(self.rules.layers[n].weights.get(original_node.attr.value),
                               "to", None) for n in layers}
                if len(tos) == 1:
                    to = tos.pop()
                    if to and to != original_node.attr.value:
                        return updated_node.with_changes(attr=cst.Name(to))
        if isinstance(original_node.value, (cst.Name, cst.Attribute)) and (
                original_node.attr.value in _CONV_ATTRS):
            # fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels (regnet's init)
            layers = self._narrowed_layer(original_node, code(original_node.value))
            if layers and all(self.rules.layers[n].special == "conv" for n in layers):
                return updated_node.with_changes(
                    attr=cst.Name(_CONV_ATTRS[original_node.attr.value]))
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Name("self")))):
            # nn.init.zeros_(self.head.weight): the layer's JAX name for it (kernel)
            layer = self._inherited_attr_rule(original_node.value.attr.value)
            rule = self.rules.layers.get(layer)
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            if wm is not None and wm.to and wm.to != original_node.attr.value:
                renamed = updated_node.with_changes(attr=cst.Name(wm.to))
                if wm.layout in ("as_is", "any") or not self._weight_read_as_value(
                        original_node):
                    return renamed
                if wm.layout == "transpose":
                    # shifted_window_attention(x, self.qkv.weight, ...) computes with torch's
                    # (out, in) layout: the NNX kernel is (in, out)
                    return expr("{k}.T", k=renamed)
                if wm.layout == "conv" and (layer or "")[-2:] in ("1d", "2d", "3d"):
                    # self.conv.weight.shape, F.conv2d(x, self.conv.weight): torch's
                    # (out, in, *kernel) from the NNX kernel's (*kernel, in, out)
                    nd = int(layer[-2])
                    self.need("jnp")
                    return expr(f"jnp.transpose({{k}}, {(nd + 1, nd, *range(nd))})", k=renamed)
                self.diag(original_node, "layer-weight", "error",
                          f"{code(original_node)}: the JAX layer lays this weight out otherwise "
                          f"({wm.layout}); read here in torch's layout, it is not translated")
                return renamed
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Attribute(
                    value=m.Name("self"))))):
            # self.transformer.wpe.weight, transformer a ModuleDict built with its layers
            rule = self.rules.layers.get(self._dict_item_rule(
                original_node.value.value.attr.value, original_node.value.attr.value) or "")
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            if wm is not None and wm.to and wm.to != original_node.attr.value and not (
                    wm.layout == "transpose" and self._weight_read_as_value(original_node)):
                return updated_node.with_changes(attr=cst.Name(wm.to))
        if (original_node.attr.value in ("weight", "bias") and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Attribute()))):
            # self.embeddings.patch_embeddings.projection.weight.dtype (ViT): a layer reached
            # through module classes of the file; its dtype (any layout), or an as-is weight
            rule = self.rules.layers.get(self._chain_layer_rule(original_node.value) or "")
            wm = rule.weights.get(original_node.attr.value) if rule is not None else None
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            if wm is not None and wm.to and wm.to != original_node.attr.value and (
                    wm.layout == "as_is" or (isinstance(parent, cst.Attribute)
                                             and parent.attr.value == "dtype")):
                return updated_node.with_changes(attr=cst.Name(wm.to))
        if (self.emitter.name == "nnx" and not self.linen and self.in_module_class()
                and m.matches(original_node.value, m.Name("self"))
                and original_node.attr.value in self._variable_attrs.get(
                    self.current_class, ())):
            parent = self.get_metadata(ParentNodeProvider, original_node, None)
            outer = self.get_metadata(ParentNodeProvider, parent, None) if isinstance(
                parent, cst.Arg) else None
            if isinstance(outer, cst.Call) and not (self.q(outer.func) or "").startswith(
                    "torch"):
                # _get_relative_position_bias(self.relative_position_bias_table, ...): a
                # function of the file computes with the array, not the nnx.Variable (x[...]
                # reads it; the equinox pass keeps it, a plain array's x[...] being x)
                return expr("{v}[...]", v=updated_node)
        if (original_node.attr.value in _CONV_ATTRS and self.in_module_class()
                and m.matches(original_node.value, m.Attribute(value=m.Name("self")))):
            # self.conv_proj.in_channels (vit's init)
            rule = self.rules.layers.get(self.index.classes[self.current_class].attr_rule.get(
                original_node.value.attr.value, ""))
            if rule is not None and rule.special == "conv":
                return updated_node.with_changes(
                    attr=cst.Name(_CONV_ATTRS[original_node.attr.value]))
        return updated_node

    # torch layers whose equinox layer names its weights and lays them out as torch does
    EQX_TORCH_WEIGHTS = frozenset({"torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d",
                                   "torch.nn.Conv3d", "torch.nn.Embedding", "torch.nn.LayerNorm",
                                   "torch.nn.GroupNorm"})

    def _built_layer_weight(self, original_node: cst.Attribute, updated_node: cst.Attribute
                            ) -> cst.BaseExpression | None:
        """``model.weight`` (``.bias``, ``.data`` after it) where ``model`` holds a torch layer
        the file built (``model = nn.Linear(3, 4)``, or ``net.fc`` of a model of the file's
        class, value analysis): read,
        the target layer's array in torch's layout (NNX ``model.kernel[...].T``; equinox
        keeps torch's names and layouts); written, or on linen (a layer object holds no
        parameters), marked. None: not such a read."""
        if original_node.attr.value not in ("weight", "bias") or self.values is None:
            return None
        root = original_node.value  # model.weight, net.fc.weight (self.fc.weight: below)
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name) or root.value == "self":
            return None
        q = self.values.layer(original_node.value)
        rule = self.rules.layers.get(q or "")
        wm = rule.weights.get(original_node.attr.value) if rule is not None else None
        if wm is None:
            return None
        read = original_node
        parent = self.get_metadata(ParentNodeProvider, read, None)
        if isinstance(parent, cst.Attribute) and parent.value is read and \
                parent.attr.value == "data":
            read, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(outer, cst.Call) and (self.q(outer.func) or "").startswith(
                    "torch.nn.init"):
                return None  # an initialiser's target (its own rule)
        holder = self.get_metadata(ParentNodeProvider, parent, None) if parent else None
        written = isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
            isinstance(parent, cst.Attribute) and parent.value is read and (
                parent.attr.value.endswith("_") or parent.attr.value in (
                    "grad", "requires_grad", "data"))) or (
            isinstance(parent, cst.Subscript) and isinstance(holder, (cst.AssignTarget,
                                                                      cst.AugAssign)))
        text = code(original_node)
        if written or self.linen or wm.to is None:
            why = ("a linen layer object holds no parameters: they are in the variables "
                   "model.init returns (variables['params'])" if self.linen and not written
                   else "written in place: the layer's array is immutable in JAX (build the "
                   "layer with an initializer instead)")
            self.diag(original_node, "layer-weight", "error",
                      f"{text} of the {q.rsplit('.', 1)[-1]} built outside a module: {why}")
            return None
        if self.for_equinox:
            if q not in self.EQX_TORCH_WEIGHTS:
                self.diag(original_node, "layer-weight", "error",
                          f"{text}: the equinox layer of a {q.rsplit('.', 1)[-1]} may name or "
                          "lay out its weights otherwise; not translated")
                return None
            self._weight_reads.add(id(original_node))
            return updated_node  # torch's name and layout
        array = expr("{v}." + wm.to + "[...]", v=updated_node.value)
        if wm.layout == "transpose":
            array = expr("{a}.T", a=array)
        elif wm.layout == "conv" and q[-2:] in ("1d", "2d", "3d"):
            nd = int(q[-2])
            self.need("jnp")
            array = expr(f"jnp.transpose({{a}}, {(nd + 1, nd, *range(nd))})", a=array)
        elif wm.layout != "as_is":
            self.diag(original_node, "layer-weight", "error",
                      f"{text}: the JAX layer lays this weight out otherwise ({wm.layout}); "
                      "not translated")
            return None
        self._weight_reads.add(id(original_node))
        return array

    def _dict_item_rule(self, attr: str, key: str) -> str | None:
        """The torch layer of ``self.<attr>[key]`` when ``self.<attr>`` is an nn.ModuleDict
        built from a dict of layers (``nn.ModuleDict(dict(wpe=nn.Embedding(...)))``)."""
        info = self.index.classes.get(self.current_class or "")
        if info is None or info.attr_rule.get(attr) != "torch.nn.ModuleDict":
            return None
        ctor = info.attr_ctor.get(attr)
        if ctor is None or not ctor.args:
            return None
        items = ctor.args[0].value
        value = None
        if m.matches(items, m.Call(func=m.Name("dict"))):
            value = next((a.value for a in items.args if a.keyword is not None
                          and a.keyword.value == key), None)
        elif isinstance(items, cst.Dict):
            value = next((e.value for e in items.elements if isinstance(e, cst.DictElement)
                          and try_literal(e.key, None) == key), None)
        if not isinstance(value, cst.Call):
            return None
        try:
            return self.q(value.func)
        except Exception:  # noqa: BLE001 - a node of another tree: no metadata
            return None

    def _lambda_methods(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        """``self.f = lambda x: m.c_proj(m.c_fc(x))`` over submodules -> a method
        (passes/closures.py); one that cannot move is marked at its line."""
        def where(attr: str) -> cst.CSTNode:
            init = next((s for s in original.body.body if isinstance(s, cst.FunctionDef)
                         and s.name.value == "__init__"), original)
            return next((s for s in init.body.body if isinstance(s, cst.SimpleStatementLine)
                         and m.matches(s.body[0], m.Assign(targets=[m.AssignTarget(
                             m.Attribute(value=m.Name("self"), attr=m.Name(attr)))],
                             value=m.Lambda()))), original) if isinstance(
                                 init, cst.FunctionDef) else original

        def mark(attr: str, message: str) -> None:
            line, col = self.pos(where(attr))
            self.report(line, col, closures.RULE, "error", message)

        info = self.index.classes.get(original.name.value)
        dicts = frozenset(a for a, r in info.attr_rule.items() if r == "torch.nn.ModuleDict") \
            if self.linen and info is not None else frozenset()
        updated, moved = closures.lambdas_to_methods(updated, mark, dicts)
        for attr in moved:
            line, col = self.pos(where(attr))
            self.report(line, col, closures.RULE, "info",
                        f"self.{attr} = lambda over submodules -> method {attr}: a lambda "
                        "would keep the layers it closed over out of JAX transforms (their "
                        "parameters would get no gradient)")
        return updated

    def _inherited_attr_rule(self, attr: str) -> str:
        """The torch layer ``self.<attr>`` is, set in this class or a module class of this
        file it derives from (ShiftedWindowAttentionV2 reads its base's self.qkv)."""
        info = self.index.classes.get(self.current_class or "")
        seen = set()
        while info is not None and info.name not in seen:
            seen.add(info.name)
            if attr in info.attr_rule:
                return info.attr_rule[attr]
            info = self.index.classes.get(info.module_base or "")
        return ""

    def _chain_layer_rule(self, node: cst.BaseExpression) -> str | None:
        """The torch layer ``self.a.b.c`` is when ``self.a`` and ``.b`` are each built by one
        module class of this file (``self.embeddings = ViTEmbeddings(config)``) and ``c`` is a
        layer of the last one."""
        names: list[str] = []
        while isinstance(node, cst.Attribute):
            names.append(node.attr.value)
            node = node.value
        if not m.matches(node, m.Name("self")) or len(names) < 2:
            return None
        names.reverse()
        info = self.index.classes.get(self.current_class or "")
        for name in names[:-1]:
            if info is None:
                return None
            built = info.built_by.get(name, set()) & self.index.module_classes
            if len(built) != 1 or name in info.attr_rule:
                return None
            info = self.index.classes.get(built.pop())
        return info.attr_rule.get(names[-1]) if info is not None else None

    def _weight_read_as_value(self, node: cst.Attribute) -> bool:
        """``self.fc.weight`` read for its values outside construction: handed to a function or
        computed with (not an nn.init target, not in ``__init__``, not an attribute's base)."""
        if not self._fn_stack or self._fn_stack[-1].name.value == "__init__":
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Attribute) and (
                parent.attr.value in ("data", "grad") or parent.attr.value.endswith("_")):
            return False  # self.fc.weight.data.normal_(...): initialisation, in place
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)):
            return False
        if isinstance(parent, cst.Assign) and any(t.target is node for t in parent.targets):
            return False
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if isinstance(outer, cst.Call) and (self.q(outer.func) or "").startswith(
                    "torch.nn.init"):
                return False
        return True

    # ------------------------------------------------------------------ calls
    def visit_Call(self, node: cst.Call) -> None:
        if self._class_stack and self._own_functional(node):
            self._own_calls.add(id(node))

    def _parameter_listing(self, original_node: cst.Call, updated_node: cst.Call):
        """``for p in model.parameters()`` / ``for n, p in model.named_parameters()`` (also in
        a comprehension: ``sum(p.numel() for p in self.parameters())``) on a module: the
        parameter arrays of the target library. None: not such a call."""
        func = original_node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in (
                "parameters", "named_parameters") and not original_node.args
                and self.values is not None
                and self.values.kind(func.value) == vk.Kind.MODULE):
            return None
        parent = self.get_metadata(ParentNodeProvider, original_node, None)
        if not (isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is original_node):
            return None
        here = self._fn_stack[-1].name.value if self._fn_stack else None
        if any(site.function == here for site in self.training.optimizers.values()):
            return None  # parameter groups: translated with their optimizer, or kept with it
        owner = updated_node.func.value
        named = func.attr.value == "named_parameters"
        if self.emitter.name == "nnx":
            self.need("nnx")
            if named:
                return expr('((".".join(map(str, path)), param.value) for path, param in '
                            "nnx.to_flat_state(nnx.state({m}, nnx.Param)))", m=owner)
            self.need("jax")
            return expr("jax.tree.leaves(nnx.state({m}, nnx.Param))", m=owner)
        if self.emitter.name == "equinox" and not named:
            self.need("jax", "eqx")
            return expr("jax.tree.leaves(eqx.filter({m}, eqx.is_inexact_array))", m=owner)
        self.diag(original_node, "module-api", "error",
                  f"{code(original_node)}: the {self.emitter.name} model's parameters are not "
                  "attributes of the module" if self.linen else
                  f"{code(original_node)}: parameter names are not translated for "
                  f"{self.emitter.name}")
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call):
        handled = self._checkpoint_dict_call(original_node) or self._parameters_call(
            original_node)
        if handled is not None:
            return handled
        if len(original_node.args) == 1 and self.q(original_node.func) == "inspect.signature" \
                and self.q(original_node.args[0].value) in _SIGNATURE_OPTIMIZERS:
            # 'fused' in inspect.signature(torch.optim.AdamW).parameters: optax's signature
            self.need("optax")
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(
                value=expr(_SIGNATURE_OPTIMIZERS[self.q(original_node.args[0].value)]))])
        if m.matches(original_node, m.Call(func=m.Name("hasattr"), args=[
                m.Arg(), m.Arg(value=m.SimpleString())])) and self.q(
                original_node.args[0].value) == "torch.nn.functional" and \
                original_node.args[1].value.evaluated_value == "scaled_dot_product_attention":
            # the flash-attention guard: JAX's fused attention is jax.nn.dot_product_attention
            self.need("jax")
            return expr("hasattr(jax.nn, 'dot_product_attention')")
        if isinstance(updated_node.func, cst.Lambda) and not updated_node.func.lpar:
            # a layer or loss built and called on the spot: nn.Identity()(x)
            updated_node = updated_node.with_changes(func=updated_node.func.with_changes(
                lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        if self.linen and isinstance(original_node.func, cst.Name) and (
                original_node.func.value in self._lt_evaluators) and not self._class_stack:
            updated_node = self._lt_pass_variables(original_node, updated_node)
        if self._factory_dicts:
            updated_node = self._factory_dict_call(original_node, updated_node)
        if self._device_functions and self.values is not None:
            updated_node = drop_device_argument(original_node, updated_node,
                                                self._device_functions, self.values.is_tensor)
        listed = self._parameter_listing(original_node, updated_node)
        if listed is not None:
            return listed
        if isinstance(original_node.func, cst.Name) and (
                original_node.func.value in self._file_functions):
            # train(model, train_loader, ...): the loader shuffled per epoch is that epoch's
            outer = [f.target.value for f in self._for_stack if isinstance(f.target, cst.Name)]
            updated_node = updated_node.with_changes(args=[
                a.with_changes(value=self._epoch_loaders(a.value, outer[-1] if outer else "0"))
                if isinstance(a.value, cst.Name) else a for a in updated_node.args])
        try:
            result = self._rewrite_call(original_node, updated_node)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or (self.q(original_node.func) or
                                                  _call_name(original_node)), "error",
                      exc.message)
            return updated_node
        if id(original_node) in self.data.host.arrays:
            result = ha.numpy_array(result)  # an array that only feeds host-side batches
        if result is not updated_node:
            result = _call_partial(result)
            self._note_imports(result)
            if isinstance(result, cst.BaseExpression) and needs_parens(result) and isinstance(
                    self.get_metadata(ParentNodeProvider, original_node, None),
                    (cst.BinaryOperation, cst.UnaryOperation, cst.Attribute, cst.Subscript,
                     cst.Call, cst.Comparison, cst.BooleanOperation, cst.ComparisonTarget,
                     cst.Await)):
                # x @ w.T + b inside a - ...: keep the operator precedence of the call
                result = result.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return result

    def _factory_dict_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.ones(n, **dd)`` / ``nn.Linear(a, b, **dd)`` with ``dd`` a factory keyword dict:
        a torch function that takes a dtype gets ``dtype=`` (the dict's value); a torch layer
        drops it, as its explicit ``device=``/``dtype=`` are dropped. Other callees (module
        classes of the project, parameters holding a layer class) keep ``**dd``, now without
        its device."""
        name = self.q(original.func) or ""
        rule = self.rules.functions.get(name) or self.rules.layers.get(name)
        if rule is None:
            return updated
        args, dtype = [], None
        for a in updated.args:
            if (a.star == "**" and isinstance(a.value, cst.Name)
                    and a.value.value in self._factory_dicts):
                dtype = self._factory_dicts[a.value.value] or expr(
                    f'{a.value.value}.get("dtype")')
                continue
            args.append(a)
        if len(args) == len(updated.args):
            return updated
        if (dtype is not None and "dtype" in rule.params and "dtype" not in rule.drop
                and not any(a.keyword and a.keyword.value == "dtype" for a in args)):
            args.append(arg(dtype, "dtype"))
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)

    def _dropout_layer(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression | None:
        """``F.dropout(x, p=self.drop_rate, training=self.training)`` in a module's method: an
        ``nnx.Dropout`` attribute built at the end of ``__init__`` (it draws from ``rngs`` and
        follows ``.train()`` / ``.eval()``), called here. The rate must be a literal or an
        attribute ``__init__`` sets; any other call is left to the rule (marked)."""
        cls = self.current_class
        if (self.emitter.name != "nnx" or not self.in_module_class()
                or not self._class_inits.get(cls or "") or not self._fn_stack
                or self._fn_stack[-1].name.value == "__init__" or self._in_expr_scope):
            return None
        b = bind(original.args, ("input", "p", "training", "inplace"))
        if b.star or b.get("input") is None or not m.matches(
                b.get("training"), m.Attribute(value=m.Name("self"), attr=m.Name("training"))):
            return None
        info = self.index.classes[cls]
        p = b.get("p")
        if p is None:
            rate: cst.BaseExpression = cst.Float("0.5")
        elif isinstance(try_literal(p, ...), (int, float)) or (
                m.matches(p, m.Attribute(value=m.Name("self")))
                and p.attr.value in info.init_attrs):
            rate = p
        else:
            return None
        taken = set(info.init_attrs) | set(info.attr_layout) | info.module_attrs
        hoisted = self._dropouts.setdefault(cls, [])
        attr = next((a for a, r in hoisted if code(r) == code(rate)), None)
        if attr is None:
            attr = "dropout"
            n = 1
            while attr in taken or any(a == attr for a, _ in hoisted):
                attr, n = f"dropout{n}", n + 1
            hoisted.append((attr, rate))
        self.diag(original, "torch.nn.functional.dropout", "info",
                  f"F.dropout(..., training=self.training) became self.{attr}, an nnx.Dropout "
                  "built in __init__ (its key comes from rngs; .eval() turns it off)")
        x = bind(updated.args, ("input", "p", "training", "inplace")).get("input")
        self._training_hoisted[cls] = self._training_hoisted.get(cls, 0) + 1
        return call(f"self.{attr}", arg(x))

    def _add_dropouts(self, cls: str, node: cst.ClassDef) -> cst.ClassDef:
        """The nnx.Dropout layers of _dropout_layer, at the end of ``__init__``."""
        hoisted = self._dropouts.get(cls)
        if not hoisted:
            return node
        self.need("nnx")
        lines = [cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(expr(f"self.{attr}"))],
            value=call("nnx.Dropout", arg(rate), arg(cst.Name("rngs"), "rngs")))])
            for attr, rate in hoisted]
        body = [f.with_changes(body=f.body.with_changes(body=[*f.body.body, *lines]))
                if isinstance(f, cst.FunctionDef) and f.name.value == "__init__" else f
                for f in node.body.body]
        return node.with_changes(body=node.body.with_changes(body=body))

    def _data_call(self, original: cst.Call, updated: cst.Call, name: str
                   ) -> cst.BaseExpression | None:
        """torch.distributed queries, DDP, TensorDataset, DataLoader (passes/data.py)."""
        transform = dt.transform_name(name)
        if transform in dt.TRANSFORMS:
            if transform in dt.RANDOM_TRANSFORMS:
                self.need("np")
            return dt.transform(transform, updated, self.data)
        if transform is not None or name.startswith("torchvision.datasets."):
            raise Untranslatable(
                f"{name}: no numpy counterpart written (the translated transforms are "
                f"{', '.join(sorted(dt.TRANSFORMS))})" if transform is not None else
                f"{name}: torchvision's datasets download and decode with torch; load the "
                "arrays with numpy (or tensorflow_datasets / datasets) into a Dataset class",
                rule=name)
        if name == "torch.distributed.get_rank":
            self.need("jax")
            return expr("jax.process_index()")
        if name == "torch.distributed.get_world_size":
            self.diag(original, name, "info", "world size 1: the JAX script is one program "
                      "over every device; its batch size is the global batch, sharded along "
                      "the data axis")
            return cst.Integer("1")
        if name in ("torch.distributed.is_initialized", "torch.distributed.is_available"):
            return cst.Name("True")
        if name in dt.WRAPPERS:
            module = updated.args[0].value if updated.args else None
            if module is None:
                raise Untranslatable(f"{name} without a module", rule=name)
            self.diag(original, name, "info", "DistributedDataParallel removed: the batch is "
                      "sharded over the devices and XLA inserts the gradient all-reduce")
            return module
        if name in dt.GENERATORS and (self._seeds_a_split(original) or self._consumed_generator(
                self._generator_variable(original))):
            return updated  # torch.Generator().manual_seed(s): the split or loader reads s
        if name in dt.TENSOR_DATASETS:
            self.need("grain")
            return dt.tensor_dataset(updated)
        if name in dt.RANDOM_SPLITS:
            self.need("grain")
            return dt.random_split(updated, self.data)
        if name in dt.SUBSETS:
            self.need("grain")
            return dt.subset(updated, self.data)
        if name in dt.LOADERS:
            target = self._assign_target(original)
            site = self.data.loaders.get(target or "")
            if site is not None and site.shuffled:
                return updated  # the assignment becomes a function of the epoch: leave_Assign
            expanded, warnings = dt.expand_loader_kwargs(original, updated, self.get_metadata)
            pipeline, notes = dt.loader_pipeline(original, expanded, self.q, self.data, None)
            for note in notes:
                self.diag(original, name, "info", note)
            for note in warnings:
                self.diag(original, name, "warning", note)
            self.need("grain")
            return pipeline
        if name in dt.SAMPLERS | dt.BATCH_SAMPLERS or name in dt.SCALERS or (
                name in dt.AUTOCASTS) or name in dt.DIST_GATHERS or (
                name in dt.DIST_DROPPED or name == dt.DIST_INIT) or (
                name in dt.DEVICE_DROPPED and isinstance(
                    self.get_metadata(ParentNodeProvider, original, None), cst.Expr)):
            return updated  # statements, arguments and with blocks: handled there
        return None

    def _seeds_a_split(self, node: cst.Call) -> bool:
        chain = [node]
        for _ in range(4):  # Call <- Attribute <- Call(manual_seed) <- Arg <- random_split
            chain.append(self.get_metadata(ParentNodeProvider, chain[-1], None))
        attr, seeded, argument, split = chain[1:]
        return (isinstance(attr, cst.Attribute) and attr.attr.value == "manual_seed"
                and isinstance(argument, cst.Arg) and isinstance(split, cst.Call)
                and (self.q(split.func) or "") in dt.RANDOM_SPLITS | dt.LOADERS)

    def _generator_variable(self, node: cst.Call) -> str:
        """``g`` of ``g = torch.Generator()`` or ``g = torch.Generator().manual_seed(s)``."""
        seeded = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(seeded, cst.Attribute) and seeded.attr.value == "manual_seed":
            node = self.get_metadata(ParentNodeProvider, seeded, node)
        return self._assign_target(node) or ""

    def _consumed_generator(self, name: str) -> bool:
        """A torch.Generator variable read only as the generator= of loaders and splits."""
        return (name in self.data.generators and name not in self.data.generators_kept
                and self.data.generators[name] is not None)

    def _assign_target(self, node: cst.CSTNode) -> str | None:
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
                parent.targets[0].target, cst.Name):
            return parent.targets[0].target.value
        return None

    def _layer_attribute(self, original: cst.Attribute, updated: cst.Attribute
                         ) -> cst.BaseExpression | None:
        """``self.drop.p`` where ``self.drop`` is an nn.Dropout: ``self.drop.rate`` (a
        hyperparameter the JAX layer keeps under another name)."""
        inner = original.value
        if self.linen or not (isinstance(inner, cst.Attribute) and m.matches(
                inner.value, m.Name("self")) and self.current_class is not None):
            return None
        info = self.index.classes.get(self.current_class)
        torch_layer = info.attr_rule.get(inner.attr.value) if info is not None else None
        new = _LAYER_ATTRIBUTES.get(torch_layer or "", {}).get(original.attr.value)
        if new is None:
            return None
        return updated.with_changes(attr=cst.Name(new))

    def _rewrite_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = self.q(original.func) if _is_dotted(original.func) else None
        # super().__init__() in a module class
        if m.matches(original, m.Call(func=m.Attribute(value=m.Call(func=m.Name("super")),
                                                        attr=m.Name("__init__")))):
            return self._super_init(original, updated)
        if name and name in self.rules.layers:
            return self._layer(original, updated, self.rules.layers[name])
        if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") and self.linen:
            return self._linen_param(original, updated)
        if name in ("torch.nn.Buffer", "torch.nn.parameter.Buffer"):
            # self.x = nn.Buffer(t, persistent=False): as self.register_buffer("x", t)
            b = bind(updated.args, ("data", "persistent"))
            if self.linen:  # a constant computed in setup()
                return b.get("data")
            self.need("nnx")
            return call(self.emitter.buffer, arg(b.get("data")))
        if name in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            b = bind(updated.args, ("data", "requires_grad"))
            if b.literal("requires_grad") is False:
                self.diag(original, "parameter", "warning",
                          "requires_grad=False parameter: kept as a non-trainable variable")
                return call(self.emitter.buffer, arg(b.get("data")))
            return call(self.emitter.param, arg(b.get("data")))
        if name in RANDOM and self._builds_layers_here():
            # a draw while building layers (pos_embedding = torch.randn(...) in __init__):
            # from the rngs the layers are built with
            return tr.random_call(name, updated, expr("rngs.params()"))
        gen = next((a.value for a in original.args if a.keyword is not None
                    and a.keyword.value == "generator"), None)
        if name in RANDOM and isinstance(gen, cst.Name) and self.data.seeded_draw(gen.value):
            # a draw from a seeded generator: its own key, split at every draw
            if self._in_expr_scope:
                raise Untranslatable("random draw inside a lambda or comprehension: each draw "
                                     "needs its own key; make it a loop", rule="random")
            g = gen.value
            self.need("jax")
            self._pending[-1].before.append(cst.parse_statement(
                f"{g}, {g}_key = jax.random.split({g})\n"))
            kept = [a for a in updated.args if not (a.keyword is not None
                                                    and a.keyword.value == "generator")]
            if kept:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return tr.random_call(name, updated.with_changes(args=kept),
                                  cst.Name(f"{g}_key"))
        if name == "torch.stack" and self.data.host.loops:
            gathered = ha.stacked_slices(original, updated, self.data.host)
            if gathered is not None:
                self.need("np", "jnp")
                return gathered
        if name in RANDOM and id(original) in self.data.host.draws:
            # batch indices of the input pipeline: numpy, from the script's seed
            self.need("np")
            self._host_rng = True
            return tr.host_random_call(name, updated)
        if name in RANDOM:
            return tr.random_call(name, updated, self._subkey(original))
        if name in ("torch.fx.wrap", "torch._assert") and self._is_statement_call(original):
            return updated  # statements: handled in leave_Expr
        data = self._data_call(original, updated, name or "")
        if data is not None:
            return data
        if name in SEEDS or name in DROPPED_SEEDS or name in CLIPS or name in GRAD_MODES:
            return updated  # statements, with blocks and decorators: handled there
        if name and name.startswith("torch.nn.init.") and self._is_statement_call(original):
            return updated  # an initialisation statement: handled in leave_Expr
        if name in ("torch.save", "torch.load") and self._checkpoint_call(original) is not None:
            return updated  # checkpoint statements: handled in leave_Expr
        if name == "torch.save" and not self.linen and not self.for_equinox and len(
                original.args) >= 2 and isinstance(original.args[0].value, cst.Name) and (
                original.args[0].value.value in self._ckpt_dicts) and isinstance(
                self.get_metadata(ParentNodeProvider, original, None), cst.Expr):
            return updated  # a checkpoint dict: handled in leave_Expr
        if name == "isinstance" or (isinstance(original.func, cst.Name)
                                    and original.func.value == "isinstance"):
            return self._isinstance(original, updated)
        if id(original) in self.training.optimizers or id(original) in self.training.schedulers:
            return updated  # statements: handled in leave_Assign / leave_Return
        if name and id(original) in self._own_calls:
            # F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps) in a
            # subclass of nn.LayerNorm: the layer's own call
            fn = self.rules.functions[name]
            x = bind(updated.args, fn.params).get(fn.params[0])
            return call("super().__call__", arg(x))
        if name == rm.CHECKPOINT:
            return self._remat(original, updated)
        if name == rm.SEQUENTIAL:
            if self.linen:
                raise Untranslatable("checkpoint_sequential in linen code: nn.remat of each "
                                     "segment is not translated", rule=name)
            layers, segments, x = rm.sequential_args(original, updated)
            return self._in_layer_layout(original.args[0].value, lambda xs: call(
                "checkpoint_sequential", layers, segments, *xs), [x])
        if name == "torch.nn.functional.dropout":
            layer = self._dropout_layer(original, updated)
            if layer is not None:
                return layer
        if name and name in self.rules.functions:
            return self._function(original, updated, self.rules.functions[name])
        if name and name.startswith("torch."):
            raise Untranslatable(f"no rule for {name}", rule=name)
        if m.matches(original.func, m.Attribute(value=m.Name(), attr=m.Name("get_last_lr"))):
            sched = self.training.scheduler_names.get(original.func.value.value)
            if sched is not None and sched.optimizer:
                if sched.inline:
                    step = f"{lt.STATE}.step" if self.linen else f"{sched.optimizer}.step.value"
                    return expr(f"[{sched.name}({step})]")
                quote = self._string_quote()
                return expr(f"[{self._lr_slot(sched.optimizer, quote)}]")
        if isinstance(original.func, cst.Name) and (
                original.func.value in self.training.key_functions) and not any(
                    a.keyword and a.keyword.value == tr.KEY for a in updated.args):
            return updated.with_changes(args=_fix_commas(
                [*updated.args, arg(self._subkey(original), tr.KEY)]))
        if name == "functools.partial" and original.args and not self.linen:
            factory = self._partial_of_layer(original)
            if factory is not None:
                return factory
        if (m.matches(original.func, m.Attribute(attr=m.Name("normal_") | m.Name("uniform_")))
                and isinstance(original.func.value, cst.Call)
                and self.q(original.func.value.func) in _FILLED
                and self._builds_layers_here()):
            return self._random_fill(original, updated)
        if (m.matches(original.func, m.Attribute(attr=m.Name("add_module")))
                and len(original.args) == 2 and self.in_module_class()):
            added = self._add_module(original, updated)
            if added is not None:
                return added
        if (m.matches(original.func, m.Attribute(attr=m.Name("append")))
                and len(original.args) == 1 and not original.args[0].keyword
                and self._normalized_list(original.func.value)):
            return self._normalized_append(original, updated)
        if isinstance(original.func, cst.Name) and not self.linen:
            n = original.func.value
            factory = Layouts(self.rules, self, self.index).factory_rule(n)
            if (factory is not None and _activation_value(factory) is not None) or (
                    factory is None and self._fn_stack and n in self._param_names[-1]
                    and ("activation" in n or n.endswith("act_layer"))
                    and all(a.star == "**" or (a.keyword and a.keyword.value == "inplace")
                            for a in original.args)):
                # an activation class handed in (activation_layer(inplace=True)): the
                # classes passed for it are their functions
                return self._activation_factory_call(original, updated)
        if isinstance(original.func, cst.Name) and not self.linen and (
                self._layer_subclass_rule(original.func.value) is not None
                and self._takes_layer_arguments(original.func.value)):
            # LayerNorm2d(dim, eps=1e-6): built with the JAX layer's arguments
            return self._layer_arguments(original, updated,
                                         self._layer_subclass_rule(original.func.value))
        # user module classes and layer-building functions need rngs
        if self._builds_module(original, name):
            return self._with_rngs(original, updated)
        # method calls on tensors
        if isinstance(original.func, cst.Attribute):
            meth = original.func.attr.value
            rule = self.rules.methods.get(meth) or self._inplace_rule(original)
            recv = original.func.value
            if rule is not None and self._tensorlike(recv, meth, original):
                if meth in ("reshape", "view") and original.args and all(
                        a.keyword is None and a.star != "**" for a in original.args) and (
                        (meth == "reshape" and self._receiver_unsure(recv, meth))
                        or any(a.star == "*" for a in original.args)):
                    # x.reshape(*shape, -1) / x.reshape(b, -1): the same call for torch, numpy
                    # and jax arrays (jax.Array.reshape takes the sizes as arguments too);
                    # x.view(*shape) is that reshape (a dtype is never given starred)
                    return updated.with_changes(func=updated.func.with_changes(
                        attr=cst.Name("reshape")))
                if self._receiver_unsure(recv, meth):
                    raise Untranslatable(
                        f"{code(recv)}.{meth}(...): {code(recv)} is not known to be a tensor "
                        f"(other objects have a .{meth} too): left as it is",
                        rule="unknown-receiver")
                return self._method(original, updated, rule)
            if meth in ("to", "cuda", "cpu") and self._is_module_expr(recv):
                return updated.func.value
        # self.layer(x): activation layout
        return self._layout_call(original, updated)

    def _remat(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``checkpoint(fn, *args, use_reentrant=False)``: see passes/remat.py for the forms."""
        ofn, fn, args = rm.split_args(original, updated)
        transform = "nn.remat" if self.linen else "nnx.remat"
        result = self._remat_form(original, ofn, fn, args, transform)
        if transform in code(result):
            self.diag(original, rm.CHECKPOINT, "info", "torch's checkpoint runs the function "
                      "again in the backward pass, so a BatchNorm inside it folds its batch "
                      f"statistics into the running ones twice per training step; {transform} "
                      "folds them once, as torch does without the checkpoint")
        return result

    def _remat_form(self, original: cst.Call, ofn: cst.BaseExpression, fn: cst.BaseExpression,
                    args: list[cst.Arg], transform: str) -> cst.BaseExpression:
        closure = self._local_function(ofn)
        if closure is not None and findall(closure, m.Name("self")):
            if isinstance(fn, cst.Lambda):
                fn = rm.with_self_param(fn)
            else:
                self._remat_closures.setdefault(id(self._fn_stack[-1]), set()).add(ofn.value)
            return rm.remat_call(transform, fn, args, cst.Name("self"))
        if m.matches(ofn, m.Attribute(value=m.Name("self"))) and not self._is_module_expr(ofn):
            # a method (of this class or of a base class of another file)
            return rm.remat_call(transform, expr(f"type(self).{ofn.attr.value}"), args,
                                 cst.Name("self"))
        if closure is not None or (isinstance(ofn, cst.Name) and "<locals>" not in (
                self.q(ofn) or "<locals>")):
            if any(self._is_module_expr(a.value) for a in args):
                return rm.remat_call(transform, fn, args)
            self.need("jax")
            return rm.remat_call("jax.checkpoint", fn, args)
        return self._in_layer_layout(ofn, lambda xs: rm.layer_call(transform, fn, xs), args)

    def _in_layer_layout(self, layer: cst.BaseExpression, build, args: list[cst.Arg]
                         ) -> cst.BaseExpression:
        """``build(args)``, a call of ``layer`` on ``args`` that is not written as one
        (checkpointed), with the input moved channels-last and the output back where the layer
        is a channels-last one (a conv, a Sequential of them)."""
        layout = self._layout_of_callee(layer)
        if layout == "mixed":
            raise Untranslatable("checkpoints a container mixing channels-last and other layers",
                                 rule="layout")
        if layout != "channels_last" or not args:
            return build(args)
        self.need("jnp")
        moved = args[0].with_changes(value=expr("jnp.moveaxis({x}, 1, -1)", x=args[0].value))
        return expr("jnp.moveaxis({y}, -1, 1)", y=build([moved, *args[1:]]))

    def _local_function(self, fn: cst.BaseExpression) -> cst.FunctionDef | cst.Lambda | None:
        """A lambda, or a function defined in the function being rewritten and used there only
        as checkpoint's function (its definition is given a ``self`` parameter)."""
        if isinstance(fn, cst.Lambda):
            return fn
        if not isinstance(fn, cst.Name) or not self._fn_stack:
            return None
        outer = self._fn_stack[-1]
        local = next((s for s in outer.body.body if isinstance(s, cst.FunctionDef)
                      and s.name.value == fn.value), None)
        if local is None:
            return None
        for use in findall(outer.body, m.Name(fn.value)):
            parent = self.get_metadata(ParentNodeProvider, use, None)
            if parent is local:
                continue
            grand = self.get_metadata(ParentNodeProvider, parent, None)
            if not (isinstance(parent, cst.Arg) and isinstance(grand, cst.Call)
                    and grand.args[0] is parent and self.q(grand.func) == rm.CHECKPOINT):
                raise Untranslatable(f"{fn.value} is checkpointed and also used otherwise: "
                                     "nnx.remat needs it to take the module as an argument",
                                     rule=rm.CHECKPOINT)
        return local

    def _remat_closures_take_self(self, original: cst.FunctionDef,
                                  updated: cst.FunctionDef) -> cst.FunctionDef:
        """The nested defs checkpointed with the module passed in take it as ``self``."""
        names = self._remat_closures.pop(id(original), set())
        if not names:
            return updated
        body = [rm.with_self_param(s) if isinstance(s, cst.FunctionDef) and s.name.value in names
                else s for s in updated.body.body]
        return updated.with_changes(body=updated.body.with_changes(body=body))

    def _linen_param(self, original, updated):
        """self.w = nn.Parameter(t) -> self.w = self.param("w", lambda key: t)"""
        b = bind(updated.args, ("data", "requires_grad"))
        assign = self.get_metadata(ParentNodeProvider, original, None)
        target = assign.targets[0].target if isinstance(assign, cst.Assign) else None
        if not m.matches(target, m.Attribute(value=m.Name("self"))):
            raise Untranslatable("nn.Parameter not assigned to self.<name>", rule="parameter")
        if b.literal("requires_grad") is False:
            return b.get("data")  # a constant
        return expr(f'self.param("{target.attr.value}", lambda key: {{d}})', d=b.get("data"))

    def _super_init(self, original, updated):
        cls = self.current_class
        info = self.index.classes.get(cls or "")
        if not info or cls not in self.index.module_classes:
            return updated
        if info.module_base == "torch" and info.container == "sequential" and not self.linen:
            return self._sequential_super_init(original, updated)
        rule = self._layer_subclass_rule(cls)
        if rule is not None and (info.module_base == "torch"
                                 or self._takes_layer_arguments(info.module_base)):
            # super().__init__(normalized_shape, eps=eps): the JAX layer's arguments
            return self._layer_arguments(original, updated, rule, super_init=True)
        if info.module_base == "torch" and info.container and not self.linen:
            return updated  # nnx.Dict / nnx.List take torch's arguments (a mapping, a list)
        if info.module_base == "torch":
            return cst.Name("__REMOVE__")
        if self.linen:
            if updated.args:
                raise Untranslatable("super().__init__(...) with arguments: a linen subclass "
                                     "inherits its base's fields", rule="linen")
            return expr("super().setup()")
        return self._with_rngs(original, updated)

    def _sequential_super_init(self, original, updated):
        """``super().__init__(*layers)`` in a subclass of nn.Sequential: nnx.Sequential's, with
        the children in torch's order (their state_dict names "0.weight", "1.running_mean"
        are nnx's layers[0], layers[1]). The class takes and returns NCHW like any module
        class, so channels-last children get transposes around them."""
        if any(a.keyword for a in original.args):
            raise Untranslatable("nn.Sequential subclass built with keywords",
                                 rule="torch.nn.Sequential")
        if not original.args:
            try:
                children = self._sequential_children()
            except Untranslatable:
                children = []  # marked at the def (leave_FunctionDef)
            if children:
                # its children are the layers assigned to attributes below (densenet's
                # _Transition): nnx.Sequential is given them once they exist (leave_FunctionDef)
                return cst.Name("__REMOVE__")
        layouts = Layouts(self.rules, self, self.index)
        scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                 if self._fn_stack and fid == id(self._fn_stack[-1])}
        overall, items = layouts.sequential(original.args, scope)
        if overall == "mixed":
            raise Untranslatable("nn.Sequential subclass mixing channels-last layers and other "
                                 "layers in an order not known statically",
                                 rule="torch.nn.Sequential")
        args = self._ordered_dict_values(original, list(updated.args), layouts)
        if "channels_last" in items:
            args = self._insert_transposes(args, items)
        return updated.with_changes(args=_fix_commas(args))

    def _sequential_children(self) -> list[str]:
        """The attributes ``__init__`` of a Sequential subclass assigns layers to, in order:
        torch registers them as the Sequential's children, which its forward runs."""
        fn = self._fn_stack[-1] if self._fn_stack else None
        info = self.index.classes.get(self.current_class or "")
        if fn is None or fn.name.value != "__init__" or info is None:
            return []
        layers = set(info.attr_rule) | info.module_attrs
        children: list[str] = []
        for stmt in fn.body.body:
            for a in findall(stmt, m.Assign(targets=[m.AssignTarget(
                    m.Attribute(value=m.Name("self")))])):
                name = a.targets[0].target.attr.value
                if name not in layers:
                    if isinstance(a.value, cst.Call) and name not in info.tensor_attrs and not (
                            m.matches(a.value.func, m.Name()) and a.value.func.value in _BUILTINS):
                        # torch registers every Module assigned to an attribute as a child
                        raise Untranslatable(
                            f"nn.Sequential subclass: whether self.{name} is a layer (one of "
                            "its children) is not known here", rule="torch.nn.Sequential")
                    continue
                if not (isinstance(stmt, cst.SimpleStatementLine) and a in stmt.body):
                    raise Untranslatable(
                        f"nn.Sequential subclass whose layer self.{name} is assigned under a "
                        "condition or in a loop: the order of its children is not known "
                        "statically", rule="torch.nn.Sequential")
                if name not in children:
                    children.append(name)
        if children and any(findall(fn.body, m.Call(func=m.Attribute(
                value=m.Name("self"), attr=m.Name("add_module"))))):
            raise Untranslatable("nn.Sequential subclass filled both by attributes and by "
                                 "add_module", rule="torch.nn.Sequential")
        return children

    def _sequential_from_attributes(self, node: cst.FunctionDef) -> cst.FunctionDef:
        """``super().__init__(self.norm, self.relu, ...)`` at the end of the __init__ of a
        Sequential subclass whose children are attributes (torch's registration order), with
        transposes around the channels-last ones: the class takes NCHW like any module."""
        children = self._sequential_children()
        info = self.index.classes[self.current_class]
        items = [info.attr_layout.get(c, "torch") for c in children]
        if "mixed" in items:
            raise Untranslatable("nn.Sequential subclass with a child whose layout is not "
                                 "known statically", rule="torch.nn.Sequential")
        args = [arg(expr(f"self.{c}")) for c in children]
        if "channels_last" in items:
            args = self._insert_transposes(args, items)
        stmt = cst.SimpleStatementLine(body=[cst.Expr(call("super().__init__", *args))])
        stmt = wrap_long_statement(stmt, 8)
        return node.with_changes(body=node.body.with_changes(body=[*node.body.body, stmt]))

    def _ordered_dict_values(self, original: cst.Call, args: list[cst.Arg],
                             layouts: Layouts) -> list[cst.Arg]:
        """``nn.Sequential(OrderedDict(pairs))`` / ``super().__init__(layers)`` of an OrderedDict:
        nnx.Sequential takes the layers themselves, in order (their torch names become
        positions: the weight transfer maps them)."""
        if len(original.args) != 1 or ordered_dict_items(
                original.args[0], layouts.is_ordered_dict) is None:
            return args
        return [cst.Arg(expr("{d}.values()", d=args[0].value), star="*")]

    def leave_SimpleStatementLine(self, original_node, updated_node):
        body = [s for s in updated_node.body
                if not m.matches(s, m.Expr(value=m.Name("__REMOVE__")))]
        if not body:
            return cst.RemoveFromParent()
        if len(body) == 1 and m.matches(body[0], m.Assign(targets=[m.AssignTarget(m.Name())],
                                                          value=m.Lambda())) and not \
                m.matches(original_node.body[0], m.Assign(value=m.Lambda())):
            # a translation that produced a named lambda (a loss module, a schedule): def
            a = body[0]
            fn = cst.FunctionDef(
                name=a.targets[0].target, params=a.value.params,
                body=cst.IndentedBlock(body=[cst.SimpleStatementLine(
                    body=[cst.Return(value=a.value.body)])]),
                leading_lines=updated_node.leading_lines)
            return fn
        return updated_node.with_changes(body=body)

    def _builds_module(self, original: cst.Call, name: str | None) -> bool:
        func = original.func
        if isinstance(func, cst.Name):
            n = func.value
            if n in self.index.module_classes and self._no_constructor(n):
                return False  # class NewGELU(nn.Module) with only a forward: built bare
            if n in self.index.module_classes or n in self.index.rngs_functions:
                return True
            # a layer factory handed in as an argument (block(...), norm_layer(...))
            # (or held in a local: norm_layer = self._norm_layer)
            factory = n.endswith(("layer", "block", "Layer", "Block", "norm", "module"))
            if (self._rngs_scope and self._rngs_scope[-1] and self._param_names and (
                    (n in self._param_names[-1] and (n[:1].isupper() or factory
                                                     or n.endswith("act"))) or factory)):
                return True
            if not (self._rngs_scope and self._rngs_scope[-1] and self._fn_stack):
                return False
            # a parameter whose default is a module class of the file
            # (inverted_residual: Callable[..., nn.Module] = InvertedResidual), a local
            # assigned one (stem_type = SimpleStemIN), or a parameter named for one
            # (block_constructor, block_type)
            if self._param_default(n) in self.index.module_classes or (
                    n in self._module_class_locals()):
                return True
            return n in self._param_names[-1] and n.endswith(("constructor", "_type", "_cls"))
        if m.matches(func, m.Attribute(value=m.Name("self"))) and self.current_class:
            return f"{self.current_class}.{func.attr.value}" in self.index.rngs_functions
        if (isinstance(func, cst.Attribute) and not m.matches(func.value, m.Name("self"))
                and func.attr.value.endswith(("block", "Block")) and self._rngs_scope
                and self._rngs_scope[-1]):
            # a module class held by a config: block_cnf.block(block_cnf, sd_prob, norm_layer)
            return True
        return False

    def _builds_layers_here(self) -> bool:
        """Inside a function that builds layers with an ``rngs`` in scope (a module's
        __init__, a layer-building helper), outside lambdas and comprehensions."""
        return bool(self._rngs_scope and self._rngs_scope[-1] and not self._in_expr_scope
                    and not self.linen)

    def _random_fill(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``torch.empty(1, n, d).normal_(std=0.02)`` while building layers (vit's position
        embedding): a draw of that shape from ``rngs.params()``."""
        made = updated.func.value  # jnp.empty(shape, dtype=...)
        if not isinstance(made, cst.Call) or not made.args:
            raise Untranslatable("in-place random fill of a tensor built with no shape",
                                 rule="random")
        shape = made.args[0].value  # an int or a sequence: jax.random takes either
        dtype = [a for a in made.args[1:] if a.keyword and a.keyword.value == "dtype"]
        dtype_text = f", {code(dtype[0].value)}" if dtype else ""
        self.need("jax")
        if original.func.attr.value == "normal_":
            b = bind(updated.args, ("mean", "std"))
            draw = f"jax.random.normal(rngs.params(), {code(shape)}{dtype_text})"
            std, mean = b.get("std"), b.get("mean")
            if std is not None and try_literal(std, ...) != 1:
                draw = f"{code(std)} * {draw}"
            if mean is not None and try_literal(mean, ...) != 0:
                draw = f"{code(mean)} + {draw}"
            return expr(draw)
        b = bind(updated.args, ("from", "to"))
        low = b.get("from")
        high = b.get("to")
        return expr(f"jax.random.uniform(rngs.params(), {code(shape)}{dtype_text}, "
                    f"minval={code(low) if low is not None else '0.0'}, "
                    f"maxval={code(high) if high is not None else '1.0'})")

    def _add_module(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression | None:
        """``self.add_module(name, block)`` in a Sequential subclass (regnet's AnyStage), or on
        a Sequential attribute (densenet's self.features): appended to the nnx.Sequential's
        layers (the name becomes a position; the weight transfer maps it); a channels-last
        layer added to a Sequential that takes NCHW comes with transposes around it. In a
        ModuleDict subclass: ``self[name] = block`` (see leave_Expr); on a plain module:
        ``setattr(self, name, block)``."""
        recv = original.func.value
        info = self.index.classes[self.current_class]
        layer = original.args[1].value
        layout = Layouts(self.rules, self, self.index).of(layer, {})
        if m.matches(recv, m.Name("self")):
            if info.container == "sequential":
                target, seq_layout = "self.layers", "torch"
            elif info.container in (None, "module_dict"):
                return call("setattr", arg(cst.Name("self")), *updated.args)
            else:
                raise Untranslatable("add_module in a ModuleList subclass: append the layer",
                                     rule="torch.nn.ModuleList")
        elif m.matches(recv, m.Attribute(value=m.Name("self"))) and info.attr_rule.get(
                recv.attr.value) == "torch.nn.Sequential":
            target = f"self.{recv.attr.value}.layers"
            seq_layout = info.attr_layout.get(recv.attr.value, "torch")
            if seq_layout not in ("torch", "any") and layout not in ("any", seq_layout):
                raise Untranslatable(
                    "add_module of a layer in torch's layout into a Sequential built from "
                    "channels-last layers: its calls give it channels-last input",
                    rule="torch.nn.Sequential")
        else:
            return None
        if layout == "channels_last" and seq_layout == "any":
            raise Untranslatable("add_module of a channels-last layer into a Sequential: "
                                 "wrap it with transposes", rule="torch.nn.Sequential")
        if layout == "channels_last" and seq_layout == "torch":
            # the Sequential takes NCHW: the layer gets its input channels-last
            self.need("jnp")
            return expr(f"{target}.extend([\n    lambda x: jnp.moveaxis(x, 1, -1),\n"
                        "    {m},\n    lambda x: jnp.moveaxis(x, -1, 1),\n])",
                        m=updated.args[1].value)
        return expr(f"{target}.append({{m}})", m=updated.args[1].value)

    def _layer_subclass_rule(self, cls: str | None) -> Rule | None:
        """The rule of the torch layer that module class ``cls`` of this file extends
        (``class LayerNorm2d(nn.LayerNorm)``), when the class derives from the JAX layer instead
        (NNX; a rule with a ``subclass`` table and a layer class as its target)."""
        info = self.index.classes.get(cls or "")
        if info is None or info.layer_base is None or self.emitter.name != "nnx":
            return None
        rule = self.rules.layers[info.layer_base]
        target = rule.targets.get("nnx", "")
        if rule.subclass is None or not (target.startswith("nnx.") and target[4:5].isupper()):
            return None
        return rule

    def _no_constructor(self, cls: str) -> bool:
        """A module class of this file whose chain of module classes up to nn.Module defines
        no ``__init__``: its JAX class takes no rngs either."""
        seen: set[str] = set()
        while cls in self.index.classes and cls not in seen:
            seen.add(cls)
            info = self.index.classes[cls]
            if info.defines_init or info.layer_base or info.container:
                return False
            if info.module_base == "torch":
                return True
            cls = info.module_base
        return False

    def _takes_layer_arguments(self, cls: str | None) -> bool:
        """No class from ``cls`` up to the torch layer defines ``__init__``: it is built with
        the layer's own arguments."""
        seen: set[str] = set()
        while cls in self.index.classes and cls not in seen:
            seen.add(cls)
            if self.index.classes[cls].defines_init:
                return False
            cls = self.index.classes[cls].module_base
        return True

    def _layer_arguments(self, original: cst.Call, updated: cst.Call,
                         rule: Rule, super_init: bool = False) -> cst.BaseExpression:
        """A call that builds a subclass of a torch layer (``LayerNorm2d(dim, eps=1e-6)``,
        ``super().__init__(...)``): the layer rule's translation of the arguments, called on
        the subclass."""
        b = bind(updated.args, rule.params)
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown or b.star:
            raise Untranslatable(f"{rule.torch} subclass: argument(s) "
                                 f"{', '.join(unknown) or '*/**'} not translated", rule=rule.id)
        site = Site(rule=rule, args=b, target="nnx", rngs=self.rngs_expr(original),
                    defined=self.index.defined)
        if rule.special:
            out = SPECIALS[rule.special](site)
            if (isinstance(out, cst.Call) and code(out.func) == "Embedding" and super_init
                    and self.index.classes[self.current_class].module_base == "torch"):
                # class Scaled(nn.Embedding) with super().__init__(n, d, padding_idx): it
                # derives from the Embedding helper, which has the padding row
                self._padded_embedding_subclasses.add(self.current_class)
            elif isinstance(out, cst.Call) and code(out.func) == "Embedding":
                raise Untranslatable(f"{rule.torch} subclass with padding_idx: the subclass "
                                     "derives from nnx.Embed, which has no padding row",
                                     rule=rule.id)
        else:
            out = call(rule.targets["nnx"], *_rule_args(site), *site.rngs_arg())
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        self.need("nnx")
        return out.with_changes(func=updated.func)

    def _own_functional(self, node: cst.Call) -> bool:
        """``F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)`` in a
        subclass of nn.LayerNorm: the layer's functional over exactly its own attributes."""
        rule = self._layer_subclass_rule(self.current_class)
        if rule is None or self.q(node.func) != rule.subclass.functional:
            return False
        fn = self.rules.functions.get(rule.subclass.functional)
        if fn is None:
            return False
        b = bind(node.args, fn.params)
        if b.star or b.extra_positional or set(b.named) - {fn.params[0], *rule.subclass.reads}:
            return False
        reads = [b.get(r) for r in rule.subclass.reads]
        if not all(m.matches(n, m.Attribute(value=m.Name("self"), attr=m.Name(r)))
                   for n, r in zip(reads, rule.subclass.reads)):
            return False
        self._own_reads.update(id(n) for n in reads)
        return True

    def _layer_subclass_attribute(self, original: cst.Attribute,
                                  updated: cst.Attribute) -> cst.BaseExpression | None:
        """``self.weight`` / ``self.eps`` in a subclass of a torch layer: the JAX layer's names
        (``self.scale``, ``self.epsilon``); another torch attribute of it is marked."""
        if not m.matches(original.value, m.Name("self")) or id(original) in self._own_reads:
            return None
        rule = self._layer_subclass_rule(self.current_class)
        if rule is None:
            return None
        name = original.attr.value
        to = rule.subclass.attrs.get(name)
        if to is not None:
            return updated.with_changes(attr=cst.Name(to)) if to != name else None
        torch_attrs = {*rule.params, *(weight_source(k) for k in rule.weights)}
        if name in torch_attrs:
            self.diag(original, "module-subclass", "error",
                      f"self.{name} of {rule.torch} has no counterpart in "
                      f"{rule.targets['nnx']}")
        return None

    def _partial_of_layer(self, original: cst.Call) -> cst.BaseExpression | None:
        """``partial(nn.BatchNorm2d, eps=1e-3, momentum=0.01)``: a factory with torch's
        keywords in flax's terms, in the layout the file's factories have (see
        _layer_class_value)."""
        first = original.args[0]
        if isinstance(first.value, cst.Name) and not first.keyword and (
                self._layer_subclass_rule(first.value.value) is not None
                and self._takes_layer_arguments(first.value.value)):
            # partial(LayerNorm2d, eps=1e-6): the subclass takes the JAX layer's arguments
            rule = self._layer_subclass_rule(first.value.value)
            if rule.special != "layer_norm":
                raise Untranslatable(f"partial of a subclass of {rule.torch}", rule=rule.id)
            return self._partial_layer_norm(original, rule, first.value.value)
        rule = self.rules.layers.get(self.q(first.value) or "") if not first.keyword else None
        if rule is not None and _activation_value(rule) is not None and all(
                a.keyword and a.keyword.value == "inplace" for a in original.args[1:]):
            return _activation_value(rule)  # partial(nn.SiLU, inplace=True): the function
        if rule is not None and rule.special == "layer_norm":
            return self._partial_layer_norm(original, rule)
        if rule is None or rule.special != "batch_norm":
            return None
        b = bind(original.args[1:], rule.params)
        if b.extra_positional or b.star or set(b.named) - {"eps", "momentum"}:
            raise Untranslatable(f"partial({rule.torch}, ...) with arguments other than eps and "
                                 "momentum", rule=rule.id)
        batch_norm_helper(self.index.defined)
        momentum = b.get("momentum")
        m_value = try_literal(momentum, ...) if momentum is not None else 0.1
        if m_value is None:
            raise Untranslatable("BatchNorm momentum=None (cumulative moving average) has no "
                                 "flax equivalent", rule=rule.id)
        m_text = (repr(round(1 - m_value, 12)) if isinstance(m_value, (int, float))
                  else f"1 - {code(momentum)}")
        eps = b.get("eps")
        parts = [] if self.index.factory_layouts == {rule.layout} else ["axis=1"]
        parts += [f"momentum={m_text}", f"epsilon={code(eps) if eps is not None else '1e-05'}"]
        self.need("partial", "nnx")
        return expr(f"partial(BatchNorm, {', '.join(parts)})")

    def _partial_layer_norm(self, original: cst.Call, rule: Rule,
                            target: str = "nnx.LayerNorm") -> cst.BaseExpression:
        """``partial(nn.LayerNorm, eps=1e-6)`` (vit's norm_layer): called with the normalized
        size, like nnx.LayerNorm (``target``: a subclass of it)."""
        b = bind(original.args[1:], rule.params)
        if b.extra_positional or b.star or set(b.named) - {"eps", "elementwise_affine", "bias"}:
            raise Untranslatable(f"partial({rule.torch}, ...) with arguments other than eps, "
                                 "elementwise_affine and bias", rule=rule.id)
        parts = [f"epsilon={code(b.get('eps')) if b.has('eps') else '1e-05'}"]
        if b.has("elementwise_affine"):
            parts += [f"use_scale={code(b.get('elementwise_affine'))}",
                      f"use_bias={code(b.get('elementwise_affine'))}"]
        elif b.has("bias"):
            parts.append(f"use_bias={code(b.get('bias'))}")
        self.need("partial", "nnx")
        return expr(f"partial({target}, {', '.join(parts)})")

    def _activation_factory_call(self, original, updated):
        """``activation_layer(**params)`` where the parameter defaults to an activation class:
        the classes passed for it are translated to their functions, so the call is the
        parameter itself. Only torch's ``inplace`` (or ``**kwargs`` holding it) may be given."""
        for a in original.args:
            if not (a.star == "**" or (a.keyword and a.keyword.value == "inplace")):
                raise Untranslatable(
                    f"{original.func.value}(...) with arguments: the activation classes passed "
                    "for it become functions, which take no constructor arguments",
                    rule="layer-factory")
        if any(a.star == "**" for a in original.args):
            self.diag(original, "layer-factory", "info",
                      f"{original.func.value}(**...): an activation function now, its "
                      "constructor keywords (inplace) are dropped")
        return updated.func

    def _module_class_locals(self) -> set[str]:
        """Names the enclosing function assigns a module class of the file (or of another
        file of the package) to: ``stem_type = SimpleStemIN``, an item of a local list of
        them (``blocks = [BasicConv2d, InceptionA]; inception_a = blocks[1]``), or one of
        two (``attention_class = Cross if is_cross_attention else Self``)."""
        fn = self._fn_stack[-1]
        if fn in self._class_locals:
            return self._class_locals[fn]
        assigns = [(node.targets[0].target.value, node.value) for node in walk(fn.body, False)
                   if isinstance(node, cst.Assign) and len(node.targets) == 1
                   and isinstance(node.targets[0].target, cst.Name)]
        classes = self.index.module_classes
        lists = {name for name, value in assigns if isinstance(value, (cst.List, cst.Tuple))
                 and value.elements and all(isinstance(e.value, cst.Name)
                                            and e.value.value in classes for e in value.elements)}
        def a_class(value: cst.BaseExpression) -> bool:
            if isinstance(value, cst.IfExp):  # Cross if is_cross_attention else Self
                return a_class(value.body) and a_class(value.orelse)
            return (isinstance(value, cst.Name) and value.value in classes) or (
                isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name)
                and value.value.value in lists)

        found = self._class_locals[fn] = {name for name, value in assigns if a_class(value)}
        return found

    def _param_default(self, name: str) -> str | None:
        """The name a parameter of the enclosing function defaults to (``= InvertedResidual``)."""
        params = self._fn_stack[-1].params
        for p in (*params.params, *params.kwonly_params):
            if p.name.value == name and isinstance(p.default, cst.Name):
                return p.default.value
        return None

    def _with_rngs(self, original, updated: cst.Call):
        if self.linen:
            # linen modules take no RNG state; the train flag is handed down instead
            inside = self.in_module_class() or (self._rngs_scope and self._rngs_scope[-1])
            if isinstance(original.func, cst.Name) and \
                    original.func.value in self.index.module_classes:
                # a linen module is hashed (a static argument of jax.jit): list fields are
                # tuples, ResNet(BasicBlock, (1, 1))
                updated = updated.with_changes(args=[a.with_changes(value=cst.Tuple(
                    a.value.elements)) if isinstance(a.value, cst.List) and a.value.elements
                    else a for a in updated.args])
            # (a layer-building method of the module reads its field: self._make_layer(...))
            if (self.uses_train and inside and not m.matches(original.func, m.Attribute(
                    value=m.Name("self"))) and not any(
                    a.keyword and a.keyword.value == linen_target.TRAIN for a in updated.args)):
                updated = updated.with_changes(args=_fix_commas([*updated.args, arg(
                    expr(self._linen_train()), linen_target.TRAIN)]))
            if self.current_class in self._lt_dtype_classes and self.in_module_class() and \
                    isinstance(original.func, cst.Name) and \
                    original.func.value in self._lt_dtype_classes:
                updated = updated.with_changes(args=_fix_commas([*updated.args, arg(
                    expr("self.dtype"), "dtype")]))
            return updated
        if any(a.keyword and a.keyword.value == "rngs" for a in updated.args):
            return updated
        return updated.with_changes(args=_fix_commas([*updated.args,
                                                      arg(self.rngs_expr(original), "rngs")]))

    # -- layers
    def _layer(self, original, updated, rule: Rule) -> cst.BaseExpression:
        b = bind(updated.args, rule.params)
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown:
            raise Untranslatable(f"{rule.torch}: argument(s) {', '.join(unknown)} not translated",
                                 rule=rule.id)
        # linen layers are the NNX translation adapted by the linen emitter
        target = rule.targets.get("nnx" if self.linen else self.emitter.name)
        if target is None:
            raise Untranslatable(f"{rule.torch} has no {self.emitter.name} translation",
                                 rule=rule.id)
        if rule.special in ("sequential", "module_list", "module_dict"):
            out = self._container(original, updated, rule)
            return linen_target.layer(out, self._linen_train()) if self.linen else out
        if (id(original) in self.index.torch_convs and self.emitter.name == "nnx"
                and not self.linen):
            # a conv among torch-layout layers of an OrderedDict (maxvit's MBConv): the NCHW
            # helper class with torch's arguments
            if b.has("padding_mode") and try_literal(b.get("padding_mode"), ...) != "zeros":
                raise Untranslatable(f"{rule.torch} padding_mode other than 'zeros'",
                                     rule=rule.id)
            args = [a for a in updated.args if not (a.keyword and a.keyword.value in (
                "device", "dtype", "padding_mode"))]
            return call(f"Conv{spatial_dims(rule.torch)}d", *args,
                        arg(self.rngs_expr(original), "rngs"))
        # a helper class of passes/helpers.py (TransformerEncoderLayer) for this target
        helper_class = target[:1].isupper() and target in HELPERS
        emitter = "linen" if self.linen else "equinox" if self.for_equinox else \
            self.emitter.name
        if helper_class and emitter not in HELPERS[target]:
            raise Untranslatable(f"{rule.torch} has no {emitter} translation (the {target} "
                                 "helper class is NNX only)", rule=rule.id)
        needs_rngs = (target.startswith("nnx.") and target[4:5].isupper() or helper_class) \
            and not self.linen
        sequences: frozenset[str] = frozenset()
        if self.values is not None and rule.special == "conv":  # kernel_size=patch_size
            given = bind(original.args, rule.params)
            sequences = frozenset(k for k in ("kernel_size", "stride", "dilation")
                                  if isinstance(given.get(k), cst.Name) and self.values.kind(
                                      given.get(k)) in (vk.Kind.TUPLE, vk.Kind.LIST))
        site = Site(rule=rule, args=b, target="nnx" if self.linen else self.emitter.name,
                    rngs=self.rngs_expr(original) if needs_rngs else None,
                    defined=self.index.defined, per_example=self.for_equinox,
                    sequences=sequences)
        if rule.special:
            out = SPECIALS[rule.special](site)
            name = code(out.func) if isinstance(out, cst.Call) else None
            if name in HELPERS and emitter not in HELPERS[name]:  # Embedding(padding_idx=)
                raise Untranslatable(f"{rule.torch} as written has no {emitter} translation "
                                     f"(the {name} helper class is NNX only)", rule=rule.id)
            if site.per_example and rule.special == "upsample":
                self.per_example_code.add(code(out))
        else:
            args = _rule_args(site)
            if needs_rngs:
                out = call(target, *args, *site.rngs_arg())
            elif self.linen and target.startswith("nnx.") and target[4:5].isupper():
                out = call(target, *args)  # a layer class, adapted below
            elif args:
                out = call("partial", arg(expr(target)), *args)
            else:
                out = expr(target)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        if self.torch_init and isinstance(out, cst.Call):
            out, why = torch_init.initialised(rule, b, out)
            if why is not None:
                self.diag(original, rule.id, "warning", f"--init torch: {why}; the layer "
                          "keeps the JAX library's initialisation")
        if self.linen:
            self.need("linen")
            out = linen_target.pooling(linen_target.layer(out, self._linen_train()))
            inits = self._lt_inits.get(self.current_class or "", {}).get(rule.torch)
            if inits:
                out = lt.with_initializers(out, inits)
            if self.current_class in self._lt_dtype_classes:
                out = lt.with_dtype(out)
        return out

    def _linen_train(self) -> str:
        """Inside a module: its field; inside a layer-building helper: its argument."""
        return f"self.{linen_target.TRAIN}" if self.in_module_class() else linen_target.TRAIN

    def _container(self, original, updated, rule: Rule):
        if rule.special == "sequential":
            layouts = Layouts(self.rules, self, self.index)
            scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                     if self._fn_stack and fid == id(self._fn_stack[-1])}
            overall, items = layouts.sequential(original.args, scope)
            if overall == "mixed":
                raise Untranslatable("nn.Sequential mixing channels-last layers (conv, pooling, "
                                     "norm) and other layers in an order not known statically",
                                     rule=rule.id)
            named = len(original.args) == 1 and ordered_dict_items(
                original.args[0], layouts.is_ordered_dict) is not None and not self.linen
            args = self._ordered_dict_values(original, list(updated.args), layouts)
            parent = self.get_metadata(ParentNodeProvider, original, None)
            returned_list = isinstance(parent, cst.Return) and any(
                a.star == "*" for a in original.args)
            if overall == "channels_last" and (returned_list or isinstance(
                    parent, cst.Assign) and isinstance(parent.targets[0].target, cst.Name)):
                # a Sequential kept in a local (downsample = nn.Sequential(conv, bn)) or returned
                # from a list (vgg's make_layers) and handed on: nothing tracks its layout there,
                # so it takes and returns NCHW itself
                overall = "torch"
            info = self.index.classes.get(self.current_class or "")
            if (info is not None and isinstance(parent, cst.Assign) and m.matches(
                    parent.targets[0].target, m.Attribute(value=m.Name("self")))
                    and parent.targets[0].target.attr.value in info.normalized_seqs):
                # built channels-last, given torch-layout layers by add_module later
                # (densenet's features): it takes NCHW, transposed around its first layers
                overall = "torch"
            if overall == "torch" and "channels_last" in items:
                args = self._insert_transposes(args, items)
            elif named:
                # nn.Sequential(OrderedDict(...)): the layers in order, and by their names
                # (self.heads.head)
                return call("NamedSequential", arg(updated.args[0].value))
            return call(rule.targets["nnx" if self.linen else self.emitter.name], *args)
        if rule.special == "module_list":
            if not updated.args:
                return call(rule.targets["nnx" if self.linen else self.emitter.name], arg(expr("[]")))
            return call(rule.targets["nnx" if self.linen else self.emitter.name], arg(updated.args[0].value))
        # ModuleDict; iterated in the class (for, items(), values()): in insertion order
        parent = self.get_metadata(ParentNodeProvider, original, None)
        info = self.index.classes.get(self.current_class or "")
        if (not self.linen and info is not None and isinstance(parent, cst.Assign)
                and m.matches(parent.targets[0].target, m.Attribute(value=m.Name("self")))
                and parent.targets[0].target.attr.value in info.iterated):
            return call("LayerDict", *updated.args)
        if not updated.args:
            return call(rule.targets["nnx" if self.linen else self.emitter.name])
        return call(rule.targets["nnx" if self.linen else self.emitter.name], *updated.args)

    def _insert_transposes(self, args: list[cst.Arg], items: list[str]) -> list[cst.Arg]:
        out: list[cst.Arg] = []
        state = "torch"
        for a, lay in zip(args, items):
            if lay == "channels_last" and state == "torch":
                out.append(arg(expr("lambda x: jnp.moveaxis(x, 1, -1)")))
                state = "channels_last"
            elif lay == "torch" and state == "channels_last":
                out.append(arg(expr("lambda x: jnp.moveaxis(x, -1, 1)")))
                state = "torch"
            out.append(a)
        if state == "channels_last":
            out.append(arg(expr("lambda x: jnp.moveaxis(x, -1, 1)")))
        self.need("jnp")
        return out

    # -- functions and methods
    def _function(self, original, updated, rule: Rule) -> cst.BaseExpression:
        b = bind(updated.args, rule.params)
        site = Site(rule=rule, args=b, unpack=self._unpack.get(id(original)),
                    target=self.emitter.name, defined=self.index.defined,
                    optional=self._optional_args(original, rule))
        binder = self._binder(original)
        if binder is not None:
            site.bind, site.before = binder
        return self._apply(original, site, receiver_first=False)

    def _binder(self, original: cst.Call):
        """Site.bind for a call in a simple statement, outside lambdas and comprehensions:
        ``name = expression`` goes before the statement."""
        if self._in_expr_scope or not self._pending:
            return None
        node = original
        while node is not None and not isinstance(node, cst.SimpleStatementLine):
            if isinstance(node, (cst.BaseCompoundStatement, cst.Lambda, cst.BaseComp)):
                return None
            node = self.get_metadata(ParentNodeProvider, node, None)
        if node is None:
            return None
        pending = self._pending[-1]

        def bind(value: cst.BaseExpression, hint: str) -> cst.Name:
            name = hint
            n = 1
            while name in self._file_names:
                n += 1
                name = f"{hint}{n}"
            self._file_names.add(name)
            pending.before.append(cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.Name(name))], value=value)]))
            return cst.Name(name)
        return bind, pending.before.append

    def _optional_args(self, original: cst.Call, rule: Rule) -> frozenset[str]:
        """The arguments of ``original`` that may hold None at run time (value analysis)."""
        if self.values is None or rule.special != "functional_layer_norm":
            return frozenset()
        given = bind(original.args, rule.params)
        return frozenset(name for name in ("weight", "bias") if given.get(name) is not None
                         and self.values.may_be_none(given.get(name)))

    def _method(self, original, updated, rule: Rule) -> cst.BaseExpression:
        b = bind(updated.args, rule.params)
        dtypes: frozenset[str] = frozenset()
        if rule.special in ("to", "type_cast") and self.values is not None:  # x.to(y.dtype)
            given = bind(original.args, rule.params)
            dtypes = frozenset(k for k in ("device", "dtype") if given.get(k) is not None
                               and self.values.is_dtype(given.get(k)))
        site = Site(rule=rule, args=b, receiver=updated.func.value,
                    unpack=self._unpack.get(id(original)), target=self.emitter.name,
                    dtypes=dtypes)
        binder = self._binder(original)
        if binder is not None:
            site.bind, site.before = binder
        return self._apply(original, site, receiver_first=True)

    def _apply(self, original, site: Site, receiver_first: bool) -> cst.BaseExpression:
        rule = site.rule
        b = site.args
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown:
            raise Untranslatable(f"{rule.torch}: argument(s) {', '.join(unknown)} not "
                                 "translated", rule=rule.id)
        if b.star:
            raise Untranslatable(f"{rule.torch} called with *args/**kwargs", rule=rule.id)
        if rule.special:
            out = SPECIALS[rule.special](site)
            if self.linen and rule.special == "pool_function":
                self.need("linen")  # nn.max_pool / nn.avg_pool
        else:
            out = self._generic(site, receiver_first)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        if rule.layout == "any" or (rule.special is None and rule.jax and rule.jax.startswith(
                "jax.nn.")):
            out = _push_out_layout(out)
        return out

    def _generic(self, site: Site, receiver_first: bool) -> cst.BaseExpression:
        rule = site.rule
        args = _rule_args(site)
        jax = rule.jax or ""
        if receiver_first:
            if jax.startswith("."):
                return call(expr("{x}" + jax, x=site.receiver), *args)
            return call(jax, arg(site.receiver), *args)
        if jax.startswith("."):
            first, *rest = args
            return call(expr("{x}" + jax, x=first.value), *rest)
        return call(jax, *args)

    # ------------------------------------------------------------------ layout
    def _layout_of_callee(self, func: cst.BaseExpression) -> str | None:
        if isinstance(func, cst.Call):
            # a layer built and called on the spot: nn.MaxPool2d(3)(x)
            rule = self.rules.layers.get(self.q(func.func) or "")
            return rule.layout if rule is not None else None
        if isinstance(func, cst.Name) and not (self._loop_layouts
                                               and func.value in self._loop_layouts[-1]):
            layout = self._name_layout(func.value)
            if layout is not None:
                return layout
        if self.current_class is None:
            return None
        info = self.index.classes.get(self.current_class)
        if info is None:
            return None
        if m.matches(func, m.Attribute(value=m.Name("self"))):
            return info.attr_layout.get(func.attr.value)
        if isinstance(func, cst.Subscript) and m.matches(func.value,
                                                         m.Attribute(value=m.Name("self"))):
            return info.elem_layout.get(func.value.attr.value)
        if isinstance(func, cst.Name) and self._loop_layouts:
            return self._loop_layouts[-1].get(func.value)
        return None

    def _name_layout(self, name: str) -> str | None:
        """The layout of the layer ``name`` holds when it was bound to one by a plain
        assignment in this function or at module level (``pool = nn.MaxPool2d(2)``), when
        that layout is not torch's; None otherwise (a parameter or another local shadows a
        module-level layer)."""
        layouts = self.index.name_layouts
        layout = None
        if self._fn_stack:
            fn = self._fn_stack[-1]
            layout = layouts.get((id(fn), name))
            if layout is None and name not in self._local_names(fn):
                layout = layouts.get((0, name))
        else:
            layout = layouts.get((0, name))
        return layout if layout in ("channels_last", "mixed") else None

    def _local_names(self, fn: cst.FunctionDef) -> set[str]:
        names = self._locals_cache.get(id(fn))
        if names is None:
            names = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params,
                                            *fn.params.posonly_params)}
            names |= set(tr.names_of(fn.body).assigned)
            self._locals_cache[id(fn)] = names
        return names

    def _layout_call(self, original, updated: cst.Call):
        func = original.func
        if m.matches(func, m.Attribute(value=m.Name("self"))) and self.in_module_class():
            info = self.index.classes[self.current_class]
            rule = self.rules.layers.get(info.attr_rule.get(func.attr.value, ""))
            if rule is not None and rule.call:
                return self._rule_call(original, updated, rule,
                                       info.attr_ctor[func.attr.value])
            table = info.tied_heads.get(func.attr.value)
            if table is not None:
                parts = table.split(".")
                if self.linen and len(parts) == 3 and info.attr_rule.get(parts[1]) == \
                        "torch.nn.ModuleDict":
                    table = f'self.{parts[1]}["{parts[2]}"]'
                return updated.with_changes(func=expr(table + ".attend"))
            if func.attr.value in info.batch_stats_only and not self.linen and not any(
                    a.keyword and a.keyword.value == "use_running_average" for a in updated.args):
                # torch's BatchNorm(track_running_stats=False) normalises with the batch
                # statistics in eval mode too; model.eval() must not switch it
                updated = updated.with_changes(args=_fix_commas(
                    [*updated.args, arg(expr("False"), "use_running_average")]))
        layout = self._layout_of_callee(original.func)
        if layout == "mixed":
            if self.for_equinox:  # (every equinox layer takes torch's channel-first layout)
                return updated
            raise Untranslatable("calls a container mixing channels-last and other layers",
                                 rule="layout")
        if layout not in ("channels_last", "any") or not updated.args:
            return updated
        first = updated.args[0]
        if layout == "any":
            return _push_out_layout(updated)
        self.need("jnp")
        inner = first.value
        cl = inner.args[0].value if m.matches(inner, _FROM_CL) else expr(
            "jnp.moveaxis({x}, 1, -1)", x=inner)
        new = _call_partial(updated.with_changes(args=[first.with_changes(value=cl),
                                                       *updated.args[1:]]))
        return expr("jnp.moveaxis({y}, -1, 1)", y=new)

    def _rule_call(self, original, updated: cst.Call, rule: Rule, ctor: cst.Call):
        """``self.attn(q, k, v)`` of a layer whose rule has a ``call`` transform."""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        unpack = index = None
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
                parent.targets[0].target, (cst.Tuple, cst.List)):
            unpack = tuple(code(e.value) for e in parent.targets[0].target.elements)
        elif (isinstance(parent, cst.Subscript) and parent.value is original
              and len(parent.slice) == 1 and isinstance(parent.slice[0].slice, cst.Index)):
            index = int_value(parent.slice[0].slice.value)
        site = CallSite(rule=rule, func=updated.func, ctor=bind(ctor.args, rule.params),
                        args=bind(updated.args, rule.call_params), unpack=unpack, index=index,
                        target="linen" if self.linen else "nnx")
        out = CALLS[rule.call](site)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        self._note_imports(out)
        return out

    # ------------------------------------------------------------------ tensor detection
    def _is_module_expr(self, node: cst.BaseExpression) -> bool:
        """``model`` / ``self`` / ``self.encoder``: things that are modules, not tensors."""
        if m.matches(node, m.Name("self")):
            return True
        if m.matches(node, m.Attribute(value=m.Name("self"))) and self.current_class:
            info = self.index.classes.get(self.current_class)
            return bool(info and node.attr.value in info.attr_layout
                        and node.attr.value not in info.tensor_attrs)
        if isinstance(node, cst.Name) and node.value in ("model", "net", "module"):
            return True
        # Net().to(device), self.transformer.h[0], a model passed to a function
        return self.values is not None and self.values.kind(node) == vk.Kind.MODULE

    def _receiver_unsure(self, recv: cst.BaseExpression, meth: str) -> bool:
        """``recv.meth(...)`` where the value analysis cannot see what ``recv`` is and
        ``meth`` is also a method of other objects (``run.log``): marked, not rewritten."""
        return (self.values is not None and meth in vk.SHARED_METHODS
                and self.values.kind(recv) == vk.Kind.UNKNOWN)

    def _array_target(self, base: cst.BaseExpression) -> str:
        """``base[i] = v``: "array" (rebind it with .at[i].set(v)), "python" (a dict, list,
        optimizer.param_groups item, numpy array...: stays as it is) or "unsure"."""
        if self.values is None:
            return "array"
        kind = self.values.kind(base)
        if kind in vk.NON_TENSOR:
            return "python"
        return "unsure" if kind == vk.Kind.UNKNOWN else "array"

    def _tensorlike(self, recv: cst.BaseExpression, meth: str | None = None,
                    call_node: cst.Call | None = None) -> bool:
        if isinstance(recv, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString,
                             cst.Dict, cst.List, cst.Tuple, cst.Integer, cst.Float)):
            return False
        if self.values is not None:
            kind = self.values.kind(recv)
            if kind == vk.Kind.TENSOR:
                return True
            if kind in vk.NON_TENSOR:
                return False  # wandb.log(...), config.get(...), model.to(...)
            rule = self.rules.methods.get(meth or "")
            if call_node is not None and rule is not None and not rule.special and len(
                    [a for a in call_node.args if a.keyword is None and not a.star]) > len(
                    rule.params):
                return False  # more arguments than the tensor method takes: run.log(k, v)
        if self._is_module_expr(recv):
            return False
        q = self.q(recv)
        if q == "builtins.None" and not isinstance(recv, cst.Name):
            q = None  # (a - b).permute(1, 2, 0): libcst names the call of a parenthesised sum so
        if q and not q.startswith("torch") and "." in q and "<locals>" not in q \
                and not q.startswith("self."):
            # an imported module or object: os.path, np, math
            return False
        if q in ("math", "np", "numpy", "os", "random", "re", "json", "sys"):
            return False
        if meth in AMBIGUOUS_METHODS and call_node is not None:
            for a in call_node.args:
                if isinstance(a.value, (cst.SimpleString, cst.FormattedString)):
                    return False
            if meth == "split" and not call_node.args:
                return False
        return True


_LIST_ANNOTATION = re.compile(r"^(typing\.)?(list|List|MutableSequence)(\[.*\])?$")


def _python_list(fn: cst.FunctionDef, name: str) -> bool:
    """``name`` is a Python list throughout ``fn``: a parameter annotated ``list[...]`` /
    ``List[...]``, or a local, every assignment of which is a list display, a list
    comprehension, ``list(...)`` or a copy of such a list (``shift_size = shift_size.copy()``),
    so ``name[i] = v`` stays an item assignment."""
    param = next((p for p in (*fn.params.params, *fn.params.kwonly_params)
                  if p.name.value == name), None)
    listy = param is not None and param.annotation is not None and bool(
        _LIST_ANNOTATION.match(code(param.annotation.annotation)))
    if param is not None and not listy:
        return False
    values = [a.value for a in findall(fn.body, m.Assign(targets=[m.AssignTarget(
        target=m.Name(name))]))]
    if any(findall(fn.body, m.AnnAssign(target=m.Name(name)) | m.AugAssign(
            target=m.Name(name)))):
        return False
    made = [isinstance(v, (cst.List, cst.ListComp)) or m.matches(v, m.Call(func=m.Name("list")))
            for v in values]
    copies = [m.matches(v, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("copy")),
                                  args=[])) for v in values]
    return (listy or any(made)) and all(a or b for a, b in zip(made, copies))


def _push_out_layout(node: cst.BaseExpression) -> cst.BaseExpression:
    """f(jnp.moveaxis(E, -1, 1), ...) -> jnp.moveaxis(f(E, ...), -1, 1) for elementwise f."""
    if isinstance(node, cst.Call) and node.args and m.matches(node.args[0].value, _FROM_CL):
        inner = node.args[0].value.args[0].value
        new = node.with_changes(args=[node.args[0].with_changes(value=inner), *node.args[1:]])
        return expr("jnp.moveaxis({y}, -1, 1)", y=new)
    return node


def _rule_args(site: Site) -> list[cst.Arg]:
    """A rule's plain translation of the bound arguments: torch's positional order is kept
    until the first renamed or dropped parameter; from there on arguments are keywords."""
    rule = site.rule
    args: list[cst.Arg] = []
    keyword_mode = False
    for p in rule.params:
        if p == "*" or p in rule.drop:
            keyword_mode = True
            continue
        v = site.args.named.get(p)
        if v is None:
            keyword_mode = keyword_mode or p in rule.rename
            continue
        if p in rule.rename or keyword_mode or p in site.args.keywords:
            args.append(arg(v, rule.rename.get(p, p)))
            keyword_mode = True
        else:
            args.append(arg(v))
    args.extend(arg(v) for v in site.args.extra_positional)
    for k, v in rule.emit.items():
        args.append(arg(expr(repr(v)), k))
    return args


# torch.nn.Module methods a subclass overrides to adapt state_dict loading / saving
_BUILTINS = {"float", "int", "bool", "str", "tuple", "list", "dict", "set", "len", "max", "min",
             "abs", "round", "sum", "range"}
_OVERLOADS = {"torch.jit._overload_method", "torch.jit._overload"}
_STATE_DICT_HOOKS = {"_load_from_state_dict", "_save_to_state_dict",
                     "_upgrade_state_dict_named", "load_state_dict", "state_dict"}

# tensors made only to be filled in place: torch.empty(...).normal_(std=0.02)
_FILLED = {"torch.empty", "torch.zeros", "torch.ones", "torch.Tensor", "torch.FloatTensor"}

# a torch conv layer's constructor attributes on nnx.Conv (kernel_size keeps its name)
_CONV_ATTRS = {"in_channels": "in_features", "out_channels": "out_features",
               "groups": "feature_group_count"}


def _isinstance_of(test: cst.BaseExpression, subject: str) -> list[cst.BaseExpression] | None:
    """The classes ``test`` requires ``subject`` to be one of: ``isinstance(<subject>, ...)``
    itself, one operand of an ``and``, or an ``or`` of such checks (``isinstance(m, nn.Conv2d)
    or isinstance(m, nn.Linear)``); None when it does not narrow ``subject``."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _isinstance_of(test.left, subject) or _isinstance_of(test.right, subject)
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        left, right = _isinstance_of(test.left, subject), _isinstance_of(test.right, subject)
        return left + right if left is not None and right is not None else None
    if (m.matches(test, m.Call(func=m.Name("isinstance"), args=[m.Arg(), m.Arg()]))
            and code(test.args[0].value) == subject):
        kinds = test.args[1].value
        return [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
    return None


def _activation_value(rule: Rule) -> cst.BaseExpression | None:
    """A parameterless activation class (nn.ReLU, nn.Hardswish) as a value: its function."""
    if rule.layout != "any" or rule.weights or rule.special not in (None, "gelu_module"):
        return None
    target = rule.targets.get("nnx", "")
    if not target.startswith("jax.nn."):
        return None
    if rule.special == "gelu_module":  # torch's default is the exact erf form
        return expr(f"partial({target}, approximate=False)")
    return expr(target)


def _is_dotted_text(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text))


def _is_dotted(node: cst.BaseExpression) -> bool:
    """``a.b.c``: a name, not a method of some computed value (``torch.tril(x).view``)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _fix_commas(items: list):
    out = []
    for i, item in enumerate(items):
        if i < len(items) - 1:
            out.append(item.with_changes(comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            out.append(item.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return out


def _is_docstring(stmt) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())]))


def _call_name(node: cst.Call) -> str:
    f = node.func
    if isinstance(f, cst.Attribute):
        return f".{f.attr.value}"
    if isinstance(f, cst.Name):
        return f.value
    return "call"


# hyperparameters of torch layers that the NNX layer keeps under another name
_LAYER_ATTRIBUTES = {f"torch.nn.{d}": {"p": "rate"} for d in (
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout")}

_FINAL = {"torch.jit.Final", "torch.jit.annotations.Final"}
_ANNOTATION_TYPES = {"torch.device": "jax.Device", "torch.dtype": "jnp.dtype",
                     "torch.Size": "tuple[int, ...]"}


def _call_partial(node):
    """``partial(f, k=v)(x)`` (a layer built and called on the spot) -> ``f(x, k=v)``."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Call)
            and m.matches(node.func.func, m.Name("partial")) and node.func.args
            and all(a.keyword is not None for a in node.func.args[1:])
            and all(a.keyword is None and not a.star for a in node.args)):
        return node
    return node.with_changes(func=node.func.args[0].value, args=_fix_commas(
        [*node.args, *node.func.args[1:]]))


# names a train step may read besides its parameters and the file's top-level names: the
# imports the translation adds
_KERNEL_CHOICES = {"fused", "foreach", "capturable"}  # torch optimizer kernel choices
# inspect.signature(torch.optim.AdamW): the optax optimizer's signature (no `fused`)
_SIGNATURE_OPTIMIZERS = {"torch.optim.AdamW": "optax.adamw", "torch.optim.Adam": "optax.adam",
                         "torch.optim.SGD": "optax.sgd", "torch.optim.RMSprop": "optax.rmsprop",
                         "torch.optim.Adagrad": "optax.adagrad"}
ACC_GRADS, ACC_MICRO = "grads", "micro_grads"  # gradient accumulation (_micro_step_loop)
STEP_GLOBALS = {"jax", "jnp", "nnx", "optax", "partial", "np", "functools", "math", "grain",
                "ocp", "os"}


def _module_names(module: cst.Module) -> set[str]:
    """The names a module binds at its top level (imports, functions, classes, assignments)."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        for imp in findall(stmt, m.Import() | m.ImportFrom()) if isinstance(
                stmt, cst.SimpleStatementLine) else ():
            if isinstance(imp.names, cst.ImportStar):
                continue
            for alias in imp.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(code(bound).split(".")[0])
        for t in findall(stmt, m.AssignTarget()) if isinstance(
                stmt, cst.SimpleStatementLine) else ():
            names.update(n.value for n in findall(t, m.Name()))
    return names


def _after(pre: list, blank: list) -> list:
    """The leading lines of a loop placed after ``pre``: blank lines after a function
    definition (the functional step defined after its split), none otherwise."""
    return list(blank) if pre and isinstance(pre[-1], cst.FunctionDef) else []


def _free_names(fn: cst.FunctionDef) -> set[str]:
    """Names ``fn`` reads that nothing in it binds (nor Python's builtins)."""
    wrapper = cst.metadata.MetadataWrapper(cst.Module(body=[fn]))
    scopes = wrapper.resolve(cst.metadata.ScopeProvider)
    free: set[str] = set()
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            if not access.referents and isinstance(access.node, cst.Name):
                free.add(access.node.value)
    return free - {fn.name.value}


def _insert_before_functions(body: list, items: list[tuple[str, cst.BaseStatement]]) -> list:
    """Each statement put before the top-level function of its name, two blank lines apart."""
    blank = [cst.EmptyLine(indent=False)] * 2
    for fn_name, stmt in items:
        at = next((i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef)
                   and s.name.value == fn_name), None)
        if at is None:
            continue
        body[at:at] = [stmt.with_changes(leading_lines=body[at].leading_lines or blank)]
        body[at + 1] = body[at + 1].with_changes(leading_lines=blank)
    return body


def _factory_dict(node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """``{"device": device, "dtype": dtype}`` (either key or both, nothing else): torch's
    factory keyword arguments gathered to be passed on as ``**dd``."""
    if not isinstance(node, cst.Dict) or not node.elements:
        return None
    out = {}
    for e in node.elements:
        if not isinstance(e, cst.DictElement) or not isinstance(e.key, cst.SimpleString):
            return None
        key = e.key.evaluated_value
        if key not in ("device", "dtype"):
            return None
        out[key] = e.value
    return out


def _is_device_expr(node: cst.BaseExpression, t: TorchToJax) -> bool:
    if isinstance(node, cst.Call) and (t.q(node.func) or "").startswith("torch.device"):
        return True
    if isinstance(node, cst.Attribute) and node.attr.value == "device":
        return True
    if isinstance(node, cst.IfExp):  # "cuda" if ... else "cpu"
        return all(_is_device_expr(branch, t) or _device_string(branch)
                   for branch in (node.body, node.orelse))
    return False


def _device_string(node: cst.BaseExpression) -> bool:
    """A string literal naming a torch device: "cuda", "cuda:1", "cpu", "mps"."""
    value = try_literal(node, ...)
    return isinstance(value, str) and value.split(":")[0] in ("cuda", "cpu", "mps", "xpu")
