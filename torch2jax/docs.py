"""Generate ``docs/supported-api.md`` from the rule tables in ``rules/``.

    python -m torch2jax.docs            # rewrite docs/supported-api.md
    python -m torch2jax.docs --check    # exit 1 when the committed file is stale
    python -m torch2jax.docs --stdout   # print it

The page lists every torch API that has a rule: what it becomes on the NNX target, what is
written out or renamed, the weight layout for layers, and the semantic difference the rule
handles (its ``notes``). A test fails when the committed page does not match the rules.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from torch2jax.ruleset import Rule, RuleSet, builtin_rules

DOC = Path(__file__).resolve().parent.parent / "docs" / "supported-api.md"
KINDS = (("layer", "Layers (`nn.Module` classes)"), ("function", "Functions"),
         ("method", "Tensor methods"))


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _target(rule: Rule) -> str:
    jax = rule.targets.get("nnx") or rule.jax or ""
    if rule.kind == "method" and jax.startswith("."):
        jax = "x" + jax
    shown = f"`{jax}`" if jax else ""
    if rule.special:
        shown = (shown + " " if shown else "") + f"(transform `{rule.special}`)"
    for target, spec in rule.target_layers.items():  # built by the rule's target table
        shown += f"; {target}: `{spec.cls}{'1d/2d/3d' if spec.rank else ''}`"
    return shown


def _details(rule: Rule) -> str:
    parts = []
    if rule.rename:
        parts.append("renamed: " + ", ".join(f"`{k}`→`{v}`" for k, v in rule.rename.items()))
    if rule.emit:
        parts.append("written out: " + ", ".join(f"`{k}={v!r}`" for k, v in rule.emit.items()))
    if rule.drop:
        parts.append("dropped: " + ", ".join(f"`{d}`" for d in rule.drop))
    if rule.weights:
        parts.append("weights: " + ", ".join(
            f"`{k}`→" + (f"`{w.to}`" if w.to else "dropped")
            + (f" ({w.layout})" if w.layout != "as_is" else "") for k, w in rule.weights.items()))
    if rule.layout != "torch":
        parts.append(f"layout: {rule.layout}")
    return "; ".join(parts)


def render(rules: RuleSet | None = None) -> str:
    rules = rules or builtin_rules()
    by_kind: dict[str, list[Rule]] = defaultdict(list)
    for rule in rules.all():
        by_kind[rule.kind].append(rule)
    # an alias or family member shares its notes with the rule it was declared with
    out = [
        "# Supported PyTorch API",
        "",
        ("<!-- Generated from rules/*.toml by `python -m torch2jax.docs`; do not edit by hand."
         " tests/test_docs.py fails when this file is stale. -->"),
        "",
        ("Every torch API the converter translates, on the NNX target, with what the rule "
         "writes out and the semantic difference it handles. A torch function not listed "
         "whose `Tensor` method is (`torch.masked_fill(x, mask, v)`) is that method on its "
         "first argument, and a `Tensor` method not listed whose function is (`x.mul(y)`) "
         "is that function of its receiver. Any other function not listed is left in place "
         "with a `# TODO(torch2jax)` marker, and so is any other method that torch's tensors "
         "have and a `jax.Array` lacks, called on a value known to be a tensor "
         "(`tensor-method`); a method a `jax.Array` has too (`x.tolist()`, `x.item()`) is "
         "left as written. `torch2jax explain NAME` shows one rule "
         "with its examples; [writing-rules.md](writing-rules.md) explains the fields."),
        "",
        "| kind | rules |",
        "| --- | --- |",
    ]
    for kind, title in KINDS:
        out.append(f"| {title} | {len(by_kind[kind])} |")
    for kind, title in KINDS:
        out += ["", f"## {title}", ""]
        groups: dict[str, list[Rule]] = defaultdict(list)
        for rule in by_kind[kind]:
            groups[rule.source].append(rule)
        for source in sorted(groups):
            out += [f"### `{source}`", "",
                    "| torch | becomes | details | semantic difference handled |",
                    "| --- | --- | --- | --- |"]
            for rule in sorted(groups[source], key=lambda r: r.torch):
                name = f"Tensor.{rule.torch}" if kind == "method" else rule.torch
                out.append(f"| `{name}` | {_cell(_target(rule))} | {_cell(_details(rule))} | "
                           f"{_cell(rule.notes)} |")
            out.append("")
        if out[-1] == "":
            out.pop()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--stdout" in argv:
        sys.stdout.write(text)
        return 0
    if "--check" in argv:
        current = DOC.read_text(encoding="utf-8") if DOC.is_file() else ""
        if current != text:
            print(f"{DOC} is stale: regenerate it with `python -m torch2jax.docs`",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
