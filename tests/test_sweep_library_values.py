"""The transformers sweep's next most common reasons (docs/transformers-sweep.md) that are general
rules: what transformers' own machinery gives in a modeling file, which value analysis did not
know, so that tensor methods on the results were left as they are and marked (``out.to(...)``,
``key.size(2)``), and the sweep's own per-stage lists. Each on a module of our own in the shape
the modeling files write it, reduced and converted as the sweep does, run against torch."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.transformers

MODELING = '''
import torch
from torch import nn
import torch.nn.functional as F

from ...activations import ACT2FN, get_activation
from ...cache_utils import Cache
from ...modeling_outputs import BaseModelOutputWithPooling


def causal_conv(hidden_states, weight, bias=None, activation=None):
    """Inkling's and the Mamba mixers' causal convolution: its activation read from ACT2FN by
    name, after which ``out`` is one of two assignments."""
    _, channels, seq_len = hidden_states.shape
    out = F.conv1d(hidden_states, weight.unsqueeze(1), bias, padding=weight.shape[-1] - 1,
                   groups=channels)[:, :, :seq_len]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


class Tower(nn.Module):
    """A vision tower: its output a ModelOutput, whose fields the caller reads."""

    def __init__(self, width=8):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        h = self.proj(x)
        return BaseModelOutputWithPooling(last_hidden_state=h, pooler_output=h.mean(dim=1))


class Block(nn.Module):
    """CPM-Ant's and FSMT's attention (the keys and values a KV cache's ``update`` returns, read
    again), LW-DETR's layer scale (``torch.Tensor(dim)``, a size held by a name), the VLMs'
    ``tower(x).pooler_output.to(dtype)``."""

    def __init__(self, width=8, heads=2, kernel=3):
        super().__init__()
        dim = width
        self.heads = heads
        self.conv_weight = nn.Parameter(torch.randn(width, kernel))
        self.conv_bias = nn.Parameter(torch.randn(width))
        self.scale = nn.Parameter(torch.Tensor(dim))
        nn.init.constant_(self.scale, 0.5)
        self.k_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.tower = Tower(width)

    def forward(self, x, cache: Cache | None = None):
        b, s, w = x.shape
        key = self.k_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
        value = self.v_proj(x).view(b, s, self.heads, -1).transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, 0)
        keys_seen = key.size(2)
        mixed = causal_conv(x.transpose(1, 2), self.conv_weight, self.conv_bias, "silu")
        summary = (key * value).sum(dim=2).reshape(b, 1, w) / keys_seen
        pooled = self.tower(x).pooler_output.to(x.dtype).view(b, 1, w)
        return mixed.transpose(1, 2) * self.scale + get_activation("gelu")(summary) + pooled
'''

NAME = "transformers.models.mixer.modeling_mixer"


def _modules(tmp_path: Path):
    """The torch module (the source run as a modeling file of the installed transformers) and
    the converted one (reduced and converted as the sweep does, beside the support module)."""
    pytest.importorskip("transformers", exc_type=ImportError)
    from torch2jax.convert import convert_source
    from torch2jax.hf import SUPPORT_MODULE, reduce_modeling, write_support_modules

    torch_space: dict = {"__name__": NAME, "__package__": NAME.rpartition(".")[0]}
    exec(compile(MODELING, "torch_mixer", "exec"), torch_space)  # noqa: S102
    reduced, unknown = reduce_modeling(MODELING, NAME)
    assert unknown == []
    result = convert_source(reduced)
    assert "TODO(torch2jax)" not in result.code, result.code
    package = tmp_path / "t2j_lib_values"
    (package / "models" / "mixer").mkdir(parents=True)
    for folder in (package, package / "models", package / "models" / "mixer"):
        (folder / "__init__.py").write_text("")
    write_support_modules(package)
    (package / "models" / "mixer" / "modeling_mixer.py").write_text(result.code)
    sys.path.insert(0, str(tmp_path))
    try:
        jax_module = importlib.import_module("t2j_lib_values.models.mixer.modeling_mixer")
        support = importlib.import_module(f"t2j_lib_values.{SUPPORT_MODULE}")
    finally:
        sys.path.remove(str(tmp_path))
    return torch_space, jax_module, support


def _same_weights(torch_model, jax_model) -> None:
    import jax.numpy as jnp

    t = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    jax_model.conv_weight.value = jnp.asarray(t["conv_weight"])
    jax_model.conv_bias.value = jnp.asarray(t["conv_bias"])
    jax_model.scale.value = jnp.asarray(t["scale"])
    for name, layer in (("k_proj", jax_model.k_proj), ("v_proj", jax_model.v_proj),
                        ("tower.proj", jax_model.tower.proj)):
        layer.kernel.value = jnp.asarray(t[f"{name}.weight"].T)
        layer.bias.value = jnp.asarray(t[f"{name}.bias"])


def test_activation_tables_caches_and_legacy_sizes_convert_and_match_torch(tmp_path) -> None:
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx
    from transformers import DynamicCache

    torch_space, jax_module, support = _modules(tmp_path)
    torch.manual_seed(0)
    torch_model = torch_space["Block"]()
    jax_model = jax_module.Block(rngs=nnx.Rngs(0))
    assert jax_model.scale.value.shape == (8,)
    _same_weights(torch_model, jax_model)
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    past = np.random.default_rng(1).standard_normal((2, 2, 3, 4)).astype(np.float32)

    # without a cache: outputs and every parameter's gradient
    xt = torch.from_numpy(x)
    out = torch_model(xt)
    out.square().sum().backward()
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), out.detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    grads = nnx.grad(lambda m: jnp.sum(jnp.square(m(jnp.asarray(x)))))(jax_model)
    np.testing.assert_allclose(np.asarray(grads.scale.value), torch_model.scale.grad.numpy(),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads.k_proj.kernel.value),
                               torch_model.k_proj.weight.grad.numpy().T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads.tower.proj.kernel.value),
                               torch_model.tower.proj.weight.grad.numpy().T, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads.conv_weight.value),
                               torch_model.conv_weight.grad.numpy(), rtol=1e-4, atol=1e-5)

    # with a cache that holds three earlier positions: the keys seen are 3 + 5, in both
    torch_cache = DynamicCache()
    torch_cache.update(torch.from_numpy(past), torch.from_numpy(past), 0)
    jax_cache = support.DynamicCache()
    jax_cache.update(jnp.asarray(past), jnp.asarray(past), 0)
    with torch.no_grad():
        expected = torch_model(xt, cache=torch_cache).numpy()
    got = jax.jit(lambda m, c, v: m(v, cache=c))(jax_model, jax_cache, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def test_the_sweep_keeps_the_stage_count_of_per_stage_lists() -> None:
    """SegFormer, PoolFormer, GLPN, Hiera: ``depths`` and ``hidden_sizes`` cut to two stages
    while ``strides``, ``patch_sizes``, ``sr_ratios`` keep four (IndexError in torch's own
    constructor). Shrunk, every per-stage list keeps its length, and torch builds and runs the
    tiny model."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from transformers_sweep import tiny_config
    finally:
        sys.path.pop(0)
    from transformers import (
        HieraConfig,
        HieraForImageClassification,
        SegformerConfig,
        SegformerForImageClassification,
    )

    for config_class, model_class in ((SegformerConfig, SegformerForImageClassification),
                                      (HieraConfig, HieraForImageClassification)):
        config, kwargs = tiny_config(config_class)
        assert len(kwargs["depths"]) == len(config_class().depths)
        assert max(kwargs["depths"]) == 1
        torch.manual_seed(0)
        model = model_class(config).eval()
        with torch.no_grad():
            logits = model(torch.randn(2, 3, 32, 32)).logits
        assert logits.shape == (2, config.num_labels)
        assert sum(p.numel() for p in model.parameters()) < 1_500_000


