"""transformers' activations (``transformers.activations``: ``ACT2FN``, ``ACT2CLS``) in JAX,
for modeling files converted by torch2jax: written as it is beside the support module
``_hf_support.py`` (transformers_runtime.py, which re-exports these names) as
``_hf_activations.py``. Needs jax and flax only; the converter itself never imports it. An
activation that is not translated raises NotImplementedError when it is looked up."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special
from flax import nnx


def _gelu_tanh(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=True)


def _gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


def _quick_gelu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(1.702 * x)


def _relu2(x: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(x))


def _gelu_10(x: jax.Array) -> jax.Array:
    return jnp.clip(_gelu(x), -10.0, 10.0)


def _laplace(x: jax.Array, mu: float = 0.707107, sigma: float = 0.282095) -> jax.Array:
    return 0.5 * (1.0 + jax.scipy.special.erf((x - mu) / (sigma * math.sqrt(2.0))))


def _sqrt_softplus(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jax.nn.softplus(x))


def _dtype(dtype: Any) -> Any:
    """A torch dtype (``torch.bfloat16``), its name or a JAX dtype as JAX's (None: float32)."""
    if dtype is None:
        return jnp.float32
    if isinstance(dtype, str) or type(dtype).__module__.startswith("torch"):
        return jnp.dtype(str(dtype).rpartition(".")[2])
    return jnp.dtype(dtype)


class XIELUActivation(nnx.Module):
    """transformers' xIELU (arXiv 2411.13010, Apertus): a learned activation, its two
    parameters stored through the inverse of softplus (torch's names, ``alpha_p`` and
    ``alpha_n``, shape (1,)) and ``beta``, ``eps`` buffers; torch's Python formula (its CUDA
    kernel computes the same)."""

    def __init__(self, alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5,
                 eps: float = -1e-6, dtype: Any = "bfloat16", with_vector_loads: bool = False,
                 ) -> None:
        dtype = _dtype(dtype)

        def inverse_softplus(v: float) -> jax.Array:
            return jnp.log(jnp.expm1(jnp.asarray(v, dtype)))[None]
        self.alpha_p = nnx.Param(inverse_softplus(alpha_p_init))
        self.alpha_n = nnx.Param(inverse_softplus(alpha_n_init - beta))
        self.beta = nnx.Variable(jnp.asarray(beta, dtype))
        self.eps = nnx.Variable(jnp.asarray(eps, dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        beta = self.beta[...]
        alpha_p = jax.nn.softplus(self.alpha_p[...])
        alpha_n = beta + jax.nn.softplus(self.alpha_n[...])
        return jnp.where(x > 0, alpha_p * x * x + beta * x,
                         (jnp.expm1(jnp.minimum(x, self.eps[...])) - x) * alpha_n + beta * x)


# the activations that hold parameters: a new module at each look-up, as transformers' are
_MODULES: dict[str, Callable[..., nnx.Module]] = {"xielu": XIELUActivation}


class _Activations(dict):
    def __getitem__(self, name: str) -> Callable[[jax.Array], jax.Array]:
        if name in _MODULES:
            return _MODULES[name]()
        if name not in self:
            raise NotImplementedError(f"activation {name!r} is not translated to JAX "
                                      f"(known: {', '.join(sorted([*self, *_MODULES]))})")
        return dict.__getitem__(self, name)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in _MODULES


ACT2FN = _Activations({
    "gelu": _gelu, "gelu_python": _gelu, "gelu_new": _gelu_tanh, "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh, "quick_gelu": _quick_gelu, "relu": jax.nn.relu,
    "relu2": _relu2, "relu6": jax.nn.relu6, "sigmoid": jax.nn.sigmoid, "silu": jax.nn.silu,
    "swish": jax.nn.silu, "tanh": jnp.tanh, "mish": jax.nn.mish,
    "leaky_relu": jax.nn.leaky_relu, "linear": lambda x: x,
    "gelu_accurate": _gelu_tanh, "gelu_python_tanh": _gelu_tanh, "gelu_10": _gelu_10,
    "hardswish": jax.nn.hard_swish, "laplace": _laplace, "sqrtsoftplus": _sqrt_softplus,
})


# transformers.activations' module-level functions (ACT2FN's entries)
gelu = gelu_python = _gelu
gelu_new = gelu_fast = gelu_pytorch_tanh = _gelu_tanh
quick_gelu, silu, mish = _quick_gelu, jax.nn.silu, jax.nn.mish


class _ActivationClasses(dict):
    """transformers' ACT2CLS: ``ACT2CLS[name]()`` is the activation (ACT2FN's function here);
    keywords of a function (a ClippedGELU's bounds) are not translated, so refused; an
    activation with parameters (xIELU) is its module's class, built with the keywords."""

    def __getitem__(self, name: str) -> Callable[..., Callable[[jax.Array], jax.Array]]:
        if name in _MODULES:
            return _MODULES[name]
        function = ACT2FN[name]

        def build(**kwargs: Any) -> Callable[[jax.Array], jax.Array]:
            if kwargs:
                raise NotImplementedError(f"ACT2CLS[{name!r}] with {sorted(kwargs)} is not "
                                          "translated to JAX")
            return function
        return build

    def __contains__(self, name: object) -> bool:
        return name in ACT2FN or name in _MODULES


ACT2CLS = _ActivationClasses()


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    return ACT2FN[name]
