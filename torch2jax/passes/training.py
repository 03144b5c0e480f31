"""Training code: seeds and random draws to explicit keys, training loops to a jit-compiled step.

The rewrite engine (:mod:`torch2jax.passes.rewrite`) calls these functions at the nodes the
training index (:mod:`torch2jax.analysis.training`) pointed out. They build JAX code only;
deciding *whether* something is training code happens in the index.

Randomness. torch has one global generator; JAX has explicit keys. A ``torch.manual_seed(s)``
becomes the root key ``key = jax.random.key(s)``; each statement that draws random numbers
first splits a fresh subkey off it (``key, subkey = jax.random.split(key)``), so every draw
in a loop gets a new key. A helper that seeds returns its key; a function that draws random
numbers without seeding takes ``key`` as a keyword argument and its callers hand it one.

Training loops. The statements between ``optimizer.zero_grad()`` and ``loss.backward()``
that depend on the model become the body of a loss function; the loop body calls a
``@nnx.jit`` train step that takes the gradient with ``nnx.value_and_grad`` and applies
``optimizer.update(model, grads)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.host import GENERATOR
from torch2jax.analysis.walk import NoAttributeHooks, findall, visit
from torch2jax.passes.common import (
    RenameNames,
    Untranslatable,
    add_kwonly_param,
    arg,
    bind,
    call,
    code,
    expr,
    try_literal,
)
from torch2jax.passes.numpy_draws import numpy_draw
from torch2jax.result import TrainStepRecord

KEY = "key"


# ---------------------------------------------------------------------------- random draws
def _size(b, first: str, rest_from: int | None = None) -> cst.BaseExpression:
    """torch's ``*size`` (``randn(2, 3)``, ``randn((2, 3))``, ``randn(shape)``) as one shape."""
    sizes = b.extra_positional[rest_from or 0:] if rest_from is not None else b.extra_positional
    size_kw = b.get("size")
    if size_kw is not None:
        return size_kw
    if not sizes:
        raise Untranslatable(f"{first} without a size")
    if len(sizes) == 1:
        only = sizes[0]
        if isinstance(only, (cst.Tuple, cst.List)) or not isinstance(
                try_literal(only, ...), int):
            return only
        return expr(f"({code(only)},)")
    return cst.Tuple([cst.Element(s) for s in sizes])


def _dtype(b) -> list[cst.Arg]:
    d = b.get("dtype")
    return [arg(d, "dtype")] if d is not None else []


def random_call(qualname: str, node: cst.Call, subkey: cst.BaseExpression
                ) -> cst.BaseExpression:
    """The ``jax.random`` expression for a torch random function, drawing from ``subkey``."""
    short = qualname.rsplit(".", 1)[-1]
    args = list(node.args)
    unsupported = {"generator", "out"} & {a.keyword.value for a in args if a.keyword}
    if unsupported:
        raise Untranslatable(f"torch.{short} with {', '.join(sorted(unsupported))}=: a "
                             "generator needs its own key (jax.random.key(seed))")
    drop = {"device", "requires_grad", "pin_memory", "layout", "memory_format"}
    args = [a for a in args if not (a.keyword and a.keyword.value in drop)]
    b = bind(args, ())
    if short in ("rand", "randn"):
        fn = "jax.random.uniform" if short == "rand" else "jax.random.normal"
        return call(fn, arg(subkey), arg(_size(b, short)), *_dtype(b))
    if short in ("rand_like", "randn_like"):
        x = b.extra_positional[0]
        fn = "jax.random.uniform" if short == "rand_like" else "jax.random.normal"
        d = b.get("dtype")
        return expr(f"{fn}({{k}}, {{x}}.shape, {{d}})", k=subkey, x=x,
                    d=d if d is not None else expr("{x}.dtype", x=x))
    if short == "randint":
        low, high, size = _randint_bounds(b)
        kws = _dtype(b)
        return call("jax.random.randint", arg(subkey), arg(size), arg(low), arg(high), *kws)
    if short == "randint_like":
        x, *rest = b.extra_positional
        low, high = (cst.Integer("0"), rest[0]) if len(rest) == 1 else rest[:2]
        return expr("jax.random.randint({k}, {x}.shape, {lo}, {hi}, {x}.dtype)", k=subkey, x=x,
                    lo=low, hi=high)
    if short == "randperm":
        n = b.extra_positional[0] if b.extra_positional else b.get("n")
        return call("jax.random.permutation", arg(subkey), arg(n))
    if short == "normal":
        mean = b.extra_positional[0] if b.extra_positional else b.get("mean")
        std = b.extra_positional[1] if len(b.extra_positional) > 1 else b.get("std")
        size = b.extra_positional[2] if len(b.extra_positional) > 2 else b.get("size")
        mean = mean if mean is not None else cst.Float("0.0")
        std = std if std is not None else cst.Float("1.0")
        if size is None:
            shape = expr("jnp.broadcast_shapes(jnp.shape({a}), jnp.shape({b}))", a=mean, b=std)
        else:
            shape = size
        return expr("{m} + {s} * jax.random.normal({k}, {shape})", m=mean, s=std, k=subkey,
                    shape=shape)
    if short == "bernoulli":
        p = b.extra_positional[0] if b.extra_positional else b.get("input")
        if b.get("p") is not None:
            raise Untranslatable("torch.bernoulli(input, p=...)")
        return expr("jax.random.bernoulli({k}, {p}).astype({p}.dtype)", k=subkey, p=p)
    if short == "multinomial":
        probs = b.extra_positional[0] if b.extra_positional else b.get("input")
        n = b.extra_positional[1] if len(b.extra_positional) > 1 else b.get("num_samples")
        repl = b.extra_positional[2] if len(b.extra_positional) > 2 else b.get("replacement")
        n_val = try_literal(n, ...)
        if try_literal(repl, False) is not True and n_val != 1:
            raise Untranslatable("torch.multinomial without replacement and more than one "
                                 "sample (no single jax.random call draws that per row)")
        # categorical draws over the last axis, its batch shape trailing the sample shape
        if n_val == 1:
            return expr("jax.random.categorical({k}, jnp.log({p}))[..., None]", k=subkey, p=probs)
        return expr("jnp.moveaxis(jax.random.categorical({k}, jnp.log({p}), shape=({n},) + "
                    "{p}.shape[:-1]), 0, -1)", k=subkey, p=probs, n=n)
    if short == "poisson":
        lam = b.extra_positional[0]
        return expr("jax.random.poisson({k}, {lam}).astype({lam}.dtype)", k=subkey, lam=lam)
    raise Untranslatable(f"no translation for torch.{short}")


