"""The ``torch2jax`` command line: a thin typer layer over the library.

It imports at start-up only what every command needs (typer); each command imports what it
uses when it runs (the engine, rich, the converter, the verifier), so that ``--help`` and
``check`` (a pre-commit hook, run on every commit) start quickly (benchmarks/startup.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from torch2jax.config import Config
    from torch2jax.discover import Exclude
    from torch2jax.engine import Options

# verify's default tolerances (torch2jax.verify.common's ATOL, RTOL, ATOL64, RTOL64; not imported
# here: the verifier needs numpy, the converter's command line does not)
ATOL, RTOL, ATOL64, RTOL64 = 1e-5, 1e-4, 1e-10, 1e-10
# the targets a configuration may name, checked without importing them (libcst); another name
# goes to torch2jax.targets.get_target, whose error lists the targets
KNOWN_TARGETS = ("nnx", "linen", "equinox")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Rewrite PyTorch code as JAX (flax NNX) and verify it numerically.")


class _LazyConsole:
    """A rich Console made on first use (importing rich.console costs start-up time)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Any = None

    def get(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


console = _LazyConsole(stderr=True, soft_wrap=True)  # a path in a message is never broken
out_console = _LazyConsole(soft_wrap=True)


def _setup(paths: list[Path], target: str | None, exclude: list[str] | None,
           rules_dirs: list[Path] | None, shard: str | None = None, init: str = "jax"
           ) -> tuple[Config, Options, tuple[Exclude, ...]]:
    """The configuration ([tool.torch2jax] above the first path) merged with the options."""
    from torch2jax.config import Config, find_config, load_user_rules
    from torch2jax.discover import Exclude
    from torch2jax.engine import Options

    cfg = find_config(paths[0]) if paths else Config()
    rule_dirs = (*cfg.rules, *(d.resolve() for d in rules_dirs or ()))
    if rule_dirs:
        load_user_rules(rule_dirs)  # validate now: a bad rule file is a usage error
    name = target or cfg.target or "nnx"
    if name not in KNOWN_TARGETS:
        from torch2jax.targets import get_target

        get_target(name)
    options = Options(target=name, rule_dirs=rule_dirs,
                      ignore=cfg.ignore, shard=shard or cfg.shard or "data", init=init)
    excludes = (Exclude(cfg.exclude, cfg.base), Exclude(tuple(exclude or ())))
    return cfg, options, excludes


def _setup_errors() -> tuple[type[Exception], ...]:
    """What _setup raises for a usage error."""
    from torch2jax.config import ConfigError
    from torch2jax.ruleset import RuleError

    return (ValueError, RuleError, ConfigError)


def _print_diff(old: str, new: str, name: str) -> None:
    from torch2jax.report import display, unified_diff

    color = sys.stdout.isatty()
    sys.stdout.write(unified_diff(old, new, display(name), color=color))
    sys.stdout.flush()


def _usage_error(message: str) -> typer.Exit:
    from rich.markup import escape  # a message is text: ".[verify]" or a path in brackets

    console.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(2)


def _require_extra(command: str, modules: list[str]) -> None:
    """Exit 2 (could not run), naming the extra to install, when one of ``modules`` (what
    ``command`` imports: the [verify] extra of pyproject.toml) is not installed."""
    from importlib.util import find_spec

    missing = []
    for name in modules:  # found, not imported (the command imports them in its own order)
        try:
            if find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    if missing:
        raise _usage_error(f"{command} needs {', '.join(missing)}, not installed here (the "
                           "converter alone does not): install the verify extra, "
                           "pip install -e '.[verify]' in a checkout or "
                           "pip install 'torch2jax-port[verify]'")


def _require_paths(paths: list[Path], option: str = "") -> None:
    """A usage error (exit 2) naming the first of ``paths`` that does not exist: a wrong path
    in a pre-commit hook or a script must not pass silently."""
    for p in paths:
        if not p.exists() and not p.is_symlink():
            from torch2jax.report import display

            raise _usage_error(f"{option}{display(str(p))}: no such file or folder")


def _modeling_module(path: Path) -> str | None:
    """The dotted name of ``path`` when it is a modeling file of an installed transformers
    (``transformers.models.llama.modeling_llama``), else None."""
    from torch2jax.hf import is_modeling_file, package_of  # (not through verify: no numpy)

    found = package_of(path) if path.is_file() and path.suffix == ".py" else None
    return found[1] if found is not None and is_modeling_file(found[1]) else None


def _convert_modeling(path: Path, out: Path, options: Options, classes: set[str]) -> int:
    """The mirror package of a transformers modeling file under ``out`` (as ``verify``
    writes it: the file reduced and converted, ``_hf_support.py``, the configuration
    forwarded to the installed one); the exit code."""
    from torch2jax.convert import convert_source
    from torch2jax.report import display
    from torch2jax.ruleset import load_rules
    from torch2jax.verify.package import convert_package_file, package_of

    mirror = out / "transformers_jax"
    root = package_of(path)[0] / "transformers"
    if mirror.exists() and (not mirror.is_dir() or any(mirror.iterdir())):
        raise _usage_error(f"{display(str(mirror))} exists: its files would be replaced; "
                           "remove it or choose another -o")
    if out.resolve().is_relative_to(root.resolve()) or root.resolve().is_relative_to(
            out.resolve()):
        raise _usage_error(f"-o {display(str(out))}: inside (or around) the installed "
                           "transformers")
    source = path.read_text(encoding="utf-8")
    missing = sorted(c for c in classes if f"class {c}(" not in source)
    if missing:
        raise _usage_error(f"--class {', '.join(missing)}: no such class in "
                           f"{display(str(path))}")
    rules = load_rules(tuple(str(d) for d in options.rule_dirs))
    errors: list[str] = []

    def convert_one(file: Path, known: set[str]) -> tuple[str, int]:
        result = convert_source(file.read_text(encoding="utf-8"), path=str(file),
                                target=options.target, rules=rules, known_modules=known,
                                shard=options.shard, init=options.init, follow_packages=False)
        found = [d for d in result.diagnostics if d.severity == "error"]
        errors.extend(f"error [{d.rule}] {d.message}" for d in found)
        return result.code, len(found)

    target, todos = convert_package_file(path, out, convert_one, classes or None,
                                         alias="transformers_jax")
    for line in errors:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    marked = " (marked # TODO(torch2jax) in the files)" if todos else ""
    console.print(f"{display(str(target))}: the converted modeling file, in its mirror package "
                  f"{display(str(out / 'transformers_jax'))}; {todos} TODO"
                  f"{'' if todos == 1 else 's'}{marked}", highlight=False, markup=False,
                  soft_wrap=True)
    return 1 if todos else 0


@app.command()
def convert(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders to convert.")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Output folder (mirror tree).")] = None,
    target: Annotated[str | None, typer.Option(
        help="nnx, linen or equinox; default: the target setting of \\[tool.torch2jax] in the "
             "pyproject.toml above the first path, else nnx.")] = None,
    shard: Annotated[str | None, typer.Option(
        help="Data-parallel scripts: data (batches split over the devices, the state "
             "replicated) or params (the parameters and optimizer state split too, FSDP-style); "
             "default: the shard setting of \\[tool.torch2jax] in the pyproject.toml above the "
             "first path, else data.")] = None,
    init: Annotated[str, typer.Option(
        help="Parameter initialisation: jax (the target library's own) or torch (torch's "
             "defaults written into the layers: kernel_init=, bias_init=, ...).")] = "jax",
    in_place: Annotated[bool, typer.Option("--in-place", help="Rewrite files in place.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff; write nothing.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Exit 1 if anything would change.")] = False,
    report: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
    jobs: Annotated[int, typer.Option("-j", "--jobs",
                                      help="Worker processes (0: one per core).")] = 0,
    exclude: Annotated[list[str] | None, typer.Option(
        "--exclude", help="gitignore-style pattern of paths to skip (repeatable).")] = None,
    no_gitignore: Annotated[bool, typer.Option(
        "--no-gitignore", help="Also convert what .gitignore files ignore.")] = False,
    rules_dir: Annotated[list[Path] | None, typer.Option(
        "--rules", help="A folder of extra rule files (repeatable).")] = None,
    allow_overlap: Annotated[bool, typer.Option(
        "--allow-overlap", help="Accept an -o folder inside (or around) an input folder; "
        "refused still if a converted file would replace an existing one.")] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="CPU seconds one file may take to convert before it is stopped and "
        "reported (default: 60 plus 1 per 2 KB of the file).")] = None,
    classes: Annotated[list[str] | None, typer.Option(
        "--class", help="A transformers modeling file: a class to keep, with what it reaches "
        "(repeatable; default: every class of the file).")] = None,
) -> None:
    """Convert PyTorch files to JAX. Exit 0: all converted; 1: TODOs left or a file failed;
    2: usage error (nothing written). A modeling file of the installed transformers
    (.../transformers/models/llama/modeling_llama.py) is written with -o as its mirror
    package, OUT/transformers_jax/models/llama/modeling_llama.py beside _hf_support.py."""
    from torch2jax.report import display

    modes = sum([out is not None, in_place, diff, check])
    if modes != 1:
        raise _usage_error("give exactly one of -o/--out, --in-place, --diff, --check")
    _require_paths(paths)
    if allow_overlap and out is None:
        raise _usage_error("--allow-overlap goes with -o/--out")
    if timeout is not None and not timeout > 0:
        raise _usage_error(f"--timeout {timeout}: expected a positive number of seconds")
    if report is not None and not report.parent.is_dir():
        raise _usage_error(f"--report {display(str(report))}: the folder "
                           f"{display(str(report.parent))} does not exist")
    if report is not None and (report.suffix == ".py" or any(
            report.resolve() == p.resolve() for p in paths)):
        raise _usage_error(f"--report {display(str(report))} is an input or a Python file: "
                           "it would be overwritten with the JSON report")
    try:
        if shard not in (None, "data", "params"):
            raise _usage_error(f"--shard {shard}: expected data or params")
        if init not in ("jax", "torch"):
            raise _usage_error(f"--init {init}: expected jax or torch")
        _, options, excludes = _setup(paths, target, exclude, rules_dir, shard, init)
    except _setup_errors() as exc:
        raise _usage_error(str(exc)) from None
    options.timeout = timeout
    modeling = [p for p in paths if _modeling_module(p)]
    if modeling or classes:
        if len(paths) != 1 or not modeling or out is None:
            raise _usage_error("a transformers modeling file converts alone, with -o/--out "
                               "(its mirror package is written there); --class goes with one")
        raise typer.Exit(_convert_modeling(paths[0], out, options, set(classes or ())))
    from torch2jax.engine import Request, UsageError, default_jobs
    from torch2jax.engine import run as run_engine

    mode = "out" if out is not None else "in-place" if in_place else "diff" if diff else "check"
    req = Request(paths=list(paths), mode=mode, out=out, options=options,
                  jobs=jobs or default_jobs(), excludes=excludes,
                  use_gitignore=not no_gitignore, allow_overlap=allow_overlap)
    try:
        run = run_engine(req, show_diff=_print_diff, progress_console=console.get())
    except UsageError as exc:
        raise _usage_error(str(exc)) from None
    run.print_summary(console.get())
    if report is not None:
        run.write_json(report)
    code = run.exit_code
    if check and any(f.status == "converted" for f in run.files):
        code = 1
    raise typer.Exit(code)


