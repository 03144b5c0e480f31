"""Module-level helper functions that converted code may call.

Some torch operations have no one-line JAX equivalent that reads well (adaptive pooling with
bins that overlap). The transforms emit a call to a plainly named function instead, and
:func:`add_helpers` writes that function's definition into the converted file, after its
imports, so that the output runs without torch2jax. A helper is added only when the converted
file calls it and does not define that name itself. Most helpers are the same for every target;
one that derives from a library class (``BatchNorm``) has a definition per target.
"""

from __future__ import annotations

import functools

import libcst as cst

from torch2jax.analysis.walk import NoAttributeHooks, visit
from torch2jax.passes import (
    helpers_embedding,  # noqa: F401 (registers the embedding helpers)
    helpers_rnn,  # noqa: F401 (registers TorchLSTM, TorchGRU)
)
from torch2jax.passes.helper_registry import HELPERS, TARGETS, helper  # noqa: F401

_ADAPTIVE = '''
def adaptive_{kind}_pool(x: jax.Array, output_size: tuple[int | None, ...]) -> jax.Array:
    """torch's adaptive {kind} pooling over the last len(output_size) axes of x.

    Output i of an axis of length n pools x[floor(i * n / out) : ceil((i + 1) * n / out)]:
    neighbouring bins overlap when out does not divide n. Pooling a box is pooling each of its
    axes in turn; None keeps an axis as it is.
    """
    first = x.ndim - len(output_size)
    for axis, out in enumerate(output_size, start=first):
        n = x.shape[axis]
        if out is None or out == n:
            continue
        bins = [
            jax.lax.slice_in_dim(x, i * n // out, -(-(i + 1) * n // out), axis=axis).{reduce}(
                axis=axis, keepdims=True
            )
            for i in range(out)
        ]
        x = jnp.concatenate(bins, axis=axis)
    return x
'''
helper("adaptive_avg_pool", {"jax", "jnp"}, _ADAPTIVE.format(kind="avg", reduce="mean"))
helper("adaptive_max_pool", {"jax", "jnp"}, _ADAPTIVE.format(kind="max", reduce="max"))



# x.split(size) whose size is not a literal (passes/special.py): torch takes a chunk size or
# a sequence of sizes, jnp.split a count or the indices to split at
helper("torch_split", {"jax", "jnp"}, '''
def torch_split(x: jax.Array, size, axis: int = 0) -> list[jax.Array]:
    """torch's split: chunks of ``size`` along ``axis`` (the last one smaller), or chunks of
    the sizes in a sequence ``size``."""
    if jnp.ndim(size) == 0:  # a chunk size
        return jnp.split(x, list(range(size, x.shape[axis], size)), axis=axis)
    at, total = [], 0
    for n in list(size)[:-1]:
        total += int(n)
        at.append(total)
    return jnp.split(x, at, axis=axis)
''')


# F.scaled_dot_product_attention(q, k, v, attn_mask=m) (passes/special_sequence.py): torch
# tells a boolean mask from a float one by its dtype, at run time; so does this helper
helper("attention_with_mask", {"jax", "jnp"}, '''
def attention_with_mask(query: jax.Array, key: jax.Array, value: jax.Array, attn_mask=None,
                        is_causal: bool = False, scale: float | None = None) -> jax.Array:
    """F.scaled_dot_product_attention on torch's (..., heads, length, dim) layout, written out
    so that it computes in the inputs' dtype (jax.nn.dot_product_attention's softmax runs in
    float32). attn_mask: a boolean one (True takes part) or one added to the scores, told
    apart by its dtype as torch does; it broadcasts against the scores (..., L, S)."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = jnp.einsum("...qd,...kd->...qk", query, key) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], bool)), scores, -jnp.inf)
    if attn_mask is not None and attn_mask.dtype == jnp.bool_:
        scores = jnp.where(attn_mask, scores, -jnp.inf)
    elif attn_mask is not None:
        scores = scores + attn_mask
    return jnp.einsum("...qk,...kd->...qd", jax.nn.softmax(scores, axis=-1), value)
''')

# module.requires_grad_(False) in a module's __init__ (nnx; passes/rewrite_calls.py); a file
# that freezes reads a model's parameters() as nnx.Any(nnx.Param, FrozenParam)
helper("FrozenParam", {"nnx"}, '''
class FrozenParam(nnx.Variable):
    """A parameter frozen by PyTorch's requires_grad_(False): not an nnx.Param, so
    nnx.grad(..., wrt=nnx.Param) and nnx.Optimizer(..., wrt=nnx.Param) leave it as it is; still
    one of the module's parameters (nnx.Any(nnx.Param, FrozenParam))."""
''', targets=("nnx",))
helper("freeze_parameters", {"nnx"}, '''
def freeze_parameters(module: nnx.Module) -> None:
    """Freezes ``module`` (PyTorch's requires_grad_(False)): its parameters become
    FrozenParams, which nnx.grad(..., wrt=nnx.Param) and nnx.Optimizer(..., wrt=nnx.Param)
    leave as they are."""
    for _, sub in nnx.iter_modules(module):
        for name, value in list(vars(sub).items()):
            if isinstance(value, nnx.Param):
                setattr(sub, name, FrozenParam(value.get_value()))
''', targets=("nnx",))


# F.interpolate(mode="bicubic") (passes/special_vision.py): torch's cubic convolution, a=-0.75
helper("resize_bicubic", {"Any", "jax", "jnp"}, '''
def resize_bicubic(x: jax.Array, shape: tuple[int, ...], align_corners: bool = False,
                   scales: tuple[float | None, ...] | None = None) -> jax.Array:
    """F.interpolate(x, size, mode="bicubic") over the axes from 2 on: torch's cubic
    convolution (a = -0.75; jax.image's cubic has a = -0.5), four taps per output, taken at
    the border where they fall outside. ``scales``: torch's scale_factor per axis, which maps
    the source coordinates instead of in/out when given."""
    a = -0.75
    for axis in range(2, x.ndim):
        n_in, n_out = x.shape[axis], shape[axis]
        dst = jnp.arange(n_out, dtype=x.dtype)
        scale = scales[axis - 2] if scales is not None else None
        if align_corners:
            src = dst * ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0)
        else:
            src = (dst + 0.5) * (1 / scale if scale else n_in / n_out) - 0.5
        start = jnp.floor(src)
        t = src - start
        weights = jnp.stack([
            ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
        ], axis=-1)
        taps = jnp.clip(start.astype(jnp.int32)[:, None] + jnp.arange(-1, 3), 0, n_in - 1)
        # (n_out, n_in): each output row the weights of its four (clamped) source taps
        matrix = jnp.zeros((n_out, n_in), x.dtype).at[
            jnp.arange(n_out)[:, None], taps].add(weights)
        x = jnp.moveaxis(jnp.tensordot(matrix, x, axes=[[1], [axis]]), 0, axis)
    return x
''')