def _randint_bounds(b) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression]:
    """``(low, high, size)`` of ``torch.randint(high, size)`` or ``randint(low, high, size)``,
    positional or by keyword (``low`` 0 when not given)."""
    pos, low, high, size = b.extra_positional, b.get("low"), b.get("high"), b.get("size")
    if low is None and high is None:
        if size is None and len(pos) == 2:
            high, size = pos
        elif size is None and len(pos) == 3:
            low, high, size = pos
        elif size is not None and len(pos) == 1:
            high = pos[0]
        elif size is not None and len(pos) == 2:
            low, high = pos
    if high is None or size is None:
        raise Untranslatable("torch.randint with this argument pattern")
    return (low if low is not None else cst.Integer("0")), high, size


# the draws that have a numpy form from the script's Generator (host_random_call)
HOST_RANDOM = frozenset({"torch.randint", "torch.randperm", "torch.rand", "torch.randn"})
_HOST_FLOATS = {f"{m}.{n}": f"np.{n}" for m in ("jnp", "np") for n in ("float32", "float64")}


def host_random_call(qualname: str, node: cst.Call, *,
                     global_draws: bool = False) -> cst.BaseExpression:
    """The numpy draw for a host-side ``torch.randint`` / ``torch.randperm``
    (analysis/host.py), or a ``torch.rand`` / ``torch.randn`` of a Dataset's method: from
    the script's ``numpy.random.Generator``, or with ``global_draws`` from numpy's global
    generator (a Dataset's draws from torch's global one, passes/host_data.py). A float draw
    is float32 as torch's default (a dtype other than float32 or float64, which numpy's draws
    take, is refused)."""
    short = qualname.rsplit(".", 1)[-1]
    source = None if global_draws else cst.Name(GENERATOR)
    if short in ("rand", "randn"):
        b = bind([a for a in node.args if not (a.keyword and a.keyword.value in (
            "requires_grad", "pin_memory", "layout", "device"))], ())
        dtype = b.get("dtype")
        name = _HOST_FLOATS.get(code(dtype)) if dtype is not None else "np.float32"
        if name is None:
            raise Untranslatable(f"torch.{short}(dtype={code(dtype)}) on the host: numpy draws "
                                 "float32 or float64 only", rule="random")
        return numpy_draw(short, source, size=_size(b, short), dtype=cst.parse_expression(name))
    drop = {"requires_grad", "pin_memory", "layout", "dtype"}
    b = bind([a for a in node.args if not (a.keyword and a.keyword.value in drop)], ())
    if short == "randperm":
        return numpy_draw(short, source, n=b.extra_positional[0] if b.extra_positional
                          else b.get("n"))
    low, high, size = _randint_bounds(b)
    return numpy_draw(short, source, low=low, high=high, size=size)


def numpy_generator_call(qualname: str, node: cst.Call, gen: str) -> cst.BaseExpression:
    """A draw from ``gen``, a torch.Generator that is a numpy Generator in the converted file
    (analysis/host_generators.py): the numpy draw, as a JAX array (torch's draw is a tensor).
    ``torch.multinomial`` goes through the ``host_multinomial`` helper (weights normalised per
    row, as torch's)."""
    short = qualname.rsplit(".", 1)[-1]
    drop = {"generator", "device", "requires_grad", "pin_memory", "layout", "memory_format"}
    args = [a for a in node.args if not (a.keyword and a.keyword.value in drop)]
    if any(a.keyword and a.keyword.value == "out" for a in args):
        raise Untranslatable(f"torch.{short} with out=")
    dtype = next((a.value for a in args if a.keyword and a.keyword.value == "dtype"), None)
    b = bind([a for a in args if not (a.keyword and a.keyword.value == "dtype")], ())
    if short in ("rand", "randn"):
        out = numpy_draw(short, cst.parse_expression(gen), size=_size(b, short))
    elif short == "randint":
        low, high, size = _randint_bounds(b)
        out = numpy_draw(short, cst.parse_expression(gen), low=low, high=high, size=size)
    elif short == "randperm":
        n = b.extra_positional[0] if b.extra_positional else b.get("n")
        out = numpy_draw(short, cst.parse_expression(gen), n=n)
    elif short == "multinomial":
        b = bind(args, ("input", "num_samples", "replacement"))
        probs, n = b.get("input"), b.get("num_samples")
        if probs is None or n is None:
            raise Untranslatable("torch.multinomial without its weights and sample count")
        repl = b.get("replacement")
        out = expr(f"host_multinomial({gen}, {{p}}, {{n}}, {{r}})", p=probs, n=n,
                   r=repl if repl is not None else cst.Name("False"))
        return out
    else:
        raise Untranslatable(f"no numpy translation for torch.{short} from a generator")
    if dtype is not None:
        return expr("jnp.asarray({x}, dtype={d})", x=out, d=dtype)
    return expr("jnp.asarray({x})", x=out)


# ---------------------------------------------------------------------------- key plumbing
@dataclass
class KeyScope:
    """Key state of one scope (module or function) while it is rewritten."""

    has_key: bool = False  # a key named ``key`` is defined here (seeded, or a parameter)
    takes_key: bool = False  # the function gained a ``key`` parameter
    seeds_here: bool = False  # the function seeds: it returns its key
    root_needed: bool = False  # module level drew before any seed: add a root key
    global_key: bool = False  # the function splits the script's key (linen): ``global key``


