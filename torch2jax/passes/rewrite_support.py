"""What the rewrite's handlers share: constants, the per-statement ``Pending`` record and
small syntax helpers (module-level functions of the transformer, passes/rewrite.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    arg,
    code,
    expr,
    try_literal,
)
from torch2jax.passes.layout_fuse import FROM_CHANNELS_LAST as _FROM_CL
from torch2jax.passes.specials import Site
from torch2jax.ruleset import Rule

# einops' torch layers (the modules that define them) -> the einops function each calls and its
# parameters before the axis lengths
EINOPS_TORCH_LAYERS = ("einops.layers.torch.", "einops.layers._einmix.")
_EINOPS_FUNCTIONS = {"Rearrange": ("rearrange", ("pattern",)),
                     "Reduce": ("reduce", ("pattern", "reduction"))}
# packages whose classes take torch's arguments and have its methods, without torch: a rule
# that renames a torch name to one of theirs is a drop-in replacement (an optional import of
# the torch name becomes an optional import of theirs, rewrite.py's _optional_import)
DROP_IN_PACKAGES = ("tensorboardX",)
_IMPORT_NAME = re.compile(r"\b(jnp|jax|nnx|partial|np|optax|ocp|grain|os|tensorboardX)\b(?=[.(])")


DTYPES = {
    "float32": "jnp.float32", "float": "jnp.float32", "float16": "jnp.float16",
    "half": "jnp.float16", "bfloat16": "jnp.bfloat16", "float64": "jnp.float64",
    "double": "jnp.float64", "int64": "jnp.int32", "long": "jnp.int32", "int32": "jnp.int32",
    "int": "jnp.int32", "int16": "jnp.int16", "int8": "jnp.int8", "uint8": "jnp.uint8",
    "bool": "jnp.bool_", "complex64": "jnp.complex64",
}

GRAD_MODES = {"torch.no_grad", "torch.inference_mode", "torch.enable_grad",
              "torch.set_grad_enabled", "torch.autograd.set_grad_enabled",
              "torch.autograd.grad_mode.no_grad"}
INPLACE_OPS = {"add_": "+", "sub_": "-", "mul_": "*", "div_": "/"}
# out-of-place methods whose result dtype is not the receiver's (x.eq_(y) keeps x's dtype)
_INPLACE_DTYPE = {"eq", "ne", "logical_not", "lt", "le", "gt", "ge"}
# Method names that are also common on non-tensors: rewritten only with tensor-like evidence.
AMBIGUOUS_METHODS = {"split", "index", "count", "copy", "sort", "type", "int", "float", "bool",
                     "item", "to", "max", "min", "sum", "all", "any", "round", "log", "exp"}


@dataclass
class Pending:
    todos: list[tuple[str, str]] = field(default_factory=list)  # (rule, message)
    keys: tr.StatementKeys = field(default_factory=tr.StatementKeys)  # subkeys it draws
    before: list[cst.BaseStatement] = field(default_factory=list)  # statements to put first
    after: list[cst.BaseStatement] = field(default_factory=list)  # statements to put after
    # diagnostics reported inside the statement, and the small statements it lost: what a
    # removed statement's placeholder needs (finish/removed.py)
    reported: list[tuple[int, int, str, str, str]] = field(default_factory=list)
    removed: list[cst.BaseSmallStatement] = field(default_factory=list)
    translated: str | None = None  # removed, but its rewritten form is a translation


def _apply_loop(model: str, fn: str, rngs: str | None, keywords: str = ""
                ) -> cst.BaseStatement:
    """torch's ``model.apply(fn)``: ``fn`` on every submodule, children before their parent
    (nnx.iter_modules' order, as torch's apply), given ``rngs`` when it draws (and the
    ``keywords`` a partial bound: ", flag=flag")."""
    extra = keywords + (f", rngs={rngs}" if rngs else "")
    return cst.parse_statement(f"for _, module in nnx.iter_modules({model}):\n"
                               f"    {fn}(module{extra})\n")


_LIST_ANNOTATION = re.compile(r"^(typing\.)?(list|List|MutableSequence)(\[.*\])?$")


def _python_list(fn: cst.FunctionDef, name: str) -> bool:
    """``name`` is a Python list throughout ``fn``: a parameter annotated ``list[...]`` /
    ``List[...]``, or a local, every assignment of which is a list display, a list
    comprehension, ``list(...)`` or a copy of such a list (``shift_size = shift_size.copy()``),
    so ``name[i] = v`` stays an item assignment."""
    param = next((p for p in (*fn.params.params, *fn.params.kwonly_params)
                  if p.name.value == name), None)
    listy = param is not None and param.annotation is not None and bool(
        _LIST_ANNOTATION.match(code(param.annotation.annotation)))
    if param is not None and not listy:
        return False
    values = [a.value for a in findall(fn.body, m.Assign(targets=[m.AssignTarget(
        target=m.Name(name))]))]
    if any(findall(fn.body, m.AnnAssign(target=m.Name(name)) | m.AugAssign(
            target=m.Name(name)))):
        return False
    made = [isinstance(v, (cst.List, cst.ListComp)) or m.matches(v, m.Call(func=m.Name("list")))
            for v in values]
    copies = [m.matches(v, m.Call(func=m.Attribute(value=m.Name(name), attr=m.Name("copy")),
                                  args=[])) for v in values]
    return (listy or any(made)) and all(a or b for a, b in zip(made, copies))


def _push_out_layout(node: cst.BaseExpression) -> cst.BaseExpression:
    """f(jnp.moveaxis(E, -1, 1), ...) -> jnp.moveaxis(f(E, ...), -1, 1) for elementwise f."""
    if isinstance(node, cst.Call) and node.args and m.matches(node.args[0].value, _FROM_CL):
        inner = node.args[0].value.args[0].value
        new = node.with_changes(args=[node.args[0].with_changes(value=inner), *node.args[1:]])
        return expr("jnp.moveaxis({y}, -1, 1)", y=new)
    return node


def _rule_args(site: Site) -> list[cst.Arg]:
    """A rule's plain translation of the bound arguments: torch's positional order is kept
    until the first renamed or dropped parameter; from there on arguments are keywords."""
    rule = site.rule
    args: list[cst.Arg] = []
    keyword_mode = False
    for p in rule.params:
        if p == "*" or p in rule.drop:
            keyword_mode = True
            continue
        v = site.args.named.get(p)
        if v is None:
            keyword_mode = keyword_mode or p in rule.rename
            continue
        if p in rule.rename or keyword_mode or p in site.args.keywords:
            args.append(arg(v, rule.rename.get(p, p)))
            keyword_mode = True
        else:
            args.append(arg(v))
    args.extend(arg(v) for v in site.args.extra_positional)
    for k, v in rule.emit.items():
        args.append(arg(expr(repr(v)), k))
    return args


# torch.nn.Module methods a subclass overrides to adapt state_dict loading / saving
_BUILTINS = {"float", "int", "bool", "str", "tuple", "list", "dict", "set", "len", "max", "min",
             "abs", "round", "sum", "range"}
_OVERLOADS = {"torch.jit._overload_method", "torch.jit._overload"}
_STATE_DICT_HOOKS = {"_load_from_state_dict", "_save_to_state_dict",
                     "_upgrade_state_dict_named", "load_state_dict", "state_dict"}

# tensors made only to be filled in place: torch.empty(...).normal_(std=0.02)
_FILLED = {"torch.empty", "torch.zeros", "torch.ones", "torch.Tensor", "torch.FloatTensor"}
# tensors made on the spot (an in-place method on one is its out-of-place value)
_MADE = _FILLED | {"torch.full", "torch.zeros_like", "torch.ones_like", "torch.empty_like",
                   "torch.full_like", "torch.arange"}
# a tensor's conversions of dtype or device (a made tensor converted is still nothing else's)
_CONVERSIONS = {"type_as", "to", "long", "float", "int", "double", "half", "bool", "cuda",
                "cpu", "type", "detach", "contiguous"}

# a torch conv layer's constructor attributes on nnx.Conv (kernel_size keeps its name)
_CONV_ATTRS = {"in_channels": "in_features", "out_channels": "out_features",
               "groups": "feature_group_count"}
# the sizes a torch layer keeps as attributes, by its rule's special: NNX's names for them
_LAYER_ATTRS = {"conv": _CONV_ATTRS, "embedding": {"embedding_dim": "features"}}


def _isinstance_of(test: cst.BaseExpression, subject: str) -> list[cst.BaseExpression] | None:
    """The classes ``test`` requires ``subject`` to be one of: ``isinstance(<subject>, ...)``
    itself, one operand of an ``and``, or an ``or`` of such checks (``isinstance(m, nn.Conv2d)
    or isinstance(m, nn.Linear)``); None when it does not narrow ``subject``."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _isinstance_of(test.left, subject) or _isinstance_of(test.right, subject)
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        left, right = _isinstance_of(test.left, subject), _isinstance_of(test.right, subject)
        return left + right if left is not None and right is not None else None
    if (m.matches(test, m.Call(func=m.Name("isinstance"), args=[m.Arg(), m.Arg()]))
            and code(test.args[0].value) == subject):
        kinds = test.args[1].value
        return [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
    return None


def _activation_value(rule: Rule) -> cst.BaseExpression | None:
    """A parameterless activation class (nn.ReLU, nn.Hardswish) as a value: its function; one
    with arguments (nn.LeakyReLU, nn.ELU: timm's tresnet ``act_layer = nn.LeakyReLU``) its
    function with torch's defaults, as ``nn.LeakyReLU()`` is (the JAX defaults are torch's)."""
    if rule.layout != "any" or rule.weights or rule.special not in (
            None, "gelu_module", "activation_with_args"):
        return None
    target = rule.targets.get("nnx", "")
    if not target.startswith("jax.nn."):
        return None
    if rule.special == "gelu_module":  # torch's default is the exact erf form
        return expr(f"partial({target}, approximate=False)")
    return expr(target)


def _is_dotted_text(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", text))


def _is_dotted(node: cst.BaseExpression) -> bool:
    """``a.b.c``: a name, not a method of some computed value (``torch.tril(x).view``)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _fix_commas(items: list):
    out = []
    for i, item in enumerate(items):
        if i < len(items) - 1:
            out.append(item.with_changes(comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))))
        else:
            out.append(item.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return out


def _is_docstring(stmt) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())]))


def _call_name(node: cst.Call) -> str:
    f = node.func
    if isinstance(f, cst.Attribute):
        return f".{f.attr.value}"
    if isinstance(f, cst.Name):
        return f.value
    return "call"


# hyperparameters of torch layers that the NNX layer keeps under another name
_LAYER_ATTRIBUTES = {f"torch.nn.{d}": {"p": "rate"} for d in (
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout")}

_FINAL = {"torch.jit.Final", "torch.jit.annotations.Final"}
_ANNOTATION_TYPES = {"torch.device": "jax.Device", "torch.dtype": "jnp.dtype",
                     "torch.Size": "tuple[int, ...]"}


def _call_partial(node):
    """``partial(f, k=v)(x)`` (a layer built and called on the spot) -> ``f(x, k=v)``."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Call)
            and m.matches(node.func.func, m.Name("partial")) and node.func.args
            and all(a.keyword is not None for a in node.func.args[1:])
            and all(a.keyword is None and not a.star for a in node.args)):
        return node
    return node.with_changes(func=node.func.args[0].value, args=_fix_commas(
        [*node.args, *node.func.args[1:]]))


# names a train step may read besides its parameters and the file's top-level names: the
# imports the translation adds
_KERNEL_CHOICES = {"fused", "foreach", "capturable"}  # torch optimizer kernel choices
# inspect.signature(torch.optim.AdamW): the optax optimizer's signature (no `fused`)
_SIGNATURE_OPTIMIZERS = {"torch.optim.AdamW": "optax.adamw", "torch.optim.Adam": "optax.adam",
                         "torch.optim.SGD": "optax.sgd", "torch.optim.RMSprop": "optax.rmsprop",
                         "torch.optim.Adagrad": "optax.adagrad"}
ACC_GRADS = "grads"  # the gradient accumulator (_micro_step_loop)
STEP_GLOBALS = {"jax", "jnp", "nnx", "optax", "partial", "np", "functools", "math", "grain",
                "ocp", "os"}


def _module_names(module: cst.Module) -> set[str]:
    """The names a module binds at its top level (imports, functions, classes, assignments)."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        for imp in findall(stmt, m.Import() | m.ImportFrom()) if isinstance(
                stmt, cst.SimpleStatementLine) else ():
            if isinstance(imp.names, cst.ImportStar):
                continue
            for alias in imp.names:
                bound = alias.asname.name if alias.asname else alias.name
                names.add(code(bound).split(".")[0])
        for t in findall(stmt, m.AssignTarget()) if isinstance(
                stmt, cst.SimpleStatementLine) else ():
            names.update(n.value for n in findall(t, m.Name()))
    return names


def _after(pre: list, blank: list) -> list:
    """The leading lines of a loop placed after ``pre``: blank lines after a function
    definition (the functional step defined after its split), none otherwise."""
    return list(blank) if pre and isinstance(pre[-1], cst.FunctionDef) else []


def _free_names(fn: cst.FunctionDef) -> set[str]:
    """Names ``fn`` reads that nothing in it binds (nor Python's builtins)."""
    wrapper = cst.metadata.MetadataWrapper(cst.Module(body=[fn]))
    scopes = wrapper.resolve(cst.metadata.ScopeProvider)
    free: set[str] = set()
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            if not access.referents and isinstance(access.node, cst.Name):
                free.add(access.node.value)
    return free - {fn.name.value}


def _insert_before_functions(body: list, items: list[tuple[str, cst.BaseStatement]]) -> list:
    """Each statement put before the top-level function (or class) of its name, two blank
    lines apart."""
    blank = [cst.EmptyLine(indent=False)] * 2
    for fn_name, stmt in items:
        at = next((i for i, s in enumerate(body) if isinstance(s, (cst.FunctionDef, cst.ClassDef))
                   and s.name.value == fn_name), None)
        if at is None:
            continue
        body[at:at] = [stmt.with_changes(leading_lines=body[at].leading_lines or blank)]
        body[at + 1] = body[at + 1].with_changes(leading_lines=blank)
    return body


def factory_dict_literal(node: cst.BaseExpression) -> cst.BaseExpression:
    """``dict(device=device, dtype=dtype)`` (timm's ``dd``; either keyword or both, nothing
    else) as the literal ``{"device": device, "dtype": dtype}`` that ``_factory_dict`` reads;
    any other node as it is."""
    if not (m.matches(node, m.Call(func=m.Name("dict"))) and node.args and all(
            a.keyword is not None and a.keyword.value in ("device", "dtype") and not a.star
            for a in node.args)):
        return node
    return cst.Dict([cst.DictElement(cst.SimpleString(f'"{a.keyword.value}"'), a.value)
                     for a in node.args])


def _factory_dict(node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """``{"device": device, "dtype": dtype}`` (either key or both, nothing else): torch's
    factory keyword arguments gathered to be passed on as ``**dd``."""
    if not isinstance(node, cst.Dict) or not node.elements:
        return None
    out = {}
    for e in node.elements:
        if not isinstance(e, cst.DictElement) or not isinstance(e.key, cst.SimpleString):
            return None
        key = e.key.evaluated_value
        if key not in ("device", "dtype"):
            return None
        out[key] = e.value
    return out


def _is_device_expr(node: cst.BaseExpression, t) -> bool:  # t: the TorchToJax
    if isinstance(node, cst.Call) and (t.q(node.func) or "").startswith("torch.device"):
        return True
    if isinstance(node, cst.Attribute) and node.attr.value == "device":
        return True
    if isinstance(node, cst.IfExp):  # "cuda" if ... else "cpu"
        return all(_is_device_expr(branch, t) or _device_string(branch)
                   for branch in (node.body, node.orelse))
    return False


def _device_string(node: cst.BaseExpression) -> bool:
    """A string literal naming a torch device: "cuda", "cuda:1", "cpu", "mps"."""
    value = try_literal(node, ...)
    return isinstance(value, str) and value.split(":")[0] in ("cuda", "cpu", "mps", "xpu")


def _indexed_sequence(fn: cst.FunctionDef, name: str) -> bool:
    """``name`` is bound once in ``fn`` (or is its parameter) and read there with an index
    (ViViT's ``tubelet_size[0]``, Qianfan-OCR's ``patch_size[1]``): a sequence, as an int has
    no items, whatever the value analysis could not tell of it (``config.tubelet_size``); or
    bound to a conditional of an ``isinstance`` test with a tuple or list on one side."""
    def binds(target: cst.CSTNode | None) -> bool:  # a, (b, c), *d; not self.name
        if isinstance(target, cst.AsName):
            target = target.name
        if isinstance(target, (cst.Tuple, cst.List)):
            return any(binds(e.value) for e in target.elements)
        if isinstance(target, cst.StarredElement):
            return binds(target.value)
        return m.matches(target, m.Name(name))

    bound = [t for t in findall(fn.body, m.AssignTarget() | m.For() | m.AugAssign()
                                | m.AnnAssign() | m.WithItem())
             if binds(getattr(t, "target", None) or getattr(t, "asname", None))]
    is_param = any(p.name.value == name for p in (*fn.params.params,
                                                   *fn.params.kwonly_params))
    if len(bound) + is_param != 1:
        return False
    if any(findall(fn.body, m.Subscript(value=m.Name(name)))):
        return True
    # bound to a conditional that makes a sequence of what is not one (Kimi-K2.5's
    # ``p if not isinstance(p, int) else (p, p)``, ViT's ``isinstance(s, Iterable)``)
    pair = m.Tuple() | m.List()
    test = m.Call(func=m.Name("isinstance")) | m.UnaryOperation(
        operator=m.Not(), expression=m.Call(func=m.Name("isinstance")))
    return any(findall(fn.body, m.Assign(targets=[m.AssignTarget(target=m.Name(name))],
                                         value=m.IfExp(test=test, body=pair)
                                         | m.IfExp(test=test, orelse=pair))))


# a parameter frozen by itself (``for name, p in model.named_parameters(): if ...:
# p.requires_grad = False``): a loop over a module's parameters() that freezes them all is
# freeze_parameters(module) (passes/rewrite_loops.py)
ONE_BY_ONE = ("a parameter frozen by itself (chosen by its name, or one of a module's): "
              "torch's parameter names are not the converted module's paths, so the choice is "
              "not translated; freeze whole modules (module.requires_grad_(False)), which "
              "becomes freeze_parameters(module)")
