"""What the rewrite needs to know about a file before changing it.

* which classes are ``nn.Module`` subclasses (directly, through another class of the file, or
  through a module class of the same repository given in ``known_modules``);
* for each module class, which ``self.x`` attributes hold layers and what activation layout
  each wants (so that ``self.conv(x)`` gets channels-last input);
* which functions build layers (they get a ``*, rngs`` parameter and their callers pass it);
* the lists that ``nn.Sequential(*layers)`` is built from;
* tied weights (``self.a.weight = self.b.weight``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from torch2jax.analysis.branch_layouts import branch_assign, torch_layout_attrs
from torch2jax.analysis.class_locals import (
    dotted,
    is_classmethod,
    local_function_options,
    looked_up_activation,
    looked_up_class,
    nchw_branch_convs,
    note_local_layer,
    param_loop_targets,
    spread_of_builder,
    tuple_class_returns,
    unpacked_classes,
)
from torch2jax.analysis.layer_lists import (
    built_layout,
    combine,
    filtered_literal,
    is_factory_dict,
    list_layout,
    literal_layout,
    literal_list_layout,
    ordered_dict_items,
    self_slice,
    spread_literals,
)
from torch2jax.analysis.returned_lists import (
    list_return_key,
    note_attr_call,
    note_method_list_returns,
    note_returned_list,
    returned_list_layouts,
)
from torch2jax.analysis.tables import method_on_parameter, named_tables
from torch2jax.analysis.value_syntax import channels_last_pattern
from torch2jax.analysis.walk import NoAttributeHooks, of_type
from torch2jax.ruleset import Rule, RuleSet

_CONTAINERS = ("sequential", "module_list", "module_dict")
MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
FACTORY_SUFFIXES = ("norm_layer", "_norm")
RANDOM_INITS = {f"torch.nn.init.{n}" for n in (
    "normal_", "uniform_", "trunc_normal_", "kaiming_normal_", "kaiming_uniform_",
    "xavier_normal_", "xavier_uniform_", "orthogonal_")}
# functions of other packages that are torch's to the letter (same signature, same meaning):
# they are read as torch's, and translated as torch's are. timm's trunc_normal_ (mean, std and
# the absolute cut-offs a, b, drawn in place) is torch.nn.init.trunc_normal_; its
# trunc_normal_tf_ (cut-offs in units of std) is not.
_TIMM_LAYERS = ("timm.layers", "timm.layers.weight_init", "timm.models.layers")
SAME_AS = {f"{m}.trunc_normal_": "torch.nn.init.trunc_normal_" for m in _TIMM_LAYERS}
# timm's other initialisers have no torch function of their meaning: they are read in
# torch.nn.init's namespace under their own names, so that they take torch's initialisers' path
# (imports, keys), and passes/rewrite_layers.py's _init_statement translates each by its name
# (trunc_normal_tf_: cut-offs in units of std; lecun_normal_ and variance_scaling_: torch's fans)
TIMM_INITS = ("trunc_normal_tf_", "lecun_normal_", "variance_scaling_")
SAME_AS.update({f"{m}.{n}": f"torch.nn.init.{n}" for m in _TIMM_LAYERS for n in TIMM_INITS})
RANDOM_INITS |= {f"torch.nn.init.{n}" for n in TIMM_INITS}


_NAMES = "_qualified_names"


def share_names(cache: dict, visitor: cst.MetadataDependent) -> cst.MetadataDependent:
    """``visitor``, answering :func:`qualified` from ``cache``, which the other visitors of
    the same module's metadata share."""
    visitor.__dict__[_NAMES] = cache
    return visitor


def qualified(visitor: cst.MetadataDependent, node: cst.CSTNode) -> str | None:
    """The single qualified name of ``node`` (``torch.nn.Linear``), or None: the first, in
    sorted order, of the names its scope gives it (what libcst's QualifiedNameProvider
    reports; the visitor declares ``ScopeProvider``). Asked once per node and visitor."""
    cache = visitor.__dict__.setdefault(_NAMES, {})
    if node in cache:
        return cache[node]
    scope = visitor.get_metadata(ScopeProvider, node, None)
    names = scope.get_qualified_names_for(node) if scope else None
    found = min(n.name for n in names) if names else None
    found = cache[node] = SAME_AS.get(found, found)  # type: ignore[arg-type]
    return found


@dataclass
class ClassInfo:
    name: str
    bases: list[str]
    module_base: str | None = None  # local module class it derives from, or "torch"
    attr_layout: dict[str, str] = field(default_factory=dict)  # self.x -> layout
    elem_layout: dict[str, str] = field(default_factory=dict)  # self.xs[i] -> layout
    uses_training: bool = False
    attr_rule: dict[str, str] = field(default_factory=dict)  # self.x -> torch layer name
    attr_ctor: dict[str, cst.Call] = field(default_factory=dict)  # self.x -> its torch call
    no_bias: set[str] = field(default_factory=set)  # self.x built with bias=False
    batch_stats_only: set[str] = field(default_factory=set)  # BatchNorm without running stats
    tied_heads: dict[str, str] = field(default_factory=dict)  # linear attr -> embedding path
    # a Linear head with a bias tied to an Embedding attribute: head attr -> "self.<embedding>"
    tied_bias_heads: dict[str, str] = field(default_factory=dict)
    container: str | None = None  # "sequential" / "module_dict" / "module_list": a subclass
    # the torch layer (not a container) it derives from, directly or through local classes:
    # class LayerNorm2d(nn.LayerNorm)
    layer_base: str | None = None
    defines_init: bool = False  # has its own __init__
    # self.x.add_module(name, layer) on a Sequential attribute: the added layers' layouts
    added_layouts: dict[str, list[str]] = field(default_factory=dict)
    # Sequential attributes built channels-last, then given torch-layout layers by add_module
    # (densenet's features): they take NCHW, with transposes around their channels-last items
    normalized_seqs: set[str] = field(default_factory=set)
    init_attrs: list[str] = field(default_factory=list)  # self.x = <layer> in __init__, in order
    iterated: set[str] = field(default_factory=set)  # self.x iterated (for / items / values)
    # a ModuleList / ModuleDict subclass: the layouts of the layers put into it (super().__init__
    # of a list, self.append / extend / add_module, self[name] = ...): `for layer in self`
    self_items: list[str] = field(default_factory=list)
    self_elem_layout: str | None = None
    # a Sequential subclass passing on its own varargs (timm's SequentialList: ``def
    # __init__(self, *args): super().__init__(*args)``): the layouts of what the file's
    # constructions of the class pass it (``SequentialList(*[Block(...) for ...])``)
    varargs_items: bool = False
    site_items: list[str] = field(default_factory=list)
    # a ModuleList whose elements are fixed-length containers (nn.ModuleList([block, attn,
    # down]) per stage, unpacked by `for block, attn, down in self.stages`): each element's
    # layouts by position (None: an element whose positions are not known), and once the
    # class is read, their layouts combined per position (absent when one is not known)
    elem_items: dict[str, list[list[str] | None]] = field(default_factory=dict)
    elem_positions: dict[str, list[str]] = field(default_factory=dict)
    module_attrs: set[str] = field(default_factory=set)  # self.x assigned a layer somewhere
    # self.x assigned a layer other than nn.Identity somewhere (an Identity in another branch
    # must then be a module in NNX: an attribute first set to a function is static)
    real_layer_attrs: set[str] = field(default_factory=set)
    tensor_attrs: set[str] = field(default_factory=set)  # self.x = nn.Parameter(...) / torch.*
    built_by: dict[str, set[str]] = field(default_factory=dict)  # self.x -> called names


