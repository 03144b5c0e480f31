"""A buffer that may be ``None`` (NNX): timm's swin blocks register ``attn_mask`` as ``None``
first, then again with what ``get_attn_mask()`` returns, a tensor for a shifted block and
``None`` for the others; the forward passes tests ``mask is not None``.

``nnx.Variable(None)`` is not ``None``: the test passes and ``mask.shape`` fails ("'NoneType'
object has no attribute 'shape'"). So, on NNX, a buffer registered as a literal ``None`` is the
attribute ``None`` (``nnx.data(None)`` where the class registers it again with a value: NNX
refuses a Variable assigned over a static attribute), and the other registrations of that name
with a value held by a name keep ``None`` as ``None``:
``self.attn_mask = nnx.Variable(attn_mask) if attn_mask is not None else None``.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import arg, call, expr

_REGISTER = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("register_buffer")))


def _registrations(root: cst.Module, cls: str, cache: dict) -> dict[str, list[bool]]:
    """class ``cls``'s ``self.register_buffer("name", value)`` calls: name -> for each, whether
    the value is a literal None."""
    if cls not in cache:
        out: dict[str, list[bool]] = {}
        for node in m.findall(root, m.ClassDef(name=m.Name(cls))):
            for c in m.findall(node, _REGISTER):
                if len(c.args) >= 2 and isinstance(c.args[0].value, cst.SimpleString):
                    out.setdefault(c.args[0].value.evaluated_value, []).append(
                        m.matches(c.args[1].value, m.Name("None")))
        cache[cls] = out
    return cache[cls]


def buffer_value(rewriter, name: str, data: cst.BaseExpression
                 ) -> tuple[cst.BaseExpression, tuple[str, ...]]:
    """The value of ``self.<name>`` for ``self.register_buffer(name, data)``."""
    target = rewriter.target
    if target.buffer != "nnx.Variable" or target.intermediate or rewriter.current_class is None:
        return target.buffer_value(data)
    cache = rewriter.__dict__.setdefault("_optional_buffers", {})
    kinds = _registrations(rewriter._root, rewriter.current_class, cache).get(name, [])
    if m.matches(data, m.Name("None")):
        if all(kinds):
            return cst.Name("None"), ()
        return call("nnx.data", arg(cst.Name("None"))), (target.module_import,)
    value, imports = target.buffer_value(data)
    if any(kinds) and isinstance(data, cst.Name):
        return cst.IfExp(test=expr(f"{data.value} is not None"), body=value,
                         orelse=cst.Name("None")), imports
    return value, imports


def optional_read(rewriter, name: str, read: cst.BaseExpression,
                  variable: cst.BaseExpression) -> cst.BaseExpression:
    """``self.<name>[...]`` (``read``) where the class registers the buffer as a literal
    ``None`` too (``self.attn(x, mask=self.attn_mask)``): ``None`` stays ``None``."""
    cache = rewriter.__dict__.setdefault("_optional_buffers", {})
    kinds = _registrations(rewriter._root, rewriter.current_class, cache).get(name, [])
    if rewriter.current_class is None or not any(kinds):
        return read
    return cst.IfExp(test=expr("{v} is not None", v=variable), body=read,
                     orelse=cst.Name("None"), lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
