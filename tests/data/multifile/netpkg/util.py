"""No torch here: copied through unchanged."""


def widen(dim: int, factor: int = 2) -> int:
    return dim * factor
