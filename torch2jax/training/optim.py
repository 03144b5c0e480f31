"""``torch.optim`` optimizers and ``torch.optim.lr_scheduler`` schedulers as optax expressions.

The functions here work on libcst nodes: the script-rewriting pass hands over the torch call it
found and gets back the optax expression to write, with the notes worth reporting. Every
hyperparameter is written out with *torch's* default when the call leaves it out (optax's
defaults differ in many places: AdamW's weight decay, RMSprop's decay and epsilon placement,
Adagrad's initial accumulator and epsilon, LinearLR's hidden factors, ...).

Optimizers (:func:`translate_optimizer` -> :class:`OptimizerTx`, then ``.build()``):

========== ===============================================================================
SGD        ``optax.sgd(lr, momentum, nesterov)``; coupled ``weight_decay`` is
           ``optax.add_decayed_weights`` *before* the momentum; ``dampening`` scales every
           gradient but the first by ``1 - dampening`` (torch seeds the buffer with the raw
           first gradient); ``maximize`` negates the gradient first.
Adam       ``optax.adam``; ``weight_decay`` is coupled L2 (added to the gradient before the
           moments), never ``optax.adamw``; ``decoupled_weight_decay=True`` is AdamW.
AdamW      ``optax.adamw`` with torch's ``weight_decay=0.01`` written out.
amsgrad    torch keeps the max of the *raw* second moment and divides by ``sqrt(1 - b2^t)``
           afterwards; ``optax.amsgrad`` takes the max of the bias-corrected moment. Emitted as
           ``optax.scale_by_amsgrad(bias_correction_nu=False)`` with the epsilon scaled by
           ``sqrt(1 - b2^t)`` (``inject_hyperparams``) and the update by ``sqrt(1 - b2^t)``,
           which is torch's formula exactly.
RMSprop    ``optax.rmsprop(decay=alpha, eps_in_sqrt=False)``; with momentum, torch's buffer
           holds unscaled steps (the lr multiplies afterwards), so the chain is
           ``scale_by_rms/scale_by_stddev -> trace -> scale_by_learning_rate``.
Adagrad    a small inline ``GradientTransformation``: torch adds eps *outside* the square root
           and starts the accumulator at ``initial_accumulator_value`` (0), optax's
           ``scale_by_rss`` puts eps inside; ``lr_decay`` is a ``1 / (1 + t * lr_decay)``
           factor.
Adamax     ``optax.adamax`` (same formulas).
RAdam      ``optax.scale_by_radam`` with the epsilon divided by ``sqrt(1 - b2^t)``: torch adds
           eps to ``sqrt(v)``, optax to ``sqrt(v / (1 - b2^t))``.
Adadelta   ``optax.adadelta`` (same formulas, coupled weight decay).
NAdam      untranslatable: torch's momentum-decay schedule ``mu_t = b1 (1 - 0.5 * 0.96^(t psi))``
           (even with ``momentum_decay=0``, ``mu_t = b1 / 2``) is not optax.nadam's constant b1.
========== ===============================================================================

Schedules (:func:`translate_scheduler` -> :class:`Schedule`) are functions of optax's update
count, which equals the number of ``scheduler.step()`` calls when torch steps the scheduler
after every ``optimizer.step()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from torch2jax.passes.common import (
    BoundArgs,
    Untranslatable,
    bind,
    code,
    needs_parens,
    try_literal,
)

Note = tuple[str, str]

_IGNORED = ("foreach", "fused", "capturable", "differentiable")


# --------------------------------------------------------------------------------------------
# small code helpers: values are cst expressions, emitted code is assembled as text
# --------------------------------------------------------------------------------------------


def _c(node: cst.BaseExpression | str) -> str:
    return node if isinstance(node, str) else code(node)


def _o(node: cst.BaseExpression | str) -> str:
    """Code of ``node`` usable as an operand (parenthesised when it needs to be)."""
    if isinstance(node, str):
        if "\n" in node:  # an expression continued over lines (inside a call's parentheses)
            return f"({node})"
        node = cst.parse_expression(node)
    text = code(node)
    if needs_parens(node) or text.startswith("-"):
        return f"({text})"
    return text


def _num(node: cst.BaseExpression | str | None) -> Any:
    """The numeric literal value of ``node`` (bool excluded), else ``...``."""
    if node is None:
        return ...
    if isinstance(node, str):
        try:
            node = cst.parse_expression(node)
        except cst.ParserSyntaxError:
            return ...
    value = try_literal(node, ...)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ...
    return value


def _lit(node: cst.BaseExpression | None) -> Any:
    return ... if node is None else try_literal(node, ...)


def _py(value: Any) -> str:
    return repr(value)


def _fold(op: str, a: cst.BaseExpression | str, b: cst.BaseExpression | str) -> str:
    """``a op b`` as code, computed in Python (float64, like torch's scheduler arithmetic)
    when both are numeric literals."""
    x, y = _num(a), _num(b)
    if x is not ... and y is not ...:
        try:
            value = {"*": lambda: x * y, "/": lambda: x / y, "-": lambda: x - y,
                     "+": lambda: x + y, "**": lambda: x ** y}[op]()
        except ZeroDivisionError:
            value = ...
        if value is not ...:
            return _py(float(value) if op == "/" else value)
    return f"{_o(a)} {op} {_o(b)}"


def _call(fn: str, *args: str | None, **kwargs: str | None) -> str:
    parts = [a for a in args if a is not None]
    parts += [f"{k}={v}" for k, v in kwargs.items() if v is not None]
    return f"{fn}({', '.join(parts)})"


def _parse(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def _is_zero(node: cst.BaseExpression | None) -> bool:
    return _num(node) == 0


def _flag(hp: dict[str, cst.BaseExpression], name: str, torch_name: str) -> bool:
    value = _lit(hp.get(name))
    if not isinstance(value, bool):
        raise Untranslatable(
            f"{torch_name}: {name}={_c(hp[name])} must be a literal True/False to choose the "
            "optax transform", rule=torch_name)
    return value


# --------------------------------------------------------------------------------------------
# optimizers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _OptSpec:
    params: tuple[str, ...]  # torch's positional order ("*": keyword-only after it)
    defaults: dict[str, Any]
    momentum_key: str | None  # what OneCycleLR cycles: "momentum", "b1" or None


_OPTIMIZERS: dict[str, _OptSpec] = {
    "SGD": _OptSpec(
        ("params", "lr", "momentum", "dampening", "weight_decay", "nesterov", "*", "maximize",
         "foreach", "differentiable", "fused"),
        {"lr": 0.001, "momentum": 0, "dampening": 0, "weight_decay": 0, "nesterov": False,
         "maximize": False}, "momentum"),
    "Adam": _OptSpec(
        ("params", "lr", "betas", "eps", "weight_decay", "amsgrad", "*", "foreach", "maximize",
         "capturable", "differentiable", "fused", "decoupled_weight_decay"),
        {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0, "amsgrad": False,
         "maximize": False, "decoupled_weight_decay": False}, "b1"),
    "AdamW": _OptSpec(
        ("params", "lr", "betas", "eps", "weight_decay", "amsgrad", "*", "maximize", "foreach",
         "capturable", "differentiable", "fused"),
        {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.01,
         "amsgrad": False, "maximize": False}, "b1"),
    "RMSprop": _OptSpec(
        ("params", "lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable",
         "foreach", "maximize", "differentiable"),
        {"lr": 0.01, "alpha": 0.99, "eps": 1e-08, "weight_decay": 0, "momentum": 0,
         "centered": False, "maximize": False}, "momentum"),
    "Adagrad": _OptSpec(
        ("params", "lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
         "foreach", "*", "maximize", "differentiable", "fused"),
        {"lr": 0.01, "lr_decay": 0, "weight_decay": 0, "initial_accumulator_value": 0,
         "eps": 1e-10, "maximize": False}, None),
    "Adamax": _OptSpec(
        ("params", "lr", "betas", "eps", "weight_decay", "foreach", "*", "maximize",
         "differentiable", "capturable"),
        {"lr": 0.002, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0,
         "maximize": False}, "b1"),
    "NAdam": _OptSpec(
        ("params", "lr", "betas", "eps", "weight_decay", "momentum_decay",
         "decoupled_weight_decay", "*", "foreach", "maximize", "capturable", "differentiable"),
        {"lr": 0.002, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0,
         "momentum_decay": 0.004, "decoupled_weight_decay": False, "maximize": False}, "b1"),
    "RAdam": _OptSpec(
        ("params", "lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "*",
         "foreach", "maximize", "capturable", "differentiable"),
        {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0,
         "decoupled_weight_decay": False, "maximize": False}, "b1"),
    "Adadelta": _OptSpec(
        ("params", "lr", "rho", "eps", "weight_decay", "foreach", "*", "capturable", "maximize",
         "differentiable"),
        {"lr": 1.0, "rho": 0.9, "eps": 1e-06, "weight_decay": 0, "maximize": False}, None),
}


def optimizer_names() -> list[str]:
    """The qualified torch names :func:`translate_optimizer` knows."""
    return [f"torch.optim.{n}" for n in _OPTIMIZERS]


def _short(qualname: str, table: dict[str, Any], what: str) -> str:
    short = qualname.rsplit(".", 1)[-1]
    if short not in table:
        raise Untranslatable(f"{qualname}: no optax translation for this {what}", rule=qualname)
    return short


def _expr_value(value: Any) -> cst.BaseExpression:
    return _parse(_py(value))


def _split_betas(hp: dict[str, cst.BaseExpression], betas: cst.BaseExpression) -> None:
    if isinstance(betas, (cst.Tuple, cst.List)) and len(betas.elements) == 2:
        hp["b1"], hp["b2"] = betas.elements[0].value, betas.elements[1].value
    else:  # a name: index it
        hp["b1"], hp["b2"] = _parse(f"{_o(betas)}[0]"), _parse(f"{_o(betas)}[1]")


@dataclass
class _Part:
    """One optax transform of a chain: ``fn(*args, **kwargs)`` (values are code)."""

    fn: str
    args: list[str] = field(default_factory=list)
    kwargs: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        return _call(self.fn, *self.args, **self.kwargs)


_LR = "learning_rate"  # placeholder names in the transform factories of inject_hyperparams
# the arguments of optax's optimizers that take a pytree or a callable of the params, never a
# schedule (optax.inject_hyperparams must not call them with the step count)
_MASK_ARGS = ("mask", "weight_decay_mask")


@dataclass
class OptimizerTx:
    """A translated ``torch.optim`` constructor; :meth:`build` writes the optax expression."""

    torch_name: str  # e.g. "torch.optim.AdamW"
    params: cst.BaseExpression  # the first argument as written
    lr: cst.BaseExpression  # the lr expression, torch's default written out when absent
    notes: list[Note] = field(default_factory=list)
    hparams: dict[str, cst.BaseExpression] = field(default_factory=dict)  # torch kwargs
    groups: list[dict[str, cst.BaseExpression]] | None = None  # literal param-group dicts

    @property
    def kind(self) -> str:
        return self.torch_name.rsplit(".", 1)[-1]

    def build(
        self,
        *,
        lr: cst.BaseExpression | None = None,
        overrides: dict[str, cst.BaseExpression] | None = None,
        mask: cst.BaseExpression | None = None,
        inject: bool = False,
        momentum: cst.BaseExpression | None = None,
    ) -> cst.BaseExpression:
        """The optax GradientTransformation expression.

        ``lr`` replaces the learning rate (a number, or a schedule ``count -> lr``);
        ``overrides`` are a param group's torch kwargs (``lr``, ``weight_decay``, ``betas``,
        ``momentum``, ``eps``, ...); ``mask`` goes to the weight-decay transform;
        ``inject=True`` wraps the transform in ``optax.inject_hyperparams`` so that
        ``opt_state.hyperparams['learning_rate']`` can be set at run time; ``momentum`` is a
        schedule for SGD/RMSprop's momentum or the Adam family's beta1 (OneCycleLR's
        ``cycle_momentum``, see :attr:`Schedule.momentum`) and implies ``inject``.
        """
        spec = _OPTIMIZERS[self.kind]
        hp = dict(self.hparams)
        lr_node = lr
        for key, value in (overrides or {}).items():
            if key == "params":
                continue
            if key == "lr":
                lr_node = lr if lr is not None else value
            elif key == "betas" and "betas" in spec.defaults:
                _split_betas(hp, value)
            elif key in spec.defaults or key in _IGNORED:
                hp[key] = value
            else:
                raise Untranslatable(f"{self.torch_name}: param-group option {key!r} is not an "
                                     "option of this optimizer", rule=self.torch_name)
        lr_node = lr_node if lr_node is not None else self.lr
        mask_code = _c(mask) if mask is not None else None
        if momentum is not None and spec.momentum_key is None:
            raise Untranslatable(f"{self.torch_name} has no momentum or beta1 to cycle "
                                 "(torch raises the same)", rule=self.torch_name)
        if not (inject or momentum is not None):
            parts = _emit(self.kind, hp, _c(lr_node), mask_code, None, self.torch_name)
            return _parse(_chain(parts))
        key = spec.momentum_key if momentum is not None else None
        parts = _emit(self.kind, hp, _LR, mask_code, key, self.torch_name)
        values = {_LR: _c(lr_node)}
        if key is not None:
            values[key] = _c(momentum)
        return _parse(_inject(parts, values))


def _chain(parts: list[_Part]) -> str:
    if len(parts) == 1:
        return parts[0].render()
    return _call("optax.chain", *(p.render() for p in parts))


def _inject(parts: list[_Part], values: dict[str, str]) -> str:
    """``optax.inject_hyperparams``: the factory itself when the transform is one optax
    optimizer taking the learning rate first, else a lambda over the injected names.

    ``inject_hyperparams`` calls every callable argument with the step count (a schedule):
    a weight-decay mask (``mask=lambda params: ...``) given to the factory would be called on
    the count and decay nothing, so the mask arguments are ``static_args``."""
    if len(parts) == 1 and parts[0].args[:1] == [_LR] and len(parts[0].args) == 1 and all(
            v not in values or k == v for k, v in parts[0].kwargs.items()):
        p = parts[0]
        kwargs = {_LR: values[_LR]}
        for k, v in p.kwargs.items():
            kwargs[k] = values.get(v, v) if v in values else v
        static = [k for k in p.kwargs if k in _MASK_ARGS]
        if static:
            names = ", ".join(f'"{k}"' for k in static)
            return _call(f"optax.inject_hyperparams({p.fn}, static_args=({names},))", **kwargs)
        return _call(f"optax.inject_hyperparams({p.fn})", **kwargs)
    names = ", ".join(values)
    factory = f"lambda {names}: {_chain(parts)}"
    return _call(f"optax.inject_hyperparams({factory})", **values)


def _prefix(hp: dict[str, cst.BaseExpression], name: str, mask: str | None,
            coupled: bool = True) -> list[_Part]:
    """maximize (negate the gradient) and coupled L2 weight decay, in torch's order."""
    parts = []
    if _flag(hp, "maximize", name):
        parts.append(_Part("optax.scale", ["-1.0"]))
    if coupled and not _is_zero(hp.get("weight_decay")):
        parts.append(_decay(hp, mask))
    return parts


