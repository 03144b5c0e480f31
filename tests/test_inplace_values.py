"""An in-place tensor method whose value is used (pytorch/examples' ``accuracy``, copied into
many training scripts: ``res.append(correct_k.mul_(100.0 / batch_size))``). Before, it was
marked (".mul_ has no rule"); now it is the out-of-place method's value bound to the name again,
and the function returns torch's numbers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("jax")

from torch2jax.convert import convert_source

SOURCE = '''
import torch


def accuracy(output, target, topk=(1,)):
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


def scaled(x):
    y = x * 2
    return y.add_(1.5).clamp_(max=4.0), y
'''


def test_inplace_values_compute_torchs_numbers():
    import jax.numpy as jnp

    result = convert_source(SOURCE, path="metrics.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    converted: dict = {}
    exec(compile(result.code, "<converted>", "exec"), converted)  # noqa: S102
    original: dict = {}
    exec(compile(SOURCE, "<torch>", "exec"), original)  # noqa: S102
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((32, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 32)
    want = original["accuracy"](torch.from_numpy(logits), torch.from_numpy(labels), (1, 5))
    got = converted["accuracy"](jnp.asarray(logits), jnp.asarray(labels), (1, 5))
    assert [float(w) for w in want] == pytest.approx([float(g[0]) for g in got])
    assert float(want[1]) > float(want[0])  # (top-5 above top-1: the data is not degenerate)
    x = rng.standard_normal(6).astype(np.float32)
    (tw, ty), (jw, jy) = original["scaled"](torch.from_numpy(x)), converted["scaled"](
        jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(jw), tw.numpy(), rtol=1e-6)
    # torch's y is the same tensor as the value; the name rebinding keeps that too
    np.testing.assert_allclose(np.asarray(jy), ty.numpy(), rtol=1e-6)


DATA_SOURCE = '''
import torch


def predictions(logits):
    probs = torch.softmax(logits, dim=1)
    as_numpy = probs.data.cpu().numpy()
    top = probs.data.max(1)[1]
    detached = probs.detach().data.numpy()
    return as_numpy, top, detached, probs.data.dtype == logits.dtype
'''


def test_a_tensors_data_reads_as_the_detached_tensor():
    """``probs.data.cpu().numpy()``, ``probs.data.max(1)[1]``: ``.data`` was left as written
    (a JAX array has none: an unmarked AttributeError); it is ``jax.lax.stop_gradient``."""
    import jax.numpy as jnp

    result = convert_source(DATA_SOURCE, path="preds.py")
    assert ".data" not in result.code and not [
        d for d in result.diagnostics if d.severity == "error"]
    converted: dict = {}
    exec(compile(result.code, "<converted>", "exec"), converted)  # noqa: S102
    original: dict = {}
    exec(compile(DATA_SOURCE, "<torch>", "exec"), original)  # noqa: S102
    logits = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    want = original["predictions"](torch.from_numpy(logits))
    got = converted["predictions"](jnp.asarray(logits))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert np.asarray(got[1]).tolist() == want[1].tolist()
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6)
    assert bool(got[3]) and want[3]
