"""``verify --program``: the torch program and its converted program, run side by side.

The program is the nanoGPT-shaped fixture (two AdamW parameter groups, decay for tensors of
rank 2 or more, a LambdaLR warmup-cosine schedule, gradient clipping, prints). Its torch side
runs once (two optimizer steps); the converted program then runs from the torch side's start,
as converted and with a bug seeded into the converted text: the weight-decay mask off, the
weight decay halved, the schedule one step ahead, a print dropped. The right conversion passes
every comparison; each seeded bug is reported as a mismatch naming what differs.

The nanoGPT-shaped corpus program and the minGPT-shaped library (``tests/corpus``) run the
same way, with the mutations of issue 29 seeded into their converted text: weight decay off,
the schedule one step ahead, clipping after the update, the accumulation not divided, the
wrong seed. Each failure names the step where it first shows and the tensor (or rate, or
seed call).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")
pytest.importorskip("optax")

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.verify.program import ProgramResult, compare, jax_side, torch_side
from torch2jax.verify.run import convert_tree

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "fixtures" / "training" / "gpt_param_groups.py"
CORPUS_GPT = ROOT / "tests" / "corpus" / "gpt" / "train.py"
STEPS = 2
# the tensors of rank >= 2: torch's decay group (wte and lm_head are one tied tensor)
DECAYED = {"wte.weight", "wpe.weight"} | {
    f"h.{i}.{name}.weight" for i in range(2)
    for name in ("attn.c_attn", "attn.c_proj", "mlp.0", "mlp.2")}


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("program")
    convert_tree(PROGRAM, tmp / "converted", "nnx", None)
    converted = (tmp / "converted" / PROGRAM.name).read_text()
    torch_rec = torch_side(PROGRAM, STEPS, [], tmp / "torch.pkl")
    return tmp, converted, torch_rec


def run(sides: tuple[Path, str, dict], name: str, *edits: tuple[str, str]) -> ProgramResult:
    """The converted program with ``edits`` (old, new: each old text once) run from the torch
    side's start, compared with the torch side."""
    tmp, converted, torch_rec = sides
    for old, new in edits:
        assert converted.count(old) == 1, old
        converted = converted.replace(old, new)
    path = tmp / f"{name}.py"
    path.write_text(converted)
    jax_rec = jax_side(path, tmp / "torch.pkl", STEPS, [], tmp / f"{name}.pkl")
    r = ProgramResult(str(PROGRAM), str(path), "nnx", STEPS)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


