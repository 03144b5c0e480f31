"""The converted LSTM trains as torch's: torch's cell has two biases, b_ih and b_hh, and an
optimizer updates each (plain SGD moves their sum twice as far as it would move one bias, Adam
each by about lr, weight decay acts on each). flax's OptimizedLSTMCell and eqx.nn.LSTMCell
have one, the sum: the same forward and gradients, another training. The converted cell (the
TorchLSTMCell helper of each target, and the stacked TorchLSTM built from it) keeps torch's
four tensors.

A classifier of a one-layer LSTM, an LSTMCell run twice and (NNX, linen) a stacked
bidirectional LSTM, converted to each target, with torch's weights: 3 SGD steps and 3 Adam
steps on the same batches on both sides, the losses and every parameter (both biases)
compared with torch's, and the parameter count with torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torch2jax.convert import convert_source

SOURCE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, inp=3, hidden=4, classes=3):
        super().__init__()
        self.rnn = nn.LSTM(inp, hidden, batch_first=True)
        self.cell = nn.LSTMCell(inp, hidden)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        first, second = x[:, 0], x[:, 1]
        h2, c2 = self.cell(first)
        h2, c2 = self.cell(second, (h2, c2))
        return self.head(h[-1] + out.mean(1) + h2 * c2)
'''

STACKED = '''

class BiNet(nn.Module):
    def __init__(self, inp=3, hidden=4, classes=3):
        super().__init__()
        self.rnn = nn.LSTM(inp, hidden, batch_first=True)
        self.cell = nn.LSTMCell(inp, hidden)
        self.bi = nn.LSTM(inp, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(hidden, classes)
        self.bihead = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        first, second = x[:, 0], x[:, 1]
        h2, c2 = self.cell(first)
        h2, c2 = self.cell(second, (h2, c2))
        both, _ = self.bi(x)
        return self.head(h[-1] + out.mean(1) + h2 * c2) + self.bihead(both.mean(1))
'''

# one model per target (one compile): equinox translates a one-layer LSTM (a stacked one is
# its own helper, targets/equinox_lstm.py, with torch's four tensors per layer; not
# bidirectional)
MODELS = {"nnx": "BiNet", "linen": "BiNet", "equinox": "Net"}
OPTIMIZERS = {"sgd": 0.5, "adam": 0.05}
TOLERANCES = {"sgd": {"rtol": 1e-5, "atol": 2e-6}, "adam": {"rtol": 1e-4, "atol": 4e-5}}
STEPS = 3


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(4, 5, 3)).astype(np.float32), rng.integers(0, 3, size=4))
            for _ in range(STEPS)]


@pytest.fixture(scope="module")
def scopes() -> dict[str, dict]:
    out = {}
    for target in ("nnx", "linen", "equinox"):
        source = SOURCE if target == "equinox" else SOURCE + STACKED
        result = convert_source(source, path="lstm.py", target=target)
        errors = [d.render() for d in result.diagnostics if d.severity == "error"]
        assert errors == [] and "TODO" not in result.code, errors
        assert "class TorchLSTMCell(" in result.code
        ns: dict = {}
        exec(result.code, ns)  # noqa: S102 - the conversion of the test's own source
        out[target] = ns
    return out


def _torch_run(model: torch.nn.Module, opt: str, batches: list) -> tuple[list, dict]:
    cls = torch.optim.SGD if opt == "sgd" else torch.optim.Adam
    optimizer = cls(model.parameters(), lr=OPTIMIZERS[opt])
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


class _Jax:
    """One converted model with torch's weights: its parameters as a tree, a jitted loss and
    gradient (one compile for both optimizers), and the tree read back under torch's names."""

    def __init__(self, target: str, ns: dict, name: str, tm: torch.nn.Module, x: np.ndarray):
        import jax
        import optax

        self.target, self.tm = target, tm

        def ce(logits, y):
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        if target == "nnx":
            from flax import nnx

            from torch2jax.weights import transfer_state_dict

            model = ns[name](rngs=nnx.Rngs(0))
            transfer_state_dict(tm, model)
            graphdef, self.params, rest = nnx.split(model, nnx.Param, ...)
            self.merge = lambda params: nnx.merge(graphdef, params, rest)

            def loss(params, x, y):
                return ce(nnx.merge(graphdef, params, nnx.clone(rest))(x), y)
        elif target == "linen":
            from torch2jax.verify.linen import transfer_to_linen

            module = ns[name]()
            variables, self.plan = transfer_to_linen(tm, module.init(jax.random.key(0), x))
            self.params = variables["params"]

            def loss(params, x, y):
                return ce(module.apply({"params": params}, x), y)
        else:
            import equinox as eqx

            from torch2jax.verify.equinox import transfer_to_equinox

            model, _, self.plan = transfer_to_equinox(tm, ns[name](key=jax.random.key(0)), None)
            self.params, static = eqx.partition(model, eqx.is_inexact_array)

            def loss(params, x, y):
                return ce(jax.vmap(eqx.combine(params, static))(x), y)
        self.loss_and_grad = jax.jit(jax.value_and_grad(loss))

    def run(self, opt: str, batches: list) -> tuple[list, dict]:
        import optax

        tx = (optax.sgd if opt == "sgd" else optax.adam)(OPTIMIZERS[opt])
        params, state, losses = self.params, None, []
        state = tx.init(params)
        for x, y in batches:
            loss, grads = self.loss_and_grad(params, x, y)
            updates, state = tx.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            losses.append(float(loss))
        return losses, self.torch_names(params)

    def torch_names(self, params) -> dict[str, np.ndarray]:
        if self.target == "nnx":
            from torch2jax.weights import export_state_dict

            out = export_state_dict(self.tm, self.merge(params))
            return {k: np.asarray(v) for k, v in out.items()}
        if self.target == "linen":
            from torch2jax.weights import invert_layout

            out = {}
            for mp in self.plan.mappings:
                node = {"params": params}
                for p in mp.nnx_path:
                    node = node[p]
                out[mp.torch_name] = invert_layout(np.asarray(node), mp.layout).reshape(
                    mp.torch_shape)
            return out
        from torch2jax.verify.equinox import torch_value

        return {key: torch_value(params, parts) for key, parts in self.plan.params}

    def count(self) -> int:
        import jax

        return sum(leaf.size for leaf in jax.tree.leaves(self.params))


