"""The equinox target's class shell: ``__init__`` and the fields and keys of a module class.

:class:`_InitRewriter` rewrites the layer constructors of ``__init__`` (or of a builder
function) into equinox; the helpers below annotate the fields, split ``key`` for the layers and
submodules built (:func:`_split_keys`), and check that nothing NNX is left. :class:`ClassInfo`
is what the pass knows of one module class (targets/equinox.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import Dedent, code, expr, is_identity_lambda, try_literal
from torch2jax.targets import layer_table
from torch2jax.targets.equinox_layers import (
    ELEMENTWISE_PREFIXES,
    KEY,
    EquinoxError,
    Info,
    Layer,
    _kw,
    _pos,
    _todo,
    batched_form,
    is_function_layer,
    layer_of,
)


# ---------------------------------------------------------------------------- __init__
class _InitRewriter(cst.CSTTransformer):
    """Rewrites layer constructors in ``__init__`` (or a builder function) and records the
    layers stored on ``self``; ``key=`` sites are numbered, the splits placed afterwards."""

    def __init__(self, classes: set[str], keyed_classes: set[str],
                 builders: dict[str, Layer] | None = None, methods: dict[str, Layer] | None
                 = None, passed: dict[str, tuple[str, ...] | str] | None = None,
                 per_example: Collection[str] = ()) -> None:
        super().__init__()
        self.classes = classes
        # code (whitespace dropped) of the NNX pass's layers written for one example
        self.per_example = per_example
        self.builders = builders or {}
        self.methods = methods or {}  # builder methods, called as self.name(...)
        # parameters bound to classes of the file (see _passed_classes), or why not known
        self.passed = passed or {}
        self.loop = 0
        self.returned: Layer | None = None
        self.keyed_classes = keyed_classes
        self.attrs: dict[str, Layer] = {}
        self.values: dict[int, Layer] = {}  # id of new node -> layer
        # every node this pass returns stays alive until it ends: `values` is keyed by id, and
        # a freed node's id could be given to a later node
        self._kept: list[cst.CSTNode] = []
        self.local: dict[str, Layer] = {}  # local names bound to layers (lists of layers)
        self.errors: list[str] = []
        self.sites = 0
        self.identities: set[str] = set()  # attributes that are an identity in some branch
        self.unknown_lists: set[str] = set()  # list attributes appended layers of two kinds

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        self._kept.append(result)
        return result

    def visit_For(self, node: cst.For) -> None:
        self.loop += 1

    def leave_For(self, original_node, updated_node):
        self.loop -= 1
        return updated_node

    def visit_While(self, node: cst.While) -> None:
        self.loop += 1

    def leave_While(self, original_node, updated_node):
        self.loop -= 1
        return updated_node

    def visit_Call(self, node: cst.Call) -> bool:
        # nnx.RNN(cell): the whole is one equinox layer (or, refused, stays as NNX wrote it)
        return not m.matches(node.func, m.Attribute(value=m.Name("nnx"), attr=m.Name("RNN")))

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node, _RNGS_DRAW):
            # a parameter drawn at build (nn.Parameter(torch.randn(...)): NNX's
            # jax.random.normal(rngs.params(), shape)): one of the constructor's keys
            self.sites += 1
            return cst.Name("__needs_key__")
        try:
            new, lay = layer_of(updated_node, self.classes)
        except EquinoxError as exc:
            self.errors.append(exc.message)
            return updated_node
        if lay.kind == "module" and not lay.bare:
            new = new.with_changes(args=[*new.args[:-1], new.args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))] if new.args
                else [], )
            new = new.with_changes(args=[*new.args, cst.Arg(cst.Name("__needs_key__"),
                                         keyword=cst.Name("key"), equal=cst.AssignEqual(
                                             cst.SimpleWhitespace(""),
                                             cst.SimpleWhitespace("")))])
        if lay.kind == "seq":
            try:
                new = self._sequential(updated_node)
            except EquinoxError as exc:
                self.errors.append(exc.message)
                return updated_node
        if lay.kind in ("list", "dict"):
            pos = _pos(updated_node)
            orig = pos[0] if pos else None
            inner = self.values.get(id(orig)) if orig is not None else None
            if (inner is None or inner.kind == "value") and isinstance(orig, cst.Call) and \
                    code(orig.func) == "dict":
                inner = self._dict_layer(orig)
            new = orig.visit(Dedent()) if orig is not None else (
                cst.List([]) if lay.kind == "list" else cst.Dict([]))
            lay = inner or lay
        if lay.kind == "value" and isinstance(updated_node.func, cst.Name) and \
                updated_node.func.value in self.builders:
            lay = self.builders[updated_node.func.value]
        if lay.kind == "value" and isinstance(updated_node.func, cst.Name) and \
                self.local.get(updated_node.func.value, Layer("value")).kind == "factory":
            # block_klass(...) with block_klass = partial(ResnetBlock, groups=4): the class
            lay = Layer("module", cls=self.local[updated_node.func.value].cls)
        func = updated_node.func
        if lay.kind == "value" and m.matches(func, m.Attribute(value=m.Name("self"))) and \
                func.attr.value in self.methods:
            lay = self.methods[func.attr.value]
        if lay.kind == "value" and isinstance(func, cst.Name) and func.value in self.passed:
            # a class handed in as an argument (`block(in_planes, planes, rngs=rngs)`)
            got = self.passed[func.value]
            if isinstance(got, str):
                self.errors.append(got)
            else:
                lay = Layer("module", cls=got[0], alts=got[1:])
        if isinstance(new, cst.Call) and any(
                a.keyword is not None and a.keyword.value == "rngs" for a in new.args):
            # a layer-building helper, a class passed as an argument, super().__init__:
            # they take the key that converted constructors take
            new = new.with_changes(args=[
                a.with_changes(keyword=cst.Name("key"), value=cst.Name("__needs_key__"))
                if a.keyword is not None and a.keyword.value == "rngs" else a
                for a in new.args])
        if (lay.kind == "module" and not lay.bare) or "__needs_key__" in code(new):
            self.sites += 1
        self.values[id(new)] = lay
        return new

    def _sequential(self, node: cst.Call) -> cst.Call:
        if any(a.star for a in node.args):
            if len(node.args) > 1:
                # nn.Sequential(stem, *[block for _ in range(depth)], head) (mlp-mixer,
                # ConvMixer): only the starred list was kept, the other layers dropped
                raise EquinoxError("a Sequential of layers and a starred list of layers "
                                   "together: not translated yet")
            (star,) = [a for a in node.args if a.star]
            return cst.Call(cst.parse_expression("eqx.nn.Sequential"), [cst.Arg(star.value)])
        # the NNX pass's moves to channels-last and back around its channels-last layers:
        # equinox's layers are channel-first (and the layers keep torch's indices)
        args = [a for a in node.args if not _is_layout_move(a.value)]
        for a in args:
            if self._is_per_example(a.value):
                self.values[id(a.value)] = Layer("resize", node=a.value)
        elements = [cst.Element(self._wrap_fn(a.value)) for a in args]
        inner = cst.List(elements)
        self.values[id(inner)] = Layer("list", items={
            str(i): self.values.get(id(a.value)) or (
                Layer("fn") if is_function_layer(code(a.value)) else Layer("value"))
            for i, a in enumerate(args)})
        return cst.Call(cst.parse_expression("eqx.nn.Sequential"), [cst.Arg(inner)])

    def _is_per_example(self, value: cst.BaseExpression) -> bool:
        """nn.Upsample's lambda, which the NNX pass wrote for one example (C, *spatial)."""
        return isinstance(value, cst.Lambda) and _squeeze(code(value)) in self.per_example

    def _wrap_fn(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if self.values.get(id(value), Layer("value")).kind in ("fn", "resize") or (
                is_function_layer(code(value))):
            return expr("eqx.nn.Lambda({f})", f=value)
        return value

    def leave_List(self, original_node, updated_node):
        lays = [self.values.get(id(e.value)) for e in updated_node.elements]
        new = updated_node
        kinds = [lay for lay in lays if lay is not None]
        if kinds:
            # (a function among layers, nn.ReLU's, is a layer too; any other element an
            # unknown value: a loop over the list calls each as it is, equinox_unroll.py)
            self.values[id(new)] = Layer("list", cls=kinds[0].cls if kinds[0].kind == "module"
                                         else "", items={str(i): k or (
                                             Layer("fn") if is_function_layer(code(e.value))
                                             else Layer("value"))
                                             for i, (k, e) in enumerate(zip(
                                                 lays, updated_node.elements, strict=True))})
        return new

    def leave_Dict(self, original_node, updated_node):
        # {"a": layer, ...}, the mapping a ModuleDict is built from: its layers by key
        items = {}
        for e in updated_node.elements:
            key = try_literal(e.key, None) if isinstance(e, cst.DictElement) else None
            lay = self.values.get(id(e.value)) if isinstance(key, str) else None
            if lay is None and isinstance(key, str) and code(e.value).startswith(
                    ELEMENTWISE_PREFIXES):
                lay = Layer("fn")
            if lay is not None:
                items[key] = lay
        if items:
            self.values[id(updated_node)] = Layer("dict", items=items)
        return updated_node

    def leave_ListComp(self, original_node, updated_node):
        lay = self.values.get(id(updated_node.elt))
        if lay is not None:
            self.values[id(updated_node)] = Layer("list", cls=lay.cls, items={"*": lay})
        return updated_node

    def leave_IfExp(self, original_node, updated_node):
        # `conv if c else (lambda x: x)`, `nn.Sequential(...) if c else None`: the layer;
        # `Downsample(...) if c else conv`, two layers called alike (batched_form)
        lays = [self._seq_layer(b) or self.values.get(id(b)) for b in (updated_node.body,
                                                                       updated_node.orelse)]
        if any(lay is not None and lay.kind not in ("value", "lambda") for lay in lays):
            lay = if_layer(lays, [updated_node.body, updated_node.orelse])
            if lay is None:
                lay, updated_node = _identity_for_keyed(lays, updated_node)
            if lay is not None:
                self.values[id(updated_node)] = lay
        return updated_node

    def leave_Expr(self, original_node, updated_node):
        # layers.append(fn): a function in a list of layers is wrapped in eqx.nn.Lambda
        v = updated_node.value
        if m.matches(v, m.Call(func=m.Attribute(attr=m.Name("append")), args=[m.Arg()])):
            a = v.args[0].value
            lay = self.values.get(id(a))
            if lay is None and is_function_layer(code(a)):
                lay = Layer("fn")
            held = v.func.value  # self.downs.append(...): a list attribute, as a local's
            if lay is not None and m.matches(held, m.Attribute(value=m.Name("self"))) and \
                    self.attrs.get(held.attr.value, Layer("value")).kind == "list" and \
                    held.attr.value not in self.unknown_lists:
                lst = self.attrs[held.attr.value]
                if any((p.kind, p.cls, p.alts) != (lay.kind, lay.cls, lay.alts)
                       for p in lst.items.values()):
                    # layers of several kinds appended: which is where is not known here
                    self.unknown_lists.add(held.attr.value)
                    lst.items.clear()
                else:
                    lst.items[str(len(lst.items))] = lay
                    lst.loop = lst.loop or self.loop > 0
            if lay is not None and isinstance(v.func.value, cst.Name):
                lst = self.local.setdefault(v.func.value.value, Layer("list"))
                lst.items[str(len(lst.items))] = lay
                lst.loop = lst.loop or self.loop > 0
            if lay is not None and lay.kind == "fn":
                v = v.with_changes(args=[v.args[0].with_changes(value=self._wrap_fn(a))])
                return updated_node.with_changes(value=v)
        return updated_node

    def _dict_layer(self, value: cst.Call) -> Layer:
        return Layer("dict", items={a.keyword.value: self.values[id(a.value)] for a in value.args
                                    if a.keyword is not None and id(a.value) in self.values})

    def leave_Return(self, original_node, updated_node):
        if updated_node.value is not None:
            self.returned = self._seq_layer(updated_node.value) or self.values.get(
                id(updated_node.value))
        return updated_node

    def _seq_layer(self, value: cst.BaseExpression) -> Layer | None:
        # a call, not an expression that starts with one (`eqx.nn.Sequential(...) if c else x`)
        if not (isinstance(value, cst.Call) and code(value).startswith("eqx.nn.Sequential(")):
            return None
        inner = value.args[0].value if value.args else None
        src = self.local.get(inner.value) if isinstance(inner, cst.Name) else \
            self.values.get(id(inner))
        parts = list(src.items.values()) if src else []
        return Layer("seq", items={str(i): p for i, p in enumerate(parts)},
                     stateful=any(p.stateful for p in parts), keyed=any(p.keyed for p in parts),
                     loop=bool(src) and (src.loop or "*" in src.items))

    def leave_Assign(self, original_node, updated_node):
        target = updated_node.targets[0].target
        value = updated_node.value
        lay = self.values.get(id(value))
        if isinstance(value, cst.Call) and code(value.func) == "dict" and not (
                lay is not None and lay.kind == "dict"):
            lay = self._dict_layer(value)
            self.values[id(value)] = lay
        if code(value).startswith("eqx.nn.Sequential("):
            lay = self._seq_layer(value) or lay
        if isinstance(value, cst.Lambda):
            lay = Layer("resize" if self._is_per_example(value) else "lambda", node=value)
        if lay is None and isinstance(value, cst.Attribute) and code(value).startswith(
                ELEMENTWISE_PREFIXES):
            lay = Layer("fn")  # a function stored as an attribute: `self.act = jax.nn.relu`
        if isinstance(target, cst.Name) and m.matches(value, m.Call(
                func=m.Name("partial"), args=[m.Arg(m.Name(), keyword=None), m.ZeroOrMore(
                    m.Arg(keyword=m.Name()))])) and value.args[0].value.value in self.classes:
            lay = Layer("factory", cls=value.args[0].value.value)  # partial(Block, groups=4)
        if isinstance(target, cst.Attribute) and m.matches(target.value, m.Name("self")):
            name, lay = target.attr.value, lay or Layer("value")
            before = self.attrs.setdefault(name, lay)
            # assigned in several branches (`self.downsample = nn.Sequential(...)` or
            # `nn.Identity()` / None): the layer is what the forward pass calls
            if _placeholder(before) and not _placeholder(lay):
                self.attrs[name] = lay
            if _is_identity(value) or before.kind in ("lambda", "seq") and _placeholder(before):
                self.identities.add(name)
        elif isinstance(target, cst.Name) and lay is not None:
            self.local[target.value] = lay
        return updated_node


def if_layer(lays: list[Layer | None], nodes: list[cst.BaseExpression]) -> Layer | None:
    """The layer of ``a if c else b`` (equinox_init._InitRewriter.leave_IfExp): a layer and
    ``None`` (never called) or an identity that a plain layer's call fits (not a module,
    whose state and key are not known yet); two layers of one batched form mapped over the
    batch alike and called alike on one example (channel-first: a convolution, a Sequential
    of such layers), the one that is not a Sequential. None otherwise."""
    known = [(lay, n) for lay, n in zip(lays, nodes, strict=True)
             if lay is not None and lay.kind not in ("value", "lambda")]
    others = [n for lay, n in zip(lays, nodes, strict=True)
              if lay is None or lay.kind in ("value", "lambda")]
    if len(known) == 1:
        (lay, _), (other,) = known[0], others
        plain = lay.kind not in ("module", "list", "dict") and not (lay.keyed or lay.stateful)
        if m.matches(other, m.Name("None")) or (_is_identity(other) and plain):
            return lay
        return None
    (a, _), (b, _) = known
    if a.rank is not None and b.rank is not None and a.rank != b.rank:
        return None
    if batched_form(a) == batched_form(b) == ("vmap",):
        return b if a.kind == "seq" else a
    return None


def _identity_for_keyed(lays: list[Layer | None], node: cst.IfExp
                        ) -> tuple[Layer | None, cst.IfExp]:
    """``nn.Sequential(nn.Linear(...), nn.Dropout(p)) if c else nn.Identity()``: a layer that
    takes a key and an identity; the identity is ``eqx.nn.Identity()``, which takes (and
    ignores) the key, so the two are called alike; for a Sequential, a Sequential of as many
    identities (a module kept batched calls its layers one by one, by index)."""
    branches = (node.body, node.orelse)
    for i, lay in enumerate(lays):
        if lay is not None and lay.kind not in ("value", "lambda", "module", "list", "dict") \
                and lay.keyed and not lay.stateful and _is_identity(branches[1 - i]) and (
                    lay.kind != "seq" or (lay.items and not lay.loop)):
            identity = cst.parse_expression("eqx.nn.Identity()" if lay.kind != "seq" else (
                "eqx.nn.Sequential([" + ", ".join(["eqx.nn.Identity()"] * len(lay.items))
                + "])"))
            return lay, node.with_changes(**{("orelse", "body")[i]: identity})
    return None, node


def _squeeze(text: str) -> str:
    """The code with its layout dropped: whitespace, and a trailing comma before a closing
    bracket (a formatter's, when a call is split over lines)."""
    return re.sub(r",([)\]}])", r"\1", re.sub(r"\s+", "", text))


def _is_layout_move(node: cst.BaseExpression) -> bool:
    """``lambda x: jnp.moveaxis(x, 1, -1)`` or ``lambda x: jnp.moveaxis(x, -1, 1)``: the NNX
    pass's layout moves between its channels-last layers and torch-layout ones."""
    if not (isinstance(node, cst.Lambda) and len(node.params.params) == 1):
        return False
    x = node.params.params[0].name.value
    return _squeeze(code(node.body)) in (f"jnp.moveaxis({x},1,-1)", f"jnp.moveaxis({x},-1,1)")


def _is_identity(node: cst.CSTNode | None) -> bool:
    """``lambda x: x`` or an empty Sequential: NNX's translations of ``nn.Identity()``."""
    if isinstance(node, cst.Call):
        return m.matches(node, m.Call(func=m.Attribute(value=m.Attribute(
            value=m.Name("eqx"), attr=m.Name("nn")), attr=m.Name("Sequential")), args=[
                m.Arg(m.List(elements=[]))]))
    return is_identity_lambda(node)


def _placeholder(lay: Layer) -> bool:
    """A value (``None``) or an identity: another branch's layer decides the calls."""
    return lay.kind == "value" or lay.kind == "lambda" and _is_identity(lay.node) or \
        lay.kind == "seq" and not lay.items


class _Identity(cst.CSTTransformer):
    """``self.downsample = lambda x: x`` in the branch where another sets a layer that takes
    ``state`` or ``key``: an identity called the same way (``eqx.nn.Sequential([])`` passes
    the state through, ``eqx.nn.Identity()`` takes ``key``)."""

    def __init__(self, names: set[str], replacement: str) -> None:
        self.names = names
        self.replacement = replacement

    def leave_Assign(self, original_node, updated_node):
        t = updated_node.targets[0].target
        if m.matches(t, m.Attribute(value=m.Name("self"))) and t.attr.value in self.names \
                and _is_identity(updated_node.value):
            return updated_node.with_changes(value=expr(self.replacement))
        return updated_node


def _dataclass_fields(module: cst.Module) -> dict[str, str]:
    """``name -> annotation`` of the fields of the file's dataclasses, where unambiguous."""
    seen: dict[str, set[str]] = {}
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef):
            continue
        for s in cls.body.body:
            if m.matches(s, m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name())])):
                a = s.body[0]
                seen.setdefault(a.target.value, set()).add(code(a.annotation.annotation))
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


