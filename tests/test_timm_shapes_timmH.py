"""Shapes of timm's model code that read a layer by torch's attribute names where the converter
cannot tell the layer's type (benchmarks/timm_sweep.py, docs/timm-sweep.md, the tenth run's
"layer attributes"), each on a model of our own written that way, converted, built and
verified against torch (outputs and gradients, in float64):

* a layer built from a class parameter whose default is a torch layer (timm's swin:
  ``norm_layer=nn.LayerNorm``, ``self.norm1 = norm_layer(dim)``, then ``dtype =
  self.norm1.weight.dtype``; a ``conv_layer=nn.Conv2d`` whose weight a forward reads): the
  helper classes with torch's signature (``LayerNorm``, ``BatchNorm2d``, ``Conv2d``,
  ``Linear``) name their weight as torch does, the norms' the scale itself, the conv's and the
  linear's the kernel in torch's layout (read-only); it was "'LayerNorm' object has no
  attribute 'weight'".
* an initialiser filling the weight of a layer built in another module (timm's cspnet and
  regnet: ``nn.init.zeros_(self.conv3.bn.weight)``, ``conv3`` a ``ConvNormAct`` of
  timm.layers whose ``bn`` is a ``BatchNormAct2d(nn.BatchNorm2d)``): the fill sets every
  element alike, so the layout does not matter, and the ``layer_weight`` helper finds the
  parameter (kernel, scale or embedding) at run time; it was marked ("the layer type is not
  known here") and failed at build ("'BatchNormAct2d' object has no attribute 'weight'").
* a closure of a constructor whose name reads as a layer factory (timm's
  swin_transformer_v2_cr: ``def _extra_norm(index)`` in the stage's ``__init__``, a flag,
  ``extra_norm=_extra_norm(index)``): called as it is, with ``rngs`` only where its def takes
  them (a closure building layers); it was given them ("_extra_norm() got an unexpected
  keyword argument 'rngs'").
* a partial of nn.LayerNorm called with torch's keywords (timm's edgenext: ``norm_layer=
  partial(nn.LayerNorm, eps=1e-6)``, ``norm_layer(dim, eps=1e-6, **dd)``): a partial of the
  ``LayerNorm`` helper with torch's keywords as given, as a bare ``nn.LayerNorm`` value is;
  it was ``partial(nnx.LayerNorm, epsilon=1e-6)`` ("LayerNorm.__init__() got an unexpected
  keyword argument 'eps'").
* an init function of another module chosen into a local, re-bound in a partial and handed on
  (timm's hieradet_sam2: ``init_fn = init_weight_jax if weight_init == 'jax' else
  init_weight_vit``, ``init_fn = partial(init_fn, classifier_name='head.fc')``,
  ``named_apply(init_fn, self)``): the partial binds the ``rngs`` the functions draw with; it
  did not ("init_weight_vit() missing 1 required keyword-only argument: 'rngs'").
* a function of the file returning an item of a list of layer classes, its result built at
  once (timm's hiera: ``def conv_nd(n): return [nn.Identity, nn.Conv1d, nn.Conv2d,
  nn.Conv3d][n]``, ``conv_nd(self.spatial_dims)(dim_in, dim_out, kernel_size=...)``): the
  ``build_layer`` helper, as an imported lookup's result is; it was called without ``rngs``
  ("Conv2d.__init__() missing 1 required keyword-only argument: 'rngs'").
"""

from __future__ import annotations

import textwrap

import numpy as np

from torch2jax.verify.run import VerifyRequest, run_request