@pytest.mark.parametrize("target", list(MODELS))
def test_training_steps_match_torch(scopes, target):
    name = MODELS[target]
    ns: dict = {}
    exec(SOURCE + STACKED, ns)  # noqa: S102 - the test's own source
    torch.manual_seed(0)
    tm = ns[name]()
    start = {k: v.clone() for k, v in tm.state_dict().items()}
    batches = _batches()
    side = _Jax(target, scopes[target], name, tm, batches[0][0])
    # the parameter count a program prints (sum(p.numel() for p in model.parameters()))
    assert side.count() == sum(p.numel() for p in tm.parameters())
    for opt in OPTIMIZERS:
        tm.load_state_dict(start)
        want_losses, want = _torch_run(tm, opt, batches)
        got_losses, got = side.run(opt, batches)
        np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=1e-6, err_msg=opt)
        assert set(got) == set(want)
        biases = [k for k in want if "bias_ih" in k or "bias_hh" in k]
        assert len(biases) == (12 if name == "BiNet" else 4)
        for key in want:
            # each bias moved by torch's optimizer on its own (the sum moves differently)
            assert not np.allclose(want[key], start[key].numpy()), key
            # (Adam divides by the gradients' scale: float32 noise weighs more)
            np.testing.assert_allclose(got[key], want[key], err_msg=f"{opt} {key}",
                                       **TOLERANCES[opt])
