"""Compiled generation loops (issue 20): a nanoGPT-shaped ``generate()`` becomes one ``nnx.jit``.

A pass over the NNX translation. The loop it knows, after the rewrite::

    for _ in range(max_new_tokens):
        idx_cond = idx if idx.shape[1] <= block_size else idx[:, -block_size:]
        logits, _ = eval_step(model, idx_cond)        # or model(idx_cond)
        logits = logits[:, -1, :] / temperature
        ...                                           # top-k, softmax: kept as written
        key, subkey = jax.random.split(key)
        idx_next = jax.random.categorical(subkey, ...)
        idx = jnp.concatenate((idx, idx_next), axis=1)
    return idx

Eagerly, every new length of ``idx`` compiles the model again. The rewrite puts the sequence in
a buffer of its final length, slides a window of ``min(block_size, final length)`` positions
over it in a ``jax.lax.fori_loop`` and reads the logits at the last valid position by index, so
one compile serves the whole loop; while the context is shorter than that window, the model runs
on the smallest window of 8, 16, 32, ... positions that holds it (``_window_loops``: a loop per
window, all in the one compile). That is exact only when the model is causal: the padding
after the current position must not reach the logits read before it. The model counts as causal
when the torch file builds a causal mask (``torch.tril`` / ``torch.triu`` or ``is_causal=True``)
and holds no layer that mixes positions without one (``nn.Conv1d``, recurrent layers, attention
modules or ``scaled_dot_product_attention`` calls without ``is_causal=True``). Otherwise the loop
stays eager, marked with a TODO and a warning. A causal model whose forward computes only the
last position (nanoGPT's ``x[:, [-1], :]``) is given the position to compute instead
(``_last_position_forward``), so the buffer route applies to it too; where its attention is
proven cacheable, such a ``generate()`` method decodes with a key/value cache instead of the
windows (``passes/kv_cache_decode.py``).

Other token loops: a function whose loop carries a state of fixed shape (a recurrent model's
hidden state, the last token) and collects the tokens in lists becomes one ``nnx.jit`` with a
``jax.lax.scan`` over the tokens (``_scan_route``); any other loop calls one jitted step per
token (``_step_route``), or the jitted forward (``_jit_forward``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.kv_cache_decode import cache_decoding
from torch2jax.passes.training import EVAL_STEP, eval_step_function

# layers that mix sequence positions; each needs is_causal=True to count as causal
_MIXING = {"Conv1d", "LSTM", "GRU", "RNN", "MultiheadAttention", "TransformerEncoderLayer",
           "TransformerEncoder", "Transformer", "TransformerDecoderLayer",
           "scaled_dot_product_attention", "conv1d"}


def _callee(call: cst.Call) -> str:
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else (
        func.value if isinstance(func, cst.Name) else "")


def is_causal(source: cst.Module) -> bool:
    """Whether the torch file's model is causal (module docstring): a ``masked_fill`` /
    ``where`` applies a ``tril`` / ``triu`` mask (directly or through a buffer or attribute
    built from one), or an attention call passes ``is_causal=True``; and no layer mixes
    positions without ``is_causal=True``."""
    triangular = m.Call(func=m.Attribute(attr=m.Name("tril") | m.Name("triu"))
                        | m.Name("tril") | m.Name("triu"))
    masks: set[str] = set()  # buffers and attributes built from a triangular matrix
    for call in m.findall(source, m.Call(func=m.Attribute(attr=m.Name("register_buffer")))):
        if len(call.args) >= 2 and isinstance(call.args[0].value, cst.SimpleString) \
                and m.findall(call.args[1], triangular):
            masks.add(call.args[0].value.evaluated_value)
    for assign in m.findall(source, m.Assign(targets=[m.AssignTarget(m.Attribute(
            value=m.Name("self")))])):
        if m.findall(assign.value, triangular):
            masks.add(assign.targets[0].target.attr.value)
    mask_use = triangular | m.Attribute(value=m.Name("self"), attr=m.OneOf(
        *(m.Name(n) for n in masks))) if masks else triangular
    causal = False
    for call in m.findall(source, m.Call()):
        name = _callee(call)
        has_causal_kw = any(
            a.keyword is not None and a.keyword.value == "is_causal"
            and m.matches(a.value, m.Name("True")) for a in call.args)
        if has_causal_kw or (name in ("masked_fill", "masked_fill_", "where")
                             and any(m.findall(a.value, mask_use) for a in call.args)):
            causal = True
        if name in _MIXING and not has_causal_kw:
            return False
    return causal


def reads_last_position(source: cst.Module, generator: str) -> bool:
    """Whether the torch file reads the last sequence position (``x[:, -1]``, ``x[:, [-1], :]``,
    ``x[:, -1:]``)
    outside the function ``generator``: nanoGPT's forward does at inference. Such a model's
    logits at the end of a padded window are the padding's, not the last token's."""
    last = m.Subscript(slice=[
        m.SubscriptElement(m.Slice(lower=None, upper=None)),
        m.SubscriptElement(m.Index(m.UnaryOperation(m.Minus(), m.Integer("1"))
                                   | m.List([m.Element(m.UnaryOperation(m.Minus(),
                                                                        m.Integer("1")))]))
                           | m.Slice(lower=m.UnaryOperation(m.Minus(), m.Integer("1")),
                                     upper=None)),
        m.ZeroOrMore()])
    outside = [n for n in m.findall(source, m.FunctionDef())
               if n.name.value != generator]
    return any(m.findall(fn, last) for fn in outside)


_FULL = m.SubscriptElement(m.Slice(lower=None, upper=None, step=None))
_MINUS_ONE = m.UnaryOperation(m.Minus(), m.Integer("1"))
_LAST_READ = m.Subscript(slice=[_FULL, m.SubscriptElement(
    m.Index(_MINUS_ONE | m.List([m.Element(_MINUS_ONE)])) | m.Slice(lower=_MINUS_ONE, upper=None,
                                                                     step=None)),
    m.ZeroOrMore(_FULL)])


def _last_position_forward(methods: cst.Module, source: cst.Module, generator: str,
                           taken: set[str]) -> tuple[int, cst.FunctionDef, str] | None:
    """nanoGPT's forward computing only the last position at inference (``x[:, [-1], :]``),
    given a keyword that, when set, makes it compute position ``k`` instead::

        x[:, [-1], :] if k is None else jax.lax.dynamic_slice_in_dim(x, k, 1, axis=1)

    so that a padded window can be read at its true last position (the model being causal).
    Only when the torch file reads the last position once, outside ``generator``, and that
    read is in the class's ``__call__``. -> (its index in ``methods``, the rewritten
    ``__call__``, the keyword)."""
    gens = [f for f in m.findall(source, m.FunctionDef(name=m.Name(generator)))]
    if len(m.findall(source, _LAST_READ)) - sum(len(m.findall(f, _LAST_READ)) for f in gens) != 1:
        return None
    found = [(i, n) for i, n in enumerate(methods.body)
             if m.matches(n, m.FunctionDef(name=m.Name("__call__")))]
    if len(found) != 1 or len(m.findall(found[0][1], _LAST_READ)) != 1 \
            or found[0][1].params.star_kwarg is not None:
        return None
    index, forward = found[0]
    kw = _fresh("last_position", taken)
    code = cst.Module(body=[]).code_for_node

    class _Position(cst.CSTTransformer):
        def leave_Subscript(self, original, updated):
            if not m.matches(original, _LAST_READ):
                return updated
            x = code(updated.value)  # (the elements after the position are all ``:``)
            read = (f"jax.lax.dynamic_index_in_dim({x}, {kw}, axis=1, keepdims=False)"
                    if m.matches(updated.slice[1].slice, m.Index(_MINUS_ONE))
                    else f"jax.lax.dynamic_slice_in_dim({x}, {kw}, 1, axis=1)")
            return cst.parse_expression(f"({code(updated)} if {kw} is None else {read})")

    params = forward.params
    star = params.star_arg if isinstance(params.star_arg, cst.Param) else cst.ParamStar()
    params = params.with_changes(star_arg=star, kwonly_params=[
        *params.kwonly_params, cst.Param(cst.Name(kw), default=cst.Name("None"),
                                         equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                               cst.SimpleWhitespace("")))])
    return index, forward.visit(_Position()).with_changes(params=params), kw


def _model_class_forward(module: cst.Module, source: cst.Module, generator: str,
                         taken: set[str]) -> tuple[int, cst.ClassDef, str] | None:
    """A function ``generator(model, idx, ...)`` at the top level: the one class of the file
    whose ``__call__`` computes the last position only (``_last_position_forward``), given the
    keyword. -> (its index in ``module``, the class rewritten, the keyword)."""
    found = []
    for i, node in enumerate(module.body):
        if not isinstance(node, cst.ClassDef):
            continue
        methods = cst.Module(body=list(node.body.body))
        forward = _last_position_forward(methods, source, generator, taken)
        if forward is not None:
            body = list(node.body.body)
            body[forward[0]] = forward[1]
            found.append((i, node.with_changes(body=node.body.with_changes(body=body)),
                          forward[2]))
    return found[0] if len(found) == 1 else None


class _NameSet(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _names(node: cst.CSTNode) -> set[str]:
    """The names read or bound in ``node`` (a visitor: matching each node was the pass's
    cost on a long file)."""
    found = _NameSet()
    node.visit(found)
    return found.names


class _Draws(cst.CSTVisitor):
    """Whether a tree calls ``jax.random.categorical`` / ``jnp.argmax`` (``_SAMPLES``)."""

    def __init__(self) -> None:
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        if not self.found and m.matches(node, _SAMPLES):
            self.found = True
        return not self.found


def _draws(node: cst.CSTNode) -> bool:
    found = _Draws()
    node.visit(found)
    return found.found


def _target_name(stmt: cst.BaseStatement, index: int = 0) -> tuple[str, cst.BaseExpression] | None:
    """``name = value`` (or ``name, _ = value`` for index 0) -> (name, value)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1):
        return None
    target = stmt.body[0].targets[0].target
    if isinstance(target, cst.Tuple) and target.elements:
        target = target.elements[index].value
    if not isinstance(target, cst.Name):
        return None
    return target.value, stmt.body[0].value


