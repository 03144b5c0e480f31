"""More of the transformers sweep's most common reasons (docs/transformers-sweep.md, the ninth
round), each a general rule on a module of our own in the modeling files' shape: converted,
built with torch's weights and verified against torch (outputs and every parameter's
gradient)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

WEIGHT_NORM = '''
import torch
from torch import nn


class PositionalConv(nn.Module):
    """wav2vec2's positional convolution (the newer weight_norm when torch has it, over the
    kernel axis, dim=2), EnCodec's weight_norm of a built conv (dim=0) and a Linear's over
    the whole weight (dim=None)."""

    def __init__(self, hidden=8, kernel=3, groups=2):
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, kernel_size=kernel, padding=kernel // 2,
                              groups=groups)
        weight_norm = nn.utils.weight_norm
        if hasattr(nn.utils.parametrizations, "weight_norm"):
            weight_norm = nn.utils.parametrizations.weight_norm
        self.conv = weight_norm(self.conv, name="weight", dim=2)
        self.down = nn.Conv1d(hidden, 4, kernel_size=2)
        self.down = nn.utils.weight_norm(self.down)
        self.proj = nn.utils.weight_norm(nn.Linear(4, 3), dim=None)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.conv(x)) + x
        return self.proj(self.down(y).transpose(1, 2))
'''


def _verify(tmp_path: Path, source: str, target: str, *inputs: str):
    path = tmp_path / "model.py"
    path.write_text(source)
    # the float32 pass (logits and every gradient) alone: the rules are dtype-free, CI's time
    return run_request(VerifyRequest(target=f"{path}::{target}", inputs=inputs, float64=False))


def test_weight_norm_parametrizes_the_layer_with_torchs_names(tmp_path) -> None:
    r = _verify(tmp_path, WEIGHT_NORM, "PositionalConv", "float32[2,8,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


SPLIT_BY_A_LOCAL_LIST = '''
import torch
from torch import nn


class GatedDeltaSplit(nn.Module):
    """Qwen3-Next's gated delta net: the projection split into unequal parts by a local list
    of sizes, unpacked into names, and Kimi-Linear's list repeated (a chunk size unpacked the
    same way stays one)."""

    def __init__(self, width=6, key_dim=2, value_dim=3):
        super().__init__()
        self.key_dim, self.value_dim = key_dim, value_dim
        self.proj = nn.Linear(width, 2 * key_dim + 2 * value_dim)

    def forward(self, x):
        sizes = [self.key_dim, self.key_dim, self.value_dim, self.value_dim]
        query, key, value, z = torch.split(self.proj(x), sizes, dim=-1)
        size = self.key_dim
        a, b, c, d, e = torch.split(self.proj(x), size, dim=-1)
        f, g = torch.split(self.proj(x)[..., :6], [self.value_dim] * 2, dim=-1)
        return ((query * key).sum(-1, keepdim=True) * value + z + f * g
                + (a * b + c * d).sum(-1)[..., None])
'''


def test_split_by_a_local_list_of_sizes_unpacked(tmp_path) -> None:
    r = _verify(tmp_path, SPLIT_BY_A_LOCAL_LIST, "GatedDeltaSplit", "float32[2,3,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


PATCH_SIZE_PAIR = '''
import collections.abc

import torch
from torch import nn


class PatchEmbed(nn.Module):
    """Kimi-K2.5's patch embedding: the kernel size a local made a pair where it is an int
    (a non-square pair here, so that (p, p) of the pair shows), and ViT's Iterable test."""

    def __init__(self, patch=(2, 3), image=(4, 6), hidden=5):
        super().__init__()
        self.patch, self.image = patch, image
        patch_size = self.patch if not isinstance(self.patch, int) else (self.patch, self.patch)
        self.proj = nn.Conv2d(3, hidden, kernel_size=patch_size, stride=patch_size)
        image_size = (self.image if isinstance(self.image, collections.abc.Iterable)
                      else (self.image, self.image))
        self.pool = nn.Conv2d(hidden, 2, kernel_size=image_size[0] // 2)

    def forward(self, x):
        return self.pool(self.proj(x))
'''


def test_a_kernel_size_made_a_pair_by_a_conditional(tmp_path) -> None:
    r = _verify(tmp_path, PATCH_SIZE_PAIR, "PatchEmbed", "float32[2,3,4,6]")
    assert r.error is None, r.error
    assert r.todos == 0 and r.passed, (r.mismatch, r.reason)
    assert r.grad_max_rel_diff is not None and r.grad_max_rel_diff < 1e-4


def _sweep():
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("transformers_sweep_cache",
                                                  root / "benchmarks" / "transformers_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.transformers
def test_a_cache_over_linear_attention_is_swept_with_the_cache_off() -> None:
    """Qwen3-Next's (and Qwen3.5's, whose text config holds the layers) DynamicCache over
    linear-attention layers is not translated: the sweep builds both sides with
    use_cache=False, on the config the decoder reads; Llama's cache stays on."""
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    sweep = _sweep()
    assert not sweep._cache_translated(transformers.Qwen3NextConfig(num_hidden_layers=4))
    assert sweep._cache_translated(transformers.LlamaConfig(num_hidden_layers=2))
    composite = transformers.Qwen3_5Config()
    assert not sweep._cache_translated(composite)
    namespace: dict = {}
    exec(sweep.CACHE_OFF, namespace)  # noqa: S102 (the sweep's own setup code)
    off = namespace["_sweep_cache_off"](composite)
    assert off is composite and off.use_cache is False
    assert off.get_text_config(decoder=True).use_cache is False


def test_filter_output_hidden_states_forces_them_on_a_backbone_only() -> None:
    """wav2vec2's heads wrap their forward in filter_output_hidden_states and ask for the
    hidden states themselves where they read them: the converted runtime passes the caller's
    value on (the capture of hidden states is refused), a backbone's forward still gets True."""
    from types import SimpleNamespace

    from torch2jax.transformers_backbone import BackboneMixin, filter_output_hidden_states

    class Head:
        config = SimpleNamespace(output_hidden_states=False)

        @filter_output_hidden_states
        def forward(self, **kwargs):
            return {"logits": 1, "hidden_states": kwargs["output_hidden_states"]}

    class Backbone(BackboneMixin, Head):
        def __init__(self) -> None:  # BackboneMixin's reads a backbone config
            pass

    assert Head().forward() == {"logits": 1}
    assert Head().forward(output_hidden_states=True)["hidden_states"] is True
    seen = []
    original = Head.forward.__wrapped__

    def recording(self, **kwargs):
        seen.append(kwargs["output_hidden_states"])
        return original(self, **kwargs)

    Backbone.forward = filter_output_hidden_states(recording)
    assert Backbone().forward() == {"logits": 1} and seen == [True]


@pytest.mark.transformers
def test_the_recurrent_layers_padding_mask_is_torchs() -> None:
    """Qwen3-Next's (and every linear-attention or mamba model's) create_recurrent_attention_mask:
    the padding mask's last positions, as transformers' (which also skips an all-ones mask
    outside tracing, where multiplying by it changes nothing); None for one new token."""
    pytest.importorskip("transformers", exc_type=ImportError)
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.masking_utils import create_recurrent_attention_mask as torch_mask

    from torch2jax.transformers_runtime import create_recurrent_attention_mask

    config = LlamaConfig(num_hidden_layers=1)
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    embeds = np.zeros((2, 3, 4), np.float32)
    got = create_recurrent_attention_mask(config, embeds, mask)
    want = torch_mask(config, torch.from_numpy(embeds), torch.from_numpy(mask))
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    assert create_recurrent_attention_mask(config, embeds[:, :1], mask) is None
    assert torch_mask(config, torch.from_numpy(embeds[:, :1]), torch.from_numpy(mask)) is None
    assert create_recurrent_attention_mask(config, embeds, None) is None
