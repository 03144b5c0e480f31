"""Conversion throughput on a large real PyTorch corpus, next to the libcst floor.

The corpus is the Python source that a PyPI package ships (by default the ``timm`` wheel:
about 300 files and 140,000 lines of PyTorch models and layers). It is downloaded with
``pip download --no-deps`` into a temporary folder and unpacked there at run time; nothing of
it is kept or committed. ``--corpus DIR`` uses a folder of Python files instead.

For each worker count (``-j 1`` and ``-j all`` by default) it prints, in the same run:

* the floor: a bare libcst ``parse_module(text).code`` round trip of every file, over the
  same worker processes;
* end to end: ``torch2jax convert CORPUS -o OUT`` as the CLI runs it (discovery, the
  repository first pass, reading, converting, writing);

as lines per second, and the ratio end-to-end / floor.

    python benchmarks/convert_throughput.py                 # timm, -j 1 and -j all
    python benchmarks/convert_throughput.py --jobs 1 2 --limit 60
    python benchmarks/convert_throughput.py --profile 40    # cProfile of -j 1 on 40 files
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
from pathlib import Path

import libcst as cst

from torch2jax.engine import Options, Request, default_jobs, run


def fetch_corpus(package: str, into: Path) -> Path:
    """Download ``package``'s wheel (no dependencies) and unpack its ``.py`` files."""
    wheels = into / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", package, "--no-deps",
                    "--only-binary", ":all:", "-q", "-d", str(wheels)], check=True)
    wheel = next(wheels.glob("*.whl"))
    corpus = into / "corpus"
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


def floor(files: list[str], jobs: int) -> float:
    """Seconds for a bare libcst parse + print of every file on ``jobs`` processes."""
    start = time.perf_counter()
    if jobs == 1:
        for f in files:
            _round_trip(f)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(_round_trip, files, chunksize=1))
    return time.perf_counter() - start


def end_to_end(corpus: Path, out: Path, jobs: int) -> tuple[float, int, int]:
    """Seconds, files converted, TODOs for ``torch2jax convert corpus -o out -j jobs``."""
    start = time.perf_counter()
    report = run(Request(paths=[corpus], mode="out", out=out, options=Options(), jobs=jobs,
                         use_gitignore=False))
    seconds = time.perf_counter() - start
    failed = [f.path for f in report.files if f.status == "failed"]
    if failed:
        print(f"  ({len(failed)} files failed: {', '.join(failed[:3])} ...)")
    converted = sum(1 for f in report.files if f.status == "converted")
    return seconds, converted, sum(f.todos for f in report.files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", default="timm", help="the PyPI package whose source to use")
    ap.add_argument("--corpus", type=Path, help="a folder of Python files instead")
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 0],
                    help="worker counts (0: all cores); default 1 and all")
    ap.add_argument("--limit", type=int, default=0, help="only the first N files (sorted)")
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile -j 1 on the first N files and print the top functions")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="torch2jax-bench-") as tmp:
        tmp_path = Path(tmp)
        corpus = args.corpus or fetch_corpus(args.package, tmp_path)
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
        print(f"{len(files)} files, {lines:,} lines; {default_jobs()} cores", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            end_to_end(corpus, tmp_path / "out-profile", 1)
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            return
        names = [str(p) for p in files]
        for jobs in args.jobs:
            n = jobs or default_jobs()
            c0 = cpu_seconds()
            t_floor = floor(names, n)
            c1 = cpu_seconds()
            t_e2e, converted, todos = end_to_end(corpus, tmp_path / f"out-{n}", n)
            c2 = cpu_seconds()
            floor_lps, e2e_lps = lines / t_floor, lines / t_e2e
            print(f"-j {n}: libcst parse+print floor {floor_lps:8,.0f} lines/s ({t_floor:6.1f} s)"
                  f" | end to end {e2e_lps:8,.0f} lines/s ({t_e2e:6.1f} s, "
                  f"{e2e_lps / n:,.0f} per worker) | ratio {e2e_lps / floor_lps:.3f}"
                  f" | {converted} files converted, {todos} TODOs", flush=True)
            # CPU time is what a busy machine does not distort: lines per CPU-second
            print(f"      per CPU-second: floor {lines / (c1 - c0):8,.0f} | end to end "
                  f"{lines / (c2 - c1):8,.0f} | ratio {(c1 - c0) / (c2 - c1):.3f}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
