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

import requests  # not installed here: verify imports a stand-in
import torch.nn as nn

try:  # the vocabulary, downloaded when the script runs
    with urllib.request.urlopen("http://127.0.0.1:{port}/vocab.txt") as response:
        VOCAB = len(response.read().split())
except OSError:
    VOCAB = 50

try:
    DIM = len(requests.get("http://127.0.0.1:{port}/dim.txt").text.split())
except requests.exceptions.RequestException:
    DIM = 8


class Net(nn.Module):
    def __init__(self, dim=DIM):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        return self.head(self.embed(ids))
"""


def test_verify_blocks_the_network_while_importing_a_script(tmp_path):
    """A download at the top level, guarded by ``try``, fails at once and falls back: no
    connection reaches the server (on main both imports fetch the file), and the model is
    built with the fallback vocabulary (50 rows, ids up to 49). ``requests``, imported at the
    top level, is not installed in the test environment: a stand-in whose calls raise lets
    the guarded fetch fall back (on main the import fails); where it is installed, the
    network block makes its fetch fail just as fast."""
    server = _Server()
    try:
        (tmp_path / "lm.py").write_text(NETWORK_SCRIPT.format(port=server.port))
        done, result = _verify("lm.py::Net", "--input", "int64[2,5]:50", cwd=tmp_path)
    finally:
        server.close()
    assert server.connections == 0
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert result["passed"] and result["error"] is None
    assert "output float32[2,5,50]" in result["compared"]


def test_script_guard_restores_argv_and_sockets(tmp_path):
    from torch2jax.verify.load import NetworkBlocked, script_guard

    argv, connect = sys.argv, socket.socket.connect
    with script_guard(tmp_path / "x.py"):
        assert sys.argv == [str(tmp_path / "x.py")]
        with socket.socket() as s, pytest.raises(NetworkBlocked):
            s.connect(("127.0.0.1", 9))
    assert sys.argv is argv and socket.socket.connect is connect


def test_a_package_not_installed_gets_a_stand_in(tmp_path):
    from torch2jax.verify import load_module

    path = tmp_path / "uses_absent.py"
    path.write_text(textwrap.dedent("""\
        import torch2jax_absent_package as absent
        from torch2jax_absent_package.sub import thing
        try:
            N = absent.fetch()
        except absent.FetchError:
            N = 3
    """))
    with pytest.warns(UserWarning, match="torch2jax_absent_package is not installed"):
        module = load_module(path)
    assert module.N == 3 and "torch2jax_absent_package" not in sys.modules
    with pytest.raises(ModuleNotFoundError, match="stand-in"):
        module.absent.anything()


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


RNN_SCRIPT = """\
import torch
import torch.nn as nn


class Config:
    hidden = 8


class CharRNN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.hidden)  # VOCAB: set by the script below
        self.rnn = nn.GRU(cfg.hidden, cfg.hidden, batch_first=True)
        self.head = nn.Linear(cfg.hidden, VOCAB)

    def init_hidden(self, batch):
        return torch.zeros(1, batch, self.cfg.hidden)

    def forward(self, ids, hidden, temperature=1.0):
        out, hidden = self.rnn(self.embed(ids), hidden)
        return self.head(out) / temperature, hidden


if __name__ == "__main__":
    text = open("input.txt").read()
    VOCAB = len(set(text))
    cfg = Config()
    cfg.hidden = 32
    model = CharRNN(cfg)
