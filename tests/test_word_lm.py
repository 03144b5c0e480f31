"""The pieces of the word-level LSTM language model (issue 28, tests/corpus/word_lm), each as a
general rule on a small program of our own in that shape: converted, run, and compared with
torch's numbers.

* ``Tensor.narrow`` / ``torch.narrow``: a slice (``jax.lax.dynamic_slice_in_dim``);
* a stacked ``nn.LSTM`` (``num_layers`` not the literal 1, dropout between layers): the
  ``TorchLSTM`` helper, called as torch's LSTM;
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from torch2jax.convert import convert_source


def _convert(source: str) -> dict:
    result = convert_source(source, path="script.py")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "torch" not in {line.split()[1].split(".")[0] for line in result.code.splitlines()
                           if line.startswith("import ")}, result.code
    scope: dict = {"__name__": "converted"}
    exec(compile(result.code, "converted.py", "exec"), scope)  # noqa: S102 - its conversion
    return scope


NARROW = '''
import torch


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def window(x, start, length):
    return torch.narrow(x, -1, start, length) + x.narrow(1, -length, length)
'''


def test_narrow_is_a_slice_like_torch():
    ns: dict = {}
    exec(NARROW, ns)  # noqa: S102 - the test's own source
    scope = _convert(NARROW)
    data = np.arange(103, dtype=np.int64)
    want = ns["batchify"](torch.tensor(data), 10).numpy()
    got = np.asarray(scope["batchify"](jax.numpy.asarray(data), 10))
    np.testing.assert_array_equal(got, want)
    x = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32)
    for start, length in [(0, 2), (2, 3), (-4, 4)]:
        want = ns["window"](torch.tensor(x), start, length).numpy()
        got = np.asarray(scope["window"](jax.numpy.asarray(x), start, length))
        np.testing.assert_allclose(got, want, rtol=1e-6)


LSTM = '''
import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self, ninp, nhid, nlayers, dropout=0.5, batch_first=False):
        super().__init__()
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=batch_first)
        self.nlayers = nlayers
        self.nhid = nhid

    def forward(self, x, hidden=None):
        output, hidden = self.rnn(x, hidden)
        return output, hidden
'''


def _lstm_weights(jax_lstm, torch_lstm) -> None:
    """torch's per-layer weights into the TorchLSTM helper's layers (the gates' order is
    torch's: the kernels transposed, b_ih and b_hh the input- and hidden-side biases)."""
    sd = {k: v.detach().numpy() for k, v in torch_lstm.state_dict().items()}
    for k, layer in enumerate(jax_lstm.layers):
        layer.cell.dense_i.kernel.value = jax.numpy.asarray(sd[f"weight_ih_l{k}"].T)
        layer.cell.dense_h.kernel.value = jax.numpy.asarray(sd[f"weight_hh_l{k}"].T)
        layer.cell.dense_i.bias.value = jax.numpy.asarray(sd[f"bias_ih_l{k}"])
        layer.cell.dense_h.bias.value = jax.numpy.asarray(sd[f"bias_hh_l{k}"])


@pytest.mark.parametrize(("nlayers", "batch_first"), [(2, False), (3, True)])
def test_stacked_lstm_matches_torch(nlayers, batch_first):
    ns: dict = {}
    exec(LSTM, ns)  # noqa: S102 - the test's own source
    scope = _convert(LSTM)
    torch.manual_seed(0)
    tmodel = ns["Stack"](5, 6, nlayers, batch_first=batch_first).eval()
    jmodel = scope["Stack"](5, 6, nlayers, batch_first=batch_first, rngs=scope["nnx"].Rngs(0))
    jmodel.eval()
    _lstm_weights(jmodel.rnn, tmodel.rnn)
    shape = (2, 7, 5) if batch_first else (7, 2, 5)
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    h0 = np.random.default_rng(2).normal(size=(2, nlayers, 2, 6)).astype(np.float32)
    for hidden in (None, (h0[0], h0[1])):
        with torch.no_grad():
            t_hidden = None if hidden is None else tuple(torch.tensor(h) for h in hidden)
            t_out, (t_h, t_c) = tmodel(torch.tensor(x), t_hidden)
        j_hidden = None if hidden is None else tuple(jax.numpy.asarray(h) for h in hidden)
        j_out, (j_h, j_c) = jmodel(jax.numpy.asarray(x), j_hidden)
        np.testing.assert_allclose(np.asarray(j_out), t_out.numpy(), atol=2e-6)
        np.testing.assert_allclose(np.asarray(j_h), t_h.numpy(), atol=2e-6)
        np.testing.assert_allclose(np.asarray(j_c), t_c.numpy(), atol=2e-6)


def test_stacked_lstm_drops_out_between_layers_in_training():
    """In training mode dropout acts on the layers' outputs but the last: with p = 1 every
    layer but the first reads zeros, so the output is the one of the last layer on zeros."""
    scope = _convert(LSTM)
    jmodel = scope["Stack"](5, 6, 2, dropout=1.0, rngs=scope["nnx"].Rngs(0))
    x = jax.numpy.asarray(np.random.default_rng(1).normal(size=(4, 3, 5)).astype(np.float32))
    jmodel.train()
    out, _ = jmodel(x)
    last = jmodel.rnn.layers[1]
    np.testing.assert_allclose(np.asarray(out), np.asarray(last(jax.numpy.zeros((4, 3, 6)))),
                               atol=1e-6)
    jmodel.eval()
    out, _ = jmodel(x)
    assert not np.allclose(np.asarray(out), np.asarray(last(jax.numpy.zeros((4, 3, 6)))))


GENERATOR = '''
import torch


class Corpus(object):
    def __init__(self, vocab=10, seed=0, length=4000):
        gen = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, 3), generator=gen)
        self.noise = torch.randn(2, 3, generator=gen)
        self.order = torch.randperm(vocab, generator=gen)
        rows = torch.tensor([[0.0, 1.0, 1.0, 2.0], [0.0, 5.0, 1.0, 1.0]])
        self.rows = torch.multinomial(rows, 2, generator=gen)
        self.first = self.tokenize(length, gen)
        self.second = self.tokenize(length, gen)

    def tokenize(self, length, gen):
        return torch.multinomial(torch.tensor([6.0, 3.0, 1.0]), length, replacement=True,
                                 generator=gen)
'''


def _generator_facts(corpus, as_np) -> dict:
    first, second = as_np(corpus.first), as_np(corpus.second)
    rows = as_np(corpus.rows)
    return {
        "successors": (as_np(corpus.successors).shape, int(as_np(corpus.successors).min()) >= 0,
                       int(as_np(corpus.successors).max()) < 10),
        "noise": as_np(corpus.noise).shape,
        "order": sorted(as_np(corpus.order).tolist()),
        "frequencies": [np.mean(first == k) for k in range(3)],
        "advanced": bool((first != second).any()),
        # without replacement: two distinct picks per row, never the zero-weight column
        "rows": (rows.shape, all(len(set(r)) == 2 and 0 not in r for r in rows.tolist())),
    }


def test_a_generator_passed_as_an_object_draws_like_torch():
    """torch's seeded generator held by an object and passed to a method: a numpy Generator
    (the streams differ by design, so the draws are compared by what they are: shapes, ranges,
    frequencies, the generator's state advancing between calls, reproducibility)."""
    ns: dict = {}
    exec(GENERATOR, ns)  # noqa: S102 - the test's own source
    scope = _convert(GENERATOR)
    code = convert_source(GENERATOR, path="script.py").code
    assert "np.random.default_rng(seed)" in code
    want = _generator_facts(ns["Corpus"](), lambda t: t.numpy())
    got = _generator_facts(scope["Corpus"](), np.asarray)
    for key in ("successors", "noise", "order", "advanced", "rows"):
        assert got[key] == want[key], key
    np.testing.assert_allclose(got["frequencies"], [0.6, 0.3, 0.1], atol=0.025)
    np.testing.assert_allclose(want["frequencies"], [0.6, 0.3, 0.1], atol=0.025)
    # seeded: the same seed draws the same, another seed otherwise
    again, other = scope["Corpus"](), scope["Corpus"](seed=1)
    np.testing.assert_array_equal(np.asarray(again.first), np.asarray(scope["Corpus"]().first))
    assert (np.asarray(again.first) != np.asarray(other.first)).any()


def test_a_generator_not_always_passed_stays_marked():
    """A function drawn from a parameter that one call fills with a generator and another with
    None (torch's global generator then): not a numpy Generator, the draw stays marked."""
    source = '''
import torch


def draw(n, gen):
    return torch.randint(0, 5, (n,), generator=gen)


g = torch.Generator().manual_seed(0)
a = draw(3, g)
b = draw(3, None)
'''
    code = convert_source(source, path="script.py").code
    assert "default_rng" not in code
    assert "TODO(torch2jax)" in code.split("def draw")[1].split("\n\n")[0], code


SGD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Cell(nn.Module):
    def __init__(self, n=4, hid=5):
        super().__init__()
        self.inp = nn.Linear(n, hid)
        self.rec = nn.Linear(hid, hid)
        self.head = nn.Linear(hid, 2)

    def forward(self, x, h):
        h = torch.tanh(self.inp(x) + self.rec(h))
        return self.head(h), h


clip = 0.5
model = Cell()


def train(xs, ys, h):
    losses = []
    for i in range(xs.shape[0]):
        model.zero_grad()
        h = h.detach()
        out, h = model(xs[i], h)
        loss = F.mse_loss(out, ys[i])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses


lr = 0.5
'''


def _copy_linears(jmodel, tmodel) -> None:
    for name in ("inp", "rec", "head"):
        t = getattr(tmodel, name)
        j = getattr(jmodel, name)
        j.kernel.value = jax.numpy.asarray(t.weight.detach().numpy().T)
        j.bias.value = jax.numpy.array(t.bias.detach().numpy())


# the spellings of one SGD update (variants of the same program)
UPDATES = ["p.data.add_(p.grad, alpha=-lr)", "p.data.add_(-lr, p.grad)",
           "p.data.sub_(p.grad, alpha=lr)", "p.data.sub_(lr * p.grad)",
           "p.data.add_(-lr * p.grad)", "p.data -= lr * p.grad", "no_grad"]
LOOP = """        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
"""
NO_GRAD = """        with torch.no_grad():
            for p in model.parameters():
                p -= p.grad * lr
"""


@pytest.mark.parametrize("update", UPDATES)
def test_hand_written_sgd_with_a_carried_state_trains_like_torch(update):
    """``for p in model.parameters(): p.data.add_(p.grad, alpha=-lr)`` after clip_grad_norm_,
    the recurrent state carried between steps (detached) and the learning rate changed
    between calls by the program: the same losses and parameters as torch, step by step."""
    source = SGD.replace(LOOP, NO_GRAD) if update == "no_grad" else SGD.replace(
        "p.data.add_(p.grad, alpha=-lr)", update)
    code = convert_source(source, path="script.py").code
    assert "optax.sgd" in code and "clip_by_global_norm" in code, code
    ns: dict = {"__name__": "torch_side"}
    torch.manual_seed(0)  # (the model's initial weights: the same each run)
    with warnings.catch_warnings():  # add_(value, tensor): torch's deprecated signature
        warnings.simplefilter("ignore", UserWarning)
        exec(source, ns)  # noqa: S102 - the test's own source
    scope = _convert(source)
    _copy_linears(scope["model"], ns["model"])
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(2, 6, 3, 4)).astype(np.float32)
    ys = rng.normal(size=(2, 6, 3, 2)).astype(np.float32)
    h0 = np.zeros((3, 5), np.float32)
    for epoch in range(2):  # the second at lr / 4, as the program sets it
        want = ns["train"](torch.tensor(xs[epoch]), torch.tensor(ys[epoch]), torch.tensor(h0))
        got = scope["train"](jax.numpy.asarray(xs[epoch]), jax.numpy.asarray(ys[epoch]),
                             jax.numpy.asarray(h0))
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=2e-5,
                                   atol=1e-6)
        ns["lr"] /= 4.0
        scope["lr"] /= 4.0
    for name in ("inp", "rec", "head"):
        np.testing.assert_allclose(
            np.asarray(getattr(scope["model"], name).kernel.value),
            getattr(ns["model"], name).weight.detach().numpy().T, rtol=2e-5, atol=1e-6)


TIED = '''
import torch
import torch.nn as nn


class LM(nn.Module):
    def __init__(self, ntoken=11, nhid=6, tie_weights=False):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, nhid)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight

    def forward(self, x):
        return self.decoder(torch.tanh(self.encoder(x)))
