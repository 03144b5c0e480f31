"""The torch line of each TODO the equinox pass writes.

The equinox pass rewrites the NNX translation of a file, so the statements it marks are
statements of its own output: their lines there are neither the torch file's nor (after the
output checks add lines) the finished file's. A diagnostic names the user's torch line, so each
marked statement is matched to a torch statement:

* the enclosing classes and functions are found by name in the torch file (``__call__`` is
  torch's ``forward``);
* within that scope the statements of both files, in order (compound statements by their
  header, nested bodies included, nested classes and functions as one statement), are aligned
  with :class:`difflib.SequenceMatcher` on their code: a statement left as written, or written
  back as its torch original, is matched exactly;
* a statement the translation changed is matched, inside the run of changed statements it
  belongs to, to the torch statement that binds the same names (the n-th such one for the n-th),
  else to the one of the run with the most words in common (a ``pass`` left in place of commented-out code
  by the code it shows);
* a class or function is its torch ``class`` or ``def`` line.

A statement with no counterpart (a scope the torch file does not have) takes its closest
enclosing scope's torch line, or line 1.
"""

from __future__ import annotations

import difflib
import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from torch2jax.finish.removed import bound_names

__all__ = ["torch_lines"]

_DEFS = (cst.FunctionDef, cst.ClassDef)
_EMPTY = cst.Module([])


def _key(s: cst.CSTNode) -> str:
    """A statement's own code: its header for a compound one, without comments."""
    if isinstance(s, _DEFS):
        return f"{type(s).__name__} {s.name.value}"
    if m.matches(s, m.SimpleStatementLine([m.Pass()])):  # in place of commented-out code
        shown = [ln.comment.value.removeprefix("#").strip() for ln in s.leading_lines
                 if ln.comment is not None and "TODO(torch2jax)" not in ln.comment.value]
        shown = [t for t in shown if t and not t.startswith("#")]
        if shown:
            return " ".join(shown[0].split())
    text = _EMPTY.code_for_node(s.with_changes(leading_lines=())).lstrip("\n")
    return " ".join(text.split("\n", 1)[0].split())


def _flat(body) -> list[cst.BaseStatement]:
    """The statements of a scope in order, nested blocks included, nested scopes not entered."""
    out: list[cst.BaseStatement] = []

    def walk(node: cst.CSTNode) -> None:
        for child in node.children:
            if isinstance(child, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                out.append(child)
                if not isinstance(child, _DEFS):
                    walk(child)
            elif not isinstance(child, (cst.BaseExpression, cst.BaseSmallStatement)):
                walk(child)

    for s in body:
        out.append(s)
        if not isinstance(s, _DEFS):
            walk(s)
    return out


def _scope(body, name: str):
    """The class or function ``name`` among ``body``'s statements (nested blocks included)."""
    names = (name, "forward") if name == "__call__" else (name,)
    return next((s for s in _flat(body) if isinstance(s, _DEFS) and s.name.value in names), None)


def _block(s) -> list:
    return list(s.body.body) if isinstance(s.body, cst.IndentedBlock) else []


def _match(out: list, torch: list, at: int) -> cst.CSTNode | None:
    """The torch statement aligned with ``out[at]``."""
    keys_out, keys_torch = [_key(s) for s in out], [_key(s) for s in torch]
    matcher = difflib.SequenceMatcher(None, keys_out, keys_torch, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if not i1 <= at < i2:
            continue
        if tag == "equal":
            return torch[j1 + at - i1]
        if j1 == j2:  # nothing of torch's here: the torch statement before (or after)
            return torch[j1 - 1] if j1 else (torch[0] if torch else None)
        names = _names(out[at])
        if names:
            same = [t for t in torch[j1:j2] if _names(t) == names]
            before = sum(1 for s in out[i1:at] if _names(s) == names)
            if same:
                return same[min(before, len(same) - 1)]
        # else the most similar one of the run
        words = _words(keys_out[at])
        return max(torch[j1:j2], key=lambda t: len(words & _words(_key(t))) / max(
            1, len(words | _words(_key(t)))))
    return None


def _words(key: str) -> set[str]:
    return set(re.findall(r"\w+", key))


def _names(s: cst.CSTNode) -> frozenset[str]:
    if isinstance(s, _DEFS):
        return frozenset({s.name.value})
    return frozenset(bound_names(s))


def torch_lines(output: str, torch_source: str, marker: str) -> list[int]:
    """The torch line of each ``# TODO(torch2jax): ... <marker>`` comment of ``output``, in the
    order of the output's lines."""
    wrapper = MetadataWrapper(cst.parse_module(torch_source))
    positions = wrapper.resolve(PositionProvider)
    torch_module = wrapper.module
    found: list[int] = []

    def line_of(node) -> int:
        return positions[node].start.line if node is not None else 1

    def visit(body: list, torch_body: list | None, torch_scope) -> None:
        flat = _flat(body)
        torch_flat = _flat(torch_body) if torch_body is not None else None
        for i, s in enumerate(flat):
            marks = sum(1 for ln in s.leading_lines if ln.comment is not None and
                        "# TODO(torch2jax): " in ln.comment.value and marker in ln.comment.value)
            match = None
            if isinstance(s, _DEFS) and torch_body is not None:
                match = _scope(torch_body, s.name.value)
            if marks:
                if match is None and torch_flat is not None:
                    match = _match(flat, torch_flat, i)
                found.extend([line_of(match if match is not None else torch_scope)] * marks)
            if isinstance(s, _DEFS):
                visit(_block(s), _block(match) if match is not None else None,
                      match if match is not None else torch_scope)
            for block in _footers(s):
                found.extend([line_of(torch_scope)] * _count(block, marker))

    visit(list(cst.parse_module(output).body), list(torch_module.body), None)
    return found


def _footers(s: cst.CSTNode) -> list:
    """Comment lines at the end of ``s``'s own blocks (not statements' leading lines)."""
    if isinstance(s, _DEFS) and isinstance(s.body, cst.IndentedBlock):
        return [s.body.footer]
    return []


def _count(lines, marker: str) -> int:
    return sum(1 for ln in lines if ln.comment is not None and
               "# TODO(torch2jax): " in ln.comment.value and marker in ln.comment.value)
