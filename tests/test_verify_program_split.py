"""``verify --program`` on an early-stop regression script (tests/data/programs/
early_stop_split.py): a ``TensorDataset`` split by ``random_split(..., generator=
torch.Generator().manual_seed(0))``, a shuffled loader, AdamW, the best weights kept in memory.

The converted script splits with grain (``ds.shuffle(seed=0)[0:192]``): the torch Generator's
seed is the grain pipeline's. The seed check matches them (it reported the right program as
FAIL, "torch torch.Generator().manual_seed(0), JAX none"), and a split from another seed is
named by the check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("grain")

from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

PROGRAM = Path(__file__).resolve().parent / "data" / "programs" / "early_stop_split.py"
STEPS = 3


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("split")
    convert_tree(PROGRAM, tmp / "converted", "nnx", None)
    converted = (tmp / "converted" / PROGRAM.name).read_text()
    torch_rec = torch_side(PROGRAM, STEPS, [], tmp / "torch.pkl", cwd=tmp)
    return tmp, converted, torch_rec


def run(split: tuple[Path, str, dict], name: str, old: str = "", new: str = "") -> ProgramResult:
    tmp, converted, torch_rec = split
    if old:
        assert converted.count(old) >= 1, old
        converted = converted.replace(old, new)
    folder = tmp / name
    folder.mkdir()
    (folder / PROGRAM.name).write_text(converted)
    jax_rec = jax_side(folder / PROGRAM.name, tmp / "torch.pkl", STEPS, [], tmp / f"{name}.pkl",
                       cwd=tmp)
    r = ProgramResult(str(PROGRAM), str(folder), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


def test_the_split_s_generator_seed_is_the_grain_pipeline_s(split):
    r = run(split, "as_converted")
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    seeds = [c.detail for c in r.checks if c.kind == "seed"]
    assert seeds == [
        "torch torch.manual_seed(1), JAX jax.random.key(1), before step 1",
        "torch torch.Generator().manual_seed(0), JAX grain.MapDataset.shuffle(0), before step 1",
    ]
    assert {c.kind for c in r.checks} >= {"loss", "param", "opt_state", "decay", "seed"}


def test_a_split_from_another_seed_is_named(split):
    # (the loader's shuffle seeds are the global seed's, 1 + epoch: none is 0)
    r = run(split, "other_seed", ".shuffle(seed=0)", ".shuffle(seed=7)")
    assert [c.detail for c in r.failures("seed")] == [
        "torch torch.Generator().manual_seed(0), JAX none, before step 1"]
