"""Random numbers drawn by a module at call time (a VAE's reparameterisation,
``eps = torch.randn_like(std)`` in a method): the NNX module keeps an ``nnx.Rngs`` of its own
(``self.rngs = rngs.fork()`` in ``__init__``) and draws ``jax.random.normal(self.rngs(), ...)``.
Its stream's count is module state, so every call, eager or jitted, draws new numbers, and the
functional train step carries it through ``nnx.split``/``merge``. torch's and JAX's generators
differ, so the draws cannot be compared with torch's: the tests check their distribution, that
they change from call to call, and that the converted training script learns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
nnx = pytest.importorskip("flax.nnx")

from torch2jax.convert import convert_source

VAE = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


class VAE(nn.Module):
    def __init__(self, latent_dim=4):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(1, 4, 4, stride=2, padding=1), nn.LeakyReLU(0.2))
        self.fc_mu = nn.Linear(4 * 4 * 4, latent_dim)
        self.fc_logvar = nn.Linear(4 * 4 * 4, latent_dim)
        self.fc_dec = nn.Linear(latent_dim, 4 * 4 * 4)
        self.dec = nn.ConvTranspose2d(4, 1, 4, stride=2, padding=1)

    def encode(self, x):
        h = self.enc(x).view(x.size(0), -1)
        return self.fc_mu(h), self.fc_logvar(h)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.dec(self.fc_dec(z).view(-1, 4, 4, 4)))

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(1)
    data = torch.zeros(32, 1, 8, 8)  # two kinds of image: top half or bottom half lit
    data[::2, :, :4] = 1.0
    data[1::2, :, 4:] = 1.0
    model = VAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(args.epochs):
        model.train()
        for i in range(0, 32, 8):
            batch = data[i:i + 8]
            optimizer.zero_grad()
            recon, mu, logvar = model(batch)
            loss = loss_function(recon, batch, mu, logvar)
            loss.backward()
            optimizer.step()
        print(f"{loss.item():.4f}")


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def converted() -> str:
    result = convert_source(VAE, path="vae.py")
    errors = [str(d) for d in result.diagnostics if d.severity == "error"]
    assert errors == [], errors
    return result.code


def test_the_module_keeps_its_own_stream(converted: str) -> None:
    assert "self.rngs = rngs.fork()" in converted
    assert "eps = jax.random.normal(self.rngs(), std.shape, std.dtype)" in converted
    assert "torch" not in converted


def test_draws_are_fresh_at_every_call(converted: str) -> None:
    import jax
    import jax.numpy as jnp

    ns: dict = {"__name__": "vae_converted"}
    exec(compile(converted, "vae.py", "exec"), ns)  # noqa: S102 - the converter's output
    model = ns["VAE"](rngs=nnx.Rngs(0))
    mu = jnp.zeros((2000, 4))
    logvar = jnp.zeros((2000, 4))
    a, b = model.reparameterize(mu, logvar), model.reparameterize(mu, logvar)
    assert not np.allclose(a, b)
    # standard normal draws (8000 of them): mean within 5 standard errors, unit variance
    assert abs(float(a.mean())) < 5 / np.sqrt(a.size) and abs(float(a.std()) - 1) < 0.05

    @nnx.jit
    def draw(model, mu, logvar):
        return model.reparameterize(mu, logvar)

    c, d = draw(model, mu, logvar), draw(model, mu, logvar)
    assert not np.allclose(c, d) and not np.allclose(c, b)

    # the functional form the converter emits for training loops: the stream's count is
    # part of the state that the jitted step returns
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, mu, logvar):
        m = nnx.merge(graphdef, state)
        return m.reparameterize(mu, logvar), nnx.state(m)

    e, state = step(state, mu, logvar)
    f, state = step(state, mu, logvar)
    assert not np.allclose(e, f)


def test_the_converted_script_learns(converted: str, tmp_path: Path) -> None:
    path = tmp_path / "vae.py"
    path.write_text(converted)
    done = subprocess.run([sys.executable, str(path), "--epochs", "30"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [float(v) for v in done.stdout.split()]
    assert len(losses) == 30 and all(np.isfinite(losses))
    # the ELBO loss of the last batch (8 images of 64 binary pixels) falls from about
    # 8 * 64 * log(2) = 355 to about 30 (torch: 360 to 23-40), and stays finite when the
    # decoder's sigmoid saturates (binary_cross_entropy's gradient is torch's, not nan)
    assert np.mean(losses[-5:]) < 0.25 * np.mean(losses[:5]), losses