STATIC_TYPES = {"int", "float", "bool", "str", "tuple"}


def _annotation(value: cst.BaseExpression, lay: Layer, params: dict[str, cst.Param],
                dataclass_fields: dict[str, str]) -> tuple[str, bool]:
    """The field annotation for ``self.x = value`` and whether the field is static."""
    text = code(value)
    if isinstance(value, cst.IfExp) and lay.kind != "value":
        return "Any", False  # (a layer or None, an identity, another layer)
    if lay.kind == "value" and isinstance(value, cst.Name) and value.value in ("True", "False"):
        return "bool", False  # `inference`: eqx.nn.inference_mode replaces it (not static)
    if lay.kind == "value" and isinstance(value, cst.Call) and text.startswith("eqx.nn."):
        return text.split("(")[0], False
    if lay.kind == "value" and isinstance(value, cst.Lambda):
        return "Callable", True
    if lay.kind in ("linear", "conv", "bn", "layernorm", "embedding", "dropout", "pool",
                    "groupnorm", "mha", "lstm", "lstmcell", "gru", "grucell"):
        if not text.startswith("eqx.nn."):  # built by a helper function
            return lay.cls or "eqx.Module", False
        return text.split("(")[0], False
    if lay.kind == "seq":
        return "eqx.nn.Sequential", False
    if lay.kind == "module":
        return "eqx.Module" if lay.alts else lay.cls, False
    if lay.kind == "list":
        return "list", False
    if lay.kind == "dict":
        return "dict", False
    if lay.kind in ("buffer", "param"):
        return "jax.Array", False
    if lay.kind in ("fn", "lambda", "resize"):
        return "Callable", True
    if isinstance(value, cst.Name) and value.value in params:
        p = params[value.value]
        if p.annotation is not None:
            ann = code(p.annotation.annotation)
            return ann, ann in STATIC_TYPES
        lit = try_literal(p.default, ...) if p.default is not None else ...
        t = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple"}.get(
            type(lit))
        if t:
            return t, True
        return "Any", False
    if isinstance(value, cst.Attribute) and value.attr.value in dataclass_fields:
        ann = dataclass_fields[value.attr.value]
        return ann, ann in STATIC_TYPES
    lit = try_literal(value, ...)
    t = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple"}.get(type(lit))
    if t:
        return t, True
    return "Any", False


