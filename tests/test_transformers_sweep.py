"""A fixed sample of the transformers sweep (benchmarks/transformers_sweep.py, issue 31).

The sweep finds each modeling file's head class, shrinks its config class's *defaults* (the
cache stays on where the config has it on), converts the file and verifies logits and
gradients against torch, without and with a padding mask. Here a decoder (GPT-2, its default
config's DynamicCache compared), an encoder (BERT), a vision model (ViT) and a mixture of
experts (Mixtral) and a composite model whose towers ``AutoModel.from_config`` builds (LLaVA:
a CLIP vision tower and a Llama text model, their modeling files converted with it) go through
the very function the sweep runs per family, so that the table in docs/transformers-sweep.md
stays what the code gives. About three minutes on two cores.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

pytestmark = pytest.mark.transformers

ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(transformers.__file__).parent / "models"


def _sweep():
    spec = importlib.util.spec_from_file_location("transformers_sweep",
                                                  ROOT / "benchmarks" / "transformers_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("transformers_sweep", module)
    spec.loader.exec_module(module)
    return module


sweep = _sweep()


def test_shrink_keeps_the_defaults_but_the_sizes() -> None:
    from transformers import LlamaConfig, WhisperConfig

    kwargs = sweep.shrink(LlamaConfig())
    assert kwargs["hidden_size"] == 32 and kwargs["num_hidden_layers"] == 2
    assert kwargs["vocab_size"] == 64 and "use_cache" not in kwargs
    config = LlamaConfig(**kwargs)
    assert config.use_cache and config.hidden_size // config.num_attention_heads == 8
    whisper = WhisperConfig(**sweep.shrink(WhisperConfig()))
    assert max(whisper.pad_token_id, whisper.eos_token_id, whisper.decoder_start_token_id) < 64
    assert whisper.d_model == 32 and whisper.encoder_layers == 2


def test_shrink_keeps_a_layer_of_each_kind() -> None:
    """Zamba's default layers are 'mamba' then 'hybrid': the first two alone would leave the
    torch model without attention layers, whose cache torch's forward then refuses."""
    from transformers import ZambaConfig

    kinds = ZambaConfig().layers_block_type
    kwargs = sweep.shrink(ZambaConfig())
    assert len(kwargs["layers_block_type"]) == 2
    assert set(kwargs["layers_block_type"]) == set(kinds[:kinds.index("hybrid") + 1])
    assert sweep._per_layer(["a", "a", "b", "a"]) == ["a", "b"]


def test_shrink_fits_multimodal_rope_sections_to_the_head() -> None:
    """Qwen2-VL's text model splits its rotary frequencies into time, height and width
    sections, [16, 24, 24] in the modeling file when the config names none (its config
    declares the key): a tiny head needs sections that sum to half its size, else torch's
    forward stops (``split_with_sizes``)."""
    from transformers import Qwen2VLConfig

    config, _ = sweep.tiny_config(Qwen2VLConfig)
    text = config.text_config
    sections = text.rope_parameters["mrope_section"]
    assert len(sections) == 3 and min(sections) > 0
    assert sum(sections) == text.hidden_size // text.num_attention_heads // 2


def test_shrink_gives_a_head_dim_of_none_its_size() -> None:
    """Ministral's default ``head_dim`` is None, which its attention raises to a power: the
    tiny config names the size the heads give, and torch builds the model."""
    from transformers import MinistralConfig, MinistralForCausalLM

    config, _ = sweep.tiny_config(MinistralConfig)
    assert config.head_dim == config.hidden_size // config.num_attention_heads
    MinistralForCausalLM(config)


def test_shrink_keeps_the_state_space_mixers_ties() -> None:
    """Mamba-2's config validates num_heads * head_dim == expand * hidden_size: the heads and
    the head size shrunk on their own, the validator refused every shrink and the row said
    'config:'. The tiny config keeps the tie (and one group, which divides the heads)."""
    from transformers import BambaConfig, Mamba2Config

    config, kwargs = sweep.tiny_config(Mamba2Config)
    assert config.hidden_size == 32 and config.num_heads * config.head_dim == (
        config.expand * config.hidden_size)
    bamba, kwargs = sweep.tiny_config(BambaConfig)
    assert kwargs["hidden_size"] == 32  # no longer left at 4096 by the validator
    assert bamba.mamba_n_heads * bamba.mamba_d_head == bamba.mamba_expand * bamba.hidden_size


def test_the_sweep_climbs_the_ladder_where_torch_refuses_the_tiniest() -> None:
    """ERNIE 4.5 MoE groups its 64 experts for a top-k that four experts cannot give (torch's
    own forward: 'selected index k out of range'). The sweep probes torch on each rung
    (``LADDER``) and takes the first it builds and runs: the expert counts of the default,
    every other size still tiny."""
    from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

    tiniest, _ = sweep.tiny_config(Ernie4_5_MoeConfig)
    specs, masked = sweep._inputs(Ernie4_5_MoeForCausalLM, tiniest)
    assert "out of range" in sweep._probe(Ernie4_5_MoeForCausalLM, tiniest, specs, masked)
    config, kwargs, specs, masked = sweep.fitting_config(Ernie4_5_MoeForCausalLM,
                                                         Ernie4_5_MoeConfig)
    assert sweep._probe(Ernie4_5_MoeForCausalLM, config, specs, masked) == ""
    assert config.hidden_size == 32 and config.num_hidden_layers == 2
    assert config.moe_num_experts == Ernie4_5_MoeConfig().moe_num_experts
    assert not set(kwargs) & sweep.EXPERT_KEYS


def test_shrink_gives_a_timm_backbone_transformers_resnet() -> None:
    """DETR's default config builds timm's ResNet-50 (the timm library, which the sweep does
    not convert): the tiny config holds transformers' ResNet, whose stages it returns."""
    from transformers import DetrConfig

    config, _ = sweep.tiny_config(DetrConfig)
    backbone = config.backbone_config
    assert backbone.model_type == "resnet" and max(backbone.hidden_sizes) <= 64
    assert backbone.out_features == ["stage1", "stage2", "stage3", "stage4"]
    # its modeling file is converted with DETR's (AutoBackbone builds it)
    assert sweep._model_types(config) == {"resnet"}


def test_the_sweep_finds_base_and_head() -> None:
    from transformers.models.gpt2 import modeling_gpt2
    from transformers.models.vit import modeling_vit

    assert [c.__name__ for c in sweep.entry_classes(modeling_gpt2)] == [
        "GPT2Model", "GPT2LMHeadModel"]
    assert [c.__name__ for c in sweep.entry_classes(modeling_vit)] == [
        "ViTModel", "ViTForImageClassification"]
    assert sweep.family_of(MODELS / "gpt2" / "modeling_gpt2.py") == "gpt2"


@pytest.mark.parametrize("family", ["gpt2", "bert", "vit", "mixtral", "llava"])
def test_sample_of_the_sweep_verifies(family) -> None:
    [row] = sweep.run_one(MODELS / family / f"modeling_{family}.py")
    # LLaVA's two: transformers helpers it imports unconverted (torch_compilable_check,
    # select_hidden_states), off the path verify runs
    assert row["converted"] and row["todos"] == (2 if family == "llava" else 0), row
    assert row["verified"], row["reason"]
    assert row["max_diff"] is not None and row["max_diff"] < 1e-4
