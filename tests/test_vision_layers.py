"""Vision layers in whole converted modules: weights moved by the rules' ``weights`` tables,
forward outputs and every parameter's gradient compared with torch (``torch2jax.verify``).

The rules' own examples (one layer at a time) run in tests/test_rules.py; here the layers sit
between convolutions, so that their activation layout, their weight layouts and their
gradients are exercised the way a model uses them.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request

SOURCE = textwrap.dedent('''
    import math
    from collections import OrderedDict
    from dataclasses import dataclass
    from functools import partial
    from typing import Callable

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch import Tensor


    class PReLUNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.act = nn.PReLU(4, init=0.1)
            self.act2 = nn.PReLU()
            self.fc = nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            x = self.act(self.conv(x))
            x = self.act2(x - 0.5)
            return self.fc(x.flatten(1))


    class ShuffleNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.shuffle = nn.PixelShuffle(2)
            self.unshuffle = nn.PixelUnshuffle(3)
            self.conv2 = nn.Conv2d(18, 4, 1)

        def forward(self, x):
            x = self.shuffle(self.conv(x))
            x = self.conv2(self.unshuffle(x))
            return F.pixel_shuffle(x, 2)


    class InstanceNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.norm = nn.InstanceNorm2d(4, affine=True)
            self.norm2 = nn.InstanceNorm2d(4)

        def forward(self, x):
            x = F.relu(self.norm(self.conv(x)))
            return self.norm2(x)


    class DeconvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
            self.up2 = nn.ConvTranspose2d(3, 2, 4, 2, 1, bias=False)
            self.up3 = nn.ConvTranspose2d(2, 2, (3, 2), padding=(2, 0), dilation=2)

        def forward(self, x):
            x = F.relu(self.up(self.conv(x)))
            return self.up3(self.up2(x))


    class UpsampleNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.up = nn.Upsample(scale_factor=2)
            self.up2 = nn.Upsample(scale_factor=2, mode='bilinear', align_corners=True)
            self.conv2 = nn.Conv2d(4, 2, 3)

        def forward(self, x):
            x = self.up2(self.up(self.conv(x)))
            x = self.conv2(x)
            y = F.interpolate(x, size=(7, 5), mode='bilinear', align_corners=False)
            z = F.interpolate(y, scale_factor=1.5, mode='nearest')
            w = F.interpolate(z, scale_factor=2.3, mode='bilinear')
            return torch.roll(F.hardsigmoid(w), shifts=(1, -2), dims=(2, 3))


    class PoolNet(nn.Module):
        """squeezenet's ceil_mode max pooling, alexnet's adaptive pooling to sizes that do not
        divide the input (torch's overlapping bins)."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
                nn.Conv2d(4, 6, 1), nn.AvgPool2d(3, 2, padding=1, ceil_mode=True),
            )
            self.pool = nn.AdaptiveAvgPool2d((3, 2))
            self.pool2 = nn.AdaptiveMaxPool2d(2)
            self.fc = nn.Linear(6 * 3 * 2 + 6 * 2 * 2, 5)
            # squeezenet's head: a layer built into a local, then put into a Sequential
            final_conv = nn.Conv2d(6, 6, kernel_size=1)
            self.head = nn.Sequential(nn.Dropout(p=0.5), final_conv, nn.ReLU(inplace=True))

        def forward(self, x):
            x = self.head(self.features(x))
            y = F.adaptive_avg_pool2d(x, (5, 3))
            return self.fc(torch.cat([self.pool(y).flatten(1), self.pool2(x).flatten(1)], 1))


    def make_layers(cfg, batch_norm=False):
        """vgg's: an annotated list grown with +=, returned as nn.Sequential(*layers)."""
        layers: list[nn.Module] = []
        in_channels = 3
        for v in cfg:
            if v == "M":
                layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
            else:
                conv2d = nn.Conv2d(in_channels, v, kernel_size=3, padding=1)
                if batch_norm:
                    layers += [conv2d, nn.BatchNorm2d(v), nn.ReLU(True)]
                else:
                    layers += [conv2d, nn.ReLU(True)]
                in_channels = v
        return nn.Sequential(*layers)


    class VGGNet(nn.Module):
        def __init__(self, features: nn.Module, num_classes: int = 5):
            super().__init__()
            self.features = features  # built elsewhere: its layout is not tracked here
            self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
            self.classifier = nn.Linear(8 * 3 * 3, num_classes)

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(x, 1))


    def vgg_like():
        return VGGNet(make_layers([4, "M", 8, "M"], batch_norm=True))


    class Branch(nn.Module):
        """shufflenet's: a static method building a (channels-last) layer inside a Sequential."""

        def __init__(self, inp: int, oup: int, stride: int) -> None:
            super().__init__()
            self.branch = nn.Sequential(
                self.depthwise_conv(inp, inp, kernel_size=3, stride=stride, padding=1),
                nn.BatchNorm2d(inp),
                nn.Conv2d(inp, oup, kernel_size=1, bias=False),
                nn.ReLU(inplace=True),
            )

        @staticmethod
        def depthwise_conv(i: int, o: int, kernel_size: int, stride: int = 1, padding: int = 0,
                           bias: bool = False) -> nn.Conv2d:
            return nn.Conv2d(i, o, kernel_size, stride, padding, bias=bias, groups=i)

        def forward(self, x):
            return self.branch(x)


    class BranchNet(nn.Module):
        """A module class handed in as a parameter's default (inverted_residual=...)."""

        def __init__(self, block: Callable[..., nn.Module] = Branch, num_classes: int = 5):
            super().__init__()
            stage = [block(3, 6, 2)]
            stage.append(block(6, 6, 1))
            self.stage = nn.Sequential(*stage)
            self.fc = nn.Linear(6, num_classes)

        def forward(self, x):
            return self.fc(self.stage(x).mean([2, 3]))


    class ConvNormAct(nn.Sequential):
        """torchvision's Conv2dNormActivation in one file: a Sequential subclass filled from a
        list, layer classes as parameter defaults (BatchNorm2d's factory is channels-last here:
        every call of it in the file is)."""

        def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1,
                     norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU, conv_layer=nn.Conv2d):
            layers = [conv_layer(cin, cout, kernel_size, stride, (kernel_size - 1) // 2,
                                 groups=groups, bias=norm_layer is None)]
            if norm_layer is not None:
                layers.append(norm_layer(cout))
            if activation_layer is not None:
                layers.append(activation_layer(inplace=True))
            super().__init__(*layers)


    class MobileNet(nn.Module):
        def __init__(self, num_classes: int = 5, norm_layer=None):
            super().__init__()
            if norm_layer is None:
                norm_layer = nn.BatchNorm2d
            self.stem = ConvNormAct(3, 4, stride=2, norm_layer=norm_layer,
                                    activation_layer=nn.Hardswish)
            layers: list[nn.Module] = [ConvNormAct(4, 4, groups=4, activation_layer=nn.ReLU6)]
            layers.extend([nn.Conv2d(4, 6, 1, bias=False), norm_layer(6)])
            layers.append(ConvNormAct(6, 6, 1, norm_layer=None, activation_layer=None))
            self.blocks = nn.Sequential(*layers)
            self.act = F.silu  # a torch function as a value
            self.head = nn.Linear(6, num_classes)

        def forward(self, x):
            x = self.act(self.blocks(self.stem(x)))
            return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


    class SEBlock(nn.Module):
        """torchvision's SqueezeExcitation: activation classes built in __init__."""

        def __init__(self, c: int, activation=nn.ReLU, scale_activation=nn.Sigmoid):
            super().__init__()
            self.fc1 = nn.Conv2d(c, c // 2, 1)
            self.fc2 = nn.Conv2d(c // 2, c, 1)
            self.activation = activation()
            self.scale_activation = scale_activation()

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * self.scale_activation(self.fc2(self.activation(self.fc1(s))))


    @dataclass
    class BlockConfig:
        channels: int
        block: Callable[..., nn.Module]


    class EffNet(nn.Module):
        """efficientnet's: partial(nn.BatchNorm2d, eps, momentum), partial(nn.SiLU, inplace=True),
        a module class held by a config, torch.jit / torch._assert guards."""

        def __init__(self, num_classes: int = 5):
            super().__init__()
            norm_layer = partial(nn.BatchNorm2d, eps=1e-3, momentum=0.01)
            cfg = BlockConfig(4, SEBlock)
            if not torch.jit.is_scripting():
                torch._assert(cfg.channels == 4, "four channels")
            self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), norm_layer(4))
            self.block = cfg.block(cfg.channels, activation=partial(nn.SiLU, inplace=True))
            self.fc = nn.Linear(4, num_classes)

        def forward(self, x):
            x = self.block(self.stem(x))
            torch._assert(x.dim() == 4, "NCHW input")
            return self.fc(x.mean((2, 3)))


    class Transform(nn.Sequential):
        """regnet's BottleneckTransform: a Sequential subclass of named layers."""

        def __init__(self, cin: int, cout: int, activation_layer: Callable[..., nn.Module]):
            layers: OrderedDict[str, nn.Module] = OrderedDict()
            layers["a"] = nn.Conv2d(cin, cout, 1, bias=False)
            layers["b"] = nn.BatchNorm2d(cout)
            layers["act"] = activation_layer(inplace=True)
            super().__init__(layers)


    class ResBlock(nn.Module):
        def __init__(self, cin: int, cout: int, activation_layer: Callable[..., nn.Module]):
            super().__init__()
            self.proj = None  # a layer only when the shape changes
            if cin != cout:
                self.proj = nn.Conv2d(cin, cout, 1)
            self.f = Transform(cin, cout, activation_layer)

        def forward(self, x):
            return (x if self.proj is None else self.proj(x)) + self.f(x)


    class Stage(nn.Sequential):
        """regnet's AnyStage: an empty Sequential filled with add_module."""

        def __init__(self, cin: int, cout: int, depth: int, block_constructor, stage_index=0):
            super().__init__()
            for i in range(depth):
                block = block_constructor(cin if i == 0 else cout, cout, nn.ReLU)
                self.add_module(f"block{stage_index}-{i}", block)


    class RegNetLike(nn.Module):
        def __init__(self, num_classes: int = 5, block_type=None):
            super().__init__()
            if block_type is None:
                block_type = ResBlock
            stages = []
            for i, (cin, cout) in enumerate([(3, 4), (4, 6)]):
                stages.append((f"block{i + 1}", Stage(cin, cout, 2, block_type, stage_index=i + 1)))
            self.trunk = nn.Sequential(OrderedDict(stages))
            self.fc = nn.Linear(6, num_classes)
            depths = torch.diff(torch.tensor([0, 2, 5])).tolist()
            self.depths = depths
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                    nn.init.normal_(m.weight, mean=0.0, std=math.sqrt(2.0 / fan_out))

        def forward(self, x):
            return self.fc(self.trunk(x).mean((2, 3)))


    class MLPHead(nn.Sequential):
        def __init__(self, dim: int, hidden: int):
            super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

        def _load_from_state_dict(self, state_dict, prefix, *args):
            state_dict[prefix + "0.weight"] = state_dict.pop(prefix + "linear_1.weight")
            super()._load_from_state_dict(state_dict, prefix, *args)


    class SqueezeExcite(nn.Module):
        def __init__(self, c: int):
            super().__init__()
            self.fc1 = nn.Conv2d(c, c // 2, 1)
            self.fc2 = nn.Conv2d(c // 2, c, 1)

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * torch.sigmoid(self.fc2(F.relu(self.fc1(s))))


    class MBConvLike(nn.Module):
        """maxvit's MBConv: an OrderedDict filled by name (one item under a condition) with
        convolutions among layers that take NCHW, run as nn.Sequential(layers)."""

        def __init__(self, c: int = 4, mid: int = 8, use_se: bool = True):
            super().__init__()
            layers = OrderedDict()
            layers["conv_a"] = nn.Conv2d(c, mid, kernel_size=1, bias=False)
            layers["conv_b"] = nn.Conv2d(mid, mid, kernel_size=3, stride=2, padding=1, groups=mid)
            if use_se:
                layers["squeeze_excitation"] = SqueezeExcite(mid)
            layers["conv_c"] = nn.Conv2d(in_channels=mid, out_channels=c, kernel_size=1)
            self.layers = nn.Sequential(layers)
            self.proj = nn.Sequential(nn.AvgPool2d(3, 2, 1), nn.Conv2d(c, c, 1))

        def forward(self, x):
            return self.proj(x) + self.layers(x)


    def cosine_attention(x, qkv_weight, qkv_bias, logit_scale, table):
        qkv_bias = qkv_bias.clone()
        n = qkv_bias.numel() // 3
        qkv_bias[n : 2 * n].zero_()
        qkv = F.linear(x, qkv_weight, qkv_bias)
        q, k, v = qkv[..., :n], qkv[..., n : 2 * n], qkv[..., 2 * n :]
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(logit_scale, max=math.log(100.0)).exp()
        return F.softmax(attn, dim=-1) @ v + table.sum()


    class CosineAttention(nn.Module):
        def __init__(self, dim: int = 8):
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.define_table()
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((1, 1))))

        def define_table(self):
            self.table = nn.Parameter(torch.zeros(4, 1))
            nn.init.trunc_normal_(self.table, std=0.02)


    class CosineAttentionV2(CosineAttention):
        """swin v2's attention: the k part of qkv's bias zeroed (at construction and in the
        function), cosine attention over padded (zero) keys, a method overriding one that
        draws (so it takes rngs too), the base's self.qkv handed to a function."""

        def __init__(self, dim: int = 8):
            super().__init__(dim)
            length = self.qkv.bias.numel() // 3
            self.qkv.bias[length : 2 * length].data.zero_()

        def define_table(self):
            self.table = nn.Parameter(torch.linspace(-1, 1, 4).unsqueeze(1))

        def forward(self, x):
            x = F.pad(x, (0, 0, 0, 2))  # two zero tokens: F.normalize of zero keys
            return cosine_attention(x, self.qkv.weight, self.qkv.bias, self.logit_scale,
                                    self.table)


    def _project(x, weight, bias):
        return torch.matmul(x, weight.transpose(0, 1)) + bias


    class LinearWeightReader(nn.Module):
        """swin's attention hands self.qkv.weight to a module-level function: a Linear's weight
        read in forward is in torch's (out, in) layout (the NNX kernel is (in, out))."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 4)
            self.out = nn.Linear(4, 3)

        def forward(self, x):
            h = F.linear(x, self.fc.weight, self.fc.bias) + self.fc.weight.sum(1)
            return _project(h, self.out.weight, self.out.bias) * self.fc.weight.shape[0]


    class TinyViT(nn.Module):
        """vision_transformer's: a class token and position embedding drawn in __init__,
        partial(nn.LayerNorm, eps), a head of named layers initialised by name."""

        def __init__(self, num_classes: int = 5, dim: int = 8, patch: int = 3,
                     norm_layer=partial(nn.LayerNorm, eps=1e-6)):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
            self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos_embedding = nn.Parameter(torch.empty(1, 5, dim).normal_(std=0.02))
            self.shift = nn.Parameter(torch.randn(1, 1, dim) * 0.1)
            self.ln = norm_layer(dim)
            self.mlp = MLPHead(dim, 2 * dim)
            heads: OrderedDict[str, nn.Module] = OrderedDict()
            heads["pre_logits"] = nn.Linear(dim, dim)
            heads["act"] = nn.Tanh()
            heads["head"] = nn.Linear(dim, num_classes)
            self.heads = nn.Sequential(heads)
            fan_in = self.conv_proj.in_channels * self.conv_proj.kernel_size[0] * patch
            nn.init.trunc_normal_(self.conv_proj.weight, std=math.sqrt(1 / fan_in))
            if hasattr(self.heads, "pre_logits") and isinstance(self.heads.pre_logits, nn.Linear):
                nn.init.zeros_(self.heads.pre_logits.bias)
            if isinstance(self.heads.head, nn.Linear):
                nn.init.normal_(self.heads.head.weight, std=0.1)

        def forward(self, x):
            x = self.conv_proj(x).reshape(x.shape[0], self.class_token.shape[-1], -1)
            x = x.permute(0, 2, 1)
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
            x = self.ln(x + self.pos_embedding + self.shift)
            x = x + self.mlp(x)
            return self.heads(x[:, 0])


    class LayerNorm2d(nn.LayerNorm):
        """convnext's: a subclass of a torch layer with its own forward over F.layer_norm of its
        own attributes, in NCHW."""

        def forward(self, x):
            x = x.permute(0, 2, 3, 1)
            x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
            x = x.permute(0, 3, 1, 2)
            return x


    class LayerNorm2dNoBias(LayerNorm2d):
        """Through a local base: still built with LayerNorm's arguments."""


    class ShiftedNorm(nn.LayerNorm):
        """Its own __init__ (super().__init__ with torch's arguments) and reads of the layer's
        weight, bias and eps."""

        def __init__(self, dim: int, shift: float = 0.5, eps: float = 1e-5):
            super().__init__(dim, eps=eps)
            self.shift = shift

        def forward(self, x):
            y = F.layer_norm(x, (x.shape[-1],), None, None, self.eps)
            return y * (self.weight + self.shift) + self.bias


    class Permute(nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.dims = dims

        def forward(self, x):
            return torch.permute(x, self.dims)


    class CNBlock(nn.Module):
        def __init__(self, dim: int, layer_scale: float, norm_layer=None):
            super().__init__()
            if norm_layer is None:
                norm_layer = partial(nn.LayerNorm, eps=1e-6)
            self.block = nn.Sequential(
                nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim, bias=True),
                Permute([0, 2, 3, 1]),
                norm_layer(dim),
                nn.Linear(in_features=dim, out_features=4 * dim, bias=True),
                nn.GELU(),
                nn.Linear(in_features=4 * dim, out_features=dim, bias=True),
                Permute([0, 3, 1, 2]),
            )
            self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1) * layer_scale)

        def forward(self, input):
            result = self.layer_scale * self.block(input)
            result += input
            return result


    class ConvNeXtLike(nn.Module):
        """torchvision's convnext: partial(LayerNorm2d, eps) as the norm layer of a stem,
        downsampling and head in NCHW, blocks running channels-last between Permutes, a layer
        scale parameter, trunc_normal_ initialisation."""

        def __init__(self, num_classes: int = 5, layer_scale: float = 0.5):
            super().__init__()
            norm_layer = partial(LayerNorm2d, eps=1e-6)
            layers = [nn.Sequential(nn.Conv2d(3, 8, kernel_size=2, stride=2), norm_layer(8))]
            layers.append(nn.Sequential(CNBlock(8, layer_scale), CNBlock(8, layer_scale)))
            layers.append(nn.Sequential(LayerNorm2dNoBias(8, eps=1e-3, bias=False),
                                        nn.Conv2d(8, 12, kernel_size=2, stride=2)))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(norm_layer(12), nn.Flatten(1), nn.Linear(12, 12))
            self.head = nn.Sequential(ShiftedNorm(12, shift=0.25), nn.Linear(12, num_classes))
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    nn.init.trunc_normal_(m.weight, std=0.2)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

        def forward(self, x):
            x = self.avgpool(self.features(x))
            return self.head(self.classifier(x))
    class DenseLayer(nn.Module):
        """densenet's _DenseLayer: TorchScript overloads, a Tensor or a list of them."""

        def __init__(self, cin: int, growth: int):
            super().__init__()
            self.norm1 = nn.BatchNorm2d(cin)
            self.relu1 = nn.ReLU(inplace=True)
            self.conv1 = nn.Conv2d(cin, 2 * growth, kernel_size=1, bias=False)
            self.norm2 = nn.BatchNorm2d(2 * growth)
            self.conv2 = nn.Conv2d(2 * growth, growth, kernel_size=3, padding=1, bias=False)

        def bn_function(self, inputs: list[Tensor]) -> Tensor:
            return self.conv1(self.relu1(self.norm1(torch.cat(inputs, 1))))

        @torch.jit._overload_method  # noqa: F811
        def forward(self, input: list[Tensor]) -> Tensor:  # noqa: F811
            pass

        @torch.jit._overload_method  # noqa: F811
        def forward(self, input: Tensor) -> Tensor:  # noqa: F811
            pass

        def forward(self, input: Tensor) -> Tensor:  # noqa: F811
            if isinstance(input, Tensor):
                prev_features = [input]
            else:
                prev_features = input
            return self.conv2(F.relu(self.norm2(self.bn_function(prev_features))))


    class DenseBlock(nn.ModuleDict):
        """densenet's _DenseBlock: a ModuleDict filled with add_module, run over items() in
        the order the layers were added (layer10 before layer2 would be the sorted order)."""

        def __init__(self, num_layers: int, cin: int, growth: int):
            super().__init__()
            for i in range(num_layers):
                self.add_module("denselayer%d" % (i + 1), DenseLayer(cin + i * growth, growth))

        def forward(self, init_features: Tensor) -> Tensor:
            features = [init_features]
            for name, layer in self.items():
                features.append(layer(features))
            return torch.cat(features, 1)


    class Transition(nn.Sequential):
        """densenet's _Transition: a Sequential whose children are attributes."""

        def __init__(self, cin: int, cout: int):
            super().__init__()
            self.norm = nn.BatchNorm2d(cin)
            self.relu = nn.ReLU(inplace=True)
            self.conv = nn.Conv2d(cin, cout, kernel_size=1, bias=False)
            self.pool = nn.AvgPool2d(kernel_size=2, stride=2)


    class DenseNetLike(nn.Module):
        """densenet's features: a channels-last Sequential of named layers that add_module
        extends with torch-layout blocks, then with a channels-last BatchNorm."""

        def __init__(self, growth: int = 2, block_config=(11, 2), num_classes: int = 3):
            super().__init__()
            self.features = nn.Sequential(OrderedDict([
                ("conv0", nn.Conv2d(3, 4, kernel_size=3, stride=1, padding=1, bias=False)),
                ("norm0", nn.BatchNorm2d(4)),
                ("relu0", nn.ReLU(inplace=True)),
                ("pool0", nn.MaxPool2d(kernel_size=3, stride=2, padding=1)),
            ]))
            num_features = 4
            for i, num_layers in enumerate(block_config):
                block = DenseBlock(num_layers, num_features, growth)
                self.features.add_module("denseblock%d" % (i + 1), block)
                num_features = num_features + num_layers * growth
                if i != len(block_config) - 1:
                    trans = Transition(num_features, num_features // 2)
                    self.features.add_module("transition%d" % (i + 1), trans)
                    num_features = num_features // 2
            self.features.add_module("norm5", nn.BatchNorm2d(num_features))
            self.classifier = nn.Linear(num_features, num_classes)

        def forward(self, x):
            out = F.relu(self.features(x))
            out = torch.flatten(F.adaptive_avg_pool2d(out, (1, 1)), 1)
            return self.classifier(out)


    class Stack(nn.ModuleList):
        """A ModuleList subclass built from a list and appended to, run in order."""

        def __init__(self, c: int, depth: int):
            super().__init__([nn.Conv2d(c, c, 3, padding=1)])
            for _ in range(depth - 1):
                self.append(nn.Conv2d(c, c, 3, padding=1))

        def forward(self, x):
            for conv in self:
                x = x + torch.tanh(conv(x))
            return x


    class ContainerAttrs(nn.Module):
        """ModuleDict / ModuleList attributes run in loops: their channels-last layers get
        transposes, and a ModuleDict runs in insertion order (c1, c0, b; sorted, as an nnx.Dict
        comes back from jit, would put the BatchNorm first and swap the heads)."""

        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleDict(dict(c1=nn.Conv2d(3, 3, 3, padding=1),
                                            c0=nn.Conv2d(3, 3, 1)))
            self.convs["b"] = nn.BatchNorm2d(3)
            self.stack = nn.ModuleList()
            for _ in range(2):
                self.stack.append(nn.Conv2d(3, 3, 1))
            self.heads = nn.ModuleDict({"b": nn.Linear(3, 2), "a": nn.Linear(3, 4)})

        def forward(self, x):
            for name, layer in self.convs.items():
                x = torch.tanh(layer(x))
            for conv in self.stack:
                x = x + conv(x)
            y = x.mean((2, 3))
            return torch.cat([head(y) for head in self.heads.values()], 1)


    class ModuleListNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 1)
            self.stack = Stack(4, 3)

        def forward(self, x):
            return self.stack(self.stem(x))
