"""A module's own methods under the equinox target: weight initialisation (torch's
``self.apply(self._init_weights)``, written as ``init_layers`` over the fields that hold
layers, and the ``_init_weights`` method rebuilt with ``eqx.tree_at``) and the methods that
return the optax transform (``configure_optimizers``). equinox.py calls them while it writes
each class; the training code around the model is equinox_training.py's.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import Dedent, code
from torch2jax.targets import layer_table
from torch2jax.targets.equinox_init import _has_nnx


def _stmt(src: str) -> cst.BaseStatement:
    return cst.parse_statement(src if src.endswith("\n") else src + "\n")


INIT_FN = "init_layers"
INIT_SRC = (f"def {INIT_FN}(fn, tree, types, *, key):\n"
            "    \"\"\"torch's Module.apply(fn) for weight initialisation: every layer of the "
            "given types\n    in tree replaced by fn(layer, key=k), each with its own key.\"\"\"\n"
            "    def is_layer(x):\n        return isinstance(x, types)\n"
            "    leaves, treedef = jax.tree.flatten(tree, is_leaf=is_layer)\n"
            "    keys = jax.random.split(key, len(leaves))\n"
            "    return jax.tree.unflatten(treedef, [fn(x, key=k) if is_layer(x) else x\n"
            "                                        for x, k in zip(leaves, keys, strict=True)])\n")
# NNX layer -> (equinox class, {NNX variable: equinox field}): the layers whose rule has an
# equinox table with its weights (a class by rank: the table's class is their base, eqx.nn.Conv)
INIT_LAYERS = {nnx: (spec.cls, spec.weights)
               for nnx, (_, spec) in layer_table.tables("equinox").items() if spec.weights}
# ... and the layers whose equinox form is code (equinox_layers.py's layer_of): ConvTranspose's
# weight (torch's layout turned, equinox_layers.py; a draw of iid values over its shape does
# not depend on it) and the BatchNorm helper written into the file
INIT_LAYERS |= {"nnx.ConvTranspose": ("eqx.nn.ConvTranspose", {"kernel": "weight", "bias": "bias"}),
                "nnx.BatchNorm": ("BatchNorm", {"scale": "weight", "bias": "bias"})}


def init_loop(s: cst.BaseStatement, fields: list[str], methods: dict[str, cst.FunctionDef]
              ) -> cst.BaseStatement | None:
    """``for _, module in nnx.iter_modules(self): self.m(module, key=K)`` (NNX's
    ``self.apply(self.m)``) -> ``self.a, self.b = init_layers(self.m, (self.a, self.b),
    (eqx.nn.Linear, ...), key=K)`` over the fields set before it; None when not that loop or
    when the method has no equinox translation (init_method)."""
    if not (isinstance(s, cst.For) and m.matches(s.iter, m.Call(func=m.Attribute(
            value=m.Name("nnx"), attr=m.Name("iter_modules")), args=[m.Arg(m.Name("self"))]))
            and isinstance(s.target, cst.Tuple) and len(s.body.body) == 1):
        return None
    var = code(s.target.elements[-1].value)
    call = s.body.body[0]
    if not m.matches(call, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(
            value=m.Name("self"))))])):
        return None
    c = call.body[0].value
    name = c.func.attr.value
    pos = [a for a in c.args if a.keyword is None]
    key = [a for a in c.args if a.keyword is not None and a.keyword.value == "key"]
    if len(pos) != 1 or code(pos[0].value) != var or name not in methods or not fields:
        return None
    types = init_types(methods[name])
    if types is None or init_method(methods[name]) is None:
        return None
    lhs = ", ".join(f"self.{f}" for f in fields) + ("," if len(fields) == 1 else "")
    tup = f"({lhs})"
    kw = f", key={code(key[0].value)}" if key else ""
    kinds = f"({types[0]},)" if len(types) == 1 else f"({', '.join(types)})"
    return _stmt(f"{lhs} = {INIT_FN}(self.{name}, {tup}, {kinds}{kw})"
                 ).with_changes(leading_lines=s.leading_lines)


def init_types(fn: cst.FunctionDef) -> list[str] | None:
    """The equinox classes of the layers the function tests with ``isinstance`` (a class or
    a tuple of them); None when one has no equinox weights here."""
    types = []
    for c in findall(fn, m.Call(func=m.Name("isinstance"))):
        if len(c.args) != 2:
            return None
        kinds = c.args[1].value
        for t in ([code(e.value) for e in kinds.elements] if isinstance(kinds, cst.Tuple)
                  else [code(kinds)]):
            if t not in INIT_LAYERS:
                return None
            if INIT_LAYERS[t][0] not in types:
                types.append(INIT_LAYERS[t][0])
    return types or None


def init_function_loops(body: list[cst.BaseStatement], fns: dict[str, cst.FunctionDef]
                        ) -> tuple[list[cst.BaseStatement], list[str]]:
    """NNX's ``model.apply(fn)`` of a function of the file (``init_rngs = nnx.Rngs(k)``, then
    ``for _, module in nnx.iter_modules(model): fn(module, rngs=init_rngs)``) -> ``model =
    init_layers(fn, model, (eqx.nn.Conv, ...), key=k)``, where ``fn`` has an equinox form
    (:func:`init_method`). Returns the statements and the functions so applied, once per
    loop."""
    out: list[cst.BaseStatement] = []
    used: list[str] = []
    rngs = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call(
        func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Rngs")), args=[m.Arg()]))])
    for s in body:
        prev = out[-1] if out and m.matches(out[-1], rngs) else None
        if not (isinstance(s, cst.For) and m.matches(s.iter, m.Call(func=m.Attribute(
                value=m.Name("nnx"), attr=m.Name("iter_modules")), args=[m.Arg(m.Name())]))
                and isinstance(s.target, cst.Tuple) and len(s.body.body) == 1):
            out.append(s)
            continue
        var = code(s.target.elements[-1].value)
        # fn(module, rngs=init_rngs) after init_rngs = nnx.Rngs(k), or fn(module): no draw
        args = [m.Arg(m.Name(var), keyword=None)] + ([m.Arg(m.Name(
            prev.body[0].targets[0].target.value), keyword=m.Name("rngs"))] if prev else [])
        call = m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Name(), args=args))])
        fn = s.body.body[0].body[0].value.func.value if m.matches(s.body.body[0], call) \
            else None
        types = init_types(fns[fn]) if fn in fns else None
        if types is None or init_method(fns[fn], method=False) is None:
            out.append(s)
            continue
        model = s.iter.args[0].value.value
        kinds = f"({types[0]},)" if len(types) == 1 else f"({', '.join(types)})"
        if prev is not None:
            out[-1] = _stmt(f"{model} = {INIT_FN}({fn}, {model}, {kinds}, "
                            f"key={code(prev.body[0].value.args[0].value)})").with_changes(
                                leading_lines=prev.leading_lines)
        else:  # no key to split: every layer of those types mapped through fn
            out.append(_stmt(
                f"{model} = jax.tree.map(lambda m: {fn}(m) if isinstance(m, {kinds}) else m, "
                f"{model}, is_leaf=lambda m: isinstance(m, {kinds}))").with_changes(
                    leading_lines=s.leading_lines))
        used.append(fn)
    return out, used


class _InitBody(cst.CSTTransformer):
    def __init__(self, var: str, fields: dict[str, str]) -> None:
        self.var, self.fields = var, fields
        self.failed: str | None = None

    def leave_Attribute(self, original_node, updated_node):
        # module.kernel.value -> module.weight
        if m.matches(updated_node, m.Attribute(value=m.Attribute(value=m.Name(self.var)),
                                                attr=m.Name("value"))):
            attr = updated_node.value.attr.value
            if attr not in self.fields:
                self.failed = f"{self.var}.{attr}"
                return updated_node
            return cst.parse_expression(f"{self.var}.{self.fields[attr]}")
        if m.matches(updated_node, m.Attribute(value=m.Name("nnx"))):
            full = code(updated_node)
            if full in INIT_LAYERS:
                return cst.parse_expression(INIT_LAYERS[full][0])
        return updated_node

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node, m.Call(func=m.Attribute(value=m.Name("rngs")))):
            return cst.Name("key")
        # the initializers NNX's kernels (*k, in, out) take with their default axes: an
        # equinox weight keeps torch's layout (out, in, *k)
        axes = {"jax.nn.initializers.variance_scaling": ", in_axis=1, out_axis=0",
                "jax.nn.initializers.orthogonal": ", column_axis=0"}.get(code(updated_node.func))
        if axes is not None and not any(a.keyword for a in updated_node.args):
            return cst.parse_expression(code(updated_node)[:-1] + axes + ")")
        return updated_node


def _draws(node: cst.CSTNode) -> int:
    """The most ``rngs.`` draws one pass through ``node`` makes (if/elif branches: the
    largest)."""
    if isinstance(node, cst.If):
        return max(_draws(node.body), _draws(node.orelse) if node.orelse else 0)
    if isinstance(node, cst.Else):
        return _draws(node.body)
    if isinstance(node, cst.IndentedBlock):
        return sum(_draws(s) for s in node.body)
    return len(findall(node, m.Call(func=m.Attribute(value=m.Name("rngs")))))


def init_method(fn: cst.FunctionDef, method: bool = True) -> cst.FunctionDef | None:
    """NNX's ``_init_weights(self, module, *, rngs)`` (``module.kernel.value = ...`` under
    ``isinstance(module, nnx.Linear)``) -> ``_init_weights(self, module, *, key)`` returning
    the module with ``eqx.tree_at``; ``method=False``: a function of the file,
    ``weights_init(m, *, rngs)``. None when anything does not fit: shapes read by index
    (NNX's kernel layout is not equinox's), several draws, other NNX code."""
    params = fn.params.params
    if len(params) != (2 if method else 1) or isinstance(fn.params.star_arg, cst.Param) \
            or fn.params.star_kwarg is not None:
        return None
    var = params[-1].name.value
    # (x.kernel.value.shape[i])
    if _draws(fn.body) > 1 or findall(fn.body, m.Subscript(value=m.Attribute(
            value=m.Attribute(attr=m.Name("value")), attr=m.Name("shape")))):
        return None
    fields = {k: v for _, fs in INIT_LAYERS.values() for k, v in fs.items()}

    class Assigns(cst.CSTTransformer):
        def __init__(self) -> None:
            self.failed = False

        def leave_SimpleStatementLine(self, original_node, updated_node):
            small = updated_node.body[0]
            if isinstance(small, cst.Assign) and m.matches(small.targets[0].target, m.Attribute(
                    value=m.Attribute(value=m.Name(var)), attr=m.Name("value"))):
                attr = small.targets[0].target.value.attr.value
                if attr not in fields:
                    self.failed = True
                    return updated_node
                tr = _InitBody(var, fields)
                value = small.value.visit(tr)
                if tr.failed:
                    self.failed = True
                return _stmt(f"{var} = eqx.tree_at(lambda m: m.{fields[attr]}, {var}, "
                             f"{code(value)})").with_changes(
                                 leading_lines=updated_node.leading_lines)
            return updated_node

    a = Assigns()
    body = fn.body.visit(a)
    tr = _InitBody(var, fields)
    body = body.visit(tr)
    if a.failed or tr.failed or _has_nnx(body):
        return None
    body = body.with_changes(body=[*body.body, _stmt(f"return {var}")])
    kw = [p.with_changes(name=cst.Name("key"), annotation=None)
          if p.name.value == "rngs" else p for p in fn.params.kwonly_params]
    return fn.with_changes(body=body, params=fn.params.with_changes(kwonly_params=kw))


def optimizer_method(fn: cst.FunctionDef) -> cst.FunctionDef | None:
    """A model method that returns ``nnx.Optimizer(self, tx, wrt=nnx.Param)`` (torch's
    ``configure_optimizers``) -> the method returning ``tx``; None when not that form."""

    class Ret(cst.CSTTransformer):
        def __init__(self) -> None:
            self.n = 0

        def leave_Return(self, original_node, updated_node):
            v = updated_node.value
            if m.matches(v, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                    attr=m.Name("Optimizer")))):
                kw = {a.keyword.value: code(a.value) for a in v.args if a.keyword}
                pos = [a for a in v.args if a.keyword is None]
                if kw.get("wrt", "nnx.Param") == "nnx.Param" and len(pos) == 2 and \
                        code(pos[0].value) == "self":
                    self.n += 1
                    return updated_node.with_changes(value=pos[1].value.visit(Dedent()))
            return updated_node

    r = Ret()
    new = fn.visit(r)
    if not r.n or _has_nnx(new):
        return None
    return new
