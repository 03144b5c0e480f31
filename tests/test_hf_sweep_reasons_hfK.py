"""The transformers sweep's reasons of building the JAX model, fourteenth round
(docs/transformers-sweep.md): a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified against torch."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

FROZEN_BATCH_NORM = '''
import torch
from torch import nn


class FrozenBatchNorm2d(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Buffer(torch.ones(n))
        self.bias = nn.Buffer(torch.zeros(n))
        self.running_mean = nn.Buffer(torch.zeros(n))
        self.running_var = nn.Buffer(torch.ones(n))

    def forward(self, x):
        scale = self.weight.reshape(1, -1, 1, 1) * (
            self.running_var.reshape(1, -1, 1, 1) + 1e-5).rsqrt()
        bias = self.bias.reshape(1, -1, 1, 1) - self.running_mean.reshape(1, -1, 1, 1) * scale
        return x * scale + bias


def replace_batch_norm(model):
    """DETR's: every BatchNorm2d below ``model`` swapped for a frozen one holding its
    statistics."""
    for name, module in model.named_children():
        if isinstance(module, nn.BatchNorm2d):
            new_module = FrozenBatchNorm2d(module.num_features)
            if module.weight.device != torch.device("meta"):
                new_module.weight.copy_(module.weight)
                new_module.bias.copy_(module.bias)
                new_module.running_mean.copy_(module.running_mean)
                new_module.running_var.data.copy_(module.running_var)
            model._modules[name] = new_module
        if len(list(module.children())) > 0:
            replace_batch_norm(module)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.stage = nn.Sequential(nn.Conv2d(4, 5, 1), nn.BatchNorm2d(5), nn.ReLU())

    def forward(self, x):
        return self.stage(self.norm(self.conv(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        backbone = Backbone()
        replace_batch_norm(backbone)
        self.backbone = backbone

    def forward(self, x):
        return self.backbone(x)
'''


def test_batch_norms_swapped_for_frozen_ones_at_build(tmp_path: Path) -> None:
    """DETR, Conditional/DAB/Deformable DETR, Table Transformer, D-FINE's "'ArrayImpl' object
    has no attribute 'copy_'" while building: ``new.weight.copy_(old.weight)`` on a buffer of
    a module the function built is the variable written in place (``new.weight[...] =``), the
    BatchNorm's statistics its ``mean`` / ``var``; the ``meta`` device test is a constant;
    ``model._modules[name] = new`` puts the child in its place (an attribute, a Sequential's
    position), in torch's layout where the BatchNorm ran channels-last. The outputs and every
    gradient are torch's, over an input whose height is not its channel count."""
    converted = convert_source(FROZEN_BATCH_NORM)
    assert converted.todos == 0 and "import torch" not in converted.code
    assert "new_module.weight[...] = module.scale" in converted.code
    assert "new_module.running_var[...] = module.var" in converted.code
    assert "torch_set_child(model, name, new_module)" in converted.code
    path = tmp_path / "model.py"
    path.write_text(FROZEN_BATCH_NORM)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,3,6,5]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


CAUSAL_CONV = '''
import torch
from torch import nn
from torch.nn import functional as F


class CausalConv1d(nn.Module):
    """Mimi / Pocket-TTS's convolution: its causal padding computed from the layer's own
    kernel size, stride, dilation and padding."""

    def __init__(self, cin, cout, kernel_size, stride=1, dilation=1, padding=0):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel_size, stride, dilation=dilation, padding=padding)

    def forward(self, x):
        kernel_size = self.conv.kernel_size[0]
        stride = self.conv.stride[0]
        dilation = self.conv.dilation[0]
        effective = (kernel_size - 1) * dilation + 1
        length = x.shape[-1] + 2 * self.conv.padding[0]
        extra = (stride - (length - effective) % stride) % stride
        return self.conv(F.pad(x, (effective - stride, extra)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = CausalConv1d(3, 4, 3, stride=2)
        self.b = CausalConv1d(4, 4, 3, dilation=2, padding=1)
        self.c = CausalConv1d(4, 2, 2)

    def forward(self, x):
        return self.c(self.b(self.a(x)))
'''


def test_a_convolutions_stride_dilation_and_padding_read_in_forward(tmp_path: Path) -> None:
    """Mimi, Pocket-TTS, MobileNetV1's "'Conv' object has no attribute 'dilation'": torch's
    ``conv.stride`` / ``.dilation`` / ``.padding`` tuples of a layer of the class are
    nnx.Conv's ``strides`` / ``kernel_dilation`` (or ones where flax keeps its default) and
    the low sides of its padding pairs; the outputs and every gradient are torch's."""
    converted = convert_source(CAUSAL_CONV)
    assert "self.conv.kernel_dilation[0]" in converted.code
    path = tmp_path / "model.py"
    path.write_text(CAUSAL_CONV)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,3,11]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


