"""Shapes of timm's model code that build layers through objects and methods that need the
model's ``rngs`` (benchmarks/timm_sweep.py, docs/timm-sweep.md, the eleventh run's "rngs
plumbing"), each on a model of our own written that way, converted, built and verified
against torch (outputs and gradients, in float64):

* a builder object (timm's ``EfficientNetBuilder``: a plain class, not a module, whose
  ``__call__`` and ``_make_block`` build the package's block classes), constructed in the
  model's ``__init__`` and called there (``builder(stem_size, block_args)``): its methods take
  ``rngs`` and the call of the instance passes them. In a package, the class in a module of
  its own that the model file imports only the builder from: that module is converted too
  (copied, it built the converted blocks without rngs: "ConvBnAct.__init__() missing 1
  required keyword-only argument: 'rngs'"), and the importer knows its ``__call__`` takes
  them; the builder's module takes the blocks by a star import (``from ._efficientnet_blocks
  import *``): the classes it uses are known module classes there too.
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

BLOCKS = textwrap.dedent('''
    import torch.nn as nn


    class ConvAct(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, padding=1)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.conv(x))


    class Residual(nn.Module):
        def __init__(self, chs):
            super().__init__()
            self.conv = nn.Conv2d(chs, chs, 1)

        def forward(self, x):
            return x + self.conv(x).tanh()
''')

BUILDER = textwrap.dedent('''
    from ._blocks import *


    class Builder:
        def __init__(self, width=6):
            self.width = width
            self.features = []

        def _make_block(self, kind, cin):
            if kind == "res" and cin == self.width:
                return Residual(cin)
            return ConvAct(cin, self.width)

        def __call__(self, cin, kinds):
            blocks = []
            for i, kind in enumerate(kinds):
                blocks.append(self._make_block(kind, cin))
                self.features.append(i)
                cin = self.width
            return blocks
''')

NET = textwrap.dedent('''
    import torch.nn as nn

    from ._builder import Builder


    class Net(nn.Module):
        def __init__(self, width=6, num_classes=4):
            super().__init__()
            builder = Builder(width=width)
            self.blocks = nn.ModuleList(builder(3, ["conv", "res", "res"]))
            self.head = nn.Linear(width, num_classes)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x.mean((2, 3)))
''')


def _verifies(path, entry: str, *inputs: str):
    result = run_request(VerifyRequest(f"{path}::{entry}", inputs=inputs, float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


def test_a_builder_object_of_another_module_of_the_package_builds_with_rngs(tmp_path):
    pkg = tmp_path / "tinypkg_builder"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    for name, text in {"_blocks": BLOCKS, "_builder": BUILDER, "net": NET}.items():
        (pkg / "models" / f"{name}.py").write_text(text)
    _verifies(pkg / "models" / "net.py", "Net", "float32[1,3,5,5]")


LAYER_FN = textwrap.dedent('''
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


    @dataclass
    class LayerFn:
        linear_norm_act: Type[nn.Module] = LinearNormAct
        act: Type[nn.Module] = nn.GELU
''')

LAYER_FN_NET = textwrap.dedent('''
    import torch.nn as nn

    from ._layer_fn import LayerFn


    class Block(nn.Module):
        def __init__(self, in_chs, out_chs, layers: LayerFn = None):
            super().__init__()
            layers = layers or LayerFn()
            self.proj = layers.linear_norm_act(in_chs, out_chs, bias=False)
            self.act = layers.act()

        def forward(self, x):
            return self.act(self.proj(x))


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3):
            super().__init__()
            self.block = Block(5, chs)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.block(x))
''')


def test_a_layer_class_field_of_a_class_of_another_module_builds_with_rngs(tmp_path):
    """timm's mobilevit: ``layers.conv_norm_act(...)``, ``layers`` a ``LayerFn`` (byobnet's:
    fields annotated ``Type[nn.Module]`` holding layer classes) imported from another module:
    the call builds the layer with rngs (it was built without: "ConvNormAct.__init__()
    missing 1 required keyword-only argument: 'rngs'"), and the module holding ``LayerFn`` is
    converted even where the importer takes nothing else from it."""
    pkg = tmp_path / "tinypkg_layer_fn"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    for name, text in {"_layer_fn": LAYER_FN, "net": LAYER_FN_NET}.items():
        (pkg / "models" / f"{name}.py").write_text(text)
    _verifies(pkg / "models" / "net.py", "Net", "float32[2,5]")


CHILD_INIT = textwrap.dedent('''
    import torch.nn as nn


    class Encoder(nn.Module):
        def __init__(self, dim=4, depth=2):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(dim, dim) for _ in range(depth)])
            self.apply(self._init_weights)

        def _init_weights(self, m):
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x).tanh()
            return x


    class Net(nn.Module):
        def __init__(self, dim=4, num_classes=3):
            super().__init__()
            self.encoder = Encoder(dim)
            self.head = nn.Linear(dim, num_classes)
            self.encoder._init_weights(self.head)

        def init_weights(self):
            self.encoder._init_weights(self.head)

        def forward(self, x):
            return self.head(self.encoder(x))
''')


def test_a_drawing_init_method_of_a_child_called_by_its_parent_gets_rngs(tmp_path):
    """timm's qwen3_vit: ``self.encoder._init_weights(self.head)`` in the model's
    ``__init__`` (and its ``init_weights``), the encoder's method drawing: it is given the
    rngs ("Qwen3VitEncoder._init_weights() missing 1 required keyword-only argument:
    'rngs'"), and the parent's method calling it takes them."""
    (tmp_path / "model.py").write_text(CHILD_INIT)
    _verifies(tmp_path / "model.py", "Net", "float32[2,4]")


MODEL_BUILDER = textwrap.dedent('''
    def build_model(model_cls, variant, **kwargs):
        model = model_cls(**kwargs)
        model.variant = variant
        return model
''')

KWARGS_NET = textwrap.dedent('''
    import torch.nn as nn

    from ._model_builder import build_model


    class Backbone(nn.Module):
        def __init__(self, cin=3, width=4):
            super().__init__()
            self.conv = nn.Conv2d(cin, width, 3, padding=1)

        def forward(self, x):
            return self.conv(x).relu()


    class Net(nn.Module):
        def __init__(self, backbone, width=4, num_classes=3):
            super().__init__()
            self.backbone = backbone
            self.head = nn.Linear(width, num_classes)

        def forward(self, x):
            return self.head(self.backbone(x).mean((2, 3)))


    def _create_net(variant, backbone, **kwargs):
        return build_model(Net, variant, backbone=backbone, **kwargs)


    def net_small(**kwargs):
        backbone = Backbone(width=4)
        model_args = dict(width=4)
        return _create_net("net_small", backbone, **dict(model_args, **kwargs))
''')


def test_kwargs_handed_on_by_a_function_that_builds_carry_the_rngs(tmp_path):
    """timm's vision_transformer_hybrid: the entry function builds a backbone (so it takes
    the rngs its caller gives in the kwargs) and hands its ``**kwargs`` on to
    ``_create_vision_transformer_hybrid``, whose kwargs reach the model class through the
    package's (copied) ``build_model_with_cfg``: the call passes the rngs on ("VisionTransformer
    .__init__() missing 1 required keyword-only argument: 'rngs'")."""
    pkg = tmp_path / "tinypkg_kwargs"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    for name, text in {"_model_builder": MODEL_BUILDER, "net": KWARGS_NET}.items():
        (pkg / "models" / f"{name}.py").write_text(text)
    _verifies(pkg / "models" / "net.py", "net_small", "float32[1,3,5,5]")
