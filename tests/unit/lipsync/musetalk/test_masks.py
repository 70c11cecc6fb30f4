"""The musetalk avatars' alpha masks (services.lipsync.musetalk.masks), on synthetic parsings and boxes."""

from __future__ import annotations

import numpy as np

from services.lipsync.musetalk.masks import (
    MOUTH_CLASSES,
    NOSE,
    SKIN,
    ellipse_mask,
    finish_mask,
    jaw_mask,
    mask_box,
    square_crop,
)


def test_the_square_is_upstreams_crop_box() -> None:
    assert mask_box((100, 50, 201, 170)) == (60, 20, 240, 200)  # centre (150, 110), s = int(120 // 2 * 1.5) = 90
    frame = np.arange(20 * 30 * 3, dtype=np.uint8).reshape(20, 30, 3)
    crop = square_crop(frame, (-5, -5, 10, 10))
    assert crop.shape == (15, 15, 3) and not crop[:5].any() and not crop[:, :5].any()
    assert np.array_equal(crop[5:, 5:], frame[:10, :10])  # black past the frame, the frame's pixels inside


def parsing() -> np.ndarray:
    """A face-like 512 map: skin everywhere in the middle, a nose, lips below it, background around."""
    p = np.zeros((512, 512), np.int64)
    p[100:420, 120:392] = SKIN
    p[200:300, 230:282] = NOSE
    p[330:360, 200:312] = MOUTH_CLASSES[1]
    return p


def test_the_jaw_mask_is_skin_grown_down_less_the_nose_plus_the_lips() -> None:
    mask = jaw_mask(parsing())
    assert set(np.unique(mask)) == {0, 255}
    assert not mask[200:300, 230:282].any()  # the nose is left out
    assert mask[330:360, 200:312].all()  # the lips are in
    # upstream's cone kernel grows the skin 6 px down at the jaw and up to 16 px up (its tail)
    assert mask[425, 256] == 255 and mask[430, 256] == 0 and mask[88, 256] == 255 and mask[80, 256] == 0
    assert not mask[:, :50].any()  # background stays out


def test_the_alpha_is_the_lower_face_inside_the_box_and_blurred() -> None:
    box = (100, 60, 200, 180)
    square = mask_box(box)
    raw = np.full((square[3] - square[1], square[2] - square[0]), 255, np.uint8)
    alpha = finish_mask(raw, box, square)
    side = alpha.shape[0]
    assert not alpha[: side // 2 - 10].any()  # nothing above the middle row (the blur spreads a few rows)
    inside = alpha[side // 2 + 20 : box[3] - square[1] - 20, box[0] - square[0] + 20 : box[2] - square[0] - 20]
    assert inside.min() == 255 and not alpha[:, : box[0] - square[0] - 20].any()  # only inside the box
    edge = alpha[side // 2 + 30, box[0] - square[0] - 5 : box[0] - square[0] + 5]
    assert 0 < edge.min() < edge.max() < 255 or (edge[0] < edge[-1])  # blurred, not a hard step
    ellipse = ellipse_mask(box, square)
    assert ellipse[round(60 + 0.76 * 120 - square[1]), 150 - square[0]] == 255 and ellipse[0, 0] == 0
