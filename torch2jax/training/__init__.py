"""Training-loop translation: ``torch.optim`` optimizers and ``torch.optim.lr_scheduler``
schedulers as optax expressions (libcst nodes), for the script-rewriting pass and the verifier."""

from torch2jax.training.optim import (
    OptimizerTx,
    Schedule,
    optimizer_names,
    scheduler_names,
    translate_optimizer,
    translate_scheduler,
    with_clipping,
)

__all__ = [
    "OptimizerTx",
    "Schedule",
    "optimizer_names",
    "scheduler_names",
    "translate_optimizer",
    "translate_scheduler",
    "with_clipping",
]