@dataclass
class StatementKeys:
    """Subkeys a statement consumes; emitted as one split in front of it."""

    names: list[str] = field(default_factory=list)

    def take(self) -> cst.Name:
        name = "subkey" if not self.names else f"subkey{len(self.names) + 1}"
        self.names.append(name)
        return cst.Name(name)

    def split_statement(self) -> cst.SimpleStatementLine | None:
        if not self.names:
            return None
        names = list(self.names)
        targets = ", ".join([KEY, *names])
        n = "" if len(names) == 1 else f", {len(names) + 1}"
        return cst.parse_statement(f"{targets} = jax.random.split({KEY}{n})\n")


def seed_statement(seed: cst.BaseExpression) -> cst.BaseSmallStatement:
    return cst.Assign(targets=[cst.AssignTarget(cst.Name(KEY))],
                      value=call("jax.random.key", arg(seed)))


def root_key_statement() -> cst.SimpleStatementLine:
    return cst.parse_statement(f"{KEY} = jax.random.key(0)  # torch's global RNG was never "
                               "seeded here\n")


def add_key_param(fn: cst.FunctionDef) -> cst.FunctionDef:
    return add_kwonly_param(fn, KEY, "jax.Array")


def declare_global_key(fn: cst.FunctionDef) -> cst.FunctionDef:
    """``global key`` first in ``fn`` (after its docstring): it splits the script's key."""
    body = list(fn.body.body)
    at = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(
        value=m.SimpleString() | m.ConcatenatedString())])) else 0
    body.insert(at, cst.parse_statement(f"global {KEY}\n"))
    return fn.with_changes(body=fn.body.with_changes(body=body))


def return_key(fn: cst.FunctionDef) -> cst.FunctionDef:
    """A seeding helper hands its root key back to the caller."""
    body = list(fn.body.body)
    if any(findall(fn, m.Return())):
        raise Untranslatable("a seeding helper that already returns a value: return the key "
                             "jax.random.key(seed) as well")
    body.append(cst.parse_statement(f"return {KEY}\n"))
    return fn.with_changes(body=fn.body.with_changes(body=body))


