"""Verification cases kept in a TOML file, so a whole fixture set verifies with one command.

```toml
[[case]]
name = "mlp"
target = "models/mlp.py::MLP"   # relative to this file
args = {}                       # or: build = "GPT(GPTConfig(n_layer=2))"
inputs = ["float32[4,784]"]
# optional: atol, rtol, atol64, rtol64, seed, device, converted, jax_target
# optional: setup = "cfg = Config(); cfg.n = 2" (or "setup.py", relative to this file),
#           input_exprs = ["hidden=model.init_hidden(4)"] (verify --setup, --input-expr)
grad = false                    # optional: gradients are compared unless false (--no-grad)
train_mode = true               # optional: the forward in training mode (verify --train-mode)
float64 = false                 # optional: absent, a float32 pass then a float64 pass;
                                # true: float64 only (--float64); false: float32 only

[case.train]                    # optional: also train both sides and compare the trajectories
optimizer = "torch.optim.SGD(params, lr=0.05, momentum=0.9)"
scheduler = "torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)"   # optional
loss = "F.cross_entropy(output, labels)"
labels = "int64[4]:10"
clip_grad_norm = 1.0            # optional
steps = 10                      # optional (10)
```
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from torch2jax.report import plural
from torch2jax.verify.run import (
    ATOL,
    ATOL64,
    GRAD_REL_NOTE,
    RTOL,
    RTOL64,
    PassFigures,
    VerifyRequest,
    VerifyResult,
    run_request,
)
from torch2jax.verify.train_common import DEFAULT_STEPS, TrainSpec
from torch2jax.verify.trajectory import verify_trajectory

_KEYS = {
    "name", "target", "args", "build", "inputs", "grad", "atol", "rtol", "seed", "device",
    "converted", "jax_target", "train", "train_mode", "float64", "atol64", "rtol64",
    "setup", "input_exprs",
}  # fmt: skip
_TRAIN_KEYS = {"optimizer", "scheduler", "loss", "labels", "clip_grad_norm", "steps", "optax"}


class CaseError(ValueError):
    """The cases file is malformed; the message names the file and the case."""


@dataclass(frozen=True)
class Case:
    name: str
    request: VerifyRequest
    train: TrainSpec | None = None


def _parse_train(raw: Any, where: str) -> TrainSpec:
    if not isinstance(raw, dict):
        raise CaseError(f"{where}: 'train' must be a table ([case.train])")
    unknown = set(raw) - _TRAIN_KEYS
    if unknown:
        raise CaseError(f"{where}: unknown keys in [case.train] {sorted(unknown)} "
                        f"(known: {sorted(_TRAIN_KEYS)})")
    for key in ("optimizer", "loss"):
        if not isinstance(raw.get(key), str):
            raise CaseError(f"{where}: [case.train] needs {key!r} (torch source text)")
    clip = raw.get("clip_grad_norm")
    return TrainSpec(
        optimizer=raw["optimizer"],
        loss=raw["loss"],
        labels=raw.get("labels"),
        scheduler=raw.get("scheduler"),
        clip_grad_norm=float(clip) if clip is not None else None,
        steps=int(raw.get("steps", DEFAULT_STEPS)),
        optax=raw.get("optax"),
    )


def _relative(base: Path, target: str) -> str:
    path, sep, name = target.rpartition("::")
    if not sep:
        return target  # split_target reports the malformed target when the case runs
    return f"{base / path}::{name}"  # an absolute path stays as it is


def _parse_case(raw: dict[str, Any], index: int, base: Path, source: Path) -> Case:
    name = str(raw.get("name", f"case {index + 1}"))
    where = f"{source}: [[case]] {name!r}"
    unknown = set(raw) - _KEYS
    if unknown:
        raise CaseError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    if "target" not in raw:
        raise CaseError(f"{where}: missing 'target' (FILE.py::Name)")
    inputs = raw.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise CaseError(f"{where}: 'inputs' must be a list of specs like \"float32[2,8]\"")
    converted = raw.get("converted")
    exprs = raw.get("input_exprs", [])
    if not isinstance(exprs, list) or not all(isinstance(i, str) for i in exprs):
        raise CaseError(f"{where}: 'input_exprs' must be a list of expressions like "
                        "\"hidden=model.init_hidden(2)\"")
    setup = raw.get("setup")
    if setup is not None and not isinstance(setup, str):
        raise CaseError(f"{where}: 'setup' must be Python code or a .py file's path")
    if setup is not None and setup.strip().endswith(".py") and "\n" not in setup.strip():
        setup = str(base / setup.strip())  # relative to the cases file, as the target is
    request = VerifyRequest(
        target=_relative(base, raw["target"]),
        args=raw.get("args"),
        build=raw.get("build"),
        inputs=tuple(inputs),
        jax_target=raw.get("jax_target", "nnx"),
        grad=bool(raw.get("grad", True)),
        atol=float(raw.get("atol", ATOL)),
        rtol=float(raw.get("rtol", RTOL)),
        atol64=float(raw.get("atol64", ATOL64)),
        rtol64=float(raw.get("rtol64", RTOL64)),
        seed=int(raw.get("seed", 0)),
        device=raw.get("device"),
        converted=str(base / converted) if converted else None,
        train_mode=bool(raw.get("train_mode", False)),
        float64=None if raw.get("float64") is None else bool(raw["float64"]),
        setup=setup,
        input_exprs=tuple(exprs),
    )
    train = _parse_train(raw["train"], where) if "train" in raw else None
    return Case(name, request, train)


def load_cases(path: str | Path) -> list[Case]:
    """Parse a cases file; paths in it are relative to the file's directory."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CaseError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise CaseError(f"{path}: not valid TOML: {exc}") from None
    if set(data) - {"case"}:
        raise CaseError(f"{path}: unknown tables {sorted(set(data) - {'case'})} (use [[case]])")
    cases = [_parse_case(raw, i, path.parent, path) for i, raw in enumerate(data.get("case", []))]
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CaseError(f"{path}: case names used twice: {duplicates}")
    return cases