@dataclass
class FileIndex:
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    module_classes: set[str] = field(default_factory=set)
    defined: set[str] = field(default_factory=set)  # names bound at the top level of the file
    # code not seen here builds the file's classes (public=None: a package's module converted
    outside_callers: bool = False  # alone): an activation parameter may get any class there
    rngs_functions: set[str] = field(default_factory=set)  # names of functions taking rngs
    type_fields: set[str] = field(default_factory=set)  # imported classes' module-class fields
    # functions taking rngs only to draw (timm's _init_weights): partial(fn, ...) binds rngs
    draw_functions: set[str] = field(default_factory=set)
    list_layouts: dict[tuple[int, str], str] = field(default_factory=dict)  # (fn id, name)
    tied: list[tuple[str, str]] = field(default_factory=list)  # (embedding path, linear path)
    fn_returns: dict[str, str] = field(default_factory=dict)  # layer-returning helpers
    factory_layouts: set[str] = field(default_factory=set)  # layer classes used as values
    # layers bound to plain names: (id of the function or 0 for module level, name) -> layout
    name_layouts: dict[tuple[int, str], str] = field(default_factory=dict)
    # lists of layers in both layouts (fn id, name): channels-last items get transposes
    normalized_lists: set[tuple[int, str]] = field(default_factory=set)
    ordered_dicts: set[tuple[int, str]] = field(default_factory=set)  # layers = OrderedDict()
    # names bound to torch's factory keywords, dd = {"device": device, "dtype": dtype}: a
    # layer given **dd is translated with its keywords (passes/rewrite.py), not as **kwargs
    factory_dicts: set[str] = field(default_factory=set)
    # module-level functions whose returns are all class names (rdnet's _get_block_type),
    # and those returning tuples with a class name at item i (cspnet's `return stage_fn,
    # stage_args`): {function: names}, {function: {i: names}}; calling their result builds
    class_returns: dict[str, set[str]] = field(default_factory=dict)
    class_tuple_returns: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    # nn.Conv2d(...) calls (ids) in an OrderedDict of torch-layout layers (maxvit's MBConv):
    # built as the NCHW Conv2d helper class, so that the dict is one layout
    torch_convs: set[int] = field(default_factory=set)


class Layouts:
    """Computes the activation layout a layer-building expression wants."""

    def __init__(self, rules: RuleSet, meta, index: FileIndex) -> None:
        self.rules = rules
        self.meta = meta
        self.index = index

    def of(self, node: cst.BaseExpression, scope_lists: dict[str, str] | None = None) -> str:
        if isinstance(node, cst.IfExp):
            # a layer or None (nn.MaxPool2d(2) if add_pooling else None): the layer's layout
            for layer, other in ((node.body, node.orelse), (node.orelse, node.body)):
                if m.matches(other, m.Name("None")):
                    return self.of(layer, scope_lists)
            a, b = self.of(node.body, scope_lists), self.of(node.orelse, scope_lists)
            return a if a == b else ("torch" if "any" in (a, b) and "torch" in (a, b) else
                                     a if b == "any" else b if a == "any" else "mixed")
        if isinstance(node, cst.Name) and scope_lists and node.value in scope_lists:
            return scope_lists[node.value]  # a layer built into a local: final_conv = nn.Conv2d
        if isinstance(node, cst.Tuple) and len(node.elements) == 2:
            # (name, layer): an item of the list an OrderedDict of layers is built from
            return self.of(node.elements[1].value, scope_lists)
        if not isinstance(node, cst.Call):
            return "torch"
        if isinstance(node.func, cst.Name) and node.func.value in self.index.fn_returns:
            return self.index.fn_returns[node.func.value]
        cls = getattr(self.meta, "current_class", None)
        if cls and m.matches(node.func, m.Attribute(value=m.Name("self"))) and (
                f"{cls}.{node.func.attr.value}" in self.index.fn_returns):
            # a method building a layer: self.depthwise_conv(...)
            return self.index.fn_returns[f"{cls}.{node.func.attr.value}"]
        if isinstance(node.func, cst.Name):
            # a parameter defaulting to a layer class (norm_layer=partial(nn.LayerNorm, ...))
            layout = self.factory_param_layout(node.func.value)
            if layout is not None:
                return layout
            # a local assigned one (if norm_layer is None: norm_layer = partial(LayerNorm2d))
            layout = self.local_factory_layout(node.func.value)
            if layout is not None:
                return layout
        if (isinstance(node.func, cst.Name) and node.func.value.endswith(FACTORY_SUFFIXES)
                and len(self.index.factory_layouts) == 1):
            # norm_layer(planes) where the file's only layer class used as a value is, e.g.,
            # nn.BatchNorm2d
            return next(iter(self.index.factory_layouts))
        name = qualified(self.meta, node.func)
        if name is None:
            return "torch"
        rule = self.rules.layers.get(name)
        if rule is None:
            return "torch"
        if rule.special == "sequential":
            return self.sequential(node.args, scope_lists)[0]
        if rule.special in ("module_list", "module_dict"):
            return "torch"
        return built_layout(rule, node, self.index.factory_dicts)

    def einops_channels_last(self, node: cst.BaseExpression) -> str | None:
        """The pattern an einops layer (``Rearrange(pattern, ...)``, ``Reduce``) built by
        ``node`` has on channels-last arrays (value_syntax.channels_last_pattern), or None."""
        if not isinstance(node, cst.Call) or qualified(self.meta, node.func) not in (
                "einops.layers.torch.Rearrange", "einops.layers.torch.Reduce"):
            return None
        given = [a.value for a in node.args if (a.keyword is None and not a.star) or (
            a.keyword is not None and a.keyword.value == "pattern")][:1]
        if not given or not isinstance(given[0], cst.SimpleString):
            return None
        return channels_last_pattern(given[0].evaluated_value)

    def is_ordered_dict(self, name: str) -> bool:
        """``name`` holds an OrderedDict of layers in the enclosing function."""
        stack = getattr(self.meta, "_fn_stack", None)
        return bool(stack) and (id(stack[-1]), name) in self.index.ordered_dicts

    def _is_param(self, name: str) -> bool:
        stack = getattr(self.meta, "_fn_stack", None)
        if not stack:
            return False
        params = stack[-1].params
        return any(p.name.value == name for p in (*params.params, *params.kwonly_params))

    def factory_rule(self, name: str) -> Rule | None:
        """The layer rule of the torch class a parameter of the enclosing function defaults to
        (``conv_layer: Callable[..., nn.Module] = nn.Conv2d``), or None."""
        stack = getattr(self.meta, "_fn_stack", None)
        if not stack:
            return None
        params = stack[-1].params
        for p in (*params.params, *params.kwonly_params):
            if p.name.value == name and p.default is not None:
                default = p.default
                if (isinstance(default, cst.Call) and default.args
                        and qualified(self.meta, default.func) == "functools.partial"):
                    default = default.args[0].value  # partial(nn.LayerNorm, eps=1e-6)
                return self.rules.layers.get(qualified(self.meta, default) or "")
        return None

    def factory_param_layout(self, name: str) -> str | None:
        """The layout of what a call of such a parameter builds: whatever class a caller passes
        is translated as a value the same way (see TorchToJax._layer_class_value)."""
        rule = self.factory_rule(name)
        if rule is None and ("activation" in name or name.endswith("act_layer")) and (
                self._is_param(name)):
            return "any"  # activation_layer(inplace=True): a function (see TorchToJax)
        if rule is None or rule.special in ("sequential", "module_list", "module_dict"):
            return None
        return self._factory_layout(rule)

    def _factory_layout(self, rule: Rule) -> str:
        """The layout of what a layer class handed around as a value builds."""
        if rule.special == "batch_norm":
            return rule.layout if self.index.factory_layouts == {rule.layout} else "torch"
        if rule.special in ("conv", "pool"):
            return "torch"  # the Conv2d / AvgPool2d / MaxPool2d helper classes take NCHW
        return rule.layout

    def local_factory_layout(self, name: str) -> str | None:
        """The layout of what ``name(...)`` builds when the enclosing function assigns ``name``
        layer classes (``norm_layer = partial(nn.LayerNorm, eps=1e-6)``, ``= LayerNorm2d``)
        of one layout, or None."""
        stack = getattr(self.meta, "_fn_stack", None)
        if not stack:
            return None
        layouts = set()
        for a in _name_assigns(self.meta, stack[-1]).get(name, ()):
            value = a.value
            if isinstance(value, cst.Call) and value.args and (
                    qualified(self.meta, value.func) == "functools.partial"):
                value = value.args[0].value
            if isinstance(value, cst.Name) and value.value in self.index.classes:
                layouts.add("torch")  # a module class of the file: NCHW in and out
                continue
            rule = self.rules.layers.get(qualified(self.meta, value) or "")
            if rule is None or rule.special in ("sequential", "module_list", "module_dict"):
                return None
            layouts.add(self._factory_layout(rule))
        return layouts.pop() if len(layouts) == 1 else None

    def items(self, args, scope_lists) -> list[str]:
        layouts = []
        for a in args:
            inner = ordered_dict_items(a, self.is_ordered_dict)
            if inner is not None:  # nn.Sequential(OrderedDict(...)): its values, in order
                a = cst.Arg(inner, star="*")
            if a.star == "*":
                v = a.value
                if isinstance(v, (cst.ListComp, cst.GeneratorExp)):
                    layouts.append(self.of(v.elt, scope_lists))
                elif isinstance(v, (cst.List, cst.Tuple)):
                    layouts.append(literal_layout(self, v, scope_lists, qualified))
                elif isinstance(v, cst.Name):
                    layouts.append((scope_lists or {}).get(v.value) or "mixed")
                elif spread_of_builder(self.meta, self.index, v):  # *builder(chs, args)
                    layouts.append("torch")
                elif filtered_literal(v) is not None:  # *filter(None, [conv, aa, norm, act])
                    layouts.append(list_layout([self.of(e.value, scope_lists)
                                                    for e in filtered_literal(v).elements]))
                else:
                    # *list(backbone.children())[:-1]: the rewriter reads the children
                    spread = getattr(self.meta, "children_layout", None)
                    layouts.append((spread(v) if spread is not None else None) or "mixed")
            elif a.star:
                layouts.append("mixed")
            else:
                layouts.append(self.of(a.value, scope_lists))
        return layouts

    def sequential(self, args, scope_lists=None) -> tuple[str, list[str]]:
        """(overall layout, per-item layouts). Overall is channels_last when the first and last
        layout-sensitive items are channels-last, torch otherwise, any if all are any."""
        args = spread_literals(args)
        items = self.items(args, scope_lists)
        flexible = [i for i, a in enumerate(args) if not a.star and self.einops_channels_last(
            a.value) is not None]
        others = [x for i, x in enumerate(items) if i not in flexible and x != "any"]
        if flexible and others and set(others) == {"channels_last"}:
            # an einops layer over (N, C, H, W) among channels-last layers: it reads its
            # pattern channels-last (rewrite_layers.py's _container writes it so)
            for i in flexible:
                items[i] = "channels_last"
        if "mixed" in items:
            return "mixed", items
        sensitive = [x for x in items if x != "any"]
        if not sensitive:
            return "any", items
        if sensitive[0] == "channels_last" and sensitive[-1] == "channels_last":
            return "channels_last", items
        return "torch", items


