"""Transforms for the sequence layers of ``rules/sequence.toml``: attention and recurrent.

Constructors are ``@special`` transforms (a :class:`~torch2jax.passes.special.Site`); the calls
of these layers differ from the JAX modules' (torch's MultiheadAttention takes (L, N, E) inputs
and returns ``(output, weights)``, an LSTM returns ``(output, (h_n, c_n))``), so each also has a
``@call_transform`` (a :class:`~torch2jax.passes.calls.CallSite`). What each reproduces, and
what it refuses, is in the rules' notes; ``tests/test_attention_rnn.py`` checks the weight
transfers and the numbers against torch.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes import calls
from torch2jax.passes.calls import CallSite, call_transform
from torch2jax.passes.common import Untranslatable, arg, call, code, expr, is_simple, py
from torch2jax.passes.registry import Site, special


def _required(site: Site, name: str) -> cst.BaseExpression:
    node = site.get(name)
    if node is None:
        raise Untranslatable(f"{site.rule.torch} without {name}")
    return node


def _given(site: Site, name: str) -> cst.BaseExpression | None:
    """The argument, or None when absent or a literal None."""
    node = site.get(name)
    return None if node is None or (isinstance(node, cst.Name) and node.value == "None") \
        else node


def _flag_calls(site: Site, returns: str, takes: str) -> None:
    if not calls.ENGINE_TRANSLATES_CALLS:
        site.note(f"the calls of this layer are not translated yet: torch's {returns}; "
                  f"{site.rule.targets[site.target]} {takes} (torch2jax explain "
                  f"{site.rule.torch})", "error")


def _simple(node: cst.BaseExpression, what: str) -> str:
    if not is_simple(node):
        raise Untranslatable(f"{what} is a compound expression used more than once in the "
                             "translation: assign it to a name first")
    return code(node)


# --------------------------------------------------------------------------------------------
# MultiheadAttention
# --------------------------------------------------------------------------------------------


@special("multihead_attention")
def multihead_attention(site: Site) -> cst.BaseExpression:
    """``nn.MultiheadAttention(E, H, ...)`` -> ``nnx.MultiHeadAttention(num_heads=H,
    in_features=E, ..., decode=False)``: q/k/v/out projections with torch's shapes, dropout on
    the attention probabilities, unbroadcast like torch's."""
    for name in ("add_bias_kv", "add_zero_attn"):
        if site.lit(name) is not False:
            raise Untranslatable(f"MultiheadAttention({name}=True): nnx.MultiHeadAttention has "
                                 "no learned key/value bias row nor zero-attention row")
    embed, heads = _required(site, "embed_dim"), _required(site, "num_heads")
    kdim, vdim = _given(site, "kdim"), _given(site, "vdim")
    if (kdim is None) != (vdim is None) or (kdim is not None and code(kdim) != code(vdim)):
        raise Untranslatable("MultiheadAttention with kdim != vdim: nnx.MultiHeadAttention's "
                             "key and value projections share in_kv_features")
    out = [arg(heads, "num_heads"), arg(embed, "in_features")]
    if kdim is not None:
        out.append(arg(kdim, "in_kv_features"))
    dropout = site.get("dropout")
    if dropout is not None and site.lit("dropout") not in (0, 0.0):
        # torch drops each attention probability independently: no broadcast over the batch
        out += [arg(dropout, "dropout_rate"), arg(py(False), "broadcast_dropout")]
    if site.lit("bias") is not True:
        out.append(arg(site.get("bias") or py(False), "use_bias"))
    out.append(arg(py(False), "decode"))
    _flag_calls(site, "forward(query, key, value, ...) takes (L, N, E) inputs unless "
                "batch_first=True and returns (output, attention weights)",
                "takes batch-first inputs, a mask with the opposite polarity, and returns the "
                "output alone")
    return call(site.rule.targets[site.target], *out, *site.rngs_arg())


