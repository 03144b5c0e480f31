"""Channels-last between the module classes of a file (flax targets).

The call pass keeps torch's NCHW between statements, so a residual block moves its input to
channels-last on entry and its output back on exit, in every block. This pass runs on the
converted code and lets a module class of the file take and return channels-last values when
every caller can hand it one:

    class BasicBlock(nnx.Module):            # held only by ResNet's Sequentials
        def __call__(self, x):               # x: channels-last
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + self.downsample(x))

    class ResNet(nnx.Module):                # not held by another class: NCHW in and out
        def __call__(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(jnp.moveaxis(x, 1, -1)))))
            x = self.layer2(self.layer1(x))  # channels-last straight through
            x = jax.lax.collapse(self.avgpool(jnp.moveaxis(x, -1, 1)), 1)

Such a class ("block") is instantiated only as ``self.a = Block(...)``, or inside a
``Sequential`` or a list of blocks assigned to an attribute, and those attributes are only
called with one argument (``for blk in self.a: x = blk(x)`` for a list) in their holder's
``__call__``. Each ``__call__`` involved is rewritten by
tracking which local names hold channels-last values: ``jnp.moveaxis(v, 1, -1)`` of such a
name is the name, elementwise operations (activations, ``+ - * /`` of two such values) keep
the layout, and any other use reads ``jnp.moveaxis(v, -1, 1)``, so channel indexing,
concatenation, ``dim=1`` reductions and flattening see torch's layout. A body with other
control flow than such loops, a block whose result is not channels-last without a transpose,
or a use of the class or of its holder attribute anywhere else keeps the converter's usual
code; so do the classes in ``public`` (called from outside the file).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import NoAttributeHooks, findall, walk, walk_up
from torch2jax.passes.common import code, expr, wrap_long_statement

_MOVEAXIS = m.Attribute(value=m.Name("jnp"), attr=m.Name("moveaxis"))
_MINUS_ONE = m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))
# jnp.moveaxis(v, 1, -1) and jnp.moveaxis(v, -1, 1)
TO_CL = m.Call(func=_MOVEAXIS, args=[m.Arg(keyword=None), m.Arg(m.Integer("1"), keyword=None),
                                     m.Arg(_MINUS_ONE, keyword=None)])
FROM_CL = m.Call(func=_MOVEAXIS, args=[m.Arg(keyword=None), m.Arg(_MINUS_ONE, keyword=None),
                                       m.Arg(m.Integer("1"), keyword=None)])

# functions applied elementwise, whatever the layout (as the converter writes activations)
_ELEMENTWISE = frozenset(f"jax.nn.{f}" for f in (
    "relu", "relu6", "gelu", "silu", "swish", "sigmoid", "tanh", "leaky_relu", "elu", "celu",
    "selu", "softplus", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "mish",
    "log_sigmoid", "soft_sign")) | {"jnp.tanh", "jnp.abs", "jnp.exp", "jnp.sqrt"}
_ELEMENTWISE_OPS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
_SCOPES = m.Lambda() | m.ListComp() | m.SetComp() | m.DictComp() | m.GeneratorExp() | \
    m.NamedExpr() | m.FunctionDef() | m.ClassDef() | m.Global() | m.Nonlocal()
_AUG = {cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract,
        cst.MultiplyAssign: cst.Multiply, cst.DivideAssign: cst.Divide}
_SEQUENTIAL = ("nnx.Sequential", "nn.Sequential")


class _Bail(Exception):
    """A body this pass does not rewrite; ``attr``: the holder attribute to blame, if any."""

    def __init__(self, attr: str | None = None) -> None:
        super().__init__(attr)
        self.attr = attr


def _to_cl(e: cst.BaseExpression) -> cst.BaseExpression:
    return expr("jnp.moveaxis({x}, 1, -1)", x=e)


def _from_cl(e: cst.BaseExpression) -> cst.BaseExpression:
    return expr("jnp.moveaxis({x}, -1, 1)", x=e)


def elementwise_function(node: cst.BaseExpression) -> bool:
    """``jax.nn.relu``, ``partial(jax.nn.leaky_relu, negative_slope=0.1)``."""
    if m.matches(node, m.Call(func=m.Name("partial"))) and node.args:
        return code(node.args[0].value) in _ELEMENTWISE and all(
            a.keyword is not None for a in node.args[1:])
    return code(node) in _ELEMENTWISE


def _self_attr(node: cst.CSTNode) -> str | None:
    if m.matches(node, m.Attribute(value=m.Name("self"))):
        return node.attr.value
    return None


class _Children(cst.CSTTransformer):
    """Applies ``fn`` to the direct sub-expressions of ``root`` (names that are not reads,
    keyword names, are left alone)."""

    def __init__(self, root: cst.CSTNode, fn) -> None:
        super().__init__()
        self.root, self.fn = root, fn
        self.skip: set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.root:
            return True
        if isinstance(node, cst.Arg) and node.keyword is not None:
            self.skip.add(id(node.keyword))
        return not isinstance(node, cst.BaseExpression)

    def on_leave(self, original_node, updated_node):
        if (original_node is not self.root and isinstance(original_node, cst.BaseExpression)
                and id(original_node) not in self.skip):
            return self.fn(original_node)
        return updated_node


@dataclass
class _Body:
    """Rewrites one ``__call__`` given which attributes hold blocks and which are
    elementwise functions."""

    blocks: dict[str, bool]  # holder attribute -> whether its input may be moved to it
    elementwise: set[str]
    env: set[str] = field(default_factory=set)  # locals holding channels-last values
    loop_vars: dict[str, str] = field(default_factory=dict)  # for blk in self.a: blk -> a

    # -- expressions
    def torch(self, e: cst.BaseExpression) -> cst.BaseExpression:
        """``e`` with the same value as before, reading channels-last locals back."""
        if isinstance(e, cst.Name):
            return _from_cl(e) if e.value in self.env else e
        if isinstance(e, cst.Attribute):
            return e.with_changes(value=self.torch(e.value))
        if m.matches(e, TO_CL):
            inner = self.cl(e.args[0].value)
            return inner if inner is not None else _to_cl(self.torch(e.args[0].value))
        if self._block_call(e):
            return _from_cl(self._call_block(e))
        return e.visit(_Children(e, self.torch))

    def cl(self, e: cst.BaseExpression) -> cst.BaseExpression | None:
        """An expression for ``jnp.moveaxis(e, 1, -1)`` without a transpose, or None."""
        if isinstance(e, cst.Name):
            return e if e.value in self.env else None
        if m.matches(e, FROM_CL):
            return self.torch(e.args[0].value)
        if self._block_call(e):
            return self._call_block(e)
        if isinstance(e, cst.Call) and self._elementwise(e.func) and _unary(e):
            inner = self.cl(e.args[0].value)
            return None if inner is None else e.with_changes(
                args=[e.args[0].with_changes(value=inner)])
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus):
            inner = self.cl(e.expression)
            return None if inner is None else e.with_changes(expression=inner)
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, _ELEMENTWISE_OPS):
            left, right = self.cl(e.left), self.cl(e.right)
            if left is None and right is not None and _number(e.left):
                left = e.left
            if right is None and left is not None and _number(e.right):
                right = e.right
            if left is not None and right is not None:
                return e.with_changes(left=left, right=right)
        return None

    def _elementwise(self, func: cst.BaseExpression) -> bool:
        return _self_attr(func) in self.elementwise or code(func) in _ELEMENTWISE

    def _holder(self, func: cst.BaseExpression) -> str | None:
        if isinstance(func, cst.Name):
            return self.loop_vars.get(func.value)
        attr = _self_attr(func)
        return attr if attr in self.blocks else None

    def _block_call(self, e: cst.BaseExpression) -> bool:
        return isinstance(e, cst.Call) and self._holder(e.func) is not None

    def _call_block(self, e: cst.Call) -> cst.Call:
        attr = self._holder(e.func)
        if len(e.args) != 1 or e.args[0].star or e.args[0].keyword is not None:
            raise _Bail(attr)
        value = e.args[0].value
        inner = self.cl(value)
        if inner is None:
            if not self.blocks[attr]:  # not known to be an image: its blocks never move it
                raise _Bail(attr)
            inner = _to_cl(self.torch(value))
        return e.with_changes(args=[e.args[0].with_changes(value=inner)])

    # -- statements
    def function(self, fn: cst.FunctionDef, takes_cl: bool, returns_cl: bool) -> cst.FunctionDef:
        if not isinstance(fn.body, cst.IndentedBlock) or findall(fn.body, _SCOPES):
            raise _Bail()
        if takes_cl:
            self.env.add(fn.params.params[1].name.value)
        body = self._statements(fn.body.body, returns_cl, 8)
        last = fn.body.body[-1]
        if returns_cl and not m.matches(last, m.SimpleStatementLine(body=[m.Return()])):
            raise _Bail()
        return fn.with_changes(body=fn.body.with_changes(body=body))

    def _statements(self, stmts, returns_cl: bool, indent: int) -> list[cst.BaseStatement]:
        body = []
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, cst.For):
                body.append(self._loop(stmt, indent))
                continue
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                raise _Bail()
            small = self._small(stmt.body[0], returns_cl, i == len(stmts) - 1)
            if small is not stmt.body[0]:
                stmt = wrap_long_statement(stmt.with_changes(body=[small]), indent)
            body.append(stmt)
        return body

    def _loop(self, loop: cst.For, indent: int) -> cst.For:
        """``for blk in self.blocks: x = blk(x)``: the blocks of the list, each called with
        one value, and a body that leaves every local it assigns in the layout it had."""
        attr = _self_attr(loop.iter)
        if (attr not in self.blocks or not isinstance(loop.target, cst.Name) or loop.orelse
                or loop.asynchronous or not isinstance(loop.body, cst.IndentedBlock)):
            raise _Bail()
        var = loop.target.value
        calls = findall(loop.body, m.Call(func=m.Name(var)))
        if len(findall(loop.body, m.Name(var))) != len(calls) or var in self.env:
            raise _Bail(attr)
        before = set(self.env)
        self.loop_vars[var] = attr
        body = self._statements(loop.body.body, False, indent + 4)
        del self.loop_vars[var]
        if findall(loop.body, m.Return()) or before != self.env:
            raise _Bail(attr)  # (zero iterations must leave the locals as more would)
        return loop.with_changes(body=loop.body.with_changes(body=body))

    def _small(self, s: cst.BaseSmallStatement, returns_cl: bool, last: bool):
        if isinstance(s, cst.Return):
            if s.value is None:
                raise _Bail()
            if not returns_cl:
                return s.with_changes(value=self.torch(s.value))
            value = self.cl(s.value) if last else None
            if value is None:
                raise _Bail()
            return s.with_changes(value=value)
        if isinstance(s, cst.Assign):
            return self._assign(s)
        if isinstance(s, cst.AugAssign) and isinstance(s.target, cst.Name) and \
                type(s.operator) in _AUG:
            if s.target.value not in self.env and not self._reads_env(s.value):
                return s
            value = cst.BinaryOperation(left=s.target, operator=_AUG[type(s.operator)](),
                                        right=s.value)
            return self._assign(cst.Assign(targets=[cst.AssignTarget(s.target)], value=value))
        if isinstance(s, cst.Expr):
            return s.with_changes(value=self.torch(s.value))
        if isinstance(s, cst.Assert):
            return s.with_changes(test=self.torch(s.test),
                                  msg=s.msg and self.torch(s.msg))
        if isinstance(s, cst.Pass):
            return s
        raise _Bail()

    def _assign(self, s: cst.Assign) -> cst.Assign:
        names = []
        for t in s.targets:
            target = t.target
            elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [
                cst.Element(target)]
            if not all(isinstance(el.value, cst.Name) for el in elements):
                raise _Bail()  # x[i] = v, self.a = v, *rest
            names += [el.value.value for el in elements]
        if len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
            value = self.cl(s.value)
            if value is not None:
                self.env.add(names[0])
                return s.with_changes(value=value)
        value = self.torch(s.value)
        self.env.difference_update(names)
        return s.with_changes(value=value)

    def _reads_env(self, e: cst.BaseExpression) -> bool:
        return any(n.value in self.env for n in findall(e, m.Name()))


def _unary(e: cst.Call) -> bool:
    """``f(x)``, ``f(x, 0.2)``, ``f(x, approximate=False)``: one tensor, then constants."""
    return bool(e.args) and not any(a.star for a in e.args) and e.args[0].keyword is None and \
        all(a.keyword is not None or _number(a.value) for a in e.args[1:])


def _number(e: cst.BaseExpression) -> bool:
    if isinstance(e, cst.UnaryOperation):
        e = e.expression
    return isinstance(e, (cst.Integer, cst.Float))


@dataclass
class _Class:
    node: cst.ClassDef
    call: cst.FunctionDef | None = None
    # attribute -> the file's classes it holds ("self.a = Block()", a Sequential of them), or
    # None when some assignment of it holds anything else
    holds: dict[str, list[str] | None] = field(default_factory=dict)
    elementwise: set[str] = field(default_factory=set)
    image_input: bool = False  # its __call__ moves its input to channels-last
    # what one walk of the class finds: its `self.a = v` statements (one target), whether it
    # calls itself (self(x), .__call__), and per attribute: the `self.a` reads and writes,
    # the `self.a = ` targets, and the `self.a(...)` calls and `for _ in self.a` loops of
    # its __call__
    assigns: list[cst.Assign] = field(default_factory=list)
    calls_itself: bool = False
    self_attrs: Counter = field(default_factory=Counter)
    assigned_attrs: Counter = field(default_factory=Counter)
    called_attrs: Counter = field(default_factory=Counter)


_SELF_ASSIGN = m.Assign(targets=[m.AssignTarget(m.Attribute(value=m.Name("self")))])
_CALLS_ITSELF = m.Call(func=m.Name("self")) | m.Attribute(attr=m.Name("__call__"))


def _held(value: cst.BaseExpression, classes) -> tuple[list[str], list[cst.Call]] | None:
    """The file's classes ``value`` builds (one, a Sequential or a list of them) and their
    calls."""
    if m.matches(value, m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("List")),
                               args=[m.Arg(m.List() | m.ListComp(), keyword=None)])):
        value = value.args[0].value  # nnx.List([...]); linen keeps a plain list
    if isinstance(value, cst.ListComp):
        items = [value.elt]
    elif isinstance(value, cst.List):
        items = [el.value for el in value.elements]
        if not items or any(isinstance(el, cst.StarredElement) for el in value.elements):
            return None
    elif isinstance(value, cst.Call) and code(value.func) in _SEQUENTIAL:
        items = [a.value for a in value.args]
        if len(items) == 1 and isinstance(items[0], cst.List) and code(value.func) == \
                "nn.Sequential":
            items = [el.value for el in items[0].elements]
        if not items or any(a.star for a in value.args):
            return None
    else:
        items = [value]
    calls = [v for v in items if m.matches(v, m.Call(func=m.Name()))
             and v.func.value in classes]
    if len(calls) != len(items):
        return None
    return [c.func.value for c in calls], calls


def _simple_call(fn: cst.FunctionDef) -> bool:
    """``def __call__(self, x)``."""
    p = fn.params
    return (len(p.params) == 2 and not p.posonly_params and not p.kwonly_params
            and isinstance(p.star_arg, cst.MaybeSentinel) and p.star_kwarg is None
            and p.params[1].default is None)


def _moves(fn: cst.FunctionDef, name: str) -> bool:
    """``fn`` moves its input ``name`` to channels-last (it is an image)."""
    return findall(fn.body, m.Call(func=_MOVEAXIS, args=[
        m.Arg(m.Name(name)), m.Arg(m.Integer("1")), m.Arg(_MINUS_ONE)])) != []


def _self_attr_name(node: cst.CSTNode) -> str | None:
    """``a`` of ``self.a``."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and \
            node.value.value == "self":
        return node.attr.value
    return None