def _decay(hp: dict[str, cst.BaseExpression], mask: str | None) -> _Part:
    part = _Part("optax.add_decayed_weights", [_c(hp["weight_decay"])])
    if mask is not None:
        part.kwargs["mask"] = mask
    return part


def _emit(kind: str, hp: dict[str, cst.BaseExpression], lr: str, mask: str | None,
          momentum: str | None, name: str) -> list[_Part]:
    """The chain of optax transforms for optimizer ``kind``; ``momentum`` names the injected
    momentum/beta1 placeholder (which then replaces the hyperparameter)."""
    if momentum == "b1":
        hp = {**hp, "b1": _parse("b1")}
    elif momentum == "momentum":
        hp = {**hp, "momentum": _parse("momentum")}
    return _EMITTERS[kind](hp, lr, mask, momentum is not None, name)


def _emit_sgd(hp, lr, mask, cycled, name) -> list[_Part]:
    m, d = hp["momentum"], hp["dampening"]
    nesterov = _flag(hp, "nesterov", name)
    m_zero = _is_zero(m) and not cycled
    if nesterov and (m_zero or not _is_zero(d)):
        raise Untranslatable(f"{name}: Nesterov momentum requires a momentum and zero "
                             "dampening (torch raises ValueError)", rule=name)
    parts = _prefix(hp, name, mask)
    if not m_zero and not _is_zero(d):
        if _num(m) is ... and not cycled:
            raise Untranslatable(f"{name}: dampening={_c(d)} with a non-literal momentum "
                                 f"{_c(m)}: torch ignores dampening when the momentum is 0, "
                                 "so the translation depends on its value", rule=name)
        # torch's buffer starts as the raw first gradient, then buf = m*buf + (1-d)*g
        parts.append(_Part("optax.scale_by_schedule",
                           [f"lambda count: jnp.where(count == 0, 1.0, {_fold('-', '1', d)})"]))
    parts.append(_Part("optax.sgd", [lr], {"momentum": "None" if m_zero else _c(m),
                                           "nesterov": repr(nesterov)}))
    return parts


