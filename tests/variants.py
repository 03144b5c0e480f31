"""Semantics-preserving variants of the torch training programs (issue 28).

Each transform below rewrites a TORCH program's source (libcst) into another program that
computes the same thing: a ``for`` over ``range`` as a ``while`` with a counter, the training
step moved into a function or a method, ``zero_grad()`` moved after the step, k micro-steps
of ``loss / k`` on the same batch, the
forward under a disabled autocast or a ``nullcontext``, the evaluation under ``no_grad``,
temporaries named or inlined, the loader built from ``**kwargs`` or wrapped in a class, the
constants in a dict, an argparse namespace or a dataclass, renamed variables, and the prints
sent through a logger object or a dict of metrics. A transform returns ``None`` where it does
not apply to a program; transforms compose (applied in order).

A variant is checked in three steps (``check``):

1. the torch variant prints the same as the torch original (this validates the generator: a
   difference here is a generator bug, never a converter one);
2. the variant converts with no error diagnostic and no ``TODO(torch2jax)``;
3. the converted variant runs and prints the same as the converted original (numbers within
   ``rtol``).

Programs run in-process (``exec`` with the printed lines captured), so one process pays for
the torch and JAX imports once. The CI sample is tests/test_variants.py; a larger random
sweep (combinations drawn by hypothesis from a seed) is::

    python -m tests.variants --count 1000 --seed 0

run from the repository root (docs/training.md, "Testing by variants").
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
TRAINING = ROOT / "fixtures" / "training"

# --------------------------------------------------------------------------------------------
# libcst helpers


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text)


def _expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def _identifiers(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", source))


def _fresh(source: str, base: str) -> str:
    names = _identifiers(source)
    if base not in names:
        return base
    k = 2
    while f"{base}{k}" in names:
        k += 1
    return f"{base}{k}"


def _has(node: cst.CSTNode, *texts: str) -> bool:
    code = _code(node)
    return any(t in code for t in texts)


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _header_end(module: cst.Module) -> int:
    """The index after the docstring and the leading imports (``__future__`` included)."""
    end = 0
    for i, stmt in enumerate(module.body):
        if _is_import(stmt) or (i == 0 and _is_docstring(stmt)):
            end = i + 1
        else:
            break
    return end


def _insert_after_header(module: cst.Module, stmts: list[cst.BaseStatement],
                         imports: Iterable[str] = ()) -> cst.Module:
    body = list(module.body)
    end = _header_end(module)
    have = module.code
    new_imports = [_stmt(i) for i in imports if i not in have]
    return module.with_changes(body=[*body[:end], *new_imports, *stmts, *body[end:]])


def _bodies(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Every node holding a statement list (module, indented blocks)."""
    found: list[cst.CSTNode] = []

    class V(cst.CSTVisitor):
        def visit_Module(self, n):
            found.append(n)

        def visit_IndentedBlock(self, n):
            found.append(n)

    node.visit(V())
    return found


class _ReplaceBody(cst.CSTTransformer):
    """Replace one statement list (found by identity) with new statements."""

    def __init__(self, target: cst.CSTNode, stmts: list[cst.BaseStatement]):
        self.target, self.stmts = target, stmts

    def leave_IndentedBlock(self, original, updated):
        if original is self.target:
            return updated.with_changes(body=self.stmts)
        return updated

    def leave_Module(self, original, updated):
        if original is self.target:
            return updated.with_changes(body=self.stmts)
        return updated


def _replace_body(module: cst.Module, target: cst.CSTNode,
                  stmts: list[cst.BaseStatement]) -> cst.Module:
    return module.visit(_ReplaceBody(target, stmts))


def _loads_stores(code: str) -> tuple[list[str], set[str]]:
    """The names a piece of code reads before it binds them (in evaluation order), and the
    names it binds (comprehension variables excluded)."""
    tree = ast.parse(code)
    stored: set[str] = set()
    first_loads: list[str] = []

    class V(ast.NodeVisitor):
        def visit_Name(self, n):
            if isinstance(n.ctx, ast.Load):
                if n.id not in stored and n.id not in first_loads:
                    first_loads.append(n.id)
            else:
                stored.add(n.id)

        def visit_Assign(self, n):
            self.visit(n.value)
            for t in n.targets:
                self.visit(t)

        def visit_AnnAssign(self, n):
            if n.value is not None:
                self.visit(n.value)
            self.visit(n.target)

        def visit_AugAssign(self, n):
            self.visit(n.value)
            if isinstance(n.target, ast.Name):
                if n.target.id not in stored and n.target.id not in first_loads:
                    first_loads.append(n.target.id)
                stored.add(n.target.id)
            else:
                self.visit(n.target)

        def _comp(self, n):
            for g in n.generators:
                self.visit(g.iter)

        visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comp

        def visit_Lambda(self, n):
            pass

    V().visit(tree)
    return first_loads, stored


def _scope_names(code: str) -> set[str]:
    """Every name bound or read anywhere in ``code``."""
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)} | {
        a.arg for a in ast.walk(ast.parse(code)) if isinstance(a, ast.arg)}


# --------------------------------------------------------------------------------------------
# the transforms

Transform = Callable[[str], "str | None"]
TRANSFORMS: dict[str, Transform] = {}
# transforms of one group are alternatives: a combination takes at most one of each
GROUPS: dict[str, str] = {}


def transform(name: str, group: str | None = None):
    def register(fn: Transform) -> Transform:
        TRANSFORMS[name] = fn
        GROUPS[name] = group or name
        return fn
    return register


def _changed(source: str, module: cst.Module) -> str | None:
    code = module.code
    return None if code == source else code


# --- renamed variables ----------------------------------------------------------------------

RENAMES = {"model": "net", "optimizer": "opt", "loss": "batch_loss", "xb": "inputs",
           "yb": "targets", "scheduler": "sched", "criterion": "loss_fn", "epoch": "ep",
           "logits": "scores", "out": "output", "step": "it", "x": "features", "y": "labels"}


class _NameReads(cst.CSTTransformer):
    """A transformer of variable reads: ``skip`` holds the Names that are attribute names
    (``x.model``) or keywords (``f(model=...)``), which are not variables."""

    def __init__(self):
        self.skip: set[int] = set()

    def visit_Attribute(self, node):
        self.skip.add(id(node.attr))

    def visit_Arg(self, node):
        if node.keyword is not None:
            self.skip.add(id(node.keyword))