def _split_keys(body: list[cst.BaseStatement], sites: int) -> list[cst.BaseStatement]:
    """Name the ``__needs_key__`` sites: one site takes ``key``; sites in straight-line code
    take ``key1, key2, ... = jax.random.split(key, n)``; sites in a loop or a comprehension
    split the key they are given (``key, subkey = jax.random.split(key)``)."""
    counter = [0]
    loop_sites = [0]

    class Count(cst.CSTVisitor):
        def __init__(self) -> None:
            self.loop = 0

        def visit_For(self, node):
            self.loop += 1

        def leave_For(self, node):
            self.loop -= 1

        def visit_While(self, node):
            self.loop += 1

        def leave_While(self, node):
            self.loop -= 1

        def visit_Name(self, node):
            if node.value == "__needs_key__" and self.loop:
                loop_sites[0] += 1

    mod = cst.Module(body=body)
    mod.visit(Count())
    sequential = loop_sites[0] > 0

    class Name(cst.CSTTransformer):
        def __init__(self) -> None:
            self.loop = 0

        def leave_Name(self, original_node, updated_node):
            if updated_node.value != "__needs_key__":
                return updated_node
            counter[0] += 1
            return cst.Name(KEY.format(counter[0]))

    mod = mod.visit(Name())
    n = counter[0]
    text_names = [KEY.format(i + 1) for i in range(n)]
    # comprehensions: [X(key=K) for _ in range(n)]
    mod = mod.visit(_CompKeys(set(text_names)))
    if n == 0:
        return list(mod.body)
    if not sequential:
        names = ["key"] if n == 1 else [f"key{i + 1}" for i in range(n)]
        renamed = mod.visit(_Rename(dict(zip(text_names, names, strict=True))))
        out = list(renamed.body)
        if n > 1:
            out.insert(_after_docstring(out), cst.parse_statement(
                f"{', '.join(names)} = jax.random.split(key, {n})\n"))
        return out
    # sequential: before each statement that uses a key, split off a subkey; the last use
    # outside any loop takes the key itself
    return _sequential_keys(list(mod.body), set(text_names))