def _emit_adam(hp, lr, mask, cycled, name, decoupled: bool | None = None) -> list[_Part]:
    amsgrad = _flag(hp, "amsgrad", name)
    if decoupled is None:
        decoupled = _flag(hp, "decoupled_weight_decay", name)
    parts = _prefix(hp, name, mask, coupled=not decoupled)
    b1, b2, eps, wd = _c(hp["b1"]), _c(hp["b2"]), _c(hp["eps"]), hp["weight_decay"]
    if not amsgrad:
        if decoupled:
            kw = {"b1": b1, "b2": b2, "eps": eps, "weight_decay": _c(wd)}
            if mask is not None:
                kw["mask"] = mask
            return [*parts, _Part("optax.adamw", [lr], kw)]
        return [*parts, _Part("optax.adam", [lr], {"b1": b1, "b2": b2, "eps": eps})]
    # torch: denom = sqrt(max(v)) / sqrt(1 - b2^t) + eps, max over the raw second moment
    bc2 = f"jnp.sqrt(1 - {_o(b2)} ** (count + 1))"
    parts.append(_Part("optax.inject_hyperparams(optax.scale_by_amsgrad)", [], {
        "b1": b1, "b2": b2, "eps": f"lambda count: {_o(eps)} * {bc2}",
        "bias_correction_nu": "False"}))
    parts.append(_Part("optax.scale_by_schedule", [f"lambda count: {bc2}"]))
    if decoupled and not _is_zero(wd):
        parts.append(_decay(hp, mask))
    parts.append(_Part("optax.scale_by_learning_rate", [lr]))
    return parts


def _emit_adamw(hp, lr, mask, cycled, name) -> list[_Part]:
    return _emit_adam(hp, lr, mask, cycled, name, decoupled=True)


def _emit_rmsprop(hp, lr, mask, cycled, name) -> list[_Part]:
    centered = _flag(hp, "centered", name)
    parts = _prefix(hp, name, mask)
    rms = {"decay": _c(hp["alpha"]), "eps": _c(hp["eps"]), "eps_in_sqrt": "False"}
    if _is_zero(hp["momentum"]) and not cycled:
        return [*parts, _Part("optax.rmsprop", [lr], {**rms, "centered": repr(centered)})]
    # torch's momentum buffer holds unscaled steps; the learning rate multiplies afterwards
    parts.append(_Part("optax.scale_by_stddev" if centered else "optax.scale_by_rms", [], rms))
    parts.append(_Part("optax.trace", [], {"decay": _c(hp["momentum"])}))
    parts.append(_Part("optax.scale_by_learning_rate", [lr]))
    return parts


