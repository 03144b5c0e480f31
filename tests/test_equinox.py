"""The equinox target: every model fixture converts with no TODO and no torch or flax import,
matches its committed expected output (fixtures/expected/equinox/), and computes what the torch
model computes: forward outputs and gradients, the per-example model mapped over the batch with
``jax.vmap`` under ``eqx.filter_jit`` (float32 on CPU). The SEMANTICS.md rows on equinox are
checked on small layers. Training code: tests/test_equinox_training.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import libcst as cst
import numpy as np
import pytest

from torch2jax.convert import convert_source
from torch2jax.targets.equinox_layers import EquinoxError, layer_of
from torch2jax.verify.run import verify

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
EXPECTED = FIXTURES / "expected" / "equinox"
MODELS = sorted((FIXTURES / "models").glob("*.py"))

# the fixtures' cases (fixtures/cases.toml), small shapes
CASES = {
    "mlp": ("models/mlp.py::MLP", None, ["float32[4,784]"]),
    "cnn": ("models/cnn.py::CNN", None, ["float32[4,3,32,32]"]),
    "gpt": ("models/gpt.py::GPT", "GPT(GPTConfig())", ["int64[2,16]:128"]),
}


def _imports(code: str) -> set[str]:
    tree = ast.parse(code)
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    return names | {n.module.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.module}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_fixture_converts_to_expected_equinox(path: Path) -> None:
    result = convert_source(path.read_text(), path=str(path), target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO(torch2jax)" not in result.code
    assert not _imports(result.code) & {"torch", "torch2jax", "flax"}
    assert "nnx" not in result.code and "rngs" not in result.code
    assert result.code == (EXPECTED / path.name).read_text()


def test_equinox_modules_have_fields_keys_and_per_example_code() -> None:
    cnn = (EXPECTED / "cnn.py").read_text()
    assert "class CNN(eqx.Module):\n    conv1: eqx.nn.Conv2d\n    bn1: BatchNorm\n" in cnn
    assert "def __init__(self, num_classes=10, dropout=0.25, *, key):" in cnn
    assert "key1, key2, key3, key4 = jax.random.split(key, 4)" in cnn
    # BatchNorm (the helper): torch's momentum 0.1 is its 0.9; batch statistics in training
    assert "class BatchNorm(eqx.nn.StatefulLayer):" in cnn
    assert 'BatchNorm(16, axis_name="batch", eps=1e-05, momentum=0.9)' in cnn
    # channel-first layers: no layout moves; state threaded; flatten(1) of one example
    assert "moveaxis" not in cnn
    assert "def __call__(self, x, state, *, key=None):" in cnn
    assert "x, state = self.bn1(self.conv1(x), state)" in cnn
    assert "x = x.reshape(-1)" in cnn and "return self.fc2(x), state" in cnn
    assert "self.dropout(x, key=key)" in cnn
    mlp = (EXPECTED / "mlp.py").read_text()
    assert "key, subkey = jax.random.split(key)" in mlp  # layers built in a loop
    assert "eqx.nn.Lambda(jax.nn.relu)" in mlp
    gpt = (EXPECTED / "gpt.py").read_text()
    assert "T, C = x.shape" in gpt and "reshape(T, self.n_head, C // self.n_head)" in gpt
    assert "jnp.split(jax.vmap(self.c_attn)(x), [self.n_embd, 2 * self.n_embd], axis=1)" in gpt
    assert "self.bias[0, :, :T, :T]" in gpt  # the mask's broadcast batch axis is dropped
    assert "[Block(config, key=k) for k in jax.random.split(key3, config.n_layer)]" in gpt
    assert "x @ self.transformer[\"wte\"].weight.T" in gpt  # tied head
    assert "@dataclass(frozen=True)" in gpt  # a config stored on a module must hash


@pytest.fixture(scope="module", params=sorted(CASES))
def verified(request):
    target, build, inputs = CASES[request.param]
    return verify(str(FIXTURES / target), build=build, inputs=inputs, jax_target="equinox",
                  grad=True)


def test_equinox_model_matches_torch(verified) -> None:
    r = verified
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.max_abs_diff is not None and r.max_abs_diff <= 1e-5, r.to_json()
    assert r.grad_max_abs_diff is not None and r.grad_max_abs_diff <= 1e-5, r.to_json()
    assert any(c.startswith("grad ") for c in r.compared)
    assert r.passed, r.mismatch


# ------------------------------------------------------------------ SEMANTICS.md rows on eqx
def _load(code: str, tmp_path: Path, name: str = "m"):
    from torch2jax.verify.load import load_module

    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return load_module(path, prefix="torch2jax_test_eqx")


def _convert(source: str) -> str:
    result = convert_source(source, target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == [], result.code
    return result.code


BN_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4, momentum=0.2)

    def forward(self, x):
        return self.bn(self.conv(x))
'''


def test_conv_bias_is_reshaped_and_batchnorm_trains_like_torch(tmp_path: Path) -> None:
    """Conv bias (C,) -> equinox's (C, 1, 1); BatchNorm in training mode: torch's momentum m
    is the helper's 1 - m, it normalises with the batch statistics (the biased variance, as
    torch does) from the first batch on, and its running statistics are torch's, the
    unbiased variance included; inference then uses them as they are, as torch's eval does."""
    import equinox as eqx
    import jax.numpy as jnp
    import torch

    from torch2jax.verify.equinox import batched, build_equinox_model, transfer_to_equinox

    code = _convert(BN_SOURCE)
    assert "class BatchNorm(eqx.nn.StatefulLayer):" in code
    assert 'BatchNorm(4, axis_name="batch", eps=1e-05, momentum=0.8)' in code
    torch_mod = _load(BN_SOURCE, tmp_path, "bn_torch")
    jax_mod = _load(code, tmp_path, "bn_eqx")
    torch.manual_seed(0)
    net = torch_mod.Net()
    model, state = build_equinox_model(jax_mod, "Net", None, None, 0)
    model, state, _ = transfer_to_equinox(net, model, state)
    assert model.conv.bias.shape == (4, 1, 1)
    np.testing.assert_array_equal(np.asarray(model.conv.bias).ravel(),
                                  net.conv.bias.detach().numpy())
    x = np.random.default_rng(0).standard_normal((5, 3, 6, 6)).astype(np.float32)
    net.train()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    run = eqx.filter_jit(lambda m, s, x: batched(m, 1)(s, x))
    got, new_state = run(model, state, jnp.asarray(x))
    assert np.max(np.abs(np.asarray(got) - want)) < 1e-5
    mean, var = new_state.get(model.bn.running_stats)
    # torch: running = 0.8 * running + 0.2 * batch (mean starts at 0, so equal)
    np.testing.assert_allclose(np.asarray(mean), net.bn.running_mean.numpy(), atol=1e-7)
    # torch folds the unbiased variance (n/(n-1), n = 5*6*6) into running_var, from 1
    n = 5 * 6 * 6
    conv_out = net.conv(torch.from_numpy(x)).detach().numpy()
    batch_var = conv_out.var(axis=(0, 2, 3))
    torch_var = 0.8 * 1.0 + 0.2 * batch_var * n / (n - 1)
    np.testing.assert_allclose(net.bn.running_var.numpy(), torch_var, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(var), net.bn.running_var.numpy(), rtol=1e-6)
    # (eqx.nn.BatchNorm's "batch" mode folds the biased one: this far from torch)
    assert np.max(np.abs((0.8 + 0.2 * batch_var) - torch_var)) > 1e-4
    # inference after the step: the running statistics as they are (no debiasing)
    net.eval()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    got, _ = run(eqx.nn.inference_mode(model), new_state, jnp.asarray(x))
    assert np.max(np.abs(np.asarray(got) - want)) < 1e-5
    # equinox's other mode ("ema", its default "legacy") normalises with a blend of the running
    # and batch statistics after the first batch: never torch's training output
    ema = eqx.nn.BatchNorm(4, axis_name="batch", momentum=0.8, mode="ema")
    assert ema.mode == "ema"