class _MaskSet(cst.CSTTransformer):
    """``x.at[x < y].set(s)`` -> ``jnp.where(x < y, s, x)``: a boolean mask index cannot be
    traced; the mask has ``x``'s shape (its left operand is ``x``), so the two agree."""

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not (m.matches(updated, m.Call(func=m.Attribute(
                value=m.Subscript(value=m.Attribute(attr=m.Name("at"))), attr=m.Name("set")),
                args=[m.Arg(keyword=None)]))):
            return updated
        sub = updated.func.value
        x = sub.value.value
        if len(sub.slice) != 1 or not isinstance(sub.slice[0].slice, cst.Index):
            return updated
        cond = sub.slice[0].slice.value
        if not (isinstance(cond, cst.Comparison) and len(cond.comparisons) == 1
                and cond.left.deep_equals(x)):
            return updated
        return cst.parse_expression("jnp.where(c, s, x)").with_changes(args=[
            cst.Arg(cond), cst.Arg(updated.args[0].value), cst.Arg(x)])


def _reads_before_writes(stmts: list[cst.BaseStatement], seq: str, key: str) -> bool:
    """Whether the loop carries no name but ``seq`` and ``key``: every other name the loop
    assigns is assigned before the loop body reads it."""
    assigned = set()
    for a in m.findall(cst.Module(body=stmts), m.Assign() | m.AugAssign() | m.AnnAssign()):
        targets = a.targets if isinstance(a, cst.Assign) else [a]
        for t in targets:
            assigned |= {n.value for n in m.findall(t.target, m.Name())}
    carried = assigned - {seq, key, "_"}
    done: set[str] = set()
    for small in m.findall(cst.Module(body=stmts), m.Assign() | m.AugAssign() | m.Expr()
                           | m.If() | m.AnnAssign()):
        if isinstance(small, cst.If):
            reads = _names(small.test)
        elif isinstance(small, cst.Assign):
            reads = _names(small.value)
        elif isinstance(small, (cst.AugAssign, cst.Expr)):
            reads = _names(small)
        else:
            reads = _names(small.value) if small.value is not None else set()
        if (reads & carried) - done:
            return False
        if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = small.targets if isinstance(small, cst.Assign) else [small]
            for t in targets:
                done |= {n.value for n in m.findall(t.target, m.Name())}
    return True


def _assigned(node: cst.CSTNode) -> set[str]:
    return {n.value for t in m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign())
            for n in m.findall(t.target, m.Name())}


