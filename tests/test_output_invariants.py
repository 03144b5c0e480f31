"""Output invariants (torch2jax/finish/invariants.py), checked on every converted file:
(a) it parses, (b) every name it reads is bound: a torch name still read keeps its import and
its line is marked, any other unbound read is marked, never a silent NameError."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from unbound import assert_names_bound, undefined_names

from torch2jax.convert import convert_source
from torch2jax.finish.invariants import InputFacts, check_output
from torch2jax.finish.names import unbound_names

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = sorted((ROOT / "fixtures" / "expected").rglob("*.py"))


@pytest.mark.parametrize("path", EXPECTED, ids=lambda p: str(p.relative_to(ROOT / "fixtures")))
def test_fixture_outputs_bind_every_name(path: Path) -> None:
    """The golden outputs (every target) read no unbound name: ruff F821."""
    assert_names_bound(path.read_text(), path.name)


def _run(code: str, tmp_path: Path, name: str = "script.py") -> list[str]:
    path = tmp_path / name
    path.write_text(code)
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


TORCH_LEFTOVERS = '''
import inspect
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.fast = hasattr(torch.nn.functional, "scaled_dot_product_attention")

    def forward(self, x):
        q = self.qkv(x)
        return F.softmax(q, dim=-1)


def adamw_takes(option):
    return option in inspect.signature(torch.optim.AdamW).parameters


device_type = 'cpu'
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
model = SelfAttention(8)
with ctx:
    print(model.fast, adamw_takes("fused"), adamw_takes("no_such_option"))
'''


def test_torch_still_read_keeps_its_import_and_is_marked(tmp_path: Path) -> None:
    """nanoGPT-style capability checks on torch itself: once the import went and the
    converted file died with NameError: torch. What stays untranslated is marked, and the
    converted program runs. The two capability
    checks ask JAX instead (docs/training.md): jax.nn has a fused attention, optax's AdamW
    has no `fused` option (so the script passes none)."""
    result = convert_source(TORCH_LEFTOVERS)
    assert_names_bound(result.code)
    # the nanoGPT context (`ctx = nullcontext() if ... else torch.amp.autocast(...)`) is now
    # translated (passes/rewrite_steps.py): `with ctx:` is an autocast region decided at run
    # time; this one holds no model call, so it is marked there, and nothing reads torch
    assert "import torch" not in result.code
    assert "hasattr(jax.nn, 'dot_product_attention')" in result.code
    assert "inspect.signature(optax.adamw)" in result.code
    lines = result.code.splitlines()
    at = lines.index("with ctx:")
    assert lines[at - 1].strip().startswith("# TODO(torch2jax):"), lines[at - 1]
    assert "[torch.amp.autocast]" in lines[at - 1]
    rules = sorted(d.rule for d in result.diagnostics if d.severity == "error")
    assert rules == ["torch.amp.autocast"]
    # diagnostics point at the torch file's lines
    source_lines = TORCH_LEFTOVERS.splitlines()
    for d in result.diagnostics:
        if d.severity == "error":
            assert source_lines[d.line - 1].startswith("with ctx:"), d
    want = _run(TORCH_LEFTOVERS, tmp_path, "torch_side.py")
    assert want == ["True", "True", "False"]
    assert _run(result.code, tmp_path) == ["True", "False", "False"]


def test_a_removed_definition_still_read_is_kept() -> None:
    """A statement the rewrite drops (a GradScaler) that a later line still reads stays."""
    source = "import torch\nscaler = torch.cuda.amp.GradScaler()\nprint(scaler.is_enabled())\n"
    result = convert_source(source)
    assert "scaler = torch.cuda.amp.GradScaler()" in result.code
    assert_names_bound(result.code)


def test_an_unbound_read_is_marked_at_its_statement() -> None:
    """Whatever leaves a name unbound in the output, its reads are marked (one TODO per
    statement) with an error at the torch file's read, never left to a NameError."""
    facts = InputFacts(reads={"device": [(4, 7), (9, 11)]})
    code = "def f():\n    if True:\n        print(device, device)\n    return device\n"
    out, diagnostics = check_output(code, [], facts, "f.py", "")
    assert out.splitlines() == [
        "def f():",
        "    if True:",
        ("        # TODO(torch2jax): `device` is read here but the converted file no longer "
         "binds it (the conversion removed what bound it) [unbound-name]"),
        "        print(device, device)",
        ("    # TODO(torch2jax): `device` is read here but the converted file no longer binds "
         "it (the conversion removed what bound it) [unbound-name]"),
        "    return device",
    ]
    assert [(d.rule, d.severity) for d in diagnostics] == [("unbound-name", "error")] * 2
    again, _ = check_output(out, [], facts, "f.py", "")
    assert again == out  # marked once


