"""Info diagnostics that claim a transformation, checked against the code written.

Some notes are written where one statement is translated but speak for another part of the
file: "GradScaler removed: the autocast region computes in bfloat16" is true only when the
autocast region was translated; "DistributedDataParallel removed: the batch is sharded" only
when a training loop got the data sharding; "parameter groups became an optax mask" only
when the mask reaches the update (not a callable passed as an injected hyperparameter). Each
such note has a claim id here, the text it starts with, and a test of the converted code.
When the code does not do what the note says, the note is replaced by an honest warning; the
test suite checks every claim id both ways (tests/test_claims.py).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from torch2jax.report import Diagnostic


@dataclass(frozen=True)
class Claim:
    id: str
    prefix: str  # the start of the message that makes the claim
    holds: Callable[[str], bool]  # over the converted code
    instead: str  # the warning's message when it does not hold


def _computes_in_bfloat16(code: str) -> bool:
    """A translated autocast region: a bfloat16 dtype policy, and no torch autocast left."""
    return "jnp.bfloat16" in code and re.search(r"\bautocast\(", code) is None


def _batches_sharded(code: str) -> bool:
    """Batches put on the devices with the data sharding."""
    return "NamedSharding(" in code and re.search(
        r"jax\.device_put\([^\n]*\bdata_sharding\)", code) is not None


_MASK_ARGS = ("mask", "weight_decay_mask")


def _mask_reaches_the_update(code: str) -> bool:
    """A weight-decay mask is given to an optax transform, and none is an
    ``optax.inject_hyperparams(f)(..., mask=...)`` hyperparameter: inject_hyperparams calls
    every callable argument that is not one of its ``static_args`` with the step count, so
    such a mask decays nothing."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    masked = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        given = [k.arg for k in node.keywords if k.arg in _MASK_ARGS]
        if not given:
            continue
        masked = True
        inner = node.func
        if isinstance(inner, ast.Call) and ast.unparse(inner.func).endswith("inject_hyperparams"):
            static = next((k.value for k in inner.keywords if k.arg == "static_args"), None)
            names = set()
            if isinstance(static, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in static.elts if isinstance(e, ast.Constant)}
            elif isinstance(static, ast.Constant):
                names = {static.value}
            if set(given) - names:
                return False
    return masked


def _checkpointer_call(method: str) -> Callable[[str], bool]:
    """An orbax ``checkpointer.<method>(...)`` call in the code (not in a comment: the
    equinox pass comments out a block it cannot translate)."""
    def holds(code: str) -> bool:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            return False
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr == method and isinstance(n.func.value, ast.Name)
                   and n.func.value.id == "checkpointer" for n in ast.walk(tree))
    return holds


# opt_state.hyperparams["learning_rate"] = ... (equinox, linen's state.opt_state...) or
# optimizer.opt_state.hyperparams["learning_rate"].value = ... (nnx)
_LR_SLOT = re.compile(r"""opt_state\.hyperparams\[["']learning_rate["']\](\.value)? = """)


def _lr_is_injected(code: str) -> bool:
    """The learning rate set by hand is written into an injected hyperparameter, and the
    optimizer of the file is built with optax.inject_hyperparams (without it the state has
    no hyperparams)."""
    return "optax.inject_hyperparams(" in code and _LR_SLOT.search(code) is not None


CLAIMS: dict[str, Claim] = {c.id: c for c in (
    Claim("grad-scaler", "GradScaler removed: the autocast region computes in bfloat16",
          _computes_in_bfloat16,
          "GradScaler removed (JAX computes float32 and bfloat16 without loss scaling), but "
          "no autocast region was translated to bfloat16 here: the program computes in "
          "float32 (see the autocast line's TODO)"),
    Claim("ddp-sharding", "DistributedDataParallel removed: the batch is sharded",
          _batches_sharded,
          "DistributedDataParallel removed: the model is used as it is, but no training loop "
          "of this file got the data sharding (a loop left untranslated carries a TODO): the "
          "program runs on one device unless its batches are put on a "
          "NamedSharding(mesh, P('data'))"),
    Claim("world-size-one", "world size 1: the JAX script is one program",
          _batches_sharded,
          "world size 1: the JAX script is one program over every device, but no training "
          "loop of this file shards its batches over them (a loop left untranslated carries "
          "a TODO)"),
    Claim("param-groups-mask", "parameter groups became an optax mask",
          _mask_reaches_the_update,
          "parameter groups: the weight-decay mask written does not reach the update (an "
          "optax.inject_hyperparams hyperparameter that is a callable is called with the "
          "step count): no parameter is decayed; pass the mask in static_args"),
    Claim("param-groups-multi", "parameter groups became optax.multi_transform",
          lambda code: "optax.multi_transform(" in code,
          "parameter groups: no optax.multi_transform is written in the code (the optimizer "
          "is kept as torch wrote it, see its TODO): the groups' own options are not used"),
    Claim("orbax-save", "saves an orbax checkpoint", _checkpointer_call("save"),
          "torch.save: no orbax checkpoint is written in the code (the statement is kept as "
          "torch wrote it or commented out, see its TODO): nothing is saved"),
    Claim("orbax-restore", "restores an orbax checkpoint", _checkpointer_call("restore"),
          "torch.load: no orbax checkpoint is restored in the code (the statement is kept as "
          "torch wrote it or commented out, see its TODO): the model keeps the weights it "
          "was built with"),
    Claim("lr-injected", "param_groups learning rate set in the optimizer state",
          _lr_is_injected,
          "param_groups learning rate: no injected learning_rate is set in the code written "
          "(or the optimizer is not built with optax.inject_hyperparams): the rate set by "
          "hand does not reach the update; set opt_state.hyperparams['learning_rate']"),
)}


def check_claims(code: str, diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """``diagnostics`` with every info note whose claim the code does not hold replaced by
    its warning."""
    out = []
    verdicts: dict[str, bool] = {}
    for d in diagnostics:
        claim = claim_of(d)
        if claim is not None:
            if claim.id not in verdicts:
                verdicts[claim.id] = claim.holds(code)
            if not verdicts[claim.id]:
                d = replace(d, severity="warning", message=claim.instead)
        out.append(d)
    return out


def claim_of(d: Diagnostic) -> Claim | None:
    if d.severity != "info":
        return None
    return next((c for c in CLAIMS.values() if d.message.startswith(c.prefix)), None)
