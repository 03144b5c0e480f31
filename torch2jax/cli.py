"""The ``torch2jax`` command line: a thin typer layer over the library."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.syntax import Syntax

from torch2jax.convert import ParseError, convert_source
from torch2jax.discover import discover, read_source, write_atomic
from torch2jax.report import Diagnostic, FileReport, RunReport
from torch2jax.ruleset import RuleError, load_rules

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Rewrite PyTorch code as JAX (flax NNX) and verify it numerically.")
console = Console(stderr=True)
out_console = Console(soft_wrap=True)


def _convert_paths(paths: list[Path], out: Optional[Path], target: str, in_place: bool,
                   diff: bool, check_only: bool) -> RunReport:
    rules = load_rules()
    run = RunReport()
    files = discover(paths, exclude_dirs=[out] if out else [])
    for src, rel in files:
        report = FileReport(path=str(src), status="unchanged")
        run.files.append(report)
        try:
            text = read_source(src)
            result = convert_source(text, path=str(src), target=target, rules=rules)
        except (ParseError, UnicodeDecodeError, OSError) as exc:
            report.status = "failed"
            report.diagnostics.append(Diagnostic(str(src), _line_of(exc), 1, "parse", "error",
                                                 str(exc)))
            continue
        except Exception as exc:  # a bug of ours must not stop the other files
            report.status = "failed"
            report.diagnostics.append(Diagnostic(str(src), 1, 1, "internal", "error",
                                                 f"internal error while converting: {exc!r}"))
            continue
        report.diagnostics.extend(result.diagnostics)
        changed = result.uses_torch and result.code != text
        report.status = "converted" if changed else "unchanged"
        if check_only:
            continue
        if diff:
            if changed:
                _print_diff(text, result.code, str(src))
            continue
        if in_place:
            if changed:
                write_atomic(src, result.code)
                report.output = str(src)
        elif out is not None:
            dest = out / rel
            write_atomic(dest, result.code)
            report.output = str(dest)
    return run


def _line_of(exc: Exception) -> int:
    text = str(exc)
    parts = text.split(":")
    for p in parts[1:3]:
        if p.strip().isdigit():
            return int(p)
    return 1


def _print_diff(old: str, new: str, name: str) -> None:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{name}", tofile=f"b/{name}")
    text = "".join(lines)
    if sys.stdout.isatty():
        out_console.print(Syntax(text, "diff", theme="ansi_dark", background_color="default"))
    else:
        sys.stdout.write(text)


@app.command()
def convert(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to convert.")],
    out: Annotated[Optional[Path], typer.Option("-o", "--out", help="Output folder (mirror tree).")] = None,
    target: Annotated[str, typer.Option(help="nnx (linen and equinox are planned).")] = "nnx",
    in_place: Annotated[bool, typer.Option("--in-place", help="Rewrite files in place.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if anything would change.")] = False,
    report: Annotated[Optional[Path], typer.Option(help="Write the JSON report here.")] = None,
    jobs: Annotated[int, typer.Option("-j", "--jobs", help="Worker processes.")] = 1,
) -> None:
    """Convert PyTorch files to JAX. Exit 0: all converted; 1: TODOs left or a file failed."""
    modes = sum([out is not None, in_place, diff, check])
    if modes != 1:
        console.print("[red]error:[/] give exactly one of -o/--out, --in-place, --diff, --check")
        raise typer.Exit(2)
    for p in paths:
        if not p.exists():
            console.print(f"[red]error:[/] {p}: no such file or folder")
            raise typer.Exit(2)
    try:
        run = _convert_paths(paths, out, target, in_place, diff, check)
    except (ValueError, RuleError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    run.print_summary(console)
    if report is not None:
        run.write_json(report)
    code = run.exit_code
    if check and any(f.status == "converted" for f in run.files):
        code = 1
    raise typer.Exit(code)


@app.command()
def check(paths: Annotated[list[Path], typer.Argument(help="Files to check.")]) -> None:
    """Pre-commit entry: exit 1 when files hold torch code that would be converted."""
    run = _convert_paths(paths, None, "nnx", False, False, True)
    pending = [f for f in run.files if f.status in ("converted", "failed")]
    for f in pending:
        console.print(f"{f.path}: holds PyTorch code that torch2jax would convert")
    for d in run.diagnostics:
        if d.severity != "info":
            console.print(d.render())
    raise typer.Exit(1 if pending else 0)


@app.command()
def verify(
    target: Annotated[Optional[str], typer.Argument(help="FILE.py::Name")] = None,
    args: Annotated[Optional[str], typer.Option("--args", help="Constructor kwargs as JSON.")] = None,
    build: Annotated[Optional[str], typer.Option("--build", help="Constructor expression.")] = None,
    input: Annotated[Optional[list[str]], typer.Option("--input", help="DTYPE[D0,D1,...]")] = None,
    jax_target: Annotated[str, typer.Option("--target")] = "nnx",
    grad: Annotated[bool, typer.Option("--grad", help="Also compare gradients.")] = False,
    atol: Annotated[float, typer.Option()] = 1e-5,
    rtol: Annotated[float, typer.Option()] = 1e-4,
    device: Annotated[Optional[str], typer.Option(help="cpu, gpu or tpu")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    converted: Annotated[Optional[Path], typer.Option(help="An already converted file.")] = None,
    cases: Annotated[Optional[Path], typer.Option(help="A TOML file of cases.")] = None,
    optimizer: Annotated[str | None, typer.Option(
        help="Train instead: torch.optim.X(params, ...) (params = every parameter).")] = None,
    scheduler: Annotated[str | None, typer.Option(
        help="lr_scheduler.X(optimizer, ...), stepped after every optimizer step.")] = None,
    loss: Annotated[str | None, typer.Option(
        help="Torch loss over output and labels, e.g. F.cross_entropy(output, labels).")] = None,
    labels: Annotated[str | None, typer.Option(help="Labels SPEC, e.g. int64[4]:10.")] = None,
    clip_grad_norm: Annotated[float | None, typer.Option(
        "--clip-grad-norm", help="clip_grad_norm_(max_norm) before every step.")] = None,
    steps: Annotated[int, typer.Option(help="Training steps to compare.")] = 10,
    optax_tx: Annotated[str | None, typer.Option(
        "--optax", help="Check this optax transform instead of the translation.")] = None,
) -> None:
    """Run the torch model and its JAX translation on the same weights and inputs (with
    --optimizer and --loss: train both for --steps steps and compare the trajectories)."""
    training = (optimizer, scheduler, loss, labels, clip_grad_norm, optax_tx)
    if optimizer is None and any(v is not None for v in training):
        console.print("[red]error:[/] --scheduler, --loss, --labels, --clip-grad-norm and --optax "
                      "need --optimizer")
        raise typer.Exit(2)
    if optimizer is not None and (loss is None or cases is not None or grad):
        console.print("[red]error:[/] --optimizer needs --loss, and goes without --cases and --grad")
        raise typer.Exit(2)
    if cases is not None:
        from torch2jax.verify.cases import cases_exit_code, print_cases_summary, run_cases

        results = run_cases(cases)
        if as_json:
            print(json.dumps([r.to_json() for r in results]))
        else:
            print_cases_summary(results, out_console)
        raise typer.Exit(cases_exit_code(results))
    if target is None or "::" not in target:
        console.print("[red]error:[/] give FILE.py::Name (or --cases FILE.toml)")
        raise typer.Exit(2)
    from torch2jax.verify.run import verify as run_verify

    try:
        kwargs = json.loads(args) if args else None
    except json.JSONDecodeError as exc:
        console.print(f"[red]error:[/] --args is not valid JSON: {exc}")
        raise typer.Exit(2) from None
    if optimizer is not None:
        from torch2jax.verify.run import VerifyRequest
        from torch2jax.verify.trajectory import TrainSpec, print_trajectory, verify_trajectory

        request = VerifyRequest(target, kwargs, build, tuple(input or []), jax_target, False,
                                atol, rtol, 0, device, str(converted) if converted else None)
        train = TrainSpec(optimizer, loss or "", labels, scheduler, clip_grad_norm, steps,
                          optax_tx)
        result = verify_trajectory(request, train)
        if not as_json:
            print_trajectory(result, out_console)
    else:
        result = run_verify(target, args=kwargs, build=build, inputs=list(input or []),
                            jax_target=jax_target, grad=grad, atol=atol, rtol=rtol,
                            device=device, converted=str(converted) if converted else None)
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        from torch2jax.verify.cases import print_cases_summary

        print_cases_summary([result], out_console)
    if result.error:
        raise typer.Exit(2)
    raise typer.Exit(0 if result.passed else 1)


@app.command("rules")
def list_rules() -> None:
    """List the translation rules."""
    from rich.table import Table

    table = Table(title="torch2jax rules")
    for col in ("kind", "torch", "jax", "source"):
        table.add_column(col, overflow="fold")
    for r in load_rules().all():
        jax = r.targets.get("nnx") or r.jax or ""
        torch_name = f"Tensor.{r.torch}" if r.kind == "method" else r.torch
        table.add_row(r.kind, torch_name, jax + (f"  ({r.special})" if r.special else ""),
                      r.source)
    out_console.print(table)


@app.command()
def explain(name: Annotated[str, typer.Argument(help="e.g. torch.nn.BatchNorm2d, F.gelu, view")]) -> None:
    """Show how one torch API is translated and which semantic differences apply."""
    rules = load_rules()
    aliases = {"nn.": "torch.nn.", "F.": "torch.nn.functional."}
    candidates = [name] + [full + name[len(short):] for short, full in aliases.items()
                           if name.startswith(short)]
    rule = next((r for c in candidates if (r := rules.lookup(c)) is not None), None)
    if rule is None:
        console.print(f"[red]error:[/] no rule for {name!r}; `torch2jax rules` lists them")
        raise typer.Exit(2)
    out_console.print(f"[bold]{rule.torch}[/] ({rule.kind}, {rule.source})")
    out_console.print(f"  becomes: {rule.targets.get('nnx') or rule.jax}")
    if rule.rename:
        out_console.print("  arguments: " + ", ".join(f"{k} -> {v}" for k, v in rule.rename.items()))
    if rule.weights:
        out_console.print("  weights: " + ", ".join(
            f"{k} -> {w.to or '(dropped)'}" + (f" [{w.layout}]" if w.layout != "as_is" else "")
            for k, w in rule.weights.items()))
    if rule.layout != "torch":
        out_console.print(f"  activation layout: {rule.layout}")
    if rule.notes:
        out_console.print("  why: " + rule.notes)
    for ex in rule.examples:
        out_console.print(f"  {ex.torch}\n    -> {ex.jax}")


@app.command()
def weights(
    state_dict_file: Annotated[Path, typer.Argument(help="A .pt/.pth or .safetensors file.")],
    model: Annotated[str, typer.Option("--model", help="Converted FILE.py::Name.")],
    torch_model: Annotated[str, typer.Option("--torch-model", help="Its torch original.")],
    out: Annotated[Path, typer.Option("--out", help="The orbax checkpoint folder to write.")],
    args: Annotated[str | None, typer.Option("--args", help="Constructor kwargs as JSON.")] = None,
    build: Annotated[str | None, typer.Option("--build", help="Constructor expression.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out.")] = False,
) -> None:
    """Convert trained torch weights into an orbax checkpoint of the converted NNX model."""
    from torch2jax.checkpoint import weights_command

    code = weights_command(state_dict_file, model, torch_model, out, args, build, overwrite,
                           lambda text, err: typer.echo(text, err=err))
    raise typer.Exit(code)
