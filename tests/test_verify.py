"""The verifier: right conversions pass with float32-noise differences, wrong ones fail.

Conversions are the hand-written files in tests/data/verify/nnx/ (``converted=``), so these
tests check the verifier itself whatever state the converter is in; one test at the end runs
the real converter end to end.
"""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from rich.console import Console

from torch2jax.report import Diagnostic
from torch2jax.verify import LoadError, load_module, parse_spec, split_target, verify
from torch2jax.verify.cases import (
    CaseError,
    cases_exit_code,
    load_cases,
    print_cases_summary,
    run_cases,
)
from torch2jax.verify.common import compare_arrays
from torch2jax.verify.run import local_imports, randomise_for_verification

DATA = Path(__file__).parent / "data" / "verify"
TORCH = DATA / "torch" / "models.py"
RIGHT = str(DATA / "nnx" / "models.py")
WRONG = str(DATA / "nnx" / "wrong.py")

# name -> (build expression or None, inputs)
MODELS = {
    "MLP": (None, ["float32[4,8]"]),
    "ConvNet": (None, ["float32[2,3,8,8]"]),
    "Blocks": (None, ["float32[3,8]"]),
    "SeqConv": (None, ["float32[2,4,10]"]),
    "TinyLM": ("TinyLM(LMConfig(vocab=50, dim=16))", ["int64[2,7]:50"]),
    "UsesSubclass": (None, ["float32[2,6]"]),
}


def _verify(name: str, converted: str, **kwargs):
    build, inputs = MODELS[name]
    return verify(f"{TORCH}::{name}", build=build, inputs=inputs, converted=converted, **kwargs)


@pytest.fixture(scope="module")
def right():
    return {name: _verify(name, RIGHT, grad=True) for name in MODELS}


@pytest.fixture(scope="module")
def wrong():
    return {name: _verify(name, WRONG, grad=True) for name in MODELS}


# --- input specs ------------------------------------------------------------------------------


def test_specs_parse():
    s = parse_spec("float32[2,3,32,32]")
    assert (s.dtype, s.shape, s.high) == ("float32", (2, 3, 32, 32), None)
    s = parse_spec(" int64[2, 16]:100 ")
    assert (s.dtype, s.shape, s.high, str(s)) == ("int64", (2, 16), 100, "int64[2,16]:100")
    assert parse_spec("float[]").shape == ()
    assert parse_spec("bool[3]").sample(np.random.default_rng(0)).dtype == np.bool_


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("float32(2,3)", "expected DTYPE"),
        ("complex64[2]", "unknown dtype"),
        ("float32[2,x]", "non-negative integers"),
        ("float32[2]:5", "only integer inputs"),
        ("int64[2,16]", "exclusive upper bound"),
        ("int64[2]:0", "positive integer"),
        ("uint8[2]:300", "does not fit uint8"),
    ],
)
def test_bad_specs_say_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_spec(text)


def test_int_samples_stay_below_the_bound_and_repeat_with_the_seed():
    spec = parse_spec("int64[1000]:7")
    a = spec.sample(np.random.default_rng(3))
    assert a.dtype == np.int64 and a.min() >= 0 and a.max() == 6
    np.testing.assert_array_equal(a, spec.sample(np.random.default_rng(3)))


# --- loading ----------------------------------------------------------------------------------


def test_targets_split():
    assert split_target("a/b.py::Net") == (Path("a/b.py"), "Net")
    for bad in ("a/b.py", "a/b.py::", "::Net", "a.py::not-a-name"):
        with pytest.raises(LoadError, match=r"FILE\.py::Name"):
            split_target(bad)


def test_siblings_of_the_torch_and_the_jax_file_do_not_mix():
    # each models.py asserts that `config` is its own sibling (BACKEND torch / jax)
    t = load_module(TORCH)
    j = load_module(RIGHT)
    assert t.LMConfig is not j.LMConfig
    assert "config" not in sys.modules


def test_local_imports_find_sibling_files():
    found = local_imports((DATA / "torch" / "e2e.py").read_text(), DATA / "torch")
    assert found == [DATA / "torch" / "config.py"]


# --- comparison -------------------------------------------------------------------------------


