"""The sweep over the installed transformers' ``models/`` folder (issue 31).

For each modeling file (``models/<family>/modeling_<name>.py``) the sweep

* imports it and finds its base class (``<Prefix>Model``) and its head classes
  (``...ForCausalLM``, ``...ForMaskedLM``, ``...ForImageClassification``, ...): the classes
  of the file that subclass ``PreTrainedModel``; the head it verifies is the first in
  ``HEADS``'s order, else the base; where that class's forward takes a first input the sweep
  does not build (a session object, a neck's hidden states), another class of the file whose
  forward takes one it builds, a head first;
* builds a tiny config by shrinking the config class's defaults (hidden sizes, layers, heads,
  key-value heads, vocabulary, positions, experts, image and audio sizes; ``head_dim`` kept
  consistent with the hidden size and the heads; lists per layer cut to the new layer count;
  token ids kept inside the vocabulary; the stages of a hierarchical model and the stages a
  backbone hands on kept; sizes tied to others kept tied: a rotary part and multimodal RoPE
  sections, a depthwise convolution's groups; a list of layer kinds that the default leaves
  None given one layer of each kind its modeling file names; where torch refuses the result,
  the sizes the default leaves None filled in too; RoPE parameters per layer kind where the
  file reads them so; a backbone's channel lists following its stage widths; a size a config
  validator ties to another set as its message says). Nothing else of the default config changes: the
  cache stays on where the config has it on, unless its ``DynamicCache`` holds layers the
  converted cache does not translate (``_cache_translated``: then ``use_cache=False``);
* builds the forward's inputs from its first parameter's name and the config (tokens, pixels,
  a video's frames, audio features or waveform, a time series' past values over its context;
  an image's height and width, a waveform as long as the config's feature encoder needs), and
  the other inputs the forward requires (or checks for None) where their name says what they
  are;
* converts the file once into a mirror package (as ``torch2jax verify`` does) and runs
  ``verify`` on it: logits and every parameter's gradient in float32, without and with a
  random padding mask where the forward takes ``attention_mask``;
* writes one row per file with ``sweep_table.write_markdown``: family, entry, converted,
  TODOs, verified, largest difference and the first reason of a failure.

Each family runs in its own process with a time limit (``--timeout``), so that one hang or
crash does not stop the sweep; ``--jobs`` runs several at once. Every finished row is appended
to ``--jsonl`` as it comes, and ``--resume`` skips the families already there, so a long sweep
can be stopped and continued. The command::

    nice python benchmarks/transformers_sweep.py --jobs 2 --timeout 300 \\
        --jsonl sweep.jsonl --doc docs/transformers-sweep.md

``--families llama,bert`` (directory names or file stems), ``--range 100:200`` (a slice of the
file list, after ``--shuffle``) and ``--limit N`` choose a subset;
``--doc-only`` rewrites the doc from the rows of ``--jsonl``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import dataclasses
import datetime
import inspect
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_table import Result, write_markdown

# the head classes, in the order the sweep prefers them (a class name's ending)
HEADS = ("ForCausalLM", "ForConditionalGeneration", "ForMaskedLM", "LMHeadModel",
         "ForImageClassification", "ForSequenceClassification", "ForAudioClassification",
         "ForTokenClassification", "ForQuestionAnswering", "ForPreTraining")
SEQ, DECODER_SEQ, BATCH = 7, 5, 2
WIDTH, FFN, LAYERS, HEADS_N, HEAD_DIM, VOCAB, POSITIONS = 32, 64, 2, 4, 8, 64, 64

# config keys shrunk to a fixed value when their default is larger
SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim",
                     "word_embed_proj_dim", "projection_dim", "text_embed_dim",
                     "vision_embed_dim", "embedding_size", "d_embed", "n_embed",
                     "encoder_hidden_size", "decoder_hidden_size", "proj_dim",
                     "hidden_size_per_head", "emb_dim", "pred_hidden_size",
                     "hidden_size_global",
                     # a tower's output width, a projector's (multimodal models: the text
                     # model's width, which the shrinking makes WIDTH too)
                     "out_hidden_size", "projector_hidden_size", "vision_hidden_size",
                     "audio_hidden_size"), WIDTH),
    **dict.fromkeys(("intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim",
                     "decoder_ffn_dim", "n_inner", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "decoder_intermediate_size",
                     "ffn_hidden_size", "mlp_dim", "expert_intermediate_size",
                     "intermediate_size_mlp", "d_inner", "shared_intermediate_size",
                     "encoder_feedforward_dim", "dim_feedforward", "share_expert_dim",
                     "moe_shared_expert_intermediate_size"), FFN),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "encoder_layers",
                     "decoder_layers", "num_decoder_layers", "n_layers",
                     "num_encoder_layers", "decoder_num_layers", "encoder_num_layers",
                     "pred_num_hidden_layers", "encoder_num_hidden_layers",
                     "decoder_num_hidden_layers", "depth",
                     # LXMERT's language, cross-modality and relation layers
                     "l_layers", "x_layers", "r_layers"), LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "encoder_attention_heads",
                     "decoder_attention_heads", "num_heads", "n_heads",
                     "decoder_num_attention_heads", "encoder_num_attention_heads",
                     "pred_num_attention_heads"), HEADS_N),
    **dict.fromkeys(("head_dim", "d_kv", "attention_head_dim", "kv_channels",
                     "attention_head_size", "qk_nope_head_dim", "v_head_dim",
                     "index_head_dim", "linear_key_head_dim", "linear_value_head_dim",
                     "swa_head_dim"), HEAD_DIM),
    **dict.fromkeys(("mamba_d_state", "state_size", "ssm_state_size", "d_state",
                     "classifier_proj_size"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "rotary_dim", "rotary_emb_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("vocab_size", "n_vocab", "vocab_size_per_layer_input"), VOCAB),
    **dict.fromkeys(("hidden_size_per_layer_input",), 16),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_target_positions",
                     "n_ctx", "max_seq_len", "max_sequence_length", "seq_length",
                     "max_text_positions"), POSITIONS),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                     "num_experts_total"), 4),
    **dict.fromkeys(("num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts",
                     "n_group", "topk_group", "top_k_experts"), 2),
    **dict.fromkeys(("image_size", "img_size", "input_size"), 32),
    **dict.fromkeys(("patch_size",), 4),
    **dict.fromkeys(("num_mel_bins", "feature_size", "n_mels", "input_feat_size"), 8),
    **dict.fromkeys(("num_frames", "frames_per_clip"), 2),
    **dict.fromkeys(("crop_size",), 32),
    **dict.fromkeys(("max_source_positions",), 16),
    **dict.fromkeys(("context_length",), 32),
    **dict.fromkeys(("prediction_length", "horizon_length"), 4),
    **dict.fromkeys(("num_labels",), 5),
    # a detector's object queries (D-FINE takes the top ones of its tiny image's anchors)
    **dict.fromkeys(("num_queries",), 8),
    **dict.fromkeys(("relative_attention_num_buckets",), 8),
    **dict.fromkeys(("relative_attention_max_distance",), 16),
    **dict.fromkeys(("type_vocab_size",), 2),
}
# sizes that no default shrinks but that a default config may leave None for the checkpoints
# to give (``shrink``'s ``fill``): Dots1's shared experts
FILLED = {"n_shared_experts": 1,
          "sliding_window": 4,  # (Step3p7's attention reads a window its default leaves None)
          "clip_qkv": 8}  # (DBRX clamps its queries, keys and values to it, None or not)
# lists with one entry per stage of a hierarchical vision model (SegFormer, Swin, Hiera):
# what kind of size each entry is
STAGES = {**dict.fromkeys(("depths", "block_sizes"), "depth"),
          **dict.fromkeys(("hidden_sizes", "embed_dims", "dims"), "width"),
          **dict.fromkeys(("num_heads", "num_attention_heads"), "heads")}
KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers",
                "decoder_layers", "n_layers")


def shrink(config, fill: bool = False) -> dict:
    """The keyword arguments that make ``type(config)``'s defaults tiny: the changed keys
    only, sub-configs as dicts of theirs. With ``fill``, the sizes the default config leaves
    None are given their tiny value too (key-value heads: the heads), for a config that torch
    refuses as it is (``fitting_config``: ESM's vocabulary, Nemotron's key-value heads,
    DeepSeek-V2's top-k are None by default, the checkpoints' configs give them)."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    out: dict = {}
    layers = next((values[k] for k in LAYER_COUNTS if isinstance(values.get(k), int)), None)
    stages = next((len(v) for k, v in values.items() if k in STAGES and isinstance(v, list)), 0)
    if layers and layers == stages:
        # a layer count that is the stage count (Swin's num_layers = len(depths)): the stages
        # are kept (each made small), and so are the lists with one entry per stage
        layers = None
    for key, value in values.items():
        try:
            sub = getattr(config, key, None)
        except Exception:  # noqa: BLE001 (a per-layer attribute read as one)
            sub = None
        if key == "backbone_config" and getattr(sub, "model_type", None) == "timm_backbone":
            # DETR's default backbone is timm's ResNet-50, which needs the timm library (not
            # converted either): transformers' own ResNet instead, tiny, with the same stages
            from transformers import ResNetConfig

            out[key] = {"model_type": "resnet", **shrink(ResNetConfig()),
                        "out_indices": list(getattr(sub, "out_indices", None) or [4])}
            continue
        if key.endswith("_config") and hasattr(sub, "to_dict"):
            changed = shrink(sub, fill)
            if key == "backbone_config" and changed:
                # the stages a backbone hands on, which the model's default config chose (D-FINE
                # builds its HGNet-V2 with out_indices [2, 3, 4]): a dict of the changed keys
                # alone would take the backbone config's own default (its last stage only)
                changed.update({k: list(getattr(sub, k)) for k in ("out_indices",)
                                if isinstance(getattr(sub, k, None), (list, tuple))})
                depth = next((changed[k] for k in LAYER_COUNTS if isinstance(changed.get(k), int)),
                             None)
                if depth and isinstance(changed.get("out_indices"), list):
                    # a plain (non-hierarchical) backbone's layers cut: the layers it hands on
                    # that no longer exist are its last (ViTMatte's ViTDet hands on layer 4)
                    changed["out_indices"] = sorted({min(i, depth) if isinstance(i, int) and i > 0
                                                     else i for i in changed["out_indices"]})
                if isinstance(changed.get("hidden_sizes"), list):
                    # the widths of the stages it hands on (out_indices count the stem as 0)
                    picked = [i - 1 for i in changed.get("out_indices", ()) if isinstance(i, int)]
                    old = list(sub.hidden_sizes)
                    changed["_hidden_sizes"] = [
                        v if not picked or i in picked else None for i, v in enumerate(old)]
            if changed:
                out[key] = {"model_type": getattr(sub, "model_type", None), **changed}
                if out[key]["model_type"] in (None, ""):
                    del out[key]["model_type"]
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(v, int) for v in value) and isinstance(sub, tuple) and re.search(
                rf"\+\s*(?:self\.)?config\.{key}\b|\bconfig\.{key}\s*\+", _source(config)):
            # a tuple default that the modeling file extends with a list (ViTMatte's
            # ``[config.hidden_size] + config.fusion_hidden_sizes``): a checkpoint's config, read
            # from JSON, gives a list
            out[key] = list(value)
            value = out[key]
        if value is None and key.endswith("layer_types") and layers:
            kinds = _layer_kinds(config, key)
            if kinds:
                out[key] = kinds
                out[next(k for k in LAYER_COUNTS if isinstance(values.get(k), int))] = len(kinds)
            continue
        if key == "feature_size" and "lags_sequence" in values:
            continue  # (Autoformer's: the lagged values and the time features, derived)
        if fill and layers and (value is None and key in HYBRID_INDICES or key in OTHER_KIND and (
                isinstance(value, list) and value and len(set(value)) == 1
                and value[0] != OTHER_KIND[key])):
            # a hybrid whose default config has no attention layer, which torch refuses
            # (Bamba's attn_layer_indices None, GraniteMoeHybrid's layer_types all
            # "linear_attention": get_seq_length finds no attention layer in the cache): its
            # last layer an attention layer, as the checkpoints' configs have some
            out[key] = [LAYERS - 1] if value is None else [value[0]] * (LAYERS - 1) + [
                OTHER_KIND[key]]
        elif fill and value is None and key in SIZES and key not in LAYER_COUNTS:
            out[key] = SIZES[key]
        elif fill and value is None and key in FILLED:
            out[key] = FILLED[key]
        elif fill and value is None and str(_annotation(config, key)).startswith("dict") and (
                re.search(rf"\bconfig\.{key}\b", _source(config))):
            # a mapping the default leaves None and the modeling file reads (Chameleon's
            # vocabulary_map, its image tokens' names, which the checkpoints give): an empty one
            # (no image tokens: the text alone)
            out[key] = {}
        elif fill and value is None and key == "pad_token_id":
            out[key] = 1  # (ESM compares the tokens with it)
        elif fill and value is None and key.endswith(("_token_index", "_token_id")) and any(
                re.search(rf"\bconfig\.{name}\b", _source(config))
                for name in (key, *(k for k, v in getattr(config, "attribute_map", {}).items()
                                    if v == key))):
            # a special token the modeling file compares the tokens with, which the default
            # leaves None (BLIP-2's image token, where its image features go): one inside the
            # tiny vocabulary, from its top down
            out[key] = VOCAB - 1 - sum(k.endswith(("_token_index", "_token_id")) for k in out)
        elif key in SIZES and isinstance(value, int) and value > SIZES[key] and not (
                key in LAYER_COUNTS and layers is None and value == stages):
            out[key] = SIZES[key]
        elif key in ("image_size", "img_size", "input_size") and isinstance(value, list) and all(
                isinstance(v, int) and v > 32 for v in value):
            out[key] = [32] * len(value)  # an image size given as (height, width)
        elif key in STAGES and isinstance(value, list) and value and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            # one entry per stage: the stage count kept (sibling lists, strides, patch sizes,
            # ratios, have one entry per stage too), each entry made small
            small = _stage_list(key, value)
            if small != value:
                out[key] = small
        elif (isinstance(value, list) and layers and len(value) == layers and layers > LAYERS
              and key not in ("depths",)):
            out[key] = _per_layer(value)
        elif key.endswith("token_id") and isinstance(value, int) and value >= VOCAB:
            out[key] = 3 + abs(hash(key)) % 8
        elif key.endswith("token_id") and isinstance(value, list) and any(
                isinstance(v, int) and v >= VOCAB for v in value):
            out[key] = [v if v < VOCAB else 3 + i for i, v in enumerate(value)]
        elif key.endswith("_token_index") and isinstance(value, int) and value >= VOCAB:
            out[key] = VOCAB - 1
    for i, (key, number) in enumerate(re.findall(
            r"getattr\(\s*(?:self\.)?config,\s*[\"'](\w+_token_(?:index|id))[\"'],\s*(\d[\d_]*)\s*\)",
            _source(config))):
        if key not in values and int(number) >= VOCAB:
            # a token the modeling file reads with a default of the checkpoint's vocabulary
            # (ShieldGemma 2's yes_token_index, 10_784): one inside the tiny vocabulary
            out[key] = VOCAB - 2 - i
    heads = out.get("num_attention_heads", values.get("num_attention_heads"))
    for key in KV_HEADS:
        kv = values.get(key)
        if isinstance(kv, int) and isinstance(heads, int):
            original = values.get("num_attention_heads")
            out[key] = heads if kv == original else max(1, min(kv, heads // 2))
        elif fill and kv is None and key in values and isinstance(heads, int):
            out[key] = heads
    width = out.get("hidden_size", values.get("hidden_size"))
    if "head_dim" in values and (isinstance(values["head_dim"], int) or values[
            "head_dim"] is None) and isinstance(width, int) and heads:
        # (a default of None too: Ministral's and Hunyuan's modeling files read it as a
        # number, so torch refuses those defaults even at full size)
        out["head_dim"] = max(width // heads, 1)
        if isinstance(values.get("qk_rope_head_dim"), int) and values.get(
                "head_dim") == values["qk_rope_head_dim"]:
            # the rotary part's size, which multi-head latent attention's config names head_dim
            # (DeepSeek-V3: head_dim = qk_rope_head_dim, the rotary embedding built for it)
            out["head_dim"] = out.get("qk_rope_head_dim", values["qk_rope_head_dim"])
    for key, value in values.items():
        if key.endswith("groups") and isinstance(value, int) and value > 1 and value == values.get(
                "hidden_size") and isinstance(width, int):
            out[key] = width  # a depthwise convolution's groups, one per channel (Mimi's upsample)
    expand = values.get("mamba_expand", values.get("expand"))
    if isinstance(values.get("mamba_n_heads"), int) and isinstance(width, int) and isinstance(
            expand, int):
        # a state-space mixer's heads: n_heads * d_head = expand * hidden (Bamba's validation),
        # its groups dividing the heads
        out["mamba_n_heads"] = min(values["mamba_n_heads"], HEADS_N)
        if isinstance(values.get("mamba_d_head"), int):
            out["mamba_d_head"] = expand * width // out["mamba_n_heads"]
        if isinstance(values.get("mamba_n_groups"), int) and values["mamba_n_groups"] > 1:
            out["mamba_n_groups"] = 1
    elif isinstance(values.get("n_groups"), int) and isinstance(expand, int) and isinstance(
            values.get("head_dim"), int) and isinstance(width, int) and isinstance(
            out.get("num_heads"), int):
        # Mamba-2's mixer: num_heads * head_dim = expand * hidden, its groups dividing the heads
        out["head_dim"] = expand * width // out["num_heads"]
        out["n_groups"] = 1
    if isinstance(values.get("num_kv_shared_layers"), int) and layers and layers > LAYERS:
        # layers that reuse an earlier layer's keys and values (Gemma 3n): none among the
        # few layers left, each of which then produces its own cache
        out["num_kv_shared_layers"] = 0
    positions = out.get("max_position_embeddings")
    for key in ("context_size",):
        if isinstance(positions, int) and isinstance(values.get(key), int) and values[key] > positions:
            out[key] = positions  # an attention context within the positions (Granite Speech 5)
    if fill and isinstance(heads, int) and not any(k in values for k in KV_HEADS):
        # key-value heads the config lacks although its modeling file reads them (Moonshine
        # Streaming's decoder reads config.num_key_value_heads): one per head
        out.update({k: heads for k in KV_HEADS if re.search(rf"\bconfig\.{k}\b", _source(config))})
    if isinstance(values.get("sliding_window"), int) and values["sliding_window"] > 4:
        out["sliding_window"] = 4
    if "mrope_section" in getattr(config, "ignore_keys_at_rope_validation", ()) and heads and (
            isinstance(width, int)):
        # multimodal RoPE (Qwen2-VL's text model): sections of the rotary frequencies for time,
        # height and width, which the modeling file defaults to the full-size [16, 24, 24]
        # when the config has none; they must sum to half the tiny head dimension's rotary part
        # (GLM-4V: partial_rotary_factor 0.5)
        half = out.get("head_dim", values.get("head_dim")) or width // heads
        rope = dict(values.get("rope_parameters") or {})
        factor = rope.get("partial_rotary_factor", values.get("partial_rotary_factor")) or 1
        half = int(half * factor) // 2
        rope["mrope_section"] = [half - 2 * (half // 4), half // 4, half // 4]
        default = rope.get("mrope_section") if "mrope_section" in (
            values.get("rope_parameters") or {}) else re.findall(
            r"[\"']mrope_section[\"'],\s*\[(\d+),\s*(\d+),\s*(\d+)\]", _source(config))
        default = [int(v) for v in (default[0] if default and isinstance(default[0], tuple)
                                    else default or ())]
        if len(default) == 3 and default[0] == default[1] != default[2]:
            # the height and width sections first, of one size (ERNIE 4.5-VL interleaves them)
            rope["mrope_section"] = [half // 4, half // 4, half - 2 * (half // 4)]
        out["rope_parameters"] = rope
    _rope_per_kind(config, values, out)
    _widths_followed(values, out)
    # a pattern of layer kinds repeated over the layers (RecurrentGemma's block_types,
    # ["recurrent", "recurrent", "attention"]): as many layers as the pattern has, so that
    # each kind is built (two layers would have no attention layer, which torch refuses)
    pattern = max((len(v) for k, v in values.items() if isinstance(v, list) and layers
                   and LAYERS < len(v) <= 4 and len(v) < layers and k not in STAGES
                   and all(isinstance(x, str) for x in v) and len(set(v)) > 1), default=0)
    if pattern:
        key = next(k for k in LAYER_COUNTS if isinstance(values.get(k), int))
        out[key] = pattern
    return out


def _annotation(config, key: str):
    """The type a config class's field is annotated with (its dataclass field), None where
    it has none."""
    for klass in type(config).__mro__:
        if key in getattr(klass, "__annotations__", {}):
            return klass.__annotations__[key]
    return None


def _rope_per_kind(config, values: dict, out: dict) -> None:
    """RoPE parameters keyed by layer kind where the modeling file reads them so
    (``rope_parameters[layer_type]``: Cohere Compass's default config gives them flat, its
    checkpoints per kind): one entry per kind of the tiny config's ``layer_types``, each the
    flat parameters (and the multimodal sections made to fit, ``shrink``)."""
    kinds = out.get("layer_types", values.get("layer_types"))
    rope = out.get("rope_parameters", values.get("rope_parameters"))
    if not (isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds)):
        return
    if isinstance(rope, dict) and not set(rope).isdisjoint(kinds):
        return
    if not re.search(r"rope_parameters\[\s*(?:self\.)?layer_type\s*\]", _source(config)):
        return
    flat = {k: v for k, v in (rope or {}).items() if not isinstance(v, dict)}
    flat.setdefault("rope_type", "default")
    flat.setdefault("rope_theta", values.get("rope_theta") or 10000.0)
    out["rope_parameters"] = {kind: dict(flat) for kind in dict.fromkeys(kinds)}


# the lists of a config that name a width of the stages (a backbone's channels, a neck's
# input channels): where the stage widths are made small, the entries equal to a default
# width follow it (``_widths_followed``)
CHANNEL_LISTS = re.compile(r"channels|hidden_sizes|in_dims|out_dims")


def _widths_followed(values: dict, out: dict) -> None:
    """Widths tied by equality kept tied: where ``hidden_sizes`` (a hierarchical model's stage
    widths) is made small, every list of channels in the config, and in its parent for a
    backbone's (D-FINE's ``encoder_in_channels``), has its entries that equal a default stage
    width replaced by that stage's new width (HGNet-V2's ``stage_out_channels``, which its
    stages build from, and ``stage_in_channels``, each the previous stage's out), the other
    entries (a stem's channels) kept."""
    pairs = []
    for key in ("hidden_sizes",):
        if isinstance(out.get(key), list) and isinstance(values.get(key), list):
            pairs.append((values[key], out[key]))
    backbone = out.get("backbone_config")
    if isinstance(backbone, dict) and isinstance(backbone.get("_hidden_sizes"), list):
        pairs.append((backbone.pop("_hidden_sizes"), backbone["hidden_sizes"]))
    for old, new in pairs:
        if len(old) != len(new):
            continue
        mapping = {o: n for o, n in zip(old, new) if isinstance(o, int) and o != n
                   and not isinstance(o, bool)}
        if len(set(mapping.values())) != len(mapping):
            continue
        for key, value in values.items():
            if key in out or not CHANNEL_LISTS.search(key) or not isinstance(value, list):
                continue
            if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) and any(
                    v in mapping for v in value):
                out[key] = [mapping.get(v, v) for v in value]


# the kind a layer has where a modeling file names only the other (``layer_types[i] != "conv"``)
OTHER_KIND = {"layer_types": "full_attention", "mlp_layer_types": "dense"}
# the indices of a hybrid's attention layers (the others state-space layers)
HYBRID_INDICES = ("attn_layer_indices", "attention_layer_indices")


def _source(config) -> str:
    """The source of ``config``'s modeling file, where it is imported ('' where not)."""
    module = sys.modules.get(type(config).__module__.replace(".configuration_", ".modeling_"))
    try:
        return inspect.getsource(module) if module else ""
    except (OSError, TypeError):
        return ""


def _layer_kinds(config, key: str) -> list[str]:
    """One layer of each kind for a per-layer list of kinds that the default config leaves
    None although its modeling file indexes it (LFM2-MoE's ``layer_types``, DeepSeek-OCR 2's
    ``mlp_layer_types``: the checkpoints' configs give them): the kinds the modeling file
    compares its entries with, and ``OTHER_KIND``'s where it names one kind only."""
    source = _source(config)
    kinds = list(dict.fromkeys(re.findall(
        rf"\b{key}\[[^\]]+\]\s*[!=]=\s*[\"'](\w+)[\"']", source)))
    if len(kinds) == 1 and key in OTHER_KIND and kinds[0] != OTHER_KIND[key]:
        kinds.insert(0, OTHER_KIND[key])
    return kinds


def _stage_list(key: str, values: list[int]) -> list[int]:
    """A per-stage list of ``STAGES`` made small, its length kept: one block per stage,
    widths 8, 16, 32, ... (doubling as torch's defaults do), at most two heads a stage (one
    where the default has one, so that the widths stay divisible)."""
    kind = STAGES[key]
    if kind == "depth":
        return [1] * len(values)
    if kind == "heads":
        return [min(v, 2) for v in values]
    return [min(v, 8 * 2 ** i) for i, v in enumerate(values)]


def _per_layer(values: list) -> list:
    """A per-layer list cut to LAYERS entries, keeping one layer of each kind where the
    entries are names (a hybrid's ["mamba", "mamba", ..., "attention"]: a cut to its first
    entries would leave no attention layer, which the torch model refuses)."""
    if not all(isinstance(v, str) for v in values):
        return values[:LAYERS]
    firsts = [values.index(kind) for kind in dict.fromkeys(values)][:LAYERS]
    rest = [i for i in range(len(values)) if i not in firsts][:LAYERS - len(firsts)]
    return [values[i] for i in sorted(firsts + rest)]


# the shrinks tried in turn, each leaving more of the default sizes as they are, where torch
# refuses to build or run the tinier one (a size tied to another that the shrinking cannot
# know: a GroupNorm's groups and the widths, a convolution's strides and the image, a
# projection read from a width the file hard-codes): the expert counts (their grouping and
# top-k); then the widths, image and audio sizes and positions (layers, stages, vocabulary and
# experts still small); then the experts too
WIDTH_KEYS = frozenset(k for k, v in SIZES.items() if k not in (
    "vocab_size", "n_vocab", "num_labels", "type_vocab_size", "num_experts",
    "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_total",
    "num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts", "n_group",
    "topk_group", "top_k_experts", "num_hidden_layers", "num_layers", "n_layer", "encoder_layers",
    "decoder_layers", "num_decoder_layers", "n_layers", "num_encoder_layers",
    "decoder_num_layers", "encoder_num_layers")) | {
    "hidden_sizes", "embed_dims", "dims", "num_heads", "num_attention_heads", "head_dim",
    "sliding_window", "rope_parameters", *KV_HEADS}
EXPERT_KEYS = frozenset(("num_experts", "num_local_experts", "n_routed_experts",
                         "moe_num_experts", "num_experts_total", "num_experts_per_tok", "top_k",
                         "moe_topk", "num_selected_experts", "n_group", "topk_group",
                         "top_k_experts"))
LADDER = ((), (EXPERT_KEYS,), (WIDTH_KEYS,), (WIDTH_KEYS, EXPERT_KEYS))
MAX_PARAMETERS = 130_000_000  # a rung whose model is larger is not tried


def _without(kwargs: dict, keep: tuple[frozenset, ...]) -> dict:
    """``kwargs`` less the keys of ``keep`` (left at their defaults), in sub-configs too."""
    drop = frozenset().union(*keep) if keep else frozenset()
    out = {}
    for key, value in kwargs.items():
        if key in drop:
            continue
        if isinstance(value, dict) and key.endswith("_config"):
            value = _without(value, keep)
            if set(value) <= {"model_type"} and key != "backbone_config":
                continue
        out[key] = value
    return out


def tiny_configs(config_class, fill: bool = False):
    """The candidate tiny configs of ``config_class``, tiniest first (``LADDER``): each
    ``(config, keywords)``; a rung whose keywords equal an earlier one's is skipped."""
    full = shrink(config_class(), fill)
    seen: list[dict] = []
    for keep in LADDER:
        kwargs = _without(full, keep)
        if kwargs in seen:
            continue
        seen.append(kwargs)
        try:
            yield _built(config_class, kwargs)
        except Exception:
            if not keep:
                raise


def _probe(cls, config, specs: list[str], masked: bool) -> str:
    """Why torch refuses ``cls(config)`` on the sweep's inputs ('' when it builds and runs):
    its size counted on the meta device first, so that a large rung is not built."""
    import numpy as np
    import torch

    from torch2jax.verify.spec import parse_specs

    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(config).parameters())
        if size > MAX_PARAMETERS:
            return f"{size} parameters"
        torch.manual_seed(0)
        model = cls(config).eval()
        args, kwargs = [], {}
        rng = np.random.default_rng(0)
        plain, exprs = _split(specs)
        for spec in parse_specs(plain + (
                [f"attention_mask=int64[{BATCH},{SEQ}]:2"] if masked else []), exprs):
            value = (eval(spec.expr, {"torch": torch}) if spec.expr is not None  # (ours)
                     else torch.from_numpy(spec.sample(rng)))
            (kwargs.__setitem__(spec.name, value) if spec.name else args.append(value))
        with torch.no_grad():
            model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return ""


def fitting_config(cls, config_class):
    """The tiniest candidate config (``tiny_configs``) that torch builds and runs, with its
    keywords and the sweep's inputs for it; the tiniest one where torch refuses them all (the
    row then says why). Where torch refuses every rung, the rungs again with the sizes the
    default config leaves None filled in (``shrink``'s ``fill``)."""
    return _fitting(cls, config_class)[0]


def _fitting(cls, config_class):
    """``fitting_config``'s answer, and whether torch runs it."""
    first = None
    rungs = list(tiny_configs(config_class))
    if shrink(config_class(), True) != shrink(config_class()):
        rungs.append(None)  # the filled rungs, tried only where the others fail
    patched, cached = 0, []
    while rungs:
        rung = rungs.pop(0)
        if rung is None:
            try:
                rungs = list(tiny_configs(config_class, True))
            except Exception:  # noqa: BLE001 (a filled config its validation refuses)
                break
            continue
        config, kwargs = rung
        tried: list = []
        for variant in VARIANTS:
            specs, masked = _inputs(cls, config, variant)
            if (specs, masked) in tried:
                continue
            tried.append((specs, masked))
            first = first or (config, kwargs, specs, masked)
            why = _probe(cls, config, specs, masked)
            if why and _cache_on(config) and not why.endswith(" parameters"):
                cached.append((config, kwargs, specs, masked))
            if not why:
                return (config, kwargs, specs, masked), True
            if why.endswith(" parameters"):
                break  # too large for any inputs
            given = _attribute_given(config, kwargs, why)
            if given is not None and patched < 3:
                patched += 1
                try:
                    rungs.insert(0, _built(config_class, given))
                except Exception:  # noqa: BLE001, S110 (its validation refuses it)
                    pass
                break
    for config, kwargs, specs, masked in cached[:2]:
        # where torch refuses every rung: a forward whose cache torch cannot build for the
        # default config (BLT's DynamicCache reads a layer count its composite config lacks)
        # with the cache off, as a model whose cache the converter does not translate is swept
        # (``CACHE_OFF``); one pass from no cache computes the same logits either way
        off = _cache_off(copy.deepcopy(config))
        if not _probe(cls, off, specs, masked):
            return (off, kwargs, specs, masked), True
    return first, False


# torch's message where a module reads an attribute its config lacks
MISSING = re.compile(r"AttributeError: '(\w+)' object has no attribute '(\w+)'")


def _attribute_given(config, kwargs: dict, why: str) -> dict | None:
    """``kwargs`` with an attribute that the modeling file reads from a (sub-)config lacking
    it given there, where another config of the tree has it: a checkpoint's config.json
    carries such a key, which the config then keeps (DBRX's attention reads
    ``attn_config.rope_theta``, which its config class moved to the model's
    ``rope_parameters``); None where none has it or it is given already."""
    match = MISSING.search(why)
    if not match:
        return None
    owner, name = match.groups()
    found, path = _find_value(config, name), _config_path(config, owner)
    if found is None or path is None:
        return None
    fixed = copy.deepcopy(kwargs)
    node = fixed
    for part in path:
        node = node.setdefault(part, {})
    if name in node:
        return None
    node[name] = found
    return fixed


def _find_value(config, name: str, depth: int = 0):
    """The value of ``name`` in ``config``, its ``rope_parameters`` or its sub-configs."""
    from transformers import PretrainedConfig

    if name in vars(config) and getattr(config, name) is not None:
        return getattr(config, name)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get(name) is not None:
        return rope[name]
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig) and depth < 3:
            found = _find_value(value, name, depth + 1)
            if found is not None:
                return found
    return None


def _config_path(config, class_name: str) -> list[str] | None:
    """The keys from ``config`` to its sub-config of class ``class_name`` ([] for itself)."""
    from transformers import PretrainedConfig

    if type(config).__name__ == class_name:
        return []
    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig) and key.endswith("_config"):
            path = _config_path(value, class_name)
            if path is not None:
                return [key, *path]
    return None


def fitting_entry(module, cls, others: int = 3):
    """``cls`` and its ``fitting_config``; where torch refuses ``cls`` on every rung (a head
    that takes no token ids, SeamlessM4T's text-to-units model, which the head order picks
    first), the first of up to ``others`` other classes of the file that torch builds and runs
    (``_entries``' order), with its; ``cls``'s where none does (the row then says why)."""
    fit, runs = _fitting(cls, cls.config_class)
    if runs:
        return cls, fit
    for other in _entries(module, cls)[:others]:
        try:
            found, runs = _fitting(other, other.config_class)
        except Exception:  # noqa: BLE001, S112 (its config refused: the next)
            continue
        if runs:
            return other, found
    return cls, fit


def _entries(module, chosen) -> list[type]:
    """The other classes of ``module`` the sweep could verify in ``chosen``'s stead: its own
    PreTrainedModel subclasses whose forward's first input it builds, heads first (in
    ``HEADS``' order, then others with "For" in the name), then bases, shortest names first."""
    from transformers import PreTrainedModel

    own = [c for c in vars(module).values() if isinstance(c, type) and c is not chosen
           and c.__module__ == module.__name__ and issubclass(c, PreTrainedModel)
           and "PreTrainedModel" not in c.__name__ and not inspect.isabstract(c)
           and isinstance(getattr(c, "config_class", None), type)
           and _first_input(c) in BUILT_FIRST]

    def order(c):
        rank = next((i for i, suffix in enumerate(HEADS) if c.__name__.endswith(suffix)),
                    len(HEADS) if "For" in c.__name__ else len(HEADS) + 1)
        return rank, len(c.__name__)

    return sorted(own, key=order)


def _cache_on(config) -> bool:
    try:
        return bool(getattr(config, "use_cache", False) or getattr(
            config.get_text_config(decoder=True), "use_cache", False))
    except Exception:  # noqa: BLE001 (a config without a text config)
        return False


def _cache_off(config):
    """``config`` with its cache off, as ``CACHE_OFF`` turns it off, and marked so that the
    sweep's build does so too (``run_one``)."""
    config.use_cache = False
    try:
        config.get_text_config(decoder=True).use_cache = False
    except Exception:  # noqa: BLE001, S110 (a config without a text config)
        pass
    config.sweep_cache_off = True
    return config


def tiny_config(config_class):
    """``config_class`` built from its shrunk defaults, and the keywords that build it."""
    return _built(config_class, shrink(config_class()))


def _built(config_class, kwargs: dict):
    """``config_class(**kwargs)``; where a config's validation refuses the whole set (a size
    tied to another), the keywords it refuses are left at their defaults, one at a time."""
    kwargs = _as_validated(config_class, kwargs)
    tries = [kwargs] + [{k: v for k, v in kwargs.items() if k != key} for key in kwargs]
    errors: list[Exception] = []
    for attempt in tries:
        try:
            return config_class(**attempt), attempt
        except Exception as exc:  # noqa: BLE001 (a validator's refusal)
            errors.append(exc)
    raise errors[0]


# a config validator's message that names the size one field must have ("`adaptor_config.
# intermediate_size` (64) must equal `text_config.hidden_size // 4` (8)")
# (the names in backticks or not: "vision_config.out_hidden_size (1024) must equal
# text_config.hidden_size (32)", Granite-Docling's)
TIED_SIZE = re.compile(r"`?([\w.]+)`?\s*\((\d+)\)\s*must (?:equal|be equal to|match)\b[^()]*\((\d+)\)")
# and "`vision_config.video_temporal_patch_size` (None) and `video_temporal_patch_size` (2)
# must be equal" (NemotronH-Omni's: a sub-config's size the shrunk keywords leave None)
TIED_PAIR = re.compile(r"`([\w.]+)`\s*\(([^()]*)\)\s*and\s*`[\w.]+`\s*\((\d+)\)\s*must be equal")


def _as_validated(config_class, kwargs: dict, tries: int = 4) -> dict:
    """``kwargs`` with the sizes that ``config_class``'s validators tie to others set as they
    say (Fun-ASR-Nano's adaptor width, a quarter of the text model's): a size the shrinking
    made small whose tie it cannot know. ``kwargs`` as they are where the message names none."""
    for _ in range(tries):
        try:
            config_class(**kwargs)
            return kwargs
        except Exception as exc:  # noqa: BLE001 (a validator's refusal)
            match = next((m for pattern in (TIED_SIZE, TIED_PAIR) for text in (
                str(exc), str(exc.__cause__ or "")) if (m := pattern.search(text))), None)
        if not match:
            return kwargs
        *path, last = match.group(1).split(".")
        fixed = dict(kwargs)
        node = fixed
        for part in path:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        if node.get(last) == int(match.group(3)):
            return kwargs
        node[last] = int(match.group(3))
        kwargs = fixed
    return kwargs


def _literal(value) -> str:
    if isinstance(value, dict):
        return "dict(" + ", ".join(f"{k}={_literal(v)}" for k, v in value.items()) + ")"
    return repr(value)


def discover(models: Path) -> list[Path]:
    return sorted(p for p in models.glob("*/modeling_*.py")
                  if not p.stem.startswith(("modeling_tf_", "modeling_flax_")))


def family_of(path: Path) -> str:
    name = path.stem.removeprefix("modeling_")
    return name if name == path.parent.name else f"{path.parent.name}/{name}"


def entry_classes(module) -> tuple[type | None, type | None]:
    """(base, head) of a modeling module: its own PreTrainedModel subclasses."""
    from transformers import PreTrainedModel

    own = [c for c in vars(module).values() if isinstance(c, type)
           and c.__module__ == module.__name__ and issubclass(c, PreTrainedModel)
           and "PreTrainedModel" not in c.__name__ and not inspect.isabstract(c)]
    bases = sorted((c for c in own if c.__name__.endswith("Model") and "For" not in c.__name__
                    and not c.__name__.endswith("LMHeadModel")), key=lambda c: len(c.__name__))
    head = next((c for suffix in HEADS for c in own if c.__name__.endswith(suffix)), None)
    if not bases:  # a backbone (VitPoseBackbone) or a model named otherwise
        bases = sorted(own, key=lambda c: len(c.__name__))
    base = bases[0] if bases else None
    chosen = head or base
    if chosen is not None and _first_input(chosen) not in BUILT_FIRST:
        # a forward whose first input the sweep does not build (a session object, a neck's
        # hidden states, a decoder's vision features): another class of the file whose forward
        # takes one it builds, a head first (PP-OCRv5's detector, SLANeXt's table recognizer)
        other = next((c for c in sorted(own, key=lambda c: ("For" not in c.__name__,
                                                            len(c.__name__)))
                      if _first_input(c) in BUILT_FIRST), None)
        if other is not None:
            return base, other
    return base, head


# the first inputs of a forward that ``_inputs`` builds from the config alone
BUILT_FIRST = ("input_ids", "input_ids_or_embeds", "pixel_values", "pixel_values_videos",
               "input_features", "input_values", "past_values")


def _first_input(cls) -> str:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return ""
    return next((n for n in params if n != "self"), "")


# the ways of reading the forward's inputs the sweep tries in turn, where torch refuses the
# plain one: the images passed where the forward takes them optionally (ViLT's masked LM needs
# them); a video's frames (TimeSformer, X-CLIP: [batch, frames, channels, height, width]); one
# row of tokens per codebook (MusicGen's decoder: [batch * codebooks, length]); audio features
# time-major (Parakeet's encoder: [batch, frames, mel bins]); a waveform with a channel axis
# (Mimi, EnCodec's kind: [batch, channels, samples]); a waveform ten times longer, for a
# feature encoder whose strides the config does not name (Moonshine's); the optional inputs
# that a forward checks for None where their names say what they are (``_extras``); a video's
# frames with those (InstructBLIP-Video: its frames and its language model's tokens)
VARIANTS = ("", "pixels", "video", "codebooks", "frames", "channels", "long", "extras",
            "video extras")


def _inputs(cls, config, variant: str = "") -> tuple[list[str], bool]:
    """The verify input specs of ``cls``'s forward (and whether it takes a padding mask)."""
    params = inspect.signature(cls.forward).parameters
    first = next((n for n in params if n != "self"), "")
    vocab = getattr(config, "vocab_size", None) or getattr(
        getattr(config, "text_config", None), "vocab_size", None) or VOCAB
    rows = BATCH * (getattr(config, "num_codebooks", 1) if variant == "codebooks" else 1)
    tokens = f"int64[{rows},{SEQ}]:{min(vocab, VOCAB)}"
    vision = getattr(config, "vision_config", None) or config
    size = getattr(vision, "image_size", 32)
    # an image size given as (height, width) (MGP-STR's text lines, [32, 128])
    height, width = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
    frames = (f"{getattr(vision, 'num_frames', None) or getattr(config, 'num_frames', 2)},"
              if variant.startswith("video") else "")
    pixels = f"float32[{BATCH},{frames}{getattr(vision, 'num_channels', 3)},{height},{width}]"
    specs: list[str] = []
    if first in ("input_ids", "input_ids_or_embeds"):
        specs.append(tokens)
        # a text and a vision tower compared (CLIP's kind) need both; a model that splices
        # image features into the text at image tokens runs on text alone
        token = any(hasattr(config, k) for k in ("image_token_id", "image_token_index"))
        if "pixel_values" in params and (params["pixel_values"].default is inspect._empty or (
                hasattr(config, "vision_config") and not token) or variant in ("pixels", "video")):
            specs.append(f"pixel_values={pixels}")
    elif first == "pixel_values":
        specs.append(pixels)
        if "input_ids" in params and params["input_ids"].default is inspect._empty:
            specs.append(f"input_ids={tokens}")  # BLIP-2's captioner: images, then the text
    elif first == "pixel_values_videos":
        # a video model's frames (V-JEPA 2, VidEoMT): [batch, frames, channels, height, width]
        count = (getattr(vision, "num_frames", None) or getattr(vision, "frames_per_clip", None)
                 or 2)
        size = getattr(vision, "crop_size", None) or size
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(vision, "num_channels", None) or getattr(vision, "in_chans", 3)
        specs.append(f"float32[{BATCH},{count},{channels},{size},{size}]")
    elif first == "input_features":
        # the mel bins, or the features per frame of Speech2Text's convolutions
        # (Wav2Vec2-BERT's stacked features: the width its feature projection reads)
        mel = getattr(config, "feature_projection_input_dim", None) or getattr(
            config, "num_mel_bins", None) or getattr(config, "input_feat_per_channel", None) or 8
        frames = 2 * getattr(config, "max_source_positions", 16)
        specs.append(f"float32[{BATCH},{frames},{mel}]" if variant == "frames" else
                     f"float32[{BATCH},{mel},{frames}]")
    elif first == "input_values" and variant == "frames" and isinstance(
            getattr(config, "num_mel_bins", None), int):
        # a spectrogram read as [batch, frames, mel bins] (the Audio Spectrogram Transformer's
        # input_values): the frames the config names
        frames = getattr(config, "max_length", None) or 2 * getattr(
            config, "max_source_positions", 16)
        specs.append(f"float32[{BATCH},{frames},{config.num_mel_bins}]")
    elif first == "input_values":
        samples = _samples(config) * (10 if variant == "long" else 1)
        specs.append(f"float32[{BATCH},{getattr(config, 'audio_channels', 1)},{samples}]"
                     if variant == "channels" else f"float32[{BATCH},{samples}]")
    elif first == "past_values":
        specs += _series(config, params)
    elif first in ("inputs", "input") and "input_ids" in params:
        # Perceiver's heads: ``inputs`` is what the model's preprocessor reads, and a text
        # head also takes the token ids by their own name (its preprocessor embeds them)
        specs.append(f"input_ids={tokens}")
    elif first == "hidden_states" and getattr(config, "backbone_config", None) is not None:
        specs.append(pixels)  # a detector's hidden_states, handed to its vision backbone
    else:
        raise ValueError(f"the forward's first input {first!r} is not one the sweep builds")
    for name, param in params.items():
        # the other inputs the forward requires, where their name says what they are: a second
        # tower's tokens (InstructBLIP's Q-Former), a prompt image and its mask (SegGPT)
        if param.default is not inspect._empty or name == first or param.kind in (
                param.VAR_KEYWORD, param.VAR_POSITIONAL) or any(
                x.startswith(f"{name}=") for x in specs):
            continue
        if name.endswith("input_ids"):
            specs.append(f"{name}={tokens}")
        elif name.endswith(("pixel_values", "_masks")) and first == "pixel_values":
            specs.append(f"{name}={pixels}")
        else:
            specs += _required(config, name, first, specs, height, width)
    if variant.endswith("extras"):
        specs += _extras(config, params, first, tokens, specs)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        specs.append(f"decoder_input_ids=int64[{BATCH},{DECODER_SEQ}]:{min(vocab, VOCAB)}")
    masked = "attention_mask" in params and first in ("input_ids", "input_ids_or_embeds")
    return specs, masked


def _required(config, name: str, first: str, specs: list[str], height: int,
              width: int) -> list[str]:
    """A required input of the forward that its name and the config say how to build (''
    where they do not): ``<x>_attention_mask`` of the tokens ``<x>_input_ids`` (OmDet-Turbo's
    classes and tasks; a random padding mask, as the sweep's own); ``<x>_padding`` of a time
    series (TimesFM's ``past_values_padding``: which steps are padding, at random); ``freq``,
    one of ``config.freq_size`` frequencies per row; ``bool_masked_pos``, which patches a
    masked image model hides (one per patch of the image, or of each frame's tubelet: VideoMAE,
    SegGPT), every other one, so that each row hides as many (a pre-training loss gathers them
    into one tensor)."""
    shapes = {x.partition("=")[0]: x.partition("=")[2] or x for x in specs}
    stem = name.removesuffix("attention_mask") + "input_ids"
    if name.endswith("attention_mask") and stem in shapes:
        return [f"{name}={shapes[stem].split(']')[0].replace('float32', 'int64')}]:2"]
    if name.endswith("_padding") and first == "past_values":
        return [f"{name}={specs[0].split(']')[0].replace('float32', 'int64')}]:2"]
    if name == "freq" and isinstance(getattr(config, "freq_size", None), int):
        return [f"{name}=int64[{BATCH},1]:{config.freq_size}"]
    vision = getattr(config, "vision_config", None) or config
    patch = getattr(vision, "patch_size", None)
    if name == "bool_masked_pos" and isinstance(patch, int):
        count = (height // patch) * (width // patch)
        tubelet = getattr(vision, "tubelet_size", None)
        if isinstance(tubelet, int) and isinstance(getattr(vision, "num_frames", None), int):
            count *= vision.num_frames // tubelet
        return [f"{name}={MASKED_POS.format(count=count, batch=BATCH)}"]
    return []


# every other patch hidden, each row alike: an input that is an expression (``verify
# --input-expr``: the torch side evaluates it, the JAX side gets its value), not a random array
MASKED_POS = "torch.arange({count}).repeat({batch}, 1) % 2 == 1"


def _split(specs) -> tuple[list[str], list[str]]:
    """The random-array specs of ``specs`` and its expressions (``MASKED_POS``)."""
    exprs = [x for x in specs if "(" in x]
    return [x for x in specs if x not in exprs], exprs


def _extras(config, params, first: str, tokens: str, specs: list[str]) -> list[str]:
    """The optional inputs a forward refuses to run without (it checks them for None: BROS's
    boxes, LXMERT's visual features, X-MOD's language ids, SAM 3's text prompt), where their
    name and the config say what they are: the token ids of a model whose first input is
    another; ``bbox`` (a box per token, its four corners' coordinates); ``lang_ids`` (one
    language of ``config.languages`` per row); ``<x>_feats`` / ``<x>_pos`` of
    ``config.<x>_feat_dim`` / ``<x>_pos_dim`` features (a feature vector per region)."""
    out = []
    for name, param in params.items():
        if param.default is not None or name == first or any(
                x.startswith(f"{name}=") for x in specs):
            continue
        dim = getattr(config, f"{name.removesuffix('s')}_dim", None) or getattr(
            config, f"{name}_dim", None)
        if name == "input_ids":
            out.append(f"{name}={tokens}")
        elif name == "bbox":
            out.append(f"{name}=float32[{BATCH},{SEQ},4]")
        elif name == "lang_ids" and getattr(config, "languages", None):
            out.append(f"{name}=int64[{BATCH}]:{len(config.languages)}")
        elif name.endswith(("_feats", "_pos")) and isinstance(dim, int):
            out.append(f"{name}=float32[{BATCH},{SEQ},{dim}]")
    return out


def _samples(config, frames: int = 8) -> int:
    """A waveform's length: 400 samples, or as many as the config's convolutional feature
    encoder (``conv_kernel``, ``conv_stride``: wav2vec 2.0's kind) needs to hand on ``frames``
    frames, times SEW's ``squeeze_factor`` (its pooling after the encoder)."""
    kernels, strides = getattr(config, "conv_kernel", None), getattr(config, "conv_stride", None)
    if not (isinstance(kernels, (list, tuple)) and isinstance(strides, (list, tuple))
            and len(kernels) == len(strides) and all(isinstance(v, int) for v in
                                                      (*kernels, *strides))):
        return 400
    length = frames * (getattr(config, "squeeze_factor", None) or 1)
    for kernel, stride in zip(reversed(kernels), reversed(strides), strict=True):
        length = (length - 1) * stride + kernel  # the input a convolution needs for ``length``
    return max(length, 400)


def _series(config, params) -> list[str]:
    """A time-series model's inputs (PatchTST, TimesFM, Autoformer): the past values over the
    context the config names (and the lags it looks back, Autoformer's and Informer's), one
    column per input channel where the model takes several, and where the forward requires
    them, the time features of those steps and which values were observed (at random)."""
    length = getattr(config, "context_length", None) or 32
    lags = getattr(config, "lags_sequence", None)
    length += max(lags) if lags else 0
    channels = getattr(config, "input_size", 1) if lags else getattr(
        config, "num_input_channels", None)
    shape = f"{BATCH},{length}" + (f",{channels}" if channels and (channels > 1 or not lags)
                                   else "")
    specs = [f"float32[{shape}]"]
    required = [n for n, p in params.items() if p.default is inspect._empty]
    if "past_time_features" in required:
        specs.append(f"past_time_features=float32[{BATCH},{length},"
                     f"{getattr(config, 'num_time_features', 0)}]")
    if "past_observed_mask" in required:
        specs.append(f"past_observed_mask=bool[{shape}]")
    return specs


def _model_types(config, depth: int = 0) -> set[str]:
    """The model types of the tiny config's sub-configs (a backbone the sweep chose, not the
    default config's): ``AutoModel`` / ``AutoBackbone.from_config`` build those, so their
    modeling files are converted with the file (as verify does from the torch model)."""
    from transformers import PretrainedConfig

    found: set[str] = set()
    for value in vars(config).values():
        if isinstance(value, PretrainedConfig) and depth < 4:
            found |= {value.model_type, type(value).model_type} | _model_types(value, depth + 1)
    return {t for t in found if t}


# the setup of a model swept with the cache off (``_cache_translated``): use_cache=False on the
# config and on its text (decoder) config, which the decoder's forward reads
CACHE_OFF = """
def _sweep_cache_off(config):
    config.use_cache = False
    config.get_text_config(decoder=True).use_cache = False
    return config
"""


def _cache_translated(config) -> bool:
    """Whether the converted forward's ``DynamicCache(config=...)`` is translated for
    ``config``'s layers (torch2jax.transformers_runtime: attention, full or sliding). A model
    with other layers (linear attention, recurrent or convolution states, an indexer) is swept
    with ``use_cache=False`` on both sides (``CACHE_OFF``): one forward pass from no cache
    computes the same logits and gradients either way, and the cache it would return is not
    what the sweep compares."""
    from torch2jax.transformers_runtime import _layer_windows

    try:
        _layer_windows(config)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 (a config the runtime reads otherwise: the forward says)
        return True
    return True


def run_one(path: Path) -> list[dict]:
    """One modeling file: find, shrink, convert once, verify (without and with a mask)."""
    import importlib

    import transformers

    from torch2jax.verify import common
    from torch2jax.verify.common import VerifyRequest
    from torch2jax.verify.package import convert_package_file
    from torch2jax.verify.run import _convert_file, run_request

    start = time.perf_counter()
    family = family_of(path)
    result = Result(family=family, entry="", target="nnx")
    phases = _Phases()
    common.phase_hook = phases.hook

    def done(reason: str = "") -> list[dict]:
        common.phase_hook = None  # (run_one in a test's process: the phases of this row only)
        result.reason = reason
        result.seconds = round(time.perf_counter() - start, 1)
        return [{**dataclasses.asdict(result), "phases": phases.seconds, "cpu": phases.cpu}]

    name = f"transformers.models.{path.parent.name}.{path.stem}"
    try:
        with common.timed("importing the modeling file"):
            module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 (a file that needs a missing package)
        return done(f"import: {type(exc).__name__}: {exc}")
    base, head = entry_classes(module)
    cls = head or base
    if cls is None:
        return done("no PreTrainedModel class with a head or a base in the file")
    result.entry = cls.__name__ if base is None or cls is base else f"{cls.__name__}"
    config_class = getattr(cls, "config_class", None)
    if config_class is None or not isinstance(config_class, type):
        return done("the class names no config_class")
    try:
        with common.timed("fitting the tiny config (torch builds and runs each rung)"):
            cls, (config, kwargs, specs, masked) = fitting_entry(module, cls)
    except Exception as exc:  # noqa: BLE001
        return done(f"config: {type(exc).__name__}: {exc}")
    result.entry, config_class = cls.__name__, cls.config_class
    expression = f"_SweepConfig({', '.join(f'{k}={_literal(v)}' for k, v in kwargs.items())})"
    setup = f"from {config_class.__module__} import {config_class.__name__} as _SweepConfig"
    if getattr(config, "sweep_cache_off", False) or not _cache_translated(config):
        expression, setup = f"_sweep_cache_off({expression})", setup + CACHE_OFF
    expression = f"{cls.__name__}({expression})"
    with tempfile.TemporaryDirectory(prefix="t2j-sweep-") as tmp:
        try:
            with common.timed("converting the file (and its local imports)"):
                converted, todos = convert_package_file(
                path, Path(tmp), lambda f, known: _convert_file(f, "nnx", None, known),
                    {cls.__name__}, model_types=_model_types(config))
        except Exception as exc:  # noqa: BLE001
            return done(f"convert: {type(exc).__name__}: {exc}")
        result.converted, result.todos = True, todos
        worst = 0.0
        for mask in ((False, True) if masked else (False,)):
            plain, exprs = _split(specs)
            inputs = tuple(plain) + ((f"attention_mask=int64[{BATCH},{SEQ}]:2",) if mask else ())
            phases.prefix = "with the mask: " if mask else ""
            req = VerifyRequest(target=f"{path}::{cls.__name__}", build=expression,
                                inputs=inputs, atol=1e-5, rtol=1e-4, converted=str(converted),
                                float64=False, setup=setup, input_exprs=tuple(exprs))
            try:
                r = float64_decides(req, run_request(req))
            except Exception as exc:  # noqa: BLE001
                return done(f"verify: {type(exc).__name__}: {exc}")
            diffs = [d for d in (r.max_rel_diff, r.grad_max_rel_diff) if d is not None]
            worst = max([worst, *diffs])
            result.max_diff = worst if diffs or result.max_diff is not None else None
            if r.error or not r.passed:
                where = "with the mask: " if mask else ""
                return done(where + (r.error or r.mismatch or r.reason or "did not pass"))
    result.verified = True
    del transformers
    return done()


def float64_decides(req, r):
    """A float32 pass ``r`` that differs in numbers only (same structure and shapes, finite)
    rerun in float64, as ``torch2jax verify`` does by default: float64 agreeing to its own
    rounding (1e-10) says the float32 difference is rounding through a deep network (a value
    near a kink, a gradient that cancels to near zero), and the row verifies; float64 differing
    as well says the translation computes something else (the reason says so)."""
    from torch2jax.verify.run import run_request

    if r.error or r.passed or not math.isfinite(r.max_abs_diff or 0.0) or not math.isfinite(
            r.grad_max_abs_diff or 0.0):
        return r
    r64 = run_request(dataclasses.replace(req, float64=True))
    if r64.error is None and r64.passed:
        return r64
    r.mismatch = (f"{r.mismatch} (float64 not run: {r64.error})" if r64.error
                  else f"float64 differs as well: {r64.mismatch}")
    return r


class _Phases:
    """The seconds of each phase of a row (``torch2jax.verify.common.timed``): summed per
    phase in ``seconds``, and each start and end written to stderr as it comes (``PHASE``
    lines), so that a row that times out still says which phase it was in."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}  # wall-clock seconds
        self.cpu: dict[str, float] = {}  # this process's CPU seconds (a loaded machine's
        self.prefix = ""  # wall clock says more of the load than of the work)
        self.started: list[float] = []

    def hook(self, what: str, seconds: float | None) -> None:
        what = self.prefix + re.sub(r"(/[\w.\-]+)+/", "", what)
        if seconds is None:
            self.started.append(time.process_time())
            print(f"PHASE start {what}", file=sys.stderr, flush=True)
            return
        cpu = time.process_time() - self.started.pop()
        self.seconds[what] = round(self.seconds.get(what, 0.0) + seconds, 1)
        self.cpu[what] = round(self.cpu.get(what, 0.0) + cpu, 1)
        print(f"PHASE {seconds:.1f} {what}", file=sys.stderr, flush=True)


def _phases_of(stderr: str | bytes | None) -> tuple[dict[str, float], str]:
    """The phases a child's stderr reports as ended (their seconds, summed) and the one it
    was in when it stopped ('' when none)."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    ended: dict[str, float] = {}
    running: list[str] = []
    for line in text.splitlines():
        if not line.startswith("PHASE "):
            continue
        _, when, what = line.split(" ", 2)
        if when == "start":
            running.append(what)
        else:
            ended[what] = round(ended.get(what, 0.0) + float(when), 1)
            if what in running:
                running.remove(what)
    return ended, running[-1] if running else ""


def _child(path: Path, timeout: float) -> list[dict]:
    """``run_one`` in a process of its own, with a time limit (a row that times out names
    the phase it was in, and its ``phases`` the seconds of those that ended)."""
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    row = Result(family=family_of(path), entry="", target="nnx")
    try:
        done = subprocess.run([sys.executable, __file__, "--one", str(path)], env=env, check=False,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        ended, running = _phases_of(exc.stderr)
        row.reason = f"timed out after {timeout:.0f} s" + (f" (in {running})" if running else "")
        row.seconds = round(time.perf_counter() - start, 1)
        return [{**dataclasses.asdict(row), "phases": ended}]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("SWEEP ")]
    if lines:
        return json.loads(lines[-1][len("SWEEP "):])
    tail = [ln for ln in done.stderr.splitlines() if ln.strip()]
    row.reason = f"crashed (exit {done.returncode}): {tail[-1] if tail else ''}"
    row.seconds = round(time.perf_counter() - start, 1)
    return [dataclasses.asdict(row)]


def clean_reason(text: str) -> str:
    """A failure's reason on one line, without the temporary folders of the converted
    package (rows that differ only there count as one reason)."""
    text = re.sub(r"/tmp/[\w.\-/]*?transformers_jax_\d+/", "", text)
    text = re.sub(r"/tmp/[\w.\-]+/", "", text)
    return " ".join(text.split())


def preamble(results: list[Result], command: str) -> str:
    import transformers

    files = len(discover(Path(transformers.__file__).parent / "models"))
    verified, swept = sum(r.verified for r in results), len(results)
    return (f"transformers {transformers.__version__}, swept on "
            f"{datetime.date.today().isoformat()} by `{command}` "
            "(benchmarks/transformers_sweep.py says what each row does; docs/transformers.md, "
            "\"The sweep\", what the failures are).\n\n"
            f"{swept} of the {files} modeling files of `transformers/models/` swept; {verified} "
            f"verified: {100 * verified / max(swept, 1):.0f}% of those swept, "
            f"{100 * verified / max(files, 1):.0f}% of all {files}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="", help="comma-separated directory names or stems")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--range", default="", help="START:STOP of the (shuffled) file list: "
                        "a long sweep in parts, run one after another or on several machines")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per family")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--jsonl", default="", help="append each row here (and --resume from it)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--shuffle", action="store_true",
                        help="a fixed random order (a partial sweep is then a fair sample)")
    parser.add_argument("--doc", default="", help="write the markdown table here")
    parser.add_argument("--doc-only", action="store_true")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("SWEEP " + json.dumps(run_one(Path(args.one))), flush=True)
        return 0
    import transformers

    files = discover(Path(transformers.__file__).parent / "models")
    if args.families:
        wanted = set(args.families.split(","))
        files = [p for p in files if p.parent.name in wanted or family_of(p) in wanted]
    if args.shuffle:
        random.Random(0).shuffle(files)
    if args.range:
        start, _, stop = args.range.partition(":")
        files = files[int(start or 0):int(stop) if stop else None]
    if args.limit:
        files = files[:args.limit]
    rows: list[dict] = []
    jsonl = Path(args.jsonl) if args.jsonl else None
    if jsonl and jsonl.exists() and (args.resume or args.doc_only):
        rows = [json.loads(ln) for ln in jsonl.read_text().splitlines() if ln.strip()]
        seen = {r["family"] for r in rows}
        files = [p for p in files if family_of(p) not in seen]
    if not args.doc_only:
        with concurrent.futures.ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            futures = {pool.submit(_child, p, args.timeout): p for p in files}
            for future in concurrent.futures.as_completed(futures):
                for row in future.result():
                    rows.append(row)
                    if jsonl:
                        with jsonl.open("a") as f:
                            f.write(json.dumps(row) + "\n")
                    print(f"{row['family']:30} {'ok' if row['verified'] else 'FAIL':4} "
                          f"{row['seconds']:6.1f}s {row['reason'][:120]}", flush=True)
    fields = {f.name for f in dataclasses.fields(Result)}
    results = [Result(**{**{k: v for k, v in r.items() if k in fields},
                         "reason": clean_reason(r["reason"])}) for r in rows]
    if args.doc:
        command = "python benchmarks/transformers_sweep.py " + " ".join(
            Path(a).name if a.startswith("/") else a
            for a in (argv if argv is not None else sys.argv[1:]))
        write_markdown(Path(args.doc), "The transformers sweep", preamble(results, command),
                       results)
    verified = sum(r.verified for r in results)
    print(f"{verified} of {len(results)} verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
