"""The programs of ``tests/data/programs`` as the ``verify --program`` tests use them: a
program edited into a variant (each edit must apply), written into a fresh ``src`` folder of
the test's tmp folder (the current folder, as a user runs it) and converted there."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch2jax.verify.run import convert_tree

PROGRAMS = Path(__file__).resolve().parent / "data" / "programs"


def edited(name: str, replacements: Sequence[tuple[str, str]] = ()) -> str:
    """The program ``name``'s source with each ``(old, new)`` applied (``old`` must be in it)."""
    source = (PROGRAMS / name).read_text()
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


def converted_program(tmp_path: Path, monkeypatch, name: str,
                      source: str | None = None) -> tuple[Path, Path, str]:
    """``(the program, its NNX conversion, the conversion's text)``: ``source`` (the program
    ``name`` as it is by default) written as ``src/<name>`` under ``tmp_path``, the current
    folder, and converted into ``out/`` with no TODO left."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    program = tmp_path / "src" / name
    program.write_text(edited(name) if source is None else source)
    assert convert_tree(program, tmp_path / "out", "nnx", None) == 0
    converted = tmp_path / "out" / name
    return program, converted, converted.read_text()
