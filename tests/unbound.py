"""The unbound-name check that the tests run over converted code: ruff's F821 (undefined name),
independent of the converter's own check (torch2jax/finish/names.py)."""

from __future__ import annotations

import subprocess
import sys


def undefined_names(code: str, filename: str = "converted.py") -> list[str]:
    """ruff's F821 findings for ``code``, one ``line:col: message`` each."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F821",
         "--output-format", "concise", "--stdin-filename", filename, "-"],
        input=code, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed: {done.stderr}")
    return [line.split(":", 1)[1] for line in done.stdout.splitlines()
            if "F821" in line]


def assert_names_bound(code: str, filename: str = "converted.py") -> None:
    """Every name ``code`` reads is bound (no NameError waiting at run time)."""
    found = undefined_names(code, filename)
    assert not found, f"{filename}: unbound names:\n" + "\n".join(found)
