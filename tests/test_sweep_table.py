"""The table both sweeps write (benchmarks/sweep_table.py): one row per family and target, the
Summary's counts per target, and the most common reasons of failure per target where a sweep
ran several (docs/timm-sweep.md's linen and equinox columns, issues 32 and 34)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from sweep_table import Result, write_markdown


def _section(text: str, head: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(head) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_three_targets_rows_summary_and_reasons_per_target(tmp_path):
    results = [
        Result("a.py", "a_tiny", "nnx", True, 1, True, 1e-15),
        Result("a.py", "a_tiny", "linen", True, 1, False, reason="building failed: KeyError 'x'"),
        Result("a.py", "a_tiny", "equinox", True, 1, True, 2e-15),
        Result("b.py", "b_s", "nnx", True, 0, False, reason="output differs by 3"),
        Result("b.py", "b_s", "linen", True, 0, False, reason="building failed: KeyError 'y'"),
        Result("c.py", "c_s", "linen", True, 0, False, reason="output differs by 4"),
    ]
    text = write_markdown(tmp_path / "t.md", "T", "pre", results)
    assert (tmp_path / "t.md").read_text() == text
    summary = _section(text, "## Summary")
    assert "| equinox | 1 | 1 | 100% |" in summary
    assert "| linen | 0 | 3 | 0% |" in summary
    assert "| nnx | 1 | 2 | 50% |" in summary
    reasons = _section(text, "## Most common reasons of failure")
    # a table per target, each counting its own failures only (equinox has none)
    linen = reasons[reasons.index("### linen") + 1:reasons.index("### nnx")]
    assert "| building failed: KeyError … | 2 |" in linen
    assert "| output differs by N | 1 |" in linen
    nnx = reasons[reasons.index("### nnx") + 1:]
    assert [ln for ln in nnx if ln.startswith("| ") and "count" not in ln] == [
        "| output differs by N | 1 |"]
    families = [ln for ln in _section(text, "## Families") if ln.startswith("| ") and ".py" in ln]
    assert [ln.split(" | ")[:3] for ln in families] == [
        ["| a.py", "a_tiny", "equinox"], ["| a.py", "a_tiny", "linen"], ["| a.py", "a_tiny", "nnx"],
        ["| b.py", "b_s", "linen"], ["| b.py", "b_s", "nnx"], ["| c.py", "c_s", "linen"]]


def test_one_target_keeps_a_single_reasons_table(tmp_path):
    results = [Result("a.py", "a", "nnx", reason="boom 1"), Result("b.py", "b", "nnx",
                                                                   reason="boom 2")]
    text = write_markdown(tmp_path / "t.md", "T", "pre", results)
    assert "###" not in text
    assert "| reason | count |\n|---|---|\n| boom N | 2 |" in text


def test_short_reason_drops_absolute_paths_and_keeps_relative_ones():
    from sweep_table import short_reason

    text = ("importing timm/models/beit.py failed: TypeError: x (at /x/pkg_12/timm/layers/a.py:3)"
            " at 0x7f3a\nsecond line")
    assert short_reason(text, 200) == (
        "importing timm/models/beit.py failed: TypeError: x (at a.py:3) at 0x…")


def test_reason_class_counts_one_reason_across_files():
    from sweep_table import common_reasons

    results = [Result(f"{n}.py", n, "linen", reason=f"importing timm/models/{n}.py failed: "
                      f"TypeError: non-default argument '{a}' follows default argument")
               for n, a in (("beit", "x"), ("cait", "y"))]
    text = "importing ….py failed: TypeError: non-default argument … follows default argument"
    assert common_reasons(results) == [(text, 2)]