class _Rename(_NameReads):
    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    def leave_Name(self, original, updated):
        if id(original) in self.skip or original.value not in self.names:
            return updated
        return updated.with_changes(value=self.names[original.value])


@transform("rename")
def rename(source: str) -> str | None:
    module = cst.parse_module(source)
    names = _identifiers(source)
    keywords = {n.keyword.value for n in _find(module, cst.Arg) if n.keyword is not None}
    imported = {a.evaluated_alias or a.evaluated_name for a in _find(module, cst.ImportAlias)}
    chosen = {old: new for old, new in RENAMES.items()
              if old in names and new not in names and old not in keywords
              and old not in imported}
    if not chosen:
        return None
    return _changed(source, module.visit(_Rename(chosen)))


def _find(node: cst.CSTNode, kind: type) -> list:
    found: list = []

    class V(cst.CSTVisitor):
        def on_visit(self, n):
            if isinstance(n, kind):
                found.append(n)
            return True

    node.visit(V())
    return found


# --- for versus while with a counter ---------------------------------------------------------


class _ForToWhile(cst.CSTTransformer):
    def __init__(self, source: str):
        self.source = source
        self.count = 0

    def leave_For(self, original, updated):
        it = updated.iter
        if (updated.orelse is not None or updated.asynchronous is not None
                or not isinstance(updated.target, cst.Name)
                or not isinstance(it, cst.Call) or _code(it.func) != "range"
                or not 1 <= len(it.args) <= 3 or any(a.keyword or a.star for a in it.args)
                or _find(updated.body, cst.Continue)):
            return updated
        args = [a.value for a in it.args]
        start, stop, step = ((cst.Integer("0"), args[0], cst.Integer("1")) if len(args) == 1
                             else (args[0], args[1], cst.Integer("1")) if len(args) == 2
                             else tuple(args))
        if not (isinstance(step, cst.Integer) and int(step.value) > 0):
            return updated
        self.count += 1
        counter = _fresh(self.source, f"_{updated.target.value}_n{self.count}")
        pre = [_stmt(f"{counter} = {_code(start)}\n")]
        if not isinstance(stop, (cst.Integer, cst.Name)):
            limit = _fresh(self.source, f"_stop{self.count}")
            pre.append(_stmt(f"{limit} = {_code(stop)}\n"))
            stop_code = limit
        else:
            stop_code = _code(stop)
        body = [_stmt(f"{updated.target.value} = {counter}\n"), *updated.body.body,
                _stmt(f"{counter} += {step.value}\n")]
        loop = cst.While(test=_expr(f"{counter} < {stop_code}"),
                         body=updated.body.with_changes(body=body),
                         leading_lines=updated.leading_lines)
        return cst.FlattenSentinel([*pre, loop])


@transform("for_to_while", group="loop")
def for_to_while(source: str) -> str | None:
    return _changed(source, cst.parse_module(source).visit(_ForToWhile(source)))


# --- a for loop versus a while loop drawing next() batches -----------------------------------

def _enumerated(loop: cst.For) -> tuple[cst.BaseExpression, str, cst.BaseExpression,
                                        cst.BaseExpression] | None:
    """``for i, b in enumerate(xs[, start])``: (i's target, i's name, b's target, xs, start)."""
    it, t = loop.iter, loop.target
    if not (isinstance(it, cst.Call) and _code(it.func) == "enumerate" and isinstance(
            t, cst.Tuple) and len(t.elements) == 2 and isinstance(t.elements[0].value, cst.Name)
            and 1 <= len(it.args) <= 2 and not any(a.star for a in it.args)
            and it.args[0].keyword is None):
        return None
    start = it.args[1].value if len(it.args) == 2 else cst.Integer("0")
    return t.elements[0].value.value, t.elements[1].value, it.args[0].value, start


@transform("while_next", group="loop")
def while_next(source: str) -> str | None:
    """The training loop ``for b in xs:`` as ``batches = iter(xs)`` and ``while True:`` drawing
    ``b = next(batches)`` until ``StopIteration``; ``for i, b in enumerate(xs)`` the same with
    ``i`` a step counter (``i += 1`` at the end of the body, so not with ``continue``)."""
    module = cst.parse_module(source)
    loop = _step_loop(module)
    if not isinstance(loop, cst.For) or loop.orelse is not None or loop.asynchronous:
        return None
    it_name = _fresh(source, "batches")
    counted = _enumerated(loop)
    pre, post = [], []
    target, iterable = loop.target, loop.iter
    if counted is not None:
        if _find(loop.body, cst.Continue):
            return None
        counter, target, iterable, start = counted
        pre = [_stmt(f"{counter} = {_code(start)}\n")]
        post = [_stmt(f"{counter} += 1\n")]
    draw = cst.parse_statement(
        f"try:\n    {_code(target).strip('()') if isinstance(target, cst.Tuple) else _code(target)}"
        f" = next({it_name})\nexcept StopIteration:\n    break\n")
    body = [draw, *loop.body.body, *post]
    new = cst.While(test=cst.Name("True"), body=loop.body.with_changes(body=body))
    pre = [*pre, _stmt(f"{it_name} = iter({_code(iterable)})\n")]
    pre[0] = pre[0].with_changes(leading_lines=loop.leading_lines)

    class _Swap(cst.CSTTransformer):
        def leave_For(self, original, updated):
            return cst.FlattenSentinel([*pre, new]) if original is loop else updated

    return _changed(source, module.visit(_Swap()))


# --- the step in a function or a method ------------------------------------------------------

_STEP_MARKS = (".backward(", "zero_grad(", "optimizer.step(", "scaler.step(")


def _step_loop(module: cst.Module):
    """The innermost loop whose own body holds the backward and the optimizer step."""
    best = None
    for loop in _find(module, (cst.For, cst.While)):
        stmts = loop.body.body
        if (any(_has(s, ".backward(") for s in stmts)
                and any(_has(s, "step(") and not _has(s, ".backward(") for s in stmts)):
            best = loop  # _find visits outer loops first
    return best


def _enclosing_scope(module: cst.Module, target: cst.CSTNode):
    """The function definition enclosing ``target`` (None at module level) and the top-level
    statement holding it."""
    top = next(s for s in module.body if _contains(s, target))
    scope = None
    for fn in _find(top, cst.FunctionDef):
        if _contains(fn, target):
            scope = fn
    return scope, top


