"""torch's packed sequences, ``nn.utils.rnn.pack_padded_sequence`` and ``pad_packed_sequence``
(rules/sequence.toml): the helpers of passes/helpers_rnn.py, which keep the batch padded with
its lengths (a ``PackedSequence`` of two arrays); a file that packs has its LSTMs and GRUs
translated as the TorchLSTM / TorchGRU helpers, which run each sequence to its own length
(``seq_lengths``). NNX and linen; the equinox target keeps the calls, marked."""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import Untranslatable, arg, call
from torch2jax.passes.registry import Site, special


def _given(site: Site, names: tuple[str, ...]) -> list[cst.Arg]:
    """The torch arguments ``names`` as given (positional or keyword)."""
    return [arg(site.get(n), n if n in site.args.keywords else None)
            for n in names if site.args.has(n)]


def _check(site: Site) -> None:
    if not site.packed:  # (the equinox target's translation: its RNNs are not the helpers)
        raise Untranslatable(f"{site.rule.torch}: translated for the NNX and linen targets only")
    if site.args.star or site.args.extra_positional:
        raise Untranslatable(f"{site.rule.torch} with *args / **kwargs")
    name = site.rule.torch.rsplit(".", 1)[-1]
    if name in site.defined or "PackedSequence" in site.defined:
        raise Untranslatable(f"the file defines its own {name} or PackedSequence: rename it, the "
                             "converted file needs the name for its helper")


@special("pack_padded_sequence")
def pack_padded_sequence(site: Site) -> cst.BaseExpression:
    """``nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first, enforce_sorted)`` ->
    ``pack_padded_sequence(x, lengths, batch_first)``, the helper: the padded batch and its
    lengths. enforce_sorted is left out: torch's only refuses unsorted lengths (the batch's
    order is kept either way)."""
    _check(site)
    if site.get("input") is None or site.get("lengths") is None:
        raise Untranslatable("pack_padded_sequence without input or lengths")
    if site.args.has("enforce_sorted") and site.lit("enforce_sorted") is not False:
        site.note("enforce_sorted=True: torch raises on lengths that are not decreasing, the "
                  "converted pack_padded_sequence does not check them", "info")
    return call("pack_padded_sequence", *_given(site, ("input", "lengths", "batch_first")))


@special("pad_packed_sequence")
def pad_packed_sequence(site: Site) -> cst.BaseExpression:
    """``nn.utils.rnn.pad_packed_sequence(packed, batch_first, padding_value, total_length)``
    -> the helper of the same name and arguments: (output, lengths), padding_value past each
    length. Without total_length the output keeps the length the batch was padded to (torch's
    is max(lengths), known only at run time): noted."""
    _check(site)
    if site.get("sequence") is None:
        raise Untranslatable("pad_packed_sequence without a sequence")
    if site.get("total_length") is None:
        site.note("pad_packed_sequence: the output's time axis is the padded input's length, "
                  "torch's the longest sequence's (max(lengths)): the steps past it, padding "
                  "in every sequence, are extra (read the output's length from lengths.max(), "
                  "or pass total_length)", "warning")
    return call("pad_packed_sequence", *_given(
        site, ("sequence", "batch_first", "padding_value", "total_length")))
