"""The recurrent layers' helper classes written into converted files (passes/helpers.py writes
them; rules/sequence.toml names them): torch's nn.LSTM and nn.GRU with num_layers other than 1
or bidirectional, as stacked one-layer RNNs (a reverse one per layer when bidirectional) with
torch's call and return, for NNX and linen.

One template per target; the LSTM and the GRU differ in their cell, in their state (an LSTM's
carry is flax's (c, h), torch's state (h, c)) and in what they return."""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

# torch's LSTM cell keeps two biases, b_ih and b_hh; flax's OptimizedLSTMCell (and
# eqx.nn.LSTMCell) one, their sum: the same forward, but an optimizer step on the sum is not
# torch's step on each (plain SGD moves the sum twice as far in torch, weight decay acts on
# each). These cells keep torch's four tensors.
helper("TorchLSTMCell", {"Any", "nnx"}, '''
class TorchLSTMCell(nnx.OptimizedLSTMCell):
    """nn.LSTMCell / torch's LSTM cell: an nnx.OptimizedLSTMCell (fused gates i, f, g, o as
    torch's) whose input-side dense has a bias too: dense_i's is torch's b_ih, dense_h's b_hh."""

    def __init__(self, in_features: int, hidden_features: int, *, rngs: nnx.Rngs,
                 **kwargs: Any) -> None:
        super().__init__(in_features, hidden_features, rngs=rngs, **kwargs)
        self.dense_i = nnx.Linear(
            in_features, 4 * hidden_features,
            kernel_init=kwargs.get("kernel_init", nnx.initializers.lecun_normal()),
            bias_init=kwargs.get("bias_init", nnx.initializers.zeros_init()),
            dtype=self.dtype, param_dtype=self.param_dtype, rngs=rngs)
''', targets=("nnx",))


helper("TorchLSTMCell", {"jax", "jnp", "linen"}, '''
class TorchLSTMCell(nn.OptimizedLSTMCell):
    """nn.LSTMCell / torch's LSTM cell: an nn.OptimizedLSTMCell (gates i, f, g, o as torch's)
    with fused input and hidden-side denses, dense_i and dense_h, each with a bias: torch's
    b_ih and b_hh."""

    @nn.compact
    def __call__(self, carry: tuple[jax.Array, jax.Array], inputs: jax.Array
                 ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        c, h = carry
        dense = {"features": 4 * self.features, "dtype": self.dtype,
                 "param_dtype": self.param_dtype, "bias_init": self.bias_init}
        y = nn.Dense(kernel_init=self.kernel_init, name="dense_i", **dense)(inputs) + nn.Dense(
            kernel_init=self.recurrent_kernel_init, name="dense_h", **dense)(h)
        i, f, g, o = jnp.split(y, 4, axis=-1)
        new_c = self.gate_fn(f) * c + self.gate_fn(i) * self.activation_fn(g)
        new_h = self.gate_fn(o) * self.activation_fn(new_c)
        return (new_c, new_h), new_h
''', targets=("linen",))


helper("TorchLSTMCell", {"jax", "jnp"}, '''
class TorchLSTMCell(eqx.Module):
    """nn.LSTMCell / torch's LSTM cell on one example, with torch's parameters (gates i, f, g,
    o) and initialisation (U(-1/sqrt(H), 1/sqrt(H)) everywhere), called as eqx.nn.LSTMCell:
    cell(input, (h, c)) -> (h', c'). eqx.nn.LSTMCell keeps b_ih + b_hh as one bias; this cell
    keeps torch's four tensors."""

    weight_ih: jax.Array
    weight_hh: jax.Array
    bias_ih: jax.Array
    bias_hh: jax.Array
    input_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)

    def __init__(self, input_size: int, hidden_size: int, *, key: jax.Array) -> None:
        lim = hidden_size**-0.5
        shapes = [(4 * hidden_size, input_size), (4 * hidden_size, hidden_size),
                  (4 * hidden_size,), (4 * hidden_size,)]
        self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh = (
            jax.random.uniform(k, s, minval=-lim, maxval=lim)
            for k, s in zip(jax.random.split(key, 4), shapes))
        self.input_size = input_size
        self.hidden_size = hidden_size

    def __call__(self, input: jax.Array, hidden: tuple[jax.Array, jax.Array], *,
                 key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        h, c = hidden
        y = self.weight_ih @ input + self.bias_ih + self.weight_hh @ h + self.bias_hh
        i, f, g, o = jnp.split(y, 4)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c), c
''', targets=("equinox",))

