"""Small shared pieces of the rewrite passes: node <-> code, argument binding, failures."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall

_EMPTY = cst.Module(body=[])


class Untranslatable(Exception):
    """Raised by a transform that cannot translate a construct faithfully.

    The engine leaves the original code in place, adds ``# TODO(torch2jax): <message>`` on that
    line and an ``error`` diagnostic with ``rule``.
    """

    def __init__(self, message: str, rule: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.rule = rule


def code(node: cst.CSTNode) -> str:
    """Source text of a node."""
    return _EMPTY.code_for_node(node)


def one_line(message: str) -> str:
    """A diagnostic message on one line, as a ``# TODO(torch2jax)`` comment must be: code quoted
    in it (a call written over several lines) keeps its tokens; each line break, with the
    indentation around it, becomes one space."""
    return _BREAK.sub(" ", message) if "\n" in message or "\r" in message else message


_BREAK = re.compile(r"\s*[\r\n]+\s*")


def expr(template: str, **parts: cst.CSTNode | str) -> cst.BaseExpression:
    """Parse ``template`` after substituting ``{name}`` with the code of each part.

    Sub-expressions are parenthesised when needed, so that ``{x}.T`` stays right for ``a + b``.
    Without parts the template is parsed as it is: it may hold the user's code, whose braces
    (dict and set literals, f-strings) are not placeholders.
    """
    if not parts:
        return cst.parse_expression(template)
    values = {}
    for name, part in parts.items():
        text = part if isinstance(part, str) else code(part)
        if isinstance(part, cst.CSTNode) and needs_parens(part) and _is_operand(template, name):
            text = f"({text})"
        elif isinstance(part, cst.BaseExpression) and "\n" in text and not part.lpar:
            # a method chain written over lines inside the caller's parentheses: on its own
            # it needs its own
            text = f"({text})"
        values[name] = text
    return cst.parse_expression(template.format(**values))


def _is_operand(template: str, name: str) -> bool:
    """False where ``{name}`` stands alone as a call argument, a subscript or the whole
    template: no parentheses are needed there."""
    token = "{" + name + "}"
    start = template.find(token)
    while start >= 0:
        before = template[:start].rstrip()
        after = template[start + len(token):].lstrip()
        alone = (before == "" or before.endswith(("(", ",", "[", "=", ":"))) and (
            after == "" or after.startswith((")", ",", "]")))
        if not alone:
            return True
        start = template.find(token, start + 1)
    return False


def needs_parens(node: cst.CSTNode) -> bool:
    """True when ``node`` must be parenthesised to be used as an operand or receiver."""
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation, cst.Comparison,
                         cst.UnaryOperation, cst.IfExp, cst.Lambda, cst.NamedExpr,
                         cst.Await)):
        return not node.lpar
    return False


def is_identity_lambda(node: cst.CSTNode | None) -> bool:
    """``lambda x: x``, the translation of ``nn.Identity()``."""
    return isinstance(node, cst.Lambda) and len(node.params.params) == 1 and m.matches(
        node.body, m.Name(node.params.params[0].name.value))


def is_simple(node: cst.CSTNode) -> bool:
    """Cheap and side-effect free to evaluate twice: a name or a chain of attributes."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Attribute):
        return is_simple(node.value)
    return False


def int_value(node: cst.CSTNode | None) -> int | None:
    """The value of an integer literal (also ``-1``), else None."""
    if isinstance(node, cst.Integer):
        return int(node.value)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.value)
    return None


def literal(node: cst.CSTNode | None):
    """A Python literal (number, string, bool, None, tuple/list of those), or raise ValueError."""
    import ast

    if node is None:
        raise ValueError("no node")
    return ast.literal_eval(code(node))


def try_literal(node: cst.CSTNode | None, default=...):
    try:
        return literal(node)
    except (ValueError, SyntaxError, TypeError):
        return default


