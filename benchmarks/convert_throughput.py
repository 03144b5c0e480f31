"""Conversion speed on a large real PyTorch corpus, next to the libcst floor.

The corpus is the Python source that PyPI packages ship: by default the ``timm`` and
``torchvision`` wheels (about 600 files and 230,000 lines of PyTorch models, layers and
transforms). They are downloaded with ``pip download --no-deps`` into a temporary folder and
unpacked there at run time; nothing of them is kept or committed. ``--corpus DIR`` uses a
folder of Python files instead.

For each worker count (``-j 1`` and ``-j 2`` by default) it prints, in the same run:

* the floor: a bare libcst ``parse_module(text).code`` round trip of every file, over the
  same number of worker processes;
* end to end: ``torch2jax convert CORPUS -o OUT`` as the CLI runs it (discovery, the
  repository first pass, reading, converting, writing);

in lines per CPU-second (user + system time of this process and its workers: what a busy
machine does not distort) and per wall-clock second, and the ratio end-to-end / floor. The
wall-clock speed-up of ``-j 2`` over ``-j 1`` follows.

Then, on one large model file (by default the 1,114-line ``denoising_diffusion_pytorch.py`` of
the ``denoising-diffusion-pytorch`` wheel: a UNet, attention, a Gaussian-diffusion trainer):
its conversion in lines per CPU-second next to its floor, and ``torch2jax check FILE`` (the
pre-commit entry), timed as a fresh process (interpreter start and imports included, with the
modules' bytecode cached as an installed package has it) and in process (the engine's check run
alone).

    python benchmarks/convert_throughput.py                     # timm + torchvision, -j 1 and 2
    python benchmarks/convert_throughput.py --jobs 1 --limit 60
    python benchmarks/convert_throughput.py --slowest 15        # the files slowest per line
    python benchmarks/convert_throughput.py --profile 40        # cProfile of -j 1 on 40 files
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path

import libcst as cst

from torch2jax.engine import Options, Request, default_jobs, run

PACKAGES = ["timm==1.0.31", "torchvision==0.29.1"]
LARGE = ("denoising-diffusion-pytorch==2.3.4",
         "denoising_diffusion_pytorch/denoising_diffusion_pytorch.py")


def fetch(package: str, into: Path) -> Path:
    """Download ``package``'s wheel (no dependencies) and unpack its ``.py`` files."""
    wheels = into / "wheels" / package
    pip = subprocess.run([sys.executable, "-m", "pip", "download", package, "--no-deps",
                          "--only-binary", ":all:", "-q", "-d", str(wheels)],
                         capture_output=True, text=True, check=False)
    if pip.returncode:
        sys.exit(f"pip download {package} failed:\n{pip.stderr}")
    wheel = next(wheels.glob("*.whl"))
    corpus = into / "corpus" / wheel.name.split("-")[0]
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".py"):
                z.extract(name, corpus)
    print(f"corpus: {wheel.name}", flush=True)
    return corpus


def _round_trip(path: str) -> int:
    text = Path(path).read_text(encoding="utf-8")
    assert cst.parse_module(text).code == text
    return text.count("\n")


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def floor(files: list[str], jobs: int) -> None:
    """A bare libcst parse + print of every file on ``jobs`` processes."""
    if jobs == 1:
        for f in files:
            _round_trip(f)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_round_trip, files, chunksize=1))


def end_to_end(corpus: Path, out: Path, jobs: int, mode: str = "out") -> tuple[int, int]:
    """``torch2jax convert corpus -o out -j jobs``: files converted, TODOs."""
    report = run(Request(paths=[corpus], mode=mode, out=out if mode == "out" else None,
                         options=Options(), jobs=jobs, use_gitignore=False))
    failed = [f.path for f in report.files if f.status == "failed"]
    if failed:
        print(f"  ({len(failed)} files failed: {', '.join(failed[:3])} ...)")
    converted = sum(1 for f in report.files if f.status == "converted")
    return converted, sum(f.todos for f in report.files)