def test_the_sweep_builds_each_layer_kind_of_a_repeated_pattern() -> None:
    """RecurrentGemma's ``block_types`` repeats ["recurrent", "recurrent", "attention"] over
    26 layers: cut to two layers, the tiny model had no attention layer and torch's own forward
    refused its cache. Shrunk, it has one layer per entry of the pattern and runs."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        from transformers_sweep import tiny_config
    finally:
        sys.path.pop(0)
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    config, kwargs = tiny_config(RecurrentGemmaConfig)
    assert kwargs["num_hidden_layers"] == 3
    torch.manual_seed(0)
    model = RecurrentGemmaForCausalLM(config).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, 64, (2, 7))).logits
    assert logits.shape == (2, 7, config.vocab_size)


def test_the_support_models_output_embeddings_are_transformers_answer() -> None:
    """EncoderDecoderModel ties through ``decoder.get_output_embeddings()`` of a base model
    (BertModel: None in transformers); the support PreTrainedModel had no such method. It
    answers as transformers does: the lm_head of a model with one and an input embedding,
    else None."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    from flax import nnx

    from torch2jax import transformers_runtime as runtime

    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=16)

    class Base(runtime.PreTrainedModel):
        def __init__(self, config, *, rngs):
            super().__init__(config, rngs=rngs)
            self.embed_tokens = nnx.Embed(16, 8, rngs=rngs)

    class Head(Base):
        def __init__(self, config, *, rngs):
            super().__init__(config, rngs=rngs)
            self.lm_head = nnx.Linear(8, 16, use_bias=False, rngs=rngs)

    class Backbone(runtime.PreTrainedModel):  # a head without an input embedding
        def __init__(self, config, *, rngs):
            super().__init__(config, rngs=rngs)
            self.lm_head = nnx.Linear(8, 16, use_bias=False, rngs=rngs)

    base, head = Base(config, rngs=nnx.Rngs(0)), Head(config, rngs=nnx.Rngs(0))
    assert base.get_output_embeddings() is None
    assert transformers.LlamaModel(config).get_output_embeddings() is None
    assert head.get_output_embeddings() is head.lm_head
    assert transformers.LlamaForCausalLM(config).get_output_embeddings() is not None
    assert Backbone(config, rngs=nnx.Rngs(0)).get_output_embeddings() is None


