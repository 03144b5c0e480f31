"""The numpy draw of a torch random function on the host, written once.

Three translations draw on the host in numpy: a script's host-side ``torch.randint`` /
``torch.randperm`` (analysis/host.py, from the script's ``numpy.random.Generator``), a draw
from a ``torch.Generator`` that became a numpy Generator (analysis/host_generators.py), and a
Dataset's methods (passes/host_data.py, from the dataset's own generator or from numpy's
global one where torch drew from its global generator). Each reads torch's arguments its own
way; :func:`numpy_draw` writes the numpy call from the parts, so the forms (ranges, dtypes,
the global generator's legacy functions) are decided in one place.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.passes.common import arg

DRAWS = frozenset({"rand", "randn", "randint", "randperm"})


def numpy_draw(kind: str, source: cst.BaseExpression | None, *,
               n: cst.BaseExpression | None = None, low: cst.BaseExpression | None = None,
               high: cst.BaseExpression | None = None, size: cst.BaseExpression | None = None,
               dtype: cst.BaseExpression | None = None) -> cst.Call:
    """torch's ``rand`` / ``randn`` / ``randint`` / ``randperm`` (``kind``) drawn from
    ``source``, a numpy ``Generator`` expression, or, when it is None, from numpy's global
    generator (one stream per process, as torch's global generator is).

    torch's default dtypes are kept: a float draw is float32 (numpy's is float64) unless
    ``dtype`` says otherwise, an integer draw int64. The global generator's legacy functions
    take no dtype for floats, so that draw is cast; ``np.random.randint``'s default integer
    is the platform's ``long``, so it is given int64."""
    def call(method: str, *args: cst.Arg) -> cst.Call:
        base = source if source is not None else cst.parse_expression("np.random")
        return cst.Call(func=cst.Attribute(base, cst.Name(method)), args=list(args))

    if kind == "randperm":
        return call("permutation", arg(n))
    if kind == "randint":
        if source is None:
            return call("randint", arg(low), arg(high), arg(size, "size"),
                        arg(dtype or cst.parse_expression("np.int64"), "dtype"))
        return call("integers", arg(low), arg(high), arg(size, "size"),
                    *([arg(dtype, "dtype")] if dtype is not None else []))
    if kind not in ("rand", "randn"):
        raise ValueError(f"not a draw numpy_draw writes: {kind}")
    method = "random" if kind == "rand" else "standard_normal"
    dtype = dtype or cst.parse_expression("np.float32")
    if source is None:
        return cst.Call(func=cst.Attribute(call(method, arg(size)), cst.Name("astype")),
                        args=[arg(dtype)])
    return call(method, arg(size), arg(dtype, "dtype"))
