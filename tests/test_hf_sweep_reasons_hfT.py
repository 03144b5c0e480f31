"""The transformers sweep's time-outs (issue 31, the fourteenth round): where a row's time
goes, and work done twice. The verifier reports each phase to ``common.phase_hook`` (the
sweep's rows keep their seconds, and a row that times out names the phase it was in); a
modeling file whose auto classes build a class of its own file is reduced with that class
before it is converted, not converted a second time. Work is counted, not timed."""

from __future__ import annotations

import collections
import textwrap
from pathlib import Path

import pytest
from sweep_module import sweep

from torch2jax.verify import common
from torch2jax.verify.common import VerifyRequest
from torch2jax.verify.run import run_request

_MODEL = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.norm = nn.LayerNorm(3)

        def forward(self, x):
            return torch.tanh(self.norm(self.fc(x)))
    ''')


def test_each_phase_of_a_verification_is_reported_once(tmp_path: Path, monkeypatch) -> None:
    """A float32 verification (forward and gradients) against torch reports each phase as it
    starts and as it ends, once: the torch model built once, the JAX model built once, the
    weights transferred once, one JAX forward pass and one gradient."""
    pytest.importorskip("torch")
    (tmp_path / "net.py").write_text(_MODEL)
    events: list[tuple[str, bool]] = []
    monkeypatch.setattr(common, "phase_hook", lambda what, s: events.append((what, s is None)))
    r = run_request(VerifyRequest(target=f"{tmp_path / 'net.py'}::Net",
                                  inputs=("float32[2,4]",), float64=False))
    assert r.passed and r.error is None, r
    starts = collections.Counter(w for w, start in events if start)
    ends = collections.Counter(w for w, start in events if not start)
    assert starts == ends  # every phase that starts ends
    for phase in ("building the torch model", "building the JAX model", "the weight transfer",
                  "importing the converted file", "the torch forward pass",
                  "the JAX forward pass (under jax.jit)", "the torch backward pass",
                  "the JAX gradient (jax.grad under jax.jit)"):
        assert starts[phase] == 1, (phase, starts)
    assert sum(w.startswith("converting ") for w in starts) == 1, starts


def test_a_timed_out_row_names_the_phase_it_was_in() -> None:
    """The sweep's child reports its phases on stderr; a row that times out reads there the
    phases that ended (their seconds summed) and the one it was in."""
    ended, running = sweep._phases_of(
        "PHASE start converting the file\nwarning: something\nPHASE start converting a.py\n"
        "PHASE 2.5 converting a.py\nPHASE 3.0 converting the file\n"
        "PHASE start the JAX forward pass\nPHASE 1.5 the JAX forward pass\n"
        "PHASE start with the mask: the JAX gradient\n")
    assert ended == {"converting a.py": 2.5, "converting the file": 3.0,
                     "the JAX forward pass": 1.5}
    assert running == "with the mask: the JAX gradient"
    assert sweep._phases_of(b"PHASE start a\nPHASE 1.0 a\n") == ({"a": 1.0}, "")


def _conversions(module: str, cls_name: str, model_types: set[str], tmp: Path
                 ) -> tuple[collections.Counter, Path]:
    """How often ``convert_package_file`` converts each file of the mirror package of
    ``transformers.models.<module>`` built for ``cls_name`` (its converter counted, not run)."""
    import importlib

    from torch2jax.verify.package import convert_package_file

    original = importlib.import_module(f"transformers.models.{module}")
    seen: collections.Counter = collections.Counter()

    def convert(file: Path, known: set[str]) -> tuple[str, int]:
        seen[file.name] += 1
        return file.read_text(), 0

    path, _ = convert_package_file(Path(original.__file__), tmp, convert, {cls_name},
                                   model_types=model_types)
    return seen, path


@pytest.mark.transformers
@pytest.mark.parametrize("module, cls_name, files, auto_built", [
    # Qwen3VLModel builds its vision model with AutoModel.from_config(config.vision_config),
    # a class of its own file that the head does not reach by name
    ("qwen3_vl.modeling_qwen3_vl", "Qwen3VLForConditionalGeneration", 1,
     "Qwen3VLVisionModel"),
    # ShieldGemma2 builds Gemma3ForConditionalGeneration, whose Gemma3Model builds
    # Gemma3TextModel with AutoModel.from_config(config.text_config)
    ("shieldgemma2.modeling_shieldgemma2", "ShieldGemma2ForImageClassification", 3,
     "Gemma3TextModel"),
    # (and Gemma3Model, the gemma3 type's own AutoModel class, reached from the head already:
    # not converted again)
])
def test_a_modeling_file_is_converted_once(tmp_path: Path, module: str, cls_name: str,
                                           files: int, auto_built: str) -> None:
    """Each modeling file of a mirror package is converted once, with the classes its auto
    classes build kept (they were converted in a second pass over the file before)."""
    pytest.importorskip("transformers")
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{module}"), cls_name)
    seen, _ = _conversions(module, cls_name, sweep._model_types(cls.config_class()), tmp_path)
    assert len(seen) == files and set(seen.values()) == {1}, seen
    assert any(f"class {auto_built}(" in p.read_text() for p in tmp_path.rglob("modeling_*.py"))


def _largest(config, depth: int = 0) -> tuple[int, int]:
    """(the most layers, the widest hidden size) of ``config`` and its sub-configs."""
    from transformers import PretrainedConfig

    layers = width = 0
    for key, value in vars(config).items():
        if isinstance(value, PretrainedConfig) and depth < 4:
            sub = _largest(value, depth + 1)
            layers, width = max(layers, sub[0]), max(width, sub[1])
        elif isinstance(value, int) and not isinstance(value, bool):
            if key in ("num_hidden_layers", "depth", "l_layers", "x_layers", "r_layers",
                       "encoder_num_hidden_layers", "decoder_num_hidden_layers"):
                layers = max(layers, value)
            elif key in ("hidden_size", "out_hidden_size", "audio_hidden_size"):
                width = max(width, value)
    return layers, width


@pytest.mark.transformers
@pytest.mark.parametrize("module, cls_name", [
    # a validator's message without backticks ("vision_config.out_hidden_size (1024) must
    # equal text_config.hidden_size (32)"): the whole text model was left at full size
    ("granite_docling.modeling_granite_docling", "GraniteDoclingForConditionalGeneration"),
    # "`head_config.audio_hidden_size` (512) must match `audio_config.hidden_size` (32)"
    ("nemotron3_5_transcribe.modeling_nemotron3_5_transcribe",
     "Nemotron3_5TranscribeForConditionalGeneration"),
    # "`vision_config.video_temporal_patch_size` (None) and `video_temporal_patch_size` (2)
    # must be equal": the vision tower was left at full size
    ("nemotron_h_omni.modeling_nemotron_h_omni", "NemotronH_Omni_Reasoning_V3"),
    # LXMERT's language, cross-modality and relation layers; Moonshine's encoder and decoder
    ("lxmert.modeling_lxmert", "LxmertForQuestionAnswering"),
    ("moonshine.modeling_moonshine", "MoonshineForConditionalGeneration"),
    # a vision tower's depth and output width (Qwen2.5-VL's, under HyperCLOVA X Vision)
    ("hyperclovax_vision_v2.modeling_hyperclovax_vision_v2",
     "HyperCLOVAXVisionV2ForConditionalGeneration"),
])
def test_every_tower_of_a_tiny_config_is_tiny(module: str, cls_name: str) -> None:
    """The sweep's tiny config shrinks each sub-config (towers, projectors, nested audio
    configs) to the sweep's sizes, where a config validator ties one size to another."""
    pytest.importorskip("transformers")
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{module}"), cls_name)
    config, _ = sweep.tiny_config(cls.config_class)
    layers, width = _largest(config)
    assert layers <= sweep.LAYERS and width <= sweep.WIDTH, (layers, width)


@pytest.mark.transformers
def test_lxmert_tiny_config_runs_in_torch() -> None:
    """LXMERT's tiny config (its three layer counts cut) builds and runs in torch on the
    sweep's inputs."""
    pytest.importorskip("transformers")
    from sweep_module import fit

    config, _, _ = fit("lxmert.modeling_lxmert", "LxmertForQuestionAnswering")
    assert (config.l_layers, config.x_layers, config.r_layers) == (2, 2, 2)