@app.command()
def check(paths: Annotated[list[Path], typer.Argument(help="Files to check.")],
          jobs: Annotated[int, typer.Option("-j", "--jobs",
                                            help="Worker processes (0: one per core).")] = 0,
          explain: Annotated[bool, typer.Option(
              "--explain", help="Convert each PyTorch file (nothing is written) and print what "
              "the conversion would leave for review; slower.")] = False,
          ) -> None:
    """Pre-commit entry: exit 1 when files hold torch code that would be converted, keep
    TODO(torch2jax) markers of an earlier conversion, or cannot be read or parsed. A file is
    not converted to answer (its imports are read) unless --explain is given; the markers and
    errors found are printed."""
    _require_paths(paths)
    try:
        _, options, excludes = _setup(paths, None, None, None)
    except _setup_errors() as exc:
        raise _usage_error(str(exc)) from None
    from torch2jax.engine import Request, default_jobs
    from torch2jax.engine import run as run_engine
    from torch2jax.report import display

    req = Request(paths=list(paths), mode="check", options=options,
                  jobs=jobs or default_jobs(), excludes=excludes, explain=explain)
    run = run_engine(req)
    pending = [f for f in run.files if f.status in ("converted", "failed") or f.todos]
    for f in pending:
        what = ("could not be converted" if f.status == "failed"
                else "holds PyTorch code that torch2jax would convert"
                if f.status == "converted" else "has TODO(torch2jax) markers left for review")
        if f.status == "converted" and not explain:
            what += " (`torch2jax check --explain` lists what it would leave for review)"
        console.print(f"{display(f.path)}: {what}", highlight=False, markup=False,
                      soft_wrap=True)
    for d in run.diagnostics:
        if d.severity != "info":
            console.print(d.render(), highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(1 if pending else 0)


@app.command()
def verify(
    target: Annotated[str | None, typer.Argument(help="FILE.py::Name")] = None,
    args: Annotated[str | None, typer.Option("--args", help="Constructor kwargs as JSON.")] = None,
    build: Annotated[str | None, typer.Option("--build", help="Constructor expression.")] = None,
    input: Annotated[list[str] | None, typer.Option("--input", help="DTYPE[D0,D1,...]")] = None,
    setup: Annotated[str | None, typer.Option(
        "--setup", help="Python statements (or a .py file) run in the model file's namespace, "
        "torch and converted, before --build and --input-expr.")] = None,
    input_expr: Annotated[list[str] | None, typer.Option(
        "--input-expr", help="EXPR or NAME=EXPR: a forward input built by code on each side, "
        "`model` bound, e.g. hidden=model.init_hidden(2).")] = None,
    jax_target: Annotated[str, typer.Option(
        "--target", help="nnx, linen or equinox (not read from pyproject.toml).")] = "nnx",
    grad: Annotated[bool, typer.Option(
        "--grad/--no-grad", help="Compare the gradients of every parameter too (the default; "
        "--grad is accepted and does nothing more).")] = True,
    atol: Annotated[float, typer.Option(help="Absolute tolerance of the float32 pass.")] = ATOL,
    rtol: Annotated[float, typer.Option(help="Relative tolerance of the float32 pass.")] = RTOL,
    atol64: Annotated[float, typer.Option(
        "--atol64", help="Absolute tolerance of the float64 pass.")] = ATOL64,
    rtol64: Annotated[float, typer.Option(
        "--rtol64", help="Relative tolerance of the float64 pass.")] = RTOL64,
    device: Annotated[str | None, typer.Option(help="cpu, gpu or tpu")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    converted: Annotated[Path | None, typer.Option(help="An already converted file.")] = None,
    cases: Annotated[Path | None, typer.Option(help="A TOML file of cases.")] = None,
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
    benchmark: Annotated[bool, typer.Option(
        "--benchmark", help="Also time both forward passes (jax_ms, torch_ms, speed_ratio).")] = False,
    train_mode: Annotated[bool, typer.Option(
        "--train-mode", help="Run both models in training mode (dropout off) and also compare "
        "the BatchNorm running statistics the forward pass updates.")] = False,
    float64: Annotated[bool | None, typer.Option(
        "--float64/--no-float64", help="Default: compare in float32, then again in float64 "
        "wherever both sides support it (catches a default that float32 noise hides; tells "
        "float32 rounding from a translation error). --float64: the float64 pass only; "
        "--no-float64: the float32 pass only.")] = None,
    program: Annotated[Path | None, typer.Option(
        "--program", help="Verify a whole training program instead: run it and its conversion "
        "(--converted, or converted here) side by side for --steps optimizer steps and compare "
        "losses, learning rates, parameters, optimizer state, weight decay and prints.")] = None,
    program_args: Annotated[str | None, typer.Option(
        "--program-args", help="The command line both programs get (--program), e.g. "
        "'--batch_size=8'.")] = None,
    print_skip: Annotated[list[str] | None, typer.Option(
        "--print-skip", help="A regular expression: printed lines that match it (timings) "
        "are not compared (--program; repeatable).")] = None,
) -> None:
    """Run the torch model and its JAX translation on the same weights and inputs (with
    --optimizer and --loss: train both for --steps steps and compare the trajectories)."""
    if program is not None:
        _verify_program(program, converted, steps, jax_target, program_args, as_json,
                        target is not None or cases is not None, print_skip or [])
    training = (optimizer, scheduler, loss, labels, clip_grad_norm, optax_tx)
    if optimizer is None and any(v is not None for v in training):
        console.print("[red]error:[/] --scheduler, --loss, --labels, --clip-grad-norm and --optax "
                      "need --optimizer")
        raise typer.Exit(2)
    if optimizer is not None and (loss is None or cases is not None or train_mode or float64):
        console.print("[red]error:[/] --optimizer needs --loss, and goes without --cases, "
                      "--train-mode and --float64")
        raise typer.Exit(2)
    named = target is not None and "::" in target
    _require_paths([Path(target.rpartition("::")[0])] if named else [])
    _require_paths([cases] if cases is not None else [], "--cases ")
    _require_paths([converted] if converted is not None else [], "--converted ")
    if named or cases is not None:
        _require_extra("verify", ["numpy", "torch", "jax",
                                  *(["optax"] if optimizer is not None else [])])
    if cases is not None:
        from torch2jax.verify.cases import (
            CaseError,
            cases_exit_code,
            print_cases_summary,
            run_cases,
        )

        try:
            results = run_cases(cases)
        except CaseError as exc:
            raise _usage_error(str(exc)) from None
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

        request = VerifyRequest(target, kwargs, build, tuple(input or []), jax_target,
                                atol=atol, rtol=rtol, device=device,
                                converted=str(converted) if converted else None,
                                setup=setup, input_exprs=tuple(input_expr or []))
        train = TrainSpec(optimizer, loss or "", labels, scheduler, clip_grad_norm, steps,
                          optax_tx)
        result = verify_trajectory(request, train)
        if not as_json:
            print_trajectory(result, out_console)
    else:
        result = run_verify(target, args=kwargs, build=build, inputs=list(input or []),
                            jax_target=jax_target, grad=grad, atol=atol, rtol=rtol,
                            device=device, converted=str(converted) if converted else None,
                            benchmark=benchmark, train_mode=train_mode, float64=float64,
                            atol64=atol64, rtol64=rtol64, setup=setup,
                            input_exprs=list(input_expr or []))
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        from torch2jax.verify.cases import print_cases_summary

        print_cases_summary([result], out_console)
    if result.error:
        raise typer.Exit(2)
    raise typer.Exit(0 if result.passed else 1)


def _verify_program(program: Path, converted: Path | None, steps: int, jax_target: str,
                    program_args: str | None, as_json: bool, other: bool,
                    print_skip: list[str]) -> None:
    """``verify --program``; exits 0 (pass), 1 (a mismatch) or 2 (could not run)."""
    import shlex

    if other:
        console.print("[red]error:[/] --program goes without FILE.py::Name and --cases")
        raise typer.Exit(2)
    _require_paths([program], "--program ")
    _require_paths([converted] if converted is not None else [], "--converted ")
    _require_extra("verify", ["numpy", "torch", "jax", "flax", "optax"])
    from torch2jax.verify.program import print_program_result, verify_program

    result = verify_program(program, converted, steps, jax_target,
                            shlex.split(program_args or ""), print_skip=print_skip)
    if as_json:
        print(json.dumps(result.to_json()))
    else:
        print_program_result(result, out_console)
    raise typer.Exit(2 if result.error else 0 if result.passed else 1)


def _user_rules(rules_dir: list[Path] | None):
    """The built-in rules with those of [tool.torch2jax] (above the current folder) and
    --rules; a bad rule file is a usage error."""
    from torch2jax.config import ConfigError, find_config, load_user_rules
    from torch2jax.ruleset import RuleError, load_rules

    try:
        dirs = (*find_config(Path.cwd()).rules, *(d.resolve() for d in rules_dir or ()))
        return load_user_rules(dirs) if dirs else load_rules()
    except (ConfigError, RuleError) as exc:
        raise _usage_error(str(exc)) from None


@app.command("rules")
def list_rules(rules_dir: Annotated[list[Path] | None, typer.Option(
        "--rules", help="A folder of extra rule files (repeatable).")] = None) -> None:
    r"""List the translation rules, with those of the rule folders that \[tool.torch2jax] in
    the pyproject.toml above the current folder names (its rules setting) and of --rules."""
    from rich.table import Table

    table = Table(title="torch2jax rules")
    for col in ("kind", "torch", "jax", "source"):
        table.add_column(col, overflow="fold")
    for r in _user_rules(rules_dir).all():
        jax = r.targets.get("nnx") or r.jax or ""
        torch_name = f"Tensor.{r.torch}" if r.kind == "method" else r.torch
        table.add_row(r.kind, torch_name, jax + (f"  ({r.special})" if r.special else ""),
                      r.source)
    out_console.print(table)


@app.command()
def explain(name: Annotated[str, typer.Argument(help="e.g. torch.nn.BatchNorm2d, F.gelu, view")],
            rules_dir: Annotated[list[Path] | None, typer.Option(
                "--rules", help="A folder of extra rule files (repeatable).")] = None) -> None:
    """Show how one torch API is translated and which semantic differences apply."""
    rules = _user_rules(rules_dir)
    aliases = {"nn.": "torch.nn.", "F.": "torch.nn.functional."}
    candidates = [name] + [full + name[len(short):] for short, full in aliases.items()
                           if name.startswith(short)]
    rule = next((r for c in candidates if (r := rules.lookup(c)) is not None), None)
    if rule is None:
        console.print(f"[red]error:[/] no rule for {name!r}; `torch2jax rules` lists them")
        raise typer.Exit(2)
    from rich.markup import escape  # rule text has brackets ([transpose], x[..., 0])

    out_console.print(f"[bold]{escape(rule.torch)}[/] ({rule.kind}, {escape(rule.source)})")
    out_console.print(escape(f"  becomes: {rule.targets.get('nnx') or rule.jax}"))
    if rule.rename:
        out_console.print(escape("  arguments: " + ", ".join(
            f"{k} -> {v}" for k, v in rule.rename.items())))
    if rule.weights:
        out_console.print(escape("  weights: " + ", ".join(
            f"{k} -> {w.to or '(dropped)'}" + (f" [{w.layout}]" if w.layout != "as_is" else "")
            for k, w in rule.weights.items())))
    if rule.layout != "torch":
        out_console.print(f"  activation layout: {rule.layout}")
    if rule.notes:
        out_console.print(escape("  why: " + rule.notes))
    for ex in rule.examples:
        out_console.print(escape(f"  {ex.torch}\n    -> {ex.jax}"))


@app.command()
def weights(
    state_dict_file: Annotated[Path, typer.Argument(
        help="A .pt/.pth or .safetensors file, or a transformers save_pretrained directory.")],
    model: Annotated[str, typer.Option("--model", help="Converted FILE.py::Name.")],
    out: Annotated[Path, typer.Option("--out", help="The orbax checkpoint folder to write.")],
    torch_model: Annotated[str | None, typer.Option(
        "--torch-model", help="Its torch original (a state_dict file only).")] = None,
    args: Annotated[str | None, typer.Option("--args", help="Constructor kwargs as JSON.")] = None,
    build: Annotated[str | None, typer.Option("--build", help="Constructor expression.")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace an existing --out: an earlier checkpoint (orbax's "
        "_CHECKPOINT_METADATA) or an empty folder; a folder of other files is refused.")] = False,
) -> None:
    """Convert trained torch weights into an orbax checkpoint of the converted NNX model (from
    a transformers save_pretrained directory: its safetensors and config.json, no torch)."""
    if state_dict_file.exists():  # (a missing one: weights_command's usage error)
        _require_extra("weights", ["numpy", "jax", "flax", "orbax.checkpoint",
                                   *([] if state_dict_file.is_dir() else ["torch"])])
    from torch2jax.weights_cli import weights_command

    code = weights_command(state_dict_file, model, torch_model, out, args, build, overwrite,
                           lambda text, err: typer.echo(text, err=err))
    raise typer.Exit(code)


if __name__ == "__main__":  # python -m torch2jax.cli
    app()
