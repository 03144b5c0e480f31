"""The direction of imports inside torch2jax (issue 18).

The contracts in pyproject.toml's ``[tool.importlinter]``: no cycle between the subpackages of a
package (with the package-level edges still to remove listed there), the converter never imports
the verifier, and the converter imports neither torch nor JAX nor their libraries, not even
inside a function (they are the verifier's and the tests' dependencies, not the rewriter's).
Beside them, a finer check than import-linter's: no module imports, directly or through others,
a module that imports it back, counting the imports inside functions too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    # (in a process of its own: import-linter prints through a console it keeps)
    script = ("import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports("
              "config_filename='pyproject.toml', no_cache=True, no_logo=True))")
    run = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 kept, 0 broken" in run.stdout, run.stdout


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_strongly_connected_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    graph = grimp.build_graph("torch2jax", cache_dir=None)
    modules = graph.modules
    # a package's __init__ is its own node; "from torch2jax.verify import run" imports the
    # submodule, which grimp records as such
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in modules}
             for m in modules}
    assert strongly_connected(edges) == []
