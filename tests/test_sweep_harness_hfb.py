"""The transformers sweep's harness (benchmarks/transformers_sweep.py, issue 31), the thirteenth
round's config rules: sizes the shrinking must keep consistent with others. Each test builds the
family's tiny model in torch and runs it on the sweep's inputs (the probe the sweep runs before
converting; no conversion here), and checks the tie the rule keeps."""

from __future__ import annotations

import importlib

import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

from sweep_module import fit, sweep

pytestmark = pytest.mark.transformers


def test_rope_parameters_keyed_by_layer_kind_where_the_file_reads_them_so() -> None:
    """Cohere Compass reads ``rope_parameters[layer_type]``; its default config gives them
    flat (the checkpoints per kind), which torch refused at any size."""
    config, _, _ = fit("cohere_compass.modeling_cohere_compass", "CohereCompassForCausalLM")
    assert set(config.rope_parameters) == set(config.layer_types)
    assert config.hidden_size == 32
    # where the file does not index them by kind, they stay flat
    from transformers import LlamaConfig
    assert "full_attention" not in sweep.shrink(LlamaConfig()).get("rope_parameters", {})


def test_a_backbones_stage_widths_followed_by_the_channels_tied_to_them() -> None:
    """D-FINE's HGNet-V2 builds its stages from ``stage_out_channels`` (each stage's input the
    previous one's output) and its encoder reads ``encoder_in_channels``, all equal to default
    stage widths: made small together, the other sizes (the stem's, the decoder's) kept."""
    from transformers import DFineConfig

    default = DFineConfig()
    config, _, _ = fit("d_fine.modeling_d_fine", "DFineModel")
    backbone = config.backbone_config
    assert backbone.stage_in_channels[1:] == backbone.stage_out_channels[:-1]
    assert backbone.stage_out_channels[1:] == backbone.hidden_sizes[1:]
    assert list(config.encoder_in_channels) == backbone.hidden_sizes[1:]
    assert backbone.stem_channels == default.backbone_config.stem_channels
    assert list(config.decoder_in_channels) == list(default.decoder_in_channels)
    assert config.num_queries == 8


def test_a_class_whose_forward_takes_an_input_the_sweep_builds() -> None:
    """PP-OCRv5's detector model takes a neck's ``hidden_states``, SAM 2's video model an
    inference session: the sweep verifies another class of the file whose forward takes what it
    builds (the detection head, on pixel values), or keeps the first where none does."""
    module = importlib.import_module(
        "transformers.models.pp_ocrv5_mobile_det.modeling_pp_ocrv5_mobile_det")
    base, head = sweep.entry_classes(module)
    assert base.__name__ == "PPOCRV5MobileDetModel"
    assert head.__name__ == "PPOCRV5MobileDetForObjectDetection"
    assert sweep._first_input(head) == "pixel_values"
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    assert sweep.entry_classes(llama)[1].__name__ == "LlamaForCausalLM"


def test_a_video_models_frames() -> None:
    """V-JEPA 2 takes ``pixel_values_videos``: [batch, frames, channels, height, width], its
    frames per clip and crop size made small together (a tubelet of two frames kept)."""
    config, _, specs = fit("vjepa2.modeling_vjepa2", "VJEPA2Model")
    assert specs[0] == f"float32[2,{config.frames_per_clip},3,{config.crop_size},{config.crop_size}]"
    assert config.frames_per_clip % config.tubelet_size == 0 and config.crop_size == 32


def test_a_plain_backbones_layers_handed_on_within_its_cut_layers() -> None:
    """ViTMatte's ViTDet backbone hands on its layer 4 of 12: cut to two layers, it hands on its
    last (the config's validation refused layer 4 of 2, so the backbone stayed full size); the
    fusion widths, a tuple the modeling file extends with a list, passed as a list."""
    from transformers import VitMatteConfig
    from transformers.models.vitmatte import modeling_vitmatte  # noqa: F401 (the file read)

    config, _ = sweep._built(VitMatteConfig, sweep.shrink(VitMatteConfig()))
    assert config.backbone_config.out_indices == [2]
    assert config.backbone_config.hidden_size == config.hidden_size == 32
    assert isinstance(config.fusion_hidden_sizes, list)


def test_an_attention_context_kept_within_the_positions() -> None:
    """Granite Speech 5's encoder validates ``context_size <= max_position_embeddings``: the
    positions made small, the context follows them."""
    from transformers.models.granite_speech5 import modeling_granite_speech5

    cls = modeling_granite_speech5.GraniteSpeech5ForCTC
    kwargs = sweep.shrink(cls.config_class())
    config, built = sweep._built(cls.config_class, kwargs)
    assert built == kwargs  # nothing refused, nothing left at its default

    def sizes(cfg):
        yield cfg
        for value in vars(cfg).values():
            if hasattr(value, "context_size"):
                yield from sizes(value)
    for cfg in sizes(config):
        if isinstance(getattr(cfg, "context_size", None), int):
            assert cfg.context_size <= cfg.max_position_embeddings <= 64


def test_key_value_heads_the_config_lacks_but_the_file_reads() -> None:
    """Moonshine Streaming's decoder reads ``config.num_key_value_heads``, which its config
    does not have (torch refused the default at any size): one per attention head."""
    config, _, specs = fit("moonshine_streaming.modeling_moonshine_streaming",
                            "MoonshineStreamingForConditionalGeneration")
    assert config.num_key_value_heads == config.num_attention_heads == 4
    assert specs[0] == "float32[2,400]"


def test_a_size_a_config_validator_ties_to_another_is_set_as_it_says() -> None:
    """Fun-ASR-Nano's validator ties its adaptor's width to a quarter of the text model's
    ("`adaptor_config.intermediate_size` (64) must equal `text_config.hidden_size // 4` (8)"):
    the shrunk config refused, set as the message says; a config it accepts is unchanged."""
    from transformers.models.fun_asr_nano import modeling_fun_asr_nano

    cls = modeling_fun_asr_nano.FunAsrNanoForConditionalGeneration
    config, kwargs = sweep._built(cls.config_class, sweep.shrink(cls.config_class()))
    assert config.adaptor_config.intermediate_size == config.text_config.hidden_size // 4 == 8
    assert kwargs["text_config"]["hidden_size"] == 32
    from transformers import LlamaConfig
    small = sweep.shrink(LlamaConfig())
    assert sweep._as_validated(LlamaConfig, small) == small


def test_shared_experts_the_default_leaves_none_filled() -> None:
    """Dots1's default config leaves its expert counts None (the checkpoints give them): filled,
    the shared experts too (one), torch builds and runs the tiny model; unfilled it refuses."""
    from transformers.models.dots1 import modeling_dots1

    cls = modeling_dots1.Dots1ForCausalLM
    assert "n_shared_experts" not in sweep.shrink(cls.config_class())
    config, kwargs = next(sweep.tiny_configs(cls.config_class, True))
    assert kwargs["n_shared_experts"] == 1 and config.n_routed_experts == 4
    specs, masked = sweep._inputs(cls, config)
    assert sweep._probe(cls, config, specs, masked) == ""
