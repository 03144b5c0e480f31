"""One JAX side per target: what :mod:`torch2jax.verify.run` and
:mod:`torch2jax.verify.trajectory` ask of the target a request names.

The torch side (building the model, randomising its statistics, the inputs, the training
setup and the loss) is shared; a :class:`JaxSide` does the rest on its target's model: build
it, load the torch weights into it, run the forward pass, the gradients and the statistics
(``forward``), and train it step by step against torch (``trajectory``). The verifier looks the
side up once, by the target's name (``SIDES[req.jax_target]``), and never branches on the name.
Each side's code lives in its own module (:mod:`~torch2jax.verify.nnx`,
:mod:`~torch2jax.verify.linen`, :mod:`~torch2jax.verify.equinox`), imported when the side runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class JaxSide:
    """The verifier's operations on one target's converted model.

    ``forward(r, req, jax_module, jax_path, name, torch_model, specs)``: build the model from the
    converted module, load the torch weights, compare the forward pass (and, as ``req`` asks,
    gradients, normalisation statistics, float64, a benchmark) into the result ``r``.

    ``trajectory(r, req, train, jax_path, name, torch_model, specs, setup, loss_fn)``: build and
    load the same way, train both models ``train.steps`` steps and compare losses, parameters
    and statistics into ``r``.
    """

    name: str
    keyword_inputs: bool  # NAME=SPEC (keyword) inputs to the forward pass are verified
    forward: Callable[..., None]
    trajectory: Callable[..., None]


def _nnx_forward(r: Any, req: Any, jax_module: ModuleType, jax_path: Path, name: str,
                 torch_model: Any, specs: list[Any]) -> None:
    from torch2jax.verify.nnx import run_nnx_side

    run_nnx_side(r, req, jax_module, jax_path, name, torch_model, specs)


def _nnx_trajectory(r: Any, req: Any, train: Any, jax_path: Path, name: str, torch_model: Any,
                    specs: list[Any], setup: Any, loss_fn: Callable[..., Any]) -> None:
    from torch2jax.verify.nnx import nnx_trajectory

    nnx_trajectory(r, req, train, jax_path, name, torch_model, specs, setup, loss_fn)


def _linen_forward(r: Any, req: Any, jax_module: ModuleType, jax_path: Path, name: str,
                   torch_model: Any, specs: list[Any]) -> None:
    from torch2jax.verify.linen import run_linen_side

    run_linen_side(r, req, jax_module, jax_path, name, torch_model, specs)


def _linen_trajectory(r: Any, req: Any, train: Any, jax_path: Path, name: str,
                      torch_model: Any, specs: list[Any], setup: Any,
                      loss_fn: Callable[..., Any]) -> None:
    from torch2jax.verify.linen import linen_trajectory

    linen_trajectory(r, req, train, jax_path, name, torch_model, specs, setup, loss_fn)


def _equinox_forward(r: Any, req: Any, jax_module: ModuleType, jax_path: Path, name: str,
                     torch_model: Any, specs: list[Any]) -> None:
    from torch2jax.verify.equinox import run_equinox_side

    run_equinox_side(r, req, jax_module, jax_path, name, torch_model, specs)


def _equinox_trajectory(r: Any, req: Any, train: Any, jax_path: Path, name: str,
                        torch_model: Any, specs: list[Any], setup: Any,
                        loss_fn: Callable[..., Any]) -> None:
    # equinox translates the training setup and the loss itself (train_equinox)
    from torch2jax.verify.equinox import equinox_trajectory

    equinox_trajectory(r, req, train, jax_path, name, torch_model)


SIDES: dict[str, JaxSide] = {
    side.name: side for side in (
        JaxSide("nnx", keyword_inputs=True, forward=_nnx_forward, trajectory=_nnx_trajectory),
        JaxSide("linen", keyword_inputs=False, forward=_linen_forward,
                trajectory=_linen_trajectory),
        JaxSide("equinox", keyword_inputs=False, forward=_equinox_forward,
                trajectory=_equinox_trajectory),
    )
}