REGISTERED_LIST = '''
import torch
from torch import nn


class PixelDecoder(nn.Module):
    """Mask2Former's pixel decoder: each level's convolutions registered under torch's names
    and kept, low to high resolution, in plain lists torch does not register."""

    def __init__(self, channels=(3, 5), dim=4):
        super().__init__()
        lateral_convs = []
        output_convs = []
        for idx, in_channels in enumerate(channels):
            lateral_conv = nn.Sequential(nn.Conv2d(in_channels, dim, kernel_size=1, bias=False),
                                         nn.GroupNorm(2, dim))
            output_conv = nn.Sequential(nn.Conv2d(dim, dim, kernel_size=3, padding=1),
                                        nn.GroupNorm(2, dim), nn.ReLU())
            self.add_module(f"adapter_{idx + 1}", lateral_conv)
            self.add_module(f"layer_{idx + 1}", output_conv)
            lateral_convs.append(lateral_conv)
            output_convs.append(output_conv)
        self.lateral_convolutions = lateral_convs[::-1]
        self.output_convolutions = output_convs[::-1]

    def forward(self, x, y):
        out = []
        for idx, feature in enumerate((y, x)):
            lateral_conv = self.lateral_convolutions[idx]
            output_conv = self.output_convolutions[idx]
            out.append(output_conv(lateral_conv(feature)))
        return out[0] * 2 + out[1]
'''


def test_a_reversed_local_list_of_registered_modules_kept_in_an_attribute(
        tmp_path: Path) -> None:
    """Mask2Former, MaskFormer, OneFormer's "Found data on value of type list assigned to
    static attribute": a local list of modules the constructor registered one by one
    (``add_module``), kept reversed in an attribute, is a module list of those modules,
    which keep torch's names; the outputs and every gradient are torch's."""
    converted = convert_source(REGISTERED_LIST)
    assert "self.lateral_convolutions = nnx.List(lateral_convs[::-1])" in converted.code
    path = tmp_path / "model.py"
    path.write_text(REGISTERED_LIST)
    r = run_request(VerifyRequest(target=f"{path}::PixelDecoder", float64=False,
                                  inputs=("float32[2,3,4,4]", "float32[2,5,4,4]")))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


NEXT_PARAMETER = '''
import torch
from torch import nn


class Model(nn.Module):
    """Swin V2 / Swin2SR's continuous position bias: a table cast to the dtype of the MLP's
    first parameter, ``next(mlp.parameters()).dtype``."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 3))
        self.register_buffer("table", torch.linspace(-1, 1, 10).reshape(5, 2).half(),
                             persistent=False)

    def forward(self, x):
        table = self.table.to(next(self.mlp.parameters()).dtype)
        return self.mlp(table).sum(0) * x
'''


def test_the_dtype_of_a_layers_first_parameter() -> None:
    """Swin V2 and Swin2SR's "'Sequential' object has no attribute 'parameters'":
    ``next(m.parameters())`` of a module is the first of its parameter arrays (an iterator
    over the list of them); the outputs and every gradient are torch's (``test_three_build_rules_verified_together``)."""
    converted = convert_source(NEXT_PARAMETER)
    assert "next(iter(jax.tree.leaves(nnx.state(self.mlp, nnx.Param)))).dtype" in converted.code


KAISER = '''
import math

import torch
from torch import nn
from torch.nn import functional as F


def kaiser_sinc_filter1d(cutoff, half_width, kernel_size):
    """NeuCodec / XCodec2's anti-aliasing filter: a Kaiser-windowed sinc, built once."""
    delta_f = 4 * half_width
    attenuation = 2.285 * (kernel_size // 2 - 1) * math.pi * delta_f + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    else:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    kaiser_window = torch.kaiser_window(kernel_size, beta=beta, periodic=False,
                                        dtype=torch.float32)
    time = torch.arange(-(kernel_size // 2), kernel_size // 2) + 0.5
    filter_ = 2 * cutoff * kaiser_window * torch.sinc(2 * cutoff * time)
    filter_ /= filter_.sum()
    return filter_.view(1, 1, kernel_size)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("filter", kaiser_sinc_filter1d(0.25, 0.3, 6), persistent=False)
        self.proj = nn.Linear(9, 9)

    def forward(self, x):
        return self.proj(F.pad(F.conv1d(x, self.filter), (2, 2)))
'''


def test_a_kaiser_windowed_sinc_filter_built_at_build() -> None:
    """NeuCodec and XCodec2's "kaiser_window() received an invalid combination of
    arguments": torch's symmetric Kaiser window is ``jnp.kaiser`` and ``torch.sinc``
    ``jnp.sinc`` (both normalised); the outputs and every gradient are torch's (the filter
    is a buffer the JAX side builds itself: not transferred from torch;
    ``test_three_build_rules_verified_together``)."""
    converted = convert_source(KAISER)
    assert "jnp.kaiser(kernel_size, beta).astype(jnp.float32)" in converted.code
    assert converted.todos == 0


