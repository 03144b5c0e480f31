"""Rule specials for ``rules/optim.toml``: a bare ``torch.optim`` constructor outside a training
script. The translation itself is :func:`torch2jax.training.translate_optimizer`'s; the
training-script pass builds the ``nnx.Optimizer`` around it where it sees the training loop."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable
from torch2jax.passes.registry import Site, special
from torch2jax.training.optim import translate_optimizer


@special("optimizer")
def optimizer(site: Site) -> cst.BaseExpression:
    """``torch.optim.X(params, ...)`` -> the optax transform."""
    tx = translate_optimizer(None, site.rule.torch, site.args)
    site.notes.extend(tx.notes)
    return tx.build()


@special("lr_scheduler")
def lr_scheduler(site: Site) -> cst.BaseExpression:
    raise Untranslatable(
        f"{site.rule.torch}: a scheduler is translated with its optimizer's learning rate, by "
        "the training-script pass (see torch2jax.training.translate_scheduler)",
        rule=site.rule.torch)