def _fresh(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _loop(fn: cst.FunctionDef) -> tuple[cst.For | cst.While, str, set[str], str] | None:
    """A token loop, the function's whole body: ``for _ in range(n): ...`` or
    ``while idx.shape[1] < n: ...``, then ``return idx``. -> (loop, sequence name, the names
    the final length depends on, the final length as code, written
    with the placeholder ``{t0}`` for the prompt length)."""
    body = list(fn.body.body)
    if len(body) != 2 or not isinstance(body[0], (cst.For, cst.While)) or fn.decorators:
        return None
    loop, ret = body
    if not (m.matches(ret, m.SimpleStatementLine(body=[m.Return(value=m.Name())]))
            and loop.orelse is None):
        return None
    seq = ret.body[0].value.value
    code = cst.Module(body=[]).code_for_node
    if isinstance(loop, cst.For):
        if not (isinstance(loop.target, cst.Name) and m.matches(
                loop.iter, m.Call(func=m.Name("range"), args=[m.Arg(keyword=None)]))
                and (loop.target.value == "_" or loop.target.value not in _names(loop.body))):
            return None
        n = loop.iter.args[0].value
        return loop, seq, _names(n), "{t0} + " + code(n)
    # while idx.shape[1] < n  (idx.size(1) < n in torch)
    if not m.matches(loop.test, m.Comparison(
            left=m.Subscript(value=m.Attribute(value=m.Name(seq), attr=m.Name("shape")),
                             slice=[m.SubscriptElement(m.Index(m.Integer("1")))]),
            comparisons=[m.ComparisonTarget(operator=m.LessThan())])):
        return None
    n = loop.test.comparisons[0].comparator
    if seq in _names(n):
        return None
    return loop, seq, _names(n), "max({t0}, " + code(n) + ")"


def _compile(fn: cst.FunctionDef, last_kw: str | None = None,
             windows: bool = False) -> cst.FunctionDef | None:
    """The compiled form of a generation function, or None when ``fn`` is not one.
    ``last_kw``: the model is called as ``self(window, last_kw=position)`` and computes that
    position only (``_last_position_forward``), so the read stays at ``-1``. ``windows``:
    while the context is shorter than the full window, the model runs on the smallest of
    windows of 8, 16, 32, ... positions that holds it (``_window_loops``; the code calls
    ``functools.partial`` as ``partial``)."""
    found_loop = _loop(fn)
    if found_loop is None:
        return None
    loop, seq, steps, total_code = found_loop
    ret = fn.body.body[1]
    stmts = list(loop.body.body)
    if len(stmts) < 4:
        return None
    params = {p.name.value: p for p in (*fn.params.params, *fn.params.kwonly_params)}
    if seq not in params or steps & _assigned(loop.body):
        return None
    steps = sorted(steps & set(params))  # static: they fix the buffer's length
    # 1. idx_cond = idx if idx.shape[1] <= BS else idx[:, -BS:]
    first = _target_name(stmts[0])
    if first is None or not m.matches(first[1], m.IfExp(
            test=m.Comparison(left=m.Subscript(value=m.Attribute(value=m.Name(seq),
                                                                 attr=m.Name("shape"))),
                              comparisons=[m.ComparisonTarget(operator=m.LessThanEqual())]),
            body=m.Name(seq))):
        return None
    cond_name = first[0]
    block = first[1].test.comparisons[0].comparator
    if not (m.matches(first[1].test.left.slice[0].slice, m.Index(value=m.Integer("1")))):
        return None
    # 2. logits[, _] = eval_step(model, idx_cond) | model(idx_cond)
    call = _target_name(stmts[1])
    if call is None or not isinstance(call[1], cst.Call):
        return None
    logits, model_call = call
    args = [a.value for a in model_call.args]
    if m.matches(model_call.func, m.Name("eval_step")) and len(args) == 2 \
            and m.matches(args[1], m.Name(cond_name)) and isinstance(args[0], cst.Name):
        model_call = cst.Call(func=args[0], args=[cst.Arg(cst.Name(cond_name))])
    elif not (isinstance(model_call.func, cst.Name) and len(args) == 1
              and m.matches(args[0], m.Name(cond_name))):
        return None
    if last_kw is not None and not (m.matches(model_call.func, m.Name("self")) or (
            isinstance(model_call.func, cst.Name) and model_call.func.value in params)):
        return None  # (a method calls self; a function, the model it is given)
    # 3. logits = logits[:, -1, :] ... : the read at the last valid position
    read = _target_name(stmts[2])
    last = m.Subscript(value=m.Name(logits), slice=[
        m.SubscriptElement(m.Slice(lower=None, upper=None)),
        m.SubscriptElement(m.Index(m.UnaryOperation(m.Minus(), m.Integer("1")))),
        m.ZeroOrMore(m.SubscriptElement(m.Slice(lower=None, upper=None)))])
    if read is None or read[0] != logits or len(m.findall(read[1], last)) != 1:
        return None
    # the last statement: idx = jnp.concatenate((idx, idx_next), axis=1)
    end = _target_name(stmts[-1])
    if end is None or end[0] != seq or not m.matches(end[1], m.Call(
            func=m.Attribute(value=m.Name("jnp"), attr=m.Name("concatenate")),
            args=[m.Arg(value=m.Tuple(elements=[m.Element(m.Name(seq)), m.Element(m.Name())])),
                  m.Arg(keyword=m.Name("axis"), value=m.Integer("1"))])):
        return None
    nxt = end[1].args[0].value.elements[1].value.value
    middle = stmts[3:-1]
    if seq in _names(cst.Module(body=middle)) or any(
            m.findall(s, m.Return() | m.Break() | m.Continue() | m.Yield()) for s in stmts):
        return None
    taken = set(_names(fn))
    split = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("random")),
                                    attr=m.Name("split")))
    draws = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("rngs")), args=[])
    prelude: list[cst.BaseStatement] = []
    key: str | None = None  # greedy decoding (argmax) draws nothing
    if "key" in params:  # a function: its key is split in the loop
        key = "key"
        if not any(m.findall(s, split) for s in middle):
            return None
    elif any(m.findall(s, draws | split) for s in middle):  # a method drawing from its nnx.Rngs: one key drawn before the loop, split per step
        found = [i for i, s in enumerate(middle) if m.findall(s, draws)]
        if len(found) != 1 or len(m.findall(middle[found[0]], draws)) != 1 \
                or not isinstance(middle[found[0]], cst.SimpleStatementLine) \
                or any(m.findall(s, split) for s in middle):
            return None
        key, subkey = _fresh("key", taken), _fresh("subkey", taken)
        draw = m.findall(middle[found[0]], draws)[0]
        prelude = [cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(cst.Name(key))], value=draw)])]
        middle[found[0]] = m.replace(middle[found[0]], draws, cst.Name(subkey))
        middle.insert(found[0], cst.parse_statement(
            f"{key}, {subkey} = jax.random.split({key})\n"))
    if not _reads_before_writes(stmts, seq, key or seq):
        return None
    carry = f"{seq}, {key}" if key else f"{seq},"

    t, t0, b, width, start, step = (_fresh(n, taken) for n in
                                    ("t", "t0", "b", "width", "start", "decode_step"))
    # the growing context: a loop per window of 8, 16, 32, ... below ``width``
    window, lo, hi, state = (_fresh(n, taken) for n in ("window", "lo", "hi", "state")) \
        if windows else ("",) * 4
    total = total_code.format(t0=t0)
    block_code = cst.Module(body=[]).code_for_node(block)

    class _Read(cst.CSTTransformer):
        def leave_Subscript(self, original, updated):
            if m.matches(original, last):
                elems = list(updated.slice)
                elems[1] = cst.SubscriptElement(cst.Index(cst.parse_expression(
                    f"{t} - 1 - {start}")))
                return updated.with_changes(slice=elems)
            return updated

    stmt = cst.parse_statement
    if last_kw is not None:  # the forward computes the position given, the read stays -1
        model_call = model_call.with_changes(args=[*model_call.args, cst.Arg(
            cst.parse_expression(f"{t} - 1 - {start}"), keyword=cst.Name(last_kw),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])
    loop_body = [
        stmt(f"{carry} = carry\n"),
        stmt(f"{start} = jnp.maximum({t} - {block_code}, 0)\n"),
        stmt(f"{cond_name} = jax.lax.dynamic_slice_in_dim({seq}, {start}, "
             f"{window if windows else width}, axis=1)\n"),
        stmts[1].with_changes(body=[stmts[1].body[0].with_changes(value=model_call)]),
        stmts[2] if last_kw is not None else stmts[2].visit(_Read()),
        *(s.visit(_MaskSet()) for s in middle),
        stmt(f"{seq} = {seq}.at[:, {t}].set({nxt}[:, 0])\n"),
        stmt(f"return {carry}\n"),
    ]
    inner = cst.FunctionDef(
        name=cst.Name(step),
        params=cst.Parameters(params=[cst.Param(cst.Name(n)) for n in (
            t, "carry", *[window] * windows)]),
        body=cst.IndentedBlock(body=loop_body))
    static = [*dict.fromkeys(steps + [n for n, p in params.items() if p.default is not None
                                      and m.matches(p.default, m.Name("None"))])]
    names = ", ".join(f'"{n}"' for n in static) + ("," if len(static) == 1 else "")
    jit = f"nnx.jit(static_argnames=({names}))" if static else "nnx.jit"
    new_body = [
        stmt(f"{b}, {t0} = {seq}.shape\n").with_changes(leading_lines=[
            cst.EmptyLine(comment=cst.Comment(
                "# one compiled decode step over a buffer of the final length: the model is "
                "causal,")),
            cst.EmptyLine(comment=cst.Comment(
                "# so the padding after position t - 1 cannot change the logits read there"))]),
        stmt(f"{seq} = jnp.zeros(({b}, {total}), {seq}.dtype).at[:, :{t0}].set({seq})\n"),
        stmt(f"{width} = min({block_code}, {total})\n"),
        *prelude,
        inner.with_changes(leading_lines=[cst.EmptyLine(indent=False)]),
        *(_window_loops(carry, t0, total, width, step, window, lo, hi, state) if windows else [
            stmt(f"{carry} = jax.lax.fori_loop({t0}, {total}, {step}, ({carry}))\n")
            .with_changes(leading_lines=[cst.EmptyLine(indent=False)])]),
        ret,
    ]
    decorator = cst.Decorator(cst.parse_expression(jit))
    return fn.with_changes(decorators=[decorator], body=fn.body.with_changes(body=new_body))


def _window_loops(carry: str, t0: str, total: str, width: str, step: str, window: str,
                  lo: str, hi: str, state: str) -> list[cst.BaseStatement]:
    """The loops of ``_compile`` with ``windows``: the step at position ``t`` reads a context
    of ``t`` tokens, which a window of ``w >= t`` positions starting at 0 holds; the model
    being causal, the logits at ``t - 1`` do not see the padding after it. So while ``t`` is
    at most 8, 16, 32, ... (below the full window ``width``), the model runs on that many
    positions; then on ``width`` (sliding once the context is longer). The bounds are static
    (the prompt's shape and ``max_new_tokens``): one ``fori_loop`` per window the tokens
    reach, each tracing the model at its width, all in the one compiled function."""
    code = (
        f"{state}, {lo}, {window} = ({carry}), {t0}, 8\n"
        f"while {window} < {width}:\n"
        f"    {hi} = min({window} + 1, {total})\n"
        f"    if {lo} < {hi}:\n"
        f"        {state} = jax.lax.fori_loop({lo}, {hi}, partial({step}, {window}={window}), "
        f"{state})\n"
        f"        {lo} = {hi}\n"
        f"    {window} *= 2\n"
        f"{carry} = jax.lax.fori_loop({lo}, {total}, partial({step}, {window}={width}), "
        f"{state})\n")
    stmts = list(cst.parse_module(code).body)
    stmts[0] = stmts[0].with_changes(leading_lines=[
        cst.EmptyLine(indent=False),
        cst.EmptyLine(comment=cst.Comment(
            "# while the context is shorter than the window, the model runs on the smallest")),
        cst.EmptyLine(comment=cst.Comment(
            "# window of 8, 16, 32, ... positions that holds it: a loop per window (each "
            "traced once)"))])
    return stmts


# a parameter that holds the model a token loop calls (``generate(model, idx, n)``)
_MODEL_PARAM = re.compile(r"(^|_)(model|net|rnn|lstm|gru|gpt|lm|decoder)(_|\d|$)|^m$")
_SAMPLES = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("random")),
                                   attr=m.Name("categorical"))
                  | m.Attribute(value=m.Name("jnp"), attr=m.Name("argmax")))


