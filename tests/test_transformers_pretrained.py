"""The transformers tier, past the forward pass: ``save_pretrained`` checkpoints through
``torch2jax weights`` (no torch on the way), and greedy generation with a KV cache.

Llama (untied head, written sharded too), GPT-2 (tied head, left out of the file by
``save_pretrained``) and T5 (an encoder-decoder: the head and both embeddings tied to one
table) are converted once per module, saved by transformers with random
weights, turned into orbax checkpoints by the command, restored into the converted model and
compared with torch. Skipped without transformers; marker ``transformers``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", exc_type=ImportError)

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.verify.package import convert_package_file
from torch2jax.verify.run import _convert_file

pytestmark = pytest.mark.transformers

MODELS = Path(transformers.__file__).parent / "models"
runner = CliRunner()

# family -> (modeling file, class, config class, config keywords)
FAMILIES = {
    "llama": ("llama/modeling_llama.py", "LlamaForCausalLM", "LlamaConfig",
              {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
               "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2,
               "pad_token_id": 0, "initializer_range": 0.2}),
    "gpt2": ("gpt2/modeling_gpt2.py", "GPT2LMHeadModel", "GPT2Config",
             {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 32,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
              "initializer_range": 0.2}),
}

# an encoder-decoder, saved and generated from: T5 (the head and both embeddings are the
# shared table, transformers' default for T5; save_pretrained writes shared.weight alone)
SEQ2SEQ = {
    "t5": ("t5/modeling_t5.py", "T5ForConditionalGeneration", "T5Config",
           {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2,
            "num_heads": 4, "vocab_size": 64, "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 16, "decoder_start_token_id": 0}),
}


def _import(path: Path, root: Path):
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(".".join(path.relative_to(root).with_suffix("").parts))
    finally:
        sys.path.remove(str(root))


class Family:
    """One family: torch's model with random weights, saved by save_pretrained, and the
    converted modeling file."""

    def __init__(self, name: str, tmp: Path) -> None:
        import torch

        file, self.cls, config_cls, kwargs = {**FAMILIES, **SEQ2SEQ}[name]
        self.name = name
        self.path, todos = convert_package_file(
            MODELS / file, tmp / "converted", lambda f, known: _convert_file(f, "nnx", None, known),
            {self.cls})
        assert todos == 0
        self.module = _import(self.path, tmp / "converted")
        torch_module = importlib.import_module(
            f"transformers.models.{file.split('/')[0]}.{Path(file).stem}")
        torch.manual_seed(0)
        self.config = getattr(transformers, config_cls)(**kwargs)
        self.torch_model = getattr(torch_module, self.cls)(self.config).eval()
        if name in SEQ2SEQ:
            # T5's own initialisation repeats one token at this size: weights from N(0, 2)
            with torch.no_grad():
                for key, p in self.torch_model.named_parameters():
                    if "layer_norm" not in key:
                        p.normal_(0.0, 2.0)
        self.saved = tmp / "saved"
        self.torch_model.save_pretrained(self.saved)
        self.target = f"{self.path}::{self.cls}"

    def jax_model(self, checkpoint: Path):
        """The converted model with the checkpoint's weights (orbax alone restores it)."""
        import orbax.checkpoint as ocp
        from flax import nnx

        config = type(self.config).from_pretrained(self.saved)
        abstract = nnx.eval_shape(lambda: getattr(self.module, self.cls)(config,
                                                                         rngs=nnx.Rngs(1)))
        graphdef, state = nnx.split(abstract)
        with ocp.StandardCheckpointer() as checkpointer:
            state = checkpointer.restore(checkpoint.resolve(), state)
        model = nnx.merge(graphdef, state)
        model.eval()
        return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory) -> Family:
    return Family(request.param, tmp_path_factory.mktemp(request.param))


def _weights(*args: str):
    result = runner.invoke(app, ["weights", *map(str, args)])
    assert "Traceback" not in result.output
    return result


def _logits_match(fam: Family, checkpoint: Path) -> None:
    import torch
    from jax import numpy as jnp

    model = fam.jax_model(checkpoint)
    ids = np.random.default_rng(0).integers(3, 64, (2, 7))
    mask = np.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    decoder = np.random.default_rng(1).integers(0, 64, (2, 5))
    extra = {"decoder_input_ids": decoder} if fam.name in SEQ2SEQ else {}
    with torch.no_grad():
        want = fam.torch_model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                               **{k: torch.tensor(v) for k, v in extra.items()}).logits
    got = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                           **{k: jnp.asarray(v) for k, v in extra.items()}).logits)
    want = want.numpy()
    assert np.abs(got - want).max() / np.abs(want).max() <= 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# the command in a process where torch is not installed, as far as imports can tell
