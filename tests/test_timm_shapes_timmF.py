"""Convolutions and pooling given the other layout (docs/timm-sweep.md, issue 34: timm's
resnet, res2net, resnest, "conv_general_dilated lhs feature dimension ... 16 // 1 != 32"), on
models of our own written in timm's shape, converted, built and verified against torch:

* an attribute given a pooling layer built in place in one branch of ``__init__`` and
  torch-layout layers in the others (timm's ResNet stem: ``self.maxpool = nn.MaxPool2d(3, 2,
  1)``, else ``aa_layer(2)``, else ``nn.Sequential(nn.MaxPool2d(...), aa_layer(...))``): the
  attribute was "mixed", its call marked, and called on NCHW input where the pool wanted
  channels-last; the pool is now the NCHW MaxPool2d helper with torch's arguments
  (analysis/branch_layouts.py);
* the branch ``nn.Sequential(*filter(None, [conv, aa if use_aa else None, norm, act]))``
  (the same stem's ``replace_stem_pool``): a conv among torch-layout layers in a filtered
  list, marked ("nn.Sequential mixing channels-last layers ... not known statically"); the
  list now has transposes between its layers (passes/filtered_layers.py);
* a pooling layer given the callers' ``**kwargs`` (timm.layers' ``create_pool2d``:
  ``nn.MaxPool2d(kernel_size, stride=stride, padding=padding, **kwargs)``, nest's
  ``ConvPool``): flax's pooling, channels-last, the keywords dropped, and called on NCHW by
  a module that does not see the function's layout (a mirror package's other module): now
  the NCHW helper class with torch's arguments, as a conv given ``**kwargs`` is;
* ``F.scaled_dot_product_attention`` over 5-D tensors (timm's nest and twins attend within
  image blocks, (B, heads, blocks, length, dim), from ``qkv.reshape(B, T, N, 3, H, C // H)
  .permute(3, 0, 4, 1, 2, 5).unbind(0)``): jax.nn.dot_product_attention takes 4-D only ("too
  many values to unpack (expected 4)"); where the function's lines give a rank above 4, the
  attention is the einsum helper, which takes torch's leading dimensions
  (passes/attention_rank.py);
* a ModuleList of conv-norm-act Sequentials built and returned by a method, kept in an
  attribute and called in a comprehension (timm's hrnet: ``self.transition1 =
  self._make_transition_layer(...)``, ``[t(x) for i, t in enumerate(self.transition1)]``):
  the elements' layout was not known (called on NCHW: "conv_general_dilated lhs feature
  dimension ..."), and a comprehension's loop variable was bound after its element was
  rewritten; the returned list's layout is kept (analysis/returned_lists.py), the
  comprehension's variables bound first;
* an attribute given a slice of itself (selecsls pruning its head: ``self.head =
  self.head[:n]``, the head a Sequential of conv-norm-act Sequentials): the slice was a
  layer of torch's layout, the attribute "mixed" and its call given NCHW ("2 // 1 != 480");
  it keeps the layout of the layers it held (analysis/layer_lists.py's self_slice).
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


    def create_pool2d(pool_type, kernel_size, stride=None, **kwargs):
        stride = stride or kernel_size
        padding = kwargs.pop('padding', 0)
        if pool_type == 'avg':
            return nn.AvgPool2d(kernel_size, stride=stride, padding=padding, **kwargs)
        return nn.MaxPool2d(kernel_size, stride=stride, padding=padding, **kwargs)


    class StemPool(nn.Module):
        def __init__(self, chs, aa_layer=None, replace_stem_pool=False, norm_layer=nn.BatchNorm2d):
            super().__init__()
            if replace_stem_pool:
                self.maxpool = nn.Sequential(*filter(None, [
                    nn.Conv2d(chs, chs, 3, stride=1 if aa_layer else 2, padding=1, bias=False),
                    aa_layer(channels=chs, stride=2) if aa_layer is not None else None,
                    norm_layer(chs),
                    nn.ReLU(inplace=True),
                ]))
            elif aa_layer is not None:
                if issubclass(aa_layer, nn.AvgPool2d):
                    self.maxpool = aa_layer(2)
                else:
                    self.maxpool = nn.Sequential(*[
                        nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
                        aa_layer(channels=chs, stride=2)])
            else:
                self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

        def forward(self, x):
            return self.maxpool(x)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.pool = StemPool(8)
            self.replaced = StemPool(8, replace_stem_pool=True)
            self.blurred = StemPool(8, aa_layer=BlurPool)
            self.conv2 = nn.Conv2d(8, 6, 3, padding=1)
            self.down = create_pool2d('avg', kernel_size=3, stride=2, padding=1, ceil_mode=True)
            self.fc = nn.Linear(6, 4)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = self.pool(x) + self.replaced(x) + self.blurred(x)
            x = self.down(self.conv2(x))
            return self.fc(x.mean((2, 3)))
''')


def test_a_pool_in_one_branch_torch_layout_layers_in_others(tmp_path):
    (tmp_path / "model.py").write_text(STEM_POOL)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,7,7]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0  # the call of self.maxpool was marked


BLOCK_ATTENTION = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class BlockAttention(nn.Module):
        def __init__(self, dim=8, num_heads=2, fused=True):
            super().__init__()
            self.num_heads = num_heads
            self.scale = (dim // num_heads) ** -0.5
            self.fused_attn = fused
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            B, T, N, C = x.shape
            qkv = self.qkv(x).reshape(
                B, T, N, 3, self.num_heads, C // self.num_heads).permute(3, 0, 4, 1, 2, 5)
            q, k, v = qkv.unbind(0)
            if self.fused_attn:
                x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.)
            else:
                q = q * self.scale
                attn = q @ k.transpose(-2, -1)
                x = attn.softmax(dim=-1) @ v
            x = x.permute(0, 2, 3, 4, 1).reshape(B, T, N, C)
            return self.proj(x)
''')


def test_attention_over_five_dimensional_blocks(tmp_path):
    (tmp_path / "model.py").write_text(BLOCK_ATTENTION)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::BlockAttention",
                                       inputs=("float32[2,3,4,8]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.todos == 0


TRANSITIONS = textwrap.dedent('''
    import torch
    import torch.nn as nn


    def conv_bn(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
            self.transition1 = self._make_transition_layer([4], [4, 6])
            self.features = nn.Sequential(*[conv_bn(*a) for a in [(6, 5), (5, 6)]])
            self.head = nn.Linear(10, 3)

        def prune(self, n):
            self.features = self.features[:n]

        def _make_transition_layer(self, pre, cur):
            transition_layers = []
            for i in range(len(cur)):
                if i < len(pre):
                    if cur[i] != pre[i]:
                        transition_layers.append(nn.Sequential(
                            nn.Conv2d(pre[i], cur[i], 3, 1, 1, bias=False),
                            nn.BatchNorm2d(cur[i]),
                            nn.ReLU(inplace=True)))
                    else:
                        transition_layers.append(nn.Identity())
                else:
                    conv3x3s = []
                    for j in range(i + 1 - len(pre)):
                        conv3x3s.append(nn.Sequential(
                            nn.Conv2d(pre[-1], cur[i], 3, 2, 1, bias=False),
                            nn.BatchNorm2d(cur[i]),
                            nn.ReLU(inplace=True)))
                    transition_layers.append(nn.Sequential(*conv3x3s))
            return nn.ModuleList(transition_layers)

        def forward(self, x):
            x = self.conv1(x)
            xl = [t(x) for i, t in enumerate(self.transition1)]
            xl[1] = self.features(xl[1])
            return self.head(torch.cat([y.mean((2, 3)) for y in xl], dim=1))
''')


def test_a_returned_module_list_called_in_a_comprehension(tmp_path):
    (tmp_path / "model.py").write_text(TRANSITIONS)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::Net",
                                       inputs=("float32[2,3,6,6]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    # nothing marked: the calls of the transitions and of self.features, and prune's slice of
    # the channels-last Sequential (nnx.Sequential(*self.features.layers[:n]), the same
    # layers in the same layout: passes/sequential_items.py)
    assert result.todos == 0
