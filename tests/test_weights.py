"""torch state_dict -> NNX parameters: layouts, paths, ties, and every way it can not fit.

The models are in tests/data/verify/{torch,nnx}/models.py (NNX written by hand in the shape
docs/nnx-output.md fixes), so these tests do not depend on the converter.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from torch2jax.ruleset import builtin_rules, parse_rule_text
from torch2jax.verify.load import load_module
from torch2jax.weights import (
    WeightTransferError,
    apply_layout,
    gradient_map,
    invert_layout,
    layer_rules_by_class,
    rule_for_module,
    transfer_state_dict,
)

DATA = Path(__file__).parent / "data" / "verify"


@pytest.fixture(scope="module")
def tm():
    return load_module(DATA / "torch" / "models.py")


@pytest.fixture(scope="module")
def jm():
    return load_module(DATA / "nnx" / "models.py")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def _val(var) -> np.ndarray:
    return np.asarray(var[...])


def _pair(tm, jm, name: str, *args, **kwargs):
    torch.manual_seed(0)
    return getattr(tm, name)(*args, **kwargs), getattr(jm, name)(*args, **kwargs, rngs=nnx.Rngs(0))


def test_linear_is_transposed_and_own_parameters_are_copied(tm, jm):
    t, j = _pair(tm, jm, "MLP")
    with torch.no_grad():
        t.scale.mul_(3.0)
        t.offset.add_(0.5)
    report = transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.net.layers[0].kernel), _np(t.net[0].weight).T)
    np.testing.assert_array_equal(_val(j.net.layers[2].bias), _np(t.net[2].bias))
    np.testing.assert_array_equal(_val(j.scale), _np(t.scale))
    np.testing.assert_array_equal(_val(j.offset), _np(t.offset))
    by_name = {m.torch_name: m for m in report.mappings}
    assert by_name["net.0.weight"].nnx_path == ("net", "layers", 0, "kernel")
    assert by_name["net.0.weight"].layout == "transpose"
    assert by_name["net.0.weight"].rule == "torch.nn.Linear"
    assert by_name["scale"].rule is None and by_name["scale"].layout == "as_is"
    assert len(report.mapped) == 6 and not report.tied and not report.dropped


def test_conv_kernel_is_permuted_and_batchnorm_statistics_move(tm, jm):
    t, j = _pair(tm, jm, "ConvNet")
    with torch.no_grad():
        t.bn.running_mean.uniform_(-1, 1)
        t.bn.running_var.uniform_(0.5, 2)
    report = transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.conv.kernel), _np(t.conv.weight).transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(_val(j.bn.mean), _np(t.bn.running_mean))
    np.testing.assert_array_equal(_val(j.bn.var), _np(t.bn.running_var))
    np.testing.assert_array_equal(_val(j.bn.scale), _np(t.bn.weight))
    assert [m.torch_name for m in report.dropped] == ["bn.num_batches_tracked"]


def test_conv1d_and_layernorm_over_two_axes_are_reshaped(tm, jm):
    t, j = _pair(tm, jm, "SeqConv")
    with torch.no_grad():
        t.norm.weight.uniform_(0.5, 1.5)
    transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.conv.kernel), _np(t.conv.weight).transpose(2, 1, 0))
    assert _val(j.norm.scale).shape == (48,)
    np.testing.assert_array_equal(_val(j.norm.scale), _np(t.norm.weight).reshape(48))


def test_module_list_sequential_and_dict_paths(tm, jm):
    t, j = _pair(tm, jm, "Blocks")
    report = transfer_state_dict(t, j)
    paths = {m.torch_name: m.nnx_path for m in report.mappings}
    assert paths["blocks.1.0.weight"] == ("blocks", 1, "layers", 0, "scale")
    assert paths["blocks.1.1.weight"] == ("blocks", 1, "layers", 1, "kernel")
    assert paths["heads.b.bias"] == ("heads", "b", "bias")
    np.testing.assert_array_equal(_val(j.heads["b"].kernel), _np(t.heads["b"].weight).T)


def test_tied_lm_head_becomes_the_embedding(tm, jm):
    t, j = _pair(tm, jm, "TinyLM", tm.LMConfig(vocab=20, dim=8))
    report = transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.wte.embedding), _np(t.wte.weight))
    [tied] = report.tied
    assert tied.torch_name == "lm_head.weight" and tied.tied_to == "wte.weight"
    assert tied.nnx_path == ("wte", "embedding")
    grads = gradient_map(t, j)
    assert set(grads) == {"wte.weight", "ln.weight", "ln.bias"}  # torch names a tie once
    assert grads["wte.weight"].nnx_path == ("wte", "embedding")


def test_a_subclass_of_a_torch_layer_uses_the_layer_rule(tm, jm):
    t, j = _pair(tm, jm, "UsesSubclass")
    transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.proj.kernel), _np(t.proj.weight).T)
    table = layer_rules_by_class(builtin_rules())
    assert rule_for_module(t.proj, table).torch == "torch.nn.Linear"
    assert rule_for_module(nn.Conv1d(1, 1, 1), table).weights["weight"].layout == "conv"


def test_gradient_map_gives_path_and_layout_per_parameter(tm, jm):
    t, j = _pair(tm, jm, "ConvNet")
    grads = gradient_map(t, j)
    assert set(grads) == {n for n, _ in t.named_parameters()}
    assert grads["conv.weight"].layout == "conv"
    assert grads["conv.weight"].nnx_path == ("conv", "kernel")
    assert grads["fc.weight"].layout == "transpose"
    assert grads["bn.weight"].nnx_path == ("bn", "scale")


def test_an_nnx_parameter_without_a_torch_tensor_is_an_error(tm):
    wrong = load_module(DATA / "nnx" / "wrong.py")
    torch.manual_seed(0)
    t, j = tm.SeqConv(), wrong.SeqConv(rngs=nnx.Rngs(0))
    before = _val(j.conv.kernel).copy()
    with pytest.raises(WeightTransferError, match=r"NNX parameter conv\.bias receives no"):
        transfer_state_dict(t, j)
    np.testing.assert_array_equal(_val(j.conv.kernel), before)  # nothing half-copied


def test_a_torch_tensor_without_an_nnx_parameter_is_an_error(tm, jm):
    t, j = _pair(tm, jm, "MLP")
    t.extra = nn.Parameter(torch.zeros(2))
    t.net[0].register_buffer("stats", torch.zeros(3))
    with pytest.raises(WeightTransferError) as info:
        transfer_state_dict(t, j)
    problems = "\n".join(info.value.problems)
    assert "torch extra has no NNX counterpart: the model has no 'extra'" in problems
    assert "torch net.0.stats has no NNX counterpart: net.0 has no 'stats'" in problems


def test_shapes_that_do_not_fit_are_all_reported(tm, jm):
    torch.manual_seed(0)
    t, j = tm.MLP(hidden=16), jm.MLP(hidden=12, rngs=nnx.Rngs(0))
    with pytest.raises(WeightTransferError) as info:
        transfer_state_dict(t, j)
    assert len(info.value.problems) == 3  # net.0.weight, net.0.bias, net.2.weight
    assert (
        "net.0.weight: shape (16, 8) (after 'transpose': (8, 16)) does not fit "
        "NNX net.layers.0.kernel of shape (8, 12)"
    ) in info.value.problems


def test_layouts_round_trip():
    rng = np.random.default_rng(0)
    for shape in [(5, 3, 4), (5, 3, 4, 2), (5, 3, 4, 2, 2)]:
        w = rng.standard_normal(shape)
        k = apply_layout(w, "conv")
        assert k.shape == (*shape[2:], shape[1], shape[0])
        np.testing.assert_array_equal(invert_layout(k, "conv"), w)
    w = rng.standard_normal((3, 4))
    np.testing.assert_array_equal(apply_layout(w, "transpose"), w.T)
    np.testing.assert_array_equal(invert_layout(apply_layout(w, "transpose"), "transpose"), w)
    with pytest.raises(ValueError, match="unknown weight layout"):
        apply_layout(w, "hwio")
    with pytest.raises(ValueError, match="2-D"):
        apply_layout(rng.standard_normal((2, 3, 4)), "transpose")


_SQUARE_RULE = """
[[layer]]
torch = "torch.nn.Linear"
nnx = "nnx.Linear"
weights = { weight = { to = "kernel", layout = "%s" }, bias = "%s" }
"""


def test_the_rules_decide_the_layout():
    torch.manual_seed(0)
    t = nn.Sequential(nn.Linear(4, 4))
    j = nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    rules = parse_rule_text(_SQUARE_RULE % ("as_is", "bias"), "test.toml")
    transfer_state_dict(t, j, rules)
    np.testing.assert_array_equal(_val(j.layers[0].kernel), _np(t[0].weight))  # not .T
    dropping = parse_rule_text(_SQUARE_RULE % ("transpose", ""), "test.toml")
    with pytest.raises(WeightTransferError, match=r"layers\.0\.bias receives no torch tensor"):
        transfer_state_dict(t, j, dropping)


class _TorchMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.register_buffer("mask", torch.ones(3), persistent=False)


class _NnxMasked(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.proj = nnx.Linear(3, 3, rngs=rngs)
        self.mask = nnx.Variable(jnp.ones(3))


def test_non_persistent_buffers_keep_their_constructed_value():
    report = transfer_state_dict(_TorchMasked(), _NnxMasked(rngs=nnx.Rngs(0)))
    assert report.unset_variables == ["mask"]
    assert "2 tensors transferred" in report.summary()
