"""Trained torch weights -> an orbax checkpoint of the converted flax NNX model.

``torch2jax weights STATE_DICT --model converted.py::Name --torch-model original.py::Name --out DIR``
(see docs/checkpoints.md) does, in order:

1. read the state_dict file (:func:`load_state_dict_file`): ``.pt``/``.pth``/``.bin`` through
   ``torch.load(weights_only=True)``, a bare state_dict or one under a ``"state_dict"`` or
   ``"model"`` entry; ``.safetensors`` through the ``safetensors`` package;
2. build the torch original and load the file into it, which checks every key and shape
   against the architecture the weights were trained with;
3. build the converted NNX model and move the weights across with :mod:`torch2jax.weights`,
   whose layout rules (a Linear weight is transposed, a conv weight goes OIHW -> HWIO, ...)
   are keyed by torch layer class and whose tie detection reads torch's shared storage: this
   is why the torch original is needed, not only the converted file;
4. write ``nnx.state(model)`` with ``orbax.checkpoint.StandardCheckpointer`` into a temporary
   folder beside ``--out`` and rename it into place (:func:`save_nnx_checkpoint`).

The checkpoint is the plain layout of the flax NNX documentation, so converted code restores it
with orbax alone (no torch, no torch2jax): see :func:`restore_nnx_checkpoint` and the snippet in
docs/checkpoints.md.

Every failure is a :class:`CheckpointError` with a one-line message naming the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch2jax.ruleset import RuleSet

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
SAFETENSORS_SUFFIX = ".safetensors"
NESTED_KEYS = ("state_dict", "model")  # {"model": sd, "optimizer": ..., "epoch": ...}
WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP, torch.compile
_LISTED = 5  # keys named in a message before "and N more"


class CheckpointError(RuntimeError):
    """The weights could not be converted; the message is one line and names the file."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def _some(keys: list[str]) -> str:
    shown = ", ".join(keys[:_LISTED])
    return shown + (f" (and {len(keys) - _LISTED} more)" if len(keys) > _LISTED else "")


# --- reading ----------------------------------------------------------------------------------