def _contains(node: cst.CSTNode, target: cst.CSTNode) -> bool:
    return any(n is target for n in _find(node, type(target)))


def _extract_step(source: str, as_method: bool) -> str | None:
    module = cst.parse_module(source)
    loop = _step_loop(module)
    if loop is None:
        return None
    stmts = list(loop.body.body)
    last = max(i for i, s in enumerate(stmts) if _has(s, *_STEP_MARKS))
    chunk = stmts[:last + 1]
    if any(_find(s, k) for s in chunk for k in (cst.Continue, cst.Break, cst.Return,
                                               cst.Yield, cst.Global, cst.Nonlocal)):
        return None
    scope, _top = _enclosing_scope(module, loop)
    chunk_code = "".join(_code(s) for s in chunk)
    loads, stores = _loads_stores(chunk_code)
    scope_code = _code(scope) if scope is not None else source
    bound = _scope_names(scope_code) if scope is not None else {
        n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Store)}
    # the file's imports (torch, F) are globals the function reads as its caller did: no one
    # passes a module as an argument
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(ast.parse(source))
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    bound -= imported
    params = [n for n in loads if n in bound]
    if scope is not None:
        outer = [a.arg for a in ast.walk(ast.parse(scope_code)) if isinstance(a, ast.arg)]
        params = [n for n in loads if n in bound or n in outer]
    returns = sorted(stores)
    name = _fresh(source, "train_one_step")
    ret = f"    return {', '.join(returns)}\n" if returns else ""
    body = "".join("    " + line + "\n" if line.strip() else "\n"
                   for line in chunk_code.rstrip("\n").split("\n"))
    args = ", ".join(params)
    if as_method:
        cls = _fresh(source, "StepRunner")
        obj = _fresh(source, "step_runner")
        method_body = "".join("    " + line + "\n" if line.strip() else "\n"
                              for line in (body + ret).rstrip("\n").split("\n"))
        defs = [_stmt(f"class {cls}:\n    def {name}(self{', ' if args else ''}{args}):\n"
                      f"{method_body}"),
                _stmt(f"{obj} = {cls}()\n")]
        call = f"{obj}.{name}({args})"
    else:
        defs = [_stmt(f"def {name}({args}):\n{body}{ret}")]
        call = f"{name}({args})"
    line = (f"{', '.join(returns)} = {call}\n" if returns else f"{call}\n")
    new_body = [_stmt(line), *stmts[last + 1:]]
    module = _replace_body(module, loop.body, new_body)
    body_list = list(module.body)
    # the top-level statement holding the loop is the one whose code changed; insert before it
    old_codes = [_code(s) for s in cst.parse_module(source).body]
    index = next(i for i, s in enumerate(body_list) if _code(s) not in old_codes)
    defs = [d.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for d in defs]
    return module.with_changes(body=[*body_list[:index], *defs, *body_list[index:]]).code


@transform("step_in_function", group="step")
def step_in_function(source: str) -> str | None:
    return _extract_step(source, as_method=False)


@transform("step_in_method", group="step")
def step_in_method(source: str) -> str | None:
    return _extract_step(source, as_method=True)


@transform("zero_grad_at_end")
def zero_grad_at_end(source: str) -> str | None:
    """``optimizer.zero_grad()`` moved from before the forward to just after the step, as
    ``zero_grad(set_to_none=True)``: the gradients start as None in torch, so every backward
    still adds to cleared ones."""
    if ".grad" in source.replace(".grad(", "").replace("zero_grad", ""):
        return None
    module = cst.parse_module(source)
    for body in _bodies(module):
        stmts = list(body.body)
        zeros = [i for i, st in enumerate(stmts) if _is_zero_grad(st)]
        steps = [i for i, st in enumerate(stmts) if isinstance(st, cst.SimpleStatementLine)
                 and _has(st, ".step()") and not _has(st, "sched")]
        if len(zeros) != 1 or not steps or not zeros[0] < steps[0]:
            continue
        z, st = zeros[0], steps[0]
        if not any(_has(x, ".backward(") for x in stmts[z + 1:st]):
            continue
        call = stmts[z].body[0].value
        moved = stmts[z].with_changes(leading_lines=[], body=[cst.Expr(_expr(
            f"{_code(call.func)}(set_to_none=True)"))])
        rest = stmts[z + 1:]
        if stmts[z].leading_lines and rest:
            rest[0] = rest[0].with_changes(leading_lines=stmts[z].leading_lines)
        at = st - z
        new = [*stmts[:z], *rest[:at], moved, *rest[at:]]
        return _replace_body(module, body, new).code
    return None


# --- the forward slice before a backward ------------------------------------------------------


def _model_names(module: cst.Module) -> set[str]:
    return {"model"} | set(re.findall(r"(\w+)\.parameters\(\)", module.code))


def _is_zero_grad(s: cst.CSTNode) -> bool:
    return (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
            and isinstance(s.body[0], cst.Expr) and _has(s, "zero_grad("))


def _backward_sites(module: cst.Module):
    """(statement list, index of ``X.backward()``, start of the forward feeding it): the
    forward is the run of assignments just before the backward that read the model or what
    was computed from it (a ``zero_grad()`` among them is moved before them)."""
    models = _model_names(module)
    for body in _bodies(module):
        stmts = list(body.body)
        for b, s in enumerate(stmts):
            if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                    and isinstance(s.body[0], cst.Expr) and _has(s, ".backward(")):
                continue
            derived = set(models)
            included = []
            for j in range(b):
                prev = stmts[j]
                if not isinstance(prev, cst.SimpleStatementLine):
                    continue
                loads, stores = _loads_stores(_code(prev))
                if set(loads) & derived and all(isinstance(x, cst.Assign) for x in prev.body):
                    included.append(j)
                    derived |= stores
            if not included:
                continue
            start = included[0]
            if all(j in included or _is_zero_grad(stmts[j]) for j in range(start, b)):
                yield body, b, start


def _forward_and_hoisted(stmts, start, b):
    forward = [s for s in stmts[start:b] if not _is_zero_grad(s)]
    hoisted = [s for s in stmts[start:b] if _is_zero_grad(s)]
    return forward, hoisted