def _scan(info: _Class) -> None:
    """Fills the facts of one walk of the class (and one of its ``__call__``)."""
    for n in walk(info.node, trivia=False):
        if isinstance(n, cst.Attribute):
            attr = _self_attr_name(n)
            if attr is not None:
                info.self_attrs[attr] += 1
            if n.attr.value == "__call__":
                info.calls_itself = True
        elif isinstance(n, cst.AssignTarget):
            attr = _self_attr_name(n.target)
            if attr is not None:
                info.assigned_attrs[attr] += 1
        elif isinstance(n, cst.Assign):
            if m.matches(n, _SELF_ASSIGN):
                info.assigns.append(n)
        elif isinstance(n, cst.Call) and m.matches(n.func, m.Name("self")):
            info.calls_itself = True
    if info.call is not None:
        for n in walk(info.call, trivia=False):
            attr = _self_attr_name(n.func) if isinstance(n, cst.Call) else \
                _self_attr_name(n.iter) if isinstance(n, cst.For) else None
            if attr is not None:
                info.called_attrs[attr] += 1


def _index(module: cst.Module) -> dict[str, _Class]:
    classes: dict[str, _Class] = {}
    for node in module.body:
        if isinstance(node, cst.ClassDef):
            info = classes[node.name.value] = _Class(node)
            for fn in node.body.body:
                if isinstance(fn, cst.FunctionDef) and fn.name.value == "__call__":
                    info.call = fn
    for info in classes.values():
        _scan(info)
        assigned: dict[str, list[cst.BaseExpression]] = {}
        for a in info.assigns:
            assigned.setdefault(a.targets[0].target.attr.value, []).append(a.value)
        for attr, values in assigned.items():
            if all(elementwise_function(v) for v in values):
                info.elementwise.add(attr)
            held = [_held(v, classes) for v in values]
            if any(h is not None for h in held):
                info.holds[attr] = None if None in held else [c for h in held for c in h[0]]
        if info.call is not None and _simple_call(info.call):
            info.image_input = _moves(info.call, info.call.params.params[1].name.value)
    return classes