def _name_assigns(meta, fn: cst.FunctionDef) -> dict[str, list[cst.Assign]]:
    """``name -> [name = ..., ...]``: the assignments to one plain name anywhere in ``fn``
    (nested functions included), in order; one walk of ``fn`` per visitor ``meta``."""
    cache = meta.__dict__.setdefault("_name_assigns", {})
    found = cache.get(fn)
    if found is None:
        found = cache[fn] = {}
        for a in of_type(fn, cst.Assign):
            if len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name):
                found.setdefault(a.targets[0].target.value, []).append(a)
    return found


class Indexer(NoAttributeHooks, cst.CSTVisitor):
    METADATA_DEPENDENCIES = (ScopeProvider,)

    def _known_from_config(self, func: cst.BaseExpression) -> bool:
        """``AutoModel.from_config(config.text_config)``: the classmethod constructor of a
        module class of another converted module (it takes rngs there)."""
        return m.matches(func, m.Attribute(value=m.Name(), attr=m.Name("from_config"))) and (
            func.value.value in self.known_modules)

    def __init__(self, rules: RuleSet, known_modules: set[str],
                 fn_returns: dict[str, str] | None = None,
                 factory_layouts: set[str] | None = None,
                 imported_builders: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.rules = rules
        # functions of other converted files that build layers (their conversion takes rngs):
        # a call of one builds a module, and the function making it takes rngs too
        self.imported_builders = imported_builders
        self.meta = self
        self.index = FileIndex(fn_returns=dict(fn_returns or {}),
                               factory_layouts=set(factory_layouts or ()))
        self.fn_returns: dict[str, list[str]] = {}
        self.layouts = Layouts(rules, self, self.index)
        self.known_modules = known_modules
        self._class_stack: list[ClassInfo] = []
        self._fn_stack: list[cst.FunctionDef] = []
        self._lists: dict[int, dict[str, list[str]]] = {}
        self._dict_convs: dict[tuple[int, str], list[cst.Call]] = {}  # convs put in by name
        self._local_layers: dict = {}  # (function, local) -> [(layout, conv or None)]
        # (class, attribute) -> the layouts of the layers assigned to it, with the convs built
        # in place among them (mvitv2: self.pool_q = pool_op(...) or nn.Conv2d(...))
        self._attr_assigns: dict[tuple[str, str], list[tuple[str, cst.Call | None]]] = {}
        self._methods: set[str] = set()  # Class.method of every method defined
        self._fn_calls: dict[str, set[str]] = {}
        self._tables: dict[str, set[str]] = {}  # the file's tables of names (named_tables)
        self._fn_method_calls: dict[str, set[str]] = {}  # method_on_parameter's, by function
        self._fn_builds: set[str] = set()
        self._fn_draws: set[str] = set()  # functions that draw (torch.nn.init) or apply one
        self._fn_partials: dict[str, set[str]] = {}
        self._module_partials: dict[str, str] = {}  # NAME = partial(cls, ...) at the top  # partial(fn, ...) of a file's function
        self._fn_param_calls: set[str] = set()  # functions that call one of their parameters
        self._loop_targets: dict = {}  # per function: its loop targets, its unpacked classes
        self._spread_fns: dict[int, cst.FunctionDef] = {}  # Sequential(*xs) -> its function
        # module-level functions returning lists of layers: {position: layout}
        self._list_returns: dict[str, dict[int, str]] = {}
        self._root: cst.Module | None = None
        # analysis/children.py's reading of *list(backbone.children())[a:b], handed in by
        # analyse() (children.py reads this module's results)
        self.children_layouts = lambda indexer, cls, v, root, fn: None

    # -- classes
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = []
        for b in node.bases:
            q = qualified(self.meta, b.value)
            bases.append(q or (b.value.value if isinstance(b.value, cst.Name) else ""))
        info = ClassInfo(name=node.name.value, bases=bases, defines_init=any(
            isinstance(st, cst.FunctionDef) and st.name.value == "__init__"
            for st in node.body.body))
        self.index.classes[info.name] = info
        self._class_stack.append(info)
        note_method_list_returns(self, node)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._class_stack.pop()

    @property
    def current_class(self) -> str | None:
        return self._class_stack[-1].name if self._class_stack else None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._fn_stack.append(node)
        self._lists[id(node)] = {}
        key = self._fn_key()
        if self._class_stack and key:
            self._methods.add(key)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        lists = self._lists.get(id(node), {})
        for name in nchw_branch_convs(self._local_layers, id(node), self.index.torch_convs):
            lists[name] = ["torch"]  # timm's _create_fc: a conv or a Linear
        for name, layouts in lists.items():
            layout = combine(layouts)
            if (id(node), name) in self.index.ordered_dicts:
                layout = self._dict_layout(id(node), name)
                if layout == "torch" and combine(layouts) == "mixed":
                    self.index.torch_convs.update(id(c) for c in self._dict_convs[(id(node), name)])
            if layout == "mixed" and "mixed" not in layouts and (
                    id(node), name) not in self.index.ordered_dicts:
                # every item known: put in by literals, append, or extend / += of a literal
                self.index.normalized_lists.add((id(node), name))
                layout = "torch"
            self.index.list_layouts[(id(node), name)] = layout
        if not self._class_stack and len(self._fn_stack) == 1:
            self._note_list_return(node)
            returned = [r.value for r in m.findall(node, m.Return())]
            if returned and all(isinstance(v, cst.Name) and v.value[:1].isupper()
                                for v in returned):
                self.index.class_returns[node.name.value] = {v.value for v in returned}
            items = tuple_class_returns(node, returned)
            if items:
                self.index.class_tuple_returns[node.name.value] = items
        self._fn_stack.pop()

    def _note_list_return(self, node: cst.FunctionDef) -> None:
        """A function of the file returning a list of layers it built (timm's rexnet:
        ``return features, feature_info``): its callers' ``features, info = fn(...)`` bind
        that list, with its layout."""
        found = set()
        for ret in m.findall(node, m.Return()):
            value = ret.value
            items = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [
                value]
            found.add(tuple((i, v.value) for i, v in enumerate(items) if isinstance(
                v, cst.Name) and (id(node), v.value) in self.index.list_layouts))
        if len(found) == 1:
            self._list_returns[node.name.value] = {
                position: self.index.list_layouts[(id(node), name)]
                for position, name in next(iter(found))}

    def _note_added_attr(self, attr: object, value: cst.Call) -> None:
        """The layer ``self.add_module(attr, value)`` registers under a literal name."""
        if not (isinstance(attr, str) and attr.isidentifier()):
            return
        info = self._class_stack[-1]
        q = qualified(self.meta, value.func)
        rule = self.rules.layers.get(q or "")
        if rule is not None or q in self.known_modules:
            info.module_attrs.add(attr)
            if rule is None or rule.special != "identity":
                info.real_layer_attrs.add(attr)
        elif isinstance(value.func, cst.Name):
            info.built_by.setdefault(attr, set()).add(value.func.value)
        if rule is not None:
            info.attr_rule.setdefault(attr, rule.torch)
            info.attr_ctor.setdefault(attr, value)

    def _callers_fixed_point(self, builders: set[str],
                             calls: dict[str, set[str]] | None = None) -> set[str]:
        """``builders`` and every function that calls one of them (or a module class)."""
        calls = self._fn_calls if calls is None else calls
        changed = True
        while changed:
            changed = False
            for fn, called in calls.items():
                if fn not in builders and called & (builders | self.index.module_classes):
                    builders.add(fn)
                    changed = True
        return builders

    def _fn_key(self) -> str | None:
        if not self._fn_stack:
            return None
        fn = self._fn_stack[-1].name.value
        if self._class_stack:
            return f"{self._class_stack[-1].name}.{fn}"
        return fn

    def visit_Return(self, node: cst.Return) -> None:
        self._note_param_call(node.value)
        if self._fn_stack and node.value is not None:
            name = self._fn_key()
            layout = self.layouts.of(node.value, self._scope())
            if isinstance(node.value, cst.Call) and self._is_sequential(node.value) and any(
                    a.star == "*" for a in node.value.args):
                # a Sequential of a list built in a helper is handed on (vgg's make_layers ->
                # VGG(features)): nothing tracks its layout there, so it takes and returns NCHW
                # itself (one of explicit layers keeps its layout, known to the callers)
                layout = "torch"
            self.fn_returns.setdefault(name, []).append(layout)
            note_returned_list(self, name, node.value, self.rules.layers.get(qualified(
                self.meta, node.value.func) or "") if isinstance(node.value, cst.Call) else None)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if (self._class_stack and m.matches(node, m.Attribute(value=m.Name("self"),
                                                               attr=m.Name("training")))):
            self._class_stack[-1].uses_training = True

    def _unpacked(self, fn: cst.FunctionDef) -> set[str]:
        """:func:`unpacked_classes` of ``fn``, once per function and table (its calls are
        many; the table grows only when a top-level function is left)."""
        key = (id(fn), len(self.index.class_tuple_returns))
        if key not in self._loop_targets:
            self._loop_targets[key] = unpacked_classes(fn, self.index.class_tuple_returns)
        return self._loop_targets[key]

    def _note_param_call(self, value: cst.BaseExpression | None) -> None:
        """``layers.append(block(...))``, ``stem["conv"] = block(...)``, ``nn.Sequential(*[
        block(...) for ...])`` in a function whose parameter ``block`` is called: a class."""
        key, value = self._fn_key(), getattr(value, "elt", value)  # (a comprehension's item)
        if key is None or not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return
        fn, called = self._fn_stack[-1], value.func.value
        if id(fn) not in self._loop_targets:  # (once a function: its calls are many)
            self._loop_targets[id(fn)] = param_loop_targets(fn)
        params = {p.name.value for p in (*fn.params.params, *fn.params.kwonly_params)}
        if called in params or called in self._loop_targets[id(fn)]:
            self._fn_param_calls.add(key)
        if called in params and called.endswith("_layer"):  # create_aa(aa_layer, ...): builds
            self._fn_builds.add(key)  # a layer wherever it is called from (timm's blur_pool)

    def visit_Module(self, node: cst.Module) -> None:
        self._root = node
        self._tables = named_tables(node)

    def visit_Call(self, node: cst.Call) -> None:
        built = self.index.classes.get(node.func.value) if isinstance(node.func, cst.Name) \
            else None
        if built is not None and built.varargs_items:
            # SequentialList(*[Block(...) for ...]): the layers the class is given here
            built.site_items.extend(self.layouts.items(spread_literals(node.args), self._scope()))
        if self._fn_stack and any(a.star == "*" for a in node.args):
            # nn.Sequential(*list(backbone.children())[:-1]): read again in finish()
            self._spread_fns[id(node)] = self._fn_stack[-1]
        key = self._fn_key()
        if m.matches(node.func, m.Attribute(attr=m.Name("append"))) or self._is_sequential(node):
            for a in node.args:
                self._note_param_call(a.value)
        q = qualified(self.meta, node.func)
        if key is not None:
            builds = (q in self.rules.layers and self._needs_rngs(q)) or (
                q in self.known_modules
            ) or self._known_from_config(node.func)
            if isinstance(node.func, cst.Name):
                self._fn_calls.setdefault(key, set()).update({node.func.value} | (  # init_fn(m)
                    local_function_options(self._fn_stack[-1], node.func.value)))
                if node.func.value in self.known_modules | self.imported_builders:
                    builds = True
                if node.func.value == "cls" and self._class_stack and is_classmethod(
                        self._fn_stack[-1]):
                    # GPT.from_pretrained(...): cls(config) builds the class itself
                    self._fn_calls[key].add(self._class_stack[-1].name)
            elif self._class_stack and m.matches(node.func, m.Attribute(value=m.Name("self"))):
                method = f"{self._class_stack[-1].name}.{node.func.attr.value}"
                self._fn_calls.setdefault(key, set()).add(method)
            elif m.matches(node.func, m.Subscript(value=m.Name())) and (
                    node.func.value.value in self._tables):  # _block_registry[block](...)
                self._fn_calls.setdefault(key, set()).update(self._tables[node.func.value.value])
            # act_layer = get_act_layer(name); act_layer(**kwargs): builds a module class
            # where the lookup gives one (timm's create_act_layer)
            if looked_up_activation(self._fn_stack[-1], node) or looked_up_class(
                    self._fn_stack[-1], node) or isinstance(node.func, cst.Name) and (
                    node.func.value in self._unpacked(self._fn_stack[-1])) or m.matches(
                    node.func, m.Call(
                        func=m.Name(m.MatchIfTrue(self.index.class_returns.__contains__)))):
                builds = True  # (or _get_block_type(kind)(...): resolved below)
            # torch.nn.init draws need a key: the function takes rngs
            if q in RANDOM_INITS:
                self._fn_draws.add(key)
            # self.apply(self._init_weights): the init method runs with rngs
            fn = node.args[0].value if node.args else None
            if fn is not None and m.matches(fn, m.Call(args=[m.Arg(m.Attribute(
                    value=m.Name("self")), keyword=None), m.ZeroOrMore()])) and qualified(
                    self.meta, fn.func) == "functools.partial":
                fn = fn.args[0].value  # self.apply(partial(self._init_weights, flag=flag))
            if (self._class_stack and m.matches(node.func, m.Attribute(
                    value=m.Name("self"), attr=m.Name("apply")))
                    and m.matches(fn, m.Attribute(value=m.Name("self")))):
                method = f"{self._class_stack[-1].name}.{fn.attr.value}"
                self._fn_draws.add(method)
                self._fn_calls.setdefault(key, set()).add(method)  # it runs here, with rngs
            # named_apply(partial(_init_weights, head_bias=0.), self): a function of the file
            # handed on, bound or bare (it runs elsewhere, with rngs if it draws)
            self._fn_partials.setdefault(key, set()).update(
                a.value.value for a in node.args[:1 if q == "functools.partial" else None]
                if isinstance(a.value, cst.Name))
            if q == "functools.partial" and self._class_stack and node.args and m.matches(
                    node.args[0].value, m.Attribute(value=m.Name("self"))):  # (maxxvit's
                # named_apply(partial(self._init_weights, scheme=scheme), self))
                self._fn_partials[key].add(
                    f"{self._class_stack[-1].name}.{node.args[0].value.attr.value}")
            if (meth := method_on_parameter(node, self._fn_stack[-1])) is not None:
                self._fn_method_calls.setdefault(key, set()).add(meth)
                if f"*.{meth}" in self.imported_builders:  # (another module's: it draws, its
                    self._fn_draws.add(key)  # caller handed on bound to rngs, timm's byoanet)
            if builds:
                self._fn_builds.add(key)
        # a BatchNorm factory handed to a module class of another file (norm_layer=norm_layer
        # into Conv2dNormActivation): that file calls it on NCHW input, so the factory is the
        # channels-first one here too
        if isinstance(node.func, cst.Name) and node.func.value in self.known_modules and any(
                isinstance(a.value, cst.Name) and a.value.value.endswith(FACTORY_SUFFIXES)
                for a in node.args):
            self.index.factory_layouts.add("torch")
        # self.features.add_module("denseblock1", block), self.convs.append(conv): layers added
        # to a container attribute
        if self._class_stack and m.matches(node.func, m.Attribute(
                value=m.Attribute(value=m.Name("self")))) and node.args:
            info = self._class_stack[-1]
            attr, meth = node.func.value.attr.value, node.func.attr.value
            added = None
            if meth == "add_module" and len(node.args) == 2:
                added = [node.args[1].value]
            elif meth == "append" or (meth == "insert" and len(node.args) == 2):
                added = [node.args[-1].value]
            elif meth in ("extend", "update"):
                added = self._container_values(node.args[0].value)
            if added is not None:
                info.added_layouts.setdefault(attr, []).extend(
                    self.layouts.of(v, self._scope()) if v is not None else "mixed"
                    for v in added)
                if meth != "add_module":
                    info.elem_items.setdefault(attr, []).extend(self._positions(v)
                                                                for v in added)
            if meth in ("items", "values", "keys") and not node.args:
                info.iterated.add(attr)
        if self._class_stack and m.matches(node.func, m.Attribute(
                value=m.Attribute(value=m.Name("self")), attr=m.Name("items")
                | m.Name("values") | m.Name("keys"))):
            self._class_stack[-1].iterated.add(node.func.value.attr.value)
        # self.add_module("bn", nn.BatchNorm2d(c)) (timm's ConvBN(nn.Sequential)), then
        # self.bn.weight: the attribute holds that layer, as self.bn = ... would
        if self._class_stack and self._fn_stack and m.matches(node, m.Call(
                func=m.Attribute(value=m.Name("self"), attr=m.Name("add_module")),
                args=[m.Arg(m.SimpleString(), keyword=None), m.Arg(m.Call(), keyword=None)])):
            self._note_added_attr(node.args[0].value.evaluated_value, node.args[1].value)
        # a ModuleList / ModuleDict subclass filling itself
        if self._class_stack and self._fn_stack:
            info = self._class_stack[-1]
            layers = None
            if m.matches(node.func, m.Attribute(value=m.Name("self"), attr=m.Name("append"))
                         ) and node.args:
                layers = [node.args[0].value]
            elif m.matches(node.func, m.Attribute(
                    value=m.Name("self"), attr=m.Name("add_module") | m.Name("insert"))
                           ) and len(node.args) == 2:
                layers = [node.args[1].value]
            elif (m.matches(node.func, m.Attribute(value=m.Call(func=m.Name("super")),
                                                   attr=m.Name("__init__")))
                  and node.args and (len(node.args) > 1 or node.args[0].star
                                     or self._is_layer_call(node.args[0].value))):
                # a Sequential subclass's super().__init__(conv, norm, act): one layer an argument
                layers = [None if a.star or a.keyword else a.value for a in node.args]
                star = self._fn_stack[-1].params.star_arg
                if (len(node.args) == 1 and node.args[0].star == "*"
                        and isinstance(star, cst.Param)
                        and m.matches(node.args[0].value, m.Name(star.name.value))):
                    # super().__init__(*args) of its own varargs: what the constructions
                    # of the class pass (finish())
                    info.varargs_items, layers = True, []
            elif (m.matches(node.func, m.Attribute(value=m.Name("self"), attr=m.Name("extend")))
                  or m.matches(node.func, m.Attribute(value=m.Call(func=m.Name("super")),
                                                      attr=m.Name("__init__")))) and node.args:
                layers = self._container_values(node.args[0].value)
            if layers is not None:
                info.self_items.extend(self.layouts.of(v, self._scope()) if v is not None
                                       else "mixed" for v in layers)
        # list building: layers.append(X) / layers.extend([...])
        if (
            self._fn_stack
            and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name)
            and node.func.attr.value in ("append", "extend")
            and node.args
        ):
            lists = self._lists[id(self._fn_stack[-1])]
            name = node.func.value.value
            if name in lists:
                v = node.args[0].value
                if node.func.attr.value == "append":
                    lists[name].append(self.layouts.of(v, self._scope()))
                elif isinstance(v, (cst.List, cst.Tuple)):
                    lists[name].extend(self.layouts.of(e.value, self._scope())
                                       for e in v.elements)
                else:
                    lists[name].append("mixed")

    def visit_For(self, node: cst.For) -> None:
        if self._class_stack and m.matches(node.iter, m.Attribute(value=m.Name("self"))):
            self._class_stack[-1].iterated.add(node.iter.attr.value)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        if self._class_stack and m.matches(node.iter, m.Attribute(value=m.Name("self"))):
            self._class_stack[-1].iterated.add(node.iter.attr.value)

    def _container_values(self, v: cst.BaseExpression) -> list[cst.BaseExpression | None]:
        """The layers a list (or a dict) given to a ModuleList / ModuleDict holds; None for one
        that is not known statically."""
        if isinstance(v, (cst.List, cst.Tuple)):
            return [e.value if not isinstance(e, cst.StarredElement) else None
                    for e in v.elements]
        if isinstance(v, cst.Dict):
            return [e.value if isinstance(e, cst.DictElement) else None for e in v.elements]
        if isinstance(v, (cst.ListComp, cst.GeneratorExp)):
            return [v.elt]
        if m.matches(v, m.Call(func=m.Name("dict") | m.Name("OrderedDict")
                               | m.Attribute(attr=m.Name("OrderedDict")))):
            if all(a.keyword for a in v.args):  # dict(wte=..., h=...)
                return [a.value for a in v.args]
            if len(v.args) == 1 and not v.args[0].keyword:  # OrderedDict([(name, layer), ...])
                return self._container_values(v.args[0].value)
        return [None]

    def _positions(self, v: cst.BaseExpression | None) -> list[str] | None:
        """The layouts, by position, of a fixed-length container of layers put into a
        ModuleList (``nn.ModuleList([a, b])``, ``nn.Sequential(a, b)``, ``[a, b]``), or None."""
        if isinstance(v, cst.Call) and len(v.args) == 1 and not v.args[0].keyword:
            rule = self.rules.layers.get(qualified(self.meta, v.func) or "")
            if rule is not None and rule.special == "module_list":
                v = v.args[0].value
        if isinstance(v, cst.Call) and self._is_sequential(v) and not any(
                a.keyword or a.star for a in v.args):
            return [self.layouts.of(a.value, self._scope()) for a in v.args]
        if isinstance(v, (cst.List, cst.Tuple)) and not any(
                isinstance(e, cst.StarredElement) for e in v.elements):
            return [self.layouts.of(e.value, self._scope()) for e in v.elements]
        return None

    def _is_layer_call(self, v: cst.BaseExpression) -> bool:
        """A call that builds one layer (not a list, a dict or an OrderedDict of them)."""
        return isinstance(v, cst.Call) and not m.matches(v.func, m.Name("dict") | m.Name(
            "OrderedDict") | m.Name("list") | m.Name("tuple")
            | m.Attribute(attr=m.Name("OrderedDict")))

    def _is_sequential(self, node: cst.Call) -> bool:
        rule = self.rules.layers.get(qualified(self.meta, node.func) or "")
        return rule is not None and rule.special == "sequential"

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        # layers: OrderedDict[str, nn.Module] = OrderedDict()
        if (self._fn_stack and isinstance(node.target, cst.Name) and m.matches(
                node.value, m.Call(func=m.Name("OrderedDict")
                                   | m.Attribute(attr=m.Name("OrderedDict")), args=[]))):
            self._lists[id(self._fn_stack[-1])][node.target.value] = []
            self.index.ordered_dicts.add((id(self._fn_stack[-1]), node.target.value))
        # layers: list[nn.Module] = []
        if (self._fn_stack and isinstance(node.target, cst.Name)
                and isinstance(node.value, cst.List)):
            self._lists[id(self._fn_stack[-1])][node.target.value] = [
                self.layouts.of(e.value, self._scope()) for e in node.value.elements
                if not isinstance(e, cst.StarredElement)
            ]

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # layers += [conv2d, nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
        if not (self._fn_stack and isinstance(node.target, cst.Name)
                and isinstance(node.operator, cst.AddAssign)):
            return
        lists = self._lists[id(self._fn_stack[-1])]
        if node.target.value not in lists:
            return
        if isinstance(node.value, (cst.List, cst.Tuple)):
            lists[node.target.value].extend(self.layouts.of(e.value, self._scope())
                                            for e in node.value.elements)
        else:
            lists[node.target.value].append("mixed")

    def _needs_rngs(self, q: str) -> bool:
        rule = self.rules.layers[q]
        target = rule.targets.get("nnx", "")
        return target.startswith("nnx.") and target[4:5].isupper() and rule.special not in (
            "sequential", "module_list", "module_dict")

    def _scope(self) -> dict[str, str]:
        if not self._fn_stack:
            return {}
        fid = id(self._fn_stack[-1])
        return {k: self._dict_layout(fid, k) if (fid, k) in self.index.ordered_dicts
                else list_layout(v) for k, v in self._lists[fid].items()}

    def _is_conv(self, call: cst.Call) -> bool:
        rule = self.rules.layers.get(qualified(self.meta, call.func) or "")
        return rule is not None and rule.special in ("conv", "pool") and rule.layout == "channels_last"

    def _dict_layout(self, fid: int, name: str) -> str:
        """An OrderedDict of layers: one layout whatever its order (its items may be put in
        under conditions). Torch's when its only channels-last items are convolutions built
        in place or poolings: the NCHW Conv2d / MaxPool2d helpers (torch_convs; resnetv2's stem)."""
        layouts = self._lists[fid][name]
        layout = combine(layouts)
        convs = self._dict_convs.get((fid, name), [])
        if layout == "mixed" and convs and "mixed" not in layouts and (
                layouts.count("channels_last") == len(convs)):
            return "torch"
        return layout

    def visit_Assign(self, node: cst.Assign) -> None:
        if not self._fn_stack and not self._class_stack and m.matches(node, m.Assign(
                targets=[m.AssignTarget(m.Name())], value=m.Call(args=[m.Arg(
                    m.Name(), keyword=None), m.ZeroOrMore()]))) and qualified(
                    self.meta, node.value.func) == "functools.partial":
            # _SE_LAYER = partial(SqueezeExcite, gate_layer="hard_sigmoid") (timm's ghostnet):
            # a call of it builds that module class (resolved in finish)
            self._module_partials[node.targets[0].target.value] = node.value.args[0].value.value
        if m.matches(node, m.Assign(targets=[m.AssignTarget(m.Name())])) and is_factory_dict(
                node.value):
            self.index.factory_dicts.add(node.targets[0].target.value)
        if len(node.targets) != 1:
            return
        if m.matches(node.targets[0].target, m.Attribute(value=m.Name("self")) | m.Subscript()):
            self._note_param_call(node.value)
        if isinstance(node.value, (cst.Name, cst.Attribute)):
            rule = self.rules.layers.get(qualified(self.meta, node.value) or "")
            if rule is not None:  # norm_layer = nn.BatchNorm2d: a layer class as a value
                self.index.factory_layouts.add(rule.layout)
        target = node.targets[0].target
        # local lists: layers = [...]
        if self._fn_stack and isinstance(target, cst.Name) and isinstance(node.value, cst.List):
            self._lists[id(self._fn_stack[-1])][target.value] = [self.layouts.of(
                e.value, self._scope()) for e in node.value.elements
                if not isinstance(e, cst.StarredElement)]
        elif self._fn_stack and isinstance(target, cst.Name) and (got := literal_layout(
                self.layouts, node.value, self._scope(), qualified)) is not None:
            self._lists[id(self._fn_stack[-1])][target.value] = [got]  # [conv] + [...]
        elif self._fn_stack and isinstance(target, cst.Name) and isinstance(node.value, cst.ListComp) \
                and self.layouts.of(node.value.elt, self._scope()) in ("torch", "any"):
            # blocks = [Block(dim) for i in range(depth)] (starnet; channels-last: not normalized)
            self._lists[id(self._fn_stack[-1])][target.value] = ["torch"]
        # features, info = [], []
        if self._fn_stack and m.matches(node, m.Assign(
                targets=[m.AssignTarget(m.Tuple(elements=[m.ZeroOrMore(m.Element(m.Name()))]))],
                value=m.Tuple(elements=[m.ZeroOrMore(m.Element(m.List()))]))) and len(
                    target.elements) == len(node.value.elements):
            for t, v in zip(target.elements, node.value.elements):
                self._lists[id(self._fn_stack[-1])][t.value.value] = [
                    self.layouts.of(e.value, self._scope()) for e in v.value.elements
                    if not isinstance(e, cst.StarredElement)]
        # features, info = _build_blocks(...) returning a list of layers it built
        if self._fn_stack and (key := list_return_key(self, node.value)) is not None:
            names = [e.value for e in target.elements] if isinstance(
                target, (cst.Tuple, cst.List)) else [target]
            for position, layout in self._list_returns[key].items():
                if position < len(names) and isinstance(names[position], cst.Name):
                    self._lists[id(self._fn_stack[-1])][names[position].value] = [layout]
        # stages = nn.ModuleList([]), then stages.append(stage) (timm's ghostnet): a list too
        built = self.rules.layers.get(qualified(self.meta, node.value.func) or "") if (
            isinstance(node.value, cst.Call)) else None
        if self._fn_stack and isinstance(target, cst.Name) and built is not None and (
                built.special == "module_list") and (not node.value.args or m.matches(
                    node.value.args[0], m.Arg(m.List(), keyword=None, star=""))):
            self._lists[id(self._fn_stack[-1])][target.value] = [
                self.layouts.of(e.value, self._scope()) for e in (
                    node.value.args[0].value.elements if node.value.args else ())
                if not isinstance(e, cst.StarredElement)
            ]
        # layers = OrderedDict(); layers["a"] = layer: a list of layers with names
        if (self._fn_stack and isinstance(target, cst.Name) and m.matches(node.value, m.Call(
                func=m.Name("OrderedDict") | m.Attribute(attr=m.Name("OrderedDict")), args=[]))):
            self._lists[id(self._fn_stack[-1])][target.value] = []
            self.index.ordered_dicts.add((id(self._fn_stack[-1]), target.value))
        if (self._fn_stack and isinstance(target, cst.Subscript)
                and isinstance(target.value, cst.Name)
                and (id(self._fn_stack[-1]), target.value.value) in self.index.ordered_dicts):
            self._lists[id(self._fn_stack[-1])][target.value.value].append(
                self.layouts.of(node.value, self._scope()))
            if isinstance(node.value, cst.Call) and self._is_conv(node.value):
                self._dict_convs.setdefault((id(self._fn_stack[-1]), target.value.value),
                                            []).append(node.value)
        # a layer built into a local (final_conv = nn.Conv2d(...)) and put into a Sequential
        # later: its layout, like a list's. A local Sequential takes and returns NCHW itself.
        if self._fn_stack and isinstance(target, cst.Name) and isinstance(node.value, cst.Call):
            rule = self.rules.layers.get(qualified(self.meta, node.value.func) or "")
            if rule is not None:
                note_local_layer(self, target.value, node.value, rule)
        # a layer bound to a plain name (pool = nn.MaxPool2d(2), at module level or in a
        # function) and called by it: the call moves a channels-last layer's input and output
        if isinstance(target, cst.Name) and isinstance(node.value, cst.Call) and (
                self._fn_stack or not self._class_stack):
            rule = self.rules.layers.get(qualified(self.meta, node.value.func) or "")
            if rule is not None and rule.special not in _CONTAINERS:
                key = (id(self._fn_stack[-1]) if self._fn_stack else 0, target.value)
                layout = built_layout(rule, node.value, self.index.factory_dicts)
                old = self.index.name_layouts.get(key, layout)
                self.index.name_layouts[key] = layout if old == layout else "mixed"
        if not self._class_stack:
            return
        info = self._class_stack[-1]
        # tied weights: self.a.weight = self.b.weight
        if (
            isinstance(target, cst.Attribute)
            and isinstance(node.value, cst.Attribute)
            and target.attr.value == "weight"
            and node.value.attr.value == "weight"
        ):
            pair = (dotted(target.value), dotted(node.value.value))
            self.index.tied.append(pair)
            for head, table in (pair, pair[::-1]):
                if head.startswith("self.") and head.count(".") == 1:
                    info.tied_heads[head[5:]] = table
            return
        if m.matches(target, m.Subscript(value=m.Name("self"))) and self._fn_stack:
            info.self_items.append(self.layouts.of(node.value, self._scope()))  # self[k] = layer
        if m.matches(target, m.Subscript(value=m.Attribute(value=m.Name("self")))):
            # self.heads["a"] = layer
            info.added_layouts.setdefault(target.value.attr.value, []).append(
                self.layouts.of(node.value, self._scope()))
        if m.matches(target, m.Attribute(value=m.Name("self"))):
            attr = target.attr.value
            value = node.value
            layout = self.layouts.of(value, self._scope())
            if m.matches(value, m.Name("None")) or self_slice(value, attr):
                layout = "any"  # self.proj = None, self.head = self.head[:n]: no new layer
            conv = self.rules.layers.get(qualified(self.meta, value.func) or "") if isinstance(
                value, cst.Call) else None
            self._attr_assigns.setdefault((info.name, attr), []).append(
                branch_assign(layout, value, conv and conv.special))
            if attr in info.attr_layout:  # assigned in several branches
                layout = combine([info.attr_layout[attr], layout])
            info.attr_layout[attr] = layout
            if self._fn_stack and self._fn_stack[-1].name.value == "__init__" and (
                    attr not in info.init_attrs):
                info.init_attrs.append(attr)
            note_attr_call(self, info, attr, value)
            if isinstance(value, cst.Call):
                q = qualified(self.meta, value.func)
                rule = self.rules.layers.get(q or "")
                if rule is not None or q in self.known_modules or self._known_from_config(
                        value.func) or (isinstance(value.func, cst.Name)
                                        and value.func.value in self.imported_builders):
                    # (a builder of another converted module, taking rngs: timm's
                    # create_conv2d, in dpn's self.c1x1_c1 = create_conv2d(...) or None)
                    info.module_attrs.add(attr)
                    if rule is None or rule.special != "identity":
                        info.real_layer_attrs.add(attr)
                elif q in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") or (
                        q or "").startswith("torch.") and q.count(".") == 1:
                    info.tensor_attrs.add(attr)  # self.class_token = nn.Parameter(...)
                elif isinstance(value.func, cst.Name):
                    info.built_by.setdefault(attr, set()).add(value.func.value)
            elif isinstance(value, cst.Name) and self._fn_stack:
                # proj = BnActConv2d(...); self.c1x1_w_s2 = proj (timm's dpn): built by what
                # the local is assigned a call of in this function
                for a in _name_assigns(self.meta, self._fn_stack[-1]).get(value.value, ()):
                    if isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Name):
                        info.built_by.setdefault(attr, set()).add(a.value.func.value)
            if isinstance(value, cst.Call):
                q = qualified(self.meta, value.func)
                rule = self.rules.layers.get(q or "")
                if rule is not None:
                    info.attr_rule[attr] = rule.torch
                    info.attr_ctor[attr] = value
                    if any(a.keyword and a.keyword.value == "bias"
                           and m.matches(a.value, m.Name("False")) for a in value.args):
                        info.no_bias.add(attr)
                    if rule.special == "batch_norm" and any(
                            a.keyword and a.keyword.value == "track_running_stats"
                            and m.matches(a.value, m.Name("False")) for a in value.args):
                        info.batch_stats_only.add(attr)
                if rule is not None and rule.special == "module_dict" and value.args:
                    # nn.ModuleDict({...}) / dict(a=...) / [(name, layer), ...]
                    layers = self._container_values(value.args[0].value)
                    info.elem_layout[attr] = combine(
                        [self.layouts.of(v, self._scope()) if v is not None else "mixed"
                         for v in layers])
                if rule is not None and rule.special == "module_list" and value.args:
                    inner = value.args[0].value
                    info.elem_items[attr] = (
                        [self._positions(e.value) for e in inner.elements]
                        if isinstance(inner, (cst.List, cst.Tuple)) else
                        [self._positions(inner.elt)] if isinstance(inner, cst.ListComp)
                        else [None])
                    if isinstance(inner, (cst.List, cst.Tuple)):
                        info.elem_layout[attr] = literal_list_layout([e.value for e in inner.elements], (
                            self.layouts.of, self._scope()), self._is_conv, self.index.torch_convs)
                    elif isinstance(inner, cst.ListComp):
                        info.elem_layout[attr] = self.layouts.of(inner.elt, self._scope())
                    elif isinstance(inner, cst.Name):
                        info.elem_layout[attr] = self._scope().get(inner.value, "mixed")

    def _children_layouts(self) -> None:
        """``self.x = nn.Sequential(*list(backbone.children())[:-1])``: the layout of the
        children spread into it, now that every class of the file is known."""
        for info in self.index.classes.values():
            for attr, ctor in info.attr_ctor.items():
                if (info.attr_layout.get(attr) != "mixed" or id(ctor) not in self._spread_fns
                        or info.attr_rule.get(attr) != "torch.nn.Sequential"
                        or len(ctor.args) != 1):
                    continue
                layouts = self.children_layouts(self, info.name, ctor.args[0].value,
                                                self._root, self._spread_fns[id(ctor)])
                if layouts is not None and combine(layouts or ["any"]) != "mixed":
                    info.attr_layout[attr] = combine(layouts or ["any"])

    def finish(self) -> FileIndex:
        returned_list_layouts(self)
        # module classes: fixed point over bases
        idx = self.index
        changed = True
        while changed:
            changed = False
            for info in idx.classes.values():
                if info.name in idx.module_classes:
                    continue
                for b in info.bases:
                    short = b.rsplit(".", 1)[-1]
                    if b in MODULE_BASES or b in self.rules.layers:
                        info.module_base = "torch"
                    elif short in idx.module_classes and short in idx.classes or b in self.known_modules or short in self.known_modules:
                        info.module_base = short
                    else:
                        continue
                    idx.module_classes.add(info.name)
                    changed = True
                    break
        for info in idx.classes.values():
            for b in info.bases:
                special = self.rules.layers[b].special if b in self.rules.layers else None
                if special in ("sequential", "module_dict", "module_list"):
                    info.container = special
            info.layer_base = next((b for b in info.bases if b in self.rules.layers and (
                self.rules.layers[b].special not in _CONTAINERS)), None)
            if info.varargs_items:
                info.self_items.extend(info.site_items or ["mixed"])
            if info.container in ("module_dict", "module_list", "sequential"):
                info.self_elem_layout = combine(info.self_items) if info.self_items else None
            for attr, items in info.elem_items.items():
                if items and all(i is not None and len(i) == len(items[0]) for i in items):
                    info.elem_positions[attr] = [combine(list(p)) for p in zip(*items)]
            for attr, added in info.added_layouts.items():
                ctor = info.attr_ctor.get(attr)
                if info.attr_rule.get(attr) in ("torch.nn.ModuleList", "torch.nn.ModuleDict") \
                        and ctor is not None and (attr in info.elem_layout or not ctor.args):
                    # the layers appended (or set by key) after the container was built
                    base = [info.elem_layout[attr]] if attr in info.elem_layout else []
                    info.elem_layout[attr] = combine(base + added)
                # a Sequential built channels-last (conv0, norm0, pool0) and given torch-layout
                # layers later: it takes NCHW as a whole
                # an empty one (self.stages = nn.Sequential(), then append) given layers of
                # either layout: it takes NCHW, its channels-last layers between transposes
                if (info.attr_rule.get(attr) == "torch.nn.Sequential"
                        and info.attr_layout.get(attr) in ("channels_last", "any")
                        and ("torch" in added or ctor is not None and not ctor.args
                             and "channels_last" in added) and "mixed" not in added):
                    info.attr_layout[attr] = "torch"
                    info.normalized_seqs.add(attr)
        self._children_layouts()
        torch_layout_attrs(idx.classes, idx.torch_convs, self._attr_assigns)
        for info in idx.classes.values():  # through local bases: class Wide(LayerNorm2d)
            base, seen = info.module_base, set()
            while info.layer_base is None and base in idx.classes and base not in seen:
                seen.add(base)
                info.layer_base = idx.classes[base].layer_base
                base = idx.classes[base].module_base
            for attr, called in info.built_by.items():
                if called & (idx.module_classes | self.known_modules):
                    info.module_attrs.add(attr)
                    info.real_layer_attrs.add(attr)
        # attributes a base class uses but only its subclasses assign: the subclasses' layouts
        for info in idx.classes.values():
            for sub in idx.classes.values():
                if info.name in [b.rsplit(".", 1)[-1] for b in sub.bases]:
                    for k, v in sub.attr_layout.items():
                        info.attr_layout[k] = combine([info.attr_layout.get(k, "any"), v])
        # inherit attribute layouts from local base classes
        for info in idx.classes.values():
            base = info.module_base
            seen = set()
            while base and base in idx.classes and base not in seen:
                seen.add(base)
                parent = idx.classes[base]
                for k, v in parent.attr_layout.items():
                    info.attr_layout.setdefault(k, v)
                for k, v in parent.elem_layout.items():
                    info.elem_layout.setdefault(k, v)
                info.uses_training |= parent.uses_training
                base = parent.module_base
        # a tied pair is an LM head only when one side is a bias-free Linear attribute
        for info in idx.classes.values():
            info.tied_bias_heads = {
                head: table for head, table in info.tied_heads.items()
                if info.attr_rule.get(head) == "torch.nn.Linear" and head not in info.no_bias
                and table.count(".") == 1 and table.startswith("self.")
                and info.attr_rule.get(table[5:]) == "torch.nn.Embedding"}
            info.tied_heads = {
                head: table for head, table in info.tied_heads.items()
                if info.attr_rule.get(head) == "torch.nn.Linear" and head in info.no_bias
            }
        # functions that build layers, and their callers (fixed point). A helper called from
        # a constructor that calls one of its parameters builds layers too: ResNet's
        # self._make_layer(block, ...) calls block(...), a module class handed in
        for key, names in self._fn_method_calls.items():  # any class's method of that name
            self._fn_calls.setdefault(key, set()).update(
                k for k in self._methods if k.partition(".")[2] in names
                and k.partition(".")[0] in idx.module_classes)
        partials = {n for n, c in self._module_partials.items()
                    if c in idx.module_classes or c in self.known_modules}
        module_builders = self._callers_fixed_point(partials | set(self._fn_builds) | {
            fn for fn in self._fn_param_calls if any(
                k.endswith(".__init__") and fn in called for k, called in self._fn_calls.items())})
        # the functions that take rngs only to draw (torch.nn.init), and those that call
        # them or bind them in a partial (that draw when the partial is called)
        calls = {k: self._fn_calls.get(k, set()) | (
            self._fn_partials.get(k, set()) - idx.module_classes)
            for k in {*self._fn_calls, *self._fn_partials}}
        builders = self._callers_fixed_point(module_builders | self._fn_draws, calls)
        # an override takes rngs when the method it overrides (or one overriding it) does:
        # ShiftedWindowAttention.__init__ calls self.define_relative_position_bias_table(rngs=)
        # and runs ShiftedWindowAttentionV2's
        changed = True
        while changed:
            changed = False
            for info in idx.classes.values():
                base = idx.classes.get(info.module_base or "")
                if base is None:
                    continue
                for key in list(self._methods):
                    cls, _, meth = key.partition(".")
                    if cls != info.name or meth == "__init__" or f"{base.name}.{meth}" not in \
                            self._methods:
                        continue
                    pair = {key, f"{base.name}.{meth}"}
                    if pair & builders and not pair <= builders:
                        builders |= pair
                        changed = True
        idx.rngs_functions = builders | self.imported_builders
        idx.draw_functions = builders - module_builders - idx.module_classes
        idx.fn_returns = {k: combine(v) for k, v in self.fn_returns.items()}
        return idx
