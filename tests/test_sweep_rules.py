"""General rules the transformers sweep found missing (docs/transformers-sweep.md), each on a
module of our own in the shape the modeling files write it: converted, built with torch's
weights and verified against torch (outputs and gradients)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

NORMS = '''
import torch
from torch import nn


class Contrastive(nn.Module):
    """OWL-ViT's and CLIP-like heads: embeddings divided by their norms, torch.linalg's."""

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(6, 8)
        self.text = nn.Linear(6, 8)

    def forward(self, x, y):
        i = self.image(x)
        t = self.text(y)
        i = i / torch.linalg.norm(i, ord=2, dim=-1, keepdim=True)
        t = t / (torch.linalg.vector_norm(t, dim=[-1], keepdim=True) + 1e-6)
        scale = torch.norm(i, p=2, dim=-1) + torch.linalg.norm(t)
        return (i @ t.T) * scale[:, None]
'''


PATCHES = '''
import torch
from torch import nn


class PatchEmbed(nn.Module):
    """CLAP's audio patch embedding: sizes that are an int or a pair, made pairs by
    ``(p, p) if isinstance(p, int) else p``, and a padding computed as a tuple."""

    def __init__(self, patch=5, stride=3):
        super().__init__()
        patch_size = (patch, patch) if isinstance(patch, int) else patch
        patch_stride = (stride, stride) if isinstance(stride, int) else stride
        padding = ((patch_size[0] - patch_stride[0]) // 2, (patch_size[1] - patch_stride[1]) // 2)
        self.proj = nn.Conv2d(3, 8, kernel_size=patch_size, stride=patch_stride, padding=padding)

    def forward(self, x):
        return self.proj(x)
'''


def _verify(tmp_path: Path, source: str, target: str, *inputs: str, build: str | None = None):
    path = tmp_path / "model.py"
    path.write_text(source)
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs, build=build))


@pytest.mark.parametrize("build", [None, "PatchEmbed(patch=(5, 3), stride=(3, 1))"])
def test_sizes_made_pairs_by_isinstance_int_verify(tmp_path, build) -> None:
    r = _verify(tmp_path, PATCHES, "PatchEmbed", "float32[2,3,12,10]", build=build)
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


def test_linalg_norms_verify(tmp_path) -> None:
    r = _verify(tmp_path, NORMS, "Contrastive", "float32[3,6]", "float32[4,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_a_state_space_cache_flattens_to_its_states() -> None:
    """Mamba's and the hybrids' caches hold LinearAttentionLayers (conv and recurrent states,
    no keys): verify compares those states instead of failing on the missing keys."""
    import types

    import numpy as np

    from torch2jax.verify.common import flatten_output

    conv, rec = np.zeros((1, 4, 3)), np.ones((1, 4, 2))
    state = types.SimpleNamespace(conv_states={0: conv}, recurrent_states={0: rec})
    attention = types.SimpleNamespace(keys=np.ones(2), values=np.zeros(2))
    cache = type("DynamicCache", (), {"layers": [state, attention]})()
    leaves = dict(flatten_output(cache))
    assert list(leaves) == ["output[0]['conv_states'][0]", "output[0]['recurrent_states'][0]",
                            "output[1]['keys']", "output[1]['values']"]
    assert leaves["output[0]['recurrent_states'][0]"] is rec


LEGACY = '''
import numpy as np
import torch
from torch import nn


class RelativeBias(nn.Module):
    """FastSpeech2-Conformer's and the DETRs' parameters made by the legacy constructors, and
    RoFormer's (XLM's, Marian's, DistilBERT's: nine files) sinusoidal table, a numpy array
    given to ``torch.FloatTensor``."""

    def __init__(self, heads=4, dim=3):
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim
        self.linear = nn.Linear(12, 12)
        self.pos_bias_u = nn.Parameter(torch.Tensor(self.num_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.FloatTensor(heads * dim))
        nn.init.normal_(self.pos_bias_u)
        nn.init.normal_(self.pos_bias_v)
        self.offsets = nn.Buffer(torch.Tensor([0.5, -1.0, 2.0]))
        n_pos = heads
        position_enc = np.array([[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)]
                                 for pos in range(n_pos)])
        table = torch.empty(n_pos, dim, requires_grad=False)
        sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
        table[:, 0:sentinel] = torch.FloatTensor(np.sin(position_enc[:, 0::2]))
        table[:, sentinel:] = torch.FloatTensor(np.cos(position_enc[:, 1::2]))
        self.register_buffer("table", table, persistent=False)

    def forward(self, x):
        y = self.linear(x).view(x.shape[0], self.num_heads, self.head_dim)
        v = self.pos_bias_v.view(self.num_heads, self.head_dim)
        return y * self.pos_bias_u + v * self.offsets + self.table
'''


def test_legacy_tensor_constructors_verify(tmp_path) -> None:
    r = _verify(tmp_path, LEGACY, "RelativeBias", "float32[2,12]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


def test_a_legacy_constructor_of_one_unknown_name_is_marked() -> None:
    from torch2jax.convert import convert_source

    out = convert_source("import torch\n\ndef f(values):\n    return torch.Tensor(values)\n")
    assert "TODO(torch2jax): torch.Tensor(values): a size or data" in out.code


DEVICE_PAIR = '''
import torch
from torch import nn


class Positions(nn.Module):
    """CPM-Ant's and others' ``dtype, device = input_ids.dtype, input_ids.device``."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)

    def forward(self, input_ids):
        dtype, device = input_ids.dtype, input_ids.device
        length = input_ids.size(1)
        position = torch.arange(length, dtype=dtype, device=device)
        scale, where = 0.5, input_ids.device
        return self.emb(input_ids + position) * torch.ones(8, device=where) * scale
