"""Models built from an installed package inside user code (torch2jax/package_models.py).

These tests run without torchvision: a small package named ``torchvision``, written here in
the shape of the real one (a ``models`` subpackage that re-exports its builders, a builder
with ``weights``/``progress`` and the pretrained-weights machinery around it, a layer class
from ``ops``, a helper from ``models/_utils.py``), is put on ``sys.path``. The real
torchvision is tested in the torchvision tier (tests/test_torchvision_user.py).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

if importlib.util.find_spec("torchvision") is not None:  # the tier's environment
    pytest.skip("the real torchvision is installed: tests/test_torchvision_user.py",
                allow_module_level=True)

from torch2jax import package_code, package_models
from torch2jax.convert import convert_source

FAKE = {
    "__init__.py": "from . import models, ops, utils\n",
    "utils.py": """
        def _log_api_usage_once(obj):
            pass
    """,
    "ops/__init__.py": "from .misc import ConvBN\n",
    "ops/misc.py": """
        import torch.nn as nn


        class ConvBN(nn.Sequential):
            def __init__(self, cin, cout):
                super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())


        class Unused(nn.Module):
            def forward(self, x):
                return x
    """,
    "models/__init__.py": "from .tiny import *\nfrom ._api import WeightsEnum\n",
    "models/_api.py": """
        import torch


        class Weights(dict):
            pass


        class WeightsEnum:
            @classmethod
            def verify(cls, w):
                return w


        def register_model():
            return lambda fn: fn
    """,
    "models/_utils.py": """
        from ._api import WeightsEnum


        def _make_divisible(v, divisor):
            return max(divisor, int(v) // divisor * divisor)


        def _ovewrite_named_param(kwargs, param, new_value):
            kwargs[param] = new_value


        def handle_legacy_interface(**weights):
            assert all(issubclass(WeightsEnum, object) for _ in weights)
            return lambda fn: fn
    """,
    "models/tiny.py": '''
        import torch
        import torch.nn as nn

        from ..ops.misc import ConvBN
        from ..utils import _log_api_usage_once
        from ._api import register_model, Weights, WeightsEnum
        from ._utils import _make_divisible, _ovewrite_named_param, handle_legacy_interface

        __all__ = ["Tiny", "Tiny_Weights", "tiny"]


        class Tiny(nn.Module):
            def __init__(self, num_classes=10, width=8):
                super().__init__()
                _log_api_usage_once(self)
                w = _make_divisible(width, 4)
                self.stem = ConvBN(3, w)
                self.conv = nn.Conv2d(w, w, 3, padding=1)
                self.pool = nn.AdaptiveAvgPool2d(1)
                self.classifier = nn.Sequential(nn.Dropout(0.0), nn.Linear(w, num_classes))

            def forward(self, x):
                x = self.pool(torch.relu(self.conv(self.stem(x))))
                return self.classifier(torch.flatten(x, 1))


        class Tiny_Weights(WeightsEnum):
            IMAGENET1K_V1 = Weights(url="https://example.invalid/tiny.pth",
                                    meta={"categories": ["a", "b"]})
            DEFAULT = IMAGENET1K_V1


        def _tiny(weights, progress, **kwargs):
            if weights is not None:
                _ovewrite_named_param(kwargs, "num_classes", len(weights.meta["categories"]))
            model = Tiny(**kwargs)
            if weights is not None:
                model.load_state_dict(weights.get_state_dict(progress=progress))
            return model


        @register_model()
        @handle_legacy_interface(weights=("pretrained", Tiny_Weights.IMAGENET1K_V1))
        def tiny(*, weights=None, progress=True, **kwargs):
            """A tiny model.

            Args:
                weights: the pretrained weights.
            """
            weights = Tiny_Weights.verify(weights)
            return _tiny(weights, progress, **kwargs)
    ''',
}

USER = '''\
import torch.nn as nn
import torchvision


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torchvision.models.tiny(weights=None, num_classes=4)
        self.body.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.body.pool = nn.AdaptiveMaxPool2d(1)
        self.body.classifier[1] = nn.Linear(8, 3)

    def forward(self, x):
        return self.body(x)
'''


@pytest.fixture
def fake_torchvision(tmp_path, monkeypatch):
    root = tmp_path / "site"
    for rel, text in FAKE.items():
        (root / "torchvision" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "torchvision" / rel).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    for cache in (package_code.package_dir, package_code.generate):
        cache.cache_clear()
    yield root
    for cache in (package_code.package_dir, package_code.generate):
        cache.cache_clear()
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]


def _todos(code: str) -> list[str]:
    return [line.strip() for line in code.splitlines() if "TODO(torch2jax)" in line]


def test_builder_followed_and_edits_converted(fake_torchvision, tmp_path):
    result = convert_source(USER, path=str(tmp_path / "net.py"))
    assert result.todos == 0, result.code
    assert _todos(result.code) == []
    code = result.code
    assert "from _torchvision.models.tiny import tiny\n" in code
    assert "import torchvision" not in code
    assert "self.body = tiny(num_classes=4, rngs=rngs)" in code
    assert "self.body.conv = nnx.Conv(" in code  # channels-last, as the model's own conv
    assert "self.body.pool = nnx.static(" in code  # a function where a layer was
    assert "self.body.classifier.layers[1] = nnx.Linear(8, 3, rngs=rngs)" in code
    assert sorted(result.files) == [
        "_torchvision/__init__.py", "_torchvision/models/__init__.py",
        "_torchvision/models/_utils.py", "_torchvision/models/tiny.py",
        "_torchvision/ops/__init__.py", "_torchvision/ops/misc.py"]  # not utils.py
    header, tiny = result.files["_torchvision/models/tiny.py"].split("\n", 2)[::2]
    assert header.startswith("# Generated by torch2jax from torchvision")
    for gone in ("Weights", "register_model", "handle_legacy_interface", "_log_api_usage_once",
                 "weights=", "weights,", "progress", "_ovewrite_named_param", "import torch"):
        assert gone not in tiny, gone
    assert "def tiny(*, rngs: nnx.Rngs, **kwargs):" in tiny
    assert '"""A tiny model. (torch2jax: without pretrained weights)"""' in tiny
    assert "from ..ops.misc import ConvBN" in tiny and "from ._utils import _make_divisible" in tiny
    utils = result.files["_torchvision/models/_utils.py"]
    assert "def _make_divisible" in utils and "handle_legacy_interface" not in utils
    assert "class Unused" not in result.files["_torchvision/ops/misc.py"]


def test_converted_package_model_runs_and_verifies(fake_torchvision, tmp_path):
    from torch2jax.verify.run import VerifyRequest, run_request

    src = tmp_path / "src"
    src.mkdir()
    (src / "net.py").write_text(USER)
    result = run_request(VerifyRequest(f"{src / 'net.py'}::Net", inputs=("float32[2,3,8,8]",),
                                       grad=True))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    grads = {c.split()[1] for c in result.compared if c.startswith("grad ")}
    assert {"body.conv.weight", "body.stem.0.weight", "body.stem.1.weight",
            "body.classifier.1.weight"} <= grads
    assert "body.conv.bias" not in grads  # the replacement has no bias
    # the converted file and its _torchvision run without torch, torchvision or torch2jax
    out = tmp_path / "out"
    converted = convert_source(USER, path=str(out / "net.py"))
    for rel, code in {"net.py": converted.code, **converted.files}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(code)
    run = subprocess.run(
        [sys.executable, "-c", ("import sys; sys.modules.update(torch=None, torchvision=None, "
                                "torch2jax=None)\nimport jax.numpy as jnp\nfrom flax import nnx\n"
                                "from net import Net\n"
                                "print(Net(rngs=nnx.Rngs(0))(jnp.ones((2, 3, 8, 8))).shape)")],
        cwd=out, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(2, 3)"


def test_unconvertible_edits_are_marked(fake_torchvision):
    source = USER.replace("self.body.pool = nn.AdaptiveMaxPool2d(1)",
                          "self.body.conv = nn.Linear(8, 8)\n"
                          "        self.body.stem[0] = nn.Conv2d(3, 8, 1)\n"
                          "        feats = nn.Sequential(*list(self.body.children())[:-1])")
    result = convert_source(source)
    lines = source.splitlines()
    marked = {d.line: d.message for d in result.diagnostics if d.rule == "package-model"}
    assert sorted(marked) == [10, 11, 12]
    assert "torch inputs where the converted model calls conv with channels_last" in marked[10]
    assert lines[10].strip().startswith("self.body.stem[0]")
    assert "not an nn.Sequential of layers" in marked[11]
    assert "children()" in marked[12]
    assert "self.body.conv = nnx.Conv(" in result.code  # the good edit still converts


def test_pretrained_weights_marked(fake_torchvision):
    source = USER.replace("import torchvision\n", "from torchvision.models import tiny, "
                          "Tiny_Weights\n").replace(
        "torchvision.models.tiny(weights=None, num_classes=4)",
        "tiny(weights=Tiny_Weights.DEFAULT, num_classes=4)")
    result = convert_source(source)
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert [(d.line, d.rule) for d in errors] == [(8, "package-model")]
    assert errors[0].message.startswith("weights=Tiny_Weights.DEFAULT: pretrained weights are "
                                        "not loaded")
    assert "torch2jax weights" in errors[0].message
    assert "self.body = tiny(num_classes=4, rngs=rngs)" in result.code
    assert "Tiny_Weights" not in result.code.replace("weights=Tiny_Weights.DEFAULT:", "")
    assert "from torchvision" not in result.code


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_other_targets_mark_the_lines(fake_torchvision, target):
    result = convert_source(USER, target=target)
    marked = sorted((d.line, d.message.split(":")[0]) for d in result.diagnostics
                    if d.rule == "package-model")
    assert marked[0] == (8, "torchvision.models.tiny")
    assert "flax NNX only" in next(d.message for d in result.diagnostics if d.line == 8)
    assert [line for line, _ in marked[1:]] == [9, 10, 11]  # the edits of that model
    assert "torchvision.models.tiny(weights=None, num_classes=4)" in result.code


def test_not_installed_marks_the_line(monkeypatch):
    monkeypatch.setattr(package_models, "package_dir", lambda top: None)
    result = convert_source(USER)
    by_line = {d.line: d.message for d in result.diagnostics if d.rule == "package-model"}
    assert sorted(by_line) == [8, 9, 10, 11]
    assert "torchvision is not installed where torch2jax runs" in by_line[8]
    assert by_line[9].startswith("edits the model built at line 8")
    assert "torchvision.models.tiny(weights=None, num_classes=4)" in result.code
    assert "import torchvision" in result.code


def test_timm_models_are_marked():
    source = ("import timm\nimport torch.nn as nn\n\n\nclass Net(nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n"
              "        self.m = timm.create_model('resnet18', pretrained=False)\n")
    result = convert_source(source)
    (d,) = [d for d in result.diagnostics if d.severity == "error"]
    assert (d.line, d.rule) == (8, "timm.create_model")
    assert "timm's models are not followed" in d.message


def test_files_without_package_models_are_untouched():
    assert package_models.prepare("import torch\nx = torch.ones(2)\n", path="a.py",
                                  target="nnx", convert=convert_source) is None


@pytest.mark.parametrize(("source", "may"), [
    ("import torchvision\nm = torchvision.models.resnet18()\n", True),
    ("import torchvision as tv\nm = tv.models.resnet18()\n", True),
    ("from torchvision import models\nm = models.resnet18()\n", True),
    ("from torchvision import (\n    datasets,\n    models,\n)\n", True),
    ("from torchvision.models import resnet18\n", True),
    ("import torchvision.models as tvm\n", True),
    ("def build():\n    import timm\n    return timm.create_model('x')\n", True),
    # torchvision's transforms and utils only (the diffusion trainer's imports): not parsed
    ("from torchvision import transforms as T, utils\nmodels = {}\n", False),
    ("import torch\nbest_models = []\n", False),
])
def test_which_files_are_searched_for_package_models(source: str, may: bool) -> None:
    assert package_models._may_reference_models(source) is may
