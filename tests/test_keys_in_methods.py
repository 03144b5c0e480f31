"""A plain class's method that draws random numbers takes a key as the file's functions do
(issue 28: the step moved into a method of a runner class, with the input pipeline's draws).
The method gains ``key``, ``self.method(...)`` and ``obj.method(...)`` (``obj`` bound once to
an instance) pass a subkey; a method also called on a receiver that is not known keeps its
draws marked, since that call would give no key."""

from __future__ import annotations

import runpy
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax")

from torch2jax.convert import convert_source

SOURCE = textwrap.dedent('''
    import torch


    class Augment:
        def noise(self, n):
            return torch.randn(n)

        def batch(self, n):
            idx = torch.randint(0, 10, (n,))
            return idx, self.noise(n)


    torch.manual_seed(0)
    aug = Augment()


    def draw(n):
        return aug.batch(n)


    idx, noise = draw(20000)
    idx2, noise2 = draw(20000)
''')


def test_methods_that_draw_take_keys(tmp_path):
    result = convert_source(SOURCE, path="script.py")
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "def noise(self, n, *, key: jax.Array)" in result.code
    path = tmp_path / "script.py"
    path.write_text(result.code)
    out = runpy.run_path(str(path))
    noise, noise2 = np.asarray(out["noise"]), np.asarray(out["noise2"])
    idx = np.asarray(out["idx"])
    # torch's distributions (another stream): N(0, 1), integers in [0, 10), fresh each call
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05
    assert idx.min() == 0 and idx.max() == 9 and abs(idx.mean() - 4.5) < 0.1
    assert not np.allclose(noise, noise2)


def test_a_receiver_not_known_keeps_the_draw_marked():
    source = SOURCE.replace("aug = Augment()\n", "aug = Augment()\naug = Augment()\n")
    result = convert_source(source, path="script.py")
    assert "random draw in a method" in result.code
