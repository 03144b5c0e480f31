"""Whole programs, torch vs converted vs hand-written JAX (issue 20, item 4).

Programs in benchmarks/programs/: a nanoGPT-shaped training script (gpt_train.py: ms per
iteration, data, step and logging included) and a sampling script (gpt_sample.py: tokens per
second of a token-by-token generate()); issue 30's public shapes: nanogpt.py (training with
micro-step accumulation, parameter groups and an lr set per iteration; sampling with a
generate() method whose forward computes the last position only), mingpt_trainer.py (minGPT's
Dataset and Trainer) and char_rnn_sample.py (a GRU sampled one character at a time). Each is run three ways in one process, in turn:

* torch: the original script;
* converted: the script converted by torch2jax now (convert_source of the working tree);
* twin: the same program written by hand in idiomatic JAX (gpt_train_jax.py, gpt_sample_jax.py);
  for the GPT sampling programs also a cached twin, a decoder with a key/value cache
  (gpt_sample_cached_jax.py, nanogpt_sample_cached_jax.py). The char-RNN's twin carries the
  GRU's hidden state, which is its cache.

Each program times itself (its warmup iterations and compilation excluded) and prints
``ms_per_iter=`` or ``tokens_per_s=``; a run is ``runpy.run_path`` of the script with its
output captured. The order of the three is rotated every repetition, and the table shows the
median over the repetitions. Thread settings run in child processes, because XLA reads its
flags when jax is imported: 1 thread (XLA's Eigen pool off, torch.set_num_threads(1)), then all
threads. A program that fails (a converted script with a TODO) is reported with its error.

A second table gives each JAX program's compile cost, which the timings above exclude: the
seconds it spent tracing, lowering and compiling (jax.monitoring's compile events, summed over
the run; CPU seconds with --cpu-time), its number of XLA compiles, and that cost in
steady-state iterations or tokens. An eager op that an earlier run in the same process
compiled is not compiled again, so it is not counted.

    python benchmarks/programs.py                 # CPU, 1 thread then all threads
    python benchmarks/programs.py --device cuda   # torch on CUDA, JAX on its default GPU
    python benchmarks/programs.py --cases sample  # the sampling program only
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
ROOT = HERE.parent
CASES = {  # name: (torch script, twin, metric, environment of the run)
    "train": ("gpt_train.py", "gpt_train_jax.py", "ms_per_iter", {}),
    "sample": ("gpt_sample.py", "gpt_sample_jax.py", "tokens_per_s", {"GPT_TOP_K": "10"}),
    # without top-k: the same loop with one step fewer
    "sample, no top-k": ("gpt_sample.py", "gpt_sample_jax.py", "tokens_per_s",
                         {"GPT_TOP_K": "0"}),
    # issue 30: the public shapes. nanoGPT: micro-step accumulation, parameter groups, an lr
    # set per iteration; generate() a method whose forward computes the last position only
    "nanogpt train": ("nanogpt.py", "nanogpt_jax.py", "ms_per_iter", {"GPT_MODE": "train"}),
    "nanogpt sample": ("nanogpt.py", "nanogpt_jax.py", "tokens_per_s", {"GPT_MODE": "sample"}),
    # minGPT's demo: a Dataset drawing in __getitem__, a Trainer class with a DataLoader
    "mingpt trainer": ("mingpt_trainer.py", "mingpt_trainer_jax.py", "ms_per_iter", {}),
    # a char-level GRU sampled one token at a time with torch.multinomial
    "charrnn sample": ("char_rnn_sample.py", "char_rnn_sample_jax.py", "tokens_per_s", {}),
}
# a second twin for the sampling program: the decoder with a key/value cache (issue 30)
CACHED = {
    "sample": "gpt_sample_cached_jax.py",
    "sample, no top-k": "gpt_sample_cached_jax.py",
    "nanogpt sample": "nanogpt_sample_cached_jax.py",
}
GROUPS = ["train", "sample", "nanogpt", "mingpt", "charrnn"]  # --cases: a case's first word
METRIC = re.compile(r"^(ms_per_iter|tokens_per_s)=([0-9.]+)$", re.MULTILINE)


class CompileClock:
    """What a program spends compiling: jax's monitoring events around tracing a jitted
    function (jaxpr_trace), lowering it (jaxpr_to_mlir_module) and XLA's compile
    (backend_compile). Each event records a scalar at its start and a duration at its end;
    the clock reads the process's CPU time (or wall time) at both and sums the outermost
    spans, so a trace nested in another counts once. ``compiles`` counts XLA compiles."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")

    def __init__(self, cpu_time: bool) -> None:
        import jax.monitoring

        self.clock = time.process_time if cpu_time else time.perf_counter
        self.starts: list[float] = []
        self.reset()
        jax.monitoring.register_scalar_listener(self._start)
        jax.monitoring.register_event_duration_secs_listener(self._end)

    def close(self) -> None:
        import jax.monitoring

        jax.monitoring.unregister_scalar_listener(self._start)
        jax.monitoring.unregister_event_duration_listener(self._end)

    def reset(self) -> None:
        self.seconds, self.compiles, self.starts = 0.0, 0, []

    def _start(self, event: str, value: float, **kwargs: object) -> None:
        if event in self.EVENTS:
            self.starts.append(self.clock())

    def _end(self, event: str, duration: float, **kwargs: object) -> None:
        if event not in self.EVENTS or not self.starts:
            return
        start = self.starts.pop()
        if not self.starts:  # outermost span
            self.seconds += self.clock() - start
        self.compiles += event == self.EVENTS[2]


