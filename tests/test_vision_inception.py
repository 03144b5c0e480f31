"""torchvision's googlenet / inception_v3 constructs, in a small model written here (no
torchvision): ``BasicConv2d`` (``nn.Conv2d(cin, cout, bias=False, **kwargs)``), module classes
picked from a list (``conv_block = blocks[0]``), branches concatenated along the channel axis,
``F.max_pool2d`` / ``F.avg_pool2d`` on NCHW input, a ceil-mode ``nn.MaxPool2d`` inside a
Sequential with a torch-layout block, auxiliary heads (``self.AuxLogits: Optional[nn.Module] =
None`` then a layer), ``transform_input``, namedtuple outputs with ``torch.jit.unused`` /
``torch.jit.is_scripting()`` / ``eager_outputs``, and the init loop over ``self.modules()``
with ``isinstance(m, nn.Conv2d) or isinstance(m, nn.Linear)`` and ``hasattr(m, "stddev")``.

Forward outputs (eval mode) and every parameter's gradient are compared with torch
(``torch2jax.verify``); the auxiliary head's parameters exist on both sides and transfer.
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
    import warnings
    from collections import namedtuple
    from typing import Any, Callable, Optional

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch import Tensor

    Outputs = namedtuple("Outputs", ["logits", "aux_logits"])
    Outputs.__annotations__ = {"logits": Tensor, "aux_logits": Optional[Tensor]}


    class BasicConv2d(nn.Module):
        def __init__(self, in_channels: int, out_channels: int, **kwargs: Any) -> None:
            super().__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
            self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

        def forward(self, x: Tensor) -> Tensor:
            x = self.conv(x)
            x = self.bn(x)
            return F.relu(x, inplace=True)


    class Mixed(nn.Module):
        """inception_v3's InceptionA/E and googlenet's Inception: parallel branches, one a pair
        of (1, 3) / (3, 1) convolutions concatenated, pooled branches, torch.cat on axis 1."""

        def __init__(self, in_channels: int, pool_features: int,
                     conv_block: Optional[Callable[..., nn.Module]] = None) -> None:
            super().__init__()
            if conv_block is None:
                conv_block = BasicConv2d
            self.branch1x1 = conv_block(in_channels, 4, kernel_size=1)
            self.branch3x3_1 = conv_block(in_channels, 3, kernel_size=1)
            self.branch3x3_2a = conv_block(3, 2, kernel_size=(1, 3), padding=(0, 1))
            self.branch3x3_2b = conv_block(3, 2, kernel_size=(3, 1), padding=(1, 0))
            self.branch_pool = conv_block(in_channels, pool_features, kernel_size=1)
            self.branch_max = nn.Sequential(
                nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True),
                conv_block(in_channels, 2, kernel_size=1),
            )

        def _forward(self, x: Tensor) -> list[Tensor]:
            branch1x1 = self.branch1x1(x)
            branch3x3 = self.branch3x3_1(x)
            branch3x3 = [self.branch3x3_2a(branch3x3), self.branch3x3_2b(branch3x3)]
            branch3x3 = torch.cat(branch3x3, 1)
            branch_pool = F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)
            branch_pool = self.branch_pool(branch_pool)
            outputs = [branch1x1, branch3x3, branch_pool, self.branch_max(x)]
            return outputs

        def forward(self, x: Tensor) -> Tensor:
            outputs = self._forward(x)
            return torch.cat(outputs, 1)


    class Reduction(nn.Module):
        """InceptionB/D: a strided convolution next to F.max_pool2d."""

        def __init__(self, in_channels: int, conv_block=None) -> None:
            super().__init__()
            if conv_block is None:
                conv_block = BasicConv2d
            self.branch3x3 = conv_block(in_channels, 8, kernel_size=3, stride=2)

        def forward(self, x: Tensor) -> Tensor:
            branch_pool = F.max_pool2d(x, kernel_size=3, stride=2)
            return torch.cat([self.branch3x3(x), branch_pool], 1)


    class Aux(nn.Module):
        """InceptionAux: stddev attributes read by the model's init loop."""

        def __init__(self, in_channels: int, num_classes: int, conv_block=None) -> None:
            super().__init__()
            if conv_block is None:
                conv_block = BasicConv2d
            self.conv0 = conv_block(in_channels, 8, kernel_size=1)
            self.conv1 = conv_block(8, 8, kernel_size=(2, 1))
            self.conv1.stddev = 0.01  # type: ignore[assignment]
            self.fc = nn.Linear(8, num_classes)
            self.fc.stddev = 0.001  # type: ignore[assignment]

        def forward(self, x: Tensor) -> Tensor:
            x = F.avg_pool2d(x, kernel_size=3, stride=2)
            x = self.conv1(self.conv0(x))
            x = F.adaptive_avg_pool2d(x, (1, 1))
            return self.fc(torch.flatten(x, 1))


    class InceptionNet(nn.Module):
        __constants__ = ["aux_logits", "transform_input"]

        def __init__(self, num_classes: int = 5, aux_logits: bool = True,
                     transform_input: bool = True,
                     blocks: Optional[list[Callable[..., nn.Module]]] = None,
                     init_weights: Optional[bool] = None) -> None:
            super().__init__()
            if blocks is None:
                blocks = [BasicConv2d, Mixed, Reduction, Aux]
            if init_weights is None:
                warnings.warn("init_weights will change", FutureWarning)
                init_weights = True
            if len(blocks) != 4:
                raise ValueError(f"blocks length should be 4 instead of {len(blocks)}")
            conv_block = blocks[0]
            mixed = blocks[1]
            reduction = blocks[2]
            aux = blocks[3]
            self.aux_logits = aux_logits
            self.transform_input = transform_input
            self.stem = conv_block(3, 8, kernel_size=3, stride=2)
            self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
            self.mixed = mixed(8, pool_features=4)
            self.AuxLogits: Optional[nn.Module] = None
            if aux_logits:
                self.AuxLogits = aux(14, num_classes)
            self.reduce = reduction(14)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.dropout = nn.Dropout(p=0.5)
            self.fc = nn.Linear(22, num_classes)
            if init_weights:
                for m in self.modules():
                    if isinstance(m, nn.Conv2d) or isinstance(m, nn.Linear):
                        stddev = float(m.stddev) if hasattr(m, "stddev") else 0.1
                        torch.nn.init.trunc_normal_(m.weight, mean=0.0, std=stddev, a=-2, b=2)
                    elif isinstance(m, nn.BatchNorm2d):
                        nn.init.constant_(m.weight, 1)
                        nn.init.constant_(m.bias, 0)

        def _transform_input(self, x: Tensor) -> Tensor:
            if self.transform_input:
                x_ch0 = torch.unsqueeze(x[:, 0], 1) * (0.229 / 0.5) + (0.485 - 0.5) / 0.5
                x_ch1 = torch.unsqueeze(x[:, 1], 1) * (0.224 / 0.5) + (0.456 - 0.5) / 0.5
                x_ch2 = torch.unsqueeze(x[:, 2], 1) * (0.225 / 0.5) + (0.406 - 0.5) / 0.5
                x = torch.cat((x_ch0, x_ch1, x_ch2), 1)
            return x

        def _forward(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
            x = self.maxpool1(self.stem(x))
            x = self.mixed(x)
            aux: Optional[Tensor] = None
            if self.AuxLogits is not None:
                if self.training:
                    aux = self.AuxLogits(x)
            x = self.reduce(x)
            x = self.dropout(self.avgpool(x))
            x = torch.flatten(x, 1)
            return self.fc(x), aux

        @torch.jit.unused
        def eager_outputs(self, x: Tensor, aux: Optional[Tensor]) -> Outputs:
            if self.training and self.aux_logits:
                return Outputs(x, aux)
            else:
                return x  # type: ignore[return-value]

        def forward(self, x: Tensor) -> Outputs:
            x = self._transform_input(x)
            x, aux = self._forward(x)
            aux_defined = self.training and self.aux_logits
            if torch.jit.is_scripting():
                if not aux_defined:
                    warnings.warn("Scripted InceptionNet always returns an Outputs tuple")
                return Outputs(x, aux)
            else:
                return self.eager_outputs(x, aux)


    def inception_no_aux():
        """googlenet(aux_logits=False): no auxiliary head at all."""
        return InceptionNet(aux_logits=False, transform_input=False, init_weights=True)
''')

# name -> input spec: 21 x 19 -> stem 10 x 9 -> ceil-mode pool 5 x 4 (the last window overhangs
# on the first axis) -> reduction 2 x 1
MODELS = {"InceptionNet": "float32[2,3,21,19]", "inception_no_aux": "float32[2,3,21,19]"}


@pytest.fixture(scope="module")
def source_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("inception") / "inception_models.py"
    path.write_text(SOURCE)
    return path


@pytest.fixture(scope="module")
def converted():
    result = convert_source(SOURCE, path="inception_models.py")
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors)
    ns: dict = {}
    exec(compile(result.code, "<converted>", "exec"), ns)  # noqa: S102 - its conversion
    return result.code, ns


def test_converts_idiomatically(converted):
    code, _ = converted
    # BasicConv2d: the callers' torch keywords go to the Conv2d helper class (NCHW)
    assert "self.conv = Conv2d(in_channels, out_channels, bias=False, **kwargs, rngs=rngs)" in code
    # module classes picked from the list get rngs, like the ones named directly
    assert "self.mixed = mixed(8, pool_features=4, rngs=rngs)" in code
    assert "self.AuxLogits = aux(14, num_classes, rngs=rngs)" in code
    # an attribute first None, then a layer: data for NNX
    assert "self.AuxLogits: Optional[nnx.Module] = nnx.data(None)" in code
    # the namedtuple's annotations name JAX's array type
    assert '{"logits": jax.Array, "aux_logits": Optional[jax.Array]}' in code
    # the init loop writes the kernels (nnx names) of convolutions and linears alike
    assert "m.kernel.value = 0.0 + stddev * jax.random.truncated_normal(" in code
    assert "m.weight" not in code
    assert "import torch" not in code and "Tensor]" not in code


@pytest.mark.filterwarnings("ignore:init_weights will change")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_match(source_file, name):
    result = run_request(VerifyRequest(f"{source_file}::{name}", inputs=(MODELS[name],),
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert result.todos == 0
    grads = [c for c in result.compared if c.startswith("grad ")]
    # the auxiliary head exists in eval mode too: its parameters transfer (zero gradients)
    aux = [c for c in grads if c.startswith("grad AuxLogits.")]
    assert len(aux) == (8 if name == "InceptionNet" else 0), aux
    assert len(grads) >= 20


@pytest.mark.filterwarnings("ignore:init_weights will change")
def test_training_mode_returns_the_namedtuple(converted):
    """eager_outputs: in training mode (with the auxiliary head) the JAX model returns the
    namedtuple, as torch does; in eval mode the logits alone."""
    _, ns = converted
    model = ns["InceptionNet"](rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 21, 19)), jnp.float32)
    model.train()
    out = model(x)
    assert type(out).__name__ == "Outputs" and out.logits.shape == out.aux_logits.shape == (2, 5)
    model.eval()
    assert model(x).shape == (2, 5)


@pytest.mark.filterwarnings("ignore:init_weights will change")
def test_init_loop_reads_stddev_attributes(converted):
    """torch's init loop: trunc_normal_ with std 0.1, except layers carrying a stddev
    attribute (the auxiliary head's fc: 0.001); InceptionAux's conv1.stddev is set on the
    BasicConv2d, not on its Conv2d, so torch ignores it and so does the translation."""
    _, ns = converted
    model = ns["InceptionNet"](rngs=nnx.Rngs(0))
    assert abs(float(jnp.std(model.AuxLogits.fc.kernel.value)) - 0.001) < 4e-4
    assert abs(float(jnp.std(model.AuxLogits.conv1.conv.kernel.value)) - 0.1) < 0.03
    assert abs(float(jnp.std(model.mixed.branch_pool.conv.kernel.value)) - 0.1) < 0.05
    assert float(jnp.abs(model.stem.bn.scale.value - 1).max()) == 0


@pytest.mark.parametrize("torch_expr", [
    "F.max_pool2d(x, kernel_size=3, stride=2)",
    "F.max_pool2d(x, 3, 2, 1)",
    "F.max_pool2d(x, 2)",  # stride defaults to the kernel size
    "F.max_pool2d(x, 3, stride=2, ceil_mode=True)",
    "F.max_pool2d(x, (3, 1), (2, 3), ceil_mode=True)",
    "F.avg_pool2d(x, kernel_size=3, stride=1, padding=1)",
    "F.avg_pool2d(x, kernel_size=5, stride=3)",
    "F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True)",
    "F.avg_pool2d(x, 2, 3, padding=1, ceil_mode=True, count_include_pad=False)",
    "F.avg_pool2d(F.relu(x), 3, 2)",  # a compound input
])
@pytest.mark.parametrize("shape", [(2, 3, 11, 7), (1, 2, 8, 9)])
def test_functional_pooling_matches_torch(torch_expr, shape):
    source = ("import torch\nimport torch.nn.functional as F\n\n\n"
              f"def f(x):\n    return {torch_expr}\n")
    assert_function_matches_torch(source, np.random.default_rng(0).standard_normal(shape)
                                  .astype(np.float32))


def test_ceil_mode_pooling_of_an_expression_is_bound_once():
    """The overhang padding is computed from the input's shape: a compound input is read
    twice, so it is bound to a fresh name (evaluated once) and the pooling matches torch."""
    source = ("import torch.nn.functional as F\n\n\n"
              "def f(x):\n    return F.max_pool2d(x + 1, 3, 2, ceil_mode=True)\n")
    x = np.random.default_rng(0).standard_normal((1, 2, 8, 9)).astype(np.float32)
    result = assert_function_matches_torch(source, x)
    assert "pooled_input = x + 1" in result.code


def test_functional_pooling_in_linen_uses_linen_names():
    """linen has the same pooling functions (flax.linen as nn): no nnx import in its output."""
    source = ("import torch.nn.functional as F\n\n\n"
              "def f(x):\n    return F.max_pool2d(x, 3, 2, ceil_mode=True) + F.avg_pool2d(x, 2)\n")
    result = convert_source(source, path="<op>", target="linen")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.code
    assert "nn.max_pool(jnp.moveaxis(x, 1, -1)" in result.code
    assert "nn.avg_pool(jnp.moveaxis(x, 1, -1)" in result.code
    assert "nnx" not in result.code
    ns: dict = {}
    exec(result.code, ns)  # noqa: S102 - its conversion
    x = np.random.default_rng(0).standard_normal((1, 2, 7, 6)).astype(np.float32)
    want = (torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, ceil_mode=True)
            + torch.nn.functional.avg_pool2d(torch.from_numpy(x), 2)).numpy()
    np.testing.assert_allclose(np.asarray(ns["f"](jnp.asarray(x))), want, rtol=1e-6, atol=1e-6)


def test_functional_pooling_of_a_channels_last_layer_skips_the_round_trip(tmp_path):
    """F.max_pool2d(self.conv(x), 2): the convolution's output is pooled channels-last as it
    comes, one move back at the end."""
    path = tmp_path / "pooled.py"
    path.write_text(textwrap.dedent('''
        import torch.nn as nn
        import torch.nn.functional as F


        class Pooled(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3)

            def forward(self, x):
                return F.avg_pool2d(F.max_pool2d(self.conv(x), 2), 2, 1, padding=1)
    '''))
    code = convert_source(path.read_text(), path=str(path)).code
    assert "nnx.max_pool(self.conv(jnp.moveaxis(x, 1, -1)), window_shape=(2, 2)" in code
    assert code.count("jnp.moveaxis(") == 2, code
    result = run_request(VerifyRequest(f"{path}::Pooled", inputs=("float32[2,3,9,8]",),
                                       grad=True, atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
