"""Verification cases kept in a TOML file, so a whole fixture set verifies with one command.

```toml
[[case]]
name = "mlp"
target = "models/mlp.py::MLP"   # relative to this file
args = {}                       # or: build = "GPT(GPTConfig(n_layer=2))"
inputs = ["float32[4,784]"]
grad = true                     # optional: atol, rtol, seed, device, converted, jax_target
train_mode = true               # optional: the forward in training mode (verify --train-mode)
float64 = true                  # optional: both sides in float64 (verify --float64)

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

from rich.console import Console
from rich.table import Table

from torch2jax.verify.run import VerifyRequest, VerifyResult, run_request
from torch2jax.verify.trajectory import DEFAULT_STEPS, TrainSpec, verify_trajectory

_KEYS = {
    "name", "target", "args", "build", "inputs", "grad", "atol", "rtol", "seed", "device",
    "converted", "jax_target", "train", "train_mode", "float64",
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
    request = VerifyRequest(
        target=_relative(base, raw["target"]),
        args=raw.get("args"),
        build=raw.get("build"),
        inputs=tuple(inputs),
        jax_target=raw.get("jax_target", "nnx"),
        grad=bool(raw.get("grad", False)),
        atol=float(raw.get("atol", 1e-5)),
        rtol=float(raw.get("rtol", 1e-4)),
        seed=int(raw.get("seed", 0)),
        device=raw.get("device"),
        converted=str(base / converted) if converted else None,
        train_mode=bool(raw.get("train_mode", False)),
        float64=bool(raw.get("float64", False)),
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
    return "-" if value is None else f"{value:.2e}"


def print_cases_summary(results: list[VerifyResult], console: Console) -> None:
    """One row per case: verdict, differences, and why it failed or could not run."""
    table = Table(title="torch2jax verify")
    for column in ("case", "result", "max abs", "max rel", "grad abs", "grad rel", "why"):
        table.add_column(column, overflow="fold")
    for r in results:
        if r.error:
            verdict, why = "[yellow]error[/yellow]", r.error.splitlines()[0]
        elif r.passed:
            verdict, why = "[green]pass[/green]", ""
        else:
            verdict, why = "[red]FAIL[/red]", r.mismatch or ""
        label = r.name or r.model
        loss_rel = getattr(r, "loss_max_rel_diff", None)
        if r.mode.startswith("train"):
            label += f" ({r.mode})"
            if r.passed and loss_rel is not None:
                why = f"loss rel {loss_rel:.2e}; max = params at the end"
        if r.passed and r.stats_max_abs_diff is not None:
            why = "; ".join(filter(None, [why, f"running stats abs {r.stats_max_abs_diff:.2e}"]))
        table.add_row(
            label,
            verdict,
            _fmt(r.max_abs_diff),
            _fmt(r.max_rel_diff),
            _fmt(r.grad_max_abs_diff),
            _fmt(r.grad_max_rel_diff),
            why,
        )
    console.print(table)
    from torch2jax.verify.benchmark import summary_line

    for line in filter(None, map(summary_line, results)):
        console.print(line, highlight=False, markup=False)
    passed = sum(r.passed for r in results)
    errors = sum(r.error is not None for r in results)
    failed = len(results) - passed - errors
    console.print(f"{len(results)} cases: {passed} passed, {failed} failed, {errors} could not run")


def cases_exit_code(results: list[VerifyResult]) -> int:
    """The verify contract over several cases: 2 if any could not run, else 1 if any failed."""
    if any(r.error for r in results):
        return 2
    return 0 if all(r.passed for r in results) else 1
