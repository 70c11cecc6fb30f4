"""The reference paste: blend a generated face into a BGR frame with the feather mask.

The compositor (services/media/composite.py) blends into cached I420 frames instead; this is the
plain version its tests and benchmarks compare against."""

from __future__ import annotations

import numpy as np

from services.media.composite import feather_mask


def paste_face(frame: np.ndarray, face: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """Alpha-blends a face crop into a copy of a frame using the feather mask.

    Args:
        frame: (H, W, 3) uint8 BGR frame; not modified.
        face: (y2 - y1, x2 - x1, 3) uint8 BGR face, already resized to the box.
        box: ``(x1, y1, x2, y2)`` pixel box inside the frame (x2/y2 exclusive).

    Returns:
        A new frame with the face blended into ``frame[y1:y2, x1:x2]``.

    Raises:
        ValueError: The box is empty or outside the frame, or the face's shape does not match it.
    """
    x1, y1, x2, y2 = (int(v) for v in box)
    height, width = frame.shape[:2]
    if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
        raise ValueError(f"box {box} is empty or outside the {width}x{height} frame")
    if face.shape != (y2 - y1, x2 - x1, 3):
        raise ValueError(f"face has shape {face.shape}, the box {box} needs {(y2 - y1, x2 - x1, 3)}")
    mask = feather_mask(y2 - y1, x2 - x1)
    region = frame[y1:y2, x1:x2].astype(np.float32)
    blended = region + mask * (face.astype(np.float32) - region)
    out = frame.copy()
    # Values lie in [0, 255], so +0.5 then truncation is rounding; where mask == 1 this is exactly face.
    out[y1:y2, x1:x2] = (blended + 0.5).astype(np.uint8)
    return out