@dataclass
class BoundArgs:
    """A call's arguments bound to torch's parameter names.

    ``positional`` keeps arguments that could not be bound to a name (more positional
    arguments than the rule lists: varargs such as ``x.view(2, 3)``).
    """

    named: dict[str, cst.BaseExpression] = field(default_factory=dict)
    extra_positional: list[cst.BaseExpression] = field(default_factory=list)
    star: list[cst.Arg] = field(default_factory=list)  # *args / **kwargs passed through
    keywords: set[str] = field(default_factory=set)  # names that were given as keywords
    # the positional arguments in their order, starred ones too (x.expand(*y.shape[:-1], 1))
    ordered: list[cst.Arg] = field(default_factory=list)

    def get(self, name: str) -> cst.BaseExpression | None:
        return self.named.get(name)

    def has(self, name: str) -> bool:
        return name in self.named

    def literal(self, name: str, default=None):
        node = self.named.get(name)
        if node is None:
            return default
        return try_literal(node, ...)


# the numpy spellings torch's argument parser takes for its own (torch.mean(x, axis=-1,
# keepdims=True), torch.cat(xs, axis=1)): bound to torch's names
_NUMPY_ALIASES = {"axis": "dim", "keepdims": "keepdim"}


def bind(args: tuple[cst.Arg, ...] | list[cst.Arg], params: tuple[str, ...]) -> BoundArgs:
    bound = BoundArgs()
    known = params
    if "*" in params:  # parameters after "*" are keyword-only
        params = params[: params.index("*")]
    i = 0
    for arg in args:
        if arg.star != "**" and arg.keyword is None:
            bound.ordered.append(arg)
        if arg.star:
            bound.star.append(arg)
        elif arg.keyword is not None:
            name = arg.keyword.value
            if name in _NUMPY_ALIASES and name not in known and _NUMPY_ALIASES[name] in known:
                name = _NUMPY_ALIASES[name]
            bound.named[name] = arg.value
            bound.keywords.add(name)
        elif i < len(params):
            bound.named[params[i]] = arg.value
            i += 1
        else:
            bound.extra_positional.append(arg.value)
    return bound


def add_kwonly_param(fn: cst.FunctionDef, name: str, annotation: str,
                     default: str | None = None) -> cst.FunctionDef:
    """``def f(a)`` -> ``def f(a, *, name: annotation[ = default])`` (after existing keyword-only
    parameters; unchanged when ``fn`` already has a parameter of that name)."""
    params = fn.params
    if any(p.name.value == name for p in (*params.params, *params.kwonly_params)):
        return fn
    param = cst.Param(name=cst.Name(name), annotation=cst.Annotation(cst.parse_expression(
        annotation)))
    if default is not None:
        param = param.with_changes(
            default=cst.parse_expression(default),
            equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(" "),
                                  whitespace_after=cst.SimpleWhitespace(" ")))
    star = params.star_arg
    if star is cst.MaybeSentinel.DEFAULT or star is None:
        star = cst.ParamStar()
    plain, kwonly = list(params.params), list(params.kwonly_params)
    last_list = kwonly if kwonly else plain
    if (last_list and params.star_kwarg is None and isinstance(last_list[-1].comma, cst.Comma)
            and isinstance(last_list[-1].comma.whitespace_after, cst.ParenthesizedWhitespace)):
        # one parameter per line, ending with a comma: the new one goes on a line of its own
        closing = last_list[-1].comma.whitespace_after
        before = [*plain, *kwonly][-2].comma if len(plain) + len(kwonly) > 1 else None
        inner = before.whitespace_after if isinstance(before, cst.Comma) and isinstance(
            before.whitespace_after, cst.ParenthesizedWhitespace) else closing
        last_list[-1] = last_list[-1].with_changes(comma=cst.Comma(whitespace_after=inner))
        if isinstance(star, cst.ParamStar) and not kwonly:
            star = cst.ParamStar(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        param = param.with_changes(comma=cst.Comma(whitespace_after=closing))
    return fn.with_changes(params=params.with_changes(
        params=plain, star_arg=star, kwonly_params=[*kwonly, param]))


def arg(value: cst.BaseExpression, keyword: str | None = None) -> cst.Arg:
    if value is None:  # a transform asked for an argument the call does not have
        raise Untranslatable(f"a required argument{f' ({keyword})' if keyword else ''} is "
                             "missing from the call")
    if keyword is None:
        return cst.Arg(value=value)
    return cst.Arg(
        value=value,
        keyword=cst.Name(keyword),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )


def call(func: str | cst.BaseExpression, *args: cst.Arg) -> cst.Call:
    fn = cst.parse_expression(func) if isinstance(func, str) else func
    cleaned = []
    for i, a in enumerate(args):
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if i < len(args) - 1 else (
            cst.MaybeSentinel.DEFAULT
        )
        cleaned.append(a.with_changes(comma=comma))
    return cst.Call(func=fn, args=cleaned)


def py(value) -> cst.BaseExpression:
    """A Python value as an expression node."""
    return cst.parse_expression(repr(value))


# ---------------------------------------------------------------------------- line breaking
MAX_LINE = 99


class Dedent(cst.CSTTransformer):
    """Continuation lines move out one level (4 spaces): an expression lifted out of a call
    it was an argument of (``nnx.Optimizer(model, tx)``'s ``tx``, ``nnx.Dict(dict(...))``'s
    dict) keeps the indentation its old place gave it otherwise."""

    def leave_ParenthesizedWhitespace(self, original_node, updated_node):
        last = updated_node.last_line.value
        if last.startswith("    "):
            return updated_node.with_changes(last_line=cst.SimpleWhitespace(last[4:]))
        return updated_node


def _newline(extra: int) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True,
        last_line=cst.SimpleWhitespace(" " * extra))