@dataclass
class _Uses:
    """What one walk of the module finds: every use (a ``Name`` node) of each class name with
    its parent, and how many ``.attr`` attributes of each name the file holds."""

    names: dict[str, list[cst.Name]] = field(default_factory=dict)
    parents: dict[int, cst.CSTNode] = field(default_factory=dict)
    attrs: Counter = field(default_factory=Counter)


def _uses(module: cst.Module, classes: dict[str, _Class]) -> _Uses:
    uses = _Uses({name: [] for name in classes})
    for parent, kids in walk_up(module, trivia=False):
        if isinstance(parent, cst.Attribute):
            uses.attrs[parent.attr.value] += 1
        for child in kids:
            # (a node that a rewrite put in two places: its last parent, as libcst's
            # ParentNodeProvider records it)
            if isinstance(child, cst.Name) and child.value in uses.names:
                uses.names[child.value].append(child)
                uses.parents[id(child)] = parent
    return uses


def _local_bases(classes: dict[str, _Class]) -> set[str]:
    return {code(b.value) for c in classes.values() for b in c.node.bases}


def _candidates(classes: dict[str, _Class], uses: _Uses) -> set[str]:
    """Classes built only where a holder attribute takes them, with a plain ``__call__``,
    neither deriving from nor derived by another class of the file."""
    local_bases = _local_bases(classes)
    built: set[int] = set()
    for info in classes.values():
        for a in info.assigns:
            held = _held(a.value, classes)
            if held is not None and info.holds.get(a.targets[0].target.attr.value):
                built |= {id(c) for c in held[1]}
    out = set()
    for name, info in classes.items():
        if (info.call is None or not _simple_call(info.call) or name in local_bases
                or any(code(b.value) in classes for b in info.node.bases)
                or info.calls_itself):
            continue  # (self(x) in another method would hand it torch's layout)
        found = [n for n in uses.names[name] if n is not info.node.name]
        parents = uses.parents
        if found and all(id(parents.get(id(n))) in built and parents[id(n)].func is n
                         for n in found):
            out.add(name)
    return out


