"""Which names a file reads without binding them: the check pyflakes / ruff call F821, written
with libcst's scope analysis so that the converter needs no linter at conversion time."""

from __future__ import annotations

import ast
import builtins
import symtable
from collections.abc import Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

# bound in every module although no statement binds them
MODULE_NAMES = frozenset({"__file__", "__name__", "__doc__", "__package__", "__spec__",
                          "__loader__", "__builtins__", "__annotations__", "__path__",
                          "__cached__", "__dict__", "__module__", "__qualname__", "__class__"})
BUILTINS = frozenset(dir(builtins)) | MODULE_NAMES


def _star_import(module: cst.Module) -> bool:
    """``from m import *`` at the top level: any name may be bound (ruff reports F405 there,
    not F821)."""
    return any(isinstance(s, cst.ImportFrom) and isinstance(s.names, cst.ImportStar)
               for stmt in module.body if isinstance(stmt, cst.SimpleStatementLine)
               for s in stmt.body)


def unbound_names(tree: ast.Module, code: str, filename: str = "<output>") -> set[str]:
    """The names ``code`` (parsed: ``tree``) reads somewhere without any scope binding them.
    The compiler's own symbol tables answer (fast): a read resolved to the global scope of a
    name that nothing at the top level (or a ``global`` statement) binds, and no builtin.
    Nothing when the module star-imports."""
    if any(isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)
           for s in tree.body):
        return set()
    top = symtable.symtable(code, filename, "exec")
    bound: set[str] = set()
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        for sym in table.get_symbols():
            if table is top:
                if sym.is_assigned() or sym.is_imported() or sym.is_namespace():
                    bound.add(sym.get_name())
                elif sym.is_referenced():
                    read.add(sym.get_name())
            elif sym.is_global():
                if sym.is_assigned() or sym.is_imported() or sym.is_namespace():
                    bound.add(sym.get_name())  # global x; x = ...
                elif sym.is_referenced():
                    read.add(sym.get_name())
        tables.extend(table.get_children())
    return read - bound - BUILTINS


def unbound_reads(wrapper: MetadataWrapper, only: set[str] | None = None,
                  imported: frozenset[str] | set[str] = frozenset()) -> Iterator[cst.Name]:
    """The ``Name`` nodes of ``wrapper``'s module that read a name no scope binds (of ``only``
    when given), and those that read one of ``imported`` bound by an import, in no
    particular order: libcst's scope analysis, exact to the node. Nothing when the module
    star-imports."""
    if _star_import(wrapper.module):
        return
    scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
    for scope in scopes:
        for access in scope.accesses:
            node = access.node
            if not isinstance(node, cst.Name) or node.value in BUILTINS:
                continue
            imported_read = node.value in imported and access.referents and all(
                isinstance(getattr(a, "node", None), (cst.Import, cst.ImportFrom))
                for a in access.referents)
            if imported_read or (not access.referents and (only is None or node.value in only)):
                yield node


def torch_import_lines(wrapper: MetadataWrapper, packages: tuple[str, ...]) -> dict[str, str]:
    """name -> the import line that binds it, for every import of ``packages`` (at any depth
    of the file)."""
    empty = cst.Module([])
    out: dict[str, str] = {}
    scopes = {s for s in wrapper.resolve(ScopeProvider).values() if s is not None}
    for scope in scopes:
        for assignment in scope.assignments:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.Import):
                for alias in node.names:
                    dotted = empty.code_for_node(alias.name)
                    if dotted.split(".")[0] not in packages:
                        continue
                    bound = alias.asname.name.value if alias.asname and isinstance(
                        alias.asname.name, cst.Name) else dotted.split(".")[0]
                    if bound == assignment.name:
                        out.setdefault(bound, f"import {dotted}" + (
                            f" as {bound}" if alias.asname else ""))
            elif isinstance(node, cst.ImportFrom) and node.module is not None and \
                    not node.relative and not isinstance(node.names, cst.ImportStar):
                module = empty.code_for_node(node.module)
                if module.split(".")[0] not in packages:
                    continue
                for alias in node.names:
                    name = empty.code_for_node(alias.name)
                    bound = alias.asname.name.value if alias.asname and isinstance(
                        alias.asname.name, cst.Name) else name
                    if bound == assignment.name:
                        out.setdefault(bound, f"from {module} import {name}" + (
                            f" as {bound}" if bound != name else ""))
    return out