def test_compare_arrays_definitions():
    d = compare_arrays(np.array([1.0, 2.0, -np.inf]), np.array([1.0, 2.1, -np.inf]), 1e-5, 1e-4)
    assert not d.ok and math.isclose(d.abs, 0.1) and math.isclose(d.rel, 0.1 / 2.1)
    assert "index (1,)" in d.worst
    both_nan = compare_arrays(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 1e-5, 1e-4)
    assert both_nan.ok and both_nan.abs == 0.0
    one_nan = compare_arrays(np.array([np.nan]), np.array([1.0]), 1e-5, 1e-4)
    assert not one_nan.ok and one_nan.abs == math.inf
    noise = compare_arrays(np.array([7e-8]), np.array([5e-8]), 1e-5, 1e-4)
    assert noise.ok and math.isclose(noise.rel, 2e-8 / 1e-5)  # relative to atol, not to 5e-8
    shape = compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)), 1e-5, 1e-4)
    assert not shape.ok and not shape.comparable
    # atol + rtol * |torch|, element-wise
    assert compare_arrays(np.array([100.009]), np.array([100.0]), 1e-5, 1e-4).ok
    assert not compare_arrays(np.array([100.02]), np.array([100.0]), 1e-5, 1e-4).ok


def test_randomise_touches_statistics_and_constant_parameters_only():
    torch.manual_seed(0)
    model = load_module(TORCH).ConvNet()
    conv_before = model.conv.weight.detach().clone()
    notes = randomise_for_verification(model, seed=0)
    assert not torch.all(model.bn.running_mean == 0)
    assert torch.all((model.bn.running_var >= 0.5) & (model.bn.running_var <= 1.5))
    assert model.bn.weight.std() > 0 and model.bn.bias.std() > 0
    assert torch.equal(model.conv.weight, conv_before)
    assert notes == [
        "randomised the running statistics of 1 normalisation layers",
        "perturbed 2 constant-initialised parameters",
    ]


# --- right conversions pass -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_right_conversions_pass_forward_and_gradient(right, name):
    r = right[name]
    assert r.error is None and r.mismatch is None, (r.error, r.mismatch)
    assert r.passed
    assert r.max_abs_diff < 1e-5 and r.max_rel_diff < 1e-6
    assert r.grad_max_abs_diff is not None and r.grad_max_rel_diff < 1e-5
    assert (r.target, r.mode, r.device, r.dtype) == ("nnx", "eval", jax.default_backend(), "float32")
    assert any(c.startswith("grad ") for c in r.compared)


def test_the_report_says_what_was_compared(right):
    r = right["TinyLM"]
    assert r.compared == [
        "input[0] int64[2,7]:50",
        "output[0] float32[2,7,50]",
        "output[1] None",
        "grad wte.weight -> wte.embedding (as_is)",
        "grad ln.weight -> ln.scale (as_is)",
        "grad ln.bias -> ln.bias (as_is)",
    ]
    assert "3 tensors transferred, 1 tied" in r.notes
    assert right["Blocks"].compared[1:3] == ["output['a'] float32[3,2]", "output['b'] float32[3,3]"]
    data = json.loads(json.dumps(r.to_json()))
    for key in ("passed", "max_abs_diff", "max_rel_diff", "target", "device", "grad_max_abs_diff"):
        assert key in data


# --- wrong conversions fail -------------------------------------------------------------------


def test_gelu_approximation_is_caught(right, wrong):
    r = wrong["MLP"]
    assert r.error is None and not r.passed
    # the forward difference is far above float32 noise even where the tolerance lets it by;
    # the gradient check is what rejects it
    assert r.max_abs_diff > 100 * right["MLP"].max_abs_diff
    assert r.mismatch.startswith("grad ")


def test_flattening_channels_last_is_caught(wrong):
    r = wrong["ConvNet"]
    assert r.error is None and not r.passed and r.max_abs_diff > 0.1
    assert r.mismatch.startswith("output: at index")
    # the float64 pass differs too: not rounding (docs/verification.md)
    assert [(p.dtype, p.passed) for p in r.passes] == [("float32", False), ("float64", False)]
    assert any("float64 differs as well" in n for n in r.notes)
    r = _verify("ConvNet", WRONG, grad=False, float64=False)
    assert any("--no-float64" in n for n in r.notes)  # float32 only: points to the check


def test_layernorm_epsilon_default_is_caught(wrong):
    r = wrong["Blocks"]
    assert r.error is None and not r.passed and r.max_rel_diff > 1e-3
    assert r.mismatch.startswith("output['a']")


