"""The transformers sweep's harness, the fourteenth round (benchmarks/transformers_sweep.py,
issue 31): rows that failed in torch before the converter was tested. The required inputs a
forward's signature names (TimesFM's padding and frequency, VideoMAE's masked patches,
OmDet-Turbo's masks of its tokens), an attribute a module reads from a sub-config that lacks it
given from another config of the tree (DBRX), the cache turned off where torch cannot build it
for the default config (BLT: a stand-in model here), and another class of the file where torch
refuses the one the head order picks (SeamlessM4T's text-to-units model).

Each test builds the tiny model in torch and runs it on the sweep's inputs (``_probe``: torch's
error, '' when it runs); no conversion here (tests/test_transformers_sweep.py runs a sample end
to end).
"""

from __future__ import annotations

import importlib

import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

from sweep_module import sweep

pytestmark = pytest.mark.transformers


def _module(name: str):
    return importlib.import_module(f"transformers.models.{name}")


def test_a_time_series_forward_gets_its_padding_and_frequency() -> None:
    """TimesFM's forward requires which steps are padding and a frequency per row: the
    padding is as long as the past values, the frequency one of ``config.freq_size``."""
    cls = _module("timesfm.modeling_timesfm").TimesFmModel
    config, _ = sweep.tiny_config(cls.config_class)
    specs, masked = sweep._inputs(cls, config)
    length = config.context_length
    assert specs == [f"float32[2,{length}]", f"past_values_padding=int64[2,{length}]:2",
                     f"freq=int64[2,1]:{config.freq_size}"]
    assert sweep._probe(cls, config, specs, masked) == ""