def _run(script: Path, env: dict[str, str], cpu_time: bool = False,
         compile_clock: CompileClock | None = None) -> tuple[float | None, str]:
    import runpy

    os.environ.update(env)
    out = io.StringIO()
    clock = time.perf_counter
    if compile_clock is not None:
        # (no jax.clear_caches(): a program's timed region may hold an eager op's first call,
        # which an earlier run in this process compiled, as before; the jitted functions of
        # a run are new objects, so their tracing and compiles are all counted)
        compile_clock.reset()
    if cpu_time:  # the program's own timer reads the process's CPU time (a loaded machine)
        time.perf_counter = time.process_time
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
    except BaseException as exc:  # noqa: BLE001 - a failing program is a result
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return None, last[:160]
    finally:
        time.perf_counter = clock
    found = METRIC.findall(out.getvalue())
    return (float(found[-1][1]), "") if found else (None, "printed no metric")


def child(args: argparse.Namespace) -> None:
    if args.threads == 1:
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    import jax
    import torch

    if args.device == "cuda":
        assert torch.cuda.is_available(), "--device cuda: torch sees no CUDA device"
        assert jax.default_backend() == "gpu", f"jax's default backend is {jax.default_backend()}"
    sys.path.insert(0, str(ROOT))
    from torch2jax.convert import convert_source

    tmp = Path(tempfile.mkdtemp(prefix="programs-"))
    scripts: dict[str, dict[str, Path]] = {}
    for case, (torch_name, twin, _, _) in CASES.items():
        src = PROGRAMS / torch_name
        converted = tmp / f"converted_{torch_name}"  # (the same file for both samples)
        converted.write_text(convert_source(src.read_text(), path=str(src)).code)
        scripts[case] = {"torch": src, "converted": converted, "twin": PROGRAMS / twin}
        if case in CACHED:
            scripts[case]["cached twin"] = PROGRAMS / CACHED[case]
    results: dict[str, dict[str, list[float]]] = {c: {} for c in CASES}
    compile_s: dict[str, dict[str, list[float]]] = {c: {} for c in CASES}
    compiles: dict[str, dict[str, list[int]]] = {c: {} for c in CASES}
    compile_clock = CompileClock(args.cpu_time)
    errors: dict[str, dict[str, str]] = {c: {} for c in CASES}
    once: dict[str, set[str]] = {c: set() for c in CASES}  # runs too slow to repeat
    order = ["torch", "converted", "twin"]
    for rep in range(args.reps):
        for case in CASES:
            sides = order + (["cached twin"] if case in scripts and "cached twin" in
                             scripts[case] else [])
            for who in sides[rep % len(sides):] + sides[:rep % len(sides)]:
                if who in errors[case] or who in once[case]:
                    continue
                start = time.perf_counter()
                value, err = _run(scripts[case][who], CASES[case][3], args.cpu_time,
                                  compile_clock)
                if time.perf_counter() - start > args.slow_s:
                    once[case].add(who)  # (the converted eager sampling loop: minutes)
                if value is None:
                    errors[case][who] = err
                else:
                    results[case].setdefault(who, []).append(value)
                    if who != "torch":
                        compile_s[case].setdefault(who, []).append(compile_clock.seconds)
                        compiles[case].setdefault(who, []).append(compile_clock.compiles)
    cpu = os.times()
    print(json.dumps({"threads": args.threads,
                      "median": {c: {w: statistics.median(v) for w, v in r.items()}
                                 for c, r in results.items()},
                      "compile_s": {c: {w: statistics.median(v) for w, v in r.items()}
                                    for c, r in compile_s.items()},
                      "compiles": {c: {w: statistics.median(v) for w, v in r.items()}
                                   for c, r in compiles.items()},
                      "errors": errors, "once": {c: sorted(w) for c, w in once.items()},
                      "cpu_s": cpu.user + cpu.system}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=120, help="training iterations per run")
    p.add_argument("--tokens", type=int, default=100, help="tokens generated per run")
    p.add_argument("--slow-s", type=float, default=15.0,
                   help="a program whose run takes longer is not repeated")
    p.add_argument("--cases", nargs="+", choices=GROUPS, default=GROUPS,
                   help="the programs to run, by a case's first word (sample: both "
                        "sampling rows; nanogpt: its training and sampling rows)")
    p.add_argument("--one-thread", action="store_true",
                   help="on the CPU, the 1-thread setting only")
    p.add_argument("--cpu-time", action="store_true",
                   help="each program's timer (time.perf_counter) reads the process's CPU "
                        "time (time.process_time): on a machine other jobs load, with 1 thread")
    p.add_argument("--threads", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    for case in list(CASES):
        if re.split(r"[ ,]", case)[0] not in args.cases:
            del CASES[case]
    if args.child:
        child(args)
        return
    env = {**os.environ, "GPT_MAX_ITERS": str(args.iters), "GPT_NEW_TOKENS": str(args.tokens),
           "GPT_DEVICE": args.device}
    settings = ([1] if args.one_thread else [1, 0]) if args.device == "cpu" else [0]
    rows = []
    for threads in settings:
        e = dict(env)
        if args.device == "cpu":
            e["JAX_PLATFORMS"] = "cpu"
        if threads == 1:
            e["XLA_FLAGS"] = (e.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                              "intra_op_parallelism_threads=1").strip()
            e["OMP_NUM_THREADS"] = "1"
        done = subprocess.run([sys.executable, __file__, "--child", "--threads", str(threads),
                               "--device", args.device, "--reps", str(args.reps),
                               "--slow-s", str(args.slow_s), "--cases", *args.cases,
                               *(["--cpu-time"] if args.cpu_time else [])],
                              env=e, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"child failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    clock = "CPU " if args.cpu_time else ""
    print(f"device {args.device}; medians of {args.reps} runs; train: {clock}ms per iteration "
          f"({args.iters} iterations, 10 warmup), sample: tokens per {clock}s ({args.tokens} "
          "tokens)\n")
    print("| program | threads | torch | converted | twin | converted/twin | cached twin | "
          "converted/cached twin | converted speedup over torch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        threads = "1" if row["threads"] == 1 else "all"
        for case, (_, _, metric, _) in CASES.items():
            med, err = row["median"][case], row["errors"][case]

            def cell(who: str, med=med, once=row["once"][case]) -> str:
                mark = " (1 run)" if who in once else ""
                return f"{med[who]:.2f}{mark}" if who in med else "fails"

            conv, twin, tor = med.get("converted"), med.get("twin"), med.get("torch")
            cached = med.get("cached twin")
            if metric == "ms_per_iter":  # lower is better: converted takes x times the twin
                ratio = f"{conv / twin:.2f}" if conv and twin else "-"
                vs_torch = f"{tor / conv:.2f}" if conv and tor else "-"
            else:  # tokens/s, higher is better: the twin is x times faster than converted
                ratio = f"{twin / conv:.2f}" if conv and twin else "-"
                vs_torch = f"{conv / tor:.2f}" if conv and tor else "-"
            vs_cached = f"{cached / conv:.2f}" if conv and cached else "-"
            print(f"| {case} ({metric}) | {threads} | {cell('torch')} | {cell('converted')} "
                  f"| {cell('twin')} | {ratio} | {cell('cached twin') if cached else '-'} "
                  f"| {vs_cached} | {vs_torch} |")
            for who, msg in err.items():
                print(f"|   {who} failed: {msg} |||||||||")
    print("\nconverted/twin: time (train) or inverse throughput (sample) of the converted "
          "program over the twin's; 1.0 is parity, above 1 slower. Speedup over torch: torch's "
          "time over the converted program's (train), the converted tokens/s over torch's "
          "(sample); above 1 the converted program is faster.")
    print(f"\nCompile cost (medians): what each JAX program spends tracing, lowering and "
          f"compiling ({clock.strip() or 'wall'} time; its first calls, excluded from the "
          "steady state above), against one steady-state iteration or token\n")
    print("| program | threads | side | XLA compiles | compile s | steady state | "
          "compile / steady step |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        threads = "1" if row["threads"] == 1 else "all"
        for case, (_, _, metric, _) in CASES.items():
            for who, seconds in row["compile_s"][case].items():
                value = row["median"][case][who]
                step_ms = value if metric == "ms_per_iter" else 1000 / value
                unit = "ms/iteration" if metric == "ms_per_iter" else "ms/token"
                print(f"| {case} | {threads} | {who} | {row['compiles'][case][who]:g} | "
                      f"{seconds:.2f} | {step_ms:.3f} {unit} | "
                      f"{seconds * 1000 / step_ms:.0f} |")


if __name__ == "__main__":
    main()