@call_transform("multihead_attention")
def multihead_attention_call(cs: CallSite) -> cst.BaseExpression:
    """``self.attn(q, k, v, key_padding_mask=, need_weights=, attn_mask=)`` ->
    ``(jnp.moveaxis(self.attn(jnp.moveaxis(q, 0, -2), ..., mask=...), -2, 0), None)``."""
    func = code(cs.func)
    q, k, v = cs.args.get("query"), cs.args.get("key"), cs.args.get("value")
    if q is None or k is None or v is None:
        raise Untranslatable("MultiheadAttention called without query, key and value")
    batch_first = cs.ctor_lit("batch_first")
    if batch_first not in (True, False, None):
        raise Untranslatable("MultiheadAttention with a non-literal batch_first: the call's "
                             "axes are rearranged by it")
    need = cs.lit("need_weights")
    if need is ...:
        raise Untranslatable("MultiheadAttention called with a non-literal need_weights")
    if need is not False and not cs.unused(1):
        raise Untranslatable("MultiheadAttention's attention weights are used (need_weights="
                             "True): nnx.MultiHeadAttention returns the output alone "
                             "(sow_weights=True keeps the weights in its 'intermediates')")
    masks = []
    attn_mask = cs.args.get("attn_mask")
    if attn_mask is not None and cs.lit("attn_mask") is not None:
        m = _simple(attn_mask, "attn_mask")
        # torch: (L, S) or (N*H, L, S), True = blocked; flax: [batch..., H, L, S], True = attend.
        # `~` raises on a float (additive) mask instead of misreading it.
        masks.append(f"~({m}.reshape(-1, {func}.num_heads, *{m}.shape[-2:]) if {m}.ndim == 3 "
                     f"else {m})")
        why = ("attn_mask is read as a boolean mask (True = blocked): a float additive mask "
               "raises TypeError at `~`")
        cs.notes.append(("warning", why))
    elif cs.lit("is_causal") not in (None, False):
        raise Untranslatable("MultiheadAttention(is_causal=True) without attn_mask (torch "
                             "raises)")
    kpm = cs.args.get("key_padding_mask")
    if kpm is not None and cs.lit("key_padding_mask") is not None:
        m = _simple(kpm, "key_padding_mask")
        masks.append(f"~{m}[..., None, None, :]")  # (N, S), True = ignored
    parts = [code(q)]
    if code(k) != code(q) or code(v) != code(k):
        parts.append(code(k))
        if code(v) != code(k):
            parts.append(code(v))
    if batch_first is not True:  # (L, N, E) -> (N, L, E); an unbatched (L, E) stays
        parts = [f"jnp.moveaxis({p}, 0, -2)" for p in parts]
    kwargs = []
    if masks:
        kwargs.append("mask=" + (masks[0] if len(masks) == 1 else
                                 f"jnp.logical_and({masks[0]}, {masks[1]})"))
    out = f"{func}({', '.join(parts + kwargs)})"
    if batch_first is not True:
        out = f"jnp.moveaxis({out}, -2, 0)"
    return expr(f"({out}, None)")


# --------------------------------------------------------------------------------------------
# TransformerEncoderLayer / TransformerEncoder: helper classes (passes/helpers.py) with torch's
# arguments, forward and attribute names
# --------------------------------------------------------------------------------------------


def _as_given(site: Site, helper: str, skip: tuple[str, ...] = (), written: bool = False
              ) -> cst.Call:
    """``helper(...)`` with the torch arguments the rule knows, positional or keyword as given
    (the dropped ones, device and dtype, left out). ``written``: the target writes this
    helper (else only a target with the helper classes does)."""
    if not (written or site.renders.helper_classes):
        raise Untranslatable(f"{site.rule.torch}: translated for the NNX target only")
    if site.args.star or site.args.extra_positional:
        raise Untranslatable(f"{site.rule.torch} with *args / **kwargs")
    if helper in site.defined:
        raise Untranslatable(f"the file defines its own {helper}: rename it, the converted file "
                             f"needs that name for the {helper} helper class")
    out = [arg(site.get(name), name if name in site.args.keywords else None)
           for name in site.rule.params if site.args.has(name) and name not in skip]
    return call(helper, *out, *site.rngs_arg())


