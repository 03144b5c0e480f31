"""The torch.optim / lr_scheduler -> optax translation library (torch2jax.training.optim):
the emitted text (torch's defaults written out), what is refused, and that every emitted
expression evaluates to an optax object. The numbers are in tests/test_trajectory.py (the
transforms built here) and tests/test_optim_programs.py (the converted programs as emitted:
injected learning rates, masks, clipping, accumulation, schedules)."""

from __future__ import annotations

import ast

import libcst as cst
import pytest

from torch2jax.passes.common import Untranslatable, code
from torch2jax.training import (
    translate_optimizer,
    translate_scheduler,
    with_clipping,
)

optax = pytest.importorskip("optax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

NS = {"optax": optax, "jax": jax, "jnp": jnp}


def _opt(src: str):
    call = cst.parse_expression(src)
    name = code(call.func)
    if not name.startswith("torch."):
        name = "torch.optim." + name.rsplit(".", 1)[-1]
    return translate_optimizer(call, name)


def _tx(src: str, **build) -> str:
    return code(_opt(src).build(**build))


def _sched(src: str, base: str = "0.1", resolve=lambda e: None):
    call = cst.parse_expression(src)
    return translate_scheduler(call, code(call.func), cst.parse_expression(base), resolve)


def _same(got: str, want: str) -> None:
    assert ast.unparse(ast.parse(got)) == ast.unparse(ast.parse(want)), got


# --------------------------------------------------------------------------------------------
# optimizers: text
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("torch_src", "want"), [
    ("torch.optim.SGD(model.parameters(), lr=0.1)",
     "optax.sgd(0.1, momentum=None, nesterov=False)"),
    ("torch.optim.SGD(model.parameters())",  # torch 2.13's default lr written out
     "optax.sgd(0.001, momentum=None, nesterov=False)"),
    ("torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)",
     ("optax.chain(optax.add_decayed_weights(5e-4), "
     "optax.sgd(0.05, momentum=0.9, nesterov=True))")),
    ("torch.optim.SGD(p, 0.1, 0.9, 0.5)",  # positional momentum, dampening
     ("optax.chain(optax.scale_by_schedule(lambda count: jnp.where(count == 0, 1.0, 0.5)), "
     "optax.sgd(0.1, momentum=0.9, nesterov=False))")),
    ("torch.optim.SGD(p, lr=0.1, maximize=True)",
     "optax.chain(optax.scale(-1.0), optax.sgd(0.1, momentum=None, nesterov=False))"),
    ("torch.optim.Adam(p)", "optax.adam(0.001, b1=0.9, b2=0.999, eps=1e-08)"),
    ("torch.optim.Adam(p, lr=1e-3, betas=(0.8, 0.99), weight_decay=1e-4)",
     ("optax.chain(optax.add_decayed_weights(1e-4), optax.adam(1e-3, b1=0.8, b2=0.99, "
     "eps=1e-08))")),
    ("torch.optim.Adam(p, weight_decay=0.1, decoupled_weight_decay=True)",
     "optax.adamw(0.001, b1=0.9, b2=0.999, eps=1e-08, weight_decay=0.1)"),
    ("torch.optim.AdamW(p, lr=3e-4)",  # torch's weight_decay=0.01, not optax's 1e-4
     "optax.adamw(3e-4, b1=0.9, b2=0.999, eps=1e-08, weight_decay=0.01)"),
    ("optim.AdamW(p, lr=3e-4, betas=betas)",  # a name: indexed
     "optax.adamw(3e-4, b1=betas[0], b2=betas[1], eps=1e-08, weight_decay=0.01)"),
    ("torch.optim.RMSprop(p)",
     "optax.rmsprop(0.01, decay=0.99, eps=1e-08, eps_in_sqrt=False, centered=False)"),
    ("torch.optim.RMSprop(p, momentum=0.9, centered=True)",
     ("optax.chain(optax.scale_by_stddev(decay=0.99, eps=1e-08, eps_in_sqrt=False), "
     "optax.trace(decay=0.9), optax.scale_by_learning_rate(0.01))")),
    ("torch.optim.Adamax(p)", "optax.adamax(0.002, b1=0.9, b2=0.999, eps=1e-08)"),
    ("torch.optim.Adadelta(p, weight_decay=0.1)",
     "optax.adadelta(1.0, rho=0.9, eps=1e-06, weight_decay=0.1)"),
])
def test_optimizer_text(torch_src: str, want: str) -> None:
    _same(_tx(torch_src), want)


