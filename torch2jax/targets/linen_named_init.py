"""An init loop over a module's parameter names, rendered for ``--target linen``.

nanoGPT's constructor draws its residual projections again after ``self.apply(...)``::

    for pn, p in self.named_parameters():
        if pn.endswith('c_proj.weight'):
            torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

A linen module has no parameters in ``setup()``: a layer takes its initializer when it is
built. So every torch layer stored under an attribute that ends the suffix's module name
(``self.c_proj = nn.Linear(...)``, in the class or in a class it builds) gets the
initializer (``kernel_init=nn.initializers.normal(stddev=0.02 / math.sqrt(2 *
self.config.n_layer))``), over the one the init function gave it, as torch draws it last.
The expression may read the constructor's arguments that reach that class under the same
name (``config``, passed on as ``Block(config)``); anything else keeps the loop, marked.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.common import Untranslatable

_LOOP = m.For(target=m.Tuple([m.Element(m.Name()), m.Element(m.Name())]), iter=m.Call(
    func=m.Attribute(value=m.Name("self"), attr=m.Name("named_parameters")), args=[]))


def _init(cls: cst.ClassDef) -> cst.FunctionDef | None:
    return next((f for f in cls.body.body if isinstance(f, cst.FunctionDef)
                 and f.name.value == "__init__"), None)


def _params(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in fn.params.params][1:]


def name_loops(cls: cst.ClassDef) -> list[cst.For]:
    """The ``for pn, p in self.named_parameters():`` loops of the constructor's body."""
    init = _init(cls)
    return [st for st in init.body.body if m.matches(st, _LOOP)] if init is not None else []


def loop_inits(loop: cst.For, cls: cst.ClassDef, classes: dict[str, cst.ClassDef],
               qualify, init_args: dict, initializer
               ) -> dict[str, dict[str, dict[str, cst.BaseExpression]]]:
    """class -> attribute -> {linen initializer argument: initializer} for the layers the
    loop draws again; Untranslatable where it cannot be told."""
    pn, p = (e.value.value for e in loop.target.elements)
    body = loop.body.body
    if len(body) != 1 or not m.matches(body[0], m.If(test=m.Call(func=m.Attribute(
            value=m.Name(pn), attr=m.Name("endswith")), args=[m.Arg(m.SimpleString())]),
            orelse=None)) or len(body[0].body.body) != 1 or not m.matches(
            body[0].body.body[0], m.SimpleStatementLine([m.Expr(m.Call(args=[
                m.Arg(m.Name(p), keyword=None), m.ZeroOrMore()]))])):
        raise Untranslatable("a loop over named_parameters() other than one test of the "
                             "name's suffix around one torch.nn.init call")
    call = body[0].body.body[0].body[0].value
    q = qualify(call.func) or ""
    if not q.startswith("torch.nn.init."):
        raise Untranslatable("a loop over named_parameters() that does not initialise")
    parts = body[0].test.args[0].value.evaluated_value.split(".")
    if len(parts) != 2 or parts[1] not in ("weight", "bias") or not parts[0]:
        raise Untranslatable("a parameter suffix other than '<module>.weight' / '.bias'")
    value = initializer(q.rsplit(".", 1)[-1], call)
    root_init = _init(cls)
    args = set(_params(root_init))
    free = {n.value for a in call.args[1:] for n in findall(a.value, m.Name())}
    local = {n for st in root_init.body.body for n in tr.names_of(st).assigned}
    if free & local - args:
        raise Untranslatable("an initializer computed from the constructor's locals")
    reads = free & args

    out: dict[str, dict[str, dict[str, cst.BaseExpression]]] = {}
    seen: set[str] = set()

    def visit(name: str) -> bool:
        """Whether ``name`` (or a class it builds) holds a layer the suffix names."""
        if name in seen:
            return name in out
        seen.add(name)
        init = _init(classes[name])
        if init is None:
            return False
        found = False
        for a in findall(init, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self")))])):
            attr = a.targets[0].target.attr.value
            if not attr.endswith(parts[0]):
                continue
            lq = qualify(a.value.func) if isinstance(a.value, cst.Call) else None
            if lq not in init_args or parts[1] not in init_args[lq]:
                raise Untranslatable(f"self.{attr} is not a layer whose {parts[1]} a linen "
                                     "initializer argument sets")
            if not reads <= set(_params(init)):
                raise Untranslatable(f"the initializer reads {', '.join(sorted(reads))}, "
                                     f"which {name} does not receive")
            out.setdefault(name, {})[attr] = {init_args[lq][parts[1]]: _fields(value, reads)}
            found = True
        for k in findall(init, m.Arg(keyword=m.Name()) | m.DictElement(m.SimpleString())):
            key = k.keyword.value if isinstance(k, cst.Arg) else k.key.evaluated_value
            if key.endswith(parts[0]) and not m.matches(k.value, m.Name()):
                raise Untranslatable(f"a module stored under the key {key} (a container's)")
        for c in findall(init, m.Call(func=m.Name())):
            callee = c.func.value
            if callee not in classes or not visit(callee):
                continue
            found = True
            cparams = _params(_init(classes[callee]))
            bound = {cparams[i]: a.value for i, a in enumerate(c.args) if a.keyword is None
                     and i < len(cparams)}
            bound.update({a.keyword.value: a.value for a in c.args if a.keyword is not None})
            if any(not m.matches(bound.get(r), m.Name(r)) for r in reads):
                raise Untranslatable(f"{callee} is built with other values of "
                                     f"{', '.join(sorted(reads))} than {name}'s")
        return found

    visit(cls.name.value)
    if not out:
        raise Untranslatable(f"no layer of {cls.name.value} is stored under a name ending "
                             f"{parts[0]}")
    return out


def _fields(value: cst.BaseExpression, names: set[str]) -> cst.BaseExpression:
    """The constructor's arguments read as the linen module's fields (``self.config``)."""
    class Fields(cst.CSTTransformer):
        def leave_Attribute(self, original_node, updated_node):
            return updated_node.with_changes(attr=original_node.attr)

        def leave_Arg(self, original_node, updated_node):
            return updated_node.with_changes(keyword=original_node.keyword)

        def leave_Name(self, original_node, updated_node):
            return cst.Attribute(value=cst.Name("self"), attr=updated_node) if (
                updated_node.value in names) else updated_node
    return value.visit(Fields())
