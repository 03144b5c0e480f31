"""The training-script fixtures, converted: plain JAX that learns as well as the original.

Each script in fixtures/training/ converts with no TODO, imports neither torch nor torch2jax,
matches its committed expected output (fixtures/expected/nnx/training/), threads explicit
keys (no global RNG state), and, run as a user would run it, reaches the torch original's
final accuracy within noise. The converted script draws its own synthetic data and initial
weights from JAX's PRNG, so the two runs see different samples of the same task; "within
noise" is the spread of the torch script over seeds 0..4 (at most 0.005 for these tasks, see
tests/test_training_fixtures.py) plus a margin: 0.03.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from launch import session_final_accuracy

from torch2jax.convert import convert_source

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "fixtures" / "training"
EXPECTED = ROOT / "fixtures" / "expected" / "nnx" / "training"
SCRIPTS = sorted(TRAINING.glob("*.py"))
WITHIN = 0.03
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def converted() -> dict[str, object]:
    return {p.stem: convert_source(p.read_text(), path=str(p)) for p in SCRIPTS}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_training_script_converts_to_expected(path: Path, converted) -> None:
    result = converted[path.stem]
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == []
    assert "TODO(torch2jax)" not in result.code
    tree = ast.parse(result.code)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"torch", "torch2jax"}
    assert result.code == (EXPECTED / path.name).read_text()


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_keys_are_explicit(path: Path, converted) -> None:
    code = converted[path.stem].code
    tree = ast.parse(code)
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    # one root key from the script's seed, split before every draw; nnx.Rngs get split keys
    assert "jax.random.key" in calls
    assert "jax.random.split" in calls
    assert "nnx.Rngs(0)" not in code
    # host-side batch indices draw from one numpy Generator seeded from the script's seed
    assert not any(c.startswith("np.random.") and c not in ("np.random.seed",
                                                             "np.random.default_rng")
                   for c in calls)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_training_step_is_jitted(path: Path, converted) -> None:
    code = converted[path.stem].code
    assert "@nnx.jit" in code and "nnx.value_and_grad" in code and ".update(" in code
    assert ".backward()" not in code and ".zero_grad(" not in code


@pytest.mark.slow
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_converted_script_reaches_torch_accuracy(path: Path, converted, tmp_path: Path,
                                                 tmp_path_factory) -> None:
    script = tmp_path / path.name
    script.write_text(converted[path.stem].code)
    # each run once per session, from an empty folder (it must write no files): four files
    # compare with the torch original's run, tests/test_program_speed.py reads the converted
    # one's
    jax_acc = session_final_accuracy(script, tmp_path_factory, TIMEOUT_S)
    torch_acc = session_final_accuracy(path, tmp_path_factory, TIMEOUT_S)
    print(f"{path.stem}: torch {torch_acc:.4f}  jax {jax_acc:.4f}")
    assert abs(jax_acc - torch_acc) <= WITHIN, (torch_acc, jax_acc)