def test_inference_mode_uses_the_transferred_running_statistics(tmp_path: Path) -> None:
    result = verify(str(_write(tmp_path, "bn_eval.py", BN_SOURCE)) + "::Net",
                    inputs=["float32[3,3,5,5]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5
    assert any("running statistics of 1 BatchNorm" in n for n in result.notes)


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


POOL_SOURCE = '''
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1, bias=False)
        self.pool = nn.AdaptiveAvgPool2d(3)

    def forward(self, x):
        return self.pool(F.relu(self.conv(x)))
'''


def test_adaptive_avg_pool_is_not_mapped_to_equinox_binning() -> None:
    """equinox's AdaptiveAvgPool2d bins differently from torch (7 -> 3 differs by 0.57): the
    converter never emits it; what has no proven per-example form is marked."""
    result = convert_source(POOL_SOURCE, target="equinox")
    assert "eqx.nn.AdaptiveAvgPool" not in result.code


ATTN_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]
'''


def test_multihead_attention_is_mapped_with_torch_biases() -> None:
    """eqx.nn.MultiheadAttention has its biases off by default (torch: on): the converter turns
    all four on (numbers: tests/test_targets_layers.py)."""
    result = convert_source(ATTN_SOURCE, target="equinox")
    assert "eqx.nn.MultiheadAttention(2, 8, use_query_bias=True, use_key_bias=True, " \
        "use_value_bias=True, use_output_bias=True, key=key)" in result.code
    assert "return (self.attn(x, x, x), None)[0]" in result.code
    assert not result.diagnostics


BATCH_SIZE_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        n = x.size(0)
        y = self.fc(x)
        return y.sum(dim=0) / n
'''


def test_batch_size_used_beyond_a_reshape_keeps_the_module_batched(tmp_path: Path) -> None:
    """A sum over the batch has no per-example form: the module keeps torch's batch axis
    (``batched = True``, its Linear mapped over the leading axes) and computes torch's
    numbers, called on the batch (issue 32)."""
    result = convert_source(BATCH_SIZE_SOURCE, target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO(torch2jax)" not in result.code
    assert "batched = True" in result.code
    assert "y = over_leading(self.fc, x, 1)" in result.code
    r = verify(str(_write(tmp_path, "batch_size.py", BATCH_SIZE_SOURCE)) + "::Net",
               inputs=["float32[5,4]"], jax_target="equinox", grad=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.passed, r.mismatch


# five layers: the equinox class has a field line per layer, so the equinox pass's own output
# lines are not the torch lines of the statements it marks
MARKED_SOURCE = """import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)
        self.fc4 = nn.Linear(8, 8)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc4(self.fc3(self.fc2(self.fc1(x))))
        h = h.reshape(-1, 8)
        return self.out(h)


model = MLP()
state = {k: v.clone() for k, v in model.state_dict().items()}
model.share_memory()
model.load_state_dict(state)
print(model(torch.ones(3, 4)).shape)
"""


def test_equinox_diagnostics_name_the_torch_line_of_the_marked_statement() -> None:
    result = convert_source(MARKED_SOURCE, path="mlp.py", target="equinox")
    torch_lines = MARKED_SOURCE.splitlines()
    out_lines = result.code.splitlines()
    marked = {}
    for i, line in enumerate(out_lines):
        if line.strip().startswith("# TODO(torch2jax):") and line.endswith("[equinox]"):
            marked[line.split(": ", 1)[1].removesuffix(" [equinox]")] = (
                out_lines[i + 1].strip(), i + 2)
    errors = [d for d in result.diagnostics if d.rule == "equinox" and d.severity == "error"]
    # (self.out(h) on a value of unknown rank was marked too; it is mapped over the leading
    # axes now: over_leading, tests/test_equinox_refusals.py)
    # (the in-memory snapshot and its restore translate: tests/test_memory_snapshots.py)
    assert [(d.message, torch_lines[d.line - 1].strip()) for d in errors] == [
        (("model.share_memory(...): torch's Module API has no counterpart on an equinox "
         "model (a pytree of arrays): left as written"), "model.share_memory()"),
    ]
    # the statement each marks, at other lines of the output
    assert {k: s for k, (s, _) in marked.items()} == {
        d.message: torch_lines[d.line - 1].strip() for d in errors}
    assert [d.line for d in errors] == [22]
    assert [at for _, at in marked.values()] == [43]  # (after the over_leading helper)
    # so a marker on the torch line suppresses the diagnostic
    ignored = MARKED_SOURCE.replace("model.share_memory()",
                                    "model.share_memory()  # torch2jax: ignore[equinox]")
    result = convert_source(ignored, path="mlp.py", target="equinox")
    assert [d.line for d in result.diagnostics if d.rule == "equinox" and d.severity == "error"
            ] == []


BUILDER_SOURCE = '''
import torch
from torch import nn


def block(in_features, out_features, act=True):
    return nn.Sequential(nn.Linear(in_features, out_features), nn.ReLU() if act else nn.Identity())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = block(6, 8)
        self.heads = nn.ModuleList([block(8, 3, act=False) for _ in range(2)])

    def forward(self, x):
        h = self.a(x)
        return self.heads[0](h) + self.heads[1](h)
'''


def test_layer_building_helpers_take_a_key_and_verify(tmp_path: Path) -> None:
    code = _convert(BUILDER_SOURCE)
    assert "def block(in_features, out_features, act=True, *, key):" in code
    assert "[block(8, 3, act=False, key=k) for k in jax.random.split(key2, 2)]" in code
    result = verify(str(_write(tmp_path, "builder.py", BUILDER_SOURCE)) + "::Net",
                    inputs=["float32[3,6]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5
    assert result.passed


TRAINING_FLAG_SOURCE = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = self.fc(x)
        if self.training:
            x = x * 2
        return x
'''


def test_self_training_is_the_inference_field_that_inference_mode_sets(tmp_path: Path) -> None:
    import equinox as eqx
    import jax

    code = _convert(TRAINING_FLAG_SOURCE)
    assert "    inference: bool\n" in code and "if not self.inference:" in code
    mod = _load(code, tmp_path, "flag_eqx")
    model = mod.Net(key=jax.random.key(0))
    x = np.ones((4,), np.float32)
    train_out = np.asarray(model(x))
    eval_out = np.asarray(eqx.nn.inference_mode(model)(x))
    np.testing.assert_allclose(train_out, 2 * eval_out, rtol=1e-6)
    result = verify(str(_write(tmp_path, "flag.py", TRAINING_FLAG_SOURCE)) + "::Net",
                    inputs=["float32[3,4]"], jax_target="equinox", grad=True)
    assert result.passed and result.max_abs_diff <= 1e-5, result.to_json()


CONV_HELPER_SOURCE = '''
import torch
from torch import nn


def conv_bn(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = conv_bn(3, 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.pool(self.stem(x))
        return self.fc(torch.flatten(x, 1))
'''


def test_channel_first_sequential_with_state_and_global_pooling(tmp_path: Path) -> None:
    code = _convert(CONV_HELPER_SOURCE)
    assert "moveaxis" not in code
    result = verify(str(_write(tmp_path, "conv_helper.py", CONV_HELPER_SOURCE)) + "::Net",
                    inputs=["float32[3,3,8,8]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5
    assert result.passed


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "data" / "other_styles").glob(
    "*.py")), ids=lambda p: p.stem)
def test_other_styles_convert_without_nnx_code(path: Path) -> None:
    """What the equinox pass does not translate is marked; nothing NNX is left in the code."""
    result = convert_source(path.read_text(), path=str(path), target="equinox")
    ast.parse(result.code)
    code_lines = [ln for ln in result.code.splitlines() if not ln.lstrip().startswith("#")]
    assert not any("nnx." in ln or "rngs" in ln for ln in code_lines)
    markers = result.code.count("TODO(torch2jax)")
    assert markers == sum(1 for d in result.diagnostics if d.severity == "error")


BATCH_LOSS = '''
import torch
from torch import nn
import torch.nn.functional as F


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 5)
        self.head = nn.Linear(5, 7)

    def forward(self, idx, targets):
        b, t = idx.size()  # sequences: per example idx is (t,)
        logits = self.head(self.emb(idx))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
'''


def test_batch_loss_in_forward_is_a_per_example_mean_averaged_by_the_caller() -> None:
    """``F.cross_entropy(logits.view(-1, V), targets.view(-1))`` in forward: per example the
    mean over its own rows; mapped over the batch and averaged it is torch's loss."""
    import jax
    import torch

    result = convert_source(BATCH_LOSS, path="tagger.py", target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "logits.reshape(-1, logits.shape[-1])" in result.code
    ns: dict = {}
    exec(compile(result.code, "tagger.py", "exec"), ns)  # noqa: S102 (our snippet)
    torch_ns: dict = {}
    exec(compile(BATCH_LOSS, "tagger_torch.py", "exec"), torch_ns)  # noqa: S102
    torch.manual_seed(0)
    t_model = torch_ns["Tagger"]()
    model = ns["Tagger"](key=jax.random.key(0))
    import equinox as eqx

    model = eqx.tree_at(lambda mm: (mm.emb.weight, mm.head.weight, mm.head.bias), model, tuple(
        jax.numpy.array(p.detach().numpy()) for p in (t_model.emb.weight, t_model.head.weight,
                                                        t_model.head.bias)))
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 7, (3, 4)), rng.integers(0, 7, (3, 4))
    _, want = t_model(torch.from_numpy(idx), torch.from_numpy(targets))
    _, per_example = jax.vmap(model)(idx, targets)
    assert per_example.shape == (3,)
    np.testing.assert_allclose(float(per_example.mean()), want.item(), rtol=1e-6)


def test_other_uses_of_folded_rows_keep_the_module_batched() -> None:
    """The first folded row (an example's first token) has no per-example form: the module
    keeps torch's batch axis and computes torch's loss, called on the batch."""
    import equinox as eqx
    import jax
    import torch

    source = BATCH_LOSS.replace("return logits, loss",
                                "return logits, loss + logits.view(-1, 7)[0].sum()")
    result = convert_source(source, path="tagger.py", target="equinox")
    assert "TODO(torch2jax)" not in result.code
    assert "batched = True" in result.code
    ns: dict = {}
    exec(compile(result.code, "tagger.py", "exec"), ns)  # noqa: S102 (our snippet)
    torch_ns: dict = {}
    exec(compile(source, "tagger_torch.py", "exec"), torch_ns)  # noqa: S102
    torch.manual_seed(0)
    t_model = torch_ns["Tagger"]()
    model = ns["Tagger"](key=jax.random.key(0))
    model = eqx.tree_at(lambda mm: (mm.emb.weight, mm.head.weight, mm.head.bias), model, tuple(
        jax.numpy.array(p.detach().numpy()) for p in (t_model.emb.weight, t_model.head.weight,
                                                        t_model.head.bias)))
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 7, (3, 4)), rng.integers(0, 7, (3, 4))
    want_logits, want = t_model(torch.from_numpy(idx), torch.from_numpy(targets))
    logits, loss = model(idx, targets)
    np.testing.assert_allclose(np.asarray(logits), want_logits.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(float(loss), want.item(), rtol=1e-5)


def test_empty_module_dict_filled_in_a_loop_converts() -> None:
    """``self.blocks = nn.ModuleDict()`` then filled by key: an empty dict field (it used to be
    an internal error). Iterating it in forward has no per-example form here: marked."""
    source = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict()
        for i in range(11):
            self.blocks[f"layer{i + 1}"] = nn.Linear(4, 4)

    def forward(self, x):
        for name, layer in self.blocks.items():
            x = torch.tanh(layer(x))
        return x
'''
    result = convert_source(source, path="blocks.py", target="equinox")
    assert "self.blocks = {}" in result.code
    assert [d.rule for d in result.diagnostics if d.severity == "error"] == ["equinox"]
    assert result.code.count("TODO(torch2jax)") == 1


FLATTEN_SOURCE = '''
import torch
from torch import nn


class Head(nn.Module):
    """torch.flatten inside expressions: of the per-example axes 1.. and of axes 2.."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        out = self.fc(torch.flatten(torch.relu(self.conv(x)), 1))
        return out + torch.flatten(self.conv(x), 2).mean(-1).sum(-1, True)
'''


def test_flatten_of_a_batched_value_inside_an_expression(tmp_path: Path) -> None:
    code = convert_source(FLATTEN_SOURCE, path="flatten.py", target="equinox").code
    assert "TODO" not in code and "jnp.ravel(" in code
    assert "jax.lax.collapse(self.conv(x), 1)" in code
    result = verify(str(_write(tmp_path, "flatten.py", FLATTEN_SOURCE)) + "::Head",
                    inputs=["float32[2,3,6,6]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.passed, result.mismatch


MODULE_DICT_SOURCE = '''
import torch
from torch import nn


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"a": nn.Linear(4, 8), "b": nn.Linear(8, 3)})
        self.extra = nn.ModuleDict({"drop": nn.Dropout(0.1), "act": nn.ReLU()})

    def forward(self, x):
        for name, layer in self.layers.items():
            x = layer(x)
            if name == "a":
                x = self.extra["act"](x)
        return self.extra["drop"](x)


class Stages(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleDict({"z": nn.Linear(4, 6), "a": nn.Linear(6, 5),
                                     "m": nn.Linear(5, 3)})

    def forward(self, x):
        for stage in self.stages.values():
            x = torch.tanh(stage(x))
        return x
'''


@pytest.mark.parametrize("name", ["Heads", "Stages"])
def test_module_dict_loops_and_string_keys(tmp_path: Path, name: str) -> None:
    """A loop over ``ModuleDict.items()`` / ``.values()`` runs over the keys in torch's order,
    written out (jax rebuilds a dict attribute with sorted keys: "z", "a", "m" would run as
    "a", "m", "z"); ``self.extra["act"]`` is the layer under that key."""
    code = _convert(MODULE_DICT_SOURCE)
    assert "TODO" not in code
    assert 'for name in ("a", "b"):\n            layer = self.layers[name]' in code
    assert 'for stage_key in ("z", "a", "m"):\n            stage = self.stages[stage_key]' in code
    assert 'return self.extra["drop"](x, key=key)' in code
    result = verify(str(_write(tmp_path, "dicts.py", MODULE_DICT_SOURCE)) + f"::{name}",
                    inputs=["float32[4,4]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.passed, result.mismatch


CONDITIONAL_SOURCE = '''import torch
from torch import nn


def block(dim, last):
    return nn.Sequential(nn.Linear(dim, dim), nn.ReLU()) if not last else nn.Identity()


class Net(nn.Module):
    def __init__(self, dim, last):
        super().__init__()
        self.a = block(dim, last)
        self.b = nn.Sequential(nn.Linear(dim, dim), nn.ReLU()) if last else nn.Identity()

    def forward(self, x):
        return self.b(self.a(x))
'''


@pytest.mark.parametrize("last", [False, True])
def test_a_conditional_sequential_converts(tmp_path: Path, last: bool) -> None:
    """`nn.Sequential(...) if c else nn.Identity()`, returned by a helper or assigned: the
    equinox pass took the conditional expression for the Sequential call and crashed (an internal
    error, the whole file not converted: seen on a diffusion UNet's helpers), then marked the
    call ('self.a is not a layer the equinox target translated'). The layer of a conditional
    expression is its layer beside an identity (equinox_init.if_layer): both branches match
    torch."""
    result = convert_source(CONDITIONAL_SOURCE, target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "return eqx.nn.Sequential([eqx.nn.Linear(dim, dim, key=key), eqx.nn.Lambda(" \
        "jax.nn.relu)]) if not last else lambda x: x" in result.code
    r = verify(str(_write(tmp_path, "cond.py", CONDITIONAL_SOURCE)) + "::Net",
               args={"dim": 4, "last": last}, inputs=["float32[3,4]"], jax_target="equinox",
               grad=True, float64=False)
    assert r.error is None, r.error
    assert r.todos == 0
    assert r.passed, r.mismatch


FUNCTIONAL_POOL_SOURCE = '''
import torch
from torch import nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.fc = nn.Linear(3 * 3 * 2, 4)

    def forward(self, x):
        x = F.relu(self.conv(x))
        x = F.max_pool2d(x, 2) + F.avg_pool2d(x, kernel_size=2, stride=2)
        return self.fc(torch.flatten(x, 1))
'''


def test_functional_pooling_in_forward_verifies(tmp_path: Path) -> None:
    """F.max_pool2d(x, 2) in forward (the MNIST example's): the NNX pool between moves to
    channels-last and back was commented out and marked (the forward then skipped the
    pooling); per example it is eqx.nn.MaxPool2d on the channel-first image."""
    code = _convert(FUNCTIONAL_POOL_SOURCE)
    assert "eqx.nn.MaxPool2d(kernel_size=(2, 2), stride=(2, 2))(x)" in code
    assert "eqx.nn.AvgPool2d(kernel_size=(2, 2), stride=(2, 2))(x)" in code
    result = verify(str(_write(tmp_path, "pool.py", FUNCTIONAL_POOL_SOURCE)) + "::Net",
                    inputs=["float32[2,2,8,6]"], jax_target="equinox", grad=True)
    assert result.error is None, result.error
    assert result.todos == 0
    assert result.max_abs_diff <= 1e-5 and result.grad_max_abs_diff <= 1e-5
    assert result.passed


# --- layers built from the rules' equinox tables (rules/layers.toml, targets/layer_table.py)

@pytest.mark.parametrize(("nnx_call", "built", "rank"), [
    ("nnx.Conv(2, 4, kernel_size=(3, 1, 2), strides=(2, 2, 1), rngs=rngs)",
     "eqx.nn.Conv3d(2, 4, kernel_size=(3, 1, 2), stride=(2, 2, 1), key=__needs_key__)", 4),
    ("nnx.Conv(2, 4, kernel_size=(3,), padding='VALID', rngs=rngs)",
     "eqx.nn.Conv1d(2, 4, kernel_size=(3,), padding='VALID', key=__needs_key__)", 2),
    # flax's GroupNorm takes num_groups second: positional or keyword, the same layer
    ("nnx.GroupNorm(16, 4, epsilon=1e-05, rngs=rngs)", "eqx.nn.GroupNorm(4, 16, eps=1e-05)", None),
    ("nnx.GroupNorm(16, num_groups=4, epsilon=1e-05, use_scale=a, use_bias=a, rngs=rngs)",
     "eqx.nn.GroupNorm(4, 16, eps=1e-05, channelwise_affine=a)", None),
])
def test_equinox_layer_tables_build(nnx_call: str, built: str, rank: int | None) -> None:
    new, layer = layer_of(cst.parse_expression(nnx_call), set())
    assert cst.Module([]).code_for_node(new) == built
    assert layer.rank == rank and layer.cls == built.split("(")[0]


@pytest.mark.parametrize(("nnx_call", "message"), [
    ("nnx.Conv(3, 8, kernel_size=k, rngs=rngs)",
     "nnx.Conv whose kernel_size is not a tuple of 1 to 3 sizes"),
    ("nnx.Conv(3, 8, kernel_size=(3, 3), padding='CIRCULAR', rngs=rngs)",
     "nnx.Conv padding='CIRCULAR' has no equinox form"),
    ("nnx.Conv(3, 8, kernel_size=(3, 3), mask=m, rngs=rngs)",
     "nnx.Conv argument mask has no equinox form"),
    ("nnx.GroupNorm(16, num_groups=4, use_scale=False, rngs=rngs)",
     ("nnx.GroupNorm with use_scale and use_bias not the same: eqx.nn.GroupNorm has one "
      "channelwise_affine for them")),
    ("nnx.GroupNorm(16, num_groups=4, use_scale=False, use_bias=True, rngs=rngs)",
     "nnx.GroupNorm with use_scale and use_bias not the same"),
    ("nnx.GroupNorm(16, epsilon=1e-05, rngs=rngs)", "nnx.GroupNorm without its num_groups"),
])
def test_equinox_layer_tables_refuse(nnx_call: str, message: str) -> None:
    """What a table has no form for raises EquinoxError, which the pass writes as a TODO."""
    with pytest.raises(EquinoxError, match=re.escape(message)):
        layer_of(cst.parse_expression(nnx_call), set())


GROUPNORM_INIT_SOURCE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Conv2d):
            nn.init.constant_(module.weight, 0.1)
            nn.init.constant_(module.bias, 0.05)
        elif isinstance(module, nn.GroupNorm):
            nn.init.constant_(module.weight, 2.0)
            nn.init.constant_(module.bias, -0.5)

    def forward(self, x):
        return self.norm(self.conv(x) * torch.linspace(-1.0, 2.0, 8))
'''


def test_groupnorm_weight_initialisation() -> None:
    """``self.apply(self._init_weights)`` over a GroupNorm: its equinox table's weights
    (NNX's scale is equinox's weight) give init_layers the layer and its fields; the converted
    model computes what torch's computes with those weights."""
    import jax
    import jax.numpy as jnp
    import torch

    result = convert_source(GROUPNORM_INIT_SOURCE, target="equinox")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "(eqx.nn.Conv, eqx.nn.GroupNorm)" in result.code
    ns: dict = {}
    exec(compile(result.code, "net.py", "exec"), ns)  # noqa: S102 - the converter's output
    model = ns["Net"](key=jax.random.key(0))
    x = np.linspace(-2.0, 3.0, 2 * 2 * 8 * 8, dtype=np.float32).reshape(2, 2, 8, 8)
    got = jax.vmap(model)(jnp.asarray(x))
    torch_ns: dict = {}
    exec(GROUPNORM_INIT_SOURCE, torch_ns)  # noqa: S102 - the torch original above
    with torch.no_grad():
        want = torch_ns["Net"]()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


DIRECT_INIT_SOURCE = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc1 = nn.Linear(3, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 2)
        nn.init.constant_(self.conv.weight, 0.05)
        nn.init.constant_(self.conv.bias, -0.1)
        nn.init.constant_(self.fc1.weight, 0.1)
        nn.init.zeros_(self.fc1.bias)
        nn.init.constant_(self.norm.weight, 1.5)
        nn.init.constant_(self.norm.bias, 0.25)
        nn.init.constant_(self.fc2.weight, -0.2)
        nn.init.ones_(self.fc2.bias)

    def forward(self, x):
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        h = self.norm(self.fc1(h) * torch.linspace(-1.0, 2.0, 8))
        return self.fc2(h)


net = Net()
x = torch.linspace(-2.0, 3.0, 2 * 2 * 4 * 4).reshape(2, 2, 4, 4)
print(" ".join(f"{v:.5f}" for v in net(x).flatten().tolist()))
'''


def test_direct_init_calls_in_init_set_the_equinox_fields(tmp_path: Path) -> None:
    """``nn.init.constant_(self.fc1.weight, 0.1)`` written in ``__init__`` (not through
    ``self.apply``): the converted script sets the layer's field with ``eqx.tree_at`` (NNX's
    ``self.fc1.kernel.value = ...`` fails on an equinox layer) and prints torch's numbers."""
    import subprocess
    import sys

    result = convert_source(DIRECT_INIT_SOURCE, target="equinox")
    assert "TODO" not in result.code and ".value" not in result.code, result.code
    assert "self.fc1 = eqx.tree_at(lambda m: m.weight, self.fc1, jnp.full_like(" \
        "self.fc1.weight, 0.1))" in result.code
    (tmp_path / "torch_net.py").write_text(DIRECT_INIT_SOURCE)
    (tmp_path / "jax_net.py").write_text(result.code)

    def run(name: str) -> list[float]:
        out = subprocess.run([sys.executable, str(tmp_path / name)], capture_output=True,
                             text=True, check=True, timeout=300).stdout
        return [float(v) for v in out.split()]

    want, got = run("torch_net.py"), run("jax_net.py")
    assert len(want) == 4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_direct_init_calls_without_an_equinox_form_are_marked() -> None:
    """What the pass cannot write in equinox (a random draw, an init in a loop over layers, a
    method on the weight) is commented out and marked, never left as NNX code that fails."""
    source = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        nn.init.normal_(self.fc.weight, 0.0, 0.02)
        for layer in self.layers:
            nn.init.zeros_(layer.bias)
        with torch.no_grad():
            self.fc.bias.fill_(0.3)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.fc(x)
'''
    result = convert_source(source, target="equinox")
    live = [line for line in result.code.splitlines() if not line.strip().startswith("#")]
    assert not [line for line in live if ".value" in line or ".kernel" in line], result.code
    assert result.code.count("# self.fc.kernel.value") == 1
    assert "#     layer.bias.value = jnp.zeros_like(layer.bias.value)" in result.code
    assert sum("equinox translation" in d.message for d in result.diagnostics) >= 2


# a ViT's tokens: parameters drawn at build (NNX's jax.random.normal(rngs.params(), shape):
# left marked, "Field 'pos' was not initialized" at build), and a class token expanded to the
# batch size (x.shape[0] put in a shape: per example it is the sequence length, and the
# per-example form concatenated a (n, 1, d) block with an (n, d) one, unmarked)
TOKENS_SOURCE = '''import torch
from torch import nn


class Tokens(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim))
        self.tok = nn.Parameter(torch.zeros(1, 1, dim))
        self.fc = nn.Linear(dim, 2)

    def forward(self, x):
        x = torch.cat((self.tok.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        return self.fc(x)
'''


def test_parameters_drawn_at_build_and_a_token_expanded_to_the_batch(tmp_path: Path) -> None:
    result = convert_source(TOKENS_SOURCE, target="equinox")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "self.pos = jax.random.normal(key1, (1, n + 1, dim))" in result.code
    assert "batched = True" in result.code  # (the batch size in a shape)
    r = verify(str(_write(tmp_path, "tokens.py", TOKENS_SOURCE)) + "::Tokens",
               build="Tokens(3, 8)", inputs=["float32[2,3,8]"], jax_target="equinox",
               grad=True)
    assert r.error is None and r.todos == 0, r.error
    assert r.passed, r.mismatch
