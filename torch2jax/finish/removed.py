"""Statements the conversion removes, put back when a later line still reads what they bind.

The rewrite removes statements that have no JAX counterpart (``device = torch.device(...)``,
a ``GradScaler``, the bookkeeping of optimizer parameter groups). Whether anything still reads
what such a statement binds is only known once the whole file is rewritten (``x.to(device)``
drops its ``device``; ``print(device)`` keeps it). So the rewrite leaves a one-line placeholder
where the statement was, and records what to put back (:class:`Removed`). When the file is
finished (:func:`settle`), a placeholder whose names some line still reads without any other
binding becomes its statement again: translated when the rewrite could translate it (a device
selection is ``jax.devices()[0]``), otherwise kept as written and marked ``# TODO(torch2jax)``.
The other placeholders go, so a statement is deleted only when nothing reads what it binds.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import libcst as cst

from torch2jax.finish.names import unbound_names

PLACEHOLDER = "__torch2jax_removed_{}__"
_PLACEHOLDER = re.compile(
    r"^(?P<indent>[ \t]*)(?:import )?__torch2jax_removed_(?P<id>\d+)__[ \t]*$")
RULE = "removed-but-read"


@dataclass
class Removed:
    """One removed statement: the names it binds, what to write back if they are read."""

    names: frozenset[str]
    statement: str  # the statement to put back, at column 0, without its leading lines
    line: int  # its place in the torch file
    column: int
    leading: str = ""  # its blank and comment lines
    todos: str = ""  # the TODO lines of what was not translated inside it
    # the diagnostics reported inside the statement: (line, column, rule, severity, message)
    reported: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    # put back as the rewrite translated it (no TODO): message of the info diagnostic then
    translated: str | None = None
    # the translation it was removed for (an optimizer site): put back as it was when that
    # translation failed
    part_of: int | None = None
    imports: bool = False  # an import (of torch): the lines that still read it are marked
    # what to write back when the names are read, where that differs from ``statement``
    # (a parameter group's list from the target's parameters; ``statement`` then is what the
    # torch line was, put back as it was when the optimizer's translation failed)
    read_statement: str | None = None


    def kept_message(self) -> str:
        listed = ", ".join(f"`{n}`" for n in sorted(self.names))
        return (f"kept because later lines read {listed}: the conversion removes this "
                "statement (no JAX counterpart) when nothing reads it")

    def text(self, read: bool) -> str:
        """What to write back: marked when it is back only because its names are read."""
        kept = f"# TODO(torch2jax): {self.kept_message()} [{RULE}]\n" if (
            read and self.translated is None and not self.imports) else ""
        statement = self.read_statement if read and self.read_statement is not None \
            else self.statement
        return self.leading + self.todos + kept + statement


def bound_names(stmt: cst.CSTNode) -> set[str]:
    """The names ``stmt`` binds in its own scope (assignment targets, loop and ``with``
    targets, definitions; inside its blocks too, not inside nested functions or classes)."""
    names: set[str] = set()

    def targets(node: cst.CSTNode) -> None:
        if isinstance(node, cst.Name):
            names.add(node.value)
        elif isinstance(node, (cst.Tuple, cst.List)):
            for e in node.elements:
                targets(e.value)
        elif isinstance(node, cst.StarredElement):
            targets(node.value)

    def walk(node: cst.CSTNode) -> None:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    if alias.asname is not None:
                        targets(alias.asname.name)
                    else:
                        top = alias.name
                        while isinstance(top, cst.Attribute):
                            top = top.value
                        targets(top)
            return
        if isinstance(node, cst.Assign):
            for t in node.targets:
                targets(t.target)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            targets(node.target)
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            names.add(node.name.value)
            return
        elif isinstance(node, cst.For):
            targets(node.target)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            targets(node.asname.name)
        elif isinstance(node, (cst.Lambda, cst.BaseExpression)) and not isinstance(
                node, cst.Name):
            return
        for child in node.children:
            walk(child)

    walk(stmt)
    return names


def placeholder(key: int, imports: bool = False) -> cst.SimpleStatementLine:
    """The line that stands for removed statement ``key``: an import for an import, so that
    the passes that put code after a file's imports see the same imports."""
    name = cst.Name(PLACEHOLDER.format(key))
    return cst.SimpleStatementLine(body=[
        cst.Import(names=[cst.ImportAlias(name=name)]) if imports else cst.Expr(name)])


def has_placeholders(code: str) -> bool:
    return "__torch2jax_removed_" in code