# ---------------------------------------------------------------------------- names
class _Names(NoAttributeHooks, cst.CSTVisitor):
    def __init__(self) -> None:
        self.used: list[str] = []
        self.assigned: list[str] = []
        self._lambda_params: list[set[str]] = []

    def visit_Name(self, node: cst.Name) -> None:
        if any(node.value in s for s in self._lambda_params):
            return
        if node.value not in self.used:
            self.used.append(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._lambda_params.append({p.name.value for p in node.params.params})

    def leave_Lambda(self, node: cst.Lambda) -> None:
        self._lambda_params.pop()

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        self._targets(node.target)
        if not isinstance(node.target, (cst.Name, cst.Tuple, cst.List)):
            node.target.visit(self)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._targets(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._targets(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._targets(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._targets(node.target)

    def _targets(self, t: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name):
            if t.value not in self.assigned:
                self.assigned.append(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for e in t.elements:
                self._targets(e.value)
        elif isinstance(t, cst.StarredElement):
            self._targets(t.value)


def names_of(node: cst.CSTNode) -> _Names:
    v = _Names()
    visit(node, v)
    return v


def assigned_in_order(stmts: Sequence[cst.CSTNode]) -> list[str]:
    """The names the statements assign, each once, in the order first assigned."""
    out: list[str] = []
    for s in stmts:
        for a in names_of(s).assigned:
            if a not in out:
                out.append(a)
    return out


def loss_slice(before: Sequence[cst.BaseStatement], loss: str) -> list[bool]:
    """Which of the statements before ``loss.backward()`` the loss depends on (its backward
    slice). A statement that reads the name it assigns (``out = out.float()``,
    ``loss = loss / accum``) keeps the earlier assignment in the slice."""
    needed = {loss}
    in_slice = [False] * len(before)
    for i in range(len(before) - 1, -1, -1):
        n = names_of(before[i])
        if set(n.assigned) & needed:
            in_slice[i] = True
            needed -= set(n.assigned)
            needed |= set(n.used)
    return in_slice


def split_loss(before: Sequence[cst.BaseStatement], in_slice: Sequence[bool],
               model: str | set[str]) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement]]:
    """The statements before ``backward()`` that form the loss function (those of the loss's
    backward slice, ``in_slice``, that depend on the model, or on one of the models), and the
    others, in order."""
    diff: set[str] = {model} if isinstance(model, str) else set(model)
    loss_body: list[cst.BaseStatement] = []
    outside: list[cst.BaseStatement] = []
    for s, sliced in zip(before, in_slice):
        n = names_of(s)
        if sliced and set(n.used) & diff:
            loss_body.append(s)
            diff |= set(n.assigned)
        else:
            outside.append(s)
    return loss_body, outside


def tuple_text(names: Sequence[str]) -> str:
    """``a, b`` / ``a,``: the inside of a tuple of ``names`` (one name keeps its comma)."""
    return ", ".join(names) + ("," if len(names) == 1 else "")


# ---------------------------------------------------------------------------- train loops
def _is_method_stmt(stmt: cst.CSTNode, receivers: set[str] | None, method: str) -> str | None:
    """``recv.method(...)`` as a statement: the receiver's name."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    e = stmt.body[0]
    if not isinstance(e, cst.Expr) or not isinstance(e.value, cst.Call):
        return None
    f = e.value.func
    if (isinstance(f, cst.Attribute) and f.attr.value == method and isinstance(f.value, cst.Name)
            and (receivers is None or f.value.value in receivers)):
        return f.value.value
    return None


def _attribute_loss(body: list[cst.BaseStatement]) -> tuple[list[cst.BaseStatement], str | None]:
    """``logits, self.loss = model(x, y)`` ... ``self.loss.backward()`` (a Trainer that keeps
    the loss for its callbacks): the body with ``self.loss`` read and written as the local
    ``loss``, and ``"loss"`` (the step's caller assigns ``self.loss = loss`` back)."""
    attr = None
    for s in body:
        if (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                and m.matches(s.body[0], m.Expr(m.Call(func=m.Attribute(
                    value=m.Attribute(value=m.Name("self"), attr=m.Name()),
                    attr=m.Name("backward")))))):
            attr = s.body[0].value.func.value.attr.value
    if attr is None:
        return body, None
    if any(attr in names_of(s).used or attr in names_of(s).assigned for s in body):
        return body, None  # the name is taken in the loop

    class _Local(cst.CSTTransformer):
        def leave_Attribute(self, original_node, updated_node):
            if m.matches(updated_node, m.Attribute(value=m.Name("self"), attr=m.Name(attr))):
                return cst.Name(attr)
            return updated_node
    return [s.visit(_Local()) for s in body], attr


def _clip_norm(stmt: cst.BaseStatement) -> cst.BaseExpression | None:
    """``clip_grad_norm_(params, max_norm)`` as a statement: ``max_norm`` (the default norm
    type, 2, only)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.Call)):
        return None
    args = stmt.body[0].value.args
    if len(args) != 2 or any(a.keyword or a.star for a in args):
        return None
    return args[1].value


@dataclass
class TrainStep:
    function: cst.FunctionDef  # the @nnx.jit train step to define before the loop
    body: list[cst.BaseStatement]  # the loop's new body
    call: cst.SimpleStatementLine  # the statement of the body that calls the step
    functional: bool = False  # the step is a jax.jit function of (graphdef, state)
    closure: bool = False  # ... of the state alone, closing over the graphdef split before it
    # what a pass over the translation needs to know of the step (None: a step that returns
    # the gradients instead of applying them, or a GAN step)
    record: TrainStepRecord | None = None


def build_train_step(body: Sequence[cst.BaseStatement], *, optimizer: str, model: str,
                     loop_names: set[str], step_name: str, accumulate: bool = False,
                     functional: bool = False, tree_mode: bool = False,
                     clip: cst.BaseStatement | None = None,
                     grads_out: str | None = None, closure: bool = False,
                     read_later: frozenset[str] | set[str] = frozenset(),
                     joint: Sequence[tuple[str, str]] = (),
                     group: Sequence[str] = ()) -> TrainStep | None:
    """Restructure a loop body that runs ``backward()`` and ``optimizer.step()``.

    ``loop_names``: names assigned in the enclosing loops (batches, targets): they are passed
    to the step as arguments; other free names (the loss function, constants) are closed
    over. Returns None when the body is not in the recognised shape.

    ``functional``: the step is ``jax.jit`` of a pure function of the model's and optimizer's
    state (``nnx.merge`` inside, the new state returned and the old one donated), which
    skips ``nnx.jit``'s per-call walk of the module graph (docs/performance.md); the caller
    splits the state before the loop and updates the objects after it (functional_loop).
    ``closure``: the functional step reads ``graphdef`` from its scope instead of taking it
    as a static argument, which ``jax.jit`` would hash on every call; the caller defines it
    after the split (the loop is the outermost of its scope, so the split runs once).

    ``read_later``: names that code after ``body`` reads (a step where it stands, in a
    function that returns what the loss computed): the step returns those it computes.

    ``grads_out``: a gradient step for accumulation (analysis/accumulate.py): the step takes
    the accumulated gradients ``grads_out`` (None: none yet) instead of the optimizer, adds
    the loss's gradients to them and returns the sum, bound to ``grads_out`` at the call; the
    body needs no ``optimizer.step()``.

    ``joint``: the other ``(optimizer, model)`` pairs whose ``step()`` follows the same
    ``backward()`` (the seq2seq tutorial's encoder and decoder optimizers): the loss is
    differentiated with respect to every model, each optimizer updates its own.

    ``group``: the models whose parameters the one optimizer holds together
    (``Adam(list(encoder.parameters()) + list(decoder.parameters()))``): the loss is
    differentiated with respect to each, and the optimizer of their tuple updates them.
    """
    if (joint or group) and (functional or closure or grads_out is not None or accumulate
                             or clip) or joint and group:
        return None
    models = list(group) if group else [model, *(mo for _, mo in joint)]
    optimizers = [optimizer, *(o for o, _ in joint)]
    body = list(body)
    clip_at = next((i for i, s in enumerate(body) if s is clip), None)
    if clip is not None and clip_at is None:
        return None
    body, kept_attr = _attribute_loss(body)
    clip = body[clip_at] if clip_at is not None else None
    back = [i for i, s in enumerate(body) if _is_method_stmt(s, None, "backward")]
    others = [i for i, s in enumerate(body) for o in optimizers[1:]
              if _is_method_stmt(s, {o}, "step")]
    steps = [i for i, s in enumerate(body) if _is_method_stmt(s, {optimizer}, "step") or (
        accumulate and isinstance(s, cst.If) and not s.orelse and len(s.body.body) == 1
        and _is_method_stmt(s.body.body[0], {optimizer}, "step"))]
    if grads_out is not None and not steps and len(back) == 1:
        steps = [None]
    elif len(back) != 1 or len(steps) != 1 or steps[0] < back[0]:
        return None
    if len(others) != len(joint) or any(i < back[0] for i in others):
        return None
    ib, istep = back[0], steps[0]
    loss = _is_method_stmt(body[ib], None, "backward")
    before = [s for s in body[:ib] if not _is_method_stmt(s, {*optimizers, *models},
                                                            "zero_grad")]
    loss_body, outside = split_loss(before, loss_slice(before, loss), set(models))
    if not loss_body:
        return None
    defined = assigned_in_order(loss_body)
    after = [s for s in body[ib + 1:]
             if (istep is None or s is not body[istep]) and s is not clip
             and not any(s is body[i] for i in others)]
    # the learning rate set between backward() and step() (a hand-written SGD's, made an
    # optimizer by passes/manual_sgd.py): the step it precedes reads it, so it is set before
    # the call (it reads nothing the loss computes)
    early = [s for s in after if istep is not None and body.index(s) < istep
             and _sets_hyperparameter(s, optimizer) and not set(names_of(s).used) & set(defined)]
    after = [s for s in after if not any(s is e for e in early)]
    clip_line = ""
    if clip is not None:
        if istep is None or not ib < clip_at < istep:
            return None
        max_norm = _clip_norm(clip)
        if max_norm is None:
            return None
        clip_line = (f"    {{grads}}, _ = optax.clip_by_global_norm({code(max_norm)}).update("
                     f"{{grads}}, optax.EmptyState())\n")
    used_later = set(read_later)
    for s in [*outside, *after]:
        used_later |= set(names_of(s).used)
    aux = [d for d in defined if d != loss and d in used_later]
    # statements placed before backward() that read what the loss function computes
    pre, post_dep = [], []
    order = {id(s): i for i, s in enumerate(before)}
    for s in outside:
        # (a statement written after the loss that rebinds what the loss read, the next
        # batch fetched ahead: X, Y = get_batch('train'), runs after the step too)
        rebinds = set(names_of(s).assigned) & {
            u for st in loss_body if order[id(st)] < order[id(s)] for u in names_of(st).used}
        # what it reads of the loss function's names, computed before it in this iteration
        # (one read before any such statement, loss.item() at the top of the loop body,
        # is the previous iteration's value: the statement stays before the step)
        fresh = {d for st in loss_body if order[id(st)] < order[id(s)]
                 for d in names_of(st).assigned}
        (post_dep if set(names_of(s).used) & set(defined) & fresh or _restores_dtype(s)
         or rebinds else pre).append(s)
    # batch expressions (X[i:i + 4], train_x[idx]) are computed by the caller and passed in:
    # their indices may be Python ints that a jit-compiled function cannot slice with
    taken0 = set(used_later) | set(loop_names) | {u for st in loss_body
                                                  for u in names_of(st).used}
    lifter = _LiftBatches({*models, *defined}, loop_names, taken0)
    loss_body = [st.visit(lifter) for st in loss_body]
    free = []
    # names the loss body reads before it binds them (``output, hidden = model(x, hidden)``,
    # a recurrent state carried between steps): arguments of the step and of the loss function
    carried = _read_before_bound(loss_body, set(models))
    for s in loss_body:
        n = names_of(s)
        for u in n.used:
            if u not in models and u not in free and (u not in defined and u in loop_names
                                                      or u in carried):
                free.append(u)
    taken = set(used_later) | set(loop_names) | {u for st in loss_body
                                                  for u in names_of(st).used}
    loss_fn = _fresh("loss_fn", taken)
    grads = _fresh("grads", taken)
    vg_clip = clip_line.format(grads=grads)
    head = ([STATE] if closure else [GRAPHDEF, STATE]) if functional else [*models,
                                                                                *optimizers]
    params = ", ".join([*head, *free, *(n for n, _ in lifter.lifted)])
    loss_params = ", ".join([*models, *carried])
    argnums = f", argnums={tuple(range(len(models)))}" if joint or group else ""
    call_args = ", ".join([*head, *free, *(code(e) for _, e in lifter.lifted)])
    first = loss_body[0]
    if isinstance(first, cst.SimpleStatementLine):  # its blank lines go to the call
        loss_body[0] = first.with_changes(leading_lines=[])
    inner = "".join("        " + line + "\n" for s in loss_body
                    for line in cst.Module(body=[s]).code.rstrip("\n").split("\n"))
    if aux:
        ret_inner = f"        return {loss}, ({tuple_text(aux)})\n"
        vg = (f"    ({loss}, ({tuple_text(aux)})), {grads} = "
              f"nnx.value_and_grad({loss_fn}{argnums}, has_aux=True)({loss_params})\n")
        ret = f"    return {loss}, {', '.join(aux)}\n"
        lhs = f"{loss}, {', '.join(aux)}"
    else:
        ret_inner = f"        return {loss}\n"
        vg = f"    {loss}, {grads} = nnx.value_and_grad({loss_fn}{argnums})({loss_params})\n"
        ret = f"    return {loss}\n"
        lhs = loss
    if grads_out is not None:
        # the gradients summed into the accumulator (``grads_out``, None after zero_grad)
        # in the compiled step, as backward() sums into .grad
        ret = ret.rstrip("\n") + f", {grads}\n"
        lhs = f"{lhs}, {grads_out}"
        acc = _fresh("acc", taken | {grads})
        params = params.replace(f"{model}, {optimizer}", f"{model}, {acc}", 1)
        call_args = call_args.replace(f"{model}, {optimizer}", f"{model}, {grads_out}", 1)
        add = (f"    {grads} = {grads} if {acc} is None else jax.tree.map(jnp.add, {acc}, "
               f"{grads})\n")
        src = (f"{nnx_jit(tree_mode)}\ndef {step_name}({params}):\n"
               f"    def {loss_fn}({loss_params}):\n{inner}{ret_inner}{vg}{add}{ret}")
    elif functional:
        ret = ret.replace("    return ", f"    return nnx.state(({model}, {optimizer})), ", 1)
        lhs = f"{STATE}, {lhs}"
        static = python_conditions(loss_body, free)
        names = f", static_argnames={tuple(static)!r}" if static else ""
        jit = (f"@partial(jax.jit, donate_argnums=0{names})" if closure else
               f"@partial(jax.jit, static_argnums=0, donate_argnums=1{names})")
        src = (f"{jit}\n"
               f"def {step_name}({params}):\n"
               f"    {model}, {optimizer} = nnx.merge({GRAPHDEF}, {STATE})\n"
               f"    def {loss_fn}({loss_params}):\n{inner}{ret_inner}"
               f"{vg}{vg_clip}    {optimizer}.update({model}, {grads})\n{ret}")
    else:
        # (jointly: each optimizer updates its model with the gradient of its argument)
        update = "".join(f"    {o}.update({mo}, {grads}[{i}])\n" for i, (o, mo) in enumerate(
            zip(optimizers, models))) if joint else (
            f"    {optimizer}.update(({', '.join(models)}), {grads})\n" if group
            else f"    {optimizer}.update({model}, {grads})\n")
        src = (f"{nnx_jit(tree_mode, python_conditions(loss_body, free))}\n"
               f"def {step_name}({params}):\n"
               f"    def {loss_fn}({loss_params}):\n{inner}{ret_inner}"
               f"{vg}{vg_clip}{update}{ret}")
    fn = cst.parse_statement(src)
    assert isinstance(fn, cst.FunctionDef)
    call_stmt = cst.parse_statement(f"{lhs} = {step_name}({call_args})\n")
    if isinstance(first, cst.SimpleStatementLine) and first.leading_lines:
        call_stmt = call_stmt.with_changes(leading_lines=first.leading_lines)
    keep = [cst.parse_statement(f"self.{kept_attr} = {kept_attr}\n")] if kept_attr else []
    new_body = [*pre, *early, call_stmt, *keep, *post_dep, *after]
    record = None if grads_out is not None else TrainStepRecord(
        step_name, model, optimizer, functional=functional, closure=closure and functional)
    return TrainStep(function=fn, body=new_body, call=call_stmt, functional=functional,
                     closure=closure and functional, record=record)


def joint_pairs(body: Sequence[cst.BaseStatement], optimizer: str,
                model_of: dict[str, str | None]) -> list[tuple[str, str]]:
    """The other ``(optimizer, model)`` pairs whose ``step()`` follows the body's one
    ``backward()`` as ``optimizer``'s does (``loss.backward(); encoder_optimizer.step();
    decoder_optimizer.step()``), each over another model: one step differentiates the loss
    with respect to every model (build_train_step's ``joint``)."""
    back = [i for i, s in enumerate(body) if _is_method_stmt(s, None, "backward")]
    if len(back) != 1:
        return []
    stepped = [o for s in body[back[0] + 1:]
               if (o := _is_method_stmt(s, set(model_of), "step")) is not None
               and not s.body[0].value.args]
    if optimizer not in stepped or len(set(stepped)) != len(stepped):
        return []
    pairs = [(o, model_of[o]) for o in stepped if o != optimizer]
    models = [model_of[optimizer], *(mo for _, mo in pairs)]
    if any(mo is None for mo in models) or len(set(models)) != len(models):
        return []
    return pairs


def _read_before_bound(loss_body: Sequence[cst.BaseStatement], model: str | set[str]
                       ) -> list[str]:
    """The names a statement of ``loss_body`` reads before any statement of it binds them,
    that one of its statements binds (in order of first read)."""
    bound: set[str] = set()
    read_first: list[str] = []
    for s in loss_body:
        n = names_of(s)
        read_first += [u for u in n.used if u not in bound and u not in read_first
                       and u not in ({model} if isinstance(model, str) else model)]
        bound |= set(n.assigned)
    return [u for u in read_first if u in bound]


def _sets_hyperparameter(stmt: cst.BaseStatement, optimizer: str) -> bool:
    """``optimizer.opt_state.hyperparams[...].value = v``: an injected hyperparameter set."""
    slot = m.Attribute(attr=m.Name("value"), value=m.Subscript(value=m.Attribute(
        attr=m.Name("hyperparams"), value=m.Attribute(value=m.Name(optimizer),
                                                     attr=m.Name("opt_state")))))
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(target=slot)])]))


