"""A compiled ``generate()`` that decodes with a key/value cache (issue 30).

``passes/generation.py`` compiles nanoGPT's ``generate()`` into one ``nnx.jit`` whose steps
run the model on a window of the sequence (8, 16, 32, ... positions while the context grows,
then ``block_size``), recomputing every position of it for each token. Where
``analysis/kv_cache.py`` proves the model's one cross-position operation a causal
self-attention, and positions an ``arange`` into an embedding, this pass rewrites three places
of the NNX translation:

* the attention: ``__init__`` holds ``cached_key``, ``cached_value`` and ``cache_index``
  (``None`` outside decoding); while ``cache_index`` is set, ``__call__`` writes the call's
  keys and values into the cache at the index (allocated by the prompt's call) and attends to
  the whole cache. With a ``tril`` mask buffer the cache has the buffer's ``block_size``
  positions and the mask's rows of the call's positions are read; with
  ``scaled_dot_product_attention(..., is_causal=True)`` (``jax.nn.dot_product_attention``,
  whose causal mask is aligned to the first key) the cache has ``cache_size`` positions, set
  by ``generate()`` (its output's length, at most the block), and the mask is explicit (a
  query at position ``index + i`` sees the keys up to it);
* the model's forward: a keyword ``start_position=0`` added to the positions' ``arange``;
* ``generate()``, a method of the model or a function ``generate(model, idx, ...)`` (then
  only for an instance of the model's class): while the context fits in ``block_size``, the
  prompt runs once (its keys and values cached), then each token runs the model on the last
  token alone (``nnx.fori_loop``, the model in the carry since its cache changes); past
  ``block_size`` the window slides, every position moves, and the steps run on the full
  window as before. A forward computing every position, read by the window route at
  ``logits[:, t - 1 - start]``, is read at its one position in a cached step. The cache is
  dropped at the end, so the model's structure is the same after the call (one compile).

Anything else keeps the window route: another read of the logits, another spelling of the
attention's call, or any name the rewrite needs already taken.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.kv_cache import cacheable_attention

_NAMES = ("cached_key", "cached_value", "cache_index", "cache_size", "start_position",
          "cached_step",
          "attentions", "cached", "layer")
_STMT = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    if hasattr(node, "leading_lines"):
        node = node.with_changes(leading_lines=[])
    return _STMT.code_for_node(node).strip()


def _stmts(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(code).body)


def _class(module: cst.Module, name: str) -> tuple[int, cst.ClassDef] | None:
    found = [(i, n) for i, n in enumerate(module.body)
             if isinstance(n, cst.ClassDef) and n.name.value == name]
    return found[0] if len(found) == 1 else None


def _method(cls: cst.ClassDef, name: str) -> tuple[int, cst.FunctionDef] | None:
    found = [(i, n) for i, n in enumerate(cls.body.body)
             if isinstance(n, cst.FunctionDef) and n.name.value == name]
    return found[0] if len(found) == 1 else None


def _with_method(cls: cst.ClassDef, index: int, fn: cst.BaseStatement) -> cst.ClassDef:
    body = list(cls.body.body)
    body[index] = fn
    return cls.with_changes(body=cls.body.with_changes(body=body))


def _attention(cls: cst.ClassDef, mask: str) -> cst.ClassDef | None:
    """The attention class with the cache (module docstring)."""
    init, call = _method(cls, "__init__"), _method(cls, "__call__")
    if init is None or call is None:
        return None
    if re.search(r"(?<![\w.])(mask|index|shape)\b", _code(call[1])):
        return None  # (the locals the cache's lines bind; not an attribute such as x.shape)
    body = list(call[1].body.body)
    masks = m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.Name(mask)),
                        slice=[m.SubscriptElement(m.Slice(lower=None, upper=None))] * 2
                        + [m.SubscriptElement(m.Slice(lower=None, upper=m.Name()))] * 2)
    reads = m.findall(call[1], masks)
    matmuls = m.findall(call[1], m.BinaryOperation(operator=m.MatrixMultiply()))
    if len(reads) != 1 or len(matmuls) != 2:
        return None
    time = reads[0].slice[2].slice.upper.value
    keys = [mm.right.args[0].value.value for mm in matmuls if m.matches(mm.right, m.Call(
        func=m.Attribute(value=m.Name("jnp"), attr=m.Name("swapaxes")),
        args=[m.Arg(m.Name()), m.Arg(m.UnaryOperation(m.Minus(), m.Integer("2"))),
              m.Arg(m.UnaryOperation(m.Minus(), m.Integer("1")))]))]
    values = [mm.right.value for mm in matmuls if isinstance(mm.right, cst.Name)]
    if len(keys) != 1 or len(values) != 1:
        return None
    k, v = keys[0], values[0]
    first = next(i for i, s in enumerate(body) if m.findall(s, m.BinaryOperation(
        operator=m.MatrixMultiply())))
    later = body[first:]
    if any(m.findall(s, m.AssignTarget(m.Name(k) | m.Name(v))) for s in later):
        return None  # keys or values written after the scores: not the shape known here
    block = _stmts(
        f"mask = self.{mask}[:, :, :{time}, :{time}]\n"
        f"if self.cache_index is not None:\n"
        f"    # decoding (generate()): this call's keys and values written into the cache at\n"
        f"    # the index; its queries attend to every position written so far\n"
        f"    index = self.cache_index[...]\n"
        f"    if self.cached_key is None:  # the prompt's call: a cache of block_size positions\n"
        f"        shape = (*{k}.shape[:-2], self.{mask}.shape[-1], {k}.shape[-1])\n"
        f"        self.cached_key = nnx.Cache(jnp.zeros(shape, {k}.dtype))\n"
        f"        self.cached_value = nnx.Cache(jnp.zeros(shape, {v}.dtype))\n"
        f"    {k} = jax.lax.dynamic_update_slice_in_dim(self.cached_key[...], {k}, index, axis=-2)\n"
        f"    {v} = jax.lax.dynamic_update_slice_in_dim(self.cached_value[...], {v}, index, axis=-2)\n"
        f"    self.cached_key[...], self.cached_value[...] = {k}, {v}\n"
        f"    self.cache_index[...] = index + {time}\n"
        f"    mask = jax.lax.dynamic_slice_in_dim(self.{mask}[...], index, {time}, axis=-2)\n")

    class _Mask(cst.CSTTransformer):
        def leave_Subscript(self, original, updated):
            return cst.Name("mask") if m.matches(original, masks) else updated

    forward = call[1].with_changes(body=call[1].body.with_changes(
        body=[*body[:first], *block, *(s.visit(_Mask()) for s in later)]))
    init_fn = init[1].with_changes(body=init[1].body.with_changes(body=[
        *init[1].body.body, *_stmts(
            "# while generate() decodes: the keys and values of the positions so far, the next\n"
            "# position's index\n"
            "self.cached_key, self.cached_value = nnx.data(None), nnx.data(None)\n"
            "self.cache_index = nnx.data(None)\n")]))
    return _with_method(_with_method(cls, init[0], init_fn), call[0], forward)


def _swapped() -> m.Arg:
    return m.Arg(m.Call(func=m.Attribute(value=m.Name("jnp"), attr=m.Name("swapaxes")), args=[
        m.Arg(m.Name()), m.Arg(m.UnaryOperation(m.Minus(), m.Integer("3"))),
        m.Arg(m.UnaryOperation(m.Minus(), m.Integer("2")))]), keyword=None)


def _causal_attention(cls: cst.ClassDef) -> cst.ClassDef | None:
    """The attention class of ``scaled_dot_product_attention(..., is_causal=True)`` (emitted
    as ``jax.nn.dot_product_attention`` over (batch, length, heads, dim)) with the cache: as
    ``_attention``'s, of ``cache_size`` positions (set by generate()), and while decoding an
    explicit mask instead of ``is_causal`` (whose mask is aligned to the first key, not to
    the query's position in the cache)."""
    init, call = _method(cls, "__init__"), _method(cls, "__call__")
    if init is None or call is None:
        return None
    if re.search(r"(?<![\w.])(mask|index|shape)\b", _code(call[1])):
        return None
    attention = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("nn")),
                                        attr=m.Name("dot_product_attention")))
    found = m.findall(call[1], attention)
    if len(found) != 1 or len(found[0].args) < 4 or not all(
            m.matches(a, _swapped()) for a in found[0].args[:3]):
        return None
    sdpa = found[0]
    keywords = {a.keyword.value: a for a in sdpa.args[3:] if a.keyword is not None}
    if len(keywords) != len(sdpa.args) - 3 or not set(keywords) <= {"is_causal", "scale"} or \
            not m.matches(keywords.get("is_causal"), m.Arg(m.Name("True"))):
        return None
    q, k, v = (a.value.args[0].value.value for a in sdpa.args[:3])
    body = list(call[1].body.body)
    first = next(i for i, s in enumerate(body) if m.findall(s, attention))
    if any(m.findall(s, m.AssignTarget(m.Name(k) | m.Name(v) | m.Name(q)))
           for s in body[first:]) or not isinstance(body[first], cst.SimpleStatementLine):
        return None
    block = _stmts(
        f"mask = None\n"
        f"if self.cache_index is not None:\n"
        f"    # decoding (generate()): this call's keys and values written into the cache at\n"
        f"    # the index; its queries attend to the positions written up to their own\n"
        f"    index = self.cache_index[...]\n"
        f"    if self.cached_key is None:  # the prompt's call: a cache of cache_size positions\n"
        f"        shape = (*{k}.shape[:-2], self.cache_size, {k}.shape[-1])\n"
        f"        self.cached_key = nnx.Cache(jnp.zeros(shape, {k}.dtype))\n"
        f"        self.cached_value = nnx.Cache(jnp.zeros(shape, {v}.dtype))\n"
        f"    {k} = jax.lax.dynamic_update_slice_in_dim(self.cached_key[...], {k}, index, axis=-2)\n"
        f"    {v} = jax.lax.dynamic_update_slice_in_dim(self.cached_value[...], {v}, index, axis=-2)\n"
        f"    self.cached_key[...], self.cached_value[...] = {k}, {v}\n"
        f"    self.cache_index[...] = index + {q}.shape[-2]\n"
        f"    mask = jnp.arange({k}.shape[-2]) <= index + jnp.arange({q}.shape[-2])[:, None]\n")
    causal = keywords["is_causal"]
    # (is_causal keeps the layout of an argument followed by another: the comma before it)
    before = sdpa.args[list(sdpa.args).index(causal) - 1].comma
    comma = causal.comma if causal is not sdpa.args[-1] else before
    args = []
    for a in sdpa.args:
        args += [a] if a is not causal else [
            a.with_changes(value=cst.parse_expression("mask is None"), comma=comma),
            a.with_changes(keyword=cst.Name("mask"), value=cst.Name("mask"))]
    new = sdpa.with_changes(args=args)
    forward = call[1].with_changes(body=call[1].body.with_changes(
        body=[*body[:first], *block, body[first].visit(_ReplaceNode(sdpa, new)),
              *body[first + 1:]]))
    init_fn = init[1].with_changes(body=init[1].body.with_changes(body=[
        *init[1].body.body, *_stmts(
            "# while generate() decodes: the keys and values of the positions so far, the next\n"
            "# position's index, the positions the cache holds\n"
            "self.cached_key, self.cached_value = nnx.data(None), nnx.data(None)\n"
            "self.cache_index, self.cache_size = nnx.data(None), None\n")]))
    return _with_method(_with_method(cls, init[0], init_fn), call[0], forward)