# F.binary_cross_entropy / nn.BCELoss (passes/special_losses.py)
helper("binary_cross_entropy", {"jax", "jnp"}, '''
@jax.custom_vjp
def binary_cross_entropy(p: jax.Array, y: jax.Array) -> jax.Array:
    """PyTorch's elementwise binary cross-entropy of probabilities p against targets y, both
    logarithms clamped at -100, with PyTorch's gradients: (p - y) / max(p * (1 - p), 1e-12) for
    p, finite where p is exactly 0 or 1 (there the clamped logarithms' own gradient is
    0 * inf = nan), and log(1 - p) - log(p) for y."""
    return -(y * jnp.maximum(jnp.log(p), -100) + (1 - y) * jnp.maximum(jnp.log1p(-p), -100))


def _binary_cross_entropy_fwd(p, y):
    return binary_cross_entropy(p, y), (p, y)


def _binary_cross_entropy_bwd(residuals, g):
    p, y = residuals
    dp = g * (p - y) / jnp.maximum(p * (1 - p), 1e-12)
    dy = g * (jnp.log1p(-p) - jnp.log(p))  # not clamped, as in PyTorch
    return dp, dy


binary_cross_entropy.defvjp(_binary_cross_entropy_fwd, _binary_cross_entropy_bwd)
''')


# equinox (torch2jax/targets/equinox.py): torch's LSTM (batch_first=True) on one example
helper("lstm_scan", {"jax", "jnp"}, '''
def lstm_scan(cell, xs: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """torch's one-layer LSTM on one sequence xs (L, I), from zero states, with the
    TorchLSTMCell helper (torch's gates, i f g o, and tensors): the outputs (L, H) and torch's
    (h_n, c_n), each (1, H) (one layer)."""
    zeros = jnp.zeros(cell.hidden_size, xs.dtype)

    def step(state, x):
        h, c = cell(x, state)
        return (h, c), h

    (h, c), out = jax.lax.scan(step, (zeros, zeros), xs)
    return out, (h[None], c[None])
''')


# torch.multinomial(w, n, replacement, generator=g) with g a numpy Generator
# (analysis/host_generators.py)
helper("host_multinomial", {"Any", "np", "jnp"}, '''
def host_multinomial(rng: Any, weights: Any, num_samples: int,
                     replacement: bool = False) -> Any:
    """torch.multinomial drawn from rng, a numpy Generator: num_samples category indices per
    row of weights (1-D or 2-D, non-negative, each row normalised as torch does), with or
    without replacement."""
    w = np.asarray(weights, dtype=np.float64)
    rows = [rng.choice(len(p), size=num_samples, replace=replacement, p=p / p.sum())
            for p in w.reshape(-1, w.shape[-1])]
    return jnp.asarray(np.stack(rows).reshape(*w.shape[:-1], num_samples))
''')


# equinox (torch2jax/targets/equinox_calls.py): a vector layer on a value whose rank per
# example is not known when converting
helper("over_leading", {"jax"}, '''
def over_leading(layer, x: jax.Array, rank: int) -> jax.Array:
    """layer, written for one input of rank axes, applied to x over all its leading axes
    (one jax.vmap per leading axis)."""
    for _ in range(x.ndim - rank):
        layer = jax.vmap(layer)
    return layer(x)
''', targets=("equinox",))


# equinox (torch2jax/targets/equinox_calls.py): a module handed to a module kept batched
# whose class no call in the file shows
helper("on_batch", {"jax"}, '''
def on_batch(module, *args, **kwargs):
    """module called on a batch: equinox's Linear, LayerNorm, RMSNorm and Embedding over every
    leading axis; another equinox module written for one example (a layer, a model converted
    per example) mapped over the batch, axis 0 of every argument; one that keeps the batch
    axis (batched = True) or a plain function called as it is."""
    vector = (eqx.nn.Linear, eqx.nn.LayerNorm, eqx.nn.RMSNorm, eqx.nn.Embedding)
    if isinstance(module, vector) and len(args) == 1 and not kwargs:
        if isinstance(module, eqx.nn.Embedding):
            rank = 0
        elif isinstance(module, eqx.nn.Linear):
            rank = 0 if module.in_features == "scalar" else 1
        else:
            rank = len(module.shape)
        for _ in range(args[0].ndim - rank):
            module = jax.vmap(module)
        return module(args[0])
    if isinstance(module, eqx.Module) and not getattr(module, "batched", False):
        return jax.vmap(module)(*args, **kwargs)
    return module(*args, **kwargs)
''', targets=("equinox",))


# torch's GRU cell (rules/sequence.toml): n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); the
# library cells have no hidden-side bias b_hn
helper("TorchGRUCell", {"Any", "nnx"}, '''
class TorchGRUCell(nnx.GRUCell):
    """nn.GRUCell / torch's GRU cell: an nnx.GRUCell (gates r, z, n as torch's) whose
    hidden-side dense has a bias, torch's b_hr, b_hz and b_hn (b_hn inside r * (W_hn h + b_hn))."""

    def __init__(self, in_features: int, hidden_features: int, *, rngs: nnx.Rngs,
                 **kwargs: Any) -> None:
        super().__init__(in_features, hidden_features, rngs=rngs, **kwargs)
        self.dense_h = nnx.Linear(
            hidden_features, 3 * hidden_features,
            kernel_init=kwargs.get("recurrent_kernel_init", nnx.initializers.orthogonal()),
            bias_init=kwargs.get("bias_init", nnx.initializers.zeros_init()),
            dtype=self.dtype, param_dtype=self.param_dtype, rngs=rngs)
''', targets=("nnx",))