GRAPHDEF, STATE = "graphdef", "train_state"


def functional_loop(step: TrainStep, model: str, optimizer: str
                    ) -> tuple[list[cst.BaseStatement], list[cst.BaseStatement],
                               list[cst.BaseStatement]] | None:
    """(statements before the loop, the loop's body, statements after it) for a functional
    step, or None when the body uses the model or the optimizer outside the step call: their
    arrays are donated to the step until the loop ends. An autocast region's dtype switches
    move out of the loop with the split."""
    objects = {model, optimizer, GRAPHDEF, STATE}
    before: list[cst.BaseStatement] = []
    after: list[cst.BaseStatement] = []
    body: list[cst.BaseStatement] = []
    for s in step.body:
        if s is step.call:
            body.append(s)
        elif _sets_dtype(s, model):
            (after if _restores_dtype(s) else before).append(s)
        elif set(names_of(s).used) & objects or set(names_of(s).assigned) & objects:
            read = _optimizer_state_reads(s, model, optimizer)
            if read is None:
                return None
            body.append(read)
        else:
            body.append(s)
    split = cst.parse_statement(f"{GRAPHDEF}, {STATE} = nnx.split(({model}, {optimizer}))\n")
    update = cst.parse_statement(f"nnx.update(({model}, {optimizer}), {STATE})\n")
    return [*before, split], body, [update, *after]


