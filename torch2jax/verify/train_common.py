"""What the training trajectories of the three target sides share: the train spec, the torch
side's training mode, optimizer, scheduler, loss and step, their optax translation, and the
result. It imports no target side; :func:`torch2jax.verify.sides.check_trajectory` runs the
loop.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torch2jax.ruleset import RuleSet
from torch2jax.verify.common import (
    DROP_PATH_CLASSES,
    VerifyError,
    VerifyResult,
    stage,
)

DEFAULT_STEPS = 10


LOSS_PRELUDE = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"


@dataclass(frozen=True)
class TrainSpec:
    """What to train with: torch source text for the optimizer, scheduler and loss."""

    optimizer: str
    loss: str
    labels: str | None = None  # an input SPEC (DTYPE[...][:HIGH]); None: no labels
    scheduler: str | None = None
    clip_grad_norm: float | None = None
    steps: int = DEFAULT_STEPS
    optax: str | None = None  # a hand-written optax transform to check instead of ours


@dataclass
class TrajectoryResult(VerifyResult):
    """A :class:`VerifyResult` (``max_*_diff`` are the final parameters') with the steps."""

    steps: int = 0
    optimizer: str | None = None
    scheduler: str | None = None
    loss: str | None = None
    optax: str | None = None  # the optax transform that ran
    schedule: str | None = None  # the optax schedule (or plateau transform) that ran
    losses_torch: list[float] = field(default_factory=list)
    losses_jax: list[float] = field(default_factory=list)
    loss_max_rel_diff: float | None = None
    param_max_abs_diff: float | None = None
    param_max_rel_diff: float | None = None
    worst_param: str | None = None


def _callee_name(src: str, what: str) -> tuple[Any, str]:
    import libcst as cst

    from torch2jax.passes.common import code

    try:
        node = cst.parse_expression(src)
    except cst.ParserSyntaxError as exc:
        raise VerifyError(f"--{what} {src!r} is not a Python expression: {exc.message}") from None
    if not isinstance(node, cst.Call):
        raise VerifyError(f"--{what} {src!r} must be a call, e.g. torch.optim.SGD(params, lr=0.1)")
    return node, code(node.func)


_OPT_PREFIXES = ("torch.optim.", "optim.", "")


_SCHED_PREFIXES = ("torch.optim.lr_scheduler.", "optim.lr_scheduler.", "lr_scheduler.", "")


def _qualify(name: str, prefixes: tuple[str, ...], known: list[str], what: str) -> str:
    short = name.rsplit(".", 1)[-1]
    full = next((k for k in known if k.rsplit(".", 1)[-1] == short), None)
    if full is None or not any(name == p + short for p in prefixes):
        raise VerifyError(f"--{what} {name}: not one of {', '.join(k.rsplit('.', 1)[-1] for k in known)}"
                          f" (written as {' or '.join(p + 'X' for p in prefixes if p)} or X)")
    return full


@dataclass
class JaxSetup:
    tx: Any  # optax GradientTransformation
    tx_code: str
    schedule_code: str | None
    plateau: Any = None  # optax.contrib.reduce_on_plateau transform, stepped like torch's
    negate_metric: bool = False
    base_lr: Any = None
    notes: list[str] = field(default_factory=list)


def translate_setup(spec: TrainSpec) -> JaxSetup:
    """The optax side of ``spec``; raises VerifyError with the translator's reason."""
    import jax
    import jax.numpy as jnp
    import libcst as cst
    import optax

    from torch2jax.passes.common import Untranslatable, code
    from torch2jax.training import optim

    ns = {"optax": optax, "jax": jax, "jnp": jnp}
    call, name = _callee_name(spec.optimizer, "optimizer")
    qual = _qualify(name, _OPT_PREFIXES, optim.optimizer_names(), "optimizer")
    notes: list[str] = []
    try:
        try:
            tx = optim.translate_optimizer(call, qual)
        except Untranslatable:
            if spec.optax is None or spec.scheduler:
                raise
            tx = None  # a hand-written transform for an optimizer we refuse: check it anyway
        if tx is not None and tx.groups is not None:
            raise VerifyError("--optimizer with parameter groups is not supported by verify: "
                              "give params (every parameter in one group)")
        schedule = None
        if spec.scheduler and tx is not None:
            scall, sname = _callee_name(spec.scheduler, "scheduler")
            squal = _qualify(sname, _SCHED_PREFIXES, optim.scheduler_names(), "scheduler")
            schedule = optim.translate_scheduler(scall, squal, tx.lr)
        plateau = schedule is not None and schedule.plateau is not None
        if spec.optax is not None:
            built = cst.parse_expression(spec.optax)
            notes.append(f"checking the given optax transform: {spec.optax}")
        elif schedule is not None and schedule.fn is not None:
            built = tx.build(lr=schedule.fn, momentum=schedule.momentum)
        else:
            built = tx.build(inject=plateau)
        if spec.clip_grad_norm is not None:
            built = optim.with_clipping(built, max_norm=cst.parse_expression(
                repr(float(spec.clip_grad_norm))))
    except Untranslatable as exc:
        raise VerifyError(f"no faithful optax translation: {exc.message}") from None
    except cst.ParserSyntaxError as exc:
        raise VerifyError(f"--optax is not a Python expression: {exc.message}") from None
    found = [*(tx.notes if tx else []), *(schedule.notes if schedule else [])]
    notes += [f"{sev}: {msg}" for sev, msg in found if sev == "warning"]
    tx_code = code(built)
    with stage("building the optax transform"):
        transform = eval(tx_code, dict(ns))  # the translation library's own output
    out = JaxSetup(transform, tx_code, None, notes=notes)
    if schedule is not None:
        out.schedule_code = code(schedule.fn if schedule.fn is not None else schedule.plateau)
    if plateau:
        if spec.optax is not None:
            raise VerifyError("--optax with ReduceLROnPlateau: give the optimizer only")
        with stage("building the plateau transform"):
            out.plateau = eval(out.schedule_code, dict(ns))
        out.negate_metric = schedule.negate_metric
        try:
            out.base_lr = float(ast.literal_eval(code(tx.lr)))
        except (ValueError, SyntaxError):
            raise VerifyError("ReduceLROnPlateau: give the optimizer a literal lr") from None
    return out


def translate_loss(loss: str, rules: RuleSet | None = None) -> tuple[Callable[..., Any], str]:
    """``loss`` (torch code over ``output`` and ``labels``) converted: (fn(output, labels),
    the JAX code).

    A rule that needs an operand as a name (``flatten(0, 1)`` of ``output[0]``, an input that
    ``F.cross_entropy(..., label_smoothing=...)`` reads twice) asks the user to assign it first,
    which a one-expression option cannot do: when the expression does not convert as it is,
    each compound receiver and argument of a call is bound to a fresh name, in evaluation
    order, and the statements are converted together (:func:`bind_operands`)."""
    try:
        ast.parse(loss, mode="eval")
    except SyntaxError as exc:
        raise VerifyError(f"--loss {loss!r} is not a Python expression: {exc.msg}") from None
    try:
        return _translate_loss(loss, [], loss, rules)
    except VerifyError:
        bound = bind_operands(loss)
        if bound is None:
            raise
    return _translate_loss(loss, *bound, rules)


def bind_operands(expression: str) -> tuple[list[tuple[str, str]], str] | None:
    """``expression`` with each compound receiver and argument of a call bound to a fresh name:
    (the bindings in evaluation order, the expression over them); None when there is nothing to
    bind or when a part is evaluated conditionally or repeatedly (``and``/``or``, ``x if c else
    y``, a lambda or a comprehension: binding it beforehand would evaluate it always, once)."""
    tree = ast.parse(expression, mode="eval")
    lazy = (ast.BoolOp, ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
            ast.GeneratorExp, ast.NamedExpr, ast.Starred)
    if any(isinstance(n, lazy) for n in ast.walk(tree)):
        return None
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    bindings: list[tuple[str, str]] = []

    def simple(node: ast.expr) -> bool:
        if isinstance(node, ast.Attribute):
            return simple(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return isinstance(node.operand, ast.Constant)
        if isinstance(node, (ast.Tuple, ast.List)):
            return all(simple(e) for e in node.elts)
        return isinstance(node, (ast.Name, ast.Constant))

    def bind(node: ast.expr) -> ast.expr:
        node = visit(node)
        if simple(node):
            return node
        i = len(bindings)
        while f"_loss{i}" in taken:
            i += 1
        name = f"_loss{i}"
        taken.add(name)
        bindings.append((name, ast.unparse(node)))
        return ast.Name(id=name, ctx=ast.Load())

    def visit(node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):
                node.func.value = bind(node.func.value)
            node.args = [bind(a) for a in node.args]
            for kw in node.keywords:
                kw.value = bind(kw.value)
            return node
        for field_name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, field_name, visit(value))
            elif isinstance(value, list):
                setattr(node, field_name, [visit(v) if isinstance(v, ast.expr) else v
                                           for v in value])
        return node

    value = visit(tree.body)
    if not bindings:
        return None
    return bindings, ast.unparse(value)


def _translate_loss(loss: str, bindings: list[tuple[str, str]], value: str,
                    rules: RuleSet | None) -> tuple[Callable[..., Any], str]:
    """:func:`translate_loss` of ``value`` after ``bindings`` (``loss`` names it in errors)."""
    from torch2jax.convert import convert_source

    # in a function over annotated tensors: the value analysis then knows what output and
    # labels are (a method such as .mean() is rewritten only on a known tensor)
    body = "".join(f"    {name} = {text}\n" for name, text in bindings)
    source = (LOSS_PRELUDE + "\n\ndef loss_of(output: torch.Tensor, labels: torch.Tensor):\n"
              f"{body}    loss = {value}\n    return loss\n")
    with stage("converting the loss"):
        result = convert_source(source, path="<--loss>", rules=rules)
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    if errors:
        raise VerifyError(f"--loss {loss!r} did not convert: {'; '.join(errors)}")
    tree = ast.parse(result.code)
    # the converted function whole: its rules may bind operands to names of their own in
    # statements before the loss (a fresh name for a value read twice)
    fn = next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "loss_of"),
              None)
    assigned = {t.id for s in ast.walk(fn) if isinstance(s, ast.Assign)
                for t in s.targets if isinstance(t, ast.Name)} if fn is not None else set()
    if fn is None or not {name for name, _ in bindings} | {"loss"} <= assigned:
        raise VerifyError(f"--loss {loss!r}: the converted snippet lost its assignment")
    fn.name = "__loss__"
    fn.args = ast.parse("def f(output, labels): pass").body[0].args
    fn.returns = None
    header = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    module = ast.Module(body=[*header, fn], type_ignores=[])
    ast.fix_missing_locations(module)
    ns: dict[str, Any] = {"__name__": "torch2jax_verify_loss"}
    with stage("building the JAX loss"):
        exec(compile(module, "<--loss converted>", "exec"), ns)  # noqa: S102 - converter output
    body = [st for st in fn.body if not (isinstance(st, ast.Return) and isinstance(
        st.value, ast.Name) and st.value.id == "loss")]
    shown = "; ".join(ast.unparse(st).removeprefix("loss = ") for st in body)
    return ns["__loss__"], shown