helper("TorchGRUCell", {"jax", "jnp", "linen"}, '''
class TorchGRUCell(nn.GRUCell):
    """nn.GRUCell / torch's GRU cell: an nn.GRUCell (gates r, z, n as torch's) with fused input
    and hidden-side denses, dense_i and dense_h, each with a bias: torch's b_ir, b_iz, b_in and
    b_hr, b_hz, b_hn (b_hn inside r * (W_hn h + b_hn))."""

    @nn.compact
    def __call__(self, carry: jax.Array, inputs: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = carry
        dense = {"features": 3 * self.features, "dtype": self.dtype,
                 "param_dtype": self.param_dtype, "bias_init": self.bias_init}
        xi_r, xi_z, xi_n = jnp.split(
            nn.Dense(kernel_init=self.kernel_init, name="dense_i", **dense)(inputs), 3, axis=-1)
        hh_r, hh_z, hh_n = jnp.split(
            nn.Dense(kernel_init=self.recurrent_kernel_init, name="dense_h", **dense)(h), 3,
            axis=-1)
        r = self.gate_fn(xi_r + hh_r)
        z = self.gate_fn(xi_z + hh_z)
        n = self.activation_fn(xi_n + r * hh_n)
        new_h = (1.0 - z) * n + z * h
        return new_h, new_h
''', targets=("linen",))


helper("TorchGRUCell", {"jax", "jnp"}, '''
class TorchGRUCell(eqx.Module):
    """nn.GRUCell / torch's GRU cell on one example, with torch's parameters (gates r, z, n)
    and initialisation (U(-1/sqrt(H), 1/sqrt(H)) everywhere). eqx.nn.GRUCell keeps b_ih + b_hh
    of the r and z gates summed, and b_hn apart; this cell keeps torch's four tensors."""

    weight_ih: jax.Array
    weight_hh: jax.Array
    bias_ih: jax.Array
    bias_hh: jax.Array
    input_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)

    def __init__(self, input_size: int, hidden_size: int, *, key: jax.Array) -> None:
        lim = hidden_size**-0.5
        k_ih, k_hh, k_bi, k_bh = jax.random.split(key, 4)
        shapes = [(3 * hidden_size, input_size), (3 * hidden_size, hidden_size),
                  (3 * hidden_size,), (3 * hidden_size,)]
        self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh = (
            jax.random.uniform(k, s, minval=-lim, maxval=lim)
            for k, s in zip((k_ih, k_hh, k_bi, k_bh), shapes))
        self.input_size = input_size
        self.hidden_size = hidden_size

    def __call__(self, input: jax.Array, hidden: jax.Array, *, key: jax.Array | None = None
                 ) -> jax.Array:
        xi_r, xi_z, xi_n = jnp.split(self.weight_ih @ input + self.bias_ih, 3)
        hh_r, hh_z, hh_n = jnp.split(self.weight_hh @ hidden + self.bias_hh, 3)
        r = jax.nn.sigmoid(xi_r + hh_r)
        z = jax.nn.sigmoid(xi_z + hh_z)
        n = jnp.tanh(xi_n + r * hh_n)
        return (1.0 - z) * n + z * hidden
''', targets=("equinox",))


# equinox (torch2jax/targets/equinox.py): torch's GRU (batch_first=True) on one example
helper("gru_scan", {"jax", "jnp"}, '''
def gru_scan(cell, xs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """torch's one-layer GRU on one sequence xs (L, I), from a zero state, with the TorchGRUCell
    helper: the outputs (L, H) and torch's h_n (1, H) (one layer)."""

    def step(h, x):
        h = cell(x, h)
        return h, h

    h, out = jax.lax.scan(step, jnp.zeros(cell.hidden_size, xs.dtype), xs)
    return out, h[None]
''', targets=("equinox",))


# linen (torch2jax/targets/linen.py): a Linear whose weight the forward code reads
helper("ReadableDense", {"linen", "Any"}, '''
class ReadableDense(nn.Module):
    """nn.Dense(features) with its kernel (in_features, features) and bias made in setup(), so
    that forward code can read them (torch's F.linear(x, self.fc.weight)); the same variables
    as nn.Dense's."""

    in_features: int
    features: int
    use_bias: bool = True
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros

    def setup(self):
        self.kernel = self.param("kernel", self.kernel_init, (self.in_features, self.features))
        self.bias = self.param("bias", self.bias_init, (self.features,)) if self.use_bias else None

    def __call__(self, x):
        y = x @ self.kernel
        return y if self.bias is None else y + self.bias
''')


# linen (torch2jax/targets/linen.py): a Linear head with a bias tied to an Embedding's table
# under a condition of the constructor (word_lm's `if tie_weights:`)
helper("TiedDense", {"linen", "Any"}, '''
class TiedDense(nn.Module):
    """nn.Dense(features) whose weight may be tied to an embedding's table: called with the
    table (num_embeddings, in_features), it reads it as its kernel (and makes none of its own);
    its bias is its own either way. The same variables as nn.Dense's."""

    features: int
    use_bias: bool = True
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros

    @nn.compact
    def __call__(self, x, table=None):
        if table is None:
            y = x @ self.param("kernel", self.kernel_init, (x.shape[-1], self.features))
        else:
            y = x @ table.T
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y
''')

# act_layer(inplace=True) of a layer handed in whose kind is known only at run time (timm's
# create_act_layer given a lookup's result; passes/rewrite_calls.py)
helper("build_layer", {"Any", "inspect", "partial"}, '''
def build_layer(layer: Any, *args: Any, rngs: Any, **kwargs: Any) -> Any:
    """What torch's layer(*args, **kwargs) built, the layer handed in being known only at run
    time: a JAX function (a torch activation class converted) is used as it is; a class (or a
    partial of one) is built, given the rngs where its constructor takes them (a converted
    module), without them otherwise (a module without parameters, another library's class)."""
    cls = layer.func if isinstance(layer, partial) else layer
    if not isinstance(cls, type):
        try:  # a function that builds layers takes the rngs; a JAX activation is the layer
            builds = "rngs" in inspect.signature(cls).parameters
        except (TypeError, ValueError):
            builds = False
        return layer(*args, rngs=rngs, **kwargs) if builds else layer
    if "rngs" in inspect.signature(cls.__init__).parameters:
        return layer(*args, rngs=rngs, **kwargs)
    return layer(*args, **kwargs)
''')