def _model_call(models: set[str]) -> m.Call:
    return m.Call(func=m.Name(EVAL_STEP) | m.OneOf(*(m.Name(n) for n in models))) if models \
        else m.Call(func=m.Name(EVAL_STEP))


def _token_loop(loop: cst.For | cst.While, models: set[str]) -> bool:
    """Whether ``loop`` samples tokens autoregressively: it calls the model, then draws
    (``jax.random.categorical`` / ``jnp.argmax``), and what it assigns from the draw on is read
    by the model call or before it (the token, or the sequence it is appended to, goes back
    in). An evaluation loop that takes an argmax of the model's output is not one."""
    stmts = list(loop.body.body)
    call = next((i for i, s in enumerate(stmts) if m.findall(s, _model_call(models))), None)
    draw = max((i for i, s in enumerate(stmts) if m.findall(s, _SAMPLES)), default=None)
    if call is None or draw is None or draw < call:
        return False
    return bool(_assigned(cst.Module(body=stmts[draw:]))
                & _names(cst.Module(body=stmts[:call + 1])))


class _JitModelCalls(cst.CSTTransformer):
    """``model(x, h)`` -> ``eval_step(model, x, h)`` (the jitted forward the NNX pass writes)
    for the given callee names; counts the calls that go through it, those already written so
    included."""

    def __init__(self, models: set[str]) -> None:
        super().__init__()
        self.models, self.count = models, 0

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if m.matches(updated.func, m.Name(EVAL_STEP)):
            self.count += 1
        elif isinstance(updated.func, cst.Name) and updated.func.value in self.models \
                and all(a.keyword is None and not a.star for a in updated.args):
            self.count += 1
            return updated.with_changes(func=cst.Name(EVAL_STEP),
                                        args=[cst.Arg(updated.func), *updated.args])
        return updated


