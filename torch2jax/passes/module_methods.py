"""Torch module methods that set a parameter, written as the plain forms the analysis reads,
before it (a canonical form, as ``passes/local_lambdas.py``).

transformers' modeling files (SuperGlue, EoMT-DINOv3, ConvBERT, Granite Speech) write

    self.register_parameter("bin_score", bin_score)
    self.embeddings.register_parameter("mask_token", None)
    self.depthwise.weight.data.normal_(mean=0.0, std=config.initializer_range)

A JAX module has no ``register_parameter``: left as they were, the first two stayed unmarked
and failed when the model was built. ``m.register_parameter("name", value)`` (a literal name,
a statement) is, in torch, ``m.name = value``: ``Module.__setattr__`` registers a
``Parameter`` (or ``None``) assigned to an attribute the same way, and
``register_parameter`` refuses any other value. (The third line, an in-place draw through
``.data``, is ``torch.nn.init.normal_(...)``: passes/data_inits.py, the form before this one,
writes it.)
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m


class _Plain(cst.CSTTransformer):
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
        return updated_node


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with the module methods of the docstring written as their plain forms."""
    if not m.findall(module, m.Call(func=m.Attribute(attr=m.Name("register_parameter")))):
        return module
    return module.visit(_Plain())
