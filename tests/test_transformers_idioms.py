"""Idioms of transformers' modeling files, in the main suite (no transformers needed): dtype
casts read from a value (``x.to(input_dtype)``, ``.to(dtype=x.dtype)``, ``.type(v.dtype)``),
``nn.Buffer``, ``torch.baddbmm``, ``reshape(*shape, -1)`` of a value from a call the analysis
cannot see through, ``view(*shape)``, ``expand((1, -1))``. The script is converted and run; it must print what torch prints.
Before the fixes: ``astype(input_dtype.dtype)`` (AttributeError), ``.to(dtype=x.dtype)``
dropped (float32 where torch gives float16), ``.type(...)`` left as it is with no marker,
``jnp.broadcast_to(x, (2, -1))`` (an error when run), and TODOs for nn.Buffer, baddbmm, the
reshape and the view.
"""

from __future__ import annotations

from test_training_scripts import _run
from unbound import assert_names_bound

from torch2jax.convert import convert_source
from torch2jax.verify.spec import call_with, parse_specs

SCRIPT = '''
import torch
import torch.nn.functional as F
from torch import nn


def rope_init(n):
    return 1.0 / (10.0 ** (torch.arange(0, n, 2, dtype=torch.float) / n)), 1.0


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        init_fn = rope_init
        inv, self.scale = init_fn(n)
        self.inv = nn.Buffer(inv, persistent=False)
        self.inv_copy = nn.Buffer(inv.clone(), persistent=False)
        self.attention = lambda q: (q * 2.0, None)

    def forward(self, x):
        input_dtype = x.dtype
        h = x.to(torch.float32)
        freqs = h[..., : self.inv.shape[0]] * self.inv.to(device=x.device, dtype=torch.float)
        w = F.softmax(h, dim=-1, dtype=torch.float32).to(x.dtype)
        c = freqs.cos().to(dtype=x.dtype)
        t = w.type(x.dtype)
        s = torch.baddbmm(torch.empty(2, 2, 2), h.reshape(2, 2, 2), h.reshape(2, 2, 2),
                          beta=0, alpha=0.5)
        out, _ = self.attention(s)
        shape = s.shape[:-1]
        r = out.reshape(*shape, -1).contiguous()
        e = self.inv.expand((2, -1))
        v = h.view(*h.shape[:-1], 2, 2)
        return h.to(input_dtype), w, c, t, s, r, self.inv_copy, e, v


model = Block(4)
x = (torch.arange(8.0).reshape(2, 4) / 8).to(torch.float16)
for y in model(x):
    print(str(y.dtype).split(".")[-1], [round(float(v), 3) for v in y.flatten()[:3]])
'''


def test_transformers_idioms_convert_unmarked_and_print_what_torch_prints(tmp_path) -> None:
    result = convert_source(SCRIPT, path="script.py")
    assert_names_bound(result.code)
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "torch" not in result.code
    assert ".dtype.dtype" not in result.code
    assert "c = jnp.cos(freqs).astype(x.dtype)" in result.code
    assert "t = w.astype(x.dtype)" in result.code
    assert "self.inv = nnx.Variable(inv)" in result.code
    want = _run(SCRIPT, tmp_path)
    dtypes = [w for w in want if w.startswith("float")]
    assert dtypes == ["float16"] * 4 + ["float32"] * 5
    assert _run(result.code, tmp_path) == want


def test_type_without_a_dtype_is_marked() -> None:
    source = "import torch\n\n\ndef f(x):\n    return x.type()\n"
    result = convert_source(source, path="f.py")
    assert [d.rule for d in result.diagnostics if d.severity == "error"]
    assert "TODO(torch2jax)" in result.code


def test_keyword_input_specs() -> None:
    specs = parse_specs(["int64[2,7]:64", "attention_mask=int64[2,7]:2"])
    assert specs[1].name == "attention_mask" and str(specs[1]) == "attention_mask=int64[2,7]:2"
    assert call_with(lambda *a, **k: (a, k), [1, 2], specs) == ((1,), {"attention_mask": 2})


def test_every_name_the_reduction_imports_from_the_support_module_is_there() -> None:
    """hf.SUPPORT_NAMES are imported from _hf_support (transformers_runtime.py): a name
    missing there would be an ImportError in every converted modeling file that uses it."""
    import torch2jax.transformers_runtime as runtime
    from torch2jax.hf import SUPPORT_LAYERS, SUPPORT_NAMES

    assert set(SUPPORT_NAMES) <= set(vars(runtime))
    assert SUPPORT_LAYERS <= SUPPORT_NAMES
