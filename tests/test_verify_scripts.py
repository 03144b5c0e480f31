"""``torch2jax verify`` on research code as it is written: a model file that is also a training
script (an argparse parse and a download at its top level, a ``__main__`` block), and models
whose inputs or configuration only code can build (``--setup``, ``--input-expr``).

Each test runs the CLI in a subprocess (verify's own arguments are then in ``sys.argv``, as
they are for a user), converts the file, builds both models and compares them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

CLI = [sys.executable, "-c", "from torch2jax.cli import app; app()"]


def _verify(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([*CLI, "verify", *args, "--json"], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        result = {}
    return done, result


ARGPARSE_SCRIPT = """\
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--hidden", type=int, default=12)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self, hidden=args.hidden):
        super().__init__()
        self.fc1 = nn.Linear(6, hidden)
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


if __name__ == "__main__":
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    raise SystemExit("training starts here: verify must not run this block")
"""


def test_verify_runs_an_argparse_training_script(tmp_path):
    """The script's ``parser.parse_args()`` sees the file alone, not verify's arguments (on
    main: ``unrecognized arguments: --input ...`` and exit code 2); the ``__main__`` block does
    not run; the model is built with the argparse default."""
    (tmp_path / "train.py").write_text(ARGPARSE_SCRIPT)
    done, result = _verify("train.py::Net", "--input", "float32[2,6]", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert result["passed"] and result["error"] is None
    assert result["max_abs_diff"] < 1e-5 and result["grad_max_abs_diff"] is not None


class _Server:
    """A local HTTP server that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.recv(4096)
                body = b"a b c d e f g h i j k l m n o p q r s t"
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(body), body))

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


NETWORK_SCRIPT = """\
import urllib.request

import torch.nn as nn

try:  # the vocabulary, downloaded when the script runs
    with urllib.request.urlopen("http://127.0.0.1:{port}/vocab.txt") as response:
        VOCAB = len(response.read().split())
except OSError:
    VOCAB = 50


class Net(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        return self.head(self.embed(ids))
"""


def test_verify_blocks_the_network_while_importing_a_script(tmp_path):
    """A download at the top level, guarded by ``try``, fails at once and falls back: no
    connection reaches the server (on main both imports fetch the file), and the model is
    built with the fallback vocabulary (50 rows, ids up to 49)."""
    server = _Server()
    try:
        (tmp_path / "lm.py").write_text(NETWORK_SCRIPT.format(port=server.port))
        done, result = _verify("lm.py::Net", "--input", "int64[2,5]:50", cwd=tmp_path)
    finally:
        server.close()
    assert server.connections == 0
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert result["passed"] and result["error"] is None


def test_script_guard_restores_argv_and_sockets(tmp_path):
    from torch2jax.verify.load import NetworkBlocked, script_guard

    argv, connect = sys.argv, socket.socket.connect
    with script_guard(tmp_path / "x.py"):
        assert sys.argv == [str(tmp_path / "x.py")]
        with socket.socket() as s, pytest.raises(NetworkBlocked):
            s.connect(("127.0.0.1", 9))
    assert sys.argv is argv and socket.socket.connect is connect


def test_a_script_that_exits_at_import_is_a_load_error(tmp_path):
    from torch2jax.verify import LoadError, load_module

    path = tmp_path / "needs_args.py"
    path.write_text(textwrap.dedent("""\
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--data", required=True)
        args = parser.parse_args()
    """))
    with pytest.raises(LoadError, match="exited"):
        load_module(path)
