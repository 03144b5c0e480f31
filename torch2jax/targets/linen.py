"""The flax.linen target.

Linen modules are dataclasses: the torch constructor's parameters become fields, and the body
of ``__init__`` becomes ``setup()``, so submodules keep the torch attribute names and the
parameter tree follows the torch state_dict (``params/conv1/kernel``; a Sequential's layers
are ``layers_0``, ``layers_1``, ...; a list of blocks ``h_0``, ``h_1``, ...).

Linen layers do not take input sizes and do not take RNG state: layers are built from the
NNX translation of the rule (the rules describe torch once) and then adapted here. Train and
eval behaviour comes from one ``train: bool = False`` field: BatchNorm (the ``BatchNorm`` helper
of passes/helpers.py, an ``nn.BatchNorm`` with torch's running variance) gets
``use_running_average=not self.train`` and Dropout ``deterministic=not self.train``. Training
code is applied with ``model.apply(variables, x, rngs={"dropout": key},
mutable=["batch_stats"])`` on a ``Model(..., train=True)`` clone.
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    call,
    code,
    expr,
    freezable_dataclasses,
    freeze_dataclass,
    try_literal,
)
from torch2jax.passes.training import names_of
from torch2jax.targets import layer_table

TRAIN = "train"


# NNX layer classes and their linen counterparts (for annotations and isinstance checks): the
# layers built by their rule's linen table (rules/layers.toml), and the special ones below
CLASSES = {**layer_table.classes("linen"),
           "nnx.BatchNorm": "nn.BatchNorm",
           "nnx.MultiHeadAttention": "nn.MultiHeadDotProductAttention",
           "nnx.RNN": "nn.RNN",
           "nnx.Sequential": "nn.Sequential", "nnx.Module": "nn.Module"}


def _kw(node: cst.Call) -> dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in node.args if a.keyword is not None}


def _pos(node: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in node.args if a.keyword is None and not a.star]


def _rebuild(func: str, pos: list[cst.BaseExpression], kw: dict[str, cst.BaseExpression],
             drop: tuple[str, ...] = ("rngs",)) -> cst.Call:
    return call(func, *[arg(p) for p in pos],
                *[arg(v, k) for k, v in kw.items() if k not in drop])


def layer(node: cst.BaseExpression, train: str = f"self.{TRAIN}") -> cst.BaseExpression:
    """An NNX layer constructor (as the rules emit it) -> the linen constructor. ``train`` is
    the expression that says whether the module trains (a field, or a helper's argument)."""
    if not isinstance(node, cst.Call):
        return node
    name = code(node.func)
    pos, kw = _pos(node), _kw(node)
    built = layer_table.construct(node, "linen", {"train": train})
    if built is not None:  # a layer with a linen table in its rule
        return _rebuild(built.cls, built.pos, dict(built.kw))
    if name in ("BatchNorm", "nnx.BatchNorm"):  # the helper (torch's running variance) or not
        kw.pop("num_features", None)
        running = kw.pop("use_running_average", None)
        if running is None:
            running = expr(f"not {train}")
        return _rebuild("BatchNorm" if name == "BatchNorm" else "nn.BatchNorm", [],
                        {"use_running_average": running, **kw})
    if name == "nnx.MultiHeadAttention":
        # linen infers the input sizes; dropout of the attention weights off in eval mode
        for k in ("in_features", "in_kv_features", "decode"):
            kw.pop(k, None)
        if "dropout_rate" in kw:
            kw["deterministic"] = expr(f"not {train}")
        return _rebuild("nn.MultiHeadDotProductAttention", pos, kw)
    if name in ("TorchLSTMCell", "TorchGRUCell"):  # the helpers (torch's two biases): (H)
        if len(pos) != 2:
            raise Untranslatable(f"{'an LSTM' if 'LSTM' in name else 'a GRU'} cell without its "
                                 "two sizes")
        return _rebuild(name, [pos[1]], kw)
    if name in ("TorchLSTM", "TorchGRU"):  # the helper (stacked layers): input size dropped
        fields = ("hidden_size", "num_layers", "bias", "batch_first", "dropout",
                  "bidirectional")
        kw.pop("input_size", None)
        pos = pos[1:] if "input_size" not in _kw(node) else pos
        if not pos and "hidden_size" not in kw:
            raise Untranslatable("a recurrent layer without its hidden size")
        if "dropout" in kw or len(pos) >= len(fields) - 1:  # (the file has the train field)
            kw["deterministic"] = expr(f"not {train}")
        return _rebuild(name, pos, kw)
    if name == "nnx.RNN":
        return _rebuild("nn.RNN", [layer(p, train) for p in pos], kw)
    if name == "nnx.Sequential":
        if any(a.star for a in node.args):
            (star,) = [a for a in node.args if a.star]
            return call("nn.Sequential", arg(star.value if isinstance(star.value, cst.Name)
                                             else expr("list({x})", x=star.value)))
        if not pos:  # torch's empty Sequential is the identity; linen's raises when called
            return expr("lambda x: x")
        return call("nn.Sequential", arg(cst.List([cst.Element(p) for p in pos])))
    if name == "nnx.List":
        return pos[0] if pos else expr("[]")
    if name == "nnx.Dict":
        return pos[0] if pos else expr("{}")
    if name.startswith("nnx.") and name[4:5].isupper():
        raise Untranslatable(f"{name} has no linen translation yet")
    return node


def pooling(node: cst.BaseExpression) -> cst.BaseExpression:
    """partial(nnx.max_pool, ...) -> partial(nn.max_pool, ...): linen has the same functions."""
    text = code(node)
    if "nnx.max_pool" in text or "nnx.avg_pool" in text:
        return cst.parse_expression(text.replace("nnx.max_pool", "nn.max_pool").replace(
            "nnx.avg_pool", "nn.avg_pool"))
    return node


class _DenseAssigns(cst.CSTTransformer):
    """``self.<attr> = nn.Dense(...)`` for an attribute of ``attrs``: its value replaced by
    ``build(attr, value)``."""

    def __init__(self, attrs: set[str], build) -> None:
        self.attrs, self.build = attrs, build

    def leave_Assign(self, original_node, updated_node):
        target, value = updated_node.targets[0].target, updated_node.value
        if m.matches(target, m.Attribute(value=m.Name("self"))) and \
                target.attr.value in self.attrs and m.matches(value, m.Call(
                    func=m.Attribute(value=m.Name("nn"), attr=m.Name("Dense")))):
            return updated_node.with_changes(value=self.build(target.attr.value, value))
        return updated_node


def readable_dense(cls: cst.ClassDef, in_features: dict[str, cst.BaseExpression]
                   ) -> cst.ClassDef:
    """``nn.Dense`` makes its kernel when it is first called, so forward code cannot read it
    (torch's ``F.linear(x, self.fc.weight)``; NNX: ``self.fc.kernel``). A Linear whose kernel
    is read becomes ``ReadableDense(in_features, features)`` (a helper that makes its kernel
    and bias in ``setup()``, under the same names). ``in_features``: self.x -> torch's input
    size, for the class's Linear attributes."""
    read = {a.value.attr.value for s in cls.body.body if isinstance(s, cst.FunctionDef)
            and s.name.value != "__init__" for a in findall(s, m.Attribute(
                value=m.Attribute(value=m.Name("self")), attr=m.Name("kernel")))}
    wanted = read & set(in_features)
    if not wanted:
        return cls

    return cls.visit(_DenseAssigns(wanted, lambda attr, value: call(
        "ReadableDense", arg(in_features[attr]), *value.args)))


def tied_dense(cls: cst.ClassDef, heads: set[str]) -> cst.ClassDef:
    """A Linear head with a bias tied to an Embedding under a condition of the constructor
    (``if tie_weights: self.decoder.weight = self.encoder.weight``) -> ``TiedDense(features)``
    (a helper with nn.Dense's variables that reads the table it is called with as its kernel);
    its calls pass the table when the condition holds."""
    if not heads:
        return cls

    def tied(attr: str, value: cst.Call) -> cst.Call:
        if any(a.keyword and a.keyword.value not in ("use_bias", "kernel_init", "bias_init")
               for a in value.args):
            raise Untranslatable(f"the tied head self.{attr} with {code(value)}: TiedDense "
                                 "takes no such argument")
        return value.with_changes(func=cst.Name("TiedDense"))

    return cls.visit(_DenseAssigns(heads, tied))


def freeze_configs(module: cst.Module) -> cst.Module:
    """A linen module is hashed when it is a static argument of ``jax.jit`` (``eval_step``,
    ``TrainState.apply_fn``): a config object among its fields must be hashable, so the file's
    dataclasses that nothing mutates become ``@dataclass(frozen=True)``."""
    if not any(isinstance(c, cst.ClassDef) and any(code(b.value) == "nn.Module" for b in c.bases)
               for c in module.body):
        return module
    frozen = freezable_dataclasses(module)
    return module.with_changes(body=[freeze_dataclass(s) if isinstance(s, cst.ClassDef)
                                     and s.name.value in frozen else s for s in module.body])


# ---------------------------------------------------------------------------- classes
class _SelfFields(cst.CSTTransformer):
    """Constructor parameters read in ``setup()`` are fields: ``x`` -> ``self.x``."""

    def __init__(self, fields: set[str]) -> None:
        super().__init__()
        self.fields = fields
        self._skip: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def visit_FunctionDef(self, node) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> None:
        for p in node.params.params:
            self._skip.add(id(p.name))

    def leave_Name(self, original_node, updated_node):
        if id(original_node) in self._skip or updated_node.value not in self.fields:
            return updated_node
        return expr(f"self.{updated_node.value}")


class _RenameAttrs(cst.CSTTransformer):
    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames

    def leave_Attribute(self, original_node, updated_node):
        if m.matches(updated_node.value, m.Name("self")) and \
                updated_node.attr.value in self.renames:
            return updated_node.with_changes(attr=cst.Name(self.renames[updated_node.attr.value]))
        return updated_node


def _declares_param(value: cst.BaseExpression, name: str) -> bool:
    """``self.param("name", ...)``, or it under a condition (``... if bias else None``)."""
    declared = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("param")),
                      args=[m.Arg(m.SimpleString(m.MatchIfTrue(
                          lambda s: s[1:-1] == name))), m.ZeroOrMore()])
    return m.matches(value, declared | m.IfExp(body=declared, orelse=m.Name("None"))
                     | m.IfExp(body=m.Name("None"), orelse=declared))


