"""torchvision.transforms and their numpy translations, compared on the same images.

Part of the torchvision tier (``-m torchvision``, run by ``tests/torchvision_tier.sh``): the
deterministic transforms must give torchvision's arrays exactly, and every output of a random
one must be an output torchvision can give (the draws come from different generators).
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

torchvision = pytest.importorskip("torchvision", exc_type=ImportError)

import torch
from torchvision.transforms import functional as F

from torch2jax.convert import convert_source

pytestmark = pytest.mark.torchvision

SOURCE = textwrap.dedent('''
    import torchvision.transforms as T

    DETERMINISTIC = {
        "normalize": T.Normalize((0.5, 0.2, 0.1), (0.3, 0.25, 2.0)),
        "center_crop_5": T.CenterCrop(5),
        "center_crop_4x6": T.CenterCrop((4, 6)),
        "center_crop_3x3": T.CenterCrop([3]),
        "center_crop_bigger": T.CenterCrop((10, 11)),
        "pad_int": T.Pad(2),
        "pad_pair_fill": T.Pad((1, 3), fill=7),
        "pad_ltrb_edge": T.Pad((1, 2, 3, 0), padding_mode="edge"),
        "pad_reflect": T.Pad(2, padding_mode="reflect"),
        "pad_symmetric": T.Pad((2, 1), padding_mode="symmetric"),
        "hflip": T.RandomHorizontalFlip(p=1.0),
        "vflip": T.RandomVerticalFlip(p=1.0),
        "no_flip": T.RandomHorizontalFlip(p=0.0),
        "compose": T.Compose([T.CenterCrop(4), T.Normalize((0.5,) * 3, (0.5,) * 3)]),
        "lambda": T.Lambda(lambda x: x * 2),
    }
    TO_TENSOR = T.ToTensor()
    CROPS = {
        "padded": T.RandomCrop((4, 5), padding=1),
        "pad_if_needed": T.RandomCrop((10, 10), pad_if_needed=True, fill=3),
        "reflect": T.RandomCrop(6, padding=(2, 1), padding_mode="reflect"),
    }
''')


@pytest.fixture(scope="module")
def both() -> tuple[dict, dict]:
    result = convert_source(SOURCE, path="transforms.py")
    assert [d for d in result.diagnostics if d.severity == "error"] == []
    assert "torchvision" not in result.code.split("\nclass ")[0]  # no import of it left
    ours: dict = {}
    exec(compile(result.code, "transforms.py", "exec"), ours)  # noqa: S102 (our snippet)
    theirs: dict = {}
    exec(compile(SOURCE, "transforms.py", "exec"), theirs)  # noqa: S102 (our snippet)
    return ours, theirs


IMAGE = np.random.default_rng(0).standard_normal((3, 7, 8)).astype(np.float32)


@pytest.mark.parametrize("name", ["normalize", "center_crop_5", "center_crop_4x6",
                                  "center_crop_3x3", "center_crop_bigger", "pad_int",
                                  "pad_pair_fill", "pad_ltrb_edge", "pad_reflect",
                                  "pad_symmetric", "hflip", "vflip", "no_flip", "compose",
                                  "lambda"])
def test_deterministic_transform_matches_torchvision(both, name: str) -> None:
    ours, theirs = both
    want = theirs["DETERMINISTIC"][name](torch.from_numpy(IMAGE.copy())).numpy()
    got = np.asarray(ours["DETERMINISTIC"][name](IMAGE.copy()))
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("image", [
    np.random.default_rng(1).integers(0, 256, (5, 6, 3), dtype=np.uint8),  # HWC bytes
    np.random.default_rng(2).integers(0, 256, (5, 6), dtype=np.uint8),  # one channel
    np.random.default_rng(3).standard_normal((5, 6, 2)).astype(np.float32),  # values kept
], ids=["uint8", "gray", "float32"])
def test_to_tensor_matches_torchvision(both, image: np.ndarray) -> None:
    ours, theirs = both
    want = theirs["TO_TENSOR"](image).numpy()
    got = ours["TO_TENSOR"](image)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["padded", "pad_if_needed", "reflect"])
def test_random_crop_gives_torchvision_windows(both, name: str) -> None:
    """Each crop is one of the windows torchvision can cut (after its padding), and the draws
    reach every window position."""
    ours, theirs = both
    crop = theirs["CROPS"][name]
    x = torch.from_numpy(IMAGE)
    if crop.padding is not None:
        x = F.pad(x, crop.padding, crop.fill, crop.padding_mode)
    th, tw = crop.size
    if crop.pad_if_needed and x.shape[-1] < tw:
        x = F.pad(x, [tw - x.shape[-1], 0], crop.fill, crop.padding_mode)
    if crop.pad_if_needed and x.shape[-2] < th:
        x = F.pad(x, [0, th - x.shape[-2]], crop.fill, crop.padding_mode)
    windows = {F.crop(x, i, j, th, tw).numpy().tobytes(): (i, j)
               for i in range(x.shape[-2] - th + 1) for j in range(x.shape[-1] - tw + 1)}
    reached = set()
    for _ in range(300):
        got = np.asarray(ours["CROPS"][name](IMAGE))
        assert got.tobytes() in windows
        reached.add(windows[got.tobytes()])
    assert reached == set(windows.values())
