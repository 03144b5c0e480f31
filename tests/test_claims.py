"""(d) every info note that claims a transformation corresponds to the code written: each
claim id of torch2jax/finish/claims.py, converted where it holds (the note stays) and where it
does not (the note becomes an honest warning)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from unbound import assert_names_bound

from torch2jax.convert import convert_source
from torch2jax.finish.claims import CLAIMS, check_claims
from torch2jax.report import Diagnostic

ROOT = Path(__file__).resolve().parent.parent
DDP_AMP = (ROOT / "fixtures" / "training" / "ddp_amp_dataloader.py").read_text()
GROUPS = (ROOT / "tests" / "data" / "optim" / "gpt_groups_lr.py").read_text()
# the claims the DDP + autocast fixture makes (the others have their own tests below)
DDP_CLAIMS = ("ddp-sharding", "grad-scaler", "world-size-one")

# an autocast context chosen at run time in a dtype that is not translated (float32), and an
# unrecognised training loop
NOT_DONE = """
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = int(os.environ.get('RANK', -1)) != -1
world_size = dist.get_world_size() if ddp else 1
device_type = 'cpu'
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.float32)
model = nn.Linear(4, 2)
scaler = torch.cuda.amp.GradScaler(enabled=False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if ddp:
    model = DDP(model)
x, y = torch.ones(8, 4), torch.zeros(8, dtype=torch.long)
for step in range(3):
    for micro_step in range(2):
        with ctx:
            loss = F.cross_entropy(model(x), y) / 2
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
"""


def _notes(source: str) -> dict[str, tuple[str, str]]:
    """claim id -> (severity, message) of the diagnostic that carries it."""
    result = convert_source(textwrap.dedent(source), path="script.py")
    assert_names_bound(result.code)
    found = {}
    for d in result.diagnostics:
        for claim in CLAIMS.values():
            if d.message.startswith(claim.prefix) or d.message == claim.instead:
                found[claim.id] = (d.severity, d.message)
    return found


@pytest.fixture(scope="module")
def done() -> dict[str, tuple[str, str]]:
    return _notes(DDP_AMP)


@pytest.fixture(scope="module")
def not_done() -> dict[str, tuple[str, str]]:
    return _notes(NOT_DONE)


def test_every_claim_is_tested() -> None:
    assert set(CLAIMS) == {*DDP_CLAIMS, "param-groups-mask", "param-groups-multi",
                           "lr-injected", "orbax-save", "orbax-restore"}


@pytest.mark.parametrize("claim_id", DDP_CLAIMS)
def test_claim_is_made_where_the_code_does_it(claim_id: str, done) -> None:
    """The DDP + bfloat16 autocast + GradScaler fixture: translated, so each note stays."""
    severity, message = done[claim_id]
    assert severity == "info"
    assert message.startswith(CLAIMS[claim_id].prefix)


@pytest.mark.parametrize("claim_id", DDP_CLAIMS)
def test_claim_is_not_made_where_the_code_does_not(claim_id: str, not_done) -> None:
    """The autocast context is chosen at run time and the loop is not recognised: no region
    computes in bfloat16, no batch is sharded. Each note is a warning that says so."""
    severity, message = not_done[claim_id]
    assert severity == "warning"
    assert message == CLAIMS[claim_id].instead


# --------------------------------------------------------------------------------------------
# parameter groups: the mask must reach the update (issue 29)
# --------------------------------------------------------------------------------------------

_MASK = "mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)"
# what the converter wrote before: a callable hyperparameter of inject_hyperparams is called
# with the step count, so this mask decays no parameter
_INJECTED_MASK = ("tx = optax.inject_hyperparams(optax.adamw)(learning_rate=lr, "
                  f"weight_decay=0.1, {_MASK})\n")


def _groups_note(code: str) -> Diagnostic:
    note = Diagnostic("f.py", 1, 0, "param-groups", "info",
                      "parameter groups became an optax mask; the statements that only built "
                      "the groups were removed")
    return check_claims(code, [note])[0]


def test_param_groups_claim_holds_in_the_converted_program() -> None:
    """nanoGPT's groups with an injected learning rate (the scheduler is stepped in another
    function): the mask is a static_arg, the note stays."""
    notes = _notes(GROUPS)
    assert notes["param-groups-mask"][0] == "info", notes


@pytest.mark.parametrize(("code", "holds"), [
    (_INJECTED_MASK, False),
    (_INJECTED_MASK.replace("(optax.adamw)", '(optax.adamw, static_args=("mask",))'), True),
    (f"tx = optax.adamw(1e-3, weight_decay=0.1, {_MASK})\n", True),
    (("tx = optax.inject_hyperparams(lambda learning_rate: optax.chain(optax.adamw("
      f"learning_rate, {_MASK})))(learning_rate=lr)\n"), True),
    (("tx = optax.inject_hyperparams(optax.adadelta)(learning_rate=lr, weight_decay=0.1, "
      "weight_decay_mask=m)\n"), False),
    ("tx = optax.adamw(1e-3, weight_decay=0.1)\n", False),  # no mask at all
])
def test_param_groups_claim_checks_where_the_mask_goes(code: str, holds: bool) -> None:
    d = _groups_note(code)
    assert d.severity == ("info" if holds else "warning")
    if not holds:
        assert d.message == CLAIMS["param-groups-mask"].instead


# --------------------------------------------------------------------------------------------
# verify's trajectory notes: "no Dropout modules found" only where there are none
# --------------------------------------------------------------------------------------------


def test_dropout_at_rate_zero_is_not_reported_missing() -> None:
    """nanoGPT's dropout=0.0 config builds nn.Dropout(0.0) modules: they are there."""
    from flax import nnx

    from torch2jax.verify.nnx import nnx_trajectory_mode

    class WithDropout(nnx.Module):
        def __init__(self, rate):
            self.drop = nnx.Dropout(rate, rngs=nnx.Rngs(0))
            self.fc = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    class WithoutDropout(nnx.Module):
        def __init__(self):
            self.fc = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    notes = nnx_trajectory_mode(WithDropout(0.0), 0, 0)
    assert not any("no Dropout modules found" in n for n in notes), notes
    assert any("1 nnx.Dropout modules at rate 0 already" in n for n in notes), notes
    notes = nnx_trajectory_mode(WithDropout(0.1), 1, 0)
    assert any("1 torch Dropout modules and 1 nnx.Dropout set to p=0" in n for n in notes)
    assert any("no Dropout modules found" in n
               for n in nnx_trajectory_mode(WithoutDropout(), 0, 0))