def _jit_forward(fn: cst.FunctionDef, method: bool) -> tuple[cst.FunctionDef, int]:
    """The exact route for any forward: in ``fn``'s token loops (``_token_loop``) the model is called through the jitted
    ``eval_step``, which compiles once per distinct input shape. -> (function, the number of
    model calls in its token loops that are jitted)."""
    params = [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]
    models = {p for p in params if _MODEL_PARAM.search(p)} | ({params[0]} if method and params
                                                             else set())
    count = 0

    class _Loops(cst.CSTTransformer):
        def leave_For(self, original, updated):
            return self._loop(updated)

        def leave_While(self, original, updated):
            return self._loop(updated)

        def _loop(self, loop):
            nonlocal count
            if not _token_loop(loop, models):
                return loop
            jitted = _JitModelCalls(models)
            loop = loop.with_changes(body=loop.body.visit(jitted))
            count += jitted.count
            return loop

    return fn.visit(_Loops()), count


_PURE_ROOTS = {"jax", "jnp", "nnx", "F", "math"}
_STATIC_USES = {"min", "max", "range", "int", "len"}


def _locals(fn: cst.FunctionDef) -> set[str]:
    params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
    return params | _assigned(fn) | {n.value for loop in m.findall(fn, m.For())
                                     for n in m.findall(loop.target, m.Name())}


def _pure(stmt: cst.BaseStatement, models: set[str], local: set[str]) -> bool:
    """Whether a statement of a token step can be traced: assignments, and ``if`` statements
    around them, whose calls are jax / jnp / F functions, methods of local values, the model
    (or the eval step), ``self.rngs()`` and ``min`` / ``max``."""
    if isinstance(stmt, cst.If):
        return stmt.orelse is None and all(_pure(s, models, local) for s in stmt.body.body)
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], (cst.Assign, cst.AugAssign))):
        return False
    for c in m.findall(stmt, m.Call()):
        f = c.func
        if isinstance(f, cst.Name):
            if f.value not in models | {EVAL_STEP, "min", "max", "float", "int"}:
                return False
        elif isinstance(f, cst.Attribute):
            root = f
            while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
                root = root.value if not isinstance(root, cst.Call) else root.func
            if not isinstance(root, cst.Name):
                return False
            if root.value in models:
                if not m.matches(c, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("rngs")),
                                           args=[])):
                    return False
            elif root.value not in _PURE_ROOTS and root.value not in local:
                return False
        else:
            return False
    return True


def _step_route(fn: cst.FunctionDef, method: bool, taken: set[str], tree: bool
                ) -> tuple[cst.FunctionDef, cst.FunctionDef] | None:
    """The token step compiled whole: in ``fn``'s token loop, the statements from the model
    call to the draw (``jax.random.categorical`` / ``jnp.argmax``) become one module-level
    ``nnx.jit`` function of the values they read, called once per token; what comes before
    (a crop of the context) and after (appending the token) stays as written. The model call
    then runs with the sampling in one compiled call. -> (the new function, the step), or
    None when the loop has no such run of traceable statements."""
    params = [p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)]
    defaults = {p.name.value: p.default for p in (*fn.params.params, *fn.params.kwonly_params)}
    models = {p for p in params if _MODEL_PARAM.search(p)} | ({params[0]} if method and params
                                                             else set())
    loops = [n for n in m.findall(fn, m.For() | m.While()) if _token_loop(n, models)]
    if len(loops) != 1 or m.findall(loops[0].body, m.For() | m.While()):
        return None
    loop = loops[0]
    stmts = list(loop.body.body)
    first = next((i for i, s in enumerate(stmts) if m.findall(s, _model_call(models))), None)
    last = max((i for i, s in enumerate(stmts) if m.findall(s, _SAMPLES)), default=None)
    local = _locals(fn)
    if first is None or last is None or last < first or not all(
            _pure(s, models, local) for s in stmts[first:last + 1]):
        return None
    step = stmts[first:last + 1]
    block = cst.Module(body=step)
    # inputs: the locals the step reads before it assigns them; outputs: what it assigns
    # and the rest of the function reads
    inputs: list[str] = []
    done: set[str] = set()
    for small in m.findall(block, m.Assign() | m.AugAssign() | m.If()):
        reads = _names(small.test) if isinstance(small, cst.If) else (
            _names(small.value) | (_names(small.target) if isinstance(small, cst.AugAssign)
                                   else set()))
        inputs += [n for n in sorted(reads & local - done) if n not in inputs]
        if not isinstance(small, cst.If):
            done |= _assigned(small) if isinstance(small, cst.Assign) else _names(small.target)
    rest = fn.with_changes(body=fn.body.with_changes(body=[
        *[s for s in fn.body.body if s is not loop],
        loop.with_changes(body=loop.body.with_changes(
            body=[*stmts[:first], *stmts[last + 1:]]))]))
    outputs = sorted((done - {"_"}) & (_names(rest) | _names(loop.test if isinstance(
        loop, cst.While) else loop.iter) | set(inputs)))
    if not outputs or any(n in models for n in outputs):
        return None
    static = [n for n in inputs if (defaults.get(n) is not None and m.matches(
        defaults[n], m.Name("None"))) or any(n in _names(i.test) for i in m.findall(
            block, m.If())) or any(n in _names(c) for c in m.findall(block, m.Call(
                func=m.OneOf(*(m.Name(u) for u in _STATIC_USES)))))]
    # the static inputs last, passed by keyword after the others (top_k=None read before
    # the key that the draw splits)
    inputs = [*(n for n in inputs if n not in static), *(n for n in inputs if n in static)]
    name = _fresh(f"{fn.name.value}_step", taken)

    body = [s.visit(_Unjit()).visit(_MaskSet()) for s in step]
    ret = ", ".join(outputs)
    names = ", ".join(f'"{n}"' for n in static) + ("," if len(static) == 1 else "")
    options = ["graph=False"] * tree + [f"static_argnames=({names})"] * bool(static)
    deco = f"nnx.jit({', '.join(options)})" if options else "nnx.jit"
    step_fn = cst.parse_statement(
        f"@{deco}\ndef {name}({', '.join(inputs)}):\n    pass\n    return {ret}\n")
    step_fn = step_fn.with_changes(body=step_fn.body.with_changes(
        body=[*(s.with_changes(leading_lines=[]) if i == 0 else s for i, s in enumerate(body)),
              step_fn.body.body[1]]), leading_lines=[cst.EmptyLine(indent=False)] * 2)
    args = ", ".join(f"{n}={n}" if n in static else n for n in inputs)
    call = cst.parse_statement(f"{ret} = {name}({args})\n").with_changes(
        leading_lines=stmts[first].leading_lines)
    new_loop = loop.with_changes(body=loop.body.with_changes(
        body=[*stmts[:first], call, *stmts[last + 1:]]))
    return fn.visit(_ReplaceNode(loop, new_loop)), step_fn


class _Unjit(cst.CSTTransformer):
    """``eval_step(model, x)`` -> ``model(x)``: inside a compiled function already."""

    def leave_Call(self, original, updated):
        if m.matches(updated.func, m.Name(EVAL_STEP)) and updated.args:
            return updated.with_changes(func=updated.args[0].value, args=updated.args[1:])
        return updated