WITHOUT_TORCH = """
import importlib.machinery, sys
find = importlib.machinery.PathFinder.find_spec
def hide(name, path=None, target=None):
    return None if name.split(".")[0] == "torch" else find(name, path, target)
importlib.machinery.PathFinder.find_spec = staticmethod(hide)
from torch2jax.cli import app
try:
    app(sys.argv[1:])
finally:
    print("torch imported:", "torch" in sys.modules)
"""


def test_save_pretrained_to_orbax_round_trip(family, tmp_path) -> None:
    """save_pretrained -> torch2jax weights (torch hidden) -> orbax restore: torch's logits
    (GPT-2's file has no lm_head: the tied head reads the embedding)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "weights", str(family.saved),
                          "--model", family.target, "--out", str(tmp_path / "ckpt")],
                         check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "tensors transferred" in out.stdout and "torch imported: False" in out.stdout
    _logits_match(family, tmp_path / "ckpt")


def test_sharded_checkpoint(family, tmp_path) -> None:
    """save_pretrained(max_shard_size=...) writes shards and an index: all are read."""
    sharded = tmp_path / "sharded"
    family.torch_model.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*-of-*.safetensors"))) > 2
    result = _weights(sharded, "--model", family.target, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    _logits_match(family, tmp_path / "ckpt")


def test_bfloat16_checkpoint(family, tmp_path) -> None:
    """A bfloat16 checkpoint (numpy has no bfloat16: read through safetensors.flax) fills the
    float32 model with the same values: torch's logits with the weights rounded the same."""
    import copy

    import torch

    copy.deepcopy(family.torch_model).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    result = _weights(tmp_path / "bf16", "--model", family.target, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    rounded = copy.deepcopy(family.torch_model)
    with torch.no_grad():
        for p in rounded.parameters():  # the buffers (rotary inv_freq) stay float32
            p.copy_(p.to(torch.bfloat16).float())
    reference = Family.__new__(Family)
    reference.__dict__.update(family.__dict__, torch_model=rounded)
    _logits_match(reference, tmp_path / "ckpt")


def test_bad_directories_are_one_line_errors(family, tmp_path) -> None:
    import shutil

    from safetensors.numpy import load_file, save_file

    out = tmp_path / "ckpt"
    missing = _weights(tmp_path / "nowhere", "--model", family.target, "--out", out)
    assert missing.exit_code == 2 and "no such file or directory" in missing.output

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((family.saved / "config.json").read_text())
    result = _weights(empty, "--model", family.target, "--out", out)
    assert result.exit_code == 2 and "no model.safetensors" in result.output

    renamed = tmp_path / "renamed"
    shutil.copytree(family.saved, renamed)
    arrays = load_file(renamed / "model.safetensors")
    first = min(k for k in arrays if "layers.0" in k or ".h.0." in k)
    arrays[first.replace(".0.", ".0.extra_")] = arrays.pop(first)
    save_file(arrays, renamed / "model.safetensors")
    result = _weights(renamed, "--model", family.target, "--out", out)
    assert result.exit_code == 2, result.output
    assert "does not fit the weights" in result.output and "no NNX counterpart" in result.output
    assert "receives no checkpoint tensor" in result.output

    shards = tmp_path / "shards"
    family.torch_model.save_pretrained(shards, max_shard_size="20KB")
    next(shards.glob("model-00002-*.safetensors")).unlink()
    result = _weights(shards, "--model", family.target, "--out", out)
    assert result.exit_code == 2 and "lists shards that are not in" in result.output

    both = _weights(family.saved, "--model", family.target, "--out", out,
                    "--torch-model", "x.py::X")
    assert both.exit_code == 2 and "save_pretrained directory" in both.output
    assert not out.exists()


# --- greedy generation with a StaticCache -------------------------------------------------------


@pytest.fixture(scope="module")
def generator(family):
    """The converted model with torch's weights, its forward counted (traces under jit)."""
    import functools

    from flax import nnx

    from torch2jax.weights import transfer_state_dict

    cls = getattr(family.module, family.cls)
    model = cls(type(family.config)(**FAMILIES[family.name][3]), rngs=nnx.Rngs(0))
    transfer_state_dict(family.torch_model, model, None)
    model.eval()
    traces = []
    forward = cls.__call__

    @functools.wraps(forward)
    def counted(self, *args, **kwargs):
        traces.append(kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape)
        return forward(self, *args, **kwargs)

    cls.__call__ = counted
    yield model, traces
    cls.__call__ = forward


def _torch_generate(family, ids, mask, **kwargs):
    import torch

    with torch.no_grad():
        return family.torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                           do_sample=False, **kwargs).numpy()