@special("transformer_encoder_layer")
def transformer_encoder_layer(site: Site) -> cst.BaseExpression:
    """``nn.TransformerEncoderLayer(d, h, ...)`` -> ``TransformerEncoderLayer(d, h, ...)``,
    the helper class: self_attn an nnx.MultiHeadAttention, linear1/linear2, norm1/norm2 and
    dropout/dropout1/dropout2 as torch names them."""
    for name in ("d_model", "nhead"):
        _required(site, name)
    activation = site.lit("activation")
    if isinstance(activation, str) and activation not in ("relu", "gelu"):
        raise Untranslatable(f"TransformerEncoderLayer(activation={activation!r}): torch "
                             "accepts only 'relu' and 'gelu'")
    return _as_given(site, "TransformerEncoderLayer")


@special("transformer_encoder")
def transformer_encoder(site: Site) -> cst.BaseExpression:
    """``nn.TransformerEncoder(layer, n, norm)`` -> ``TransformerEncoder(layer, n, norm)``,
    the helper class: ``layers``, n copies of the layer, and the final ``norm``."""
    for name in ("encoder_layer", "num_layers"):
        _required(site, name)
    if site.lit("enable_nested_tensor") is not False:
        site.note("in eval mode, with a src_key_padding_mask whose padding is at the end of "
                  "each row and no mask, and a layer with batch_first=True, norm_first=False, "
                  "bias=True, an even nhead and relu/gelu, torch's no-grad inference (nested "
                  "tensors) returns 0.0 at the padded positions: the converted "
                  "TransformerEncoder does the same after model.eval() (set its "
                  "inference_fast_path = False for torch's eval forward with autograd on, "
                  "which computes those positions); enable_nested_tensor=False turns it off "
                  "on both sides", "warning")
    return _as_given(site, "TransformerEncoder")


# --------------------------------------------------------------------------------------------
# LSTM / LSTMCell
# --------------------------------------------------------------------------------------------


def _bias_true(site: Site) -> bool:
    """bias=True, or a constructor parameter passed on whose only literal is True
    (passes/layer_choices.py)."""
    return site.lit("bias") is True or site.choices.get("bias") == (True,)


def _lstm_checks(site: Site) -> None:
    if not _bias_true(site):
        raise Untranslatable(f"{site.rule.torch}(bias=False): the converted LSTM cell "
                             "always has trainable biases (dense_i, dense_h), which torch's has not")


def _rnn(site: Site, cell: cst.Call) -> cst.Call:
    """``nnx.RNN(cell, time_major=True unless batch_first)`` for a one-layer, one-direction
    torch LSTM or GRU."""
    checks = [("num_layers", 1, "stack nnx.RNN layers"),
              ("bidirectional", False, "nnx.Bidirectional of two nnx.RNN")]
    if "proj_size" in site.rule.params:
        checks.append(("proj_size", 0, "flax's LSTM cells have no projection"))
    for name, ok, why in checks:
        if site.lit(name) != ok:
            kind = site.rule.torch.rsplit(".", 1)[-1]
            raise Untranslatable(f"{kind}({name}={code(site.get(name))}): not translated ({why})")
    out = [arg(cell)]
    batch_first = site.lit("batch_first")
    if batch_first is ...:
        out.append(arg(expr("not {b}", b=site.get("batch_first")), "time_major"))
    elif not batch_first:
        out.append(arg(py(True), "time_major"))
    return call(site.rule.targets[site.target], *out)


def _cell(site: Site, name: str) -> cst.Call:
    return call(name, arg(_required(site, "input_size")), arg(_required(site, "hidden_size")),
                *site.rngs_arg())