# calls that need a concrete value: under a whole-function jit they would fail on a tracer
_HOST_CALLS = m.Call(func=m.Name("float") | m.Name("int") | m.Name("bool") | m.Name("print")
                     | m.Name("len") | m.Attribute(attr=m.OneOf(*(m.Name(n) for n in (
                         "item", "tolist", "numpy", "block_until_ready", "eval", "train",
                         "append", "extend")))))
_LITERALS = m.Integer() | m.Float() | m.Name("None") | m.Name("True") | m.Name("False") \
    | m.SimpleString() | m.UnaryOperation(expression=m.Integer() | m.Float())


_SHAPED = m.Call(func=m.Attribute(value=m.Name("jnp"), attr=m.OneOf(*(m.Name(f) for f in (
    "zeros", "ones", "full", "empty", "arange", "eye", "linspace", "broadcast_to"))))
    | m.Attribute(attr=m.Name("reshape")))


def _shape_names(node: cst.CSTNode) -> set[str]:
    """The names a shape is made of: in the arguments of ``jnp.zeros`` / ``ones`` / ``full``
    / ``arange`` / ... and ``.reshape`` (a traced value cannot be a shape), not those read
    as ``x.shape`` / ``x.dtype`` / ``x.ndim``."""
    found: set[str] = set()
    for call in m.findall(node, _SHAPED):
        for a in call.args:
            meta = {id(n.value) for n in m.findall(a.value, m.Attribute(
                value=m.Name(), attr=m.Name("shape") | m.Name("dtype") | m.Name("ndim")))}
            found |= {n.value for n in m.findall(a.value, m.Name()) if id(n) not in meta}
    return found


def _scan_route(fn: cst.FunctionDef, taken: set[str], method: bool = False
                ) -> tuple[cst.FunctionDef, str] | None:
    """A sampling function with a carried state compiled whole (issue 30)::

        def sample(model, start, n, temperature=1.0, *, key):
            h = jnp.zeros(...)                      # traceable set-up
            chars = []
            for _ in range(n):                      # the token loop, a static count
                logits, h = model(x, h)             # traceable: model call ... draw
                ...
                x = jax.random.categorical(...)
                chars.append(x)                     # lists collect per-token values
            return jnp.concatenate(chars, axis=1)   # traceable

    becomes one ``nnx.jit`` (tree mode) whose token loop is a ``jax.lax.scan`` of ``n``
    steps: the names the loop carries (assigned in it, set before it) and the model's state
    (split before the scan, merged in each step and carried, so a module that updates a
    Variable keeps its updates) are the carry; each list's appended values are the scan's
    outputs, put back into the list after the scan. The count, the parameters with a literal
    default and those read by an ``if`` or a shape function are static arguments. -> (the new
    function, a note), or None when the function is not of that shape, every statement
    traceable and no value taken to the host."""
    if fn.decorators or fn.asynchronous:
        return None
    plist = [*fn.params.params, *fn.params.kwonly_params]
    if isinstance(fn.params.star_arg, cst.Param) or fn.params.star_kwarg \
            or fn.params.posonly_params:
        return None
    params = [p.name.value for p in plist]
    models = {p for p in params if _MODEL_PARAM.search(p)}
    if method:  # a method of the model: ``self`` is the model, its draws ``self.rngs()``
        models = {params[0]} if params and not models else set()
    body = list(fn.body.body)
    loops = [i for i, s in enumerate(body) if isinstance(s, (cst.For, cst.While))]
    if len(models) != 1 or len(loops) != 1 or len(m.findall(fn, m.Return())) != 1 \
            or m.findall(fn.body, m.Yield() | m.Break() | m.Continue() | m.Global()
                         | m.Nonlocal() | m.Lambda() | m.With() | m.Try() | m.FunctionDef()
                         | m.ClassDef() | m.Del()):
        return None
    model = next(iter(models))
    at = loops[0]
    loop = body[at]
    if not (isinstance(loop, cst.For) and loop.orelse is None and _token_loop(loop, models)
            and isinstance(loop.target, cst.Name) and m.matches(loop.iter, m.Call(
                func=m.Name("range"), args=[m.Arg(keyword=None, star="")]))
            and (loop.target.value == "_" or loop.target.value not in _names(loop.body))
            and not m.findall(loop.body, m.For() | m.While() | m.FunctionDef())):
        return None
    before, after = body[:at], body[at + 1:]
    if not (after and m.matches(after[-1], m.SimpleStatementLine(body=[m.Return()]))
            and after[-1].body[0].value is not None):
        return None
    count = loop.iter.args[0].value
    local = _locals(fn)
    # lists: ``L = [...]`` before the loop, appended to in it and read only after it
    lists: list[str] = []
    for s in before:
        if m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())],
                                                             value=m.List())])):
            lists.append(s.body[0].targets[0].target.value)
    appends: dict[str, list[cst.BaseExpression]] = {}
    steps: list[cst.BaseStatement] = []
    for s in loop.body.body:
        if m.matches(s, m.SimpleStatementLine(body=[m.Expr(m.Call(
                func=m.Attribute(value=m.Name(), attr=m.Name("append")),
                args=[m.Arg(keyword=None, star="")]))])):
            name = s.body[0].value.func.value.value
            if name not in lists:
                return None
            appends.setdefault(name, []).append(s.body[0].value.args[0].value)
        else:
            steps.append(s)
    if not appends or any(len(v) != 1 for v in appends.values()):
        return None
    pure_return = [cst.SimpleStatementLine(body=[cst.Assign(
        targets=[cst.AssignTarget(cst.Name("_"))], value=after[-1].body[0].value)])]
    checked = [*(s for s in before if not (m.matches(s, m.SimpleStatementLine(
        body=[m.Assign(value=m.List())])))), *steps, *after[:-1], *pure_return]
    with_models = models | {EVAL_STEP}
    if not all(_pure(s, with_models, local) for s in checked) or any(
            m.findall(s, _HOST_CALLS) for s in checked):
        return None
    step_module = cst.Module(body=steps)
    if any(n in _names(step_module) for n in lists) or any(
            m.findall(s, m.Assign(value=m.List())) for s in [*steps, *after])\
            or (_assigned(step_module) | _assigned(cst.Module(body=after))) & (
                set(lists) | models):
        return None
    # static: the count, literal defaults, names in if tests and shape functions
    static = {n for n in _names(count) if n in params}
    static |= {p.name.value for p in plist if p.default is not None
               and m.matches(p.default, _LITERALS)}
    everything = cst.Module(body=body)
    for node in m.findall(everything, m.If() | m.IfExp() | m.Call(func=m.OneOf(
            *(m.Name(u) for u in _STATIC_USES)))):
        static |= _names(node.test if not isinstance(node, cst.Call) else node) & set(params)
    static |= _shape_names(everything) & set(params)
    if (static & models) or (_assigned(everything) & static):
        return None
    tests = [_names(i.test) for i in m.findall(everything, m.If() | m.IfExp())]
    if any(t & (local - static) for t in tests):
        return None
    # the carry: names the loop assigns that are set before it and read in it or after it
    set_before = (_assigned(cst.Module(body=before)) | set(params)) - set(lists)
    reads = _names(step_module) | _names(cst.Module(body=after)) | {
        n for v in appends.values() for e in v for n in _names(e)}
    carry = [n for n in dict.fromkeys(sorted(_assigned(step_module)))
             if n in set_before and n in reads and n != "_"]
    if set(carry) & static:
        return None
    for s in m.findall(cst.Module(body=before), m.Assign()):
        if _assigned(s) & set(carry) and (m.matches(s.value, m.Name("None") | m.Name("True")
                                                    | m.Name("False")) or not isinstance(
                s.value, (cst.Call, cst.Name, cst.Tuple, cst.BinaryOperation, cst.Subscript,
                          cst.Attribute, cst.Integer, cst.Float))):
            return None  # ``h = None`` and the like: no carry of one type through the scan
    if any(_assigned(i) & set(carry) for i in m.findall(cst.Module(body=before), m.If())):
        return None
    grows = m.Call(func=m.Attribute(value=m.Name("jnp"), attr=m.OneOf(*(m.Name(f) for f in (
        "concatenate", "append", "stack", "hstack", "vstack", "pad", "repeat", "tile")))))
    for a in m.findall(step_module, m.Assign()):
        if _assigned(a) & set(carry) and m.findall(a.value, grows):
            return None  # a carried value whose shape may change: no scan carry
    born = _assigned(step_module) - set_before
    if not carry or born & (_names(cst.Module(body=after)) - _assigned(cst.Module(body=after))):
        return None  # a value made in the loop read after it: the last iteration's
    name = fn.name.value
    graphdef, state, token = (_fresh(n, taken) for n in ("graphdef", "state", f"{name}_token"))
    outs = {n: _fresh(f"{n}_scanned", taken) for n in appends}
    # a list empty before the loop and read after it only as what jnp.concatenate / jnp.stack
    # joins is the scan's stacked output itself (their array form joins it in one reshape;
    # the list of its n rows was n slices and an n-way concatenation for XLA to compile)
    stacked = {n for n in outs if _joined_only(n, before, after)}
    before = [s for s in before if not (m.matches(s, m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(m.Name())], value=m.List(elements=[]))]))
        and s.body[0].targets[0].target.value in stacked)]
    code = cst.Module(body=[]).code_for_node
    ctuple = ", ".join(carry) + ("," if len(carry) == 1 else "")
    otuple = ", ".join(outs.values()) + ("," if len(outs) == 1 else "")
    ys = ", ".join(code(v[0]) for v in appends.values()) + ("," if len(outs) == 1 else "")
    stmt = cst.parse_statement
    inner = cst.parse_statement(
        f"def {token}(carry, _):\n"
        f"    ({ctuple}), {state} = carry\n"
        f"    {model} = nnx.merge({graphdef}, {state})\n"
        f"    pass\n"
        f"    return (({ctuple}), nnx.state({model})), ({ys})\n")
    work = [s.visit(_Unjit()).visit(_MaskSet()) for s in steps]
    work[0] = work[0].with_changes(leading_lines=[])
    inner = inner.with_changes(body=inner.body.with_changes(body=[
        *inner.body.body[:2], *work, inner.body.body[3]]),
        leading_lines=[cst.EmptyLine(indent=False)])
    n_code = code(count)
    tail = [stmt(f"{graphdef}, {state} = nnx.split({model})\n").with_changes(
                leading_lines=loop.leading_lines),
            inner,
            stmt(f"(({ctuple}), {state}), ({otuple}) = jax.lax.scan({token}, "
                 f"(({ctuple}), {state}), length={n_code})\n").with_changes(
                leading_lines=[cst.EmptyLine(indent=False)]),
            stmt(f"nnx.update({model}, {state})\n"),
            *(stmt(f"{lst} = {out}\n" if lst in stacked else f"{lst}.extend({out})\n")
              for lst, out in outs.items())]
    names = ", ".join(f'"{n}"' for n in sorted(static)) + ("," if len(static) == 1 else "")
    deco = "nnx.jit(graph=False" + (f", static_argnames=({names}))" if static else ")")
    new = fn.with_changes(decorators=[cst.Decorator(cst.parse_expression(deco))],
                          body=fn.body.with_changes(body=[*before, *tail, *after]))
    note = (f"{name}(): one nnx.jit whose token loop is a jax.lax.scan of {n_code} steps "
            f"carrying {', '.join(carry)} and the model's state (compiled once per value of "
            f"its static arguments: {', '.join(sorted(static)) or 'none'})")
    return new, note


