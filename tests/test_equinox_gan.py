"""The GAN step (DCGAN shape: two models with BatchNorm, two optimizers) under
``--target equinox`` (targets/equinox_gan.py), converted and run against torch: the losses of
every iteration and the BatchNorm running statistics of both models agree. Each model has its
own eqx.nn.State and each optimizer its own optax state; G's forward runs once, under
eqx.filter_vjp. The program is tests/test_gan_training.py's (also run there on NNX and linen).
"""

from __future__ import annotations

import contextlib
import io

from test_gan_training import SCRIPT, TORCH_STATS
from unbound import undefined_names

from torch2jax.convert import convert_source

EQX_STATS = """
for model, state in ((netG, netG_state), (netD, netD_state)):
    mean, var = state.get(model.bn.running_stats)
    print(mean[0].item(), var[0].item())
"""


def _printed(code: str) -> list[float]:
    """What the script prints, run in this process (no interpreter started, torch and jax
    imported once for the session)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "script.py", "exec"), {"__name__": "__main__"})  # noqa: S102 - the test program or its conversion
    return [float(x) for x in out.getvalue().split()]


def test_gan_step_on_equinox_matches_torch():
    converted = convert_source(SCRIPT, path="script.py", target="equinox")
    errors = [str(d) for d in converted.diagnostics if d.severity == "error"]
    code = converted.code
    assert errors == [] and "TODO" not in code, errors
    assert undefined_names(code) == []
    assert "eqx.filter_vjp(generate, netG, has_aux=True)" in code
    assert "optimizerD_state = optimizerD.init(" in code and "netG, netG_state = " in code
    want = _printed(SCRIPT + TORCH_STATS)
    got = _printed(code + EQX_STATS)
    assert len(want) == len(got) == 2 * 6 + 4
    for a, b in zip(want, got):
        assert abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-3), (want, got)


def test_gan_step_with_dropout_stays_marked():
    # models that take a key per step: not translated, marked (not left half converted)
    source = SCRIPT.replace("self.fc2 = nn.Linear(5, 1)",
                            "self.fc2 = nn.Sequential(nn.Dropout(0.1), nn.Linear(5, 1))")
    result = convert_source(source, path="script.py", target="equinox")
    assert "TODO(torch2jax)" in result.code
    assert any("dropout" in d.message and d.severity == "error" for d in result.diagnostics)
