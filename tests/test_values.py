"""The value analysis (torch2jax/analysis/values.py): what each expression of a file holds."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from torch2jax.analysis.metadata import ALL, FileMetadata
from torch2jax.analysis.values import Kind, ValueFacts

SOURCE = textwrap.dedent('''
    import argparse
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import wandb
    from dataclasses import dataclass
    from torch.utils.data import DataLoader


    @dataclass
    class Config:
        n: int = 4


    class Net(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.fc = nn.Linear(config.n, 2)
            self.scale = nn.Parameter(torch.ones(2))
            self.bias = nn.Parameter(torch.zeros(2)) if config.n else None

        def forward(self, x, mask=None):
            h = self.fc(x) * self.scale
            return h

        def count(self):
            return sum(p.numel() for p in self.parameters())


    def helper(t):
        return t.sum()


    def get_batch(split):
        data = np.arange(10)
        ix = torch.randint(8, (4,))
        x = torch.stack([torch.from_numpy(data[i:i + 2]) for i in ix])
        return x, x


    parser = argparse.ArgumentParser()
    args = parser.parse_args()
    config = Config()
    model = Net(config)
    loader = DataLoader(None, batch_size=2)
    optimizer = torch.optim.AdamW(model.parameters())
    out = {}
    groups = optimizer.param_groups
    X, Y = get_batch('train')
    logits = model(X)
    size = logits.size()
    rows = logits.size(0)
    first, second = logits.chunk(2)
    total = 0
    total = total + F.mse_loss(logits, Y)
    for xb, yb in loader:
        pass
    for group in optimizer.param_groups:
        group['lr'] = args.lr
    name = "a,b".split(",")
    run = wandb.init()
    arr = np.zeros(3)
    helper(logits)
    print(args, config, model, loader, optimizer, out, groups, X, Y, logits, size, rows, first,
          total, xb, group, name, wandb, arr, parser)
''')

CASES = {
    "args": Kind.CONFIG, "config": Kind.CONFIG, "model": Kind.MODULE, "loader": Kind.LOADER,
    "optimizer": Kind.OPTIMIZER, "out": Kind.DICT, "groups": Kind.LIST, "X": Kind.TENSOR,
    "Y": Kind.TENSOR, "logits": Kind.TENSOR, "size": Kind.TUPLE, "rows": Kind.SCALAR,
    "first": Kind.TENSOR, "total": Kind.TENSOR, "xb": Kind.TENSOR, "group": Kind.DICT,
    "name": Kind.LIST, "wandb": Kind.OBJECT, "arr": Kind.OBJECT, "parser": Kind.OBJECT,
}


@pytest.fixture(scope="module")
def facts():
    wrapper = FileMetadata(cst.parse_module(SOURCE))
    wrapper.resolve_many(ALL)
    facts = ValueFacts(wrapper, {"Net"}, lambda q: q == "torch.nn.Linear")
    # the reads of the last statement, print(args, config, ...)
    last = wrapper.module.body[-1].body[0].value
    reads = {a.value.value: a.value for a in last.args}
    return facts, reads, wrapper.module


@pytest.mark.parametrize("name", sorted(CASES))
def test_kind_of_a_name(facts, name: str) -> None:
    values, reads, _ = facts
    assert values.kind(reads[name]) == CASES[name]


def test_kinds_inside_functions_and_classes(facts) -> None:
    values, _, module = facts
    net = next(s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == "Net")
    forward = next(s for s in net.body.body if isinstance(s, cst.FunctionDef)
                   and s.name.value == "forward")
    x, mask = forward.params.params[1:]
    assert values.kind(x.name) == Kind.TENSOR  # forward's arguments
    assert values.may_be_none(mask.name)  # mask=None
    assert not values.may_be_none(x.name)
    helper = next(s for s in module.body if isinstance(s, cst.FunctionDef)
                  and s.name.value == "helper")
    # an argument: the call site passes a tensor
    assert values.kind(helper.params.params[0].name) == Kind.TENSOR
    h = forward.body.body[0].body[0]
    assert values.kind(h.value) == Kind.TENSOR  # self.fc(x) * self.scale
    init = net.body.body[0]
    bias_value = init.body.body[-1].body[0].value
    assert values.kind(bias_value) == Kind.TENSOR  # Parameter(...) if ... else None
    bias_target = init.body.body[-1].body[0].targets[0].target
    assert values.may_be_none(bias_target)
    scale_target = init.body.body[-2].body[0].targets[0].target
    assert not values.may_be_none(scale_target)
