"""Configuration: [tool.torch2jax] in the user's pyproject.toml, inline suppression comments,
user rule folders validated with errors that name the file and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torch2jax.cli import app
from torch2jax.config import ConfigError, find_config, load_user_rules
from torch2jax.convert import convert_source

runner = CliRunner()

UNKNOWN = "import torch\n\n\ndef f(x):\n    return torch.frobnicate(x)\n"


def test_inline_ignore_drops_the_diagnostic_and_its_todo() -> None:
    src = (
        "import torch\n\n\n"
        "def f(x):\n"
        "    a = torch.frobnicate(x)  # torch2jax: ignore[torch.frobnicate]\n"
        "    b = torch.frobnicate(x)\n"
        "    c = torch.wibble(torch.frobnicate(x))  # torch2jax: ignore[torch.wibble]\n"
        "    d = torch.wibble(x)  # torch2jax: ignore\n"
        "    if torch.wibble(x):  # torch2jax: ignore[torch.*]\n"
        "        e = torch.frobnicate(\n"
        "            x)  # torch2jax: ignore[torch.frobnicate]\n"
        "    return a, b, c, d, e\n"
    )
    result = convert_source(src)
    left = [(d.line, d.rule) for d in result.diagnostics if d.severity == "error"]
    assert left == [(6, "torch.frobnicate"), (7, "torch.frobnicate")]
    todos = [ln.strip() for ln in result.code.splitlines() if "TODO(torch2jax)" in ln]
    assert todos == ["# TODO(torch2jax): no rule for torch.frobnicate [torch.frobnicate]"] * 2
    # the TODOs that stay sit above the lines they are about
    lines = result.code.splitlines()
    for i, ln in enumerate(lines):
        if "TODO(torch2jax)" in ln:
            assert "torch.frobnicate" in lines[i + 1]
            assert "ignore[torch.frobnicate]" not in lines[i + 1]
    # the untranslated code itself is left as it was
    assert "a = torch.frobnicate(x)  # torch2jax: ignore[torch.frobnicate]" in result.code


def test_unsuppressed_output_is_unchanged_by_the_suppression_step() -> None:
    for path in sorted((Path(__file__).resolve().parent.parent / "fixtures").rglob("*.py")):
        if "expected" in path.parts:
            continue
        from torch2jax.suppress import suppress

        result = convert_source(path.read_text(), path=str(path))
        again = suppress(result, path.read_text(), ())
        assert again is result


def _project(tmp_path: Path, table: str) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n\n" + table)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    return tmp_path / "src"


def test_pyproject_ignore_and_exclude(tmp_path: Path) -> None:
    src = _project(tmp_path, "[tool.torch2jax]\nignore = ['torch.frob*']\n"
                             "exclude = ['src/pkg/legacy.py']\ntarget = 'nnx'\n")
    (src / "pkg" / "todo.py").write_text(UNKNOWN)
    (src / "pkg" / "legacy.py").write_text(UNKNOWN)
    out = tmp_path / "out"
    report = tmp_path / "r.json"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out), "--report", str(report)])
    assert res.exit_code == 0, res.output
    assert "TODO" not in (out / "pkg" / "todo.py").read_text()
    assert not (out / "pkg" / "legacy.py").exists()
    data = json.loads(report.read_text())
    assert [Path(f["path"]).name for f in data["files"]] == ["todo.py"]
    assert data["files"][0]["diagnostics"] == []
    cfg = find_config(src / "pkg" / "todo.py")
    assert cfg.path == (tmp_path / "pyproject.toml").resolve()
    assert cfg.ignore == ("torch.frob*",)


def test_pyproject_errors_name_the_file_and_key(tmp_path: Path) -> None:
    src = _project(tmp_path, "[tool.torch2jax]\ntargett = 'nnx'\n")
    (src / "a.py").write_text(UNKNOWN)
    res = runner.invoke(app, ["convert", str(src), "--check"])
    assert res.exit_code == 2
    assert "pyproject.toml" in res.output and "targett" in res.output
    (tmp_path / "pyproject.toml").write_text("[tool.torch2jax]\ntarget = 'linen2'\n")
    res = runner.invoke(app, ["convert", str(src), "--check"])
    assert res.exit_code == 2 and "linen2" in res.output
    (tmp_path / "pyproject.toml").write_text("[tool.torch2jax]\nrules = ['missing']\n")
    res = runner.invoke(app, ["convert", str(src), "--check"])
    assert res.exit_code == 2 and "missing" in res.output and "not a folder" in res.output


GOOD_RULE = """
[[function]]
torch = "torch.frobnicate"
jax = "jnp.negative"
notes = "a user rule"
[[function.examples]]
torch = "torch.frobnicate(x)"
jax = "jnp.negative(x)"
"""


def test_user_rules_extend_the_builtin_ones(tmp_path: Path) -> None:
    rules = tmp_path / "myrules"
    rules.mkdir()
    (rules / "mine.toml").write_text(GOOD_RULE)
    src = _project(tmp_path, "[tool.torch2jax]\nrules = ['myrules']\n")
    (src / "a.py").write_text(UNKNOWN)
    out = tmp_path / "out"
    res = runner.invoke(app, ["convert", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "return jnp.negative(x)" in (out / "a.py").read_text()
    res = runner.invoke(app, ["explain", "torch.frobnicate", "--rules", str(rules)])
    assert res.exit_code == 0 and "jnp.negative" in res.stdout and "a user rule" in res.stdout
    res = runner.invoke(app, ["rules", "--rules", str(rules)])
    assert res.exit_code == 0 and "torch.frobnicate" in res.stdout
    rs = load_user_rules([rules])
    assert rs.functions["torch.frobnicate"].source.endswith("mine.toml")
    assert "torch.sum" in rs.functions  # the built-in ones are still there


@pytest.mark.parametrize("text,needle", [
    ("[[function]]\ntorch = 'torch.f'\njax = 'jnp.f'\nspecial = 'nope'\n",
     "special 'nope' is not a registered transform"),
    ("[[function]]\ntorch = 'torch.f'\n", "needs 'jax' or 'special'"),
    ("[[function]]\ntorch = 'torch.f'\njax = 'jnp.f'\ncolour = 1\n", "unknown keys ['colour']"),
    ("[[function]]\ntorch = 'numpy.f'\njax = 'jnp.f'\n", "qualified torch name"),
    ("[[function]]\ntorch = 'torch.f'\njax = 'jnp.f(1'\n", "not a dotted name"),
    ("[[funktion]]\ntorch = 'torch.f'\n", "unknown table [[funktion]]"),
    ("[[function]\n", "not valid TOML"),
    ("[[layer]]\ntorch = 'torch.f'\nnnx = 'nnx.F'\n[layer.linen]\nclass = 'nn.F'\n",
     "read from the built-in rules only"),
    ("[[layer]]\ntorch = 'torch.f'\nnnx = 'nnx.F'\n[layer.linen]\nklass = 'nn.F'\n",
     "a target table takes class"),
])
def test_bad_user_rules_name_the_file_and_rule(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_user_rules([tmp_path])
    assert needle in str(exc.value)
    assert "bad.toml" in str(exc.value)
    if "torch = " in text and "funktion" not in text and "TOML" not in needle:
        assert "'torch.f'" in str(exc.value) or "'numpy.f'" in str(exc.value)
    # the CLI turns it into a usage error with the same message
    (tmp_path / "a.py").write_text(UNKNOWN)
    res = runner.invoke(app, ["convert", str(tmp_path / "a.py"), "--check", "--rules",
                              str(tmp_path)])
    assert res.exit_code == 2 and "bad.toml" in res.output