def wrap_call(node: cst.Call, level: int = 1) -> cst.Call:
    """One argument per line, like a formatter would lay out a call too long for one line:

        nnx.Sequential(
            nnx.Linear(784, 256, rngs=rngs),
            ...
        )
    """
    args = list(node.args)
    pad = 4 * level
    new_args = []
    for i, a in enumerate(args):
        value = a.value
        if len(code(value)) + pad + 4 > MAX_LINE:
            value = _wrap_expr(value, level + 1)
        last = i == len(args) - 1
        comma = cst.Comma(whitespace_after=_newline(pad - 4 if last else pad))
        new_args.append(a.with_changes(value=value, comma=comma))
    return node.with_changes(args=new_args, whitespace_before_args=_newline(pad))


def _wrap_expr(node: cst.BaseExpression, level: int) -> cst.BaseExpression:
    """Break the first call inside ``node`` that has several arguments (through curried
    calls and lambda bodies: ``optax.inject_hyperparams(lambda lr: optax.chain(...))(...)``)."""
    if isinstance(node, cst.Call) and len(node.args) > 1 and not any(a.star for a in node.args):
        return wrap_call(node, level)
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Call):
            func = _wrap_expr(func, level)
        args = [a.with_changes(value=_wrap_expr(a.value, level)) for a in node.args]
        return node.with_changes(func=func, args=args)
    if isinstance(node, cst.Lambda):
        return node.with_changes(body=_wrap_expr(node.body, level))
    if isinstance(node, cst.IfExp) and not node.lpar:
        pad = 4 * level  # one branch per line, in parentheses

        def branches(e):
            if not isinstance(e, cst.IfExp) or e.lpar:
                return e
            return e.with_changes(whitespace_before_else=_newline(pad),
                                  orelse=branches(e.orelse))
        return branches(node).with_changes(
            lpar=[cst.LeftParen(whitespace_after=_newline(pad))],
            rpar=[cst.RightParen(whitespace_before=_newline(pad - 4))])
    if isinstance(node, cst.Dict) and len(node.elements) > 1 and all(
            isinstance(e, cst.DictElement) for e in node.elements):
        pad = 4 * level  # one entry per line (optax.multi_transform's transforms)
        last = len(node.elements) - 1
        elements = [e.with_changes(value=_wrap_expr(e.value, level + 1) if len(
            code(e.value)) + pad > MAX_LINE else e.value, comma=cst.Comma(
                whitespace_after=_newline(pad - 4 if i == last else pad)))
            for i, e in enumerate(node.elements)]
        return node.with_changes(elements=elements, lbrace=cst.LeftCurlyBrace(
            whitespace_after=_newline(pad)), rbrace=cst.RightCurlyBrace())
    return node