def _positions(cls: cst.ClassDef) -> cst.ClassDef | None:
    """The model's forward with ``start_position=0`` added to its positions."""
    call = _method(cls, "__call__")
    if call is None:
        return None
    aranges = m.findall(call[1], m.Assign(value=m.Call(func=m.Attribute(
        value=m.Name("jnp"), attr=m.Name("arange")))))
    if len(aranges) != 1:
        return None
    target = aranges[0]

    class _Shift(cst.CSTTransformer):
        def leave_Assign(self, original, updated):
            if original is not target:
                return updated
            return updated.with_changes(value=cst.parse_expression(
                f"start_position + {_code(updated.value)}"))

    params = call[1].params
    star = params.star_arg if isinstance(params.star_arg, cst.Param) else cst.ParamStar()
    eq = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    params = params.with_changes(star_arg=star, kwonly_params=[
        *params.kwonly_params, cst.Param(cst.Name("start_position"), default=cst.Integer("0"),
                                         equal=eq)])
    return _with_method(cls, call[0], call[1].visit(_Shift()).with_changes(params=params))


_LOOPS = re.compile(r"(\w+), (\w+), (\w+) = \(([\w, ]+)\), (\w+), 8")
_LAST = re.compile(r"([\w, ]+) = jax\.lax\.fori_loop\((\w+), (.+), partial\((\w+), (\w+)=(\w+)\), "
                   r"(\w+)\)")
