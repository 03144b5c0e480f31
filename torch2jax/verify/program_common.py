"""What the two sides of ``verify --program`` share: running a program as ``__main__`` and
stopping it after its N-th optimizer step."""

from __future__ import annotations

import runpy
import sys
import traceback
from pathlib import Path
from typing import Any


class ProgramStopped(BaseException):
    """Raised by an instrumented optimizer step once the program has taken its N steps; a
    BaseException, so that a program's ``except Exception`` does not swallow it."""


def run_program(path: str, args: list[str]) -> dict[str, Any]:
    """Run ``path`` as ``__main__`` with ``args`` (its folder first on ``sys.path``):
    ``{"stopped": it reached the N-th step, "error": the traceback of anything else it
    raised}``."""
    program = Path(path).resolve()
    sys.argv = [str(program), *args]
    sys.path.insert(0, str(program.parent))
    out: dict[str, Any] = {"stopped": False, "error": None}
    try:
        runpy.run_path(str(program), run_name="__main__")
    except ProgramStopped:
        out["stopped"] = True
    except SystemExit as exc:
        if exc.code not in (None, 0):
            out["error"] = f"the program exited with status {exc.code}"
    except Exception:  # noqa: BLE001 - the program's own failure: reported, not raised
        out["error"] = traceback.format_exc(limit=-8)
    finally:
        sys.stdout.flush()
    return out
