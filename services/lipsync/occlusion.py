"""Is the lower face visible? A weight-free per-frame check run once per avatar in DetectFaces.

The Haar cascade finds a face from the eyes and nose bridge, so it keeps finding it when a hand, a
microphone or a card covers the mouth, and the lip-sync model would paint a mouth on the hand. No
packaged model with shipped weights judges this (landmark models place lips under a hand; see
docs/decisions.md), so the check compares each frame with the avatar itself: an avatar is one person
in one setting, and its lower face looks about the same in most frames.

Per frame with a face box, the box is cut and shrunk to CROP_SIDE px (blurred, so a pixel of box
jitter or head motion hardly changes it) and turned into Lab. The lower face (the mouth band, rows
LOWER_ROWS x columns LOWER_COLS of the box) is normalised by the same frame's upper face (eyes and
nose, rows UPPER_ROWS): lightness by its mean and spread, colour by its mean, so a change of light or
white balance over the whole face cancels while something in front of the mouth does not. Each
pixel's distance to the per-pixel median over all frames is capped at PIXEL_CAP (an open mouth
darkens a few pixels a lot; an occluder changes most pixels) and averaged: the frame's score.

A frame is covered when its score is above max(min_score, median + mad_k * 1.4826 * MAD) of the
scores: the template's own talking and head motion set the spread, and the absolute floor keeps a
nearly static template (MAD ~ 0) from flagging noise. Covered runs are dilated by `dilate` frames on
each side so the generated mouth does not flicker at the edges of the occlusion, where the hand is
only partly in front. Fewer than `min_frames` faces (a photo is one frame) are never judged: there is
no "usual" lower face to compare with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from services.lipsync.faces import DEFAULT_PADS, prepare_boxes
from services.media.crops import Box

if TYPE_CHECKING:
    from services.lipsync.settings import CoveredMouthSettings

__all__ = [
    "OcclusionConfig",
    "covered_from_features",
    "final_boxes",
    "lower_face_scores",
    "mouth_covered",
    "scores_from_features",
    "second_pass_boxes",
    "visible_boxes",
]

CROP_SIDE = 48
BLUR_SIGMA = 1.0  # px of the CROP_SIDE crop
UPPER_ROWS = (0.15, 0.50)  # fractions of the padded box height: eyes and nose, never regenerated
LOWER_ROWS = (0.55, 0.98)  # mouth, lips and chin (the procedural mouth sits at 0.73)
LOWER_COLS = (0.15, 0.85)
MIN_SPREAD = 4.0  # grey levels
PIXEL_CAP = 2.0  # per-pixel distance cap, in normalised units


@dataclass(frozen=True)
class OcclusionConfig:
    """Thresholds of `mouth_covered` (both tiers' stage settings carry them, CoveredMouthSettings; these are
    the defaults)."""

    enabled: bool = True
    mad_k: float = 4.0  # robust z-score above which a frame is an outlier
    min_score: float = 0.8  # absolute floor of the threshold (mean capped distance)
    dilate: int = 2  # frames added on each side of a covered run
    min_frames: int = 8  # fewer faces than this: never flagged

    @classmethod
    def from_settings(cls, s: CoveredMouthSettings) -> OcclusionConfig:
        """The thresholds a stage's settings set (the `occlusion_*` ones)."""
        return cls(s.occlusion_check, s.occlusion_mad_k, s.occlusion_min_score, s.occlusion_dilate)


def _bands(side: int) -> tuple[slice, slice, slice]:
    upper = slice(round(UPPER_ROWS[0] * side), round(UPPER_ROWS[1] * side))
    lower = slice(round(LOWER_ROWS[0] * side), round(LOWER_ROWS[1] * side))
    cols = slice(round(LOWER_COLS[0] * side), round(LOWER_COLS[1] * side))
    return upper, lower, cols


def lower_face_features(frame: np.ndarray, box: Box) -> np.ndarray:
    """The normalised lower face of one frame: (rows, cols, 3) float32 (L, a, b).

    Args:
        frame: (H, W, 3) BGR uint8.
        box: (x1, y1, x2, y2), the padded face box.
    """
    x1, y1, x2, y2 = box
    crop = cv2.resize(frame[y1:y2, x1:x2], (CROP_SIDE, CROP_SIDE), interpolation=cv2.INTER_AREA)
    crop = cv2.GaussianBlur(crop.astype(np.float32), (0, 0), BLUR_SIGMA)
    upper, lower, cols = _bands(CROP_SIDE)
    ref = crop[upper, cols].reshape(-1, 3)
    # Per channel: a change of exposure or white balance is about a gain and an offset per channel.
    spread = np.maximum(ref.std(axis=0), MIN_SPREAD)  # a flat upper face must not blow the scale up
    return (crop[lower, cols] - ref.mean(axis=0)) / spread


def lower_face_scores(frames: Sequence[np.ndarray], boxes: Sequence[Box | None]) -> np.ndarray:
    """How far each frame's lower face is from the avatar's usual one: (N,) float64, NaN without a box."""
    return scores_from_features([None if b is None else lower_face_features(frames[i], b) for i, b in enumerate(boxes)])