'''


@pytest.mark.parametrize("tied", [True, False])
def test_tied_linear_head_with_a_bias_keeps_one_table(tied):
    """``self.decoder.weight = self.encoder.weight`` (a Linear with a bias, tied in a branch):
    the decoder reads the embedding's table, which stays one parameter, with its own bias;
    outputs and gradients match torch's."""
    ns: dict = {}
    exec(TIED, ns)  # noqa: S102 - the test's own source
    scope = _convert(TIED)
    nnx = scope["nnx"]
    torch.manual_seed(0)
    tmodel = ns["LM"](tie_weights=tied)
    jmodel = scope["LM"](tie_weights=tied, rngs=nnx.Rngs(0))
    jmodel.encoder.embedding.value = jax.numpy.array(tmodel.encoder.weight.detach().numpy())
    jmodel.decoder.bias.value = jax.numpy.array(tmodel.decoder.bias.detach().numpy())
    if not tied:
        jmodel.decoder.kernel.value = jax.numpy.asarray(tmodel.decoder.weight.detach().numpy().T)
    n_params = len(jax.tree.leaves(nnx.state(jmodel, nnx.Param)))
    assert n_params == len(list(tmodel.parameters())) == (2 if tied else 3)
    x = np.array([[1, 4, 7], [0, 10, 3]])
    out = tmodel(torch.tensor(x))
    out.square().sum().backward()
    got = jmodel(jax.numpy.asarray(x))
    np.testing.assert_allclose(np.asarray(got), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads = nnx.grad(lambda mdl: jax.numpy.square(mdl(jax.numpy.asarray(x))).sum())(jmodel)
    np.testing.assert_allclose(np.asarray(grads["encoder"]["embedding"].value),
                               tmodel.encoder.weight.grad.numpy(), rtol=1e-4, atol=1e-5)


CHECKPOINT = '''
import torch
import torch.nn as nn

