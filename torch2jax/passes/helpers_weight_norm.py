"""torch's weight normalisation of a converted layer (``nn.utils.weight_norm`` and
``nn.utils.parametrizations.weight_norm``, rules/functions.toml): helpers written into the
converted file (NNX only) that give an ``nnx.Linear`` or ``nnx.Conv`` (or a subclass: the
``Conv1d`` helper) torch's parameters of the parametrization, by torch's names and in torch's
layout (``weight_g`` / ``weight_v``, or ``parametrizations.weight.original0`` / ``original1``),
so that a state dict transfers as it is, and compute the layer's kernel from them in each
forward pass, as torch does. Registered in passes/helper_registry.py's table, written in by
passes/helpers.py."""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

helper("weight_norm_weight", {"jax", "jnp"}, '''
def weight_norm_weight(v: jax.Array, g: jax.Array, dim: int) -> jax.Array:
    """torch._weight_norm: v scaled to the norm g over every axis but dim (dim -1: the norm
    of the whole of v, g a scalar)."""
    if dim == -1:
        return v * (g / jnp.sqrt(jnp.sum(v * v)))
    axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
    return v * (g / jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=True)))
''', targets=("nnx",))

helper("WeightNormParametrization", {"jax", "nnx"}, '''
class WeightNormParametrization(nnx.Module):
    """torch's parametrizations.weight of weight_norm: original0 the norm g, original1 the
    direction v (torch's layout)."""

    def __init__(self, g: jax.Array, v: jax.Array) -> None:
        self.original0 = nnx.Param(g)
        self.original1 = nnx.Param(v)
''', targets=("nnx",))

helper("WeightNormKernel", {"nnx"}, '''
class WeightNormKernel(nnx.Variable):
    """The kernel a weight-normalised layer computes from its parameters in each forward pass
    (torch's module.weight under weight_norm): state, not a parameter."""
''', targets=("nnx",))

helper("weight_normed", {"Any", "jax", "jnp", "nnx"}, '''
_WEIGHT_NORMED_CLASSES: dict[type, type] = {}


def weight_normed(module: Any, name: str, dim: int | None, parametrized: bool) -> Any:
    """``module`` (an nnx.Linear or nnx.Conv, or a subclass) with its kernel computed in each
    call from torch's weight-norm parameters: g, the norm of the weight over every axis but
    ``dim`` (None: over all of it), and v, the weight (torch's (out, in, *k) layout). The
    kernel itself becomes state the call overwrites. Returns the module, as torch does."""
    if name != "weight" or not isinstance(module, (nnx.Linear, nnx.Conv)):
        raise NotImplementedError(f"weight_norm of {type(module).__name__}.{name}: the weight "
                                  "of a Linear or a Conv only")
    kernel = module.kernel[...]
    n = kernel.ndim - 2  # the kernel's spatial axes, (*k, in, out); 0 for a Linear's (in, out)
    v = jnp.transpose(kernel, (n + 1, n, *range(n)))
    dim = -1 if dim is None else dim
    if dim == -1:
        g = jnp.sqrt(jnp.sum(v * v))
    else:
        axes = tuple(a for a in range(v.ndim) if a != dim % v.ndim)
        g = jnp.sqrt(jnp.sum(v * v, axis=axes, keepdims=True))
    if parametrized:
        module.parametrizations = nnx.Dict(weight=WeightNormParametrization(g, v))
    else:
        module.weight_g, module.weight_v = nnx.Param(g), nnx.Param(v)
    module.kernel = WeightNormKernel(kernel)
    module.weight_norm_dim = dim
    base = type(module)
    if base not in _WEIGHT_NORMED_CLASSES:
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if hasattr(self, "parametrizations"):
                p = self.parametrizations["weight"]
                g, v = p.original0[...], p.original1[...]
            else:
                g, v = self.weight_g[...], self.weight_v[...]
            w = weight_norm_weight(v, g, self.weight_norm_dim)
            self.kernel[...] = jnp.transpose(w, (*range(2, w.ndim), 1, 0))
            return base.__call__(self, *args, **kwargs)

        _WEIGHT_NORMED_CLASSES[base] = type(f"WeightNormed{base.__name__}", (base,),
                                            {"__call__": __call__, "__module__": base.__module__})
    module.__class__ = _WEIGHT_NORMED_CLASSES[base]
    return module
''', targets=("nnx",))

helper("torch_weight_norm", {"Any"}, '''
def torch_weight_norm(module: Any, name: str = "weight", dim: int | None = 0) -> Any:
    """torch.nn.utils.weight_norm: the parameters weight_g and weight_v (weight_normed)."""
    return weight_normed(module, name, dim, parametrized=False)
''', targets=("nnx",))

helper("torch_parametrized_weight_norm", {"Any"}, '''
def torch_parametrized_weight_norm(module: Any, name: str = "weight", dim: int | None = 0) -> Any:
    """torch.nn.utils.parametrizations.weight_norm: the parameters
    parametrizations.weight.original0 (g) and original1 (v) (weight_normed)."""
    return weight_normed(module, name, dim, parametrized=True)
''', targets=("nnx",))