def _verified(path, entry: str, *inputs: str):
    result = run_request(VerifyRequest(f"{path}::{entry}", inputs=inputs, float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


TORCH_NAMES = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Block(nn.Module):
        def __init__(self, dim=4, conv_layer=nn.Conv2d, norm_layer=nn.LayerNorm,
                     linear_layer=nn.Linear, bn_layer=nn.BatchNorm2d):
            super().__init__()
            self.proj = conv_layer(dim, dim, 3, padding=1)
            self.bn = bn_layer(dim)
            self.norm1 = norm_layer(dim)
            self.fc = linear_layer(dim, 3)
            self.gain = nn.Parameter(torch.linspace(0.5, 1.5, dim).reshape(dim, 1, 1, 1))
            dtype = self.norm1.weight.dtype
            self.register_buffer("mask", torch.ones(dim, dtype=dtype) * 0.5, persistent=False)

        def forward(self, x):
            x = F.conv2d(x, self.proj.weight * self.gain, self.proj.bias, padding=1)
            x = self.bn(x) * self.bn.weight[:, None, None]
            x = x.permute(0, 2, 3, 1)
            x = self.norm1(x) * self.mask + self.norm1.weight
            return F.linear(x, self.fc.weight * 2, self.fc.bias)
''')


def test_layers_built_from_class_parameters_read_by_torchs_names(tmp_path):
    (tmp_path / "model.py").write_text(TORCH_NAMES)
    _verified(tmp_path / "model.py", "Block", "float32[2,4,5,5]")


NORM_ACT = textwrap.dedent('''
    import torch.nn as nn
    import torch.nn.functional as F


    class BatchNormAct2d(nn.BatchNorm2d):
        def __init__(self, num_features, eps=1e-5, apply_act=True):
            super().__init__(num_features, eps=eps)
            self.act = nn.ReLU() if apply_act else nn.Identity()

        def forward(self, x):
            x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                             self.training, self.momentum, self.eps)
            return self.act(x)


    class ConvNormAct(nn.Module):
        def __init__(self, cin, cout, kernel_size=1, apply_act=True):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2, bias=False)
            self.bn = BatchNormAct2d(cout, apply_act=apply_act)

        def forward(self, x):
            return self.bn(self.conv(x))
''')

INIT_MODEL = textwrap.dedent('''
    import torch.nn as nn

    from ..layers import ConvNormAct


    class Bottleneck(nn.Module):
        def __init__(self, chs):
            super().__init__()
            self.conv1 = ConvNormAct(chs, chs, kernel_size=3)
            self.conv3 = ConvNormAct(chs, chs, apply_act=False)
            self.zero_init_last()

        def zero_init_last(self):
            nn.init.constant_(self.conv3.bn.weight, 0.5)
            nn.init.trunc_normal_(self.conv1.conv.weight, std=.02)

        def forward(self, x):
            return x + self.conv3(self.conv1(x))


    class Net(nn.Module):
        def __init__(self, chs=4):
            super().__init__()
            self.stem = ConvNormAct(3, chs, kernel_size=3)
            self.block = Bottleneck(chs)

        def forward(self, x):
            return self.block(self.stem(x)).mean((2, 3))
''')


def test_an_init_fill_of_a_layer_built_in_another_module(tmp_path):
    pkg = tmp_path / "tinypkg_fills"
    for sub in (pkg, pkg / "layers", pkg / "models"):
        sub.mkdir(parents=True)
        (sub / "__init__.py").write_text("")
    (pkg / "layers" / "norm_act.py").write_text(NORM_ACT)
    (pkg / "layers" / "__init__.py").write_text(
        "from .norm_act import BatchNormAct2d, ConvNormAct\n")
    (pkg / "models" / "net.py").write_text(INIT_MODEL)
    _verified(pkg / "models" / "net.py", "Net", "float32[2,3,5,5]")


def test_layer_weight_finds_each_layers_weight():
    """The helper the fills use, on the layers whose weight NNX names otherwise: a conv's
    kernel, a norm's scale (the BatchNorm helper with torch's signature), an embedding's
    table; a layer without one is refused."""
    from flax import nnx

    from torch2jax.passes.helpers import HELPERS

    ns: dict = {"nnx": nnx}
    exec(HELPERS["layer_weight"]["nnx"][0], ns)  # noqa: S102 - the helper's own source
    layer_weight, rngs = ns["layer_weight"], nnx.Rngs(0)
    conv = nnx.Conv(2, 3, kernel_size=(3, 3), rngs=rngs)
    norm = nnx.BatchNorm(3, rngs=rngs)
    embed = nnx.Embed(5, 2, rngs=rngs)
    assert layer_weight(conv) is conv.kernel
    assert layer_weight(norm) is norm.scale
    assert layer_weight(embed) is embed.embedding
    layer_weight(norm).value = np.full(3, 0.5, np.float32)
    np.testing.assert_array_equal(np.asarray(norm.scale[...]), 0.5)
    try:
        layer_weight(nnx.Dropout(0.1))
    except AttributeError as exc:
        assert "Dropout has no weight" in str(exc)
    else:
        raise AssertionError("a layer without a weight was given one")


CLOSURE = textwrap.dedent('''
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, dim, extra_norm=False):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.norm = nn.LayerNorm(dim) if extra_norm else nn.Identity()

        def forward(self, x):
            return self.norm(self.fc(x))


    class Stage(nn.Module):
        def __init__(self, dim=4, depth=3, extra_norm_period=2, extra_norm_stage=True):
            super().__init__()

            def _extra_norm(index):
                i = index + 1
                if extra_norm_period and i % extra_norm_period == 0:
                    return True
                return i == depth if extra_norm_stage else False

            def make_norm(i):
                return nn.LayerNorm(dim) if i else nn.Identity()

            self.blocks = nn.Sequential(*[
                Block(dim=dim, extra_norm=_extra_norm(index)) for index in range(depth)])
            self.norms = nn.ModuleList([make_norm(i) for i in range(2)])

        def forward(self, x):
            x = self.blocks(x)
            for norm in self.norms:
                x = norm(x)
            return x