def _emit_adagrad(hp, lr, mask, cycled, name) -> list[_Part]:
    parts = _prefix(hp, name, mask)
    iav, eps = _c(hp["initial_accumulator_value"]), _o(hp["eps"])
    init = f"lambda params: jax.tree.map(lambda p: jnp.full_like(p, {iav}), params)"
    update = ("lambda updates, state, params=None: ("
              f"jax.tree.map(lambda g, s: g / (jnp.sqrt(s + g * g) + {eps}), updates, state), "
              "jax.tree.map(lambda g, s: s + g * g, updates, state))")
    parts.append(_Part("optax.GradientTransformation", [init, update]))
    if not _is_zero(hp["lr_decay"]):
        parts.append(_Part("optax.scale_by_schedule",
                           [f"lambda count: 1 / (1 + count * {_o(hp['lr_decay'])})"]))
    parts.append(_Part("optax.scale_by_learning_rate", [lr]))
    return parts


def _emit_adamax(hp, lr, mask, cycled, name) -> list[_Part]:
    parts = _prefix(hp, name, mask)
    return [*parts, _Part("optax.adamax", [lr], {"b1": _c(hp["b1"]), "b2": _c(hp["b2"]),
                                                 "eps": _c(hp["eps"])})]


def _emit_nadam(hp, lr, mask, cycled, name) -> list[_Part]:
    raise Untranslatable(
        f"{name}: torch's NAdam multiplies beta1 by a momentum-decay schedule "
        "mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay)) (beta1/2 even with "
        "momentum_decay=0) and keeps the running product of mu_t; optax.nadam uses a constant "
        "beta1. There is no faithful optax composition", rule=name)


def _emit_radam(hp, lr, mask, cycled, name) -> list[_Part]:
    decoupled = _flag(hp, "decoupled_weight_decay", name)
    parts = _prefix(hp, name, mask, coupled=not decoupled)
    b2 = _c(hp["b2"])
    # torch: sqrt(1 - b2^t) / (sqrt(v) + eps) = 1 / (sqrt(v_hat) + eps / sqrt(1 - b2^t))
    parts.append(_Part("optax.inject_hyperparams(optax.scale_by_radam)", [], {
        "b1": _c(hp["b1"]), "b2": b2,
        "eps": f"lambda count: {_o(hp['eps'])} / jnp.sqrt(1 - {_o(b2)} ** (count + 1))",
        "threshold": "5.0"}))
    if decoupled and not _is_zero(hp["weight_decay"]):
        parts.append(_decay(hp, mask))
    parts.append(_Part("optax.scale_by_learning_rate", [lr]))
    return parts


def _emit_adadelta(hp, lr, mask, cycled, name) -> list[_Part]:
    parts = _prefix(hp, name, mask, coupled=False)
    kw = {"rho": _c(hp["rho"]), "eps": _c(hp["eps"])}
    if not _is_zero(hp["weight_decay"]):  # optax.adadelta adds it to the gradient: coupled
        kw["weight_decay"] = _c(hp["weight_decay"])
        if mask is not None:
            kw["weight_decay_mask"] = mask
    return [*parts, _Part("optax.adadelta", [lr], kw)]


_EMITTERS: dict[str, Callable[..., list[_Part]]] = {
    "SGD": _emit_sgd, "Adam": _emit_adam, "AdamW": _emit_adamw, "RMSprop": _emit_rmsprop,
    "Adagrad": _emit_adagrad, "Adamax": _emit_adamax, "NAdam": _emit_nadam,
    "RAdam": _emit_radam, "Adadelta": _emit_adadelta,
}

_OPT_NOTES: dict[str, str] = {
    "SGD": "torch.optim.SGD: weight_decay is L2 added to the gradient before the momentum "
           "(optax.add_decayed_weights first in the chain)",
    "Adam": "torch.optim.Adam: weight_decay is coupled L2 (added to the gradient before the "
            "moments), emitted as optax.add_decayed_weights before optax.adam, not optax.adamw",
    "AdamW": "torch.optim.AdamW: weight_decay defaults to 0.01 (optax.adamw: 1e-4); written out",
    "RMSprop": "torch.optim.RMSprop: alpha=0.99 becomes decay (optax default 0.9) and eps is "
               "added outside the square root (eps_in_sqrt=False)",
    "Adagrad": "torch.optim.Adagrad: eps outside the square root and an accumulator starting "
               "at initial_accumulator_value (0); optax.adagrad differs in both, so the "
               "transform is written inline",
    "RAdam": "torch.optim.RAdam adds eps to sqrt(v) before the bias correction; the optax "
             "epsilon is scaled by 1/sqrt(1 - b2^t) to match",
}


def _group_dicts(params: cst.BaseExpression) -> list[dict[str, cst.BaseExpression]] | None:
    if not isinstance(params, (cst.List, cst.Tuple)) or not params.elements:
        return None
    groups = []
    for el in params.elements:
        if not isinstance(el, cst.Element) or not isinstance(el.value, cst.Dict):
            return None
        group = {}
        for item in el.value.elements:
            if not isinstance(item, cst.DictElement):
                return None
            key = _lit(item.key)
            if not isinstance(key, str):
                return None
            group[key] = item.value
        groups.append(group)
    return groups


def translate_optimizer(
    call: cst.Call | None, qualname: str, bound: BoundArgs | None = None
) -> OptimizerTx:
    """Translate ``torch.optim.X(params, ...)``; ``bound`` is the call's arguments bound to
    torch's parameter names (bound here from ``call`` when None). Raises Untranslatable."""
    kind = _short(qualname, _OPTIMIZERS, "optimizer")
    spec = _OPTIMIZERS[kind]
    name = f"torch.optim.{kind}"
    if bound is None:
        if call is None:
            raise ValueError("translate_optimizer needs the call or its bound arguments")
        bound = bind(call.args, spec.params)
    if bound.star:
        raise Untranslatable(f"{name} called with *args/**kwargs", rule=name)
    if bound.extra_positional:
        raise Untranslatable(f"{name}: too many positional arguments", rule=name)
    known = set(spec.params) - {"*"}
    unknown = sorted(set(bound.named) - known)
    if unknown:
        raise Untranslatable(f"{name}: unknown argument(s) {', '.join(unknown)}", rule=name)
    params = bound.get("params")
    if params is None:
        raise Untranslatable(f"{name}: missing the parameters argument", rule=name)
    hp: dict[str, cst.BaseExpression] = {}
    for key, default in spec.defaults.items():
        if key in ("lr", "betas"):
            continue
        hp[key] = bound.get(key) or _expr_value(default)
    if "betas" in spec.defaults:
        _split_betas(hp, bound.get("betas") or _expr_value(spec.defaults["betas"]))
    lr = bound.get("lr") or _expr_value(spec.defaults["lr"])
    notes: list[Note] = []
    if kind in _OPT_NOTES:
        notes.append(("info", _OPT_NOTES[kind]))
    if bound.get("lr") is None:
        notes.append(("info", f"{name}: torch's default lr={_py(spec.defaults['lr'])} written out"))
    tx = OptimizerTx(name, params, lr, notes, hp, _group_dicts(params))
    tx.build()  # raise Untranslatable now, not when the caller builds it
    if tx.groups:
        tx.notes.append(("info", (f"{name}: {len(tx.groups)} parameter groups: build one "
                                 "transform per group (build(overrides=group)) and combine them "
                                 "with optax.multi_transform")))
    return tx