@pytest.mark.parametrize("code", [
    "import os\nprint(os.sep, torch.x)\n",
    "def f(a):\n    return [b for b in a if b > c]\n",
    "class C:\n    k = 1\n    def m(self):\n        return k\n",
    "def f():\n    global g\n    g = 1\n\nprint(g, h)\n",
    "def f(x=y):\n    return lambda z: z + w\n",
    "try:\n    pass\nexcept Exception as e:\n    print(e, q)\n",
    "def outer():\n    v = 1\n    def inner():\n        return v + u\n    return inner\n",
    "print(__file__, __name__, undefined_thing)\n",
])
def test_names_check_agrees_with_ruff(code: str) -> None:
    """The converter's fast check (the compiler's symbol tables) finds what ruff's F821 finds."""
    ours = unbound_names(ast.parse(code), code)
    theirs = {line.rsplit("`", 2)[1] for line in undefined_names(code)}
    assert ours == theirs


def test_output_that_does_not_parse_leaves_the_file_as_it_was() -> None:
    source = "import torch\nx = torch.ones(3)\n"
    code, diagnostics = check_output("x = (\n", [], InputFacts(), "f.py", source)
    assert code == source
    assert [d.rule for d in diagnostics] == ["invalid-output"]
    assert diagnostics[0].severity == "error"


def test_placeholders_of_a_block_emptied_leave_one_pass() -> None:
    """The statements a block held were all removed and nothing reads them: the block gets
    `pass` (once), as libcst writes an emptied block."""
    from torch2jax.finish.removed import Removed, settle

    removed = {k: Removed(names=frozenset({f"v{k}"}), statement=f"v{k} = {k}\n", line=1,
                          column=1) for k in range(3)}
    code = ("def f():\n    __torch2jax_removed_0__\n    __torch2jax_removed_1__\n"
            "\n\nx = 1\n__torch2jax_removed_2__\nprint(x)\n")
    out, read, unfinished, dropped = settle(code, removed, set())
    assert out == "def f():\n    pass\n\n\nx = 1\nprint(x)\n"
    assert dropped == {0, 1, 2} and not read and not unfinished
    # one of them read later: it is put back, the others go
    out, read, _, dropped = settle(code.replace("print(x)", "print(x, v2)"), removed, set())
    assert out == ("def f():\n    pass\n\n\nx = 1\n# TODO(torch2jax): kept because later "
                   "lines read `v2`: the conversion removes this statement (no JAX "
                   "counterpart) when nothing reads it [removed-but-read]\nv2 = 2\n"
                   "print(x, v2)\n")
    assert read == {2} and dropped == {0, 1}



NN_FUNCTIONAL_DROPOUT = """
import torch
from torch import nn


def attend(module, q, k, dropout=0.0):
    w = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    w = nn.functional.dropout(w, p=dropout, training=module.training)
    return w @ k
"""


