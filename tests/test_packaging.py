"""The distribution ships every subpackage of torch2jax. pyproject.toml lists them by name (the
rule tables are mapped in from rules/), so a new subpackage missing from that list would be
left out of the wheel: the installed converter would then fail on import, while this checkout,
installed in editable mode, works. .ci/run builds and runs the wheel; this catches it sooner."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_in_the_distribution() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "torch2jax").rglob("__init__.py")}
    assert found, "no package found"
    assert found - listed == set()
    assert listed - found == {"torch2jax.rules"}  # rules/ at the root, see package-dir
