"""The fixture and other-style models are real PyTorch programs: each case in a cases.toml
builds, runs forward on inputs of its spec, gives the expected output shape, and backpropagates.

These tests need only torch; they guard the inputs of the conversion and verification tests.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
CASE_FILES = [
    ROOT / "fixtures" / "cases.toml",
    ROOT / "tests" / "data" / "other_styles" / "cases.toml",
]

# Output shape of each case's forward pass on its declared inputs.
EXPECTED_SHAPES: dict[str, tuple[int, ...]] = {
    "mlp": (4, 10),
    "cnn": (4, 10),
    "cnn_train_mode": (4, 10),
    "gpt": (2, 16, 128),
    "resnet_tiny": (2, 10),
    "densenet_tiny": (2, 10),
    "mixer_tiny": (2, 10),
    "signal_conv1d": (2, 4),
    "batch_stats_only": (4, 3),
    "factory_init": (2, 5),
}

SPEC = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<shape>[0-9,\s]*)\](?::(?P<high>\d+))?$")


def load_cases() -> list[tuple[Path, dict[str, Any]]]:
    cases = []
    for toml_path in CASE_FILES:
        with toml_path.open("rb") as f:
            for case in tomllib.load(f)["case"]:
                cases.append((toml_path, case))
    return cases


CASES = load_cases()


def import_file(path: Path) -> ModuleType:
    # Registered in sys.modules before executing, as a normal import would be (dataclasses
    # and pickling look a class's module up there).
    name = f"_torch2jax_fixture_{path.stem}_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def build_model(toml_path: Path, case: dict[str, Any]) -> torch.nn.Module:
    file_part, class_name = case["target"].split("::")
    module = import_file(toml_path.parent / file_part)
    if "build" in case:
        return eval(case["build"], vars(module))
    return getattr(module, class_name)(**case.get("args", {}))


def make_input(spec: str, generator: torch.Generator) -> torch.Tensor:
    match = SPEC.match(spec.replace(" ", ""))
    assert match, f"bad input spec {spec!r}"
    dtype = getattr(torch, match["dtype"])
    shape = tuple(int(d) for d in match["shape"].split(",") if d)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    high = int(match["high"]) if match["high"] else 2
    return torch.randint(0, high, shape, generator=generator, dtype=dtype)


@pytest.mark.parametrize(("toml_path", "case"), CASES, ids=[c["name"] for _, c in CASES])
def test_case_is_well_formed(toml_path: Path, case: dict[str, Any]) -> None:
    assert {"name", "target", "inputs"} <= case.keys()
    assert ("args" in case) != ("build" in case), "give exactly one of args / build"
    file_part, class_name = case["target"].split("::")
    assert (toml_path.parent / file_part).is_file()
    assert isinstance(getattr(import_file(toml_path.parent / file_part), class_name), type)
    for spec in case["inputs"]:
        assert SPEC.match(spec.replace(" ", "")), spec
    assert case["name"] in EXPECTED_SHAPES


@pytest.mark.parametrize(("toml_path", "case"), CASES, ids=[c["name"] for _, c in CASES])
def test_case_runs_in_torch(toml_path: Path, case: dict[str, Any]) -> None:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = build_model(toml_path, case)
    assert isinstance(model, torch.nn.Module)
    inputs = [make_input(spec, generator) for spec in case["inputs"]]

    model.train()
    out = model(*inputs)
    assert tuple(out.shape) == EXPECTED_SHAPES[case["name"]]
    assert torch.isfinite(out).all()
    if case.get("grad", False):
        out.float().square().mean().backward()
        for name, param in model.named_parameters():
            assert param.grad is not None, f"no gradient reached {name}"
            assert torch.isfinite(param.grad).all(), name

    model.eval()
    with torch.no_grad():
        out_eval = model(*inputs)
    assert tuple(out_eval.shape) == EXPECTED_SHAPES[case["name"]]


def test_gpt_ties_embedding_and_head() -> None:
    gpt = import_file(ROOT / "fixtures" / "models" / "gpt.py")
    model = gpt.GPT(gpt.GPTConfig())
    assert model.transformer.wte.weight is model.lm_head.weight
    assert "transformer.h.0.attn.bias" in model.state_dict()  # the causal mask is a buffer