TOWER = '''
import torch
from torch import nn

from ...modeling_utils import PreTrainedModel
from ..auto import AutoModel


class Model(PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.text_model = AutoModel.from_config(config.text_config)

    def forward(self, ids):
        x = self.text_model.get_input_embeddings()(ids).to(torch.float32)
        return x.transpose(0, 1)
'''


def test_a_towers_input_embedding_applied_is_a_tensor() -> None:
    """Granite-Docling's and other composites' ``self.text_model.get_input_embeddings()(ids)
    .to(...)``, the tower built by AutoModel: the embedding of a transformers model is a
    module, its output a tensor, so the methods on it translate (they were marked)."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import libcst as cst

    from torch2jax.analysis.metadata import ALL, FileMetadata
    from torch2jax.analysis.values import Kind, ValueFacts
    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling

    reduced, _ = reduce_modeling(TOWER, NAME)
    wrapper = FileMetadata(cst.parse_module(reduced))
    wrapper.resolve_many(ALL)
    facts = ValueFacts(wrapper, {"Model"}, lambda q: False)
    forward = wrapper.module.body[-1].body.body[1]
    embedded = forward.body.body[0].body[0].value  # ...get_input_embeddings()(ids).to(...)
    assert facts.kind(embedded.func.value) == Kind.TENSOR
    assert facts.kind(embedded.func.value.func) == Kind.MODULE
    assert "TODO(torch2jax)" not in convert_source(reduced).code


MASK = '''
import torch
from torch import nn

from ...masking_utils import create_causal_mask


class Masked(nn.Module):
    """MPT's decoder: the mask transformers builds, made boolean by ``.to(torch.bool)``."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, inputs_embeds, attention_mask=None):
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=None,
        ).to(torch.bool)
'''


def test_a_mask_made_by_transformers_is_a_tensor_and_other_results_are_marked(tmp_path) -> None:
    """``create_causal_mask(...).to(torch.bool)`` was left as it is, unmarked (an imported
    function's name was taken for what it returns), and crashed under jit: the mask is a
    tensor, and what another library's function returns is marked, not left silently."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    import jax.numpy as jnp
    import torch

    from torch2jax import transformers_runtime as runtime
    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling

    reduced, _ = reduce_modeling(MASK, NAME)
    code = convert_source(reduced).code
    assert "TODO(torch2jax)" not in code and ".astype(jnp.bool_)" in code
    space: dict = {"create_causal_mask": runtime.create_causal_mask}  # the support module's
    code = code.replace("from ..._hf_support import create_causal_mask\n", "")
    exec(compile(code, "jax_masked", "exec"), space)  # noqa: S102
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=16,
                                      num_hidden_layers=1)
    config._attn_implementation = "eager"
    embeds = np.zeros((2, 5, 8), np.float32)
    padding = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    from transformers.masking_utils import create_causal_mask

    expected = create_causal_mask(config=config, inputs_embeds=torch.from_numpy(embeds),
                                  attention_mask=torch.from_numpy(padding), cache=None)
    from flax import nnx

    masked = space["Masked"](config, rngs=nnx.Rngs(0))
    got = np.asarray(masked(jnp.asarray(embeds), jnp.asarray(padding)))
    assert got.dtype == np.bool_
    want = expected.to(torch.bool).numpy()  # what MPT's line computes in torch
    np.testing.assert_array_equal(got.reshape(want.shape), want)

    other = convert_source("import torch\nfrom somelib import make\n\n\ndef f(x):\n"
                           "    return make(x).to(torch.float32)\n")
    assert [d.rule for d in other.diagnostics if d.severity == "error"] == ["unknown-receiver"]
    assert "# TODO(torch2jax): make(x).to(...)" in other.code


LEVIT = '''
import itertools