@pytest.mark.parametrize("prompt", [1, 7])
def test_greedy_generation_matches_torch(family, generator, prompt) -> None:
    """model.generate of the converted model (a StaticCache, one lax.while_loop step compiled
    once) gives torch's generate(do_sample=False) tokens: batch 2, the first row left-padded
    when the prompt has room for it."""
    from jax import numpy as jnp

    model, traces = generator
    rng = np.random.default_rng(prompt)
    ids = rng.integers(3, 64, (2, prompt))
    mask = np.ones((2, prompt), np.int64)
    if prompt > 1:
        mask[0, :3], ids[0, :3] = 0, 0
    want = _torch_generate(family, ids, mask, max_new_tokens=12, eos_token_id=None)
    assert want.shape == (2, prompt + 12)
    assert len(set(want[:, prompt:].ravel())) > 3  # not one token repeated
    del traces[:]
    got = np.asarray(model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                    max_new_tokens=12, eos_token_id=[]))
    np.testing.assert_array_equal(got, want)
    # traced twice: the prompt, and the decoding step that serves all 11 other tokens
    assert traces == [(2, prompt), (2, 1)]
    again = model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                           max_new_tokens=12, eos_token_id=[])
    assert traces == [(2, prompt), (2, 1)]  # compiled once: the same shapes trace nothing
    np.testing.assert_array_equal(np.asarray(again), want)


def test_generation_stops_at_the_end_token(family, generator) -> None:
    """A row that produces the end token is padded from there (pad_token_id), and decoding
    stops when every row has ended, as torch's generate does."""
    from jax import numpy as jnp

    model, _ = generator
    ids = np.random.default_rng(7).integers(3, 64, (2, 5))
    mask = np.ones((2, 5), np.int64)
    free = _torch_generate(family, ids, mask, max_new_tokens=10, eos_token_id=None)[:, 5:]
    # an end token that the first row reaches early and the second late, or never
    eos = int(next(t for t in free[0, 1:] if t not in free[1, :3]))
    want = _torch_generate(family, ids, mask, max_new_tokens=10, eos_token_id=eos,
                           pad_token_id=0)
    got = np.asarray(model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                    max_new_tokens=10, eos_token_id=eos, pad_token_id=0))
    assert (want[0, 5:] == 0).any()  # the first row ended and was padded
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    assert (got[:, want.shape[1]:] == 0).all()  # torch stopped where every row had ended



def _manual_loop_matches_torch(torch_model, model) -> None:
    """A manual decoding loop on a default config (use_cache=True): the forward returns a
    DynamicCache (a pytree) that the next call takes back; logits at every step and the
    cache's keys and values equal torch's (a sliding-window layer keeps the window's last
    keys, as torch's does)."""
    import torch
    from jax import numpy as jnp

    ids = np.random.default_rng(3).integers(3, 64, (2, 6))
    mask = np.ones((2, 6), np.int64)
    mask[0, :2] = 0
    with torch.no_grad():
        t_out = torch_model(torch.tensor(ids), attention_mask=torch.tensor(mask))
    j_out = model(jnp.asarray(ids), attention_mask=jnp.asarray(mask))
    assert type(j_out.cache).__name__ == "DynamicCache"
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(j_out.logits), t_out.logits.numpy(), rtol=1e-4,
                                   atol=1e-5)
        token = t_out.logits[:, -1].argmax(-1, keepdim=True).numpy()
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        with torch.no_grad():
            t_out = torch_model(torch.tensor(token), attention_mask=torch.tensor(mask),
                                cache=t_out.cache)
        j_out = model(jnp.asarray(token), attention_mask=jnp.asarray(mask), cache=j_out.cache)
    np.testing.assert_allclose(np.asarray(j_out.logits), t_out.logits.numpy(), rtol=1e-4,
                               atol=1e-5)
    assert len(j_out.cache.layers) == len(t_out.cache.layers)
    for jl, tl in zip(j_out.cache.layers, t_out.cache.layers, strict=True):
        assert jl.keys.shape == tuple(tl.keys.shape)
        np.testing.assert_allclose(np.asarray(jl.keys), tl.keys.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(jl.values), tl.values.numpy(), rtol=1e-4,
                                   atol=1e-5)