def test_amsgrad_is_torchs_formula_not_optax_amsgrad() -> None:
    text = _tx("torch.optim.Adam(p, amsgrad=True)")
    assert "optax.amsgrad" not in text
    assert "bias_correction_nu=False" in text
    assert "optax.scale_by_schedule(lambda count: jnp.sqrt(1 - 0.999 ** (count + 1)))" in text


def test_adagrad_writes_torch_accumulator_and_eps() -> None:
    text = _tx("torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01)")
    assert "optax.adagrad" not in text  # eps inside the sqrt, accumulator 0.1
    assert "jnp.full_like(p, 0)" in text and "jnp.sqrt(s + g * g) + 1e-10" in text
    assert "lambda count: 1 / (1 + count * 0.01)" in text


def test_build_lr_overrides_mask_inject() -> None:
    tx = _opt("torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)")
    assert code(tx.lr) == "3e-4"
    _same(code(tx.build(lr=cst.Name("schedule"), mask=cst.Name("decay_mask"))),
          "optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-08, weight_decay=0.1, "
          "mask=decay_mask)")
    overrides = {"weight_decay": cst.parse_expression("0.0"),
                 "betas": cst.parse_expression("(0.9, 0.95)")}
    _same(code(tx.build(overrides=overrides)),
          "optax.adamw(3e-4, b1=0.9, b2=0.95, eps=1e-08, weight_decay=0.0)")
    _same(code(tx.build(inject=True)),
          "optax.inject_hyperparams(optax.adamw)(learning_rate=3e-4, b1=0.9, b2=0.999, "
          "eps=1e-08, weight_decay=0.1)")
    sgd = _opt("torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)")
    _same(code(sgd.build(inject=True, mask=cst.Name("m"))),
          "optax.inject_hyperparams(lambda learning_rate: optax.chain("
          "optax.add_decayed_weights(1e-4, mask=m), optax.sgd(learning_rate, momentum=0.9, "
          "nesterov=False)))(learning_rate=0.1)")
    with pytest.raises(Untranslatable, match="not an option"):
        sgd.build(overrides={"betas": cst.parse_expression("(0.9, 0.99)")})


def test_param_groups_are_kept() -> None:
    tx = _opt("torch.optim.AdamW([{'params': decay, 'weight_decay': 0.1}, "
              "{'params': no_decay, 'weight_decay': 0.0}], lr=1e-3)")
    assert tx.groups is not None and len(tx.groups) == 2
    assert code(tx.groups[1]["weight_decay"]) == "0.0"
    assert any("parameter groups" in msg for _, msg in tx.notes)


@pytest.mark.parametrize(("torch_src", "why"), [
    ("torch.optim.NAdam(p)", "momentum-decay"),
    ("torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=flag)", "literal True/False"),
    ("torch.optim.SGD(p, lr=0.1, nesterov=True)", "Nesterov momentum requires"),
    ("torch.optim.SGD(p, lr=0.1, momentum=m, dampening=0.1)", "non-literal momentum"),
    ("torch.optim.Adam(p, amsgrad=use_amsgrad)", "literal True/False"),
    ("torch.optim.Adam(p, bogus=1)", "unknown argument"),
    ("torch.optim.Adam(*args)", "missing the parameters|\\*args"),
    ("torch.optim.LBFGS(p)", "no optax translation"),
])
def test_optimizer_untranslatable(torch_src: str, why: str) -> None:
    with pytest.raises(Untranslatable, match=why):
        _opt(torch_src)


def test_cycled_momentum_injects_the_schedule() -> None:
    one = _sched("OneCycleLR(opt, max_lr=0.1, total_steps=10)")
    assert one.momentum is not None
    sgd = _opt("torch.optim.SGD(p, lr=0.1)")  # momentum 0: torch's OneCycleLR turns it on
    text = code(sgd.build(lr=one.fn, momentum=one.momentum))
    assert text.startswith("optax.inject_hyperparams(optax.sgd)(learning_rate=lambda count:")
    assert "momentum=lambda count:" in text
    adam = _opt("torch.optim.Adam(p, lr=0.1, weight_decay=0.1)")
    assert "b1=b1" in code(adam.build(lr=one.fn, momentum=one.momentum))
    with pytest.raises(Untranslatable, match="no momentum"):
        _opt("torch.optim.Adagrad(p)").build(momentum=one.momentum)


