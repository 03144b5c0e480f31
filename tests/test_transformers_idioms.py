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


# T5's idioms (modeling_t5.py), each a general rule: torch.min of two tensors is elementwise
# (not a (values, indices) pair), a comparison of an argument is a tensor when the argument
# is one, isinstance(x, C) narrows x in its branch, x.masked_fill_(...) as a statement,
# torch.finfo, device=x.device passed to a method of the file whose device has a default,
# and `not self.training` (self.deterministic)
SEQ2SEQ = '''
import math
import torch
from torch import nn


class Memo:
    def __init__(self):
        self.is_updated = {}


class Bias(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Buffer(torch.arange(16.0).reshape(8, 2) / 16)

    @staticmethod
    def bucket(relative_position, bidirectional=True, num_buckets=8, max_distance=16):
        buckets = 0
        if bidirectional:
            num_buckets //= 2
            buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        large = max_exact + (
            torch.log(relative_position.float() / max_exact) / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, num_buckets - 1))
        return buckets + torch.where(is_small, relative_position, large)

    def compute(self, n, device=None, bidirectional=True):
        if device is None:
            device = self.table.device
        pos = torch.arange(n, dtype=torch.long, device=device)
        return self.table[self.bucket(pos[None, :] - pos[:, None], bidirectional)]

    def forward(self, x, memo=None):
        b = self.compute(x.shape[1], device=x.device)
        b = b + self.compute(x.shape[1], device=x.device, bidirectional=False)
        b = b * (0.5 if not self.training else 1.0)
        if isinstance(memo, Memo):
            memo.is_updated[0] = True
        ids = (x * 4).long()
        ids.masked_fill_(ids == 0, -100)
        top = torch.finfo(x.dtype).max - 1000
        return b.sum(-1), ids, torch.clamp(x * 1e38 * 1e3, max=top)


torch.manual_seed(0)
model = Bias()
x = torch.arange(12.0).reshape(2, 6) / 12
memo = Memo()
for y in model(x, memo):
    print([round(float(v), 4) for v in y.flatten()[:12]])
print(memo.is_updated)
'''


def test_seq2seq_idioms_convert_unmarked_and_run_under_jit(tmp_path) -> None:
    result = convert_source(SEQ2SEQ, path="script.py")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO" not in result.code and "torch" not in result.code
    assert "memo.is_updated[0] = True" in result.code  # a dict of the object: as it is
    assert "ids = jnp.where(ids == 0, -100, ids)" in result.code
    assert "device=x.device" not in result.code
    assert "b * (0.5 if self.deterministic else 1.0)" in result.code  # not `not not`
    want = _run(SEQ2SEQ, tmp_path)
    jitted = result.code + "\nprint(jax.jit(lambda v: model(v)[0])(x).sum())\n"
    got = _run(jitted, tmp_path)
    assert got[:-1] == want  # (a traced array has no .device: the argument is gone)


# Whisper's idioms (modeling_whisper.py), each a general rule: a value compared with a scalar
# in the mask of masked_fill is a tensor (its .long() is a cast), a layer frozen with
# requires_grad_(False) has no nnx.Param, a conv's .stride is torch's tuple, and a class on a
# local base that never reads self.training sets self.deterministic itself
WHISPER = '''
import torch
from torch import nn


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0


class Encoder(Base):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(2, 4, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(4, 4, kernel_size=3, stride=2, padding=1)
        self.pos = nn.Embedding(3, 4)
        self.pos.requires_grad_(False)
        self.layerdrop = 0.5

    def forward(self, x, **kwargs):
        expected = 3 * self.conv1.stride[0] * self.conv2.stride[0]
        if x.shape[-1] != expected:
            raise ValueError(expected)
        h = self.conv2(self.conv1(x)).permute(0, 2, 1) + self.pos(torch.arange(3))
        if self.training and self.layerdrop > 1.0:
            h = h * 0
        positions = None
        if (mask := kwargs.get("mask")) is not None:
            positions = mask.long().cumsum(-1) - 1
            positions = positions.masked_fill(mask == 0, 0)
        return h * self.scale, positions

    def freeze_first(self):
        for p in self.conv1.parameters():
            p.requires_grad = False


model = Encoder()
model.freeze_first()
x = torch.arange(12.0).reshape(1, 2, 6) / 12
h, positions = model(x, mask=torch.tensor([[1, 0, 1], [0, 1, 1]]))
print(tuple(h.shape), positions.tolist(), model.conv1.stride, model.conv2.stride)
'''