def _holder_uses_ok(classes: dict[str, _Class], uses: _Uses, local_bases: set[str],
                    all_self_attrs: Counter, holder: str, attr: str) -> bool:
    """``self.attr`` of ``holder`` is assigned in its methods and called (or iterated) in its
    ``__call__``, and ``.attr`` appears nowhere else in the file."""
    info = classes[holder]
    if info.call is None or holder in local_bases:
        return False
    allowed = info.assigned_attrs[attr] + info.called_attrs[attr]
    # the file's .attr, less the self.attr of the other classes
    everywhere = uses.attrs[attr] - (all_self_attrs[attr] - info.self_attrs[attr])
    return allowed == everywhere


def channels_last_blocks(module: cst.Module, public: set[str]) -> cst.Module:
    """The rewrite described in the module docstring; ``module`` when nothing applies.
    ``public``: classes called from outside the file, which keep torch's layout."""
    classes = _index(module)
    uses = _uses(module, classes)
    blocks = _candidates(classes, uses) - public
    holders = {(name, attr): held for name, info in classes.items()
               for attr, held in info.holds.items() if held}
    local_bases = _local_bases(classes)
    all_self_attrs = sum((c.self_attrs for c in classes.values()), Counter())
    called_only = {key for key in holders if _holder_uses_ok(
        classes, uses, local_bases, all_self_attrs, *key)}
    new: dict[str, cst.FunctionDef] = {}
    # (class, its attributes holding blocks, whether it is one) -> its new __call__, or the
    # _Bail: the same question asked again in a later round has the same answer
    done: dict[tuple, cst.FunctionDef | _Bail] = {}
    while True:  # until every block's holders pass it channels-last
        dropped = {c for key, held in holders.items()
                   if key not in called_only or not set(held) <= blocks for c in held}
        new.clear()
        for name, info in classes.items():
            attrs = {a: all(classes[c].image_input for c in held)
                     for (holder, a), held in holders.items()
                     if holder == name and set(held) <= blocks - dropped}
            if not attrs and name not in blocks:
                continue
            key = (name, frozenset(attrs.items()), name in blocks)
            if key not in done:
                try:
                    done[key] = _Body(attrs, info.elementwise).function(
                        info.call, name in blocks, name in blocks)
                except _Bail as exc:
                    done[key] = exc
            if isinstance(done[key], _Bail):
                exc = done[key]
                culprits = [exc.attr] if exc.attr else list(attrs)
                dropped |= {c for a in culprits for c in info.holds[a]} | {name}
            else:
                new[name] = done[key]
        if not dropped & blocks:
            break
        blocks -= dropped
    if not blocks:
        return module
    calls = {id(classes[name].call): fn for name, fn in new.items()}
    return module.visit(_Replace(calls))


class _Replace(NoAttributeHooks, cst.CSTTransformer):
    def __init__(self, calls: dict[int, cst.FunctionDef]) -> None:
        super().__init__()
        self.calls = calls

    def leave_FunctionDef(self, original_node, updated_node):
        return self.calls.get(id(original_node), updated_node)
