"""Containers and module classes of timm's model code (benchmarks/timm_sweep.py,
docs/timm-sweep.md), each on a model of our own written that way, converted, built and
verified against torch (outputs and gradients, in float64, the pass that decides):

* a stage registering its blocks by computed names (timm's regnet ``RegStage``:
  ``self.add_module("b{}".format(i + 1), block_fn(...))`` in a loop, ``block_fn`` a parameter
  defaulting to a block class of the file), run by ``for block in self.children()``: every
  child is an NNX module assigned in torch's order, so the children are the modules the
  instance holds (the ``torch_named_children`` walk); it was marked, "layers registered by
  name", and failed with "'RegStage' object has no attribute 'children'";
* a Sequential of the stages a builder object of another module of the package returns
  (timm's efficientnet: ``builder = EfficientNetBuilder(...)``, then
  ``self.blocks = nn.Sequential(*builder(stem_size, block_args))``, its ``__call__`` returning
  a list of ``nn.Sequential(*blocks)``): the stages keep torch's layout, as every layer that
  module builds, so the Sequential is an ``nnx.Sequential`` of them (it was marked, "mixing
  channels-last layers ... in an order not known statically", and kept torch's: "flax.nnx.
  helpers.Sequential is not a Module subclass").
"""

from __future__ import annotations

import textwrap

from model_cases import verified_file

from torch2jax.verify.run import VerifyRequest, run_request

BY_NAME = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, in_chs, out_chs, stride=1):
            super().__init__()
            self.conv = nn.Conv2d(in_chs, out_chs, 3, stride=stride, padding=1)
            self.bn = nn.BatchNorm2d(out_chs)
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))


    class Stage(nn.Module):
        def __init__(self, depth, in_chs, out_chs, stride, block_fn=Block):
            super().__init__()
            self.grad_checkpointing = False
            for i in range(depth):
                name = "b{}".format(i + 1)
                self.add_module(name, block_fn(in_chs if i == 0 else out_chs, out_chs,
                                               stride=stride if i == 0 else 1))

        def forward(self, x):
            for block in self.children():
                x = block(x)
            return x


    class Net(nn.Module):
        def __init__(self, widths=(6,)):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, padding=1)
            prev = 4
            for i, w in enumerate(widths):
                # the blocks' order matters: b1 changes the width, b2 keeps it
                setattr(self, f"s{i + 1}", Stage(2, prev, w, 2))
                prev = w
            self.head = nn.Linear(prev, 5)

        def forward(self, x):
            x = self.stem(x)
            x = self.s1(x)
            return self.head(x.mean((2, 3)))
''')


def test_children_of_blocks_registered_by_computed_names(tmp_path):
    result = verified_file(tmp_path, BY_NAME, "Net", "float32[2,3,8,8]")
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


STAGE_BUILDER = textwrap.dedent('''
    import torch.nn as nn


    class ConvBnAct(nn.Module):
        def __init__(self, cin, cout, stride=1):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            return self.bn(self.conv(x)).relu()


    class StageBuilder:
        def __init__(self, round_fn=int):
            self.round_fn = round_fn
            self.features = []

        def _make_block(self, cin, cout, stride):
            return ConvBnAct(cin, self.round_fn(cout), stride)

        def __call__(self, cin, stage_args):
            stages = []
            for widths in stage_args:
                blocks = []
                for i, w in enumerate(widths):
                    blocks.append(self._make_block(cin, w, 2 if i == 0 else 1))
                    cin = w
                self.features.append(cin)
                stages.append(nn.Sequential(*blocks))
            return stages
''')

STAGES_NET = textwrap.dedent('''
    import torch.nn as nn

    from ._builder import StageBuilder


    class Net(nn.Module):
        def __init__(self, num_classes=4):
            super().__init__()
            self.conv_stem = nn.Conv2d(3, 4, 3, padding=1)
            builder = StageBuilder()
            self.blocks = nn.Sequential(*builder(4, [[6], [8]]))
            self.head = nn.Linear(builder.features[-1], num_classes)

        def forward(self, x):
            x = self.blocks(self.conv_stem(x))
            return self.head(x.mean((2, 3)))
''')


def test_a_sequential_of_the_stages_a_builder_object_returns(tmp_path):
    pkg = tmp_path / "tinypkg_stages"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "_builder.py").write_text(STAGE_BUILDER)
    (pkg / "models" / "net.py").write_text(STAGES_NET)
    result = run_request(VerifyRequest(f"{pkg / 'models' / 'net.py'}::Net",
                                       inputs=("float32[2,3,8,8]",), float64=True))
    assert result.error is None, result.error
    assert result.passed, result.reason
    assert result.max_abs_diff is not None and result.grad_max_abs_diff is not None


ACT_BY_NAME = textwrap.dedent('''
    import torch.nn as nn


    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = nn.Linear(d, d)

        def forward(self, x):
            return self.fc(x)


    class Stage(nn.Module):
        def __init__(self, d, act_layer=nn.ReLU):
            super().__init__()
            for i in range(2):
                self.add_module(f"b{i}", Block(d))
            self.add_module("act", act_layer())

        def forward(self, x):
            for layer in self.children():
                x = layer(x)
            return x
''')


def test_children_registered_by_name_with_an_activation_stay_marked():
    # the activation is a JAX function in NNX, not a module the walk would find: marked
    from torch2jax.convert import convert_source

    result = convert_source(ACT_BY_NAME, path="stage.py")
    lines = ACT_BY_NAME.splitlines()
    errors = [(d.line, d.message) for d in result.diagnostics if d.severity == "error"]
    assert any("self.children()" in lines[n - 1] and "registered by name" in msg
               for n, msg in errors), errors
    assert "torch_named_children" not in result.code
