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
# code is not markdown: fenced blocks and inline code spans hold no links (x[i](epoch))
CODE = re.compile(r"^```.*?^```|`[^`\n]+`", re.DOTALL | re.MULTILINE)


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
    for target in LINK.findall(CODE.sub("", page.read_text(encoding="utf-8"))):
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


FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_install_commands_work_without_a_package_index(page: Path) -> None:
    """torch2jax-port is not on a package index: a command in the docs installs it from a
    checkout (``pip install -e .``) or from the repository (``@ git+<repository URL>``)."""
    for block in FENCE.findall(page.read_text(encoding="utf-8")):
        for line in block.splitlines():
            if "pip install" in line and "torch2jax-port" in line:
                assert "@ git+" in line, f"{page.name}: {line.strip()}"


def test_ci_builds_the_wheel_and_runs_the_readmes_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = readme.split("Run the tests:\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert any(line.startswith(command + " ") for line in ci.splitlines()), command
    assert "python -m build --wheel" in ci and "torch2jax_port-*.whl" in ci
