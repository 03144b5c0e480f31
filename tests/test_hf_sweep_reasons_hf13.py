"""The transformers sweep's build-time reasons of the twelfth round (docs/transformers-sweep.md),
each checked against torch: a rule of the support module (transformers' machinery in JAX) on
transformers' own torch class, or a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request


@pytest.mark.transformers
def test_xielu_is_a_module_with_torchs_parameters_and_formula() -> None:
    """Apertus' ``ACT2CLS["xielu"](dtype=config.dtype)`` (and ``ACT2FN["xielu"]``): a module
    holding torch's parameters (``alpha_p``, ``alpha_n``) and buffers (``beta``, ``eps``);
    with torch's values copied in, its output and its gradients (of the input and of both
    parameters) are torch's, on both sides of zero and below ``eps``."""
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from torch2jax import transformers_runtime as runtime

    torch_act = activations.ACT2CLS["xielu"](dtype=torch.float32)
    with torch.no_grad():  # away from the initial values, so that a swapped pair shows
        torch_act.alpha_p.copy_(torch.tensor([0.3]))
        torch_act.alpha_n.copy_(torch.tensor([-0.7]))
    x = torch.linspace(-4.0, 3.0, 29).reshape(29, 1) * torch.tensor([1.0, 0.5, 1e-7])
    x.requires_grad_(True)
    out = torch_act(x)
    out.pow(2).sum().backward()

    assert "xielu" in runtime.ACT2FN and "xielu" in runtime.ACT2CLS
    act = runtime.ACT2CLS["xielu"](dtype=torch.float32)
    assert isinstance(runtime.ACT2FN["xielu"], nnx.Module)
    state = dict(torch_act.state_dict())
    assert set(state) == {"alpha_p", "alpha_n", "beta", "eps"}
    for name, value in state.items():
        variable = getattr(act, name)
        assert variable[...].shape == tuple(value.shape) and variable[...].dtype == jnp.float32
        variable[...] = jnp.array(value.detach().numpy())

    def loss(module, xs):
        return jnp.sum(module(xs) ** 2)

    xs = jnp.array(x.detach().numpy())
    np.testing.assert_allclose(np.asarray(act(xs)), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads, grad_x = jax.grad(loss, argnums=(0, 1))(act, xs)
    np.testing.assert_allclose(np.asarray(grad_x), x.grad.numpy(), rtol=1e-5, atol=1e-6)
    for name in ("alpha_p", "alpha_n"):
        np.testing.assert_allclose(np.asarray(getattr(grads, name)[...]),
                                   getattr(torch_act, name).grad.numpy(), rtol=1e-5)
    # the default (transformers': bfloat16) and a dtype named by a string
    assert runtime.ACT2FN["xielu"].alpha_p[...].dtype == jnp.bfloat16
    assert runtime.ACT2CLS["xielu"](dtype="float32").beta[...].dtype == jnp.float32


REGISTERED_LIST = '''
import torch
from torch import nn


class ConvModule(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class PoolingBlock(nn.Module):
    """UperNet's pyramid pooling block: a plain list whose modules add_module registers."""

    def __init__(self, scale, cin, cout):
        super().__init__()
        self.layers = [nn.AdaptiveAvgPool2d(scale), ConvModule(cin, cout)]
        for i, layer in enumerate(self.layers):
            self.add_module(str(i), layer)

    def forward(self, x):
        h = x
        for layer in self.layers:
            h = layer(h)
        return h


class PoolingModule(nn.Module):
    """UperNet's pyramid pooling module: an empty list grown in a loop that registers each
    block too."""

    def __init__(self, scales=(1, 2), cin=3, cout=4):
        super().__init__()
        self.blocks = []
        for i, scale in enumerate(scales):
            block = PoolingBlock(scale, cin, cout)
            self.blocks.append(block)
            self.add_module(str(i), block)

    def forward(self, x):
        outs = [nn.functional.interpolate(b(x), size=x.size()[2:], mode="bilinear",
                                          align_corners=False) for b in self.blocks]
        return outs[0] + outs[1]
'''


def test_a_plain_list_of_modules_registered_by_add_module_builds(tmp_path: Path) -> None:
    """UperNet / MaskFormer / Xcodec's "Found data on value of type list assigned to static
    attribute": the list is a module list from the start; the modules keep torch's names
    ("0.1.conv.weight"), so the weights and every gradient are compared by them."""
    path = tmp_path / "model.py"
    path.write_text(REGISTERED_LIST)
    r = run_request(VerifyRequest(target=f"{path}::PoolingModule", inputs=("float32[2,3,4,4]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


@pytest.mark.transformers
def test_the_auto_table_names_the_configs_class_and_the_models_own_type() -> None:
    """Mimi's ``AutoModel.from_config(config.encoder_config)``: transformers builds the class
    that the config's *class* maps to (MimiEncoderConfig, "mimi_encoder": MimiEncoderModel;
    the instance's model_type says "mimi"); ShieldGemma2 builds Gemma3 from its whole config
    with ``AutoModelForImageTextToText``. The converted package's table (``_hf_auto.py``)
    names both, so the converted model finds them when it is built."""
    pytest.importorskip("transformers")
    from transformers import AutoModel, AutoModelForImageTextToText, MimiConfig, ShieldGemma2Config

    from torch2jax.verify.package import _auto_models

    mimi = _auto_models("transformers.models.mimi.modeling_mimi", {"AutoModel"}, set())
    built = AutoModel.from_config(MimiConfig().encoder_config)
    assert mimi[("AutoModel", "mimi_encoder")] == (type(built).__module__, type(built).__name__)
    shield = _auto_models("transformers.models.shieldgemma2.modeling_shieldgemma2",
                          {"AutoModelForImageTextToText"}, set())
    want = AutoModelForImageTextToText._model_mapping[ShieldGemma2Config]
    assert shield[("AutoModelForImageTextToText", "shieldgemma2")] == (want.__module__,
                                                                        want.__name__)


@pytest.mark.transformers
def test_the_sweeps_inputs_for_perceiver_and_a_detectors_hidden_states() -> None:
    """The harness: Perceiver's masked LM takes ``inputs`` (what its preprocessor reads) and
    the token ids by their name; PP-OCRv5's detector hands ``hidden_states`` to its backbone
    (the pixels); a ``...PreTrainedModelFor...`` class (Qwen-Omni's) is no entry."""
    transformers = pytest.importorskip("transformers")
    import importlib.util
    import sys
    import types

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "transformers_sweep.py"
    spec = importlib.util.spec_from_file_location("transformers_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("transformers_sweep", sweep)
    spec.loader.exec_module(sweep)
    from transformers.models.perceiver.modeling_perceiver import PerceiverForMaskedLM
    from transformers.models.pp_ocrv5_mobile_det.modeling_pp_ocrv5_mobile_det import (
        PPOCRV5MobileDetModel,
    )

    config = transformers.PerceiverConfig(vocab_size=50)
    specs, masked = sweep._inputs(PerceiverForMaskedLM, config)
    assert specs == [f"input_ids=int64[{sweep.BATCH},{sweep.SEQ}]:50"] and not masked
    det = PPOCRV5MobileDetModel.config_class()
    assert det.backbone_config is not None
    specs, _ = sweep._inputs(PPOCRV5MobileDetModel, det)
    assert len(specs) == 1 and specs[0].startswith(f"float32[{sweep.BATCH},")

    module = types.ModuleType("modeling_fake")
    base = type("FakePreTrainedModel", (transformers.PreTrainedModel,), {})
    for name in ("FakePreTrainedModelForConditionalGeneration", "FakeModel",
                 "FakeForConditionalGeneration"):
        setattr(module, name, type(name, (base,), {"__module__": module.__name__}))
    base.__module__ = module.__name__
    found = sweep.entry_classes(module)
    assert [c.__name__ for c in found] == ["FakeModel", "FakeForConditionalGeneration"]
