"""Shapes of timm's model code that pass ``rngs`` to what they call, or do not
(benchmarks/timm_sweep.py, docs/timm-sweep.md, the twelfth run's "rngs plumbing"), each on a
model of our own written that way, converted, built and verified against torch (outputs and
gradients, in float64, the pass that decides):

* an init function chosen at run time, a parameter defaulting to a function of the file that
  draws (timm's ``efficientnet_init_weights(model, init_fn=None)``: ``init_fn = init_fn or
  _init_weight_goog``, then ``init_fn(m, n)`` over ``model.named_modules()``, called from
  rexnet's ``__init__`` in another module): the function takes ``rngs`` (a local it calls may
  hold a function that draws) and calls the local through ``call_with_rngs``, which passes
  them where the function takes them; the local was called without them
  ("_init_weight_goog() missing 1 required keyword-only argument: 'rngs'"). A caller's own
  init function that does not draw is called without them.
* a method of a child layer whose class comes from another module of the package, not known
  where it is called (timm's byobnet ``SelfAttnBlock.init_weights``: ``self.self_attn.
  reset_parameters()``, ``self_attn`` built from a config field holding timm.layers'
  ``HaloAttn``, whose ``reset_parameters`` draws): a converted module's methods taking ``rngs``
  are known to the modules converted after it, so the caller takes ``rngs`` and calls the
  method through ``call_with_rngs`` (a class whose method does not draw gets none); it was
  called without them ("HaloAttn.reset_parameters() missing 1 required keyword-only
  argument: 'rngs'"); likewise a loop over a tuple of children (byobnet's ``for attn in
  (self.attn, self.attn_last): attn.reset_parameters()``).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

INIT_HELPERS = textwrap.dedent('''
    import math

    import torch.nn as nn


    class ConvAct(nn.Module):
        def __init__(self, in_chs, out_chs):
            super().__init__()
            self.conv = nn.Conv2d(in_chs, out_chs, 3, padding=1)
            self.bn = nn.BatchNorm2d(out_chs)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))


    def _init_weight_std(m, n='', fix_group_fanout=True):
        if isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            if fix_group_fanout:
                fan_out //= m.groups
            nn.init.normal_(m.weight, 0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            init_range = 1.0 / math.sqrt(m.weight.size(0))
            nn.init.uniform_(m.weight, -init_range, init_range)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


    def init_all(model, init_fn=None):
        init_fn = init_fn or _init_weight_std
        for n, m in model.named_modules():
            init_fn(m, n)
''')

def _package(pkg, model: str, layers: dict[str, str]):
    """A package of timm's layout at ``pkg``: ``layers/<name>.py`` for each of ``layers``
    and ``models/net.py`` holding ``model``."""
    for sub in (pkg, pkg / "layers", pkg / "models"):
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "__init__.py").write_text("")
    for name, text in layers.items():
        (pkg / "layers" / f"{name}.py").write_text(text)
    (pkg / "models" / "net.py").write_text(model)
    return pkg


def _verifies_package(pkg, entry: str, *inputs: str):
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::{entry}", inputs=inputs,
                                       float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


ATTN_LAYERS = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.nn.init import trunc_normal_


    class HaloLike(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.q = nn.Linear(dim, dim, bias=False)
            self.rel = nn.Parameter(torch.empty(dim))
            self.reset_parameters()

        def reset_parameters(self):
            trunc_normal_(self.q.weight, std=0.1)
            trunc_normal_(self.rel, std=0.1)

        def forward(self, x):
            return self.q(x) + self.rel


    class ScaleLike(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.scale = nn.Parameter(torch.empty(dim))
            self.reset_parameters()

        def reset_parameters(self):
            nn.init.ones_(self.scale)

        def forward(self, x):
            return x * self.scale
''')

MODEL = textwrap.dedent('''
    import torch.nn as nn

    from ..layers.attn import HaloLike, ScaleLike
    from ..layers.helpers import ConvAct, init_all


    def _init_plain(m, n=''):
        if isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


    class Block(nn.Module):
        def __init__(self, dim, attn_layer=None):
            super().__init__()
            self.fc = nn.Linear(dim, dim)
            self.attn = attn_layer(dim)
            self.attn_last = attn_layer(dim)

        def init_weights(self, zero_init_last=False):
            if zero_init_last:
                nn.init.zeros_(self.fc.bias)
            if hasattr(self.attn, 'reset_parameters'):
                self.attn.reset_parameters()
            for attn in (self.attn, self.attn_last):
                if hasattr(attn, 'reset_parameters'):
                    attn.reset_parameters()

        def forward(self, x):
            return self.attn_last(self.attn(self.fc(x)))


    class Net(nn.Module):
        def __init__(self, chs=4, num_classes=3):
            super().__init__()
            self.stem = ConvAct(3, chs)
            self.conv = ConvAct(chs, chs)
            self.block1 = Block(chs, attn_layer=HaloLike)
            self.block2 = Block(chs, attn_layer=ScaleLike)
            self.head = nn.Linear(chs, num_classes)
            init_all(self)
            init_all(self.conv, init_fn=_init_plain)
            self.block1.init_weights()
            self.block2.init_weights(zero_init_last=True)

        def forward(self, x):
            x = self.conv(self.stem(x)).mean((2, 3))
            return self.head(self.block2(self.block1(x)))
''')


def test_init_function_and_child_method_from_other_modules(tmp_path):
    pkg = _package(tmp_path / "qinitpkg", MODEL, {"helpers": INIT_HELPERS, "attn": ATTN_LAYERS})
    _verifies_package(pkg, "Net", "float32[2,3,8,8]")