# module.init_weights() of a module known only at run time (timm's _init_weights over the
# model's modules: the method draws, taking rngs, in some classes only; rewrite_calls.py)
helper("call_with_rngs", {"Any", "inspect"}, '''
def call_with_rngs(method: Any, *args: Any, rngs: Any, **kwargs: Any) -> Any:
    """method(*args, **kwargs), given the rngs where it takes them (a method that draws in
    some classes and not in others, of a module known only at run time)."""
    if "rngs" in inspect.signature(method).parameters:
        return method(*args, rngs=rngs, **kwargs)
    return method(*args, **kwargs)
''')

# module.named_children() / .children() on a module whose class the file does not define
# (timm's named_apply walking the model it is given, passes/rewrite_calls.py)
helper("torch_named_children", {"Any", "nnx"}, '''
def torch_named_children(module: Any) -> Any:
    """torch's module.named_children() of an NNX module: its direct submodules in the order
    it assigned them (torch's registration order), a Sequential's, a List's or a Dict's by
    their index or key, each once. Activation layers, JAX functions here, are not modules,
    except in a Sequential built from named layers, whose names (torch_names) are torch's; a
    layer added to a Sequential by add_module is also its attribute of torch's name."""
    names = getattr(module, "torch_names", None) or {}
    if isinstance(module, nnx.Sequential):
        given = {at: name for name, at in names.items()}
        added = {id(v): k for k, v in vars(module).items()
                 if k != "layers" and isinstance(v, nnx.Module)}
        seen = set()
        for at, child in enumerate(module.layers):
            name = given.get(at) or added.get(id(child))
            if id(child) in seen or (name is None and (names or not isinstance(
                    child, nnx.Module))):
                continue
            seen.add(id(child))
            yield name or str(at), child
        return
    if isinstance(module, (nnx.List, list, tuple)):
        items = enumerate(module)
    elif isinstance(module, (nnx.Dict, dict)):
        items = module.items()
    else:
        items = vars(module).items()
    seen = set()
    for name, child in list(items):
        if isinstance(child, nnx.Module) and id(child) not in seen:
            seen.add(id(child))
            yield str(name), child
''', targets=("nnx",))


# parameter groups selected by torch's names (minGPT's configure_optimizers walks
# named_modules / named_parameters into sets of names): the optax mask names each NNX
# parameter as torch does (passes/training.py, group_mask); the same names as the loop's
helper("torch_parameter_name", {"jax"}, '''
def torch_parameter_name(path: tuple) -> str:
    """torch's dotted name of the parameter at ``path`` (a key path of an nnx.Param state):
    the attribute names and list indices joined by dots, a layer's kernel, embedding or scale
    being torch's weight."""
    keys = [k.key if isinstance(k, jax.tree_util.DictKey)
            else k.idx if isinstance(k, jax.tree_util.SequenceKey) else k
            for k in path if not isinstance(k, jax.tree_util.GetAttrKey)]
    last = {"kernel": "weight", "embedding": "weight", "scale": "weight"}.get(keys[-1], keys[-1])
    return ".".join(map(str, (*keys[:-1], last)))
''', targets=("nnx",))
helper("torch_parameter_name", {"jax"}, '''
def torch_parameter_name(path: tuple) -> str:
    """torch's dotted name of the parameter at ``path`` (a key path into an equinox model):
    the field names and list indices joined by dots (equinox's layers name their arrays
    weight and bias, as torch does)."""
    keys = [k.name if isinstance(k, jax.tree_util.GetAttrKey)
            else k.key if isinstance(k, jax.tree_util.DictKey) else k.idx for k in path]
    return ".".join(map(str, keys))
''', targets=("equinox",))
helper("torch_parameter_name", {"jax"}, '''
def torch_parameter_name(path: tuple) -> str:
    """torch's dotted name of the parameter at ``path`` (a key path into linen's params): the
    submodule names joined by dots, a layer's kernel, embedding or scale being torch's weight
    (a list's item keeps linen's name, ``layers_0`` for torch's ``layers.0``)."""
    keys = [k.key if isinstance(k, jax.tree_util.DictKey) else k.idx for k in path]
    last = {"kernel": "weight", "embedding": "weight", "scale": "weight"}.get(keys[-1], keys[-1])
    return ".".join(map(str, (*keys[:-1], last)))
''', targets=("linen",))


helper("checkpoint_sequential", {"Any", "jax", "nnx"}, '''
def checkpoint_sequential(layers: Any, segments: int, x: jax.Array) -> jax.Array:
    """torch.utils.checkpoint.checkpoint_sequential: the layers (an nnx.Sequential or a list)
    run in order, in `segments` chunks of len(layers) // segments; every chunk but the last is
    rematerialised (nnx.remat) in the backward pass, the last one takes what is left."""
    layers = list(layers.layers if isinstance(layers, nnx.Sequential) else layers)
    size = len(layers) // segments
    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        x = nnx.remat(lambda chunk, x: chunk(x))(nnx.Sequential(*layers[start:end]), x)
    return nnx.Sequential(*layers[end:])(x)
''')


helper("torch_uniform_init", {"Any", "jax", "jnp"}, '''
def torch_uniform_init(fan_in: int) -> Any:
    """torch's default bias initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in the
    inputs of the layer's weight (0: zeros, as torch), for convert --init torch; also its RNN
    weights and biases (fan_in: the hidden size)."""
    bound = 1 / fan_in**0.5 if fan_in > 0 else 0.0

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init
''')


helper("split_fractions", {"Any"}, '''
def split_fractions(dataset: Any, fractions: list[float]) -> list[Any]:
    """torch.utils.data.random_split's fractions over an already shuffled dataset: int(n * f)
    items each, the remainder handed out one at a time from the first split on."""
    n = len(dataset)
    lengths = [int(n * f) for f in fractions]
    for i in range(n - sum(lengths)):
        lengths[i % len(lengths)] += 1
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [dataset[start:start + length] for start, length in zip(starts, lengths)]
''')


helper("IterableLoader", {"Any", "jax", "np"}, '''
class IterableLoader:
    """torch's DataLoader over an IterableDataset: consecutive elements of the dataset stacked
    into numpy batches (or handed to collate_fn). Each pass iterates the dataset again, as
    torch does every epoch; batch_size=None yields the elements as they are."""

    def __init__(self, dataset: Any, batch_size: int | None = 1, drop_last: bool = False,
                 collate_fn: Any = None) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.collate_fn = collate_fn or (lambda batch: jax.tree.map(lambda *xs: np.stack(xs),
                                                                    *batch))

    def __iter__(self):
        if self.batch_size is None:
            yield from self.dataset
            return
        batch = []
        for element in self.dataset:
            batch.append(element)
            if len(batch) == self.batch_size:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.collate_fn(batch)
''')


