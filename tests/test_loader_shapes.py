"""DataLoaders as public scripts write them.

* ``shuffle=is_train`` (known at run time) was dropped with no mark: the converted loader
  never shuffled. It shuffles where the flag is true, with a new order every epoch.
* A shuffled loader that is not assigned to a name (``return DataLoader(ds, shuffle=True)``
  from a ``get_loaders()``) lost its shuffle with no mark. Returned to callers that bind it
  to names (``train_loader, val_loader = get_loaders(64)``), it is a function of the epoch;
  used any other way, it is marked, the line kept.
* ``for x, y in tqdm(loader)``: the batches were of unknown kind (``x.to(device)`` marked);
  ``OneCycleLR(total_steps=epochs * len(train_loader))`` was refused as "not a literal
  integer" (the check took any expression for a literal). tests/data/programs/amp_onecycle.py
  converts with no TODO and prints torch's learning rate at every epoch.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("grain")

from torch2jax.convert import convert_source

FLAGGED = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    ds = TensorDataset(torch.arange(16.0))
    is_train = IS_TRAIN
    loader = DataLoader(ds, batch_size=16, shuffle=is_train)
    for epoch in range(3):
        for (x,) in loader:
            print([int(v) for v in x])
""")


def _printed(code: str) -> list[list[int]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "script.py", "exec"), {"__name__": "__main__"})  # noqa: S102
    return [eval(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("flag", [True, False])
def test_a_shuffle_flag_known_at_run_time_shuffles_where_it_is_true(flag: bool) -> None:
    result = convert_source(FLAGGED.replace("IS_TRAIN", str(flag)), path="script.py")
    assert "TODO(torch2jax)" not in result.code
    epochs = _printed(result.code)
    assert len(epochs) == 3 and all(sorted(e) == list(range(16)) for e in epochs)
    if flag:  # a new order every epoch, as torch's sampler draws
        assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(16))
    else:
        assert epochs == [list(range(16))] * 3


RETURNED = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    def get_loaders(batch_size):
        ds = TensorDataset(torch.arange(16.0))
        return (DataLoader(ds, batch_size=batch_size, shuffle=True),
                DataLoader(ds, batch_size=batch_size))

    torch.manual_seed(0)
    train_loader, val_loader = get_loaders(16)
    for epoch in range(3):
        for (x,) in train_loader:
            print([int(v) for v in x])
        for (x,) in val_loader:
            print([int(v) for v in x])
    print([len(train_loader)])
""")


def test_a_shuffled_loader_a_function_returns_to_named_variables() -> None:
    """``train_loader, val_loader = get_loaders(16)``: the returned shuffled loader is a
    function of the epoch (a new order every epoch, as torch's); the other one as it was."""
    result = convert_source(RETURNED, path="script.py")
    assert "TODO(torch2jax)" not in result.code
    assert "lambda epoch:" in result.code
    *printed, (batches,) = _printed(result.code)
    train, val = printed[0::2], printed[1::2]
    assert batches == 1 and val == [list(range(16))] * 3
    assert all(sorted(e) == list(range(16)) for e in train) and len(set(map(tuple, train))) == 3


@pytest.mark.parametrize("loader", [
    "return DataLoader(ds, batch_size=4, shuffle=True)",
    "return DataLoader(ds, batch_size=4, shuffle=shuffle)",
    "return [DataLoader(ds, batch_size=4, sampler=torch.utils.data.RandomSampler(ds))]",
])
def test_a_shuffled_loader_with_no_name_is_marked(loader: str) -> None:
    source = textwrap.dedent(f"""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def make(ds, shuffle):
            {loader}
    """)
    result = convert_source(source, path="script.py")
    assert any("a shuffled DataLoader that is not assigned to a name" in d.message
               for d in result.diagnostics if d.severity == "error")
    assert loader in result.code  # kept as written


PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "amp_onecycle.py"
LR = re.compile(r"lr (\S+)$", re.MULTILINE)


def test_a_tqdm_loop_with_one_cycle_over_the_loader_length(tmp_path: Path) -> None:
    result = convert_source(PROGRAM.read_text(), path=PROGRAM.name)
    assert "TODO(torch2jax)" not in result.code, [
        d.message for d in result.diagnostics if d.severity == "error"]
    assert "len(train_loader" in result.code  # the schedule's length, read at run time
    runs = []
    for folder, code in (("torch", PROGRAM.read_text()), ("jax", result.code)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / PROGRAM.name).write_text(code)
        done = subprocess.run([sys.executable, PROGRAM.name], cwd=tmp_path / folder, text=True,
                              capture_output=True, check=False, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(done.stdout)
    theirs, ours = (LR.findall(out) for out in runs)
    assert len(theirs) == 4 and ours == theirs  # OneCycleLR's rate at the end of every epoch
