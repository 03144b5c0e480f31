"""Start-up time of the command line: ``torch2jax --help`` and ``torch2jax check FILE`` on a
1,000-line PyTorch file, each timed as a fresh process (what a pre-commit hook starts on every
commit), with the bytecode of torch2jax's modules cached as an installed package has it.

It prints the median wall-clock time of ``--runs`` fresh processes per command (after one
warm-up run that writes the bytecode), their median CPU time (user + system of the process and
its workers: what a machine busy with other jobs distorts less than the wall clock), and the torch2jax modules and third-party packages each
command imported (``python -X importtime``, the slowest first with ``--imports N``).

    python benchmarks/startup.py
    python benchmarks/startup.py --runs 21 --imports 15

The torch2jax measured is the one ``python -c "import torch2jax"`` finds: set ``PYTHONPATH`` to
a checkout to time that one (for instance an older commit, to compare). The 1,000-line file is
written into a temporary folder: model classes as users write them (layers, a forward with
reshapes and activations, a training step), repeated under new names.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = """import torch
import torch.nn as nn
import torch.nn.functional as F

"""

BLOCK = '''

class Block{i}(nn.Module):
    """A residual MLP block with a normalisation and dropout."""

    def __init__(self, dim: int = 64, hidden: int = 256, p: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(p)
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        h = F.gelu(self.fc1(h))
        h = self.drop(h)
        h = self.fc2(h) * self.scale
        return x + h


class Net{i}(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((4, 4))
        self.proj = nn.Linear(16 * 4 * 4, 64)
        self.blocks = nn.ModuleList([Block{i}() for _ in range(2)])
        self.head = nn.Linear(64, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv(images))
        x = self.pool(x).flatten(1)
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def train_step{i}(model, optimizer, images, labels):
    model.train()
    optimizer.zero_grad()
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    optimizer.step()
    return loss.item()
'''


def large_file(lines: int) -> str:
    """About ``lines`` lines of PyTorch code."""
    text, i = HEADER, 0
    while text.count("\n") < lines:
        text += BLOCK.format(i=i)
        i += 1
    return text


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fresh(args: list[str], env: dict[str, str], cwd: str) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and exit status of one fresh ``torch2jax ARGS`` process (run
    from ``cwd``: not this checkout, which ``python -c`` would put first on the path)."""
    cmd = [sys.executable, "-c", "from torch2jax.cli import app; app()", *args]
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, check=False, env=env, cwd=cwd)
    return time.perf_counter() - start, _children_cpu() - cpu, proc.returncode


def imports(args: list[str], env: dict[str, str], cwd: str, top: int) -> None:
    """The packages a fresh ``torch2jax ARGS`` imports, and its slowest imports."""
    cmd = [sys.executable, "-X", "importtime", "-c", "from torch2jax.cli import app; app()",
           *args]
    err = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env,
                         cwd=cwd).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line[len("import time:"):].split("|")
        if cumulative.strip().isdigit():
            rows.append((int(cumulative), name.rstrip()))
    top_level = sorted({n.strip().split(".")[0] for _, n in rows if not n.startswith("  ")})
    print(f"    imported packages: {', '.join(top_level)}")
    ours = sorted({n.strip() for _, n in rows if n.strip().startswith("torch2jax")})
    print(f"    torch2jax modules ({len(ours)}): {', '.join(ours)}")
    for cumulative, name in sorted(rows, reverse=True)[:top]:
        print(f"    {cumulative / 1000:8.1f} ms  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="fresh processes per command")
    parser.add_argument("--lines", type=int, default=1000, help="lines of the checked file")
    parser.add_argument("--imports", type=int, default=0, metavar="N",
                        help="also print the N slowest imports of each command")
    opts = parser.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        found = subprocess.run(
            [sys.executable, "-c", "import torch2jax; print(torch2jax.__file__)"],
            capture_output=True, text=True, check=True, env=env, cwd=tmp).stdout.strip()
        print(f"torch2jax: {Path(found).parent}; {os.cpu_count()} CPUs, load average "
              f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        path = Path(tmp) / "model.py"
        path.write_text(large_file(opts.lines), encoding="utf-8")
        n_lines = path.read_text(encoding="utf-8").count("\n")
        commands = {"torch2jax --help": ["--help"],
                    f"torch2jax check FILE ({n_lines} lines)": ["check", str(path)]}
        for label, args in commands.items():
            fresh(args, env, tmp)  # warm-up: writes the bytecode of what it imports
            walls, cpus, codes = [], [], set()
            for _ in range(opts.runs):
                wall, cpu, code = fresh(args, env, tmp)
                walls.append(wall)
                cpus.append(cpu)
                codes.add(code)
            print(f"{label}: median {statistics.median(walls):.3f} s wall (min {min(walls):.3f}, "
                  f"max {max(walls):.3f}), {statistics.median(cpus):.3f} CPU-s, over "
                  f"{opts.runs} fresh processes (exit {', '.join(map(str, sorted(codes)))})",
                  flush=True)
            if opts.imports:
                imports(args, env, tmp, opts.imports)


if __name__ == "__main__":
    main()