@special("lstm")
def lstm(site: Site) -> cst.BaseExpression:
    """``nn.LSTM(I, H)`` -> ``nnx.RNN(TorchLSTMCell(I, H), time_major=True)``, TorchLSTMCell
    the helper of passes/helpers_rnn.py: an nnx.OptimizedLSTMCell whose input-side dense has a
    bias too. One layer, one direction; gates in torch's order i, f, g, o, so torch's (4H, I)
    and (4H, H) weights are the cell's fused kernels transposed, b_ih and b_hh their biases."""
    _lstm_checks(site)
    if _stacked(site) or site.lit("bidirectional") is not False or site.packed:
        return _stacked_rnn(site)
    _flag_calls(site, "forward(input, (h_0, c_0)) returns (output, (h_n, c_n)) with a "
                "leading layer axis on h_n and c_n", "returns the output, or (carry, output) "
                "with carry (c, h)")
    return _rnn(site, _cell(site, "TorchLSTMCell"))


def _stacked(site: Site) -> bool:
    """Whether an LSTM may have more than one layer (num_layers not the literal 1)."""
    return site.lit("num_layers") != 1


def _stacked_rnn(site: Site) -> cst.BaseExpression:
    """``nn.LSTM(I, H, L, dropout=p, bidirectional=b)`` with L not the literal 1, or b not the
    literal False -> ``TorchLSTM(I, H, L, dropout=p, bidirectional=b)`` (a GRU: ``TorchGRU``),
    the helper of passes/helpers_rnn.py (stacked nnx.RNNs, a reverse one per layer when
    bidirectional, dropout between layers, torch's call and return), its arguments as given."""
    kind = site.rule.torch.rsplit(".", 1)[-1]
    if not site.renders.stacked_rnn:
        # (the equinox target renders a stacked one-direction LSTM from the helper's NNX
        # form, targets/equinox_lstm.py, and marks the others)
        name = "num_layers" if _stacked(site) else "bidirectional"
        raise Untranslatable(f"{kind}({name}={code(site.get(name))}): not translated on this "
                             "target (stack one-layer RNNs, one per direction)")
    if "proj_size" in site.rule.params and site.lit("proj_size") != 0:
        raise Untranslatable(f"LSTM(proj_size={code(site.get('proj_size'))}): not translated "
                             "(flax's LSTM cells have no projection)")
    return _as_given(site, f"Torch{kind}", skip=("proj_size",), written=True)


def _helper_call(cs: CallSite) -> cst.BaseExpression | None:
    """``self.rnn(x, hx)`` as written where the layer is the TorchLSTM / TorchGRU helper (torch's
    call and return), else None."""
    if cs.ctor_lit("num_layers") == 1 and cs.ctor_lit("bidirectional") is False and not cs.packed:
        return None
    x, hx = cs.args.get("input"), cs.args.get("hx")
    return expr(f"{code(cs.func)}({code(x)}" + ("" if hx is None else f", {code(hx)}") + ")")


@special("lstm_cell")
def lstm_cell(site: Site) -> cst.BaseExpression:
    _lstm_checks(site)
    _flag_calls(site, "forward(input, (h, c)) returns (h', c')", "is called as cell((c, h), x) "
                "and returns ((c', h'), h')")
    return _cell(site, "TorchLSTMCell")


def _hx(cs: CallSite, name: str) -> tuple[str, str] | None:
    """torch's (h, c) argument as two expressions, or None when absent."""
    node = cs.args.get(name)
    if node is None or cs.lit(name) is None:
        return None
    if isinstance(node, cst.Tuple) and len(node.elements) == 2:
        h, c = (e.value for e in node.elements)
        return code(h), code(c)
    hx = _simple(node, name)
    return f"{hx}[0]", f"{hx}[1]"


