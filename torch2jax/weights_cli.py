"""The ``torch2jax weights`` command: a torch state_dict file (checkpoint.py) or a transformers
``save_pretrained`` directory (hf_weights.py) into an orbax checkpoint of the converted model.
It imports both readers; neither imports it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch2jax.checkpoint import CheckpointError, _one_line, convert_weights
from torch2jax.hf_weights import convert_pretrained


def weights_command(
    state_dict_file: Path,
    model: str,
    torch_model: str | None,
    out: Path,
    args_json: str | None,
    build: str | None,
    overwrite: bool,
    echo: Callable[[str, bool], None],
) -> int:
    """The CLI entry: prints one line (``echo(text, err)``) and returns the exit status,
    0 when the checkpoint was written, 2 otherwise."""
    import json

    try:
        if not state_dict_file.exists():
            raise CheckpointError(f"{state_dict_file}: no such file or directory")
        if state_dict_file.is_dir():  # a transformers save_pretrained directory
            if torch_model is not None or args_json is not None or build is not None:
                raise CheckpointError(f"{state_dict_file} is a save_pretrained directory: "
                                      "its config.json builds the model (no --torch-model, "
                                      "--args or --build)")
            written, report = convert_pretrained(state_dict_file, model, out,
                                                 overwrite=overwrite)
            echo(f"wrote {written}: {report.summary()}", False)
            return 0
        if torch_model is None:
            raise CheckpointError(f"{state_dict_file}: a state_dict file needs --torch-model "
                                  "(its torch original); a save_pretrained directory does not")
        args = json.loads(args_json) if args_json else None
        if args is not None and not isinstance(args, dict):
            raise CheckpointError("--args must be a JSON object of constructor keyword arguments")
        written, report = convert_weights(
            state_dict_file, model, torch_model, out, args=args, build=build, overwrite=overwrite
        )
    except json.JSONDecodeError as exc:
        echo(f"error: --args is not valid JSON: {exc}", True)
        return 2
    except CheckpointError as exc:
        echo(f"error: {exc}", True)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug of ours: still one line, no traceback
        echo(f"error: {state_dict_file}: internal error ({_one_line(exc)})", True)
        return 2
    echo(f"wrote {written}: {report.summary()}", False)
    return 0