_DOC = '''"""nn.{torch}(input_size, hidden_size, num_layers, bias=True, batch_first, dropout,
    bidirectional), gates {gates} as torch's: num_layers layers of
    {rnn}({cell}), layer k reading layer k - 1's output, dropout on every
    layer's output but the last{off}. Bidirectional: each layer also
    runs a reverse RNN, {reverse}, its outputs after the forward ones on the
    feature axis. Called as torch's: {call},
    {states} of (num_layers * directions, N, H) in torch's order (layer 0 forward, layer 0
    reverse, layer 1 forward, ...)."""'''

_CALL = '''
    def __call__(self, input, hx=None):
        # a PackedSequence (pack_padded_sequence), (padded batch first, lengths): each sequence
        # runs to its own length, the reverse direction from its own last step
        packed = isinstance(input, tuple)
        x, lengths = (input[0], jnp.asarray(input[1])) if packed else (input, None)
        if packed and not self.batch_first:
            x = jnp.swapaxes(x, 0, 1)
        hs, cs = [], []
        directions = 2 if len(self.reverse_layers) else 1
        for k, layer in enumerate(self.layers):
            if k > 0:
                x = self.{drop}(x)
            outs = []
            for d, rnn in enumerate([layer, *self.reverse_layers[k:k + 1]]):
                i = directions * k + d
{step}
                outs.append(out)
                hs.append(h)
            x = jnp.concatenate(outs, axis=-1) if len(outs) > 1 else outs[0]
        if packed:  # a PackedSequence back (its padded steps as they come: pad_packed_sequence)
            x = type(input)(x if self.batch_first else jnp.swapaxes(x, 0, 1), lengths)
        return {returned}
'''

_NNX = '''
class {name}(nnx.Module):
    {doc}

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, *, rngs: nnx.Rngs) -> None:
        directions = 2 if bidirectional else 1

        def rnn(k: int, reverse: bool) -> nnx.RNN:
            features = input_size if k == 0 else directions * hidden_size
            return nnx.RNN({cell}(features, hidden_size, rngs=rngs),
                           time_major=not batch_first, reverse=reverse, keep_order=True)

        self.layers = nnx.List([rnn(k, False) for k in range(num_layers)])
        self.reverse_layers = nnx.List([rnn(k, True) for k in range(num_layers)
                                        if bidirectional])
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.batch_first, self.bidirectional = batch_first, bidirectional
'''

_LINEN = '''
class {name}(nn.Module):
    {doc}

    hidden_size: int
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    deterministic: bool = True

    def setup(self) -> None:
        self.layers = [
            nn.RNN({cell}(self.hidden_size), time_major=not self.batch_first)
            for _ in range(self.num_layers)]
        self.reverse_layers = [
            nn.RNN({cell}(self.hidden_size), time_major=not self.batch_first,
                   reverse=True, keep_order=True)
            for _ in range(self.num_layers if self.bidirectional else 0)]
        self.drop = nn.Dropout(self.dropout, deterministic=self.deterministic)
'''