_WIDTH = re.compile(r"(\w+) = min\((.+), (.+)\)")


def _generate(fn: cst.FunctionDef, attention: str, model_class: str | None = None,
              sized: bool = False) -> cst.FunctionDef | None:
    """The compiled ``generate()`` with the cached route (module docstring): a method of the
    model (``model_class`` None), or a function whose first parameter is the model (the
    cached route then taken only for an instance of ``model_class``). ``sized``: the attention
    takes its cache's length from generate() (``cache_size``: the final length, at most the
    block)."""
    body = list(fn.body.body)
    codes = [_code(s) for s in body]
    starts = [i for i, c in enumerate(codes) if _LOOPS.fullmatch(c)]
    ends = [i for i, c in enumerate(codes) if _LAST.fullmatch(c)]
    widths = [_WIDTH.fullmatch(c) for c in codes if _WIDTH.fullmatch(c)]
    steps = [(i, s) for i, s in enumerate(body) if isinstance(s, cst.FunctionDef)]
    if len(starts) != 1 or len(ends) != 1 or len(widths) != 1 or len(steps) != 1 \
            or not starts[0] < ends[0] or not fn.params.params:
        return None
    state, lo, window, carry, t0 = _LOOPS.fullmatch(codes[starts[0]]).groups()
    _, _, total, step, _, width, _ = _LAST.fullmatch(codes[ends[0]]).groups()
    if widths[0].group(1) != width or widths[0].group(3) != total:
        return None
    block = widths[0].group(2)
    index, decode = steps[0]
    if decode.name.value != step or [p.name.value for p in decode.params.params] != [
            decode.params.params[0].name.value, "carry", window]:
        return None
    t = decode.params.params[0].name.value
    owner = fn.params.params[0].name.value  # self, or the function's model
    model = "model" if model_class is None else owner  # the step's model parameter
    if model_class is not None and (owner in ("self", "cached", "carry", t, window)
                                    or owner in _names(decode.params)):
        return None
    inner = list(decode.body.body)
    calls = [i for i, s in enumerate(inner) if m.matches(s, m.SimpleStatementLine(body=[
        m.Assign(value=m.Call(func=m.Name(owner), args=[m.Arg(keyword=None), m.ZeroOrMore(
            m.Arg(keyword=m.Name()))]))]))]
    if len(calls) != 1 or calls[0] < 1 or not m.matches(inner[calls[0] - 1], m.SimpleStatementLine(
            body=[m.Assign(targets=[m.AssignTarget(m.Name())], value=m.Call(func=m.Attribute(
                attr=m.Name("dynamic_slice_in_dim"))))])):
        return None
    j = calls[0]
    window_read, call_stmt = inner[j - 1], inner[j]
    seq = _code(window_read.body[0].value.args[0].value)
    target = _code(call_stmt.body[0].targets[0].target)
    keywords = {a.keyword.value for a in call_stmt.body[0].value.args if a.keyword is not None}
    if keywords == {"last_position"}:
        # the last-position route: the read after the call is ``logits[:, -1, :]``, so it
        # holds for the one position of a cached step too
        reads: list[cst.BaseStatement] = []
    elif not keywords and j + 1 < len(inner):
        # a forward computing every position of the window, read at the window's position of
        # ``t - 1``: a cached step computes one position, its last
        read = _window_read(inner[j + 1], call_stmt.body[0].targets[0].target,
                            f"{t} - 1 - {_code(window_read.body[0].value.args[1].value)}")
        if read is None:
            return None
        reads = [inner[j + 1]]
        j += 1
    else:
        return None
    model_call = call_stmt.visit(_Rename(owner, model))
    branch = _stmts(
        f"if cached:  # the last token alone: the earlier positions' keys and values are cached\n"
        f"    {target} = {model}(jax.lax.dynamic_slice_in_dim({seq}, {t} - 1, 1, axis=1), "
        f"start_position={t} - 1)\n"
        f"else:\n"
        f"    pass\n")[0]
    branch = branch.with_changes(
        body=branch.body.with_changes(body=[*branch.body.body, *([read] if reads else [])]),
        orelse=branch.orelse.with_changes(body=branch.orelse.body.with_changes(
            body=[window_read, model_call, *reads])))
    eq = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    decode = decode.with_changes(
        params=decode.params.with_changes(params=[
            *decode.params.params,
            cst.Param(cst.Name(model), default=cst.Name(owner), equal=eq),
            cst.Param(cst.Name("cached"), default=cst.Name("False"), equal=eq)]),
        body=decode.body.with_changes(body=[*inner[:j - 1 - len(reads)], branch, *inner[j + 1:]]))
    instance = "" if model_class is None else f" and isinstance({owner}, {model_class})"
    tail = _stmts(
        f"{state}, {lo} = ({carry}), {t0}\n"
        f"if {t0} < {width}{instance}:\n"
        f"    # while the context fits in the block, a key/value cache: the prompt runs once,\n"
        f"    # then each token runs the model on the last token alone (the model in the\n"
        f"    # carry: its cache changes)\n"
        f"    attentions = [layer for _, layer in nnx.iter_modules({owner}) if isinstance(layer, "
        f"{attention})]\n"
        f"    for layer in attentions:\n"
        f"        layer.cache_index = nnx.Cache(jnp.int32(0))\n"
        + (f"        layer.cache_size = {width}\n" if sized else "") +
        f"    {state} = {step}({t0}, {state}, {window}={t0})\n"
        f"\n"
        f"    def cached_step({t}, carry):\n"
        f"        {model}, {state} = carry\n"
        f"        return {model}, {step}({t}, {state}, {window}=1, {model}={model}, cached=True)\n"
        f"\n"
        f"    {lo} = min({block}, {total} - 1) + 1\n"
        f"    _, {state} = nnx.fori_loop({t0} + 1, {lo}, cached_step, ({owner}, {state}))\n"
        f"    for layer in attentions:  # the model's structure as before the call\n"
        f"        layer.cache_index = layer.cached_key = layer.cached_value = None\n"
        + ("        layer.cache_size = None\n" if sized else "") +
        f"# past the block the window slides (every position moves): the full window per token\n"
        f"{carry} = jax.lax.fori_loop({lo}, {total}, partial({step}, {window}={width}), "
        f"{state})\n")
    tail[0] = tail[0].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    body[index] = decode
    body = [*body[:starts[0]], *tail, *body[ends[0] + 1:]]
    return fn.with_changes(body=fn.body.with_changes(body=body))