def test_manual_decoding_loop_with_the_returned_cache_matches_torch(family, generator) -> None:
    """Llama and GPT-2 from their default use_cache=True: see _manual_loop_matches_torch."""
    model, _ = generator
    assert family.config.use_cache
    _manual_loop_matches_torch(family.torch_model, model)


SAMPLINGS = [{}, {"temperature": 0.7, "top_k": 5}, {"top_k": 0, "top_p": 0.8},
             {"temperature": 1.3, "top_k": 20, "top_p": 0.9}]


@pytest.mark.parametrize("settings", SAMPLINGS, ids=lambda s: ",".join(
    f"{k}={v}" for k, v in s.items()) or "defaults")
def test_sampled_generation_matches_torch_under_forced_draws(family, generator, settings,
                                                             monkeypatch) -> None:
    """generate(do_sample=True, key=...) draws token i of a row with the uniform
    ``sample_uniforms(key, batch, n)[row, i]`` by inverse CDF of the processed distribution
    (temperature, top-k, top-p in transformers' order; transformers' default top_k=50 where
    none is given). torch's generate, with torch.multinomial made to draw by the same rule
    from the same uniforms, gives the same tokens: the processed distributions are torch's.
    Compiled once: another key traces nothing and gives other tokens."""
    import jax
    import torch
    from jax import numpy as jnp

    model, traces = generator
    support = importlib.import_module(next(
        c for c in type(model).__mro__ if c.__name__ == "GenerationMixin").__module__)
    rng = np.random.default_rng(11)
    ids = rng.integers(3, 64, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[0, :2], ids[0, :2] = 0, 0
    key = jax.random.key(5)
    uniforms = np.asarray(support.sample_uniforms(key, 2, 10))
    step = iter(range(10))

    def multinomial(probs, num_samples):  # the inverse CDF of the same uniforms
        assert num_samples == 1
        u = torch.tensor(uniforms[:, next(step)], dtype=probs.dtype)
        cdf = probs.cumsum(-1)
        return (cdf <= u[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)[:, None]

    monkeypatch.setattr(torch, "multinomial", multinomial)
    with torch.no_grad():
        want = family.torch_model.generate(
            torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=True,
            max_new_tokens=10, eos_token_id=2, pad_token_id=0, **settings).numpy()
    del traces[:]
    got = np.asarray(model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                    do_sample=True, key=key, max_new_tokens=10,
                                    eos_token_id=2, pad_token_id=0, **settings))
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    assert (got[:, want.shape[1]:] == 0).all()
    assert len(set(got[:, 7:].ravel())) > 3  # sampled, not one token repeated
    assert traces == [(2, 7), (2, 1)]  # the prompt, and one decoding step for every token
    other = np.asarray(model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                      do_sample=True, key=jax.random.key(6), max_new_tokens=10,
                                      eos_token_id=2, pad_token_id=0, **settings))
    assert traces == [(2, 7), (2, 1)]  # compiled once
    assert (other != got).any()


def test_sampling_needs_an_explicit_key(generator) -> None:
    from jax import numpy as jnp

    model, _ = generator
    with pytest.raises(ValueError, match="key=jax.random.key"):
        model.generate(jnp.ones((1, 3), jnp.int32), do_sample=True, max_new_tokens=2)


# more decoders, generation only: a window over the cache's slots (Mistral: 4 of 19 slots),
# softcapping and eager attention (Gemma 2), sliding and full layers mixed (Gemma 3)
DECODERS = {
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 4}),
    # untied: with the tied table every row repeats its last prompt token at this size
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",
               {"sliding_window": 4, "head_dim": 8, "tie_word_embeddings": False}),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig",
               {"sliding_window": 4, "head_dim": 8, "tie_word_embeddings": False,
                "layer_types": ["sliding_attention", "full_attention"]}),
}
_SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64,
          "pad_token_id": 0, "initializer_range": 0.2}