def test_the_masked_patches_of_a_video_pre_training_model() -> None:
    """VideoMAE's pre-training hides patches (``bool_masked_pos``, required): one entry per
    tubelet of the frames, as many hidden in each row (its loss gathers them into one tensor),
    an expression each side evaluates; torch runs the model on them."""
    import torch

    cls = _module("videomae.modeling_videomae").VideoMAEForPreTraining
    config, _ = sweep.tiny_config(cls.config_class)
    specs, masked = sweep._inputs(cls, config, "video")
    _, exprs = sweep._split(specs)
    count = (config.image_size // config.patch_size) ** 2 * (
        config.num_frames // config.tubelet_size)
    assert [x.partition("=")[0] for x in exprs] == ["bool_masked_pos"]
    value = eval(exprs[0].partition("=")[2], {"torch": torch})
    assert value.shape == (sweep.BATCH, count) and value.sum(1).tolist() == [count // 2] * 2
    assert sweep._probe(cls, config, specs, masked) == ""


def test_the_attention_masks_of_named_tokens() -> None:
    """OmDet-Turbo requires a mask for each of its two token inputs: each has its tokens'
    shape (its ``classes_structure``, a count of classes per image, no rule knows)."""
    cls = _module("omdet_turbo.modeling_omdet_turbo").OmDetTurboForObjectDetection
    config, _ = sweep.tiny_config(cls.config_class)
    specs = dict(x.partition("=")[::2] for x in sweep._inputs(cls, config)[0][1:])
    assert specs["classes_attention_mask"] == "int64[2,7]:2"
    assert specs["tasks_attention_mask"] == "int64[2,7]:2"
    assert "classes_structure" not in specs


def test_an_attribute_a_sub_config_lacks_is_given_from_the_tree() -> None:
    """DBRX's attention reads ``attn_config.rope_theta``, which the config class keeps in the
    model's ``rope_parameters`` (a checkpoint's config.json carries it): the sweep gives it
    there, and its clamp a bound (``clip_qkv``, None by default, clamped anyway); torch then
    builds and runs the tiny model."""
    cls = _module("dbrx.modeling_dbrx").DbrxForCausalLM
    config, kwargs = sweep.tiny_config(cls.config_class)
    why = sweep._probe(cls, config, ["int64[2,7]:64"], False)
    assert "'DbrxAttentionConfig' object has no attribute 'rope_theta'" in why
    given = sweep._attribute_given(config, kwargs, why)
    assert given["attn_config"]["rope_theta"] == config.rope_parameters["rope_theta"]
    assert sweep._attribute_given(config, given, why) is None  # given once only
    fit, runs = sweep._fitting(cls, cls.config_class)
    assert runs and fit[0].attn_config.rope_theta == config.rope_parameters["rope_theta"]
    assert fit[0].attn_config.clip_qkv == sweep.FILLED["clip_qkv"]


class _CacheConfig(transformers.PretrainedConfig):
    model_type = "sweep_cache_stand_in"

    def __init__(self, hidden_size=32, vocab_size=64, use_cache=True, **kwargs):
        self.hidden_size, self.vocab_size, self.use_cache = hidden_size, vocab_size, use_cache
        super().__init__(**kwargs)


class _CacheModel(transformers.PreTrainedModel):
    """A model whose cache torch cannot build for the default config (BLT's DynamicCache
    reads a layer count its composite config lacks): it refuses to run with the cache on."""

    config_class = _CacheConfig

    def __init__(self, config):
        import torch

        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, input_ids, attention_mask=None):
        if self.config.use_cache:
            raise AttributeError("'_CacheConfig' object has no attribute 'num_hidden_layers'")
        return self.embed(input_ids)


def test_the_cache_turned_off_where_torch_cannot_build_it() -> None:
    """Where torch refuses a forward with the cache on and runs it with the cache off, the
    sweep keeps the cache off (marked, so that its build turns it off too, ``CACHE_OFF``)."""
    fit, runs = sweep._fitting(_CacheModel, _CacheConfig)
    assert runs and fit[0].use_cache is False and fit[0].sweep_cache_off
    assert sweep._probe(_CacheModel, fit[0], fit[2], fit[3]) == ""


class _TokensModel(_CacheModel):
    """A model of the same file that runs (the cache plays no part in it)."""

    def forward(self, input_ids, attention_mask=None):
        return self.embed(input_ids)


def test_another_class_where_torch_refuses_the_head() -> None:
    """Where torch refuses the class the head order picks on every rung, the sweep verifies
    the first other class of the file that torch runs, heads first (SeamlessM4T v2's
    text-to-units model takes no token ids: its text-to-text model comes first of the others)."""
    import types

    module = _module("seamless_m4t_v2.modeling_seamless_m4t_v2")
    head = module.SeamlessM4Tv2TextToUnitForConditionalGeneration
    assert sweep.entry_classes(module)[1] is head
    assert sweep._entries(module, head)[0] is module.SeamlessM4Tv2ForTextToText
    stand_in = types.ModuleType(__name__)
    refused = type("RefusedForCausalLM", (_CacheModel,), {"__module__": __name__})
    runs = type("RunsModel", (_TokensModel,), {"__module__": __name__})
    stand_in.RefusedForCausalLM, stand_in.RunsModel = refused, runs
    refused.forward = lambda self, input_ids, attention_mask=None: input_ids.foo
    cls, fit = sweep.fitting_entry(stand_in, refused)
    assert cls is runs and sweep._probe(cls, fit[0], fit[2], fit[3]) == ""
    assert sweep.fitting_entry(stand_in, runs)[0] is runs


def test_a_special_token_the_default_leaves_none() -> None:
    """BLIP-2's default config leaves its image token None (the checkpoints give it), and its
    forward compares the tokens with it: where torch refuses the default, the filled config
    names one inside the tiny vocabulary (read through the attribute map's
    ``image_token_id``), and torch runs the model on it."""
    cls = _module("blip_2.modeling_blip_2").Blip2ForConditionalGeneration
    assert "image_token_index" not in sweep.shrink(cls.config_class())
    assert sweep.shrink(cls.config_class(), True)["image_token_index"] == sweep.VOCAB - 1
    config = cls.config_class(image_token_index=sweep.VOCAB - 1)
    assert "image_token_id" in cls.config_class.attribute_map and config.image_token_id == 63


def test_the_input_features_a_feature_projection_reads() -> None:
    """Wav2Vec2-BERT's features are stacked frames, as wide as its feature projection reads
    (``feature_projection_input_dim``, not the mel bins): torch runs the model on them."""
    cls = _module("wav2vec2_bert.modeling_wav2vec2_bert").Wav2Vec2BertForSequenceClassification
    config, _ = sweep.tiny_config(cls.config_class)
    specs, masked = sweep._inputs(cls, config, "frames")
    assert specs == [f"float32[2,32,{config.feature_projection_input_dim}]"]
    assert sweep._probe(cls, config, specs, masked) == ""


def test_a_mapping_the_default_leaves_none() -> None:
    """Chameleon's model reads ``config.vocabulary_map`` (its image tokens' names, which the
    checkpoints give; None by default, which torch refuses): the filled config gives an
    empty mapping (no image tokens, the text alone)."""
    cls = _module("chameleon.modeling_chameleon").ChameleonForConditionalGeneration
    assert "vocabulary_map" not in sweep.shrink(cls.config_class())
    assert sweep.shrink(cls.config_class(), True)["vocabulary_map"] == {}
    config, _ = sweep._built(cls.config_class, sweep.shrink(cls.config_class(), True))
    assert config.vocabulary_map == {} and config.image_token_id is None
    # (torch builds and runs the model on it: the sweep's row, which reaches the JAX build;
    # not here, where its image tokenizer at full size would take seconds)


def test_a_video_with_the_tokens_its_language_model_reads() -> None:
    """InstructBLIP-Video's forward takes a video's frames ([batch, frames, channels, height,
    width]) and, optionally, its language model's tokens, without which it refuses to run: the
    'video extras' variant gives both."""
    cls = _module("instructblipvideo.modeling_instructblipvideo"
                  ).InstructBlipVideoForConditionalGeneration
    config, _ = sweep.tiny_config(cls.config_class)
    specs, _ = sweep._inputs(cls, config, "video extras")
    frames = config.vision_config.num_frames if hasattr(config.vision_config, "num_frames") else 2
    size = config.vision_config.image_size
    assert specs == [f"float32[2,{frames},3,{size},{size}]", "qformer_input_ids=int64[2,7]:64",
                     "input_ids=int64[2,7]:64"]
    assert "input_ids=int64[2,7]:64" not in sweep._inputs(cls, config, "video")[0]
