"""nn.TransformerEncoderLayer and nn.TransformerEncoder (rules/sequence.toml) on the NNX target:
the TransformerEncoderLayer / TransformerEncoder helper classes (passes/helpers.py) against
torch's forward and every parameter's gradient, torch's weights landing by path, dropout
wired to model.train() / model.eval(), and torch's no-grad inference fast path (nested tensors:
0.0 at the padded positions) reproduced in eval mode and pinned here.

Sizes: E=16, H=4, S=5, N=2, FF=32. The padding masks are built inside the models (no row fully
masked; padding at the end of the rows unless the test says otherwise).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source
from torch2jax.verify.load import load_module
from torch2jax.verify.run import VerifyRequest, run_request
from torch2jax.weights import transfer_state_dict

SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


def padding(rows):
    """(N, S) boolean padding mask, True at padded positions."""
    return torch.tensor(rows, dtype=torch.bool)


class Layer(nn.Module):
    def __init__(self, batch_first=False, norm_first=False, activation="relu", dropout=0.0):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=dropout,
                                                activation=activation, batch_first=batch_first,
                                                norm_first=norm_first)

    def forward(self, x):
        return self.layer(x)


class GeluFn(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, 0.0, F.gelu, norm_first=True)

    def forward(self, x):
        return self.layer(x)


class Padded(nn.Module):
    """TransformerEncoder, two layers and a final norm, with a key padding mask."""

    def __init__(self, batch_first=False, norm_first=False, left_aligned=True):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.1,
                                           batch_first=batch_first, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16))
        self.left_aligned = left_aligned

    def forward(self, x):
        if self.left_aligned:
            pad = padding([[False, False, False, False, False],
                           [False, False, False, True, True]])
        else:
            pad = padding([[True, False, False, False, False],
                           [False, False, True, False, True]])
        return self.encoder(x, src_key_padding_mask=pad)


class PaddedLayer(nn.Module):
    """One layer called with a key padding mask, no encoder."""

    def __init__(self, batch_first=False):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=batch_first)

    def forward(self, x):
        pad = padding([[False, False, False, False, True], [False, False, True, True, True]])
        return self.layer(x, src_key_padding_mask=pad)


class Causal(nn.Module):
    def __init__(self, batch_first=False):
        super().__init__()
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 4, 32, 0.0, "gelu", batch_first=batch_first), 2)

    def forward(self, x):
        mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
        return self.encoder(x, mask=mask, is_causal=True)


class Additive(nn.Module):
    """pytorch/examples' word_language_model: a float mask added to the scores (0 or -inf,
    log(tril(ones))), here with a bias that is neither, and a boolean padding mask."""

    def __init__(self, batch_first=False):
        super().__init__()
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=batch_first), 2)

    def forward(self, x):
        mask = torch.log(torch.tril(torch.ones(5, 5))) + 0.3 * torch.arange(5.0)
        pad = padding([[False, False, False, False, False], [False, True, False, False, False]])
        return self.encoder(x, mask, src_key_padding_mask=pad)
'''

SEQ_FIRST, BATCH_FIRST = "float32[5,2,16]", "float32[2,5,16]"


@pytest.fixture(scope="module")
def converted():
    result = convert_source(SOURCE, path="encoders.py")
    return result


@pytest.fixture(scope="module")
def source_file(tmp_path_factory, converted):
    folder = tmp_path_factory.mktemp("tenc")
    (folder / "encoders.py").write_text(SOURCE)
    (folder / "encoders_jax.py").write_text(converted.code)
    return folder / "encoders.py"


@pytest.fixture(scope="module")
def jax_module(source_file):
    return load_module(source_file.with_name("encoders_jax.py"), prefix="test_tenc_jax")


def _verify(source_file, converted, name, spec, args=None, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "enable_nested_tensor is True, but ..."
        result = run_request(VerifyRequest(f"{source_file}::{name}", args=args, inputs=(spec,),
                                           grad=True, atol=1e-5, rtol=1e-5, float64=False,
                                           converted=str(source_file.with_name("encoders_jax.py")),
                                           **kwargs))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    n_grads = sum(1 for c in result.compared if c.startswith("grad "))
    print(f"{name} {args}: forward {result.max_abs_diff:.2g}, gradients "
          f"{result.grad_max_abs_diff:.2g} ({n_grads} parameters)")
    return result, n_grads


def test_converts_without_todos(converted):
    errors = [d.render() for d in converted.diagnostics if d.severity == "error"]
    assert not errors, "\n".join(errors)
    assert "TODO(torch2jax)" not in converted.code
    assert "class TransformerEncoderLayer(nnx.Module)" in converted.code
    assert "class TransformerEncoder(nnx.Module)" in converted.code
    assert "norm=nnx.LayerNorm(16, epsilon=1e-05, rngs=rngs)," in converted.code
    assert "partial(jax.nn.gelu, approximate=False)," in converted.code  # F.gelu: exact
    # the nested-tensor quirk is announced where a TransformerEncoder is built
    warned = [d for d in converted.diagnostics if d.severity == "warning"
              and d.rule == "torch.nn.TransformerEncoder"]
    assert warned and all("0.0 at the padded positions" in d.message for d in warned)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_layer_matches_torch(source_file, converted, batch_first, norm_first, activation):
    _, n = _verify(source_file, converted, "Layer", BATCH_FIRST if batch_first else SEQ_FIRST,
                   {"batch_first": batch_first, "norm_first": norm_first,
                    "activation": activation})
    # in_proj weight and bias in three parts each (query, key, value), out_proj, linear1,
    # linear2, norm1, norm2: weight and bias each
    assert n == 16


def test_callable_gelu_matches_torch(source_file, converted):
    _verify(source_file, converted, "GeluFn", SEQ_FIRST)


def test_dropout_is_off_in_eval_and_matches(source_file, converted):
    """dropout=0.3: verify runs both sides in eval mode, where every dropout is off."""
    _verify(source_file, converted, "Layer", SEQ_FIRST, {"dropout": 0.3})


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_with_padding_mask_matches_torch(source_file, converted, batch_first,
                                                 norm_first):
    _, n = _verify(source_file, converted, "Padded", BATCH_FIRST if batch_first else SEQ_FIRST,
                   {"batch_first": batch_first, "norm_first": norm_first})
    assert n == 2 * 16 + 2  # two layers and the final norm


@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_with_padding_not_at_the_end_matches_torch(source_file, converted, batch_first):
    _verify(source_file, converted, "Padded", BATCH_FIRST if batch_first else SEQ_FIRST,
            {"batch_first": batch_first, "left_aligned": False})


@pytest.mark.parametrize("batch_first", [False, True])
def test_layer_with_padding_mask_matches_torch(source_file, converted, batch_first):
    _verify(source_file, converted, "PaddedLayer", BATCH_FIRST if batch_first else SEQ_FIRST,
            {"batch_first": batch_first})


@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_with_causal_mask_matches_torch(source_file, converted, batch_first):
    _verify(source_file, converted, "Causal", BATCH_FIRST if batch_first else SEQ_FIRST,
            {"batch_first": batch_first})


# --- the models themselves ------------------------------------------------------------------


def _pair(source_file, jax_module, name, **args):
    """The torch model (seeded) and the converted one with torch's weights."""
    from torch2jax.verify.load import load_module as load

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch_model = getattr(load(source_file, prefix="test_tenc_torch"), name)(**args)
    jax_model = getattr(jax_module, name)(**args, rngs=nnx.Rngs(0))
    transfer_state_dict(torch_model, jax_model)
    return torch_model, jax_model