''')


def test_a_closure_named_like_a_factory_is_called_as_it_is(tmp_path):
    (tmp_path / "model.py").write_text(CLOSURE)
    _verified(tmp_path / "model.py", "Stage", "float32[2,3,4]")


PARTIAL_NORM = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, dim, norm_layer=partial(nn.LayerNorm, eps=1e-6)):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.norm = norm_layer(dim, eps=1e-3)
            self.norm2 = norm_layer(dim)

        def forward(self, x):
            return self.norm2(self.norm(self.fc(x)))


    class Net(nn.Module):
        def __init__(self, dim=4):
            super().__init__()
            self.a = Block(dim)
            self.b = Block(dim, norm_layer=partial(nn.LayerNorm, elementwise_affine=False))

        def forward(self, x):
            return self.b(self.a(x) * 3.0)
''')


def test_a_partial_of_layer_norm_called_with_torchs_keywords(tmp_path):
    (tmp_path / "model.py").write_text(PARTIAL_NORM)
    _verified(tmp_path / "model.py", "Net", "float32[2,3,4]")


WEIGHT_INIT = textwrap.dedent('''
    import torch.nn as nn


    def named_apply(fn, module, name='', depth_first=True, include_root=False):
        if not depth_first and include_root:
            fn(module=module, name=name)
        for child_name, child_module in module.named_children():
            child_name = '.'.join((name, child_name)) if name else child_name
            named_apply(fn=fn, module=child_module, name=child_name, depth_first=depth_first,
                        include_root=True)
        if depth_first and include_root:
            fn(module=module, name=name)
        return module


    def init_weight_vit(module, name, init_bias=0.02, classifier_name='head'):
        if isinstance(module, nn.Linear):
            if name.startswith(classifier_name):
                nn.init.zeros_(module.weight)
            else:
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.constant_(module.bias, init_bias)


    def init_weight_jax(module, name, classifier_name='head'):
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
''')

INIT_FN_MODEL = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn

    from ..layers.weight_init import init_weight_jax, init_weight_vit, named_apply


    class Net(nn.Module):
        def __init__(self, dim=4, weight_init=''):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.head = nn.Linear(dim, 2)
            if weight_init != 'skip':
                init_fn = init_weight_jax if weight_init == 'jax' else init_weight_vit
                init_fn = partial(init_fn, classifier_name='head')
                named_apply(init_fn, self)

        def forward(self, x):
            return self.head(self.fc(x).tanh())
''')


def test_an_imported_init_function_chosen_into_a_local_binds_rngs(tmp_path):
    pkg = tmp_path / "tinypkg_initfn"
    for sub in (pkg, pkg / "layers", pkg / "models"):
        sub.mkdir(parents=True)
        (sub / "__init__.py").write_text("")
    (pkg / "layers" / "weight_init.py").write_text(WEIGHT_INIT)
    (pkg / "models" / "net.py").write_text(INIT_FN_MODEL)
    _verified(pkg / "models" / "net.py", "Net", "float32[2,3,4]")


CLASS_LOOKUP = textwrap.dedent('''
    from typing import Type

    import torch.nn as nn


    def conv_nd(n: int) -> Type[nn.Module]:
        return [nn.Identity, nn.Conv1d, nn.Conv2d, nn.Conv3d][n]


    class PatchEmbed(nn.Module):
        def __init__(self, dim_in=3, dim_out=4, spatial_dims=2):
            super().__init__()
            self.spatial_dims = spatial_dims
            self.proj = conv_nd(self.spatial_dims)(dim_in, dim_out, kernel_size=3, stride=2,
                                                   padding=1)

        def forward(self, x):
            return self.proj(x)
''')


def test_a_list_lookup_of_layer_classes_built_at_once(tmp_path):
    (tmp_path / "model.py").write_text(CLASS_LOOKUP)
    _verified(tmp_path / "model.py", "PatchEmbed", "float32[2,3,6,6]")
