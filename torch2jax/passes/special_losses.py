"""Loss functions: ``torch.nn.functional`` losses and their ``nn.*Loss`` modules -> optax / jnp.

One implementation per loss, shared by both forms. The functional transform reads the tensors
from the call; the module transform reads the options from the constructor and returns
``lambda input, target: <what the functional form gives with those options>``. Constructor
options that are computed expressions (``weight=torch.tensor([...])``) become defaults of the
lambda, so that they are evaluated once, when the loss is built, as in torch.

The emitted expression is the simplest one that is faithful for the options actually given:
masking machinery only appears with ``ignore_index=`` / ``weight=``. Where a tensor would be
used twice and is not a plain name, the transform binds it to a fresh name (``Site.once``)
rather than duplicating a computation.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from torch2jax.passes.common import (
    Untranslatable,
    code,
    expr,
    int_value,
    is_simple,
    py,
    try_literal,
)
from torch2jax.passes.registry import Site, special

Core = Callable[[Site, cst.BaseExpression, cst.BaseExpression], cst.BaseExpression]

# Converted target expressions that are evidently floating point (probabilities).
_FLOAT_EVIDENCE = re.compile(
    r"\b(softmax|log_softmax|sigmoid|smooth_labels)\b|\bjnp\.(float16|float32|float64|bfloat16)\b"
    r"|\.astype\(float\)")

_DEFAULT_IGNORE_NOTE = (
    "labels equal to -100 are not ignored here: torch's default ignore_index=-100 is silently "
    "active; pass ignore_index=-100 explicitly if your labels use it")


# --------------------------------------------------------------------------------------------
# shared pieces
# --------------------------------------------------------------------------------------------


def _reduction(site: Site, allowed: tuple[str, ...] = ("none", "mean", "sum")) -> str:
    """The reduction, with the legacy ``size_average``/``reduce`` flags mapped as torch does."""
    name = site.rule.torch
    if site.get("size_average") is not None or site.get("reduce") is not None:
        size_average, reduce = site.lit("size_average"), site.lit("reduce")
        if size_average is ... or reduce is ...:
            raise Untranslatable(f"{name}: legacy size_average/reduce with non-literal values; "
                                 "use reduction='none'|'mean'|'sum'")
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        out = "mean" if size_average and reduce else "sum" if reduce else "none"
        site.note(f"legacy size_average/reduce read as reduction={out!r}")
        return out
    value = site.lit("reduction")
    value = "mean" if value is None else value
    if value is ...:
        raise Untranslatable(f"{name}: reduction given as a non-literal; write the string")
    if value not in allowed:
        raise Untranslatable(f"{name}: unknown reduction {value!r}")
    return value


def _reduce(per: cst.BaseExpression, reduction: str) -> cst.BaseExpression:
    if reduction == "none":
        return per
    return expr("{p}." + reduction + "()", p=per)


def _simple(site: Site, node: cst.BaseExpression, what: str, why: str,
            hint: str) -> cst.BaseExpression:
    """``node`` when it may be written twice (a name or attribute chain, or a reshape of one:
    ``targets.view(-1)`` as minGPT-style models pass it), else a fresh name bound to it
    (``Site.once``: evaluated once, in torch's order)."""
    if is_simple(node) or _reshaped_name(node):
        return node
    return site.once(node, hint, f"{what} ({why})")


def _reshaped_name(node: cst.BaseExpression) -> bool:
    """``t.reshape(-1)`` / ``t.reshape(a, b)`` on a name, with integer or name arguments: pure,
    and evaluated twice under jit it is one reshape (XLA merges the duplicates)."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "reshape" and is_simple(node.func.value)
            and all(a.keyword is None and not a.star and (
                int_value(a.value) is not None or is_simple(a.value)) for a in node.args))


def _tensor_opt(site: Site, name: str) -> cst.BaseExpression | None:
    """An optional tensor argument (weight=, pos_weight=), None when absent or ``None``."""
    node = site.get(name)
    if node is None or (isinstance(node, cst.Name) and node.value == "None"):
        return None
    return node


def _number(site: Site, name: str, default: float) -> tuple[float | None, cst.BaseExpression]:
    """(literal value or None when computed, node to emit) for a scalar option."""
    node = site.get(name)
    if node is None:
        return default, py(default)
    value = site.lit(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, node
    return value, node


def _target(site: Site) -> cst.BaseExpression:
    node = site.get("target")
    if node is None:
        raise Untranslatable(f"{site.rule.torch}: missing argument 'target'")
    return node


def _index(site: Site, node: cst.BaseExpression) -> cst.BaseExpression:
    """ignore_index: a literal or a name (the mask it builds is written more than once)."""
    if isinstance(site.lit("ignore_index"), int):
        return node
    return _simple(site, node, "ignore_index", "the mask is written more than once",
                   "ignore_index")


def _is_float_target(t: cst.BaseExpression) -> bool:
    return bool(_FLOAT_EVIDENCE.search(code(t)))


# --------------------------------------------------------------------------------------------
# cross_entropy / nll_loss
# --------------------------------------------------------------------------------------------


def _cross_entropy(site: Site, x: cst.BaseExpression, t: cst.BaseExpression) -> cst.BaseExpression:
    reduction = _reduction(site)
    w = _tensor_opt(site, "weight")
    ls, ls_node = _number(site, "label_smoothing", 0.0)
    if ls is not None and not 0.0 <= ls <= 1.0:
        raise Untranslatable(f"label_smoothing={ls}: torch requires 0 <= label_smoothing <= 1")
    smoothing = ls is None or ls != 0
    ii_node = site.get("ignore_index")
    if _is_float_target(t):
        return _cross_entropy_probs(site, x, t, w, ls_node if smoothing else None, reduction)
    t, w, valid = _mask_and_weight(site, t, w, ii_node, reduction)
    if not smoothing:
        args = "{x}, {t}, axis=1" + (", where={v}" if valid is not None else "")
        per = expr("optax.softmax_cross_entropy_with_integer_labels(" + args + ")", x=x, t=t,
                   v=valid if valid is not None else py(None))
    else:
        x = _simple(site, x, "the input", "its class count is read for one_hot", "logits")
        labels = expr("optax.smooth_labels(jax.nn.one_hot({t}, {x}.shape[1]), {a})",
                      t=t, x=x, a=ls_node)
        if w is not None:
            labels = expr("{q} * {w}", q=labels, w=w)
        per = expr("optax.softmax_cross_entropy(jnp.moveaxis({x}, 1, -1), {q})", x=x, q=labels)
        if valid is not None:
            per = expr("jnp.where({v}, {p}, 0)", v=valid, p=per)
    if w is not None and not smoothing:
        per = expr("{w}[{t}] * {p}", w=w, t=t, p=per)
    return _class_mean(per, t, w, valid, reduction)


def _class_mean(per, t, w, valid, reduction: str) -> cst.BaseExpression:
    """torch's class-index reductions: 'mean' divides by the number (or the summed weight) of
    the targets that are not ignored."""
    if reduction != "mean" or (w is None and valid is None):
        return _reduce(per, reduction)
    if w is None:
        return expr("{p}.sum() / {v}.sum()", p=per, v=valid)
    if valid is None:
        return expr("{p}.sum() / {w}[{t}].sum()", p=per, w=w, t=t)
    return expr("{p}.sum() / jnp.where({v}, {w}[{t}], 0).sum()", p=per, v=valid, w=w, t=t)


def _cross_entropy_probs(site: Site, x, t, w, ls_node, reduction: str) -> cst.BaseExpression:
    """Probability (float) targets: -sum_c w_c q_c log_softmax(x)_c, mean over all positions."""
    ii = site.lit("ignore_index")
    if site.get("ignore_index") is not None and (not isinstance(ii, int) or ii >= 0):
        raise Untranslatable("ignore_index with probability (float) targets: torch raises "
                             "'ignore_index is not supported for floating point target'")
    if w is None:
        labels = t if ls_node is None else expr("optax.smooth_labels({t}, {a}, axis=1)", t=t,
                                                a=ls_node)
        per = expr("optax.softmax_cross_entropy({x}, {q}, axis=1)", x=x, q=labels)
    else:
        labels = expr("jnp.moveaxis({t}, 1, -1)", t=t)
        if ls_node is not None:
            labels = expr("optax.smooth_labels({q}, {a})", q=labels, a=ls_node)
        per = expr("optax.softmax_cross_entropy(jnp.moveaxis({x}, 1, -1), {q} * {w})", x=x,
                   q=labels, w=w)
    return _reduce(per, reduction)


def _mask_and_weight(site: Site, t: cst.BaseExpression, w: cst.BaseExpression | None,
                     ii_node: cst.BaseExpression | None, reduction: str):
    """Shared by cross_entropy and nll_loss: ``(target, weight, valid mask or None)``, with the
    operands used more than once required to be names."""
    if (ii_node is not None or w is not None) and not is_simple(t):
        t = site.once(t, "target", "the target (ignore_index/weight mask and weigh it)")
    if ii_node is None:
        site.note(_DEFAULT_IGNORE_NOTE)
        valid = None
    else:
        valid = expr("{t} != {i}", t=t, i=_index(site, ii_node))
    if ii_node is not None or w is not None:
        t = _simple(site, t, "the target", "ignore_index/weight mask and weigh it", "target")
    if w is not None and reduction == "mean":
        w = _simple(site, w, "the class weight",
                    "the mean divides by the weight of the targets", "class_weight")
    return t, w, valid


def _nll_loss(site: Site, x: cst.BaseExpression, t: cst.BaseExpression) -> cst.BaseExpression:
    reduction = _reduction(site)
    w = _tensor_opt(site, "weight")
    ii_node = site.get("ignore_index")
    t, w, valid = _mask_and_weight(site, t, w, ii_node, reduction)
    picked = expr("jnp.take_along_axis({x}, jnp.expand_dims({t}, 1), axis=1)", x=x, t=t)
    if valid is None and w is None and reduction != "none":
        # the (N, 1, ...) shape of the picked log-probabilities does not change the sum
        return expr("-{r}", r=_reduce(picked, reduction))
    per = expr("-{p}.squeeze(1)", p=picked)
    if w is not None:
        per = expr("-{w}[{t}] * {p}.squeeze(1)", w=w, t=t, p=picked)
    if valid is not None:
        per = expr("jnp.where({v}, {p}, 0)", v=valid, p=per)
    return _class_mean(per, t, w, valid, reduction)


# --------------------------------------------------------------------------------------------
# regression losses
# --------------------------------------------------------------------------------------------


def _elementwise(site: Site, per: cst.BaseExpression, reduction: str,
                 weighted_mean: str) -> cst.BaseExpression:
    """An elementwise loss with torch's optional elementwise ``weight=`` (functional form):
    'mean' divides by ``weight.sum()`` (mse, l1) or by the element count (huber)."""
    w = _tensor_opt(site, "weight")
    if w is None:
        return _reduce(per, reduction)
    if reduction == "mean" and weighted_mean == "weight":
        w = _simple(site, w, "the weight", "the mean divides by its sum", "weight")
        return expr("({w} * {p}).sum() / {w}.sum()", w=w, p=per)
    return _reduce(expr("{w} * {p}", w=w, p=per), reduction)


def _mse_loss(site: Site, x, t) -> cst.BaseExpression:
    return _elementwise(site, expr("optax.squared_error({x}, {t})", x=x, t=t), _reduction(site),
                        "weight")


def _l1_loss(site: Site, x, t) -> cst.BaseExpression:
    return _elementwise(site, expr("jnp.abs({x} - {t})", x=x, t=t), _reduction(site), "weight")


def _huber(x, t, delta, delta_node) -> cst.BaseExpression:
    if delta == 1.0:
        return expr("optax.huber_loss({x}, {t})", x=x, t=t)
    return expr("optax.huber_loss({x}, {t}, delta={d})", x=x, t=t, d=delta_node)


def _huber_loss(site: Site, x, t) -> cst.BaseExpression:
    reduction = _reduction(site)
    delta, node = _number(site, "delta", 1.0)
    if delta is not None and delta <= 0:
        raise Untranslatable(f"huber_loss delta={delta}: torch requires delta > 0")
    return _elementwise(site, _huber(x, t, delta, node), reduction, "count")


def _smooth_l1_loss(site: Site, x, t) -> cst.BaseExpression:
    reduction = _reduction(site)
    beta, node = _number(site, "beta", 1.0)
    if beta is not None and beta < 0:
        raise Untranslatable(f"smooth_l1_loss beta={beta}: torch requires beta >= 0")
    if beta == 0:
        return _reduce(expr("jnp.abs({x} - {t})", x=x, t=t), reduction)
    if beta == 1.0:
        return _reduce(_huber(x, t, 1.0, node), reduction)
    if beta is None:
        site.note("smooth_l1_loss with a computed beta: written as huber_loss(delta=beta) / beta, "
                  "which divides by zero for beta == 0 (torch then computes the L1 loss)",
                  "warning")
    return expr("{h} / {b}", h=_reduce(_huber(x, t, None, node), reduction), b=node)


# --------------------------------------------------------------------------------------------
# binary cross-entropy
# --------------------------------------------------------------------------------------------


def _binary_cross_entropy(site: Site, x, t) -> cst.BaseExpression:
    reduction = _reduction(site)
    w = _tensor_opt(site, "weight")
    if "binary_cross_entropy" not in site.defined:
        # the helper of passes/helpers.py: torch's value and torch's gradient, which stays
        # finite where a sigmoid output saturates to exactly 0 or 1
        per = expr("binary_cross_entropy({p}, {y})", p=x, y=t)
        return _reduce(per if w is None else expr("{w} * {p}", w=w, p=per), reduction)
    site.note("the file defines its own binary_cross_entropy, the name of the helper with "
              "torch's gradient: written out instead, whose gradient is nan where the "
              "input is exactly 0 or 1", "warning")
    p = _simple(site, x, "the input", "log(p) and log(1 - p)", "probs")
    y = _simple(site, t, "the target", "y and 1 - y", "target")
    per = expr("{y} * jnp.maximum(jnp.log({p}), -100) + (1 - {y}) * "
               "jnp.maximum(jnp.log1p(-{p}), -100)", y=y, p=p)
    per = expr("-({p})", p=per) if w is None else expr("-{w} * ({p})", w=w, p=per)
    return _reduce(per, reduction)


def _binary_cross_entropy_with_logits(site: Site, x, t) -> cst.BaseExpression:
    reduction = _reduction(site)
    pw = _tensor_opt(site, "pos_weight")
    if pw is None:
        per = expr("optax.sigmoid_binary_cross_entropy({x}, {t})", x=x, t=t)
    else:
        x = _simple(site, x, "the input",
                    "log_sigmoid(x) and log_sigmoid(-x) with pos_weight", "logits")
        t = _simple(site, t, "the target", "y and 1 - y with pos_weight", "target")
        per = expr("-({pw} * {y} * jax.nn.log_sigmoid({x}) + (1 - {y}) * "
                   "jax.nn.log_sigmoid(-{x}))", pw=pw, y=t, x=x)
    w = _tensor_opt(site, "weight")
    if w is not None:
        per = expr("{w} * {p}", w=w, p=per)
    return _reduce(per, reduction)


# --------------------------------------------------------------------------------------------
# KL divergence
# --------------------------------------------------------------------------------------------


def _kl_div(site: Site, x, t) -> cst.BaseExpression:
    reduction = _reduction(site, ("none", "mean", "sum", "batchmean"))
    log_target = site.lit("log_target")
    if log_target is ...:
        raise Untranslatable("kl_div with a non-literal log_target")
    fn = "optax.losses.kl_divergence_with_log_targets" if log_target else "optax.kl_divergence"
    if reduction == "sum":
        return expr(fn + "({x}, {t}, axis=None)", x=x, t=t)
    if reduction == "batchmean":  # sum over everything / input.size(0)
        if is_simple(x):
            return expr(fn + "({x}, {t}, axis=None) / {x}.shape[0]", x=x, t=t)
        return expr(fn + "({x}, {t}, axis=()).mean(axis=0).sum()", x=x, t=t)
    if reduction == "mean":
        site.note("kl_div reduction='mean' averages over every element, as torch does; the "
                  "KL divergence proper is reduction='batchmean'")
    return _reduce(expr(fn + "({x}, {t}, axis=())", x=x, t=t), reduction)


# --------------------------------------------------------------------------------------------
# registration: one functional and one module transform per loss
# --------------------------------------------------------------------------------------------

_LAMBDA_PARAMS = ("input", "target")


def _functional(core: Core) -> Callable[[Site], cst.BaseExpression]:
    def transform(site: Site) -> cst.BaseExpression:
        return core(site, site.x("input"), _target(site))

    return transform


def _module(core: Core) -> Callable[[Site], cst.BaseExpression]:
    def transform(site: Site) -> cst.BaseExpression:
        named = dict(site.args.named)
        bound: dict[str, cst.BaseExpression] = {}
        changed = True
        while changed:  # a later default could shadow a name an earlier option reads
            changed = False
            for name, node in site.args.named.items():
                if name not in bound and _binds_at_construction(node, (*_LAMBDA_PARAMS, *bound)):
                    bound[name] = node
                    named[name] = cst.Name(name)
                    changed = True
        defaults = list(bound.items())
        named.update({p: cst.Name(p) for p in _LAMBDA_PARAMS})
        args = type(site.args)(named=named, extra_positional=list(site.args.extra_positional),
                               star=list(site.args.star), keywords=set(site.args.keywords))
        inner = Site(rule=site.rule, args=args, target=site.target, notes=site.notes,
                     defined=site.defined)
        body = core(inner, cst.Name("input"), cst.Name("target"))
        params = ", ".join([*_LAMBDA_PARAMS, *(f"{n}={code(v)}" for n, v in defaults)])
        return cst.parse_expression(f"lambda {params}: {code(body)}")

    return transform


def _binds_at_construction(node: cst.BaseExpression, params: tuple[str, ...]) -> bool:
    """A computed constructor option (not a literal, not a plain name): evaluated once, when
    the loss is built, as a default of the lambda. A name one of the lambda's parameters would
    shadow is bound the same way."""
    if try_literal(node, ...) is not ...:
        return False
    if is_simple(node):
        root = node
        while isinstance(root, cst.Attribute):
            root = root.value
        return isinstance(root, cst.Name) and root.value in params
    return True


for _name, _core in {
    "cross_entropy": _cross_entropy,
    "nll_loss": _nll_loss,
    "mse_loss": _mse_loss,
    "l1_loss": _l1_loss,
    "smooth_l1_loss": _smooth_l1_loss,
    "huber_loss": _huber_loss,
    "binary_cross_entropy": _binary_cross_entropy,
    "binary_cross_entropy_with_logits": _binary_cross_entropy_with_logits,
    "kl_div": _kl_div,
}.items():
    special(_name)(_functional(_core))
    special(_name + "_module")(_module(_core))
