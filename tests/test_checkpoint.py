"""``torch2jax weights`` and torch2jax.checkpoint: trained torch weights -> orbax checkpoint of
the converted NNX model, restored the way docs/checkpoints.md shows, computing what torch does.

The fixture models are converted once per module (into a temporary folder); each torch model is
built once per module too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nnx = pytest.importorskip("flax.nnx")
ocp = pytest.importorskip("orbax.checkpoint")

from typer.testing import CliRunner

from torch2jax.checkpoint import (
    CheckpointError,
    load_state_dict_file,
    restore_nnx_checkpoint,
    save_nnx_checkpoint,
)
from torch2jax.cli import app
from torch2jax.convert import convert_source
from torch2jax.verify.load import load_module
from torch2jax.verify.run import randomise_for_verification

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
runner = CliRunner()

# name -> (class name, --build expression or None, input maker)
CASES = {
    "mlp": ("MLP", None, lambda g: torch.randn(4, 784, generator=g)),
    "cnn": ("CNN", None, lambda g: torch.randn(4, 3, 32, 32, generator=g)),
    "gpt": ("GPT", "GPT(GPTConfig())", lambda g: torch.randint(0, 128, (2, 16), generator=g)),
}


def _construct(name: str, module, **rngs):
    """The model of case ``name`` from ``module`` (torch, or NNX given rngs=...)."""
    if name == "gpt":
        return module.GPT(module.GPTConfig(), **rngs)
    return getattr(module, CASES[name][0])(**rngs)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("converted")
    for name in CASES:
        src = MODELS / f"{name}.py"
        (out / src.name).write_text(convert_source(src.read_text(), path=str(src)).code)
    return {name: out / f"{name}.py" for name in CASES}


@pytest.fixture(scope="module")
def trained() -> dict[str, object]:
    """Each torch fixture model with non-trivial weights and statistics, in eval mode."""
    models = {}
    for i, name in enumerate(CASES):
        module = load_module(MODELS / f"{name}.py")
        torch.manual_seed(i)
        model = _construct(name, module)
        randomise_for_verification(model, seed=i)
        models[name] = model.eval()
    return models


def _targets(name: str, converted: dict[str, Path]) -> list[str]:
    cls, build, _ = CASES[name]
    opts = [
        "--model",
        f"{converted[name]}::{cls}",
        "--torch-model",
        f"{MODELS / name}.py::{cls}",
    ]
    return opts + (["--build", build] if build else [])


def _weights(*args: str):
    return runner.invoke(app, ["weights", *args])


def _restore_like_the_docs(path: Path, name: str, module):
    """Exactly the restore snippet of docs/checkpoints.md (orbax and flax only)."""
    import os

    abstract = nnx.eval_shape(lambda: _construct(name, module, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    with ocp.StandardCheckpointer() as checkpointer:
        state = checkpointer.restore(os.path.abspath(path), abstract_state)
    return nnx.merge(graphdef, state)


def _assert_same_forward(name: str, torch_model, nnx_model) -> None:
    g = torch.Generator().manual_seed(123)
    x = CASES[name][2](g)
    with torch.no_grad():
        expected = torch_model(x)
    expected = expected[0] if isinstance(expected, tuple) else expected
    nnx_model.eval()
    got = nnx_model(np.asarray(x.numpy()))
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_allclose(np.asarray(got), expected.numpy(), atol=1e-5, rtol=1e-5)


def _one_line_error(result, *names: str) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    for n in names:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_pt_checkpoint_restores_to_the_torch_forward(name, converted, trained, tmp_path):
    torch_model = trained[name]
    pt = tmp_path / f"{name}.pt"
    torch.save(torch_model.state_dict(), pt)
    out = tmp_path / "ckpt"
    result = _weights(str(pt), *_targets(name, converted), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([pt.name, "ckpt"])  # no leftovers

    module = load_module(converted[name])
    _assert_same_forward(name, torch_model, _restore_like_the_docs(out, name, module))
    # the library's restore, into a factory and into an existing model
    restored = restore_nnx_checkpoint(lambda: _construct(name, module, rngs=nnx.Rngs(1)), out)
    _assert_same_forward(name, torch_model, restored)
    fresh = _construct(name, module, rngs=nnx.Rngs(2))
    assert restore_nnx_checkpoint(fresh, out) is fresh
    _assert_same_forward(name, torch_model, fresh)


def test_training_checkpoint_dict_and_wrapper_prefix_are_unwrapped(trained, tmp_path):
    sd = trained["mlp"].state_dict()
    path = tmp_path / "train.pth"
    wrapped = {f"module.{k}": v for k, v in sd.items()}
    torch.save({"model": wrapped, "epoch": 3, "optimizer": {"lr": 0.1}}, path)
    loaded = load_state_dict_file(path)
    assert list(loaded) == list(sd)
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)


def test_safetensors_with_tied_weights(converted, trained, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch_model = trained["gpt"]
    path = tmp_path / "gpt.safetensors"
    safetensors_torch.save_model(torch_model, str(path))  # stores one of the tied weights
    stored = safetensors_torch.load_file(str(path))
    assert len(stored) < len(torch_model.state_dict())
    out = tmp_path / "ckpt"
    result = _weights(str(path), *_targets("gpt", converted), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "tied" in result.output
    module = load_module(converted["gpt"])
    _assert_same_forward("gpt", torch_model, _restore_like_the_docs(out, "gpt", module))


def test_safetensors_cnn_round_trip(converted, trained, tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch_model = trained["cnn"]
    path = tmp_path / "cnn.safetensors"
    safetensors_torch.save_file(torch_model.state_dict(), str(path))
    out = tmp_path / "ckpt"
    result = _weights(str(path), *_targets("cnn", converted), "--out", str(out))
    assert result.exit_code == 0, result.output
    module = load_module(converted["cnn"])
    _assert_same_forward("cnn", torch_model, _restore_like_the_docs(out, "cnn", module))


def _bad(tmp_path, trained, edit) -> Path:
    sd = dict(trained["cnn"].state_dict())
    edit(sd)
    path = tmp_path / "bad.pt"
    torch.save(sd, path)
    return path


def _nothing_written(tmp_path: Path, out: Path) -> None:
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_unknown_key_exits_2(converted, trained, tmp_path):
    path = _bad(tmp_path, trained, lambda sd: sd.update({"head.weight": torch.zeros(3)}))
    out = tmp_path / "ckpt"
    line = _one_line_error(
        _weights(str(path), *_targets("cnn", converted), "--out", str(out)), str(path)
    )
    assert "head.weight" in line
    _nothing_written(tmp_path, out)


def test_wrong_shape_exits_2(converted, trained, tmp_path):
    path = _bad(tmp_path, trained, lambda sd: sd.update({"fc2.weight": torch.zeros(7, 64)}))
    out = tmp_path / "ckpt"
    line = _one_line_error(
        _weights(str(path), *_targets("cnn", converted), "--out", str(out)), str(path)
    )
    assert "fc2.weight" in line and "[7, 64]" in line and "[10, 64]" in line
    _nothing_written(tmp_path, out)


def test_missing_key_exits_2(converted, trained, tmp_path):
    path = _bad(tmp_path, trained, lambda sd: sd.pop("conv1.bias"))
    out = tmp_path / "ckpt"
    line = _one_line_error(
        _weights(str(path), *_targets("cnn", converted), "--out", str(out)), str(path)
    )
    assert "conv1.bias" in line
    _nothing_written(tmp_path, out)


def test_converted_model_that_does_not_fit_exits_2(converted, trained, tmp_path):
    # the user edited the converted file: fc1 now has 32 outputs, torch's has 64
    edited = tmp_path / "edited.py"
    edited.write_text(
        converted["cnn"]
        .read_text()
        .replace("nnx.Linear(32 * 8 * 8, 64", "nnx.Linear(32 * 8 * 8, 32")
    )
    path = tmp_path / "cnn.pt"
    torch.save(trained["cnn"].state_dict(), path)
    out = tmp_path / "ckpt"
    args = ["--model", f"{edited}::CNN", "--torch-model", f"{MODELS / 'cnn.py'}::CNN"]
    line = _one_line_error(_weights(str(path), *args, "--out", str(out)), str(path))
    assert "fc1" in line
    _nothing_written(tmp_path, out)


def test_missing_file_and_bad_format_exit_2(converted, tmp_path):
    out = tmp_path / "ckpt"
    missing = tmp_path / "nope.pt"
    line = _one_line_error(
        _weights(str(missing), *_targets("cnn", converted), "--out", str(out)), str(missing)
    )
    assert "no such file" in line
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    _one_line_error(_weights(str(junk), *_targets("cnn", converted), "--out", str(out)), str(junk))
    txt = tmp_path / "weights.txt"
    txt.write_text("")
    _one_line_error(_weights(str(txt), *_targets("cnn", converted), "--out", str(out)), str(txt))
    _nothing_written(tmp_path, out)


def test_missing_model_file_exits_2(trained, tmp_path):
    path = tmp_path / "cnn.pt"
    torch.save(trained["cnn"].state_dict(), path)
    out = tmp_path / "ckpt"
    args = ["--model", f"{tmp_path / 'gone.py'}::CNN", "--torch-model", f"{MODELS / 'cnn.py'}::CNN"]
    _one_line_error(_weights(str(path), *args, "--out", str(out)), "gone.py", "--model")
    _nothing_written(tmp_path, out)


def test_existing_out_is_kept_unless_overwrite(converted, trained, tmp_path):
    """--overwrite replaces an earlier checkpoint, never a folder of the user's own files
    (issue 33: a folder holding them was replaced, and its files were gone)."""
    path = tmp_path / "mlp.pt"
    torch.save(trained["mlp"].state_dict(), path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    _one_line_error(_weights(str(path), *_targets("mlp", converted), "--out", str(mine)), "exists")
    _one_line_error(_weights(str(path), *_targets("mlp", converted), "--out", str(mine),
                             "--overwrite"), str(mine), "not an orbax checkpoint")
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]
    assert (mine / "keep.txt").read_text() == "mine"
    out = tmp_path / "ckpt"
    assert _weights(str(path), *_targets("mlp", converted), "--out", str(out)).exit_code == 0
    (out / "notes.txt").write_text("mine too")  # a checkpoint folder with a file of the user's
    _one_line_error(_weights(str(path), *_targets("mlp", converted), "--out", str(out),
                             "--overwrite"), "notes.txt", "which orbax does not write")
    assert (out / "notes.txt").read_text() == "mine too"
    (out / "notes.txt").unlink()
    stamp = (out / "_CHECKPOINT_METADATA").read_bytes()
    result = _weights(str(path), *_targets("mlp", converted), "--out", str(out), "--overwrite")
    assert result.exit_code == 0, result.output
    assert (out / "_CHECKPOINT_METADATA").read_bytes() != stamp  # written again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mine", "mlp.pt"]


def test_library_save_replaces_only_a_checkpoint(converted, tmp_path):
    module = load_module(converted["mlp"])
    model = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(0))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("1,2\n")
    with pytest.raises(CheckpointError, match="not an orbax checkpoint"):
        save_nnx_checkpoint(model, mine, overwrite=True)
    assert [p.name for p in mine.iterdir()] == ["data.csv"]
    a_file = tmp_path / "model.ckpt"
    a_file.write_text("not a folder")
    with pytest.raises(CheckpointError, match="not a folder"):
        save_nnx_checkpoint(model, a_file, overwrite=True)
    assert a_file.read_text() == "not a folder"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert save_nnx_checkpoint(model, empty, overwrite=True) == empty
    other = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(3))
    assert save_nnx_checkpoint(other, empty, overwrite=True) == empty  # the earlier one
    restored = restore_nnx_checkpoint(module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(5)), empty)
    np.testing.assert_array_equal(
        np.asarray(restored.layers.layers[0].kernel[...]),
        np.asarray(other.layers.layers[0].kernel[...]),
    )


def test_library_save_is_relative_path_safe_and_refuses_to_clobber(
    converted, monkeypatch, tmp_path
):
    module = load_module(converted["mlp"])
    model = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(0))
    monkeypatch.chdir(tmp_path)
    written = save_nnx_checkpoint(model, "rel_ckpt")  # relative: orbax needs it made absolute
    assert written == tmp_path / "rel_ckpt" and written.is_dir()
    with pytest.raises(CheckpointError, match="already exists"):
        save_nnx_checkpoint(model, "rel_ckpt")
    other = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(5))
    restore_nnx_checkpoint(other, "rel_ckpt")
    np.testing.assert_array_equal(
        np.asarray(other.layers.layers[0].kernel[...]),
        np.asarray(model.layers.layers[0].kernel[...]),
    )


def test_documented_inline_save_and_load(converted, monkeypatch, tmp_path):
    """The code docs/checkpoints.md says converted scripts contain for torch.save(...state_dict())
    and load_state_dict(torch.load(...)): a relative path, a second save that overwrites, the
    model's RNG state left as its own seed made it."""
    import os

    import jax

    module = load_module(converted["mlp"])
    model = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(0))
    model.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(2))  # RNG state: a key and a count
    model.drop(np.ones(4, np.float32))  # count 1
    monkeypatch.chdir(tmp_path)
    path = "model.pt"
    for _ in range(2):
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(os.path.abspath(path), nnx.state(model), force=True)
    other = module.MLP(hidden_sizes=(8,), rngs=nnx.Rngs(1))
    other.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(3))
    own_key = jax.random.key_data(other.drop.rngs.key[...])
    with ocp.StandardCheckpointer() as checkpointer:
        nnx.update(other, checkpointer.restore(os.path.abspath(path), nnx.state(other)).filter(nnx.Not(nnx.RngState)))
    np.testing.assert_array_equal(
        np.asarray(other.layers.layers[0].kernel[...]),
        np.asarray(model.layers.layers[0].kernel[...]),
    )
    # what torch's load_state_dict restores and no more: the RNG state stays the model's own
    np.testing.assert_array_equal(jax.random.key_data(other.drop.rngs.key[...]), own_key)
    assert int(other.drop.rngs.count[...]) == 0 and int(model.drop.rngs.count[...]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
