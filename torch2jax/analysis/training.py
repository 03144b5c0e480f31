"""What the training-code rewrite needs to know before changing anything.

Training code is about relations between statements that may be far apart: the optimizer
that a scheduler wraps, the loop where ``scheduler.step()`` is called (per update or per
epoch), the gradient clipping that happens between ``backward()`` and ``step()``, the helper
function that seeds the global RNG, the functions that draw random numbers and so need a key.
This visitor collects those relations on the original tree; :mod:`torch2jax.passes.training`
uses them while rewriting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from torch2jax.analysis.index import qualified
from torch2jax.analysis.torch_api import FILLED_NEW, RANDOM, SEEDS
from torch2jax.analysis.walk import NoAttributeHooks, findall

OPTIM = "torch.optim."
SCHED = "torch.optim.lr_scheduler."
DROPPED_SEEDS = {"torch.cuda.manual_seed", "torch.cuda.manual_seed_all",
                 "torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode"}
CLIPS = {"torch.nn.utils.clip_grad_norm_": "norm", "torch.nn.utils.clip_grad_value_": "value",
         "torch.nn.utils.clip_grad.clip_grad_norm_": "norm",
         "torch.nn.utils.clip_grad.clip_grad_value_": "value"}


def _every_k(test: cst.BaseExpression) -> cst.BaseExpression | None:
    """``(i + 1) % k == 0`` -> ``k``."""
    if (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and m.matches(test.comparisons[0].comparator, m.Integer("0"))
            and isinstance(test.left, cst.BinaryOperation)
            and isinstance(test.left.operator, cst.Modulo)
            and m.matches(test.left.left, m.BinaryOperation(operator=m.Add(),
                                                             right=m.Integer("1")))):
        return test.left.right
    return None


def _attribute_chain(node) -> list[str] | None:
    """``model.body.fc`` -> ["model", "body", "fc"]; None for anything but names and
    attributes."""
    out: list[str] = []
    while isinstance(node, cst.Attribute):
        out.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    return [node.value, *reversed(out)]


def _is_print(line: cst.CSTNode) -> bool:
    return m.matches(line, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Name("print")))]))


def is_optimizer(q: str | None) -> bool:
    return bool(q) and q.startswith(OPTIM) and not q.startswith(SCHED) and (
        q.rsplit(".", 1)[-1][:1].isupper())


def is_scheduler(q: str | None) -> bool:
    return bool(q) and q.startswith(SCHED) and q.rsplit(".", 1)[-1][:1].isupper()


@dataclass
class OptimizerSite:
    call: cst.Call
    qualname: str
    statement: cst.CSTNode  # the Assign or Return holding the call
    name: str | None  # variable it is assigned to ("optimizer"); None for ``return ...``
    scope: int  # id of the enclosing FunctionDef (0: module level)
    function: str | None  # enclosing function name (``configure_optimizers``)
    model: str | None  # the model the params come from ("model", "self")
    clip: tuple[str, cst.BaseExpression] | None = None  # ("norm", max_norm)
    # why the loop's clipping cannot be a step of the optimizer's chain (a condition that
    # changes from step to step): the optimizer's line is marked with it
    clip_refused: str | None = None
    scheduler: SchedulerSite | None = None
    aliases: set[str] = field(default_factory=set)  # names holding it in other scopes
    groups: list[ParamGroup] | None = None  # parameter groups, when recognised
    groups_problem: str | None = None  # why the parameter groups were not recognised
    accumulate: cst.BaseExpression | None = None  # steps every k backward() calls
    returned: bool = False  # returned by its function (configure_optimizers)
    lr_set: bool = False  # its param_groups' lr set by hand (analysis/accumulate.py)
    external: bool = False  # built in another file (model.configure_optimizers())
    # the models whose parameters it holds together (Adam(list(encoder.parameters()) +
    # list(decoder.parameters()))): ``model`` is the first of them
    group: tuple[str, ...] | None = None


@dataclass
class ParamGroup:
    predicate: cst.BaseExpression | None  # on the parameter ``p``; None: every parameter
    param: str  # the name the predicate uses for the parameter
    options: dict[str, cst.BaseExpression]  # the group's own lr, weight_decay, ...
    name: str | None = None  # the variable holding the group's parameter list
    # the torch names selecting the group (minGPT: [param_dict[pn] for pn in sorted(decay)],
    # param_dict being {pn: p for pn, p in self.named_parameters()}): the set expression
    names: cst.BaseExpression | None = None
    # the group's parameters by their place in the model, as torch names relative to it:
    # ``model.body.parameters()`` -> ("body.",) (a prefix), ``[model.w, model.head.bias]`` ->
    # ("w", "head.bias") (exact names); ``root`` is the model they are read from
    paths: tuple[str, ...] | None = None
    root: str | None = None
    # the name the predicate gives the parameter's torch name, in a comprehension over
    # ``named_parameters()`` (the no-decay lists of transformers' scripts:
    # ``[p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)]``)
    name_param: str | None = None


@dataclass
class SchedulerSite:
    call: cst.Call
    qualname: str
    statement: cst.Assign
    name: str
    optimizer: str | None  # the optimizer variable it wraps
    scope: int
    step_loops: list[int | None] = field(default_factory=list)
    per_update: bool = False  # stepped in the loop that steps the optimizer
    inline: bool = False  # decided by the rewrite: folded into the optimizer's tx
    part: bool = False  # one of the schedulers a SequentialLR combines


@dataclass
class TrainingIndex:
    optimizers: dict[int, OptimizerSite] = field(default_factory=dict)  # call id ->
    schedulers: dict[int, SchedulerSite] = field(default_factory=dict)  # call id ->
    statements: dict[int, object] = field(default_factory=dict)  # statement id -> site
    optimizer_names: dict[str, OptimizerSite] = field(default_factory=dict)
    alias_models: dict[str, str] = field(default_factory=dict)  # optimizer var -> model var
    alias_groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # -> model vars
    scheduler_names: dict[str, SchedulerSite] = field(default_factory=dict)
    seed_functions: set[str] = field(default_factory=set)  # def set_seed(...): manual_seed
    key_functions: set[str] = field(default_factory=set)  # draw random numbers: take a key
    # names bound once to an instance of a plain class of the file (its methods that draw
    # are in key_functions as Class.method, and take a key as the file's functions do)
    instances: dict[str, str] = field(default_factory=dict)
    # classes with a random draw in a method other than __init__ (a VAE's reparameterisation):
    # NNX modules keep an nnx.Rngs of their own for it
    method_draws: set[str] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)  # statements with no JAX counterpart
    # removed statement -> id of the optimizer site whose translation they are part of: kept
    # when that translation fails
    removed_for: dict[int, int] = field(default_factory=dict)
    # removed parameter-group statements that can be put back translated when a kept line
    # (the print of the group sizes) reads them: line id -> the group whose list the line
    # builds (``decay_params = [...]``, written from the target's parameter leaves), or None
    # for a line computed from those lists only (``n = sum(p.numel() for p in decay_params)``,
    # put back as the rewrite translated it)
    group_lines: dict[int, ParamGroup | None] = field(default_factory=dict)
    # the prints that report parameter groups (kept) -> id of their optimizer site
    group_prints: dict[int, int] = field(default_factory=dict)
    self_keyed: set[str] = field(default_factory=set)  # functions that make their own key
    model_vars: set[str] = field(default_factory=set)  # names assigned a model instance

    def model_of(self, optimizer: str) -> str | None:
        """The variable holding the model whose parameters ``optimizer`` updates."""
        if optimizer in self.alias_models:
            return self.alias_models[optimizer]
        site = self.optimizer_names.get(optimizer)
        return site.model if site is not None and site.model != "self" else None

    def group_of(self, optimizer: str) -> tuple[str, ...] | None:
        """The variables holding the models whose parameters ``optimizer`` updates together
        (OptimizerSite.group, through the names a function receives them by), or None."""
        if optimizer in self.alias_groups:
            return self.alias_groups[optimizer]
        site = self.optimizer_names.get(optimizer)
        return None if site is None or optimizer in self.alias_models else site.group


class TrainingIndexer(NoAttributeHooks, cst.CSTVisitor):
    METADATA_DEPENDENCIES = (ScopeProvider,)

    def __init__(self, model_classes: set[str], rngs_functions: set[str],
                 own_key_draws: set[int] | frozenset[int] = frozenset(),
                 step_keys: bool = False, imported_seeds: frozenset[str] = frozenset(),
                 keys_in_apply: bool = False) -> None:
        super().__init__()
        # a module method's draws take their key from apply's rngs (linen), so the functions
        # that train or call a model of such a class take a key (a VAE's train and test)
        self.keys_in_apply = keys_in_apply
        self._backward_fns: set[str] = set()
        self.index = TrainingIndex()
        # seeding functions imported from other files of the repository (repo.py)
        self.imported_seeds = imported_seeds
        # linen with dropout: a function that runs a train step draws the dropout keys, so it
        # takes a key like one that draws random numbers (def train(args, state, ..., *, key))
        self.step_keys = step_keys
        self.model_classes = model_classes
        self.rngs_functions = rngs_functions
        # draws from a seeded torch.Generator, which keep their own key (passes/data.py)
        self.own_key_draws = own_key_draws
        self._fns: list[cst.FunctionDef] = []
        self._classes: list[str] = []
        self._loops: list[int] = []
        self._step_calls: list[tuple[str, int | None, int]] = []  # (receiver, loop, scope)
        self._ifs: list[tuple[cst.If, int | None]] = []  # enclosing ifs (and their loop)
        self._loop_nodes: list[cst.For | cst.While] = []  # enclosing loops
        self._accumulate: dict[str, cst.BaseExpression] = {}  # optimizer var -> every k
        # (kind, limit, loop, the models whose parameters it clips where named)
        self._clips: list[tuple[str, cst.BaseExpression | str, int | None,
                                tuple[str, ...] | None]] = []
        self._returns_optimizer: dict[str, OptimizerSite] = {}
        self._opt_from_fn: list[tuple[str, str, str | None]] = []  # (var, function, receiver)
        self._opt_from_fn_at: dict[str, tuple[cst.Assign, int]] = {}  # var -> (statement, scope)
        self._calls_in_fn: dict[str, set[str]] = {}
        self._draws: dict[str, bool] = {}
        # names bound once in the file to an instance of one of its plain classes (whose
        # methods draw with a key they are given, like the file's functions)
        self._instances: dict[str, str] = {}
        # (caller, receiver, method) of obj.method(...) calls, resolved once the file is read
        self._method_calls: list[tuple[str, str, str]] = []
        self._plain_classes: set[str] = set()
        self._bound: dict[str, int] = {}
        self._seeds_in: set[str] = set()
        self._returns_value: set[str] = set()
        self._assigns: dict[tuple[int, str], cst.BaseExpression] = {}
        self._lines: dict[int, list[cst.SimpleStatementLine]] = {}
        # module-level functions' parameters, and the names each call of a function passes
        # (by position and keyword; None where an argument is not a plain name)
        self._params: dict[str, list[str]] = {}
        self._fn_nodes: dict[str, list[cst.FunctionDef]] = {}
        self._named_calls: list[tuple[str, list[str | None], dict[str, str | None]]] = []

    # -- scopes
    @property
    def scope(self) -> int:
        return id(self._fns[-1]) if self._fns else 0

    @property
    def fn_name(self) -> str | None:
        return self._fns[-1].name.value if self._fns else None

    @property
    def plain_method(self) -> str | None:
        """``Class.method`` of the enclosing method of a plain (not a module) class."""
        if self._fns and self._classes and self._classes[-1] not in self.model_classes and (
                self._fns[-1].name.value != "__init__"):
            return f"{self._classes[-1]}.{self._fns[-1].name.value}"
        return None

    def instance_class(self, recv: str, caller: str | None) -> str | None:
        """The plain class whose instance ``recv`` is: ``self`` in one of its methods
        (``caller`` is ``Class.method``), or a name the file binds once, to ``Class(...)``."""
        if recv == "self":
            cls = caller.split(".", 1)[0] if caller and "." in caller else None
        else:
            cls = self._instances.get(recv) if self._bound.get(recv) == 1 else None
        return cls if cls in self._plain_classes else None

    @property
    def free_fn(self) -> str | None:
        """The enclosing function when it is a plain (not a method) function."""
        return self._fns[-1].name.value if self._fns and not self._classes else None

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)
        if node.name.value not in self.model_classes:
            self._plain_classes.add(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._fns.append(node)
        self._fn_nodes.setdefault(node.name.value, []).append(node)
        if not self._classes:
            self._calls_in_fn.setdefault(node.name.value, set())
            if len(self._fns) == 1:
                self._params[node.name.value] = [
                    p.name.value for p in (*node.params.posonly_params, *node.params.params,
                                           *node.params.kwonly_params)]

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._fns.pop()

    def visit_For(self, node: cst.For) -> None:
        for n in findall(node.target, m.Name()):  # (a loop rebinds: not one instance)
            self._bound[n.value] = self._bound.get(n.value, 0) + 2
        self._loops.append(id(node))
        self._loop_nodes.append(node)

    def leave_For(self, node: cst.For) -> None:
        self._loops.pop()
        self._loop_nodes.pop()

    def visit_While(self, node: cst.While) -> None:
        self._loops.append(id(node))
        self._loop_nodes.append(node)

    def leave_While(self, node: cst.While) -> None:
        self._loops.pop()
        self._loop_nodes.pop()

    def _guarded_limit(self, clip: cst.Call) -> cst.BaseExpression | str:
        """The clipping limit of ``clip``, as a step of the optimizer's chain: under ``if c:``
        in its loop (nanoGPT's ``if grad_clip != 0.0:``) it is ``limit if c else inf``, as
        clipping to an infinite norm or value leaves the gradients as they are. A condition
        the loop may change (it reads a name the loop assigns, or calls something) is the
        reason the clipping cannot be folded (a string)."""
        limit = clip.args[1].value
        loop = self._loops[-1] if self._loops else None
        # (an `if` that also steps the optimizer, `if (i + 1) % k == 0: clip; step()`, clips
        # exactly when the optimizer's chain runs: no condition to add)
        guards = [(n, any(c is clip for c in findall(n.body, m.Call())))
                  for n, at in self._ifs if at == loop and not findall(
                      n, m.Call(func=m.Attribute(attr=m.Name("step"))))]
        if not guards:
            return limit
        assigned = _assigned_names(self._loop_nodes[-1]) if self._loop_nodes else set()
        tests = []
        for node, in_body in guards:
            names = {n.value for n in findall(node.test, m.Name())}
            text = cst.Module([]).code_for_node(node.test)
            if findall(node.test, m.Call()) or names & assigned:
                return (f"clipping under `if {text}:`, a condition the loop may change from "
                        "step to step: the optimizer's chain would clip every step")
            tests.append(text if in_body else f"not ({text})")
        cond = " and ".join(f"({t})" if len(tests) > 1 else t for t in tests)
        return cst.IfExp(test=cst.parse_expression(cond), body=limit,
                         orelse=cst.parse_expression("float('inf')"))

    def visit_If(self, node: cst.If) -> None:
        self._ifs.append((node, self._loops[-1] if self._loops else None))

    def leave_If(self, node: cst.If) -> None:
        self._ifs.pop()

    def visit_SimpleStatementLine(self, node) -> None:
        self._lines.setdefault(self.scope, []).append(node)
        if len(node.body) == 1 and isinstance(node.body[0], cst.Assign):
            a = node.body[0]
            if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name):
                self._assigns[(self.scope, a.targets[0].target.value)] = a.value

    # -- what is seen
    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                self._bound[t.target.value] = self._bound.get(t.target.value, 0) + 1
        if len(node.targets) != 1 or not isinstance(node.value, cst.Call):
            return
        target = node.targets[0].target
        name = target.value if isinstance(target, cst.Name) else None
        if name and isinstance(node.value.func, cst.Name):
            self._instances[name] = node.value.func.value
        q = qualified(self, node.value.func)
        if name and self._builds_model(node.value):
            self.index.model_vars.add(name)
        if is_optimizer(q) and name:
            self._add_optimizer(node.value, q, node, name)
        elif is_scheduler(q) and name:
            first = node.value.args[0].value if node.value.args else None
            site = SchedulerSite(call=node.value, qualname=q, statement=node, name=name,
                                 optimizer=first.value if isinstance(first, cst.Name) else None,
                                 scope=self.scope)
            self.index.schedulers[id(node.value)] = site
            self.index.statements[id(node)] = site
            self.index.scheduler_names[name] = site
        elif name and m.matches(node.value.func, m.Attribute(attr=m.Name())):
            # optimizer = model.configure_optimizers(...)
            recv = node.value.func.value
            self._opt_from_fn.append((name, node.value.func.attr.value,
                                      recv.value if isinstance(recv, cst.Name) else None))
            self._opt_from_fn_at[name] = (node, self.scope)
        elif name and isinstance(node.value.func, cst.Name):
            # optimizer = make_optimizer(model, lr): a function of the file returning one
            self._opt_from_fn.append((name, node.value.func.value, None))
            self._opt_from_fn_at[name] = (node, self.scope)

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None and self.free_fn:
            self._returns_value.add(self.free_fn)
        if isinstance(node.value, cst.Call):
            q = qualified(self, node.value.func)
            if is_optimizer(q):
                site = self._add_optimizer(node.value, q, node, None)
                site.returned = True
                if self.fn_name:
                    self._returns_optimizer[self.fn_name] = site
        elif isinstance(node.value, cst.Name) and self.fn_name:
            site = self.index.optimizer_names.get(node.value.value)
            if site is not None and site.scope == self.scope:
                site.returned = True
                self._returns_optimizer[self.fn_name] = site

    def _add_optimizer(self, call: cst.Call, q: str, stmt, name: str | None) -> OptimizerSite:
        params = call.args[0].value if call.args else None
        model, group = None, None
        if m.matches(params, m.Call(func=m.Attribute(attr=m.Name("parameters")))):
            owner = params.func.value
            model = owner.value if isinstance(owner, cst.Name) else None
        elif (group := parameters_of_models(params)) is not None:
            model = group[0]
        elif self._fns and params is not None:
            model = "self" if self._in_method() else None
        site = OptimizerSite(call=call, qualname=q, statement=stmt, name=name, scope=self.scope,
                             function=self.fn_name, model=model, group=group)
        self.index.optimizers[id(call)] = site
        self.index.statements[id(stmt)] = site
        if name:
            self.index.optimizer_names[name] = site
        return site

    def _in_method(self) -> bool:
        fn = self._fns[-1]
        return bool(fn.params.params) and fn.params.params[0].name.value == "self"

    def _fills_new(self, node: cst.Call) -> bool:
        """``torch.empty_like(x).uniform_(a, b)``: a draw into a tensor made on the spot."""
        return (m.matches(node.func, m.Attribute(attr=m.Name("uniform_") | m.Name("normal_")))
                and isinstance(node.func.value, cst.Call)
                and qualified(self, node.func.value.func) in FILLED_NEW)

    def visit_Call(self, node: cst.Call) -> None:
        q = qualified(self, node.func)
        fn = self.free_fn
        if q in SEEDS and fn:
            self._seeds_in.add(fn)
        if fn and m.matches(node.func, m.Attribute(attr=m.Name("backward"))):
            self._backward_fns.add(fn)
            if self.step_keys:
                self._draws[fn] = True
        if ((q in RANDOM or self._fills_new(node)) and self._classes and self._fns
                and self._fns[-1].name.value != "__init__"
                and self._classes[-1] in self.model_classes):  # (a plain class's: its own)
            self.index.method_draws.add(self._classes[-1])
        if (q in RANDOM and id(node) not in self.own_key_draws
                or (self._builds_model(node) and not self._classes)) and fn:
            self._draws[fn] = True
        if isinstance(node.func, cst.Name) and fn:
            self._calls_in_fn[fn].add(node.func.value)
        if isinstance(node.func, cst.Name):
            name_of = (lambda a: a.value.value if isinstance(a.value, cst.Name) else None)
            self._named_calls.append((
                node.func.value, [name_of(a) for a in node.args if a.keyword is None and not a.star],
                {a.keyword.value: name_of(a) for a in node.args if a.keyword is not None}
                if not any(a.star for a in node.args) else {"*": None}))
        method = self.plain_method
        if method is not None:  # a plain class's method: its draws and calls, by name
            if q in RANDOM and id(node) not in self.own_key_draws:
                self._draws[method] = True
            if isinstance(node.func, cst.Name):
                self._calls_in_fn.setdefault(method, set()).add(node.func.value)
        if m.matches(node.func, m.Attribute(value=m.Name(), attr=m.Name())):
            self._method_calls.append((fn or method or "", node.func.value.value,
                                       node.func.attr.value))
        if q in CLIPS and len(node.args) >= 2:
            self._clips.append((CLIPS[q], self._guarded_limit(node),
                                self._loops[-1] if self._loops else None,
                                parameters_of_models(node.args[0].value) or (
                                    (node.args[0].value.func.value.value,) if m.matches(
                                        node.args[0].value, m.Call(func=m.Attribute(
                                            value=m.Name(), attr=m.Name("parameters"))))
                                    else None)))
        if m.matches(node.func, m.Attribute(value=m.Name(), attr=m.Name("step"))):
            loop = self._loops[-1] if self._loops else None
            # optimizer.step(), or scaler.step(optimizer) (a GradScaler steps the optimizer
            # it is handed; names that are not optimizers are dropped where they are read)
            stepped = [node.func.value.value, *(
                [node.args[0].value.value] if len(node.args) == 1 and m.matches(
                    node.args[0], m.Arg(value=m.Name(), keyword=None)) else [])]
            for recv in stepped:
                self._step_calls.append((recv, loop, self.scope))
            # gradient accumulation: `if (i + 1) % k == 0: optimizer.step()` in the loop
            if self._ifs and self._ifs[-1][1] == loop and loop is not None:
                k = _every_k(self._ifs[-1][0].test)
                if k is not None:
                    for recv in stepped:
                        self._accumulate[recv] = k

    def _builds_model(self, node: cst.Call) -> bool:
        """``Model(...)``, or moved on the way: ``Model(...).to(device)``, ``.cuda()``."""
        while m.matches(node, m.Call(func=m.Attribute(value=m.Call(), attr=m.Name(
                m.MatchIfTrue(lambda a: a in ("to", "cuda", "cpu", "float", "double")))))):
            node = node.func.value
        return isinstance(node.func, cst.Name) and node.func.value in self.model_classes

    # -- conclusions
    def finish(self) -> TrainingIndex:
        idx = self.index
        # optimizers returned by a function (configure_optimizers) and assigned elsewhere
        for var, fn, receiver in self._opt_from_fn:
            site = self._returns_optimizer.get(fn)
            if site is None and fn == "configure_optimizers" and receiver and (
                    var not in idx.optimizer_names):
                # the model's configure_optimizers of another file of the package (a
                # minGPT-style Trainer): converted there; here only its updates are stepped
                stmt, scope = self._opt_from_fn_at[var]
                idx.optimizer_names[var] = OptimizerSite(
                    call=stmt.value, qualname="", statement=stmt, name=var, scope=scope,
                    function=None, model=receiver, external=True)
                idx.alias_models[var] = receiver
                continue
            if site is not None:
                site.aliases.add(var)
                idx.optimizer_names.setdefault(var, site)
                if receiver:
                    idx.alias_models[var] = receiver
        self._passed_optimizers()
        # where each optimizer and scheduler is stepped
        opt_loops: dict[int, set[int | None]] = {}
        for recv, loop, _scope in self._step_calls:
            site = idx.optimizer_names.get(recv)
            if site is not None:
                opt_loops.setdefault(id(site), set()).add(loop)
        for recv, loop, _scope in self._step_calls:
            sched = idx.scheduler_names.get(recv)
            if sched is not None:
                sched.step_loops.append(loop)
        for var, k in self._accumulate.items():
            site = idx.optimizer_names.get(var)
            if site is not None:
                site.accumulate = k
        # schedulers combined by another one (SequentialLR's list) are its parts
        parts = {n.value for site in idx.schedulers.values()
                 for a in site.call.args[1:] for n in findall(a.value, m.Name())}
        for sched in idx.schedulers.values():
            if sched.name in parts:
                sched.part = True
                continue
            opt = idx.optimizer_names.get(sched.optimizer or "")
            if opt is None:
                continue
            opt.scheduler = sched
            loops = opt_loops.get(id(opt), set())
            sched.per_update = bool(sched.step_loops) and all(
                loop is not None and loop in loops for loop in sched.step_loops)
        # clipping belongs to the optimizer stepped in the same loop (of the models it names,
        # where two are)
        clipped: dict[int, list[tuple[str, ...] | None]] = {}
        for kind, value, loop, owners in self._clips:
            sites = [site for site in idx.optimizers.values()
                     if loop in opt_loops.get(id(site), set()) or len(idx.optimizers) == 1]
            named = [site for site in sites if owners is not None
                     and set(owners) <= self._models_of(site)]
            for site in (named or sites)[:1]:
                clipped.setdefault(id(site), []).append(owners)
                if isinstance(value, str):
                    site.clip_refused = value
                else:
                    site.clip = (kind, value)
                if site.group is not None and (len(clipped[id(site)]) > 1 or owners is None
                                               or set(owners) != self._models_of(site)):
                    site.clip_refused = ("the gradients of some of the models the optimizer "
                                         "holds clipped apart (one norm per model), which one "
                                         "clipping of the optimizer's chain is not")
                elif len(clipped[id(site)]) > 1:
                    site.clip_refused = "two clippings before one step"
        # seeding helpers (seed and return nothing: they will return the key), and functions
        # that need a key (fixpoint over the call graph)
        # calls of plain classes' methods (obj bound once, to an instance of such a class)
        unresolved, called = set(), set()
        for caller, recv, meth in self._method_calls:
            cls = self.instance_class(recv, caller)
            if cls is None:
                unresolved.add(meth)
            else:
                called.add(f"{cls}.{meth}")
                if caller:
                    self._calls_in_fn.setdefault(caller, set()).add(f"{cls}.{meth}")
        # a method takes a key only where every call gives one: called by name on a known
        # receiver, never on another (a Dataset's __getitem__, called by indexing, keeps its
        # own translation: passes/host_data.py); otherwise its draws stay marked
        blocked = {f for f in self._calls_in_fn.keys() | self._draws.keys()
                   if "." in f and (f not in called or f.split(".", 1)[1] in unresolved)}
        draws = {f for f, v in self._draws.items() if v and f not in blocked}
        if self.keys_in_apply and idx.method_draws:
            draws |= {f for f, callees in self._calls_in_fn.items()
                      if f in self._backward_fns or callees & idx.model_vars}
        # a seeding helper seeds and draws nothing, itself or through the functions it calls
        # (`def main(): torch.manual_seed(0); model = build_model()` makes its own key)
        helpers = {f for f in self._seeds_in if f not in self._returns_value and f not in draws}
        changed = True
        while changed:
            changed = False
            for f, callees in self._calls_in_fn.items():
                if f in draws or f in blocked:
                    continue
                if callees & (draws - helpers):
                    draws.add(f)
                    changed = True
        idx.seed_functions = {f for f in helpers if f not in draws} | self.imported_seeds
        # a function that seeds (or calls a seeding helper) makes its own key
        self_keyed = {f for f, callees in self._calls_in_fn.items()
                      if f in self._seeds_in or callees & idx.seed_functions}
        idx.self_keyed = self_keyed
        idx.key_functions = draws - self_keyed - self.rngs_functions
        idx.instances = {n: c for n, c in self._instances.items()
                         if self.instance_class(n, None) is not None}
        for site in idx.optimizers.values():
            self._param_groups(site)
        return idx

    def _given(self, fn: str, param: str) -> set[str | None]:
        """The names the file's calls of ``fn`` pass for its parameter ``param`` (None for an
        argument that is not a plain name, or a call that passes ``*args`` / ``**kwargs``)."""
        params = self._params[fn]
        index = params.index(param)
        given: set[str | None] = set()
        for name, positional, keywords in self._named_calls:
            if name != fn:
                continue
            if "*" in keywords:
                given.add(None)
            elif index < len(positional):
                given.add(positional[index])
            elif param in keywords:
                given.add(keywords[param])
        return given

    def _passed_optimizers(self) -> None:
        """A module-level function's parameter stepped as an optimizer (``opt.step()`` in
        ``train_one_epoch(model, loader, opt)``) that every call of the function gives the
        same optimizer variable: the parameter is that optimizer, and its model is the
        parameter every call gives the optimizer's model (or the model itself, read as a
        global). A parameter stepped that every call gives the same scheduler is that
        scheduler (``sched.step()`` in ``run_epoch(net, dl, opt, sched)``)."""
        idx = self.index
        for recv, _loop, scope in self._step_calls:
            fn = next((f for f in self._params if scope and any(
                id(n) == scope for n in self._fn_nodes.get(f, ()))), None)
            if fn is None or recv in idx.optimizer_names or recv not in self._params[fn]:
                continue
            given = self._given(fn, recv)
            if len(given) != 1 or None in given:
                continue
            sched = idx.scheduler_names.get(next(iter(given)) or "")
            if sched is not None and recv not in idx.scheduler_names:
                # (a scheduler handed in the same way: run_epoch(..., optimizer, scheduler))
                idx.scheduler_names[recv] = sched
                continue
            site = idx.optimizer_names.get(next(iter(given)) or "")
            model = idx.model_of(next(iter(given)) or "") if site is not None else None
            if site is not None and model is None and site.model is None:
                # (parameter groups, read later: the model whose parameters they list)
                model = self._groups_owner(site)
            if site is None or model is None:
                continue
            holders = [p for p in self._params[fn] if self._given(fn, p) == {model}]
            if len(holders) != 1 and model in self._params[fn]:
                continue  # (the model's name is another value in the function)
            members = None
            if site.group is not None:  # each model by the name the function receives it by
                members = tuple(self._received(fn, name) for name in site.group)
                if None in members:
                    continue
            site.aliases.add(recv)
            idx.optimizer_names[recv] = site
            idx.alias_models[recv] = holders[0] if len(holders) == 1 else model
            if members is not None:
                idx.alias_groups[recv] = members  # type: ignore[assignment]

    def _models_of(self, site: OptimizerSite) -> set[str]:
        """The names the models of ``site`` go by, where it is built and where it is
        received."""
        idx = self.index
        names = set(site.group or ()) | ({site.model} if site.model else set())
        for alias in site.aliases:
            names |= set(idx.alias_groups.get(alias, ()))
            if alias in idx.alias_models:
                names.add(idx.alias_models[alias])
        return names

    def _received(self, fn: str, name: str) -> str | None:
        """The parameter of ``fn`` every call gives ``name`` (``name`` itself when ``fn`` has
        no parameter of that name and reads it as a global), or None."""
        holders = [p for p in self._params[fn] if self._given(fn, p) == {name}]
        if len(holders) == 1:
            return holders[0]
        return name if not holders and name not in self._params[fn] else None

    # -- parameter groups (nanoGPT's configure_optimizers)
    def _groups_owner(self, site: OptimizerSite) -> str | None:
        """The one model whose parameters the lines of the optimizer's scope list
        (``model.named_parameters()`` in a script's groups), or None."""
        owners = {c.func.value.value for line in self._lines.get(site.scope, [])
                  for c in findall(line, m.Call(func=m.Attribute(
                      value=m.Name(), attr=m.Name("parameters") | m.Name(
                          "named_parameters")), args=[]))}
        return owners.pop() if len(owners) == 1 else None

    def _param_groups(self, site: OptimizerSite) -> None:
        params = site.call.args[0].value if site.call.args else None
        if m.matches(params, m.Call(func=m.Attribute(value=m.Attribute(),
                                                     attr=m.Name("parameters")), args=[])):
            # a submodule's parameters (fine-tuning a new head: SGD(model.fc.parameters()))
            # are one group of the model's: torch never updates the others
            group = self._selection(site.scope, params, {})
            if group is not None and group.root is not None and site.model is None and not (
                    group.paths[0].startswith("module.")):  # (DataParallel's: the model's)
                site.groups, site.model = [group], group.root
            return
        if params is None or site.group is not None or m.matches(params, m.Call(
                func=m.Attribute(attr=m.Name("parameters")))):
            return
        value = params
        if isinstance(params, cst.Name):
            value = self._assigns.get((site.scope, params.value))
        if not isinstance(value, cst.List) or not all(
                isinstance(e.value, cst.Dict) for e in value.elements):
            site.groups_problem = "parameters given as something other than model.parameters() "\
                "or a list of parameter-group dicts"
            return
        groups = []
        selections: list[cst.BaseExpression] = []
        for e in value.elements:
            options: dict[str, cst.BaseExpression] = {}
            selected = None
            for el in e.value.elements:
                if not isinstance(el, cst.DictElement) or not isinstance(el.key,
                                                                         cst.SimpleString):
                    site.groups_problem = "a parameter group with computed keys"
                    return
                k = el.key.evaluated_value
                if k == "params":
                    selected = el.value
                else:
                    options[k] = el.value
            group = self._selection(site.scope, selected, options)
            if group is not None and isinstance(selected, cst.Name):
                group.name = selected.value
            if group is None:
                site.groups_problem = ("a parameter group whose parameters are not selected by "
                                       "a comprehension over the model's parameters with a "
                                       "condition on the parameter")
                return
            groups.append(group)
            selections.append(selected)
        roots = {g.root for g in groups if g.root is not None}
        if len(roots) > 1:
            site.groups_problem = "parameter groups read from different models"
            return
        site.groups = groups
        if site.model is None and roots:
            site.model = roots.pop()
        if site.model is None:  # a script's groups: the model whose parameters they list
            site.model = self._groups_owner(site)
        needed = self._group_inputs(site, selections)
        # the list of group dicts given to the optimizer, where it lists the parameters itself
        listed = {params.value} if isinstance(params, cst.Name) else set()
        # the statements that only computed the groups have no counterpart in JAX
        tainted: set[str] = set()
        lists = {g.name: g for g in groups if g.name is not None}
        derived: set[str] = set()  # names computed from the group lists only
        for line in self._lines.get(site.scope, []):
            if line is self._line_of(site.statement):
                continue
            text = cst.Module([]).code_for_node(line)
            names = {n.value for n in findall(line, m.Name())}
            if (names & tainted) and _is_print(line):
                # reports the groups: kept, with what it reads (finish/removed.py)
                self.index.group_prints[id(line)] = id(site)
                continue
            bound = [a.target.value for a in findall(line, m.AssignTarget(target=m.Name()))]
            # a line reading the parameters is a group's when it binds what a group reads (a
            # parameter count printed, or a copy of the weights, stays and is translated)
            if ("named_parameters" in text or ".parameters()" in text) and set(
                    bound) & (needed | listed) or names & tainted:
                self.index.removed.add(id(line))
                self.index.removed_for[id(line)] = id(site)
                if len(bound) == 1 and bound[0] in lists and len(line.body) == 1:
                    self.index.group_lines[id(line)] = lists[bound[0]]
                elif bound and ".parameters()" not in text and "named_parameters" not in text \
                        and not names & (tainted - set(lists) - derived):
                    self.index.group_lines[id(line)] = None
                    derived.update(bound)
                tainted.update(bound)

    def _group_inputs(self, site: OptimizerSite, selections) -> set[str]:
        """The names the groups' parameter selections read, closed over the lines of the
        optimizer's scope that bind them (the model itself excluded)."""
        model = {site.model or "model", "self"}
        needed = {n.value for sel in selections if sel is not None
                  for n in findall(sel, m.Name())} - model
        lines = self._lines.get(site.scope, [])
        changed = True
        while changed:
            changed = False
            for line in lines:
                bound = {a.target.value for a in findall(line, m.AssignTarget(
                    target=m.Name()))}
                if bound & needed:
                    new = {n.value for n in findall(line, m.Name())} - model - needed
                    if new:
                        needed |= new
                        changed = True
        return needed

    def _line_of(self, stmt: cst.CSTNode) -> cst.CSTNode | None:
        for lines in self._lines.values():
            for line in lines:
                if any(s is stmt for s in line.body):
                    return line
        return None

    def _selection(self, scope: int, node, options) -> ParamGroup | None:
        if isinstance(node, cst.Name):
            node = self._assigns.get((scope, node.value))
        if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("parameters")), args=[])):
            chain = _attribute_chain(node.func.value)
            if chain is None:
                return None  # (model.blocks[0].parameters(): not translated yet)
            if len(chain) == 1:  # the model's: every parameter
                return ParamGroup(predicate=None, param="p", options=options)
            return ParamGroup(predicate=None, param="p", options=options,
                              paths=(".".join(chain[1:]) + ".",), root=chain[0])
        if isinstance(node, (cst.List, cst.Tuple)) and node.elements:
            chains = [_attribute_chain(e.value) if isinstance(e, cst.Element) else None
                      for e in node.elements]
            if all(c is not None and len(c) > 1 for c in chains) and len(
                    {c[0] for c in chains}) == 1:  # [model.w, model.head.bias]
                return ParamGroup(predicate=None, param="p", options=options, paths=tuple(
                    ".".join(c[1:]) for c in chains), root=chains[0][0])
            return None
        named = self._named_selection(scope, node, options)
        if named is not None:
            return named
        if not isinstance(node, cst.ListComp) or not isinstance(node.elt, cst.Name):
            return None
        comp = node.for_in
        if comp.inner_for_in is not None or len(comp.ifs) > 1:
            return None
        p = node.elt.value
        if m.matches(comp, m.CompFor(target=m.Tuple(elements=[m.Element(value=m.Name()),
                                                              m.Element(value=m.Name(p))]),
                                     iter=m.Call(func=m.Attribute(
                                         attr=m.Name("named_parameters")), args=[]))):
            n = comp.target.elements[0].value.value
            if n == p:
                return None
            cond = comp.ifs[0].test if comp.ifs else None
            return ParamGroup(predicate=cond, param=p, options=options,
                              name_param=n if cond is not None else None)
        target_names = {n.value for n in findall(comp.target, m.Name())}
        if p not in target_names:
            return None
        if not comp.ifs:
            return ParamGroup(predicate=None, param=p, options=options)
        cond = comp.ifs[0].test
        used = {n.value for n in findall(cond, m.Name())}
        if used & (target_names - {p}):
            return None  # a condition on the parameter's name: not supported (yet)
        return ParamGroup(predicate=cond, param=p, options=options)

    def _named_selection(self, scope: int, node, options) -> ParamGroup | None:
        """``[param_dict[pn] for pn in sorted(names)]`` (also ``in names``, ``list(names)``)
        where ``param_dict = {pn: p for pn, p in <model>.named_parameters()}``: the group of
        the parameters whose torch names are in ``names``."""
        if not m.matches(node, m.ListComp(elt=m.Subscript(value=m.Name()), for_in=m.CompFor(
                target=m.Name(), ifs=[], inner_for_in=None))):
            return None
        index = node.elt.slice
        pn = node.for_in.target.value
        if len(index) != 1 or not m.matches(index[0], m.SubscriptElement(
                slice=m.Index(value=m.Name(pn)))):
            return None
        table = self._assigns.get((scope, node.elt.value.value))
        if not m.matches(table, m.DictComp(key=m.Name(), value=m.Name(), for_in=m.CompFor(
                target=m.Tuple(elements=[m.Element(value=m.Name()), m.Element(value=m.Name())]),
                iter=m.Call(func=m.Attribute(attr=m.Name("named_parameters")), args=[]),
                ifs=[], inner_for_in=None))):
            return None
        key, value = (e.value.value for e in table.for_in.target.elements)
        if (table.key.value, table.value.value) != (key, value):
            return None
        names = node.for_in.iter
        while m.matches(names, m.Call(func=m.Name("sorted") | m.Name("list"), args=[m.Arg(
                keyword=None, star="")])):
            names = names.args[0].value  # sorted(list(decay))
        if not isinstance(names, cst.Name):
            return None
        return ParamGroup(predicate=None, param=pn, options=options, names=names)


