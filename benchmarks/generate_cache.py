"""nanoGPT's converted generate() with and without its key/value cache (issue 30), in one process.

Converts benchmarks/programs/nanogpt.py twice: as the converter writes it (the prompt once, then
one position per token against cached keys and values until the context fills block_size,
passes/kv_cache_decode.py) and with the cache off (the window route: windows of 8, 16, 32, ...
positions recomputed per token). Runs both, the cached-decoder twin
(nanogpt_sample_cached_jax.py) and the fixed-buffer twin (nanogpt_jax.py) in turn after a
warm-up, and prints the median CPU ms per call of 100 tokens (as benchmarks/programs.py runs
them: a prompt of 1, top-k 10), each one's ratio to the cached twin, and whether the two
converted routes draw the same tokens. One thread (XLA's Eigen pool off).

``--program gpt_sample`` does the same for gpt_sample.py (a free function ``generate(model,
idx, ...)`` over a forward computing every position; its twins gpt_sample_cached_jax.py and
gpt_sample_jax.py); there ``--top-k 0`` samples without top-k (nanogpt.py's is 10).

    python benchmarks/generate_cache.py --calls 15
    python benchmarks/generate_cache.py --calls 15 --program gpt_sample
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "benchmarks" / "programs"


def _load(code: str, name: str) -> dict:
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def _cut(code: str) -> str:
    """A program's definitions: its run at the end cut off."""
    ends = [code.find(end) for end in ('\nif mode == "train":', "\nsample()", "\nmodel = GPT(")]
    return code[:min(e for e in ends if e >= 0)]


def _converted(program: str, cache: bool) -> dict:
    """The definitions of the converted program."""
    from torch2jax.convert import convert_source
    from torch2jax.passes import generation

    real = generation.cache_decoding
    if not cache:
        generation.cache_decoding = lambda module, source, taken: module
    try:
        code = convert_source((PROGRAMS / f"{program}.py").read_text(),
                              path=f"{program}.py").code
    finally:
        generation.cache_decoding = real
    assert ("cached_step" in code) == cache
    return _load(_cut(code), f"{program}_cache_{cache}")


def _twin(name: str) -> dict:
    return _load(_cut((PROGRAMS / f"{name}.py").read_text()), name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--program", choices=("nanogpt", "gpt_sample"), default="nanogpt")
    p.add_argument("--top-k", type=int, default=10)
    args = p.parse_args()
    if args.program == "nanogpt" and args.top_k != 10:
        p.error("nanogpt.py samples with top-k 10")
    os.environ["GPT_TOP_K"] = str(args.top_k)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                               "=false intra_op_parallelism_threads=1").strip()
    os.environ["GPT_MODE"] = "sample"
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    from flax import nnx

    start = jnp.zeros((1, 1), jnp.int32)
    calls = {}
    function = args.program == "gpt_sample"  # generate(model, ...) rather than a method
    for cache in (True, False):
        ns = _converted(args.program, cache)
        model = ns["GPT"](rngs=nnx.Rngs(0))
        model.eval()
        calls["converted, cached" if cache else "converted, windows"] = (
            (lambda ns=ns, m=model: ns["generate"](m, start, args.tokens,
                                                   temperature=ns["temperature"],
                                                   top_k=args.top_k or None,
                                                   key=jax.random.key(1))) if function else
            (lambda ns=ns, m=model: m.generate(start, args.tokens,
                                               temperature=ns["temperature"],
                                               top_k=ns["top_k"])))
    twins = ("gpt_sample_cached_jax", "gpt_sample_jax") if function else (
        "nanogpt_sample_cached_jax", "nanogpt_jax")
    for side, name in zip(("cached twin", "fixed-buffer twin"), twins):
        ns = _twin(name)
        model = ns["GPT"](nnx.Rngs(0))
        calls[side] = lambda ns=ns, m=model: ns["generate"](m, jax.random.key(1), args.tokens)
    first, out = {}, {}
    for key, call in calls.items():
        t = time.process_time()
        out[key] = jax.block_until_ready(call())
        first[key] = time.process_time() - t
    times: dict = {key: [] for key in calls}
    items = list(calls.items())
    for r in range(args.calls):
        for key, call in items if r % 2 == 0 else items[::-1]:
            t = time.process_time()
            jax.block_until_ready(call())
            times[key].append(time.process_time() - t)
    base = statistics.median(times["cached twin"])
    print(f"{args.program}: {args.tokens} tokens from a prompt of 1, top-k {args.top_k or 'off'}; "
          f"median of {args.calls} calls, CPU ms per call")
    print("| program | CPU ms/call | / cached twin | first call (CPU s) | calls (CPU ms) |")
    print("|---|---|---|---|---|")
    for key, values in times.items():
        median = statistics.median(values)
        print(f"| {key} | {median * 1e3:.2f} | {median / base:.3f} | {first[key]:.2f} | "
              + " / ".join(f"{v * 1e3:.1f}" for v in values) + " |")
    same = bool((out["converted, cached"] == out["converted, windows"]).all())
    print(f"the two converted routes draw the same tokens: {same}")


if __name__ == "__main__":
    main()
