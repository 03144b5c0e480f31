"""Targets: what each JAX target is, for the passes that render it.

A :class:`Target` answers the questions the passes ask about the code they write (how a module,
a parameter or a buffer is declared; whether modules hold their own state; how training state
travels) and does the work whose code is the target's own (the linen target's step counter and
learning-rate slot, its frozen configs). The passes ask the target instead of branching on its
name: ``tests/test_architecture.py`` fails on a comparison with a target's name outside this
package. Each capability is named for the property of the target's code that the passes rely
on, so a new target states its properties rather than being special-cased.

The rewrite (``passes/rewrite.py``) renders ``nnx`` and ``linen``; ``equinox`` is, today, a pass
over an NNX translation made for it (:data:`NNX_FOR_EQUINOX`, ``targets/equinox.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import libcst as cst

from torch2jax.passes.common import arg, call, expr, nnx_parameters
from torch2jax.targets import equinox_lstm  # noqa: F401 (registers its helper class)


@dataclass(frozen=True)
class Target:
    name: str
    module_base: str  # base class of converted modules
    rngs_type: str  # annotation of the rngs parameter
    param: str  # nn.Parameter -> this constructor
    buffer: str  # register_buffer -> this constructor
    imports: tuple[str, ...]
    # the import key (convert.IMPORT_LINES) of the library its modules come from
    module_import: str = "nnx"
    # Modules own their parameters, buffers and RNG streams as attributes: layers are built
    # eagerly, with an ``rngs`` argument; a module's state is split from and merged with its
    # graph definition (nnx.split / nnx.state / nnx.update); the optimizer holds the model.
    stateful_modules: bool = False
    # Modules are frozen dataclasses: layers are declared in ``setup()``, parameters through
    # ``self.param`` and held outside the module (the variables ``model.init`` returns); a
    # module takes a ``train`` field instead of RNG state.
    setup_modules: bool = False
    # Training threads a TrainState (parameters, optimizer state, step) through pure step
    # functions (targets/linen_training.py), instead of updating a model in place.
    train_state: bool = False
    # The rewrite's output is re-read by another target's pass (the NNX translation the
    # equinox target starts from): train steps stay where the loop is, checkpoints, compiled
    # generation and per-file training bookkeeping are left to that pass, and layers are
    # applied to one example (equinox vmaps them).
    intermediate: bool = False
    # The target whose helper classes (passes/helpers.py's HELPERS) the output may use.
    helper_target: str = ""
    # The column of the rule tables its layers are built from (linen: NNX's, adapted by
    # targets/linen.py).
    layer_column: str = ""
    # helper classes with torch's constructor signature (passes/helpers.py: Conv2d, Linear,
    # BatchNorm, Embedding with padding_idx, ...) are written into the file
    helper_classes: bool = False
    # an LSTM or GRU of several layers, or bidirectional, is the TorchLSTM / TorchGRU helper
    # class (passes/helpers_rnn.py) written for this target
    stacked_rnn: bool = False
    # the attribute of a recurrent cell module that holds its hidden size
    rnn_cell_features: str = "hidden_features"
    # a parameter is declared under the name of the attribute it is assigned to
    # (``self.param("w", ...)``): the pass finds that ``self.<name>``
    parameters_named: bool = False
    # how a training step is written, for the message on a loop not recognised ("" when
    # training loops are not translated for the target)
    train_step_form: str = ""
    # ``torch.utils.checkpoint`` -> this transform
    remat: str = ""
    # models built by an installed package (torchvision.models.resnet18()) are converted from
    # the package's code (package_models.py)
    converts_package_models: bool = False
    # the target's output is a pass over another target's translation (convert.py): the name
    # of that translation's target
    rewrites_translation_of: str = ""

    @property
    def follows_packages(self) -> bool:
        """A target a user names (not an intermediate translation): package models are
        followed, converted or kept with the reason (package_models.py)."""
        return not self.intermediate

    @property
    def training_flag(self) -> str:
        """The expression a module reads for ``self.training``."""
        return "not self.deterministic"

    def step_count(self, optimizer: str) -> str:
        """The optimizer's step counter, read where a scheduler is called."""
        return f"{optimizer}.step[...]"

    def lr_slot(self, optimizer: str, quote: str = '"') -> str:
        """The optimizer's learning rate, where torch reads ``param_groups[i]["lr"]``."""
        from torch2jax.passes import training as tr

        return tr.lr_slot(optimizer, quote)

    def eval_step_function(self, tree_mode: bool = False) -> cst.FunctionDef:
        """The jit-compiled eval step written at the top of the file."""
        from torch2jax.passes import training as tr

        return tr.eval_step_function(tree_mode=tree_mode)

    def parameter_leaves(self, named: bool, frozen: bool = False
                         ) -> tuple[str, tuple[str, ...]] | None:
        """``model.parameters()`` / ``named_parameters()`` iterated: the expression (``{m}``:
        the model) and the import keys it needs, or None when the target has no such view.
        ``frozen``: the file freezes parameters (``requires_grad_(False)``), which are still
        the model's parameters."""
        return None

    def finish_module(self, module: cst.Module) -> cst.Module:
        """The target's own last step over the rewritten file."""
        return module

    def buffer_value(self, data: cst.BaseExpression
                     ) -> tuple[cst.BaseExpression, tuple[str, ...]]:
        """``register_buffer(name, data)`` / ``nn.Buffer(data)``: the attribute's value and the
        import keys it needs."""
        return call(self.buffer, arg(data)), (self.module_import,)

    def parameter_value(self, name: str | None, data: cst.BaseExpression, trainable: bool
                        ) -> tuple[cst.BaseExpression, str | None]:
        """``nn.Parameter(data, requires_grad=trainable)`` assigned to ``self.<name>`` (the
        name when :attr:`parameters_named`): the attribute's value, and a warning for the pass
        to report (or None)."""
        if not trainable:
            return (call(self.buffer, arg(data)),
                    "requires_grad=False parameter: kept as a non-trainable variable")
        return call(self.param, arg(data)), None

    def flax_function(self, name: str) -> str:
        """A flax function of the rule tables (``nnx.max_pool``) under this target's import."""
        return name

    def module_cast(self, model: cst.BaseExpression, dtype: str
                    ) -> cst.SimpleStatementLine | None:
        """``model.double()`` / ``model.to(torch.float16)`` as a statement: the module's
        floating-point state cast to ``dtype`` (a jnp dtype), or None (marked)."""
        return None