@transform("micro_steps")
def micro_steps(source: str) -> str | None:
    """The forward and backward repeated over 2 micro-steps of ``loss / 2`` on the same batch:
    the summed gradients are the original ones exactly (halving and doubling are exact). Not
    for models with dropout: each micro-step would draw another mask."""
    if re.search(r"dropout", source, re.IGNORECASE):
        return None
    module = cst.parse_module(source)
    for body, b, start in _backward_sites(module):
        stmts = list(body.body)
        forward, hoisted = _forward_and_hoisted(stmts, start, b)
        code = "".join(_code(s) for s in forward)
        loads, stores = _loads_stores(code)
        if (set(loads) & stores or re.search(r"rand|print|next\(|\+=|zero_grad|\.step\(", code)
                or any(isinstance(s, cst.With) for s in forward)):
            continue
        call = stmts[b].body[0].value
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if isinstance(receiver, cst.Name):
            new_receiver = _expr(f"({receiver.value} / 2)")
        elif (isinstance(receiver, cst.Call) and len(receiver.args) == 1
              and isinstance(receiver.args[0].value, cst.Name)):
            arg = receiver.args[0].value.value
            new_receiver = receiver.with_changes(args=[cst.Arg(_expr(f"{arg} / 2"))])
        else:
            continue
        backward = stmts[b].with_changes(body=[cst.Expr(call.with_changes(
            func=call.func.with_changes(value=new_receiver)))])
        counter = _fresh(source, "micro_step")
        loop = _stmt(f"for {counter} in range(2):\n    pass\n")
        loop = loop.with_changes(body=loop.body.with_changes(
            body=[s.with_changes(leading_lines=[]) for s in forward] + [backward]),
            leading_lines=forward[0].leading_lines)
        new = [*stmts[:start], *hoisted, loop, *stmts[b + 1:]]
        return _replace_body(module, body, new).code
    return None


# --- contexts: disabled autocast, nullcontext, no_grad for the evaluation ----------------------


def _wrap_forward(source: str, header: str, prelude: list[str],
                  imports: Iterable[str] = ()) -> str | None:
    module = cst.parse_module(source)
    for body, b, start in _backward_sites(module):
        stmts = list(body.body)
        forward, hoisted = _forward_and_hoisted(stmts, start, b)
        block = _stmt(f"{header}\n    pass\n")
        block = block.with_changes(body=block.body.with_changes(
            body=[s.with_changes(leading_lines=[]) for s in forward]),
            leading_lines=forward[0].leading_lines)
        module = _replace_body(module, body, [*stmts[:start], *hoisted, block, *stmts[b:]])
        return _insert_after_header(module, [_stmt(p) for p in prelude], imports).code
    return None


@transform("autocast_disabled", group="context")
def autocast_disabled(source: str) -> str | None:
    device = _fresh(source, "DEVICE_TYPE")
    return _wrap_forward(
        source,
        f"with torch.autocast(device_type={device}, dtype=torch.bfloat16, "
        f"enabled={device} == \"cuda\"):",
        [f"{device} = \"cpu\"\n"])


@transform("nullcontext", group="context")
def nullcontext(source: str) -> str | None:
    """nanoGPT's context: ``nullcontext()`` on the CPU, else autocast."""
    ctx, device = _fresh(source, "amp_ctx"), _fresh(source, "device_type")
    return _wrap_forward(
        source, f"with {ctx}:",
        [f"{device} = \"cpu\"\n",
         (f"{ctx} = (nullcontext() if {device} == \"cpu\"\n"
          f"       else torch.amp.autocast(device_type={device}, dtype=torch.bfloat16))\n")],
        ["from contextlib import nullcontext\n"])


class _NoGradEval(cst.CSTTransformer):
    """Runs of logging statements after the step (``.item()``, ``print``) in a training loop,
    under ``torch.no_grad()``."""

    def __init__(self):
        self.count = 0

    def _rewrite(self, stmts):
        out, run = [], []

        def flush():
            if run:
                self.count += 1
                block = _stmt("with torch.no_grad():\n    pass\n")
                out.append(block.with_changes(
                    body=block.body.with_changes(body=[s.with_changes(leading_lines=[])
                                                       for s in run]),
                    leading_lines=run[0].leading_lines))
                run.clear()

        seen_step = False
        for s in stmts:
            evaluation = (seen_step and isinstance(s, cst.SimpleStatementLine)
                          and all(isinstance(x, (cst.Assign, cst.Expr, cst.AugAssign))
                                  for x in s.body)
                          and _has(s, ".item()", "print(")
                          and not _has(s, *_STEP_MARKS, "step("))
            if evaluation:
                run.append(s)
            else:
                flush()
                out.append(s)
            if _has(s, "optimizer.step(", "scaler.step(", ".backward("):
                seen_step = True
        flush()
        return out

    def leave_For(self, original, updated):
        if not _has(original, ".backward("):
            return updated
        return updated.with_changes(body=updated.body.with_changes(
            body=self._rewrite(updated.body.body)))

    leave_While = leave_For


@transform("no_grad_eval")
def no_grad_eval(source: str) -> str | None:
    return _changed(source, cst.parse_module(source).visit(_NoGradEval()))


# --- temporaries named or inlined -------------------------------------------------------------


def _leftmost(e: cst.BaseExpression):
    """The sub-expressions evaluated before anything else in ``e`` (so that hoisting one of
    them out of the statement keeps the order of evaluation)."""
    yield e
    if isinstance(e, cst.Call):
        if isinstance(e.func, cst.Attribute) and not isinstance(e.func.value,
                                                                (cst.Name, cst.Attribute)):
            yield from _leftmost(e.func.value)
        elif e.args and e.args[0].keyword is None and not e.args[0].star:
            yield from _leftmost(e.args[0].value)
    elif isinstance(e, cst.BinaryOperation):
        yield from _leftmost(e.left)
    elif isinstance(e, (cst.Attribute, cst.Subscript)):
        yield from _leftmost(e.value)


def _single_assign(s: cst.CSTNode):
    if (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
            and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1):
        return s.body[0]
    return None