''')

# name -> input spec
MODELS = {
    "PReLUNet": "float32[2,3,6,6]",
    "ShuffleNet": "float32[2,3,6,6]",
    "InstanceNet": "float32[2,3,5,7]",
    "DeconvNet": "float32[2,3,5,6]",
    "UpsampleNet": "float32[2,3,5,6]",
    "PoolNet": "float32[2,3,13,10]",
    "vgg_like": "float32[2,3,8,8]",
    "BranchNet": "float32[2,3,7,6]",
    "MobileNet": "float32[2,3,9,8]",
    "EffNet": "float32[2,3,5,6]",
    "RegNetLike": "float32[2,3,5,6]",
    "TinyViT": "float32[2,3,6,6]",
    "ConvNeXtLike": "float32[2,3,8,8]",
    "LinearWeightReader": "float32[2,6]",
    "MBConvLike": "float32[2,4,6,6]",
    "CosineAttentionV2": "float32[2,5,8]",
    "DenseNetLike": "float32[2,3,8,8]",
    "ModuleListNet": "float32[2,3,5,6]",
    "ContainerAttrs": "float32[2,3,5,6]",
}


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision") / "vision_models.py"
    path.write_text(SOURCE)
    return path


def test_converts_without_todos():
    result = convert_source(SOURCE, path="vision_models.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors)
    assert "nnx.PReLU(" in result.code and "nnx.ConvTranspose(" in result.code


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_match(source_file, name):
    result = run_request(VerifyRequest(f"{source_file}::{name}", inputs=(MODELS[name],),
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    # passed: every output and gradient element within 1e-5 (+ 1e-5 relative; gradients'
    # atol scaled by their own magnitude, see torch2jax.verify.run)
    assert result.passed, result.mismatch
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff is not None
    print(f"{name}: forward {result.max_abs_diff:.2g}, gradients {result.grad_max_abs_diff:.2g}")
    # every parameter's gradient was compared (the weight layouts are right both ways)
    n_params = sum(1 for c in result.compared if c.startswith("grad "))
    assert n_params >= 3


# --- ops that already had rules, checked on the cases vision models use ----------------------


def _run(torch_expr: str, shape: tuple[int, ...]) -> None:
    source = ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
              f"def f(x):\n    return {torch_expr}\n")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 4
    assert_function_matches_torch(source, x)


@pytest.mark.parametrize("torch_expr", [
    "torch.roll(x, shifts=(-1, 2), dims=(1, 2))",  # swin's cyclic shift
    "torch.roll(x, 3)",  # no dims: flattened, rolled, reshaped (jnp.roll(axis=None) too)
    "x.roll(1, -1)",
    "F.hardsigmoid(x)",  # relu6(x + 3) / 6: the same formula in jax.nn.hard_sigmoid
    "nn.Hardsigmoid()(x)",
    "F.interpolate(x, size=(2, 3), mode='nearest')",  # downsampling: floor(dst * in / out)
    "F.interpolate(x, size=(2, 3), mode='bilinear')",  # antialias=False written out
    "F.interpolate(x, scale_factor=0.6, mode='bilinear', align_corners=True)",
    # adaptive pooling to sizes that do not divide the input: overlapping bins
    "F.adaptive_avg_pool2d(x, 6)",
    "F.adaptive_max_pool2d(x + 1, (2, 3))",
])
def test_op_matches_torch(torch_expr):
    _run(torch_expr, (2, 3, 5, 7))


@pytest.mark.parametrize("layer", [
    # ceil_mode: the last window overhangs, a window starting in the right padding is dropped
    "nn.MaxPool2d(3, 2, ceil_mode=True)",
    "nn.MaxPool2d(2, 3, padding=1, ceil_mode=True)",  # s > k - p: the dropped window
    "nn.MaxPool2d((3, 1), (2, 3), ceil_mode=True)",
    "nn.AvgPool2d(3, 2, padding=1, ceil_mode=True)",  # the padding counts, the overhang not
    "nn.AvgPool2d(2, 3, padding=1, ceil_mode=True, count_include_pad=False)",
    "nn.AdaptiveAvgPool2d((3, 4))",
    "nn.AdaptiveMaxPool2d((4, None))",
])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 2, 8, 9)])
def test_layer_matches_torch(layer, shape):
    """A layer held by a module and called on its input (the channels-last ones get moveaxis)."""
    source = ("import torch\nimport torch.nn as nn\n\n\nclass M(nn.Module):\n"
              f"    def __init__(self):\n        super().__init__()\n        self.layer = {layer}\n\n"
              "    def forward(self, x):\n        return self.layer(x)\n")
    result = convert_source(source, path="<layer>")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ns_t["M"]()(torch.from_numpy(x)).numpy()
    got = np.asarray(ns_j["M"](rngs=nnx.Rngs(0))(jnp.asarray(x)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _import(path, name: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and torch.jit._overload_method look it up
    spec.loader.exec_module(module)
    return module


def test_densenet_like_weights_land_by_name_and_position(source_file, tmp_path):
    """DenseNetLike's state_dict names (features.denseblock1.denselayer10.norm1.weight): the
    Sequential's children by position (not counting the transposes around conv0..pool0 and
    norm5), the ModuleDict subclass's by name, the Transition's attributes by position; the
    export gives torch's state_dict back."""
    from torch2jax.weights import export_state_dict, transfer_state_dict

    converted = tmp_path / "vision_models_jax.py"
    converted.write_text(convert_source(SOURCE, path="vision_models.py").code)
    torch.manual_seed(0)
    model_t = _import(source_file, "vision_models_t").DenseNetLike()
    with torch.no_grad():
        for p in model_t.parameters():
            p.add_(torch.randn_like(p))
    model_j = _import(converted, "vision_models_jax").DenseNetLike(rngs=nnx.Rngs(0))
    report = transfer_state_dict(model_t, model_j)
    paths = {m.torch_name: m.nnx_name for m in report.mapped}
    # torch children: conv0 norm0 relu0 pool0 denseblock1 transition1 denseblock2 norm5;
    # nnx layers: a transpose first, one after pool0 and one before and after norm5
    assert paths["features.conv0.weight"] == "features.layers.1.kernel"
    # (a block added under a computed name is also the Sequential's attribute of that name,
    # the same module: its variables go by either path)
    assert paths["features.denseblock1.denselayer10.norm1.weight"] in (
        "features.layers.6.denselayer10.norm1.scale",
        "features.denseblock1.denselayer10.norm1.scale")
    assert paths["features.denseblock2.denselayer2.conv2.weight"] in (
        "features.layers.8.denselayer2.conv2.kernel",
        "features.denseblock2.denselayer2.conv2.kernel")
    assert paths["features.norm5.running_var"] == "features.layers.10.var"
    block = model_j.features.layers[6]
    # in the order they were added, also through nnx.split / merge (jit), which sort by name
    assert list(block) == [f"denselayer{i}" for i in range(1, 12)]
    assert list(nnx.merge(*nnx.split(block))) == list(block)
    sd = model_t.state_dict()
    np.testing.assert_array_equal(np.asarray(block["denselayer10"].norm1.scale[...]),
                                  sd["features.denseblock1.denselayer10.norm1.weight"].numpy())
    trans = model_j.features.layers[7]
    np.testing.assert_array_equal(
        np.asarray(trans.conv.kernel[...]),
        sd["features.transition1.conv.weight"].numpy().transpose(2, 3, 1, 0))
    exported = export_state_dict(model_t, model_j)
    assert exported.keys() == sd.keys()
    for k, v in sd.items():
        np.testing.assert_array_equal(exported[k], v.numpy(), err_msg=k)


def test_functional_dropout_with_training_flag_becomes_a_layer(tmp_path):
    """densenet's F.dropout(x, p=self.drop_rate, training=self.training): an nnx.Dropout built
    at the end of __init__. In eval mode the model is torch's; in training mode each output is
    dropped (0) or scaled by 1 / (1 - p), with about p of them dropped."""
    from torch2jax.weights import transfer_state_dict

    source = textwrap.dedent('''
        import torch.nn as nn
        import torch.nn.functional as F


        class M(nn.Module):
            def __init__(self, drop_rate: float = 0.25):
                super().__init__()
                self.fc = nn.Linear(8, 256)
                self.drop_rate = float(drop_rate)

            def forward(self, x):
                x = self.fc(x)
                if self.drop_rate > 0:
                    x = F.dropout(x, p=self.drop_rate, training=self.training)
                return x
    ''')
    result = convert_source(source, path="<dropout>")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    assert "self.dropout = nnx.Dropout(self.drop_rate, rngs=rngs)" in result.code
    assert "self.deterministic" not in result.code  # nnx.Dropout has its own flag
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    model_t = ns_t["M"]().eval()
    model_j = ns_j["M"](rngs=nnx.Rngs(0))
    transfer_state_dict(model_t, model_j)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    want = model_t(torch.from_numpy(x)).detach().numpy()
    model_j.eval()
    np.testing.assert_allclose(np.asarray(model_j(jnp.asarray(x))), want, rtol=1e-6, atol=1e-6)
    model_j.train()
    got = np.asarray(model_j(jnp.asarray(x)))
    dropped = got == 0
    np.testing.assert_allclose(got[~dropped], want[~dropped] / 0.75, rtol=1e-5, atol=1e-6)
    assert 0.15 < dropped.mean() < 0.35, dropped.mean()


def test_memory_efficient_branch_marks_requires_grad():
    """densenet's memory_efficient path (off by default): requires_grad reads have no JAX
    form (marked, not run wrongly); the checkpoint of a layer becomes nnx.remat
    (tests/test_remat.py)."""
    source = textwrap.dedent('''
        import torch.nn as nn
        import torch.utils.checkpoint as cp


        class M(nn.Module):
            def __init__(self, memory_efficient: bool = False):
                super().__init__()
                self.fc = nn.Linear(4, 4)
                self.memory_efficient = memory_efficient

            def any_requires_grad(self, inputs):
                return any(t.requires_grad for t in inputs)

            def forward(self, x):
                if self.memory_efficient and self.any_requires_grad([x]):
                    return cp.checkpoint(self.fc, x, use_reentrant=False)
                return self.fc(x)
    ''')
    result = convert_source(source, path="<checkpoint>")
    rules = sorted(d.rule for d in result.diagnostics if d.severity == "error")
    assert rules == ["requires_grad"], result.code
    assert "nnx.remat(lambda m, *xs: m(*xs))(self.fc, x)" in result.code


def test_sequential_subclass_with_an_attribute_of_unknown_kind_is_marked():
    """A Sequential subclass filled by attributes runs every Module assigned to one: an
    attribute built by a call the converter cannot classify (a factory parameter) is marked,
    not left out of the layers (nnx.Sequential would skip it); float(c) is no layer."""
    source = textwrap.dedent('''
        import torch.nn as nn


        class Block(nn.Sequential):
            def __init__(self, c, make):
                super().__init__()
                self.conv = nn.Conv2d(c, c, 1)
                self.extra = make(c)
                self.scale = float(c)
    ''')
    result = convert_source(source, path="<sequential>")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert errors == [("nn.Sequential subclass: whether self.extra is a layer (one of its "
                       "children) is not known here")], result.code
    assert "super().__init__(self.conv" not in result.code



def test_layer_subclass_reads_without_counterpart_are_marked():
    """A subclass of nn.LayerNorm derives from nnx.LayerNorm; the torch attributes nnx has no
    name for (normalized_shape outside F.layer_norm over all of the layer's own attributes) are
    marked, as is a subclass of a layer without a subclass translation (nn.ConvTranspose2d) and
    any layer subclass for the linen target."""
    source = textwrap.dedent('''
        import torch.nn as nn
        import torch.nn.functional as F


        class Partial(nn.LayerNorm):
            def forward(self, x):
                return F.layer_norm(x, self.normalized_shape, None, None, self.eps) + self.bias


        class MyConv(nn.ConvTranspose2d):
            def forward(self, x):
                return super().forward(x).relu()
    ''')
    result = convert_source(source, path="<subclass>")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert any("self.normalized_shape of torch.nn.LayerNorm" in e for e in errors), errors
    assert any("subclass of the torch layer torch.nn.ConvTranspose2d" in e
               for e in errors), errors
    assert "class Partial(nnx.LayerNorm):" in result.code
    assert "epsilon=self.epsilon) + self.bias" in result.code
    linen = convert_source(source, path="<subclass>", target="linen")
    errors = [d.message for d in linen.diagnostics if d.severity == "error"]
    assert any("subclass of the torch layer torch.nn.LayerNorm" in e for e in errors), errors
# --- swin_transformer's constructs (torchvision.models.swin_transformer, mimicked) ------------

SWIN_SOURCE = textwrap.dedent('''
    from functools import partial
    from typing import Callable, List, Optional

    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    def _merge_pad(x: torch.Tensor) -> torch.Tensor:
        H, W, _ = x.shape[-3:]
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        return torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :],
                          x[..., 0::2, 1::2, :], x[..., 1::2, 1::2, :]], -1)


    torch.fx.wrap("_merge_pad")


    def _position_bias(table: torch.Tensor, index: torch.Tensor, window: List[int]) -> torch.Tensor:
        n = window[0] * window[1]
        bias = table[index].view(n, n, -1)
        return bias.permute(2, 0, 1).contiguous().unsqueeze(0)


    def window_attention(x: torch.Tensor, qkv_weight: torch.Tensor, proj_weight: torch.Tensor,
                         bias: torch.Tensor, window: List[int], num_heads: int, shift: List[int],
                         attention_dropout: float = 0.0, qkv_bias: Optional[torch.Tensor] = None,
                         proj_bias: Optional[torch.Tensor] = None, training: bool = True):
        B, H, W, C = x.shape
        pad_r = (window[1] - W % window[1]) % window[1]
        pad_b = (window[0] - H % window[0]) % window[0]
        x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))
        _, pH, pW, _ = x.shape
        shift = shift.copy()
        if window[0] >= pH:
            shift[0] = 0
        if window[1] >= pW:
            shift[1] = 0
        if sum(shift) > 0:
            x = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2))
        nw = (pH // window[0]) * (pW // window[1])
        x = x.view(B, pH // window[0], window[0], pW // window[1], window[1], C)
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(B * nw, window[0] * window[1], C)
        qkv = F.linear(x, qkv_weight, qkv_bias)
        qkv = qkv.reshape(x.size(0), x.size(1), 3, num_heads, C // num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // num_heads) ** -0.5).matmul(k.transpose(-2, -1)) + bias
        if sum(shift) > 0:
            mask = x.new_zeros((pH, pW))
            count = 0
            for h in ((0, -window[0]), (-window[0], -shift[0]), (-shift[0], None)):
                for w in ((0, -window[1]), (-window[1], -shift[1]), (-shift[1], None)):
                    mask[h[0]:h[1], w[0]:w[1]] = count
                    count += 1
            mask = mask.view(pH // window[0], window[0], pW // window[1], window[1])
            mask = mask.permute(0, 2, 1, 3).reshape(nw, window[0] * window[1])
            mask = mask.unsqueeze(1) - mask.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, float(-100.0)).masked_fill(mask == 0, float(0.0))
            attn = attn.view(x.size(0) // nw, nw, num_heads, x.size(1), x.size(1))
            attn = (attn + mask.unsqueeze(1).unsqueeze(0)).view(-1, num_heads, x.size(1), x.size(1))
        attn = F.softmax(attn, dim=-1)
        attn = F.dropout(attn, p=attention_dropout, training=training)
        x = attn.matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), C)
        x = F.linear(x, proj_weight, proj_bias)
        x = x.view(B, pH // window[0], pW // window[1], window[0], window[1], C)
        x = x.permute(0, 1, 3, 2, 4, 5).reshape(B, pH, pW, C)
        if sum(shift) > 0:
            x = torch.roll(x, shifts=(shift[0], shift[1]), dims=(1, 2))
        return x[:, :H, :W, :].contiguous()


    class WindowAttention(nn.Module):
        def __init__(self, dim: int, window: List[int], shift: List[int], num_heads: int):
            super().__init__()
            self.window, self.shift, self.num_heads = window, shift, num_heads
            self.qkv = nn.Linear(dim, dim * 3)
            self.proj = nn.Linear(dim, dim)
            self.define_table()
            coords = torch.stack(torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]),
                                                indexing="ij"))
            flat = torch.flatten(coords, 1)
            rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
            rel[:, :, 0] += window[0] - 1
            rel[:, :, 1] += window[1] - 1
            rel[:, :, 0] *= 2 * window[1] - 1
            self.register_buffer("relative_position_index", rel.sum(-1).flatten())

        def define_table(self):
            self.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * self.window[0] - 1) * (2 * self.window[1] - 1), self.num_heads))
            nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

        def forward(self, x):
            bias = _position_bias(self.relative_position_bias_table, self.relative_position_index,
                                  self.window)
            return window_attention(x, self.qkv.weight, self.proj.weight, bias, self.window,
                                    self.num_heads, self.shift, qkv_bias=self.qkv.bias,
                                    proj_bias=self.proj.bias, training=self.training)


    class Block(nn.Module):
        def __init__(self, dim: int, heads: int, window: List[int], shift: List[int],
                     norm_layer: Callable[..., nn.Module] = nn.LayerNorm):
            super().__init__()
            self.norm1 = norm_layer(dim)
            self.attn = WindowAttention(dim, window, shift, heads)
            self.norm2 = norm_layer(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for m in self.mlp.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    if m.bias is not None:
                        nn.init.normal_(m.bias, std=1e-6)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))


    class Merge(nn.Module):
        def __init__(self, dim: int, norm_layer: Callable[..., nn.Module] = nn.LayerNorm):
            super().__init__()
            self.norm = norm_layer(4 * dim)
            self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

        def forward(self, x):
            return self.reduction(self.norm(_merge_pad(x)))


    class TinySwin(nn.Module):
        """swin_transformer's constructs: a channels-last body after the patch conv, cyclic shifts
        with an attention mask, padding to the window, a window covering the whole map (no shift),
        a relative position bias gathered through a buffer, Linear weights handed to a function."""

        def __init__(self, window: int = 4, dim: int = 8, num_classes: int = 5):
            super().__init__()
            w = [window, window]
            self.patch = nn.Conv2d(3, dim, kernel_size=2, stride=2)
            norm_layer = partial(nn.LayerNorm, eps=1e-5)
            self.norm0 = norm_layer(dim)
            self.stage1 = nn.Sequential(Block(dim, 2, w, [0, 0]), Block(dim, 2, w, [window // 2] * 2))
            self.merge = Merge(dim)
            self.stage2 = nn.Sequential(Block(2 * dim, 2, w, [window // 2] * 2))
            self.head = nn.Linear(2 * dim, num_classes)

        def forward(self, x):
            x = self.norm0(self.patch(x).permute(0, 2, 3, 1))
            x = self.stage2(self.merge(self.stage1(x)))
            return self.head(x.mean(dim=(1, 2)))
''')


@pytest.fixture(scope="module")
def swin_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("swin") / "swin_like.py"
    path.write_text(SWIN_SOURCE)
    return path


@pytest.mark.parametrize("shape", [
    # 7x7 after the patch conv: padded to 8 for the windows of 4, the shift applies; the merge
    # pads 7 to 8; then 4x4: the window covers the whole map and the shift is clamped to 0
    "float32[2,3,14,14]",
    # 4x4, then 2x2 padded to 4: no shift anywhere (the mask code never runs)
    "float32[1,3,8,8]",
])
def test_swin_like_forward_and_gradients_match(swin_file, shape):
    result = run_request(VerifyRequest(f"{swin_file}::TinySwin", inputs=(shape,), grad=True,
                                       atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    grads = [c for c in result.compared if c.startswith("grad ")]
    assert sum("relative_position_bias_table" in c for c in grads) == 3
    assert sum("qkv.weight" in c for c in grads) == 3  # the weights handed to the function
    assert not any("relative_position_index" in c for c in grads)  # a buffer, no gradient
    assert result.todos == 1  # F.dropout in the function: identity-only, marked


def test_swin_like_conversion():
    """The relative position index is a non-trainable nnx.Variable of integers; shift lists stay
    Python lists; F.dropout without a key is translated for its identity only and marked."""
    result = convert_source(SWIN_SOURCE, path="swin_like.py")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert len(errors) == 1 and "functional dropout needs a random key" in errors[0], errors
    code = result.code
    assert "shift[0] = 0" in code
    # the marked dropout keeps torch's F for its training branch (no NameError there): the
    # import stays for that one line, and nothing else reads torch
    # (a helper's docstring may name torch: "torch's arguments")
    assert [line for line in code.splitlines() if "torch." in line or "import torch" in line
            or "F." in line] == [
        "import torch.nn.functional as F",
        *[line for line in code.splitlines() if "F.dropout(" in line or "[torch.nn.functional"
          in line]]
    assert "window_attention(x, self.qkv.kernel.T, self.proj.kernel.T," in code
    ns: dict = {}
    exec(code, ns)  # noqa: S102 - the conversion of the test's own source
    model = ns["TinySwin"](rngs=nnx.Rngs(0))
    index = model.stage1.layers[0].attn.relative_position_index
    assert type(index) is nnx.Variable and jnp.issubdtype(index.value.dtype, jnp.integer)
    params = nnx.state(model, nnx.Param)
    assert "relative_position_index" not in str(jax.tree_util.tree_structure(params))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 3, 8, 8)), jnp.float32)
    model.eval()
    y = model(x)  # the marked dropout is the identity in eval mode
    assert y.shape == (1, 5)
    ns["window_attention"]  # the module-level function, kept as a function


@pytest.mark.parametrize("layer, settings", [
    ("nn.AvgPool2d", "kernel_size=2, stride=2"),  # timm's aa_layer(kernel_size=2, stride=2)
    ("nn.AvgPool2d", "3"),  # stride: the kernel size
    ("nn.AvgPool2d", "3, 2, 1, ceil_mode=True"),
    ("nn.AvgPool2d", "3, 2, 1, ceil_mode=True, count_include_pad=False"),
    ("nn.AvgPool2d", "2, 3, 1, ceil_mode=True, count_include_pad=False"),  # a dropped window
    ("nn.AvgPool2d", "(3, 2), (2, 1), (1, 0), divisor_override=4"),
    ("nn.MaxPool2d", "3, 2, 1, ceil_mode=True"),
    ("nn.MaxPool2d", "2, 3, 1, ceil_mode=True"),
    ("nn.MaxPool2d", "3, 1, 1, dilation=2"),
    ("nn.MaxPool2d", "kernel_size=(2, 3), stride=(1, 2)"),
    ("nn.AvgPool1d", "3, 2, 1, ceil_mode=True, count_include_pad=False"),
    ("nn.MaxPool1d", "2, ceil_mode=True"),
    ("nn.AvgPool3d", "2, 2, 1, ceil_mode=True"),
])
def test_pooling_class_as_a_value_matches_torch(layer, settings):
    """timm's ``aa_layer=nn.AvgPool2d`` then ``aa_layer(kernel_size=2, stride=2)``: the class
    handed around becomes a helper class with torch's arguments on NCHW input."""
    source = textwrap.dedent(f'''
        import torch.nn as nn


        class M(nn.Module):
            def __init__(self, pool_layer={layer}):
                super().__init__()
                self.pool = pool_layer({settings})

            def forward(self, x):
                return self.pool(x)
    ''')
    result = convert_source(source, path="<pool>")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    name = layer.split(".")[1]
    assert f"def __init__(self, pool_layer={name}, *, rngs: nnx.Rngs)" in result.code
    ns_t: dict = {}
    ns_j: dict = {}
    exec(source, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    n = int(name[-2])
    for shape in [(2, 3, 5, 7, 6)[:2 + n], (1, 2, 8, 9, 4)[:2 + n]]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        want = ns_t["M"]()(torch.from_numpy(x)).numpy()
        got = np.asarray(jax.jit(ns_j["M"](rngs=nnx.Rngs(0)))(jnp.asarray(x)))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
