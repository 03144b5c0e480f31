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

UperNet's and MaskFormer's blocks keep a plain list whose modules the same function registers
one by one under torch's own names::

    self.layers = [nn.AdaptiveAvgPool2d(scale), UperNetConvModule(...)]
    for i, layer in enumerate(self.layers):
        self.add_module(str(i), layer)

    self.blocks = []
    for i, pool_scale in enumerate(pool_scales):
        block = UperNetPyramidPoolingBlock(...)
        self.blocks.append(block)
        self.add_module(str(i), block)

There the list is a module list from the start too (``nn.ModuleList([...])``): the modules
stay registered under the names ``add_module`` gives (torch's parameter names; NNX names a
module held twice by its first path, and ``"0"`` sorts before any attribute name), and the list
holds the same modules, as torch's does.

Mask2Former's pixel decoder registers each module and appends it to a local list, then keeps
the list (reversed) in an attribute torch does not register::

    for idx, in_channels in enumerate(channels):
        lateral_conv = nn.Sequential(...)
        self.add_module(f"adapter_{idx + 1}", lateral_conv)
        lateral_convs.append(lateral_conv)
    self.lateral_convolutions = lateral_convs[::-1]

There the attribute is a module list of the list (``nn.ModuleList(lateral_convs[::-1])``):
the same modules, named by the paths ``add_module`` gave where those sort first.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

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


def _adds(block: cst.BaseSuite, name: str) -> bool:
    """Whether ``block`` holds ``self.add_module(<name>, name)``."""
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if (_CODE.code_for_node(node.func) == "self.add_module" and len(node.args) == 2
                    and _CODE.code_for_node(node.args[1].value) == name):
                found.append(node)
    block.visit(_Find())
    return bool(found)


def _registered(stmt: cst.BaseStatement) -> set[str]:
    """The list attributes whose elements the loop ``stmt`` registers with ``add_module``:
    ``for i, m in enumerate(self.x): self.add_module(str(i), m)``, or a loop that appends
    ``m`` to ``self.x`` and registers it."""
    if not (isinstance(stmt, cst.For) and isinstance(stmt.body, cst.IndentedBlock)):
        return set()
    out: set[str] = set()
    it = stmt.iter
    if (isinstance(it, cst.Call) and _CODE.code_for_node(it.func) == "enumerate"
            and len(it.args) == 1 and isinstance(stmt.target, cst.Tuple)
            and len(stmt.target.elements) == 2
            and isinstance(stmt.target.elements[1].value, cst.Name)
            and _adds(stmt.body, stmt.target.elements[1].value.value)):
        out.add(_CODE.code_for_node(it.args[0].value))
    for line in stmt.body.body:
        if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                and isinstance(line.body[0], cst.Expr)
                and isinstance(call := line.body[0].value, cst.Call)):
            continue
        func = _CODE.code_for_node(call.func)
        if (func.endswith(".append") and len(call.args) == 1
                and isinstance(call.args[0].value, cst.Name)
                and _adds(stmt.body, call.args[0].value.value)):
            out.add(func.removesuffix(".append"))  # self.x, or a local list
    return out


def _local_list_kept(stmt: cst.BaseStatement, names: set[str],
                     module_list: cst.BaseExpression) -> cst.BaseStatement | None:
    """``self.x = convs[::-1]`` (or ``= convs``) of a local list ``convs`` whose modules the
    function registered one by one: ``self.x = nn.ModuleList(convs[::-1])`` (Mask2Former's
    lateral convolutions), else None."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(assign := stmt.body[0], cst.Assign) and len(assign.targets) == 1
            and m.matches(assign.targets[0].target, m.Attribute(value=m.Name("self")))):
        return None
    value = assign.value
    held = value.value if isinstance(value, cst.Subscript) and all(
        isinstance(e.slice, cst.Slice) for e in value.slice) else value
    if not (isinstance(held, cst.Name) and held.value in names):
        return None
    return stmt.with_changes(body=[assign.with_changes(
        value=cst.Call(module_list, [cst.Arg(value)]))])


class _ModuleListFromStart(cst.CSTTransformer):
    def __init__(self, module_list: cst.BaseExpression | None) -> None:
        super().__init__()
        self.module_list = module_list  # the file's nn.ModuleList, None where it has no nn

    def _registered_lists(self, body: list[cst.BaseStatement]) -> bool:
        """``self.x = [...]`` whose modules a later loop registers one by one: a module list
        from the start (``nn.ModuleList([...])``); whether any was rewritten."""
        changed = False
        local: set[str] = set()  # local lists whose modules a loop registered
        for i, stmt in enumerate(body):
            kept = _local_list_kept(stmt, local, self.module_list) if local else None
            if kept is not None:
                body[i], changed = kept, True
            for code in _registered(stmt) if self.module_list is not None else ():
                if "." not in code:
                    local.add(code)
                    continue
                for j in range(i - 1, -1, -1):
                    line = body[j]
                    if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                            and isinstance(line.body[0], cst.Assign)
                            and len(line.body[0].targets) == 1 and _CODE.code_for_node(
                                line.body[0].targets[0].target) == code):
                        continue
                    assign = line.body[0]
                    if isinstance(assign.value, cst.List):
                        value = cst.Call(self.module_list, [cst.Arg(assign.value)] if (
                            assign.value.elements) else [])
                        body[j] = line.with_changes(body=[assign.with_changes(value=value)])
                        changed = True
                    break
        return changed

    def leave_FunctionDef(self, original_node, updated_node):
        if not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body = list(updated_node.body.body)
        changed = self._registered_lists(body)
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
    function written as ``self.x = nn.ModuleList()``, and a plain list whose modules the
    function registers with ``add_module`` one by one written as ``nn.ModuleList([...])``."""
    return module.visit(_ModuleListFromStart(_module_list(module)))


def _module_list(module: cst.Module) -> cst.BaseExpression | None:
    """The file's name for torch's ``nn.ModuleList``: ``nn.ModuleList`` where the file
    imports ``nn`` from torch, ``torch.nn.ModuleList`` where it imports torch; else None."""
    plain = False
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and small.module is not None and (
                    _CODE.code_for_node(small.module) == "torch") and not isinstance(
                    small.names, cst.ImportStar) and any(
                    a.evaluated_name == "nn" and a.asname is None for a in small.names):
                return cst.parse_expression("nn.ModuleList")
            if isinstance(small, cst.Import):
                for alias in small.names:
                    name = _CODE.code_for_node(alias.name)
                    if name == "torch.nn" and alias.asname is not None and (
                            _CODE.code_for_node(alias.asname.name) == "nn"):
                        return cst.parse_expression("nn.ModuleList")
                    plain |= name == "torch" and alias.asname is None
    return cst.parse_expression("torch.nn.ModuleList") if plain else None