@transform("name_temporaries", group="temporaries")
def name_temporaries(source: str) -> str | None:
    """``loss = F.cross_entropy(model(x), y)`` -> ``out = model(x)``;
    ``loss = F.cross_entropy(out, y)``."""
    module = cst.parse_module(source)
    count = 0
    for body in _bodies(module):
        stmts, new, hit = list(body.body), [], False
        for s in stmts:
            a = _single_assign(s)
            inner = None
            if a is not None:
                for e in _leftmost(a.value):
                    if (isinstance(e, cst.Call) and e.args and e.args[0].keyword is None
                            and isinstance(e.args[0].value, cst.Call)
                            and isinstance(e.args[0].value.func, cst.Name)
                            and e.args[0].value.func.value in _model_names(module)):
                        inner = e.args[0].value
                        break
            if inner is None:
                new.append(s)
                continue
            count += 1
            temp = _fresh(source, f"model_out{count}")
            replaced = a.with_changes(value=a.value.deep_replace(inner, cst.Name(temp)))
            new.append(_stmt(f"{temp} = {_code(inner)}\n").with_changes(
                leading_lines=s.leading_lines))
            new.append(s.with_changes(body=[replaced], leading_lines=[]))
            hit = True
        if hit:
            return name_temporaries(_replace_body(module, body, new).code) or \
                _replace_body(module, body, new).code
    return None


@transform("inline_temporaries", group="temporaries")
def inline_temporaries(source: str) -> str | None:
    """``out = model(x)``; ``loss = F.cross_entropy(out, y)`` (``out`` used once) ->
    ``loss = F.cross_entropy(model(x), y)``."""
    module = cst.parse_module(source)
    for body in _bodies(module):
        counts: dict[str, int] = {}
        for n in _find(body, cst.Name):
            counts[n.value] = counts.get(n.value, 0) + 1
        stmts = list(body.body)
        for i in range(len(stmts) - 1):
            a, nxt = _single_assign(stmts[i]), _single_assign(stmts[i + 1])
            if (a is None or nxt is None or not isinstance(a.targets[0].target, cst.Name)
                    or not isinstance(a.value, cst.Call)):
                continue
            name = a.targets[0].target.value
            if counts.get(name) != 2:
                continue
            use = next((e.args[0].value for e in _leftmost(nxt.value)
                        if isinstance(e, cst.Call) and e.args and e.args[0].keyword is None
                        and isinstance(e.args[0].value, cst.Name)
                        and e.args[0].value.value == name), None)
            if use is None:
                continue
            merged = nxt.with_changes(value=nxt.value.deep_replace(use, a.value))
            new = [*stmts[:i], stmts[i + 1].with_changes(body=[merged],
                                                         leading_lines=stmts[i].leading_lines),
                   *stmts[i + 2:]]
            module = _replace_body(module, body, new)
            return inline_temporaries(module.code) or module.code
    return None


# --- the loader from **kwargs or in a class ---------------------------------------------------


def _loader_calls(module: cst.Module) -> list[cst.Call]:
    return [c for c in _find(module, cst.Call)
            if _code(c.func).split(".")[-1] == "DataLoader"
            and any(a.keyword is not None for a in c.args)
            and not any(a.star == "**" for a in c.args)]


@transform("loader_kwargs", group="loader")
def loader_kwargs(source: str) -> str | None:
    module = cst.parse_module(source)
    calls = _loader_calls(module)
    if not calls:
        return None
    call = calls[0]
    for body in _bodies(module):
        stmts = list(body.body)
        for i, s in enumerate(stmts):
            if isinstance(s, cst.SimpleStatementLine) and _contains(s, call):
                name = _fresh(source, "loader_kwargs")
                items = ", ".join(f"\"{a.keyword.value}\": {_code(a.value)}"
                                  for a in call.args if a.keyword is not None)
                new_call = call.with_changes(args=[
                    *[a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                      for a in call.args if a.keyword is None],
                    cst.Arg(cst.Name(name), star="**")])
                kw = _stmt(f"{name} = {{{items}}}\n").with_changes(
                    leading_lines=s.leading_lines)
                line = s.deep_replace(call, new_call).with_changes(leading_lines=[])
                module = _replace_body(module, body, [*stmts[:i], kw, line, *stmts[i + 1:]])
                return loader_kwargs(module.code) or module.code
    return None


@transform("loader_class", group="loader")
def loader_class(source: str) -> str | None:
    module = cst.parse_module(source)
    calls = [c for c in _find(module, cst.Call)
             if _code(c.func).split(".")[-1] == "DataLoader"]
    if not calls:
        return None
    cls = _fresh(source, "Batches")
    func = _code(calls[0].func)
    module = module.visit(_RenameCall(func, cls))
    definition = _stmt(
        f"class {cls}:\n"
        f"    def __init__(self, *args, **kwargs):\n"
        f"        self.loader = {func}(*args, **kwargs)\n\n"
        f"    def __iter__(self):\n"
        f"        return iter(self.loader)\n\n"
        f"    def __len__(self):\n"
        f"        return len(self.loader)\n\n"
        f"    def __getattr__(self, name):\n"
        f"        return getattr(self.loader, name)\n")
    body = list(module.body)
    # after the definitions the class needs: the imports and any class the loader uses
    index = max(i for i, s in enumerate(body) if _is_import(s)) + 1
    definition = definition.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    return module.with_changes(body=[*body[:index], definition, *body[index:]]).code


class _RenameCall(cst.CSTTransformer):
    def __init__(self, func: str, new: str):
        self.func, self.new = func, new

    def leave_Call(self, original, updated):
        if _code(original.func) == self.func:
            return updated.with_changes(func=cst.Name(self.new))
        return updated


# --- the constants as a config: dict, argparse namespace, dataclass ---------------------------

_HYPER = ("lr", "momentum", "weight_decay", "gamma", "T_max", "step_size", "factor",
          "patience", "label_smoothing")


def _number(e: cst.BaseExpression) -> bool:
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
        e = e.expression
    return isinstance(e, (cst.Integer, cst.Float))


class _ConfigUse(_NameReads):
    def __init__(self, constants: dict[str, str], literals: dict[int, str], access):
        super().__init__()
        self.constants, self.literals, self.access = constants, literals, access

    def leave_Arg(self, original, updated):
        if id(original) in self.literals:
            return updated.with_changes(value=_expr(self.access(self.literals[id(original)])))
        return updated

    def leave_Name(self, original, updated):
        if id(original) in self.skip or original.value not in self.constants:
            return updated
        return _expr(self.access(self.constants[original.value]))