def scores_from_features(features: Sequence[np.ndarray | None]) -> np.ndarray:
    """`lower_face_scores` from each frame's `lower_face_features` (None without a box).

    Why separate: a stream of frames (DetectFaces) keeps each frame's features (~9 KB), not the frame.
    """
    scores = np.full(len(features), np.nan)
    idx = [i for i, f in enumerate(features) if f is not None]
    if not idx:
        return scores
    feats = np.stack([f for f in features if f is not None])  # the frames of `idx`, in order
    typical = np.median(feats, axis=0)
    dist = np.sqrt(((feats - typical) ** 2).sum(axis=-1))
    scores[idx] = np.minimum(dist, PIXEL_CAP).mean(axis=(1, 2))
    return scores


def judged(faces: Sequence[object | None], config: OcclusionConfig) -> bool:
    """Whether `mouth_covered` judges these frames at all (enabled, and enough faces to compare).

    Args:
        faces: per frame its box or its `lower_face_features`, None without a face.
    """
    return config.enabled and sum(f is not None for f in faces) >= config.min_frames


def covered_from_features(features: Sequence[np.ndarray | None], config: OcclusionConfig) -> np.ndarray:
    """`mouth_covered` from each frame's `lower_face_features` (None without a face): (N,) bool.

    Why: a stream of frames (DetectFaces, the musetalk tier's PrepareAvatar) keeps each frame's
    features, not the frame, and judges them all once the frames have ended.
    """
    if not judged(features, config):
        return np.zeros(len(features), dtype=bool)
    return covered_from_scores(scores_from_features(features), config)


def covered_from_scores(scores: np.ndarray, config: OcclusionConfig = OcclusionConfig()) -> np.ndarray:
    """(N,) bool: frames whose score is an outlier, runs dilated; NaN scores (no face) are never covered."""
    valid = ~np.isnan(scores)
    covered = np.zeros(len(scores), dtype=bool)
    if not config.enabled or valid.sum() < config.min_frames:
        return covered
    s = scores[valid]
    med = float(np.median(s))
    mad = 1.4826 * float(np.median(np.abs(s - med)))
    threshold = max(config.min_score, med + config.mad_k * mad)
    covered[valid] = s > threshold
    if config.dilate > 0 and covered.any():
        kernel = np.ones(2 * config.dilate + 1, dtype=np.int64)
        covered = np.convolve(covered.astype(np.int64), kernel, mode="same") > 0
    return covered & valid


def mouth_covered(
    frames: Sequence[np.ndarray], boxes: Sequence[Box | None], config: OcclusionConfig = OcclusionConfig()
) -> np.ndarray:
    """(N,) bool: True where a face was found but its lower face is hidden (hand, microphone, card).

    Args:
        frames: the avatar's frames, (H, W, 3) BGR uint8 each.
        boxes: the padded, smoothed boxes of those frames (None = no face).
        config: thresholds.
    """
    if not judged(boxes, config):
        return np.zeros(len(frames), dtype=bool)
    return covered_from_scores(lower_face_scores(frames, boxes), config)


def visible_boxes(
    frames: Sequence[np.ndarray],
    raw: Sequence[Box | None],
    pads: Sequence[int] = DEFAULT_PADS,
    smooth: bool = True,
    config: OcclusionConfig = OcclusionConfig(),
) -> tuple[list[Box | None], np.ndarray]:
    """DetectFaces' boxes: `prepare_boxes`, with the covered frames' boxes set to None.

    The cascade's boxes on covered frames are often off (the hand changes what it sees), and the
    smoothing spreads that over the frames around them, whose crops then look off too. So the check
    runs twice: once on the boxes as detected, then with the neighbours' boxes smoothed without the
    frames flagged the first time; the final boxes are smoothed without the covered frames.
    (`services.lipsync.detect_stream` runs the same steps over a stream, holding features, not frames.)

    Returns:
        boxes: one per frame (None = no face, or a covered mouth: the frame passes through).
        covered: (N,) bool, True where a face was found but its mouth is covered.
    """
    height, width = frames[0].shape[:2]
    boxes = prepare_boxes(raw, height, width, pads, smooth)
    covered = mouth_covered(frames, boxes, config)
    if not covered.any():
        return boxes, covered
    second = second_pass_boxes(raw, boxes, covered, height, width, pads, smooth)
    covered = mouth_covered(frames, second, config)
    return final_boxes(raw, boxes, covered, height, width, pads, smooth)


def second_pass_boxes(
    raw: Sequence[Box | None],
    boxes: Sequence[Box | None],
    covered: np.ndarray,
    height: int,
    width: int,
    pads: Sequence[int],
    smooth: bool,
) -> list[Box | None]:
    """The boxes the second check judges: the flagged frames' own, the others' smoothed without the flagged."""
    clean = prepare_boxes([None if c else b for b, c in zip(raw, covered)], height, width, pads, smooth)
    return [b if c else k for b, k, c in zip(boxes, clean, covered)]


def final_boxes(
    raw: Sequence[Box | None],
    boxes: Sequence[Box | None],
    covered: np.ndarray,
    height: int,
    width: int,
    pads: Sequence[int],
    smooth: bool,
) -> tuple[list[Box | None], np.ndarray]:
    """`visible_boxes`' answer once the second check flagged ``covered`` (``boxes``: the first pass's)."""
    if not covered.any():
        return list(boxes), covered
    final = prepare_boxes([None if c else b for b, c in zip(raw, covered)], height, width, pads, smooth)
    return final, covered & np.array([b is not None for b in boxes])
