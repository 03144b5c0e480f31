"""Greedy decoding: the converted transformers Llama against torch's generate (issue 19).

transformers' ``modeling_llama.py`` is converted as it stands in the installed package (the
transformers tier's conversion, torch2jax/hf.py), a tiny random ``LlamaForCausalLM`` is built
in torch and its weights moved into the converted model. Both then decode greedily from the
same prompt: torch's ``model.generate(do_sample=False)`` (transformers' own loop, its
DynamicCache) and the converted model's ``generate`` (``greedy_generate`` of
``_hf_support``: a StaticCache, the prompt in one pass, a ``lax.while_loop`` step compiled
once; warmed up with the same shapes first, so no compile is timed). The two are timed in
turn, ``--reps`` times each, in one process, and the tokens are checked equal. Reported:
new tokens per second (batch x new tokens / wall time of one generate call), medians, and
their ratio.

The run is in a child process at 1 thread on each side, because XLA reads its flags when
jax is imported: XLA_FLAGS --xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1, OMP_NUM_THREADS=1, torch.set_num_threads(1) (as
benchmarks/programs.py does).

    python benchmarks/hf_generate.py                      # batch 1, prompt 8, 64 new tokens
    python benchmarks/hf_generate.py --batch 4 --new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
          "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2,
          "pad_token_id": 0, "initializer_range": 0.2}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    import importlib

    import jax
    import numpy as np
    import transformers
    from flax import nnx
    from jax import numpy as jnp

    sys.path.insert(0, str(ROOT))
    from torch2jax.verify.package import convert_package_file
    from torch2jax.verify.run import _convert_file
    from torch2jax.weights import transfer_state_dict

    models = Path(transformers.__file__).parent / "models"
    with tempfile.TemporaryDirectory() as tmp:
        path, todos = convert_package_file(
            models / "llama" / "modeling_llama.py", Path(tmp),
            lambda f, known: _convert_file(f, "nnx", None, known), {"LlamaForCausalLM"})
        assert todos == 0, todos
        sys.path.insert(0, tmp)
        converted = importlib.import_module(
            ".".join(path.relative_to(tmp).with_suffix("").parts))
        sys.path.remove(tmp)

        from transformers.models.llama.modeling_llama import LlamaForCausalLM

        torch.manual_seed(0)
        torch_model = LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
        jax_model = converted.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG),
                                               rngs=nnx.Rngs(0))
        transfer_state_dict(torch_model, jax_model, None)
        jax_model.eval()

        ids = np.random.default_rng(0).integers(3, CONFIG["vocab_size"],
                                                (args.batch, args.prompt))
        mask = np.ones_like(ids)
        t_ids, t_mask = torch.tensor(ids), torch.tensor(mask)
        j_ids, j_mask = jnp.asarray(ids), jnp.asarray(mask)

        def run_torch():
            with torch.no_grad():
                return torch_model.generate(t_ids, attention_mask=t_mask, do_sample=False,
                                            max_new_tokens=args.new_tokens, eos_token_id=None,
                                            pad_token_id=0).numpy()

        def run_jax():
            return np.asarray(jax.block_until_ready(jax_model.generate(
                j_ids, attention_mask=j_mask, max_new_tokens=args.new_tokens,
                eos_token_id=[], pad_token_id=0)))

        start = time.perf_counter()
        want, got = run_torch(), run_jax()  # warm-up; the JAX call compiles
        compile_s = time.perf_counter() - start
        times: dict[str, list[float]] = {"torch": [], "jax": []}
        for rep in range(args.reps):
            for side in (("torch", "jax") if rep % 2 == 0 else ("jax", "torch")):
                start = time.perf_counter()
                out = run_torch() if side == "torch" else run_jax()
                times[side].append(time.perf_counter() - start)
                assert (out == want).all(), f"{side}: the tokens differ"
        new = args.batch * args.new_tokens
        result = {side: new / statistics.median(t) for side, t in times.items()}
        result.update(equal=bool((got == want).all()), warmup_s=compile_s,
                      jax_version=jax.__version__, torch_version=torch.__version__,
                      transformers_version=transformers.__version__)
        print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                         "intra_op_parallelism_threads=1").strip()}
    done = subprocess.run([sys.executable, __file__, "--child", "--batch", str(args.batch),
                           "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
                           "--reps", str(args.reps)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"child failed:\n{done.stderr[-3000:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"tiny LlamaForCausalLM (hidden 64, 2 layers, vocab 256), batch {args.batch}, "
          f"prompt {args.prompt}, {args.new_tokens} new tokens, greedy, 1 thread each side, "
          f"medians of {args.reps} calls in turn; jax {r['jax_version']}, torch "
          f"{r['torch_version']}, transformers {r['transformers_version']}; tokens equal: "
          f"{r['equal']}; first calls (JAX compile included): {r['warmup_s']:.1f} s\n")
    print("| new tokens/s | torch generate | converted generate | converted / torch |")
    print("|---|---|---|---|")
    print(f"| batch {args.batch} | {r['torch']:.1f} | {r['jax']:.1f} | "
          f"{r['jax'] / r['torch']:.2f} |")


if __name__ == "__main__":
    main()