_RNGS_DRAW = m.Call(func=m.Attribute(value=m.Name("rngs"), attr=m.Name("params")) | m.Name(
    "rngs"), args=[])


def _uses_nnx(node: cst.CSTNode) -> bool:
    """Whether ``node`` reads an attribute of the ``nnx`` module (``nnx.Param``)."""
    return any(m.matches(a.value, m.Name("nnx")) for a in findall(node, m.Attribute()))


def _has_nnx(node: cst.CSTNode) -> bool:
    """Whether anything of NNX is left in ``node``: the ``nnx`` module, an ``rngs`` name, or a
    TODO of the NNX pass that names an NNX construct (a loop it could not translate, whose
    advice is NNX's: the statement, or the class holding it, goes back to torch's)."""
    return _uses_nnx(node) or bool(findall(node, m.Name("rngs"))) or any(
        c.value.startswith("# TODO(torch2jax)") and "nnx." in c.value
        and not c.value.endswith("[equinox]")  # (this pass's own marks)
        for c in findall(node, m.Comment()))


class _NoNnx(cst.CSTTransformer):
    MESSAGE = "no equinox translation yet (shown as its NNX translation)"

    def __init__(self) -> None:
        super().__init__()
        self.any = False

    def leave_Annotation(self, original_node, updated_node):
        if _has_nnx(updated_node):
            self.any = True
            return updated_node.with_changes(annotation=cst.Name("Any"))
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if _has_nnx(updated_node):
            return _todo(_comment_out(updated_node), self.MESSAGE)
        return updated_node

    def on_leave(self, original_node, updated_node):
        updated = super().on_leave(original_node, updated_node)
        if isinstance(updated, cst.BaseCompoundStatement) and _has_nnx(updated):
            return _todo(_comment_out(updated), self.MESSAGE)
        return updated


