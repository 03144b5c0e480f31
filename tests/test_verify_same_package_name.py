"""Two packages of the same name verified one after the other in one process (two models of a
user's, or two test files on one pytest worker): each side of the second must be built from
the second package's files.

The mirror package's conversion resolved the package's modules with ``find_spec``, which
answers from ``sys.modules``: the first package's modules, kept there by the torch side's
import, were converted for the second model, and the weight transfer failed ("torch
conv.weight has no NNX counterpart", the NNX model being the first package's).
"""

from __future__ import annotations

import textwrap

from torch2jax.verify.run import VerifyRequest, run_request

LAYERS = textwrap.dedent('''
    import torch.nn as nn


    def make_layer(n_in, n_out):
        return nn.Linear(n_in, n_out)
''')

FIRST = textwrap.dedent('''
    import torch.nn as nn

    from ..layers.make import make_layer


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = make_layer(6, 4)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.stem(x).relu())
''')

SECOND = textwrap.dedent('''
    import torch.nn as nn

    from ..layers.make import make_layer


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = make_layer(6, 3)

        def forward(self, x):
            return self.body(x).tanh()
''')


def _package(root, model):
    pkg = root / "samename_pkg"
    for d in (pkg, pkg / "layers", pkg / "models"):
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
    (pkg / "layers" / "make.py").write_text(LAYERS)
    (pkg / "models" / "net.py").write_text(model)
    return pkg / "models" / "net.py"


def test_a_second_package_of_the_same_name_verifies_its_own_model(tmp_path):
    for name, model in (("a", FIRST), ("b", SECOND)):
        path = _package(tmp_path / name, model)
        result = run_request(VerifyRequest(f"{path}::Net", inputs=("float32[2,6]",)))
        assert result.error is None, (name, result.error)
        assert result.passed, (name, result.reason)
