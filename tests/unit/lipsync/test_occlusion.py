"""The covered-mouth check on synthetic templates made from the sample face (fixed boxes, no detector)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from services.lipsync.musetalk.settings import MuseTalkSettings
from services.lipsync.occlusion import OcclusionConfig, covered_from_scores, lower_face_scores, mouth_covered
from services.lipsync.settings import CoveredMouthSettings, LipSyncSettings
from tests.helpers.occluders import hand
from tests.integration.util import SAMPLES

BOX = (177, 67, 270, 189)  # the sample face's padded box (Haar box + 10 % + 10 px)
N = 60
COVERED = range(24, 30)


@pytest.fixture(scope="module")
def face() -> np.ndarray:
    return cv2.imread(str(SAMPLES / "avatar.jpg"))[:320, 60:380].copy()  # the face's neighbourhood


def shifted(box: tuple[int, int, int, int], dx: int = 0, dy: int = 0) -> tuple[int, int, int, int]:
    return (box[0] + dx - 60, box[1] + dy, box[2] + dx - 60, box[3] + dy)


def mouth(frame: np.ndarray, box: tuple[int, int, int, int], opening: float) -> np.ndarray:
    """A talking mouth: a dark inner-mouth ellipse of `opening` (0..1) at the lips, jaw dropped with it."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    out = frame.copy()
    cx, cy = x1 + w // 2, y1 + int(0.70 * h)
    drop = round(0.08 * h * opening)
    if drop:  # the chin and lower lip move down with the jaw
        out[cy + drop : y2, x1 + w // 5 : x2 - w // 5] = frame[cy : y2 - drop, x1 + w // 5 : x2 - w // 5]
        cv2.ellipse(out, (cx, cy + drop // 2), (int(0.16 * w), max(1, drop // 2 + 1)), 0, 0, 360, (40, 30, 90), -1)
    return out


def talking(face: np.ndarray, cover: range = range(0), motion: int = 3, light: float = 0.25, seed: int = 0):
    """N frames: talking mouth, head moving by up to `motion` px (the box follows to within 1 px),
    exposure changing by up to `light`; a hand over the mouth in the `cover` frames."""
    rng = np.random.default_rng(seed)
    frames, boxes = [], []
    for i in range(N):
        dx, dy = round(motion * np.sin(i / 7)), round(motion * np.sin(i / 11) / 2)
        frame = np.roll(face, (dy, dx), axis=(0, 1))
        box = shifted(BOX, dx, dy)
        frame = mouth(frame, box, max(0.0, np.sin(i * 0.8)) * rng.uniform(0.5, 1.0))
        if i in cover:
            frame = hand(frame, box)
        gain = 1 + light * np.sin(i / 5)
        frame = np.clip(frame.astype(np.float32) * gain + 8 * light * np.cos(i / 4), 0, 255).astype(np.uint8)
        jitter = tuple(int(v) for v in rng.integers(-1, 2, 4))
        frames.append(frame)
        boxes.append(tuple(b + j for b, j in zip(box, jitter)))
    return frames, boxes


def test_hand_over_the_mouth_is_flagged_and_dilated(face: np.ndarray) -> None:
    frames, boxes = talking(face, COVERED)
    covered = mouth_covered(frames, boxes)
    assert covered[list(COVERED)].all()
    dilate = OcclusionConfig().dilate
    expected = np.zeros(N, bool)
    expected[COVERED.start - dilate : COVERED.stop + dilate] = True
    np.testing.assert_array_equal(covered, expected)


def test_talking_head_motion_and_light_are_not_flagged(face: np.ndarray) -> None:
    for seed in range(3):
        frames, boxes = talking(face, seed=seed)
        scores = lower_face_scores(frames, boxes)
        assert not mouth_covered(frames, boxes).any(), np.round(scores, 2)


def test_wide_mouth_opening_is_not_flagged(face: np.ndarray) -> None:
    frames, boxes = talking(face, motion=0, light=0.0)
    frames = [mouth(f, b, 1.0 if i % 3 == 0 else 0.0) for i, (f, b) in enumerate(zip(frames, boxes))]
    assert not mouth_covered(frames, boxes).any()


def test_photo_and_short_clips_are_never_flagged(face: np.ndarray) -> None:
    frames, boxes = talking(face, COVERED)
    photo = [frames[COVERED.start]]
    assert not mouth_covered(photo, boxes[:1]).any()
    assert not mouth_covered(frames[20:27], boxes[20:27]).any()  # 7 < min_frames, 4 of them covered


def test_frames_without_a_face_are_skipped_and_never_flagged(face: np.ndarray) -> None:
    frames, boxes = talking(face, COVERED)
    boxes[5] = boxes[COVERED.start] = None
    scores = lower_face_scores(frames, boxes)
    assert np.isnan(scores[[5, COVERED.start]]).all()
    covered = mouth_covered(frames, boxes)
    assert not covered[5] and not covered[COVERED.start]
    assert covered[COVERED.start + 1 : COVERED.stop].all()


def test_disabled_and_floor() -> None:
    scores = np.r_[np.full(20, 0.1), 0.5, np.full(20, 0.1)]  # MAD 0: only the floor decides
    assert not covered_from_scores(scores, OcclusionConfig(min_score=0.6)).any()
    assert covered_from_scores(scores, OcclusionConfig(min_score=0.4, dilate=0)).sum() == 1
    assert not covered_from_scores(scores, OcclusionConfig(enabled=False, min_score=0.4)).any()


@pytest.mark.parametrize("settings", [LipSyncSettings, MuseTalkSettings])  # both tiers' stages run the check
def test_settings_carry_the_thresholds(settings: type[CoveredMouthSettings]) -> None:
    s = settings()
    assert (s.occlusion_check, s.occlusion_mad_k, s.occlusion_min_score, s.occlusion_dilate) == (
        OcclusionConfig().enabled,
        OcclusionConfig().mad_k,
        OcclusionConfig().min_score,
        OcclusionConfig().dilate,
    )
    assert OcclusionConfig.from_settings(settings(occlusion_check=False, occlusion_dilate=5)) == OcclusionConfig(
        enabled=False, dilate=5
    )
    with pytest.raises(ValueError, match="occlusion"):
        settings(occlusion_dilate=-1).validate()
