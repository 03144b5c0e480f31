"""The transformers sweep's output-structure reasons, fourteenth round (docs/transformers-sweep.md):
a general rule on a module of our own in the modeling files' shape, converted, built with
torch's weights and verified against torch (outputs, their structure, every gradient)."""

from __future__ import annotations

from pathlib import Path

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

TRACING = '''
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)

    def forward(self, x, cache=None):
        b, t, d = x.shape
        q, k, v = (f(x).view(b, t, 2, d // 2).transpose(1, 2) for f in (self.q, self.k, self.v))
        if cache is not None:  # transformers' DynamicCache.update, as a list
            cache.append((k, v))
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // 2), dim=-1)
        return x + (w @ v).transpose(1, 2).reshape(b, t, d)


class Model(nn.Module):
    """A decoder in transformers' shape: the cache is made where it is not traced
    (and returned), the position table used as it is where it fits (else interpolated)."""

    def __init__(self, dim=8, positions=6):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, positions, dim))
        self.layers = nn.ModuleList([Attention(dim, i) for i in range(2)])

    def positions(self, t):
        if not torch.jit.is_tracing() and t == self.pos.shape[1]:
            return self.pos
        return F.interpolate(self.pos.transpose(1, 2), size=t, mode="linear").transpose(1, 2)

    def forward(self, x, use_cache=True, cache=None):
        if use_cache and cache is None and not self.training and not torch.jit.is_tracing():
            cache = []
        x = x + self.positions(x.shape[1])
        for layer in self.layers:
            x = layer(x, cache)
        return x, cache
'''


def test_is_tracing_is_false_and_the_cache_is_returned(tmp_path: Path) -> None:
    """"output structure: jax ['output['logits']'] vs torch [..., 'output['cache'][0]['keys']'"
    (Cohere Compass, GLM-4V-MoE, the Qwen omni/VL MoE models): ``torch.jit.is_tracing()`` was
    True, so ``not torch.jit.is_tracing()`` never made the cache and the ViTs' ``not
    is_tracing() and num_patches == num_positions`` always interpolated. It asks about
    torch.jit.trace: False, the eager path kept (and the ``not False`` conjunct dropped); the
    outputs, the cache's keys and values and every gradient are torch's."""
    path = tmp_path / "model.py"
    path.write_text(TRACING)
    code = convert_source(TRACING).code
    assert "is_tracing()\n" not in code and "is_tracing() and" not in code
    assert "not False" not in code and "not True" not in code
    assert "cache = []" in code
    r = run_request(VerifyRequest(target=f"{path}::Model", inputs=("float32[2,6,8]",),
                                  float64=False))
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert any(c.startswith("output[1][1][1]") for c in r.compared), r.compared
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def test_a_float32_difference_in_numbers_only_is_decided_in_float64(monkeypatch) -> None:
    """GroupViT's "grad ...fc2.bias: jax -0.00019 vs torch 0.00024" (a gradient that cancels
    to near zero against the model's largest, 85): the sweep's float32-only pass counted float32
    rounding as a mismatch. A pass that differs in numbers only is rerun in float64, as ``verify``
    does by default: agreeing there verifies the row, differing there says so; a structure
    difference (inf) or an error is not rerun."""
    from dataclasses import replace

    from sweep_module import sweep

    from torch2jax.verify import run
    from torch2jax.verify.common import VerifyResult

    req = VerifyRequest(target="m.py::M", float64=False)
    f32 = VerifyResult(model="m", target="nnx", passed=False, max_abs_diff=5e-5,
                       grad_max_abs_diff=4e-4, mismatch="grad b: jax -1 vs torch 1")
    asked = []

    def answer(passed):
        def fake(r):
            asked.append(r.float64)
            return VerifyResult(model="m", target="nnx", passed=passed, max_abs_diff=1e-15,
                                mismatch=None if passed else "output: jax 1 vs torch 2")
        return fake

    monkeypatch.setattr(run, "run_request", answer(True))
    assert sweep.float64_decides(req, replace(f32)).passed and asked == [True]
    monkeypatch.setattr(run, "run_request", answer(False))
    r = sweep.float64_decides(req, replace(f32))
    assert not r.passed and r.mismatch == "float64 differs as well: output: jax 1 vs torch 2"
    for other in (replace(f32, max_abs_diff=float("inf")), replace(f32, error="x"),
                  replace(f32, passed=True)):
        assert sweep.float64_decides(req, other) is other
    assert asked == [True, True]


def test_a_field_left_none_and_set_later_is_an_output_field() -> None:
    """Chinese-CLIP's "output structure: ... ['text_model_output']['pooler_output']" missing on
    the JAX side: ``text_outputs.pooler_output = self.text_projection(...)`` on an output made
    with ``pooler_output=None`` is a field of transformers' output (its keys, its tuple, what
    the verifier flattens); the runtime's output added it only where it was set already."""
    import jax
    import numpy as np
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling as TorchOutput

    from torch2jax.transformers_runtime import BaseModelOutputWithPooling

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ref = TorchOutput(last_hidden_state=torch.from_numpy(x), pooler_output=None)
    ref.pooler_output = ref.last_hidden_state[:, 0] * 2
    got = BaseModelOutputWithPooling(last_hidden_state=jax.numpy.asarray(x), pooler_output=None)
    got.pooler_output = got.last_hidden_state[:, 0] * 2
    got._private = 1  # not a field
    assert list(got.keys()) == list(ref.keys()) == ["last_hidden_state", "pooler_output"]
    leaves = jax.tree_util.tree_leaves(got)
    assert len(leaves) == 2 and np.array_equal(np.asarray(leaves[1]), ref.to_tuple()[1].numpy())


