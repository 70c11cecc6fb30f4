"""The alpha masks a `musetalk` avatar's generated faces are pasted through, as upstream MuseTalk 1.5
builds them (`utils/blending.get_image_prepare_material`, `utils/face_parsing`'s "jaw" mode; the
reference's section 6): per frame, over the square 1.5x around the face box.

1. `mask_box`: the square of side 2 s, s = int(max(w, h) // 2 x 1.5), around the box's centre (it may
   reach past the frame: those pixels are black in the crop and never pasted);
2. the square's parsing into a 0/255 mask: BiSeNet's classes through `jaw_mask` (skin dilated by a cone
   kernel, eroded in the cheek bands, nose removed, mouth and lips added), or without a face parser
   `ellipse_mask`, a lower-face ellipse in the face box (the weight-free stand-in);
3. `finish_mask`: kept only inside the face box and only from the square's middle row down, then a
   Gaussian blur of kernel int(0.1 x side // 2 x 2) + 1 (upstream's realtime preparation).
numpy and OpenCV only; the parsing network runs in services/lipsync/musetalk/prep.py.
"""

from __future__ import annotations

import cv2
import numpy as np

from services.media.crops import Box

__all__ = ["ellipse_mask", "finish_mask", "jaw_mask", "mask_box", "square_crop"]

PARSE_SIZE = 512  # the face parser's input side
EXPAND = 1.5
UPPER_BOUNDARY_RATIO = 0.5  # the mask starts at the square's middle row
BLUR_FRACTION = 0.1  # realtime preparation's blur kernel, of the square's side
CHEEK_WIDTH = 90  # v1.5 inference's left/right cheek widths, px of the 512 parsing map
SKIN, NOSE = 1, 10
MOUTH_CLASSES = (11, 12, 13)  # mouth, upper lip, lower lip


def mask_box(box: Box, expand: float = EXPAND) -> Box:
    """The square the mask covers: upstream's `get_crop_box` (integer centre, s = int(max // 2 x 1.5))."""
    x1, y1, x2, y2 = box
    cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
    s = int(max(x2 - x1, y2 - y1) // 2 * expand)
    return (cx - s, cy - s, cx + s, cy + s)


def square_crop(frame: np.ndarray, square: Box) -> np.ndarray:
    """The frame's pixels in `square`, black where it reaches past the frame (PIL's crop, as upstream)."""
    x1, y1, x2, y2 = square
    out = np.zeros((y2 - y1, x2 - x1, *frame.shape[2:]), frame.dtype)
    h, w = frame.shape[:2]
    fx1, fy1, fx2, fy2 = max(0, x1), max(0, y1), min(w, x2), min(h, y2)
    if fx2 > fx1 and fy2 > fy1:
        out[fy1 - y1 : fy2 - y1, fx1 - x1 : fx2 - x1] = frame[fy1:fy2, fx1:fx2]
    return out


def _cone_kernel(cone_height: int = 21, tail_height: int = 12) -> np.ndarray:
    """Upstream's dilation kernel: a downward cone (rows from half the cone's height widen by 2), then
    a vertical tail as wide as the cone's last row: the skin mask grows down over the jaw, not up."""
    size = cone_height + tail_height
    kernel = np.zeros((size, size), np.uint8)
    centre = size // 2
    for row in range(cone_height // 2, cone_height):
        width = 2 * (row - cone_height // 2) + 1
        kernel[row, centre - width // 2 : centre + width // 2 + 1] = 1
    base = int(kernel[cone_height - 1].sum())
    kernel[cone_height:, max(0, centre - base // 2) : min(size, centre + base // 2 + 1)] = 1
    return kernel


_KERNEL = _cone_kernel()
_CHEEK_KERNEL = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3))


def _cheek_bands(width: int = CHEEK_WIDTH) -> np.ndarray:
    """255 left and right of the central +-`width` columns of the 512 map (the cheeks), 0 between."""
    bands = np.zeros((PARSE_SIZE, PARSE_SIZE), np.uint8)
    centre = PARSE_SIZE // 2
    cv2.rectangle(bands, (0, 0), (centre - width, PARSE_SIZE), 255, -1)
    cv2.rectangle(bands, (centre + width, 0), (PARSE_SIZE, PARSE_SIZE), 255, -1)
    return bands


_CHEEKS = _cheek_bands()


def jaw_mask(parsing: np.ndarray) -> np.ndarray:
    """(512, 512) class indices (BiSeNet's argmax) -> 0/255 uint8 mask, upstream's "jaw" mode."""
    face = np.where(parsing == SKIN, 255, 0).astype(np.uint8)
    dilated = cv2.dilate(face, _KERNEL, iterations=1)
    eroded = cv2.erode(dilated, _CHEEK_KERNEL, iterations=2)
    region = cv2.bitwise_or(cv2.bitwise_and(eroded, _CHEEKS), cv2.bitwise_and(dilated, cv2.bitwise_not(_CHEEKS)))
    keep = ((region == 255) & (parsing != NOSE)) | np.isin(parsing, MOUTH_CLASSES)
    return np.where(keep, 255, 0).astype(np.uint8)


def ellipse_mask(box: Box, square: Box) -> np.ndarray:
    """The mask over `square` without a face parser: a filled ellipse over the mouth and chin of `box`
    (centre at 76 % of its height, half axes 32 % of its width and 22 % of its height)."""
    x1, y1, x2, y2 = box
    sx1, sy1, sx2, sy2 = square
    out = np.zeros((sy2 - sy1, sx2 - sx1), np.uint8)
    w, h = x2 - x1, y2 - y1
    centre = (round((x1 + x2) / 2 - sx1), round(y1 + 0.76 * h - sy1))
    cv2.ellipse(out, centre, (max(1, round(0.32 * w)), max(1, round(0.22 * h))), 0, 0, 360, 255, -1)
    return out


def finish_mask(mask: np.ndarray, box: Box, square: Box) -> np.ndarray:
    """A 0/255 mask over `square` -> the blurred alpha: only inside `box`, only from the square's
    middle row down, Gaussian-blurred (upstream's `get_image_prepare_material`)."""
    x1, y1, x2, y2 = box
    sx1, sy1, _, _ = square
    height, width = mask.shape
    kept = np.zeros_like(mask)
    bx1, by1, bx2, by2 = max(0, x1 - sx1), max(0, y1 - sy1), min(width, x2 - sx1), min(height, y2 - sy1)
    kept[by1:by2, bx1:bx2] = mask[by1:by2, bx1:bx2]
    kept[: int(height * UPPER_BOUNDARY_RATIO)] = 0
    kernel = int(BLUR_FRACTION * width // 2 * 2) + 1
    return cv2.GaussianBlur(kept, (kernel, kernel), 0)
