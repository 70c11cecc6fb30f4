"""The video conventions every encoder in lipline shares (render's MP4 segments, live's per-frame
stream): the I420 layout the compositor writes and the encoders read, the BT.601 colour tags, the
x264 presets, and exact frame rates for time bases."""

from __future__ import annotations

from fractions import Fraction

import cv2
import numpy as np


def split_i420(frame: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y (height, width), U and V (height/2, width/2) views of a C-contiguous I420 frame (the
    (height * 3 / 2, width) layout of `to_yuv420`)."""
    flat = frame.reshape(-1)
    y_size = height * width
    c_size = y_size // 4
    return (
        flat[:y_size].reshape(height, width),
        flat[y_size : y_size + c_size].reshape(height // 2, width // 2),
        flat[y_size + c_size : y_size + 2 * c_size].reshape(height // 2, width // 2),
    )


def to_yuv420(frame_bgr: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 BGR -> (H * 3 / 2, W) uint8 I420 planes (Y, then U, then V), BT.601 limited range.

    Why not let PyAV convert: its swscale path (bgr24 -> yuv420p) runs single-threaded on the
    encoding thread and measured 8.4 ms per 720p frame on 2 cores, against 1.8 ms for OpenCV's
    SIMD conversion, which also releases the GIL. Both use BT.601 limited-range coefficients (what
    an untagged H.264 stream is read as); they differ by rounding only (Y within 1 level, chroma
    within 3 where swscale filters the 2x2 subsampling differently).
    """
    return cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2YUV_I420)


def exact_rate(fps: float) -> Fraction:
    """The exact frame rate for ``fps``: 25 -> 25/1, 29.97 or 29.97002997 -> 30000/1001.

    A float fps cannot be a time base; the NTSC family (N * 1000/1001) is snapped explicitly because
    a typed 29.97 would otherwise become 2997/100, which drifts against 30000/1001 material.
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    ntsc = round(fps * 1.001)
    if abs(fps - round(fps)) > 1e-6 and abs(fps * 1.001 - ntsc) < 1e-3:
        return Fraction(ntsc * 1000, 1001)
    return Fraction(fps).limit_denominator(1001)


X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


#: The colour tags of every H.264 stream lipline writes (render's `Mp4Writer`, live's encoder) (AVCodecContext values; docs/quality.md).
#: They state what the pixels are, so that players do not guess (many assume BT.709 for HD):
#: * matrix BT.601 (smpte170m; bt470bg has the same coefficients) and range limited (tv, 16-235/240):
#:   the frames are converted by OpenCV's COLOR_BGR2YUV_I420 (`to_yuv420`, the compositor's
#:   `I420Frames`), whose coefficients are BT.601 limited range (white -> Y 235, black -> Y 16,
#:   pure red -> Y 82, V 240; checked by tests/unit/render/test_quality.py) whatever the frame size;
#: * primaries and transfer BT.709: nothing in the pipeline converts them, so they are the
#:   source's, and the sources are camera videos and photos (sRGB: BT.709 primaries, a
#:   BT.709-like transfer).
COLOR_TAGS = {"colorspace": 6, "color_range": 1, "color_primaries": 1, "color_trc": 1}

COLOR_TAG_NAMES = {"colorspace": "smpte170m", "color_range": "tv", "color_primaries": "bt709", "color_trc": "bt709"}
