"""Shapes of timm's model code that failed the sweep while building the JAX model
(benchmarks/timm_sweep.py, docs/timm-sweep.md, the thirteenth run's timmB part), each on a
model of our own written that way, converted, built and compared with torch:

* ``m.reset_parameters()`` of a torch norm layer in an ``isinstance`` branch of an init
  function applied over the model (timm's efficientvim ``_init_weights``: ``elif
  isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm1d)): m.reset_parameters()``):
  the ``reset_norm_parameters`` helper (scale ones, bias zeros, running mean zeros and
  variance ones); flax's norms have no such method ("'LayerNorm' object has no attribute
  'reset_parameters'").
* a layer's weight scaled in place by a number through a loop over the blocks (timm's beit
  ``fix_init_weight``: ``for layer_id, layer in enumerate(self.blocks):
  layer.attn.proj.weight.div_(scale)``) and through a local function given the weight's
  ``.data`` (timm's hieradet_sam2: ``def rescale(param, layer_id): param.div_(...)``,
  ``rescale(layer.attn.proj.weight.data, layer_id + 1)``): the parameter the ``layer_weight``
  helper finds (kernel, scale) scaled in place, and the function given it, scaling what it
  is given in place ("'Linear' object has no attribute 'weight'"; the function rebound a
  local, which changed nothing).
* an init function of the file, defined below the class, handed to a ``named_apply`` of
  another module in a ``partial`` (timm's byobnet ``named_apply(partial(_init_weights,
  zero_init_last=...), self)``, built from by byoanet), that calls a module's method which
  draws in a class of another module (``module.init_weights(...)``, a block whose
  ``init_weights`` calls timm.layers' ``HaloAttn.reset_parameters``): the function draws, so
  the partial binds the rngs ("_init_weights() missing 1 required keyword-only argument:
  'rngs'" where ``named_apply`` called it: it was taken for a builder of modules, which a
  caller gives rngs itself).
* an ``nn.Sequential()`` attribute filled with ``add_module`` under literal names, one
  chosen in a branch, then a layer reached by its name (timm's attention2d in mobilenetv5:
  ``self.query.add_module('proj', create_conv2d(...))``, then
  ``nn.init.xavier_uniform_(self.query.proj.weight)``): the layer is an attribute of the
  Sequential too, which holds the same module ("'Sequential' object has no attribute
  'proj'"); under a computed name (timm's densenet: ``self.features.add_module(
  f'denseblock{i + 1}', block)`` into a Sequential of an OrderedDict, then
  ``[n for n, _ in self.features.named_children()].index('denseblock1')``): an attribute by
  that name too (``setattr``), which ``torch_named_children`` names the layer by ("'denseblock1'
  is not in list").
"""

from __future__ import annotations

import textwrap

import numpy as np
import torch

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

NORM_RESET = textwrap.dedent('''
    from functools import partial

    import torch
    import torch.nn as nn


    class Scale(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.alpha = nn.Parameter(torch.full((dim,), 4.0))

        def reset_parameters(self):
            nn.init.constant_(self.alpha, 0.5)

        def forward(self, x):
            return x * self.alpha


    class Net(nn.Module):
        def __init__(self, chs=4, needs_reset=True):
            super().__init__()
            self.bn = nn.BatchNorm2d(chs)
            self.norm = nn.LayerNorm(chs)
            self.bn1 = nn.BatchNorm1d(chs)
            self.gn = nn.GroupNorm(2, chs)
            self.scale = Scale(chs)
            with torch.no_grad():
                self.bn.weight.fill_(2.0)
                self.norm.weight.fill_(2.0)
                self.bn1.bias.fill_(0.25)
                self.gn.weight.fill_(2.0)
            self.apply(partial(self._init_weights, needs_reset=needs_reset))

        def _init_weights(self, m, needs_reset=True):
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm1d)):
                m.reset_parameters()
            elif needs_reset and hasattr(m, 'reset_parameters'):
                m.reset_parameters()

        def forward(self, x):
            x = self.gn(self.bn(x)).sum((2, 3))
            return self.scale(self.bn1(self.norm(x)))
''')


