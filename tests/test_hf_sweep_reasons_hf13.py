"""The transformers sweep's build-time reasons of the twelfth round (docs/transformers-sweep.md),
each checked against torch: a rule of the support module (transformers' machinery in JAX) on
transformers' own torch class, or a general rule on a module of our own in the modeling files'
shape, converted, built with torch's weights and verified."""

from __future__ import annotations

import numpy as np
import pytest


def test_xielu_is_a_module_with_torchs_parameters_and_formula() -> None:
    """Apertus' ``ACT2CLS["xielu"](dtype=config.dtype)`` (and ``ACT2FN["xielu"]``): a module
    holding torch's parameters (``alpha_p``, ``alpha_n``) and buffers (``beta``, ``eps``);
    with torch's values copied in, its output and its gradients (of the input and of both
    parameters) are torch's, on both sides of zero and below ``eps``."""
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from torch2jax import transformers_runtime as runtime

    torch_act = activations.ACT2CLS["xielu"](dtype=torch.float32)
    with torch.no_grad():  # away from the initial values, so that a swapped pair shows
        torch_act.alpha_p.copy_(torch.tensor([0.3]))
        torch_act.alpha_n.copy_(torch.tensor([-0.7]))
    x = torch.linspace(-4.0, 3.0, 29).reshape(29, 1) * torch.tensor([1.0, 0.5, 1e-7])
    x.requires_grad_(True)
    out = torch_act(x)
    out.pow(2).sum().backward()

    assert "xielu" in runtime.ACT2FN and "xielu" in runtime.ACT2CLS
    act = runtime.ACT2CLS["xielu"](dtype=torch.float32)
    assert isinstance(runtime.ACT2FN["xielu"], nnx.Module)
    state = dict(torch_act.state_dict())
    assert set(state) == {"alpha_p", "alpha_n", "beta", "eps"}
    for name, value in state.items():
        variable = getattr(act, name)
        assert variable[...].shape == tuple(value.shape) and variable[...].dtype == jnp.float32
        variable[...] = jnp.asarray(value.detach().numpy())

    def loss(module, xs):
        return jnp.sum(module(xs) ** 2)

    xs = jnp.asarray(x.detach().numpy())
    np.testing.assert_allclose(np.asarray(act(xs)), out.detach().numpy(), rtol=1e-5, atol=1e-6)
    grads, grad_x = jax.grad(loss, argnums=(0, 1))(act, xs)
    np.testing.assert_allclose(np.asarray(grad_x), x.grad.numpy(), rtol=1e-5, atol=1e-6)
    for name in ("alpha_p", "alpha_n"):
        np.testing.assert_allclose(np.asarray(getattr(grads, name)[...]),
                                   getattr(torch_act, name).grad.numpy(), rtol=1e-5)
    # the default (transformers': bfloat16) and a dtype named by a string
    assert runtime.ACT2FN["xielu"].alpha_p[...].dtype == jnp.bfloat16
    assert runtime.ACT2CLS["xielu"](dtype="float32").beta[...].dtype == jnp.float32
