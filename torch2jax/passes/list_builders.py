"""A module list built in an attribute that starts as a plain list, written as a module list
from the start, before the analysis (a canonical form, as ``passes/module_methods.py``).

transformers' DAC and PE Audio encoders grow a plain list in the attribute they then wrap::

    self.block = []
    for stride in config.downsampling_ratios:
        self.block += [DacEncoderBlock(config, stride=stride)]
    self.block = nn.ModuleList(self.block)

A flax NNX module refuses a plain list holding modules (or arrays) in an attribute: the
converted ``self.block += [...]`` failed when the model was built ("Found data on value of
type list assigned to static attribute"). Where the same function assigns the attribute an
empty list and later ``nn.ModuleList(self.block)``, the empty list is ``nn.ModuleList()``:
torch's module list takes ``+=``, ``append``, ``extend``, ``len`` and indexing as the list
does, and wrapping it again gives the same modules (NNX's ``nnx.List``, its translation, as well).
"""

from __future__ import annotations

import libcst as cst

_CODE = cst.Module([])


def _wrapped(stmt: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """``self.x = nn.ModuleList(self.x)``: (the attribute's code, the class expression)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1):
        return None
    target, value = stmt.body[0].targets[0].target, stmt.body[0].value
    if not (isinstance(target, cst.Attribute) and isinstance(value, cst.Call)
            and _CODE.code_for_node(value.func).split(".")[-1] == "ModuleList"
            and len(value.args) == 1 and value.args[0].keyword is None
            and not value.args[0].star):
        return None
    code = _CODE.code_for_node(target)
    if _CODE.code_for_node(value.args[0].value) != code:
        return None
    return code, value.func


def _empty(stmt: cst.BaseStatement, code: str) -> bool:
    """``self.x = []``."""
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
            and _CODE.code_for_node(stmt.body[0].targets[0].target) == code
            and isinstance(stmt.body[0].value, cst.List) and not stmt.body[0].value.elements)


class _ModuleListFromStart(cst.CSTTransformer):
    def leave_FunctionDef(self, original_node, updated_node):
        if not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body = list(updated_node.body.body)
        changed = False
        for i, stmt in enumerate(body):
            found = _wrapped(stmt)
            if found is None:
                continue
            code, cls = found
            for j in range(i - 1, -1, -1):
                if _empty(body[j], code):
                    assign = body[j].body[0]
                    body[j] = body[j].with_changes(body=[assign.with_changes(
                        value=cst.Call(cls))])
                    changed = True
                    break
        if not changed:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with ``self.x = []`` later wrapped by ``nn.ModuleList(self.x)`` in the same
    function written as ``self.x = nn.ModuleList()``."""
    return module.visit(_ModuleListFromStart())