def with_clipping(
    tx: cst.BaseExpression,
    *,
    max_norm: cst.BaseExpression | None = None,
    clip_value: cst.BaseExpression | None = None,
) -> cst.BaseExpression:
    """``optax.chain(optax.clip(v), optax.clip_by_global_norm(n), tx)`` (an existing
    ``optax.chain`` is extended). torch's clip_grad_norm_ divides by ``norm + 1e-6``; optax by
    ``norm``: a relative difference of about 1e-6 / norm on the clipped steps."""
    clips = []
    if clip_value is not None:
        clips.append(f"optax.clip({_c(clip_value)})")
    if max_norm is not None:
        clips.append(f"optax.clip_by_global_norm({_c(max_norm)})")
    if not clips:
        return tx
    if isinstance(tx, cst.Call) and code(tx.func) == "optax.chain":
        inner = [code(a.value) if not a.star else a.star + code(a.value) for a in tx.args]
    else:
        inner = [code(tx)]
    return _parse(_call("optax.chain", *clips, *inner))


# --------------------------------------------------------------------------------------------
# learning-rate schedulers
# --------------------------------------------------------------------------------------------


@dataclass
class Schedule:
    """A translated ``torch.optim.lr_scheduler`` constructor.

    ``fn`` is an optax schedule (``count -> lr``, count = number of ``scheduler.step()``
    calls). For ReduceLROnPlateau, ``fn`` is None and ``plateau`` is an
    ``optax.contrib.reduce_on_plateau`` transform: keep its state beside the optimizer's, step
    it where torch calls ``scheduler.step(metric)`` with
    ``_, plateau_state = plateau.update(None, plateau_state, value=metric)`` (``-metric`` when
    ``negate_metric``), and use ``lr * plateau_state.scale`` as the learning rate from then on
    (``build(inject=True)`` + ``opt_state.hyperparams['learning_rate']``). ``momentum`` is a
    momentum/beta1 schedule for ``OptimizerTx.build(momentum=...)`` (OneCycleLR).
    """

    torch_name: str
    fn: cst.BaseExpression | None
    notes: list[Note] = field(default_factory=list)
    plateau: cst.BaseExpression | None = None
    momentum: cst.BaseExpression | None = None
    negate_metric: bool = False


_SCHEDULERS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "StepLR": (("optimizer", "step_size", "gamma", "last_epoch"), {"gamma": 0.1}),
    "MultiStepLR": (("optimizer", "milestones", "gamma", "last_epoch"), {"gamma": 0.1}),
    "ExponentialLR": (("optimizer", "gamma", "last_epoch"), {}),
    "CosineAnnealingLR": (("optimizer", "T_max", "eta_min", "last_epoch"), {"eta_min": 0.0}),
    "LinearLR": (("optimizer", "start_factor", "end_factor", "total_iters", "last_epoch"),
                 {"start_factor": 1.0 / 3, "end_factor": 1.0, "total_iters": 5}),
    "ConstantLR": (("optimizer", "factor", "total_iters", "last_epoch"),
                   {"factor": 1.0 / 3, "total_iters": 5}),
    "OneCycleLR": (("optimizer", "max_lr", "total_steps", "epochs", "steps_per_epoch",
                    "pct_start", "anneal_strategy", "cycle_momentum", "base_momentum",
                    "max_momentum", "div_factor", "final_div_factor", "three_phase",
                    "last_epoch"),
                   {"total_steps": None, "epochs": None, "steps_per_epoch": None,
                    "pct_start": 0.3, "anneal_strategy": "cos", "cycle_momentum": True,
                    "base_momentum": 0.85, "max_momentum": 0.95, "div_factor": 25.0,
                    "final_div_factor": 1e4, "three_phase": False}),
    "SequentialLR": (("optimizer", "schedulers", "milestones", "last_epoch"), {}),
    "LambdaLR": (("optimizer", "lr_lambda", "last_epoch"), {}),
    "PolynomialLR": (("optimizer", "total_iters", "power", "last_epoch"),
                     {"total_iters": 5, "power": 1.0}),
    "ReduceLROnPlateau": (("optimizer", "mode", "factor", "patience", "threshold",
                           "threshold_mode", "cooldown", "min_lr", "eps"),
                          {"mode": "min", "factor": 0.1, "patience": 10, "threshold": 1e-4,
                           "threshold_mode": "rel", "cooldown": 0, "min_lr": 0, "eps": 1e-8}),
}


def scheduler_names() -> list[str]:
    return [f"torch.optim.lr_scheduler.{n}" for n in _SCHEDULERS]


class _Args:
    """A scheduler call's arguments with torch's defaults (as code)."""

    def __init__(self, name: str, bound: BoundArgs, defaults: dict[str, Any]) -> None:
        self.name, self.bound, self.defaults = name, bound, defaults

    def node(self, key: str) -> cst.BaseExpression:
        node = self.bound.get(key)
        if node is not None:
            return node
        if key not in self.defaults:
            raise Untranslatable(f"{self.name}: missing argument {key!r}", rule=self.name)
        return _expr_value(self.defaults[key])

    def code(self, key: str) -> str:
        return _c(self.node(key))

    def lit(self, key: str) -> Any:
        return _lit(self.node(key))

    def given(self, key: str) -> bool:
        return self.bound.get(key) is not None

    def require(self, key: str, types: tuple[type, ...], what: str) -> Any:
        value = self.lit(key)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            raise Untranslatable(f"{self.name}: {key}={self.code(key)} must be {what}",
                                 rule=self.name)
        return value