def test_an_empty_dynamic_cache_keeps_sdpa_s_own_causality() -> None:
    """PaliGemma's "output['logits']: at index (0, 0, 45): jax 0.14 vs torch 0.20": its text
    config has ``use_bidirectional_attention`` (the attention's ``is_causal`` False). With no
    padding, torch's create_causal_mask gives None while the keys are as many as the queries,
    an empty DynamicCache too (the forward's use_cache=True), and sdpa then attends both ways;
    the runtime gave a causal mask once a cache was there. Both sides' mask and sdpa attention,
    with the same inputs, against each other."""
    from types import SimpleNamespace

    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import DynamicCache as TorchCache
    from transformers import LlamaConfig
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as torch_sdpa
    from transformers.masking_utils import create_causal_mask as torch_mask

    from torch2jax import transformers_runtime as rt

    config = LlamaConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                         num_key_value_heads=2)
    config._attn_implementation = "sdpa"
    q, k, v = np.random.default_rng(0).standard_normal((3, 2, 2, 5, 4)).astype(np.float32)
    embeds = np.zeros((2, 5, 8), np.float32)
    for causal in (False, True):
        module = SimpleNamespace(is_causal=causal, training=False)
        t_mask = torch_mask(config=config, inputs_embeds=torch.from_numpy(embeds),
                            attention_mask=None, cache=TorchCache(config=config))
        j_mask = rt.create_causal_mask(config, jnp.asarray(embeds), None,
                                       cache=rt.DynamicCache(config=config))
        assert t_mask is None and j_mask is None
        ref = torch_sdpa(module, *map(torch.from_numpy, (q, k, v)), t_mask)[0].numpy()
        got = rt.sdpa_attention_forward(module, *map(jnp.asarray, (q, k, v)), j_mask)[0]
        np.testing.assert_allclose(np.asarray(got), ref, atol=1e-6)


def test_a_dataclass_output_over_a_runtime_output_orders_its_own_fields_last() -> None:
    """Gradium Phonon TTS's "output structure: jax [logits, last_hidden_state, cache...] vs
    torch [logits, cache..., last_hidden_state]": a modeling file's ``@dataclass`` output adding
    a field to ``CausalLMOutputWithPast`` orders it after the parent's fields in transformers,
    whatever order the call gives; against transformers' own output."""
    from dataclasses import dataclass

    import numpy as np
    import torch
    from transformers.modeling_outputs import CausalLMOutputWithPast as TorchParent

    from torch2jax.transformers_runtime import CausalLMOutputWithPast

    @dataclass
    class TorchOut(TorchParent):
        last_hidden_state: torch.Tensor | None = None

    @dataclass
    class JaxOut(CausalLMOutputWithPast):
        last_hidden_state: np.ndarray | None = None

    values = {"loss": None, "logits": 1.0, "last_hidden_state": 2.0, "hidden_states": 3.0}
    ref = TorchOut(**{k: None if v is None else torch.tensor(v) for k, v in values.items()})
    got = JaxOut(**values)
    assert list(got.keys()) == list(ref.keys()) == ["logits", "hidden_states",
                                                    "last_hidden_state"]


def test_a_cache_layer_never_written_has_no_leaves() -> None:
    """MusicGen's "output structure: ... vs torch [..., 'output['cache']['cross_attention_cache']
    [0]['keys'], ...]": a decoder-only forward leaves its EncoderDecoderCache's cross-attention
    layers unwritten (torch makes them with keys None; the converted cache has no layer): both
    flatten to the self-attention layers' keys and values only, with the same values."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import DynamicCache, EncoderDecoderCache, LlamaConfig

    from torch2jax import transformers_runtime as rt
    from torch2jax.verify.common import flatten_output

    config = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2)
    k = np.arange(16, dtype=np.float32).reshape(1, 2, 2, 4)
    ref = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    got = rt.EncoderDecoderCache(rt.DynamicCache(config=config), rt.DynamicCache(config=config))
    for i in range(2):
        ref.self_attention_cache.update(torch.from_numpy(k + i), torch.from_numpy(k - i), i)
        got.self_attention_cache.update(jnp.asarray(k + i), jnp.asarray(k - i), i)
    t_leaves, j_leaves = flatten_output({"cache": ref}), flatten_output({"cache": got})
    assert [p for p, _ in j_leaves] == [p for p, _ in t_leaves] and len(t_leaves) == 4
    for (_, a), (_, b) in zip(j_leaves, t_leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b.numpy())


def test_a_four_dimensional_mask_is_taken_as_it_is() -> None:
    """PaliGemma's "with the mask: ... NotImplementedError: only (batch, seq) padding masks are
    translated": the model makes its (batch, 1, q, kv) mask and hands it to its text model,
    whose create_causal_mask takes a 4-D mask as it is, as torch's does (also the
    bidirectional one)."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.masking_utils import create_bidirectional_mask as torch_bidirectional
    from transformers.masking_utils import create_causal_mask as torch_mask

    from torch2jax import transformers_runtime as rt

    config = LlamaConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2)
    config._attn_implementation = "sdpa"
    mask = np.tril(np.ones((5, 5), bool))[None, None].repeat(2, 0)
    mask[1, :, :, 0] = False
    embeds = np.zeros((2, 5, 8), np.float32)
    for t_fn, j_fn, more in ((torch_mask, rt.create_causal_mask, {"cache": None}),
                             (torch_bidirectional, rt.create_bidirectional_mask, {})):
        ref = t_fn(config=config, inputs_embeds=torch.from_numpy(embeds),
                   attention_mask=torch.from_numpy(mask), **more)
        got = j_fn(config, jnp.asarray(embeds), jnp.asarray(mask), **more)
        np.testing.assert_array_equal(np.asarray(got), ref.numpy())