def torch_loss(loss: str) -> Callable[..., Any]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    code_obj = compile(loss, "<--loss>", "eval")
    ns = {"torch": torch, "F": F, "nn": nn}
    return lambda output, labels: eval(code_obj, {**ns, "output": output, "labels": labels})


def torch_setup(spec: TrainSpec, model: Any) -> tuple[Any, Any]:
    """(optimizer, scheduler or None) built from the torch source text."""
    import torch
    from torch import optim
    from torch.optim import lr_scheduler

    ns: dict[str, Any] = {"torch": torch, "optim": optim, "lr_scheduler": lr_scheduler,
                          "model": model, "params": list(model.parameters()), "math": math}
    ns.update({k: v for k, v in vars(optim).items() if isinstance(v, type)})
    ns.update({k: v for k, v in vars(lr_scheduler).items() if isinstance(v, type)})
    with stage("building the torch optimizer"):
        opt = eval(spec.optimizer, ns)  # the user's own expression
    sched = None
    if spec.scheduler:
        with stage("building the torch scheduler"):
            sched = eval(spec.scheduler, {**ns, "optimizer": opt, "opt": opt})
    return opt, sched


@dataclass
class Trajectory:
    """The loss of every step on each side."""

    losses_torch: list[float]
    losses_jax: list[float]


