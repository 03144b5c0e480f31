"""The converted generate() with and without its window loops (issue 30), in one process.

Converts benchmarks/programs/gpt_sample.py and nanogpt.py twice: as the converter writes them
(while the context is shorter than block_size, the model runs on windows of 8, 16, 32, ...
positions) and with the window loops off (the model on the full window from the first token).
Runs both in turn, after a warm-up that compiles them, and prints the median CPU ms per call,
their ratio, the CPU seconds of the first call (its compile) and whether the tokens are the
same. One thread (XLA's Eigen pool off), as ``benchmarks/programs.py --one-thread``.

    python benchmarks/generate_windows.py --calls 21
    python benchmarks/generate_windows.py --calls 5 --block 256 --layers 4 --width 128 --tokens 255
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "benchmarks" / "programs"


def convert(path: Path, windows: bool, sizes: dict[str, int]) -> dict:
    """The definitions of the converted program (its run at the end cut off)."""
    import torch2jax.convert as convert_module

    source = path.read_text()
    for name, value in sizes.items():
        source = re.sub(rf"^{name} = \d+$", f"{name} = {value}", source, flags=re.MULTILINE)
    real = convert_module.compile_generation

    def without_windows(*args, imports=None, **kwargs):
        return real(*args, **kwargs)

    if not windows:
        convert_module.compile_generation = without_windows
    try:
        code = convert_module.convert_source(source, path=str(path)).code
    finally:
        convert_module.compile_generation = real
    cut = min(i for i in (code.find("\nkey, subkey = jax.random.split(key)\nmodel = GPT("),
                          code.find('\nif mode == "train":')) if i >= 0)
    name = f"windows_{windows}_{path.stem}"
    module_path = Path(tempfile.mkdtemp()) / f"{name}.py"
    module_path.write_text(code[:cut])
    spec = importlib.util.spec_from_file_location(name, module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--calls", type=int, default=21)
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                               "=false intra_op_parallelism_threads=1").strip()
    os.environ["GPT_MODE"] = "sample"
    sys.path.insert(0, str(ROOT))
    import jax
    import jax.numpy as jnp
    from flax import nnx

    sizes = {"block_size": args.block, "n_layer": args.layers, "n_embd": args.width}
    start = jnp.zeros((1, 1), jnp.int32)
    calls = {}
    for windows in (False, True):
        side = "windows" if windows else "full window"
        sample = convert(PROGRAMS / "gpt_sample.py", windows, sizes)
        model = sample["GPT"](rngs=nnx.Rngs(0))
        for top_k in (10, None):
            calls[(f"sample, top-k {top_k}", side)] = (
                lambda s=sample, m=model, k=top_k: s["generate"](
                    m, start, args.tokens, temperature=0.8, top_k=k, key=jax.random.key(1)))
        nano = convert(PROGRAMS / "nanogpt.py", windows, sizes)
        model = nano["GPT"](rngs=nnx.Rngs(0))
        model.eval()
        calls[("nanogpt sample", side)] = (lambda n=nano, m=model: m.generate(
            start, args.tokens, temperature=n["temperature"], top_k=n["top_k"]))
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
    print(f"block {args.block}, {args.layers} layers, {args.width} wide, {args.tokens} tokens "
          f"from a prompt of 1; median of {args.calls} calls, CPU ms per call")
    print("| program | full window | windows | windows/full | first call CPU s, full | "
          "windows | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for case in dict.fromkeys(k[0] for k in calls):
        full, win = (statistics.median(times[(case, s)]) * 1e3 for s in ("full window", "windows"))
        same = bool((out[(case, "full window")] == out[(case, "windows")]).all())
        print(f"| {case} | {full:.2f} | {win:.2f} | {win / full:.3f} | "
              f"{first[(case, 'full window')]:.2f} | {first[(case, 'windows')]:.2f} | {same} |")


if __name__ == "__main__":
    main()
