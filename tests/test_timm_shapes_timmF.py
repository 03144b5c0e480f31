"""Convolutions and pooling given the other layout (docs/timm-sweep.md, issue 34: timm's
resnet, res2net, resnest, "conv_general_dilated lhs feature dimension ... 16 // 1 != 32"), on
models of our own written in timm's shape, converted, built and verified against torch:

* an attribute given a pooling layer built in place in one branch of ``__init__`` and
  torch-layout layers in the others (timm's ResNet stem: ``self.maxpool = nn.MaxPool2d(3, 2,
  1)``, else ``aa_layer(2)``, else ``nn.Sequential(nn.MaxPool2d(...), aa_layer(...))``): the
  attribute was "mixed", its call marked, and called on NCHW input where the pool wanted
  channels-last; the pool is now the NCHW MaxPool2d helper with torch's arguments
  (analysis/branch_layouts.py).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

STEM_POOL = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class BlurPool(nn.Module):
        def __init__(self, channels, stride=2):
            super().__init__()
            self.stride = stride
            self.proj = nn.Conv2d(channels, channels, 1)

        def forward(self, x):
            return self.proj(x[:, :, ::self.stride, ::self.stride])


    class Net(nn.Module):
        def __init__(self, aa_layer=None, norm_layer=nn.BatchNorm2d):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = norm_layer(8)
            if aa_layer is not None:
                if issubclass(aa_layer, nn.AvgPool2d):
                    self.maxpool = aa_layer(2)
                else:
                    self.maxpool = nn.Sequential(*[
                        nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
                        aa_layer(channels=8, stride=2)])
            else:
                self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.conv2 = nn.Conv2d(8, 6, 3, padding=1)
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.maxpool(x)
            x = self.conv2(x)
            return self.fc(x.mean((2, 3)))
''')


def test_a_pool_in_one_branch_torch_layout_layers_in_others(tmp_path):
    (tmp_path / "model.py").write_text(STEM_POOL)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,7,7]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0  # the call of self.maxpool was marked
