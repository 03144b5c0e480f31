"""``load_backbone(config)``: 35 modeling files of transformers build their vision backbone so
(detection, segmentation, OCR, depth and pose models), from ``backbone_config``'s model type
through ``AutoBackbone``. The converted file used to call transformers' own function, which
built a *torch* backbone inside the JAX model (the sweep's most common reason once counted
with its weight-transfer failures: "HGNetV2Backbone does not support an attention
implementation", "torch backbone... has no NNX counterpart"). Now it builds the converted
backbone class, whose ``BackboneMixin`` and ``filter_output_hidden_states`` are translated.

Tested on a detector and a backbone of our own in the shape the modeling files write them,
registered with transformers' auto classes for the torch side, reduced and converted as the
sweep does, run against torch."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.transformers

MODELING = '''
import torch
from torch import nn

from ...backbone_utils import BackboneMixin, filter_output_hidden_states, load_backbone
from ...modeling_outputs import BackboneOutput
from ...modeling_utils import PreTrainedModel
from ...utils import can_return_tuple


class TinyPreTrainedModel(PreTrainedModel):
    base_model_prefix = "tiny"
    main_input_name = "pixel_values"


class TinyBackbone(BackboneMixin, TinyPreTrainedModel):
    has_attentions = False

    def __init__(self, config):
        super().__init__(config)
        self.num_features = [config.num_channels] + config.hidden_sizes
        self.stages = nn.ModuleList()
        channels = config.num_channels
        for width in config.hidden_sizes:
            self.stages.append(nn.Conv2d(channels, width, 3, stride=2, padding=1))
            channels = width
        self.post_init()

    @can_return_tuple
    @filter_output_hidden_states
    def forward(self, pixel_values, output_hidden_states=None, return_dict=None, **kwargs):
        hidden_states = (pixel_values,)
        hidden = pixel_values
        for stage in self.stages:
            hidden = nn.functional.relu(stage(hidden))
            hidden_states += (hidden,)
        feature_maps = ()
        for idx, stage in enumerate(self.stage_names):
            if stage in self.out_features:
                feature_maps += (hidden_states[idx],)
        return BackboneOutput(feature_maps=feature_maps,
                              hidden_states=hidden_states if output_hidden_states else None)


class TinyDetector(TinyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.backbone = load_backbone(config)
        self.head = nn.Conv2d(self.backbone.channels[-1], config.num_labels, 1)
        self.post_init()

    def forward(self, pixel_values):
        features = self.backbone(pixel_values).feature_maps
        logits = self.head(features[-1])
        return logits + features[0].mean(dim=(1, 2, 3)).view(-1, 1, 1, 1)
'''

NAME = "transformers.models.tinydet.modeling_tinydet"
BACKBONE_TYPE = "t2j_tiny_backbone"


def _configs():
    from transformers import PretrainedConfig
    from transformers.backbone_utils import BackboneConfigMixin

    class TinyBackboneConfig(BackboneConfigMixin, PretrainedConfig):
        model_type = BACKBONE_TYPE

        def __init__(self, num_channels=3, hidden_sizes=(4, 6, 8), out_features=None,
                     out_indices=None, **kwargs):
            super().__init__(**kwargs)
            self.num_channels, self.hidden_sizes = num_channels, list(hidden_sizes)
            self.stage_names = ["stem"] + [f"stage{i}" for i in range(1, len(hidden_sizes) + 1)]
            self.set_output_features_output_indices(out_features, out_indices)

    class TinyDetectorConfig(PretrainedConfig):
        model_type = "t2j_tiny_detector"

        def __init__(self, backbone_config=None, num_labels=5, **kwargs):
            super().__init__(num_labels=num_labels, **kwargs)
            self.backbone_config = backbone_config

    return TinyBackboneConfig, TinyDetectorConfig


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """(torch namespace, converted module, configs): the torch backbone registered with
    AutoBackbone; the converted file in a package beside the support modules, whose auto table
    names the converted backbone for the backbone config's model type."""
    pytest.importorskip("transformers", exc_type=ImportError)
    from transformers import AutoBackbone, AutoConfig

    from torch2jax.convert import convert_source
    from torch2jax.hf import (
        BACKBONE_MODULE,
        BACKBONE_RUNTIME,
        SUPPORT_LAYERS,
        reduce_modeling,
        write_support_modules,
    )
    from torch2jax.repo import RNGS_FUNCTION

    backbone_config, detector_config = _configs()
    torch_space: dict = {"__name__": NAME, "__package__": NAME.rpartition(".")[0]}
    exec(compile(MODELING, "torch_tinydet", "exec"), torch_space)  # noqa: S102
    for cls, config in (("TinyBackbone", backbone_config), ("TinyDetector", detector_config)):
        torch_space[cls].config_class = config
    AutoConfig.register(BACKBONE_TYPE, backbone_config, exist_ok=True)
    AutoBackbone.register(backbone_config, torch_space["TinyBackbone"], exist_ok=True)

    autos: set[str] = set()
    reduced, unknown = reduce_modeling(MODELING, NAME, autos=autos)
    assert unknown == [] and autos == {"AutoBackbone"}
    # as the package side converts it (verify/package.py)
    known = set(SUPPORT_LAYERS) | autos | {RNGS_FUNCTION + "load_backbone"}
    result = convert_source(reduced, known_modules=known)
    assert "TODO(torch2jax)" not in result.code, result.code
    assert "load_backbone(config, rngs=rngs)" in result.code
    tmp = tmp_path_factory.mktemp("backbones")
    package = tmp / "t2j_backbones"
    folder = package / "models" / "tinydet"
    folder.mkdir(parents=True)
    for path in (package, package / "models", folder):
        (path / "__init__.py").write_text("")
    write_support_modules(package)
    (package / f"{BACKBONE_MODULE}.py").write_text(BACKBONE_RUNTIME.read_text())
    (package / "_hf_auto.py").write_text(
        f"MODELS = {{('AutoBackbone', {BACKBONE_TYPE!r}): "
        "('models.tinydet.modeling_tinydet', 'TinyBackbone')}\n")
    (folder / "modeling_tinydet.py").write_text(result.code)
    sys.path.insert(0, str(tmp))
    try:
        converted = importlib.import_module("t2j_backbones.models.tinydet.modeling_tinydet")
    finally:
        sys.path.remove(str(tmp))
    return torch_space, converted, backbone_config, detector_config