@pytest.mark.parametrize("name", list(DECODERS))
def test_more_decoders_generate_like_torch(name, tmp_path_factory) -> None:
    """Left-padded greedy generation of other decoder families: torch's tokens; and a manual
    decoding loop through the DynamicCache the forward returns (sliding-window layers)."""
    import torch
    from flax import nnx
    from jax import numpy as jnp

    from torch2jax.weights import transfer_state_dict

    cls, config_cls, extra = DECODERS[name]
    out = tmp_path_factory.mktemp(name)
    path, todos = convert_package_file(
        MODELS / name / f"modeling_{name}.py", out,
        lambda f, known: _convert_file(f, "nnx", None, known), {cls})
    assert todos == 0
    module = _import(path, out)
    torch_module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    config_module = importlib.import_module(f"transformers.models.{name}.configuration_{name}")

    def config():
        return getattr(config_module, config_cls)(**{**_SMALL, **extra})

    torch.manual_seed(0)
    torch_model = getattr(torch_module, cls)(config()).eval()
    model = getattr(module, cls)(config(), rngs=nnx.Rngs(0))
    transfer_state_dict(torch_model, model, None)
    model.eval()
    ids = np.random.default_rng(3).integers(3, 64, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[0, :3], ids[0, :3] = 0, 0
    with torch.no_grad():
        want = torch_model.generate(torch.tensor(ids), attention_mask=torch.tensor(mask),
                                    do_sample=False, max_new_tokens=12,
                                    eos_token_id=None).numpy()
    assert len(set(want[:, 7:].ravel())) > 3
    got = model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask), max_new_tokens=12,
                         eos_token_id=[])
    np.testing.assert_array_equal(np.asarray(got), want)
    # the sliding windows of a DynamicCache: a manual loop past the window of 4
    _manual_loop_matches_torch(torch_model, model)


# --- an encoder-decoder: T5 ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def t5(tmp_path_factory) -> Family:
    return Family("t5", tmp_path_factory.mktemp("t5"))


@pytest.mark.slow
def test_t5_save_pretrained_round_trip(t5, tmp_path) -> None:
    """T5's directory holds shared.weight alone (the encoder's and decoder's embeddings and
    the head are tied to it): the command fills all three, torch's logits come back (the
    command without torch: the Llama and GPT-2 round trips)."""
    from safetensors.numpy import load_file

    saved = load_file(t5.saved / "model.safetensors")
    assert "shared.weight" in saved and "lm_head.weight" not in saved
    assert "encoder.embed_tokens.weight" not in saved
    result = _weights(t5.saved, "--model", t5.target, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert f"{len(saved)} tensors transferred" in result.output
    _logits_match(t5, tmp_path / "ckpt")


@pytest.fixture(scope="module")
def t5_generator(t5):
    """The converted T5 with torch's weights, its forward's traces counted."""
    import functools

    from flax import nnx

    from torch2jax.weights import transfer_state_dict

    cls = getattr(t5.module, t5.cls)
    model = cls(type(t5.config)(**SEQ2SEQ["t5"][3]), rngs=nnx.Rngs(0))
    transfer_state_dict(t5.torch_model, model, None)
    model.eval()
    traces = []
    forward = cls.__call__

    @functools.wraps(forward)
    def counted(self, *args, **kwargs):
        traces.append(kwargs["decoder_input_ids"].shape)
        return forward(self, *args, **kwargs)

    cls.__call__ = counted
    yield model, traces
    cls.__call__ = forward


@pytest.mark.slow
@pytest.mark.parametrize("source", [1, 7])
def test_t5_greedy_generation_matches_torch(t5, t5_generator, source) -> None:
    """Encoder-decoder greedy decoding: the encoder once, the decoder from
    decoder_start_token_id with a StaticCache for its self-attention and the cross-attention
    keys/values computed at the first step; torch's generate(do_sample=False) tokens, batch 2,
    the first row's source padded (length 4 of 7)."""
    from jax import numpy as jnp

    model, traces = t5_generator
    rng = np.random.default_rng(source)
    ids = rng.integers(2, 64, (2, source))
    mask = np.ones((2, source), np.int64)
    if source > 1:
        mask[0, 4:], ids[0, 4:] = 0, 0
    want = _torch_generate(t5, ids, mask, max_new_tokens=8, eos_token_id=None)
    assert want.shape == (2, 1 + 8) and (want[:, 0] == 0).all()  # the start token, then 8
    assert len(set(want[:, 1:].ravel())) >= 3  # not one token repeated
    del traces[:]
    got = np.asarray(model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                                    max_new_tokens=8, eos_token_id=[]))
    np.testing.assert_array_equal(got, want)
    # traced twice: the first step (it computes the cross-attention keys and values) and
    # the loop step that serves the other 7 tokens; the same shapes again trace nothing
    assert traces == [(2, 1), (2, 1)]
    again = model.generate(jnp.asarray(ids), attention_mask=jnp.asarray(mask),
                           max_new_tokens=8, eos_token_id=[])
    assert traces == [(2, 1), (2, 1)]
    np.testing.assert_array_equal(np.asarray(again), want)
