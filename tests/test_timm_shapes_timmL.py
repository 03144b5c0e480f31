"""Shapes of timm's models (benchmarks/timm_sweep.py, docs/timm-sweep.md, issue 34: converted
layer classes and their attributes), each on a model of our own written that way, converted,
built and verified against torch (outputs and gradients).

* a subclass of ``nn.Conv2d`` whose forward computes its own weight from ``self.weight``
  (weight standardisation: timm's ``StdConv2d`` / ``ScaledStdConv2d``, BiT's) and convolves
  with it by the layer's own geometry, ``F.conv2d(x, w, self.bias, self.stride, self.padding,
  self.dilation, self.groups)``: the class derives from the Conv2d helper (torch's signature,
  ``weight`` in torch's layout) and the call is the helper's ``_conv_forward`` (it was marked,
  "subclass of the torch layer torch.nn.Conv2d: its parameters and forward are not
  translated", its ``super().__init__`` dropped, and the build failed: "'StdConv2d' object has
  no attribute 'weight'"). A subclass that calls ``F.conv2d`` over its own weight unchanged is
  the helper's call.
* ``F.batch_norm`` without running statistics (``training=True``): timm's ``ScaledStdConv2d``
  standardises its weight so (it had no rule, "no rule for torch.nn.functional.batch_norm").
"""

from __future__ import annotations

import textwrap

from torch2jax.convert import convert_source
from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch (forward and
    gradients, float32 then float64) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


STD_CONV = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class StdConv2d(nn.Conv2d):
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                     dilation=1, groups=1, bias=True, eps=1e-6):
            super().__init__(in_channels, out_channels, kernel_size, stride=stride,
                             padding=padding, dilation=dilation, groups=groups, bias=bias)
            self.eps = eps

        def forward(self, x):
            w = self.weight
            m = w.mean(dim=(1, 2, 3), keepdim=True)
            v = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
            w = (w - m) / torch.sqrt(v + self.eps)
            return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation,
                            self.groups)


    class ScaledStdConv2d(nn.Conv2d):
        def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=None,
                     gamma=1.0, eps=1e-6, gain_init=1.0):
            if padding is None:
                padding = ((stride - 1) + (kernel_size - 1)) // 2
            super().__init__(in_channels, out_channels, kernel_size, stride=stride,
                             padding=padding, bias=True)
            self.scale = gamma * self.weight[0].numel() ** -0.5
            self.eps = eps
            self.gain_init = gain_init
            self.gain = nn.Parameter(torch.empty((self.out_channels, 1, 1, 1)))
            self.reset_parameters()

        def reset_parameters(self):
            if hasattr(self, 'gain'):
                torch.nn.init.constant_(self.gain, self.gain_init)
                super().reset_parameters()

        def forward(self, x):
            weight = F.batch_norm(
                self.weight.reshape(1, self.out_channels, -1), None, None,
                weight=(self.gain * self.scale).view(-1), training=True, momentum=0.,
                eps=self.eps).reshape_as(self.weight)
            return F.conv2d(x, weight, self.bias, self.stride, self.padding, self.dilation,
                            self.groups)


    class PlainConv(nn.Conv2d):
        def forward(self, x):
            return F.relu(F.conv2d(x, self.weight, self.bias, self.stride, self.padding,
                                   self.dilation, self.groups))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = StdConv2d(3, 4, 3, stride=2, padding=1)
            self.b = StdConv2d(4, 4, (3, 1), padding="same", dilation=2, groups=2, bias=False)
            self.s = ScaledStdConv2d(4, 4, 3, gain_init=1.5)
            self.c = PlainConv(4, 6, 1)
            self.fc = nn.Linear(6, 5)

        def forward(self, x):
            x = self.c(self.s(self.b(self.a(x))))
            return self.fc(x.mean((2, 3)))
''')


def test_weight_standardised_conv_subclass(tmp_path):
    code = convert_source(STD_CONV).code
    assert "class StdConv2d(Conv2d):" in code and "TODO(torch2jax)" not in code
    assert "self._conv_forward(x, w, self.bias)" in code
    _verifies(tmp_path, STD_CONV, "Net", "float32[2,3,9,8]")


def test_conv_subclass_padding_read_elsewhere_is_marked():
    """The helper keeps flax's padding (pairs): ``self.padding`` read outside ``F.conv2d`` over
    the layer's own geometry is marked, not given flax's value for torch's."""
    source = textwrap.dedent('''
        import torch.nn as nn
        import torch.nn.functional as F


        class Shifted(nn.Conv2d):
            def forward(self, x):
                w = self.weight * 2
                y = F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation,
                             self.groups)
                return y + self.padding[0]
    ''')
    result = convert_source(source, path="<subclass>")
    errors = [d.message for d in result.diagnostics if d.severity == "error"]
    assert errors == ["self.padding of torch.nn.Conv2d has no counterpart in nnx.Conv"], errors
    assert "y = self._conv_forward(x, w, self.bias)" in result.code


NAMED_INIT = textwrap.dedent('''
    import torch.nn as nn


    def init_named(m, n):
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.bias, 2.0 if n.endswith("head") else 1.0)


    def init_weights(model: nn.Module):
        for n, m in model.named_modules():
            init_named(m, n)


    def module_names(model):
        return [n for n, _ in model.named_modules()]


    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.norm = nn.LayerNorm(dim)

        def forward(self, x):
            return self.norm(self.fc(x))


    class Net(nn.Module):
        def __init__(self, dim=4):
            super().__init__()
            self.blocks = nn.Sequential(Block(dim), Block(dim))
            self.extra = nn.ModuleList([nn.Linear(dim, dim)])
            self.head = nn.Linear(dim, 3)
            init_weights(self)

        def forward(self, x):
            return self.head(self.extra[0](self.blocks(x)))
''')


def test_named_modules_walk_keeps_torchs_names(tmp_path):
    """``model.named_modules()`` of a converted model (timm's ``efficientnet_init_weights``:
    ``for n, m in model.named_modules(): init_fn(m, n)``, rexnet's build): torch's walk, the
    names torch gives the modules, and an init chosen by name sets what torch's sets (it was
    marked and left torch's: "'RexNet' object has no attribute 'named_modules'")."""
    import numpy as np
    from flax import nnx

    from torch2jax.verify.load import load_module

    (tmp_path / "named_torch.py").write_text(NAMED_INIT)
    ns_torch = load_module(tmp_path / "named_torch.py", prefix="torch2jax_test_timmL")
    torch_model = ns_torch.Net()
    code = convert_source(NAMED_INIT).code
    assert "torch_named_modules(model)" in code and "TODO(torch2jax)" not in code
    (tmp_path / "named_jax.py").write_text(code)
    ns = load_module(tmp_path / "named_jax.py", prefix="torch2jax_test_timmL")
    jax_model = ns.Net(rngs=nnx.Rngs(0))
    assert ns.module_names(jax_model) == ns_torch.module_names(torch_model)
    for name, layer in torch_model.named_modules():
        if hasattr(layer, "bias") and name.split(".")[-1] in ("fc", "head", "0"):
            jax_layer = jax_model
            for part in name.split("."):
                jax_layer = (jax_layer.layers[int(part)] if isinstance(jax_layer, nnx.Sequential)
                             else jax_layer[int(part)] if part.isdigit() else
                             getattr(jax_layer, part))
            np.testing.assert_array_equal(np.asarray(jax_layer.bias[...]),
                                          layer.bias.detach().numpy())
