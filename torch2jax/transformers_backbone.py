"""transformers' backbone machinery (``transformers/backbone_utils.py``) for converted modeling
files, written as it is beside them as ``_hf_backbone.py`` (jax and flax only, no torch2jax
import at run time), next to the support module ``_hf_support.py`` (transformers_runtime.py).

A detection or OCR model builds its vision backbone with ``load_backbone(config)``: the class
that ``config.backbone_config``'s ``model_type`` maps to in transformers' ``AutoBackbone``
table. Here that is the *converted* class (``AutoBackbone.from_config`` of the support module,
over the modeling files converted with the package), never torch's. A backbone class mixes in
``BackboneMixin`` (its stage names and the features it returns, read from the config) and
wraps its forward in ``filter_output_hidden_states``. What is not translated is refused when
it runs: a timm backbone, a selection of hidden states."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from flax import nnx


def load_backbone(config: Any, *, rngs: nnx.Rngs) -> nnx.Module:
    """The converted backbone of ``config.backbone_config`` (of ``config`` itself when it has
    none), as transformers' ``load_backbone`` builds torch's."""
    support = importlib.import_module(f"{__name__.rpartition('.')[0]}._hf_support")
    backbone_config = getattr(config, "backbone_config", None)
    return support.AutoBackbone.from_config(
        config if backbone_config is None else backbone_config, rngs=rngs)


class BackboneMixin:
    """transformers' BackboneMixin for a converted backbone (a transformers one: a timm
    backbone is refused): its stage names and out features come from the config."""

    has_attentions: bool = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop("timm_backbone", None) is not None:
            raise NotImplementedError("a timm backbone is not translated: only transformers' "
                                      "backbones are converted")
        super().__init__(*args, **kwargs)
        self.stage_names = list(self.config.stage_names)
        verify = getattr(self.config, "verify_out_features_out_indices", None)
        if verify is not None:
            verify()
        self.num_features = None

    @property
    def out_features(self) -> list[str]:
        return self.config._out_features

    @out_features.setter
    def out_features(self, out_features: list[str]) -> None:
        self.config.out_features = out_features

    @property
    def out_indices(self) -> list[int]:
        return self.config._out_indices

    @out_indices.setter
    def out_indices(self, out_indices: list[int]) -> None:
        self.config.out_indices = out_indices

    @property
    def out_feature_channels(self) -> dict[str, int]:
        return {stage: self.num_features[i] for i, stage in enumerate(self.stage_names)}

    @property
    def channels(self) -> list[int]:
        return [self.out_feature_channels[name] for name in self.out_features]

    def forward_with_filtered_kwargs(self, *args: Any, **kwargs: Any) -> Any:
        if not self.has_attentions:
            kwargs.pop("output_attentions", None)
        return self(*args, **kwargs)


def filter_output_hidden_states(forward: Callable) -> Callable:
    """A backbone's forward computes every hidden state (its feature maps are some of them):
    it runs with ``output_hidden_states=True`` and the field goes from the output unless the
    caller asked for it. Another model's forward (wav2vec2's heads, which ask for the hidden
    states themselves where they read them: ``use_weighted_layer_sum``) runs with the
    caller's value: the converted model computes hidden states only where they are read."""

    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = kwargs.get("output_hidden_states",
                            getattr(self.config, "output_hidden_states", False))
        if wanted not in (None, True, False):
            raise NotImplementedError(f"output_hidden_states={wanted!r} (a selection of the "
                                      "hidden states) is not translated")
        kwargs["output_hidden_states"] = True if isinstance(self, BackboneMixin) else bool(wanted)
        output = forward(self, *args, **kwargs)
        if not wanted:
            output = type(output)(**{k: v for k, v in output.items() if k != "hidden_states"})
        return output

    return wrapper