# --------------------------------------------------------------------------------------------
# the learning rate set by hand: an injected hyperparameter the code sets
# --------------------------------------------------------------------------------------------

LR_BY_HAND = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        return self.fc(x)


def train(steps):
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.ones(5, 3), torch.zeros(5, 4)
    for step in range(steps):
        for g in optimizer.param_groups:
            g['lr'] = 0.01 * (step + 1)
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    return model
"""


@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
def test_lr_injected_claim_holds_in_the_converted_program(target: str) -> None:
    result = convert_source(LR_BY_HAND, path="script.py", target=target)
    notes = [d for d in result.diagnostics if d.message.startswith(CLAIMS["lr-injected"].prefix)
             or d.message == CLAIMS["lr-injected"].instead]
    assert [d.severity for d in notes] == ["info"], [str(d) for d in result.diagnostics]


def _lr_note(code: str) -> Diagnostic:
    note = Diagnostic("f.py", 1, 0, "param_groups", "info",
                      f"{CLAIMS['lr-injected'].prefix}: optimizer's injected learning_rate")
    return check_claims(code, [note])[0]


_INJECTED = "tx = optax.inject_hyperparams(optax.adamw)(learning_rate=0.01)\n"


@pytest.mark.parametrize(("code", "holds"), [
    (_INJECTED + 'optimizer.opt_state.hyperparams["learning_rate"].value = lr\n', True),
    (_INJECTED + "opt_state.hyperparams['learning_rate'] = jnp.float32(lr)\n", True),
    (_INJECTED + 'state.opt_state.hyperparams["learning_rate"] = jnp.float32(lr)\n', True),
    # the loop left as torch wrote it: nothing sets the injected rate
    (_INJECTED + "for g in optimizer.param_groups:\n    g['lr'] = lr\n", False),
    # the slot set, but the optimizer is not injected (its state has no hyperparams)
    (("tx = optax.adamw(0.01)\n" 'opt_state.hyperparams["learning_rate"] = lr\n'), False),
])
def test_lr_injected_claim_checks_the_code(code: str, holds: bool) -> None:
    d = _lr_note(code)
    assert d.severity == ("info" if holds else "warning")
    if not holds:
        assert d.message == CLAIMS["lr-injected"].instead


# --------------------------------------------------------------------------------------------
# checkpoints: "saves / restores an orbax checkpoint" only where the orbax call is written
# --------------------------------------------------------------------------------------------

CHECKPOINT = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


torch.manual_seed(0)
model = Net()
run = True
if run:
    torch.save(model.state_dict(), "net.pt")
    model.load_state_dict(torch.load("net.pt"))
    {use}
"""


@pytest.mark.parametrize(("target", "use", "holds"), [
    ("nnx", "print(run)", True),
    ("equinox", "print(run)", True),
    # equinox: the model called with dropout outside a step: the block is commented out,
    # the save and the restore in it with it
    ("equinox", "print(model(torch.ones(2, 3)))", False),
])
def test_checkpoint_claims_follow_the_code(target: str, use: str, holds: bool) -> None:
    result = convert_source(CHECKPOINT.format(use=use), path="script.py", target=target)
    for claim in ("orbax-save", "orbax-restore"):
        notes = [d for d in result.diagnostics
                 if d.message.startswith(CLAIMS[claim].prefix)
                 or d.message == CLAIMS[claim].instead]
        assert [d.severity for d in notes] == ["info" if holds else "warning"], (
            claim, [str(d) for d in result.diagnostics], result.code)


@pytest.mark.parametrize(("code", "holds"), [
    ('tx = optax.multi_transform({"body": optax.sgd(0.1), "head": optax.sgd(0.01)}, labels)\n',
     True),
    ("tx = torch.optim.SGD(groups, lr=0.1)\n", False),  # kept as torch wrote it
])
def test_multi_transform_claim(code: str, holds: bool) -> None:
    note = Diagnostic("f.py", 1, 0, "param-groups", "info",
                      "parameter groups became optax.multi_transform (2 groups: one transform "
                      "per group, a label per parameter)")
    out = check_claims(code, [note])[0]
    assert (out.severity == "info") is holds, out