'''


def test_a_device_in_a_tuple_assignment_goes_and_verifies_under_jit(tmp_path) -> None:
    r = _verify(tmp_path, DEVICE_PAIR, "Positions", "int64[2,5]:8")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


def test_every_activation_of_transformers_is_in_the_support_module() -> None:
    """ACT2FN of the support module against transformers' (PP-LCNet's hardswish was missing):
    each name the installed transformers knows, on the same inputs. prelu has parameters (a
    module, not a function): refused by name; xielu's module, with its parameters, is compared
    with transformers' in tests/test_hf_sweep_reasons_hf13.py."""
    activations = pytest.importorskip("transformers.activations", exc_type=ImportError)
    import numpy as np
    import torch

    from torch2jax import transformers_runtime as runtime

    x = np.linspace(-12.0, 12.0, 97, dtype=np.float32)
    for name in sorted(activations.ACT2CLS):
        if name == "xielu":
            continue
        if name == "prelu":
            with pytest.raises(NotImplementedError, match=name):
                runtime.ACT2FN[name]
            continue
        want = activations.ACT2FN[name](torch.tensor(x)).numpy()
        got = np.asarray(runtime.ACT2FN[name](x))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


LAYER_SIZES = '''
import torch
from torch import nn


class ConvLayer(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return self.convolution(x)


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_1x1 = ConvLayer(3, 6)

    def forward(self, x):
        return self.conv_1x1(x)


class Net(nn.Module):
    \"\"\"MobileNetV2's head sized from a layer deep in the body; FSMT's embed_dim from the
    embedding.\"\"\"

    def __init__(self):
        super().__init__()
        self.body = Body()
        self.embed_tokens = nn.Embedding(10, 5)
        embed_dim = self.embed_tokens.embedding_dim
        last = self.body.conv_1x1.convolution.out_channels
        self.head = nn.Linear(last + embed_dim, 4)

    def forward(self, x, ids):
        h = self.body(x).mean(dim=(2, 3))
        e = self.embed_tokens(ids).mean(dim=1)
        return self.head(torch.cat([h, e], dim=-1))
'''


def test_sizes_read_from_layers_verify(tmp_path) -> None:
    """A layer's torch size attributes (out_channels deep in a body, embedding_dim) read by
    NNX's names (MobileNetV2's head, FSMT's embed_dim)."""
    r = _verify(tmp_path, LAYER_SIZES, "Net", "float32[2,3,6,6]", "int64[2,4]:10")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


ANGLES = '''
import math

import torch
from torch import nn


class Expectation(nn.Module):
    """YOSO's collision expectation: an angle between normalised vectors, torch.acos."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(6, 8)
        self.k = nn.Linear(6, 8)

    def forward(self, x):
        q = nn.functional.normalize(self.q(x), dim=-1)
        k = nn.functional.normalize(self.k(x), dim=-1)
        cos = torch.clamp(q @ k.transpose(-1, -2), -0.99, 0.99)
        angle = torch.acos(cos) + cos.asin().abs() + torch.atan(cos).trunc()
        return (1 - angle / math.pi) * torch.tan(cos) + torch.sinh(cos) * cos.cosh()
'''


def test_inverse_trigonometric_functions_verify(tmp_path) -> None:
    r = _verify(tmp_path, ANGLES, "Expectation", "float32[2,5,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


LOOKUP = '''
import torch
import torch.nn.functional as F
from torch import nn


class RelativeBias(nn.Module):
    """CPM-Ant's relative position bias: a parameter table read by F.embedding."""

    def __init__(self, buckets=6, heads=2):
        super().__init__()
        self.relative_attention_bias = nn.Parameter(torch.randn(buckets, heads))

    def forward(self, x, bucket):
        bias = F.embedding(bucket, self.relative_attention_bias)
        return x + bias.permute(2, 0, 1)
'''


def test_functional_embedding_of_a_parameter_verifies(tmp_path) -> None:
    r = _verify(tmp_path, LOOKUP, "RelativeBias", "float32[2,4,4]", "int64[4,4]:6")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


SPREAD = '''
import torch
from torch import nn


class SpreadSizes(nn.Module):
    """GPT-OSS's and Flint's attention sinks, Inkling's relative-position gather index and the
    chunked state-space models' ``x[..., None].expand(*x.size(), n)``: sizes spread from a
    tensor's shape, then given one by one (a -1 keeps the input's size)."""

    def __init__(self, heads=2, extent=3):
        super().__init__()
        self.sinks = nn.Parameter(torch.randn(heads))
        self.extent = extent

    def forward(self, scores, positions):
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        distance = (positions[:, None] - positions[None, :])[None, None, :, :]
        index = distance.clamp(0, self.extent - 1).expand(*scores.shape[:2], -1, -1)
        chunks = scores[..., None].expand(*scores.size(), 2)
        return weights * torch.gather(scores, -1, index) + chunks.sum(-1)
'''


def test_expand_of_spread_sizes_verifies(tmp_path) -> None:
    r = _verify(tmp_path, SPREAD, "SpreadSizes", "float32[2,2,5,5]", "int64[5]:4")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


def test_expand_of_sizes_that_may_hold_minus_one_is_marked() -> None:
    from torch2jax.convert import convert_source

    out = convert_source("import torch\n\ndef f(x, sizes):\n    return x.expand(*sizes, 3)\n")
    assert "TODO(torch2jax)" in out.code and "x.expand(*sizes, 3)" in out.code


@pytest.mark.transformers
@pytest.mark.parametrize("text", ["mistral", "qwen2"])
def test_a_composite_model_builds_its_sub_models_converted(text) -> None:
    """Llava builds its towers with ``AutoModel.from_config(config.vision_config)`` and
    ``AutoModel.from_config(config.text_config)`` (124 modeling files do so). The converted
    file builds the *converted* classes of those configs' model types: here a text model other
    than the default config's (Llava's default is Llama), so the sub-model's modeling file is
    found from the model verify builds, converted beside Llava's and built with rngs."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    path = Path(transformers.__file__).parent / "models" / "llava" / "modeling_llava.py"
    small = "hidden_size=32, intermediate_size=64, num_attention_heads=4"
    text_config = (f"dict(model_type={text!r}, {small}, num_hidden_layers=2, "
                   "num_key_value_heads=2, vocab_size=64, max_position_embeddings=64)")
    vision = (f"dict(model_type='siglip_vision_model', {small}, num_hidden_layers=1, "
              "image_size=16, patch_size=4)")
    build = (f"LlavaForConditionalGeneration(LlavaConfig(text_config={text_config}, "
             f"vision_config={vision}, image_token_id=63, vision_feature_layer=-1))")
    r = run_request(VerifyRequest(
        target=f"{path}::LlavaForConditionalGeneration", build=build,
        setup="from transformers import LlavaConfig",
        inputs=("int64[2,6]:60", "attention_mask=int64[2,6]:2"), float64=False))
    assert r.error is None, r.error
    assert r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


CLASS_OR_NONE = '''
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    """Bamba's decoder layer: the feed-forward class picked as ``MLP if ... else None``."""

    def __init__(self, width=6, num_experts=1):
        super().__init__()
        ffn_layer_class = MLP if num_experts == 1 else None
        self.feed_forward = ffn_layer_class(width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + self.feed_forward(self.norm(x))
'''


def test_a_layer_class_or_none_picked_by_a_condition_verifies(tmp_path) -> None:
    r = _verify(tmp_path, CLASS_OR_NONE, "Block", "float32[3,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)


@pytest.mark.transformers
def test_the_support_models_dtype_is_its_parameters_as_in_transformers() -> None:
    """PaliGemma and LLaVA-NeXT-Video read ``self.dtype`` in ``__init__``: the support
    module's PreTrainedModel answers its parameters' dtype, as transformers' does."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from torch2jax import transformers_runtime as runtime

    config = transformers.LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=16)

    class Tiny(runtime.PreTrainedModel):
        def __init__(self, config, dtype, *, rngs):
            super().__init__(config, rngs=rngs)
            self.before = self.dtype
            self.proj = nnx.Linear(8, 8, param_dtype=dtype, rngs=rngs)

    for name in ("float32", "bfloat16"):
        torch_model = transformers.LlamaModel(config).to(getattr(torch, name))
        jax_model = Tiny(config, getattr(jnp, name), rngs=nnx.Rngs(0))
        assert str(jax_model.dtype) == str(torch_model.dtype).removeprefix("torch.") == name
        assert jax_model.before == jnp.float32


ROPES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "mscale": 0.7, "mscale_all_dim": 1.0, "beta_fast": 16, "partial_rotary_factor": 0.5},
    {"rope_type": "proportional", "partial_rotary_factor": 0.25},
]


@pytest.mark.transformers
@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"])
def test_static_rope_types_give_transformers_frequencies(rope) -> None:
    """CWM (llama3), Gemma 4 (proportional) and the YaRN models read
    ROPE_INIT_FUNCTIONS[rope_type] at init: the support module's give the same inverse
    frequencies and attention factor as transformers' own."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    import numpy as np
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from torch2jax import transformers_runtime as runtime

    def config():
        return transformers.LlamaConfig(
            hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
            rope_parameters={"rope_theta": 10000.0, **rope})

    torch_freq, torch_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config())
    jax_freq, jax_factor = runtime.ROPE_INIT_FUNCTIONS[rope["rope_type"]](config())
    np.testing.assert_allclose(np.asarray(jax_freq), torch_freq.numpy(), rtol=1e-6)
    assert jax_factor == pytest.approx(torch_factor, rel=1e-7)


PARAM_COPY = '''
import torch
from torch import nn


class Mixer(nn.Module):
    """Mamba's and Bamba's mixers: parameters set after they are made, by copy_ under no_grad
    (what transformers' init.copy_ does) and by assigning .data."""

    def __init__(self, heads=4):
        super().__init__()
        A = torch.arange(1, heads + 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.D = nn.Parameter(torch.ones(1, heads))
        with torch.no_grad():
            self.A_log.copy_(torch.log(A) * 2)
            self.D.data.copy_(torch.tensor(0.5))
        self.dt_bias.data = torch.linspace(0.5, 1.5, heads)

    def forward(self, x):
        return x * torch.exp(self.A_log) + self.D * self.dt_bias
'''


def test_a_parameter_copied_into_or_given_new_data_verifies(tmp_path) -> None:
    r = _verify(tmp_path, PARAM_COPY, "Mixer", "float32[3,4]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    # verify brings torch's weights over; the values set at init are compared here
    import numpy as np
    import torch
    from flax import nnx

    from torch2jax.convert import convert_source

    torch_space: dict = {}
    exec(compile(PARAM_COPY, "torch_mixer", "exec"), torch_space)  # noqa: S102
    jax_space: dict = {}
    exec(compile(convert_source(PARAM_COPY).code, "jax_mixer", "exec"), jax_space)  # noqa: S102
    with torch.no_grad():
        torch_model = torch_space["Mixer"]()
    jax_model = jax_space["Mixer"](rngs=nnx.Rngs(0))
    for name in ("A_log", "D", "dt_bias"):
        np.testing.assert_allclose(np.asarray(getattr(jax_model, name).value),
                                   getattr(torch_model, name).detach().numpy(), rtol=1e-6)


HF_INIT = '''
import torch
from torch import nn

from ... import initialization as init


class Mixer(nn.Module):
    """Bamba's and Mamba's mixers: transformers' init functions called outside _init_weights."""

    def __init__(self, heads=4):
        super().__init__()
        self.A_log = nn.Parameter(torch.empty(heads))
        self.D = nn.Parameter(torch.empty(heads))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        A = torch.arange(1, self.A_log.shape[0] + 1, dtype=torch.float32)
        init.copy_(self.A_log, torch.log(A))
        init.ones_(self.D)

    def forward(self, x):
        return x * torch.exp(self.A_log) + self.D
'''


@pytest.mark.transformers
def test_transformers_init_functions_outside_init_weights_convert() -> None:
    """``from ... import initialization as init`` in a modeling file: its functions are
    torch.nn.init's for a model being built, and ``init.copy_`` the tensor's own copy_. The
    reduced and converted file sets the values transformers' functions set."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import numpy as np
    import torch
    from flax import nnx

    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling

    torch_space: dict = {"__name__": "transformers.models.mixer.modeling_mixer",
                         "__package__": "transformers.models.mixer"}
    exec(compile(HF_INIT, "torch_mixer", "exec"), torch_space)  # noqa: S102
    reduced, unknown = reduce_modeling(HF_INIT, "transformers.models.mixer.modeling_mixer")
    assert unknown == []
    jax_space: dict = {}
    exec(compile(convert_source(reduced).code, "jax_mixer", "exec"), jax_space)  # noqa: S102
    torch_model, jax_model = torch_space["Mixer"](), jax_space["Mixer"](rngs=nnx.Rngs(0))
    for name in ("A_log", "D"):
        np.testing.assert_allclose(np.asarray(getattr(jax_model, name).value),
                                   getattr(torch_model, name).detach().numpy(), rtol=1e-6)
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(jax_model(x)), torch_model(torch.from_numpy(x))
                               .detach().numpy(), rtol=1e-6)


@pytest.mark.transformers
def test_config_class_comes_from_the_config_annotation_as_in_transformers() -> None:
    """VisionTextDualEncoderModel checks ``isinstance(config, self.config_class)`` and names its
    config class only as ``config: VisionTextDualEncoderConfig``: the support PreTrainedModel
    derives config_class from that annotation as transformers' does (and resolves a string
    annotation, where transformers would keep the string)."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    from torch2jax import transformers_runtime as runtime

    source = '''
from transformers import LlamaConfig


class Annotated(Base):
    config: LlamaConfig


class Named(Base):
    config_class = LlamaConfig


class Inherited(Annotated):
    pass
'''
    import sys
    import types

    sides = {}
    for side, base in (("torch", transformers.PreTrainedModel),
                       ("jax", runtime.PreTrainedModel)):
        module = types.ModuleType(f"t2j_{side}_classes")  # string annotations resolve in it
        module.Base = base
        sys.modules[module.__name__] = module
        try:
            exec(compile(source, module.__name__, "exec", dont_inherit=True), vars(module))  # noqa: S102
        finally:
            del sys.modules[module.__name__]
        sides[side] = {name: getattr(module, name).config_class
                       for name in ("Annotated", "Named", "Inherited")}
    assert sides["jax"] == sides["torch"]
    assert sides["jax"]["Annotated"] is transformers.LlamaConfig


@pytest.mark.transformers
def test_dataclass_outputs_over_the_support_output_classes_take_every_field() -> None:
    """LLaVA's ``@dataclass class LlavaModelOutputWithPast(MultimodalBaseModelOutputWithPast)``
    (no field of its own) and Gemma 4's ``Gemma4TextModelOutputWithPast(BaseModelOutputWithPast)``
    (one more field) are built with their parents' fields by keyword: the support module's
    output classes are no dataclasses, so @dataclass alone would take only the class's own
    fields. Read as transformers' own outputs read."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    import dataclasses

    from torch2jax import transformers_runtime as runtime

    reads = {}
    for side, base in (("torch", transformers.modeling_outputs.BaseModelOutputWithPast),
                       ("jax", runtime.BaseModelOutputWithPast)):
        plain = dataclasses.dataclass(type("Plain", (base,), {}))
        more = dataclasses.dataclass(type("More", (base,), {
            "__annotations__": {"per_layer": object}, "per_layer": None}))
        a = plain(last_hidden_state=1.0, past_key_values=None)
        b = more(last_hidden_state=2.0, per_layer=3.0)
        reads[side] = (dict(a), a.last_hidden_state, a[0], dict(b), b.per_layer,
                       b.last_hidden_state, b.past_key_values, b.to_tuple())
    assert reads["jax"] == reads["torch"]
