"""The torchvision tier: ``torch2jax verify`` on builders of the installed torchvision.

Needs torch==2.14.1 and torchvision==0.29.1 (a second virtual environment, see
docs/torchvision.md); skipped when torchvision cannot be imported. Run it with
``python -m pytest -q -m torchvision``.

Every builder is expected to verify (forward in eval mode and gradients, float32, small inputs,
num_classes=10). Those that do not yet are strict xfails naming the first blocker, which is in
the converter's engine (see docs/torchvision.md for the full list); fixing it turns the case
into an XPASS that asks for its entry to be removed from ``BLOCKERS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torchvision = pytest.importorskip("torchvision", exc_type=ImportError)

from torch2jax.verify.package import convert_package_file
from torch2jax.verify.run import VerifyRequest, run_request

pytestmark = pytest.mark.torchvision

MODELS = Path(torchvision.__file__).parent / "models"
SMALL = ("float32[1,3,64,64]",)

SWIN_SMALL = {"patch_size": [4, 4], "embed_dim": 32, "depths": [2, 2], "num_heads": [2, 4],
              "window_size": [4, 4], "stochastic_depth_prob": 0.0, "num_classes": 10}

# builder (a name of the file, with a [config] suffix when one builder has several cases) ->
# (file, constructor keyword arguments or a build expression, inputs)
BUILDERS = {
    "resnet18": ("resnet.py", {"num_classes": 10}, SMALL),
    "resnet50": ("resnet.py", {"num_classes": 10}, SMALL),
    "mobilenet_v2": ("mobilenetv2.py", {"num_classes": 10}, SMALL),
    "mobilenet_v3_small": ("mobilenetv3.py", {"num_classes": 10}, SMALL),
    "squeezenet1_1": ("squeezenet.py", {"num_classes": 10}, SMALL),
    "densenet121": ("densenet.py", {"num_classes": 10}, SMALL),
    "alexnet": ("alexnet.py", {"num_classes": 10}, SMALL),
    "vgg11_bn": ("vgg.py", {"num_classes": 10}, SMALL),
    "efficientnet_b0": ("efficientnet.py", {"num_classes": 10}, SMALL),
    "convnext_tiny": ("convnext.py", {"num_classes": 10}, SMALL),
    "shufflenet_v2_x0_5": ("shufflenetv2.py", {"num_classes": 10}, SMALL),
    "regnet_y_400mf": ("regnet.py", {"num_classes": 10}, SMALL),
    "VisionTransformer": ("vision_transformer.py",
                          {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2,
                           "hidden_dim": 32, "mlp_dim": 64, "num_classes": 10},
                          ("float32[1,3,32,32]",)),
    # the auxiliary heads are built (their parameters transfer) but unused in eval mode;
    # transform_input's per-channel affine runs on the NCHW input
    "googlenet": ("googlenet.py", {"num_classes": 10, "aux_logits": True, "transform_input": True,
                                   "init_weights": True}, SMALL),
    # 75 x 75 is the smallest input its stride chain takes (torchvision's min_size). With
    # init_weights=True (trunc_normal_ std 0.1 on every convolution) the activations grow to
    # about 6e9 at the logits; torchvision's default initialisation keeps them of order 1, so that
    # the absolute tolerance means something
    "inception_v3": ("inception.py", {"num_classes": 10, "aux_logits": True,
                                      "transform_input": True, "init_weights": False},
                     ("float32[1,3,75,75]",)),
    # swin_t itself: 28M parameters, about 100 s on 2 cores (marked slow, see SLOW)
    "swin_t": ("swin_transformer.py", {"num_classes": 10}, SMALL),
    # the generic class, small: 36 -> 9x9 patches, padded to 12 for the windows of 4, the shift
    # applies and masks; the merge pads 9 to 10; 5x5 padded to 8, shifted again
    "SwinTransformer[shifted]": ("swin_transformer.py", SWIN_SMALL, ("float32[1,3,36,36]",)),
    # 8x8 patches under a window of 8: the shift is clamped to 0; then 4x4 padded to 8
    "SwinTransformer[whole-window]": ("swin_transformer.py", {**SWIN_SMALL, "window_size": [8, 8]},
                                      ("float32[1,3,32,32]",)),
    # V2 (swin_v2_t's blocks and merging, by a build expression): cosine attention
    # (F.normalize of padded, zero keys), the log-spaced relative coordinates through cpb_mlp,
    # logit_scale clamped, the k part of qkv's bias zeroed
    "SwinTransformer[v2]": ("swin_transformer.py",
                            ("SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], "
                             "num_heads=[2, 4], window_size=[4, 4], stochastic_depth_prob=0.0, "
                             "num_classes=10, block=SwinTransformerBlockV2, "
                             "downsample_layer=PatchMergingV2)"), ("float32[1,3,36,36]",)),
    # maxvit_t needs 224x224 (partition 7 in every block): the generic class, small. 32 -> 16
    # after the stem; blocks of one layer (MBConv with a stride-2 projection, window and grid
    # attention with partitions of 2) at 8x8 and 4x4
    "MaxVit": ("maxvit.py", {"input_size": [32, 32], "stem_channels": 16, "partition_size": 2,
                             "block_channels": [16, 32], "block_layers": [1, 1], "head_dim": 8,
                             "stochastic_depth_prob": 0.0, "num_classes": 10},
               ("float32[1,3,32,32]",)),
}

# the slow ones: run in CI, skipped locally with -m "torchvision and not slow"
SLOW = {"swin_t"}

# Compared in float64 only (the converter's translation checked near float64 rounding, 1e-10):
# resnet50 has about a million ReLU pre-activations, and float32 rounding (about 1e-5 at
# activations of order 20) puts one or two of them on the other side of zero in JAX than in torch
# for most draws. One flipped gate moves a bn3 bias gradient by 0.2 and conv1's gradients by 1.5
# (of order 30). Seeds 0 and 1 both hit such a tie under the current draw order; float64 has
# none (both sides agree to 1e-14). A seed chosen to dodge it breaks whenever the draws change.
FLOAT64_ONLY = {"resnet50"}

BLOCKERS = {
}


def _params():
    return [pytest.param(name, marks=([pytest.mark.xfail(strict=True, reason=BLOCKERS[name])]
                                      if name in BLOCKERS else [])
                         + ([pytest.mark.slow] if name in SLOW else []), id=name)
            for name in BUILDERS]


@pytest.mark.parametrize("name", _params())
def test_builder_verifies(name):
    file, args, inputs = BUILDERS[name]
    builder = name.split("[")[0]
    build = args if isinstance(args, str) else None
    args = None if build else args
    result = run_request(VerifyRequest(f"{MODELS / file}::{builder}", args=args, build=build,
                                       inputs=inputs, grad=True, atol=1e-4, rtol=1e-4,
                                       # float32 only (the tier's time), but see FLOAT64_ONLY
                                       float64=name in FLOAT64_ONLY))
    assert result.error is None, result.error
    assert result.passed, result.mismatch


def test_resnet50_float32_rounding_passes_on_float64_evidence():
    """Issue 29: resnet50 at --atol 1e-4 --rtol 1e-3 with both passes (the default). float32
    rounding through 50 layers may put a ReLU pre-activation on the other side of zero
    (FLOAT64_ONLY above) and move gradients past the float32 tolerance; float64 agrees, and
    the verdict is float64's."""
    result = run_request(VerifyRequest(f"{MODELS / 'resnet.py'}::resnet50",
                                       args={"num_classes": 10}, inputs=SMALL, grad=True,
                                       atol=1e-4, rtol=1e-3))
    assert result.error is None, result.error
    assert [p.dtype for p in result.passes] == ["float32", "float64"]
    assert result.passes[1].passed and result.passed, result.reason
    if not result.passes[0].passed:
        assert result.reason.startswith("float32 rounding: "), result.reason