def test_a_gradient_only_bug_is_caught(right, wrong):
    r = wrong["TinyLM"]
    assert r.max_abs_diff == right["TinyLM"].max_abs_diff  # the forward pass is right
    assert not r.passed and r.mismatch.startswith("grad wte.weight")
    assert verify(
        f"{TORCH}::TinyLM", build=MODELS["TinyLM"][0], inputs=MODELS["TinyLM"][1], converted=WRONG,
        grad=False,
    ).passed  # with --no-grad the bug is invisible: that is why gradients are the default


def test_an_output_of_another_shape_fails_without_gradients(wrong):
    r = wrong["UsesSubclass"]
    assert r.error is None and not r.passed and r.max_abs_diff == math.inf
    assert "shape (2, 2) vs torch (2, 3)" in r.mismatch
    assert r.grad_max_abs_diff is None
    assert any("gradients not compared" in n for n in r.notes)
    assert r.float64_skipped == "the outputs differ in structure, shape or finiteness"
    assert r.to_json()["max_abs_diff"] == "inf"


def test_a_conversion_whose_weights_do_not_fit_cannot_run(wrong):
    r = wrong["SeqConv"]
    assert not r.passed and "NNX parameter conv.bias receives no torch tensor" in r.error


def test_the_rules_given_are_the_rules_used():
    from torch2jax.ruleset import load_rules, parse_rule_text

    rules = load_rules()
    rules.merge(
        parse_rule_text(
            '[[layer]]\ntorch = "torch.nn.Linear"\nnnx = "nnx.Linear"\n'
            'weights = { weight = { to = "kernel", layout = "as_is" }, bias = "bias" }\n',
            "as_is.toml",
        )
    )
    inputs = MODELS["Blocks"][1]
    r = verify(f"{TORCH}::Blocks", inputs=inputs, converted=RIGHT, rules=rules)
    assert "heads.a.weight: shape (2, 8) (after 'as_is': (2, 8)) does not fit" in r.error
    assert verify(f"{TORCH}::Blocks", inputs=inputs, converted=RIGHT).passed


# --- could not run ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"target": "nope/missing.py::Net"}, "no such file"),
        ({"target": f"{TORCH}::Missing"}, "has no 'Missing'; it defines Blocks, ConvNet"),
        ({"inputs": ["float32[4,8"]}, "bad input spec"),
        ({"inputs": []}, "no inputs"),
        ({"jax_target": "haiku"}, "verify supports nnx, linen, equinox"),
        ({"args": {}, "build": "MLP()"}, "not both"),
        ({"build": "MLP"}, "must be a call"),
        ({"build": "MLP("}, "not a Python expression"),
        ({"converted": "nope/converted.py"}, "no such file (--converted)"),
        ({"inputs": ["float32[4,9]"]}, "the torch forward pass failed: RuntimeError"),
        ({"args": {"d_inn": 3}}, "building the torch model failed: TypeError"),
        ({"device": "tpu"}, "--device tpu: not available"),
    ],
)
def test_what_prevents_running_is_an_error(kwargs, error):
    call = {"target": f"{TORCH}::MLP", "inputs": ["float32[4,8]"], "converted": RIGHT, **kwargs}
    r = verify(call.pop("target"), **call)
    assert r.error is not None and error in r.error, r.error
    assert not r.passed


def test_device_cpu_and_args(right):
    r = verify(f"{TORCH}::MLP", args={"hidden": 5}, inputs=["float32[2,8]"], converted=RIGHT,
               device="cpu")  # fmt: skip
    assert r.passed and r.device == "cpu"


# --- converting on the fly --------------------------------------------------------------------


def test_without_converted_the_converter_output_is_run(monkeypatch):
    """The converter is replaced by one that returns the hand-written conversion, to check the
    plumbing (temporary tree, TODO count) independently of the converter's progress."""
    calls = []

    def convert_source(source, *, path, target, rules=None, public=None):
        calls.append(Path(path).name)
        name = Path(path).name
        code = Path(RIGHT).read_text() if name == "models.py" else (DATA / "nnx" / name).read_text()
        diags = [Diagnostic(path, 1, 0, "x", "error", "stub")] if name == "models.py" else []
        return types.SimpleNamespace(code=code, diagnostics=diags)

    stub = types.ModuleType("torch2jax.convert")
    stub.convert_source = convert_source
    monkeypatch.setitem(sys.modules, "torch2jax.convert", stub)
    r = verify(f"{TORCH}::ConvNet", inputs=["float32[2,3,8,8]"])
    assert r.passed and r.todos == 1
    assert sorted(calls) == ["config.py", "models.py"]  # the sibling is converted too