def timed(fn, *args) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, result) of ``fn(*args)``."""
    c0, w0 = cpu_seconds(), time.perf_counter()
    result = fn(*args)
    return cpu_seconds() - c0, time.perf_counter() - w0, result


def slowest(files: list[Path], count: int) -> None:
    """Convert each file alone (-j 1) and print the ``count`` slowest per line."""
    from torch2jax.convert import ParseError, convert_source
    from torch2jax.ruleset import load_rules

    rules = load_rules()
    rows = []
    for p in files:
        text = p.read_text(encoding="utf-8")
        c0 = time.process_time()
        try:
            convert_source(text, path=str(p), rules=rules, public=frozenset())
        except ParseError:
            continue
        rows.append((time.process_time() - c0, text.count("\n"), p))
    rows.sort(key=lambda r: -r[0] / max(r[1], 1))
    print(f"slowest {count} files per line (convert_source alone):")
    for cpu, lines, p in rows[:count]:
        print(f"  {lines / cpu:8,.0f} lines/CPU-s  {lines:6,} lines  {cpu:6.2f} s  {p.name}")


def large_file(path: Path, tmp: Path) -> None:
    """Convert one large file and time ``torch2jax check`` on it."""
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    print(f"large file: {path.name}, {lines:,} lines", flush=True)
    cpu_floor = min(timed(_round_trip, str(path))[0] for _ in range(3))
    cpu_conv, _, _ = timed(end_to_end, path, tmp / "out-large", 1)
    print(f"  convert -j 1: {lines / cpu_conv:8,.0f} lines/CPU-s ({cpu_conv:5.2f} CPU-s) | "
          f"floor {lines / cpu_floor:8,.0f} lines/CPU-s ({cpu_floor:5.2f} CPU-s) | "
          f"ratio {cpu_floor / cpu_conv:.3f}", flush=True)
    cpu_check, wall_check, _ = timed(end_to_end, path, tmp, 1, "check")
    print(f"  check, in process (the engine's run): {cpu_check:5.2f} CPU-s, "
          f"{wall_check:5.2f} s wall", flush=True)
    # a fresh process, as pre-commit starts it, with the bytecode of its modules cached as an
    # installed package has it (written on a first, untimed run)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    cmd = [sys.executable, "-c", "from torch2jax.cli import app; app()", "check", str(path)]
    cmd_imports = [sys.executable, "-c", "import torch2jax.cli"]  # what check loads

    def fresh(command: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, check=False, env=env)

    fresh(cmd)
    cpu_cli, wall_cli, proc = timed(fresh, cmd)
    cpu_imp, wall_imp, _ = timed(fresh, cmd_imports)
    print(f"  torch2jax check FILE (a fresh process, exit {proc.returncode}): "
          f"{cpu_cli:5.2f} CPU-s, {wall_cli:5.2f} s wall; of which starting Python and "
          f"importing torch2jax.cli {cpu_imp:5.2f} CPU-s, {wall_imp:5.2f} s wall", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", nargs="+", default=PACKAGES,
                    help="the PyPI packages whose source to use (default: %(default)s)")
    ap.add_argument("--corpus", type=Path, help="a folder of Python files instead")
    ap.add_argument("--large", nargs=2, default=LARGE, metavar=("PACKAGE", "PATH"),
                    help="the large file: a package and the path of a file in its wheel")
    ap.add_argument("--no-large", action="store_true", help="skip the large file")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2],
                    help="worker counts (0: all cores); default 1 and 2")
    ap.add_argument("--limit", type=int, default=0, help="only the first N files (sorted)")
    ap.add_argument("--slowest", type=int, default=0,
                    help="also convert each file alone and list the N slowest per line")
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile -j 1 on the first N files and print the top functions")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="torch2jax-bench-") as tmp:
        tmp_path = Path(tmp)
        if args.corpus:
            corpus = args.corpus
        else:
            for package in args.package:
                fetch(package, tmp_path)
            corpus = tmp_path / "corpus"
        files = sorted(p for p in corpus.rglob("*.py"))
        if args.limit or args.profile:
            keep = files[: args.limit or args.profile]
            subset = tmp_path / "subset"
            for p in keep:
                dest = subset / p.relative_to(corpus)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(p.read_bytes())
            corpus, files = subset, sorted(subset.rglob("*.py"))
        lines = sum(p.read_bytes().count(b"\n") for p in files)
        print(f"{len(files)} files, {lines:,} lines; {default_jobs()} cores; "
              f"python {sys.version.split()[0]}, libcst {version('libcst')}",
              flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            end_to_end(corpus, tmp_path / "out-profile", 1)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        names = [str(p) for p in files]
        walls = {}
        for jobs in args.jobs:
            n = jobs or default_jobs()
            cpu_floor, wall_floor, _ = timed(floor, names, n)
            cpu_e2e, wall_e2e, (converted, todos) = timed(end_to_end, corpus,
                                                         tmp_path / f"out-{n}", n)
            walls[n] = wall_e2e
            print(f"-j {n}: per CPU-second: floor {lines / cpu_floor:8,.0f} | end to end "
                  f"{lines / cpu_e2e:8,.0f} lines | ratio {cpu_floor / cpu_e2e:.3f}"
                  f" || wall: floor {wall_floor:6.1f} s | end to end {wall_e2e:6.1f} s "
                  f"({lines / wall_e2e:,.0f} lines/s) | {converted} files converted, "
                  f"{todos} TODOs", flush=True)
        if 1 in walls:
            for n, wall in walls.items():
                if n != 1:
                    print(f"-j {n} vs -j 1: {walls[1] / wall:.2f}x the wall-clock speed",
                          flush=True)
        if not args.no_large:
            large = fetch(args.large[0], tmp_path / "large")
            large_file(large / args.large[1], tmp_path)
        if args.slowest:
            slowest(files, args.slowest)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