def wrap_long_statement(stmt: cst.SimpleStatementLine, indent: int) -> cst.SimpleStatementLine:
    """Break the outermost call of a converted statement that ended up too long."""
    if len(stmt.body) != 1 or indent + len(code(stmt.body[0])) <= MAX_LINE:
        return stmt
    small = stmt.body[0]
    value = getattr(small, "value", None)
    if not isinstance(value, cst.Call) or any(a.star for a in value.args):
        return stmt
    if "\n" in code(value):
        return stmt  # already laid out over lines
    return stmt.with_changes(body=[small.with_changes(value=_wrap_expr(value, 1))])


def freezable_dataclasses(module: cst.Module) -> set[str]:
    """``@dataclass`` classes of the file that nothing assigns attributes on (neither outside
    ``self`` anywhere nor their own methods): a module that stores such a config object must
    be hashable (``eqx.filter_jit`` hashes the static part of an equinox pytree, ``jax.jit``
    with a linen module static hashes its fields), so the dataclass can be ``frozen=True``."""
    mutated = any(not m.matches(t.target.value, m.Name("self"))
                  for t in findall(module, m.AssignTarget(target=m.Attribute())))
    if mutated:
        return set()
    return {c.name.value for c in module.body if isinstance(c, cst.ClassDef) and any(
        m.matches(d.decorator, m.Name("dataclass")) for d in c.decorators)
        and not findall(c, m.AssignTarget(target=m.Attribute(value=m.Name("self"))))}


def freeze_dataclass(cls: cst.ClassDef) -> cst.ClassDef:
    """``@dataclass`` -> ``@dataclass(frozen=True)``."""
    decorators = [d.with_changes(decorator=cst.parse_expression("dataclass(frozen=True)"))
                  if m.matches(d.decorator, m.Name("dataclass")) else d for d in cls.decorators]
    return cls.with_changes(decorators=decorators)


def unnamed_modules_loop(loop: cst.CSTNode) -> bool:
    """``for name, m in self.named_modules():`` (or of a submodule of self) whose body never
    reads ``name``: torch's names and NNX's paths differ, the modules walked are the same."""
    if not (isinstance(loop, cst.For) and m.matches(loop.iter, m.Call(func=m.Attribute(
            value=m.Name("self") | m.Attribute(value=m.Name("self")),
            attr=m.Name("named_modules")), args=[]))
            and m.matches(loop.target, m.Tuple([m.Element(m.Name()), m.Element(m.Name())]))):
        return False
    name = loop.target.elements[0].value.value
    return not any(m.findall(part, m.Name(name)) for part in (loop.body, loop.orelse) if part)


class RenameNames(cst.CSTTransformer):
    """The names of ``names`` renamed where they are read or assigned; attribute and keyword
    names left alone (``p.dim()`` with ``{"dim": ...}`` keeps its method)."""

    def __init__(self, names: dict[str, str]) -> None:
        super().__init__()
        self.names = names

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # (only the receiver is a name: renamed in leave_Attribute)

    def leave_Attribute(self, original_node, updated_node):
        return updated_node.with_changes(value=original_node.value.visit(self))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return True

    def leave_Arg(self, original_node, updated_node):
        return updated_node.with_changes(keyword=original_node.keyword)

    def leave_Name(self, original_node, updated_node):
        new = self.names.get(original_node.value)
        return updated_node.with_changes(value=new) if new else updated_node


def nnx_parameters(frozen: bool) -> str:
    """NNX's filter of a module's parameters in torch's sense; in a file that freezes
    (``freeze_parameters``) the ``FrozenParam``s are parameters too."""
    return "nnx.Any(nnx.Param, FrozenParam)" if frozen else "nnx.Param"
