"""Layer construction: torch layers to JAX layers, containers, subclasses of torch layers,
layer factories (classes and partials as values), dropout layers (parameter init written in
torch's in-place form: passes/rewrite_inits.py).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import itertools
import re

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.index import Layouts, ordered_dict_items, spread_literals
from torch2jax.analysis.layer_lists import built_layout
from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.passes import inplace_inputs as ii
from torch2jax.passes import torch_init
from torch2jax.passes.common import (
    Untranslatable,
    arg,
    bind,
    call,
    code,
    expr,
    is_simple,
    try_literal,
)
from torch2jax.passes.conv_subclass import HELPER_BASES
from torch2jax.passes.filtered_layers import with_filtered_transposes
from torch2jax.passes.helpers import HELPERS
from torch2jax.passes.layer_choices import layer_choices
from torch2jax.passes.registry import spatial_dims
from torch2jax.passes.rewrite_support import (
    _EINOPS_FUNCTIONS,
    _LAYER_ATTRIBUTES,
    _activation_value,
    _indexed_sequence,
    _is_dotted_text,
    _rule_args,
)
from torch2jax.passes.special import batch_norm_helper
from torch2jax.passes.specials import SPECIALS, Site
from torch2jax.ruleset import Rule, weight_source
from torch2jax.targets import linen as linen_target
from torch2jax.targets import linen_training as lt

# torch.nn.functional.batch_norm's parameters (the subclass forward of a BatchNorm, above)
BATCH_NORM_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "training",
                     "momentum", "eps")

FLAT_EXAMPLE = "lambda x: x.reshape(-1)"  # nn.Flatten() for one example (special.py)
# torch's tensor types, also legacy constructors (rules/functions.toml: torch.Tensor(2, 3))
_TENSOR_TYPES = ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor")


class LayersMixin:
    def _einops_layer(self, updated: cst.Call, name: str) -> cst.BaseExpression:
        """``Rearrange('b c h w -> b (h w) c')`` (einops' torch layer: it calls torch's
        methods on its input) -> ``lambda t: einops.rearrange(t, 'b c h w -> b (h w) c')``,
        the same einops function on JAX arrays; ``Reduce(pattern, 'mean', h=2)`` likewise
        with einops.reduce. EinMix holds weights: marked."""
        layer = name.rsplit(".", 1)[-1]
        if layer not in _EINOPS_FUNCTIONS:
            raise Untranslatable(f"einops.layers.torch.{layer}: a layer with weights built by "
                                 "einops for torch, not translated; write its einsum with an "
                                 "nnx.Param (or einops.layers.flax for linen)", rule=name)
        fn, positional = _EINOPS_FUNCTIONS[layer]
        b = bind(updated.args, positional)
        if b.star or b.extra_positional or any(b.get(p) is None for p in positional):
            raise Untranslatable(f"einops.layers.torch.{layer} with arguments not written "
                                 "out", rule=name)
        parts = [code(b.get(p)) for p in positional]
        parts += [f"{k}={code(v)}" for k, v in b.named.items() if k not in positional]
        self.need("einops")
        one = per_example_pattern(b.get("pattern")) if self.target.intermediate else None
        if one is not None:  # (the equinox pass's layers take one example)
            parts[0] = one
            out = expr(f"lambda t: einops.{fn}(t, {', '.join(parts)})")
            self.per_example_code.add(code(out))
            return out
        return expr(f"lambda t: einops.{fn}(t, {', '.join(parts)})")

    def _holds_layer(self, attr: str) -> bool:
        """``self.<attr>`` of the current module class is assigned a layer somewhere: a torch
        layer or module class, or a call of a module class held in a local of this function
        (``inception_aux = inception_blocks[6]``)."""
        if self.target.setup_modules:
            return False
        info = self.index.classes[self.current_class]
        if attr in info.module_attrs:
            return True
        return bool(self._fn_stack and info.built_by.get(attr, set())
                    & self._module_class_locals())

    def _holds_module(self, attr: str) -> bool:
        """``self.<attr>`` holds a layer that is an NNX module (its ``None`` elsewhere is
        data), not a pooling or activation function (static, as ``None`` is: hieradet_sam2's
        ``self.pool = None``, then ``nn.MaxPool2d(...)`` in a branch)."""
        info = self.index.classes[self.current_class]
        rule = self.rules.layers.get(info.attr_rule.get(attr, ""))
        nnx_target = rule.targets.get("nnx", "") if rule is not None else ""
        if any(n.endswith(("norm_layer", "conv_layer")) for n in info.built_by.get(attr, ())):
            return True  # self.norm_q = norm_layer(dim) later (mvitv2): a module
        # (a class: nnx.Conv, a helper's BatchNorm; not nnx.max_pool, partial(...), a lambda)
        built = nnx_target.split("(")[0].rsplit(".", 1)[-1]
        return self._holds_layer(attr) and (rule is None or built[:1].isupper())

    def _layer_container(self, node: cst.BaseExpression) -> bool:
        """``self.heads`` holding a ModuleDict / ModuleList (``self.heads["a"] = layer``), or
        ``self`` in a subclass of one."""
        info = self.index.classes.get(self.current_class or "")
        if info is None:
            return False
        if m.matches(node, m.Name("self")):
            return info.container in ("module_dict", "module_list")
        return m.matches(node, m.Attribute(value=m.Name("self"))) and info.attr_rule.get(
            node.attr.value) in ("torch.nn.ModuleDict", "torch.nn.ModuleList")

    def _inplace_input(self, call: cst.Call) -> None:
        """``self.block(x)`` where ``self.block`` activates its input in place (an
        ``nn.ReLU(inplace=True)`` first): ``x`` rebound to the activated value before the
        statement, or a read of it after the call marked (passes/inplace_inputs.py)."""
        info = self.index.classes.get(self.current_class or "")
        if info is None or not self._fn_stack or self._fn_stack[-1].name.value == "__init__" \
                or not m.matches(call.func, m.Attribute(value=m.Name("self"))):
            return
        act = ii.inplace_activation(info.attr_ctor.get(call.func.attr.value), self.q)
        if act is None:
            return
        statement: cst.CSTNode | None = self.get_metadata(ParentNodeProvider, call, None)
        while statement is not None and not isinstance(statement, (
                cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            statement = self.get_metadata(ParentNodeProvider, statement, None)
        if statement is None:
            return
        seen = ii.visible_reads(self._fn_stack[-1], call, statement,
                                lambda n: self.get_metadata(ParentNodeProvider, n, None),
                                lambda n: self.get_metadata(PositionProvider, n))
        if seen is None or not seen.read:
            return
        if seen.rebind and act in ii.IDEMPOTENT and self._pending:
            self.need("jax")
            self._pending[-1].before.append(cst.parse_statement(
                f"{seen.name} = {ii.IDEMPOTENT[act]}({seen.name})  # torch's in-place "
                f"{act.rsplit('.', 1)[-1]} in self.{call.func.attr.value}\n"))
            return
        self.diag(call, "inplace-input", "error",
                  f"self.{call.func.attr.value} applies {act.rsplit('.', 1)[-1]}(inplace=True) "
                  f"to {seen.name} in torch, and {seen.name} is read after this call: torch "
                  "reads the activated values, JAX arrays are not changed in place")

    def _tensor_type_value(self, original: cst.Name, parent: cst.CSTNode | None) -> bool:
        """``Tensor`` (from torch) as a value outside annotations: a namedtuple's
        ``__annotations__ = {"logits": Tensor, "aux": Optional[Tensor]}`` (googlenet). Not an
        import, a construction or an isinstance check (handled there)."""
        if self.q(original) not in _TENSOR_TYPES:
            return False
        if isinstance(parent, (cst.ImportAlias, cst.Call)):
            return False
        if isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            return not m.matches(outer, m.Call(func=m.Name("isinstance")))
        return True

    def _class_check_tuple(self, node: cst.CSTNode | None) -> bool:
        """``whitelist = (nn.Linear, nn.Conv2d)`` in a function that reads ``whitelist`` only
        as the classes of ``isinstance(m, whitelist)`` (minGPT's configure_optimizers): the
        layer classes are the classes NNX builds, as in an isinstance call itself."""
        assign = node
        if not self._fn_stack or not m.matches(assign, m.Assign(
                targets=[m.AssignTarget(target=m.Name())], value=m.Tuple())):
            return False
        name = assign.targets[0].target.value
        fn = self._fn_stack[-1]
        reads = [n for n in m.findall(fn, m.Name(name))]
        checks = [c for c in m.findall(fn, m.Call(func=m.Name("isinstance"), args=[
            m.Arg(), m.Arg(value=m.Name(name))]))]
        return bool(checks) and len(reads) == len(checks) + 1 and len(
            m.findall(fn, m.AssignTarget(target=m.Name(name)))) == 1

    def _layer_class_value(self, original: cst.BaseExpression) -> cst.BaseExpression | None:
        """``norm_layer = nn.BatchNorm2d``: a torch layer class used as a value (a factory)."""
        q = self.q(original)
        rule = self.rules.layers.get(q or "")
        if rule is None or self._in_annotation:
            return None
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if isinstance(parent, cst.Call) and parent.func is original:
            return None  # a construction: handled as a call
        if isinstance(parent, cst.Arg) and isinstance(
                self.get_metadata(ParentNodeProvider, parent, None), cst.ClassDef):
            return None  # a base class: handled with the class
        if isinstance(parent, cst.Arg) and not parent.keyword:
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if (isinstance(outer, cst.Call) and outer.args and outer.args[0] is parent
                    and self.q(outer.func) == "functools.partial"
                    and rule.special in ("batch_norm", "layer_norm", "activation_with_args")):
                return None  # partial(nn.LayerNorm, eps=1e-6): translated as a whole
        if isinstance(parent, (cst.Arg, cst.Element)):
            grand = self.get_metadata(ParentNodeProvider, parent, None)
            while isinstance(grand, (cst.Tuple, cst.Element)):
                grand = self.get_metadata(ParentNodeProvider, grand, None)
            if isinstance(grand, cst.Call) and m.matches(grand.func, m.Name("isinstance")):
                return None
            if isinstance(grand, cst.Arg):
                grand = self.get_metadata(ParentNodeProvider, grand, None)
                if isinstance(grand, cst.Call) and m.matches(grand.func, m.Name("isinstance")):
                    return None
            if self._class_check_tuple(grand):
                target = rule.targets.get(self.target.name)
                if target and re.fullmatch(r"nnx\.[A-Z]\w*", target):
                    return expr(target)
                self.diag(original, "isinstance", "error",
                          f"isinstance check against {q}: no single JAX class")
                return None
        if rule.special == "batch_norm" and "BatchNorm" in self.index.defined:
            self.diag(original, rule.id, "error", f"{q} as a value: the file defines its own "
                      "BatchNorm, the name of the converter's BatchNorm helper class: rename it")
            return None
        if rule.special == "batch_norm" and self.target.setup_modules:
            self.need("partial", "linen")
            return expr(f"partial(BatchNorm, use_running_average=not {self._linen_train()}, "
                        "momentum=0.9, epsilon=1e-05)")
        if rule.special == "batch_norm" and self.target.stateful_modules:
            self.need("partial", "nnx")
            if self.index.factory_layouts == {rule.layout}:
                # its calls (norm_layer(planes)) are known to want channels-last input
                return expr("partial(BatchNorm, momentum=0.9, epsilon=1e-05)")
            helper = self._batch_norm_value(rule, q)
            if helper is not None:
                # torch's signature and name, called wherever the value goes (timm's
                # get_norm_act_layer rebinds a partial's keywords to its own class)
                self.diag(original, rule.id, "info", f"{q} as a value: the {helper} helper "
                          "class, torch's arguments on channels-first input (axis 1)")
                return cst.Name(helper)
            # normalises over every axis but 1: right for NCHW/NCL input without a transpose
            self.diag(original, rule.id, "info", f"{q} as a value: a BatchNorm factory on "
                      "axis 1 (channels first), so that it fits wherever it is used")
            return expr("partial(BatchNorm, axis=1, momentum=0.9, epsilon=1e-05)")
        if rule.special == "layer_norm" and self.target.stateful_modules:
            if "LayerNorm" not in self.index.defined and (
                    self.target.helper_target in HELPERS.get("LayerNorm", {})):
                # norm_layer = nn.LayerNorm, LayoutLM's alias, InternVL's NORM2FN table:
                # called with torch's arguments (eps=) wherever the value goes, a helper class
                # with that signature over nnx.LayerNorm
                return cst.Name("LayerNorm")
            # (swin's PatchMerging's norm_layer(size)): torch's epsilon, flax's being 1e-6
            self.need("partial", "nnx")
            return expr("partial(nnx.LayerNorm, epsilon=1e-05)")
        if rule.special == "conv" and self.target.stateful_modules:
            # conv_layer: Callable[..., nn.Module] = nn.Conv2d, called with Conv2d's arguments
            # wherever the value goes: a helper class with that signature and torch's layout
            return cst.Name(f"Conv{spatial_dims(rule.torch)}d")
        if rule.special == "pool" and self.target.stateful_modules:
            # aa_layer = nn.AvgPool2d, called with torch's arguments (kernel_size, stride, ...):
            # a helper class with that signature on NCHW input
            return cst.Name(q.rsplit(".", 1)[1])
        if rule.torch == "torch.nn.Linear" and self.target.stateful_modules:
            # linear_layer = nn.Linear, called with torch's arguments (bias=): a helper class
            # with that signature over nnx.Linear
            return cst.Name("Linear")
        if rule.special == "layer_norm" and self.target.stateful_modules:
            # norm_layer = nn.LayerNorm, called with the normalized size as nnx.LayerNorm is;
            # torch's eps (1e-5) written out, flax's default is 1e-6
            self.need("partial", "nnx")
            return expr("partial(nnx.LayerNorm, epsilon=1e-05)")
        activation = _activation_value(rule)
        if activation is not None and self.target.stateful_modules:
            # activation_layer = nn.ReLU6: the function itself; the calls of a parameter
            # defaulting to an activation class (activation_layer(inplace=True)) give it back
            self._note_imports(activation)
            return activation
        self.diag(original, rule.id, "error", f"the layer class {q} used as a value")
        return None

    def _function_value(self, original, rule: Rule) -> cst.BaseExpression | None:
        """``act = F.relu`` / ``interpolate = torch.nn.functional.interpolate``: a torch function
        used as a value, not called. A plain rename is its JAX function (with the keywords the
        rule always writes); one whose arguments are translated per call cannot be: the JAX
        function is named so that the module still imports, and marked."""
        parent = self.get_metadata(ParentNodeProvider, original, None)
        if (isinstance(parent, cst.Call) and parent.func is original) or isinstance(
                parent, cst.Attribute):
            return None
        if self.q(original) in _TENSOR_TYPES:
            return None  # the type as a value (torch.jit.annotate(torch.Tensor, x)): jax.Array
        target = rule.jax
        if not target or not _is_dotted_text(target):
            return None
        self._note_imports(expr(target))
        if rule.special == "gelu":  # torch's default is the exact erf form
            self.need("partial")
            return expr(f"partial({target}, approximate=False)")
        if rule.special is None and not rule.rename and set(rule.drop) <= {"inplace"}:
            if rule.emit:
                self.need("partial")
                return expr(f"partial({target}, " + ", ".join(
                    f"{k}={v!r}" for k, v in rule.emit.items()) + ")")
            return expr(target)
        self.diag(original, rule.id, "error",
                  f"{rule.torch} used as a value: its arguments are translated per call, and "
                  f"calls through this name are not; {target} takes other arguments")
        return expr(target)

    def _dropout_layer(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression | None:
        """``F.dropout(x, p=self.drop_rate, training=self.training)`` in a module's method: an
        ``nnx.Dropout`` attribute built at the end of ``__init__`` (it draws from ``rngs`` and
        follows ``.train()`` / ``.eval()``), called here. The rate must be a literal or an
        attribute ``__init__`` sets; any other call is left to the rule (marked)."""
        cls = self.current_class
        if (not self.target.stateful_modules or not self.in_module_class()
                or not self._class_inits.get(cls or "") or not self._fn_stack
                or self._fn_stack[-1].name.value == "__init__" or self._in_expr_scope):
            return None
        b = bind(original.args, ("input", "p", "training", "inplace"))
        if b.star or b.get("input") is None or not m.matches(
                b.get("training"), m.Attribute(value=m.Name("self"), attr=m.Name("training"))):
            return None
        info = self.index.classes[cls]
        p = b.get("p")
        if p is None:
            rate: cst.BaseExpression = cst.Float("0.5")
        elif isinstance(try_literal(p, ...), (int, float)) or (
                m.matches(p, m.Attribute(value=m.Name("self")))
                and p.attr.value in info.init_attrs):
            rate = p
        else:
            return None
        taken = set(info.init_attrs) | set(info.attr_layout) | info.module_attrs
        hoisted = self._dropouts.setdefault(cls, [])
        attr = next((a for a, r in hoisted if code(r) == code(rate)), None)
        if attr is None:
            attr = "dropout"
            n = 1
            while attr in taken or any(a == attr for a, _ in hoisted):
                attr, n = f"dropout{n}", n + 1
            hoisted.append((attr, rate))
        self.diag(original, "torch.nn.functional.dropout", "info",
                  f"F.dropout(..., training=self.training) became self.{attr}, an nnx.Dropout "
                  "built in __init__ (its key comes from rngs; .eval() turns it off)")
        x = bind(updated.args, ("input", "p", "training", "inplace")).get("input")
        self._training_hoisted[cls] = self._training_hoisted.get(cls, 0) + 1
        return call(f"self.{attr}", arg(x))

    def _add_dropouts(self, cls: str, node: cst.ClassDef) -> cst.ClassDef:
        """The nnx.Dropout layers of _dropout_layer, at the end of ``__init__``."""
        hoisted = self._dropouts.get(cls)
        if not hoisted:
            return node
        self.need("nnx")
        lines = [cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(expr(f"self.{attr}"))],
            value=call("nnx.Dropout", arg(rate), arg(cst.Name("rngs"), "rngs")))])
            for attr, rate in hoisted]
        body = [f.with_changes(body=f.body.with_changes(body=[*f.body.body, *lines]))
                if isinstance(f, cst.FunctionDef) and f.name.value == "__init__" else f
                for f in node.body.body]
        return node.with_changes(body=node.body.with_changes(body=body))

    def _layer_attribute(self, original: cst.Attribute, updated: cst.Attribute
                         ) -> cst.BaseExpression | None:
        """``self.drop.p`` where ``self.drop`` is an nn.Dropout: ``self.drop.rate`` (a
        hyperparameter the JAX layer keeps under another name)."""
        inner = original.value
        if self.target.setup_modules or not (isinstance(inner, cst.Attribute) and m.matches(
                inner.value, m.Name("self")) and self.current_class is not None):
            return None
        info = self.index.classes.get(self.current_class)
        torch_layer = info.attr_rule.get(inner.attr.value) if info is not None else None
        rule = self.rules.layers.get(torch_layer or "")
        ctor = info.attr_ctor.get(inner.attr.value)
        attr = original.attr.value
        if (attr in ("stride", "dilation", "padding") and rule is not None
                and rule.special == "conv"
                and not self.target.intermediate  # (equinox's Conv has torch's .stride)
                and torch_layer[-2:] in ("1d", "2d", "3d") and ctor is not None
                and not any(a.star for a in ctor.args)):
            # self.conv1.stride (Whisper's encoder), self.conv.dilation[0] and .padding[0]
            # (Mimi's causal padding): torch's tuples. nnx.Conv keeps what it was built with:
            # strides= / kernel_dilation= are written unless 1 (flax's default, an int), the
            # padding as (low, high) pairs
            given = bind(ctor.args, rule.params).get(attr)
            none = 0 if attr == "padding" else 1
            if given is None or m.matches(given, m.Integer(str(none))):
                return expr(repr((none,) * int(torch_layer[-2])))
            if attr == "padding":
                if isinstance(given, cst.SimpleString):  # "same" / "valid": torch keeps it
                    return given
                return expr("tuple(low for low, _ in {p})", p=updated)
            return updated.with_changes(attr=cst.Name(
                "strides" if attr == "stride" else "kernel_dilation"))
        new = _LAYER_ATTRIBUTES.get(torch_layer or "", {}).get(original.attr.value)
        if new is None:
            return None
        return updated.with_changes(attr=cst.Name(new))

    def _random_fill(self, original: cst.Call, updated: cst.Call,
                     key: cst.BaseExpression | None = None) -> cst.BaseExpression:
        """``torch.empty(1, n, d).normal_(std=0.02)`` while building layers (vit's position
        embedding): a draw of that shape from ``rngs.params()``; ``key``: from that key
        instead (``torch.empty_like(x).uniform_(a, b)`` in a module's method: x's shape and
        dtype)."""
        made = updated.func.value  # jnp.empty(shape, dtype=...)
        if not isinstance(made, cst.Call) or not made.args:
            raise Untranslatable("in-place random fill of a tensor built with no shape",
                                 rule="random")
        shape = made.args[0].value  # an int or a sequence: jax.random takes either
        dtype = [a for a in made.args[1:] if a.keyword and a.keyword.value == "dtype"]
        dtype_text = f", {code(dtype[0].value)}" if dtype else ""
        if self.q(original.func.value.func).endswith("_like"):
            if not is_simple(shape):
                raise Untranslatable("random fill of a tensor like a compound expression: "
                                     "assign it to a name first", rule="random")
            dtype_text = f", {code(dtype[0].value) if dtype else code(shape) + '.dtype'}"
            shape = expr("{x}.shape", x=shape)
        self.need("jax")
        key_text = code(key) if key is not None else "rngs.params()"
        if original.func.attr.value == "normal_":
            b = bind(updated.args, ("mean", "std"))
            draw = f"jax.random.normal({key_text}, {code(shape)}{dtype_text})"
            std, mean = b.get("std"), b.get("mean")
            if std is not None and try_literal(std, ...) != 1:
                draw = f"{code(std)} * {draw}"
            if mean is not None and try_literal(mean, ...) != 0:
                draw = f"{code(mean)} + {draw}"
            return expr(draw)
        b = bind(updated.args, ("from", "to"))
        low = b.get("from")
        high = b.get("to")
        return expr(f"jax.random.uniform({key_text}, {code(shape)}{dtype_text}, "
                    f"minval={code(low) if low is not None else '0.0'}, "
                    f"maxval={code(high) if high is not None else '1.0'})")

    def _layer_subclass_rule(self, cls: str | None) -> Rule | None:
        """The rule of the torch layer that module class ``cls`` of this file extends
        (``class LayerNorm2d(nn.LayerNorm)``), when the class derives from the JAX layer instead
        (NNX; a rule with a ``subclass`` table and a layer class as its target)."""
        info = self.index.classes.get(cls or "")
        if info is None or info.layer_base is None or not self.target.stateful_modules:
            return None
        rule = self.rules.layers[info.layer_base]
        target = rule.targets.get("nnx", "")
        if rule.subclass is None or not (target.startswith("nnx.") and target[4:5].isupper()):
            return None
        if rule.special in ("batch_norm", "conv") and self._batch_norm_base(cls) is None:
            return None
        return rule

    def _torch_signature_layer(self, cls: str | None) -> bool:
        """A subclass of a torch layer whose rule translates its arguments plainly (no special:
        ``class Linear(nn.Linear)``, timm's) and that defines no ``__init__`` along its chain:
        its JAX class is given an ``__init__`` of torch's signature
        (:meth:`_torch_signature_init`), so that it is built with torch's arguments here and in
        the files that import it (timm.layers' ``Linear(in, out, bias=True, **dd)``)."""
        rule = self._layer_subclass_rule(cls)
        return (rule is not None and rule.special is None and self._takes_layer_arguments(cls)
                and self._torch_signature_init(rule) is not None)

    def _torch_signature_init(self, rule: Rule) -> cst.FunctionDef | None:
        """``def __init__(self, in_features, out_features, bias=True, device=None,
        dtype=None, *, rngs)``: torch's parameters and defaults, the factory keywords the
        rule drops accepted and unused, and the JAX layer built by the rule's translation of
        them; None where the parameters cannot be written so (a parameter without a default
        after one with)."""
        params = [p for p in rule.params if p != "*" and p not in rule.drop]
        defaults = [p in rule.defaults for p in params]
        if any(a and not b for a, b in itertools.pairwise(defaults)):
            return None
        sig = [p if p not in rule.defaults else f"{p}={rule.defaults[p]!r}" if not isinstance(
            rule.defaults[p], str) else f"{p}={rule.defaults[p]}" for p in params]
        sig += [f"{d}=None" for d in rule.drop if d not in params]
        site = Site(rule=rule, args=bind([arg(cst.Name(p)) for p in params], rule.params),
                    target="nnx", rngs=cst.Name("rngs"), defined=self.index.defined)
        body = call("super().__init__", *_rule_args(site), *site.rngs_arg())
        return cst.parse_statement(
            f"def __init__(self, {', '.join(sig)}, *, rngs: nnx.Rngs):\n"
            f"    {code(body)}  # torch's arguments, the {rule.targets['nnx']} built from them\n")

    def _batch_norm_base(self, cls: str | None) -> str | None:
        """The helper class (``BatchNorm2d``, torch's signature on channels-first input) that a
        subclass of nn.BatchNorm{n}d derives from instead (timm's ``BatchNormAct2d``), or None
        where the target has no such helper."""
        info = self.index.classes.get(cls or "")
        if info is None or info.layer_base is None:
            return None
        name = f"{HELPER_BASES[self.rules.layers[info.layer_base].special]}{spatial_dims(info.layer_base)}d"
        if name in self.index.defined or self.target.helper_target not in HELPERS.get(name, {}):
            return None
        return name

    def _no_constructor(self, cls: str) -> bool:
        """A module class of this file whose chain of module classes up to nn.Module defines
        no ``__init__``: its JAX class takes no rngs either. So for a container subclass
        (``class SequentialTuple(nn.Sequential)`` with only a forward: nnx.Sequential's,
        nnx.List's and nnx.Dict's constructors take the layers alone)."""
        seen: set[str] = set()
        while cls in self.index.classes and cls not in seen:
            seen.add(cls)
            info = self.index.classes[cls]
            if info.defines_init or info.layer_base:
                return False
            if info.module_base == "torch":
                return True
            cls = info.module_base
        return False

    def _takes_layer_arguments(self, cls: str | None) -> bool:
        """No class from ``cls`` up to the torch layer defines ``__init__``: it is built with
        the layer's own arguments."""
        seen: set[str] = set()
        while cls in self.index.classes and cls not in seen:
            seen.add(cls)
            if self.index.classes[cls].defines_init:
                return False
            cls = self.index.classes[cls].module_base
        # a module class of another file (analysis/layer_bases.py): built by its own __init__
        return not (cls in self.index.module_classes and cls not in self.index.classes)

    def _layer_arguments(self, original: cst.Call, updated: cst.Call,
                         rule: Rule, super_init: bool = False) -> cst.BaseExpression:
        """A call that builds a subclass of a torch layer (``LayerNorm2d(dim, eps=1e-6)``,
        ``super().__init__(...)``): the layer rule's translation of the arguments, called on
        the subclass."""
        if rule.special in ("batch_norm", "conv"):
            # the BatchNorm{n}d / Conv{n}d helper base takes torch's arguments (device, dtype, **dd too)
            self.need("nnx")
            return updated.with_changes(args=[*updated.args, arg(self.rngs_expr(original),
                                                                 "rngs")])
        passed_on = self._passed_on_kwargs(updated, super_init)
        args = [a for a in updated.args if a is not passed_on]
        b = bind(args, rule.params)
        if (rule.special == "layer_norm" and super_init and b.star
                and self.index.classes[self.current_class].module_base == "torch"
                and "LayerNorm" not in self.index.defined
                and self.target.helper_target in HELPERS.get("LayerNorm", {})):
            # DINOv3-ConvNeXt's super().__init__(*args, **kwargs): torch's arguments, unseen
            # here, to the LayerNorm helper (torch's signature), which the class derives from
            self._torch_layer_norm_subclasses.add(self.current_class)
            self.need("nnx")
            return updated.with_changes(args=[*updated.args, arg(self.rngs_expr(original),
                                                                 "rngs")])
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown or b.star:
            raise Untranslatable(f"{rule.torch} subclass: argument(s) "
                                 f"{', '.join(unknown) or '*/**'} not translated", rule=rule.id)
        site = Site(rule=rule, args=b, target="nnx", rngs=self.rngs_expr(original),
                    defined=self.index.defined)
        if rule.special:
            out = SPECIALS[rule.special](site)
            if (isinstance(out, cst.Call) and code(out.func) == "Embedding" and super_init
                    and self.index.classes[self.current_class].module_base == "torch"):
                # class Scaled(nn.Embedding) with super().__init__(n, d, padding_idx): it
                # derives from the Embedding helper, which has the padding row
                self._padded_embedding_subclasses.add(self.current_class)
            elif isinstance(out, cst.Call) and code(out.func) == "Embedding":
                raise Untranslatable(f"{rule.torch} subclass with padding_idx: the subclass "
                                     "derives from nnx.Embed, which has no padding row",
                                     rule=rule.id)
        else:
            out = call(rule.targets["nnx"], *_rule_args(site), *site.rngs_arg())
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        self.need("nnx")
        if passed_on is not None and isinstance(out, cst.Call):
            # super().__init__(dim, eps=eps, **kwargs) in timm's LayerNorm(nn.LayerNorm): the
            # factory keywords (device, dtype: timm's **dd) are dropped as the rule drops them
            name = code(passed_on.value)
            drop = ", ".join(repr(d) for d in rule.drop) + ("," if len(rule.drop) == 1 else "")
            self.diag(original, rule.id, "error",
                      f"{rule.torch} subclass: **{name} is passed on without {drop.rstrip(',')};"
                      f" any other {rule.torch} keyword in it reaches the JAX layer untranslated")
            out = out.with_changes(args=[*out.args, cst.Arg(expr(
                f"{{k: v for k, v in {name}.items() if k not in ({drop})}}"), star="**")])
        return out.with_changes(func=updated.func)

    def _passed_on_kwargs(self, updated: cst.Call, super_init: bool) -> cst.Arg | None:
        """The ``**kwargs`` of ``super().__init__(..., **kwargs)`` that passes on the
        enclosing ``__init__``'s own ``**kwargs``, or None."""
        stars = [a for a in updated.args if a.star]
        if not (super_init and self._fn_stack and len(stars) == 1 and stars[0].star == "**"
                and isinstance(stars[0].value, cst.Name)):
            return None
        kw = self._fn_stack[-1].params.star_kwarg
        if isinstance(kw, cst.Param) and kw.name.value == stars[0].value.value:
            return stars[0]
        return None

    def _own_functional(self, node: cst.Call) -> bool:
        """``F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)`` in a
        subclass of nn.LayerNorm: the layer's functional over exactly its own attributes."""
        rule = self._layer_subclass_rule(self.current_class)
        if rule is None or self.q(node.func) != rule.subclass.functional:
            return False
        if rule.special == "batch_norm":
            return self._own_batch_norm(node, rule)
        fn = self.rules.functions.get(rule.subclass.functional)
        if fn is None:
            return False
        b = bind(node.args, fn.params)
        if b.star or b.extra_positional or set(b.named) - {fn.params[0], *rule.subclass.reads}:
            return False
        reads = [b.get(r) for r in rule.subclass.reads]
        if not all(m.matches(n, m.Attribute(value=m.Name("self"), attr=m.Name(r)))
                   for n, r in zip(reads, rule.subclass.reads)):
            return False
        self._own_reads.update(id(n) for n in reads)
        return True

    def _own_batch_norm(self, node: cst.Call, rule: Rule) -> bool:
        """``F.batch_norm(x, running_mean, running_var, self.weight, self.bias, training,
        momentum, self.eps)`` in a subclass of nn.BatchNorm2d, torch's own forward as timm's
        BatchNormAct2d copies it: the running statistics given are the module's own (the
        arguments read ``self.running_mean`` / ``self.running_var`` and nothing else of
        another tensor), the weight, bias and eps too, the training flag and the average
        factor names or the module's attributes. It is the base's call, whose flag is the
        module's train/eval state and whose factor its momentum (the helper refuses
        momentum=None)."""
        b = bind(node.args, BATCH_NORM_PARAMS)
        if b.star or b.extra_positional or b.get("input") is None:
            return False
        own = {"weight": "weight", "bias": "bias", "eps": "eps"}
        if not all(m.matches(b.get(p), m.Attribute(value=m.Name("self"), attr=m.Name(a)))
                   for p, a in own.items()):
            return False
        for p in ("running_mean", "running_var"):
            reads = m.findall(b.get(p) or cst.Name("None"), m.Attribute(value=m.Name("self")))
            if not reads or {r.attr.value for r in reads} - {p, "training",
                                                              "track_running_stats"}:
                return False
        for p, attr in (("training", "training"), ("momentum", "momentum")):
            v = b.get(p)
            if not (isinstance(v, cst.Name) or m.matches(v, m.Attribute(
                    value=m.Name("self"), attr=m.Name(attr)))):
                return False
        self._own_reads.update(id(b.get(p)) for p in own)
        for p in ("running_mean", "running_var", "training", "momentum"):
            self._own_reads.update(id(r) for r in m.findall(b.get(p), m.Attribute(
                value=m.Name("self"))))
        self.diag(node, rule.id, "info", "F.batch_norm over the module's own statistics "
                  "and weights: the base BatchNorm's call (its train/eval state, its momentum)")
        return True

    def _layer_subclass_attribute(self, original: cst.Attribute,
                                  updated: cst.Attribute) -> cst.BaseExpression | None:
        """``self.weight`` / ``self.eps`` in a subclass of a torch layer: the JAX layer's names
        (``self.scale``, ``self.epsilon``); another torch attribute of it is marked."""
        if not m.matches(original.value, m.Name("self")) or id(original) in self._own_reads:
            return None
        rule = self._layer_subclass_rule(self.current_class)
        if rule is None:
            return None
        name = original.attr.value
        to = rule.subclass.attrs.get(name)
        if to is not None and "." in to:
            # a weight the JAX layer holds in another layout (nn.Linear's weight, (out, in),
            # is the transposed kernel): read as the torch weight
            return expr(f"self.{to}")
        if to is not None:
            return updated.with_changes(attr=cst.Name(to)) if to != name else None
        torch_attrs = {*rule.params, *(weight_source(k) for k in rule.weights)}
        if name in torch_attrs:
            self.diag(original, "module-subclass", "error",
                      f"self.{name} of {rule.torch} has no counterpart in "
                      f"{rule.targets['nnx']}")
        return None

    def _batch_norm_value(self, rule: Rule, q: str | None) -> str | None:
        """The helper class with torch's signature (passes/helpers.py ``BatchNorm{n}d``) that a
        BatchNorm class used as a value becomes, where its calls are not all known to want
        channels-last input and the target has the helper; None otherwise."""
        name = f"BatchNorm{spatial_dims(q or rule.torch)}d"  # (3d is 2d's alias)
        if (self.index.factory_layouts == {rule.layout} or name in self.index.defined
                or self.target.helper_target not in HELPERS.get(name, {})):
            return None
        return name

    def _partial_of_layer(self, original: cst.Call) -> cst.BaseExpression | None:
        """``partial(nn.BatchNorm2d, eps=1e-3, momentum=0.01)``: a factory with torch's
        keywords in flax's terms, in the layout the file's factories have (see
        _layer_class_value)."""
        first = original.args[0]
        if isinstance(first.value, cst.Name) and not first.keyword and (
                self._layer_subclass_rule(first.value.value) is not None
                and self._takes_layer_arguments(first.value.value)
                and not self._torch_signature_layer(first.value.value)):
            # partial(LayerNorm2d, eps=1e-6): the subclass takes the JAX layer's arguments
            rule = self._layer_subclass_rule(first.value.value)
            if rule.special != "layer_norm":
                raise Untranslatable(f"partial of a subclass of {rule.torch}", rule=rule.id)
            return self._partial_layer_norm(original, rule, first.value.value)
        rule = self.rules.layers.get(self.q(first.value) or "") if not first.keyword else None
        if rule is not None and _activation_value(rule) is not None and all(
                a.keyword and a.keyword.value == "inplace" for a in original.args[1:]):
            return _activation_value(rule)  # partial(nn.SiLU, inplace=True): the function
        if rule is not None and rule.special == "activation_with_args" and (
                self.target.layer_column in rule.targets):
            # partial(nn.LeakyReLU, 0.1): the function with its arguments, as the layer built
            # with them (the calls of an activation factory give the function back)
            b = bind(original.args[1:], rule.params)
            if b.star or set(b.named) - set(rule.params):
                raise Untranslatable(f"partial({rule.torch}, ...) with arguments not known",
                                     rule=rule.id)
            out = SPECIALS["activation_with_args"](Site(rule, b, target=self.target.layer_column))
            self._note_imports(out)
            self.need("partial")
            return out
        if rule is not None and rule.special == "layer_norm":
            return self._partial_layer_norm(original, rule)
        if rule is None or rule.special != "batch_norm":
            return None
        b = bind(original.args[1:], rule.params)
        if b.extra_positional or b.star or set(b.named) - {"eps", "momentum"}:
            raise Untranslatable(f"partial({rule.torch}, ...) with arguments other than eps and "
                                 "momentum", rule=rule.id)
        batch_norm_helper(self.index.defined)
        helper = self._batch_norm_value(rule, self.q(first.value))
        if helper is not None:  # partial(BatchNorm2d, eps=1e-3): torch's keywords, as given
            self.need("partial", "nnx")
            return call("partial", arg(cst.Name(helper)), *original.args[1:])
        momentum = b.get("momentum")
        m_value = try_literal(momentum, ...) if momentum is not None else 0.1
        if m_value is None:
            raise Untranslatable("BatchNorm momentum=None (cumulative moving average) has no "
                                 "flax equivalent", rule=rule.id)
        m_text = (repr(round(1 - m_value, 12)) if isinstance(m_value, (int, float))
                  else f"1 - {code(momentum)}")
        eps = b.get("eps")
        parts = [] if self.index.factory_layouts == {rule.layout} else ["axis=1"]
        parts += [f"momentum={m_text}", f"epsilon={code(eps) if eps is not None else '1e-05'}"]
        self.need("partial", "nnx")
        return expr(f"partial(BatchNorm, {', '.join(parts)})")

    def _partial_layer_norm(self, original: cst.Call, rule: Rule,
                            target: str = "nnx.LayerNorm") -> cst.BaseExpression:
        """``partial(nn.LayerNorm, eps=1e-6)`` (vit's norm_layer): called with the normalized
        size, like nnx.LayerNorm (``target``: a subclass of it)."""
        b = bind(original.args[1:], rule.params)
        if b.extra_positional or b.star or set(b.named) - {"eps", "elementwise_affine", "bias"}:
            raise Untranslatable(f"partial({rule.torch}, ...) with arguments other than eps, "
                                 "elementwise_affine and bias", rule=rule.id)
        if target == "nnx.LayerNorm" and "LayerNorm" not in self.index.defined and (
                self.target.helper_target in HELPERS.get("LayerNorm", {})):
            # the calls give torch's keywords (edgenext's norm_layer(dim, eps=1e-6, **dd)):
            # the LayerNorm helper of torch's signature, as nn.LayerNorm as a value is
            self.need("partial")
            return call("partial", arg(cst.Name("LayerNorm")), *original.args[1:])
        parts = [f"epsilon={code(b.get('eps')) if b.has('eps') else '1e-05'}"]
        if b.has("elementwise_affine"):
            parts += [f"use_scale={code(b.get('elementwise_affine'))}",
                      f"use_bias={code(b.get('elementwise_affine'))}"]
        elif b.has("bias"):
            parts.append(f"use_bias={code(b.get('bias'))}")
        self.need("partial", "nnx")
        return expr(f"partial({target}, {', '.join(parts)})")

    def _activation_factory_call(self, original, updated):
        """``activation_layer(**params)`` where the parameter defaults to an activation class:
        the classes passed for it are translated to their functions, so the call is the
        parameter itself. Only torch's ``inplace`` (or ``**kwargs`` holding it) may be given,
        or a lone ``True`` / ``False``: ``inplace`` too, the first parameter of nn.ReLU, ReLU6,
        SiLU, Hardswish, Hardsigmoid and Mish (vgg's ``act_layer(True)``)."""
        for a in original.args:
            flag = (len(original.args) == 1 and not a.keyword and not a.star
                    and isinstance(a.value, cst.Name) and a.value.value in ("True", "False"))
            if not (flag or a.star == "**" or (a.keyword and a.keyword.value == "inplace")):
                raise Untranslatable(
                    f"{original.func.value}(...) with arguments: the activation classes passed "
                    "for it become functions, which take no constructor arguments",
                    rule="layer-factory")
        if any(a.star == "**" for a in original.args):
            self.diag(original, "layer-factory", "info",
                      f"{original.func.value}(**...): an activation function now, its "
                      "constructor keywords (inplace) are dropped")
        return updated.func

    # -- layers
    def _layer(self, original, updated, rule: Rule) -> cst.BaseExpression:
        b = bind(updated.args, rule.params)
        unknown = [k for k in b.named if k not in rule.params and k not in rule.drop]
        if unknown:
            raise Untranslatable(f"{rule.torch}: argument(s) {', '.join(unknown)} not translated",
                                 rule=rule.id)
        # linen layers are the NNX translation adapted by the linen emitter
        target = rule.targets.get(self.target.layer_column)
        if target is None:
            raise Untranslatable(f"{rule.torch} has no {self.target.name} translation",
                                 rule=rule.id)
        if rule.special in ("sequential", "module_list", "module_dict"):
            out = self._container(original, updated, rule)
            if not self.target.setup_modules:
                return out
            out = linen_target.layer(out, self._linen_train())
            if self.current_class is None and m.matches(out, m.Call(
                    func=m.Attribute(attr=m.Name("Sequential")), args=[m.Arg(m.List())])):
                # a model built outside a class is a static argument of the jitted steps: its
                # layers in a tuple, which hashes (a list does not)
                out = out.with_changes(args=[out.args[0].with_changes(value=cst.Tuple(
                    list(out.args[0].value.elements)))])
            return out
        if rule.special == "pool" and self.target.stateful_modules and (id(
                original) in self.index.torch_convs or built_layout(
                    rule, original, self.index.factory_dicts) == "torch"):
            # a pooling layer an attribute holds in one branch, torch-layout layers in others
            # (analysis/branch_layouts.py), or one given the callers' **kwargs (timm's
            # create_pool2d): the NCHW helper class with torch's arguments (built_layout)
            return call(self.q(original.func).rsplit(".", 1)[-1], *updated.args)
        if id(original) in self.index.torch_convs and self.target.setup_modules:
            # (linen's nn.Conv takes channels-last input; the NCHW helper class is NNX only)
            raise Untranslatable(f"{rule.torch} among torch-layout layers: linen's nn.Conv is "
                                 "channels-last, called here on NCHW input", rule="layout")
        if id(original) in self.index.torch_convs and self.target.stateful_modules and \
                not self.target.intermediate:  # (equinox's layers are all channels-first)
            # a conv among torch-layout layers of an OrderedDict (maxvit's MBConv): the NCHW
            # helper class with torch's arguments
            if b.has("padding_mode") and try_literal(b.get("padding_mode"), ...) != "zeros":
                raise Untranslatable(f"{rule.torch} padding_mode other than 'zeros'",
                                     rule=rule.id)
            args = [a for a in updated.args if not (a.keyword and a.keyword.value in (
                "device", "dtype", "padding_mode"))]
            return call(f"Conv{spatial_dims(rule.torch)}d", *args,
                        arg(self.rngs_expr(original), "rngs"))
        # a helper class of passes/helpers.py (TransformerEncoderLayer) for this target
        helper_class = target[:1].isupper() and target in HELPERS
        emitter = self.target.helper_target
        if helper_class and emitter not in HELPERS[target]:
            raise Untranslatable(f"{rule.torch} has no {emitter} translation (the {target} "
                                 "helper class is NNX only)", rule=rule.id)
        needs_rngs = (target.startswith("nnx.") and target[4:5].isupper() or helper_class) \
            and self.target.stateful_modules
        sequences: frozenset[str] = frozenset()
        if self.values is not None and rule.special in ("conv", "pool"):  # kernel_size=patch_size
            given = bind(original.args, rule.params)
            sequences = frozenset(k for k in ("kernel_size", "stride", "padding", "dilation")
                                  if isinstance(given.get(k), cst.Name) and (self.values.kind(
                                      given.get(k)) in (vk.Kind.TUPLE, vk.Kind.LIST) or (
                                      self._fn_stack and _indexed_sequence(
                                          self._fn_stack[-1], given.get(k).value))))
        site = Site(rule=rule, args=b, target=self.target.layer_column,
                    rngs=self.rngs_expr(original) if needs_rngs else None,
                    defined=self.index.defined, per_example=self.target.intermediate,
                    sequences=sequences, packed=self._packs,
                    choices=layer_choices(self, original, rule))
        if rule.special:
            out = SPECIALS[rule.special](site)
            name = code(out.func) if isinstance(out, cst.Call) else None
            if name in HELPERS and emitter not in HELPERS[name]:  # Embedding(padding_idx=)
                raise Untranslatable(f"{rule.torch} as written has no {emitter} translation "
                                     f"(the {name} helper class is NNX only)", rule=rule.id)
            if site.per_example and (rule.special == "upsample" or rule.special ==
                                     "flatten_module" and code(out) == FLAT_EXAMPLE):
                self.per_example_code.add(code(out))
        else:
            args = _rule_args(site)
            if needs_rngs:
                out = call(target, *args, *site.rngs_arg())
            elif self.target.setup_modules and target.startswith("nnx.") and \
                    target[4:5].isupper():
                out = call(target, *args)  # a layer class, adapted below
            elif args:
                out = call("partial", arg(expr(target)), *args)
            else:
                out = expr(target)
        for severity, msg in site.notes:
            self.diag(original, rule.id, severity, msg)
        if not self.torch_init and self.jax_init_layer is None and (
                torch_init.initialisation_differs(rule)):
            pos = self.get_metadata(PositionProvider, original, None)
            if pos is not None:
                self.jax_init_layer = (pos.start.line, pos.start.column,
                                       rule.torch.rsplit(".", 1)[-1])
        if self.torch_init and isinstance(out, cst.Call):
            out, why = torch_init.initialised(rule, b, out)
            if why is not None:
                self.diag(original, rule.id, "warning", f"--init torch: {why}; the layer "
                          "keeps the JAX library's initialisation")
        if self.target.setup_modules:
            self.need("linen")
            out = linen_target.pooling(linen_target.layer(out, self._linen_train()))
            inits = {**self._lt_inits.get(self.current_class or "", {}).get(rule.torch, {}),
                     **self._lt_attr_init(original)}  # (a named_parameters() loop's, last)
            if inits:
                out = lt.with_initializers(out, inits)
            if self.current_class in self._lt_dtype_classes:
                out = lt.with_dtype(out)
        return out

    def _container(self, original, updated, rule: Rule):
        if rule.special == "sequential":
            layouts = Layouts(self.rules, self, self.index)
            scope = {name: lay for (fid, name), lay in self.index.list_layouts.items()
                     if self._fn_stack and fid == id(self._fn_stack[-1])}
            original_args, updated_args = spread_literals(original.args), spread_literals(
                updated.args)
            updated_args = with_filtered_transposes(self, original_args, updated_args, layouts, scope)
            overall, items = layouts.sequential(original_args, scope)
            if overall == "mixed":
                raise Untranslatable("nn.Sequential mixing channels-last layers (conv, pooling, "
                                     "norm) and other layers in an order not known statically",
                                     rule=rule.id)
            named = len(original.args) == 1 and ordered_dict_items(
                original.args[0], layouts.is_ordered_dict) is not None and \
                self.target.stateful_modules
            args = self._ordered_dict_values(original, self._channels_last_einops(
                original_args, updated_args, items, layouts), layouts)
            parent = self.get_metadata(ParentNodeProvider, original, None)
            returned_list = isinstance(parent, cst.Return) and any(
                a.star == "*" for a in original.args)
            if overall == "channels_last" and (returned_list or isinstance(
                    parent, cst.Assign) and isinstance(parent.targets[0].target, cst.Name)):
                # a Sequential kept in a local (downsample = nn.Sequential(conv, bn)) or returned
                # from a list (vgg's make_layers) and handed on: nothing tracks its layout there,
                # so it takes and returns NCHW itself
                overall = "torch"
            if overall == "channels_last" and isinstance(parent, cst.Arg) and m.matches(
                    self.get_metadata(ParentNodeProvider, parent, None),
                    m.Call(func=m.Name(m.MatchIfTrue(self.index.module_classes.__contains__)))):
                # handed to a module class of the file (Residual(nn.Sequential(conv, act, bn))
                # in timm's convmixer): that class calls it on NCHW, so it takes NCHW itself
                overall = "torch"
            info = self.index.classes.get(self.current_class or "")
            if (info is not None and isinstance(parent, cst.Assign) and m.matches(
                    parent.targets[0].target, m.Attribute(value=m.Name("self")))
                    and parent.targets[0].target.attr.value in info.normalized_seqs):
                # built channels-last, given torch-layout layers by add_module later
                # (densenet's features): it takes NCHW, transposed around its first layers
                overall = "torch"
            if overall == "torch" and "channels_last" in items:
                args = self._insert_transposes(args, items)
            elif overall == "channels_last" and "torch" in items:
                # nn.Sequential(conv, norm_layer(c), act, conv), norm_layer a class handed in
                # (the BatchNorm2d helper, on NCHW): channels-last around it, NCHW inside
                args = self._insert_transposes(args, items, "channels_last")
            elif named:
                # nn.Sequential(OrderedDict(...)): the layers in order, and by their names
                # (self.heads.head)
                return call("NamedSequential", arg(updated.args[0].value))
            return call(rule.targets[self.target.layer_column], *args)
        if rule.special == "module_list":
            if not updated.args:
                return call(rule.targets[self.target.layer_column], arg(expr("[]")))
            return call(rule.targets[self.target.layer_column], arg(updated.args[0].value))
        # ModuleDict; iterated in the class (for, items(), values()): in insertion order
        parent = self.get_metadata(ParentNodeProvider, original, None)
        info = self.index.classes.get(self.current_class or "")
        if (self.target.stateful_modules and info is not None
                and isinstance(parent, cst.Assign)
                and m.matches(parent.targets[0].target, m.Attribute(value=m.Name("self")))
                and parent.targets[0].target.attr.value in info.iterated):
            return call("LayerDict", *updated.args)
        if not updated.args:
            return call(rule.targets[self.target.layer_column])
        return call(rule.targets[self.target.layer_column], *updated.args)

    def _channels_last_einops(self, original_args: list[cst.Arg], args: list[cst.Arg],
                              items: list[str], layouts: Layouts) -> list[cst.Arg]:
        """An einops layer that a Sequential runs channels-last (Layouts.sequential) reads its
        pattern so: ``b c (h p1) (w p2) -> b (c p1 p2) h w`` as
        ``b (h p1) (w p2) c -> b h w (c p1 p2)``."""
        if len(args) != len(original_args) or self.target.intermediate:
            return args  # (the equinox pass's einops layers take one channel-first example)
        out = []
        for a, new, lay in zip(original_args, args, items):
            pattern = None if a.star or lay != "channels_last" else (
                layouts.einops_channels_last(a.value))
            if pattern is not None and m.matches(new.value, m.Lambda(body=m.Call(
                    args=[m.DoNotCare(), m.Arg(m.SimpleString()), m.ZeroOrMore()]))):
                body = new.value.body
                q = body.args[1].value
                pat = body.args[1].with_changes(value=cst.SimpleString(
                    f"{q.prefix}{q.quote}{pattern}{q.quote}"))
                new = new.with_changes(value=new.value.with_changes(body=body.with_changes(
                    args=[body.args[0], pat, *body.args[2:]])))
            out.append(new)
        return out

    def _insert_transposes(self, args: list[cst.Arg], items: list[str],
                           outer: str = "torch") -> list[cst.Arg]:
        """``args`` with transposes between items of the two layouts, taking and returning
        ``outer``."""
        out: list[cst.Arg] = []
        state = outer
        for a, lay in zip(args, items):
            if lay == "channels_last" and state == "torch":
                out.append(arg(expr("lambda x: jnp.moveaxis(x, 1, -1)")))
                state = "channels_last"
            elif lay == "torch" and state == "channels_last":
                out.append(arg(expr("lambda x: jnp.moveaxis(x, -1, 1)")))
                state = "torch"
            out.append(a)
        if state == "channels_last" and outer == "torch":
            out.append(arg(expr("lambda x: jnp.moveaxis(x, -1, 1)")))
        elif state == "torch" and outer == "channels_last":
            out.append(arg(expr("lambda x: jnp.moveaxis(x, 1, -1)")))
        self.need("jnp")
        return out


def per_example_pattern(node: cst.BaseExpression | None) -> str | None:
    """An einops pattern whose input and output both start with one axis, the same name, kept
    as it is (``"b c (h p1) (w p2) -> b (c p1 p2) h w"``): the pattern for one example, that
    axis dropped on both sides (``"c (h p1) (w p2) -> (c p1 p2) h w"``), as a string literal.
    None for any other pattern (one that moves, splits or reduces the first axis)."""
    if not isinstance(node, cst.SimpleString):
        return None
    text = node.evaluated_value
    if not isinstance(text, str) or text.count("->") != 1:
        return None
    left, right = (side.split() for side in text.split("->"))
    if len(left) < 2 or len(right) < 2 or left[0] != right[0] or not left[0].isidentifier() \
            or re.findall(r"[A-Za-z_]\w*", text).count(left[0]) != 2:
        return None
    return repr(f"{' '.join(left[1:])} -> {' '.join(right[1:])}").replace("'", '"')