@dataclass(frozen=True)
class NnxTarget(Target):
    def module_cast(self, model: cst.BaseExpression, dtype: str
                    ) -> cst.SimpleStatementLine | None:
        from torch2jax.passes.module_casts import cast_statement

        return None if self.intermediate else cast_statement(model, dtype)

    def parameter_leaves(self, named: bool, frozen: bool = False
                         ) -> tuple[str, tuple[str, ...]] | None:
        which = nnx_parameters(frozen)
        if named:
            return (('((".".join(map(str, path)), param.value) for path, param in '
                     f"nnx.to_flat_state(nnx.state({{m}}, {which})))"), ("nnx",))
        return f"jax.tree.leaves(nnx.state({{m}}, {which}))", ("nnx", "jax")


@dataclass(frozen=True)
class LinenTarget(Target):
    @property
    def training_flag(self) -> str:
        from torch2jax.targets.linen import TRAIN

        return f"self.{TRAIN}"

    def step_count(self, optimizer: str) -> str:
        from torch2jax.targets.linen_training import STATE

        return f"{STATE}.step"

    def lr_slot(self, optimizer: str, quote: str = '"') -> str:
        from torch2jax.targets import linen_training as lt

        return lt.lr_slot(quote)

    def eval_step_function(self, tree_mode: bool = False) -> cst.FunctionDef:
        from torch2jax.targets import linen_training as lt

        return lt.eval_step_function()

    def finish_module(self, module: cst.Module) -> cst.Module:
        from torch2jax.targets.linen import freeze_configs

        return freeze_configs(module)

    def buffer_value(self, data: cst.BaseExpression
                     ) -> tuple[cst.BaseExpression, tuple[str, ...]]:
        return data, ()  # a constant computed in setup()

    def parameter_value(self, name: str | None, data: cst.BaseExpression, trainable: bool
                        ) -> tuple[cst.BaseExpression, str | None]:
        """self.w = nn.Parameter(t) -> self.w = self.param("w", lambda key: t)"""
        if not trainable:
            return data, None  # a constant
        return expr(f'self.param("{name}", lambda key: {{d}})', d=data), None

    def flax_function(self, name: str) -> str:
        return name.replace("nnx.", "nn.")  # flax.linen as nn has the same functions


@dataclass(frozen=True)
class EquinoxTarget(Target):
    def parameter_leaves(self, named: bool, frozen: bool = False
                         ) -> tuple[str, tuple[str, ...]] | None:
        if named:
            return None
        return "jax.tree.leaves(eqx.filter({m}, eqx.is_inexact_array))", ("jax", "eqx")


NNX = NnxTarget(
    name="nnx",
    module_base="nnx.Module",
    rngs_type="nnx.Rngs",
    param="nnx.Param",
    buffer="nnx.Variable",
    imports=("from flax import nnx",),
    stateful_modules=True,
    helper_classes=True,
    stacked_rnn=True,
    helper_target="nnx",
    layer_column="nnx",
    remat="nnx.remat",
    train_step_form="nnx.value_and_grad + optimizer.update",
    converts_package_models=True,
)

# the NNX translation that the equinox target's pass (targets/equinox.py) rewrites
NNX_FOR_EQUINOX = replace(NNX, intermediate=True, helper_target="equinox",
                          converts_package_models=False)

LINEN = LinenTarget(
    name="linen",
    module_base="nn.Module",
    rngs_type="",
    param="self.param",
    buffer="",
    imports=("import flax.linen as nn",),
    module_import="linen",
    setup_modules=True,
    train_state=True,
    rnn_cell_features="features",
    stacked_rnn=True,
    parameters_named=True,
    helper_target="linen",
    layer_column="nnx",
    remat="nn.remat",
    train_step_form="jax.value_and_grad + state.apply_gradients",
)

EQUINOX = EquinoxTarget(
    name="equinox",
    module_base="eqx.Module",
    rngs_type="",
    param="",
    buffer="",
    imports=("import equinox as eqx",),
    module_import="eqx",
    helper_target="equinox",
    layer_column="equinox",
    rewrites_translation_of="nnx-for-equinox",
)

TARGETS = {"nnx": NNX, "linen": LINEN, "equinox": EQUINOX}
# translations made for another target's pass (convert.py), not named by users
_INTERMEDIATE = {"nnx-for-equinox": NNX_FOR_EQUINOX}


def get_target(name: str) -> Target:
    """A target a user names (``--target``)."""
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(
            f"unknown target {name!r}; available: {', '.join(sorted(TARGETS))}"
        ) from None


def target_or_translation(name: str) -> Target:
    """:func:`get_target`, or a translation made for another target's pass (convert.py)."""
    return _INTERMEDIATE[name] if name in _INTERMEDIATE else get_target(name)


# (the earlier names)
Emitter = Target
get_emitter = get_target