def kinds(r: ProgramResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in r.checks:
        out[c.kind] = out.get(c.kind, 0) + 1
    return out


def test_the_conversion_computes_what_the_program_computes(sides):
    r = run(sides, "as_converted")
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    # every kind was compared: 2 losses, 2 steps x 2 groups of lr, 28 parameters (the tied
    # lm_head is wte), their Adam moments, the decay probe, the two printed lines
    assert kinds(r) == {"loss": STEPS, "lr": 2 * STEPS, "param": 28, "opt_state": 56,
                        "decay": 28, "seed": 1, "print": 2}
    decayed = {c.name for c in r.checks if c.kind == "decay" and c.detail.startswith("decay")}
    assert decayed == DECAYED
    assert "inputs replayed: 4 arrays over 2 torch forward calls" in r.notes


def test_decay_off_schedule_ahead_and_a_dropped_print_are_each_named(sides):
    """Three bugs seeded at once, each seen by its own comparison (one JAX run, for CI
    time): the decay mask matches no tensor, the schedule is one step ahead after the first
    step, the loss print is gone."""
    r = run(sides, "three_bugs", ("lambda p: p.ndim >= 2", "lambda p: p.ndim >= 3"),
            ("scheduler(scheduler_steps))", "scheduler(scheduler_steps + 1))"),
            ('print(f"step {step} loss {loss.item():.4f}")', "pass"))
    assert not r.passed
    assert {c.name for c in r.failures("decay")} == DECAYED
    assert all("in torch only" in c.detail for c in r.failures("decay"))
    # step 1 runs at the initial rate (set before the loop), step 2 at the schedule's
    assert [c.name for c in r.failures("lr")] == ["step 2 group 0", "step 2 group 1"]
    assert [c.name for c in r.failures("print")] == ["line 2"]
    # the losses come before each update: the second step's rate shows in the parameters only
    assert not r.failures("loss") and r.failures("param")


def test_a_different_weight_decay_is_caught(sides):
    r = run(sides, "wd_half", ("weight_decay=weight_decay,", "weight_decay=weight_decay * 0.5,"))
    assert {c.name for c in r.failures("decay")} == DECAYED
    assert "decay torch 0.1, JAX 0.05" in r.failures("decay")[0].detail
    # a decay of lr * wd * p (1e-5 p per step here) is invisible in two steps' losses and
    # parameters: the probe is what sees it
    assert not r.failures("lr") and not r.failures("print")
    assert not r.failures("loss") and not r.failures("param")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """The nanoGPT-shaped corpus program (evaluation before training, two micro-batches of
    gradient accumulation, AdamW parameter groups through ``configure_optimizers``, the lr set
    in the loop, tied weights), its torch side run for three steps in a folder of its own."""
    tmp = tmp_path_factory.mktemp("corpus")
    convert_tree(CORPUS_GPT, tmp / "converted", "nnx", None)
    torch_rec = torch_side(CORPUS_GPT, 3, [], tmp / "torch.pkl", cwd=tmp)
    return tmp, tmp / "converted", torch_rec


def run_corpus(corpus: tuple[Path, Path, dict], name: str,
               *edits: tuple[str, str, str]) -> ProgramResult:
    """The converted corpus program with ``edits`` (file, old, new) as a copy of its folder."""
    tmp, converted, torch_rec = corpus
    folder = tmp / name
    shutil.copytree(converted, folder)
    for file, old, new in edits:
        text = (folder / file).read_text()
        assert text.count(old) == 1, old
        (folder / file).write_text(text.replace(old, new))
    jax_rec = jax_side(folder / "train.py", tmp / "torch.pkl", 3, [], tmp / f"{name}.pkl",
                       cwd=tmp)
    r = ProgramResult(str(CORPUS_GPT), str(folder), "nnx", 3)
    compare(r, torch_rec, jax_rec, 1e-3, [r"time .*ms"])
    return r


def test_the_corpus_gpt_program_agrees(corpus):
    r = run_corpus(corpus, "as_converted")
    assert r.error is None and r.passed, [(c.name, c.detail) for c in r.failures()]
    # 3 steps x 2 micro-batches; 2 groups; 28 parameters; the evaluation before training
    assert kinds(r) == {"loss": 6, "lr": 6, "param": 28, "opt_state": 56, "decay": 28,
                        "seed": 2, "print": 7}
    # torch.manual_seed(1337) -> jax.random.key(1337); numpy's generator stays numpy's
    assert [c.detail for c in r.checks if c.kind == "seed"] == [
        "torch torch.manual_seed(1337), JAX jax.random.key(1337), before step 1",
        "torch np.random.default_rng(1337), JAX np.random.default_rng(1337), before step 1"]
    assert "inputs replayed: 28 arrays over 14 torch forward calls" in r.notes


def test_the_corpus_gpt_mask_as_a_schedule_and_an_undivided_accumulation(corpus):
    """The bug of issue 29 (``inject_hyperparams`` calls a callable mask on the step count
    unless it is static: no tensor decays) and the accumulated loss not divided by the number
    of micro-batches, seeded together: each is named by its own comparison."""
    r = run_corpus(corpus, "two_bugs",
                   ("model.py", 'optax.inject_hyperparams(optax.adamw, static_args=("mask",))',
                    "optax.inject_hyperparams(optax.adamw)"),
                   ("train.py", "loss = loss / gradient_accumulation_steps", "loss = loss"))
    torch_params = corpus[2]["params"]
    assert {c.name for c in r.failures("decay")} == {
        n for n, p in torch_params.items() if p.ndim >= 2}
    assert all("in torch only" in c.detail for c in r.failures("decay"))
    # every loss is twice torch's; the moments follow the doubled gradients
    assert [c.name for c in r.failures("loss")] == [f"loss {i}" for i in range(1, 7)]
    assert [c.step for c in r.failures("loss")] == [1, 1, 2, 2, 3, 3]
    assert all(c.name.endswith(("exp_avg", "exp_avg_sq")) for c in r.failures("opt_state"))
    assert r.failures("opt_state") and {c.step for c in r.failures("opt_state")} == {1}
    assert {c.step for c in r.failures("decay")} == {1}


# --- seeded mutations of the converted corpus program: each named by its step and tensor ------
CLIP = ("    if grad_clip != 0.0:\n"
        "        grads, _ = optax.clip_by_global_norm(grad_clip).update(grads, optax.EmptyState())\n")
UPDATE = "    apply_grads(model, optimizer, grads)\n"


def test_the_corpus_gpt_decay_off_and_the_wrong_seed(corpus):
    """``weight_decay=0.0`` in the converted ``configure_optimizers`` and the program's key
    made from another seed, seeded together (one JAX run): the decay probe names every tensor
    torch decays at step 1, the seed check the first seed call; nothing else differs (the
    weights and batches are torch's)."""
    r = run_corpus(corpus, "decay_off_seed",
                   ("model.py", "weight_decay=weight_decay,", "weight_decay=0.0,"),
                   ("train.py", "jax.random.key(seed + seed_offset)",
                    "jax.random.key(seed + seed_offset + 1)"))
    torch_params = corpus[2]["params"]
    assert {c.name for c in r.failures("decay")} == {
        n for n, p in torch_params.items() if p.ndim >= 2}
    assert {(c.step, c.detail) for c in r.failures("decay")} == {
        (1, "weight decay touches it in torch only")}
    [seed] = r.failures("seed")
    assert (seed.name, seed.step) == ("seed 1", 1)
    assert seed.detail == ("torch torch.manual_seed(1337), JAX jax.random.key(1338), "
                           "before step 1")
    # the missing decay shows in no rate nor the first step's losses
    assert not r.failures("lr") and not [c for c in r.failures("loss") if c.step == 1]


def test_the_corpus_gpt_schedule_one_step_ahead(corpus):
    r = run_corpus(corpus, "schedule_ahead",
                   ("train.py", "lr = get_lr(iter_num) if", "lr = get_lr(iter_num + 1) if"))
    # every step's rate is the next one's, in both groups; the parameters show it from step 1
    assert [(c.name, c.step) for c in r.failures("lr")] == [
        (f"step {s} group {g}", s) for s in (1, 2, 3) for g in (0, 1)]
    assert r.failures("param") and {c.step for c in r.failures("param")} == {1}
    # the first step's losses come before any update
    assert not [c for c in r.failures("loss") if c.step == 1]


def test_the_corpus_gpt_clipping_after_the_update(corpus):
    """The clipping moved after ``apply_grads``: the moments take the unclipped gradients.
    Torch's clipping first engages at step 3 here (the gradients' global norm passes
    ``grad_clip=1.0`` there): every tensor's ``exp_avg`` is named from that step, nothing
    before it differs."""
    r = run_corpus(corpus, "clip_after", ("train.py", CLIP + UPDATE, UPDATE + CLIP))
    failed = r.failures("opt_state")
    assert {c.name for c in failed if c.name.endswith(" exp_avg")} == {
        f"{n} exp_avg" for n in corpus[2]["opt_state"]}
    assert {c.step for c in failed} == {3}
    assert "after step 3 of 3" in failed[0].detail
    assert not r.failures("lr") and not r.failures("seed") and not r.failures("loss")


def test_cli_program_mode(tmp_path):
    result = CliRunner().invoke(app, ["verify", "--program", str(PROGRAM), "--steps", "1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["passed"] and data["steps"] == 1
    assert {c["kind"] for c in data["checks"]} == {"loss", "lr", "param", "opt_state", "decay",
                                                    "seed", "print"}


@pytest.mark.parametrize("extra", [["fixtures/models/mlp.py::MLP"], ["--target", "linen"]])
def test_cli_program_usage_errors(extra):
    """--program goes without a model to verify; a target without a program side is refused
    before anything runs (exit 2)."""
    result = CliRunner().invoke(app, ["verify", "--program", str(PROGRAM), *extra])
    assert result.exit_code == 2, result.output


# --- the minGPT-shaped library: its trainer in the package, a grain loader, set_seed ----------
LIBRARY = ROOT / "tests" / "corpus" / "library" / "train_script.py"
LIB_CLIP = ("            grads, _ = optax.clip_by_global_norm(config.grad_norm_clip)"
            ".update(grads, optax.EmptyState())\n")
LIB_UPDATE = "            optimizer.update(model, grads)\n"


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp("library")
    convert_tree(LIBRARY, tmp / "converted", "nnx", None)
    torch_rec = torch_side(LIBRARY, 3, [], tmp / "torch.pkl", cwd=tmp)
    return tmp, tmp / "converted", torch_rec


def run_library(library: tuple[Path, Path, dict], name: str,
                *edits: tuple[str, str, str]) -> ProgramResult:
    tmp, converted, torch_rec = library
    folder = tmp / name
    shutil.copytree(converted, folder)
    for file, old, new in edits:
        text = (folder / file).read_text()
        assert text.count(old) == 1, old
        (folder / file).write_text(text.replace(old, new))
    jax_rec = jax_side(folder / LIBRARY.name, tmp / "torch.pkl", 3, [], tmp / f"{name}.pkl",
                       cwd=tmp)
    r = ProgramResult(str(LIBRARY), str(folder), "nnx", 3)
    compare(r, torch_rec, jax_rec, 1e-3)
    return r


@pytest.mark.slow


def test_the_corpus_library_agrees(library):
    r = run_library(library, "as_converted")
    assert r.error is None, r.error
    # the seeds too: set_seed's torch.manual_seed(3407) (another file) is np.random.seed(3407)
    # and jax.random.key(3407) in the converted program (issue 29 item 3)
    assert not r.failures(), [(c.name, c.detail) for c in r.failures()]
    assert [c.detail for c in r.checks if c.kind == "seed"] == [
        "torch random.seed(3407), JAX random.seed(3407), before step 1",
        "torch torch.manual_seed(3407), JAX np.random.seed(3407), before step 1",
        "torch torch.manual_seed(3407), JAX jax.random.key(3407), before step 1"]
    assert any(n.startswith("batches replayed: 6 arrays over 3 batches") for n in r.notes)


@pytest.mark.slow
def test_the_corpus_library_decay_off_and_the_wrong_seed(library):
    """Two bugs seeded into the package (one JAX run): no weight decay in
    ``configure_optimizers`` and ``set_seed`` keyed with another seed. Each is named: the decay
    of every tensor torch decays, at step 1, and the seed call before step 1."""
    r = run_library(library, "decay_seed",
                    ("tinygpt/model.py", "weight_decay=train_config.weight_decay,",
                     "weight_decay=0.0,"),
                    ("tinygpt/utils.py", "jax.random.key(seed)", "jax.random.key(seed + 1)"))
    decayed = {n for n, (moved, _) in library[2]["decay"].items() if moved}
    assert decayed and {c.name for c in r.failures("decay")} == decayed
    assert {(c.step, c.detail) for c in r.failures("decay")} == {
        (1, "weight decay touches it in torch only")}
    assert [(c.name, c.detail) for c in r.failures("seed")] == [
        ("seed 3", "torch torch.manual_seed(3407), JAX jax.random.key(3408), before step 1")]
    assert not r.failures("lr") and not [c for c in r.failures("loss") if c.step == 1]


@pytest.mark.slow
def test_the_corpus_library_clipping_after_the_update(library):
    """The trainer's step clips after ``optimizer.update``: the moments are named from the
    first step whose gradient torch clips; rates and seeds agree."""
    r = run_library(library, "clip_after",
                    ("tinygpt/trainer.py", LIB_CLIP + LIB_UPDATE, LIB_UPDATE + LIB_CLIP))
    failed = r.failures("opt_state")
    assert failed and all(c.step is not None and f"after step {c.step} of 3" in c.detail
                          for c in failed)
    first = min(c.step for c in failed)
    assert any(c.name.endswith(" exp_avg") and c.step == first for c in failed)
    # nothing differs before that step: the losses computed before its update agree
    assert not [c for c in r.failures("loss") if c.step <= first]
    assert not r.failures("lr") and not r.failures("decay")
    assert not r.failures("seed")