_KINDS = {
    "LSTM": {
        "gates": "i, f, g, o", "call": "lstm(input, (h_0, c_0)) -> (output, (h_n, c_n))",
        "states": "h and c",
        "step": "                carry = None if hx is None else (hx[1][i], hx[0][i])\n"
                "                (c, h), out = rnn(x, initial_carry=carry, seq_lengths=lengths,\n"
                "                                  return_carry=True)\n"
                "                cs.append(c)",
        "returned": "x, (jnp.stack(hs), jnp.stack(cs))",
        "cells": {"nnx": "TorchLSTMCell", "linen": "TorchLSTMCell"}},
    "GRU": {
        "gates": "r, z, n", "call": "gru(input, h_0) -> (output, h_n)", "states": "h",
        "step": "                carry = None if hx is None else hx[i]\n"
                "                h, out = rnn(x, initial_carry=carry, seq_lengths=lengths,\n"
                "                             return_carry=True)",
        "returned": "x, jnp.stack(hs)",
        "cells": {"nnx": "TorchGRUCell", "linen": "TorchGRUCell"}},
}

for _torch, _kind in _KINDS.items():
    for _target, _shell, _rnn, _reverse, _drop, _off in [
            ("nnx", _NNX, "nnx.RNN", "reverse_layers[k]", "dropout", ""),
            ("linen", _LINEN, "nn.RNN", "reverse_layers_k", "drop", " (off when deterministic)")]:
        _cell = _kind["cells"][_target]
        _doc = _DOC.format(torch=_torch, rnn=_rnn, cell=_cell, gates=_kind["gates"], off=_off,
                           reverse=_reverse, call=_kind["call"], states=_kind["states"])
        _source = _shell.format(name=f"Torch{_torch}", doc=_doc, cell=_cell) + _CALL.format(
            drop=_drop, step=_kind["step"], returned=_kind["returned"])
        if _torch == "GRU":
            _source = _source.replace("hs, cs = [], []", "hs = []")
        helper(f"Torch{_torch}", {"jnp", _target}, _source, targets=(_target,))

# torch's packed sequences (nn.utils.rnn.pack_padded_sequence / pad_packed_sequence): kept
# padded, with the lengths, which the TorchLSTM / TorchGRU helpers above run each sequence to
_PACKED = '''
class PackedSequence(NamedTuple):
    """torch's PackedSequence kept padded: padded, the batch (N, T, *) batch first whatever the
    packing's batch_first, and lengths (N,), each sequence's number of valid steps. The
    TorchLSTM / TorchGRU helpers run each sequence to its own length; pad_packed_sequence reads
    the result back. torch's data, batch_sizes and sorted_indices are not kept."""

    padded: jax.Array
    lengths: jax.Array
'''

helper("PackedSequence", {"jax", "NamedTuple"}, _PACKED, targets=("nnx", "linen"))

helper("pack_padded_sequence", {"Any", "jnp"}, '''
def pack_padded_sequence(input: jax.Array, lengths: Any, batch_first: bool = False
                         ) -> PackedSequence:
    """nn.utils.rnn.pack_padded_sequence(input, lengths, batch_first): the padded batch and its
    lengths. (torch's enforce_sorted=True only refuses lengths that are not decreasing: the
    output keeps the batch's order either way.)"""
    return PackedSequence(input if batch_first else jnp.swapaxes(input, 0, 1),
                          jnp.asarray(lengths))
''', targets=("nnx", "linen"))

helper("pad_packed_sequence", {"jax", "jnp"}, '''
def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None
                        ) -> tuple[jax.Array, jax.Array]:
    """nn.utils.rnn.pad_packed_sequence: (output, lengths), padding_value at the steps past each
    sequence's length. torch's time axis is total_length when given, else the longest
    length, max(lengths), known only at run time: without total_length this one keeps the
    length the batch was padded to, where torch's output lacks the trailing steps that are
    padding in every sequence."""
    x, lengths = sequence
    if total_length is not None:
        x = x[:, :total_length]
        x = jnp.pad(x, [(0, 0), (0, total_length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
    valid = jnp.arange(x.shape[1]) < lengths[:, None]
    x = jnp.where(valid.reshape(valid.shape + (1,) * (x.ndim - 2)), x, padding_value)
    return (x if batch_first else jnp.swapaxes(x, 0, 1)), lengths
''', targets=("nnx", "linen"))
