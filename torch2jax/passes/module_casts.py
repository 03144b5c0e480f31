"""A module cast to another floating-point type: ``model.double()``, ``model.half()``,
``model.float()``, ``model.bfloat16()``, ``model.to(torch.float64)``,
``model.to(device, dtype=torch.float16)``.

torch casts every floating-point parameter and buffer of the module in place (and returns the
module). An NNX module's arrays are its state, so the cast is that state mapped and written
back, what one writes by hand:

    nnx.update(model, jax.tree.map(
        lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
        nnx.state(model)))

A device move (``.cuda()``, ``.cpu()``, ``.to(device)``) changes no value and is dropped, as
before. float64 needs JAX's 64-bit mode: the rewriter turns it on at the top of the file
(``jax.config.update("jax_enable_x64", True)``), with a warning that arrays made without a
dtype are then float64 too (torch's default is float32). A cast this cannot read (a dtype in a
variable that may be a device, a starred argument) is dropped only where it is a device move;
a target without a form (linen, equinox) marks the statement.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes.common import Untranslatable, code, expr

# a module's cast method -> the jnp dtype its floating-point state takes
CAST_METHODS = {"double": "jnp.float64", "float": "jnp.float32", "half": "jnp.float16",
                 "bfloat16": "jnp.bfloat16"}
# torch's floating dtypes, qualified -> jnp's
_DTYPES = {"torch.float64": "jnp.float64", "torch.double": "jnp.float64",
           "torch.float32": "jnp.float32", "torch.float": "jnp.float32",
           "torch.float16": "jnp.float16", "torch.half": "jnp.float16",
           "torch.bfloat16": "jnp.bfloat16"}
_TO_KEYWORDS = ("device", "non_blocking", "copy", "memory_format")
X64 = 'jax.config.update("jax_enable_x64", True)'
X64_WARNING = ("float64 needs JAX's 64-bit mode: jax.config.update(\"jax_enable_x64\", True) is "
               "added at the top of the file; under it, arrays made without a dtype are float64 "
               "too (torch's default is float32)")


class Unreadable(Exception):
    """A module cast whose dtype torch2jax cannot read."""


def cast_dtype(call: cst.Call, qualify) -> str | None:
    """The jnp dtype the module cast ``call`` gives the module's floating-point state, None for
    a device move (``.cuda()``, ``.to(device)``); Unreadable for a dtype it cannot read."""
    if not isinstance(call.func, cst.Attribute):
        return None
    meth = call.func.attr.value
    if meth in CAST_METHODS:
        if call.args:
            raise Unreadable(f".{meth}() with arguments")
        return CAST_METHODS[meth]
    if meth != "to":
        return None
    found = None
    for a in call.args:
        if a.star:
            raise Unreadable("a starred argument of .to()")
        keyword = a.keyword.value if a.keyword is not None else None
        if keyword in _TO_KEYWORDS:
            continue
        name = qualify(a.value) or ""
        if keyword == "dtype" or name in _DTYPES:
            if name not in _DTYPES:
                raise Unreadable(f"the dtype {code(a.value)}")
            found = _DTYPES[name]
        elif keyword is not None:
            raise Unreadable(f"the argument {keyword}=")
    return found


def cast_statement(model: cst.BaseExpression, dtype: str) -> cst.SimpleStatementLine:
    """NNX: the module's floating-point state cast to ``dtype`` and written back."""
    return cst.SimpleStatementLine(body=[cst.Expr(expr(
        "nnx.update({m}, jax.tree.map(lambda a: a.astype(" + dtype + ") if jnp.issubdtype("
        "a.dtype, jnp.floating) else a, nnx.state({m})))", m=model))])


def with_x64(body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """The module body with 64-bit mode turned on after its imports (and docstring)."""
    if any(code(s).strip() == X64 for s in body):
        return body
    i = 0
    while i < len(body) and (
            isinstance(body[i], cst.SimpleStatementLine) and isinstance(
                body[i].body[0], (cst.Import, cst.ImportFrom))
            or i == 0 and isinstance(body[i], cst.SimpleStatementLine) and isinstance(
                body[i].body[0], cst.Expr) and isinstance(body[i].body[0].value,
                                                           cst.SimpleString)):
        i += 1
    line = cst.parse_statement(X64 + "\n")
    return [*body[:i], line, *body[i:]]


def rewrite_cast(rw, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
    """The rewriter's ``leave_Call`` of a module's device move or cast (``original``): the
    module (the call dropped), the cast written after its statement; Untranslatable where it
    cannot be."""
    receiver = updated.func.value
    try:
        dtype = cast_dtype(original, rw.q)
    except Unreadable as exc:
        raise Untranslatable(f"{code(original)}: {exc} is not read: cast the module's "
                             "floating-point state with jax.tree.map", rule="module-cast") from None
    if dtype is None:
        return receiver
    parent = rw.get_metadata(ParentNodeProvider, original, None)
    built = isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
        parent.targets[0].target, cst.Attribute) and rw._builds_layers_here()
    if rw.in_module_class() and not built:  # (self.cell = Cell(...).to(dtype) in __init__:
        model = None                        # the cast after the statement, as outside)
    elif isinstance(parent, cst.Expr):
        model = receiver
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(
            parent.targets[0].target, (cst.Name, cst.Attribute)):
        model = parent.targets[0].target
    else:
        model = None
    statement = None if model is None or isinstance(model, cst.Call) else \
        rw.target.module_cast(model, dtype)
    if statement is None:
        raise Untranslatable(f"{code(original)}: a module cast to {dtype} is translated as a "
                             f"statement of its own on NNX (nnx.update of its state mapped by "
                             f"jax.tree.map); cast the floating-point arrays of its state here",
                             rule="module-cast")
    rw.need("nnx", "jax", "jnp")
    if dtype == "jnp.float64" and not rw.x64:
        rw.x64 = True
        rw.diag(original, "float64", "warning", X64_WARNING)
    rw._pending[-1].after.append(statement)
    return receiver
