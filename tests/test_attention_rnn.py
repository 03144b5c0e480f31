"""MultiheadAttention, LSTM, LSTMCell, GRU and GRUCell (rules/sequence.toml): split and summed
weight layouts, the weights moved both ways, and the JAX modules against torch's forward and
gradients.

The constructors are converted by the engine, and so are the calls (rule `call` transforms,
torch2jax/passes/calls.py). The call transforms are also applied directly to torch call
expressions here, and the JAX text they give is run on the converted modules; the whole-module
checks run torch2jax.verify on models that call these layers.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from snippets import assert_function_matches_torch

from torch2jax.convert import convert_source
from torch2jax.passes.calls import CALLS, CallSite
from torch2jax.passes.common import Untranslatable, bind, code
from torch2jax.ruleset import RuleError, builtin_rules, parse_rule_text
from torch2jax.verify.run import VerifyRequest, run_request
from torch2jax.weights import (
    _reshape_allowed,
    apply_layout,
    export_state_dict,
    gradient_map,
    gradient_parts,
    invert_layout,
    join_parts,
    transfer_state_dict,
)

RULES = builtin_rules()

# attribute -> torch constructor
LAYERS = {
    "attn": "nn.MultiheadAttention(16, 4)",
    "attn_bf": "nn.MultiheadAttention(16, 2, bias=False, batch_first=True)",
    "cross": "nn.MultiheadAttention(16, 4, kdim=8, vdim=8)",
    "lstm": "nn.LSTM(5, 6)",
    "lstm_bf": "nn.LSTM(5, 6, batch_first=True)",
    "cell": "nn.LSTMCell(5, 6)",
    "gru": "nn.GRU(5, 6)",
    "gru_bf": "nn.GRU(5, 6, batch_first=True)",
    "gcell": "nn.GRUCell(5, 6)",
}
SOURCE = "import torch\nimport torch.nn as nn\n\n\nclass Seq(nn.Module):\n" \
    "    def __init__(self):\n        super().__init__()\n" + "".join(
        f"        self.{a} = {c}\n" for a, c in LAYERS.items())


# --------------------------------------------------------------------------------------------
# layouts and rule format
# --------------------------------------------------------------------------------------------


def test_split_layout_takes_a_chunk_then_the_base_layout():
    w = np.arange(4 * 3 * 2, dtype=np.float32).reshape(12, 2)
    for i in range(3):
        part = apply_layout(w, f"transpose[{i}/3]")
        np.testing.assert_array_equal(part, w[4 * i:4 * (i + 1)].T)
        np.testing.assert_array_equal(invert_layout(part, f"transpose[{i}/3]"),
                                      w[4 * i:4 * (i + 1)])
    chunks = [invert_layout(apply_layout(w, f"transpose[{i}/3]"), f"transpose[{i}/3]")
              for i in range(3)]
    np.testing.assert_array_equal(join_parts(chunks), w)
    with pytest.raises(ValueError, match="equal parts"):
        apply_layout(np.zeros((5, 2)), "as_is[0/3]")
    with pytest.raises(ValueError, match="bad weight layout"):
        apply_layout(w, "transpose[3/3]")


def test_reshape_splits_or_merges_axes_in_place_only():
    assert _reshape_allowed((16, 16), (16, 4, 4))  # attention kernel: (E, E) -> (E, H, D)
    assert _reshape_allowed((16, 8), (4, 4, 8))  # out kernel: (E, E_out) -> (H, D, E_out)
    assert _reshape_allowed((2, 3, 4), (6, 4)) and _reshape_allowed((48,), (3, 16))
    assert _reshape_allowed((1, 6, 1), (6,))
    assert not _reshape_allowed((2, 8), (8, 2))  # a missing transpose
    assert not _reshape_allowed((4, 6), (8, 3))  # crosses an axis boundary
    assert not _reshape_allowed((16, 8), (8, 4, 4))
    assert not _reshape_allowed((4, 4), (4, 5))


def test_rule_weight_parts_are_checked():
    rule = RULES.layers["torch.nn.MultiheadAttention"]
    assert rule.weights["in_proj_weight[1/3]"].transfer_layout == "transpose[1/3]"
    assert rule.weights["in_proj_bias[2/3]"].part == (2, 3)
    # the LSTM keeps torch's two biases apart (tests/test_lstm_two_biases.py); a rule may
    # still sum several tensors into one parameter
    assert not any(w.sum for w in RULES.layers["torch.nn.LSTM"].weights.values())
    base = '[[layer]]\ntorch = "X"\nnnx = "nnx.X"\n[layer.weights]\n'
    summed = parse_rule_text(base + 'a = { to = "p", sum = true }\nb = { to = "p", sum = true }\n',
                             "ok.toml")
    assert all(w.sum for w in summed.layers["X"].weights.values())
    parse_rule_text(base + '"w[0/2]" = "a"\n"w[1/2]" = "b"\n', "ok.toml")
    for bad in ('"w[0/2]" = "a"\n', '"w[0/2]" = "a"\n"w[1/2]" = "b"\nw = "c"\n',
                '"w[0/2]" = "a"\n"w[2/2]" = "b"\n', '"w[x]" = "a"\n',
                'w = { to = "a", split = 2 }\n'):
        with pytest.raises(RuleError):
            parse_rule_text(base + bad, "bad.toml")


def test_every_call_transform_is_registered():
    for rule in RULES.layers.values():
        if rule.call:
            assert rule.call in CALLS, rule.torch
            assert rule.call_params, rule.torch


# --------------------------------------------------------------------------------------------
# the converted modules, weights moved by the rules
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted():
    result = convert_source(SOURCE, path="seq.py")
    errors = [d for d in result.diagnostics if d.severity == "error"]
    assert not errors, result.code
    return result.code


@pytest.fixture(scope="module")
def models(converted):
    ns_t: dict = {}
    exec(SOURCE, ns_t)  # noqa: S102 - the test's own source
    ns_j: dict = {}
    exec(converted, ns_j)  # noqa: S102 - its conversion
    torch.manual_seed(0)
    tm = ns_t["Seq"]().eval()
    with torch.no_grad():  # non-trivial biases (torch's MultiheadAttention starts them at 0)
        for name, p in tm.named_parameters():
            if "bias" in name:
                p.normal_()
    jm = ns_j["Seq"](rngs=nnx.Rngs(0))
    jm.eval()
    report = transfer_state_dict(tm, jm)
    return tm, jm, report


def test_constructors(converted):
    assert "self.attn = nnx.MultiHeadAttention(num_heads=4, in_features=16, decode=False, " \
        "rngs=rngs)" in converted
    assert "in_kv_features=8" in converted and "use_bias=False" in converted
    assert "self.lstm = nnx.RNN(TorchLSTMCell(5, 6, rngs=rngs), time_major=True)" in converted
    assert "self.lstm_bf = nnx.RNN(TorchLSTMCell(5, 6, rngs=rngs))" in converted
    assert "self.cell = TorchLSTMCell(5, 6, rngs=rngs)" in converted
    # the helper, with a bias on dense_i too (torch's b_ih and b_hh apart)
    assert "class TorchLSTMCell(nnx.OptimizedLSTMCell):" in converted
    assert "self.gru = nnx.RNN(TorchGRUCell(5, 6, rngs=rngs), time_major=True)" in converted
    assert "self.gru_bf = nnx.RNN(TorchGRUCell(5, 6, rngs=rngs))" in converted
    assert "self.gcell = TorchGRUCell(5, 6, rngs=rngs)" in converted
    assert "class TorchGRUCell(nnx.GRUCell):" in converted  # the helper, with a bias on dense_h


def test_transfer_maps_every_part(models):
    tm, jm, report = models
    by = {(m.torch_name, m.nnx_name): m for m in report.mapped}
    assert by[("attn.in_proj_weight", "attn.key.kernel")].layout == "transpose[1/3]"
    assert by[("attn.in_proj_bias", "attn.value.bias")].nnx_shape == (4, 4)
    assert by[("attn.out_proj.weight", "attn.out.kernel")].nnx_shape == (4, 4, 16)
    assert by[("cross.k_proj_weight", "cross.key.kernel")].nnx_shape == (8, 4, 4)
    w = tm.attn.in_proj_weight.detach().numpy()
    np.testing.assert_array_equal(np.asarray(jm.attn.value.kernel[...]),
                                  w[32:].T.reshape(16, 4, 4))
    np.testing.assert_array_equal(np.asarray(jm.attn.out.kernel[...]),
                                  tm.attn.out_proj.weight.detach().numpy().T.reshape(4, 4, 16))
    # LSTM and GRU: one flax parameter per torch tensor (the GRU's b_hn, the last third of
    # b_hh, on dense_h; the LSTM's b_ih on dense_i, not summed into dense_h's)
    for layer in ("lstm", "gru"):
        assert by[(f"{layer}.bias_hh_l0", f"{layer}.cell.dense_h.bias")].summed_into is None
        assert by[(f"{layer}.bias_ih_l0", f"{layer}.cell.dense_i.bias")].summed_into is None
    for cell, j, sfx in ((jm.gru.cell, tm.gru, "_l0"), (jm.gcell, tm.gcell, ""),
                         (jm.lstm.cell, tm.lstm, "_l0"), (jm.cell, tm.cell, "")):
        for name, dense, tr in (("weight_ih", "dense_i", True), ("weight_hh", "dense_h", True),
                                ("bias_ih", "dense_i", False), ("bias_hh", "dense_h", False)):
            want = getattr(j, name + sfx).detach().numpy()
            got = getattr(cell, dense).kernel if tr else getattr(cell, dense).bias
            np.testing.assert_array_equal(np.asarray(got[...]), want.T if tr else want)


def test_round_trip_torch_jax_torch(models):
    tm, jm, _ = models
    back = export_state_dict(tm, jm)
    state = tm.state_dict()
    assert set(back) == set(state)
    for name, value in back.items():  # every tensor as it was (no bias summed)
        np.testing.assert_array_equal(value, state[name].numpy(), err_msg=name)
    # the same torch function: load it into a copy and compare the LSTM's output
    ns: dict = {}
    exec(SOURCE, ns)  # noqa: S102
    other = ns["Seq"]().eval()
    other.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in back.items()})
    x = torch.randn(7, 2, 5)
    with torch.no_grad():
        torch.testing.assert_close(other.lstm(x)[0], tm.lstm(x)[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(other.gru(x)[0], tm.gru(x)[0], rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# calls: the call transforms' JAX text, run on the converted modules
# --------------------------------------------------------------------------------------------


def _call_text(attr: str, torch_call: str, unpack: tuple[str, ...] | None = None,
               index: int | None = None) -> str:
    ctor = cst.parse_expression(LAYERS[attr])
    rule = RULES.layers["torch." + code(ctor.func)]
    node = cst.parse_expression(torch_call)
    site = CallSite(rule=rule, func=node.func, ctor=bind(ctor.args, rule.params),
                    args=bind(node.args, rule.call_params), unpack=unpack, index=index)
    return code(CALLS[rule.call](site))


def _leaves(value) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value.detach().numpy()]
    return [np.asarray(value)]


def _compare(models, attr: str, torch_call: str, arrays: dict[str, np.ndarray],
             unpack=None, index=None) -> float:
    tm, jm, _ = models
    text = _call_text(attr, torch_call, unpack, index)
    with torch.no_grad():
        want = eval(torch_call, {"self": tm, **{k: torch.from_numpy(v) for k, v in
                                                  arrays.items()}})
    got = eval(text, {"self": jm, "jnp": jnp, **{k: jnp.asarray(v) for k, v in arrays.items()}})
    if index is not None:
        want, got = want[index], got[index]
    elif unpack is not None:  # the elements the caller ignores are not compared
        keep = [i for i, t in enumerate(unpack)
                if not all(n.startswith("_") for n in t.strip("()").replace(",", " ").split())]
        want, got = [want[i] for i in keep], [got[i] for i in keep]
    w, g = _leaves(want), _leaves(got)
    assert [a.shape for a in g] == [a.shape for a in w], text
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(g, w, strict=True))
    assert worst < 2e-6, (text, worst)
    return worst


RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 2, 16)).astype(np.float32)  # (L, N, E)
KV = RNG.standard_normal((4, 2, 16)).astype(np.float32)  # (S, N, E)
KV8 = RNG.standard_normal((4, 2, 8)).astype(np.float32)
CAUSAL = np.triu(np.ones((5, 5), bool), 1)
PAD = np.array([[False, False, True, True], [False, False, False, True]])
MASK3 = RNG.random((2 * 4, 5, 4)) < 0.4
MASK3[..., 0] = False  # no row fully masked (torch: NaN, flax: the mean of the values)


@pytest.mark.parametrize(("attr", "torch_call", "arrays", "unpack", "index"), [
    ("attn", "self.attn(x, x, x, need_weights=False)", {"x": X}, None, None),
    ("attn", "self.attn(x, k, v, need_weights=False)", {"x": X, "k": KV, "v": KV * 2}, None,
     None),
    ("attn", "self.attn(x, x, x)", {"x": X}, ("out", "_"), None),  # weights not used
    ("attn", "self.attn(x, x, x)", {"x": X}, None, 0),
    ("attn", "self.attn(x, x, x, attn_mask=m, need_weights=False)", {"x": X, "m": CAUSAL},
     None, None),
    ("attn", "self.attn(x, k, k, key_padding_mask=p, need_weights=False)",
     {"x": X, "k": KV, "p": PAD}, None, None),
    ("attn", "self.attn(x, k, k, key_padding_mask=p, attn_mask=m, need_weights=False)",
     {"x": X, "k": KV, "p": PAD, "m": MASK3}, None, None),
    ("attn", "self.attn(x, x, x, need_weights=False)", {"x": X[:, 0]}, None, None),  # unbatched
    ("attn_bf", "self.attn_bf(x, x, x, need_weights=False)", {"x": X.swapaxes(0, 1)}, None,
     None),
    ("cross", "self.cross(x, k, v, need_weights=False)", {"x": X, "k": KV8, "v": -KV8}, None,
     None),
], ids=lambda v: v if isinstance(v, str) else None)
def test_attention_call_matches_torch(models, attr, torch_call, arrays, unpack, index):
    worst = _compare(models, attr, torch_call, arrays, unpack, index)
    print(f"{torch_call}: {worst:.2g}")


XS = RNG.standard_normal((7, 2, 5)).astype(np.float32)  # (L, N, I)
H0 = RNG.standard_normal((1, 2, 6)).astype(np.float32)
C0 = RNG.standard_normal((1, 2, 6)).astype(np.float32)


@pytest.mark.parametrize(("attr", "torch_call", "arrays", "unpack"), [
    ("lstm", "self.lstm(x)", {"x": XS}, None),
    ("lstm", "self.lstm(x, (h, c))", {"x": XS, "h": H0, "c": C0}, None),
    ("lstm", "self.lstm(x)", {"x": XS}, ("out", "_")),
    ("lstm", "self.lstm(x, (h, c))", {"x": XS, "h": H0, "c": C0}, ("out", "(_h, _c)")),
    ("lstm", "self.lstm(x)", {"x": XS[:, 0]}, None),  # unbatched: h_n (1, H)
    ("lstm_bf", "self.lstm_bf(x, (h, c))", {"x": XS.swapaxes(0, 1), "h": H0, "c": C0}, None),
    ("cell", "self.cell(x, (h, c))", {"x": XS[0], "h": H0[0], "c": C0[0]}, None),
    ("cell", "self.cell(x)", {"x": XS[0]}, None),
], ids=lambda v: v if isinstance(v, str) else None)
def test_lstm_call_matches_torch(models, attr, torch_call, arrays, unpack):
    worst = _compare(models, attr, torch_call, arrays, unpack)
    print(f"{torch_call}: {worst:.2g}")


@pytest.mark.parametrize(("attr", "torch_call", "arrays", "unpack"), [
    ("gru", "self.gru(x)", {"x": XS}, None),
    ("gru", "self.gru(x, h)", {"x": XS, "h": H0}, None),
    ("gru", "self.gru(x)", {"x": XS}, ("out", "_")),
    ("gru", "self.gru(x, h)", {"x": XS, "h": H0}, ("out", "h_n")),
    ("gru", "self.gru(x, None)", {"x": XS}, None),
    ("gru", "self.gru(x)", {"x": XS[:, 0]}, None),  # unbatched: h_n (1, H)
    ("gru_bf", "self.gru_bf(x)", {"x": XS.swapaxes(0, 1)}, None),
    ("gru_bf", "self.gru_bf(x, h)", {"x": XS.swapaxes(0, 1), "h": H0}, None),
    ("gcell", "self.gcell(x, h)", {"x": XS[0], "h": H0[0]}, None),
    ("gcell", "self.gcell(x)", {"x": XS[0]}, None),
    ("gcell", "self.gcell(x, h)", {"x": XS[0, 0], "h": H0[0, 0]}, None),  # unbatched
], ids=lambda v: v if isinstance(v, str) else None)
def test_gru_call_matches_torch(models, attr, torch_call, arrays, unpack):
    worst = _compare(models, attr, torch_call, arrays, unpack)
    print(f"{torch_call}: {worst:.2g}")


def test_gru_h_n_last_layer_matches_torch(models):
    tm, jm, _ = models
    text = _call_text("gru", "self.gru(x, h)", index=1)
    with torch.no_grad():
        want = tm.gru(torch.from_numpy(XS), torch.from_numpy(H0))[1][-1].numpy()
    got = eval(text, {"self": jm, "jnp": jnp, "x": jnp.asarray(XS), "h": jnp.asarray(H0)})[1][-1]
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-6)


def test_lstm_call_with_a_state_variable(models):
    tm, jm, _ = models
    text = _call_text("lstm", "self.lstm(x, hx)")
    # a name may hold None at run time (forward(self, x, hx=None)): torch's zero state then
    assert "initial_carry=None if hx is None else (hx[1][0], hx[0][0])" in text, text
    with torch.no_grad():
        want = tm.lstm(torch.from_numpy(XS), (torch.from_numpy(H0), torch.from_numpy(C0)))
    got = eval(text, {"self": jm, "jnp": jnp, "x": jnp.asarray(XS),
                      "hx": (jnp.asarray(H0), jnp.asarray(C0))})
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)


@pytest.mark.parametrize(("attr", "torch_call", "unpack", "why"), [
    ("attn", "self.attn(x, x, x)", None, "weights are used"),
    ("attn", "self.attn(x, x, x)", ("out", "w"), "weights are used"),
    ("attn", "self.attn(x, x, x, attn_mask=a + b, need_weights=False)", None, "compound"),
    ("attn", "self.attn(x, x, x, is_causal=True, need_weights=False)", None, "is_causal"),
])
def test_attention_calls_refused(attr, torch_call, unpack, why):
    with pytest.raises(Untranslatable, match=why):
        _call_text(attr, torch_call, unpack)


# --------------------------------------------------------------------------------------------
# gradients: every part of every parameter
# --------------------------------------------------------------------------------------------


def _grads(models, attr: str, torch_call: str, arrays: dict[str, np.ndarray]):
    tm, jm, _ = models
    text = _call_text(attr, torch_call, index=0)
    torch_arrays = {k: torch.from_numpy(v) for k, v in arrays.items()}
    out = eval(torch_call, {"self": tm, **torch_arrays})[0]
    proj = np.random.default_rng(1).standard_normal(tuple(out.shape)).astype(np.float32)
    tm.zero_grad()
    (out * torch.from_numpy(proj)).sum().backward()
    torch_grads = {n: p.grad.numpy().copy() for n, p in tm.named_parameters()
                   if p.grad is not None}

    def loss(m):
        y = eval(text, {"self": m, "jnp": jnp, **{k: jnp.asarray(v) for k, v in
                                                   arrays.items()}})[0]
        return jnp.sum(y * proj)

    grads = nnx.grad(loss)(jm)
    flat = {tuple(str(p) for p in path): np.asarray(v[...] if hasattr(v, "value") else v)
            for path, v in nnx.to_flat_state(grads)}
    return torch_grads, flat


@pytest.mark.parametrize(("attr", "torch_call", "arrays"), [
    ("attn", "self.attn(x, k, v, need_weights=False)", {"x": X, "k": KV, "v": KV * 2}),
    ("cross", "self.cross(x, k, v, need_weights=False)", {"x": X, "k": KV8, "v": -KV8}),
    ("lstm", "self.lstm(x)", {"x": XS}),
    ("gru", "self.gru(x, h)", {"x": XS, "h": H0}),
    ("gru_bf", "self.gru_bf(x)", {"x": XS.swapaxes(0, 1)}),
    ("gcell", "self.gcell(x, h)", {"x": XS[0], "h": H0[0]}),
], ids=lambda v: v if isinstance(v, str) else None)
def test_gradients_match_through_every_part(models, attr, torch_call, arrays):
    tm, jm, _ = models
    torch_grads, jax_grads = _grads(models, attr, torch_call, arrays)
    parts = gradient_parts(tm, jm)
    compared = 0
    worst = 0.0
    for name, grad in torch_grads.items():
        for m in parts[name]:
            ref = apply_layout(grad, m.layout).reshape(m.nnx_shape)
            got = jax_grads[tuple(str(p) for p in m.nnx_path)]
            scale = max(1.0, float(np.max(np.abs(ref))))
            diff = float(np.max(np.abs(got - ref)))
            assert diff <= 2e-5 * scale, (name, m.nnx_name, diff)
            worst = max(worst, diff / scale)
            compared += 1
    assert compared >= 4
    # gradient_map keeps each parameter's first part: what verify compares today
    assert gradient_map(tm, jm)["attn.in_proj_weight"].nnx_name == "attn.query.kernel"
    print(f"{attr}: {compared} gradient parts, worst relative {worst:.2g}")


# --------------------------------------------------------------------------------------------
# refused layers, and whole modules through the engine
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("ctor", "why"), [
    ("nn.GRU(5, 6, bias=False)", "input-side bias"),
    ("nn.GRUCell(5, 6, bias=False)", "input-side bias"),
    ("nn.LSTM(5, 6, bias=False)", "trainable biases"),
    ("nn.LSTM(5, 6, proj_size=2)", "proj_size"),
    ("nn.MultiheadAttention(16, 4, add_bias_kv=True)", "add_bias_kv"),
    ("nn.MultiheadAttention(16, 4, kdim=8, vdim=4)", "kdim != vdim"),
])
def test_refused_constructors(ctor, why):
    src = f"import torch.nn as nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n" \
          f"        super().__init__()\n        self.layer = {ctor}\n"
    result = convert_source(src, path="m.py")
    assert any(d.severity == "error" and why in d.message for d in result.diagnostics), \
        [d.message for d in result.diagnostics]
    assert f"self.layer = {ctor}" in result.code  # left as torch code with a TODO


MODULES = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class AttnNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 4)
            self.fc = nn.Linear(16, 3)

        def forward(self, x):
            out, _ = self.attn(x, x, x, need_weights=False)
            return self.fc(out)


    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(5, 6, batch_first=True)
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            out, (h, c) = self.lstm(x)
            return self.fc(out + h[-1][:, None] + c[-1][:, None])


    class GRUNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(5, 6, batch_first=True)
            self.cell = nn.GRUCell(6, 6)
            self.fc = nn.Linear(6, 2)

        def forward(self, x):
            out, h = self.gru(x)
            y = self.cell(out[:, -1], h[-1])
            return self.fc(out + y[:, None])


    class GRUSeqFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(5, 6)

        def forward(self, x):
            h0 = torch.tanh(x[:1, :, :1]).expand(1, x.shape[1], 6).contiguous()
            out, h = self.gru(x, h0)
            return out.sum(0) * h[-1]


    class GRUCell(nn.Module):  # the file's own: the helper's name (TorchGRUCell) differs
        def __init__(self, n):
            super().__init__()
            self.fc = nn.Linear(n, n)

        def forward(self, x):
            return torch.tanh(self.fc(x))


    class OwnCell(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(5, 6, batch_first=True)
            self.mine = GRUCell(6)

        def forward(self, x):
            return self.mine(self.gru(x)[0])


    class GRUMaybeState(nn.Module):  # the state a parameter that defaults to None
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(5, 6, batch_first=True)

        def forward(self, x, h=None):
            out, h = self.gru(x, h)
            return out * h[-1][:, None]


    class LSTMMaybeState(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(5, 6, batch_first=True)

        def init_hidden(self, batch):
            return (torch.full((1, batch, 6), 0.3), torch.full((1, batch, 6), -0.2))

        def forward(self, x, hx=None):
            out, (h, c) = self.lstm(x, hx)
            return out * h[-1][:, None] + c[-1][:, None]
''')


@pytest.mark.parametrize(("name", "spec"), [("AttnNet", "float32[5,2,16]"),
                                            ("LSTMNet", "float32[2,7,5]"),
                                            ("GRUNet", "float32[2,7,5]"),
                                            ("GRUSeqFirst", "float32[7,2,5]"),
                                            ("OwnCell", "float32[2,7,5]")])
def test_whole_module_verifies(tmp_path, name, spec):
    path = tmp_path / "seq_models.py"
    path.write_text(MODULES)
    result = run_request(VerifyRequest(f"{path}::{name}", inputs=(spec,), grad=True,
                                       atol=1e-5, rtol=1e-5, float64=False))  # float64: tests/test_verify_defaults.py
    assert result.error is None, result.error
    assert result.passed, result.mismatch


@pytest.mark.parametrize(("name", "inputs", "exprs"), [
    ("GRUMaybeState", ("float32[2,7,5]",), ()),  # h None: torch's zero state
    ("GRUMaybeState", ("float32[2,7,5]", "float32[1,2,6]"), ()),
    ("LSTMMaybeState", ("float32[2,7,5]",), ()),
    ("LSTMMaybeState", ("float32[2,7,5]",), ("hx=model.init_hidden(2)",)),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_state_that_may_be_none_verifies(tmp_path, name, inputs, exprs):
    """``def forward(self, x, h=None): self.gru(x, h)``: None is torch's zero state, on an
    unmarked line it must not be indexed (``h[0]``); float64 too (the zero carry's dtype)."""
    path = tmp_path / "seq_models.py"
    path.write_text(MODULES)
    result = run_request(VerifyRequest(f"{path}::{name}", inputs=inputs, input_exprs=exprs,
                                       grad=True, atol=1e-5, rtol=1e-5))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


# --- F.scaled_dot_product_attention ----------------------------------------------------------

@pytest.mark.parametrize("torch_expr,shape", [
    ("F.scaled_dot_product_attention(q, k, v)", (2, 3, 5, 4)),
    ("F.scaled_dot_product_attention(q, k, v, is_causal=True)", (2, 3, 5, 4)),
    ("F.scaled_dot_product_attention(q, k, v, scale=0.3, dropout_p=0.0)", (2, 3, 5, 4)),
    ("F.scaled_dot_product_attention(q, k, v, is_causal=True)", (3, 5, 4)),  # no batch axis
])
def test_scaled_dot_product_attention_matches_torch(torch_expr, shape):
    source = ("import torch\nimport torch.nn.functional as F\n\n\n"
              f"def f(q, k, v):\n    return {torch_expr}\n")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    assert_function_matches_torch(source, q, k, v, rtol=1e-5)


# attn_mask: a boolean mask (True takes part) or one added to the scores, told apart by its
# dtype at run time as torch does (the attention_with_mask helper); a mask of fewer axes than
# the query broadcasts from the right (timm's Attention(attn_mask=...), issue 34)
@pytest.mark.parametrize("mask_shape,boolean,q_shape", [
    ((2, 1, 5, 6), True, (2, 3, 5, 4)),
    ((5, 6), False, (2, 3, 5, 4)),
    ((3, 5, 6), True, (3, 5, 4)),  # no batch axis
])
def test_scaled_dot_product_attention_with_a_mask_matches_torch(mask_shape, boolean, q_shape):
    source = ("import torch\nimport torch.nn.functional as F\n\n\n"
              "def f(q, k, v, m):\n    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)\n")
    rng = np.random.default_rng(0)
    kv_shape = q_shape[:-2] + (6, q_shape[-1])
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (q_shape, kv_shape, kv_shape))
    if boolean:
        m = rng.random(mask_shape) > 0.4
        m[..., 0] = True  # every query sees a key (a row of no keys is NaN in torch)
    else:
        m = rng.standard_normal(mask_shape).astype(np.float32)
    result = assert_function_matches_torch(source, q, k, v, m, rtol=1e-5, atol=1e-5)
    assert "attention_with_mask(" in result.code


@pytest.mark.parametrize("call", [
    "F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)",
])
def test_scaled_dot_product_attention_refuses_what_it_cannot_map(call):
    source = f"import torch.nn.functional as F\n\n\ndef f(q, k, v, m):\n    return {call}\n"
    result = convert_source(source, path="<sdpa>")
    assert "TODO(torch2jax)" in result.code
    assert [d.rule for d in result.diagnostics if d.severity == "error"]