def _field(param: cst.Param) -> cst.SimpleStatementLine:
    value = try_literal(param.default, None) if param.default is not None else None
    if isinstance(value, list) and param.annotation is None:
        # a list default: not allowed on a dataclass field, and a module must be hashable
        # (jit with the module static): the same values as a tuple
        param = param.with_changes(default=cst.parse_expression(repr(tuple(value))))
    if param.annotation is not None:
        ann = code(param.annotation.annotation)
    else:
        value = try_literal(param.default, ...) if param.default is not None else ...
        ann = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple"}.get(
            type(value), "Any")
        if param.default is not None and value is None:
            ann = "Any"
    default = f" = {code(param.default)}" if param.default is not None else ""
    return cst.parse_statement(f"{param.name.value}: {ann}{default}\n")


def _train_field(kw_only: bool) -> cst.BaseStatement:
    if kw_only:  # subclasses add fields without defaults after it
        return cst.parse_statement(
            f"{TRAIN}: bool = dataclasses.field(default=False, kw_only=True)\n")
    return cst.parse_statement(f"{TRAIN}: bool = False\n")


_GROWS = ("append", "extend", "insert")


def _local_lists(stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """``self.layers = []`` then ``self.layers.append(...)`` (torch's ``nn.ModuleList()`` grown
    in a loop): linen turns a list assigned to a module attribute into a tuple, so the
    appends fail at init. The list is built in a local and assigned once, at the end."""
    grown: dict[str, str] = {}
    attrs = {id(a.attr) for s in stmts for a in m.findall(s, m.Attribute())}
    locals_ = {n.value for s in stmts for n in m.findall(s, m.Name()) if id(n) not in attrs}
    for s in stmts:
        a = s.body[0] if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 else None
        if isinstance(a, cst.Assign) and len(a.targets) == 1 and m.matches(
                a.targets[0].target, m.Attribute(value=m.Name("self"))) and m.matches(
                a.value, m.List(elements=[]) | m.Call(func=m.Name("list"), args=[])):
            attr = a.targets[0].target.attr.value
            if any(m.findall(t, m.Call(func=m.Attribute(value=m.Attribute(
                    value=m.Name("self"), attr=m.Name(attr)), attr=m.OneOf(
                        *(m.Name(g) for g in _GROWS))))) for t in stmts):
                name = attr if attr not in locals_ else f"{attr}_list"
                grown[attr] = name
    if not grown:
        return stmts
    renamer = _RenameSelf(grown)
    out = [s.visit(renamer) for s in stmts]
    out += [cst.parse_statement(f"self.{attr} = {name}\n") for attr, name in grown.items()]
    return out


class _RenameSelf(cst.CSTTransformer):
    """``self.<attr>`` -> a local name."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def leave_Attribute(self, original_node, updated_node):
        if m.matches(original_node.value, m.Name("self")) and (
                original_node.attr.value in self.names):
            return cst.Name(self.names[original_node.attr.value])
        return updated_node


def to_setup(cls: cst.ClassDef, uses_train: bool, kw_only: bool = False,
             values: Collection[str] = ()) -> tuple[cst.ClassDef, set[str]]:
    """``__init__(self, a, b=2)`` -> fields ``a: Any`` / ``b: int = 2`` and ``setup(self)``.
    ``values``: attributes that hold no layer and are read only as ``self.<attr>`` in this
    class: one stored under a field's name (``self.out_dim = default(out_dim, channels)``) is
    renamed ``<attr>_value``.

    Returns the class and the imports its fields need (``Any``)."""
    body = list(cls.body.body)
    inits = [s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"]
    needs: set[str] = set()
    if not inits:
        fields = [_train_field(kw_only)] if uses_train else []
        if fields and kw_only:
            needs.add("dataclasses")
        return cls.with_changes(body=cls.body.with_changes(body=[*fields, *body])), needs
    init = inits[0]
    params = init.params
    if params.star_arg not in (cst.MaybeSentinel.DEFAULT, None) and not isinstance(
            params.star_arg, cst.ParamStar) or params.star_kwarg is not None:
        raise Untranslatable("a constructor with *args/**kwargs: linen modules are dataclasses "
                             "with named fields")
    plist = [p for p in params.params[1:]] + [p for p in params.kwonly_params
                                               if p.name.value != "rngs"]
    names = {p.name.value for p in plist}
    fields = [_field(p) for p in plist]
    if uses_train and TRAIN not in names:
        fields.append(_train_field(kw_only))
        if kw_only:
            needs.add("dataclasses")
    if any("Any" in code(f) for f in fields):
        needs.add("Any")
    # a submodule stored under a field's name (torch: dropout=0.25 and self.dropout =
    # nn.Dropout(dropout)): linen cannot have both, the attribute is renamed
    clashes = set()
    for s in init.body.body:
        for a in findall(s, m.Assign(targets=[m.AssignTarget(m.Attribute(
                value=m.Name("self")))])):
            attr = a.targets[0].target.attr.value
            if attr in names and not m.matches(a.value, m.Name(attr)):
                clashes.add(attr)
    if clashes:
        weightless = ("nn.Dropout(", "partial(", "jax.nn.", "lambda")
        declared = set()  # a parameter (self.param("bias", ...)): its path keeps its name
        for s in init.body.body:
            for a in findall(s, m.Assign()):
                t = a.targets[0].target
                if not m.matches(t, m.Attribute(value=m.Name("self"))) or t.attr.value not in \
                        clashes or t.attr.value in values or code(a.value).startswith(weightless):
                    continue
                if _declares_param(a.value, t.attr.value):
                    declared.add(t.attr.value)
                    continue
                raise Untranslatable(f"the submodule self.{t.attr.value} has the name of a "
                                     "constructor argument (a linen field)")
        renamer2 = _RenameAttrs({c: f"{c}_value" if c in values else f"{c}_param" if c in declared
                                 else f"{c}_layer" for c in clashes})
        body = [s.visit(renamer2) for s in body]
        init = next(s for s in body if isinstance(s, cst.FunctionDef)
                    and s.name.value == "__init__")
    # parameters the constructor reassigns (if not mid: mid = out) are read-only fields in
    # linen: setup() starts from a local copy of each (mid = self.mid) and uses the local
    reassigned = set(names_of(init.body).assigned) & names
    renamer = _SelfFields(names - reassigned)
    stmts = [cst.parse_statement(f"{p.name.value} = self.{p.name.value}")
             for p in plist if p.name.value in reassigned]
    for s in init.body.body:
        # self.x = x: the field is already there
        if m.matches(s, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(m.Attribute(value=m.Name("self")))], value=m.Name())])):
            a = s.body[0]
            if a.targets[0].target.attr.value == a.value.value and a.value.value in names:
                if a.value.value in reassigned:
                    raise Untranslatable(
                        f"a constructor that reassigns its parameter {a.value.value} and "
                        f"stores it as self.{a.value.value}: the linen field of that name "
                        "holds the argument, and setup() cannot change it")
                continue
        stmts.append(s.visit(renamer))
    stmts = _local_lists(stmts)
    if not stmts:
        stmts = [cst.SimpleStatementLine(body=[cst.Pass()])]
    setup = init.with_changes(
        name=cst.Name("setup"),
        params=cst.Parameters(params=[params.params[0].with_changes(
            comma=cst.MaybeSentinel.DEFAULT)]),
        returns=None,
        body=init.body.with_changes(body=stmts))
    # docstring first, then fields, then setup where __init__ was
    head = []
    rest = list(body)
    if rest and m.matches(rest[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        head.append(rest.pop(0))
    i = rest.index(init)
    rest[i] = setup.with_changes(leading_lines=[cst.EmptyLine(indent=False)]
                                 if fields else setup.leading_lines)
    return cls.with_changes(body=cls.body.with_changes(body=[*head, *fields, *rest])), needs
