"""Shapes of timm's model code that pass ``rngs`` to the modules they build, or do not
(benchmarks/timm_sweep.py, docs/timm-sweep.md, the ninth run's "rngs plumbing"), each on a
model of our own written that way, converted, built and verified against torch (outputs and
gradients, in float64):

* an activation class parameter with a default (timm.layers' ``Mlp``: ``act_layer=nn.GELU``,
  ``self.act = act_layer()``) in a package's module, given a module class by another module
  (timm's convnext: ``get_act_layer("gelu_tanh")``, timm's ``GELUTanh(nn.Module)``): the
  file's callers are not all seen, so the call is the ``build_layer`` helper (a function used
  as it is, a class built); it was the parameter itself, and the class was built on the
  activations in the forward ("GELUTanh.__init__() missing 1 required keyword-only argument:
  'rngs'", at ``x = self.act(x)``).
* a table of block classes written ``dict(name=Class, ...)`` (timm's byobnet:
  ``_block_registry = dict(basic=BasicBlock, ..., edge=EdgeBlock)``, called as
  ``_block_registry[block](**kwargs)`` in ``create_block``): its items are built with ``rngs``,
  and a function calling an item takes them, as the ``{...}`` form did ("EdgeBlock.__init__()
  missing 1 required keyword-only argument: 'rngs'").
* an init method of the model handed on bound (timm's maxxvit: ``named_apply(partial(
  self._init_weights, scheme=scheme), self)``), which calls ``module.init_weights(scheme=
  scheme)`` on each module, the method drawing in some classes: the method takes ``rngs``
  (it calls a method that draws), the partial binds them, and the call passes them where the
  module's method takes them (``call_with_rngs``); it was called without them, the ``except
  TypeError`` fallback too ("Stem.init_weights() missing 1 required keyword-only argument:
  'rngs'").
* a local given one of two layer factories (timm's byobnet ``Stem``, halonet's stem in
  byoanet: ``layer_fn = layers.conv_norm_act if na else create_conv2d``, a config field
  holding a module class or a function of the file that builds a layer), then called: the
  ``build_layer`` helper, which gives the rngs to a class or a function whose signature takes
  them (a JAX activation function is used as it is); it was called without them
  ("ConvNormAct.__init__() missing 1 required keyword-only argument: 'rngs'").
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch in float64:
    the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs,
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


def _package(pkg, model: str, layers: dict[str, str]):
    """A package of timm's layout at ``pkg``: ``layers/<name>.py`` for each of ``layers``
    and ``models/net.py`` holding ``model``."""
    for sub in (pkg, pkg / "layers", pkg / "models"):
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "__init__.py").write_text("")
    for name, text in layers.items():
        (pkg / "layers" / f"{name}.py").write_text(text)
    (pkg / "models" / "net.py").write_text(model)
    return pkg


def _verifies_package(pkg, entry: str, *inputs: str):
    """``entry`` of the package's ``models/net.py`` verified against torch in float64 (the
    float32 pass would double the time): the result, which passed."""
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::{entry}", inputs=inputs,
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


ACTIVATIONS = textwrap.dedent('''
    import torch.nn as nn
    import torch.nn.functional as F


    class GELUTanh(nn.Module):
        def __init__(self, inplace: bool = False):
            super().__init__()

        def forward(self, input):
            return F.gelu(input, approximate="tanh")


    _ACT_LAYERS = dict(gelu=nn.GELU, relu=nn.ReLU, gelu_tanh=GELUTanh)


    def get_act_layer(name="relu"):
        if not isinstance(name, str):
            return name
        return _ACT_LAYERS[name]
''')

MLP = textwrap.dedent('''
    import torch.nn as nn


    class Mlp(nn.Module):
        def __init__(self, in_features, hidden_features=None, act_layer=nn.GELU):
            super().__init__()
            hidden_features = hidden_features or in_features
            self.fc1 = nn.Linear(in_features, hidden_features)
            self.act = act_layer()
            self.fc2 = nn.Linear(hidden_features, in_features)

        def forward(self, x):
            x = self.fc1(x)
            x = self.act(x)
            return self.fc2(x)
''')

ACT_MODEL = textwrap.dedent('''
    import torch.nn as nn

    from ..layers.activations import get_act_layer
    from ..layers.mlp import Mlp


    class Block(nn.Module):
        def __init__(self, dim, act_layer=nn.GELU):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, 2 * dim, act_layer=act_layer)

        def forward(self, x):
            return x + self.mlp(self.norm(x))


    class Net(nn.Module):
        def __init__(self, dim=6, num_classes=3, act_layer="gelu_tanh"):
            super().__init__()
            act_layer = get_act_layer(act_layer)
            self.block = Block(dim, act_layer=act_layer)
            self.plain = Mlp(dim)
            self.relu = Mlp(dim, act_layer=get_act_layer("relu"))
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            return self.head(self.relu(self.plain(self.block(x))))
''')


def test_an_activation_parameter_with_a_default_given_a_module_class_elsewhere(tmp_path):
    pkg = _package(tmp_path / "tinypkg_act", ACT_MODEL, {"activations": ACTIVATIONS,
                                                          "mlp": MLP})
    _verifies_package(pkg, "Net", "float32[2,6]")


BLOCK_REGISTRY = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn


    class Basic(nn.Module):
        def __init__(self, in_chs, out_chs, scale=1.0):
            super().__init__()
            self.fc = nn.Linear(in_chs, out_chs)
            self.scale = scale

        def forward(self, x):
            return self.fc(x).tanh() * self.scale


    class Edge(nn.Module):
        def __init__(self, in_chs, out_chs, scale=1.0):
            super().__init__()
            self.fc1 = nn.Linear(in_chs, out_chs)
            self.fc2 = nn.Linear(out_chs, out_chs)

        def forward(self, x):
            return self.fc2(self.fc1(x).sigmoid())


    _block_registry = dict(
        basic=Basic,
        edge=Edge,
    )


    def register_block(block_type, block_fn):
        _block_registry[block_type] = block_fn


    def create_block(block, **kwargs):
        if not isinstance(block, str):
            return block(**kwargs)
        return _block_registry[block](**kwargs)


    def registered(name, **kwargs):
        return _block_registry[name](**kwargs)


    class Net(nn.Module):
        def __init__(self, dim=4, types=("basic", "edge"), num_classes=3):
            super().__init__()
            blocks = []
            for t in types:
                block_kwargs = dict(in_chs=dim, out_chs=dim)
                blocks += [create_block(t, **block_kwargs)]
            blocks += [create_block(partial(Basic, scale=0.5), in_chs=dim, out_chs=dim)]
            blocks += [registered("edge", in_chs=dim, out_chs=dim)]
            self.blocks = nn.Sequential(*blocks)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            return self.head(self.blocks(x))
''')


def test_a_dict_call_table_of_block_classes_builds_with_rngs(tmp_path):
    _verifies(tmp_path, BLOCK_REGISTRY, "Net", "float32[2,4]")


INIT_METHOD = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn


    def named_apply(fn, module, name="", depth_first=True, include_root=False):
        if not depth_first and include_root:
            fn(module=module, name=name)
        for child_name, child_module in module.named_children():
            child_name = ".".join((name, child_name)) if name else child_name
            named_apply(fn=fn, module=child_module, name=child_name, depth_first=depth_first,
                        include_root=True)
        if depth_first and include_root:
            fn(module=module, name=name)
        return module


    class Stem(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.fc = nn.Linear(dim, dim)

        def init_weights(self, scheme=""):
            nn.init.trunc_normal_(self.fc.weight, std=0.02)
            nn.init.zeros_(self.fc.bias)

        def forward(self, x):
            return self.fc(x).tanh()


    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.fc = nn.Linear(dim, dim)

        def init_weights(self):
            nn.init.zeros_(self.fc.bias)

        def forward(self, x):
            return x + self.fc(x).sigmoid()


    class Net(nn.Module):
        def __init__(self, dim=4, num_classes=3, weight_init="normal"):
            super().__init__()
            self.stem = Stem(dim)
            self.block = Block(dim)
            self.head = nn.Linear(dim, num_classes)
            if weight_init:
                named_apply(partial(self._init_weights, scheme=weight_init), self)

        def _init_weights(self, module, name, scheme=""):
            if hasattr(module, "init_weights"):
                try:
                    module.init_weights(scheme=scheme)
                except TypeError:
                    module.init_weights()

        def forward(self, x):
            return self.head(self.block(self.stem(x)))
''')


def test_an_init_method_handed_on_bound_calls_drawing_methods_with_rngs(tmp_path):
    _verifies(tmp_path, INIT_METHOD, "Net", "float32[2,4]")


LAYER_FN_LOCAL = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import Type

    import torch.nn as nn


    class LinearNormAct(nn.Module):
        def __init__(self, in_chs, out_chs, bias=True):
            super().__init__()
            self.fc = nn.Linear(in_chs, out_chs, bias=bias)
            self.norm = nn.LayerNorm(out_chs)

        def forward(self, x):
            return self.norm(self.fc(x)).relu()


    def create_linear(in_chs, out_chs, bias=True):
        return nn.Linear(in_chs, out_chs, bias=bias)


    @dataclass
    class LayerFn:
        linear_norm_act: Type[nn.Module] = LinearNormAct
        act: Type[nn.Module] = nn.ReLU


    class Stem(nn.Module):
        def __init__(self, in_chs, out_chs, num_rep=2, num_act=1, layers: LayerFn = None):
            super().__init__()
            layers = layers or LayerFn()
            prev_chs = in_chs
            fcs = []
            for na in [False] * (num_rep - num_act) + [True] * num_act:
                layer_fn = layers.linear_norm_act if na else create_linear
                fcs.append(layer_fn(prev_chs, out_chs, bias=False))
                prev_chs = out_chs
            self.fcs = nn.ModuleList(fcs)

        def forward(self, x):
            for fc in self.fcs:
                x = fc(x)
            return x


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3):
            super().__init__()
            self.stem = Stem(5, chs)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.stem(x))
''')


def test_a_local_given_one_of_two_layer_factories_builds_with_rngs(tmp_path):
    _verifies(tmp_path, LAYER_FN_LOCAL, "Net", "float32[2,5]")
