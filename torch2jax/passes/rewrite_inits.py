"""Parameter initialisation written in torch's in-place form: ``nn.init.*_(w, ...)``,
``w.data.normal_(...)``, ``calculate_gain``, on a converted layer's weight after construction
(the JAX initialiser drawn from ``rngs.params()`` into the variable).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.passes import torch_init
from torch2jax.passes.common import Untranslatable, bind, code, expr
from torch2jax.passes.helpers import HELPERS
from torch2jax.passes.rewrite_support import _fix_commas


class InitsMixin:
    def _calculate_gain(self, updated: cst.Call) -> cst.BaseExpression:
        """``nn.init.calculate_gain('relu')`` -> its number (torch_init.calculate_gain)."""
        q = "torch.nn.init.calculate_gain"
        b = bind(updated.args, ("nonlinearity", "param"))
        gain = None if b.star else torch_init.calculate_gain(
            b.literal("nonlinearity", ...), b.literal("param", None))
        if gain is None:
            raise Untranslatable(f"{q} of {code(updated.args[0].value) if updated.args else '?'}"
                                 ": a nonlinearity not written out as one of torch's names",
                                 rule=q)
        return cst.Float(repr(gain))

    def _param_fill(self, call: cst.Call) -> str | None:
        """``self.emb.weight.data.uniform_(-r, r)`` / ``m.weight.data.normal_(0, 0.02)`` /
        ``m.bias.data.zero_()`` / ``.fill_(v)`` as a statement, on NNX, on a layer's (or the
        class's own) weight or bias: the ``torch.nn.init`` function that does the same
        (``uniform_``, ``normal_``, ``zeros_``, ``constant_``), else None."""
        fills = {"normal_": "normal_", "uniform_": "uniform_", "zero_": "zeros_",
                 "fill_": "constant_"}
        if not (self.target.stateful_modules and m.matches(call.func, m.Attribute(
                attr=m.OneOf(*(m.Name(f) for f in fills))))
                and isinstance(self.get_metadata(ParentNodeProvider, call, None), cst.Expr)):
            return None
        recv = call.func.value
        if m.matches(recv, m.Attribute(attr=m.Name("data"))):
            recv = recv.value
        if not m.matches(recv, m.Attribute(value=m.Name() | m.Attribute(),
                                           attr=m.Name("weight") | m.Name("bias"))):
            return None
        return fills[call.func.attr.value]

    def _param_fill_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """:meth:`_param_fill`'s statement, as its ``torch.nn.init`` call."""
        fn = self._param_fill(original_node.value)
        new = updated_node.value
        if fn is None or not isinstance(new, cst.Call) or not isinstance(new.func,
                                                                         cst.Attribute):
            return None
        args = [a.with_changes(keyword=cst.Name("val")) if a.keyword and (
            a.keyword.value == "value") else a for a in new.args]
        init = new.with_changes(func=expr(f"torch.nn.init.{fn}"),
                                args=_fix_commas([cst.Arg(new.func.value), *args]))
        q = f"torch.nn.init.{fn}"
        try:
            return self._init_statement(original_node, updated_node.with_changes(value=init), q)
        except Untranslatable as exc:
            self.diag(original_node, exc.rule or q, "error", exc.message)
            return updated_node

    def _init_statement(self, original_node: cst.Expr, updated_node: cst.Expr, q: str):
        """torch.nn.init.normal_(module.weight, std=0.02) -> module.kernel.value = ..."""
        fn = q.rsplit(".", 1)[-1]
        new_call = updated_node.value
        params = {"normal_": ("tensor", "mean", "std"), "uniform_": ("tensor", "a", "b"),
                  "zeros_": ("tensor",), "ones_": ("tensor",), "constant_": ("tensor", "val"),
                  "trunc_normal_": ("tensor", "mean", "std", "a", "b"),
                  "trunc_normal_tf_": ("tensor", "mean", "std", "a", "b")}
        fans = {"kaiming_normal_": ("tensor", "a", "mode", "nonlinearity"),
                "kaiming_uniform_": ("tensor", "a", "mode", "nonlinearity"),
                "xavier_normal_": ("tensor", "gain"), "xavier_uniform_": ("tensor", "gain")}
        if fn in fans:
            return self._fan_init(new_call, fn, fans[fn], q)
        if fn in ("lecun_normal_", "variance_scaling_"):
            return self._variance_scaling_init(new_call, fn, q)
        if fn == "orthogonal_":
            return self._orthogonal_init(new_call, q)
        if fn not in params:
            raise Untranslatable(f"{q}: structured initialisers are not translated; set the "
                                 "layer's kernel_init instead", rule=q)
        b = bind(new_call.args, params[fn])
        t = b.get("tensor")
        if (b.star and not torch_init.spread_bounds(fn, b)) or not isinstance(t, (
                cst.Attribute, cst.Name)):
            raise Untranslatable(f"{q} of a computed tensor", rule=q)
        if m.matches(t, m.Attribute(value=m.Attribute(value=m.Name() | m.Attribute()),
                                    attr=m.Name("data"))):
            t = t.value  # normal_(m.weight.data, ...): the parameter's value is set either way
        v = expr("{t}.value", t=t)
        if torch_init.weight_of_a_sublayer(t, self, original_node) and self.target.helper_target in HELPERS.get(
                "layer_weight", {}):
            # self.conv3.bn.weight, bn built in another module: an elementwise fill does not
            # depend on the layout, the parameter is found at run time (cspnet's zero_init_last)
            v = expr("layer_weight({layer}).value", layer=t.value)
        elif isinstance(t, cst.Attribute) and (t.attr.value == "data" or (
                t.attr.value == "weight" and not m.matches(t.value, m.Name("self")))):
            # m.weight where m's layer type is not known (a test of m.__class__.__name__,
            # not isinstance): NNX names it kernel, scale or embedding by type
            raise Untranslatable(f"{q} of {code(t)}: the layer type is not known here (NNX "
                                 "names a weight kernel, scale or embedding by layer type); "
                                 "test it with isinstance(m, nn.Conv2d) and so on", rule=q)
        shape = f"{code(v)}.shape, {code(v)}.dtype"
        g = lambda n, d: code(b.get(n)) if b.get(n) is not None else d
        if fn in ("normal_", "uniform_", "trunc_normal_", "trunc_normal_tf_") and not (
                self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        key = "rngs.params()"
        if fn == "normal_":
            value = f"{g('mean', '0.0')} + {g('std', '1.0')} * jax.random.normal({key}, {shape})"
        elif fn == "uniform_":
            value = f"jax.random.uniform({key}, {shape}, {torch_init.uniform_bounds(b)})"
        elif fn == "trunc_normal_":
            mean, std = g("mean", "0.0"), g("std", "1.0")
            lo, hi = g("a", "-2.0"), g("b", "2.0")
            value = (f"{mean} + {std} * jax.random.truncated_normal({key}, ({lo} - {mean}) / "
                     f"{std}, ({hi} - {mean}) / {std}, {shape})")
        elif fn == "trunc_normal_tf_":  # timm's: the cut-offs are in units of std
            value = (f"{g('mean', '0.0')} + {g('std', '1.0')} * jax.random.truncated_normal("
                     f"{key}, {g('a', '-2.0')}, {g('b', '2.0')}, {shape})")
        elif fn == "zeros_":
            value = f"jnp.zeros_like({code(v)})"
        elif fn == "ones_":
            value = f"jnp.ones_like({code(v)})"
        else:
            value = f"jnp.full_like({code(v)}, {g('val', '0.0')})"
        self.need("jax", "jnp")
        return cst.Assign(targets=[cst.AssignTarget(v)], value=cst.parse_expression(value))

    def _orthogonal_init(self, new_call: cst.Call, q: str):
        """orthogonal_(w, gain) -> jax.nn.initializers.orthogonal(gain) on the JAX weight.
        torch makes the weight flattened to (shape[0], rest) orthogonal; JAX the weight
        flattened to (rest, shape[column_axis]). NNX's Linear and Conv kernels (*k, in, out)
        (ConvTranspose's (*k, out, in)) hold torch's first axis last, the default
        column_axis=-1: the same matrix, transposed (and its rows permuted), whose
        distribution is torch's. A 2-d weight (an embedding) is the same matrix either way."""
        b = bind(new_call.args, ("tensor", "gain"))
        t = b.get("tensor")
        if b.star or not m.matches(t, m.Attribute(attr=m.Name("kernel") | m.Name(
                "embedding"))):
            raise Untranslatable(f"{q} of {code(t) if t is not None else '?'}: only Linear "
                                 "and Conv kernels and embeddings are translated", rule=q)
        if not (self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        gain = b.literal("gain", 1.0)
        if not isinstance(gain, (int, float)) or isinstance(gain, bool):
            raise Untranslatable(f"{q} with a computed gain", rule=q)
        v = code(t) + ".value"
        self.need("jax")
        return cst.Assign(targets=[cst.AssignTarget(expr(v))], value=expr(
            f"jax.nn.initializers.orthogonal({float(gain)!r})("
            f"rngs.params(), {v}.shape, {v}.dtype)"))

    def _fan_init(self, new_call: cst.Call, fn: str, params: tuple[str, ...], q: str):
        """kaiming_* / xavier_*: jax.nn.initializers.variance_scaling, whose fans (in axis -2,
        out axis -1, the rest receptive field) are torch's for NNX Linear and Conv kernels."""
        import math

        b = bind(new_call.args, params)
        t = b.get("tensor")
        if not m.matches(t, m.Attribute(attr=m.Name("kernel"))):
            raise Untranslatable(f"{q} of {code(t) if t is not None else '?'}: only Linear and "
                                 "Conv kernels have torch's fans in JAX's layout", rule=q)
        if not (self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        if fn.startswith("kaiming"):
            mode = b.literal("mode", "fan_in")
            nl = b.literal("nonlinearity", "leaky_relu")
            a = b.literal("a", 0)
            gains = {"relu": 2.0, "linear": 1.0, "sigmoid": 1.0, "conv1d": 1.0, "conv2d": 1.0,
                     "conv3d": 1.0, "tanh": 25.0 / 9.0, "selu": 9.0 / 16.0}
            if nl == "leaky_relu" and isinstance(a, (int, float)):
                scale = 2.0 / (1 + a * a)
            elif nl in gains:
                scale = gains[nl]
            else:
                raise Untranslatable(f"{q} with nonlinearity={nl!r}, a={a!r}", rule=q)
            if mode not in ("fan_in", "fan_out"):
                raise Untranslatable(f"{q} with mode={mode!r}", rule=q)
        else:
            gain = b.literal("gain", 1.0)
            if not isinstance(gain, (int, float)):
                raise Untranslatable(f"{q} with a computed gain", rule=q)
            scale, mode = float(gain) ** 2, "fan_avg"
        dist = "normal" if fn.endswith("normal_") else "uniform"
        v = code(t) + ".value"
        scale_text = repr(round(scale, 12)) if not math.isclose(scale, 2.0) else "2.0"
        self.need("jax")
        return cst.Assign(targets=[cst.AssignTarget(expr(v))], value=expr(
            f'jax.nn.initializers.variance_scaling({scale_text}, "{mode}", "{dist}")('
            f"rngs.params(), {v}.shape, {v}.dtype)"))

    def _variance_scaling_init(self, new_call: cst.Call, fn: str, q: str):
        """timm's ``lecun_normal_(w)`` / ``variance_scaling_(w, scale, mode, distribution)``:
        jax.nn.initializers.variance_scaling, whose distributions are timm's (the truncated
        normal cut at two standard deviations, rescaled by .8796...). The fans are torch's
        (in: axis 1, out: axis 0, times the rest): JAX's default axes on an NNX Linear or Conv
        kernel, axes 1 and 0 on a parameter of the module, which keeps torch's layout."""
        params = ("tensor",) if fn == "lecun_normal_" else (
            "tensor", "scale", "mode", "distribution")
        b = bind(new_call.args, params)
        t = b.get("tensor")
        axes = ""
        info = self.index.classes.get(self.current_class or "")
        if b.star or t is None:
            raise Untranslatable(f"{q} of a tensor not written out", rule=q)
        if m.matches(t, m.Attribute(value=m.Name("self"), attr=m.Name())) and info is not None \
                and t.attr.value in info.tensor_attrs:
            axes = ", in_axis=1, out_axis=0"  # torch's layout (a 2-d or larger parameter)
        elif not m.matches(t, m.Attribute(attr=m.Name("kernel"))):
            raise Untranslatable(f"{q} of {code(t)}: only Linear and Conv kernels and the "
                                 "module's own parameters have torch's fans here", rule=q)
        if not (self._rngs_scope and self._rngs_scope[-1]):
            raise Untranslatable(f"{q} outside module construction: no key", rule=q)
        scale = b.literal("scale", 1.0)
        mode = b.literal("mode", "fan_in")
        dist = "truncated_normal" if fn == "lecun_normal_" else b.literal(
            "distribution", "normal")
        if (not isinstance(scale, (int, float)) or isinstance(scale, bool)
                or mode not in ("fan_in", "fan_out", "fan_avg")
                or dist not in ("normal", "truncated_normal", "uniform")):
            raise Untranslatable(f"{q} with scale, mode or distribution not written out as "
                                 "one of timm's", rule=q)
        v = code(t) + ".value"
        self.need("jax")
        return cst.Assign(targets=[cst.AssignTarget(expr(v))], value=expr(
            f'jax.nn.initializers.variance_scaling({float(scale)!r}, "{mode}", "{dist}"{axes})'
            f"(rngs.params(), {v}.shape, {v}.dtype)"))
