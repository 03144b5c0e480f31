"""Shapes of timm's model code that construct modules (benchmarks/timm_sweep.py,
docs/timm-sweep.md, the eighth run's "constructing modules"), each on a model of our own
written that way, converted, built and verified against torch (outputs and gradients):

* a block class handed to a stage-building function of the file (timm's volo:
  ``outlooker_blocks(Outlooker, i, dim, ...)``, whose loop calls ``block_fn(dim, ...)``): the
  call builds a module and takes ``rngs`` (it failed with "Outlooker.__init__() missing 1
  required keyword-only argument: 'rngs'").
* an activation class with arguments used as a value (timm's tresnet: ``act_layer =
  nn.LeakyReLU``, handed to a block of timm.layers that builds it with ``act_layer(inplace=
  True)``): its function with torch's defaults, as ``nn.LeakyReLU()`` is (it was marked and
  left torch's class, "LeakyReLU.__init__() got an unexpected keyword argument 'rngs'"); an
  activation factory whose kind is known only at run time is the ``build_layer`` helper,
  which uses a function as it is and builds a class (or a partial of one), passing ``rngs``
  only where its constructor takes them.
* ``module.init_weights()`` in an init function walked over the model's modules (timm's
  mlp_mixer ``_init_weights``, given to ``named_apply``), the method drawing in one class
  (it takes ``rngs``) and not in another: the ``call_with_rngs`` helper passes ``rngs`` where
  the method takes them ("SpatialGatingUnit.init_weights() missing 1 required keyword-only
  argument: 'rngs'").
* a call of an imported lookup's result (timm's xception_aligned: ``get_norm_act_layer(
  norm_layer, act_layer=act_layer)(in_chs, inplace=True, **dd)``): ``build_layer``, the class
  built with ``rngs`` (an activation function used as it is); it was built without them
  ("BatchNormAct2d.__init__() missing 1 required keyword-only argument: 'rngs'").
* a layer-class parameter of a stem-building function whose layers go into a dict (timm's
  nfnet: ``stem["conv1"] = conv_layer(in_chs, c, kernel_size=3, stride=s, **dd)``, then
  ``nn.Sequential(stem)``): the function builds layers and takes ``rngs`` ("ScaledStdConv2d.
  __init__() missing 1 required keyword-only argument: 'rngs'").
* an init function of the file that draws, handed on bare (timm's vitamin: ``named_apply(
  _init_conv, self)`` in ``__init__``): ``partial(_init_conv, rngs=rngs)``, as the partial
  form binds them ("_init_conv() missing 1 required keyword-only argument: 'rngs'").
* a config's field annotated as a module class (timm's byobnet ``LayerFn``: ``conv_norm_act:
  Type[nn.Module] = ConvNormAct``, given ``partial(ConvNormAct, ...)``; ``act: Type[nn.Module]
  = nn.ReLU``), called as ``layers.conv_norm_act(in_chs, out_chs, 3)``: ``build_layer``
  ("ConvNormAct.__init__() missing 1 required keyword-only argument: 'rngs'").
* a function of a package's layers building the class its ``*_layer`` parameter is given
  (timm's ``create_aa(aa_layer, channels, stride)``, called by tresnet, not by a module of
  its own file): a builder, taking ``rngs`` and given them by its importers ("BlurPool2d.
  __init__() missing 1 required keyword-only argument: 'rngs'").
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch (forward and
    gradients, in float64) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    # the float64 pass only (it decides; the float32 pass would double the time)
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


STAGE_FUNCTIONS = textwrap.dedent('''
    import torch.nn as nn


    class Outlook(nn.Module):
        def __init__(self, dim, mlp_ratio=2.0):
            super().__init__()
            self.fc1 = nn.Linear(dim, int(dim * mlp_ratio))
            self.fc2 = nn.Linear(int(dim * mlp_ratio), dim)

        def forward(self, x):
            return x + self.fc2(self.fc1(x).tanh())


    class Mixer(nn.Module):
        def __init__(self, dim, heads, mlp_ratio=2.0):
            super().__init__()
            self.heads = heads
            self.fc = nn.Linear(dim, dim)

        def forward(self, x):
            return x + self.fc(x).sigmoid()


    def outlook_blocks(block_fn, index, dim, layers, mlp_ratio=2.0):
        blocks = []
        for _ in range(layers[index]):
            blocks.append(block_fn(dim, mlp_ratio=mlp_ratio))
        return nn.Sequential(*blocks)


    def mixer_blocks(block_fn, index, dim, layers, heads):
        return nn.Sequential(*[block_fn(dim, heads) for _ in range(layers[index])])


    class Net(nn.Module):
        def __init__(self, dim=6, layers=(2, 1), num_classes=3):
            super().__init__()
            stages = []
            for i in range(len(layers)):
                if i == 0:
                    stages.append(outlook_blocks(Outlook, i, dim, layers, mlp_ratio=1.5))
                else:
                    stages.append(mixer_blocks(block_fn=Mixer, index=i, dim=dim, layers=layers,
                                               heads=2))
            self.network = nn.ModuleList(stages)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            for stage in self.network:
                x = stage(x)
            return self.head(x)
''')


def test_a_block_class_handed_to_a_stage_function_takes_rngs(tmp_path):
    _verifies(tmp_path, STAGE_FUNCTIONS, "Net", "float32[2,6]")


ACT_LAYERS = textwrap.dedent('''
    import torch.nn as nn


    def get_act_layer(name):
        return name


    def create_act_layer(name, inplace=None, **kwargs):
        act_layer = get_act_layer(name)
        return act_layer(inplace=inplace, **kwargs)
''')

ACT_MODEL = textwrap.dedent('''
    from functools import partial

    import torch
    import torch.nn as nn

    from layers import create_act_layer


    class Scale(nn.Module):
        """A module built from a class handed in, with parameters (it takes rngs)."""

        def __init__(self, inplace=None):
            super().__init__()
            self.scale = nn.Parameter(torch.full((1,), 1.5))

        def forward(self, x):
            return x * self.scale


    class Block(nn.Module):
        def __init__(self, dim, act_layer=None):
            super().__init__()
            act_layer = act_layer or partial(nn.LeakyReLU, negative_slope=0.2)
            self.fc = nn.Linear(dim, dim)
            self.act = create_act_layer(act_layer, inplace=True)

        def forward(self, x):
            return self.act(self.fc(x))


    class Net(nn.Module):
        def __init__(self, dim=5, num_classes=3):
            super().__init__()
            act_layer = nn.LeakyReLU
            self.b1 = Block(dim, act_layer=act_layer)
            self.b2 = Block(dim, act_layer=nn.ELU)
            self.b3 = Block(dim)
            self.b4 = Block(dim, act_layer=Scale)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            return self.head(self.b4(self.b3(self.b2(self.b1(x)))))
''')


def test_an_activation_class_with_arguments_as_a_value_and_a_run_time_factory(tmp_path):
    (tmp_path / "layers.py").write_text(ACT_LAYERS)
    _verifies(tmp_path, ACT_MODEL, "Net", "float32[4,5]")


INIT_METHODS = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn


    def named_apply(fn, module, name="", include_root=False):
        for child_name, child in module.named_children():
            child_name = ".".join((name, child_name)) if name else child_name
            named_apply(fn=fn, module=child, name=child_name, include_root=True)
        if include_root:
            fn(module=module, name=name)
        return module


    class Gate(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.proj = nn.Linear(dim, dim)

        def init_weights(self):
            nn.init.normal_(self.proj.weight, std=1e-6)
            nn.init.ones_(self.proj.bias)

        def forward(self, x):
            return x * self.proj(x)


    class Plain(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.fc = nn.Linear(dim, dim)

        def init_weights(self):
            nn.init.zeros_(self.fc.bias)

        def forward(self, x):
            return self.fc(x)


    def _init_weights(module, name, head_bias=0.0):
        if isinstance(module, nn.Linear):
            if name.startswith("head"):
                nn.init.zeros_(module.weight)
                nn.init.constant_(module.bias, head_bias)
            else:
                nn.init.xavier_uniform_(module.weight)
        elif hasattr(module, "init_weights"):
            module.init_weights()


    class Net(nn.Module):
        def __init__(self, dim=6, num_classes=3):
            super().__init__()
            self.gate = Gate(dim)
            self.plain = Plain(dim)
            self.head = nn.Linear(dim, num_classes)
            self.init_weights()

        def init_weights(self):
            named_apply(partial(_init_weights, head_bias=0.5), module=self)

        def forward(self, x):
            return self.head(self.plain(self.gate(x)))
''')


def test_an_init_method_of_a_module_known_at_run_time_takes_rngs_where_it_draws(tmp_path):
    _verifies(tmp_path, INIT_METHODS, "Net", "float32[2,6]")


LOOKUP_LAYERS = textwrap.dedent('''
    import torch.nn as nn


    class BatchNormAct(nn.BatchNorm2d):
        def __init__(self, num_features, act_layer=nn.ReLU, inplace=True):
            super().__init__(num_features)
            self.act = act_layer(inplace=inplace)

        def forward(self, x):
            return self.act(super().forward(x))


    _ACTS = {"relu": nn.ReLU, "silu": nn.SiLU}


    def get_act_layer(name):
        return _ACTS[name] if isinstance(name, str) else name


    def get_norm_act_layer(norm_layer, act_layer=None):
        return BatchNormAct
''')

LOOKUP_MODEL = textwrap.dedent('''
    import torch.nn as nn

    from layers import get_act_layer, get_norm_act_layer


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3, act_layer="silu"):
            super().__init__()
            self.conv = nn.Conv2d(3, chs, 3, padding=1)
            self.norm = get_norm_act_layer(nn.BatchNorm2d, act_layer=act_layer)(chs, inplace=True)
            self.act = get_act_layer(act_layer)(inplace=False)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            x = self.act(self.norm(self.conv(x)))
            return self.head(x.mean((2, 3)))
''')


def test_a_call_of_an_imported_lookups_result_builds_with_rngs(tmp_path):
    (tmp_path / "layers.py").write_text(LOOKUP_LAYERS)
    _verifies(tmp_path, LOOKUP_MODEL, "Net", "float32[2,3,5,5]")


STEM_DICT = textwrap.dedent('''
    from collections import OrderedDict
    from functools import partial

    import torch.nn as nn


    class StdConv(nn.Module):
        def __init__(self, in_chs, out_chs, kernel_size, stride=1, padding=None, gain=1.0):
            super().__init__()
            padding = kernel_size // 2 if padding is None else padding
            self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride, padding=padding)
            self.gain = gain

        def forward(self, x):
            return self.conv(x) * self.gain


    def create_stem(in_chs, out_chs, conv_layer=None, act_layer=None):
        stem = OrderedDict()
        stem["conv1"] = conv_layer(in_chs, out_chs // 2, kernel_size=3, stride=1)
        stem["act1"] = act_layer(inplace=True)
        stem["conv2"] = conv_layer(out_chs // 2, out_chs, kernel_size=3, stride=2)
        return nn.Sequential(stem)


    class Net(nn.Module):
        def __init__(self, in_chans=3, chs=4, num_classes=3):
            super().__init__()
            conv_layer = partial(StdConv, gain=2.0)
            self.stem = create_stem(in_chans, chs, conv_layer=conv_layer, act_layer=nn.SiLU)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.stem(x).mean((2, 3)))
''')


def test_a_layer_class_parameter_building_into_a_dict_takes_rngs(tmp_path):
    _verifies(tmp_path, STEM_DICT, "Net", "float32[2,3,6,6]")


BARE_INIT = textwrap.dedent('''
    import math

    import torch.nn as nn


    def named_apply(fn, module, name="", include_root=False):
        for child_name, child in module.named_children():
            child_name = ".".join((name, child_name)) if name else child_name
            named_apply(fn=fn, module=child, name=child_name, include_root=True)
        if include_root:
            fn(module=module, name=name)
        return module


    def _init_conv(module, name, scheme=""):
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            nn.init.normal_(module.weight, 0, math.sqrt(2.0 / fan_out))
            if module.bias is not None:
                nn.init.zeros_(module.bias)


    class Stem(nn.Module):
        def __init__(self, in_chs, out_chs):
            super().__init__()
            self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride=2, padding=1)
            self.act = nn.GELU()
            self.conv2 = nn.Conv2d(out_chs, out_chs, 3, padding=1)
            named_apply(_init_conv, self)

        def forward(self, x):
            return self.conv2(self.act(self.conv1(x)))


    class Net(nn.Module):
        def __init__(self, in_chans=3, chs=4, num_classes=3):
            super().__init__()
            self.stem = Stem(in_chans, chs)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.stem(x).mean((2, 3)))
''')


def test_a_drawing_init_function_handed_on_bare_binds_rngs(tmp_path):
    _verifies(tmp_path, BARE_INIT, "Net", "float32[2,3,6,6]")


LAYER_FNS = textwrap.dedent('''
    from dataclasses import dataclass
    from functools import partial
    from typing import Optional, Type

    import torch.nn as nn


    class ConvNormAct(nn.Module):
        def __init__(self, in_chs, out_chs, kernel_size=1, act_layer=nn.ReLU, apply_act=True):
            super().__init__()
            self.conv = nn.Conv2d(in_chs, out_chs, kernel_size, padding=kernel_size // 2)
            self.bn = nn.BatchNorm2d(out_chs)
            self.act = act_layer() if apply_act else nn.Identity()

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))


    @dataclass
    class LayerFn:
        conv_norm_act: Type[nn.Module] = ConvNormAct
        act: Type[nn.Module] = nn.ReLU
        attn: Optional[Type[nn.Module]] = None


    def get_layer_fns(act_layer=nn.SiLU):
        conv_norm_act = partial(ConvNormAct, act_layer=act_layer)
        return LayerFn(conv_norm_act=conv_norm_act, act=act_layer)


    class Block(nn.Module):
        def __init__(self, in_chs, out_chs, layers: LayerFn = None):
            super().__init__()
            layers = layers or LayerFn()
            self.conv1 = layers.conv_norm_act(in_chs, out_chs, 3)
            self.conv2 = layers.conv_norm_act(out_chs, out_chs, 1, apply_act=False)
            self.act = layers.act()

        def forward(self, x):
            return self.act(self.conv2(self.conv1(x)) + x)


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3):
            super().__init__()
            layers = get_layer_fns()
            self.stem = layers.conv_norm_act(3, chs, 3)
            self.block = Block(chs, chs, layers=layers)
            self.block2 = Block(chs, chs)
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.block2(self.block(self.stem(x))).mean((2, 3)))
''')


def test_a_config_field_holding_a_module_class_builds_with_rngs(tmp_path):
    _verifies(tmp_path, LAYER_FNS, "Net", "float32[2,3,6,6]")


AA_LAYERS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Blur(nn.Module):
        def __init__(self, channels, stride=2):
            super().__init__()
            self.pool = nn.AvgPool2d(stride, stride)
            self.scale = nn.Parameter(torch.ones(channels, 1, 1))

        def forward(self, x):
            return self.pool(x) * self.scale


    def create_aa(aa_layer, channels=None, stride=2, enable=True):
        if not aa_layer or not enable:
            return None
        return aa_layer(channels=channels, stride=stride)
''')

AA_MODEL = textwrap.dedent('''
    import torch.nn as nn

    from ..layers.blur import Blur, create_aa


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3, aa_layer=Blur):
            super().__init__()
            self.conv = nn.Conv2d(3, chs, 3, padding=1)
            self.aa = create_aa(aa_layer, channels=chs, stride=2)
            self.skip = create_aa(None, channels=chs) or nn.Identity()
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            return self.head(self.skip(self.aa(self.conv(x))).mean((2, 3)))
''')


def test_a_package_function_building_its_layer_parameter_takes_rngs(tmp_path):
    pkg = _package(tmp_path / "tinypkg_aa", AA_MODEL, {"blur": AA_LAYERS})
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::Net",
                                       inputs=("float32[2,3,6,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
