"""Classes deriving from torch's containers and ``.children()`` (issue 34), converted, built
and verified against torch (outputs and gradients) on NNX.

* ``class Encoder(nn.Sequential)`` grown by ``self.append`` and iterated, indexed and measured
  in its own forward (``for layer in self``, ``self[0]``, ``len(self)``): nnx.Sequential is
  none of these, its ``layers`` are;
* ``backbone.children()`` / ``self.named_children()`` on a module class of the file: the
  attributes in torch's registration order (activations included), also spread into a
  Sequential (``nn.Sequential(*list(backbone.children())[:-1])``);
* what is not known statically (a child assigned under a branch, a container of
  channels-last layers iterated) is marked, never left to fail at run time.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("flax")

from torch2jax.convert import convert_source
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

SOURCE = '''
from collections import OrderedDict

import torch
import torch.nn as nn


class Encoder(nn.Sequential):
    def __init__(self, d):
        super().__init__(nn.Linear(d, d), nn.GELU())
        self.append(nn.Linear(d, d))
        self.extend([nn.Tanh(), nn.LayerNorm(d)])

    def forward(self, x):
        h = x
        for i, layer in enumerate(self):
            h = layer(h) if i < len(self) - 1 else h + layer(h)
        return h + self[0](x)


class Grown(nn.Sequential):
    def __init__(self, d):
        super().__init__()
        self.add_module("fc", nn.Linear(d, d))
        self.append(nn.ReLU())

    def forward(self, x):
        return super().forward(x) + x


class Named(nn.Sequential):
    def __init__(self, d):
        super().__init__(OrderedDict([("fc", nn.Linear(d, d)), ("act", nn.Tanh())]))


class Blocks(nn.ModuleList):
    def __init__(self, d, n):
        super().__init__()
        for _ in range(n):
            self.append(nn.Linear(d, d))
        self.extend([nn.LayerNorm(d)])

    def forward(self, x):
        for i in range(len(self) - 1):
            x = x + torch.relu(self[i](x))
        return self[-1](x)


class Heads(nn.ModuleDict):
    def __init__(self, d):
        super().__init__()
        self["a"] = nn.Linear(d, 2)
        self.update({"b": nn.Linear(d, 3)})

    def forward(self, x):
        return torch.cat([m(x) for m in self.values()], dim=-1)


class Containers(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.enc = Encoder(d)
        self.grown = Grown(d)
        self.named = Named(d)
        self.blocks = Blocks(d, 2)
        self.heads = Heads(d)

    def forward(self, x):
        return self.heads(self.blocks(self.named(self.grown(self.enc(x)))))


class Backbone(nn.Module):
    def __init__(self, d=8, classes: int = 3):
        super().__init__()
        self.width = d * 2
        self.a = nn.Linear(d, self.width)
        self.act = nn.ReLU()
        self.b = nn.Linear(self.width, d)
        self.fc = nn.Linear(d, classes)

    def forward(self, x):
        return self.fc(self.b(self.act(self.a(x))))


class Headless(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        backbone = Backbone(d)
        self.features = nn.Sequential(*list(backbone.children())[:-1])
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        return self.head(self.features(x))


class Walk(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.l1 = nn.Linear(d, d)
        self.act = nn.Tanh()
        self.l2 = nn.Linear(d, d)

    def forward(self, x):
        x = next(self.children())(x)  # the first child (a generator in torch)
        for layer in self.children():
            x = layer(x)
        for name, layer in self.named_children():
            if name != "act":
                x = x + 0.5 * layer(x)
        return x
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("containers")
    result = convert_source(SOURCE, path="containers.py")
    (folder / "containers.py").write_text(SOURCE)
    (folder / "containers_jax.py").write_text(result.code)
    return folder, result


def test_converts_without_a_mark(files):
    _, result = files
    errors = [d.render() for d in result.diagnostics if d.severity == "error"]
    assert errors == [], result.code
    assert "TODO(torch2jax)" not in result.code
    assert "children()" not in result.code


@pytest.mark.parametrize("name", ["Containers", "Headless", "Walk"])
def test_module_matches_torch(files, name):
    folder, _ = files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_request(VerifyRequest(
            f"{folder / 'containers.py'}::{name}", inputs=("float32[4,8]",), grad=True,
            atol=1e-5, rtol=1e-5, float64=False,
            converted=str(folder / "containers_jax.py")))
    assert result.error is None, result.error
    assert result.passed, result.mismatch
    assert any(c.startswith("grad ") for c in result.compared)


MARKED = '''
import torch.nn as nn


class Maybe(nn.Module):
    def __init__(self, d, gate):
        super().__init__()
        self.a = nn.Linear(d, d)
        if gate:
            self.g = nn.Sigmoid()
        self.b = nn.Linear(d, d)


class Given(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.block = block


class Convs(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
        self.insert(0, nn.Identity())

    def forward(self, x):
        for layer in self:
            x = layer(x)
        return x


def heads(d):
    maybe = Maybe(d, True)
    given = Given(nn.Linear(d, d))
    return list(maybe.children()), [n for n, _ in given.named_children()]
'''


def test_what_is_not_known_statically_is_marked():
    result = convert_source(MARKED, path="marked.py")
    errors = [(d.line, d.message) for d in result.diagnostics if d.severity == "error"]
    lines = MARKED.splitlines()
    assert any("children()" in lines[n - 1] and "under a condition" in msg
               for n, msg in errors), errors
    assert any("named_children()" in lines[n - 1] and "self.block" in msg
               for n, msg in errors), errors
    assert any("for layer in self" in lines[n - 1] and "channels-last" in msg
               for n, msg in errors), errors
    assert any("self.insert(" in lines[n - 1] and "cannot shift" in msg
               for n, msg in errors), errors


# minGPT's configure_optimizers (issue 28): named_modules() walked with isinstance(m, whitelist)
MINGPT = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class GPT(nn.Module):
    def __init__(self, vocab=11, d=16):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList([Block(d) for _ in range(2)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def configure_optimizers(self, train_config):
        decay = set()
        no_decay = set()
        whitelist_weight_modules = (torch.nn.Linear, )
        blacklist_weight_modules = (torch.nn.LayerNorm, torch.nn.Embedding)
        for mn, m in self.named_modules():
            for pn, p in m.named_parameters():
                fpn = '%s.%s' % (mn, pn) if mn else pn
                if pn.endswith('bias'):
                    no_decay.add(fpn)
                elif pn.endswith('weight') and isinstance(m, whitelist_weight_modules):
                    decay.add(fpn)
                elif pn.endswith('weight') and isinstance(m, blacklist_weight_modules):
                    no_decay.add(fpn)
        param_dict = {pn: p for pn, p in self.named_parameters()}
        inter_params = decay & no_decay
        union_params = decay | no_decay
        assert len(inter_params) == 0, "parameters %s made it into both decay/no_decay sets!" % (str(inter_params), )
        assert len(param_dict.keys() - union_params) == 0, "parameters %s were not separated into either decay/no_decay set!" % (str(param_dict.keys() - union_params), )
        optim_groups = [
            {"params": [param_dict[pn] for pn in sorted(list(decay))], "weight_decay": train_config.weight_decay},
            {"params": [param_dict[pn] for pn in sorted(list(no_decay))], "weight_decay": 0.0},
        ]
        optimizer = torch.optim.AdamW(optim_groups, lr=train_config.learning_rate, betas=train_config.betas)
        return optimizer

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))
'''


def test_mingpt_whitelist_walk_decays_what_torch_decays(tmp_path):
    """minGPT's walk, as minGPT writes it (issue 28): ``named_modules()`` becomes NNX's modules
    with their dotted paths, the whitelist tuples NNX's classes, and the two groups an optax
    mask by torch's parameter names (``torch_parameter_name``). Stepped once with zero
    gradients from all-ones weights, only weight decay moves a tensor: the same tensors move
    under torch and under the converted method (the Linear weights, not the biases, the
    LayerNorms or the Embedding)."""
    import importlib.util
    import sys
    from types import SimpleNamespace

    import jax
    import jax.numpy as jnp
    from flax import nnx

    torch = pytest.importorskip("torch")
    result = convert_source(MINGPT, path="gpt.py")
    assert not [d for d in result.diagnostics if d.severity == "error"], result.diagnostics
    path = tmp_path / "gpt_jax.py"
    path.write_text(result.code)
    spec = importlib.util.spec_from_file_location("gpt_jax_containers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    config = SimpleNamespace(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.95))
    model = module.GPT(rngs=nnx.Rngs(0))
    optimizer = model.configure_optimizers(config)
    nnx.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))
    optimizer.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    got = sorted(module.torch_parameter_name(p) for p, a in flat if not bool(jnp.all(a == 1)))

    torch_path = tmp_path / "gpt_torch.py"
    torch_path.write_text(MINGPT)
    spec = importlib.util.spec_from_file_location("gpt_torch_containers", torch_path)
    torch_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(torch_module)
    reference = torch_module.GPT()
    opt = reference.configure_optimizers(config)
    with torch.no_grad():
        for p in reference.parameters():
            p.fill_(1.0)
            p.grad = torch.zeros_like(p)
    opt.step()
    want = sorted(n for n, p in reference.named_parameters() if not bool((p == 1).all()))
    assert got == want == ["h.0.fc.weight", "h.1.fc.weight", "lm_head.weight"]


@pytest.mark.parametrize("target", ["linen", "equinox"])
def test_container_subclasses_are_marked_on_the_other_targets(target):
    """linen and equinox do not translate container subclasses yet: each class is marked at
    its line, never left to fail unmarked."""
    result = convert_source(SOURCE, path="containers.py", target=target)
    lines = SOURCE.splitlines()
    marked = {d.line for d in result.diagnostics if d.severity == "error"}
    for name in ("Encoder", "Grown", "Named", "Blocks", "Heads"):
        at = next(i for i, line in enumerate(lines, 1) if line.startswith(f"class {name}("))
        assert at in marked, (target, name, sorted(marked))