def test_encoder_layers_are_copies_of_the_layer(jax_module):
    """torch deep-copies the layer: every copy starts from its values; the dropout streams
    differ (the masks of the two layers are not the same)."""
    model = jax_module.Padded(rngs=nnx.Rngs(0))
    first, second = model.encoder.layers
    for a, b in zip(jax.tree.leaves(nnx.state(first, nnx.Param)),
                    jax.tree.leaves(nnx.state(second, nnx.Param)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert first.dropout1.rngs is not second.dropout1.rngs


def test_nested_tensor_quirk_pinned(source_file, jax_module):
    """torch, eval mode, batch_first, left-aligned padding: with autograd off the padded
    positions come out 0.0 (before the final norm, here LayerNorm with weight 1 and bias 0:
    0.0 too); with autograd on they are computed. The converted model gives the first after
    model.eval(), the second with inference_fast_path = False, and never zeroes in training."""
    torch_model, jax_model = _pair(source_file, jax_module, "Padded", batch_first=True)
    torch_model.eval()
    jax_model.eval()
    x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    pad = np.array([[False] * 5, [False, False, False, True, True]])
    with torch.no_grad():
        no_grad = torch_model(torch.from_numpy(x)).numpy()
    with_grad = torch_model(torch.from_numpy(x)).detach().numpy()
    assert (no_grad[pad] == 0).all() and not (with_grad[pad] == 0).any()
    np.testing.assert_allclose(no_grad[~pad], with_grad[~pad], atol=1e-5)

    out = np.asarray(jax_model(jnp.asarray(x)))
    assert (out[pad] == 0).all()
    np.testing.assert_allclose(out, no_grad, atol=1e-5)
    jax_model.encoder.inference_fast_path = False
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), with_grad, atol=1e-5)
    jax_model.encoder.inference_fast_path = True
    jax_model.train()
    for m in (jax_model.encoder.layers[0], jax_model.encoder.layers[1]):
        m.eval()  # deterministic layers, the encoder in training mode
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), with_grad, atol=1e-5)