def _built(source: str):
    result = convert_source(source, path="model.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    return result, ns_t, ns_j


def test_norm_reset_parameters_in_an_applied_init():
    """The norms hold no drawn weight: the built models are compared as built, in eval mode,
    no weight transfer (a reset left undone keeps the fills, 2.0 and 0.25, and the running
    statistics); the GroupNorm is not in the isinstance tuple and keeps its fills, the module
    of our own is reset by its own method."""
    import jax.numpy as jnp
    from flax import nnx

    result, ns_t, ns_j = _built(NORM_RESET)
    assert "reset_norm_parameters(m)" in result.code
    x = np.random.default_rng(0).standard_normal((2, 4, 3, 5)).astype(np.float32)
    for needs_reset in (True, False):
        torch_net = ns_t["Net"](needs_reset=needs_reset).eval()
        with torch.no_grad():
            want = torch_net(torch.from_numpy(x)).numpy()
        net = ns_j["Net"](needs_reset=needs_reset, rngs=nnx.Rngs(0))
        net.eval()
        np.testing.assert_allclose(np.asarray(net(jnp.asarray(x))), want, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(np.asarray(net.gn.scale[...]), 2.0)
        np.testing.assert_array_equal(np.asarray(net.scale.alpha[...]),
                                      0.5 if needs_reset else 4.0)
    # the running statistics, set on both sides, reset by the init function called again
    with torch.no_grad():
        torch_net.bn.running_mean.fill_(0.5)
        torch_net.bn1.running_var.fill_(3.0)
    net.bn.mean[...] = jnp.full_like(net.bn.mean[...], 0.5)
    net.bn1.var[...] = jnp.full_like(net.bn1.var[...], 3.0)
    for torch_norm, norm in ((torch_net.bn, net.bn), (torch_net.bn1, net.bn1)):
        torch_net._init_weights(torch_norm)
        net._init_weights(norm, rngs=nnx.Rngs(1))
        np.testing.assert_array_equal(np.asarray(norm.mean[...]),
                                      torch_norm.running_mean.numpy())
        np.testing.assert_array_equal(np.asarray(norm.var[...]),
                                      torch_norm.running_var.numpy())


RESCALED_BLOCKS = textwrap.dedent('''
    import math

    import torch
    import torch.nn as nn


    class Attn(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.qkv = nn.Linear(dim, dim)
            self.proj = nn.Linear(dim, dim)
            nn.init.constant_(self.qkv.weight, 0.25)
            nn.init.constant_(self.qkv.bias, 0.5)
            nn.init.constant_(self.proj.weight, -0.75)
            nn.init.constant_(self.proj.bias, 0.125)

        def forward(self, x):
            return self.proj(torch.tanh(self.qkv(x)))


    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.attn = Attn(dim)
            self.fc = nn.Linear(dim, dim)
            nn.init.constant_(self.fc.weight, 0.5)
            nn.init.constant_(self.fc.bias, -0.25)

        def forward(self, x):
            x = x + self.attn(self.norm(x))
            return x + self.fc(x)


    class Net(nn.Module):
        def __init__(self, dim=4, depth=3):
            super().__init__()
            self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
            self.fix_init_weight()
            self.rescale_more()

        def fix_init_weight(self):
            with torch.no_grad():
                for layer_id, layer in enumerate(self.blocks):
                    scale = math.sqrt(2.0 * (layer_id + 1))
                    layer.attn.proj.weight.div_(scale)
                    layer.norm.weight.mul_(layer_id + 2)

        def rescale_more(self):
            def rescale(param, _layer_id):
                param.div_(math.sqrt(3.0 * _layer_id))

            for layer_id, layer in enumerate(self.blocks):
                rescale(layer.attn.qkv.weight.data, layer_id + 1)
                rescale(layer.fc.bias.data, layer_id + 1)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return x
''')


def test_weights_scaled_in_place_over_the_blocks():
    """Every weight is a constant of the source, so the built models are compared as built,
    no weight transfer: a scale left undone (or done on a copy) changes the output."""
    import jax.numpy as jnp
    from flax import nnx

    result, ns_t, ns_j = _built(RESCALED_BLOCKS)
    assert "rescale(layer_weight(layer.attn.qkv), layer_id + 1)" in result.code
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        want = ns_t["Net"]()(torch.from_numpy(x)).numpy()
    net = ns_j["Net"](rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(net(jnp.asarray(x))), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(net.blocks[2].norm.scale[...]), 4.0)


NAMED_APPLY = textwrap.dedent('''
    import torch.nn as nn


    def named_apply(fn, module: nn.Module, name='', depth_first=True, include_root=False):
        if not depth_first and include_root:
            fn(module=module, name=name)
        for child_name, child_module in module.named_children():
            child_name = '.'.join((name, child_name)) if name else child_name
            named_apply(fn=fn, module=child_module, name=child_name, depth_first=depth_first,
                        include_root=True)
        if depth_first and include_root:
            fn(module=module, name=name)
        return module
''')

HALO_LIKE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.nn.init import trunc_normal_


    class HaloLike(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.q = nn.Linear(dim, dim, bias=False)
            self.rel = nn.Parameter(torch.empty(dim))
            self.reset_parameters()

        def reset_parameters(self):
            trunc_normal_(self.q.weight, std=0.1)
            trunc_normal_(self.rel, std=0.1)

        def forward(self, x):
            return self.q(x) + self.rel
''')

NAMED_APPLY_MODEL = textwrap.dedent('''
    import math
    from functools import partial

    import torch.nn as nn

    from ..layers.attn import HaloLike
    from ..layers.manip import named_apply


    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.attn = HaloLike(dim)

        def init_weights(self, zero_init_last=False):
            if zero_init_last:
                nn.init.zeros_(self.fc.bias)
            self.attn.reset_parameters()

        def forward(self, x):
            return self.attn(self.fc(x))


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3, zero_init_last=True):
            super().__init__()
            self.conv = nn.Conv2d(3, chs, 3, padding=1)
            self.block = Block(chs)
            self.head = nn.Linear(chs, num_classes)
            named_apply(partial(_init_weights, zero_init_last=zero_init_last), self)

        def forward(self, x):
            return self.head(self.block(self.conv(x).mean((2, 3))))


    def _init_weights(module, name='', zero_init_last=False):
        if isinstance(module, nn.Conv2d):
            fan_out = module.kernel_size[0] * module.kernel_size[1] * module.out_channels
            module.weight.data.normal_(0, math.sqrt(2.0 / fan_out))
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.01)
        elif hasattr(module, 'init_weights'):
            module.init_weights(zero_init_last=zero_init_last)
''')


def test_named_apply_of_a_partial_calling_another_modules_drawing_method(tmp_path):
    pkg = tmp_path / "napkg"
    for sub in (pkg, pkg / "layers", pkg / "models"):
        sub.mkdir(parents=True)
        (sub / "__init__.py").write_text("")
    (pkg / "layers" / "manip.py").write_text(NAMED_APPLY)
    (pkg / "layers" / "attn.py").write_text(HALO_LIKE)
    (pkg / "models" / "net.py").write_text(NAMED_APPLY_MODEL)
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::Net",
                                       inputs=("float32[2,3,8,8]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason


ADDED_BY_NAME = textwrap.dedent('''
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self, dim=4, pool=True):
            super().__init__()
            self.query = nn.Sequential()
            if pool:
                self.query.add_module('down_pool', nn.AvgPool2d(kernel_size=2))
            self.query.add_module('norm', nn.BatchNorm2d(dim))
            self.query.add_module('proj', nn.Conv2d(dim, dim, 1, bias=False))
            self.head = nn.Linear(dim, 3)
            nn.init.ones_(self.query.proj.weight)
            nn.init.zeros_(self.query.norm.bias)

        def forward(self, x):
            return self.head(self.query(x).mean((2, 3)))