class _Lambdas(cst.CSTTransformer):
    def __init__(self, lambdas: dict[str, cst.Lambda]) -> None:
        super().__init__()
        self.lambdas = lambdas

    def leave_Assign(self, original_node, updated_node):
        t = updated_node.targets[0].target
        if m.matches(t, m.Attribute(value=m.Name("self"))) and t.attr.value in self.lambdas \
                and isinstance(updated_node.value, cst.Lambda):
            return updated_node.with_changes(value=self.lambdas[t.attr.value])
        return updated_node


class _Inference(cst.CSTTransformer):
    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node, m.Attribute(value=m.Name("self"), attr=m.Name(
                "deterministic"))):
            return updated_node.with_changes(attr=cst.Name("inference"))
        return updated_node

    def leave_Comment(self, original_node, updated_node):
        if updated_node.value == "# flipped by .train()/.eval()":
            return updated_node.with_changes(value="# set by eqx.nn.inference_mode")
        return updated_node


class _Rename(cst.CSTTransformer):
    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Name(self, original_node, updated_node):
        return updated_node.with_changes(value=self.names.get(updated_node.value,
                                                              updated_node.value))


class _CompKeys(cst.CSTTransformer):
    """``[Block(c, key=K) for _ in range(n)]`` -> ``[Block(c, key=k) for k in
    jax.random.split(K, n)]``."""

    def __init__(self, placeholders: set[str]) -> None:
        super().__init__()
        self.placeholders = placeholders

    def leave_ListComp(self, original_node, updated_node):
        used = [p for p in self.placeholders if p in code(updated_node.elt)]
        f = updated_node.for_in
        if len(used) != 1 or f.inner_for_in is not None or f.ifs:
            return updated_node
        if not (m.matches(f.target, m.Name("_")) and m.matches(
                f.iter, m.Call(func=m.Name("range"), args=[m.Arg()]))):
            return updated_node
        n = f.iter.args[0].value
        elt = updated_node.elt.visit(_Rename({used[0]: "k"}))
        return updated_node.with_changes(elt=elt, for_in=f.with_changes(
            target=cst.Name("k"), iter=expr("jax.random.split({k}, {n})", k=used[0], n=n)))