def load_state_dict_file(path: str | Path) -> dict[str, Any]:
    """The torch tensors stored in ``path`` (a ``.pt``/``.pth``/``.bin``/``.ckpt`` written by
    ``torch.save``, or a ``.safetensors`` file), by state_dict key.

    A training checkpoint that keeps the weights under ``"state_dict"`` or ``"model"`` is
    unwrapped, and a ``module.`` (DataParallel) or ``_orig_mod.`` (torch.compile) prefix common
    to every key is removed.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == SAFETENSORS_SUFFIX:
        data = _load_safetensors(path)
    elif suffix in TORCH_SUFFIXES:
        data = _load_torch(path)
    else:
        known = ", ".join((*TORCH_SUFFIXES, SAFETENSORS_SUFFIX))
        raise CheckpointError(
            f"{path}: unknown weights format {suffix or '(no suffix)'!r} ({known})"
        )
    return _unwrap(data, path)


def _load_torch(path: Path) -> Any:
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(
            f"{path}: torch.load(weights_only=True) refused it ({first}); save only tensors, "
            "e.g. torch.save(model.state_dict(), path)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - truncated file, not a torch file, ...
        raise CheckpointError(f"{path}: not a readable torch file ({_one_line(exc)})") from None


def _load_safetensors(path: Path) -> Any:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise CheckpointError(
            f"{path}: reading .safetensors needs the safetensors package: pip install safetensors"
        ) from None
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({_one_line(exc)})"
        ) from None


def _is_tensor_dict(value: Any) -> bool:
    import torch

    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())
    )


def _unwrap(data: Any, path: Path) -> dict[str, Any]:
    if isinstance(data, Mapping):
        for key in NESTED_KEYS:
            if key in data and _is_tensor_dict(data[key]) and not _is_tensor_dict(data):
                data = data[key]
                break
    if not _is_tensor_dict(data):
        what = (
            f"keys {_some([str(k) for k in data])}"
            if isinstance(data, Mapping)
            else type(data).__name__
        )
        raise CheckpointError(
            f"{path}: holds no state_dict (expected a dict of tensors, or one under "
            f"{' or '.join(repr(k) for k in NESTED_KEYS)}; found {what})"
        )
    state = dict(data)
    for prefix in WRAPPER_PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- mapping ----------------------------------------------------------------------------------


def load_into_torch_model(state_dict: Mapping[str, Any], torch_model: Any, source: str) -> None:
    """Load ``state_dict`` into ``torch_model`` after checking every key and shape.

    Keys the model lacks and shapes that differ are errors. A missing key is accepted only when
    the model ties it to a key that is present (safetensors' ``save_model`` stores one of tied
    weights) or when the layer rules drop it (BatchNorm's ``num_batches_tracked``); the caller
    checks that with the transfer report, see :func:`missing_keys_problem`.
    """
    own = torch_model.state_dict()
    unexpected = [k for k in state_dict if k not in own]
    if unexpected:
        raise CheckpointError(
            f"{source}: {len(unexpected)} keys match nothing in {type(torch_model).__name__}: "
            f"{_some(unexpected)}"
        )
    wrong = [
        f"{k} is {list(v.shape)} in the file but {list(own[k].shape)} in the model"
        for k, v in state_dict.items()
        if tuple(v.shape) != tuple(own[k].shape)
    ]
    if wrong:
        raise CheckpointError(f"{source}: shape mismatch: {_some(wrong)}")
    try:
        torch_model.load_state_dict(dict(state_dict), strict=False)
    except Exception as exc:  # noqa: BLE001 - a custom _load_from_state_dict may raise anything
        raise CheckpointError(f"{source}: load_state_dict failed ({_one_line(exc)})") from None


def missing_keys_problem(
    state_dict: Mapping[str, Any], torch_model: Any, report: Any, source: str
) -> str | None:
    """Why the file lacks weights the model needs, or None. Tied and dropped keys may be absent
    (one of each tied group must be there: tied keys then carry its value)."""
    by_key = {m.torch_name: m for m in report.mappings}
    filled = {by_key[k].nnx_path for k in state_dict if k in by_key}  # tied keys share a path
    missing = []
    for key in torch_model.state_dict():
        m = by_key.get(key)
        if key in state_dict or (m is not None and m.status == "dropped"):
            continue
        if m is not None and m.nnx_path is not None and m.nnx_path in filled:
            continue
        missing.append(key)
    if not missing:
        return None
    return (
        f"{source}: lacks {len(missing)} entries of {type(torch_model).__name__}'s state_dict: "
        f"{_some(missing)}"
    )


def transfer_to_nnx(
    state_dict: Mapping[str, Any],
    torch_model: Any,
    nnx_model: Any,
    *,
    source: str = "state_dict",
    rules: RuleSet | None = None,
) -> Any:
    """Load ``state_dict`` into ``torch_model`` and copy it into ``nnx_model`` (in place).

    Returns the :class:`torch2jax.weights.TransferReport`.
    """
    load_into_torch_model(state_dict, torch_model, source)
    return copy_loaded_to_nnx(state_dict, torch_model, nnx_model, source=source, rules=rules)


def copy_loaded_to_nnx(
    state_dict: Mapping[str, Any],
    torch_model: Any,
    nnx_model: Any,
    *,
    source: str = "state_dict",
    rules: RuleSet | None = None,
) -> Any:
    """The second half of :func:`transfer_to_nnx`, for a ``torch_model`` that already holds
    ``state_dict`` (:func:`load_into_torch_model`)."""
    from torch2jax.weights import WeightTransferError, transfer_state_dict

    try:
        report = transfer_state_dict(torch_model, nnx_model, rules)
    except WeightTransferError as exc:
        raise CheckpointError(
            f"{source}: the converted model does not fit the weights "
            f"({len(exc.problems)} problems): {'; '.join(exc.problems[:3])}"
            + (" ..." if len(exc.problems) > 3 else "")
        ) from None
    problem = missing_keys_problem(state_dict, torch_model, report, source)
    if problem:
        raise CheckpointError(problem)
    return report


# --- orbax ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` (same file system, so the final rename is atomic),
    removed afterwards whatever happens."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.torch2jax-tmp-", dir=out.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# what orbax writes at the top of a checkpoint folder (StandardCheckpointer, OCDBT format)
_ORBAX_NAMES = frozenset({"_CHECKPOINT_METADATA", "_METADATA", "_sharding", "_ROOT_METADATA",
                          "commit_success.txt", "manifest.ocdbt", "d", "array_metadatas",
                          "descriptor"})


def not_replaceable(out: Path) -> str | None:
    """Why ``overwrite`` must not replace the existing ``out`` (None: it may): only an empty
    folder or an orbax checkpoint folder (its ``_CHECKPOINT_METADATA``, nothing but what orbax
    writes beside it) is replaced; a folder of the user's own files, a file or a link is not."""
    if out.is_symlink() or not out.is_dir():
        return f"{out}: exists and is not a folder; --overwrite replaces only a checkpoint folder"
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return None
    if "_CHECKPOINT_METADATA" not in entries:
        return (f"{out}: not an orbax checkpoint (no _CHECKPOINT_METADATA); --overwrite replaces "
                "only a checkpoint folder, not one of other files: remove it or choose another "
                "--out")
    foreign = [n for n in entries if n not in _ORBAX_NAMES and not n.startswith("ocdbt.process_")]
    if foreign:
        return (f"{out}: holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}, "
                "which orbax does not write; --overwrite replaces only a checkpoint folder: "
                "remove it or choose another --out")
    return None


def save_nnx_checkpoint(model: Any, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``nnx.state(model)`` as an orbax checkpoint folder at ``path``; return its
    absolute path.

    The checkpoint is written into a temporary folder beside ``path`` and renamed into place,
    so ``path`` holds either nothing, the previous checkpoint or the complete new one. An
    existing ``path`` is replaced only with ``overwrite=True``, and only when it is an empty
    folder or an orbax checkpoint (:func:`not_replaceable`).
    """
    import orbax.checkpoint as ocp
    from flax import nnx

    out = Path(os.path.abspath(path))  # orbax wants absolute paths
    if not out.parent.is_dir():
        raise CheckpointError(f"{out}: the folder {out.parent} does not exist")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise CheckpointError(f"{out}: already exists (pass overwrite=True / --overwrite)")
        if (why := not_replaceable(out)) is not None:
            raise CheckpointError(why)
    with _staging(out) as tmp:
        written = tmp / "checkpoint"
        try:
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(written, nnx.state(model))
        except Exception as exc:  # noqa: BLE001 - one line instead of orbax's traceback
            raise CheckpointError(
                f"{out}: orbax could not write the checkpoint ({_one_line(exc)})"
            ) from None
        if out.exists():  # overwrite: move the old one into the staging folder, then drop it
            os.replace(out, tmp / "previous")
        os.replace(written, out)
    return out


def restore_nnx_checkpoint(model_factory_or_model: Any, path: str | Path) -> Any:
    """Restore a checkpoint written by :func:`save_nnx_checkpoint` (or ``torch2jax weights``).

    Given a model factory (``lambda: Model(..., rngs=nnx.Rngs(0))``), the model is built
    abstractly with ``nnx.eval_shape`` (no parameter is initialised) and the restored model is
    returned. Given a model, its state is replaced in place (``nnx.update``) and it is returned.
    """
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    where = Path(os.path.abspath(path))
    if not where.is_dir():
        raise CheckpointError(f"{where}: no such checkpoint folder")
    if isinstance(model_factory_or_model, nnx.Module):
        model = model_factory_or_model
        abstract_state = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(model))
        graphdef = None
    elif callable(model_factory_or_model):
        abstract = nnx.eval_shape(model_factory_or_model)
        graphdef, abstract_state = nnx.split(abstract)
    else:
        raise TypeError("restore_nnx_checkpoint takes an nnx.Module or a function building one")
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            state = checkpointer.restore(where, abstract_state)
    except Exception as exc:  # noqa: BLE001 - one line instead of orbax's traceback
        raise CheckpointError(
            f"{where}: cannot restore into this model ({_one_line(exc)})"
        ) from None
    if graphdef is not None:
        return nnx.merge(graphdef, state)
    nnx.update(model, state)
    return model


# --- the command ------------------------------------------------------------------------------


@contextlib.contextmanager
def _no_bytecode() -> Iterator[None]:
    """Import user files without writing __pycache__ next to them (only --out is written)."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def checkpoint_destination(out: str | Path, overwrite: bool) -> Path:
    """The checkpoint's absolute path, checked before any work: it does not exist (unless
    ``overwrite``, and then it is one :func:`not_replaceable` accepts) and its folder does."""
    out_path = Path(os.path.abspath(out))
    if out_path.exists() or out_path.is_symlink():
        if not overwrite:
            raise CheckpointError(f"{out_path}: already exists (pass --overwrite to replace it)")
        if (why := not_replaceable(out_path)) is not None:
            raise CheckpointError(why)
    if not out_path.parent.is_dir():
        raise CheckpointError(f"{out_path}: the folder {out_path.parent} does not exist")
    return out_path


def load_target(target: str, option: str) -> tuple[Any, str, Path]:
    """The module of ``FILE.py::Name``, loaded without writing bytecode beside it, with the
    name and the path; a :class:`CheckpointError` naming ``option`` when there is none.
    The caller catches :class:`torch2jax.verify.load.LoadError`."""
    from torch2jax.verify.load import load_module, split_target

    path, name = split_target(target)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file ({option})")
    with _no_bytecode():
        module = load_module(path, prefix="torch2jax_weights")
    return module, name, path


def _build(target: str, args: dict | None, build: str | None, *, nnx_side: bool) -> Any:
    from torch2jax.verify.load import LoadError, find_name
    from torch2jax.verify.nnx import build_nnx_model
    from torch2jax.verify.run import VerifyError, build_torch_model

    option = "--model" if nnx_side else "--torch-model"
    try:
        module, name, path = load_target(target, option)
        if build is None:
            find_name(module, name, path)
        if nnx_side:
            return build_nnx_model(module, name, args, build, seed=0)
        return build_torch_model(module, name, args, build)
    except (LoadError, VerifyError) as exc:
        raise CheckpointError(f"{option} {target}: {exc}") from None
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's constructor failed
        raise CheckpointError(
            f"{option} {target}: building the model failed ({_one_line(exc)})"
        ) from None


def convert_weights(
    state_dict_file: str | Path,
    model: str,
    torch_model: str,
    out: str | Path,
    *,
    args: dict | None = None,
    build: str | None = None,
    overwrite: bool = False,
    rules: RuleSet | None = None,
) -> tuple[Path, Any]:
    """What ``torch2jax weights`` does; returns (the checkpoint's absolute path, the transfer
    report). ``model`` is the converted ``FILE.py::Name``, ``torch_model`` its torch original;
    ``args``/``build`` construct both, as in ``torch2jax verify``."""
    if args is not None and build is not None:
        raise CheckpointError("give either --args or --build, not both")
    out_path = checkpoint_destination(out, overwrite)
    state = load_state_dict_file(state_dict_file)
    source = str(state_dict_file)
    reference = _build(torch_model, args, build, nnx_side=False)
    load_into_torch_model(state, reference, source)  # key and shape errors before the NNX build
    converted = _build(model, args, build, nnx_side=True)
    report = copy_loaded_to_nnx(state, reference, converted, source=source, rules=rules)
    return save_nnx_checkpoint(converted, out_path, overwrite=overwrite), report
