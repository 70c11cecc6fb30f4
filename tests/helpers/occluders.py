"""Things drawn over a face in the covered-mouth tests (issue 10, item 4)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np


def hand(
    frame: np.ndarray, box: tuple[int, int, int, int], top: float = 0.58, bottom: float = 0.1, right: float = 0.05
) -> np.ndarray:
    """A skin-coloured hand over the mouth and chin: three fingers across, shaded from left to right.

    It spans the box's rows from `top` (a fraction of the box height) to `bottom` below the box, and
    its columns from 10 % left of the box to `right` short of its right edge."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    r0, r1, c0, c1 = y1 + int(top * h), y2 + int(bottom * h), x1 - int(0.1 * w), x2 - int(right * w)
    patch = np.full((r1 - r0, c1 - c0, 3), (120, 150, 205), np.float32)
    for k in range(1, 4):
        r = k * (r1 - r0) // 4
        patch[r - 1 : r + 1] *= 0.7
    patch *= np.linspace(1.05, 0.85, c1 - c0)[None, :, None]
    out = frame.copy()
    out[r0:r1, c0:c1] = np.clip(cv2.GaussianBlur(patch, (0, 0), 1.0), 0, 255).astype(np.uint8)
    return out


SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "avatar.jpg"
SAMPLE_FACE = (177, 67, 270, 169)  # the sample face's Haar box (x1, y1, x2, y2) in samples/avatar.jpg


def panning_clip(
    frames: int, covered: range = range(0), size: int = 256, left: int = 100, blank: range = range(0)
) -> list[np.ndarray]:
    """A template clip of the sample face: a `size` square window panning right 1 px a frame from column
    `left` (the face moves left), with a `hand` over the mouth and chin in the `covered` frames and
    flat grey (no face) in the `blank` ones."""
    photo = cv2.imread(str(SAMPLE))
    x1, y1, x2, y2 = SAMPLE_FACE
    out = []
    for i in range(frames):
        x0 = left + i
        frame = np.ascontiguousarray(photo[0:size, x0 : x0 + size])
        if i in covered:
            frame = hand(frame, (x1 - x0, y1, x2 - x0, y2), top=0.62, bottom=0.3, right=0.0)
        if i in blank:
            frame = np.full_like(frame, 90)
        out.append(frame)
    return out