def _after_docstring(body: list) -> int:
    if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        return 1
    return 0


def _sequential_keys(body: list[cst.BaseStatement], placeholders: set[str],
                     in_loop: bool = False) -> list[cst.BaseStatement]:
    def uses(s: cst.CSTNode) -> list[str]:
        text = code(s)
        return sorted(p for p in placeholders if p in text)

    # the last statement outside loops that uses a key takes `key` itself
    last = max((i for i, s in enumerate(body) if uses(s)), default=None)
    out: list[cst.BaseStatement] = []
    for i, s in enumerate(body):
        used = uses(s)
        if not used:
            out.append(s)
            continue
        if isinstance(s, (cst.For, cst.While)):
            inner = _sequential_keys(list(s.body.body), placeholders, True)
            out.append(s.with_changes(body=s.body.with_changes(body=inner)))
            continue
        if isinstance(s, cst.BaseCompoundStatement):
            raise EquinoxError("layers built inside a compound statement other than a loop")
        if i == last and len(used) == 1 and not in_loop:
            out.append(_rename_stmt(s, {used[0]: "key"}))
            continue
        if len(used) == 1:
            out.append(cst.parse_statement("key, subkey = jax.random.split(key)\n"))
            out.append(_rename_stmt(s, {used[0]: "subkey"}))
        else:
            names = [f"subkey{j + 1}" for j in range(len(used))]
            out.append(cst.parse_statement(
                f"key, {', '.join(names)} = jax.random.split(key, {len(used) + 1})\n"))
            out.append(_rename_stmt(s, dict(zip(used, names, strict=True))))
    return out