@pytest.mark.parametrize("out_features", [None, ["stem", "stage2", "stage3"]])
def test_a_backbone_loaded_from_the_config_is_the_converted_one(sides, out_features) -> None:
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from torch2jax.weights import transfer_state_dict

    torch_space, converted, backbone_config, detector_config = sides
    config = detector_config(backbone_config=backbone_config(out_features=out_features))
    torch.manual_seed(0)
    torch_model = torch_space["TinyDetector"](config).eval()
    jax_model = converted.TinyDetector(config, rngs=nnx.Rngs(0))
    assert isinstance(jax_model.backbone, converted.TinyBackbone)  # not torch's
    assert jax_model.backbone.channels == torch_model.backbone.channels
    transfer_state_dict(torch_model, jax_model)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(x)).numpy()
    got = np.asarray(nnx.jit(lambda m, v: m(v))(jax_model, jnp.asarray(x)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # the backbone's hidden states go from its output unless asked for, as torch's do
    backbone = jax_model.backbone(jnp.asarray(x))
    assert "hidden_states" not in backbone and len(backbone.feature_maps) == len(
        config.backbone_config.out_features)
    both = jax_model.backbone(jnp.asarray(x), output_hidden_states=True)
    with torch.no_grad():
        torch_both = torch_model.backbone(torch.from_numpy(x), output_hidden_states=True)
    assert len(both.hidden_states) == len(torch_both.hidden_states) == 4


def test_the_auto_table_names_a_families_backbone() -> None:
    """The package side finds the backbone class of a real family's default config
    (UperNet's ResNet): its modeling file is converted with the model's."""
    pytest.importorskip("transformers", exc_type=ImportError)
    from torch2jax.verify.package import _auto_models

    table = _auto_models("transformers.models.upernet.modeling_upernet", {"AutoBackbone"}, set())
    assert table[("AutoBackbone", "resnet")] == ("transformers.models.resnet.modeling_resnet",
                                                "ResNetBackbone")