def relative_loss_diff(a: float, b: float) -> float:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), float(np.finfo(np.float32).tiny))


def unalias(torch_model: Any) -> None:
    """Give the torch tensors fresh memory: the transfer may hand JAX a zero-copy view of
    torch's CPU buffers, which ``optimizer.step()`` (and BatchNorm's running averages) would
    then change under the JAX model."""
    import torch

    with torch.no_grad():
        for p in torch_model.parameters():
            p.data = p.data.clone()
        for b in torch_model.buffers():
            b.data = b.data.clone()


def settle_trajectory(r: TrajectoryResult, traj: Trajectory, loss_rel: float, worst_step: int,
                      p_abs: float, p_rel: float, worst: str | None) -> None:
    """The verdict of a trajectory from its largest loss and parameter differences: the
    figures on ``r``, whether it passed, and what differed first when it did not."""
    p_rel = max(p_rel, 0.0)
    r.param_max_abs_diff, r.param_max_rel_diff, r.worst_param = p_abs, p_rel, worst
    r.max_abs_diff, r.max_rel_diff = p_abs, p_rel
    r.passed = loss_rel <= r.rtol and p_rel <= r.rtol
    if not r.passed:
        if loss_rel > r.rtol:
            i = worst_step
            r.mismatch = (f"loss at step {i}: jax {traj.losses_jax[i]:.7g} vs torch "
                          f"{traj.losses_torch[i]:.7g} (rel {loss_rel:.2e})")
        else:
            r.mismatch = f"parameter {worst} after {r.steps} steps: rel {p_rel:.2e}"