@pytest.mark.parametrize("args", [{"batch_first": False}, {"batch_first": True, "norm_first": True},
                                  {"batch_first": True, "left_aligned": False}])
def test_no_fast_path_outside_its_conditions(source_file, jax_module, args):
    """Sequence-first, pre-norm, or padding not at the rows' ends: torch computes the padded
    positions under no_grad too, and so does the converted model."""
    torch_model, jax_model = _pair(source_file, jax_module, "Padded", **args)
    torch_model.eval()
    jax_model.eval()
    shape = (2, 5, 16) if args["batch_first"] else (5, 2, 16)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    with torch.no_grad():
        ref = torch_model(torch.from_numpy(x)).numpy()
    assert not (ref == 0).any()
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), ref, atol=1e-5)


def test_dropout_is_random_in_training(jax_module):
    model = jax_module.Padded(rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((5, 2, 16)), jnp.float32)
    model.train()
    a, b = np.asarray(model(x)), np.asarray(model(x))
    assert not np.allclose(a, b)
    model.eval()
    np.testing.assert_array_equal(np.asarray(model(x)), np.asarray(model(x)))


def test_float_mask_is_added_to_the_scores(source_file, converted):
    _verify(source_file, converted, "Additive", SEQ_FIRST, {"batch_first": False})


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_linen_and_equinox_mark_the_layers(target: str):
    """NNX only: linen and equinox mark both layers where they are built, and the NNX helper
    classes are not written into their files."""
    result = convert_source(SOURCE, path="encoders.py", target=target)
    marked = {d.rule for d in result.diagnostics if d.severity == "error"}
    assert {"torch.nn.TransformerEncoderLayer", "torch.nn.TransformerEncoder"} <= marked
    assert "class TransformerEncoderLayer" not in result.code
    assert "TODO(torch2jax)" in result.code


# --- nn.Embedding(padding_idx=...) -----------------------------------------------------------

EMBEDDING = '''
import torch.nn as nn


class Emb(nn.Module):
    def __init__(self, padding_idx=0):
        super().__init__()
        self.emb = nn.Embedding(10, 4, padding_idx=padding_idx)

    def forward(self, ids):
        return self.emb(ids)
'''