def settle(code: str, removed: dict[int, Removed], unbound_in_input: set[str],
           failed: set[int] = frozenset(), tree: ast.Module | None = None
           ) -> tuple[str, set[int], set[int], set[int]]:
    """Put back the removed statements that belong to a translation that ``failed``, and
    those whose names ``code`` still reads unbound (until none is left: a statement put back
    may read another removed one); drop the other placeholders. ``tree``: ``code`` parsed,
    if it is at hand. Returns the code and the keys put back because their names are read,
    put back because their translation failed, and dropped."""
    read: set[int] = set()
    unfinished = {k for k, r in removed.items() if r.part_of is not None and r.part_of in failed}
    if unfinished:
        code = _replace(code, {k: removed[k].text(False) for k in unfinished})
        tree = None
    fast = _drop_unread(code, removed)
    if fast is not None:  # (the common case: no line names what they bind)
        return fast[0], read, unfinished, fast[1]
    while True:
        tree = tree if tree is not None else ast.parse(code)
        parents, present, loads = _scan(tree)
        names = {n for k in present if k in removed for n in removed[k].names}
        if not names & loads.keys():
            break  # nothing reads what the removed statements bind
        unbound = {n for n in unbound_names(tree, code) - unbound_in_input
                   if not n.startswith("__torch2jax_removed_")}
        wanted = {k for k in present if k in removed and removed[k].names & unbound}
        if not wanted:  # read where another binding may not have happened (if ddp: ...)
            wanted = {k for k, node in present.items() if k in removed and any(
                _reaches_a_read(node, n, parents, loads.get(n, ())) for n in removed[k].names)}
        if not wanted:
            break
        code = _replace(code, {k: removed[k].text(True) for k in wanted})
        read |= wanted
        tree = None
    dropped = set(present)
    return _drop(code, present, parents), read, unfinished, dropped


def _drop_unread(code: str, removed: dict[int, Removed]) -> tuple[str, set[int]] | None:
    """Without walking a tree: when no line other than a comment or a placeholder contains a
    name the placeholders' statements bind, they all go (a block left empty gets ``pass``,
    found by indentation). None when some line might read one, or the result does not parse
    (a string spanning lines)."""
    lines = code.splitlines(keepends=True)
    found: dict[int, int] = {}  # line index -> placeholder number
    words: set[str] = set()
    for i, line in enumerate(lines):
        mt = _PLACEHOLDER.match(line.rstrip("\r\n"))
        if mt is not None:
            found[i] = int(mt.group("id"))
        elif not line.lstrip().startswith("#"):
            words.update(_WORD.findall(line))
    names = {n for k in found.values() if k in removed for n in removed[k].names}
    if names & words:
        return None
    out = []
    for i, line in enumerate(lines):
        if i not in found:
            out.append(line)
        elif _first_of_empty_block(lines, i, found):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(f"{indent}pass{line[len(line.rstrip(chr(13) + chr(10))):]}")
    text = "".join(out)
    try:
        ast.parse(text)
    except SyntaxError:
        return None
    return text, set(found.values())


_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _first_of_empty_block(lines: list[str], i: int, found: dict[int, int]) -> bool:
    """Placeholder line ``i`` opens a block (the code line before it is a header less
    indented) whose statements are all placeholders (the next code line is less indented)."""
    def code_line(j: int, step: int, skip: dict[int, int]) -> int | None:
        while 0 <= j < len(lines):
            text = lines[j].strip()
            if text and not text.startswith("#") and j not in skip:
                return j
            j += step
        return None

    width = len(lines[i]) - len(lines[i].lstrip())
    before = code_line(i - 1, -1, {})  # (another placeholder before it: not the first)
    if before is None or not lines[before].rstrip().endswith(":") or (
            len(lines[before]) - len(lines[before].lstrip())) >= width:
        return False
    after = code_line(i + 1, 1, found)
    return after is None or len(lines[after]) - len(lines[after].lstrip()) < width


def _scan(tree: ast.Module) -> tuple[dict[int, ast.AST], dict[int, ast.stmt],
                                     dict[str, list[ast.Name]]]:
    """One walk: every node's parent, the placeholders by number, the reads of each name."""
    parents: dict[int, ast.AST] = {}
    present: dict[int, ast.stmt] = {}
    loads: dict[str, list[ast.Name]] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.setdefault(node.id, []).append(node)
            continue
        name = node.value.id if isinstance(node, ast.Expr) and isinstance(
            node.value, ast.Name) else node.names[0].name if isinstance(
            node, ast.Import) and len(node.names) == 1 else None
        if name is not None and name.startswith("__torch2jax_removed_"):
            mt = re.fullmatch(r"__torch2jax_removed_(\d+)__", name)
            if mt:
                present[int(mt.group(1))] = node
    return parents, present, loads


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES = (*_FUNCTIONS, ast.ClassDef, ast.Module)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def shadowed(read: ast.Name, parents: dict[int, ast.AST]) -> bool:
    """``read`` is of a name some function (or comprehension) around it binds locally."""
    child, at = read, parents.get(id(read))
    while at is not None:
        if isinstance(at, _FUNCTIONS):
            inside = child in (at.body if isinstance(at.body, list) else [at.body])
            if inside and _local_to(at, read.id):
                return True
        elif isinstance(at, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and any(
                isinstance(n, ast.Name) and n.id == read.id
                for g in at.generators for n in ast.walk(g.target)):
            return True
        child, at = at, parents.get(id(at))
    return False


def parents_of(tree: ast.Module) -> dict[int, ast.AST]:
    return _parents(tree)


def _parents(tree: ast.Module) -> dict[int, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[id(child)] = node
    return out


def _block_of(node: ast.stmt, parents: dict[int, ast.AST]) -> tuple[list[ast.stmt], int] | None:
    """The statement list ``node`` is in, and its index there."""
    parent = parents.get(id(node))
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and any(s is node for s in block):
            return block, next(i for i, s in enumerate(block) if s is node)
    return None


def _binds(stmt: ast.stmt, name: str) -> bool:
    """``stmt`` itself (not a block inside it) binds ``name``."""
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        targets = [stmt.target]
    elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name == name
    elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in stmt.names)
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for t in targets for n in ast.walk(t))