# the optimizer's own state that a loop may read or set between functional steps: its update
# count and its optax state (injected hyperparameters such as the learning rate)
_OPTIMIZER_STATE = frozenset({"step", "opt_state"})


class _OptimizerState(NoAttributeHooks, cst.CSTTransformer):
    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.optimizer = optimizer

    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node.value, m.Name(self.optimizer)) and (
                updated_node.attr.value in _OPTIMIZER_STATE):
            # nnx.split((model, optimizer)): entry 1 of the state is the optimizer's
            return updated_node.with_changes(value=cst.parse_expression(f"{STATE}[1]"))
        return updated_node


def _optimizer_state_reads(stmt: cst.BaseStatement, model: str, optimizer: str
                           ) -> cst.BaseStatement | None:
    """``stmt`` with its reads and writes of ``optimizer.step`` / ``optimizer.opt_state``
    turned into the split state's (``train_state[1].step``), or None when it uses the model
    or the optimizer in any other way. A log line ``scheduler(optimizer.step[...])`` and a
    per-step ``optimizer.opt_state.hyperparams["learning_rate"].value = lr`` then leave the
    functional step in place: the state between steps is ``train_state``."""
    n = names_of(stmt)
    if set(n.assigned) & {model, optimizer, GRAPHDEF, STATE} or set(n.used) & {
            model, GRAPHDEF, STATE}:
        return None
    new = stmt.visit(_OptimizerState(optimizer))
    if {model, optimizer, GRAPHDEF} & set(names_of(new).used):
        return None
    return new


def _sets_dtype(stmt: cst.CSTNode, model: str) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call(
        func=m.Attribute(value=m.Name(model), attr=m.Name("set_attributes")),
        args=[m.Arg(keyword=m.Name("dtype")), m.ZeroOrMore()]))]))


def _restores_dtype(stmt: cst.CSTNode) -> bool:
    """``model.set_attributes(dtype=None, ...)``: the end of an autocast region, which goes
    after the step (passes/data.py)."""
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.Call(
        func=m.Attribute(attr=m.Name("set_attributes")),
        args=[m.Arg(keyword=m.Name("dtype"), value=m.Name("None")), m.ZeroOrMore()]))]))