def translate_scheduler(
    call: cst.Call,
    qualname: str,
    base_lr: cst.BaseExpression,
    resolve: Callable[[cst.BaseExpression], Schedule | None] = lambda e: None,
) -> Schedule:
    """Translate ``torch.optim.lr_scheduler.X(optimizer, ...)`` into an optax schedule of the
    number of ``scheduler.step()`` calls, starting from the optimizer's ``base_lr``.

    ``resolve`` maps a name used inside SequentialLR (``[warmup, cosine]``) to the Schedule
    translated earlier for it; inline scheduler calls are translated here. Raises
    Untranslatable."""
    kind = _short(qualname, _SCHEDULERS, "scheduler")
    name = f"torch.optim.lr_scheduler.{kind}"
    params, defaults = _SCHEDULERS[kind]
    bound = bind(call.args, params)
    if bound.star:
        raise Untranslatable(f"{name} called with *args/**kwargs", rule=name)
    unknown = sorted(set(bound.named) - set(params))
    if unknown or bound.extra_positional:
        what = ", ".join(unknown) if unknown else "extra positional arguments"
        raise Untranslatable(f"{name}: unknown argument(s) {what}", rule=name)
    a = _Args(name, bound, defaults)
    if a.given("last_epoch") and a.lit("last_epoch") != -1:
        raise Untranslatable(f"{name}: last_epoch={a.code('last_epoch')} (resuming a schedule) "
                             "is not translated; shift the optax count instead", rule=name)
    sched = _SCHED_EMITTERS[kind](a, _c(base_lr), resolve)
    sched.torch_name = name
    return sched


def _lambda(body: str) -> str:
    return f"lambda count: {body}"


def _sched_step(a: _Args, base: str, resolve) -> Schedule:
    step_size = a.code("step_size")
    fn = _call("optax.exponential_decay", base, transition_steps=step_size,
               decay_rate=a.code("gamma"), staircase="True")
    return Schedule("", _parse(fn))


def _sched_multistep(a: _Args, base: str, resolve) -> Schedule:
    milestones = a.lit("milestones")
    if not isinstance(milestones, (list, tuple)) or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in milestones):
        raise Untranslatable(f"{a.name}: milestones={a.code('milestones')} must be a literal "
                             "list of integers", rule=a.name)
    gamma = a.node("gamma")
    counts = Counter(milestones)  # torch counts repeated milestones: gamma applies twice
    items = []
    for m in sorted(counts):
        c = counts[m]
        items.append(f"{m}: {_c(gamma) if c == 1 else _fold('**', gamma, str(c))}")
    fn = _call("optax.piecewise_constant_schedule", base, "{" + ", ".join(items) + "}")
    notes = []
    if any(c > 1 for c in counts.values()):
        notes.append(("info", (f"{a.name}: repeated milestones apply gamma once per repetition "
                              "(folded into one factor)")))
    return Schedule("", _parse(fn), notes)


def _sched_exponential(a: _Args, base: str, resolve) -> Schedule:
    fn = _call("optax.exponential_decay", base, transition_steps="1",
               decay_rate=a.code("gamma"))
    return Schedule("", _parse(fn))


def _sched_cosine(a: _Args, base: str, resolve) -> Schedule:
    t_max, eta = a.node("T_max"), a.node("eta_min")
    cos = f"(1 + jnp.cos(jnp.pi * count / {_o(t_max)})) / 2"
    if _is_zero(eta):
        body = f"{_o(base)} * {cos}"
    else:
        body = f"{_o(eta)} + {_o(_fold('-', base, eta))} * {cos}"
    note = ("info", (f"{a.name}: written as the closed form; torch keeps following the cosine "
                    "after T_max (the lr rises again), optax.cosine_decay_schedule would clamp"))
    return Schedule("", _parse(_lambda(body)), [note])


def _sched_linear(a: _Args, base: str, resolve) -> Schedule:
    start, end = a.node("start_factor"), a.node("end_factor")
    fn = _call("optax.linear_schedule", _fold("*", base, start), _fold("*", base, end),
               transition_steps=a.code("total_iters"))
    notes = []
    if not (a.given("start_factor") and a.given("total_iters")):
        notes.append(("info", (f"{a.name}: torch's hidden defaults start_factor=1/3, "
                              "total_iters=5 written out")))
    return Schedule("", _parse(fn), notes)


def _sched_constant(a: _Args, base: str, resolve) -> Schedule:
    factor = a.node("factor")
    total = a.code("total_iters")
    fn = _call("optax.piecewise_constant_schedule", _fold("*", base, factor),
               "{" + f"{total}: {_fold('/', '1', factor)}" + "}")
    notes = []
    if not (a.given("factor") and a.given("total_iters")):
        notes.append(("info", (f"{a.name}: torch's hidden defaults factor=1/3, total_iters=5 "
                              "written out")))
    return Schedule("", _parse(fn), notes)


def _sched_polynomial(a: _Args, base: str, resolve) -> Schedule:
    fn = _call("optax.polynomial_schedule", init_value=base, end_value="0.0",
               power=a.code("power"), transition_steps=a.code("total_iters"))
    notes = []
    if not a.given("total_iters"):
        notes.append(("info", f"{a.name}: torch's hidden default total_iters=5 written out"))
    return Schedule("", _parse(fn), notes)


def _anneal(strategy: str, start: str, end: str, pct: str) -> str:
    if strategy == "cos":
        return f"{_o(end)} + {_o(_fold('-', start, end))} / 2 * (jnp.cos(jnp.pi * {pct}) + 1)"
    return f"{_o(_fold('-', end, start))} * {pct} + {_o(start)}"


def _piecewise(strategy: str, knots: list[tuple[str, str, str]]) -> str:
    """torch's phase logic: phase i covers ``count <= end_i`` (the last one everything after),
    ``pct = (count - start_step) / (end_step - start_step)``."""
    out = None
    start_step = "0.0"
    branches = []
    for end_step, lo, hi in knots:
        span = _fold("-", end_step, start_step)
        shifted = "count" if _num(start_step) == 0 else f"(count - {_o(start_step)})"
        branches.append((end_step, _anneal(strategy, lo, hi, f"{shifted} / {_o(span)}")))
        start_step = end_step
    out = branches[-1][1]
    for end_step, value in reversed(branches[:-1]):
        out = f"jnp.where(count <= {_o(end_step)}, {value}, {out})"
    return out