def test_with_clipping() -> None:
    tx = _opt("torch.optim.SGD(p, lr=0.1)").build()
    _same(code(with_clipping(tx, max_norm=cst.parse_expression("1.0"))),
          "optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=None, "
          "nesterov=False))")
    chained = _opt("torch.optim.Adam(p, weight_decay=0.1)").build()
    _same(code(with_clipping(chained, clip_value=cst.parse_expression("0.5"))),
          "optax.chain(optax.clip(0.5), optax.add_decayed_weights(0.1), optax.adam(0.001, "
          "b1=0.9, b2=0.999, eps=1e-08))")


# --------------------------------------------------------------------------------------------
# schedulers: text
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("torch_src", "want"), [
    ("StepLR(opt, step_size=2, gamma=0.5)",
     "optax.exponential_decay(0.1, transition_steps=2, decay_rate=0.5, staircase=True)"),
    ("lr_scheduler.StepLR(opt, 30)",
     "optax.exponential_decay(0.1, transition_steps=30, decay_rate=0.1, staircase=True)"),
    ("MultiStepLR(opt, [2, 4, 4], gamma=0.5)",  # repeated milestone: gamma twice
     "optax.piecewise_constant_schedule(0.1, {2: 0.5, 4: 0.25})"),
    ("ExponentialLR(opt, 0.9)",
     "optax.exponential_decay(0.1, transition_steps=1, decay_rate=0.9)"),
    ("CosineAnnealingLR(opt, T_max=5)",
     "lambda count: 0.1 * (1 + jnp.cos(jnp.pi * count / 5)) / 2"),
    ("LinearLR(opt)",  # hidden defaults 1/3, 1.0, 5
     "optax.linear_schedule(0.03333333333333333, 0.1, transition_steps=5)"),
    ("ConstantLR(opt)", "optax.piecewise_constant_schedule(0.03333333333333333, {5: 3.0})"),
    ("PolynomialLR(opt)",
     "optax.polynomial_schedule(init_value=0.1, end_value=0.0, power=1.0, transition_steps=5)"),
    ("LambdaLR(opt, lambda epoch: min(1.0, (epoch + 1) / 5))",
     "lambda epoch: 0.1 * jnp.minimum(1.0, (epoch + 1) / 5)"),
    ("LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / 10)) if s < 3 else 0.1)",
     "lambda s: 0.1 * jnp.where(s < 3, 0.5 * (1 + jnp.cos(jnp.pi * s / 10)), 0.1)"),
    ("LambdaLR(opt, lambda s: 1.0 if 2 <= s < 4 and not s == 3 else max(0.1, 1 - s / 9, 0.2))",
     ("lambda s: 0.1 * jnp.where(jnp.logical_and(jnp.logical_and(2 <= s, s < 4), "
     "jnp.logical_not(s == 3)), 1.0, jnp.maximum(jnp.maximum(0.1, 1 - s / 9), 0.2))")),
])
def test_scheduler_text(torch_src: str, want: str) -> None:
    _same(code(_sched(torch_src).fn), want)


def test_symbolic_base_lr() -> None:
    s = _sched("CosineAnnealingLR(opt, T_max=epochs, eta_min=1e-5)", base="args.lr")
    _same(code(s.fn), "lambda count: 1e-5 + (args.lr - 1e-5) * (1 + jnp.cos(jnp.pi * count / "
                      "epochs)) / 2")
    s = _sched("LinearLR(opt, start_factor=0.1, total_iters=warmup)", base="lr")
    _same(code(s.fn), "optax.linear_schedule(lr * 0.1, lr * 1.0, transition_steps=warmup)")


def test_sequential_inline_and_resolved() -> None:
    inline = _sched("SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=3), "
                    "CosineAnnealingLR(opt, 7)], milestones=[3])")
    _same(code(inline.fn), "optax.join_schedules([optax.linear_schedule(0.010000000000000002, "
                           "0.1, transition_steps=3), lambda count: 0.1 * (1 + jnp.cos("
                           "jnp.pi * count / 7)) / 2], boundaries=[3])")
    warm = _sched("LinearLR(opt, 0.1, total_iters=3)")
    named = _sched("SequentialLR(opt, schedulers=[warmup, optim.lr_scheduler.ExponentialLR("
                   "opt, 0.9)], milestones=[3])",
                   resolve=lambda e: warm if code(e) == "warmup" else None)
    assert code(named.fn).startswith("optax.join_schedules([optax.linear_schedule(")
    with pytest.raises(Untranslatable, match="cannot tell"):
        _sched("SequentialLR(opt, [warmup, cosine], milestones=[3])")


