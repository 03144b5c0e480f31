"""Whole repositories: relative imports, ``__init__`` re-exports, module classes that derive
from module classes of other files, files without torch copied through, ``.gitignore`` and
``exclude`` honoured, and the converted tree verified against the original."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.repo import index_repository, module_name
from torch2jax.ruleset import load_rules

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data"
MULTI = DATA / "multifile"


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def test_package_converts_imports_and_verifies(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(MULTI, src)
    before = _digest(src)
    out = tmp_path / "out"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "-j", "2"])
    assert res.exit_code == 0, res.output
    assert _digest(src) == before  # the source tree is untouched
    # the file without torch is copied byte for byte, the others hold no torch
    assert (out / "netpkg" / "util.py").read_bytes() == (src / "netpkg" / "util.py").read_bytes()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.py")) == sorted(
        p.relative_to(src).as_posix() for p in src.rglob("*.py"))
    for p in out.rglob("*.py"):
        assert "import torch" not in p.read_text() and "from torch" not in p.read_text(), p
    classifier = (out / "classifier.py").read_text()
    # cross-file inheritance: the subclass and the layers it builds take the rngs
    assert "super().__init__(dim, rngs=rngs)" in classifier
    assert "self.head = H(dim, classes, rngs=rngs)" in classifier
    backbone = (out / "netpkg" / "backbone.py").read_text()
    assert "ResidualMlp(dim, rngs=rngs)" in backbone
    heads = (out / "netpkg" / "heads.py").read_text()
    assert "super().__init__(dim, classes, rngs=rngs)" in heads

    from torch2jax.verify.run import verify

    result = verify(f"{src / 'classifier.py'}::Classifier", inputs=["float32[2,16]"], grad=True,
                    converted=str(out / "classifier.py"))
    assert result.error is None, result.error
    assert result.passed, result.to_json()
    # verify converts the package itself too, knowing its cross-file module classes
    result = verify(f"{src / 'classifier.py'}::Classifier", inputs=["float32[2,16]"], grad=True)
    assert result.error is None, result.error
    assert result.todos == 0 and result.passed, result.to_json()


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_index_resolves_relative_imports_reexports_and_aliases(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from .base import *\nfrom .sub import Deep as Reexported\n",
        "pkg/base.py": "import torch.nn as nn\n__all__ = ['Base']\nclass Base(nn.Module):\n"
                       "    pass\nclass NotExported(nn.Module):\n    pass\n",
        "pkg/sub/__init__.py": "from ..base import Base\nclass Deep(Base):\n    pass\n",
        "pkg/sub/leaf.py": "from .. import base\nfrom ... import nothing\n"
                           "Alias = base.Base\nclass Leaf(Alias):\n    pass\n"
                           "class Plain:\n    pass\n",
        "app.py": "import pkg\nimport pkg.sub.leaf as lf\nfrom pkg import Reexported, Base\n"
                  "from pkg.sub.leaf import Plain\nclass A(pkg.Base):\n    pass\n",
        "cfg.py": "class Config:\n    pass\n",
    })
    files = sorted(tmp_path.rglob("*.py"))
    idx = index_repository(files, load_rules().layers)
    assert module_name(tmp_path / "pkg" / "sub" / "leaf.py") == ("pkg.sub.leaf", False)
    assert module_name(tmp_path / "pkg" / "sub" / "__init__.py") == ("pkg.sub", True)
    assert module_name(tmp_path / "app.py") == ("app", False)
    classes = {c for _, c in idx.module_classes}
    assert classes == {"Base", "NotExported", "Deep", "Leaf", "A"}
    app = idx.known_for(tmp_path / "app.py")
    assert {"Reexported", "pkg.Reexported", "Base", "pkg.Base", "pkg.base.Base"} <= app
    assert "lf.Leaf" not in app and "pkg.sub.leaf.Leaf" in app  # libcst's qualified name
    assert "Plain" not in app and "Config" not in app
    leaf = idx.known_for(tmp_path / "pkg" / "sub" / "leaf.py")
    assert "..base.Base" in leaf and "Alias" in leaf


def test_gitignore_and_exclude(tmp_path: Path) -> None:
    good = "import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n"
    _write(tmp_path, {
        ".gitignore": "generated/\n*_skip.py\n!keep_skip.py\n",
        "a.py": good, "generated/g.py": good, "b_skip.py": good, "keep_skip.py": good,
        "legacy/old.py": good, "sub/.gitignore": "local.py\n", "sub/local.py": good,
        "sub/c.py": good,
        "pyproject.toml": "[tool.torch2jax]\nexclude = ['legacy/']\n",
    })
    (tmp_path / ".git").mkdir()
    out = tmp_path.parent / (tmp_path.name + "_out")
    res = runner.invoke(app, ["convert", str(tmp_path), "-o", str(out), "--exclude", "*/c.py"])
    assert res.exit_code == 0, res.output
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.py"))
    assert written == ["a.py", "keep_skip.py"]
    res = runner.invoke(app, ["convert", str(tmp_path), "-o", str(out), "--no-gitignore"])
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.py"))
    assert written == ["a.py", "b_skip.py", "generated/g.py", "keep_skip.py", "sub/c.py",
                       "sub/local.py"]
    # a file named explicitly is taken even when .gitignore ignores it, not when excluded
    res = runner.invoke(app, ["check", str(tmp_path / "b_skip.py")])
    assert res.exit_code == 1
    res = runner.invoke(app, ["check", str(tmp_path / "legacy" / "old.py")])
    assert res.exit_code == 0


def test_jobs_do_not_change_output_or_report(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(MULTI, src)
    reports = []
    for jobs in ("1", "3"):
        out = tmp_path / f"out{jobs}"
        rep = tmp_path / f"r{jobs}.json"
        res = runner.invoke(app, ["convert", str(src), "-o", str(out), "-j", jobs,
                                  "--report", str(rep)])
        assert res.exit_code == 0, res.output
        reports.append(rep.read_text().replace(str(out), "OUT"))
    assert reports[0] == reports[1]
    assert _digest(tmp_path / "out1") == _digest(tmp_path / "out3")


def test_a_file_named_alone_still_knows_the_module_classes_of_its_tree(tmp_path: Path) -> None:
    """pre-commit passes the staged files only: the base class of an unstaged file counts."""
    src = tmp_path / "src"
    shutil.copytree(MULTI, src)
    out = tmp_path / "out"
    res = runner.invoke(app, ["convert", str(src / "classifier.py"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["classifier.py"]
    classifier = (out / "classifier.py").read_text()
    assert "super().__init__(dim, rngs=rngs)" in classifier
    assert "self.head = H(dim, classes, rngs=rngs)" in classifier


def test_a_seed_function_of_another_file_seeds_the_models(tmp_path: Path) -> None:
    """`set_seed` lives in utils.py (torch.manual_seed, returns nothing): its conversion returns
    the key it makes. The caller in main.py used to drop it and build the model from
    `nnx.Rngs(0)`, so every seed gave the same weights (a seed sweep ran one seed, silently).
    Now the caller keeps the key and the model is built from it: another seed, other weights;
    the same seed, the same weights."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "utils.py").write_text(
        "import random\n\nimport numpy as np\nimport torch\n\n\ndef set_seed(seed):\n"
        "    random.seed(seed)\n    np.random.seed(seed)\n    torch.manual_seed(seed)\n")
    (src / "main.py").write_text(
        "import sys\n\nimport torch\nfrom torch import nn\n\nfrom utils import set_seed\n\n"
        "set_seed(int(sys.argv[1]))\nmodel = nn.Linear(3, 2)\n"
        "print(f'{float(model(torch.ones(1, 3)).sum()):.6f}')\n")
    res = runner.invoke(app, ["convert", str(src), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    code = (tmp_path / "out" / "main.py").read_text()
    assert "key = set_seed(int(sys.argv[1]))" in code
    assert "nnx.Rngs(0)" not in code

    def run(seed: int) -> str:
        done = subprocess.run([sys.executable, "main.py", str(seed)], check=False, cwd=tmp_path / "out",
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    first, other, again = run(1), run(2), run(1)
    assert first != other
    assert first == again


def test_module_classes_of_a_star_import_are_known(tmp_path: Path) -> None:
    # a model split across files with `from .parts import *` (Pytorch-UNet's layout): the
    # classes the star import binds are module classes, built with the rngs
    src, out = tmp_path / "src", tmp_path / "out"
    _write(src, {
        "unetpkg/__init__.py": "",
        "unetpkg/parts.py": (
            "import torch.nn as nn\n\n\nclass DoubleConv(nn.Module):\n"
            "    def __init__(self, cin, cout):\n        super().__init__()\n"
            "        self.net = nn.Sequential(nn.Linear(cin, cout), nn.ReLU(),\n"
            "                                 nn.Linear(cout, cout))\n\n"
            "    def forward(self, x):\n        return self.net(x)\n"),
        "unetpkg/model.py": (
            "import torch.nn as nn\n\nfrom .parts import *\n\n\nclass UNet(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n"
            "        self.inc = DoubleConv(4, 8)\n        self.out = nn.Linear(8, 2)\n\n"
            "    def forward(self, x):\n        return self.out(self.inc(x))\n"),
        "app.py": "from unetpkg.model import UNet\n",
    })
    idx = index_repository(sorted(src.rglob("*.py")), load_rules().layers)
    assert "DoubleConv" in idx.known_for(src / "unetpkg" / "model.py")
    res = runner.invoke(app, ["convert", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "self.inc = DoubleConv(4, 8, rngs=rngs)" in (out / "unetpkg" / "model.py").read_text()

    from torch2jax.verify.run import verify

    result = verify(f"{src / 'unetpkg' / 'model.py'}::UNet", inputs=["float32[2,4]"], grad=True,
                    converted=str(out / "unetpkg" / "model.py"))
    assert result.error is None, result.error
    assert result.passed, result.to_json()
