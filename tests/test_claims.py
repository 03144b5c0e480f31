"""(d) every info note that claims a transformation corresponds to the code written: each
claim id of torch2jax/finish/claims.py, converted where it holds (the note stays) and where it
does not (the note becomes an honest warning)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from unbound import assert_names_bound

from torch2jax.convert import convert_source
from torch2jax.finish.claims import CLAIMS

ROOT = Path(__file__).resolve().parent.parent
DDP_AMP = (ROOT / "fixtures" / "training" / "ddp_amp_dataloader.py").read_text()

# an autocast context chosen at run time (not translated) and an unrecognised training loop
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
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
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


@pytest.mark.parametrize("claim_id", sorted(CLAIMS))
def test_claim_is_made_where_the_code_does_it(claim_id: str, done) -> None:
    """The DDP + bfloat16 autocast + GradScaler fixture: translated, so each note stays."""
    severity, message = done[claim_id]
    assert severity == "info"
    assert message.startswith(CLAIMS[claim_id].prefix)


@pytest.mark.parametrize("claim_id", sorted(CLAIMS))
def test_claim_is_not_made_where_the_code_does_not(claim_id: str, not_done) -> None:
    """The autocast context is chosen at run time and the loop is not recognised: no region
    computes in bfloat16, no batch is sharded. Each note is a warning that says so."""
    severity, message = not_done[claim_id]
    assert severity == "warning"
    assert message == CLAIMS[claim_id].instead