def test_onecycle_and_plateau() -> None:
    one = _sched("OneCycleLR(opt, max_lr=0.1, total_steps=10, cycle_momentum=False)")
    assert one.momentum is None and "jnp.where(count <= 2.0" in code(one.fn)
    plateau = _sched("ReduceLROnPlateau(opt, patience=2, min_lr=1e-3)")
    assert plateau.fn is None
    _same(code(plateau.plateau), "optax.contrib.reduce_on_plateau(factor=0.1, patience=3, "
                                 "rtol=0.0001, atol=0.0, cooldown=0, accumulation_size=1, "
                                 "min_scale=0.01)")
    mx = _sched("ReduceLROnPlateau(opt, 'max', threshold_mode='abs', threshold=0.01)")
    assert mx.negate_metric and "atol=0.01" in code(mx.plateau)


@pytest.mark.parametrize(("torch_src", "why"), [
    ("LambdaLR(opt, lambda e: helper(e))", "jit-safe"),
    ("LambdaLR(opt, [lambda e: 1.0, lambda e: 0.5])", "one lambda per param group"),
    ("MultiStepLR(opt, milestones)", "literal list"),
    ("StepLR(opt, 2, last_epoch=5)", "last_epoch"),
    ("ReduceLROnPlateau(opt, mode='max')", "threshold_mode='abs'"),
    ("OneCycleLR(opt, max_lr=0.1)", "total_steps"),
    ("CyclicLR(opt, 0.01, 0.1)", "no optax translation"),
    ("SequentialLR(opt, [StepLR(opt, 2), ReduceLROnPlateau(opt)], milestones=[2])",
     "cannot be part"),
])
def test_scheduler_untranslatable(torch_src: str, why: str) -> None:
    with pytest.raises(Untranslatable, match=why):
        _sched(torch_src)


# --------------------------------------------------------------------------------------------
# every emitted expression is a working optax object
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("torch_src", [
    "torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.1)",
    "torch.optim.Adam(p, amsgrad=True, weight_decay=0.1)",
    "torch.optim.AdamW(p, amsgrad=True)",
    "torch.optim.RMSprop(p, momentum=0.5)",
    "torch.optim.Adagrad(p, lr_decay=0.1)",
    "torch.optim.RAdam(p, weight_decay=0.1)",
    "torch.optim.Adadelta(p, maximize=True)",
])
def test_emitted_optimizers_run(torch_src: str) -> None:
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    for inject in (False, True):
        tx = eval(_tx(torch_src, inject=inject), NS)  # our own emitted code
        state = tx.init(params)
        updates, _ = jax.jit(tx.update)(params, state, params)
        assert jax.tree.structure(updates) == jax.tree.structure(params)


def test_emitted_schedules_evaluate_under_jit() -> None:
    for src in ("CosineAnnealingLR(opt, 5)", "OneCycleLR(opt, 0.1, total_steps=20)",
                "LambdaLR(opt, lambda e: min(1.0, e / 3) if e < 5 else 0.5 ** (e // 5))"):
        fn = eval(code(_sched(src).fn), NS)
        values = jax.jit(jax.vmap(fn))(jnp.arange(12))
        assert values.shape == (12,) and bool(jnp.all(jnp.isfinite(values)))


def test_injected_optimizer_keeps_its_mask_static() -> None:
    """inject_hyperparams calls every callable hyperparameter with the step count: a mask
    passed to the injected factory must be one of its static_args (issue 29)."""
    mask = cst.parse_expression("lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)")
    tx = _opt("torch.optim.AdamW(p, lr=3e-4, weight_decay=0.1)")
    text = code(tx.build(inject=True, mask=mask))
    assert 'optax.inject_hyperparams(optax.adamw, static_args=("mask",))(' in text
    ada = _opt("torch.optim.Adadelta(p, weight_decay=0.1)")
    assert 'static_args=("weight_decay_mask",)' in code(ada.build(inject=True, mask=mask))
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    for t in (tx, ada):
        built = eval(code(t.build(inject=True, mask=mask)), NS)
        state = built.init(params)
        zeros = jax.tree.map(jnp.zeros_like, params)
        new = optax.apply_updates(params, built.update(zeros, state, params)[0])
        assert float(new["b"][0]) == 1.0 and float(new["w"][0, 0]) < 1.0, t.kind
