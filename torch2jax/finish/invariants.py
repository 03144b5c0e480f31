"""Output invariants, checked on every converted file before it is returned.

(a) the file parses; (c) a statement is removed only when nothing reads what it binds
(finish/removed.py puts the others back); (d) an info note that claims a transformation
matches the code written (finish/claims.py); (b) every name it reads is bound. A read that the
conversion left unbound (a torch name whose import went, a name whose statement went) is
never left to fail at run time with a NameError: a torch import that is still read is kept,
and every such line is marked ``# TODO(torch2jax)`` with an error diagnostic.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.finish import removed as rmv
from torch2jax.finish.claims import check_claims
from torch2jax.finish.names import BUILTINS, torch_import_lines, unbound_names, unbound_reads
from torch2jax.report import Diagnostic

TODO_PREFIX = "# TODO(torch2jax):"
# torch names that the converter itself writes in code it leaves to torch under a marker (the
# random branch of a functional dropout: F.dropout), with the import that binds them when the
# input does not (it reads nn.functional.dropout, or torch.nn.functional.dropout)
EMITTED_TORCH_NAMES = {"F": "import torch.nn.functional as F"}


@dataclass
class InputFacts:
    """What the checks need to know about the torch file the output was converted from."""

    torch_imports: dict[str, str] = field(default_factory=dict)  # name -> its import line
    unbound: set[str] = field(default_factory=set)  # names the input itself never binds
    # dotted text read (``torch.optim.AdamW``, ``device``) -> its positions, in order
    reads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def _dotted(node: cst.Name, parents) -> str:
    """The longest ``a.b.c`` that starts with the Name ``node``."""
    text, at = node.value, node
    while True:
        parent = parents.get(at)
        if not isinstance(parent, cst.Attribute) or parent.value is not at:
            return text
        text, at = f"{text}.{parent.attr.value}", parent


def input_facts(wrapper: MetadataWrapper, packages: tuple[str, ...]) -> InputFacts:
    """From the metadata the rewrite already resolved on the input (scopes, positions,
    parents)."""
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    reads: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for scope in {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}:
        for access in scope.accesses:
            node = access.node
            if isinstance(node, cst.Name) and node in positions:
                start = positions[node].start
                reads[_dotted(node, parents)].append((start.line, start.column + 1))
    for found in reads.values():
        found.sort()
    return InputFacts(torch_imports=torch_import_lines(wrapper, packages),
                      unbound={n.value for n in unbound_reads(wrapper)}, reads=dict(reads))


def check_output(code: str, diagnostics: list[Diagnostic], facts: InputFacts, path: str,
                 source: str, removed: dict[int, rmv.Removed] | None = None,
                 own_imports: Callable[[cst.Module, set[str]], cst.Module] | None = None,
                 own_names: Collection[str] = (), failed: set[int] = frozenset()
                 ) -> tuple[str, list[Diagnostic]]:
    """``code`` and ``diagnostics`` with the invariants enforced (see the module docstring).
    Output that does not parse is a converter bug: the file is returned unchanged, with an
    error diagnostic, so that nothing is lost. ``own_names`` are the names the converter's
    own imports bind (``jnp``): ``own_imports(module, names)`` adds their imports when a
    statement put back reads one."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        if "nested" in str(exc):  # beyond CPython's parser, as the input is: too deep
            raise RecursionError(str(exc)) from None
        return source, [*diagnostics, Diagnostic(
            path, 1, 1, "invalid-output", "error",
            f"the converted code does not parse ({exc}); the file is left as it was: please "
            "report this")]
    kept_imports: set[str] = set()  # torch names whose import was put back: still read
    if rmv.has_placeholders(code):
        code, diagnostics, kept_imports = _settle(code, diagnostics, removed or {}, facts,
                                                  path, failed, tree)
        tree = ast.parse(code)
    diagnostics = check_claims(code, diagnostics)
    suspects = unbound_names(tree, code, path) - facts.unbound
    emitted = {n: line for n, line in EMITTED_TORCH_NAMES.items()
               if n in suspects and n not in facts.torch_imports}
    if emitted:  # torch code the converter wrote under a marker, in the input's absence
        facts = replace(facts, torch_imports={**facts.torch_imports, **emitted})
    own = suspects & set(own_names) - set(facts.torch_imports)
    if own and own_imports is not None:
        code = own_imports(cst.parse_module(code), own).code
        suspects -= own
    if not suspects and not kept_imports:
        return code, diagnostics
    return _mark_reads(code, tree, suspects, kept_imports, diagnostics, facts, path)


