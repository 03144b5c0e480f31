"""The transformers sweep's inputs that follow the config and the forward's signature
(benchmarks/transformers_sweep.py, issue 31, the thirteenth round): rows whose torch model
failed on the inputs the sweep built, before the converter was tested.

Each test builds the family's tiny model in torch and runs it on the sweep's inputs (the probe
the sweep runs before converting: ``_probe`` returns torch's error, '' when it runs). No
conversion here (tests/test_transformers_sweep.py runs a sample end to end).
"""

from __future__ import annotations

import importlib
import types

import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

from sweep_module import sweep

pytestmark = pytest.mark.transformers


def _head(module: str, cls_name: str):
    return getattr(importlib.import_module(f"transformers.models.{module}"), cls_name)


def _runs(cls, config, variant: str = "") -> list[str]:
    """The sweep's inputs of ``variant`` for ``cls(config)``, asserted to run in torch."""
    specs, masked = sweep._inputs(cls, config, variant)
    assert sweep._probe(cls, config, specs, masked) == ""
    return specs


def test_an_image_size_given_as_height_and_width() -> None:
    """MGP-STR reads text lines of 32 by 128 pixels: the image keeps both sides (its row
    verifies on them)."""
    cls = _head("mgp_str.modeling_mgp_str", "MgpstrForSceneTextRecognition")
    config, _ = sweep.tiny_config(cls.config_class)
    assert list(config.image_size) == [32, 128]
    assert sweep._inputs(cls, config)[0] == ["float32[2,3,32,128]"]


def test_a_waveform_as_long_as_the_feature_encoder_needs() -> None:
    """SEW's convolutions (strides 5, 2, 2, 2, 2, 2, kernels 10, 3, ..., then a pooling by its
    squeeze factor 2) shrink 400 samples to less than one frame: the waveform is as long as
    they need for 8 frames after the pooling, and the pooled output has them."""
    import torch

    cls = _head("sew.modeling_sew", "SEWModel")
    config, _ = sweep.tiny_config(cls.config_class)
    specs, _ = sweep._inputs(cls, config)
    samples = int(specs[0].split(",")[1].rstrip("]"))
    assert samples > 400
    torch.manual_seed(0)
    out = cls(config).eval()(torch.randn(1, samples)).last_hidden_state
    assert out.shape[1] == 8 * config.squeeze_factor  # (pooled to 8, upsampled back)
    assert sweep._samples(types.SimpleNamespace(conv_kernel=[3], conv_stride=[1])) == 400


def test_a_spectrogram_read_as_input_values() -> None:
    """The Audio Spectrogram Transformer's input_values are [batch, frames, mel bins]."""
    cls = _head("audio_spectrogram_transformer.modeling_audio_spectrogram_transformer",
                "ASTForAudioClassification")
    config, _ = sweep.tiny_config(cls.config_class)
    assert _runs(cls, config, "frames") == [
        f"float32[2,{config.max_length},{config.num_mel_bins}]"]


def test_the_optional_inputs_a_forward_checks_for_none() -> None:
    """BROS refuses to run without its boxes, X-MOD without a language per row: the
    'extras' variant gives them, from their names and the config (X-MOD's languages; the
    X-MOD model runs on them)."""
    cls = _head("bros.modeling_bros", "BrosForTokenClassification")
    config, _ = sweep.tiny_config(cls.config_class)
    assert sweep._inputs(cls, config, "extras")[0][1:] == ["bbox=float32[2,7,4]"]
    cls = _head("xmod.modeling_xmod", "XmodForCausalLM")
    config, _ = sweep.tiny_config(cls.config_class)
    assert _runs(cls, config, "extras")[1:] == [f"lang_ids=int64[2]:{len(config.languages)}"]


def test_a_hybrid_whose_default_has_no_attention_layer() -> None:
    """GraniteMoeHybrid's default layer_types are all linear attention, which torch refuses
    (no attention layer for the cache's length): where torch refuses every rung, the filled
    config gives its last layer attention."""
    cls = _head("granitemoehybrid.modeling_granitemoehybrid", "GraniteMoeHybridForCausalLM")
    assert sweep.shrink(cls.config_class())["layer_types"] == ["linear_attention"] * 2
    assert sweep.shrink(cls.config_class(), True)["layer_types"] == [
        "linear_attention", "full_attention"]
    config, _, specs, masked = sweep.fitting_config(cls, cls.config_class)
    assert config.layer_types == ["linear_attention", "full_attention"]
    assert sweep._probe(cls, config, specs, masked) == ""


def test_a_token_index_read_with_a_default_past_the_vocabulary() -> None:
    """ShieldGemma 2 reads ``getattr(config, "yes_token_index", 10_784)``: the tiny config
    names one inside its vocabulary."""
    cls = _head("shieldgemma2.modeling_shieldgemma2", "ShieldGemma2ForImageClassification")
    kwargs = sweep.shrink(cls.config_class())
    assert {kwargs["yes_token_index"], kwargs["no_token_index"]} <= set(range(sweep.VOCAB))