def run_cases(
    path: str | Path, *, names: list[str] | None = None, device: str | None = None
) -> list[VerifyResult]:
    """Run every case in the file (or only ``names``); ``device`` overrides the cases'."""
    cases = load_cases(path)
    if names:
        missing = sorted(set(names) - {c.name for c in cases})
        if missing:
            raise CaseError(f"{path}: no cases named {missing}")
        cases = [c for c in cases if c.name in names]
    results = []
    for case in cases:
        request = case.request
        if device is not None:
            request = VerifyRequest(**{**request.__dict__, "device": device})
        result = run_request(request)
        result.name = case.name
        results.append(result)
        if case.train is not None:  # the forward check, then the training trajectory
            trained = verify_trajectory(request, case.train)
            trained.name = case.name
            results.append(trained)
    return results


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _tol(value: float) -> str:
    return f"{value:.0e}" if value else "0"


def _verdict(passed: bool, error: str | None) -> str:
    return "[yellow]error[/]" if error else "[green]pass[/]" if passed else "[red]FAIL[/]"


def _label(r: VerifyResult, where: str | None) -> str:
    label = r.name or r.model.replace("\\", "/").rpartition("/")[2]  # FILE.py::Name
    return f"{label} ({where})" if where else label


def _mode(r: VerifyResult) -> str:
    steps = getattr(r, "steps", 0)
    return f"{steps} steps" if r.mode.startswith("train ") and steps else r.mode