# torchvision.transforms on numpy (passes/data.py). Arrays are torchvision's tensors,
# [..., H, W]; a PIL image is processed as its H x W (x C) array and given back as a PIL image.
helper("image_op", {"Any", "np"}, '''
def image_op(img: Any, fn: Any) -> Any:
    """fn(array, (height axis, width axis)) applied to an image: an array (torchvision's tensor
    layout, [..., H, W]) or a PIL image (its H x W (x C) array, returned as a PIL image)."""
    if hasattr(img, "ndim"):
        return fn(np.asarray(img), (-2, -1))
    from PIL import Image

    return Image.fromarray(fn(np.asarray(img), (0, 1)))
''')

helper("pad_array", {"Any", "np"}, '''
def pad_array(x: np.ndarray, axes: tuple[int, int], padding: Any, fill: float = 0,
              padding_mode: str = "constant") -> np.ndarray:
    """torchvision's pad: padding is one int, (left/right, top/bottom) or (left, top, right,
    bottom); padding_mode "constant" (with fill), "edge", "reflect" or "symmetric"."""
    left, top, right, bottom = [padding] * 4 if isinstance(padding, int) else (
        list(padding) * (4 // len(padding)))
    widths = [(0, 0)] * x.ndim
    widths[axes[0]], widths[axes[1]] = (top, bottom), (left, right)
    if padding_mode == "constant":
        return np.pad(x, widths, constant_values=fill)
    return np.pad(x, widths, mode=padding_mode)
''')

helper("crop_array", {"np"}, '''
def crop_array(x: np.ndarray, axes: tuple[int, int], top: int, left: int, height: int,
               width: int) -> np.ndarray:
    """The height x width window of x whose top-left pixel is (top, left)."""
    index = [slice(None)] * x.ndim
    index[axes[0]], index[axes[1]] = slice(top, top + height), slice(left, left + width)
    return x[tuple(index)]
''')

helper("Compose", {"Any"}, '''
class Compose:
    """torchvision.transforms.Compose: the transforms applied in order."""

    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img
''')

helper("Lambda", {"Any"}, '''
class Lambda:
    """torchvision.transforms.Lambda: a function as a transform."""

    def __init__(self, lambd: Any) -> None:
        self.lambd = lambd

    def __call__(self, img: Any) -> Any:
        return self.lambd(img)
''')

helper("ToTensor", {"Any", "np"}, '''
class ToTensor:
    """torchvision.transforms.ToTensor on numpy: a PIL image or an H x W (x C) array becomes a
    C x H x W array; uint8 values are scaled to float32 in [0, 1], other dtypes kept as they
    are."""

    def __call__(self, pic: Any) -> np.ndarray:
        x = np.asarray(pic)
        x = (x[:, :, None] if x.ndim == 2 else x).transpose(2, 0, 1)
        return x.astype(np.float32) / 255 if x.dtype == np.uint8 else x
''')

helper("Normalize", {"Any", "np"}, '''
class Normalize:
    """torchvision.transforms.Normalize: (x - mean) / std for each channel of a C x H x W
    array, in the array's dtype. The result is a new array (inplace has no meaning here)."""

    def __init__(self, mean: Any, std: Any, inplace: bool = False) -> None:
        self.mean, self.std = mean, std

    def __call__(self, x: Any) -> Any:
        mean = np.asarray(self.mean, dtype=x.dtype).reshape(-1, 1, 1)
        std = np.asarray(self.std, dtype=x.dtype).reshape(-1, 1, 1)
        return (x - mean) / std
''')

helper("Pad", {"Any"}, '''
class Pad:
    """torchvision.transforms.Pad (see pad_array)."""

    def __init__(self, padding: Any, fill: float = 0, padding_mode: str = "constant") -> None:
        self.padding, self.fill, self.padding_mode = padding, fill, padding_mode

    def __call__(self, img: Any) -> Any:
        return image_op(img, lambda x, axes: pad_array(x, axes, self.padding, self.fill,
                                                       self.padding_mode))
''')

helper("CenterCrop", {"Any"}, '''
class CenterCrop:
    """torchvision.transforms.CenterCrop: the central window (rounded as torchvision rounds),
    zero-padded first where the image is smaller than the window."""

    def __init__(self, size: Any) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size) * (2 // len(size))

    def __call__(self, img: Any) -> Any:
        return image_op(img, self._crop)

    def _crop(self, x: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
        (th, tw), h, w = self.size, x.shape[axes[0]], x.shape[axes[1]]
        if th > h or tw > w:
            pad_h, pad_w = max(th - h, 0), max(tw - w, 0)
            x = pad_array(x, axes, (pad_w // 2, pad_h // 2, (pad_w + 1) // 2, (pad_h + 1) // 2))
            h, w = x.shape[axes[0]], x.shape[axes[1]]
        return crop_array(x, axes, int(round((h - th) / 2.0)), int(round((w - tw) / 2.0)),
                          th, tw)
''')

_FLIP = '''
class Random{side}Flip:
    """torchvision.transforms.Random{side}Flip: flips the image's {axis} axis with
    probability p, drawn from the numpy Generator rng (torch draws from its global
    generator)."""

    def __init__(self, p: float = 0.5, rng: np.random.Generator | None = None) -> None:
        self.p, self.rng = p, rng if rng is not None else np.random.default_rng()

    def __call__(self, img: Any) -> Any:
        if self.rng.random() < self.p:
            return image_op(img, lambda x, axes: np.flip(x, axes[{index}]))
        return img
'''
helper("RandomHorizontalFlip", {"Any", "np"},
       _FLIP.format(side="Horizontal", axis="width", index=1))
helper("RandomVerticalFlip", {"Any", "np"}, _FLIP.format(side="Vertical", axis="height", index=0))

