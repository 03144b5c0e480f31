"""Torch module methods that set a parameter, written as the plain forms the analysis reads,
before it (a canonical form, as ``passes/local_lambdas.py``).

transformers' modeling files (SuperGlue, EoMT-DINOv3, ConvBERT, Granite Speech) write

    self.register_parameter("bin_score", bin_score)
    self.embeddings.register_parameter("mask_token", None)
    self.depthwise.weight.data.normal_(mean=0.0, std=config.initializer_range)

A JAX module has no ``register_parameter`` and a JAX array no ``.data``: left as they were,
the first two stayed unmarked and failed when the model was built. Each is, in torch, the same
as a form the converter translates:

* ``m.register_parameter("name", value)`` (a literal name, a statement) is ``m.name = value``:
  torch's ``Module.__setattr__`` registers a ``Parameter`` (or ``None``) assigned to an
  attribute the same way, and ``register_parameter`` refuses any other value;
* ``p.data.normal_(...)``, ``.uniform_(...)``, ``.zero_()``, ``.fill_(v)`` (a statement) are
  ``torch.nn.init.normal_(p, ...)``, ``uniform_``, ``zeros_``, ``constant_(p, v)``: both fill
  ``p`` in place, outside autograd, from the same global generator with the same arguments.
  ``Tensor.uniform_``'s bounds are positional (``from`` is a Python keyword); a keyword the
  init function names otherwise (``generator=``) leaves the line as it is.

The file must import ``torch`` by that name for the second form (otherwise it is left as it is).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

# Tensor method -> (torch.nn.init function, keywords both accept)
_INITS = {"normal_": ("normal_", {"mean", "std"}), "uniform_": ("uniform_", set()),
          "zero_": ("zeros_", set()), "fill_": ("constant_", set())}


def _imports_torch(module: cst.Module) -> bool:
    return bool(m.findall(module, m.Import(names=[m.ImportAlias(name=m.Name("torch"),
                                                                asname=None)])))


class _Plain(cst.CSTTransformer):
    def __init__(self, torch: bool) -> None:
        self.torch = torch

    def leave_Expr(self, original_node, updated_node):
        call = updated_node.value
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return updated_node
        meth, recv = call.func.attr.value, call.func.value
        if meth == "register_parameter" and len(call.args) == 2 and not any(
                a.keyword or a.star for a in call.args) and isinstance(
                call.args[0].value, cst.SimpleString):
            name = call.args[0].value.evaluated_value
            if isinstance(name, str) and name.isidentifier():
                return cst.Assign(targets=[cst.AssignTarget(cst.Attribute(recv, cst.Name(name)))],
                                  value=call.args[1].value)
        if self.torch and meth in _INITS and m.matches(recv, m.Attribute(attr=m.Name("data"))):
            init, keywords = _INITS[meth]
            if any(a.star or (a.keyword and a.keyword.value not in keywords) for a in call.args):
                return updated_node
            func = cst.parse_expression(f"torch.nn.init.{init}")
            args = [cst.Arg(recv.value), *(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                           for a in call.args)]
            args = [a.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                    for a in args[:-1]] + args[-1:]
            return updated_node.with_changes(value=cst.Call(func=func, args=args))
        return updated_node


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with the module methods of the docstring written as their plain forms."""
    if not m.findall(module, m.Call(func=m.Attribute(attr=m.Name("register_parameter")))
                     | m.Call(func=m.Attribute(value=m.Attribute(attr=m.Name("data"))))):
        return module
    return module.visit(_Plain(_imports_torch(module)))