def _local_to(fn: ast.AST, name: str) -> bool:
    """``name`` is a parameter of, or assigned in, the function (or class body) ``fn``."""
    args = getattr(fn, "args", None)
    if args is not None and any(a.arg == name for a in (
            *args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
            if a is not None):
        return True
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            if getattr(node, "name", None) == name:
                return True
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) and _binds(node, name):
            return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _reaches_a_read(node: ast.stmt, name: str, parents: dict[int, ast.AST],
                    loads: list[ast.Name] | tuple = ()) -> bool:
    """Whether the binding of ``name`` that placeholder ``node`` stands for would reach a read
    of ``name`` in the file: a read later in its scope (or anywhere in a loop around it, or
    in a function nested in its scope), with no statement of the placeholder's own block
    binding ``name`` again in between. Other bindings inside branches (``if ddp: device =
    ...``) do not stop it: they may not happen."""
    place = _block_of(node, parents)
    if place is None:
        return False
    block, index = place
    scope = parents.get(id(node))
    while scope is not None and not isinstance(scope, _SCOPES):
        scope = parents.get(id(scope))
    if scope is None:
        return False
    loops = set()
    at = parents.get(id(node))
    while at is not None and at is not scope:
        if isinstance(at, _LOOPS):
            loops.add(id(at))
        at = parents.get(id(at))
    block_ids = {id(s): i for i, s in enumerate(block)}
    for read in loads:
        nested = in_loop = local = False
        at_index = None
        child, at = read, parents.get(id(read))
        while at is not None and at is not scope:
            inside = child in (at.body if isinstance(getattr(at, "body", None), list)
                               else [getattr(at, "body", None)])
            if isinstance(at, (*_FUNCTIONS, ast.ClassDef)) and inside:
                nested = True  # read when the function runs (bases and defaults: now)
                if _local_to(at, name):
                    local = True
                    break
            if id(at) in loops:
                in_loop = True
            if id(at) in block_ids and at_index is None:
                at_index = block_ids[id(at)]
            child, at = at, parents.get(id(at))
        if local or at is None:  # (at None: the read is outside the placeholder's scope)
            continue
        if id(child) in block_ids and at_index is None:
            at_index = block_ids[id(child)]
        if at_index is not None and at_index <= index and not in_loop and not nested:
            continue  # before the placeholder
        if at_index is None and not nested and not in_loop and (
                read.lineno, read.col_offset) < (node.lineno, node.col_offset):
            continue
        end = at_index if at_index is not None and at_index > index else len(block)
        if any(_binds(block[j], name) for j in range(index + 1, end)):
            continue  # bound again first
        return True
    return False


def _replace(code: str, texts: dict[int, str]) -> str:
    out = []
    for line in code.splitlines(keepends=True):
        mt = _PLACEHOLDER.match(line.rstrip("\r\n"))
        if mt and int(mt.group("id")) in texts:
            indent = mt.group("indent")
            for part in texts[int(mt.group("id"))].splitlines(keepends=True):
                out.append(indent + part if part.strip() else part)
            continue
        out.append(line)
    return "".join(out)


def _drop(code: str, present: dict[int, ast.stmt], parents: dict[int, ast.AST]) -> str:
    """Without the placeholders: a block left with none of its statements gets ``pass`` (as
    libcst writes an emptied block)."""
    if not present:
        return code
    ids = {id(n) for n in present.values()}
    passes: set[int] = set()  # line numbers of placeholders that become `pass`
    for node in present.values():
        place = _block_of(node, parents)
        if place is None:
            handler = parents.get(id(node))
            block = handler.body if isinstance(handler, ast.ExceptHandler) else None
        else:
            block = place[0]
        if block and not isinstance(parents.get(id(node)), ast.Module) and all(
                id(s) in ids for s in block):
            passes.add(block[0].lineno)
    out = []
    for number, line in enumerate(code.splitlines(keepends=True), start=1):
        mt = _PLACEHOLDER.match(line.rstrip("\r\n"))
        if mt is None:
            out.append(line)
        elif number in passes:
            out.append(f"{mt.group('indent')}pass{line[len(line.rstrip(chr(13) + chr(10))):]}")
    return "".join(out)


def comments_above(lines: list[str], first: int) -> list[str]:
    """The comment lines right above line ``first`` (1-based), stripped."""
    out = []
    i = first - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        out.append(lines[i].strip())
        i -= 1
    return out
