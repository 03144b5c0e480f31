"""Shapes of timm's model code that construct modules (benchmarks/timm_sweep.py,
docs/timm-sweep.md, the eighth run's "constructing modules"), each on a model of our own
written that way, converted, built and verified against torch (outputs and gradients):

* a block class handed to a stage-building function of the file (timm's volo:
  ``outlooker_blocks(Outlooker, i, dim, ...)``, whose loop calls ``block_fn(dim, ...)``): the
  call builds a module and takes ``rngs`` (it failed with "Outlooker.__init__() missing 1
  required keyword-only argument: 'rngs'").
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request


def _verifies(tmp_path, source: str, entry: str, *inputs: str):
    """``source`` written as a file, its class ``entry`` verified against torch (forward and
    gradients) on ``inputs``: the result, which passed."""
    (tmp_path / "model.py").write_text(source)
    result = run_request(VerifyRequest(f"{tmp_path / 'model.py'}::{entry}", inputs=inputs))
    assert result.error is None, result.error
    assert result.passed, result.reason
    return result


STAGE_FUNCTIONS = textwrap.dedent('''
    import torch.nn as nn


    class Outlook(nn.Module):
        def __init__(self, dim, mlp_ratio=2.0):
            super().__init__()
            self.fc1 = nn.Linear(dim, int(dim * mlp_ratio))
            self.fc2 = nn.Linear(int(dim * mlp_ratio), dim)

        def forward(self, x):
            return x + self.fc2(self.fc1(x).tanh())


    class Mixer(nn.Module):
        def __init__(self, dim, heads, mlp_ratio=2.0):
            super().__init__()
            self.heads = heads
            self.fc = nn.Linear(dim, dim)

        def forward(self, x):
            return x + self.fc(x).sigmoid()


    def outlook_blocks(block_fn, index, dim, layers, mlp_ratio=2.0):
        blocks = []
        for _ in range(layers[index]):
            blocks.append(block_fn(dim, mlp_ratio=mlp_ratio))
        return nn.Sequential(*blocks)


    def mixer_blocks(block_fn, index, dim, layers, heads):
        return nn.Sequential(*[block_fn(dim, heads) for _ in range(layers[index])])


    class Net(nn.Module):
        def __init__(self, dim=6, layers=(2, 1), num_classes=3):
            super().__init__()
            stages = []
            for i in range(len(layers)):
                if i == 0:
                    stages.append(outlook_blocks(Outlook, i, dim, layers, mlp_ratio=1.5))
                else:
                    stages.append(mixer_blocks(block_fn=Mixer, index=i, dim=dim, layers=layers,
                                               heads=2))
            self.network = nn.ModuleList(stages)
            self.head = nn.Linear(dim, num_classes)

        def forward(self, x):
            for stage in self.network:
                x = stage(x)
            return self.head(x)
''')


def test_a_block_class_handed_to_a_stage_function_takes_rngs(tmp_path):
    _verifies(tmp_path, STAGE_FUNCTIONS, "Net", "float32[2,6]")