model = nn.Linear(3, 2)


def save(path):
    with open(path, "wb") as f:
        torch.save(model.state_dict(), f)


def load(path):
    with open(path, "rb") as f:
        model.load_state_dict(torch.load(f))
'''


def test_a_checkpoint_through_an_opened_file_round_trips(tmp_path):
    """``with open(path, "wb") as f: torch.save(model.state_dict(), f)`` and its load: the
    orbax checkpoint at that path; the model saved, changed, loaded is the model saved."""
    scope = _convert(CHECKPOINT)
    model = scope["model"]
    before = np.asarray(model.kernel.value).copy()
    scope["save"](str(tmp_path / "model.pt"))
    model.kernel.value = model.kernel.value + 1.0
    scope["load"](str(tmp_path / "model.pt"))
    np.testing.assert_array_equal(np.asarray(model.kernel.value), before)


STACKED_MODELS = '''
import torch
import torch.nn as nn


class Stacked(nn.Module):
    def __init__(self, nlayers=2):
        super().__init__()
        self.rnn = nn.LSTM(5, 6, nlayers, dropout=0.3)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return out * h[-1] + c[0]


class Single(nn.Module):
    def __init__(self, nlayers=1):
        super().__init__()
        self.rnn = nn.LSTM(5, 6, nlayers, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]
'''


@pytest.mark.parametrize(("name", "spec"), [("Stacked", "float32[7,2,5]"),
                                            ("Single", "float32[2,7,5]")])
def test_stacked_lstm_verifies_with_its_weights_moved(tmp_path, name, spec):
    """torch2jax verify moves torch's per-layer LSTM weights (weight_ih_l{k}, the two biases
    summed) into the TorchLSTM helper's layers[k], also for one layer held by the helper
    (num_layers a variable that is 1), and compares outputs and gradients."""
    from torch2jax.verify.run import VerifyRequest, run_request

    path = tmp_path / "stacked.py"
    path.write_text(STACKED_MODELS)
    result = run_request(VerifyRequest(f"{path}::{name}", inputs=(spec,), grad=True,
                                       atol=1e-5, rtol=1e-5, float64=False))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_hand_written_update_without_zero_grad_stays_marked():
    """Without zero_grad torch sums the gradients of every step into .grad: not one SGD step
    per backward, so the update is not made an optimizer and stays marked."""
    source = SGD.replace("        model.zero_grad()\n", "")
    code = convert_source(source, path="script.py").code
    assert "optax.sgd" not in code
    assert "TODO(torch2jax)" in code