def _rename_stmt(s: cst.BaseStatement, names: dict[str, str]) -> cst.BaseStatement:
    return s.visit(_Rename(names))


# ---------------------------------------------------------------------------- classes
@dataclass
class ClassInfo:
    name: str
    node: cst.ClassDef
    attrs: dict[str, Layer] = field(default_factory=dict)
    stateful: bool = False
    keyed: bool = False
    inputs: list[Info] | None = None  # per-example description of __call__'s arguments
    output: Info | None = None
    new_call: cst.FunctionDef | None = None
    errors: list[str] = field(default_factory=list)
    lambdas: dict[str, cst.Lambda] = field(default_factory=dict)  # per-example forms
    init_methods: set[str] = field(default_factory=set)  # applied by init_layers
    reduced: dict[int, str] = field(default_factory=dict)  # see Forward.reduced
    identities: set[str] = field(default_factory=set)  # see _InitRewriter.identities
    # builder methods (``*, rngs`` in NNX, called as ``self.name(...)`` in ``__init__``),
    # rewritten like ``__init__``
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    # inputs of __call__ whose per-example rank no line states, taken from the first layer
    # applied to them: (parameter, rank, layer kind)
    assumed: list[tuple[str, int, str]] = field(default_factory=list)
    # its forward keeps torch's batch axis (no per-example form was shown): it is called on
    # a batch, its equinox layers mapped over the leading axes
    batched: bool = False
    failed: list[str] = field(default_factory=list)  # why its forward's statements were marked
    # its forward draws random numbers (NNX's ``self.rngs()``, torch's randn_like): it takes a
    # key in inference mode too (equinox_forward.py, Forward.draw)
    draws: bool = False
    # the other methods its forward calls (``self.encode(x)``), written like it: name -> (the
    # method, the placeholders of the keys it takes), see Forward.call_method
    fw_methods: dict[str, tuple[cst.FunctionDef, list[str]]] = field(default_factory=dict)


# the base class of the NNX translation's module classes
NNX_MODULE = m.Attribute(value=m.Name("nnx"), attr=m.Name("Module"))


def _is_module_class(cls: cst.ClassDef, classes: set[str]) -> bool:
    return any(m.matches(b.value, NNX_MODULE) or (
        isinstance(b.value, cst.Name) and b.value.value in classes) for b in cls.bases)


def _init_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for s in cls.body.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == name:
            return s
    return None


def _bind(params: list[cst.Param], call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """The argument each parameter takes at ``call`` (its default where none is given);
    None where the call unpacks arguments."""
    if any(a.star for a in call.args):
        return None
    pos, kw = _pos(call), _kw(call)
    out = {}
    for i, p in enumerate(params):
        name = p.name.value
        if i < len(pos):
            out[name] = pos[i]
        elif name in kw:
            out[name] = kw[name]
        elif p.default is not None:
            out[name] = p.default
    return out


def _passed_classes(sites: list[cst.Call], params: list[cst.Param], classes: set[str],
                    what: str, known: dict[str, tuple[str, ...] | str] | None = None
                    ) -> dict[str, tuple[str, ...] | str]:
    """For each parameter: the module classes of the file that ``sites`` (the calls that
    build ``what``) pass to it, first seen first, or why they are not known (a call passes
    something else, or nothing builds ``what``). ``known``: what the caller's own
    parameters are bound to (``self._make_layer(block, ...)`` in ``__init__``)."""
    out: dict[str, tuple[str, ...] | str] = {}
    for p in params:
        name = p.name.value
        found: list[str] = []
        why = "" if sites else f"the class `{name}` is not known: nothing in this file " \
            f"builds {what}"
        for call in sites:
            bound = _bind(params, call)
            arg = bound.get(name) if bound is not None else None
            got = known.get(arg.value) if known and isinstance(arg, cst.Name) else None
            if isinstance(got, str):
                why = got
            elif got is not None:
                found += got
            elif isinstance(arg, cst.Name) and arg.value in classes:
                found.append(arg.value)
            else:
                why = f"the class `{name}` is not known: {what} is built with " + (
                    f"`{code(arg)}` for it" if arg is not None else "arguments unpacked") + \
                    ", not a module class of this file"
            if why:
                break
        out[name] = why or tuple(dict.fromkeys(found))
    return out


def _key_param(fn: cst.FunctionDef, default_none: bool) -> cst.FunctionDef:
    """``*, rngs: nnx.Rngs`` -> ``*, key`` (``key=None`` for ``__call__``)."""
    params = fn.params
    kw = [p for p in params.kwonly_params if p.name.value != "rngs"]
    key = cst.Param(cst.Name("key"), default=cst.Name("None") if default_none else None,
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
                    if default_none else cst.MaybeSentinel.DEFAULT)
    star = params.star_arg
    if not isinstance(star, cst.Param):
        star = cst.ParamStar()
    plain = list(params.params)
    if plain:
        plain[-1] = plain[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
            " ")))
    kw = [p.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
          for p in kw]
    return fn.with_changes(params=params.with_changes(params=plain, star_arg=star,
                                                      kwonly_params=[*kw, key]))


