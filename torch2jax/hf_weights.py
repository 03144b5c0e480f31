"""A transformers ``save_pretrained`` directory -> an orbax checkpoint of the converted model.

``torch2jax weights DIR --model converted/.../modeling_llama.py::LlamaForCausalLM --out CKPT``
(docs/transformers.md) does, without torch:

1. read the safetensors weights of ``DIR`` with ``safetensors.numpy``: ``model.safetensors``,
   or the shards that ``model.safetensors.index.json`` lists (``save_pretrained`` with a
   ``max_shard_size``); dtypes numpy lacks (bfloat16) through ``safetensors.flax``;
2. read ``DIR/config.json`` with the installed transformers' ``AutoConfig`` (plain Python:
   the converted model takes transformers' own configuration) and build the converted class
   with it;
3. move every tensor into the model with :func:`torch2jax.weights.transfer_arrays`, the same
   plan and layout rules as the torch state_dict transfer, the rule of each entry read from
   the flax class at its path; the weights the model ties (``_tied_weights_keys`` when
   ``config.tie_word_embeddings``) are one parameter, so a file that leaves out the head
   (``save_pretrained`` does) fills it from the embedding;
4. write ``nnx.state(model)`` with orbax (:func:`torch2jax.checkpoint.save_nnx_checkpoint`).

Every failure is a :class:`torch2jax.checkpoint.CheckpointError` with a one-line message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch2jax.checkpoint import (
    CheckpointError,
    _one_line,
    _some,
    checkpoint_destination,
    load_target,
    save_nnx_checkpoint,
)

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def safetensors_files(directory: str | Path) -> list[Path]:
    """The safetensors files holding the weights of a ``save_pretrained`` directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such directory")
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({_one_line(exc)})") from None
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that are not in {directory}: "
                                  f"{_some(missing)}")
        return [directory / n for n in names]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    found = [n for n in TORCH_FILES if (directory / n).is_file()]
    hint = (f" (it holds {found[0]}: save it again with save_pretrained, which writes "
            "safetensors)" if found else "")
    raise CheckpointError(f"{directory}: no {SINGLE} and no {INDEX}{hint}")


def _read_one(path: Path) -> dict[str, Any]:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise CheckpointError(f"{path}: reading safetensors needs the safetensors package: "
                              "pip install safetensors") from None
    try:
        return load_file(str(path))
    except TypeError:  # a dtype numpy lacks (bfloat16): read through jax, kept as ml_dtypes
        import numpy as np
        from safetensors.flax import load_file as load_jax

        return {k: np.asarray(v) for k, v in load_jax(str(path)).items()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file "
                              f"({_one_line(exc)})") from None


def read_pretrained(directory: str | Path) -> dict[str, Any]:
    """Every tensor of a ``save_pretrained`` directory as a numpy array, by state_dict key."""
    arrays: dict[str, Any] = {}
    for path in safetensors_files(directory):
        for key, value in _read_one(path).items():
            if key in arrays:
                raise CheckpointError(f"{path}: {key} is in two shards")
            arrays[key] = value
    if not arrays:
        raise CheckpointError(f"{directory}: the safetensors files hold no tensor")
    return arrays


def _config(directory: Path) -> Any:
    if not (directory / CONFIG).is_file():
        raise CheckpointError(f"{directory}: no {CONFIG} (save_pretrained writes it beside "
                              "the weights)")
    try:
        from transformers import AutoConfig
    except ImportError:
        raise CheckpointError("reading config.json needs the transformers package the "
                              "converted model was made from: pip install transformers") from None
    try:
        return AutoConfig.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - an unknown model_type, a malformed file, ...
        raise CheckpointError(f"{directory / CONFIG}: transformers cannot read it "
                              f"({_one_line(exc)})") from None


def build_converted(model: str, config: Any) -> Any:
    """The converted class of ``model`` (``FILE.py::Name``) built from ``config``."""
    from flax import nnx

    from torch2jax.verify.load import LoadError, find_name

    try:
        module, name, path = load_target(model, "--model")
        cls = find_name(module, name, path)
    except LoadError as exc:
        raise CheckpointError(f"--model {model}: {exc}") from None
    try:
        return cls(config, rngs=nnx.Rngs(0))
    except Exception as exc:  # noqa: BLE001 - the converted constructor failed
        raise CheckpointError(f"--model {model}: building it from config.json failed "
                              f"({_one_line(exc)})") from None


def tied_keys(model: Any) -> dict[str, str]:
    """The weights the converted model shares (transformers' ``_tied_weights_keys``, used
    when the config ties the embeddings): {key: the key holding the value}."""
    tied = getattr(type(model), "_tied_weights_keys", None)
    config = getattr(model, "config", None)
    if not isinstance(tied, dict) or not getattr(config, "tie_word_embeddings", False):
        return {}
    return {str(k): str(v) for k, v in tied.items()}


def convert_pretrained(directory: str | Path, model: str, out: str | Path, *,
                       overwrite: bool = False) -> tuple[Path, Any]:
    """What ``torch2jax weights DIR --model ... --out ...`` does; returns (the checkpoint's
    absolute path, the transfer report)."""
    from torch2jax.weights import WeightTransferError, transfer_arrays

    directory = Path(directory)
    out_path = checkpoint_destination(out, overwrite)
    arrays = read_pretrained(directory)
    converted = build_converted(model, _config(directory))
    try:
        report = transfer_arrays(arrays, converted, ties=tied_keys(converted))
    except WeightTransferError as exc:
        raise CheckpointError(
            f"{directory}: the converted model does not fit the weights "
            f"({len(exc.problems)} problems): {'; '.join(exc.problems[:3])}"
            + (" ..." if len(exc.problems) > 3 else "")) from None
    return save_nnx_checkpoint(converted, out_path, overwrite=overwrite), report
