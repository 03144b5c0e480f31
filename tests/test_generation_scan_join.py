"""A token loop compiled as a jax.lax.scan, whose list of drawn tokens (empty before the loop)
is only joined after it (``torch.cat(out, dim=1)`` / ``torch.stack``): the list is the scan's
stacked output itself, joined by jnp.concatenate / jnp.stack's array form in one reshape.
The list form (``out.extend(out_scanned)``, then an n-way concatenation of n slices) made
XLA compile 200 slices for benchmarks/programs/char_rnn_sample.py: about 4x the twin's
backend-compile time. Greedy tokens as torch's, one compile for two calls."""

from __future__ import annotations

import pytest
from test_generation import TOKEN_LOOP_VARIANTS, _greedy, _key, _rnn_variant

from torch2jax.convert import convert_source

EMPTY = "empty list"


def _source(join: str) -> str:
    source = _rnn_variant(EMPTY)
    return source.replace("    return torch.cat(out, dim=1)\n", join)


JOINS = {
    "cat": ("    return torch.cat(out, dim=1)\n", "out = out_scanned"),
    # stacked on a new last axis: (batch, 1, n)
    "stack": ("    return torch.stack(out, dim=-1)\n", "out = out_scanned"),
    # the list starts with the prompt: it stays a list, extended by the scan's rows
    "prompt first": (None, "out.extend(out_scanned)"),
}


@pytest.mark.parametrize("join", list(JOINS))
def test_a_joined_token_list_is_the_scan_output(join: str, tmp_path) -> None:
    assert EMPTY in TOKEN_LOOP_VARIANTS
    tail, form = JOINS[join]
    source = _rnn_variant("gru") if tail is None else _source(tail)
    code = convert_source(source, path="rnn.py").code
    fn = code.split("def sample(", 1)[1].split("\nif __name__", 1)[0]
    assert "TODO" not in code and "jax.lax.scan(sample_token" in fn, code
    assert form in fn, fn
    assert "out = []" not in fn, fn  # the empty list is dropped with it
    if join != "stack":  # (the "empty list" variant of test_generation runs the cat form)
        return  # (the list form is what test_generation runs)

    def run(mod, model, prompt):
        return mod.sample(model, prompt, 10, temperature=1e-6, **_key(mod.sample))

    want, got, compiles = _greedy(tmp_path, source, code, run, model="CharRNN", prompt=((1,), (5,)))
    assert got.shape == want.shape and (got == want).all(), (got, want)
    assert len([c for c in compiles if "jit(sample)" in c]) == 1, compiles