def torch_step(torch_model: Any, opt: Any, sched: Any, loss_torch: Callable[..., Any],
               t_in: list[Any], t_lab: Any, clip_grad_norm: float | None, step: int) -> float:
    """One torch training step of a trajectory (the gradient clipped, the scheduler stepped,
    ReduceLROnPlateau on the loss); its loss."""
    import torch

    with stage(f"the torch training step {step}"):
        opt.zero_grad(set_to_none=True)
        loss = loss_torch(torch_model(*t_in), t_lab)
        loss.backward()
        if clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(torch_model.parameters(), clip_grad_norm)
        opt.step()
        if sched is not None:
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(loss.item())
            else:
                sched.step()
    return float(loss.item())


def torch_trajectory_mode(torch_model: Any) -> tuple[int, int]:
    """The torch model in training mode for a trajectory: BatchNorm on batch statistics,
    every Dropout at p = 0 and the drop-path modules (torchvision's StochasticDepth, timm's
    DropPath, which read self.training) in eval mode: random masks from two RNGs cannot
    agree. ``(the Dropout modules set to p = 0, the drop-path modules)``."""
    import torch

    torch_model.train()
    dropouts = 0
    for mod in torch_model.modules():
        if isinstance(mod, torch.nn.modules.dropout._DropoutNd) and mod.p:
            mod.p = 0.0
            dropouts += 1
    drop_paths = [m for m in torch_model.modules() if type(m).__name__ in DROP_PATH_CLASSES]
    for mod in drop_paths:
        mod.eval()
    return dropouts, len(drop_paths)


def set_injected_learning_rate(opt_state: Any, value: float) -> None:
    """Write ``value`` into the ``learning_rate`` that ``optax.inject_hyperparams`` put in
    ``opt_state`` (inside a chain: clipping comes first)."""
    import jax.numpy as jnp

    hp = _hyperparams(opt_state)
    hp["learning_rate"] = jnp.asarray(value, hp["learning_rate"].dtype)


def _hyperparams(opt_state: Any) -> Any:
    if hasattr(opt_state, "hyperparams"):
        return opt_state.hyperparams
    for part in opt_state if isinstance(opt_state, tuple) else ():
        found = _hyperparams(part)
        if found is not None:
            return found
    return None
