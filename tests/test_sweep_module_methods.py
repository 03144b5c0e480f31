"""Torch module methods that set a parameter, as transformers' modeling files write them
(docs/transformers-sweep.md: "a torch module method or attribute on an NNX module"):
SuperGlue's ``self.register_parameter("bin_score", bin_score)``, EoMT-DINOv3's
``self.embeddings.register_parameter("mask_token", None)``, ConvBERT's
``self.depthwise.weight.data.normal_(mean=0.0, std=...)`` and Granite Speech's
``self.query.data.normal_(...)``; Falcon's ``class FalconLinear(nn.Linear)`` whose forward
reads ``self.weight.T``; the MoE routers' ``group_mask.scatter_(1, group_idx, 1)``; and
GPT-Neo's ``torch.bitwise_xor`` of two masks. They stayed as they were on the NNX module and failed when
the model was built; each is now the form torch means (passes/module_methods.py). A module of
our own in that shape, reduced and converted as the sweep does, built with its draws, then run
against torch with torch's weights: outputs and every parameter's gradient."""

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

from ...activations import ACT2FN


class Embeddings(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))

    def forward(self, x):
        return self.proj(x)


class FalconLinear(nn.Linear):
    """Falcon's linear layer: the weight read by the subclass's own forward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        hidden_states = input @ self.weight.T
        if self.bias is None:
            return hidden_states
        return hidden_states + self.bias


class Matcher(nn.Module):
    """A learned score (registered by name), an unused mask token dropped (registered as None),
    weights and a query drawn in place through ``.data``."""

    def __init__(self, width=8, queries=64, initializer_range=0.02, positions=5, window=2):
        super().__init__()
        # GPT-Neo's local attention: the causal mask less what lies a window back
        local = torch.tril(torch.ones((positions, positions), dtype=torch.bool))
        local = torch.bitwise_xor(local, torch.tril(local, -window))
        self.local = nn.Buffer(local, persistent=False)
        self.embeddings = Embeddings(width)
        self.embeddings.register_parameter("mask_token", None)
        self.depthwise = nn.Conv1d(width, width, 3, padding=1, groups=width, bias=False)
        self.pointwise = nn.Conv1d(width, width, 1)
        self.depthwise.weight.data.normal_(mean=0.0, std=initializer_range)
        self.pointwise.weight.data.normal_(mean=0.0, std=initializer_range)
        self.pointwise.bias.data.zero_()
        self.query = nn.Parameter(torch.empty(1, queries, width))
        self.query.data.normal_(mean=0.0, std=1.0)
        bin_score = nn.Parameter(torch.tensor(1.0))
        self.register_parameter("bin_score", bin_score)
        self.act = ACT2FN["gelu"]
        self.head = FalconLinear(4, 3, bias=False)
        self.head_bias = FalconLinear(4, 3)

    def forward(self, x):
        h = (self.local.float() @ self.embeddings(x)).transpose(1, 2)
        h = self.pointwise(self.depthwise(h)).transpose(1, 2)
        scores = h @ self.query[0, :4].transpose(0, 1)
        scores = self.act(scores) * self.bin_score
        out = self.head(scores) + self.head_bias(scores)
        # the MoE routers' one-hot masks: written in place, and on a tensor made on the spot
        top = out.argmax(-1, keepdim=True)
        mask = torch.zeros_like(out)
        mask.scatter_(2, top, 1)
        hard = torch.zeros_like(out).scatter_(-1, top, 2.0)
        return out + hard * mask
'''

NAME = "transformers.models.matcher.modeling_matcher"


def _modules(tmp_path: Path):
    pytest.importorskip("transformers", exc_type=ImportError)
    from torch2jax.convert import convert_source
    from torch2jax.hf import reduce_modeling, write_support_modules

    torch_space: dict = {"__name__": NAME, "__package__": NAME.rpartition(".")[0]}
    exec(compile(MODELING, "torch_matcher", "exec"), torch_space)  # noqa: S102
    reduced, unknown = reduce_modeling(MODELING, NAME)
    assert unknown == []
    result = convert_source(reduced)
    assert "TODO(torch2jax)" not in result.code, result.code
    assert ".register_parameter(" not in result.code and ".data." not in result.code
    package = tmp_path / "t2j_module_methods"
    (package / "models" / "matcher").mkdir(parents=True)
    for folder in (package, package / "models", package / "models" / "matcher"):
        (folder / "__init__.py").write_text("")
    write_support_modules(package)
    (package / "models" / "matcher" / "modeling_matcher.py").write_text(result.code)
    sys.path.insert(0, str(tmp_path))
    try:
        return torch_space, importlib.import_module(
            "t2j_module_methods.models.matcher.modeling_matcher")
    finally:
        sys.path.remove(str(tmp_path))


def test_module_methods_that_set_parameters_convert_and_match_torch(tmp_path) -> None:
    import jax.numpy as jnp
    import torch
    from flax import nnx

    torch_space, jax_module = _modules(tmp_path)
    torch.manual_seed(0)
    torch_model = torch_space["Matcher"]()
    jax_model = jax_module.Matcher(rngs=nnx.Rngs(0))

    # what the constructor draws: the same distributions as torch's (512 query values from
    # N(0, 1), the convolutions' weights from N(0, 0.02)), the bias zero, the mask token gone
    query = np.asarray(jax_model.query.value)
    assert query.shape == (1, 64, 8)
    assert abs(query.mean()) < 0.15 and 0.85 < query.std() < 1.15
    kernel = np.asarray(jax_model.depthwise.kernel.value)
    assert 0.005 < kernel.std() < 0.04
    assert not np.asarray(jax_model.pointwise.bias.value).any()
    assert jax_model.embeddings.mask_token is None and torch_model.embeddings.mask_token is None
    assert float(jax_model.bin_score.value) == 1.0
    np.testing.assert_array_equal(np.asarray(jax_model.local.value), torch_model.local.numpy())

    # torch's weights in the JAX model: outputs and gradients
    t = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    assert "embeddings.mask_token" not in t
    jax_model.embeddings.proj.kernel.value = jnp.asarray(t["embeddings.proj.weight"].T)
    jax_model.embeddings.proj.bias.value = jnp.asarray(t["embeddings.proj.bias"])
    jax_model.depthwise.kernel.value = jnp.asarray(t["depthwise.weight"].transpose(2, 1, 0))
    jax_model.pointwise.kernel.value = jnp.asarray(t["pointwise.weight"].transpose(2, 1, 0))
    jax_model.pointwise.bias.value = jnp.asarray(t["pointwise.bias"])
    jax_model.query.value = jnp.asarray(t["query"])
    assert jax_model.head.bias is None
    jax_model.head.kernel.value = jnp.asarray(t["head.weight"].T)
    jax_model.head_bias.kernel.value = jnp.asarray(t["head_bias.weight"].T)
    jax_model.head_bias.bias.value = jnp.asarray(t["head_bias.bias"])
    with torch.no_grad():
        torch_model.bin_score.fill_(0.7)
    jax_model.bin_score.value = jnp.asarray(0.7)
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    out = torch_model(torch.from_numpy(x))
    out.square().sum().backward()
    np.testing.assert_allclose(np.asarray(jax_model(jnp.asarray(x))), out.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
    grads = nnx.grad(lambda mdl: jnp.sum(jnp.square(mdl(jnp.asarray(x)))))(jax_model)
    np.testing.assert_allclose(float(grads.bin_score.value), float(torch_model.bin_score.grad),
                               rtol=1e-4)
    np.testing.assert_allclose(np.asarray(grads.query.value), torch_model.query.grad.numpy(),
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grads.head.kernel.value),
                               torch_model.head.weight.grad.numpy().T, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grads.head_bias.bias.value),
                               torch_model.head_bias.bias.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grads.depthwise.kernel.value),
                               torch_model.depthwise.weight.grad.numpy().transpose(2, 1, 0),
                               rtol=1e-4, atol=1e-6)