def _configure(source: str, kind: str) -> str | None:
    module = cst.parse_module(source)
    tree = ast.parse(source)
    bound: dict[str, int] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound[n.id] = bound.get(n.id, 0) + 1
        elif isinstance(n, ast.arg):
            bound[n.arg] = bound.get(n.arg, 0) + 2
    constants: dict[str, str] = {}
    values: dict[str, str] = {}
    keep = []
    for s in module.body:
        a = _single_assign(s)
        if (a is not None and isinstance(a.targets[0].target, cst.Name)
                and a.targets[0].target.value.isupper() and _number(a.value)
                and bound.get(a.targets[0].target.value) == 1):
            field_name = a.targets[0].target.value.lower()
            constants[a.targets[0].target.value] = field_name
            values[field_name] = _code(a.value)
        else:
            keep.append(s)
    if any(_find(module, cst.Global)):
        return None
    literals: dict[int, str] = {}
    for arg in _find(module, cst.Arg):
        if arg.keyword is not None and arg.keyword.value in _HYPER and _number(arg.value):
            base = arg.keyword.value.lower()
            name, k = base, 2
            while name in values:
                name, k = f"{base}_{k}", k + 1
            values[name] = _code(arg.value)
            literals[id(arg)] = name
    if not values:
        return None
    cfg = _fresh(source, "config")
    if kind == "dict":
        def access(f):
            return f"{cfg}[\"{f}\"]"
        items = ", ".join(f"\"{k}\": {v}" for k, v in values.items())
        prelude, imports = [f"{cfg} = {{{items}}}\n"], []
    elif kind == "argparse":
        def access(f):
            return f"{cfg}.{f}"
        parser = _fresh(source, "parser")
        prelude = [f"{parser} = argparse.ArgumentParser()\n"]
        for k, v in values.items():
            typ = "float" if "." in v or "e" in v.lower() else "int"
            prelude.append(f"{parser}.add_argument(\"--{k}\", type={typ}, default={v})\n")
        prelude.append(f"{cfg} = {parser}.parse_args([])\n")
        imports = ["import argparse\n"]
    else:
        def access(f):
            return f"{cfg}.{f}"
        cls = _fresh(source, "Config")
        fields = "".join(
            f"    {k}: {'float' if '.' in v or 'e' in v.lower() else 'int'} = {v}\n"
            for k, v in values.items())
        prelude = [f"@dataclass\nclass {cls}:\n{fields}", f"{cfg} = {cls}()\n"]
        imports = ["from dataclasses import dataclass\n"]
    module = module.with_changes(body=keep).visit(_ConfigUse(constants, literals, access))
    return _insert_after_header(module, [_stmt(p) for p in prelude], imports).code


@transform("config_dict", group="config")
def config_dict(source: str) -> str | None:
    return _configure(source, "dict")


@transform("config_argparse", group="config")
def config_argparse(source: str) -> str | None:
    return _configure(source, "argparse")


@transform("config_dataclass", group="config")
def config_dataclass(source: str) -> str | None:
    return _configure(source, "dataclass")


# --- logging through an object or a dict ------------------------------------------------------


def _print_lines(module: cst.Module):
    for body in _bodies(module):
        for i, s in enumerate(body.body):
            if (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                    and isinstance(s.body[0], cst.Expr)
                    and isinstance(s.body[0].value, cst.Call)
                    and _code(s.body[0].value.func) == "print"):
                yield body, i, s.body[0].value


@transform("log_object", group="logging")
def log_object(source: str) -> str | None:
    module = cst.parse_module(source)
    if not any(True for _ in _print_lines(module)):
        return None
    cls, obj = _fresh(source, "MetricLogger"), _fresh(source, "logger")

    class T(cst.CSTTransformer):
        def leave_Call(self, original, updated):
            if _code(original.func) == "print":
                return updated.with_changes(func=_expr(f"{obj}.log"))
            return updated

    module = module.visit(T())
    defs = [_stmt(f"class {cls}:\n"
                  f"    def __init__(self):\n        self.lines = 0\n\n"
                  f"    def log(self, *values, **kwargs):\n"
                  f"        self.lines += 1\n        print(*values, **kwargs)\n"),
            _stmt(f"{obj} = {cls}()\n")]
    return _insert_after_header(module, defs).code


def _lift_print(call: cst.Call, name: str, count: list[int]) -> tuple[list[str], cst.Call] | None:
    """The entries of a metrics dict and the print reading them back, for one print call."""
    if any(a.keyword is not None or a.star for a in call.args) or not call.args:
        return None
    entries: list[str] = []
    new_args = []
    for a in call.args:
        v = a.value
        if isinstance(v, cst.FormattedString):
            quote = v.start[-1]
            other = "'" if quote == '"' else '"'
            parts = []
            for p in v.parts:
                if isinstance(p, cst.FormattedStringExpression):
                    if p.equal is not None or (p.format_spec and any(
                            isinstance(q, cst.FormattedStringExpression) for q in p.format_spec)):
                        return None
                    key = f"m{count[0]}"
                    count[0] += 1
                    entries.append(f"\"{key}\": {_code(p.expression)}")
                    parts.append(p.with_changes(expression=_expr(f"{name}[{other}{key}{other}]")))
                else:
                    parts.append(p)
            new_args.append(a.with_changes(value=v.with_changes(parts=parts)))
        else:
            key = f"m{count[0]}"
            count[0] += 1
            entries.append(f"\"{key}\": {_code(v)}")
            new_args.append(a.with_changes(value=_expr(f"{name}[\"{key}\"]")))
    return (entries, call.with_changes(args=new_args)) if entries else None


@transform("log_dict", group="logging")
def log_dict(source: str) -> str | None:
    """Each print's values first recorded in a dict, the print reading them back."""
    name = _fresh(source, "metrics")
    count = [0]

    def rewrite(stmts):
        out = []
        for s in stmts:
            lifted = None
            if (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                    and isinstance(s.body[0], cst.Expr) and isinstance(s.body[0].value, cst.Call)
                    and _code(s.body[0].value.func) == "print"):
                lifted = _lift_print(s.body[0].value, name, count)
            if lifted is None:
                out.append(s)
                continue
            entries, call = lifted
            out.append(_stmt(f"{name} = {{{', '.join(entries)}}}\n").with_changes(
                leading_lines=s.leading_lines))
            out.append(s.with_changes(body=[cst.Expr(call)], leading_lines=[]))
        return out

    class T(cst.CSTTransformer):
        def leave_IndentedBlock(self, original, updated):
            return updated.with_changes(body=rewrite(updated.body))

        def leave_Module(self, original, updated):
            return updated.with_changes(body=rewrite(updated.body))

    return _changed(source, cst.parse_module(source).visit(T()))


