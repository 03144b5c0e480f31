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
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, ScopeProvider

from torch2jax.finish import removed as rmv
from torch2jax.finish.claims import check_claims
from torch2jax.finish.names import BUILTINS, torch_import_lines, unbound_names, unbound_reads
from torch2jax.report import Diagnostic

TODO_PREFIX = "# TODO(torch2jax):"


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
                                                  path, failed)
        tree = ast.parse(code)
    diagnostics = check_claims(code, diagnostics)
    suspects = unbound_names(tree, code, path) - facts.unbound
    own = suspects & set(own_names) - set(facts.torch_imports)
    if own and own_imports is not None:
        code = own_imports(cst.parse_module(code), own).code
        suspects -= own
    if not suspects and not kept_imports:
        return code, diagnostics
    # the nodes, exactly (slower: only for files that have such names)
    module = cst.parse_module(code)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    unbound = list(unbound_reads(wrapper, suspects, kept_imports))
    if not unbound:
        return code, diagnostics
    positions = wrapper.resolve(PositionProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    unbound.sort(key=lambda n: (positions[n].start.line, positions[n].start.column))
    restored = sorted({n.value for n in unbound if n.value in facts.torch_imports
                       and n.value not in kept_imports})
    notes: dict[int, list[tuple[str, str, str]]] = {}  # id(Name) -> (name, rule, message)
    dotted = {id(n): _dotted(n, parents) for n in unbound}
    for node in unbound:
        name = node.value
        if name in facts.torch_imports:
            rule = "torch-leftover"
            msg = (f"{dotted[id(node)]} is not translated here ({facts.torch_imports[name]} "
                   "is kept for it)")
        else:
            rule = "unbound-name"
            msg = (f"`{name}` is read here but the converted file no longer binds it (the "
                   "conversion removed what bound it)")
        notes[id(node)] = [(name, rule, msg)]
    marker = _MarkStatements(notes)
    module = module.visit(marker)
    out = list(diagnostics)
    for node in unbound:
        if id(node) in marker.skipped:
            continue
        (_, rule, msg), = notes[id(node)]
        line, col = _input_position(node, dotted, unbound, positions, facts)
        out.append(Diagnostic(path, line, col, rule, "error", msg))
    if restored:
        module = _add_import_lines(module, [facts.torch_imports[n] for n in restored])
    out.sort(key=lambda d: (d.line, d.column))
    return module.code, out


def _settle(code: str, diagnostics: list[Diagnostic], removed: dict[int, rmv.Removed],
            facts: InputFacts, path: str, failed: set[int]) -> tuple[str, list[Diagnostic]]:
    """Removed statements back where their names are read, or where the translation they
    were removed for failed (finish/removed.py); the diagnostics follow: a dropped
    statement's TODOs went with it, a statement put back makes the info notes about its
    removal untrue."""
    code, read, unfinished, dropped = rmv.settle(code, removed, facts.unbound, failed)
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


def _input_position(node: cst.Name, dotted: dict[int, str], ordered: list[cst.Name],
                    positions, facts: InputFacts) -> tuple[int, int]:
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
    start = positions[node].start
    return start.line, start.column + 1


class _MarkStatements(cst.CSTTransformer):
    """A ``# TODO(torch2jax)`` line above the statement that holds each noted Name (its
    innermost statement: a compound statement when the Name is in its header). A torch
    leftover on a line that already carries a TODO gets none: that TODO says why."""

    def __init__(self, notes: dict[int, list[tuple[str, str, str]]]) -> None:
        super().__init__()
        self.notes = notes
        self.stack: list[list[tuple[int, str, str, str]]] = []
        self.skipped: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            self.stack.append([])
        elif isinstance(node, cst.Name) and id(node) in self.notes and self.stack:
            self.stack[-1].extend((id(node), *n) for n in self.notes[id(node)])
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        if not isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return result
        found = self.stack.pop()
        if not found:
            return result
        leading = list(result.leading_lines)
        marked = any(ll.comment is not None and ll.comment.value.startswith(TODO_PREFIX)
                     for ll in leading)
        present = {ll.comment.value for ll in leading if ll.comment is not None}
        seen = set()
        for node_id, name, rule, msg in found:
            if (rule == "torch-leftover" and marked) or (name, rule) in seen:
                self.skipped.add(node_id)
                continue
            seen.add((name, rule))
            text = f"{TODO_PREFIX} {msg} [{rule}]"
            if text not in present:  # (converted code converted again: written once)
                leading.append(cst.EmptyLine(comment=cst.Comment(text)))
        return result.with_changes(leading_lines=leading)


def _add_import_lines(module: cst.Module, lines: list[str]) -> cst.Module:
    """``lines`` after the module's docstring, ``__future__`` imports and top-level imports."""
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if i == 0 and m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
            at = 1
        elif m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
            at = i + 1
        else:
            break
    body[at:at] = [cst.parse_statement(line + "\n") for line in lines]
    return module.with_changes(body=body)


__all__ = ["BUILTINS", "InputFacts", "check_output", "input_facts"]
