"""The documentation: the generated supported-API page matches rules/, and every relative link
in docs/ and the README points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch2jax.docs import DOC, render

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_supported_api_page_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/supported-api.md is stale: regenerate it with `python -m torch2jax.docs`")


def test_supported_api_page_lists_every_rule() -> None:
    from torch2jax.ruleset import builtin_rules

    text = DOC.read_text(encoding="utf-8")
    for rule in builtin_rules().all():
        name = f"Tensor.{rule.torch}" if rule.kind == "method" else rule.torch
        assert f"| `{name}` |" in text, name


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_the_guides_exist_and_are_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("getting-started", "converting-a-repository", "reviewing", "pre-commit",
                 "verification", "writing-rules", "supported-api", "nnx-output", "training",
                 "checkpoints"):
        assert (ROOT / "docs" / f"{name}.md").is_file(), name
        assert f"docs/{name}.md" in readme, name
