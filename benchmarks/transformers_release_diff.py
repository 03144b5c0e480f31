"""Two transformers releases compared (issue 31): what changed, which rows to rerun, what differs.

The sweep (transformers_sweep.py) is about ten CPU-hours over all 538 modeling files; this
script makes a smaller, stated comparison with an older release possible:

* ``classes``: the modeling files of the two ``transformers/models/`` folders, each put in a
  class: ``new`` (only in the newer release), ``gone`` (only in the older), ``unchanged``
  (byte-identical), ``cache-rename`` (changed, and the change includes 5.24's renaming of
  the ``past_key_values`` argument and output to ``cache``), ``other-change``; and the shared
  modules (outside ``models/``) that differ;
* ``order``: the families to sweep under the older release, a fixed random order (``--seed``)
  that takes the strata (class x the newer release's row: verifies or fails; rows that timed
  out and files without a row left out) in turn, so that any prefix of it is a balanced sample;
* ``table``: the rows of the older release's sweep (``--jsonl``, from transformers_sweep.py)
  beside the newer release's rows (the Families table of ``--doc``), in markdown.

Usage::

    python benchmarks/transformers_release_diff.py classes OLD NEW
    python benchmarks/transformers_release_diff.py order OLD NEW --seed 523 --doc TABLE
    python benchmarks/transformers_release_diff.py table OLD NEW --jsonl sweep523.jsonl

where OLD and NEW are the two installed ``transformers`` package folders and TABLE the newer
release's sweep table the order was drawn from (docs/transformers-sweep.md as it stood then:
``git show COMMIT:docs/transformers-sweep.md``; a row rerun since moves a family's stratum).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep_table import short_reason

DOC = Path(__file__).resolve().parent.parent / "docs" / "transformers-sweep.md"
CLASSES = ("cache-rename", "other-change", "unchanged")
# the strata in the order a round of the sample takes them (a changed file that verifies
# twice a round: the rows a release change could lower)
PATTERN = (("unchanged", "verifies"), ("cache-rename", "verifies"), ("unchanged", "fails"),
           ("other-change", "verifies"), ("cache-rename", "fails"), ("cache-rename", "verifies"),
           ("other-change", "fails"), ("unchanged", "verifies"), ("unchanged", "fails"))


def _files(root: Path) -> dict[str, Path]:
    return {p.stem[len("modeling_"):]: p for p in sorted(root.glob("models/*/modeling_*.py"))}


def classes(old: Path, new: Path) -> dict:
    """Each modeling file's class, and the shared modules that differ."""
    a, b = _files(old), _files(new)
    out: dict = {"new": sorted(set(b) - set(a)), "gone": sorted(set(a) - set(b)), "files": {}}
    for name in sorted(set(a) & set(b)):
        ta, tb = a[name].read_text(), b[name].read_text()
        if ta == tb:
            kind = "unchanged"
        elif "past_key_values" in ta and 'new_name="cache"' in tb:
            kind = "cache-rename"
        else:
            kind = "other-change"
        out["files"][name] = kind
    shared = []
    for p in sorted(old.rglob("*.py")):
        rel = p.relative_to(old)
        if rel.parts[0] in ("models", "cli", "commands") or "__pycache__" in rel.parts:
            continue
        q = new / rel
        if q.exists() and not filecmp.cmp(p, q, shallow=False):
            shared.append(str(rel))
    out["shared"] = shared
    return out


def doc_rows(doc: Path = DOC) -> dict[str, list[str]]:
    """The newer release's rows: family -> the Families table's cells."""
    rows = {}
    for line in doc.read_text().split("## Families", 1)[1].splitlines():
        if line.startswith("| ") and not line.startswith("| family"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells
    return rows


def _status(row: list[str] | None) -> str:
    if row is None:
        return "no row"
    if row[5] == "yes":
        return "verifies"
    return "timeout" if "time" in row[7].lower() else "fails"


def order(old: Path, new: Path, seed: int, doc: Path = DOC) -> list[tuple[str, str, str]]:
    """(family, class, newer row's status), the strata taken in turn, each shuffled."""
    kinds = classes(old, new)["files"]
    rows = doc_rows(doc)
    strata: dict[tuple[str, str], list[str]] = {}
    for name, kind in sorted(kinds.items()):
        status = _status(rows.get(name))
        if status in ("verifies", "fails"):
            strata.setdefault((kind, status), []).append(name)
    rng = random.Random(seed)
    for names in strata.values():  # in the order the sorted families first name them
        rng.shuffle(names)
    out = []
    while any(strata.get(k) for k in PATTERN):
        for key in PATTERN:
            if strata.get(key):
                out.append((strata[key].pop(), *key))
    return out


def table(old: Path, new: Path, jsonl: Path, doc: Path = DOC) -> str:
    """The older release's rows beside the newer's, markdown."""
    kinds = classes(old, new)["files"]
    rows = doc_rows(doc)
    got = {}
    for line in jsonl.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            got[r["family"]] = r  # the newer row kept
    lines = ["| family | file | old: verified | old: reason | new: verified | new: reason | same |",
             "|---|---|---|---|---|---|---|"]
    for name in sorted(got):
        r, row = got[name], rows.get(name)
        new_ok = row[5] if row else ""
        new_reason = row[7] if row else ""
        old_ok = "yes" if r["verified"] else "no"
        old_reason = short_reason(r["reason"]).replace("|", "\\|")[:100]
        if old_ok != new_ok:
            same = "**no**"
        elif old_reason[:60] != new_reason.replace("|", "\\|")[:60]:
            same = "verified the same, reason differs"
        else:
            same = "yes"
        lines.append(f"| {name} | {kinds.get(name, 'new')} | {old_ok} | {old_reason} | "
                     f"{new_ok} | {new_reason[:100]} | {same} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("classes", "order", "table"))
    ap.add_argument("old", type=Path, help="the older release's transformers package folder")
    ap.add_argument("new", type=Path, help="the newer release's transformers package folder")
    ap.add_argument("--seed", type=int, default=523)
    ap.add_argument("--jsonl", type=Path)
    ap.add_argument("--doc", type=Path, default=DOC,
                    help="the newer release's sweep table (docs/transformers-sweep.md)")
    args = ap.parse_args()
    if args.what == "classes":
        got = classes(args.old, args.new)
        counts = {k: sum(v == k for v in got["files"].values()) for k in CLASSES}
        print(json.dumps({"counts": counts, "new": got["new"], "gone": got["gone"],
                          "shared": got["shared"]}, indent=1))
    elif args.what == "order":
        for name, kind, status in order(args.old, args.new, args.seed, args.doc):
            print(name, kind, status)
    else:
        print(table(args.old, args.new, args.jsonl, args.doc))


if __name__ == "__main__":
    main()
