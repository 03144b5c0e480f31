"""The table of helpers that converted code may call (passes/helpers.py writes them into the
converted file): each helper's source per target and the names it needs imported."""

from __future__ import annotations

TARGETS = ("nnx", "linen", "equinox")
# name -> target -> (source, names it needs imported: keys of torch2jax.convert.IMPORT_LINES)
HELPERS: dict[str, dict[str, tuple[str, set[str]]]] = {}


def helper(name: str, imports: set[str], source: str, targets: tuple[str, ...] = TARGETS) -> None:
    for target in targets:
        HELPERS.setdefault(name, {})[target] = (source.strip() + "\n", imports)