helper("RandomCrop", {"Any", "np"}, '''
class RandomCrop:
    """torchvision.transforms.RandomCrop: padding first (padding, then pad_if_needed on both
    sides), then a window at a uniformly drawn position, drawn from the numpy Generator rng."""

    def __init__(self, size: Any, padding: Any = None, pad_if_needed: bool = False,
                 fill: float = 0, padding_mode: str = "constant",
                 rng: np.random.Generator | None = None) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size) * (2 // len(size))
        self.padding, self.pad_if_needed = padding, pad_if_needed
        self.fill, self.padding_mode = fill, padding_mode
        self.rng = rng if rng is not None else np.random.default_rng()

    def __call__(self, img: Any) -> Any:
        return image_op(img, self._crop)

    def _crop(self, x: np.ndarray, axes: tuple[int, int]) -> np.ndarray:
        th, tw = self.size
        if self.padding is not None:
            x = pad_array(x, axes, self.padding, self.fill, self.padding_mode)
        if self.pad_if_needed and x.shape[axes[1]] < tw:
            x = pad_array(x, axes, (tw - x.shape[axes[1]], 0), self.fill, self.padding_mode)
        if self.pad_if_needed and x.shape[axes[0]] < th:
            x = pad_array(x, axes, (0, th - x.shape[axes[0]]), self.fill, self.padding_mode)
        h, w = x.shape[axes[0]], x.shape[axes[1]]
        if h < th or w < tw:
            raise ValueError(f"Required crop size {(th, tw)} is larger than input image size "
                             f"{(h, w)}")
        top = int(self.rng.integers(0, h - th + 1))
        left = int(self.rng.integers(0, w - tw + 1))
        return crop_array(x, axes, top, left, th, tw)
''')


helper("NamedSequential", {"Any", "nnx"}, '''
class NamedSequential(nnx.Sequential):
    """nn.Sequential(OrderedDict(...)): the layers run in order (layers[i]) and are also
    attributes by their names (self.heads.head)."""

    def __init__(self, layers: dict[str, Any]) -> None:
        super().__init__(*layers.values())
        for name, layer in layers.items():
            setattr(self, name, layer)
        # torch's names of the layers by position, for named_children() (torch_named_children)
        self.torch_names = {name: at for at, name in enumerate(layers)}
''')


helper("LayerDict", {"Any", "nnx"}, '''
class LayerDict(nnx.Dict):
    """nn.ModuleDict: layers by name (self[name], self.name) that iterate in the order they
    were added, as torch's do (an nnx.Dict iterates its attributes, which come back sorted by
    name from nnx.split / nnx.jit: "layer10" before "layer2")."""

    def __init__(self, layers: dict[str, Any] | None = None) -> None:
        self._order: tuple[str, ...] = ()
        for name, layer in (layers or {}).items():
            self[name] = layer

    def __setitem__(self, name: str, layer: Any) -> None:
        super().__setitem__(name, layer)
        if name not in self._order:
            self._order = (*self._order, name)

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self._order = tuple(n for n in self._order if n != name)

    def __iter__(self):
        return iter(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._order
''')



# nn.TransformerEncoderLayer / nn.TransformerEncoder (rules/sequence.toml): torch's attribute
# names, so that the weight transfer maps torch's state_dict by path (self_attn through the
# MultiheadAttention rule, linear1/linear2 and norm1/norm2 through Linear's and LayerNorm's)
helper("TransformerEncoderLayer", {"Any", "jax", "jnp", "partial", "nnx"}, """
class TransformerEncoderLayer(nnx.Module):
    \"\"\"nn.TransformerEncoderLayer: self-attention then a feed-forward block (linear1,
    activation, dropout, linear2), each added to its input, with LayerNorm after each sum
    (norm_first=False) or on each block's input (norm_first=True). Inputs are (S, N, E)
    unless batch_first (an unbatched (S, E) works either way). src_mask (S, S) or
    (N * nhead, S, S) and src_key_padding_mask (N, S) are boolean, True where attention is
    NOT allowed (torch's convention; flax's masks are the opposite), or a float src_mask,
    added to the attention scores (word_language_model's log(tril(ones)): 0 or -inf), a
    boolean padding mask then adding -inf at the padding as torch does. is_causal is a hint in
    torch: the mask decides, here too. Dropout (on
    the attention probabilities, in the feed-forward block and on each block's output) is
    nnx.Dropout / the attention's own, off after model.eval().\"\"\"

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: Any = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, rngs: nnx.Rngs) -> None:
        self.config = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                       batch_first, norm_first, bias, dtype)
        param_dtype = jnp.float32 if dtype is None else dtype
        self.self_attn = nnx.MultiHeadAttention(
            num_heads=nhead, in_features=d_model, dropout_rate=dropout, broadcast_dropout=False,
            use_bias=bias, decode=False, deterministic=False, param_dtype=param_dtype,
            attention_fn=_mask_or_bias_attention, rngs=rngs)
        self.linear1 = nnx.Linear(d_model, dim_feedforward, use_bias=bias,
                                  param_dtype=param_dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.linear2 = nnx.Linear(dim_feedforward, d_model, use_bias=bias,
                                  param_dtype=param_dtype, rngs=rngs)
        self.norm1 = nnx.LayerNorm(d_model, epsilon=layer_norm_eps, use_bias=bias,
                                   param_dtype=param_dtype, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, epsilon=layer_norm_eps, use_bias=bias,
                                   param_dtype=param_dtype, rngs=rngs)
        self.dropout1 = nnx.Dropout(dropout, rngs=rngs)
        self.dropout2 = nnx.Dropout(dropout, rngs=rngs)
        if isinstance(activation, str):
            if activation not in ("relu", "gelu"):
                raise RuntimeError(f"activation should be relu/gelu, not {activation}")
            activation = jax.nn.relu if activation == "relu" else partial(jax.nn.gelu,
                                                                          approximate=False)
        self.activation = activation
        self.batch_first = batch_first
        self.norm_first = norm_first
        # what torch's TransformerEncoder checks before its nested-tensor inference
        self.nested_tensor_ok = (not norm_first and batch_first and bias and nhead % 2 == 0
                                 and _relu_or_gelu(activation))

    def fresh_copy(self, rngs: nnx.Rngs) -> "TransformerEncoderLayer":
        \"\"\"A new layer with this one's arguments and parameter values (torch's deepcopy
        in TransformerEncoder) and its own dropout streams.\"\"\"
        layer = type(self)(*self.config, rngs=rngs)
        nnx.update(layer, nnx.state(self, nnx.Param))
        return layer

    def __call__(self, src: jax.Array, src_mask: jax.Array | None = None,
                 src_key_padding_mask: jax.Array | None = None,
                 is_causal: bool = False) -> jax.Array:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: jax.Array, attn_mask: jax.Array | None,
                  key_padding_mask: jax.Array | None) -> jax.Array:
        mask = None
        additive = attn_mask is not None and attn_mask.dtype != jnp.bool_
        if attn_mask is not None:
            # a boolean mask is True where attention is allowed (flax's convention); a float
            # one is added to the scores (_mask_or_bias_attention)
            mask = attn_mask if additive else ~attn_mask
            if mask.ndim == 3:  # torch's (N * nhead, S, S)
                mask = mask.reshape(-1, self.self_attn.num_heads, *mask.shape[-2:])
        if key_padding_mask is not None:
            if key_padding_mask.dtype != jnp.bool_:
                raise TypeError("TransformerEncoderLayer: a float src_key_padding_mask is not "
                                "translated; pass a boolean one (True = padding)")
            blocked = key_padding_mask[..., None, None, :]
            if additive:
                mask = mask + jnp.where(blocked, -jnp.inf, 0.0).astype(mask.dtype)
            else:
                mask = ~blocked if mask is None else jnp.logical_and(mask, ~blocked)
        seq_first = not self.batch_first and x.ndim == 3
        if seq_first:  # (S, N, E) -> (N, S, E)
            x = jnp.swapaxes(x, 0, 1)
        x = self.self_attn(x, mask=mask)
        if seq_first:
            x = jnp.swapaxes(x, 0, 1)
        return self.dropout1(x)

    def _ff_block(self, x: jax.Array) -> jax.Array:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


def _mask_or_bias_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                            mask: jax.Array | None = None, **kwargs: Any) -> jax.Array:
    \"\"\"nnx.dot_product_attention, whose mask may be a float array added to the attention
    scores (torch's additive attn_mask) rather than a boolean one.\"\"\"
    if mask is not None and mask.dtype != jnp.bool_:
        return nnx.dot_product_attention(query, key, value, bias=mask, **kwargs)
    return nnx.dot_product_attention(query, key, value, mask=mask, **kwargs)


def _relu_or_gelu(fn: Any) -> bool:
    \"\"\"torch's activation_relu_or_gelu: relu, or the exact (erf) gelu.\"\"\"
    if fn is jax.nn.relu:
        return True
    return isinstance(fn, partial) and fn.func is jax.nn.gelu and \\
        fn.keywords.get("approximate") is False
""", targets=("nnx",))


