"""torch's stacked ``nn.LSTM`` (``num_layers`` not the literal 1) under ``--target equinox``.

The NNX translation writes the ``TorchLSTM`` helper class (passes/helpers.py: stacked
``nnx.RNN`` layers); on equinox it is the helper below, an ``eqx.Module`` called on the batch
as torch calls the layer: ``lstm(input, (h_0, c_0)) -> (output, (h_n, c_n))``, the input
``(L, N, I)`` (``(N, L, I)`` with ``batch_first``), ``h`` and ``c`` ``(num_layers, N, H)``: the
batch is axis 1 of the states, so a module that holds one is kept batched
(docs/equinox.md). Each layer is a cell scanned over time (``jax.lax.scan``), layer ``k``
reading layer ``k - 1``'s output, torch's dropout on every layer's output but the last.

The parameters are torch's four tensors per layer in torch's layout and gate order (i, f, g,
o), initialised as torch's (U(-1/sqrt(H), 1/sqrt(H))), read under torch's names
(``lstm.weight_ih_l1``: verify's weight transfer finds them). ``eqx.nn.LSTMCell`` is not used:
it keeps ``b_ih + b_hh`` as one bias, and an optimizer step on the sum is not torch's step on
each of the two (plain SGD moves the sum twice as far in torch).
"""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

HELPER = "TorchLSTM"

helper(HELPER, {"jax", "jnp"}, '''
class TorchLSTM(eqx.Module):
    """torch's nn.LSTM(input_size, hidden_size, num_layers, bias=True, batch_first, dropout)
    on a batch, called as torch's: lstm(input, (h_0, c_0)) -> (output, (h_n, c_n)), h and c
    (num_layers, N, H). Layer k's tensors are torch's (gates i, f, g, o): weight_ih[k],
    weight_hh[k], bias_ih[k], bias_hh[k], also read as torch's names (weight_ih_l0, ...)."""

    weight_ih: list
    weight_hh: list
    bias_ih: list
    bias_hh: list
    dropout: eqx.nn.Dropout
    hidden_size: int = eqx.field(static=True)
    batch_first: bool = eqx.field(static=True)

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, *,
                 key: jax.Array) -> None:
        if not bias:
            raise NotImplementedError("TorchLSTM: bias=False is not translated")
        lim = hidden_size**-0.5
        keys = jax.random.split(key, 4 * num_layers)
        params = [[], [], [], []]
        for k in range(num_layers):
            shapes = [(4 * hidden_size, input_size if k == 0 else hidden_size),
                      (4 * hidden_size, hidden_size), (4 * hidden_size,), (4 * hidden_size,)]
            for j, s in enumerate(shapes):
                params[j].append(jax.random.uniform(keys[4 * k + j], s, minval=-lim, maxval=lim))
        self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh = params
        self.dropout = eqx.nn.Dropout(dropout)
        self.hidden_size = hidden_size
        self.batch_first = batch_first

    def __getattr__(self, name: str):
        base, sep, k = name.rpartition("_l")  # torch's names: weight_ih_l0, ..., bias_hh_l1
        if sep and k.isdigit() and base in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            return getattr(self, base)[int(k)]
        raise AttributeError(name)

    def __call__(self, input: jax.Array, hx=None, *, key: jax.Array | None = None):
        x = jnp.swapaxes(input, 0, 1) if self.batch_first else input  # (L, N, I)
        layers = len(self.weight_ih)
        keys = [None] * layers if key is None else list(jax.random.split(key, layers))
        hs, cs = [], []
        for k in range(layers):
            if k > 0:
                x = self.dropout(x, key=keys[k])
            zeros = jnp.zeros((x.shape[1], self.hidden_size), x.dtype)
            carry = (zeros, zeros) if hx is None else (hx[0][k], hx[1][k])
            w_ih, w_hh = self.weight_ih[k], self.weight_hh[k]
            b = self.bias_ih[k] + self.bias_hh[k]

            def step(state, xt, w_ih=w_ih, w_hh=w_hh, b=b):
                h, c = state
                i, f, g, o = jnp.split(xt @ w_ih.T + h @ w_hh.T + b, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
                h = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h, c), h

            (h, c), x = jax.lax.scan(step, carry, x)
            hs.append(h)
            cs.append(c)
        out = jnp.swapaxes(x, 0, 1) if self.batch_first else x
        return out, (jnp.stack(hs), jnp.stack(cs))
''', targets=("equinox",))