import torch
from torch import nn


class AttentionBias(nn.Module):
    """LeViT's attention biases: one per offset, gathered by indices built as a list and made a
    tensor by the legacy ``torch.LongTensor(indices)``."""

    def __init__(self, resolution=3, heads=2):
        super().__init__()
        points = list(itertools.product(range(resolution), range(resolution)))
        offsets, indices = {}, []
        for p1 in points:
            for p2 in points:
                offset = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
                if offset not in offsets:
                    offsets[offset] = len(offsets)
                indices.append(offsets[offset])
        n = len(points)
        self.biases = nn.Parameter(torch.randn(heads, len(offsets)))
        self.register_buffer("idxs", torch.LongTensor(indices).view(n, n), persistent=False)

    def forward(self, scores):
        return scores + self.biases[:, self.idxs]
'''


def test_a_legacy_long_tensor_of_a_list_verifies(tmp_path) -> None:
    from torch2jax.verify.common import VerifyRequest
    from torch2jax.verify.run import run_request

    path = tmp_path / "levit_bias.py"
    path.write_text(LEVIT)
    r = run_request(VerifyRequest(target=f"{path}::AttentionBias", inputs=("float32[4,2,9,9]",)))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4



def _both_sides(source: str, support: tuple[str, ...]) -> tuple[dict, dict]:
    """A modeling file's torch namespace, and its conversion's (no TODO), run with the
    ``support`` names of the transformers runtime its ``_hf_support`` import gives."""
    from torch2jax import transformers_runtime as runtime
    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling

    reduced, unknown = reduce_modeling(source, NAME)
    assert unknown == []
    code = convert_source(reduced).code
    assert "TODO(torch2jax)" not in code, code
    torch_space: dict = {"__name__": NAME, "__package__": NAME.rpartition(".")[0]}
    exec(compile(source, "torch_side", "exec"), torch_space)  # noqa: S102
    space: dict = {n: getattr(runtime, n) for n in support}
    code = code.replace(f"from ..._hf_support import {', '.join(support)}\n", "")
    exec(compile(code, "jax_side", "exec"), space)  # noqa: S102
    return torch_space, space

ATTENTION = '''
import math
from collections.abc import Callable

import torch
from torch import nn

from ...modeling_utils import ALL_ATTENTION_FUNCTIONS