helper("TransformerEncoder", {"Any", "jax", "jnp", "nnx"}, """
class TransformerEncoder(nnx.Module):
    \"\"\"nn.TransformerEncoder: num_layers copies of encoder_layer (each starts from its
    parameter values, as torch's deep copies do, with its own dropout streams), applied in
    turn, then the optional final norm. mask, src_key_padding_mask and is_causal as
    TransformerEncoderLayer's.

    torch's inference fast path: in eval mode, with autograd off (torch.no_grad(),
    torch.inference_mode(), or no parameter requiring grad), a src_key_padding_mask, no mask,
    a batched (N, S, E) input whose padding is left-aligned (every row's padding at its end,
    unless mask_check=False), enable_nested_tensor=True and a layer that qualifies
    (batch_first=True, norm_first=False, bias=True, an even nhead, relu or exact gelu),
    torch runs the layers on a nested tensor and returns 0.0 at the padded positions (before
    the final norm). The other positions are the same either way. With inference_fast_path
    (True by default) this module reproduces that after model.eval(), so that it matches
    torch's no-grad inference; set it to False for torch's eval-mode forward with autograd on
    (what a torch backward pass differentiates). Training mode never zeroes.\"\"\"

    def __init__(self, encoder_layer: Any, num_layers: int, norm: Any = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True, *,
                 rngs: nnx.Rngs) -> None:
        copy = getattr(encoder_layer, "fresh_copy", None)
        self.layers = nnx.List([copy(rngs) if copy is not None else nnx.clone(encoder_layer)
                                for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm
        self.use_nested_tensor = bool(enable_nested_tensor and getattr(
            encoder_layer, "nested_tensor_ok", False))
        self.mask_check = mask_check
        self.inference_fast_path = True
        self.deterministic = False

    def __call__(self, src: jax.Array, mask: jax.Array | None = None,
                 src_key_padding_mask: jax.Array | None = None,
                 is_causal: bool | None = None) -> jax.Array:
        output = src
        for layer in self.layers:
            output = layer(output, mask, src_key_padding_mask)
        if (self.use_nested_tensor and self.inference_fast_path and self.deterministic
                and src_key_padding_mask is not None and mask is None and src.ndim == 3):
            padded = src_key_padding_mask
            if self.mask_check:  # torch keeps the padded form unless the padding is at the end
                valid = ~padded
                padded = padded & jnp.all(valid[:, :-1] >= valid[:, 1:])
            output = jnp.where(padded[..., None], jnp.zeros((), output.dtype), output)
        if self.norm is not None:
            output = self.norm(output)
        return output
""", targets=("nnx",))


# torch's BatchNorm1d/2d/3d normalise a training batch with its biased variance but fold the
# *unbiased* one (n / (n - 1), n values per feature) into running_var; the flax layers fold the
# biased one and equinox's also debiases its statistics at inference. These helpers keep the
# library layer (and its parameter and statistic names) and follow torch's update.
helper("BatchNorm", {"jax", "nnx"}, '''
class BatchNorm(nnx.BatchNorm):
    """nn.BatchNorm1d/2d/3d: an nnx.BatchNorm whose running variance follows torch's. Training
    normalises with the batch's biased variance, as nnx.BatchNorm does, but torch folds the
    unbiased variance (n / (n - 1) times it, n values per feature) into the running one."""

    def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
        var = self.var[...]
        y = super().__call__(x, use_running_average)
        if not (self.use_running_average if use_running_average is None else use_running_average):
            n = x.size // x.shape[self.axis]
            batch_var = self.var[...] - self.momentum * var  # (1 - momentum) * biased variance
            self.var[...] = self.momentum * var + batch_var * (n / (n - 1))
        return y
''', targets=("nnx",))


