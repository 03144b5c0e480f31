"""``torch.utils.checkpoint``: gradient checkpointing as rematerialisation.

``checkpoint(fn, *args)`` recomputes ``fn``'s activations in the backward pass instead of
keeping them. JAX's form depends on what ``fn`` touches:

* a function that reads ``self`` (densenet's ``closure`` calling ``self.bn_function``), or a
  method: ``nnx.remat`` (linen: ``nn.remat``) with the module passed as the first argument. A
  closure over ``self`` cannot update BatchNorm statistics inside the transform (NNX refuses to
  mutate a variable from another trace level), so the closure takes ``self`` as a parameter
  (shadowing the outer one: its body is unchanged), and a method is taken unbound,
  ``type(self).method``;
* a layer (``self.block``, a loop variable over ``self.layers``): the same, through
  ``lambda m, *xs: m(*xs)``;
* a pure function (no ``self``, no module among the arguments): ``jax.checkpoint``.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call, expr

CHECKPOINT = "torch.utils.checkpoint.checkpoint"
SEQUENTIAL = "torch.utils.checkpoint.checkpoint_sequential"
# torch's own switches, with no meaning for a JAX transform (its randomness is the keys')
FLAGS = {"use_reentrant", "preserve_rng_state", "determinism_check", "debug"}


def with_self_param(fn: cst.FunctionDef | cst.Lambda) -> cst.FunctionDef | cst.Lambda:
    """``def closure(*inputs)`` -> ``def closure(self, *inputs)``."""
    params = fn.params
    first = cst.Param(cst.Name("self"), comma=cst.Comma(
        whitespace_after=cst.SimpleWhitespace(" ")) if (
            params.posonly_params or params.params or params.star_arg != cst.MaybeSentinel.DEFAULT
            or params.kwonly_params or params.star_kwarg) else cst.MaybeSentinel.DEFAULT)
    if params.posonly_params:
        return fn.with_changes(params=params.with_changes(
            posonly_params=[first, *params.posonly_params]))
    return fn.with_changes(params=params.with_changes(params=[first, *params.params]))


def split_args(original: cst.Call, updated: cst.Call) -> tuple[cst.BaseExpression,
                                                                 cst.BaseExpression, list[cst.Arg]]:
    """checkpoint's function (original and rewritten) and the arguments it is called with,
    torch's switches dropped."""
    kept = [(o, u) for o, u in zip(original.args, updated.args)
            if not (o.keyword and o.keyword.value in FLAGS)]
    if not kept or kept[0][0].keyword or kept[0][0].star:
        raise Untranslatable("checkpoint without its function as the first argument",
                             rule=CHECKPOINT)
    extra = [o.keyword.value for o, _ in kept[1:] if o.keyword]
    if extra:
        raise Untranslatable(f"checkpoint(..., {extra[0]}=...): keyword arguments (context_fn, "
                             "the function's own) are not translated", rule=CHECKPOINT)
    return kept[0][0].value, kept[0][1].value, [u for _, u in kept[1:]]


def remat_call(transform: str, fn: cst.BaseExpression, args: list[cst.Arg],
               module: cst.BaseExpression | None = None) -> cst.Call:
    """``transform(fn)(module, *args)``."""
    first = [arg(module)] if module is not None else []
    return call(call(transform, arg(fn)), *first, *args)


def layer_call(transform: str, layer: cst.BaseExpression, args: list[cst.Arg]) -> cst.Call:
    """A layer checkpointed: ``nnx.remat(lambda m, *xs: m(*xs))(layer, *args)``."""
    return remat_call(transform, expr("lambda m, *xs: m(*xs)"), args, layer)


def sequential_args(original: cst.Call, updated: cst.Call) -> list[cst.Arg]:
    """checkpoint_sequential(functions, segments, input): its three arguments, by position."""
    kept = [(o, u) for o, u in zip(original.args, updated.args)
            if not (o.keyword and o.keyword.value in FLAGS)]
    names = ("functions", "segments", "input")
    by_name: dict[str, cst.BaseExpression] = {}
    for i, (o, u) in enumerate(kept):
        key = o.keyword.value if o.keyword else (names[i] if i < 3 and not o.star else None)
        if key not in names:
            raise Untranslatable("checkpoint_sequential with arguments other than functions, "
                                 "segments and input", rule=SEQUENTIAL)
        by_name[key] = u.value
    if len(by_name) != 3:
        raise Untranslatable("checkpoint_sequential without functions, segments and input",
                             rule=SEQUENTIAL)
    return [arg(by_name[n]) for n in names]