def _joined_only(lst: str, before: list[cst.BaseStatement],
                 after: list[cst.BaseStatement]) -> bool:
    """Whether the list ``lst`` is made empty before the loop (``lst = []``, once) and read
    after it only as the first argument of ``jnp.concatenate`` / ``jnp.stack``."""
    made = [s for s in before if lst in _assigned(cst.Module(body=[s]))]
    if len(made) != 1 or not m.matches(made[0], m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(m.Name(lst))], value=m.List(elements=[]))])):
        return False
    tail = cst.Module(body=after)
    if lst in _assigned(tail):
        return False
    joins = m.findall(tail, m.Call(
        func=m.Attribute(value=m.Name("jnp"), attr=m.Name("concatenate") | m.Name("stack")),
        args=[m.Arg(value=m.Name(lst), keyword=None, star=""), m.ZeroOrMore()]))
    reads = m.findall(tail, m.Name(lst))
    return bool(joins) and len(reads) == len(joins)


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        super().__init__()
        self.old, self.new = old, new

    def on_leave(self, original, updated):
        return self.new if original is self.old else updated


def compile_generation(module: cst.Module, source: cst.Module, source_text: str,
                       report: Callable[[int, int, str, str, str], None],
                       tree_mode: bool = False, imports: set[str] | None = None) -> cst.Module:
    """Compile the file's generation loops (module docstring); ``report(line, column, rule,
    severity, message)`` gets one diagnostic per loop. ``tree_mode``: no module shares a
    Variable, so the token steps take flax's tree mode (``passes/training.py``'s
    ``nnx_jit``). ``imports``: where given, the window loops of a compiled generate() call
    ``partial``, and "partial" is added to it (``convert.IMPORT_LINES``); without it, or
    when the torch file binds ``partial`` otherwise than from functools, the loop runs on
    the full window from its first token."""
    compiled_names: set[str] = set()
    needs_eval_step: list[bool] = []
    taken = _names(module) | _names(source)
    taken.add("tree mode" if tree_mode else "graph mode")
    if imports is not None and ("partial" not in _names(source) or m.findall(
            source, m.ImportFrom(module=m.Name("functools"), names=[m.ImportAlias(
                name=m.Name("partial"), asname=None)]))):
        taken.add("window loops")
    module = _compile_in(module, source, source_text, report, compiled_names,
                         needs_eval_step, taken, None)
    if needs_eval_step and not any(
            isinstance(n, cst.FunctionDef) and n.name.value == EVAL_STEP for n in module.body):
        body = list(module.body)
        i = next((i for i, n in enumerate(body)
                  if isinstance(n, (cst.FunctionDef, cst.ClassDef))), len(body))
        body.insert(i, eval_step_function())
        module = module.with_changes(body=body)
    if imports is not None and m.findall(module, m.Call(
            func=m.Attribute(attr=m.Name("fori_loop")),
            args=[m.DoNotCare(), m.DoNotCare(), m.Arg(m.Call(func=m.Name("partial"))),
                  m.DoNotCare()])):
        imports.add("partial")
    if compiled_names:  # a generate() whose model's attention allows a cache
        module = cache_decoding(module, source, taken)
    return module.visit(_BlockDiscarded(compiled_names)) if compiled_names else module


