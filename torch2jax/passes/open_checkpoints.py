"""A checkpoint written to or read from a file the program opens itself, made a path before
the analysis (issue 28).

    with open(args.save, "wb") as f:
        torch.save(model.state_dict(), f)

is ``torch.save(model.state_dict(), args.save)`` (torch.save takes a path or a file object
and writes the same bytes), and ``with open(path, "rb") as f: model.load_state_dict(
torch.load(f))`` is ``model.load_state_dict(torch.load(path))``. The checkpoint pass
(``passes/rewrite_checkpoints.py``) writes an orbax checkpoint, a directory at a path, so it
needs the path. Rewritten on the torch source: a ``with open(PATH, MODE) as f:`` whose body is
that one statement, ``f`` read once there, MODE a literal binary write or read mode (a read
of ``f`` after the block, which the rewrite unbinds, is marked by finish/ as any unbound name).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

_SAVE = m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("save")))
_LOAD = m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("load")))


def _opened(item: cst.WithItem) -> tuple[cst.BaseExpression, str, str] | None:
    """(the path, the mode, the file's name) of ``open(PATH, MODE) as f``."""
    call = item.item
    if not m.matches(call, m.Call(func=m.Name("open"))) or item.asname is None or not isinstance(
            item.asname.name, cst.Name):
        return None
    pos = [a.value for a in call.args if a.keyword is None and not a.star]
    kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if set(kw) - {"mode"} or len(pos) + len(kw) != 2 or not pos:
        return None
    mode = kw.get("mode", pos[1] if len(pos) > 1 else None)
    if not isinstance(mode, cst.SimpleString) or mode.evaluated_value not in ("wb", "rb"):
        return None
    return pos[0], mode.evaluated_value, item.asname.name.value


class _Rewrite(cst.CSTTransformer):
    def leave_With(self, original_node, updated_node):
        if len(updated_node.items) != 1 or updated_node.asynchronous or not isinstance(
                updated_node.body, cst.IndentedBlock) or len(updated_node.body.body) != 1:
            return updated_node
        opened = _opened(updated_node.items[0])
        stmt = updated_node.body.body[0]
        if opened is None or not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr()])):
            return updated_node
        path, mode, f = opened
        if len(m.findall(original_node, m.Name(f))) != 2:
            return updated_node  # the file is read again in the block: kept
        call = stmt.body[0].value
        file_arg = m.Arg(value=m.Name(f), keyword=None)
        if mode == "wb" and m.matches(call, _SAVE) and len(call.args) == 2 and m.matches(
                call.args[1], file_arg):
            new = call.with_changes(args=[call.args[0], call.args[1].with_changes(value=path)])
        elif mode == "rb" and m.matches(call, m.Call(func=m.Attribute(
                attr=m.Name("load_state_dict")), args=[m.Arg(value=_LOAD, keyword=None)])) and \
                m.matches(call.args[0].value.args[0], file_arg):
            load = call.args[0].value
            load = load.with_changes(args=[load.args[0].with_changes(value=path),
                                           *load.args[1:]])
            new = call.with_changes(args=[call.args[0].with_changes(value=load)])
        else:
            return updated_node
        return stmt.with_changes(body=[stmt.body[0].with_changes(value=new)],
                                 leading_lines=updated_node.leading_lines)


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with ``with open(p) as f: torch.save(x, f)`` (and the load) made ``p``'s."""
    if "open(" not in module.code:
        return module
    return module.visit(_Rewrite())