def _window_read(stmt: cst.BaseStatement, target: cst.BaseExpression, position: str
                 ) -> cst.BaseStatement | None:
    """``stmt`` with its read of the model's logits at the window's ``position`` made a read
    of the last position (``logits[:, -1, :]``); None unless ``stmt`` reassigns the logits,
    reading them once, there."""
    logits = target.elements[0].value if isinstance(target, cst.Tuple) else target
    if not isinstance(logits, cst.Name) or not m.matches(stmt, m.SimpleStatementLine(body=[
            m.Assign(targets=[m.AssignTarget(m.Name(logits.value))])])):
        return None
    value = stmt.body[0].value
    reads = m.findall(value, m.Subscript(value=m.Name(logits.value), slice=[
        m.SubscriptElement(m.Slice(lower=None, upper=None, step=None)),
        m.SubscriptElement(m.Index()), m.ZeroOrMore(m.SubscriptElement(m.Slice(
            lower=None, upper=None, step=None)))]))
    if len(reads) != 1 or len(m.findall(value, m.Name(logits.value))) != 1 \
            or _code(reads[0].slice[1].slice.value) != position:
        return None
    last = reads[0].slice[1].with_changes(slice=cst.Index(cst.parse_expression("-1")))
    new = reads[0].with_changes(slice=[reads[0].slice[0], last, *reads[0].slice[2:]])
    return stmt.visit(_ReplaceNode(reads[0], new))


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        self.old, self.new = old, new

    def on_leave(self, original, updated):
        return self.new if original is self.old else updated


