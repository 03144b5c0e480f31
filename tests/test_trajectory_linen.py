"""Training trajectories for --target linen: the converted linen module (torch weights
transferred into its variables) trained with the training code linen output uses (a
``TrainState``, ``jax.value_and_grad`` of ``model.clone(train=True).apply`` under ``jax.jit``,
``mutable=["batch_stats"]``) against torch, step by step on the same batches; the worst
relative difference of the losses and of the final parameters stays within 1e-5 (float32,
CPU), as for NNX (tests/test_trajectory.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.verify.run import VerifyRequest
from torch2jax.verify.trajectory import TrainSpec, verify_trajectory

ROOT = Path(__file__).resolve().parent.parent
MLP = VerifyRequest(f"{ROOT / 'fixtures' / 'models' / 'mlp.py'}::MLP",
                    args={"in_features": 6, "hidden_sizes": [8], "num_classes": 3},
                    inputs=("float32[4,6]",), jax_target="linen")
CE = "F.cross_entropy(output, labels)"
TOL = 1e-5


def _check(req: VerifyRequest, train: TrainSpec):
    r = verify_trajectory(req, train)
    assert r.error is None, r.error
    assert len(r.losses_jax) == train.steps
    assert r.loss_max_rel_diff <= TOL and r.param_max_rel_diff <= TOL, r.to_json()
    assert r.passed
    return r


@pytest.mark.parametrize(("optimizer", "scheduler", "clip"), [
    ("torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)",
     "lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)", 1.0),
    ("torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)",
     "lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.3)", None),
    ("torch.optim.SGD(params, lr=0.1, momentum=0.9)",
     "lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)", 1.0),
], ids=["adamw-cosine-clip", "sgd-steplr", "sgd-plateau-clip"])
def test_linen_mlp_trains_like_torch(optimizer: str, scheduler: str, clip) -> None:
    _check(MLP, TrainSpec(optimizer, CE, "int64[4]:3", scheduler=scheduler,
                          clip_grad_norm=clip))


@pytest.mark.slow
def test_linen_batchnorm_and_dropout_model() -> None:
    """The CNN fixture: BatchNorm on batch statistics with mutable batch_stats, nn.Dropout
    intercepted (torch's Dropout at p = 0)."""
    req = VerifyRequest(f"{ROOT / 'fixtures' / 'models' / 'cnn.py'}::CNN",
                        args={"num_classes": 3}, inputs=("float32[2,3,32,32]",),
                        jax_target="linen")
    r = _check(req, TrainSpec("torch.optim.SGD(params, lr=0.05, momentum=0.9, "
                              "weight_decay=1e-3)", CE, "int64[2]:3", steps=3))
    assert any("nn.Dropout intercepted" in n for n in r.notes), r.notes
