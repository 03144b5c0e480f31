"""The transformers sweep's own harness (benchmarks/transformers_sweep.py, issue 31): the tiny
configs it makes and the inputs it builds, for a family of each kind the tenth round fixed.

Each test builds the family's tiny model in torch and runs it on the sweep's inputs (the probe
the sweep itself runs before converting), and checks that the config was only made smaller:
the stages, layer kinds, ties between sizes and the inputs' layout of the default model kept.
No conversion here (tests/test_transformers_sweep.py runs a sample end to end): a few seconds.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

from sweep_module import fit, sweep

pytestmark = pytest.mark.transformers


def test_a_layer_count_that_is_the_stage_count_keeps_the_stages() -> None:
    """Swin V2's num_layers is len(depths), and pretrained_window_sizes has one entry a stage:
    cutting either to two layers left the four stages without their window sizes."""
    config, kwargs, _ = fit("swinv2.modeling_swinv2", "Swinv2ForImageClassification")
    assert "num_layers" not in kwargs and "pretrained_window_sizes" not in kwargs
    assert config.depths == [1, 1, 1, 1] and config.embed_dim == 32


def test_a_backbone_keeps_the_stages_it_hands_on() -> None:
    """UperNet's default ResNet backbone hands on its four stages (the decode head reads each):
    a backbone dict of the shrunk sizes alone took ResNet's default, its last stage only."""
    config, _, _ = fit("upernet.modeling_upernet", "UperNetForSemanticSegmentation")
    assert config.backbone_config.out_indices == [1, 2, 3, 4]
    assert config.backbone_config.hidden_sizes == [8, 16, 32, 64]


def test_a_layer_kind_list_left_none_gets_a_layer_of_each_kind() -> None:
    """LFM2-MoE's default config leaves layer_types None, which its modeling file indexes
    (``layer_types[i] != "conv"``): one convolution layer and one attention layer."""
    config, _, _ = fit("lfm2_moe.modeling_lfm2_moe", "Lfm2MoeForCausalLM")
    assert sorted(config.layer_types) == ["conv", "full_attention"]
    assert config.num_hidden_layers == 2 and config.hidden_size == 32


def test_latent_attention_keeps_head_dim_the_rotary_size() -> None:
    """DeepSeek-V3's config names the rotary part's size head_dim (the rotary embedding is
    built for it): made width / heads, the rotation met a rotary part of half its size."""
    config, _, _ = fit("deepseek_v3.modeling_deepseek_v3", "DeepseekV3ForCausalLM")
    assert config.head_dim == config.qk_rope_head_dim == 4
    assert config.n_routed_experts % config.n_group == 0


def test_sizes_the_default_leaves_none_are_filled_where_torch_refuses_it() -> None:
    """Nemotron's default num_key_value_heads is None (the checkpoints give it), which its
    attention divides by: the heads then, as multi-head attention has."""
    from transformers import NemotronConfig

    assert NemotronConfig().num_key_value_heads is None
    assert "num_key_value_heads" not in sweep.shrink(NemotronConfig())
    config, _, _ = fit("nemotron.modeling_nemotron", "NemotronForCausalLM")
    assert config.num_key_value_heads == config.num_attention_heads == 4


@pytest.mark.parametrize(("module", "name", "shape"), [
    ("patchtst.modeling_patchtst", "PatchTSTModel", "float32[2,32,1]"),
    ("autoformer.modeling_autoformer", "AutoformerModel", "float32[2,39]"),
])
def test_a_time_series_model_gets_its_past_values(module, name, shape) -> None:
    """The past values over the context (and Autoformer's lags, 1 to 7, with its time
    features and observed mask, which its forward requires); Autoformer's feature_size, derived
    from the lags, left alone."""
    config, kwargs, specs = fit(module, name)
    assert specs[0] == shape and "feature_size" not in kwargs
    if name == "AutoformerModel":
        assert config.prediction_length == 4 and config.context_length == 32
        assert specs[1:] == ["past_time_features=float32[2,39,0]",
                             "past_observed_mask=bool[2,39]"]


def test_multimodal_rope_sections_fit_the_rotary_part() -> None:
    """GLM-4V's text model rotates half of each head (partial_rotary_factor 0.5): its
    multimodal RoPE sections sum to half that rotary part."""
    from transformers import Glm4vMoeTextConfig

    kwargs = sweep.shrink(Glm4vMoeTextConfig())
    rope = kwargs["rope_parameters"]
    head = kwargs["hidden_size"] // kwargs["num_attention_heads"]
    assert sum(rope["mrope_section"]) == int(head * rope["partial_rotary_factor"]) // 2


def test_audio_features_time_major_and_a_waveform_with_its_channels() -> None:
    """Canary's Parakeet encoder reads [batch, frames, mel bins]; Mimi's depthwise upsample
    has one group per channel of the (tiny) width and reads [batch, channels, samples]."""
    _, _, specs = fit("canary.modeling_canary", "CanaryForConditionalGeneration")
    assert specs[0] == "float32[2,32,8]"
    config, _, specs = fit("mimi.modeling_mimi", "MimiModel")
    assert config.upsample_groups == config.hidden_size == 32
    assert specs == ["float32[2,1,400]"]


def test_the_other_inputs_a_forward_requires() -> None:
    """InstructBLIP's forward requires its Q-Former's tokens besides the images."""
    from transformers import InstructBlipForConditionalGeneration

    config, _ = sweep.tiny_config(InstructBlipForConditionalGeneration.config_class)
    specs, _ = sweep._inputs(InstructBlipForConditionalGeneration, config)
    assert specs == ["float32[2,3,32,32]", "qformer_input_ids=int64[2,7]:64"]


def test_multimodal_rope_sections_keep_the_defaults_equal_pair() -> None:
    """ERNIE 4.5-VL's modeling file defaults its sections to [22, 22, 20], height and width
    first and interleaved (stacked, so of one size): the tiny sections keep that pair equal,
    and the text model builds and runs on them."""
    import torch
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as ernie

    config, _ = sweep.tiny_config(ernie.Ernie4_5_VLMoeTextConfig)
    sections = config.rope_parameters["mrope_section"]
    head = config.hidden_size // config.num_attention_heads
    assert sections[0] == sections[1] and sum(sections) == head // 2
    rotary = ernie.Ernie4_5_VLMoeTextRotaryEmbedding(config)
    cos, _ = rotary(torch.zeros(1, 3, config.hidden_size), torch.arange(3)[None])
    assert cos.shape[-1] == head