class _Rename(cst.CSTTransformer):
    """Calls of ``old`` made calls of ``new``."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_Call(self, original, updated):
        if m.matches(updated.func, m.Name(self.old)):
            return updated.with_changes(func=cst.Name(self.new))
        return updated


def _names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in m.findall(node, m.Name())}


def cache_decoding(module: cst.Module, source: cst.Module, taken: set[str]) -> cst.Module:
    """``module`` with its compiled ``generate()`` decoding through a key/value cache, where
    the torch file ``source`` is proven to allow one (module docstring); else ``module``."""
    proof = cacheable_attention(source)
    if proof is None or not proof.model \
            or not proof.position_embedding or taken & set(_NAMES):
        return module
    found_model, found_attention = _class(module, proof.model), _class(module, proof.attention)
    if found_model is None or found_attention is None:
        return module
    (mi, model), (ai, attention) = found_model, found_attention
    methods = [(i, f) for i, f in enumerate(model.body.body) if isinstance(f, cst.FunctionDef)
               and any(_LOOPS.fullmatch(_code(s)) for s in f.body.body)]
    functions = [(i, f) for i, f in enumerate(module.body) if isinstance(f, cst.FunctionDef)
                 and any(_LOOPS.fullmatch(_code(s)) for s in f.body.body)]
    if len(methods) + len(functions) != 1:
        return module
    sized = proof.mask == "is_causal"
    new_attention = _causal_attention(attention) if sized else _attention(attention, proof.mask)
    new_model = _positions(model)
    if methods:
        new_generate = _generate(methods[0][1], proof.attention, sized=sized)
    else:
        new_generate = _generate(functions[0][1], proof.attention, proof.model, sized)
    if new_attention is None or new_model is None or new_generate is None:
        return module
    body = list(module.body)
    if methods:
        new_model = _with_method(new_model, methods[0][0], new_generate)
    else:
        body[functions[0][0]] = new_generate
    body[mi], body[ai] = new_model, new_attention
    return module.with_changes(body=body)