class _LiftBatches(cst.CSTTransformer):
    """Replace the largest sub-expressions that read loop variables but not the model (nor
    what the loss function computes) with parameters named after them."""

    def __init__(self, deps: set[str], loop_names: set[str], taken: set[str]) -> None:
        super().__init__()
        self.deps = deps
        self.loop_names = loop_names
        self.taken = set(taken)
        self.lifted: list[tuple[str, cst.BaseExpression]] = []
        self._replace: dict[int, str] = {}

    def visit_AssignTarget(self, node) -> bool:
        return False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.BaseExpression) and not isinstance(
                node, (cst.Name, cst.Lambda)) and not isinstance(node, cst.BaseSlice):
            used = set(names_of(node).used)
            if used & self.loop_names and not used & self.deps:
                for name, prev in self.lifted:  # the same expression twice: one parameter
                    if prev.deep_equals(node):
                        self._replace[id(node)] = name
                        return False
                name = _fresh(_batch_name(node), self.taken)
                self.taken.add(name)
                self.lifted.append((name, node))
                self._replace[id(node)] = name
                return False
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        name = self._replace.get(id(original_node))
        if name is not None:
            return cst.Name(name)
        return super().on_leave(original_node, updated_node)


def _batch_name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name):
        return node.value.value.lower() + "_batch"
    return "batch"


