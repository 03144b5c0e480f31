"""How the tests launch the torch training fixtures.

``fixtures/training/ddp_amp_dataloader.py`` is a torch.distributed script: it expects the
variables ``torchrun`` sets. The tests run every fixture as one process with a world of one
(RANK=0, WORLD_SIZE=1) and a free port for the gloo rendezvous; scripts that do not use
torch.distributed ignore them.
"""

from __future__ import annotations

import os
import socket


def torchrun_env() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