# --- the first step outside any loop ----------------------------------------------------------


def _literal_range(loop: cst.CSTNode) -> tuple[int, int, int] | None:
    """(start, stop, step) of ``for name in range(...)`` over integer literals, with at least
    one iteration and no ``break`` / ``continue`` / ``else``."""
    it = getattr(loop, "iter", None)
    if (not isinstance(loop, cst.For) or loop.orelse is not None
            or not isinstance(loop.target, cst.Name) or not isinstance(it, cst.Call)
            or _code(it.func) != "range" or not 1 <= len(it.args) <= 3
            or any(a.keyword or a.star for a in it.args)
            or _find(loop.body, cst.Continue) or _find(loop.body, cst.Break)):
        return None
    try:
        values = [int(ast.literal_eval(_code(a.value))) for a in it.args]
    except (ValueError, SyntaxError):
        return None
    start, stop, step = ((0, values[0], 1) if len(values) == 1 else
                         (values[0], values[1], 1) if len(values) == 2 else tuple(values))
    return (start, stop, step) if step > 0 and start < stop else None


def _peeled(loop: cst.For, chain: list) -> list:
    """The loop's first iteration written out before the loop over the others (the loops of
    ``chain``, nested in it, peeled the same way inside that first iteration)."""
    start, stop, step = _literal_range(loop)
    body = []
    for s in loop.body.body:
        body.extend(_peeled(s, chain[1:]) if chain and s is chain[0] else [s])
    first = [_stmt(f"{loop.target.value} = {start}\n").with_changes(
        leading_lines=loop.leading_lines), *body]
    if start + step >= stop:
        return first
    rest = f"range({start + step}, {stop}{'' if step == 1 else f', {step}'})"
    return [*first, loop.with_changes(iter=_expr(rest), leading_lines=[])]


@transform("first_step_outside")
def first_step_outside(source: str) -> str | None:
    """The first iteration of the training loop (and of the loops around it) written out
    before it: one step outside any loop (a notebook's first step), then the loop over the
    rest. Loops over integer literals at the module level only."""
    module = cst.parse_module(source)
    loop = _step_loop(module)
    if loop is None:
        return None
    top = next((s for s in module.body if _contains(s, loop)), None)
    chain = [top]
    while chain[-1] is not loop:
        inner = next((s for s in getattr(chain[-1].body, "body", ()) if _contains(s, loop)
                      and isinstance(s, cst.For)), None)
        if inner is None:
            return None
        chain.append(inner)
    if any(_literal_range(c) is None for c in chain):
        return None
    i = next(i for i, s in enumerate(module.body) if s is top)
    body = [*module.body[:i], *_peeled(top, chain[1:]), *module.body[i + 1:]]
    return _changed(source, module.with_changes(body=body))


def apply(source: str, names: Iterable[str]) -> str | None:
    """The variant made by applying the transforms ``names`` in order; None when one of them
    does not apply."""
    for name in names:
        new = TRANSFORMS[name](source)
        if new is None:
            return None
        try:
            ast.parse(new)
        except SyntaxError as e:
            raise GeneratorError(f"{name} wrote invalid code: {e}") from e
        source = new
    return source


class GeneratorError(Exception):
    """A transform wrote something that is not Python (a bug of this file)."""


# --------------------------------------------------------------------------------------------
# the programs


@dataclass(frozen=True)
class Program:
    name: str
    source: str
    rtol: float = 2e-5
    # random programs: the converter may draw from other streams in a variant (a host numpy
    # generator seeded from a constant, or a jax key when the seed is read from a config);
    # the numbers then agree within this relative noise, not one by one
    noise: float = 0.0
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


# the fixtures at a size that runs in a second: fewer epochs, steps and samples
SHRINK = {
    "mlp_adamw_cosine": [("EPOCHS = 30", "EPOCHS = 2"), ("make_data(4096)", "make_data(512)"),
                         ("make_data(2048)", "make_data(256)"), ("LOG_EVERY = 100",
                                                                 "LOG_EVERY = 2")],
    "cnn_sgd_steplr": [("EPOCHS = 8", "EPOCHS = 2"), ("make_images(3072)", "make_images(256)"),
                       ("make_images(1024)", "make_images(128)")],
    "gpt_param_groups": [("MAX_STEPS = 300", "MAX_STEPS = 12"),
                         ("WARMUP_STEPS = 30", "WARMUP_STEPS = 3"),
                         ("N_EMBD = 48", "N_EMBD = 16"), ("BATCH_SIZE = 64", "BATCH_SIZE = 8"),
                         ("step % 50 == 0", "step % 3 == 0"), ("range(8)", "range(2)")],
    "seeds_in_helper": [("STEPS = 1200", "STEPS = 24"), ("make_data(8000,", "make_data(512,"),
                        ("make_data(2000,", "make_data(500,"), ("step % 100 == 0",
                                                                 "step % 4 == 0")],
}


def _shrink(name: str, source: str) -> str:
    for old, new in SHRINK[name]:
        assert old in source, (name, old)
        source = source.replace(old, new)
    return source