def eager_attention_forward(module: nn.Module, query, key, value, attention_mask, scaling,
                            dropout=0.0, **kwargs):
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling + module.sinks.view(1, -1, 1, 1)
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training).to(value.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class Attention(nn.Module):
    """M2M100's and Speech2Text's sinusoidal positions (``torch.get_default_dtype()``), a scale
    tested with ``torch.is_tensor``, Funnel's device passed by position to a method of the file,
    the ViTs' ``context.size()`` of what the attention function returns, PVT's tensor
    annotated ``int`` and GPT-OSS's ``module.sinks`` (a parameter of the module the attention
    function is given)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // self.heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.sinks = nn.Parameter(torch.randn(self.heads))

    @staticmethod
    def get_embedding(num, dim):
        half = dim // 2
        emb = math.log(10000) / (half - 1)
        emb = torch.exp(torch.arange(half, dtype=torch.int64).float() * -emb)
        emb = torch.arange(num, dtype=torch.int64).float().unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).to(torch.get_default_dtype())

    def positions(self, seq_len, dtype, device):
        return self.get_embedding(seq_len, self.config.hidden_size).to(dtype=dtype, device=device)

    def transpose_for_scores(self, hidden_states: int) -> torch.Tensor:
        new_shape = hidden_states.size()[:-1] + (self.heads, self.head_size)
        return hidden_states.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, scale=None):
        b, s, _ = hidden_states.shape
        hidden_states = hidden_states + self.positions(s, hidden_states.dtype, hidden_states.device)
        if torch.is_tensor(scale):
            hidden_states = hidden_states * scale
        shape = (b, -1, self.heads, self.head_size)
        q = self.transpose_for_scores(self.query(hidden_states))
        k = self.key(hidden_states).view(shape).transpose(1, 2)
        v = self.value(hidden_states).view(shape).transpose(1, 2)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward)
        context, _ = attention_interface(self, q, k, v, None, scaling=self.head_size ** -0.5)
        new_shape = context.size()[:-2] + (self.heads * self.head_size,)
        return context.reshape(new_shape)
'''


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_default_dtype_is_tensor_positional_device_and_attention_results(implementation) -> None:
    """The sweep's reasons on M2M100, MusicGen, Speech2Text, Kosmos-2 (``torch.get_default_dtype``
    had no rule), Funnel (``x.device`` passed by position reached the traced code) and YOLOS,
    DPT, VideoMAE (``context.size()`` of what ``attention_interface`` returns was marked, its
    result unknown), PVT (``hidden_states: int`` then ``hidden_states.size()``, left as it is,
    unmarked), GraniteSWA (``module.sinks.view(...)`` marked), MiMo-V2-Flash and GPT-OSS
    (``dropout(w, p, training=module.training).to(dtype)``: the support module's
    ``attention_dropout`` the reduction writes was not known to give a tensor, its ``.to`` left
    as it is): converted as the sweep does with no TODO, run under jit against torch."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    torch_space, space = _both_sides(ATTENTION, ("ALL_ATTENTION_FUNCTIONS", "attention_dropout"))
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=16,
                                      num_hidden_layers=1)
    config._attn_implementation = implementation
    torch.manual_seed(0)
    torch_model = torch_space["Attention"](config).eval()
    jax_model = space["Attention"](config, rngs=nnx.Rngs(0))
    for name in ("query", "key", "value"):
        layer = getattr(torch_model, name)
        getattr(jax_model, name).kernel.value = jnp.asarray(layer.weight.detach().numpy().T)
        getattr(jax_model, name).bias.value = jnp.array(layer.bias.detach().numpy())
    jax_model.sinks.value = jnp.array(torch_model.sinks.detach().numpy())
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    for scale in (None, np.float32(1.5)):
        with torch.no_grad():
            want = torch_model(torch.from_numpy(x), None if scale is None else torch.tensor(
                scale)).numpy()
        got = jax.jit(lambda m, v, s: m(v, s))(jax_model, jnp.asarray(x),
                                               None if scale is None else jnp.asarray(scale))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


ACTIVATIONS = '''
import torch
from torch import nn

from ...activations import ACT2CLS, gelu_new, silu


class CastNorm(nn.LayerNorm):
    """ESMC's LayerNorm that gives back its input's dtype."""

    def forward(self, hidden_states):
        return super().forward(hidden_states).to(hidden_states.dtype)


ACT_FNS = {"gelu": gelu_new, "silu": silu}


class Mlp(nn.Module):
    """RT-DETR's and SwiftFormer's ``ACT2CLS[name]()``, OpenAI GPT's table of transformers'
    module-level activation functions."""

    def __init__(self, width=8, activation="gelu", afn="silu"):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = CastNorm(width)
        self.activation = nn.Identity() if activation is None else ACT2CLS[activation]()
        self.act = ACT_FNS[afn]

    def forward(self, x):
        h = self.activation(self.fc(x))
        return self.norm(self.act(h).view(h.size(0), -1).view(x.shape) + gelu_new(x))
'''


def test_activation_classes_functions_and_a_parents_forward_convert_and_match_torch() -> None:
    """The sweep's reasons on OpenAI GPT (``gelu_new``, ``silu`` imported from transformers'
    activations had no JAX counterpart), the ACT2CLS files and ESMC
    (``super().forward(x).to(...)`` was left as it is): no TODO, the same values as torch, and
    ACT2CLS with keywords refused rather than ignored."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from torch2jax import transformers_runtime as runtime

    torch_space, space = _both_sides(ACTIVATIONS, ("ACT2CLS", "gelu_new", "silu"))
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    for activation, afn in (("gelu", "silu"), ("quick_gelu", "gelu"), (None, "silu")):
        torch.manual_seed(0)
        torch_model = torch_space["Mlp"](activation=activation, afn=afn)
        jax_model = space["Mlp"](activation=activation, afn=afn, rngs=nnx.Rngs(0))
        jax_model.fc.kernel.value = jnp.asarray(torch_model.fc.weight.detach().numpy().T)
        jax_model.fc.bias.value = jnp.array(torch_model.fc.bias.detach().numpy())
        with torch.no_grad():
            want = torch_model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), want, rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(NotImplementedError, match="ACT2CLS"):
        runtime.ACT2CLS["gelu"](approximate="tanh")
