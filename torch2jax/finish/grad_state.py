"""Invariant (f): torch's implicit gradient state never survives unmarked.

``loss.backward()``, ``optimizer.zero_grad()`` and ``optimizer.step()`` act on state that JAX
values and flax optimizers do not have (``.grad``): a JAX array has no ``backward``, an
``nnx.Optimizer`` no ``zero_grad``, and its ``step`` is its update counter, not a method. The
training passes translate these calls where they recognise the step around them; a call of
one of them left in the converted code (a step the passes did not recognise and did not mark)
would fail at run time, or worse run and do nothing. Each is marked here: a TODO line above
its statement, with an error diagnostic at the input's line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection

from torch2jax.finish import removed as rmv
from torch2jax.report import Diagnostic

TODO_PREFIX = "# TODO(torch2jax):"
RULE = "training-loop"
_OPTIM_CALL = re.compile(r"(^|\.)optim\.[A-Z]\w*$")


def _text(node: ast.AST) -> str | None:
    """``a.b.c`` of a Name / Attribute chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def optimizer_names(source: str, known: Collection[str] = ()) -> set[str]:
    """What holds an optimizer in the torch input: the names (``opt``, ``self.opt``) assigned a
    ``torch.optim.X(...)`` call, and ``known`` (the training analysis' optimizer names)."""
    names = set(known)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return names
    aliases = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = _text(node.value.func) or ""
            if _OPTIM_CALL.search(func) or func.endswith("configure_optimizers"):
                names |= {t for t in map(_text, node.targets) if t}
        elif isinstance(node, ast.Assign) and _text(node.value):
            aliases.append((_text(node.value), {t for t in map(_text, node.targets) if t}))
    # opt = self.optimizer: the same optimizer under another name
    changed = True
    while changed:
        changed = False
        for value, targets in aliases:
            if value in names and not targets <= names:
                names |= targets
                changed = True
    return names


def _why(call: ast.Call, optimizers: set[str]) -> str | None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr == "backward":
        return ("backward() not translated: torch2jax did not recognise the training step "
                "around it (JAX computes gradients with value_and_grad): write the step as "
                "value_and_grad and the optimizer's update")
    receiver = _text(func.value)
    if func.attr == "zero_grad":
        return ("zero_grad() not translated: the gradients it resets belong to a step "
                "torch2jax did not recognise")
    if func.attr == "step" and not call.args and receiver in optimizers:
        return (f"{receiver}.step() not translated: the gradients it applies come from a step "
                "torch2jax did not recognise (apply them with optimizer.update(model, grads))")
    if func.attr == "step" and len(call.args) == 1 and _text(call.args[0]) in optimizers:
        return (f"{_text(func)}(...) not translated: the gradients it applies come from a "
                "step torch2jax did not recognise")
    return None


def _input_lines(source: str, attr: str) -> list[int]:
    """The input's lines that call ``.attr(``, in order (where a diagnostic points)."""
    return [i for i, line in enumerate(source.splitlines(), start=1)
            if f".{attr}(" in line.split("#")[0]]


def mark_gradient_state(code: str, diagnostics: list[Diagnostic], path: str, source: str,
                        optimizers: set[str]) -> tuple[str, list[Diagnostic]]:
    """A TODO line above each statement of ``code`` that still calls ``backward()``,
    ``zero_grad()`` or an optimizer's ``step()``, unless it carries one already."""
    if not any(f".{a}(" in code for a in ("backward", "zero_grad", "step")):
        return code, diagnostics
    tree = ast.parse(code)
    parents = rmv.parents_of(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            why = _why(node, optimizers)
            if why is not None:
                found.append((node, why))
    if not found:
        return code, diagnostics
    found.sort(key=lambda f: (f[0].lineno, f[0].col_offset))
    lines = code.splitlines(keepends=True)
    todos: dict[int, str] = {}
    out = list(diagnostics)
    inputs = source.splitlines()
    used: set[int] = set()
    for node, why in found:
        attr = node.func.attr
        stmt = node
        while not isinstance(stmt, ast.stmt):
            stmt = parents[id(stmt)]
        first = stmt.lineno
        if first in todos or any(c.startswith(TODO_PREFIX) for c in rmv.comments_above(lines, first)):
            continue
        todos[first] = f"{TODO_PREFIX} {why} [{RULE}]"
        # the input's line: the first not yet reported that calls the same method, the same
        # text first (a leftover call is usually the input's line unchanged)
        text = lines[first - 1].strip()
        at = [n for n in _input_lines(source, attr) if n not in used]
        line = next((n for n in at if inputs[n - 1].strip() == text), at[0] if at else 1)
        used.add(line)
        out.append(Diagnostic(path, line, 1, RULE, "error", why))
    new = []
    for number, line in enumerate(lines, start=1):
        if number in todos:
            indent = line[:len(line) - len(line.lstrip())]
            new.append(f"{indent}{todos[number]}\n")
        new.append(line)
    out.sort(key=lambda d: (d.line, d.column))
    return "".join(new), out
