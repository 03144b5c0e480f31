"""``convert --init torch``: the converted layers draw their parameters from torch's default
distributions. Each parameter is compared with the same torch layer's own initialisation: the
bound of a uniform draw exactly (every sample inside it, the largest close to it), the standard
deviation within a few percent (thousands of samples)."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source

SOURCE = textwrap.dedent('''
    import torch.nn as nn


    class M(nn.Module):
        def __init__(self, width: int = 64):
            super().__init__()
            self.fc = nn.Linear(width, 4096)
            self.conv = nn.Conv2d(width, 256, 3, groups=4)
            self.conv1 = nn.Conv1d(32, 512, kernel_size=5)
            self.deconv = nn.ConvTranspose2d(128, 96, 3, stride=2)
            self.emb = nn.Embedding(1000, 64)
            self.attn = nn.MultiheadAttention(64, 4)
            self.cross = nn.MultiheadAttention(64, 4, kdim=32, vdim=32)
            self.norm = nn.LayerNorm(64)
            self.lstm = nn.LSTM(32, 256)
            self.gru = nn.GRU(32, 256)
''')

# torch tensor -> the NNX parameter(s) it lands in, and torch's bound (None: N(0, 1))
PAIRS = {
    "fc.weight": (["fc.kernel"], 1 / math.sqrt(64)),
    "fc.bias": (["fc.bias"], 1 / math.sqrt(64)),
    "conv.weight": (["conv.kernel"], 1 / math.sqrt(16 * 9)),  # in / groups * kh * kw
    "conv.bias": (["conv.bias"], 1 / math.sqrt(16 * 9)),
    "conv1.weight": (["conv1.kernel"], 1 / math.sqrt(32 * 5)),
    "conv1.bias": (["conv1.bias"], 1 / math.sqrt(32 * 5)),
    "deconv.weight": (["deconv.kernel"], 1 / math.sqrt(96 * 9)),  # torch: weight.size(1) = out
    "deconv.bias": (["deconv.bias"], 1 / math.sqrt(96 * 9)),
    "emb.weight": (["emb.embedding"], None),
    # xavier_uniform over the packed (3E, E) matrix
    "attn.in_proj_weight": (["attn.query.kernel", "attn.key.kernel", "attn.value.kernel"],
                            math.sqrt(6 / (64 + 3 * 64))),
    "attn.out_proj.weight": (["attn.out.kernel"], 1 / math.sqrt(64)),
    "cross.q_proj_weight": (["cross.query.kernel"], math.sqrt(6 / (64 + 64))),
    "cross.k_proj_weight": (["cross.key.kernel"], math.sqrt(6 / (64 + 32))),
    "cross.v_proj_weight": (["cross.value.kernel"], math.sqrt(6 / (64 + 32))),
    # every LSTM weight and bias U(-1/sqrt(H), 1/sqrt(H)), each bias one draw (the
    # TorchLSTMCell helper keeps torch's two apart)
    "lstm.weight_ih_l0": (["lstm.cell.dense_i.kernel"], 1 / 16),
    "lstm.weight_hh_l0": (["lstm.cell.dense_h.kernel"], 1 / 16),
    "lstm.bias_ih_l0": (["lstm.cell.dense_i.bias"], 1 / 16),
    "lstm.bias_hh_l0": (["lstm.cell.dense_h.bias"], 1 / 16),
    # every GRU weight and bias too, each bias one draw (the helper keeps torch's two apart)
    "gru.weight_ih_l0": (["gru.cell.dense_i.kernel"], 1 / 16),
    "gru.weight_hh_l0": (["gru.cell.dense_h.kernel"], 1 / 16),
    "gru.bias_ih_l0": (["gru.cell.dense_i.bias"], 1 / 16),
    "gru.bias_hh_l0": (["gru.cell.dense_h.bias"], 1 / 16),
}
ZEROS = {"attn.in_proj_bias": ["attn.query.bias", "attn.key.bias", "attn.value.bias"],
         "attn.out_proj.bias": ["attn.out.bias"], "norm.bias": ["norm.bias"]}


def _get(tree, path: str) -> np.ndarray:
    for part in path.split("."):
        tree = getattr(tree, part)
    return np.asarray(tree[...]).ravel()


def _check(got: np.ndarray, want: np.ndarray, bound: float | None, name: str) -> None:
    if bound is None:  # N(0, 1)
        for x in (got, want):
            assert abs(x.mean()) < 0.02 and abs(x.std() - 1) < 0.02, name
        return
    for x in (got, want):
        assert np.abs(x).max() <= bound * (1 + 1e-6), name
        # the largest of n uniform draws: within bound * (1 - 5 / n) but for a 0.7% chance
        assert np.abs(x).max() >= bound * (1 - 5 / x.size), name
    assert got.std() == pytest.approx(bound / math.sqrt(3), rel=0.1 if got.size < 1000 else 0.03)
    assert got.std() == pytest.approx(want.std(), rel=0.12 if got.size < 1000 else 0.04), name


@pytest.fixture(scope="module")
def models():
    result = convert_source(SOURCE, path="init.py", init="torch")
    assert not result.diagnostics, [d.render() for d in result.diagnostics]
    ns_t: dict = {}
    ns_j: dict = {}
    exec(SOURCE, ns_t)  # noqa: S102 - the test's own source
    exec(result.code, ns_j)  # noqa: S102 - its conversion
    torch.manual_seed(0)
    return ns_t["M"](), ns_j["M"](rngs=nnx.Rngs(0)), result.code


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_distribution_is_torchs(models, name):
    model_t, model_j, _ = models
    paths, bound = PAIRS[name]
    want = dict(model_t.named_parameters())[name].detach().numpy().ravel()
    got = np.concatenate([_get(model_j, p) for p in paths])
    assert got.size == want.size
    _check(got, want, bound, name)


def test_zero_biases_and_norms(models):
    model_t, model_j, _ = models
    params = dict(model_t.named_parameters())
    for name, paths in ZEROS.items():
        assert not params[name].detach().numpy().any()
        assert not any(_get(model_j, p).any() for p in paths), name
    assert (_get(model_j, "norm.scale") == 1).all()


def test_written_as_flax_initializers(models):
    code = models[2]
    assert 'kernel_init=jax.nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")' in code
    assert "bias_init=torch_uniform_init(width)" in code
    assert "bias_init=torch_uniform_init((width // 4) * 3 * 3)" in code
    assert "bias_init=torch_uniform_init(864)" in code  # ConvTranspose: out * kh * kw
    assert "embedding_init=jax.nn.initializers.normal(1.0)" in code
    assert "def torch_uniform_init(fan_in: int)" in code


def test_fan_in_from_torchs_arguments_by_keyword():
    source = textwrap.dedent('''
        import torch.nn as nn


        class M(nn.Module):
            def __init__(self, c=4, g=2):
                super().__init__()
                self.fc = nn.Linear(in_features=4, out_features=3)
                self.conv = nn.Conv2d(in_channels=c * 2, out_channels=4, kernel_size=3, groups=g)
                self.cell = nn.LSTMCell(4, hidden_size=8)
                self.gcell = nn.GRUCell(4, hidden_size=6)
    ''')
    code = convert_source(source, path="init.py", init="torch").code
    assert "bias_init=torch_uniform_init(4)" in code
    assert "bias_init=torch_uniform_init(((c * 2) // g) * 3 * 3)" in code
    for name, size in (("cell = TorchLSTMCell(", 8), ("gcell = TorchGRUCell(", 6)):
        cell = code[code.index(f"self.{name}"):]
        for init in ("kernel_init", "recurrent_kernel_init", "bias_init"):
            assert f"{init}=torch_uniform_init({size})," in cell, init  # biases: one draw each


def test_default_output_is_unchanged():
    plain = convert_source(SOURCE, path="init.py")
    model = plain.code[plain.code.index("class M("):]  # after the TorchGRUCell helper
    assert "_init=" not in model and "torch_uniform_init" not in plain.code
    assert convert_source(SOURCE, path="init.py", init="jax").code == plain.code


def test_linen_layers_take_the_same_initializers():
    source = textwrap.dedent('''
        import torch.nn as nn


        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(64, 4096)
                self.conv = nn.Conv2d(64, 256, 3, groups=4)
                self.emb = nn.Embedding(1000, 64)

            def forward(self, x, ids):
                return self.fc(x), self.conv(x[:, :, None, None].repeat(1, 1, 3, 3)), self.emb(ids)
    ''')
    result = convert_source(source, path="init.py", target="linen", init="torch")
    assert not result.diagnostics, [d.render() for d in result.diagnostics]
    ns: dict = {}
    exec(result.code, ns)  # noqa: S102 - the conversion of the test's own source
    import jax.numpy as jnp

    params = ns["M"]().init(jax.random.key(0), jnp.ones((1, 64)), jnp.zeros((1,), int))["params"]
    for path, bound in [("fc/kernel", 1 / 8), ("fc/bias", 1 / 8), ("conv/kernel", 1 / 12),
                        ("conv/bias", 1 / 12)]:
        layer, leaf = path.split("/")
        x = np.asarray(params[layer][leaf]).ravel()
        assert bound * (1 - 5 / x.size) <= np.abs(x).max() <= bound * (1 + 1e-6), path
    assert abs(np.asarray(params["emb"]["embedding"]).std() - 1) < 0.02