def test_a_missing_converter_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch2jax.convert", None)
    r = verify(f"{TORCH}::MLP", inputs=["float32[4,8]"])
    assert "the converter is not available" in r.error


def test_the_real_converter_end_to_end():
    pytest.importorskip("torch2jax.convert")
    target = DATA / "torch" / "e2e.py"
    r = verify(f"{target}::TinyLM", build="TinyLM(LMConfig())", inputs=["int64[2,5]:50"],
               grad=True)  # fmt: skip
    assert r.passed and r.todos == 0, (r.error, r.mismatch)
    r = verify(f"{target}::ConvNet", inputs=["float32[2,3,8,8]"], grad=True)
    assert r.passed, (r.error, r.mismatch)


# --- cases files ------------------------------------------------------------------------------


def test_cases_run_and_summarise():
    results = run_cases(DATA / "cases.toml")
    assert [(r.name, r.passed) for r in results] == [
        ("mlp", True),
        ("tiny-lm", True),
        ("convnet-wrong", False),
    ]
    assert results[0].grad_max_abs_diff is not None and results[1].grad_max_abs_diff is None
    console = Console(record=True, width=200)
    print_cases_summary(results, console)
    text = console.export_text()
    assert "3 cases: 2 passed, 1 failed, 0 could not run" in text
    assert cases_exit_code(results) == 1
    assert cases_exit_code(results[:2]) == 0
    assert [r.name for r in run_cases(DATA / "cases.toml", names=["mlp"])] == ["mlp"]


def test_bad_cases_files_say_why(tmp_path):
    bad = tmp_path / "cases.toml"
    bad.write_text('[[case]]\nname = "x"\ntarget = "a.py::A"\ninput = ["float32[2]"]\n')
    with pytest.raises(CaseError, match=r"'x': unknown keys \['input'\]"):
        load_cases(bad)
    bad.write_text('[[case]]\nname = "x"\n')
    with pytest.raises(CaseError, match="missing 'target'"):
        load_cases(bad)
    bad.write_text('[[case]]\nname = "x"\ntarget = "a.py::A"\n' * 2)
    with pytest.raises(CaseError, match="used twice"):
        load_cases(bad)
    missing = run_cases_error(tmp_path)
    assert missing == 2


def run_cases_error(tmp_path: Path) -> int:
    cases = tmp_path / "missing.toml"
    cases.write_text('[[case]]\nname = "gone"\ntarget = "gone.py::A"\ninputs = ["float32[2]"]\n')
    results = run_cases(cases)
    assert "no such file" in results[0].error
    return cases_exit_code(results)


# --- the terminal table -----------------------------------------------------------------------

CONV_BN = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBN(nn.Module):
    """A conv whose bias feeds a BatchNorm: in training mode the batch mean cancels the bias,
    so its true gradient is zero and torch's and JAX's are rounding noise."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.flatten(F.relu(self.bn(self.conv(x))), 1))
'''


@pytest.fixture(scope="module")
def conv_bn(tmp_path_factory):
    path = tmp_path_factory.mktemp("convbn") / "convbn.py"
    path.write_text(CONV_BN)
    return path, verify(f"{path}::ConvBN", inputs=["float32[4,3,6,6]"], train_mode=True)


def test_a_gradient_that_is_zero_up_to_rounding_is_explained(conv_bn):
    """A train-mode pass whose old gradient relative figure read 0.1 and more: the figure is
    now taken against the model's largest gradient, and the parameter is named with why."""
    _, r = conv_bn
    assert r.passed, (r.error, r.mismatch)
    f32, f64 = r.passes
    assert f32.grad_max_rel_diff < 1e-5 and f64.grad_max_rel_diff < 1e-13, (f32, f64)
    [note] = [n for n in r.notes if n.startswith("grad rel: ")]
    assert "conv.bias" in note and "zero up to float32 rounding" in note, note
    assert "BatchNorm" in note


def _assert_fits_and_states(text: str, r) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n" + text
    assert f"nnx on {r.device}" in lines[0]  # target and device in the title
    header = next(line for line in lines if line.startswith("case"))
    for column in ("mode", "dtype", "result", "out rel", "grad rel", "atol", "rtol"):
        assert column in header, header
    rows = [line for line in lines if "float32" in line or "float64" in line]
    assert "train" in rows[0] and "pass" in rows[0] and "1e-05" in rows[0] and "1e-04" in rows[0]
    assert "float64" in rows[1] and rows[1].count("1e-10") == 2, rows[1]
    assert "1 case: 1 passed, 0 failed, 0 could not run" in text  # singular


