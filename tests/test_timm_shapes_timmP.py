"""Shapes of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) that failed the
sweep at build with "X is not a Module subclass" or a torch layer attribute, each on a model of
our own written that way, converted, built and verified against torch (outputs and gradients,
in float64, the pass that decides).

* an ``OrderedDict`` stem of a conv built by a layer-class parameter, a norm and an
  ``nn.MaxPool2d`` built in place, then ``nn.Sequential(stem)`` (timm's resnetv2
  ``create_resnetv2_stem``): the pooling becomes the NCHW ``MaxPool2d`` helper as a conv
  would, so the Sequential takes torch's layout throughout (it was left torch's ``nn.Sequential``,
  "is not a Module subclass" at build);
* stages built by methods of the class defined below ``__init__`` and returning a list of the
  file's blocks with another value (timm's cpubone: ``blocks, in_channels =
  self._build_conv_stage(...)``, then ``stages.append(nn.Sequential(*blocks))``): the list
  is known to hold torch-layout modules, so both Sequentials are translated (they were left
  torch's, "is not a Module subclass");
* ``nn.Sequential(OrderedDict([...]))`` of a conv built in place, a norm built by a local
  layer class and a pooling chosen into a local in branches (``nn.MaxPool2d`` or a
  Sequential of it and an anti-aliasing layer), then ``add_module`` of a norm (timm's
  densenet stem): the conv and the pooling become the NCHW helpers, the Sequential takes
  torch's layout (it was left torch's, "is not a Module subclass");
* ``named_children()`` of an ``nn.Sequential(stem)`` of an OrderedDict filled by name, its
  names looked up (timm's nfnet: ``[n for n, _ in torch_named_children(self.stem)].index(
  "conv2")``): torch's names, not positions ("'conv2' is not in list");
* a stage's layers added up from lists (timm's csatv2: ``layers = ([nn.Conv2d(..., **dd)]
  if i > 0 else []) + [Block(...) for ...] + ([LayerNorm2d(dim)] if ... else [])``, then
  ``nn.Sequential(*layers)``): the conv becomes the NCHW helper, both Sequentials take
  torch's layout (they were left torch's, "is not a Module subclass").
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verify(tmp_path, source: str, inputs: tuple[str, ...]):
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net", inputs=inputs,
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


POOL_IN_DICT_STEM = textwrap.dedent('''
    from collections import OrderedDict
    from functools import partial

    import torch.nn as nn


    class StdConv(nn.Conv2d):
        def __init__(self, cin, cout, k, stride=1, eps=1e-6):
            super().__init__(cin, cout, k, stride=stride, padding=k // 2)
            self.eps = eps


    def create_stem(in_chs, out_chs, conv_layer=StdConv, norm_layer=nn.BatchNorm2d, preact=False):
        stem = OrderedDict()
        stem['conv'] = conv_layer(in_chs, out_chs, 3, stride=2)
        if not preact:
            stem['norm'] = norm_layer(out_chs)
        stem['pool'] = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        return nn.Sequential(stem)


    class Net(nn.Module):
        def __init__(self, conv_layer=partial(StdConv, eps=1e-8)):
            super().__init__()
            self.stem = create_stem(3, 8, conv_layer=conv_layer)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.stem(x).mean((2, 3)))
''')


def test_pooling_in_an_ordered_dict_stem(tmp_path):
    _verify(tmp_path, POOL_IN_DICT_STEM, ("float32[2,3,9,8]",))


STAGES_FROM_METHODS = textwrap.dedent('''
    import torch.nn as nn


    class ResidualBlock(nn.Module):
        def __init__(self, main, shortcut):
            super().__init__()
            self.main = main
            self.shortcut = shortcut

        def forward(self, x):
            res = self.main(x)
            if self.shortcut is not None:
                res = res + self.shortcut(x)
            return res


    class Net(nn.Module):
        def __init__(self, widths=(4, 6), depth=2):
            super().__init__()
            in_channels = 3
            stages = []
            for i, width in enumerate(widths):
                if i:
                    blocks, in_channels = self._build_other_stage(in_channels, width)
                else:
                    blocks, in_channels = self._build_stage(in_channels, width, depth)
                stages.append(nn.Sequential(*blocks))
            self.stages = nn.Sequential(*stages)
            self.head = nn.Linear(in_channels, 4)

        def _build_stage(self, in_channels, width, depth):
            blocks = []
            for i in range(depth):
                block = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1),
                                      nn.BatchNorm2d(width), nn.ReLU())
                blocks.append(ResidualBlock(block, nn.Identity() if i else None))
                in_channels = width
            return blocks, in_channels

        def _build_other_stage(self, in_channels, width):
            blocks = [ResidualBlock(nn.Sequential(nn.Conv2d(in_channels, width, 1)), None)]
            blocks.append(ResidualBlock(nn.Sequential(nn.Conv2d(width, width, 3, padding=1)),
                                     nn.Identity()))
            return blocks, width

        def forward(self, x):
            return self.head(self.stages(x).mean((2, 3)))
''')


def test_stages_from_lists_methods_return(tmp_path):
    _verify(tmp_path, STAGES_FROM_METHODS, ("float32[2,3,6,5]",))


DICT_STEM_WITH_BRANCH_POOL = textwrap.dedent('''
    from collections import OrderedDict

    import torch.nn as nn


    class BNAct(nn.BatchNorm2d):
        def __init__(self, c, act=True):
            super().__init__(c)
            self.act = nn.ReLU() if act else nn.Identity()

        def forward(self, x):
            return self.act(super().forward(x))


    def get_norm(norm_layer):
        return norm_layer


    class Net(nn.Module):
        def __init__(self, norm_layer=BNAct, aa_layer=None):
            super().__init__()
            norm_layer = get_norm(norm_layer)
            if aa_layer is None:
                stem_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            else:
                stem_pool = nn.Sequential(nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
                                          aa_layer(channels=8))
            self.features = nn.Sequential(OrderedDict([
                ('conv0', nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)),
                ('norm0', norm_layer(8)),
                ('pool0', stem_pool),
            ]))
            self.features.add_module('norm5', norm_layer(8))
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            return self.head(self.features(x).mean((2, 3)))
''')


def test_literal_dict_stem_with_a_pool_chosen_in_branches(tmp_path):
    _verify(tmp_path, DICT_STEM_WITH_BRANCH_POOL, ("float32[2,3,9,8]",))


NAMED_STEM_CHILDREN = textwrap.dedent('''
    from collections import OrderedDict

    import torch.nn as nn


    def create_stem(in_chs, out_chs, conv_layer=nn.Conv2d, act_layer=nn.ReLU):
        stem = OrderedDict()
        chs = (out_chs // 2, out_chs)
        for i, c in enumerate(chs):
            stem[f'conv{i + 1}'] = conv_layer(in_chs, c, kernel_size=3, stride=1, padding=1)
            if i != len(chs) - 1:
                stem[f'act{i + 2}'] = act_layer(inplace=True)
            in_chs = c
        return nn.Sequential(stem), dict(num_chs=out_chs // 2, module='stem.conv2')


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, stem_feat = create_stem(3, 8)
            names = [n for n, _ in self.stem.named_children()]
            self.feat_idx = names.index(stem_feat['module'].split('.', 1)[1])

        def forward(self, x):
            for i, layer in enumerate(self.stem):
                x = layer(x)
                if i == self.feat_idx:
                    feat = x
            return x.mean((2, 3)) + feat.mean((1, 2, 3))[:, None]
''')


def test_named_children_of_a_sequential_of_named_layers(tmp_path):
    _verify(tmp_path, NAMED_STEM_CHILDREN, ("float32[2,3,5,4]",))


SUMMED_STAGE_LISTS = textwrap.dedent('''
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x):
        return x + self.norm(self.conv(x))


class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Net(nn.Module):
    def __init__(self, dims=(4, 6), depths=(1, 2)):
        super().__init__()
        self.stem = nn.Conv2d(3, dims[0], 1)
        dd = {'device': None, 'dtype': None}
        stages = []
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            layers = (
                ([nn.Conv2d(dims[i - 1], dim, kernel_size=2, stride=2, **dd)] if i > 0 else []) +
                [Block(dim) for _ in range(depth)] +
                ([LayerNorm2d(dim, eps=1e-6)] if i < len(depths) - 1 else [])
            )
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(dims[-1], 4)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))
''')


def test_stage_layers_added_up_from_lists(tmp_path):
    _verify(tmp_path, SUMMED_STAGE_LISTS, ("float32[2,3,8,8]",))