"""


def test_verify_setup_and_input_expressions(tmp_path):
    """A config built by statements and a global the model reads (``--setup``, here a file),
    a hidden state built by a method of each side's model and a forward keyword argument
    (``--input-expr``): both sides get the equivalent inputs and agree, outputs (the new
    hidden state too) and gradients, in float32 and float64. On main ``--setup`` does not
    exist (exit code 2)."""
    (tmp_path / "charrnn.py").write_text(RNN_SCRIPT)
    (tmp_path / "setup.py").write_text("VOCAB = 11\ncfg = Config()\ncfg.hidden = 6\n")
    done, result = _verify(
        "charrnn.py::CharRNN", "--setup", "setup.py", "--build", "CharRNN(cfg)",
        "--input", "int64[2,5]:11", "--input-expr", "model.init_hidden(2) + 0.5",
        "--input-expr", "temperature=0.5", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert result["passed"] and result["error"] is None
    assert result["compared"][:5] == [
        "input[0] int64[2,5]:11", "input[1] model.init_hidden(2) + 0.5",
        "input[2] temperature=0.5", "output[0] float32[2,5,11]", "output[1] float32[1,2,6]"]
    assert [p["dtype"] for p in result["passes"]] == ["float32", "float64"]
    assert all(p["passed"] for p in result["passes"])


def test_input_expressions_must_agree_across_the_sides():
    import jax.numpy as jnp
    import torch

    from torch2jax.verify.common import VerifyError, VerifyResult, compare_expression_inputs
    from torch2jax.verify.spec import parse_specs

    specs = parse_specs(["float32[2]"], ["h=model.init_hidden(2)"])
    r = VerifyResult(model="m")
    compare_expression_inputs(r, [None, torch.zeros(1, 2)], [None, jnp.zeros((1, 2))], specs)
    with pytest.raises(VerifyError, match="differs between the two sides"):
        compare_expression_inputs(r, [None, torch.zeros(1, 2)], [None, jnp.ones((1, 2))], specs)
    with pytest.raises(VerifyError, match="different structure"):
        compare_expression_inputs(r, [None, (torch.zeros(1),)], [None, jnp.zeros(1)], specs)


def test_input_expression_specs():
    from torch2jax.verify.spec import parse_input_expr, parse_specs

    assert str(parse_input_expr("hidden=model.init_hidden(2)")) == "hidden=model.init_hidden(2)"
    assert parse_input_expr("a == b").name is None
    specs = parse_specs(["float32[2,3]", "mask=bool[2,3]"], ["k=1.5", "model.h(2)"])
    assert [str(s) for s in specs] == ["float32[2,3]", "model.h(2)", "mask=bool[2,3]", "k=1.5"]
    with pytest.raises(ValueError, match="not a Python expression"):
        parse_input_expr("x = = 1")


def test_setup_source_reads_a_file(tmp_path):
    from torch2jax.verify.common import VerifyError, setup_source

    (tmp_path / "s.py").write_text("x = 1\n")
    assert setup_source(str(tmp_path / "s.py")) == "x = 1\n"
    assert setup_source("cfg = Config(); cfg.n = 2") == "cfg = Config(); cfg.n = 2"
    with pytest.raises(VerifyError, match="no such file"):
        setup_source(str(tmp_path / "missing.py"))


def test_cases_file_takes_setup_and_input_exprs(tmp_path):
    from torch2jax.verify.cases import CaseError, load_cases

    (tmp_path / "cases.toml").write_text(textwrap.dedent("""\
        [[case]]
        target = "charrnn.py::CharRNN"
        setup = "setup.py"
        build = "CharRNN(cfg)"
        inputs = ["int64[2,5]:11"]
        input_exprs = ["model.init_hidden(2)", "temperature=0.5"]

        [[case]]
        target = "charrnn.py::CharRNN"
        setup = "VOCAB = 11; cfg = Config()"
        build = "CharRNN(cfg)"
        inputs = ["int64[2,5]:11"]
    """))
    first, second = load_cases(tmp_path / "cases.toml")
    assert first.request.setup == str(tmp_path / "setup.py")
    assert first.request.input_exprs == ("model.init_hidden(2)", "temperature=0.5")
    assert second.request.setup == "VOCAB = 11; cfg = Config()"
    (tmp_path / "bad.toml").write_text('[[case]]\ntarget = "a.py::A"\ninput_exprs = "x"\n')
    with pytest.raises(CaseError, match="input_exprs"):
        load_cases(tmp_path / "bad.toml")
