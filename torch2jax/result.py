"""What converting one source file gives: :class:`ConversionResult`.

Its own module, so that the passes that build one (the equinox target, the package models)
need not import the converter that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from torch2jax.finish.invariants import InputFacts
from torch2jax.finish.removed import Removed
from torch2jax.report import Diagnostic

__all__ = ["ConversionResult", "ModuleFlags", "TrainStepRecord"]


@dataclass(frozen=True)
class TrainStepRecord:
    """A train step the rewrite wrote (passes/training.py ``build_train_step``): a function
    ``name`` that takes the gradient of a loss of ``model`` and applies it with ``optimizer``.
    Target-neutral (names only, no code): a pass over the translation (targets/equinox.py)
    finds the step by its name instead of reading the code for it.

    ``functional``: the step is a function of the split state (``(graphdef, state, ...)``, the
    model and optimizer named ``model`` and ``optimizer`` inside it); ``closure``: of the state
    alone, closing over the graphdef split before it."""

    name: str
    model: str
    optimizer: str
    functional: bool = False
    closure: bool = False


class ModuleFlags(NamedTuple):
    """How the target's form of a module class is called, for the files that import it: it
    keeps state (BatchNorm), takes a key (dropout), is called on the batch as it is
    (``batched``), draws in its forward pass (a VAE's sample)."""

    stateful: bool
    keyed: bool
    batched: bool
    draws: bool


@dataclass
class ConversionResult:
    code: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    uses_torch: bool = True
    # (target "nnx-for-equinox") code of the layers written for one example (nn.Upsample)
    per_example: set[str] = field(default_factory=set)
    # the train steps the rewrite wrote, in the order it wrote them
    train_steps: tuple[TrainStepRecord, ...] = ()
    # the name of the evaluation step (``model(*inputs)`` jit-compiled) the rewrite wrote at
    # the top of the file, before any other function, or None
    eval_step: str | None = None
    # what the output checks need to know about the input (finish/invariants.py)
    facts: InputFacts | None = field(default=None, repr=False, compare=False)
    # removed statements that the finished file may need back (finish/removed.py)
    removed: dict[int, Removed] = field(default_factory=dict, repr=False, compare=False)
    failed: set[int] = field(default_factory=set, repr=False, compare=False)
    # the names the training analysis knows to hold an optimizer, with their aliases
    # (finish/grad_state.py marks a step() left on them)
    optimizer_names: frozenset[str] = field(default=frozenset(), repr=False, compare=False)
    # files written beside the converted one (path relative to its folder -> code): the
    # converted model code of installed packages it builds models from (package_models.py)
    files: dict[str, str] = field(default_factory=dict)
    # (equinox) the module classes of the file -> how they are called (ModuleFlags)
    module_flags: dict[str, ModuleFlags] = field(default_factory=dict, repr=False,
                                                 compare=False)

    @property
    def changed(self) -> bool:
        return self.uses_torch

    @property
    def todos(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "error")
