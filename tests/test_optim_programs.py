"""Parameter groups as converted programs run them (issue 29): nanoGPT's configure_optimizers
(AdamW, tensors of rank >= 2 decay, the others do not) converted per target, its optimizer
built by the converted code and stepped once with ZERO gradients. With zero gradients AdamW's
moments give a zero step, so exactly the decayed tensors move, by ``-lr * wd * p``: the JAX
side must decay the same tensors as torch's AdamW on the same groups, by the same amount.

The learning rate of these optimizers is an ``optax.inject_hyperparams`` hyperparameter (a
scheduler or the loop sets it), which calls every callable argument with the step count: a
``mask=lambda params: ...`` given to it as a hyperparameter decayed nothing (the bug)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

from torch2jax.convert import convert_source

ROOT = Path(__file__).resolve().parent
PROGRAM = ROOT / "data" / "optim" / "gpt_groups_lr.py"
CORPUS_MODEL = ROOT / "corpus" / "gpt" / "model.py"
WD, LR, BETAS = 0.1, 1e-2, (0.9, 0.95)


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _convert(source: Path, target: str, tmp: Path, name: str):
    result = convert_source(source.read_text(), path=str(source), target=target)
    assert "TODO(torch2jax)" not in result.code.split("def configure_optimizers", 1)[1].split(
        "\n    def ", 1)[0], result.code
    out = tmp / f"{name}.py"
    out.write_text(result.code)
    return _load(out, name), result


def _torch_moves(model, *args) -> list[tuple[int, bool]]:
    """(numel, decayed) per tensor after one AdamW step with zero gradients; asserts the decay
    is ``-lr * wd * p`` exactly."""
    opt = model.configure_optimizers(WD, LR, BETAS, *args)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    out = []
    for p, b in zip(params, before):
        moved = not torch.equal(p.detach(), b)
        if moved:
            torch.testing.assert_close(p.detach() - b, -LR * WD * b, rtol=1e-4, atol=1e-9)
        out.append((b.numel(), moved))
    return sorted(out)


def _jax_moves(before, after, lr: float = LR) -> list[tuple[int, bool]]:
    out = []
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        b, a = jnp.asarray(b), jnp.asarray(a)
        moved = not bool(jnp.array_equal(a, b))
        if moved:
            assert jnp.allclose(a - b, -lr * WD * b, rtol=1e-4, atol=1e-9), (a - b, b)
        out.append((int(b.size), moved))
    return sorted(out)


def _step_pytree(tx, params, lr: float | None = None):
    state = tx.init(params)
    if lr is not None:  # the loop sets the learning rate: an injected hyperparameter
        state.hyperparams["learning_rate"] = jnp.float32(lr)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zeros, state, params)
    return optax.apply_updates(params, updates)


@pytest.fixture(scope="module")
def torch_program():
    module = _load(PROGRAM, "optim_program_torch")
    torch.manual_seed(0)
    model = module.TinyGPT(module.VOCAB, module.BLOCK, module.EMBD, 0.0)
    return _torch_moves(model)


@pytest.mark.parametrize("target", ["nnx", "linen", "equinox"])
@pytest.mark.parametrize("lr", [None, 0.5])
def test_param_groups_decay_what_torch_decays(target, lr, torch_program, tmp_path) -> None:
    mod, _ = _convert(PROGRAM, target, tmp_path, f"optim_program_{target}")
    x = jnp.zeros((2, mod.BLOCK), jnp.int32)
    if target == "nnx":
        from flax import nnx

        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0, rngs=nnx.Rngs(0))
        opt = model.configure_optimizers(WD, LR, BETAS)
        if lr is not None:
            opt.opt_state.hyperparams["learning_rate"].value = jnp.float32(lr)
        before = jax.tree.map(jnp.array, nnx.state(model, nnx.Param))
        opt.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
        after = nnx.state(model, nnx.Param)
    elif target == "linen":
        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0)
        before = model.init(jax.random.key(0), x)["params"]
        after = _step_pytree(model.configure_optimizers(WD, LR, BETAS), before, lr)
    else:
        import equinox as eqx

        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0, key=jax.random.key(0))
        before = eqx.filter(model, eqx.is_array)
        after = _step_pytree(model.configure_optimizers(WD, LR, BETAS), before, lr)
    got = _jax_moves(before, after, LR if lr is None else lr)
    assert got == torch_program
    assert sum(moved for _, moved in got) == 4  # wte, wpe, fc and head weights


def test_corpus_gpt_configure_optimizers_decays_rank2_tensors(tmp_path) -> None:
    """tests/corpus/gpt/model.py (nanoGPT's shape; train.py sets param_group['lr'] by hand)
    under the default target: 10 of 28 tensors of a 2-layer GPT decay, as in torch."""
    from flax import nnx

    cfg = {"block_size": 8, "vocab_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8,
           "dropout": 0.0, "bias": True}
    sys.path.insert(0, str(CORPUS_MODEL.parent))
    try:
        tmod = _load(CORPUS_MODEL, "optim_corpus_torch")
    finally:
        sys.path.remove(str(CORPUS_MODEL.parent))
    torch.manual_seed(0)
    want = _torch_moves(tmod.GPT(tmod.GPTConfig(**cfg)), "cpu")
    mod, _ = _convert(CORPUS_MODEL, "nnx", tmp_path, "optim_corpus_nnx")
    model = mod.GPT(mod.GPTConfig(**cfg), rngs=nnx.Rngs(0))
    opt = model.configure_optimizers(WD, LR, BETAS, "cpu")
    before = jax.tree.map(jnp.array, nnx.state(model, nnx.Param))
    opt.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    got = _jax_moves(before, nnx.state(model, nnx.Param))
    assert got == want
    assert sum(moved for _, moved in got) == 10


@pytest.mark.parametrize("target", ["nnx", "equinox", "linen"])
def test_group_size_prints_are_kept(target, tmp_path, capsys) -> None:
    """configure_optimizers' two prints of the group sizes: printed by the converted method
    as torch prints them (nnx, equinox: the lists come from the model's parameters), and on
    linen, whose module holds no parameters, removed with a warning (not an info note)."""
    tmod = _load(PROGRAM, "optim_prints_torch")
    torch.manual_seed(0)
    tmod.TinyGPT(tmod.VOCAB, tmod.BLOCK, tmod.EMBD, 0.0).configure_optimizers(WD, LR, BETAS)
    want = capsys.readouterr().out
    assert want.count("num decayed parameter tensors: 4, with 288 parameters") == 1
    mod, result = _convert(PROGRAM, target, tmp_path, f"optim_prints_{target}")
    if target == "nnx":
        from flax import nnx

        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0, rngs=nnx.Rngs(0))
    elif target == "equinox":
        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0, key=jax.random.key(0))
    else:
        model = mod.TinyGPT(mod.VOCAB, mod.BLOCK, mod.EMBD, 0.0)
    model.configure_optimizers(WD, LR, BETAS)
    got = capsys.readouterr().out
    assert not [d for d in result.diagnostics if d.severity == "error"]
    if target == "linen":
        assert got == ""
        assert any(d.severity == "warning" and d.rule == "param-groups"
                   and "print of the parameter groups' sizes is removed" in d.message
                   for d in result.diagnostics)
    else:
        assert got == want


def test_corpus_gpt_group_size_prints(tmp_path, capsys) -> None:
    """The corpus GPT (nnx): the same two lines as torch, weight tying included."""
    from flax import nnx

    cfg = {"block_size": 8, "vocab_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 8,
           "dropout": 0.0, "bias": True}
    sys.path.insert(0, str(CORPUS_MODEL.parent))
    try:
        tmod = _load(CORPUS_MODEL, "optim_corpus_prints_torch")
    finally:
        sys.path.remove(str(CORPUS_MODEL.parent))
    tmod.GPT(tmod.GPTConfig(**cfg)).configure_optimizers(WD, LR, BETAS, "cpu")
    want = capsys.readouterr().out
    mod, _ = _convert(CORPUS_MODEL, "nnx", tmp_path, "optim_corpus_prints_nnx")
    capsys.readouterr()
    mod.GPT(mod.GPTConfig(**cfg), rngs=nnx.Rngs(0)).configure_optimizers(WD, LR, BETAS, "cpu")
    got = capsys.readouterr().out
    assert "num decayed parameter tensors: 10" in want
    assert got == want