def test_functional_dropout_branch_keeps_the_import_of_the_f_it_reads() -> None:
    """transformers' eager attention calls nn.functional.dropout(...): the converter
    translates the identity (training off, p == 0) and writes the random branch as torch's
    F.dropout under a marker. The input binds no F, so the output read an unbound F (a
    NameError when training); the marked line keeps `import torch.nn.functional as F`, as
    torch's own leftovers keep their import, and the eval path computes torch's numbers."""
    torch = pytest.importorskip("torch")
    import numpy as np

    result = convert_source(NN_FUNCTIONAL_DROPOUT)
    assert_names_bound(result.code)
    assert "import torch.nn.functional as F\n" in result.code
    lines = result.code.splitlines()
    at = next(i for i, line in enumerate(lines) if "F.dropout(" in line)
    assert "[torch.nn.functional.dropout]" in lines[at - 1]
    ns: dict = {}
    exec(compile(result.code, "m.py", "exec"), ns)  # noqa: S102 - converted test code
    torch_ns: dict = {}
    exec(compile(NN_FUNCTIONAL_DROPOUT, "t.py", "exec"), torch_ns)  # noqa: S102

    class Eval:
        training = False

    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(2))
    want = torch_ns["attend"](Eval(), torch.from_numpy(q), torch.from_numpy(k), 0.1).numpy()
    got = np.asarray(ns["attend"](Eval(), q, k, 0.1))
    np.testing.assert_allclose(got, want, atol=1e-5)


# --- (e) through names: torch objects held by a name, a parameter default, an attribute -----

HELD_TORCH = {
    # a module-level table of torch layer classes, looked up by name
    "table": ('ACTS = {"weird": nn.Hardshrink}\n', "self.act = ACTS[name]()", "self.act(h)"),
    # a parameter whose default is a torch layer class
    "default": ("", "self.act = act()", "self.act(h)"),
    # a torch function held by a name, applied to a converted value
    "function": ('FNS = {"fn": torch.special.i1e}\n', "self.scale = 2.0",
                 "FNS['fn'](h) * self.scale"),
    # ... through a local name first
    "local": ('FNS = [torch.special.i1e]\n', "self.scale = 2.0",
              "(f := FNS[0]) and f(h)"),
}


def _held_torch_source(kind: str) -> str:
    table, build, use = HELD_TORCH[kind]
    return (
        "import torch\nimport torch.nn as nn\n\n" + table + "\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, act=nn.Hardshrink, name='weird'):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(4, 4)\n"
        f"        {build}\n\n"
        "    def forward(self, x):\n"
        "        h = self.fc(x)\n"
        f"        return {use}\n")


@pytest.mark.parametrize("kind", sorted(HELD_TORCH))
def test_torch_held_by_a_name_fails_on_a_marked_line(kind: str, tmp_path: Path) -> None:
    """A converted file that reaches torch at run time through a name that holds a torch
    object (no torch name read on that line) fails there, and that line is marked."""
    import traceback

    import jax.numpy as jnp
    from flax import nnx

    torch = pytest.importorskip("torch")
    source = _held_torch_source(kind)
    ns: dict = {}
    exec(compile(source, "torch_side.py", "exec"), ns)  # noqa: S102 - a test program of our own
    ns["Net"]()(torch.ones(2, 4))  # torch's own runs
    result = convert_source(source)
    assert "import torch2jax" not in result.code
    path = tmp_path / f"held_{kind}.py"
    path.write_text(result.code)
    ns = {"__name__": f"held_{kind}"}
    with pytest.raises(Exception) as err:  # torch reached with JAX values or nnx arguments
        exec(compile(result.code, str(path), "exec"), ns)  # noqa: S102 - the converter's output
        ns["Net"](rngs=nnx.Rngs(0))(jnp.ones((2, 4)))
    frames = [f for f in traceback.extract_tb(err.value.__traceback__) if f.filename == str(path)]
    assert frames, (err.value, result.code)
    lines = result.code.splitlines()
    tree = ast.parse(result.code)
    failing = frames[-1].lineno
    stmt = min((s for s in ast.walk(tree) if isinstance(s, ast.stmt) and not isinstance(
        s, (ast.FunctionDef, ast.ClassDef)) and s.lineno <= failing <= s.end_lineno),
        key=lambda s: s.end_lineno - s.lineno)
    above = lines[stmt.lineno - 2].strip()
    assert above.startswith("# TODO(torch2jax):"), (failing, result.code)
    assert any(d.severity == "error" for d in result.diagnostics)
