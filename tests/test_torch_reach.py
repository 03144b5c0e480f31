"""Output invariant (e), torch2jax/finish/invariants.py: nothing in a converted file reaches
torch unmarked. A torch layer class, an einops torch layer or a torch library function left in
the converted code is marked ``# TODO(torch2jax)`` with an error diagnostic, and so is every
use of the attribute that holds it: a converted file that fails at run time fails on a marked
line."""

from __future__ import annotations

import ast
import sys
import traceback
from pathlib import Path

import pytest

from torch2jax.convert import convert_source
from torch2jax.finish.invariants import InputFacts, mark_torch_calls

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = sorted((ROOT / "fixtures" / "expected").rglob("*.py"))
TODO = "# TODO(torch2jax):"

LEFTOVERS = '''
import torch.nn as nn
from einops.layers.torch import EinMix, Rearrange


class Mixer(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.flat = Rearrange("b t c -> b (t c)")
        self.mix = EinMix("b c -> b d", weight_shape="c d", c=3 * dim, d=dim)

    def forward(self, x):
        h = self.fc(x)
        h = self.flat(h)
        return self.mix(h)
'''


def _marked(code: str, lineno: int) -> bool:
    """Line ``lineno`` (1-based) of ``code`` carries a TODO in the comment lines above it."""
    lines = code.splitlines()
    i = lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        if lines[i].lstrip().startswith(TODO):
            return True
        i -= 1
    return False


@pytest.fixture(scope="module")
def converted():
    pytest.importorskip("einops")
    return convert_source(LEFTOVERS, path="mixer.py")


def test_einops_torch_layers_and_their_uses_are_marked(converted) -> None:
    """On main the einops torch layers stayed in the NNX module unmarked. Rearrange is now
    translated (einops.rearrange on JAX arrays); EinMix, which holds torch weights, is
    marked where it is built and, by this invariant, where it is used."""
    code = converted.code
    tree = ast.parse(code)
    statements = {ast.get_source_segment(code, s).strip(): s.lineno for s in ast.walk(tree)
                  if isinstance(s, (ast.Assign, ast.Return))}
    for text in ('self.mix = EinMix("b c -> b d", weight_shape="c d", c=3 * dim, d=dim)',
                 "return self.mix(h)"):
        assert _marked(code, statements[text]), (text, code)
    for text in ("h = self.fc(x)", "h = self.flat(h)",
                 'self.flat = lambda t: einops.rearrange(t, "b t c -> b (t c)")'):
        assert not _marked(code, statements[text]), (text, code)
    errors = {(d.line, d.rule) for d in converted.diagnostics if d.severity == "error"}
    assert errors == {(11, "einops.layers.torch.EinMix"), (16, "torch-leftover")}  # torch lines
    leftover = next(d for d in converted.diagnostics if d.rule == "torch-leftover")
    assert "self.mix" in leftover.message


def test_the_converted_module_fails_on_a_marked_line(converted, tmp_path) -> None:
    """Built and run: the converted module fails at run time (EinMix's torch weights meet a
    JAX array), and the line it fails on in the converted file is marked."""
    jnp = pytest.importorskip("jax.numpy")
    nnx = pytest.importorskip("flax.nnx")
    path = tmp_path / "mixer_jax.py"
    path.write_text(converted.code)
    sys.path.insert(0, str(tmp_path))
    try:
        import mixer_jax

        model = mixer_jax.Mixer(rngs=nnx.Rngs(0))
        with pytest.raises(Exception) as info:  # (whatever torch raises)
            model(jnp.ones((2, 3, 4)))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mixer_jax", None)
    frames = [f for f in traceback.extract_tb(info.value.__traceback__)
              if Path(f.filename) == path]
    assert frames and _marked(converted.code, frames[-1].lineno), frames


@pytest.mark.parametrize("code", [
    # einops itself is not torch; an annotation is not a call
    ("import einops\nimport torch\n\ndef f(x: torch.Tensor) -> torch.Tensor:\n"
     "    return einops.rearrange(x, 'a b -> b a')\n"),
    # a local name shadows the import
    "from torch.nn import functional as F\n\ndef f(x, F=None):\n    return F(x)\n",
    # rebound at the top level: not known to be torch's
    "import torch\ntorch = None\nprint(torch)\n",
    # already marked for another reason
    "import torch\n# TODO(torch2jax): no rule for torch.cdist [torch.cdist]\ny = torch.cdist(1, 2)\n",
    # an attribute that holds what a marked torch call returned (a string), not a torch object
    ("import torch\n\n\nclass T:\n    def __init__(self):\n"
     "        # TODO(torch2jax): torch.cuda.is_available is not translated here [torch-leftover]\n"
     "        self.device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
     "        print(self.device)\n"),
])
def test_left_alone(code: str) -> None:
    assert mark_torch_calls(code, [], InputFacts(), "x.py") == (code, [])


def test_dotted_torch_layer_through_a_package_import_is_marked() -> None:
    code = "import einops.layers.torch\n\nlayer = einops.layers.torch.Rearrange('a b -> b a')\n"
    new, diagnostics = mark_torch_calls(code, [], InputFacts(), "x.py")
    assert new.splitlines()[2].startswith(TODO) and [d.rule for d in diagnostics] == [
        "torch-leftover"]


def test_the_golden_outputs_are_left_alone() -> None:
    """The invariant does not fire on any golden output (fixtures/expected, every target)."""
    assert EXPECTED
    for path in EXPECTED:
        code = path.read_text()
        assert mark_torch_calls(code, [], InputFacts(), str(path)) == (code, []), path
