"""The table both sweeps write (transformers_sweep.py and timm_sweep.py).

A sweep converts one file per family and verifies a small model built from it. Each row is
one family (a transformers model file, a timm model file); a target's result is one
``Result``. ``write_markdown`` writes the table a sweep documents (docs/*-sweep.md): one row per
family and target, the counts per target, and the most common first reasons of the failures
(a table per target where there are several).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from pathlib import Path


@dataclasses.dataclass
class Result:
    family: str  # the model file (or family) swept
    entry: str  # the class or entry point built
    target: str  # nnx, linen or equinox
    converted: bool = False  # the file converted without an internal error
    todos: int = 0  # TODO(torch2jax) markers in the converted file
    verified: bool = False  # outputs (and gradients) matched torch within tolerance
    max_diff: float | None = None  # the largest difference verify measured
    reason: str = ""  # the first reason of a failure (empty when verified)
    seconds: float = 0.0


def short_reason(text: str, width: int = 110) -> str:
    """The first line of a failure, without addresses, paths or numbers that make rows differ."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"(?<![\w.])(/[\w.\-]+)+/", "", line)  # absolute paths: timm/models/ stays
    return line[:width]


def reason_class(reason: str) -> str:
    """The reason with its specifics (names in quotes, numbers, shapes) taken out, to count."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "…", reason)
    text = re.sub(r"[\w./\-]+\.py\b", "….py", text)  # the file it names: one class across files
    text = re.sub(r"\(?\d[\d, ]*\)?", "N", text)
    return text[:90]


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1e}"
    return str(value).replace("|", "\\|")


def summary(results: list[Result]) -> dict[str, tuple[int, int]]:
    """Per target: (verified, families)."""
    out: dict[str, list[int]] = {}
    for r in results:
        row = out.setdefault(r.target, [0, 0])
        row[0] += r.verified
        row[1] += 1
    return {t: (v, n) for t, (v, n) in out.items()}


def common_reasons(results: list[Result], top: int = 10) -> list[tuple[str, int]]:
    counter = collections.Counter(reason_class(r.reason) for r in results if not r.verified)
    return counter.most_common(top)


def write_markdown(path: Path, title: str, preamble: str, results: list[Result]) -> str:
    lines = [f"# {title}", "", preamble.strip(), "", "## Summary", "",
             "| target | verified | families | share |", "|---|---|---|---|"]
    for target, (v, n) in sorted(summary(results).items()):
        lines.append(f"| {target} | {v} | {n} | {100 * v / max(n, 1):.0f}% |")
    lines += ["", "## Most common reasons of failure"]
    targets = sorted({r.target for r in results})
    for target in targets:  # each target its own table where there are several
        mine = [r for r in results if r.target == target] if len(targets) > 1 else results
        lines += [""] + ([f"### {target}", ""] if len(targets) > 1 else [])
        lines += ["| reason | count |", "|---|---|"]
        lines += [f"| {_cell(reason)} | {count} |" for reason, count in common_reasons(mine)]
    lines += ["", "## Families", "",
              "| family | entry | target | converted | TODOs | verified | max diff | reason |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.family, r.target)):
        lines.append("| " + " | ".join(_cell(v) for v in (
            r.family, r.entry, r.target, r.converted, r.todos, r.verified, r.max_diff,
            short_reason(r.reason))) + " |")
    text = "\n".join(lines) + "\n"
    Path(path).write_text(text)
    return text
