"""The support module of converted modeling files (torch2jax/transformers_runtime.py, written
as ``_hf_support.py``) against transformers' own machinery: the attention implementation it
writes into the config, and the masks, compared with transformers' mask functions."""

from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)
torch = pytest.importorskip("torch")
pytest.importorskip("flax.nnx")

from jax import numpy as jnp
from transformers import masking_utils

from torch2jax import transformers_runtime as rt

pytestmark = pytest.mark.transformers


@pytest.mark.parametrize(("supports_sdpa", "given", "want"), [
    (True, None, "sdpa"), (False, None, "eager"), (True, "eager", "eager")])
def test_the_attention_implementation_is_written_into_the_config(supports_sdpa, given,
                                                                  want) -> None:
    """As transformers does when it builds a model: a file may read the name itself
    (Falcon's ``FALCON_ATTENTION_CLASSES[config._attn_implementation]``: before, None there,
    a KeyError)."""
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=8)
    if given is not None:
        config._attn_implementation = given
    model = type("Model", (rt.PreTrainedModel,), {"_supports_sdpa": supports_sdpa})(config)
    assert model.config._attn_implementation == want
    torch_model = transformers.LlamaModel(transformers.LlamaConfig(
        hidden_size=8, num_attention_heads=2, vocab_size=8, num_hidden_layers=1))
    assert torch_model.config._attn_implementation == "sdpa"  # what transformers writes


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("masked", [False, True])
def test_bidirectional_sliding_window_mask_matches_transformers(implementation, masked) -> None:
    """ModernBERT's local attention: each query sees the keys at most ``sliding_window``
    positions away on either side, and not the padding."""
    config = transformers.ModernBertConfig(local_attention=4)  # sliding_window 2
    config._attn_implementation = implementation
    embeds = np.zeros((2, 7, 4), np.float32)
    mask = np.random.default_rng(0).integers(0, 2, (2, 7)) if masked else None
    want = masking_utils.create_bidirectional_sliding_window_mask(
        config=config, inputs_embeds=torch.from_numpy(embeds),
        attention_mask=None if mask is None else torch.from_numpy(mask),
        allow_is_bidirectional_skip=False)
    got = rt.create_bidirectional_sliding_window_mask(
        config, jnp.asarray(embeds), None if mask is None else jnp.asarray(mask))
    got = np.asarray(got)
    if implementation == "sdpa":
        assert got.dtype == bool and (got == want.numpy()).all()
    else:
        np.testing.assert_array_equal(got, want.numpy())
    assert not got[..., 0, 3:].any() if implementation == "sdpa" else (got[..., 0, 3:] < 0).all()


@pytest.mark.parametrize("window", [None, 2])
def test_the_mask_reads_the_cache_by_its_previous_keyword(window) -> None:
    """transformers before 5.24 passes the cache as ``past_key_values=`` (5.24:
    ``cache=``): a modeling file of 5.23 gave the mask function no cache, whose queries then
    sat at the start, not after the kept keys (no error: a silently different mask)."""
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=8,
                                      num_hidden_layers=1, sliding_window=window)
    config._attn_implementation = "eager"
    cache = rt.DynamicCache(config=config)
    cache.update(jnp.ones((2, 2, 3, 4)), jnp.ones((2, 2, 3, 4)), 0)
    embeds, mask = jnp.zeros((2, 2, 8)), jnp.ones((2, 5), jnp.int32)
    make = rt.create_causal_mask if window is None else rt.create_sliding_window_causal_mask
    want = np.asarray(make(config, embeds, mask, cache=cache))
    got = np.asarray(make(config, embeds, mask, past_key_values=cache))
    kept = 3 if window is None else window - 1
    assert want.shape[-1] == kept + 2 and (want[..., 0, :kept] == 0).all()  # the kept keys
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_block_sequence_ids_overlay_the_causal_mask(implementation, window, masked) -> None:
    """GIT's image tokens see each other both ways (``block_sequence_ids``: 0 for the image,
    -1 for the text), the text stays causal. The mask functions dropped the keyword: the image
    tokens were causal, and the logits of GIT 1.8e-3 off torch's, unmarked."""
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=8,
                                      sliding_window=window)
    config._attn_implementation = implementation
    embeds = np.zeros((2, 7, 8), np.float32)
    blocks = np.array([[0, 0, 0, 0, -1, -1, -1], [0, 0, 0, -1, -1, -1, -1]])
    mask = np.array([[1] * 7, [1, 1, 1, 0, 1, 1, 1]]) if masked else None
    make = (masking_utils.create_causal_mask, rt.create_causal_mask) if window is None else (
        masking_utils.create_sliding_window_causal_mask, rt.create_sliding_window_causal_mask)
    want = make[0](config=config, inputs_embeds=torch.from_numpy(embeds),
                   attention_mask=None if mask is None else torch.from_numpy(mask), cache=None,
                   block_sequence_ids=torch.from_numpy(blocks), allow_is_causal_skip=False)
    got = np.asarray(make[1](config, jnp.asarray(embeds), None if mask is None else
                             jnp.asarray(mask), block_sequence_ids=jnp.asarray(blocks)))
    np.testing.assert_array_equal(got, want.numpy())
    first = got[0, 0, 0, :4] if implementation == "sdpa" else got[0, 0, 0, :4] == 0
    assert first.all()  # the first image token sees the last one


def test_an_untranslated_mask_keyword_raises() -> None:
    config = transformers.LlamaConfig(hidden_size=8, num_attention_heads=2, vocab_size=8)
    with pytest.raises(NotImplementedError, match="or_mask_function"):
        rt.create_causal_mask(config, jnp.zeros((1, 3, 8)), None,
                              or_mask_function=lambda *a: True)