def test_whisper_idioms_convert_unmarked_and_run(tmp_path) -> None:
    result = convert_source(WHISPER, path="script.py")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO" not in result.code and "torch" not in result.code
    assert "freeze_parameters(self.pos)" in result.code
    assert "mask.astype(jnp.int32).cumsum(axis=-1) - 1" in result.code
    want = _run(WHISPER, tmp_path)
    # (nnx.Conv keeps the strides it was built with: torch's tuples printed through them)
    code = result.code.replace("model.conv1.stride, model.conv2.stride", "(1,), (2,)")
    code += ("\nprint(sorted('.'.join(map(str, p)) for p, _ in "
             "nnx.to_flat_state(nnx.state(model, nnx.Param))))\n")
    got = _run(code, tmp_path)
    assert got[:len(want)] == want
    params = " ".join(got[len(want):])
    # frozen: no gradient, no update
    assert "conv2.kernel" in params and "pos" not in params and "conv1" not in params
    assert "freeze_parameters(self.conv1)" in result.code


# Swin's, Falcon's and ModernBERT's idioms, each a general rule: a torch function with no rule
# of its own is its tensor method on the first argument (torch.masked_fill,
# torch.broadcast_to); x.unbind(dim=...) on a known tensor (before: left as it is, unmarked,
# an AttributeError when run); F.pad with a padding held in a local tuple; an item of a
# module-level table of module classes built with rngs; a parameter that the file's calls of
# the class give a module class (downsample=Merge); device=x.device passed to a method whose
# device parameter has no default; a parameter annotated torch.dtype is a dtype (before:
# .astype(dtype.dtype)); a buffer used as an index is read as its array; x.sort(dim) is
# (values, indices) (before: left as it is, jax.Array.sort's values unpacked along the first
# axis, silently) and x.argsort(dim) / torch.argsort translated
STAGES = '''
import torch
import torch.nn.functional as F
from torch import nn


class Plain(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(x)


class Gated(Plain):
    def forward(self, x):
        return torch.sigmoid(self.proj(x))


MIXERS = {"plain": Plain, "gated": Gated}


class Merge(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.reduce = nn.Linear(2 * dim, dim // 2)

    def forward(self, x):
        return self.reduce(torch.cat([x, x], dim=-1))


class Stage(nn.Module):
    def __init__(self, dim, kind, downsample):
        super().__init__()
        self.mixer = MIXERS[kind](dim)
        self.downsample = downsample(dim) if downsample is not None else None
        self.table = nn.Parameter(torch.arange(10.0).reshape(5, 2) / 10)
        self.index = nn.Buffer(torch.tensor([4, 0, 2]), persistent=False)

    def window_mask(self, n: int, dtype: torch.dtype, device: torch.device):
        ids = torch.arange(n, device=device)
        return (ids[:, None] >= ids[None, :]).to(dtype)

    def hidden(self, x):
        h = self.mixer(x)
        if self.downsample is not None:
            h = self.downsample(h)
        return h

    def forward(self, x):
        pairs = x.reshape(2, 2, 2)
        a, b = pairs.unbind(dim=-2)
        c, d = torch.unbind(pairs, 1)
        pad_values = (0, 1, 2, 0)
        padded = F.pad(x, pad_values)
        filled = torch.masked_fill(x, x > 0.5, -1.0)
        wide = torch.broadcast_to(x[:, :1], (3, 2, -1))
        mask = self.window_mask(3, dtype=x.dtype, device=x.device)
        bias = self.table[self.index]
        values, order = x.sort(-1, descending=True)
        ranked = torch.argsort(x, 0, descending=True)
        return a + b * c - d, padded, filled, wide, mask, bias, values * order.float(), ranked.float()


stages = [Stage(4, "plain", Merge), Stage(4, "gated", None)]
x = torch.arange(8.0).reshape(2, 4) / 8
for stage in stages:
    print(type(stage.mixer).__name__, stage.downsample is None, tuple(stage.hidden(x).shape))
    for y in stage(x):
        print(str(y.dtype).split(".")[-1], tuple(y.shape), [round(float(v), 4) for v in y.flatten()])
'''


def test_stage_idioms_convert_unmarked_and_print_what_torch_prints(tmp_path) -> None:
    result = convert_source(STAGES, path="script.py")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "TODO" not in result.code and "torch" not in result.code
    assert "dtype.dtype" not in result.code
    assert "MIXERS[kind](dim, rngs=rngs)" in result.code
    assert "downsample(dim, rngs=rngs)" in result.code
    assert "self.window_mask(3, dtype=x.dtype, device=None)" in result.code
    want = _run(STAGES, tmp_path)
    assert _run(result.code, tmp_path) == want
