"""``torch2jax verify --program``: run a torch program and its converted program side by side
for N optimizer steps and compare what the programs themselves compute (docs/verification.md,
"Verifying a program").

Each side runs in its own process, instrumented before the program starts
(``program_torch.py``, ``program_jax.py``): the torch side first, which records the model's
initial weights and the inputs of each of its forward calls; then the converted program, whose
model receives those weights and replays those inputs. Both stop after their N-th optimizer
step. This module compares the two records: the loss at every ``backward`` /
``value_and_grad``, the learning rate of every step, the parameters and the optimizer state
after every step (a mismatch names the first step it shows at), which tensors weight decay
touches and by how much, the seeds the programs set, and the printed lines.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torch2jax.verify.scratch import Scratch, changed_links, scratch_folder

PROGRAM_RTOL = 1e-3  # norm-wise, parameters and optimizer state after N float32 steps
LOSS_RTOL = 1e-4
LR_RTOL = 1e-5  # the JAX side keeps the injected learning rate in float32
DECAY_RTOL = 1e-3
NOISE = 1e-4  # a gradient this far below the model's largest is float32 rounding
# torch's optimizer state slot -> optax's, the first one the JAX state has: Adam and its kin
# (Adamax's infinity norm is optax's nu), SGD's and RMSprop's momentum, RMSprop's averages
# (centered: optax's scale_by_stddev mu and nu), Adadelta's, Adagrad's sum of squares
SLOTS = {"exp_avg": ("mu",), "exp_avg_sq": ("nu",), "exp_inf": ("nu",),
         "momentum_buffer": ("trace",), "square_avg": ("e_g", "nu"), "acc_delta": ("e_x",),
         "grad_avg": ("mu",), "sum": ("sum_of_squares",)}
# the targets whose converted programs can be instrumented, and the module that does it
JAX_SIDES = {"nnx": "torch2jax.verify.program_jax"}
KINDS = ("run", "loss", "lr", "param", "opt_state", "decay", "seed", "print")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class Check:
    kind: str  # loss, lr, param, opt_state, decay, seed, print
    name: str  # the step, the tensor, the seed call or the line
    passed: bool
    detail: str
    figure: float | None = None
    step: int | None = None  # the optimizer step it concerns (a mismatch: the first one)


@dataclass
class ProgramResult:
    program: str
    converted: str
    target: str
    steps: int
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)

    def failures(self, kind: str | None = None) -> list[Check]:
        return [c for c in self.checks if not c.passed and kind in (None, c.kind)]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = self.passed
        return out


class ProgramError(RuntimeError):
    pass


def _run_side(module: str, args: list[str], timeout: float,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=cwd,
                              check=False)
    except subprocess.TimeoutExpired:
        raise ProgramError(f"{module} ran past {timeout:.0f}s") from None


def _load(path: Path, proc: subprocess.CompletedProcess, side: str) -> dict[str, Any]:
    if not path.exists():
        raise ProgramError(f"the {side} side failed (exit {proc.returncode}):\n"
                           + proc.stderr[-3000:])
    with path.open("rb") as f:
        record = pickle.load(f)
    record["stdout"] = proc.stdout
    return record


def torch_side(program: Path, steps: int, args: list[str], record: Path,
               timeout: float = 600, cwd: Path | None = None) -> dict[str, Any]:
    """Run the torch program for ``steps`` optimizer steps (in ``cwd``: the current folder by
    default); its record (also pickled to ``record``, which :func:`jax_side` reads)."""
    proc = _run_side("torch2jax.verify.program_torch",
                     [str(record), str(steps), str(program), *args], timeout, cwd)
    return _load(record, proc, "torch")


def jax_side(converted: Path, torch_record: Path, steps: int, args: list[str], record: Path,
             timeout: float = 600, cwd: Path | None = None,
             side: str = "torch2jax.verify.program_jax") -> dict[str, Any]:
    """Run the converted program for ``steps`` optimizer steps from the torch side's start
    (``side``: the module instrumenting the target's program)."""
    proc = _run_side(side,
                     [str(record), str(torch_record), str(steps), str(converted), *args],
                     timeout, cwd)
    return _load(record, proc, "JAX")


def verify_program(program: Path, converted: Path | None = None, steps: int = 10,
                   target: str = "nnx", args: list[str] | None = None,
                   rtol: float = PROGRAM_RTOL, timeout: float = 600,
                   print_skip: list[str] | None = None) -> ProgramResult:
    """Run ``program`` and its conversion (``converted``, or made here) for ``steps``
    optimizer steps each, with ``args`` as their command line, and compare them (printed
    lines matching a ``print_skip`` pattern, such as timings, left out)."""
    r = ProgramResult(str(program), str(converted or ""), target, steps)
    if target not in JAX_SIDES:
        r.error = f"--program supports the {', '.join(JAX_SIDES)} target (not {target})"
        return r
    sides: list[Scratch] = []
    with tempfile.TemporaryDirectory(prefix="torch2jax_program_") as tmp_name:
        tmp = Path(tmp_name)
        try:
            if converted is None:
                from torch2jax.verify.run import convert_tree, converted_location

                convert_tree(program.resolve(), tmp / "converted", target, None)
                converted = converted_location(program.resolve(), tmp / "converted")
            # each side runs in its own copy of the current folder: what the programs write
            # (checkpoints, logs) never reaches the user's files, nor the other side
            here = Path.cwd()
            sides += [scratch_folder(here, tmp / "torch_run"),
                      scratch_folder(here, tmp / "jax_run")]
            torch_rec = torch_side(sides[0].place(program), steps, args or [],
                                   tmp / "torch.pkl", timeout, sides[0].root)
            jax_rec = jax_side(sides[1].place(converted), tmp / "torch.pkl", steps, args or [],
                               tmp / "jax.pkl", timeout, sides[1].root, side=JAX_SIDES[target])
        except ProgramError as exc:
            r.error = str(exc)
            return r
        except Exception as exc:  # noqa: BLE001 - the conversion itself
            r.error = f"converting {program}: {type(exc).__name__}: {exc}"
            return r
        finally:
            for side, s in zip(("torch", "converted"), sides):
                r.notes += [f"warning: the {side} program rewrote {name}, a file too large to "
                            "copy for the run (linked): the file in the folder changed"
                            for name in changed_links(s)]
    compare(r, torch_rec, jax_rec, rtol, print_skip)
    return r


def compare(r: ProgramResult, t: dict[str, Any], j: dict[str, Any], rtol: float,
            print_skip: list[str] | None = None) -> None:
    """Fill ``r`` from the two sides' records."""
    r.notes += t["notes"] + j["notes"]
    if t["error"] or not t["stopped"]:
        r.error = (f"the torch program took {t['steps']} optimizer steps of {r.steps}"
                   + (f":\n{t['error']}" if t["error"] else ""))
        return
    if j["error"] or not j["stopped"]:
        r.checks.append(Check("run", "converted program", False,
                              f"took {j['steps']} optimizer steps of {r.steps}"
                              + (f":\n{j['error']}" if j["error"] else "")))
    r.notes.append(f"inputs replayed: {j['replayed']} arrays over {len(t['forwards'])} "
                   "torch forward calls")
    if t.get("batches"):
        r.notes.append(f"batches replayed: {j['batch_arrays']} arrays over {j['batches']} "
                       f"batches the converted program drew ({len(t['batches'])} torch "
                       "DataLoader batches)")
    drawn = sum(1 for d in t.get("draws", []) if d)
    if drawn:
        r.notes.append(f"draws replayed: {j.get('draws', 0)} of the "
                       f"{sum(len(d) for d in t['draws'])} random arrays torch's model drew "
                       f"in {drawn} of its forward calls (torch.randn_like, ...: the JAX "
                       "model's jax.random draws of the same kind and shape take their values)")
    if t.get("program_draws"):
        r.notes.append(f"program draws replayed: {j.get('program_draws', 0)} of the "
                       f"{len(t['program_draws'])} random arrays torch's program drew outside "
                       "its model's forward and its modules' constructors (its data: the "
                       "JAX program's draws of the same kind, bounds and shape, in order, "
                       "take their values)")
    r.notes += [f"replay: {p}" for p in j["replay_problems"]]
    _compare_losses(r, t["losses"], j["losses"], t.get("loss_steps"))
    _compare_lrs(r, t["lrs"], j["lrs"])
    if t.get("trace") and j.get("trace"):
        _compare_tensors(r, t, j, rtol)
    _compare_seeds(r, t.get("seeds", []), j.get("seeds", []), _seeds_numpy(r.program),
                   j.get("seeded_sources", []))
    _compare_prints(r, t["stdout"], j["stdout"], rtol, print_skip or [],
                    stopped=t.get("forward_line") if j["stopped"] and not j["error"] else None)


def _close(got: float, ref: float, rtol: float, atol: float = 0.0) -> bool:
    return abs(got - ref) <= atol + rtol * abs(ref)


def _compare_losses(r: ProgramResult, t: list[float], j: list[float],
                    steps: list[int] | None = None) -> None:
    if len(t) != len(j):
        r.checks.append(Check("loss", "count", False, f"torch computed {len(t)} losses "
                              f"(backward), the converted program {len(j)} (value_and_grad)"))
    for i, (a, b) in enumerate(zip(t, j, strict=False)):
        rel = abs(b - a) / max(abs(a), 1e-30)
        r.checks.append(Check("loss", f"loss {i + 1}", _close(b, a, LOSS_RTOL, 1e-6),
                              f"torch {a:.7g}, JAX {b:.7g}", rel,
                              steps[i] if steps and i < len(steps) else None))


def _compare_lrs(r: ProgramResult, t: list[list[float]], j: list[list[float]]) -> None:
    if not any(j):
        r.notes.append("learning rate not compared: the converted optimizer state holds no "
                       "injected learning_rate (optax.inject_hyperparams)")
        return
    for step, (groups, rates) in enumerate(zip(t, j, strict=False), 1):
        if len(rates) not in (1, len(groups)):
            r.checks.append(Check("lr", f"step {step}", False, f"torch has {len(groups)} "
                                  f"parameter groups, the JAX state {len(rates)} rates"))
            continue
        pairs = zip(groups, rates if len(rates) == len(groups) else rates * len(groups),
                    strict=True)
        for g, (a, b) in enumerate(pairs):
            r.checks.append(Check("lr", f"step {step} group {g}", _close(b, a, LR_RTOL, 1e-12),
                                  f"torch {a:.7g}, JAX {b:.7g}",
                                  abs(b - a) / max(abs(a), 1e-30), step))


def _noise_masks(t: dict[str, Any]) -> dict[str, np.ndarray]:  # one step's record
    """Per torch parameter, the elements whose gradients were all zero up to float32 rounding
    (``sqrt(exp_avg_sq)`` below ``NOISE`` times the model's largest): Adam divides such a
    gradient by its own size, so rounding becomes a difference of the order of the learning
    rate there (a key bias in attention, whose gradient is zero: softmax ignores a constant
    shift). Optimizers without a second moment (SGD) have no such elements."""
    second = {n: np.sqrt(np.abs(s["exp_avg_sq"])) for n, s in t["opt_state"].items()
              if "exp_avg_sq" in s}
    scale = max((float(v.max()) for v in second.values() if v.size), default=0.0)
    return {n: v <= NOISE * scale for n, v in second.items()} if scale else {}


def _compare_tensors(r: ProgramResult, t: dict[str, Any], j: dict[str, Any],
                     rtol: float) -> None:
    """Each mapped parameter, its optimizer state and its decay after every step both sides
    took: one check per tensor (and slot), failing at the first step it differs."""
    from torch2jax.weights import apply_layout

    def pair(ref: np.ndarray, got: np.ndarray, m: dict[str, Any],
             noise: np.ndarray | None = None) -> float:
        """``max |got - ref| / max |ref|``, ``ref`` in the JAX layout, outside ``noise``."""
        def jax_layout(a: np.ndarray) -> np.ndarray:
            return apply_layout(np.asarray(a), m["layout"]).reshape(m["nnx_shape"] or got.shape)

        ref = jax_layout(ref)
        diff = np.abs(np.asarray(got, np.float64) - ref)
        if noise is not None:
            diff = np.where(jax_layout(noise), 0.0, diff)
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        worst = float(np.max(diff)) if ref.size else 0.0
        return worst / scale if scale else worst

    steps = list(enumerate(zip(t["trace"], j["trace"], strict=False), 1))
    masks = [_noise_masks(ts) for _, (ts, _) in steps]
    excluded: dict[str, int] = {}
    unknown: set[str] = set()

    def first_off(kind: str, name: str, values: list[tuple[int, float | None, str]]) -> None:
        """One check from per-step ``(step, rel, detail)`` (rel None: missing)."""
        for step, rel, detail in values:
            if rel is None or rel > rtol:
                r.checks.append(Check(kind, name, False, f"{detail} after step {step} of "
                                      f"{len(steps)}", rel, step))
                return
        worst = max((v[1] for v in values), default=0.0)
        r.checks.append(Check(kind, name, True, f"{values[-1][2] if values else ''}, worst "
                              f"{worst:.1e} over {len(values)} steps", worst))

    for m in j["mappings"]:
        name = m["torch"]
        if m["status"] != "mapped" or name not in t["params"]:
            continue
        if m["nnx"] not in j["params"]:
            r.checks.append(Check("param", name, False, f"no JAX parameter {m['nnx']}"))
            continue
        noise = masks[-1].get(name) if masks else None
        if noise is not None and noise.any():
            excluded[name] = int(noise.sum())
        first_off("param", name, [
            (k, rel := pair(ts["params"][name], js["params"][m["nnx"]], m,
                            masks[k - 1].get(name)), f"-> {m['nnx']}, rel {rel:.1e}")
            for k, (ts, js) in steps])
        unnamed = _unnamed_slot(t["opt_state"].get(name, {}), j["opt_state"].get(name, {}))
        for slot in t["opt_state"].get(name, {}):
            ours = next((o for o in SLOTS.get(slot, ()) if o in j["opt_state"].get(name, {})),
                        None) or unnamed.get(slot)
            if slot not in SLOTS and ours is None:
                unknown.add(slot)
                continue
            if ours is None:
                r.checks.append(Check("opt_state", f"{name} {slot}", False,
                                      f"no {' or '.join(SLOTS[slot])} for {m['nnx']} in the "
                                      "JAX optimizer state"))
                continue
            per_step = []
            for k, (ts, js) in steps:
                got = js["opt_state"].get(name, {}).get(ours)
                rel = None if got is None else pair(ts["opt_state"][name][slot], got, m)
                per_step.append((k, rel, f"-> {ours}, " + (f"rel {rel:.1e}" if rel is not None
                                                           else "missing")))
            first_off("opt_state", f"{name} {slot}", per_step)
        _compare_decay(r, name, [(k, ts["decay"].get(name), js["decay"].get(m["nnx"]))
                                 for k, (ts, js) in steps])
    if unknown:
        r.notes.append("optimizer state not compared (no known optax counterpart): "
                       + ", ".join(sorted(unknown)))
    if excluded:
        r.notes.append(
            f"{sum(excluded.values())} parameter elements of {len(excluded)} tensors had "
            f"gradients zero up to float32 rounding (sqrt(exp_avg_sq) <= {NOISE:g} of the "
            "model's largest): Adam scales their rounding up to the learning rate, so they are "
            "left out of the parameter comparison (their optimizer state is compared): "
            + ", ".join(f"{n} ({k})" for n, k in list(excluded.items())[:6]))


def _unnamed_slot(t_slots: dict[str, Any], j_slots: dict[str, Any]) -> dict[str, str]:
    """A hand-written optax transformation keeps its state as a bare tree, named by its place
    in the chain only (the converter's Adagrad): the one torch slot without a named
    counterpart is paired with the one such JAX slot, when there is exactly one of each."""
    named = {o for cands in SLOTS.values() for o in cands}
    unpaired = [s for s in t_slots if not any(o in j_slots for o in SLOTS.get(s, ()))]
    anonymous = [k for k in j_slots if k not in named]
    return ({unpaired[0]: anonymous[0]} if len(unpaired) == 1 and len(anonymous) == 1
            else {})


def _compare_decay(r: ProgramResult, name: str,
                   per_step: list[tuple[int, tuple | None, tuple | None]]) -> None:
    """The decay probes of every step: the first that differs fails."""
    last = None
    for step, t, j in per_step:
        if t is None or j is None:
            continue
        (t_moved, t_decay), (j_moved, j_decay) = t, j
        if t_moved != j_moved:
            r.checks.append(Check("decay", name, False, "weight decay touches it in "
                                  f"{'torch' if t_moved else 'JAX'} only", step=step))
            return
        if t_moved and j_decay is not None:
            rel = abs(j_decay - t_decay) / max(abs(t_decay), 1e-30)
            last = Check("decay", name, _close(j_decay, t_decay, DECAY_RTOL, 1e-9),
                         f"decay torch {t_decay:.6g}, JAX {j_decay:.6g}", rel, step)
            if not last.passed:
                r.checks.append(last)
                return
        else:
            last = Check("decay", name, True, "decayed on both sides" if t_moved
                         else "not decayed on either side", step=step)
    if last is not None:
        r.checks.append(last)


def _seeds_numpy(program: str) -> bool:
    """Whether the conversion of ``program`` seeds numpy's global generator at each
    ``torch.manual_seed``: a Dataset of the files it imports (the files ``convert_tree``
    converts) draws from torch's global generator, or a loader of a file that does not seed
    shuffles (repo.py's ``numpy_seeded``)."""
    from torch2jax.repo import import_closure, numpy_seeded, source_facts

    path = Path(program)
    if path.is_dir():
        files = sorted(path.rglob("*.py"))
    elif path.is_file():
        files = [f for f in import_closure([path]) if f.is_relative_to(path.parent.resolve())]
    else:
        return False
    return numpy_seeded(set().union(*(source_facts(f.read_text(errors="replace"))
                                      for f in files)))


def _compare_seeds(r: ProgramResult, t: list[tuple], j: list[tuple],
                   numpy_too: bool = False, sources: list[tuple] | tuple = ()) -> None:
    """The integer seeds the two programs' own code set, in order: torch's
    ``torch.manual_seed(s)`` is the converted program's ``jax.random.key(s)``, numpy's and
    Python's seeds stay theirs. ``numpy_too``: the program's Dataset draws from torch's
    global generator, which the converted one draws from numpy's global generator in its
    place, so ``torch.manual_seed(s)`` is ``np.random.seed(s)`` then ``jax.random.key(s)``
    (the two streams are not the same: the values drawn are not compared, the seeds are). A
    torch program that sets no seed draws from torch's default one: nothing to compare.
    ``sources``: the seeds the converted program gave grain's ``shuffle`` / ``random_map``
    (where a torch Generator given to a loader or ``random_split`` went): a
    ``torch.Generator().manual_seed(s)`` that no seeding call of the converted program
    matches in order is matched by a grain seed ``s``."""
    if not t:
        if j:
            r.notes.append("seeds not compared: the torch program sets none, the converted "
                           f"program {', '.join(f'{c}({v})' for c, v, _ in j)}")
        return
    if numpy_too:
        r.notes.append("each torch.manual_seed(s) is compared with np.random.seed(s) and "
                       "jax.random.key(s): the host-side draws from torch's global generator "
                       "come from numpy's global generator in the converted program")
        t = [e for a in t for e in ([(a[0], a[1], a[2], "np.random.seed"), a]
                                    if a[0] == "torch.manual_seed" else [a])]
    def same(a: tuple, b: tuple) -> bool:
        return a[1] == b[1] and (len(a) < 4 or b[0] == a[3])  # (numpy's: np.random.seed)

    pairs: list[tuple[tuple | None, tuple | None]] = []
    at, used = 0, 0  # (the grain seeds are matched in their order)
    for a in t:
        b = j[at] if at < len(j) else None
        found = next((k for k in range(used, len(sources)) if sources[k][1] == a[1]), None)
        if a[0] == "torch.Generator().manual_seed" and (b is None or not same(a, b)) and \
                found is not None:
            pairs.append((a, sources[found]))  # its seed is the grain pipeline's
            used = found + 1
            continue
        pairs.append((a, b))
        at += 1
    pairs += [(None, b) for b in j[at:]]
    for i, (a, b) in enumerate(pairs):
        ok = a is not None and b is not None and same(a, b)
        r.checks.append(Check(
            "seed", f"seed {i + 1}", ok,
            f"torch {f'{a[0]}({a[1]})' if a else 'none'}, JAX "
            f"{f'{b[0]}({b[1]})' if b else 'none'}, before step {(a or b)[2]}",
            step=(a or b)[2]))


def _compare_prints(r: ProgramResult, t_out: str, j_out: str, rtol: float,
                    skip: list[str], stopped: int | None = None) -> None:
    """Printed lines compared in order. ``stopped``: where both programs were stopped at the
    step limit, the number of lines torch printed before the model's last call."""
    patterns = [re.compile(p) for p in skip]

    def kept(out: str) -> list[str]:
        return [line for line in out.splitlines() if not any(p.search(line) for p in patterns)]

    t_lines, j_lines = kept(t_out), kept(j_out)
    if skip:
        r.notes.append(f"printed lines left out (--print-skip): "
                       f"{len(t_out.splitlines()) - len(t_lines)} of torch's, "
                       f"{len(j_out.splitlines()) - len(j_lines)} of the converted program's")
    if stopped is not None and len(t_lines) > len(j_lines) and len(kept(
            "\n".join(t_out.splitlines()[:stopped]))) <= len(j_lines):
        # both stopped at the step limit, and the lines torch printed beyond the converted
        # program's all come after the model's last call: values of the last step printed
        # before its step (in optimizer.step(closure)'s closure, print(loss) before backward),
        # which the converted program prints after its compiled step returns, where it was
        # stopped
        r.notes.append(f"{len(t_lines) - len(j_lines)} line(s) torch printed after the last line "
                       "both programs printed, in the step where both were stopped, are not "
                       "compared (the converted program prints a step's values after its "
                       f"compiled step): {t_lines[len(j_lines):]!r}")
        t_lines = t_lines[:len(j_lines)]
    for i in range(max(len(t_lines), len(j_lines))):
        a = t_lines[i] if i < len(t_lines) else None
        b = j_lines[i] if i < len(j_lines) else None
        ok = a is not None and b is not None and _same_line(a, b, rtol)
        r.checks.append(Check("print", f"line {i + 1}", ok, f"torch {a!r}, JAX {b!r}"))


_TORCH_SIZE = re.compile(r"torch\.Size\(\[([^\]]*)\]\)")


def _shape_text(line: str) -> str:
    """A printed ``torch.Size([16, 1])`` as the tuple a JAX shape prints, ``(16, 1)``
    (``(16,)`` for one dimension)."""
    def tuple_text(match: re.Match[str]) -> str:
        dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"

    return _TORCH_SIZE.sub(tuple_text, line)


def _same_line(a: str, b: str, rtol: float) -> bool:
    """The same text with the same numbers, each within ``rtol`` or one unit of its last
    printed decimal (integers exactly); torch's printed shapes read as JAX's."""
    a = _shape_text(a)
    if _NUMBER.sub("#", a).split() != _NUMBER.sub("#", b).split():
        return False
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b), strict=True):
        decimals = len(x.split(".")[1].split("e")[0].split("E")[0]) if "." in x else 0
        if "." not in x and "e" not in x.lower():
            if x != y:
                return False
        elif not _close(float(y), float(x), rtol, 1.01 * 10.0 ** -decimals if decimals else 0):
            return False
    return True


def print_program_result(r: ProgramResult, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"torch2jax verify --program: {r.program} ({r.target}, "
                        f"{r.steps} steps)")
    for col in ("compared", "checks", "failed", "worst rel"):  # the kind, then its figures
        table.add_column(col)
    for kind in KINDS:
        checks = [c for c in r.checks if c.kind == kind]
        if not checks:
            continue
        figures = [c.figure for c in checks if c.figure is not None]
        table.add_row(kind, str(len(checks)), str(sum(not c.passed for c in checks)),
                      f"{max(figures):.1e}" if figures else "")
    console.print(table)
    for kind in KINDS:
        failed = r.failures(kind)
        for c in failed[:8]:
            at = f" (step {c.step})" if c.step and f"step {c.step}" not in c.name + c.detail \
                else ""
            console.print(escape(f"FAIL {kind} {c.name}{at}: {c.detail}"), soft_wrap=True)
        if len(failed) > 8:
            console.print(f"... {len(failed) - 8} more {kind} mismatches")
    for note in r.notes:
        console.print(escape(f"note: {note}"), soft_wrap=True)
    if r.error:
        console.print(escape(f"error: {r.error}"), soft_wrap=True)
    console.print("PASS" if r.passed else "FAIL" if not r.error else "ERROR")