MODULE_CAST = '''
import torch
from torch import nn


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))


class Model(nn.Module):
    """SLANet / SLANeXt's head: submodules cast where they are built."""

    def __init__(self):
        super().__init__()
        self.cell = Cell().to(dtype=torch.float32)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.cell(x.to(torch.float32)))
'''


def test_a_submodule_cast_where_it_is_built() -> None:
    """SLANet and SLANeXt's "'SLANetAttentionGRUCell' object has no attribute 'to'":
    ``self.cell = Cell(...).to(dtype=torch.float32)`` in ``__init__`` is the module, its
    floating-point state cast by the statement after it (as outside a class); the outputs and
    every gradient are torch's (``test_three_build_rules_verified_together``)."""
    converted = convert_source(MODULE_CAST)
    assert converted.todos == 0 and "nnx.state(self.cell)" in converted.code


SUBMODULE_PATHS = '''
import torch
from torch import nn


class Conv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, 3, padding=1)
        self.scale = 1.0

    def forward(self, x):
        return self.conv(x) * self.scale


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.block = nn.ModuleList([nn.ELU(), Conv(dim, dim), nn.ELU(), Conv(dim, dim)])

    def forward(self, x):
        y = x
        for layer in self.block:
            y = layer(y)
        return x + y


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        names = ["layers.0"]
        model = [Conv(2, 4)]
        names.extend([f"layers.{len(model)}.block.1", f"layers.{len(model)}.block.3"])
        model += [Block(4)]
        model += [nn.ELU()]
        names.append(f"layers.{len(model)}")
        model += [Conv(4, 3)]
        self.layers = nn.ModuleList(model)
        self._names = names
        for idx, name in enumerate(self._names):
            layer = self.get_submodule(name)
            setattr(layer, "scale", 1.0 + idx)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
'''


def test_submodules_found_by_their_torch_paths(tmp_path: Path) -> None:
    """Mimi's "'MimiEncoder' object has no attribute 'get_submodule'": the encoder records
    the paths of its convolutions (``layers.1.block.3``, past activation layers) and sets an
    attribute on each through ``self.get_submodule(path)``, the ``torch_get_submodule``
    helper over torch's names; the outputs (each convolution scaled by its own index) and
    every gradient are torch's."""
    converted = convert_source(SUBMODULE_PATHS)
    assert converted.todos == 0 and "torch_get_submodule(self, name)" in converted.code
    path = tmp_path / "model.py"
    path.write_text(SUBMODULE_PATHS)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,2,5]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


TOGETHER = KAISER.replace("class Model(nn.Module):", "class KaiserModel(nn.Module):") + \
    NEXT_PARAMETER.split("class Model(nn.Module):")[0] + \
    MODULE_CAST.split("import torch\nfrom torch import nn\n")[1].replace(
        "class Model(nn.Module):", "class CastModel(nn.Module):") + \
    NEXT_PARAMETER.split("class Model(nn.Module):")[1].replace(
        "    \"\"\"Swin V2", "class Model(nn.Module):\n    \"\"\"Swin V2", 1).replace(
        "        self.mlp = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 3))",
        "        self.mlp = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))\n"
        "        self.kaiser = KaiserModel()\n        self.cast = CastModel()").replace(
        "        return self.mlp(table).sum(0) * x",
        "        y = self.kaiser(x)[..., :3]\n"
        "        return self.mlp(table).sum(0) * self.cast(y)")


def test_three_build_rules_verified_together(tmp_path: Path) -> None:
    """The Kaiser window, the submodule cast and ``next(m.parameters())`` above in one model
    (one verification: the outputs and every gradient are torch's)."""
    converted = convert_source(TOGETHER)
    assert converted.todos == 0
    path = tmp_path / "model.py"
    path.write_text(TOGETHER)
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,1,10]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


META_TESTS = '''
import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        if self.fc.weight.device == torch.device("meta"):
            self.a = 1
        else:
            self.a = 2
        if self.fc.weight.is_meta:
            self.b = 1
        elif self.fc.weight.device.type == "meta":
            self.b = 2
        else:
            self.b = 3

    def forward(self, x):
        return self.fc(x) * self.a * self.b
'''


def test_a_meta_device_test_is_a_constant() -> None:
    """``x.device == torch.device("meta")``, ``x.device.type == "meta"`` and ``x.is_meta``
    are False in JAX code (no array lives on torch's meta device): each ``if`` keeps its
    ``else``, with no mark (the conversion alone: the frozen batch norm above runs the
    ``!=`` spelling)."""
    converted = convert_source(META_TESTS)
    assert converted.todos == 0 and "meta" not in converted.code
    assert "self.a = 2" in converted.code and "self.b = 3" in converted.code
    assert "self.a = 1" not in converted.code and "self.b = 1" not in converted.code
