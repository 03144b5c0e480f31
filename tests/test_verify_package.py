"""verify on a module inside a package: relative imports, a helper module of layers converted
alongside, registries and logging hooks copied so that they run inert (torch2jax/verify/package.py).
A tiny package written to a temporary directory stands in for torchvision."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.verify.package import package_of
from torch2jax.verify.run import VerifyRequest, run_request

FILES = {
    "__init__.py": "from .models.net import net  # the real package imports everything\n",
    "_registry.py": '''
        MODELS = {}


        def register(fn):
            if fn.__name__ in MODELS:  # like torchvision's register_model
                raise ValueError(f"{fn.__name__} is already registered")
            MODELS[fn.__name__] = fn
            return fn
    ''',
    # torchvision.ops re-exports its layers: efficientnet imports StochasticDepth from there
    "ops/__init__.py": "from .blocks import ConvBlock, ConvNormAct\n",
    "ops/blocks.py": '''
        import torch
        import torch.nn as nn


        class ConvBlock(nn.Module):
            scaled: torch.jit.Final[bool]  # a TorchScript constant: the type itself

            def __init__(self, cin, cout, device: torch.device = None):
                super().__init__()
                self.scaled = False
                self.conv = nn.Conv2d(cin, cout, 3, padding=1)
                self.bn = nn.BatchNorm2d(cout)

            def forward(self, x):
                return nn.functional.relu(self.bn(self.conv(x)))


        class ConvNormAct(nn.Sequential):
            """torchvision's Conv2dNormActivation: a Sequential subclass filled from a list,
            layer classes handed in as values (the conv one called with Conv2d's arguments)."""

            def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1,
                         norm_layer=nn.BatchNorm2d, activation_layer=nn.ReLU,
                         conv_layer=nn.Conv2d):
                layers = [conv_layer(cin, cout, kernel_size, stride, (kernel_size - 1) // 2,
                                     groups=groups, bias=norm_layer is None)]
                if norm_layer is not None:
                    layers.append(norm_layer(cout))
                if activation_layer is not None:
                    params = {"inplace": True}
                    layers.append(activation_layer(**params))
                super().__init__(*layers)
                self.out_channels = cout
    ''',
    # a subpackage nothing of which is converted, imported absolutely (timm.data's constants)
    "data/__init__.py": "SHIFT = (0.25, 0.5)\n",
    "models/__init__.py": "",
    "models/net.py": '''
        import torch
        import torch.nn as nn

        from tinyvision.data import SHIFT
        from tinyvision.ops import ConvNormAct  # absolute, through the package's re-export

        from .._registry import register
        from ..ops.blocks import ConvBlock


        class Net(nn.Module):
            def __init__(self, num_classes=10, norm_layer=None, linear_layer=nn.Linear):
                super().__init__()
                if norm_layer is None:
                    norm_layer = nn.BatchNorm2d  # handed to ConvNormAct: channels-first there
                self.block = ConvBlock(3, 4)
                # mobilenet's InvertedResidual: a list of both layouts, in a known order
                layers: list[nn.Module] = []
                layers.append(ConvNormAct(4, 4, groups=4, norm_layer=norm_layer,
                                          activation_layer=nn.ReLU6))
                layers.extend([nn.Conv2d(4, 6, 1, bias=False), norm_layer(6)])
                layers.append(ConvNormAct(6, 6, stride=2, activation_layer=nn.Hardswish))
                self.conv = nn.Sequential(*layers)
                self.fc = linear_layer(6, num_classes, bias=True)  # timm's Mlp

            def forward(self, x):
                x = self.conv(self.block(x - SHIFT[1]))
                return self.fc(torch.mean(x, dim=(2, 3)))


        @register
        def net(num_classes=10):
            return Net(num_classes)
    ''',
}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    for rel, text in FILES.items():
        path = root / "tinyvision" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "tinyvision"


def test_package_of(package):
    root, name = package_of(package / "models" / "net.py")
    assert (root, name) == (package.parent, "tinyvision.models.net")
    assert package_of(package.parent / "elsewhere.py") is None


def test_verifies_a_builder_inside_a_package(package):
    result = run_request(VerifyRequest(f"{package / 'models' / 'net.py'}::net",
                                       args={"num_classes": 5}, inputs=("float32[2,3,6,6]",),
                                       grad=True))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5
    # every torch parameter's gradient compared: the Sequential subclass's children keep their
    # state_dict names (conv.0.0.weight is conv.layers[0].layers[0].kernel)
    assert sum(c.startswith("grad ") for c in result.compared) == 15


MINIGPT = {
    "__init__.py": "",
    "layers.py": '''
        import torch.nn as nn
        import torch.nn.functional as F


        class MLP(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.fc = nn.Linear(dim, 4 * dim)
                self.proj = nn.Linear(4 * dim, dim)

            def forward(self, x):
                return self.proj(F.gelu(self.fc(x)))
    ''',
    "model.py": '''
        import torch.nn as nn

        from .layers import MLP


        class Net(nn.Module):
            def __init__(self, dim=8):
                super().__init__()
                self.ln = nn.LayerNorm(dim)
                self.mlp = MLP(dim)

            def forward(self, x):
                return x + self.mlp(self.ln(x))
    ''',
}


def test_converted_accepts_an_edited_copy_of_a_converted_package(tmp_path):
    """``verify original/minigpt/model.py::Net --converted edited/minigpt/model.py``: the
    converted package, copied elsewhere and edited, has the original's package name; the JAX
    side must import the copy (and its sibling modules), not the torch original."""
    import shutil

    from typer.testing import CliRunner

    from torch2jax.cli import app

    original = tmp_path / "original" / "minigpt"
    original.mkdir(parents=True)
    for rel, text in MINIGPT.items():
        (original / rel).write_text(textwrap.dedent(text))
    converted = tmp_path / "converted" / "minigpt"
    res = CliRunner().invoke(app, ["convert", str(original), "-o", str(converted)])
    assert res.exit_code == 0, res.output
    edited = tmp_path / "somewhere" / "else" / "minigpt"
    shutil.copytree(converted, edited)
    target = f"{original / 'model.py'}::Net"

    def check(copy):
        return run_request(VerifyRequest(target, inputs=("float32[2,8]",),
                                         converted=str(copy / "model.py"), float64=False))

    result = check(edited)
    assert result.error is None and result.passed, (result.error, result.mismatch)
    layers = edited / "layers.py"  # an edit in a sibling module of the copy is what runs
    layers.write_text(layers.read_text().replace("approximate=False", "approximate=True"))
    result = check(edited)
    assert result.error is None and not result.passed, result.error
    assert check(converted).passed  # and the unedited conversion still resolves to itself