def test_mirror_package_converts_only_layer_modules(tmp_path):
    """mobilenetv2.py's Conv2dNormActivation comes from ops/misc.py: that module is converted,
    the weight enums / registry (_api.py) are copied so they run inert, the rest is forwarded."""
    converted = []

    def convert(file: Path, known: set[str]) -> tuple[str, int]:
        converted.append((file.relative_to(MODELS.parent).as_posix(), sorted(known)))
        return file.read_text(), 0  # the plumbing only: the conversion is not what is tested

    target, _ = convert_package_file(MODELS / "mobilenetv2.py", tmp_path, convert)
    assert target.relative_to(tmp_path).parts[1:] == ("models", "mobilenetv2.py")
    # (utils.py too: the dependencies are converted first, so that the builder functions the
    # model file calls are known with their rngs; it holds no layer class)
    # (and the torch layer each imported class derives from, analysis/layer_bases.py)
    assert sorted(converted) == [("models/mobilenetv2.py", [
        "Conv2dNormActivation", "layer-base:Conv2dNormActivation=torch.nn.Sequential"]),
                                 ("ops/misc.py", []), ("utils.py", [])]
    mirror = target.parent.parent
    assert (mirror / "models" / "_api.py").read_text() == (MODELS / "_api.py").read_text()
    assert "sys.modules[__name__]" in (mirror / "_internally_replaced_utils.py").read_text()
    assert "def __getattr__" in (mirror / "models" / "__init__.py").read_text()
