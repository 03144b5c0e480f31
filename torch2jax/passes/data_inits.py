"""A parameter drawn or set in place through ``.data`` (timm's pvt_v2 and dla init loops),
made the ``torch.nn.init`` call it is before the analysis.

    m.weight.data.normal_(0, math.sqrt(2. / n))    ->  torch.nn.init.normal_(m.weight, 0, ...)
    m.bias.data.zero_()                            ->  torch.nn.init.zeros_(m.bias)
    m.weight.data.fill_(1)                         ->  torch.nn.init.constant_(m.weight, 1)
    m.weight.data.uniform_(-r, r)                  ->  torch.nn.init.uniform_(m.weight, -r, r)

Each pair does the same in torch (the init functions draw or fill in place without recording
gradients, as a write through ``.data`` does), and the ``torch.nn.init`` calls are translated
with the converted weight's layout (passes/torch_init.py): the ``.data`` forms were marked,
then failed at build ("'ArrayImpl' object has no attribute 'data'"). Rewritten on the torch
source, as a statement of its own (its value unused), where the file imports ``torch`` by
that name and the receiver is an attribute's ``.data`` (a parameter, as ``m.weight``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

# Tensor method -> (torch.nn.init function, its keywords for the method's)
_INITS = {"normal_": ("normal_", {"mean": "mean", "std": "std"}),
          "uniform_": ("uniform_", {"to": "b"}),
          "zero_": ("zeros_", {}),
          "fill_": ("constant_", {"value": "val"})}
_DATA_CALL = m.Call(func=m.Attribute(value=m.Attribute(value=m.Attribute(),
                                                       attr=m.Name("data"))))


class _Rewrite(cst.CSTTransformer):
    def leave_Expr(self, original_node, updated_node):
        call = updated_node.value
        if not m.matches(call, _DATA_CALL) or call.func.attr.value not in _INITS or (
                call.func.value.value.attr.value == "grad"):
            return updated_node  # (p.grad.data.zero_(): the gradient, not a parameter)
        name, keywords = _INITS[call.func.attr.value]
        if any(a.star or a.keyword is not None and a.keyword.value not in keywords
               for a in call.args):
            return updated_node
        if name == "constant_" and len(call.args) != 1 or name == "zeros_" and call.args:
            return updated_node
        args = [a.with_changes(keyword=cst.Name(keywords[a.keyword.value]))
                if a.keyword is not None else a for a in call.args]
        param = cst.Arg(call.func.value.value)
        new = cst.Call(func=cst.parse_expression(f"torch.nn.init.{name}"),
                       args=[param.with_changes(comma=cst.Comma(
                           whitespace_after=cst.SimpleWhitespace(" "))) if args else param,
                             *args])
        return updated_node.with_changes(value=new)


def _imports_torch(module: cst.Module) -> bool:
    return any(m.matches(stmt, m.SimpleStatementLine(body=[m.Import(names=[
        m.ImportAlias(name=m.Name("torch"), asname=None)])])) for stmt in module.body)


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with its ``.data`` in-place inits made ``torch.nn.init`` calls."""
    if ".data." not in module.code or not _imports_torch(module):
        return module
    return module.visit(_Rewrite())