def _details(r: VerifyResult) -> list[str]:
    """What a row cannot hold: why it failed, what the figures mean, what did not run."""
    lines = []
    if r.error:
        lines.append(f"could not run: {r.error.splitlines()[0]}")
    if r.reason and (not r.passed or not all(p.passed for p in r.passes)):
        lines.append(f"verdict {'pass' if r.passed else 'FAIL'}: {r.reason}")
    if r.mismatch and not r.passed:
        lines.append(f"worst: {r.mismatch}")
    loss_rel = getattr(r, "loss_max_rel_diff", None)
    if loss_rel is not None:
        lines.append(f"training: every step's loss within {loss_rel:.1e} (rel); out rel: the "
                     f"parameters after {getattr(r, 'steps', 0)} steps")
    stats = [f"{p.stats_max_rel_diff:.1e} ({p.dtype})" for p in r.passes
             if p.stats_max_rel_diff is not None]
    if not r.passes and r.stats_max_rel_diff is not None:
        stats = [f"{r.stats_max_rel_diff:.1e}"]
    if stats:
        lines.append("running statistics: rel " + ", ".join(stats))
    lines += [n for n in r.notes if n.startswith(GRAD_REL_NOTE)]
    for p in r.passes:
        if p.error and p is not r.passes[0]:
            lines.append(f"{p.dtype} pass could not run: {p.error.splitlines()[0]}")
    if r.float64_skipped and not r.error:
        lines.append(f"float64 pass not run: {r.float64_skipped}")
    return lines


def print_cases_summary(results: list[VerifyResult], console: Console) -> None:
    """One row per case and pass (float32, float64): mode, dtype, verdict, the output's and
    the gradients' relative differences and the tolerances, with the target and device in the
    title; below the table, each case's explanations. Fits an 80-column terminal."""
    places = {(r.target, r.device or "-") for r in results}
    uniform = len(places) == 1
    title = "torch2jax verify"
    if uniform:
        target, device = next(iter(places))
        title += f": {target} on {device}"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
                  show_edge=False, title_justify="left", caption_justify="left",
                  caption="rel: max |jax - torch| / max |torch| per tensor (gradients: over the "
                          "model's largest gradient); pass: |jax - torch| <= atol + "
                          "rtol * |torch| at every element")
    table.add_column("case", overflow="fold", ratio=1, min_width=10)
    table.add_column("mode", no_wrap=True)
    table.add_column("dtype", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("out rel", justify="right", no_wrap=True)
    table.add_column("grad rel", justify="right", no_wrap=True)
    table.add_column("atol", justify="right", no_wrap=True)
    table.add_column("rtol", justify="right", no_wrap=True)
    notes: list[tuple[str, list[str]]] = []
    for r in results:
        label = _label(r, None if uniform else f"{r.target}, {r.device or '-'}")
        passes = r.passes or [PassFigures.of(r)]
        for i, p in enumerate(passes):
            # a float32 pass outside its tolerance in a case that float64 passed: rounding
            rounding = r.passed and not p.passed and p.error is None and p.dtype == "float32"
            table.add_row(label if i == 0 else "", _mode(r) if i == 0 else "", p.dtype,
                          "[yellow]rounding[/]" if rounding else _verdict(p.passed, p.error),
                          _fmt(p.max_rel_diff),
                          _fmt(p.grad_max_rel_diff), _tol(p.atol), _tol(p.rtol),
                          end_section=len(passes) > 1 and i == len(passes) - 1)
        details = _details(r)
        if details:
            notes.append((label, details))
    console.print(table, soft_wrap=False)
    if notes:
        console.print()
    for label, details in notes:
        for line in details:
            console.print(f"{label}: {line}", highlight=False, markup=False, soft_wrap=False)
    from torch2jax.verify.benchmark import summary_line

    for line in filter(None, map(summary_line, results)):
        console.print(line, highlight=False, markup=False, soft_wrap=False)
    passed = sum(r.passed for r in results)
    errors = sum(r.error is not None for r in results)
    failed = len(results) - passed - errors
    console.print(f"{plural(len(results), 'case')}: {passed} passed, {failed} failed, "
                  f"{errors} could not run", highlight=False, soft_wrap=False)


def cases_exit_code(results: list[VerifyResult]) -> int:
    """The verify contract over several cases: 2 if any could not run, else 1 if any failed."""
    if any(r.error for r in results):
        return 2
    return 0 if all(r.passed for r in results) else 1
