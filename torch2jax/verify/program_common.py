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


# --- batches at the loader boundary ---------------------------------------------------------
def batch_leaves(value: Any) -> list[Any]:
    """The leaves of a batch (lists, tuples and dicts, a dict's keys sorted, as jax's tree
    functions order them), in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in batch_leaves(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in batch_leaves(value[k])]
    return [value]


def rebuild_batch(value: Any, leaves: list[Any]) -> Any:
    """``value`` with its leaves (``batch_leaves``' order) taken from ``leaves``."""
    it = iter(leaves)

    def build(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            items = [build(x) for x in v]
            return type(v)(*items) if hasattr(v, "_fields") else type(v)(items)
        if isinstance(v, dict):
            new = {k: build(v[k]) for k in sorted(v)}
            return type(v)((k, new[k]) for k in v)
        return next(it)

    return build(value)


def wrap_iter(cls: type, on_batch: Any, guard: list[bool]) -> None:
    """``cls.__iter__`` yields what ``on_batch(batch)`` makes of each batch, when the iteration
    is the program's own (``guard[0]`` is set while a loader's own machinery runs, so that a
    loader iterating its parents is one loader)."""
    original = cls.__dict__["__iter__"]

    def __iter__(self: Any) -> Any:
        if guard[0]:
            return original(self)
        guard[0] = True
        try:
            inner = original(self)
        finally:
            guard[0] = False
        return _observed(inner, on_batch, guard)

    cls.__iter__ = __iter__  # type: ignore[method-assign]


def _observed(inner: Any, on_batch: Any, guard: list[bool]) -> Any:
    while True:
        guard[0] = True
        try:
            batch = next(inner)
        except StopIteration:
            return
        finally:
            guard[0] = False
        yield on_batch(batch)


# --- seeds ------------------------------------------------------------------------------------
class SeedLog:
    """The integer seeds the program's own code (a file under ``folder``, not an installed
    package there) passes to seeding functions, each as ``(call, value, step)``: ``step`` is the optimizer step it precedes."""

    def __init__(self, folder: Path, step: Any) -> None:
        self.folder, self.step = str(folder.resolve()), step
        self.calls: list[tuple[str, int, int]] = []
        self.sources: list[tuple[str, int, int]] = []  # (patch_method's)

    def note(self, label: str, values: list[Any], depth: int = 2) -> None:
        """Record the integers of ``values`` when the call ``depth`` frames up is the
        program's own."""
        caller = sys._getframe(depth).f_code.co_filename
        if caller.startswith(self.folder) and not any(
                part in caller for part in ("site-packages", "dist-packages")):
            for v in values:
                if isinstance(v, int) and not isinstance(v, bool):
                    self.calls.append((label, int(v), self.step()))

    def patch(self, owner: Any, attr: str, label: str) -> None:
        """``owner.attr(seed, ...)``'s seed (its first argument, or ``seed=``)."""
        original = getattr(owner, attr, None)
        if original is None:
            return
        log = self

        def seeded(*args: Any, **kwargs: Any) -> Any:
            log.note(label, list(args[:1]) or [kwargs.get("seed")])
            return original(*args, **kwargs)

        setattr(owner, attr, seeded)

    def patch_common(self) -> None:
        """The seeding functions both sides share: Python's and numpy's."""
        import random

        import numpy as np

        self.patch(random, "seed", "random.seed")
        self.patch(np.random, "seed", "np.random.seed")
        self.patch(np.random, "default_rng", "np.random.default_rng")

    def patch_method(self, owner: type, attr: str, label: str) -> None:
        """``obj.attr(seed, ...)``'s seed (its first argument after the object, or
        ``seed=``), recorded apart in ``sources``: grain's ``shuffle(seed=...)`` is where the
        converted program puts the seed of a torch Generator given to a loader or a split."""
        original = owner.__dict__.get(attr)
        if original is None:
            return
        log = self

        def seeded(this: Any, *args: Any, **kwargs: Any) -> Any:
            calls = log.calls
            log.calls = log.sources
            try:
                log.note(label, list(args[:1]) or [kwargs.get("seed")])
            finally:
                log.calls = calls
            return original(this, *args, **kwargs)

        setattr(owner, attr, seeded)

    def patch_init(self, cls: type, label: str) -> None:
        """``cls(...)``'s integer arguments (a class: its ``__init__`` is wrapped, so that
        ``isinstance`` still holds)."""
        original = cls.__init__
        log = self

        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            log.note(label, [*args, *kwargs.values()])
            original(this, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[method-assign]


# --- draws outside the model's forward ------------------------------------------------------
PROGRAM_DRAW_ELEMENTS = 2_000_000  # the program draws recorded, in elements at most


def in_constructor(module_class: Any) -> bool:
    """Whether the caller runs inside the ``__init__`` of a ``module_class`` instance (a
    layer's initialiser draws there, with torch's ``normal_`` on one side and flax's
    initialisers on the other: those draws are not the program's)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"),
                                                             module_class):
            return True
        frame = frame.f_back
    return False


def randint_kind(low: Any, high: Any) -> str:
    """A randint draw's kind with its bounds: replayed only by a draw between the same ones
    (torch's values between other bounds would hide a translation's wrong bounds)."""
    try:
        return f"randint [{int(low)}, {int(high)})"
    except (TypeError, ValueError):
        return "randint between bounds not known"