@call_transform("lstm")
def lstm_call(cs: CallSite) -> cst.BaseExpression:
    """``self.lstm(x, (h0, c0))`` -> ``(output, (h_n, c_n))`` from nnx.RNN's ``(carry,
    output)``, with torch's leading layer axis on h_n and c_n."""
    func = code(cs.func)
    x = cs.args.get("input")
    if x is None:
        raise Untranslatable("LSTM called without input")
    helper = _helper_call(cs)
    if helper is not None:
        return helper
    args = [code(x)]
    hx = _hx(cs, "hx")
    node = cs.args.get("hx")
    if hx is not None and isinstance(node, cst.Name):
        # a name can hold None at run time (``def forward(self, x, hx=None)``): torch's zero
        # state then, as nnx.RNN's without an initial carry
        args.append(f"initial_carry=None if {node.value} is None else "
                    f"({node.value}[1][0], {node.value}[0][0])")
    elif hx is not None:
        h, c = hx
        args.append(f"initial_carry=({c}[0], {h}[0])")  # torch's (1, N, H) per layer
    if cs.unused(1):
        return expr(f"({func}({', '.join(args)}), None)")
    args.append("return_carry=True")
    return expr(f"(lambda carry, out: (out, (carry[1][None], carry[0][None])))"
                f"(*{func}({', '.join(args)}))")


def _zero_state(cs: CallSite, xs: str) -> str:
    """Zeros of (*x.shape[:-1], H): torch's state when a cell is called without one."""
    size = cs.renders.rnn_cell_features
    return f"jnp.zeros((*{xs}.shape[:-1], {code(cs.func)}.{size}), {xs}.dtype)"


@call_transform("lstm_cell")
def lstm_cell_call(cs: CallSite) -> cst.BaseExpression:
    """``self.cell(x, (h, c))`` -> ``self.cell((c, h), x)[0][::-1]`` (torch's (h', c'))."""
    func = code(cs.func)
    x = cs.args.get("input")
    if x is None:
        raise Untranslatable("LSTMCell called without input")
    hx = _hx(cs, "hx")
    if hx is None:
        h = c = _zero_state(cs, _simple(x, "LSTMCell's input without hx"))
    else:
        h, c = hx
    return expr(f"{func}(({c}, {h}), {code(x)})[0][::-1]")


# --------------------------------------------------------------------------------------------
# GRU / GRUCell
# --------------------------------------------------------------------------------------------


def _gru_checks(site: Site) -> None:
    if not _bias_true(site):
        raise Untranslatable(f"{site.rule.torch}(bias=False): flax's GRU cell always has a "
                             "trainable input-side bias (dense_i), which torch's has not")


@special("gru")
def gru(site: Site) -> cst.BaseExpression:
    """``nn.GRU(I, H)`` -> ``nnx.RNN(TorchGRUCell(I, H), time_major=True)``, TorchGRUCell the
    helper of passes/helpers.py: an nnx.GRUCell whose hidden-side dense has torch's b_hn. Gates
    in torch's order r, z, n: each torch weight is a fused kernel transposed, each bias a bias."""
    _gru_checks(site)
    if _stacked(site) or site.lit("bidirectional") is not False or site.packed:
        return _stacked_rnn(site)
    _flag_calls(site, "forward(input, h_0) returns (output, h_n) with a leading layer axis "
                "on h_n", "returns the output, or (carry, output)")
    return _rnn(site, _cell(site, "TorchGRUCell"))


@special("gru_cell")
def gru_cell(site: Site) -> cst.BaseExpression:
    _gru_checks(site)
    _flag_calls(site, "forward(input, h) returns h'", "is called as cell(h, x) and returns "
                "(h', h')")
    return _cell(site, "TorchGRUCell")


def _state(cs: CallSite) -> str | None:
    """torch's hx argument, or None when absent."""
    node = cs.args.get("hx")
    return None if node is None or cs.lit("hx") is None else code(node)


