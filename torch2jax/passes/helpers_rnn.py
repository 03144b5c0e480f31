"""The recurrent layers' helper classes written into converted files (passes/helpers.py writes
them; rules/sequence.toml names them): torch's nn.LSTM and nn.GRU with num_layers other than 1
or bidirectional, as stacked one-layer RNNs (a reverse one per layer when bidirectional) with
torch's call and return, for NNX and linen.

One template per target; the LSTM and the GRU differ in their cell, in their state (an LSTM's
carry is flax's (c, h), torch's state (h, c)) and in what they return."""

from __future__ import annotations

from torch2jax.passes.helper_registry import helper

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
        x, hs, cs = input, [], []
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
                "                (c, h), out = rnn(x, initial_carry=carry, return_carry=True)\n"
                "                cs.append(c)",
        "returned": "x, (jnp.stack(hs), jnp.stack(cs))",
        "cells": {"nnx": "nnx.OptimizedLSTMCell", "linen": "nn.OptimizedLSTMCell"}},
    "GRU": {
        "gates": "r, z, n", "call": "gru(input, h_0) -> (output, h_n)", "states": "h",
        "step": "                carry = None if hx is None else hx[i]\n"
                "                h, out = rnn(x, initial_carry=carry, return_carry=True)",
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
            _source = _source.replace("x, hs, cs = input, [], []", "x, hs = input, []")
        helper(f"Torch{_torch}", {"jnp", _target}, _source, targets=(_target,))
