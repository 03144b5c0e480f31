"""Sequentials of timm's model code (benchmarks/timm_sweep.py, docs/timm-sweep.md) used as
torch's containers after construction, on a model of our own written that way, converted,
built and verified against torch (outputs and gradients, float64):

* a subclass of nn.Sequential passing on its own varargs (timm's selecsls ``SequentialList``,
  vovnet's ``SequentialAppendList``: ``def __init__(self, *args): super().__init__(*args)``),
  iterated in its forward (``for module in self``, ``enumerate(self)``): the layers are those
  the file's constructions of the class pass (``SequentialList(*[Block(...) for ...])``), of
  torch's layout, so ``self`` iterates ``self.layers`` (it was marked "mixing channels-last
  layers", and failed with "'SequentialAppendList' object is not iterable");
* an attribute holding such a subclass measured or iterated (``len(self.features)``: "object
  of type 'SequentialList' has no len()");
* an empty ``nn.Sequential()`` grown by ``append`` and ``extend`` (cspnext, mambaout), one
  built from a local list grown by ``append`` (fastvit's ``nn.Sequential(*stages)``), measured
  (``len(self.stages)``: marked, "has no len()") and iterated over a slice (``for s in self.stages[:n]``:
  the slice was an nnx.Sequential, which is not iterable);
* an attribute first given a flag parameter, then a layer (timm's hgnet: ``self.downsample =
  downsample``, then ``ConvBNAct(...)`` or ``nn.Identity()``): "Cannot assign data value of
  type ... to static attribute" in NNX, the flag is ``nnx.data``; and an attribute declared
  None, then given a layer through a local (dpn's ``proj = BnActConv2d(...)``, then
  ``self.c1x1_w_s2 = proj`` in one branch): its None is ``nnx.data(None)``.
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

CONTAINERS = textwrap.dedent('''
    from typing import Optional

    import torch
    import torch.nn as nn


    class SequentialList(nn.Sequential):
        def __init__(self, *args):
            super().__init__(*args)

        def forward(self, x):
            outs = []
            for module in self:
                x = module(x)
                outs.append(x)
            return outs


    class SequentialAppendList(nn.Sequential):
        def __init__(self, *args):
            super().__init__(*args)

        def forward(self, x, concat_list):
            for i, module in enumerate(self):
                if i == 0:
                    concat_list.append(module(x))
                else:
                    concat_list.append(module(concat_list[-1]))
            return torch.cat(concat_list, dim=1)


    class ConvAct(nn.Module):
        def __init__(self, in_chs, out_chs):
            super().__init__()
            self.conv = nn.Conv2d(in_chs, out_chs, 3, padding=1)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.conv(x))


    class Stage(nn.Module):
        def __init__(self, chs, downsample: bool = True, key_stride: int = 1):
            super().__init__()
            self.downsample = downsample
            if downsample:
                self.downsample = ConvAct(chs, chs)
            else:
                self.downsample = nn.Identity()
            self.proj_s1: Optional[nn.Module] = None
            self.proj_s2: Optional[nn.Module] = None
            proj = ConvAct(chs, chs)
            if key_stride == 2:
                self.proj_s2 = proj
            else:
                self.proj_s1 = proj

        def forward(self, x):
            x = self.downsample(x)
            if self.proj_s1 is not None:
                return self.proj_s1(x)
            return self.proj_s2(x)


    class Net(nn.Module):
        def __init__(self, in_chans=3, dim=4, depth=2, num_classes=3):
            super().__init__()
            self.stem = ConvAct(in_chans, dim)
            self.features = SequentialList(*[ConvAct(dim, dim) for _ in range(depth)])
            mid = []
            for _ in range(depth):
                mid.append(ConvAct(dim, dim))
            self.mid = SequentialAppendList(*mid)
            self.stages = nn.Sequential()
            for i in range(depth):
                layers = [ConvAct(dim, dim)]
                self.stages.append(nn.Sequential(*layers))
            self.stages.extend([ConvAct(dim, dim)])
            blocks = []
            for _ in range(depth):
                blocks.append(ConvAct(dim, dim))
            self.blocks = nn.Sequential(*blocks)
            self.num_blocks = len(self.blocks)
            self.num_stages = len(self.stages)
            self.num_features = len(self.features)
            self.down = Stage(dim)
            self.keep = Stage(dim, downsample=False, key_stride=2)
            self.head = nn.Linear(dim * (depth + 1), num_classes)

        def forward(self, x):
            x = self.stem(x)
            feats = self.features(x)
            x = feats[-1] + feats[0] * len(self.features)
            for stage in self.stages[:self.num_stages - 1]:
                x = stage(x)
            x = self.keep(self.down(self.stages[-1](x)))
            for i, f in enumerate(self.features):
                x = x + f(x) * 0.5
            for b in self.blocks:
                x = b(x) / self.num_blocks
            x = self.mid(x, [x])
            return self.head(x.mean((2, 3)))
''')


def test_sequentials_grown_measured_and_iterated_as_torchs(tmp_path):
    (tmp_path / "model.py").write_text(CONTAINERS)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,8,8]",), float64=True))
    assert result.error is None, result.error  # float64 only: the test's time (CI budget)
    assert result.passed, result.reason
    assert result.todos == 0


# dpn's ``self.c1x1_c1: Optional[nn.Module] = None``, then ``create_conv2d(...)`` in a branch: the builder
# is a function of the package's layers (it takes rngs once converted), so the attribute holds
# a layer and its None is ``nnx.data(None)`` ("Cannot assign data value of type Conv2d to
# static attribute 'c1x1_c1'").
BUILDER_LAYERS = textwrap.dedent('''
    import torch.nn as nn


    def create_conv2d(in_chs, out_chs, kernel_size=1, **kwargs):
        return nn.Conv2d(in_chs, out_chs, kernel_size, padding=kernel_size // 2, **kwargs)
''')

BUILDER_MODEL = textwrap.dedent('''
    from typing import Optional

    import torch.nn as nn

    from ..layers.conv import create_conv2d


    class Block(nn.Module):
        def __init__(self, chs, b=False):
            super().__init__()
            self.c1x1_c1: Optional[nn.Module] = None
            if b:
                self.c1x1_c1 = create_conv2d(chs, chs)

        def forward(self, x):
            return x if self.c1x1_c1 is None else self.c1x1_c1(x) + x


    class Net(nn.Module):
        def __init__(self, chs=3):
            super().__init__()
            self.plain = Block(chs)
            self.conv = Block(chs, b=True)

        def forward(self, x):
            return self.conv(self.plain(x))
''')


def test_an_attribute_given_a_layer_builder_of_the_package_or_none(tmp_path):
    pkg = tmp_path / "tinypkg_builder"
    for d in (pkg, pkg / "layers", pkg / "models"):
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text("")
    (pkg / "layers" / "conv.py").write_text(BUILDER_LAYERS)
    (pkg / "models" / "net.py").write_text(BUILDER_MODEL)
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::Net",
                                       inputs=("float32[2,3,4,4]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