def _compile_in(module: cst.Module, source: cst.Module, source_text: str,
                report: Callable[[int, int, str, str, str], None], compiled_names: set[str],
                needs_eval_step: list[bool], taken: set[str],
                hoist: list[cst.FunctionDef] | None) -> cst.Module:
    """The generation loops of ``module``'s functions, or of a class's methods when ``hoist``
    is a list (the compiled token steps of methods go there, to be written before the
    class)."""
    method = hoist is not None
    causal = None
    body = list(module.body)
    changed = False
    before: dict[int, list[cst.FunctionDef]] = {}
    for i, node in enumerate(body):
        if isinstance(node, cst.ClassDef):
            if not any(m.findall(b.value, m.Name("Module") | m.Attribute(attr=m.Name("Module")))
                       for b in node.bases):
                continue
            methods = [n for n in node.body.body if isinstance(n, cst.FunctionDef)]
            mod = cst.Module(body=methods)
            steps: list[cst.FunctionDef] = []
            inner = _compile_in(mod, source, source_text, report, compiled_names,
                                needs_eval_step, taken, steps)
            before[i] = steps
            if inner is not mod:
                done = dict(zip(map(id, methods), inner.body))
                body[i] = node.with_changes(body=node.body.with_changes(body=[
                    done.get(id(n), n) for n in node.body.body]))
                changed = True
            continue
        if not isinstance(node, cst.FunctionDef):
            continue
        match = re.search(rf"^[ \t]*def {re.escape(node.name.value)}\b", source_text, re.MULTILINE)
        line = source_text[:match.start()].count("\n") + 1 if match else 1
        name = node.name.value
        windows = "window loops" in taken
        compiled = _compile(node, windows=windows)
        if compiled is not None:
            if causal is None:
                causal = is_causal(source)
            if causal and not reads_last_position(source, name):
                body[i] = compiled
                compiled_names.add("." * method + name)
                changed = True
                report(line, 0, "generation", "info",
                       f"{name}(): the token loop is one compiled decode step over a "
                       f"fixed-size buffer (one compile per prompt shape and length)")
                continue
            # (flax's graph mode, modules sharing a Variable: the compiled generate() was
            # seen to compile again for the same shapes on the corpus GPT, so not there)
            forward = (_last_position_forward if method else _model_class_forward)(
                module.with_changes(body=body), source, name, taken) \
                if causal and "tree mode" in taken else None
            compiled = _compile(node, forward[2], windows) if forward else None
            if compiled is not None:
                body[i], body[forward[0]] = compiled, forward[1]
                compiled_names.add("." * method + name)
                changed = True
                report(line, 0, "generation", "info",
                       f"{name}(): the token loop is one compiled decode step over a "
                       f"fixed-size buffer (one compile per prompt shape and length); the "
                       f"forward computes the last position only, so it is given the "
                       f"position to compute ({forward[2]}=)")
                continue
        if compiled is None and not _draws(node):
            continue  # the routes below all need a token loop, which draws (_token_loop)
        if "tree mode" not in taken:
            # modules share a Variable (tied weights): flax's graph mode, in which a jitted
            # step was seen to compile again for the same shapes on nanoGPT's model
            if compiled is not None or _jit_forward(node, method)[1]:
                report(line, 0, "generation", "warning",
                       f"{name}(): the token loop stays eager (a compile per sequence length "
                       f"and op): modules share a Variable, and a step jitted in flax's graph "
                       f"mode compiled again for the same shapes")
            continue
        scanned = _scan_route(node, taken, method)
        if scanned is not None:
            body[i] = scanned[0]
            if not method:  # (a method's discarded calls are not matched by name)
                compiled_names.add(name)
            changed = True
            report(line, 0, "generation", "info", scanned[1])
            continue
        routed = _step_route(node, method, taken, True)
        jitted, count = _jit_forward(node, method) if routed is None else (routed[0], 1)
        if not count:
            continue
        if compiled is None:  # no growing sequence the buffer route knows
            why = "one compile per distinct input shape, then cached"
        else:
            why = "one compile per distinct sequence length, then cached: " + (
                "the model reads only the last position at inference, so a padded buffer "
                "would read the padding" if causal else "the model is not known to be "
                "causal, so a padded buffer could change the logits")
        if routed is not None:
            (hoist if hoist is not None else before.setdefault(i, [])).append(routed[1])
            report(line, 0, "generation", "info",
                   f"{name}(): each token's model call and draw are one jit-compiled step, "
                   f"{routed[1].name.value}() ({why})")
        else:
            report(line, 0, "generation", "info",
                   f"{name}(): each token's forward is the jit-compiled {EVAL_STEP} ({why})")
        if jitted is not node:
            body[i] = jitted
            changed = True
            needs_eval_step.extend([True] * (routed is None))
    if not changed:
        return module
    return module.with_changes(body=[x for i, node in enumerate(body)
                                     for x in (*before.get(i, ()), node)])


class _BlockDiscarded(cst.CSTTransformer):
    """``generate(model, idx, n)`` (or ``model.generate(idx, n)``, a compiled method) as a
    statement (a warm-up whose result is dropped): ``jax.block_until_ready(generate(...))``. torch's loop has finished when the call
    returns; the compiled one is dispatched asynchronously, so without the wait its work
    would run into whatever the script does next, a timer read included."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr) -> cst.Expr:
        value = updated.value
        func = value.func if isinstance(value, cst.Call) else None
        # generate(...), or model.generate(...) of a compiled method (".generate")
        if isinstance(func, cst.Name) and func.value in self.names or isinstance(
                func, cst.Attribute) and "." + func.attr.value in self.names:
            return updated.with_changes(value=cst.Call(
                func=cst.parse_expression("jax.block_until_ready"), args=[cst.Arg(value)]))
        return updated
