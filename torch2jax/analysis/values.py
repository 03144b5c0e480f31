"""What kind of value an expression holds: a tensor, a module, an optimizer, a Python container...

The rewrite turns ``x.log()`` into ``jnp.log(x)`` and ``x[i] = v`` into ``x = x.at[i].set(v)``
only when ``x`` is a tensor: ``wandb.log({...})`` and ``config['vocab_size'] = 50257`` must
stay as they are. :class:`ValueFacts` answers ``facts.kind(node)`` for any expression of the
torch file, from what the file itself shows:

* tensors come from torch calls (``torch.zeros``, ``F.softmax``), module calls (``self.fc(x)``,
  ``model(x)``), ``forward`` parameters, loader batches (``for x, y in loader``), tensor
  methods and attributes, arithmetic and indexing on tensors;
* containers from literals, comprehensions, ``dict(...)``, ``vars(...)``, ``state_dict()``;
  configuration from ``argparse`` namespaces, dataclasses and ``...Config`` classes; modules,
  optimizers, schedulers and loaders from their torch constructors and the file's classes;
* a name's kind is that of the assignments that reach the read (the latest one in straight-
  line code), a parameter's that of the arguments the file passes at its call sites, and a
  name used as a dict (``x["key"]``, ``x.items()``) or a module (``x.eval()``) is one.

It is cheap: nothing is walked up front. A query follows the scope, parent and qualified-name
metadata the rewrite already resolved for the file, and every answer is cached, so each
expression is analysed once per file.

Kinds: ``TENSOR``; ``PARAM``, an argument nothing tells about (assumed a tensor, as helper
functions of torch code take tensors); ``UNKNOWN``, a value the analysis cannot see through
(a call into another library, mixed assignments); and the non-tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment, ScopeProvider

from torch2jax.analysis import callbacks
from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.analysis.value_kinds import (  # noqa: F401 (values.X is the public name)
    _ANY_RECEIVER_METHODS,
    _BUILTIN_CALLS,
    _BUSY,
    _DICT_METHODS,
    _MASK_METHODS,
    _MODULE_METHODS,
    _MODULE_PARAM_ATTRS,
    _NUMPY_SCALAR_METHODS,
    _OPTIMIZER_ATTRS,
    _PROGRESS_BARS,
    _PYTHON_SCALAR_MODULES,
    _TENSOR_ATTRS,
    _TENSOR_SCALAR_METHODS,
    _TENSOR_TUPLE_METHODS,
    _TENSOR_TUPLE_WITH_DIM,
    _TORCH_NOT_TENSOR_PREFIXES,
    _TORCH_OBJECTS,
    _TORCH_SCALARS,
    _TORCH_TUPLES,
    _USE_EVIDENCE,
    ACTIVATION,
    ACTIVATION_CLASS,
    ATTENTION,
    ATTENTION_RESULT,
    CONFIG,
    DICT,
    DTYPE,
    FUNCTION,
    LIBRARY_ATTRS,
    LIBRARY_METHODS,
    LIST,
    MASK_FUNCTIONS,
    MODULE,
    NON_TENSOR,
    NONE,
    NUMPY,
    OBJECT,
    OUTPUT_FIELDS,
    PARAM,
    SCALAR,
    SHARED_METHODS,
    TENSOR,
    TORCH_DTYPES,
    UNKNOWN,
    Kind,
    Value,
    _join,
    library_class,
    library_function,
)
from torch2jax.analysis.value_syntax import (
    _EINOPS_TENSOR_FUNCTIONS,
    _at,
    _attr_key,
    _collect_self_assignments,
    _dotted,
    _isinstance_class,
    _none_branch,
    _pair_idiom,
    _return_values,
    passed_arguments,
)
from torch2jax.analysis.walk import findall

_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.ListComp, cst.SetComp, cst.DictComp,
           cst.GeneratorExp)
_BLOCKS = (cst.IndentedBlock, cst.Module, cst.SimpleStatementSuite)


# the helpers that make an int a tuple of ints (timm.layers.helpers, torch.nn.modules.utils)
_NTUPLE_HELPERS = frozenset({"to_1tuple", "to_2tuple", "to_3tuple", "to_4tuple", "_single",
                             "_pair", "_triple", "_quadruple"})

class ValueFacts:
    """``kind(node)`` / ``value(node)`` for expressions of one file (see the module doc).

    ``module_classes``: the ``nn.Module`` subclasses (of this file and of the repository)
    by name; ``layer``: whether a qualified name is a torch layer class."""

    def __init__(self, wrapper: cst.MetadataWrapper, module_classes: set[str],
                 layer: Callable[[str], bool]) -> None:
        self._module = wrapper.module
        self._scopes = wrapper.resolve(ScopeProvider)
        self._parents = wrapper.resolve(ParentNodeProvider)
        self._positions = wrapper.resolve(PositionProvider)
        self._qnames: dict[cst.CSTNode, str | None] = {}
        self.module_classes = module_classes
        self._layer = layer
        self._cache: dict[cst.CSTNode, Value] = {}
        self._binding_cache: dict[cst.CSTNode, Value] = {}
        self._access_of: dict[cst.CSTNode, object] = {}  # Name -> its Access (on first use)
        self._classes: dict[str, cst.ClassDef] | None = None
        self._class_attrs: dict[str, dict[str, list[cst.BaseExpression]]] = {}
        self._returns: dict[int, list[cst.BaseExpression]] = {}
        self._registries: list[callbacks.Registry] | None = None

    # ---------------------------------------------------------------- queries
    def is_dtype(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` holds a torch dtype (``torch.float16``, ``x.dtype``, a name bound
        to one)."""
        return self.value(node).dtype

    def kind(self, node: cst.CSTNode) -> Kind:
        return self.value(node).kind

    def layer(self, node: cst.CSTNode) -> str | None:
        """The torch layer class (qualified) that ``node`` holds, when the file built it
        (``model = nn.Linear(3, 4)``, on every path that reaches the read)."""
        return self.value(node).layer

    def is_tensor(self, node: cst.CSTNode) -> bool:
        return self.kind(node) == Kind.TENSOR

    def not_tensor(self, node: cst.CSTNode) -> bool:
        """Known to hold something other than a tensor."""
        return self.kind(node) in NON_TENSOR

    def param_kind(self, param: cst.Param) -> Kind:
        """The kind of a function parameter: its annotation, its default, or the arguments
        the file passes at its call sites."""
        found = self._param(param)
        return Kind.UNKNOWN if found is _BUSY else found.kind

    def may_be_none(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` may hold None: ``self.bias`` of a class that sets it to a
        parameter or None (``nn.Parameter(...) if bias else None``), a name assigned None on
        some path, a parameter defaulting to None."""
        if isinstance(node, cst.Name) and node.value == "None":
            return True
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and (
                node.value.value == "self"):
            owner = self.value(node.value)
            if owner.cls is None:
                return False
            return any(_none_branch(v) for v in self._class_values(owner.cls, node.attr.value))
        if isinstance(node, cst.Name):
            access = self._access(node)
            parent = self._parents.get(node)
            if access is None and isinstance(parent, cst.Param):  # the parameter itself
                return parent.default is not None and _none_branch(parent.default)
            for a in access.referents if access is not None else ():
                target = getattr(a, "node", None)
                if isinstance(target, cst.Param):
                    if target.default is not None and _none_branch(target.default):
                        return True
                    continue
                parent = self._parents.get(target) if target is not None else None
                assign = self._parents.get(parent) if isinstance(parent, cst.AssignTarget) \
                    else None
                if isinstance(assign, cst.Assign) and _none_branch(assign.value):
                    return True
        return False

    def value(self, node: cst.CSTNode) -> Value:
        key = node  # (the node itself, not its id: a transient node's id is reused)
        found = self._cache.get(key)
        if found is not None:
            return found
        self._cache[key] = _BUSY
        try:
            result = self._compute(node)
        except RecursionError:
            result = UNKNOWN
        if result is _BUSY:
            result = UNKNOWN
        self._cache[key] = result
        return result

    # ---------------------------------------------------------------- expressions
    def _q(self, node: cst.CSTNode) -> str | None:
        """The qualified name of a dotted name (what libcst's QualifiedNameProvider gives)."""
        if node in self._qnames:
            return self._qnames[node]
        scope = self._scopes.get(node)
        names = scope.get_qualified_names_for(node) if scope is not None else None
        found = self._qnames[node] = min(n.name for n in names) if names else None
        return found

    def _compute(self, node: cst.CSTNode) -> Value:
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
                             cst.ConcatenatedString, cst.FormattedString)):
            return SCALAR
        if isinstance(node, cst.Name):
            if node.value in ("True", "False"):
                return SCALAR
            if node.value == "None":
                return NONE
            return self._name(node)
        if isinstance(node, (cst.List, cst.ListComp)):
            return Value(Kind.LIST, item=self._items(node))
        if isinstance(node, (cst.Set, cst.SetComp)):
            return Value(Kind.SET, item=self._items(node))
        if isinstance(node, cst.Tuple):
            return Value(Kind.TUPLE, items=tuple(
                self.value(e.value) if not isinstance(e, cst.StarredElement) else UNKNOWN
                for e in node.elements))
        if isinstance(node, cst.Dict):
            values = [self.value(e.value) for e in node.elements if isinstance(
                e, cst.DictElement)]
            return Value(Kind.DICT, item=_join(values) if values else None)
        if isinstance(node, cst.DictComp):
            return Value(Kind.DICT, item=self.value(node.value))
        if isinstance(node, cst.GeneratorExp):
            return Value(Kind.OBJECT, item=self.value(node.elt))
        if isinstance(node, cst.Lambda):
            return FUNCTION
        if isinstance(node, cst.Attribute):
            return self._attribute(node)
        if isinstance(node, cst.Call):
            return self._call(node)
        if isinstance(node, cst.Subscript):
            return self._subscript(node)
        if isinstance(node, cst.BinaryOperation):
            left, right = self.value(node.left), self.value(node.right)
            kinds = {left.kind, right.kind}
            if Kind.TENSOR in kinds:
                return TENSOR
            if isinstance(node.operator, cst.MatrixMultiply):
                return TENSOR if kinds & {Kind.PARAM, Kind.UNKNOWN} else UNKNOWN
            if kinds == {Kind.SCALAR}:
                return SCALAR
            if left.kind in (Kind.LIST, Kind.TUPLE) and left.kind == right.kind:
                return Value(left.kind, item=_join([left.element(), right.element()]))
            if left.kind == Kind.SCALAR and isinstance(node.operator, cst.Modulo):
                return SCALAR  # "%d" % n
            if kinds <= {Kind.SCALAR, Kind.PARAM}:
                return PARAM
            return UNKNOWN
        if isinstance(node, cst.UnaryOperation):
            if isinstance(node.operator, cst.Not):
                return SCALAR
            return self.value(node.expression)
        if isinstance(node, cst.Comparison):
            parts = [self.value(node.left), *(self.value(c.comparator)
                                              for c in node.comparisons)]
            if any(v.kind == Kind.TENSOR for v in parts):
                return TENSOR
            if any(v.kind == Kind.PARAM for v in parts) and not any(
                    isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
                    for c in node.comparisons):
                return PARAM  # (relative_position > 0): a tensor when the argument is one
            return SCALAR
        if isinstance(node, cst.BooleanOperation):
            return _join([self.value(node.left), self.value(node.right)])
        if isinstance(node, cst.IfExp):
            if (pair := _pair_idiom(node)) is not None:  # a sequence: p, or (p, p)
                return self.value(pair)
            return _join([self.value(node.body), self.value(node.orelse)])
        if isinstance(node, cst.NamedExpr):
            return self.value(node.value)
        if isinstance(node, cst.Await):
            return UNKNOWN
        return UNKNOWN

    def _items(self, node: cst.List | cst.Set | cst.ListComp | cst.SetComp) -> Value | None:
        if isinstance(node, (cst.ListComp, cst.SetComp)):
            return self.value(node.elt)
        values = [self.value(e.value) for e in node.elements
                  if not isinstance(e, cst.StarredElement)]
        return _join(values) if values else None

    def _attribute(self, node: cst.Attribute) -> Value:
        q = self._q(node) if _dotted(node) else None
        if q and q.startswith("torch.") and "<locals>" not in q:
            return DTYPE if q in TORCH_DTYPES else OBJECT  # torch.float32, torch.nn.functional
        attr = node.attr.value
        base = self.value(node.value)
        if base.kind == Kind.TENSOR:  # (a module's output: outputs.logits)
            return _TENSOR_ATTRS.get(attr, OUTPUT_FIELDS.get(attr, UNKNOWN))
        if base.kind == Kind.MODULE:
            if base.cls is not None:
                found = self._class_attr(base.cls, attr)
                if found is not None:
                    return found
            if attr in _MODULE_PARAM_ATTRS:
                return TENSOR
            if attr in ("training",):
                return SCALAR
            return self._file_modules_attr(attr) if base.cls is None else UNKNOWN
        if base.kind == Kind.OPTIMIZER:
            return _OPTIMIZER_ATTRS.get(attr, UNKNOWN)
        if base.kind == Kind.LOADER:
            return OBJECT if attr == "dataset" else SCALAR if attr == "batch_size" else UNKNOWN
        if base.kind == Kind.CONFIG:
            found = self._class_attr(base.cls, attr) if base.cls is not None else None
            if base.cls and attr in OUTPUT_FIELDS and found in (None, NONE):  # an output's
                return OUTPUT_FIELDS[attr]  # field (``logits: torch.Tensor | None = None``)
            return found or SCALAR
        if base == NUMPY:
            return NUMPY if attr == "T" else OBJECT  # (a.shape, a.dtype, a.size)
        if (base.cls, attr) in LIBRARY_ATTRS:  # cache.layers, layer.keys
            return LIBRARY_ATTRS[base.cls, attr]
        if base.kind == Kind.OBJECT and base.cls is not None:
            return self._class_attr(base.cls, attr) or UNKNOWN
        if attr == "param_groups":
            return _OPTIMIZER_ATTRS["param_groups"]
        if base.kind == Kind.OBJECT and base.cls is None and not isinstance(node.value,
                                                                            cst.Call):
            return OBJECT  # np.random, os.path, wandb.run
        if base.kind in (Kind.UNKNOWN, Kind.PARAM) and (attr in OUTPUT_FIELDS or attr == "dtype"):
            return OUTPUT_FIELDS.get(attr, DTYPE)  # a tower's output of no known class; v.dtype
        return UNKNOWN

    def _subscript(self, node: cst.Subscript) -> Value:
        q = self._q(node.value) if isinstance(node.value, cst.Name) else None
        if q is not None and library_function(q) is not None:
            return library_function(q)  # ACT2FN[config.hidden_act]
        base = self.value(node.value)
        if base.kind == Kind.TENSOR:
            return TENSOR
        index = None
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            literal = node.slice[0].slice.value
            if isinstance(literal, cst.Integer):
                index = int(literal.value)
            elif isinstance(literal, cst.UnaryOperation) and isinstance(
                    literal.expression, cst.Integer):
                index = -int(literal.expression.value)
        elif base.kind in (Kind.LIST, Kind.TUPLE):
            return base  # a slice of a list is a list
        if base.kind == Kind.OBJECT and base.item is not None and base.item.kind == Kind.TUPLE:
            return base.item  # an item of a TensorDataset
        if base.kind in (Kind.LIST, Kind.TUPLE, Kind.DICT, Kind.OBJECT):
            if base.items is not None and index is not None and index < 0:
                index += len(base.items)
            found = base.element(index)
            return found if found.kind != Kind.NONE else UNKNOWN
        if base.kind == Kind.PARAM:
            return PARAM
        if base.kind == Kind.MODULE:  # an item of a ModuleList, Sequential or ModuleDict
            n = len(base.items) if base.items is not None and index is not None else 0
            return base.element(index + n if index < 0 else index) if n else MODULE
        return UNKNOWN

    def _layers_of(self, node: cst.Call) -> tuple[Value, ...] | None:
        """The layers of ``nn.Sequential(a, b, ...)`` by position (None: not all known)."""
        items = tuple(self.value(a.value) for a in node.args)
        return None if any(a.star or a.keyword for a in node.args) or any(
            v.kind != Kind.MODULE for v in items) else items

    def _call(self, node: cst.Call) -> Value:
        func = node.func
        # (only a dotted name has a qualified name: libcst names the method of a parenthesised
        # expression, (a - b).permute, after builtins)
        q = self._q(func) if _dotted(func) else None
        if q is not None and "<locals>" not in q:
            known = self._qualified_call(q, node)
            if known is not None:
                return known
        if q is not None and q.rsplit(".", 1)[-1] in _NTUPLE_HELPERS:
            # patch_size = to_2tuple(patch_size) (timm.layers, torch's _pair): a tuple of ints
            return Value(Kind.TUPLE, item=SCALAR)
        if isinstance(func, cst.Name):
            cls = self._file_class(func.value)
            if cls is not None and self._defines(func, cls):
                return self._instance(cls)
            if func.value in self.module_classes:
                return MODULE  # a module class of another file of the repository
        if isinstance(func, cst.Attribute):
            return self._method_call(node, func)
        callee = self.value(func)
        if callee == ACTIVATION:
            return TENSOR  # ACT2FN[name](x)
        if callee == ACTIVATION_CLASS:
            return ACTIVATION  # ACT2CLS[name]()
        if callee == ATTENTION:
            return ATTENTION_RESULT  # attention_interface(self, q, k, v, mask, ...)
        if callee.kind == Kind.MODULE:
            return TENSOR  # model(x), self.layer(x), block(x)
        if callee.kind == Kind.FUNCTION and isinstance(func, cst.Name):
            return self._function_result(func)
        if callee.kind == Kind.CONFIG and callee.cls is None:
            return UNKNOWN
        return UNKNOWN if callee.kind != Kind.PARAM else PARAM

    def _qualified_call(self, q: str, node: cst.Call) -> Value | None:
        if q == "builtins.getattr" and len(node.args) == 2 and not any(
                a.keyword or a.star for a in node.args):
            # getattr(self, f"{kind}_inv_freq"): what setattr(self, f"{kind}_inv_freq", v) (or
            # self.name = v) gives in the class, the name written the same way
            base = self.value(node.args[0].value)
            key = _attr_key(node.args[1].value)
            if base.kind == Kind.MODULE and base.cls is not None and key is not None:
                return self._class_attr(base.cls, key) or UNKNOWN
            return UNKNOWN
        if q in _BUILTIN_CALLS:
            return _BUILTIN_CALLS[q]
        if q.endswith(".get_activation") and library_function(q) is not None:
            return ACTIVATION  # get_activation(name): the function
        if q.rsplit(".", 1)[-1] in MASK_FUNCTIONS and not q.startswith("torch."):
            return TENSOR  # create_causal_mask(...).to(torch.bool)
        if q in ("builtins.max", "builtins.min", "builtins.sum", "builtins.abs"):
            args = [self.value(a.value) for a in node.args if not a.keyword]
            if any(v.kind == Kind.TENSOR for v in args):
                return TENSOR
            if args and all(v.kind == Kind.SCALAR or (v.kind in (Kind.OBJECT, Kind.LIST)
                                                        and v.item == SCALAR) for v in args):
                return SCALAR
            if q == "builtins.sum" and args and args[0].item is not None:
                return args[0].item if args[0].item.kind != Kind.NONE else UNKNOWN
            return UNKNOWN
        if q in ("builtins.iter", "builtins.next") and node.args and not node.args[0].keyword:
            of = self.value(node.args[0].value)
            if of.kind == Kind.LOADER:  # iter(loader): an iterator over its batches
                return Value(Kind.OBJECT, item=of.element()) if q == "builtins.iter" else (
                    of.element())
            if q == "builtins.next" and of.kind == Kind.OBJECT and of.item is not None:
                return of.item  # next(iter(loader)): a batch
            return OBJECT if q == "builtins.iter" else UNKNOWN
        if q in ("builtins.enumerate", "builtins.zip", "builtins.reversed", "builtins.map",
                 "builtins.filter"):
            args = [self.value(a.value) for a in node.args if not a.keyword]
            if q == "builtins.enumerate" and args:
                return Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(
                    SCALAR, args[0].element())))
            if q == "builtins.zip":
                return Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=tuple(
                    a.element() for a in args)))
            if q == "builtins.reversed" and args:
                return Value(Kind.OBJECT, item=args[0].element())
            if q == "builtins.map" and len(args) == 2:
                item = self._mapped(node.args[0].value, args[1])
                if item is not None:
                    return Value(Kind.OBJECT, item=item)
            return OBJECT
        if q in _PROGRESS_BARS and node.args and not node.args[0].keyword:
            # tqdm(loader, desc=...): an iterator over what it wraps, with a progress bar
            return Value(Kind.OBJECT, item=self.value(node.args[0].value).element())
        if q.split(".")[0] == "einops" and q.rsplit(".", 1)[-1] in _EINOPS_TENSOR_FUNCTIONS:
            first = self.value(node.args[0].value) if node.args else UNKNOWN
            if first.kind in (Kind.LIST, Kind.TUPLE) and first.element().kind == Kind.TENSOR:
                return TENSOR  # rearrange([a, b], ...) stacks them
            return first if first.kind in (Kind.TENSOR, Kind.PARAM) else UNKNOWN
        if q.startswith("torch."):
            return self._torch_call(q, node)
        if q in ("copy.deepcopy", "copy.copy") and len(node.args) == 1:
            return self.value(node.args[0].value)  # a copy of a model is a model
        if q.startswith(("numpy.", "np.")):
            return NUMPY  # numpy arrays: Python-side, mutable
        if q.startswith((*_PYTHON_SCALAR_MODULES, "builtins.")):
            return OBJECT if q.split(".")[0] in ("argparse", "logging", "collections",
                                                 "functools", "contextlib") else SCALAR
        return None

    def _mapped(self, fn: cst.BaseExpression, over: Value) -> Value | None:
        """What ``map(fn, over)`` yields: a lambda's body, a tensor when it is a tensor, or
        when it is one if its parameter is (PARAM) and ``over`` yields tensors
        (``map(lambda t: rearrange(t, ...), qkv.chunk(3, dim=-1))``)."""
        if not isinstance(fn, cst.Lambda) or len(fn.params.params) != 1:
            return None
        body = self.value(fn.body)
        if body.kind == Kind.PARAM:
            return TENSOR if over.element().kind == Kind.TENSOR else None
        return body if body.kind == Kind.TENSOR else None

    def _torch_call(self, q: str, node: cst.Call) -> Value:
        if q.startswith("torch.optim.lr_scheduler."):
            return Value(Kind.SCHEDULER)
        if q.startswith("torch.optim."):
            return Value(Kind.OPTIMIZER)
        if q in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"):
            return Value(Kind.LOADER)
        if q.endswith(".TensorDataset") and not any(a.star or a.keyword for a in node.args):
            # its items: tuples of one row of each tensor (dataset[i][0] is a tensor)
            return Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(TENSOR,) * len(node.args)))
        if q in ("torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer",
                 "torch.nn.parameter.Buffer"):
            return TENSOR
        if q in ("torch.compile", "torch.nn.parallel.DistributedDataParallel",
                 "torch.nn.DataParallel", "torch.nn.parallel.DataParallel") and node.args:
            return self.value(node.args[0].value)  # the model it wraps
        if q.startswith("torch.nn.") and not q.startswith((
                "torch.nn.functional.", "torch.nn.init.", "torch.nn.utils.")) and (
                q.split(".")[-1][:1].isupper() or self._layer(q)):
            return Value(Kind.MODULE, layer=q, items=self._layers_of(node) if q == (
                "torch.nn.Sequential") else None) if self._layer(q) else MODULE
        if q in _TORCH_OBJECTS or q.startswith(_TORCH_NOT_TENSOR_PREFIXES):
            if q.startswith(("torch.cuda.is_", "torch.distributed.get_", "torch.cuda.device_",
                             "torch.distributed.is_", "torch.backends.", "torch.is_")):
                return SCALAR
            return OBJECT
        if q in _TORCH_SCALARS:
            return SCALAR
        if q in ("torch.load", "torch.hub.load"):
            return UNKNOWN
        if q == "torch.save":
            return NONE
        if q in _TORCH_TUPLES:
            positional = [a for a in node.args if a.keyword is None]
            if q in ("torch.max", "torch.min", "torch.median", "torch.mode") and len(
                    positional) < 2 and not any(
                    a.keyword and a.keyword.value == "dim" for a in node.args):
                return TENSOR
            if q in ("torch.max", "torch.min") and (
                    (len(positional) == 2 and self.kind(positional[1].value) == Kind.TENSOR)
                    or any(a.keyword and a.keyword.value == "other" for a in node.args)):
                return TENSOR  # torch.min(x, torch.zeros_like(x)): elementwise
            return Value(Kind.TUPLE, item=TENSOR)
        return TENSOR

    def _method_call(self, node: cst.Call, func: cst.Attribute) -> Value:
        meth = func.attr.value
        if meth in ("forward", "__call__") and isinstance(func.value, cst.Call) and isinstance(
                func.value.func, cst.Name) and func.value.func.value == "super" and (
                not func.value.args):
            found = self._super_forward(func)
            if found is not None:
                return found
        if meth == "get_interface" and isinstance(func.value, cst.Name):
            q = self._q(func.value)
            if q is not None and library_function(q) == ATTENTION:
                return ATTENTION  # ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager)
        base = self.value(func.value)
        if base.kind == Kind.TENSOR:
            if meth in _TENSOR_SCALAR_METHODS:
                return SCALAR
            if meth == "size":
                return SCALAR if node.args else Value(Kind.TUPLE, item=SCALAR)
            if meth == "numpy":
                return OBJECT
            if meth in _TENSOR_TUPLE_METHODS:
                if meth in _TENSOR_TUPLE_WITH_DIM and not node.args:
                    return TENSOR
                if meth in ("max", "min") and node.args and (
                        (node.args[0].keyword is None
                         and self.kind(node.args[0].value) == Kind.TENSOR)
                        or any(a.keyword and a.keyword.value == "other" for a in node.args)):
                    return TENSOR  # x.max(y): elementwise
                return Value(Kind.TUPLE, item=TENSOR)
            return TENSOR
        if base.kind == Kind.MODULE:
            if base.cls is not None:
                method = self._method(base.cls, meth)
                if method is not None:
                    return self._returned(method)
            if meth in _MODULE_METHODS:
                return _MODULE_METHODS[meth] if _MODULE_METHODS[meth] != MODULE else base
            if meth in ("forward", "__call__"):
                return TENSOR
            return TENSOR  # a submodule called through an attribute chain
        if base == NUMPY:
            if meth in _NUMPY_SCALAR_METHODS:
                return SCALAR
            return Value(Kind.LIST, item=UNKNOWN) if meth == "tolist" else NUMPY
        if (base.cls, meth) in LIBRARY_METHODS:  # cache.update(k, v, i): the keys, values
            return LIBRARY_METHODS[base.cls, meth]
        if base.kind in (Kind.OBJECT, Kind.CONFIG) and base.cls is not None:
            method = self._method(base.cls, meth)
            return self._returned(method) if method is not None else UNKNOWN
        if base.kind == Kind.DICT:
            if meth in ("items",):
                return Value(Kind.OBJECT, item=Value(Kind.TUPLE, items=(
                    SCALAR, base.item or UNKNOWN)))
            if meth in ("keys",):
                return Value(Kind.OBJECT, item=SCALAR)
            if meth in ("values",):
                return Value(Kind.OBJECT, item=base.item or UNKNOWN)
            if meth in ("get", "pop", "setdefault"):
                return base.item or UNKNOWN
            if meth == "copy":
                return base
            return NONE if meth in ("update", "clear") else UNKNOWN
        if base.kind in (Kind.LIST, Kind.TUPLE, Kind.SET):
            if meth == "pop":
                return base.element()
            if meth == "copy":
                return base
            return SCALAR if meth in ("index", "count") else NONE
        if base.kind == Kind.SCALAR:
            if meth == "split":
                return Value(Kind.LIST, item=SCALAR)
            return SCALAR
        if base.kind == Kind.OPTIMIZER:
            return Value(Kind.DICT) if meth == "state_dict" else NONE
        if base.kind == Kind.SCHEDULER:
            return Value(Kind.LIST, item=SCALAR) if meth == "get_last_lr" else NONE
        if meth in _ANY_RECEIVER_METHODS:
            return _ANY_RECEIVER_METHODS[meth]
        if base.kind == Kind.OBJECT and base.cls is None:
            if isinstance(func.value, cst.Name) and self._is_parser(func.value) and (
                    meth == "parse_args"):
                return CONFIG
            return UNKNOWN
        if base.kind == Kind.PARAM:
            return PARAM
        return UNKNOWN

    # ---------------------------------------------------------------- names
    def _access(self, node: cst.Name):
        access = self._access_of.get(node)
        if access is None:
            scope = self._scopes.get(node)
            if scope is None:
                return None
            for a in scope.accesses[node.value]:
                self._access_of[a.node] = a
            access = self._access_of.get(node)
        return access

    def _name(self, node: cst.Name) -> Value:
        access = self._access(node)
        if access is None:  # a binding (x = ..., a parameter): what it binds
            scope = self._scopes.get(node)
            parent = self._parents.get(node)
            for a in scope.assignments[node.value] if scope is not None else ():
                if getattr(a, "node", None) is node or getattr(a, "node", None) is parent:
                    return self._binding(a)
            return UNKNOWN
        assignments = [a for a in access.referents if isinstance(a, Assignment)]
        if not assignments and not access.referents:
            return self._read_before_bound(node)
        if not assignments:
            return OBJECT  # builtins (print, len)
        reaching = self._reaching(node, assignments)
        value = _join([self._binding(a) for a in reaching])
        if value is _BUSY:
            return _BUSY
        if value.kind in (Kind.TENSOR, Kind.PARAM, Kind.UNKNOWN):
            narrowed = self._narrowed(node, reaching)
            if narrowed is not None:
                return narrowed
        if value.kind in (Kind.UNKNOWN, Kind.PARAM):
            evidence = self._use_evidence(assignments)
            if evidence is not None:
                return evidence
        return value

    def _read_before_bound(self, read: cst.Name) -> Value:
        """A read that no assignment precedes in its scope, which the scope analysis leaves
        without referents: a loop-carried name (``loss.item()`` at the top of a loop body,
        ``loss`` assigned further down). Flow-insensitively, within the scope: a tensor when
        every assignment of the name in its scope binds a tensor."""
        scope = self._scopes.get(read)
        own = [a for a in scope.assignments[read.value] if isinstance(a, Assignment)
               and a.scope is scope] if scope is not None else []
        if not own:
            return UNKNOWN
        values = [self._binding(a) for a in own]
        if any(v is _BUSY for v in values):
            return _BUSY
        value = _join(values)
        return value if value.kind == Kind.TENSOR else UNKNOWN

    def _narrowed(self, read: cst.Name, reaching: list[Assignment]) -> Value | None:
        """In the body of ``if isinstance(name, C):`` (or of ``if ... and isinstance(name,
        C):``), where no assignment of the name in that body comes before the read: an
        instance of ``C`` (``cache.is_updated[i] = True`` under ``isinstance(cache,
        EncoderDecoderCache)`` is an object's item; ``x`` under ``isinstance(x,
        torch.Tensor)`` a tensor). None when nothing narrows the name."""
        child, at = read, self._parents.get(read)
        while at is not None and not isinstance(at, (cst.FunctionDef, cst.ClassDef,
                                                     cst.Lambda, cst.Module)):
            if isinstance(at, cst.If) and child is at.body:
                cls = _isinstance_class(at.test, read.value)
                if cls is not None:
                    body = self._positions.get(at.body)
                    for a in reaching:
                        pos = self._positions.get(getattr(a, "node", None))
                        if body is None or pos is None or (
                                _at(body.start) <= _at(pos.start) and _at(pos.end)
                                <= _at(body.end)):
                            return None  # rebound in the branch (or no position to tell)
                    return self._class_value(cls)
            child, at = at, self._parents.get(at)
        return None

    def _class_value(self, cls: cst.BaseExpression) -> Value | None:
        """What ``isinstance(x, cls)`` says ``x`` is, when the class is known."""
        if not _dotted(cls):
            return None
        q = self._q(cls)
        if q is None or "<locals>" in q:
            return None
        if q in ("torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return TENSOR
        builtin = {"builtins.dict": DICT, "builtins.list": LIST,
                   "builtins.tuple": Value(Kind.TUPLE), "builtins.set": Value(Kind.SET),
                   "builtins.int": SCALAR, "builtins.float": SCALAR, "builtins.str": SCALAR,
                   "builtins.bool": SCALAR}
        if q in builtin:
            return builtin[q]
        if isinstance(cls, cst.Name) and self._file_class(cls.value) is not None and (
                self._defines(cls, cls.value)):
            instance = self._instance(cls.value)
            return instance if instance.kind != Kind.MODULE else None
        if q.startswith(("torch.", "builtins.", "typing.", "collections.", "numpy.", "jax.")):
            return None
        if isinstance(cls, cst.Name) and cls.value in self.module_classes:
            return None
        if "." not in q:
            return None
        return library_class(q.rsplit(".", 1)[-1]) or OBJECT  # a class of another library

    def _before_augmented(self, stmt: cst.AugAssign) -> Value | None:
        """What the target of ``x += ...`` held before the statement: the join of the other
        assignments of ``x`` in its scope that reach it; None where one is not known."""
        target = stmt.target
        scope = self._scopes.get(target)
        if not isinstance(target, cst.Name) or scope is None:
            return None
        others = [a for a in scope.assignments[target.value] if isinstance(a, Assignment)
                  and a.node is not target and self._parents.get(a.node) is not stmt]
        reaching = self._reaching(target, others) if others else []
        if not reaching or len(reaching) == len(others) and any(
                (self._reach(a.node) or (0, 0)) > (self._positions[target].start.line,
                                                   self._positions[target].start.column)
                for a in others if target in self._positions):
            return None  # (none before it: a loop-carried name)
        values = [self._binding(a) for a in reaching]
        return None if any(v is _BUSY for v in values) else _join(values)

    def _reaching(self, read: cst.Name, assignments: list[Assignment]) -> list[Assignment]:
        """The assignments of the read's own scope that reach it in straight-line code: the
        latest one before it whose block encloses the read, and the ones in between (in
        branches); all of them when none precedes it (a loop, a global read in a function)."""
        scope = self._scopes.get(read)
        where = self._positions.get(read)
        if where is None or any(a.scope is not scope for a in assignments):
            return assignments
        read_at = (where.start.line, where.start.column)
        before = []
        for a in assignments:
            reach = self._reach(a.node)
            if reach is not None and reach <= read_at:
                before.append((reach, a))
        if not before:
            return assignments
        before.sort(key=lambda p: p[0], reverse=True)
        blocks = set(self._blocks_of(read))
        found = []
        for _, a in before:
            found.append(a)
            if self._block(a.node) in blocks:
                break
        return found

    def _reach(self, node: cst.CSTNode) -> tuple[int, int] | None:
        """Where a binding takes effect: after the end of its assignment statement, at the
        binding itself otherwise (a loop target, a parameter)."""
        at = node
        while at is not None and not isinstance(at, (cst.BaseSmallStatement,
                                                     cst.BaseCompoundStatement, cst.Param)):
            if isinstance(at, _SCOPES):
                break
            at = self._parents.get(at)
        if isinstance(at, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            pos = self._positions.get(at)
            return (pos.end.line, pos.end.column) if pos is not None else None
        pos = self._positions.get(node)
        return (pos.start.line, pos.start.column) if pos is not None else None

    def _block(self, node: cst.CSTNode) -> int | None:
        at = self._parents.get(node)
        while at is not None and not isinstance(at, _BLOCKS):
            at = self._parents.get(at)
        return id(at) if at is not None else None

    def _blocks_of(self, node: cst.CSTNode) -> Iterable[int]:
        at = self._parents.get(node)
        while at is not None:
            if isinstance(at, _BLOCKS):
                yield id(at)
            if isinstance(at, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return
            at = self._parents.get(at)

    def _use_evidence(self, assignments: list[Assignment]) -> Value | None:
        """A name used as only some kinds are (``x["key"]``, ``x.items()``, ``x.eval()``)."""
        found: set[Kind] = set()
        for a in assignments:
            for access in a.references:
                parent = self._parents.get(access.node)
                if isinstance(parent, cst.Attribute) and parent.value is access.node:
                    kind = _USE_EVIDENCE.get(parent.attr.value)
                    if kind is not None:
                        found.add(kind)
                elif isinstance(parent, cst.Arg) and parent.keyword is None and (
                        self._tensor_data_arg(parent)):
                    found.add(Kind.TENSOR)  # nn.Buffer(x) / nn.Parameter(x): x is a tensor
                elif isinstance(parent, cst.Comparison) and self._compared_in_mask(
                        access.node, parent):
                    found.add(Kind.TENSOR)  # y.masked_fill(x == 0, v): x is a tensor
                elif isinstance(parent, cst.Subscript) and parent.value is access.node and (
                        len(parent.slice) == 1 and isinstance(parent.slice[0].slice, cst.Index)
                        and isinstance(parent.slice[0].slice.value,
                                       (cst.SimpleString, cst.FormattedString))):
                    found.add(Kind.DICT)
        if len(found) == 1:
            return Value(found.pop())
        return None

    def _compared_in_mask(self, name: cst.Name, comparison: cst.Comparison) -> bool:
        """``name`` compared with a number or string (``x == 0``, ``x > t``; not ``is``/``in``)
        where the comparison, possibly inverted or combined with ``&``/``|``, is the mask of
        ``y.masked_fill(mask, v)`` (``masked_fill_``, ``masked_scatter``, ``masked_select``)
        or the condition of ``torch.where(cond, ...)``. Those take a tensor mask only (a
        Python bool or a numpy array raises in torch), and compared with a scalar only a
        tensor gives a tensor: ``name`` is a tensor."""
        operands = [comparison.left, *(c.comparator for c in comparison.comparisons)]
        if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
               for c in comparison.comparisons) or not any(o is name for o in operands):
            return False
        if any(self.kind(o) != Kind.SCALAR for o in operands if o is not name):
            return False
        at = self._parents.get(comparison)
        while (isinstance(at, cst.UnaryOperation) and isinstance(at.operator, cst.BitInvert)) or (
                isinstance(at, cst.BinaryOperation) and isinstance(
                    at.operator, (cst.BitAnd, cst.BitOr, cst.BitXor))):
            at = self._parents.get(at)
        if not isinstance(at, cst.Arg) or at.star:
            return False
        call = self._parents.get(at)
        if not isinstance(call, cst.Call):
            return False
        positional = [a for a in call.args if a.keyword is None and not a.star]
        keyword = at.keyword.value if at.keyword is not None else None
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _MASK_METHODS:
            if self._file_method(func.attr.value):
                return False  # a class of the file has a method of that name
            return keyword == "mask" or (keyword is None and positional[:1] == [at])
        q = self._q(func) if _dotted(func) else None
        if q == "torch.where":
            return keyword == "condition" or (keyword is None and positional[:1] == [at])
        if q == "torch.masked_select":
            return keyword == "mask" or (keyword is None and positional[1:2] == [at])
        return False

    def _file_method(self, name: str) -> bool:
        """Whether a class of the file defines a method ``name``."""
        self._file_class("")
        return any(isinstance(s, cst.FunctionDef) and s.name.value == name
                   for c in self._classes.values() for s in c.body.body)

    def _tensor_data_arg(self, node: cst.Arg) -> bool:
        """``node`` is the first argument of ``nn.Buffer(...)`` / ``nn.Parameter(...)``, which
        take a tensor."""
        call = self._parents.get(node)
        return (isinstance(call, cst.Call) and bool(call.args) and call.args[0] is node
                and _dotted(call.func) and self._q(call.func) in (
                    "torch.nn.Buffer", "torch.nn.parameter.Buffer", "torch.nn.Parameter",
                    "torch.nn.parameter.Parameter"))

    def _binding(self, assignment: Assignment) -> Value:
        node = assignment.node
        key = node
        cached = self._binding_cache.get(key)
        if cached is not None:
            return cached
        self._binding_cache[key] = _BUSY
        result = self._bind(node)
        if result is _BUSY:
            del self._binding_cache[key]
            return _BUSY
        self._binding_cache[key] = result
        return result

    def _bind(self, node: cst.CSTNode) -> Value:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            return OBJECT
        if isinstance(node, cst.ClassDef):
            return OBJECT
        if isinstance(node, cst.FunctionDef):
            return FUNCTION
        if isinstance(node, cst.Param):
            return self._param(node)
        if not isinstance(node, cst.Name):
            return UNKNOWN
        # the target Name: walk up to what binds it, noting the unpacking positions
        path: list[int] = []
        child: cst.CSTNode = node
        parent = self._parents.get(node)
        while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            if isinstance(parent, cst.StarredElement):
                return Value(Kind.LIST)
            if isinstance(parent, (cst.Tuple, cst.List)):
                path.append(next(i for i, e in enumerate(parent.elements) if e is child))
            child, parent = parent, self._parents.get(parent)
        if isinstance(parent, cst.AssignTarget):
            assign = self._parents.get(parent)
            value = self.value(assign.value)
        elif isinstance(parent, cst.AnnAssign):
            value = self.value(parent.value) if parent.value is not None else UNKNOWN
            if value.kind in (Kind.UNKNOWN, Kind.PARAM, Kind.NONE):
                value = self._annotation(parent.annotation.annotation) or value
        elif isinstance(parent, cst.AugAssign):
            value = self.value(parent.value)
            before = self._before_augmented(parent)
            if before is not None and before.kind == Kind.TENSOR and value.kind != Kind.TENSOR:
                # a tensor grown in place stays one, whatever is added (mvitv2's dist_h +=
                # (k_h - 1) * k_h_ratio, a ratio from max(...), then dist_h.long())
                return before
            if value.kind == Kind.SCALAR:
                return _BUSY  # x += 1 keeps the kind x had
        elif isinstance(parent, (cst.For, cst.CompFor)) and parent.target is child:
            value = self.value(parent.iter).element()
        elif isinstance(parent, cst.AsName):
            owner = self._parents.get(parent)
            if isinstance(owner, cst.WithItem):
                value = self.value(owner.item)
            else:
                return OBJECT  # except ... as e
        elif isinstance(parent, cst.NamedExpr):
            value = self.value(parent.value)
        else:
            return UNKNOWN
        for index in reversed(path):
            value = value.element(index)
        return value

    def _param(self, param: cst.Param) -> Value:
        fn = self._parents.get(self._parents.get(param))
        if isinstance(fn, cst.Lambda):
            return PARAM
        if not isinstance(fn, cst.FunctionDef):
            return PARAM
        params = fn.params
        cls = self._parents.get(self._parents.get(fn))
        cls = cls if isinstance(cls, cst.ClassDef) else None
        positional = [*params.posonly_params, *params.params]
        if cls is not None and positional and positional[0] is param and not any(
                m_ for m_ in fn.decorators if isinstance(m_.decorator, cst.Name)
                and m_.decorator.value == "staticmethod"):
            return self._instance(cls.name.value)  # self
        if param.annotation is not None:
            found = self._annotation(param.annotation.annotation)
            if found is not None:
                return found
        if param.default is not None:
            default = self.value(param.default)
            if default.kind not in (Kind.NONE, Kind.UNKNOWN, Kind.PARAM):
                return default
        if param is params.star_arg or param is params.star_kwarg:
            return Value(Kind.TUPLE) if param is params.star_arg else DICT
        if cls is not None and fn.name.value in ("forward", "__call__") and (
                cls.name.value in self.module_classes):
            return TENSOR
        if cls is None:  # a callback a class of the file calls with its instance
            if self._registries is None:
                self._registries = callbacks.registries(self._module)
            registered = callbacks.receiver(self._module, fn, self._registries)
            if registered is not None and param in positional and (
                    positional.index(param) == registered[1]):
                return self._instance(registered[0])
        return self._from_call_sites(fn, cls, param)

    def _annotation(self, node: cst.BaseExpression) -> Value | None:
        q = self._q(node) or ""
        text = cst.Module([]).code_for_node(node)
        if q in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor") or "Tensor" in text:
            return TENSOR
        if q in ("builtins.int", "builtins.float", "builtins.str", "builtins.bool"):
            return SCALAR
        if q == "torch.dtype":  # def get_attn_mask(self, ..., dtype: torch.dtype)
            return DTYPE
        if q.startswith(("builtins.dict", "typing.Dict")) or text.startswith(("dict", "Dict")):
            return DICT
        if q.startswith(("builtins.list", "typing.List")) or text.startswith(("list", "List")):
            return LIST
        if q in ("torch.nn.Module", "torch.nn.modules.module.Module"):
            return MODULE
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr) and (
                m.matches(node.right, m.Name("None"))):
            node = node.left  # Cache | None: what it holds when it is not None
            q = self._q(node) or ""
        if isinstance(node, cst.Name) and q and "." in q and not q.startswith((
                "torch.", "builtins.", "typing.", "collections.", "numpy.", "jax.")) and (
                node.value not in self.module_classes and "<locals>" not in q):
            # a class imported from another library (cache: Cache | None): not a tensor
            return library_class(node.value) or (
                CONFIG if node.value.endswith("Config") else OBJECT)
        return None

    def _from_call_sites(self, fn: cst.FunctionDef, cls: cst.ClassDef | None,
                         param: cst.Param) -> Value:
        """The kinds of the arguments the file passes for ``param`` where it calls ``fn``
        (a function by its name; a class's ``__init__`` where the class is called)."""
        if cls is not None and fn.name.value != "__init__":
            return PARAM
        target = cls if cls is not None else fn
        scope = self._scopes.get(target)
        if scope is None:
            return PARAM
        given = passed_arguments(scope, self._parents, target, fn, param, cls is not None)
        if given is None:
            return PARAM
        values = [self.value(g) for g in given]
        if not values:
            return PARAM
        found = _join(values)
        if found is _BUSY or found.kind == Kind.UNKNOWN:
            return PARAM
        return found

    # ---------------------------------------------------------------- the file's classes
    def _file_class(self, name: str) -> str | None:
        if self._classes is None:
            self._classes = {s.name.value: s for s in self._module.body
                             if isinstance(s, cst.ClassDef)}
        return name if name in self._classes else None

    def _defines(self, func: cst.Name, cls: str) -> bool:
        access = self._access(func)
        return access is None or any(
            getattr(a, "node", None) is self._classes[cls] for a in access.referents)

    def _instance(self, cls: str) -> Value:
        if cls in self.module_classes:
            return Value(Kind.MODULE, cls=cls if self._file_class(cls) else None)
        if self._file_class(cls) is None:
            return OBJECT
        node = self._classes[cls]
        dataclass_ = any("dataclass" in cst.Module([]).code_for_node(d.decorator)
                         for d in node.decorators)
        if dataclass_ or cls.endswith(("Config", "Args", "Arguments", "Params")):
            return Value(Kind.CONFIG, cls=cls)
        return Value(Kind.OBJECT, cls=cls)

    def _super_forward(self, node: cst.CSTNode) -> Value | None:
        """``super().forward(x)`` in a method of a module class of the file (ESMC's LayerNorm
        that casts back, ``super().forward(x).to(x.dtype)``): what the parent's forward returns,
        the file's class or a torch layer (a tensor). None outside a module class."""
        at = self._parents.get(node)
        while at is not None and not isinstance(at, cst.FunctionDef):
            at = self._parents.get(at)
        cls = self._parents.get(self._parents.get(at)) if at is not None else None
        if not isinstance(cls, cst.ClassDef) or cls.name.value not in self.module_classes:
            return None
        bases = [b.value.value for b in cls.bases if isinstance(b.value, cst.Name)]
        method = self._method(bases[0], "forward") if bases else None
        return self._returned(method) if method is not None else TENSOR

    def _method(self, cls: str, name: str) -> cst.FunctionDef | None:
        seen = set()
        while cls and cls not in seen and self._file_class(cls):
            seen.add(cls)
            node = self._classes[cls]
            for stmt in node.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                    return stmt
            bases = [b.value.value for b in node.bases if isinstance(b.value, cst.Name)]
            cls = bases[0] if bases else None
        return None

    def _class_values(self, cls: str, attr: str) -> list[cst.BaseExpression]:
        """What ``self.<attr>`` is assigned in the file's class ``cls`` and its bases."""
        found: list[cst.BaseExpression] = []
        seen = set()
        while cls and cls not in seen and self._file_class(cls):
            seen.add(cls)
            found += self._attrs_of(cls).get(attr, [])
            node = self._classes[cls]
            bases = [b.value.value for b in node.bases if isinstance(b.value, cst.Name)]
            cls = bases[0] if bases else None
        return found

    def _file_modules_attr(self, attr: str) -> Value:
        """``module.<attr>`` of a module of no known class (the ``module`` an attention function
        is given: ``module.sinks.reshape(...)``): a tensor where every module class of the file
        that sets ``self.<attr>`` sets a tensor (a parameter, a buffer), else unknown."""
        found = [v for c in sorted(self.module_classes) if self._file_class(c)
                 and (v := self._class_attr(c, attr)) is not None]
        return TENSOR if found and all(v.kind == Kind.TENSOR for v in found) else UNKNOWN

    def _class_attr(self, cls: str, attr: str) -> Value | None:
        """The kind of ``self.<attr>`` in the file's class ``cls`` (and its bases of the
        file): its assignments in any method."""
        found = [self.value(v) for v in self._class_values(cls, attr)] or (
            self._unpacked_attr(cls, attr))
        if not found:
            return None
        value = _join(found)
        return None if value is _BUSY else value

    def _unpacked_attr(self, cls: str, attr: str) -> list[Value]:
        """``self.<attr>`` bound by unpacking in a method of the file's class ``cls`` (minGPT's
        ``logits, self.loss = model(x, y)``): the items of what is unpacked."""
        if self._file_class(cls) is None:
            return []
        found = []
        for assign in findall(self._classes[cls], m.Assign(targets=[m.AssignTarget(
                target=m.Tuple())])):
            for i, e in enumerate(assign.targets[0].target.elements):
                if isinstance(e, cst.Element) and m.matches(e.value, m.Attribute(
                        value=m.Name("self"), attr=m.Name(attr))):
                    found.append(self.value(assign.value).element(i))
        return found

    def _attrs_of(self, cls: str) -> dict[str, list[cst.BaseExpression]]:
        attrs = self._class_attrs.get(cls)
        if attrs is not None:
            return attrs
        attrs = {}
        node = self._classes[cls]
        for stmt in node.body.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for s in stmt.body:  # class-level x = ...
                    if isinstance(s, cst.Assign):
                        for t in s.targets:
                            if isinstance(t.target, cst.Name):
                                attrs.setdefault(t.target.value, []).append(s.value)
                    elif isinstance(s, cst.AnnAssign) and isinstance(s.target, cst.Name) and \
                            s.value is not None:
                        attrs.setdefault(s.target.value, []).append(s.value)
            elif isinstance(stmt, cst.FunctionDef):
                _collect_self_assignments(stmt, attrs)
        self._class_attrs[cls] = attrs
        return attrs

    def _returned(self, fn: cst.FunctionDef) -> Value:
        returns = self._returns.get(id(fn))
        if returns is None:
            returns = _return_values(fn)
            self._returns[id(fn)] = returns
        if not returns:
            return NONE
        value = _join([self.value(r) for r in returns])
        return UNKNOWN if value is _BUSY else value

    def _function_result(self, func: cst.Name) -> Value:
        access = self._access(func)
        if access is None:
            return UNKNOWN
        defs = [a.node for a in access.referents if isinstance(getattr(a, "node", None),
                                                                cst.FunctionDef)]
        if len(defs) != 1:
            return UNKNOWN
        return self._returned(defs[0])

    def _is_parser(self, node: cst.Name) -> bool:
        access = self._access(node)
        if access is None:
            return False
        for a in access.referents:
            target = getattr(a, "node", None)
            parent = self._parents.get(target) if target is not None else None
            assign = self._parents.get(parent) if isinstance(parent, cst.AssignTarget) else None
            if isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call) and (
                    self._q(assign.value.func) or "").startswith("argparse."):
                return True
        return False

