"""Containers of timm's model code (docs/timm-sweep.md, issue 34) used one item at a time, on a
model of our own written that way, converted, built and verified against torch (outputs and
gradients, float64):

* two Sequentials of convolutions and norms built from local lists, walked together
  (repghost's ``for conv, bn in zip(self.fusion_conv, self.fusion_bn)``) and measured
  (``len(self.fusion_conv) == 0``): their items are NNX's channels-last layers, called between
  transposes as a ModuleList's are (it was marked "iterated or indexed: its translation holds
  channels-last layers", then "'Sequential' object is not iterable");
* a subclass of nn.Sequential with only a forward (pit's ``SequentialTuple``), built in the
  file: its JAX class is nnx.Sequential's constructor, which takes no rngs ("Sequential.__init__()
  got an unexpected keyword argument 'rngs'");
* ``nn.Sequential(down, *blocks)`` with ``blocks = [Block(dim) for ...]`` a local list
  comprehension of torch-layout modules (starnet's stages): its layout is known (it was marked
  "mixing channels-last layers ... in an order not known statically" and kept torch's
  nn.Sequential, which failed at build: "ConvBN is not a Module subclass");
* a Sequential a function of the file returns in a tuple, unpacked into attributes
  (byobnet's ``self.stages, stage_feat, feat_size = create_byob_stages(...)``), measured
  (``len(self.stages)``: "object of type 'Sequential' has no len()"), sliced and indexed;
* an attribute first given a string parameter, then a layer from a tuple a builder returns
  (xception's ``self.global_pool = global_pool``, then ``self.global_pool, self.fc =
  create_classifier(...)``): the string is ``nnx.data`` ("Cannot assign data value of type
  ... to static attribute 'global_pool'").
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

ITEMS = textwrap.dedent('''
    from typing import Tuple

    import torch
    import torch.nn as nn


    class SequentialTuple(nn.Sequential):
        def forward(self, x: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
            for module in self:
                x = module(x)
            return x


    class Pair(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.lin = nn.Linear(dim, dim)

        def forward(self, x):
            a, b = x
            return self.lin(a) + b, b


    class Fusion(nn.Module):
        def __init__(self, chs, n=2):
            super().__init__()
            fusion_conv = []
            fusion_bn = []
            for _ in range(n):
                fusion_conv.append(nn.Conv2d(chs, chs, 1))
                fusion_bn.append(nn.BatchNorm2d(chs))
            self.fusion_conv = nn.Sequential(*fusion_conv)
            self.fusion_bn = nn.Sequential(*fusion_bn)
            self.first = nn.Sequential(nn.Conv2d(chs, chs, 3, padding=1), nn.ReLU())

        def forward(self, x):
            out = self.first[0](x)
            for conv, bn in zip(self.fusion_conv, self.fusion_bn):
                out = out + bn(conv(x))
            if len(self.fusion_conv) == 0:
                return x
            return out * len(self.fusion_bn)


    class ConvBN(nn.Sequential):
        def __init__(self, in_chs, out_chs, kernel_size=1, stride=1, padding=0, with_bn=True,
                     **kwargs):
            super().__init__()
            self.add_module('conv', nn.Conv2d(in_chs, out_chs, kernel_size, stride=stride,
                                              padding=padding, **kwargs))
            if with_bn:
                self.add_module('bn', nn.BatchNorm2d(out_chs))


    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dwconv = ConvBN(dim, dim, 3, 1, 1, groups=dim)
            self.f1 = ConvBN(dim, dim, 1, with_bn=False)
            self.act = nn.ReLU6()

        def forward(self, x):
            return x + self.f1(self.act(self.dwconv(x)))


    class Pool(nn.Module):
        def __init__(self, pool_type='avg'):
            super().__init__()
            self.pool_type = pool_type

        def forward(self, x):
            return x.mean((2, 3)) if self.pool_type == 'avg' else x.amax((2, 3))


    def create_classifier(num_features, num_classes, pool_type='avg'):
        return Pool(pool_type), nn.Linear(num_features, num_classes)


    def create_stages(dim, depths):
        stages = []
        feature_info = []
        for i in range(len(depths)):
            down = ConvBN(dim, dim, 3, padding=1)
            blocks = [Block(dim) for _ in range(depths[i])]
            stages.append(nn.Sequential(down, *blocks))
            feature_info.append(dict(num_chs=dim, stage=i))
        return nn.Sequential(*stages), feature_info


    class Net(nn.Module):
        def __init__(self, chs=3, dim=4, depths=(1, 2), global_pool: str = 'max'):
            super().__init__()
            self.global_pool = global_pool
            self.stem = nn.Sequential(ConvBN(chs, dim, 3, 2, 1), nn.ReLU6())
            self.stages, self.feature_info = create_stages(dim, depths)
            self.num_stages = len(self.stages)
            self.fusion = Fusion(dim)
            transformers = []
            for _ in range(2):
                transformers += [Pair(dim)]
            self.transformers = SequentialTuple(*transformers)
            self.global_pool, self.head = create_classifier(dim * 2, 2, pool_type=global_pool)

        def forward(self, x, t):
            x = self.stem(x)
            for stage in self.stages[:self.num_stages - 1]:
                x = stage(x)
            x = self.fusion(self.stages[-1](x))
            t, _ = self.transformers((t, t))
            x = torch.cat([x, t[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3])], 1)
            return self.head(self.global_pool(x))
''')


def test_sequential_items_walked_one_at_a_time(tmp_path):
    (tmp_path / "model.py").write_text(ITEMS)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,5,5]", "float32[2,4]"),
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0