''')


def test_layers_added_to_a_sequential_by_name_read_by_name(tmp_path):
    (tmp_path / "added.py").write_text(ADDED_BY_NAME)
    result = run_request(VerifyRequest(f"{tmp_path / 'added.py'}::Net",
                                       inputs=("float32[2,4,6,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason


NAMED_AFTER_ADD = textwrap.dedent('''
    from collections import OrderedDict

    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, chs):
            super().__init__()
            self.conv = nn.Conv2d(chs, chs, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x)) + x


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3):
            super().__init__()
            self.features = nn.Sequential(OrderedDict([
                ('conv0', nn.Conv2d(3, chs, 3, padding=1)),
                ('norm0', nn.BatchNorm2d(chs)),
            ]))
            for i in range(2):
                module_name = f'block{i + 1}'
                self.features.add_module(module_name, Block(chs))
            self.features.add_module('norm5', nn.BatchNorm2d(chs))
            feat_names = [n for n, _ in self.features.named_children()]
            self.ends = [feat_names.index(n) for n in ('block1', 'block2', 'norm5')]
            self.head = nn.Linear(chs, num_classes)

        def forward(self, x):
            x = self.features(x).mean((2, 3))
            return self.head(x) * float(sum(self.ends))
''')


def test_named_children_of_a_sequential_grown_by_add_module(tmp_path):
    (tmp_path / "named.py").write_text(NAMED_AFTER_ADD)
    result = run_request(VerifyRequest(f"{tmp_path / 'named.py'}::Net",
                                       inputs=("float32[2,3,6,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