def test_the_table_fits_80_columns_and_states_the_settings(conv_bn):
    _, r = conv_bn
    console = Console(record=True, width=80)
    print_cases_summary([r], console)
    text = console.export_text()
    _assert_fits_and_states(text, r)
    assert "convbn.py::ConvBN: grad rel: 1 parameter(s)" in text.replace("\n", " ")
    assert "running statistics: rel" in text


def test_the_command_prints_the_table_in_80_columns(conv_bn):
    """The command itself, in a terminal of 80 columns (COLUMNS=80)."""
    import os
    import subprocess

    path, r = conv_bn
    cli = Path(sys.executable).with_name("torch2jax")
    out = subprocess.run([str(cli), "verify", f"{path}::ConvBN", "--input", "float32[4,3,6,6]",
                          "--train-mode"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80"}, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    _assert_fits_and_states(out.stdout, r)


# --- --build with the file's helper functions -------------------------------------------------

VGG = '''
import torch
import torch.nn as nn

CFG = [4, "M", 8, "M"]


def make_layers(cfg, batch_norm=False):
    layers = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            conv = nn.Conv2d(in_channels, v, kernel_size=3, padding=1)
            if batch_norm:
                layers += [conv, nn.BatchNorm2d(v), nn.ReLU(inplace=True)]
            else:
                layers += [conv, nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


class VGG(nn.Module):
    def __init__(self, features, num_classes=5):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d((2, 2))
        self.classifier = nn.Sequential(
            nn.Linear(8 * 2 * 2, 16), nn.ReLU(True), nn.Linear(16, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)
'''


def test_build_calls_helpers_that_the_conversion_gave_rngs(tmp_path):
    """``VGG(make_layers(cfg, batch_norm=True))``: the converted make_layers takes
    ``*, rngs``; the JAX side evaluates the expression with the helper receiving one."""
    path = tmp_path / "vgg.py"
    path.write_text(VGG)
    r = verify(f"{path}::VGG", build="VGG(make_layers(CFG, batch_norm=True))",
               inputs=["float32[2,3,8,8]"], float64=False)
    assert r.error is None and r.passed, (r.error, r.mismatch)
    assert r.grad_max_rel_diff < 1e-5
    assert "16 tensors transferred" in " ".join(r.notes), r.notes  # make_layers' too


def test_a_forward_that_cannot_be_traced_in_float64_is_an_error(tmp_path):
    """The float64 pass traces the JAX forward before running it (check_float64): a forward
    that cannot be traced (a Python int of a traced value) was a raw traceback out of verify
    (timm's deit in the sweep's float64-only pass); it is the case's error, naming the stage."""
    source = ("import torch\nimport torch.nn as nn\n\n\nclass M(nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n"
              "        self.fc = nn.Linear(4, 4)\n\n    def forward(self, x):\n"
              "        n = int(x.sum() > 0)\n        return self.fc(x) * n\n")
    (tmp_path / "traced.py").write_text(source)
    r = verify(f"{tmp_path / 'traced.py'}::M", inputs=["float32[2,4]"], float64=True)
    assert not r.passed and r.error is not None
    assert "the JAX forward pass traced in float64 failed: ConcretizationTypeError" in r.error


def test_float64_pass_makes_undtyped_floats_float64_on_both_sides(tmp_path):
    """A float made without a dtype (the sinusoidal time embedding of denoising-diffusion:
    ``torch.arange(n) * -emb``) is torch's default float type, and JAX's under x64: the
    float64 pass sets torch's to float64 as jax.enable_x64 sets JAX's. Torch computed it in
    float32 there, and the float64 pass failed a right translation."""
    source = ("import math\nimport torch\nimport torch.nn as nn\n\n\nclass M(nn.Module):\n"
              "    def __init__(self):\n        super().__init__()\n"
              "        self.fc = nn.Linear(8, 4)\n\n    def forward(self, t):\n"
              "        emb = torch.exp(torch.arange(4) * -(math.log(10000) / 3))\n"
              "        emb = t[:, None] * emb[None, :]\n"
              "        return self.fc(torch.cat((emb.sin(), emb.cos()), dim=-1))\n")
    (tmp_path / "emb.py").write_text(source)
    r = verify(f"{tmp_path / 'emb.py'}::M", inputs=["float32[3]"], float64=True)
    assert r.error is None and r.passed, (r.error, r.mismatch)
    assert torch.get_default_dtype() == torch.float32