def programs() -> dict[str, Program]:
    """The training-script table of tests/test_training_scripts.py, the training fixtures, the
    MNIST program of the corpus (shrunk) and the CIFAR-shaped schedule script
    (tests/data/optim/one_cycle.py, one epoch). Not here: the ddp fixture (it opens a
    torch.distributed process group) and the GPT and library corpus programs (several files
    importing each other)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from test_training_scripts import HEADER, SCRIPTS

    found = {f"script:{k}": Program(f"script:{k}", HEADER + v) for k, v in SCRIPTS.items()}
    for name in SHRINK:
        source = _shrink(name, (TRAINING / f"{name}.py").read_text())
        found[f"fixture:{name}"] = Program(f"fixture:{name}", source, rtol=2e-4, noise=0.15)
    mnist = (TESTS / "corpus" / "mnist" / "main.py").read_text()
    assert "(1280, 200) if args.tiny" in mnist
    found["corpus:mnist"] = Program(
        "corpus:mnist", mnist.replace("(1280, 200) if args.tiny", "(256, 64) if args.tiny"),
        rtol=2e-4, noise=0.15,
        argv=("--tiny", "--epochs", "1", "--batch-size", "32", "--log-interval", "2"))
    # the CIFAR-shaped script of the schedule tests (device chosen at run time, GradScaler,
    # clipping after unscale_, OneCycleLR, evaluation, the best checkpoint saved)
    one_cycle = (TESTS / "data" / "optim" / "one_cycle.py").read_text()
    found["data:one_cycle"] = Program("data:one_cycle", one_cycle, rtol=2e-4,
                                      argv=("--epochs", "1"))
    return found


# --------------------------------------------------------------------------------------------
# running and checking


class ProgramError(Exception):
    pass


def run_source(code: str, argv: Iterable[str] = ()) -> list[str]:
    """Run a program in this process, as ``__main__``, from an empty directory; its printed
    lines."""
    out = io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            os.chdir(tmp)
            sys.argv = ["program.py", *argv]
            with contextlib.redirect_stdout(out), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scope = {"__name__": "__main__", "__file__": str(Path(tmp) / "program.py")}
                exec(compile(code, "program.py", "exec"), scope)  # noqa: S102 (test programs)
        except Exception as e:  # the caller reports what failed
            raise ProgramError(f"{type(e).__name__}: {e}") from e
        finally:
            os.chdir(old_cwd)
            sys.argv = old_argv
    return out.getvalue().splitlines()


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def same_output(a: list[str], b: list[str], rtol: float) -> str | None:
    """None when the printed lines agree (numbers within ``rtol``), else the first
    difference."""
    if len(a) != len(b) or not a:
        return f"{len(a)} lines against {len(b)}"
    for la, lb in zip(a, b):
        if _NUMBER.sub("#", la) != _NUMBER.sub("#", lb):
            return f"{la!r} != {lb!r}"
        for x, y in zip(_NUMBER.findall(la), _NUMBER.findall(lb)):
            fx, fy = float(x), float(y)
            if abs(fx - fy) > rtol * max(abs(fx), abs(fy), 1e-3):
                return f"{la!r} != {lb!r}"
    return None


@dataclass
class Outcome:
    status: str  # "pass", "not-applicable", "generator", "convert", "run", "mismatch"
    message: str = ""
    variant: str = ""
    converted: str = ""


_CACHE: dict[tuple[str, str], object] = {}


def _cached(key: tuple[str, str], make: Callable[[], object]) -> object:
    if key not in _CACHE:
        try:
            _CACHE[key] = make()
        except ProgramError as e:
            _CACHE[key] = e
    value = _CACHE[key]
    if isinstance(value, ProgramError):
        raise value
    return value


def convert(source: str) -> tuple[str, list[str]]:
    """The converted code and the converter's error messages (TODO markers included)."""
    from torch2jax.convert import convert_source

    result = convert_source(source, path="program.py")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    if not errors and "TODO(torch2jax)" in result.code:
        errors = [line.strip() for line in result.code.splitlines() if "TODO(torch2jax)" in line]
    return result.code, errors


def check(program: Program, names: tuple[str, ...]) -> Outcome:
    try:
        variant = apply(program.source, names)
    except GeneratorError as e:
        return Outcome("generator", str(e))
    if variant is None:
        return Outcome("not-applicable")
    torch_original = _cached(("torch", program.name),
                             lambda: run_source(program.source, program.argv))
    try:
        torch_variant = run_source(variant, program.argv)
    except ProgramError as e:
        return Outcome("generator", f"the torch variant fails: {e}", variant)
    diff = same_output(torch_variant, torch_original, 1e-6)
    if diff:
        return Outcome("generator", f"the torch variant prints otherwise: {diff}", variant)
    code, errors = convert(variant)
    if errors:
        return Outcome("convert", errors[0], variant, code)
    jax_original = _cached(("jax", program.name),
                           lambda: run_source(convert(program.source)[0], program.argv))
    try:
        jax_variant = run_source(code, program.argv)
    except ProgramError as e:
        return Outcome("run", str(e)[:300], variant, code)
    diff = same_output(jax_variant, jax_original, program.rtol)
    if diff and program.noise and not same_output(jax_variant, jax_original, program.noise):
        return Outcome("pass", f"within noise: {diff}", variant, code)
    if diff:
        return Outcome("mismatch", diff, variant, code)
    return Outcome("pass", "", variant, code)


def compatible(names: Iterable[str]) -> bool:
    groups = [GROUPS[n] for n in names]
    return len(groups) == len(set(groups))


# --------------------------------------------------------------------------------------------
# the sweep: combinations drawn by hypothesis from a seed


def sweep(count: int, seed: int, only: str | None = None) -> list[tuple[str, tuple, Outcome]]:
    """Check ``count`` combinations (program, transforms) drawn by hypothesis from ``seed``;
    the ones that do not apply are skipped."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    progs = programs()
    names = sorted(p for p in progs if only is None or only in p)
    order = list(TRANSFORMS)
    drawn: list[tuple[str, tuple[str, ...]]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(names),
           st.lists(st.sampled_from(order), min_size=1, max_size=4, unique=True))
    def draw(program: str, chosen: list[str]) -> None:
        combo = tuple(sorted(chosen, key=order.index))
        if compatible(combo) and (program, combo) not in drawn:
            drawn.append((program, combo))

    draw()
    results = []
    for program, combo in drawn:
        outcome = check(progs[program], combo)
        if outcome.status != "not-applicable":
            results.append((program, combo, outcome))
    return results


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100,
                        help="combinations drawn (repeats and ones that do not apply skipped)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--program", default=None, help="only programs whose name has this")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = sweep(args.count, args.seed, args.program)
    tally: dict[str, int] = {}
    for program, chosen, outcome in results:
        tally[outcome.status] = tally.get(outcome.status, 0) + 1
        print(f"{outcome.status:9} {program:40} {'+'.join(chosen):60} {outcome.message[:160]}")
    print(f"{len(results)} variants in {time.perf_counter() - start:.0f} s: {tally}")
    return 1 if tally.get("generator") else 0


if __name__ == "__main__":
    sys.exit(main())