@pytest.mark.parametrize("padding_idx", [0, -1])
@pytest.mark.parametrize("row", ["zero", "set"])
def test_embedding_padding_row_matches_torch(tmp_path, padding_idx, row):
    """The row starts at zero; its gradient is exactly zero, also when the row is not zero
    (set after construction, then transferred); the other rows' gradients as torch's."""
    result = convert_source(EMBEDDING, path="emb.py")
    assert "TODO(torch2jax)" not in result.code
    assert "Embedding(10, 4, padding_idx=padding_idx, rngs=rngs)" in result.code
    (tmp_path / "emb.py").write_text(EMBEDDING)
    (tmp_path / "emb_jax.py").write_text(result.code)
    torch_mod = load_module(tmp_path / "emb.py", prefix="test_emb_torch")
    jax_mod = load_module(tmp_path / "emb_jax.py", prefix="test_emb_jax")
    fresh = jax_mod.Emb(padding_idx, rngs=nnx.Rngs(0))
    assert (np.asarray(fresh.emb.embedding[...])[padding_idx] == 0).all()
    assert (np.asarray(fresh.emb.embedding[...]).sum(axis=1) != 0).sum() == 9

    torch.manual_seed(0)
    torch_model = torch_mod.Emb(padding_idx)
    if row == "set":
        with torch.no_grad():
            torch_model.emb.weight[padding_idx] = torch.arange(4.0) + 1
    jax_model = jax_mod.Emb(padding_idx, rngs=nnx.Rngs(0))
    transfer_state_dict(torch_model, jax_model)
    ids = np.array([[1, 0, 9, 3], [0, 9, 9, 2]])
    cot = np.random.default_rng(0).standard_normal((2, 4, 4)).astype(np.float32)

    out = torch_model(torch.from_numpy(ids))
    (out * torch.from_numpy(cot)).sum().backward()
    torch_grad = torch_model.emb.weight.grad.numpy()

    def loss(model):
        return (model(jnp.asarray(ids)) * cot).sum()

    jax_out = jax_model(jnp.asarray(ids))
    np.testing.assert_allclose(np.asarray(jax_out), out.detach().numpy(), atol=1e-6)
    grads = nnx.grad(loss)(jax_model)
    jax_grad = np.asarray(grads["emb"]["embedding"][...])
    assert (jax_grad[padding_idx] == 0).all() and (torch_grad[padding_idx] == 0).all()
    np.testing.assert_allclose(jax_grad, torch_grad, atol=1e-6)


def test_embedding_padding_idx_is_marked_on_linen():
    result = convert_source(EMBEDDING, path="emb.py", target="linen")
    assert "TODO(torch2jax)" in result.code


def test_layers_imported_by_name_from_torch_nn():
    """`from torch.nn import Embedding, TransformerEncoderLayer`: the torch import is removed,
    so the helper classes may take those names (the file does not define them itself)."""
    source = '''
import torch
from torch.nn import Embedding, Module, TransformerEncoder, TransformerEncoderLayer


class Tagger(Module):
    def __init__(self):
        super().__init__()
        self.embed = Embedding(10, 8, padding_idx=0)
        self.encoder = TransformerEncoder(TransformerEncoderLayer(8, 2, 16, dropout=0.0), 1,
                                          enable_nested_tensor=False)

    def forward(self, ids):
        return self.encoder(self.embed(ids))
'''
    result = convert_source(source, path="tagger.py")
    assert [d.message for d in result.diagnostics if d.severity == "error"] == []
    assert "class Embedding(nnx.Embed):" in result.code
    assert "class TransformerEncoderLayer(nnx.Module):" in result.code
    ns: dict = {}
    exec(compile(result.code, "tagger.py", "exec"), ns)  # noqa: S102 - the converter's output
    model = ns["Tagger"](rngs=nnx.Rngs(0))
    out = model(jnp.array([[0, 3, 4], [5, 0, 1]]))
    assert out.shape == (2, 3, 8)