def _fresh(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    i = 2
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


def loop_assigned_names(loop: cst.CSTNode) -> set[str]:
    """Names a loop binds (its target and every assignment in its body)."""
    return set(names_of(loop).assigned)


# ---------------------------------------------------------------------------- optimizers
_PRED_METHODS = {r"\.dim\(\)": ".ndim", r"\.numel\(\)": ".size", r"\.ndimension\(\)": ".ndim"}


class _Trainable(cst.CSTTransformer):
    """``p.requires_grad`` -> ``True``: the parameters an optimizer holds are trainable (a
    frozen layer's are not ``nnx.Param`` once converted, so the optimizer never sees them), and
    ``True and c`` / ``c and True`` -> ``c``."""

    def leave_Attribute(self, original_node, updated_node):
        if updated_node.attr.value == "requires_grad" and isinstance(updated_node.value,
                                                                      cst.Name):
            return cst.Name("True")
        return updated_node

    def leave_BooleanOperation(self, original_node, updated_node):
        if isinstance(updated_node.operator, cst.And):
            if m.matches(updated_node.left, m.Name("True")):
                return updated_node.right
            if m.matches(updated_node.right, m.Name("True")):
                return updated_node.left
        return updated_node


def predicate_text(pred: cst.BaseExpression) -> str:
    """A parameter group's condition on the parameter as JAX (``p.dim()`` -> ``p.ndim``,
    ``p.requires_grad`` -> True); raises Untranslatable for another method call."""
    import re

    text = code(pred.visit(_Trainable()))
    for pat, rep in _PRED_METHODS.items():
        text = re.sub(pat, rep, text)
    text = re.sub(r"\.size\(\)", ".shape", text)
    if re.search(r"\.\w+\(", text) or "requires_grad" in text:
        raise Untranslatable(f"parameter-group condition {code(pred)!r} not translated")
    return text


def group_mask(groups, build) -> tuple[dict[str, cst.BaseExpression],
                                       cst.BaseExpression | None]:
    """Parameter groups as optax options: ``(overrides, mask)`` when the groups differ only in
    weight decay and one of them has none (nanoGPT's "no decay for biases and norms");
    raises Untranslatable otherwise (``multi_transform`` is built by the caller)."""
    if len(groups) != 2:
        raise Untranslatable(f"{len(groups)} parameter groups (a mask takes two)")
    if any(g.paths is not None for g in groups):
        raise Untranslatable("parameter groups by submodule (a mask needs the groups to cover "
                             "every parameter)")
    keys = set(groups[0].options) | set(groups[1].options)
    if keys - {"weight_decay"}:
        raise Untranslatable("parameter groups that differ in " + ", ".join(
            sorted(keys - {"weight_decay"})) + " (only weight_decay is translated)")
    zero = [i for i, g in enumerate(groups)
            if try_literal(g.options.get("weight_decay"), ...) in (0, 0.0)]
    if len(zero) != 1:
        raise Untranslatable("parameter groups without a group that has weight_decay=0")
    decayed = groups[1 - zero[0]]
    if decayed.names is not None:
        # selected by torch's parameter names: the same names of the NNX parameters
        # (torch_parameter_name, passes/helpers.py), so the mask is computed from the
        # converted model's structure
        mask = expr("lambda params: jax.tree_util.tree_map_with_path("
                    "lambda path, _: torch_parameter_name(path) in {names}, params)",
                    names=decayed.names)
        overrides = {}
        if "weight_decay" in decayed.options:
            overrides["weight_decay"] = decayed.options["weight_decay"]
        return overrides, mask
    if decayed.predicate is None:
        raise Untranslatable("the decayed parameter group selects every parameter")
    p = decayed.param
    if decayed.name_param is not None:  # a condition on the torch name: the key paths'
        mask = expr(f"lambda params: jax.tree_util.tree_map_with_path("
                    f"lambda path, p: {group_test(decayed)}, params)")
    else:
        pred = predicate_text(decayed.predicate)
        mask = expr(f"lambda params: jax.tree.map(lambda {p}: {pred}, params)")
    overrides = {}
    if "weight_decay" in decayed.options:
        overrides["weight_decay"] = decayed.options["weight_decay"]
    return overrides, mask


def group_test(group) -> str | None:
    """The condition on ``(path, p)`` (a parameter's key path and array) that selects the
    group's parameters; None: every parameter."""
    if group.names is not None:
        return f"torch_parameter_name(path) in {code(group.names)}"
    if group.paths is not None:
        tests = [f'torch_parameter_name(path).startswith("{q}")' if q.endswith(".")
                 else f'torch_parameter_name(path) == "{q}"' for q in group.paths]
        return " or ".join(tests) if len(tests) == 1 else "(" + " or ".join(tests) + ")"
    if group.predicate is None:
        return None
    pred = group.predicate.visit(RenameNames({group.param: "p"}))
    if group.name_param is not None:  # the parameter's torch name, from its key path
        pred = pred.visit(_NameAsExpression(group.name_param, "torch_parameter_name(path)"))
    return predicate_text(pred)


class _NameAsExpression(cst.CSTTransformer):
    """Every read of the name ``name`` -> the expression ``value`` (parenthesised)."""

    def __init__(self, name: str, value: str) -> None:
        super().__init__()
        self.name, self.value = name, value

    def leave_Name(self, original_node, updated_node):
        if updated_node.value == self.name:
            return cst.parse_expression(self.value)
        return updated_node


def group_transform(groups, opt) -> cst.BaseExpression:
    """Parameter groups with their own options (lr, weight decay, betas, ...) as
    ``optax.multi_transform``: one transform per group, built with the group's options over the
    optimizer's, and a label per parameter from the group that selects it (torch refuses a
    parameter in two groups, so the first test that holds is its group). A parameter that no
    group selects is not updated by torch: the label ``frozen``, ``optax.set_to_zero()``."""
    tests = [group_test(g) for g in groups]
    if None in tests and len(groups) > 1:
        raise Untranslatable("a parameter group that selects every parameter beside other "
                             "groups (torch raises: a parameter in two groups)")
    labels = []
    for i, g in enumerate(groups):
        label = f"group{i}"
        if g.paths is not None and len(g.paths) == 1 and g.paths[0].endswith("."):
            name = g.paths[0][:-1].replace(".", "_")
            if name.isidentifier() and name not in labels:
                label = name
        labels.append(label)
    transforms = {label: opt.build(overrides=g.options) for label, g in zip(labels, groups)}
    if None in tests:  # one group of every parameter
        choose = f'"{labels[0]}"'
    else:
        choose = " else ".join(f'"{label}" if {t}' for label, t in zip(labels, tests)) + \
            ' else "frozen"'
        transforms["frozen"] = expr("optax.set_to_zero()")
    fn = f"lambda params: jax.tree_util.tree_map_with_path(lambda path, p: {choose}, params)"
    items = ", ".join(f'"{label}": {code(tx)}' for label, tx in transforms.items())
    return cst.parse_expression(f"optax.multi_transform({{{items}}}, {fn})")


def optimizer_object(model: str, tx: cst.BaseExpression,
                     wrt: cst.BaseExpression | None = None,
                     group: Sequence[str] | None = None) -> cst.BaseExpression:
    """``nnx.Optimizer(model, tx, wrt=...)``; over the tuple of the models of ``group``
    (one optimizer of several models' parameters: its update takes the same tuple)."""
    held = expr(f"({', '.join(group)})") if group else cst.Name(model)
    return call("nnx.Optimizer", arg(held), arg(tx), arg(wrt or expr("nnx.Param"), "wrt"))


def lr_slot(optimizer: str, quote: str = '"') -> str:
    return f"{optimizer}.opt_state.hyperparams[{quote}learning_rate{quote}].value"


# ---------------------------------------------------------------------------- evaluation
EVAL_STEP = "eval_step"


class JitModelCalls(cst.CSTTransformer):
    """``model(x)`` -> ``eval_step(model, *extra, x)`` in evaluation code (former no_grad
    blocks); linen passes its variables as ``extra``."""

    def __init__(self, models: set[str], extra: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.models = models
        self.extra = extra
        self.count = 0

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_Lambda(self, node) -> bool:
        return False

    def leave_Call(self, original_node, updated_node):
        f = updated_node.func
        if isinstance(f, cst.Name) and f.value in self.models and not any(
                a.keyword or a.star for a in updated_node.args):
            self.count += 1
            return call(EVAL_STEP, arg(f), *(arg(cst.Name(e)) for e in self.extra),
                        *updated_node.args)
        return updated_node


def nnx_jit(tree_mode: bool, static: Sequence[str] = ()) -> str:
    """The decorator of an emitted step: flax's tree mode (``graph=False``) flattens the
    module as a pytree instead of walking its graph in Python on every call (2-4x less
    per-call time for small models on a GPU, docs/performance.md); it refuses modules that
    share a Variable, so files whose modules alias attributes keep the graph mode.
    ``static``: arguments that decide the step's Python control flow (one compilation for
    each of their values)."""
    options = (["graph=False"] if tree_mode else []) + (
        [f"static_argnames={tuple(static)!r}"] if static else [])
    return f"@nnx.jit({', '.join(options)})" if options else "@nnx.jit"


def python_conditions(body: Sequence[cst.BaseStatement], names: Sequence[str]) -> list[str]:
    """Of ``names``, those ``body`` tests for truth or compares in an ``if``, ``while`` or
    conditional expression (``if use_teacher_forcing:``, ``if epoch < warmup``: a Python
    value deciding the code, which a traced argument cannot: the step takes them static).
    Only a name that is itself an operand counts: one tested with ``is`` / ``is not`` (``if
    mask is not None``) or read through an attribute, a subscript or a call (``x.shape[0] >
    1``, ``len(x)``: static under a trace already) stays traced."""
    wanted, found = set(names), set()

    def operands(test: cst.BaseExpression) -> None:
        if isinstance(test, cst.Name):
            if test.value in wanted:
                found.add(test.value)
        elif isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            operands(test.expression)
        elif isinstance(test, cst.BooleanOperation):
            operands(test.left)
            operands(test.right)
        elif isinstance(test, cst.Comparison) and not any(
                isinstance(t.operator, (cst.Is, cst.IsNot)) for t in test.comparisons):
            operands(test.left)
            for t in test.comparisons:
                operands(t.comparator)

    for st in body:
        for node in findall(st, m.If() | m.While() | m.IfExp()):
            operands(node.test)
    return [n for n in names if n in found]


def eval_step_function(tree_mode: bool = False) -> cst.FunctionDef:
    fn = cst.parse_statement(
        f"{nnx_jit(tree_mode)}\ndef {EVAL_STEP}(model, *inputs):\n    return model(*inputs)\n")
    assert isinstance(fn, cst.FunctionDef)
    return fn.with_changes(leading_lines=[cst.EmptyLine(indent=False),
                                          cst.EmptyLine(indent=False)])