@call_transform("gru")
def gru_call(cs: CallSite) -> cst.BaseExpression:
    """``self.gru(x, h0)`` -> ``(output, h_n)`` from nnx.RNN's ``(carry, output)``, with
    torch's leading layer axis on h_n."""
    func = code(cs.func)
    x = cs.args.get("input")
    if x is None:
        raise Untranslatable("GRU called without input")
    helper = _helper_call(cs)
    if helper is not None:
        return helper
    args = [code(x)]
    h0 = _state(cs)
    if h0 is not None and isinstance(cs.args.get("hx"), cst.Name):
        # a name can hold None at run time (``def forward(self, x, h=None)``): torch's zero
        # state then, as nnx.RNN's without an initial carry
        args.append(f"initial_carry=None if {h0} is None else {h0}[0]")
    elif h0 is not None:
        args.append(f"initial_carry={h0}[0]")  # torch's (1, N, H)
    if cs.unused(1):
        return expr(f"({func}({', '.join(args)}), None)")
    args.append("return_carry=True")
    return expr(f"(lambda carry, out: (out, carry[None]))(*{func}({', '.join(args)}))")


@call_transform("gru_cell")
def gru_cell_call(cs: CallSite) -> cst.BaseExpression:
    """``self.cell(x, h)`` -> ``self.cell(h, x)[0]`` (torch's h')."""
    func = code(cs.func)
    x = cs.args.get("input")
    if x is None:
        raise Untranslatable("GRUCell called without input")
    if cs.args.get("hx") is None or cs.lit("hx") is None:
        h = _zero_state(cs, _simple(x, "GRUCell's input without hx"))
    else:
        h = code(cs.args.get("hx"))
    return expr(f"{func}({h}, {code(x)})[0]")


@special("scaled_dot_product_attention")
def scaled_dot_product_attention(site: Site) -> cst.BaseExpression:
    q, k, v = (_required(site, n) for n in ("query", "key", "value"))
    rate = site.lit("dropout_p")
    if rate is ... and site.before is not None:
        # a rate computed at run time (`self.dropout if self.training else 0`): GPT configs
        # set it to 0 for pretraining; a nonzero rate stops the program at this line
        site.before(cst.parse_statement(
            f"assert not ({code(site.get('dropout_p'))}), \"attention dropout is not "
            f"translated (jax.nn.dot_product_attention has none): set the dropout to 0 or "
            f"apply it to the attention weights by hand\"\n"))
        site.note("scaled_dot_product_attention with a dropout_p computed at run time: "
                  "translated for a rate of 0, which an assert before the line checks "
                  "(jax.nn.dot_product_attention has no dropout)", "warning")
    elif rate not in (0, 0.0):
        raise Untranslatable("scaled_dot_product_attention with dropout_p: "
                             "jax.nn.dot_product_attention has no dropout")
    if site.lit("enable_gqa") not in (False, None):
        raise Untranslatable("scaled_dot_product_attention(enable_gqa=True)")
    mask = site.get("attn_mask")
    if mask is not None and site.lit("attn_mask") is not None:
        # boolean (jax's mask=) or added to the scores (jax's bias=): told apart by its dtype
        # at run time, by the attention_with_mask helper (passes/helpers.py)
        swapped = [code(t) for t in (q, k, v)] + [code(mask)]
        func = "attention_with_mask"
    elif any(r > 4 for r in site.ranks.values()):
        # (B, heads, blocks, length, dim) (timm's nest, twins): torch's leading dimensions,
        # which jax.nn.dot_product_attention does not take; the helper's einsums do
        swapped = [code(t) for t in (q, k, v)]
        func = "attention_with_mask"
    else:
        swapped = [f"jnp.swapaxes({code(t)}, -3, -2)" for t in (q, k, v)]
        func = ""
    extra = []
    causal = site.get("is_causal")
    if causal is not None and site.lit("is_causal") is not False:
        extra.append(f"is_causal={code(causal)}")
    scale = site.get("scale")
    if scale is not None and site.lit("scale") is not None:
        extra.append(f"scale={code(scale)}")
    inner = ", ".join([*swapped, *extra])
    if func:
        return expr(f"{func}({inner})")
    return expr(f"jnp.swapaxes(jax.nn.dot_product_attention({inner}), -3, -2)")
