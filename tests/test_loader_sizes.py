"""The sizes a program reads off its loaders (issue 28): ``len(loader)`` (batches) and
``len(loader.dataset)`` (examples), converted, run and compared with torch.

The shapes from the public VAE and super-resolution scripts: the dataset built inline by a
call (``DataLoader(make_data(n), ...)``), the loader shuffled (so the conversion makes it a
function of the epoch) and its sizes read inside ``train(epoch)``. Each variant prints the two
sizes and an epoch sum of the batches; the converted program must print the torch numbers.
"""

from __future__ import annotations

import contextlib
import io

import pytest

pytest.importorskip("torch")
pytest.importorskip("grain")

from torch2jax.convert import convert_source

HEAD = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_data(n):
    return TensorDataset(torch.arange(n, dtype=torch.float32).reshape(n, 1))

'''

BODIES = {
    "inline_dataset": '''
loader = DataLoader(make_data(70), batch_size=8, shuffle={shuffle})


def train(epoch):
    total = 0.0
    for (x,) in loader:
        total += x.sum().item()
    print(len(loader.dataset), len(loader), total)


for epoch in range(2):
    train(epoch)
''',
    # the batches drawn with next() from iter(loader) until StopIteration (a while loop in
    # the epoch loop): iter() reads that epoch's loader, as `for x in loader` does
    "iter_next": '''
loader = DataLoader(make_data(70), batch_size=8, shuffle={shuffle})
for epoch in range(2):
    total = 0.0
    batches = iter(loader)
    while True:
        try:
            (x,) = next(batches)
        except StopIteration:
            break
        total += x.sum().item()
    print(len(loader.dataset), len(loader), total)
''',
    "named_dataset": '''
data = make_data(70)
loader = DataLoader(data, batch_size=8, shuffle={shuffle})


def train(epoch):
    total = 0.0
    for (x,) in loader:
        total += x.sum().item()
    print(len(loader.dataset), len(loader), total)


for epoch in range(2):
    train(epoch)
''',
}


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the converter's output
    return out.getvalue()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("body", sorted(BODIES))
def test_loader_sizes_match_torch(body, shuffle):
    source = HEAD + BODIES[body].format(shuffle=shuffle)
    result = convert_source(source)
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "torch" not in result.code.replace("torch2jax", ""), result.code
    want = _run(source)
    assert want.splitlines() == ["70 9 2415.0"] * 2
    assert _run(result.code) == want


DRAWN = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_data(n):
    return TensorDataset(torch.randn(n, 1))


scale = torch.rand(1)
train_loader = DataLoader(make_data(16), batch_size=4, shuffle=True)
test_loader = DataLoader(make_data(16), batch_size=4)
seen = []
for epoch in range(2):
    values = sorted(float(v) for (x,) in train_loader for v in x.reshape(-1))
    seen.append(values)
test = sorted(float(v) for (x,) in test_loader for v in x.reshape(-1))
print("same data each epoch", seen[0] == seen[1])
print("train is the test set", seen[0] == test)
'''


def test_inline_dataset_of_a_shuffled_loader_draws_its_own_key_once():
    """The dataset built inline by a random draw, in a loader made a function of the epoch: it
    is drawn once, where torch draws it, with a key of its own (not re-drawn each epoch, not
    with the key the next statement's draw splits off)."""
    result = convert_source(DRAWN)
    assert "TODO(torch2jax)" not in result.code, result.code
    want = _run(DRAWN)
    assert want.splitlines() == ["same data each epoch True", "train is the test set False"]
    assert _run(result.code) == want


ORDER = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.arange(32.0)), batch_size=32, shuffle=True)


def train(epoch):
    for (x,) in loader:
        return [float(v) for v in x]


orders = [train(epoch) for epoch in range(1, 4)]
print("orders differ", orders[0] != orders[1] and orders[1] != orders[2])
print("same examples", sorted(orders[0]) == sorted(orders[2]))
'''


def test_shuffled_loader_read_in_train_epoch_reshuffles_each_epoch():
    """``def train(epoch): for x in loader:``: the converted per-epoch loader is called with
    the function's epoch, so each epoch has its own order, as torch's reshuffle has."""
    result = convert_source(ORDER)
    assert "TODO(torch2jax)" not in result.code, result.code
    want = _run(ORDER)
    assert want.splitlines() == ["orders differ True", "same examples True"]
    assert _run(result.code) == want