helper("BatchNorm", {"jax", "linen"}, '''
class BatchNorm(nn.BatchNorm):
    """nn.BatchNorm1d/2d/3d: an nn.BatchNorm whose running variance follows torch's. Training
    normalises with the batch's biased variance, as nn.BatchNorm does, but torch folds the
    unbiased variance (n / (n - 1) times it, n values per feature) into the running one."""

    @nn.compact
    def __call__(self, x: jax.Array, use_running_average: bool | None = None) -> jax.Array:
        training = not nn.merge_param("use_running_average", self.use_running_average,
                                      use_running_average)
        var = self.get_variable("batch_stats", "var")
        y = super().__call__(x, use_running_average)
        if training and not self.is_initializing():
            n = x.size // x.shape[self.axis]
            batch_var = self.get_variable("batch_stats", "var") - self.momentum * var
            self.put_variable("batch_stats", "var", self.momentum * var + batch_var * (n / (n - 1)))
        return y
''', targets=("linen",))


helper("BatchNorm", {"jax", "jnp"}, '''
class BatchNorm(eqx.nn.StatefulLayer):
    """nn.BatchNorm1d/2d/3d on one example (channels first), mapped over the batch with
    jax.vmap(..., axis_name=axis_name). Training normalises with the batch mean and biased
    variance and updates the running statistics as torch does: running = momentum * running +
    (1 - momentum) * batch (momentum is 1 - torch's), the variance unbiased (n / (n - 1), n
    values per channel in the batch). They start at mean 0 / var 1; inference
    (eqx.nn.inference_mode) normalises with them as they are."""

    weight: jax.Array | None
    bias: jax.Array | None
    running_stats: eqx.nn.StateIndex
    inference: bool
    axis_name: str = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    momentum: float = eqx.field(static=True)

    def __init__(self, input_size: int, axis_name: str, eps: float = 1e-5,
                 channelwise_affine: bool = True, momentum: float = 0.9,
                 inference: bool = False) -> None:
        self.weight = jnp.ones(input_size) if channelwise_affine else None
        self.bias = jnp.zeros(input_size) if channelwise_affine else None
        self.running_stats = eqx.nn.StateIndex((jnp.zeros(input_size), jnp.ones(input_size)))
        self.inference = inference
        self.axis_name = axis_name
        self.eps = eps
        self.momentum = momentum

    def __call__(self, x: jax.Array, state: eqx.nn.State, *, key: jax.Array | None = None,
                 inference: bool | None = None) -> tuple[jax.Array, eqx.nn.State]:
        axes = tuple(range(1, x.ndim))
        per_channel = (-1,) + (1,) * (x.ndim - 1)
        mean, var = state.get(self.running_stats)
        if not (self.inference if inference is None else inference):
            batch_mean = jax.lax.pmean(x.mean(axis=axes), self.axis_name)
            centred = x - batch_mean.reshape(per_channel)
            batch_var = jax.lax.pmean(jnp.square(centred).mean(axis=axes), self.axis_name)
            n = jax.lax.psum(1, self.axis_name) * (x.size // x.shape[0])
            state = state.set(self.running_stats, (
                self.momentum * mean + (1 - self.momentum) * batch_mean,
                self.momentum * var + (1 - self.momentum) * batch_var * (n / (n - 1))))
            mean, var = batch_mean, batch_var
        out = (x - mean.reshape(per_channel)) / jnp.sqrt(var.reshape(per_channel) + self.eps)
        if self.weight is not None:
            out = out * self.weight.reshape(per_channel) + self.bias.reshape(per_channel)
        return out, state
''', targets=("equinox",))


class _Names(NoAttributeHooks, cst.CSTVisitor):
    def __init__(self, target: str) -> None:
        self.target = target
        self.used: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        if self.target in HELPERS.get(node.value, {}):
            self.used.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)  # nnx.Linear is not the Linear helper
        return False


def defined_names(module: cst.Module, *, torch_imports: bool = True) -> set[str]:
    """The names the module binds at its top level (definitions, assignments, imports).
    ``torch_imports=False`` leaves out the names its torch imports bind (``from torch.nn import
    Embedding``), which the conversion removes."""
    names = set()
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for s in stmt.body:
                if isinstance(s, cst.Assign):
                    names |= {t.target.value for t in s.targets if isinstance(t.target, cst.Name)}
                elif isinstance(s, (cst.Import, cst.ImportFrom)) and not isinstance(
                        s.names, cst.ImportStar):
                    names |= {(a.asname.name.value if a.asname else _top(a.name))
                              for a in s.names
                              if (not a.asname or isinstance(a.asname.name, cst.Name))
                              and (torch_imports or not _from_torch(s, a))}
    return names


def _top(name: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(name).split(".")[0]


def _from_torch(s: cst.Import | cst.ImportFrom, alias: cst.ImportAlias) -> bool:
    """``alias`` of ``import torch...`` / ``from torch... import ...`` (not relative)."""
    if isinstance(s, cst.ImportFrom):
        return s.module is not None and not s.relative and _top(s.module) == "torch"
    return _top(alias.name) == "torch"


def _wanted(module: cst.Module, target: str) -> list[str]:
    """The helpers ``module`` calls, and the helpers those call, that it does not define."""
    defined = defined_names(module)
    visitor = _Names(target)
    visit(module, visitor)
    wanted: set[str] = set()
    todo = visitor.used - defined
    while todo:
        name = todo.pop()
        wanted.add(name)
        inner = _Names(target)
        visit(_parsed(HELPERS[name][target][0]), inner)
        todo |= inner.used - defined - wanted - {name}
    return sorted(wanted)


@functools.cache
def _parsed(source: str) -> cst.Module:
    """A helper's definition, parsed once (libcst trees are immutable)."""
    return cst.parse_module(source)


def add_helpers(module: cst.Module, target: str = "nnx") -> tuple[cst.Module, set[str]]:
    """``module`` with the definitions (for ``target``) of the helpers it calls, and the
    imports they need."""
    wanted = _wanted(module, target)
    if not wanted:
        return module, set()
    body = list(module.body)
    at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) or (
                    i == 0 and isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
                for s in stmt.body):
            at = i + 1
        else:
            break
    imports: set[str] = set()
    defs = []
    for name in wanted:
        source, needs = HELPERS[name][target]
        imports |= needs
        # a definition, and what completes it (a custom_vjp's rules and their defvjp call)
        first, *rest = _parsed(source).body
        defs += [first.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]), *rest]
    if at < len(body):
        lines = list(body[at].leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *lines])
    body[at:at] = defs
    return module.with_changes(body=body), imports


# the layer classes with torch's signatures (a layer class used as a value), registered after
# the helpers above, which they may derive from (BatchNorm2d from BatchNorm): the table's order
# is an order in which the definitions run
from torch2jax.passes import helpers_layers, helpers_weight_norm  # noqa: F401
