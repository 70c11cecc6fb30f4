"""lanczos4_resize (two matrix products) against cv2.resize(..., INTER_LANCZOS4).

Measured with opencv-python 4.14 (IPP on or off gives the same result):
* fixed_point=True on uint8-valued images, rounded half up: bit-exact for most cases; otherwise
  at most 1 level on at most ~2e-5 of the values (float32 summation order near a rounding tie).
* fixed_point=False (OpenCV's float weights) rounded: at most 1 level, on 3-25% of the values.
* float32 images in [0, 1] against cv2's float32 path: within 1e-5 (float32 rounding).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from services.superres.lanczos import lanczos4_matrix, lanczos4_resize, round_like_opencv

CASES = [
    ((96, 96), (150, 150)),  # the usual 96 px face to a paste size
    ((384, 384), (250, 250)),  # x4 output shrunk (no antialiasing, 8 taps)
    ((384, 384), (400, 400)),  # x4 output grown a little
    ((96, 80), (170, 131)),  # non-square, different factor per axis
    ((384, 384), (97, 301)),  # shrink one axis, grow-ish the other
    ((100, 120), (37, 41)),  # strong downscale
    ((7, 5), (23, 11)),  # smaller than the 8-tap window: every tap hits a border
]


def _image(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    shape = (h, w, channels) if channels > 1 else (h, w)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _to_tensor(img: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(img).float()
    return t.permute(2, 0, 1)[None] if img.ndim == 3 else t[None, None]


def _to_image(t: torch.Tensor) -> np.ndarray:
    return t[0].permute(1, 2, 0).numpy() if t.shape[1] > 1 else t[0, 0].numpy()


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize(("src", "dst"), CASES)
def test_uint8_matches_cv2(src: tuple[int, int], dst: tuple[int, int], channels: int) -> None:
    img = _image(*src, channels, seed=src[0] * 7919 + dst[1] * 31 + channels)
    expected = cv2.resize(img, (dst[1], dst[0]), interpolation=cv2.INTER_LANCZOS4).astype(int)
    x = _to_tensor(img)

    fixed = _to_image(round_like_opencv(lanczos4_resize(x, dst, fixed_point=True))).astype(int)
    assert fixed.shape == expected.shape
    diff = np.abs(fixed - expected)
    assert diff.max() <= 1
    assert (diff > 0).mean() < 1e-4

    plain = _to_image(round_like_opencv(lanczos4_resize(x, dst))).astype(int)
    assert np.abs(plain - expected).max() <= 1


@pytest.mark.parametrize(("src", "dst"), CASES[:4])
def test_float_matches_cv2_float_path(src: tuple[int, int], dst: tuple[int, int]) -> None:
    img = _image(*src, 3, seed=7).astype(np.float32) / 255
    expected = cv2.resize(img, (dst[1], dst[0]), interpolation=cv2.INTER_LANCZOS4)
    got = _to_image(lanczos4_resize(_to_tensor(img), dst))
    assert np.abs(got - expected).max() < 1e-5  # values in [0, 1]: float32 rounding only


def test_batch_and_channels_are_independent() -> None:
    imgs = [_image(40, 30, 3, seed=s) for s in range(3)]
    x = torch.cat([_to_tensor(i) for i in imgs])
    out = round_like_opencv(lanczos4_resize(x, (70, 50), fixed_point=True))
    assert out.shape == (3, 3, 70, 50) and out.dtype == torch.uint8
    for k, img in enumerate(imgs):
        expected = cv2.resize(img, (50, 70), interpolation=cv2.INTER_LANCZOS4)
        assert np.abs(out[k].permute(1, 2, 0).numpy().astype(int) - expected).max() <= 1


def test_weights() -> None:
    m = lanczos4_matrix(96, 150)
    assert m.shape == (150, 96)
    assert np.allclose(m.sum(axis=1), 1, atol=1e-6)
    assert ((m != 0).sum(axis=1) <= 8).all()
    q = lanczos4_matrix(96, 150, fixed_point=True)
    assert np.array_equal(q * 2048, np.round(q * 2048))  # multiples of 1/2048, as OpenCV's shorts
    # Same size: the identity (the 1e30 centre tap), and the function returns its input.
    assert np.allclose(lanczos4_matrix(17, 17), np.eye(17))
    x = torch.rand(1, 3, 9, 9)
    assert lanczos4_resize(x, (9, 9)) is x
    assert lanczos4_matrix(96, 150) is lanczos4_matrix(96, 150)  # cached


def test_constant_image_stays_constant_and_shapes() -> None:
    x = torch.full((2, 3, 13, 21), 77.0)
    y = lanczos4_resize(x, (40, 8))
    assert y.shape == (2, 3, 40, 8) and torch.allclose(y, torch.full_like(y, 77.0), atol=1e-3)
    assert lanczos4_resize(torch.rand(13, 21), (5, 6)).shape == (5, 6)


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match="floating"):
        lanczos4_resize(torch.zeros(1, 1, 4, 4, dtype=torch.uint8), (8, 8))
    with pytest.raises(ValueError, match="positive"):
        lanczos4_resize(torch.zeros(1, 1, 4, 4), (0, 8))


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    img = _image(384, 384, 3, seed=3)
    x = _to_tensor(img)
    cpu = round_like_opencv(lanczos4_resize(x, (250, 230), fixed_point=True))
    gpu = round_like_opencv(lanczos4_resize(x.cuda(), (250, 230), fixed_point=True)).cpu()
    diff = (cpu.int() - gpu.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-4