def _mark_reads(code: str, tree: ast.Module, suspects: set[str], kept_imports: set[str],
                diagnostics: list[Diagnostic], facts: InputFacts, path: str
                ) -> tuple[str, list[Diagnostic]]:
    """A TODO line above each statement that reads a name of ``suspects`` unbound, or a torch
    name of ``kept_imports`` (its import put back); the torch imports still read and not put
    back are added after the file's imports. Plain text edits guided by ``ast``."""
    parents = rmv.parents_of(tree)
    wanted = suspects | kept_imports
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(
        n.ctx, ast.Load) and n.id in wanted and not rmv.shadowed(n, parents)]
    if not reads:
        return code, diagnostics
    reads.sort(key=lambda n: (n.lineno, n.col_offset))
    lines = code.splitlines(keepends=True)
    dotted = {id(n): _dotted_ast(n, parents) for n in reads}
    restored = sorted({n.id for n in reads if n.id in facts.torch_imports
                       and n.id not in kept_imports})
    todos: dict[int, list[str]] = {}  # line number (1-based) -> comment texts
    out = list(diagnostics)
    seen: set[tuple[int, str, str]] = set()
    for node in reads:
        name = node.id
        if name in facts.torch_imports:
            rule = "torch-leftover"
            msg = (f"{dotted[id(node)]} is not translated here ({facts.torch_imports[name]} "
                   "is kept for it)")
        else:
            rule = "unbound-name"
            msg = (f"`{name}` is read here but the converted file no longer binds it (the "
                   "conversion removed what bound it)")
        stmt = node
        while not isinstance(stmt, ast.stmt):
            stmt = parents[id(stmt)]
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
        above = _comments_above(lines, first)
        if (rule == "torch-leftover" and any(c.startswith(TODO_PREFIX) for c in above)) or (
                (first, name, rule) in seen):
            continue
        seen.add((first, name, rule))
        text = f"{TODO_PREFIX} {msg} [{rule}]"
        if text not in above:  # (converted code converted again: written once)
            todos.setdefault(first, []).append(text)
        line, col = _input_position(node, dotted, reads, facts)
        out.append(Diagnostic(path, line, col, rule, "error", msg))
    new = []
    for number, line in enumerate(lines, start=1):
        if number in todos:
            indent = line[:len(line) - len(line.lstrip())]
            new += [f"{indent}{t}\n" for t in todos[number]]
        new.append(line)
    code = "".join(new)
    if restored:
        code = _add_import_lines(code, [facts.torch_imports[n] for n in restored])
    out.sort(key=lambda d: (d.line, d.column))
    return code, out


def _comments_above(lines: list[str], first: int) -> list[str]:
    """The comment lines right above line ``first`` (1-based), stripped."""
    out = []
    i = first - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        out.append(lines[i].strip())
        i -= 1
    return out


def _dotted_ast(node: ast.Name, parents: dict[int, ast.AST]) -> str:
    """The longest ``a.b.c`` that starts with the Name ``node``."""
    text, at = node.id, node
    while True:
        parent = parents.get(id(at))
        if not isinstance(parent, ast.Attribute) or parent.value is not at:
            return text
        text, at = f"{text}.{parent.attr}", parent


def _settle(code: str, diagnostics: list[Diagnostic], removed: dict[int, rmv.Removed],
            facts: InputFacts, path: str, failed: set[int], tree: ast.Module
            ) -> tuple[str, list[Diagnostic], set[str]]:
    """Removed statements back where their names are read, or where the translation they
    were removed for failed (finish/removed.py); the diagnostics follow: a dropped
    statement's TODOs went with it, a statement put back makes the info notes about its
    removal untrue."""
    code, read, unfinished, dropped = rmv.settle(code, removed, facts.unbound, failed, tree)
    gone: list[Diagnostic] = []
    added: list[Diagnostic] = []
    kept_imports = {n for key in read if removed[key].imports for n in removed[key].names}
    for key in dropped:
        gone += [Diagnostic(path, *d) for d in removed[key].reported if d[3] == "error"]
    for key in read | unfinished:
        r = removed[key]
        gone += [Diagnostic(path, *d) for d in r.reported if d[3] == "info"]
        if key in unfinished or r.imports:
            continue
        if r.translated is not None:
            added.append(Diagnostic(path, r.line, r.column, rmv.RULE, "info", r.translated))
        else:
            added.append(Diagnostic(path, r.line, r.column, rmv.RULE, "error",
                                    r.kept_message()))
    out = list(diagnostics)
    for d in gone:
        if d in out:
            out.remove(d)
    out += added
    out.sort(key=lambda d: (d.line, d.column))
    return code, out, kept_imports


def _input_position(node: ast.Name, dotted: dict[int, str], ordered: list[ast.Name],
                    facts: InputFacts) -> tuple[int, int]:
    """Where the read was in the torch file: among the input's reads of the same dotted text,
    the one of the same rank (counted from the end when the input has more of them: the reads
    the conversion removed are mostly definitions, early in the file). Its place in the output
    when the input has no such read."""
    text = dotted[id(node)]
    same = [n for n in ordered if dotted[id(n)] == text]
    k = next(i for i, n in enumerate(same) if n is node)
    found = facts.reads.get(text, [])
    if found:
        return found[max(0, len(found) - len(same)) + k] if len(found) >= len(same) \
            else found[-1]
    return node.lineno, node.col_offset + 1


def _add_import_lines(code: str, lines: list[str]) -> str:
    """``lines`` after the module's docstring, ``__future__`` imports and top-level imports."""
    tree = ast.parse(code)
    at = 0  # the line after which they go
    for i, stmt in enumerate(tree.body):
        docstring = i == 0 and isinstance(stmt, ast.Expr) and isinstance(
            stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
        if not docstring and not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            break
        at = stmt.end_lineno
    text = code.splitlines(keepends=True)
    if at and not text[at - 1].endswith("\n"):
        text[at - 1] += "\n"
    text[at:at] = [line + "\n" for line in lines]
    return "".join(text)


__all__ = ["BUILTINS", "InputFacts", "check_output", "input_facts"]