def _sched_onecycle(a: _Args, base: str, resolve) -> Schedule:
    name = a.name
    given = a.lit("total_steps") if a.given("total_steps") else None
    if given is not None and given is not ...:  # a literal (total_steps=None: not given)
        total: Any = a.require("total_steps", (int,), "a literal integer")
    elif given is ...:
        # total_steps=args.steps, epochs * len(loader): read when the lr is
        total = _o(a.code("total_steps"))
    elif a.given("epochs") and a.given("steps_per_epoch"):
        epochs, per_epoch = a.lit("epochs"), a.lit("steps_per_epoch")
        total = (epochs * per_epoch if isinstance(epochs, int) and isinstance(per_epoch, int)
                 and not isinstance(epochs, bool) and not isinstance(per_epoch, bool)
                 else _o(_fold("*", a.node("epochs"), a.node("steps_per_epoch"))))
    else:
        raise Untranslatable(f"{name}: needs total_steps or epochs and steps_per_epoch "
                             "(torch raises the same)", rule=name)
    pct = a.require("pct_start", (float, int), "a literal number")
    strategy = a.require("anneal_strategy", (str,), "'cos' or 'linear'")
    if strategy not in ("cos", "linear"):
        raise Untranslatable(f"{name}: anneal_strategy={strategy!r}", rule=name)
    three = a.require("three_phase", (bool,), "a literal True/False")
    cycle = a.require("cycle_momentum", (bool,), "a literal True/False")
    max_lr = a.node("max_lr")
    if isinstance(max_lr, (cst.List, cst.Tuple)):
        raise Untranslatable(f"{name}: one max_lr per param group: translate one schedule per "
                             "group", rule=name)
    initial = _fold("/", max_lr, a.node("div_factor"))
    minimum = _fold("/", initial, a.node("final_div_factor"))
    mx = _c(max_lr)
    # a total known only at run time (epochs=args.epochs, steps_per_epoch=len(loader)): the
    # same arithmetic written out, read when the schedule is
    symbolic = isinstance(total, str)
    e1 = f"{_py(pct)} * {total} - 1" if symbolic else _py(float(pct * total) - 1)
    end = f"{total} - 1" if symbolic else _py(total - 1)
    if three:
        e2 = f"{_py(2 * pct)} * {total} - 2" if symbolic else _py(float(2 * pct * total) - 2)
        knots = [(e1, initial, mx), (e2, mx, initial), (end, initial, minimum)]
    else:
        knots = [(e1, initial, mx), (end, mx, minimum)]
    fn = _lambda(_piecewise(strategy, knots))
    notes = [("info", (f"{name}: the lr starts at max_lr / div_factor whatever the optimizer's "
                      "lr; torch's phase ends are pct_start * total_steps - 1 and "
                      "total_steps - 1 (optax.cosine_onecycle_schedule is one step off), "
                      "written as the exact closed form"))]
    momentum = None
    if cycle:
        lo, hi = a.code("base_momentum"), a.code("max_momentum")
        if isinstance(a.node("base_momentum"), (cst.List, cst.Tuple)) or isinstance(
                a.node("max_momentum"), (cst.List, cst.Tuple)):
            raise Untranslatable(f"{name}: per-group momenta are not translated", rule=name)
        if three:
            mknots = [(e1, hi, lo), (e2, lo, hi), (end, hi, hi)]
        else:
            mknots = [(e1, hi, lo), (end, lo, hi)]
        momentum = _parse(_lambda(_piecewise(strategy, mknots)))
        notes.append(("warning", (f"{name}: cycle_momentum=True also cycles the optimizer's "
                                 "momentum (SGD/RMSprop) or beta1 (Adam family) between "
                                 "max_momentum and base_momentum: the optimizer is built with "
                                 "that schedule injected (OptimizerTx.build(momentum=...))")))
    return Schedule("", _parse(fn), notes, momentum=momentum)


def _sched_sequential(a: _Args, base: str, resolve) -> Schedule:
    name = a.name
    scheds = a.node("schedulers")
    if not isinstance(scheds, (cst.List, cst.Tuple)):
        raise Untranslatable(f"{name}: schedulers={a.code('schedulers')} must be a literal "
                             "list", rule=name)
    milestones = a.lit("milestones")
    if not isinstance(milestones, (list, tuple)) or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in milestones):
        raise Untranslatable(f"{name}: milestones={a.code('milestones')} must be a literal "
                             "list of integers", rule=name)
    if len(milestones) != len(scheds.elements) - 1:
        raise Untranslatable(f"{name}: needs one milestone fewer than schedulers (torch raises "
                             "the same)", rule=name)
    parts, notes = [], []
    for el in scheds.elements:
        node = el.value
        sub = resolve(node)
        if sub is None and isinstance(node, cst.Call):
            qual = code(node.func)
            sub = translate_scheduler(node, _qualify(qual), _parse(base), resolve)
        if sub is None:
            raise Untranslatable(f"{name}: cannot tell which scheduler {code(node)} is",
                                 rule=name)
        if sub.fn is None or sub.momentum is not None:
            raise Untranslatable(f"{name}: {sub.torch_name} cannot be part of a sequence",
                                 rule=name)
        parts.append(code(sub.fn))
        notes += sub.notes
    fn = _call("optax.join_schedules", "[" + ", ".join(parts) + "]",
               boundaries="[" + ", ".join(str(m) for m in milestones) + "]")
    return Schedule("", _parse(fn), notes)


def _qualify(name: str) -> str:
    """A scheduler name as written (``lr_scheduler.StepLR``, ``StepLR``, ``optim.lr_...``)."""
    short = name.rsplit(".", 1)[-1]
    return f"torch.optim.lr_scheduler.{short}"


def _sched_lambda(a: _Args, base: str, resolve) -> Schedule:
    name = a.name
    fn_node = a.node("lr_lambda")
    if isinstance(fn_node, (cst.List, cst.Tuple)):
        raise Untranslatable(f"{name}: one lambda per param group: translate one schedule per "
                             "group", rule=name)
    if not isinstance(fn_node, cst.Lambda):
        note = ("warning", (f"{name}: {code(fn_node)} is called with the step count as a JAX "
                           "array under jit: it must be pure arithmetic (no Python if/int()/"
                           "math.* on the count)"))
        return Schedule("", _parse(_lambda(f"{_o(base)} * {_o(code(fn_node))}(count)")), [note])
    params = fn_node.params
    if len(params.params) != 1 or params.star_arg not in (None, cst.MaybeSentinel.DEFAULT) or (
            params.kwonly_params or params.posonly_params):
        raise Untranslatable(f"{name}: lr_lambda must take one argument", rule=name)
    arg = params.params[0].name.value
    body = fn_node.body.visit(_LambdaBody(name, arg))
    text = f"lambda {arg}: {_o(base)} * {_o(code(body))}"
    return Schedule("", _parse(text))


_MATH = {
    "cos": "jnp.cos", "sin": "jnp.sin", "tan": "jnp.tan", "exp": "jnp.exp", "log": "jnp.log",
    "log2": "jnp.log2", "log10": "jnp.log10", "log1p": "jnp.log1p", "sqrt": "jnp.sqrt",
    "tanh": "jnp.tanh", "floor": "jnp.floor", "ceil": "jnp.ceil", "fabs": "jnp.abs",
    "pow": "jnp.power", "acos": "jnp.arccos", "asin": "jnp.arcsin", "atan": "jnp.arctan",
    "minimum": "jnp.minimum", "maximum": "jnp.maximum", "abs": "jnp.abs", "clip": "jnp.clip",
    "where": "jnp.where", "power": "jnp.power", "trunc": "jnp.trunc", "expm1": "jnp.expm1",
}
_MATH_CONSTANTS = {"pi": "jnp.pi", "e": "jnp.e", "inf": "jnp.inf"}
_MATH_MODULES = ("math", "np", "numpy")


