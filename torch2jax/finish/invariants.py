"""Output invariants, checked on every converted file before it is returned.

(a) the file parses; (c) a statement is removed only when nothing reads what it binds
(finish/removed.py puts the others back); (d) an info note that claims a transformation
matches the code written (finish/claims.py); (b) every name it reads is bound. A read that the
conversion left unbound (a torch name whose import went, a name whose statement went) is
never left to fail at run time with a NameError: a torch import that is still read is kept,
and every such line is marked ``# TODO(torch2jax)`` with an error diagnostic. (e) nothing
reaches torch unmarked: a read of a name that an import of torch, its libraries
(``torchvision``, ``torchaudio``, ``torchtext``) or einops' torch layers
(``einops.layers.torch``) binds, left in the converted code (a torch layer class, a torch
function applied to a converted value), is marked the same way unless its statement already
carries a TODO. Annotations are not calls and are left alone. So a converted file that fails
at run time because torch received a JAX value fails on a marked line.
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
from torch2jax.finish.grad_state import mark_gradient_state, optimizer_names
from torch2jax.finish.holders import torch_holders
from torch2jax.finish.names import BUILTINS, torch_import_lines, unbound_names, unbound_reads
from torch2jax.report import Diagnostic

TODO_PREFIX = "# TODO(torch2jax):"
# torch names that the converter itself writes in code it leaves to torch under a marker (the
# random branch of a functional dropout: F.dropout), with the import that binds them when the
# input does not (it reads nn.functional.dropout, or torch.nn.functional.dropout)
EMITTED_TORCH_NAMES = {"F": "import torch.nn.functional as F"}
# (e): what converted code must not call unmarked (a dotted prefix, matched at dots)
TORCH_RUNTIME = ("torch", "torchvision", "torchaudio", "torchtext", "einops.layers.torch")


@dataclass
class InputFacts:
    """What the checks need to know about the torch file the output was converted from."""

    torch_imports: dict[str, str] = field(default_factory=dict)  # name -> its import line
    unbound: set[str] = field(default_factory=set)  # names the input itself never binds
    # dotted text read (``torch.optim.AdamW``, ``device``) -> its positions, in order
    reads: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # names holding an optimizer in the file as the analysis read it (an optimizer attribute
    # read through a local of the method that steps it: passes/optimizer_attributes.py)
    optimizers: frozenset[str] = frozenset()


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
                      unbound={n.value for n in unbound_reads(wrapper)}, reads=dict(reads),
                      optimizers=frozenset(optimizer_names(wrapper.module.code)))


def check_output(code: str, diagnostics: list[Diagnostic], facts: InputFacts, path: str,
                 source: str, removed: dict[int, rmv.Removed] | None = None,
                 own_imports: Callable[[cst.Module, set[str]], cst.Module] | None = None,
                 own_names: Collection[str] = (), failed: set[int] = frozenset(),
                 known: Collection[str] = (), optimizers: Collection[str] = ()
                 ) -> tuple[str, list[Diagnostic]]:
    """``code`` and ``diagnostics`` with the invariants enforced (see the module docstring).
    Output that does not parse is a converter bug: the file is returned unchanged, with an
    error diagnostic, so that nothing is lost. ``own_names`` are the names the converter's
    own imports bind (``jnp``): ``own_imports(module, names)`` adds their imports when a
    statement put back reads one. ``known``: names converted elsewhere (a followed package
    model, whose torch import is replaced afterwards): not torch. ``optimizers``: what holds an
    optimizer in the input (finish/grad_state.py)."""
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
    if suspects or kept_imports:
        code, diagnostics = _mark_reads(code, tree, suspects, kept_imports, diagnostics, facts,
                                        path)
    code, diagnostics = mark_torch_calls(code, diagnostics, facts, path, known)
    return mark_gradient_state(code, diagnostics, path, source,
                               optimizer_names(source, {*optimizers, *facts.optimizers}))


def _torch_bindings(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """name -> (the dotted path it is bound to, its import line), for the names the file's
    imports bind (at any depth); ``import a.b`` binds ``a`` to ``a``. A name that some other
    top-level statement binds as well is left out: what it holds is not known."""
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                line = f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
                out.setdefault(bound, (a.name if a.asname else bound, line))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if a.name == "*":
                    continue
                line = f"from {node.module} import {a.name}" + (
                    f" as {a.asname}" if a.asname else "")
                out.setdefault(a.asname or a.name, (f"{node.module}.{a.name}", line))
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        for node in ast.walk(stmt):
            name = (node.id if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
                    else getattr(node, "name", None) if isinstance(
                        node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None)
            if name in out and (stmt is node or isinstance(node, ast.Name)):
                del out[name]
    return out


def _is_torch(dotted: str) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in TORCH_RUNTIME)


def _annotation_nodes(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside annotations (not run, or not as a call)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def _root(value: ast.AST | None) -> ast.AST | None:
    """The Name a value is made from: ``Rearrange`` in ``Rearrange(...)``, ``nn`` in
    ``nn.GELU`` (None for anything else: ``'cuda' if torch.cuda.is_available() else 'cpu'``)."""
    while isinstance(value, (ast.Call, ast.Attribute, ast.Subscript)):
        value = value.func if isinstance(value, ast.Call) else value.value
    return value if isinstance(value, ast.Name) else None


def _torch_attribute_calls(reads: list[ast.Name], parents: dict[int, ast.AST]
                           ) -> list[tuple[ast.Name, str]]:
    """The reads of ``self.X`` in a class whose statement ``self.X = ...`` assigns an object
    made by one of ``reads`` (``self.r = Rearrange(...)``, ``self.act = nn.GELU``): calling
    it (or passing it on) runs the torch object. Each with its message."""
    held: set[tuple[int, str]] = set()  # (class id, attribute)
    for node in reads:
        stmt, cls = node, None
        while not isinstance(stmt, ast.stmt):
            stmt = parents[id(stmt)]
        at = parents.get(id(stmt))
        while at is not None and not isinstance(at, ast.ClassDef):
            at = parents.get(id(at))
        if at is None or not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or \
                _root(stmt.value) is not node:  # it holds what torch returned, not torch's
            continue
        cls = at
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                    t.value.id == "self":
                held.add((id(cls), t.attr))
    out = []
    classes = {id(n): n for n in parents.values() if isinstance(n, ast.ClassDef)}
    for cls_id, attr in sorted(held):
        msg = f"self.{attr} holds torch code (its assignment is marked): using it runs torch"
        for n in ast.walk(classes[cls_id]):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and \
                    n.attr == attr and isinstance(n.value, ast.Name) and n.value.id == "self":
                out.append((n.value, msg))
    return sorted(out, key=lambda c: (c[0].lineno, c[0].col_offset))


def mark_torch_calls(code: str, diagnostics: list[Diagnostic], facts: InputFacts, path: str,
                     known: Collection[str] = ()) -> tuple[str, list[Diagnostic]]:
    """Invariant (e): a TODO line above each statement that reads a name bound to torch (see
    the module docstring) and carries no TODO yet, with an error diagnostic. The names of
    ``known`` are converted elsewhere (check_output)."""
    if not any(p.split(".")[0] in code for p in TORCH_RUNTIME):
        return code, diagnostics
    tree = ast.parse(code)
    bindings = {name: b for name, b in _torch_bindings(tree).items() if name not in known
                and (_is_torch(b[0]) or any(p.startswith(b[0] + ".") for p in TORCH_RUNTIME))}
    if not bindings:
        return code, diagnostics
    parents = rmv.parents_of(tree)
    annotations = _annotation_nodes(tree)
    reads = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in bindings):
            continue
        text = _dotted_ast(n, parents)
        full = bindings[n.id][0] + text[len(n.id):]
        if _is_torch(full) and id(n) not in annotations and not rmv.shadowed(n, parents):
            reads.append(n)
    if not reads:
        return code, diagnostics
    reads.sort(key=lambda n: (n.lineno, n.col_offset))
    dotted = {id(n): _dotted_ast(n, parents) for n in reads}
    holders = torch_holders(tree, reads, parents)
    calls = _torch_attribute_calls([*reads, *(n for n, _ in holders)], parents)
    dotted |= {id(n): _dotted_ast(n, parents) for n, _ in [*holders, *calls]}
    lines = code.splitlines(keepends=True)
    todos: dict[int, list[str]] = {}
    out = list(diagnostics)
    for node, msg in [*((n, None) for n in reads), *holders, *calls]:
        stmt = node
        while not isinstance(stmt, ast.stmt):
            stmt = parents[id(stmt)]
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
        if first in todos or any(c.startswith(TODO_PREFIX) for c in rmv.comments_above(lines, first)):
            continue
        if msg is None:
            msg = (f"{dotted[id(node)]} is not translated here ({bindings[node.id][1]} is "
                   "kept for it): it runs torch at run time")
        todos[first] = [f"{TODO_PREFIX} {msg} [torch-leftover]"]
        same = [n for n, _ in calls] if msg.startswith("self.") else [
            n for n, _ in holders] if msg.startswith("`") else reads
        line, col = _input_position(node, dotted, same, facts)
        out.append(Diagnostic(path, line, col, "torch-leftover", "error", msg))
    out.sort(key=lambda d: (d.line, d.column))
    return _insert_todos(lines, todos), out


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
        above = rmv.comments_above(lines, first)
        if (rule == "torch-leftover" and any(c.startswith(TODO_PREFIX) for c in above)) or (
                (first, name, rule) in seen):
            continue
        seen.add((first, name, rule))
        text = f"{TODO_PREFIX} {msg} [{rule}]"
        if text not in above:  # (converted code converted again: written once)
            todos.setdefault(first, []).append(text)
        line, col = _input_position(node, dotted, reads, facts)
        out.append(Diagnostic(path, line, col, rule, "error", msg))
    code = _insert_todos(lines, todos)
    if restored:
        code = _add_import_lines(code, [facts.torch_imports[n] for n in restored])
    out.sort(key=lambda d: (d.line, d.column))
    return code, out


def _insert_todos(lines: list[str], todos: dict[int, list[str]]) -> str:
    """``lines`` (with their ends) joined, each line number of ``todos`` (1-based) preceded by
    its comment texts at the line's indentation."""
    new = []
    for number, line in enumerate(lines, start=1):
        if number in todos:
            indent = line[:len(line) - len(line.lstrip())]
            new += [f"{indent}{t}\n" for t in todos[number]]
        new.append(line)
    return "".join(new)


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


__all__ = ["BUILTINS", "InputFacts", "check_output", "input_facts", "mark_torch_calls"]
