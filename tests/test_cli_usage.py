"""What a newcomer trips on (issue 33): a path that does not exist, the verify extra not
installed, option help that rich's markup cut short, and what a command imports at start-up
(a structural check: the times are measured by benchmarks/startup.py, not here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from torch2jax.cli import app

ROOT = Path(__file__).resolve().parent.parent
TORCH_MODELS = ROOT / "tests" / "data" / "verify" / "torch" / "models.py"
runner = CliRunner()


def _env() -> dict[str, str]:
    """This checkout first on the path of a child process (whatever is installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.parametrize("args", [
    ["check", "{missing}"],
    ["check", "{existing}", "{missing}"],
    ["convert", "{missing}", "--diff"],
    ["convert", "{existing}", "--diff", "--report", "{missing}/report.json"],
    ["verify", "{missing}::MLP", "--input", "float32[2,3]"],
    ["verify", "--cases", "{missing}"],
    ["verify", f"{TORCH_MODELS}::MLP", "--input", "float32[2,3]", "--converted", "{missing}"],
    ["weights", "{missing}", "--model", "m.py::M", "--out", "{tmp}/ckpt"],
], ids=["check", "check-one-of-two", "convert", "convert-report", "verify", "verify-cases",
        "verify-converted", "weights"])
def test_a_path_that_does_not_exist_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    """Exit 2 naming the path, before anything is read or written (on main, `check` exited 0
    in silence, a pre-commit hook with a wrong path passing forever)."""
    missing = tmp_path / "no_such_dir" / "gone.py"
    existing = tmp_path / "plain.py"
    existing.write_text("def f():\n    return 1\n")
    args = [a.format(missing=missing, existing=existing, tmp=tmp_path) for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "gone.py" in result.output or "no_such_dir" in result.output, result.output
    assert "no such file" in result.output or "does not exist" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.py"]


def test_a_cases_file_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    """A bad --cases file: one line and exit 2 (on main: a traceback and exit 1, which the
    README defines as "not equivalent")."""
    bad = tmp_path / "cases.toml"
    bad.write_text("[project]\nname = 'x'\n")
    result = runner.invoke(app, ["verify", "--cases", str(bad)])
    assert result.exit_code == 2 and "unknown tables" in result.output, result.output


# the verify extra made unimportable in a child process, as after `pip install -e .` alone
NO_EXTRA = ("import sys; sys.modules.update(dict.fromkeys(['numpy', 'torch', 'jax', 'flax', "
            "'optax', 'equinox', 'orbax', 'safetensors'])); "
            "from torch2jax.cli import app; sys.argv[0] = 'torch2jax'; app()")


@pytest.mark.parametrize("args", [
    ["verify", f"{TORCH_MODELS}::MLP", "--input", "float32[2,3]"],
    ["verify", f"{TORCH_MODELS}::MLP", "--input", "float32[2,3]", "--target", "equinox"],
    ["verify", "--cases", str(ROOT / "fixtures" / "cases.toml")],
    ["weights", str(TORCH_MODELS), "--model", "m.py::M", "--torch-model", "t.py::M",
     "--out", "OUT"],
], ids=["verify", "verify-equinox", "verify-cases", "weights"])
def test_without_the_verify_extra_says_what_to_install(tmp_path: Path, args: list[str]) -> None:
    args = [str(tmp_path / "ckpt") if a == "OUT" else a for a in args]
    proc = subprocess.run([sys.executable, "-c", NO_EXTRA, *args], capture_output=True,
                          text=True, env=_env(), cwd=tmp_path, timeout=120, check=False)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "pip install -e '.[verify]'" in proc.stderr, proc.stderr
    assert "numpy" in proc.stderr.split("pip install")[0]
    assert not (tmp_path / "ckpt").exists()


def test_the_converter_runs_without_the_verify_extra(tmp_path: Path) -> None:
    """convert and check do not need it."""
    src = tmp_path / "m.py"
    src.write_text("import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n")
    for args in (["convert", str(src), "--diff"], ["check", str(src)]):
        proc = subprocess.run([sys.executable, "-c", NO_EXTRA, *args], capture_output=True,
                              text=True, env=_env(), cwd=tmp_path, timeout=120, check=False)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    assert "jnp.sum(x, axis=1)" in proc.stdout or "would convert" in proc.stderr


def _modules_after(args: list[str], cwd: Path) -> set[str]:
    """The modules a fresh ``torch2jax ARGS`` process has imported when it exits."""
    code = ("import sys, atexit\n"
            "atexit.register(lambda: print('\\nMODULES ' + ' '.join(sorted(sys.modules))))\n"
            "from torch2jax.cli import app\nsys.argv[0] = 'torch2jax'\napp()\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=_env(), cwd=cwd, timeout=120, check=False)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("MODULES "))
    return set(line.split()[1:])


HEAVY = {"numpy", "torch", "jax", "flax", "libcst", "torch2jax.verify", "torch2jax.convert",
         "torch2jax.targets", "torch2jax.passes", "torch2jax.analysis.walk"}


def test_help_imports_neither_the_engine_nor_the_converter(tmp_path: Path) -> None:
    loaded = _modules_after(["--help"], tmp_path)
    assert "torch2jax.cli" in loaded
    assert not loaded & (HEAVY | {"torch2jax.engine", "torch2jax.config", "pathspec"})


def test_check_imports_no_converter(tmp_path: Path) -> None:
    """`check` answers from the imports (Python's parser): neither libcst nor the rewriter,
    the verifier or numpy is loaded."""
    src = tmp_path / "m.py"
    src.write_text("import torch\n\n\ndef f(x):\n    return torch.sum(x, dim=1)\n")
    loaded = _modules_after(["check", str(src)], tmp_path)
    assert "torch2jax.engine" in loaded
    assert not loaded & HEAVY, sorted(loaded & HEAVY)


def test_option_help_keeps_its_brackets() -> None:
    """Help text is rendered with rich markup, which took "[tool.torch2jax]" for a style tag
    and dropped it ("default: target, else nnx"): every help text, as shown, says what it says
    in the source."""
    import typer.main
    from rich.text import Text

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            assert Text.from_markup(text).plain == text.replace("\\[", "["), (name, text)
    result = runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "200"})
    assert "the target setting of [tool.torch2jax] in the pyproject.toml" in result.output
    assert "the shard setting of [tool.torch2jax]" in result.output


def test_the_target_names_known_without_importing_the_targets_are_the_targets() -> None:
    from torch2jax.cli import KNOWN_TARGETS
    from torch2jax.targets import TARGETS

    assert sorted(KNOWN_TARGETS) == sorted(TARGETS)


def test_python_m_torch2jax_cli_runs_the_command_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "torch2jax.cli", "check", "gone.py"],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "gone.py: no such file or folder" in proc.stderr
