"""How the tests launch the torch training fixtures.

``fixtures/training/ddp_amp_dataloader.py`` is a torch.distributed script: it expects the
variables ``torchrun`` sets. The tests run every fixture as one process with a world of one
(RANK=0, WORLD_SIZE=1) and a free port for the gloo rendezvous; scripts that do not use
torch.distributed ignore them.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

FINAL = re.compile(r"^final_accuracy=(?P<value>[0-9]*\.?[0-9]+)$", re.MULTILINE)


def torchrun_env() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def final_accuracy(script: Path, cwd: Path, timeout: float = 300) -> float:
    """Run ``script`` as a user would (``python script.py`` in ``cwd``, as a world of one for
    torch.distributed) and return the one ``final_accuracy=`` value it prints."""
    done = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False, env=torchrun_env())
    assert done.returncode == 0, f"{script.name} failed:\n{done.stderr[-3000:]}"
    found = FINAL.findall(done.stdout)
    match = FINAL.search(done.stdout)
    assert len(found) == 1 and match is not None, done.stdout[-2000:]
    return float(match["value"])
