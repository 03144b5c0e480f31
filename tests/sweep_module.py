"""benchmarks/transformers_sweep.py loaded once as a module (it is a script, not part of the
package), and the sweep's fitting config of a family asserted to run in torch: shared by the
harness's tests."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load():
    if "transformers_sweep" in sys.modules:
        return sys.modules["transformers_sweep"]
    spec = importlib.util.spec_from_file_location("transformers_sweep",
                                                  ROOT / "benchmarks" / "transformers_sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["transformers_sweep"] = module
    spec.loader.exec_module(module)
    return module


sweep = _load()


def fit(module: str, cls_name: str):
    """The sweep's fitting config of ``cls_name`` (of ``transformers.models.<module>``), and its
    inputs, asserted to build and run in torch."""
    cls = getattr(importlib.import_module(f"transformers.models.{module}"), cls_name)
    config, kwargs, specs, masked = sweep.fitting_config(cls, cls.config_class)
    assert sweep._probe(cls, config, specs, masked) == ""
    return config, kwargs, specs