def parameters_of_models(params: cst.BaseExpression | None) -> tuple[str, ...] | None:
    """The models whose parameters an optimizer's first argument joins, in order:
    ``list(a.parameters()) + list(b.parameters())``, ``[*a.parameters(), *b.parameters()]``,
    ``itertools.chain(a.parameters(), b.parameters())``; None for anything else (two or more
    distinct models named by plain names)."""

    def owner(node: cst.BaseExpression) -> str | None:
        if m.matches(node, m.Call(func=m.Name("list"), args=[m.Arg(keyword=None, star="")])):
            node = node.args[0].value
        if m.matches(node, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters")),
                                  args=[])):
            return node.func.value.value
        return None

    parts: list[cst.BaseExpression] = []
    if isinstance(params, cst.BinaryOperation) and isinstance(params.operator, cst.Add):
        todo: list[cst.BaseExpression] = [params]
        while todo:
            node = todo.pop()
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                todo += [node.right, node.left]
            else:
                parts.append(node)
    elif isinstance(params, cst.List) and all(isinstance(e, cst.StarredElement)
                                              for e in params.elements):
        parts = [e.value for e in params.elements]
    elif m.matches(params, m.Call(func=m.Name("chain") | m.Attribute(
            value=m.Name("itertools"), attr=m.Name("chain")))) and all(
            not a.star and a.keyword is None for a in params.args):
        parts = [a.value for a in params.args]
    names = [owner(part) for part in parts]
    if len(names) < 2 or None in names or len(set(names)) != len(names):
        return None
    return tuple(names)  # type: ignore[arg-type]


def _assigned_names(node: cst.CSTNode) -> set[str]:
    """The names ``node`` binds anywhere in it: assignment, augmented and annotated
    assignment, walrus and loop targets."""
    out: set[str] = set()
    for target in [*findall(node, m.AssignTarget()), *findall(node, m.AugAssign()),
                   *findall(node, m.AnnAssign()), *findall(node, m.NamedExpr()),
                   *findall(node, m.For()), *findall(node, m.CompFor())]:
        t = target.target
        out |= {n.value for n in findall(t, m.Name())} if not isinstance(t, cst.Name) else {
            t.value}
    return out