class _LambdaBody(cst.CSTTransformer):
    """A LambdaLR body as JAX: the count is a traced array, so Python's min/max/if/int()
    and math.* become jnp operations."""

    def __init__(self, name: str, arg: str) -> None:
        self.name, self.arg = name, arg

    def _fail(self, node: cst.CSTNode, why: str) -> None:
        raise Untranslatable(f"{self.name}: lr_lambda uses {code(node)}: {why}", rule=self.name)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._fail(node, "a nested lambda")
        return False

    def leave_Attribute(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value in _MATH_MODULES:
            attr = updated.attr.value
            if attr in _MATH_CONSTANTS:
                return _parse(_MATH_CONSTANTS[attr])
        return updated

    def leave_Call(self, original, updated):
        func = updated.func
        args = [a.value for a in updated.args]
        if any(a.star or a.keyword is not None for a in updated.args):
            self._fail(original, "keyword or starred arguments")
        if isinstance(func, cst.Name):
            fn = func.value
            if fn in ("min", "max") and len(args) >= 2:
                out = code(args[0])
                for other in args[1:]:
                    out = f"jnp.{'minimum' if fn == 'min' else 'maximum'}({out}, {code(other)})"
                return _parse(out)
            if fn == "abs" and len(args) == 1:
                return _parse(f"jnp.abs({code(args[0])})")
            if fn == "float" and len(args) == 1:
                return _parse(f"jnp.asarray({code(args[0])}, float)")
            if fn == "int" and len(args) == 1:
                return _parse(f"jnp.trunc({code(args[0])})")
            if fn == "round" and len(args) == 1:
                return _parse(f"jnp.round({code(args[0])})")
            if fn == "pow" and len(args) == 2:
                return _parse(f"jnp.power({code(args[0])}, {code(args[1])})")
            self._fail(original, "only arithmetic, min/max/abs/float/int/round and math.* "
                                 "translate to a jit-safe schedule")
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and (
                func.value.value in _MATH_MODULES) and func.attr.value in _MATH:
            return updated.with_changes(func=_parse(_MATH[func.attr.value]))
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and (
                func.value.value == "jnp"):
            return updated
        self._fail(original, "a call that is not plain arithmetic")
        return updated

    def leave_IfExp(self, original, updated):
        return _parse(f"jnp.where({code(updated.test)}, {code(updated.body)}, "
                      f"{code(updated.orelse)})")

    def leave_BooleanOperation(self, original, updated):
        fn = "jnp.logical_and" if isinstance(updated.operator, cst.And) else "jnp.logical_or"
        return _parse(f"{fn}({code(updated.left)}, {code(updated.right)})")

    def leave_UnaryOperation(self, original, updated):
        if isinstance(updated.operator, cst.Not):
            return _parse(f"jnp.logical_not({code(updated.expression)})")
        return updated

    def leave_Comparison(self, original, updated):
        if len(updated.comparisons) == 1:
            return updated
        left, pairs = updated.left, []
        for target in updated.comparisons:
            pairs.append(cst.Comparison(left=left, comparisons=[target.with_changes()]))
            left = target.comparator
        out = code(pairs[0])
        for p in pairs[1:]:
            out = f"jnp.logical_and({out}, {code(p)})"
        return _parse(out)


def _sched_plateau(a: _Args, base: str, resolve) -> Schedule:
    name = a.name
    mode = a.require("mode", (str,), "'min' or 'max'")
    tmode = a.require("threshold_mode", (str,), "'rel' or 'abs'")
    factor = a.lit("factor")
    if mode not in ("min", "max") or tmode not in ("rel", "abs"):
        raise Untranslatable(f"{name}: mode={mode!r}, threshold_mode={tmode!r}", rule=name)
    if mode == "max" and tmode == "rel":
        raise Untranslatable(f"{name}: mode='max' with threshold_mode='rel' (better means "
                             "a > best * (1 + threshold)) has no optax form: "
                             "optax.contrib.reduce_on_plateau only knows "
                             "a < (1 - rtol) * best - atol; use threshold_mode='abs'", rule=name)
    threshold = a.node("threshold")
    if _is_zero(threshold):
        raise Untranslatable(f"{name}: threshold=0 (optax needs a positive rtol or atol)",
                             rule=name)
    if isinstance(factor, (int, float)) and not 0 < factor < 1:
        raise Untranslatable(f"{name}: factor={factor} (optax needs 0 < factor < 1)", rule=name)
    min_lr = a.node("min_lr")
    if isinstance(min_lr, (cst.List, cst.Tuple)):
        raise Untranslatable(f"{name}: one min_lr per param group is not translated", rule=name)
    patience = a.node("patience")
    kw = {
        "factor": a.code("factor"),
        # torch reduces when num_bad_epochs > patience, optax when plateau_count == patience
        "patience": _fold("+", patience, "1"),
        "rtol": _c(threshold) if tmode == "rel" else "0.0",
        "atol": "0.0" if tmode == "rel" else _c(threshold),
        "cooldown": a.code("cooldown"),
        "accumulation_size": "1",
        "min_scale": "0.0" if _is_zero(min_lr) else _fold("/", min_lr, base),
    }
    plateau = _call("optax.contrib.reduce_on_plateau", **kw)
    notes = [("warning", (f"{name}: optax.contrib.reduce_on_plateau scales the updates by "
                         "plateau_state.scale; step it with value=<metric> where torch calls "
                         "scheduler.step(metric) and use lr * scale from the next step on. "
                         "patience is +1 (torch reduces after patience+1 bad epochs); min_lr "
                         "becomes the relative min_scale; torch's eps (skip tiny lr changes) "
                         "has no optax counterpart"))]
    if mode == "max":
        notes.append(("warning", f"{name}: mode='max': pass value=-metric"))
    return Schedule("", None, notes, plateau=_parse(plateau), negate_metric=mode == "max")


_SCHED_EMITTERS: dict[str, Callable[[_Args, str, Any], Schedule]] = {
    "StepLR": _sched_step, "MultiStepLR": _sched_multistep,
    "ExponentialLR": _sched_exponential, "CosineAnnealingLR": _sched_cosine,
    "LinearLR": _sched_linear, "ConstantLR": _sched_constant, "OneCycleLR": _sched_onecycle,
    "SequentialLR": _sched_sequential, "LambdaLR": _sched_lambda,
    "PolynomialLR": _sched_polynomial, "ReduceLROnPlateau": _sched_plateau,
}