def _comment_out(s: cst.BaseStatement) -> cst.BaseStatement:
    # (NNX's draw of a key, rngs.params(), as NNX wrote it: its key site is not filled here)
    lines = cst.Module(body=[s]).code.rstrip("\n").replace(
        "__needs_key__", "rngs.params()").splitlines()
    comments = [cst.EmptyLine(comment=cst.Comment("# " + ln if ln.strip() else "#"))
                for ln in lines]
    return cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=comments)


# ------------------------------------- torch's nn.init.*_(self.layer.weight) in __init__
# NNX variable names of the layers' weights (kernel, bias, scale, embedding)
_NNX_VARS = frozenset({"kernel", "bias", "scale", "embedding"})
# elementwise fills: the same whatever the weight's layout (NNX's kernel is (in, out), the
# equinox weight torch's (out, in))
_FILLS = {"jnp.zeros_like": 1, "jnp.ones_like": 1, "jnp.full_like": 2}


def _weight_fields(cls: str) -> dict[str, str]:
    """An equinox layer class -> {its NNX variable: its equinox field} (empty: not known)."""
    for _, spec in layer_table.tables("equinox").values():
        if spec.weights and (cls == spec.cls or re.fullmatch(
                re.escape(spec.cls) + r"[123]d", cls)):
            return dict(spec.weights)
    return {}


def _self_root(node: cst.BaseExpression) -> str | None:
    """``self.a.b.c`` -> ``a``; None when not an attribute chain from ``self``."""
    while isinstance(node, cst.Attribute) and isinstance(node.value, cst.Attribute):
        node = node.value
    if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
        return node.attr.value
    return None


def reads_nnx_weight(s: cst.CSTNode, attrs: dict[str, Layer]) -> bool:
    """Whether ``s`` reads an NNX variable (``self.fc.kernel``, ``self.fc.bias.value``) of a
    layer of the class: the NNX translation of torch's ``self.fc.weight``, which equinox's
    layers do not have; or sets one (``layer.bias.value = ...``), which an equinox layer does
    not allow."""
    nnx_var = m.Attribute(value=m.Attribute(attr=m.OneOf(*map(m.Name, _NNX_VARS))),
                          attr=m.Name("value"))
    if findall(s, m.AssignTarget(nnx_var) | m.AugAssign(target=nnx_var)):
        return True
    for a in findall(s, m.Attribute(attr=m.Name())):
        root = _self_root(a.value)
        lay = attrs.get(root) if root is not None else None
        if lay is None or lay.kind in ("value", "buffer", "param", "fn", "lambda"):
            continue
        if a.attr.value in _NNX_VARS - {"bias"} or (a.attr.value == "value" and isinstance(
                a.value, cst.Attribute) and a.value.attr.value in _NNX_VARS):
            return True
    return False


def direct_init(s: cst.BaseStatement, attrs: dict[str, Layer]) -> cst.BaseStatement | None:
    """``self.fc.kernel.value = jnp.full_like(self.fc.kernel.value, 0.1)`` (NNX's translation
    of torch's ``nn.init.constant_(self.fc.weight, 0.1)`` in ``__init__``) -> ``self.fc =
    eqx.tree_at(lambda m: m.weight, self.fc, jnp.full_like(self.fc.weight, 0.1))``: equinox's
    layers are immutable, and ``__init__`` may still set the field. Only elementwise fills of
    the weight itself (zeros, ones, a constant), which do not depend on its layout; None for
    anything else."""
    if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
            and isinstance(s.body[0], cst.Assign) and len(s.body[0].targets) == 1):
        return None
    assign = s.body[0]
    target = assign.targets[0].target
    if not m.matches(target, m.Attribute(value=m.Attribute(value=m.Attribute(
            value=m.Name("self"), attr=m.Name()), attr=m.Name()), attr=m.Name("value"))):
        return None
    name, var = target.value.value.attr.value, target.value.attr.value
    lay = attrs.get(name)
    field = _weight_fields(lay.cls).get(var) if lay is not None and lay.cls else None
    value = assign.value
    if field is None or not isinstance(value, cst.Call) or \
            _FILLS.get(code(value.func)) != len(value.args) or \
            any(a.keyword is not None or a.star for a in value.args) or \
            not target.deep_equals(value.args[0].value):
        return None
    fill = value.args[1].value if len(value.args) == 2 else None
    # the constant: a number, or names and arithmetic of them (no attribute, call or subscript)
    if fill is not None and findall(fill, m.Attribute() | m.Call() | m.Subscript()):
        return None
    rest = f", {code(fill)}" if fill is not None else ""
    return cst.parse_statement(
        f"self.{name} = eqx.tree_at(lambda m: m.{field}, self.{name}, "
        f"{code(value.func)}(self.{name}.{field}{rest}))\n").with_changes(
            leading_lines=s.leading_lines)
