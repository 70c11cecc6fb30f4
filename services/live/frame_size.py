"""A live session's output size: the avatar's, or scaled down to a maximum height, and the scaling itself.

Why scale I420 plane by plane: the compositor writes I420 at the avatar's size and x264 takes I420,
so a smaller session resizes the three planes (area interpolation, ~0.3 ms for 1080p -> 540p) and
never converts colour; JPEG sessions convert once, in the encoder.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

from services.media.video_format import split_i420
from services.serving.errors import InvalidRequest


def output_size(
    avatar_width: int, avatar_height: int, max_height: int = 0, width: int = 0, height: int = 0
) -> tuple[int, int]:
    """(width, height) of the frames sent: an explicit even size no larger than the avatar's, else the
    avatar's scaled down (aspect kept, even sides) to at most ``max_height`` (0: no limit)."""
    if width or height:
        if width <= 0 or height <= 0 or width % 2 or height % 2 or width > avatar_width or height > avatar_height:
            raise InvalidRequest(
                f"frame size {width}x{height}: give even sides no larger than the avatar's {avatar_width}x{avatar_height}"
            )
        return width, height
    if not max_height or max_height >= avatar_height:
        return avatar_width, avatar_height
    if max_height < 16:
        raise InvalidRequest(f"max_height {max_height}: frames are at least 16 pixels high")
    out_height = max_height - max_height % 2
    out_width = max(2, round(avatar_width * out_height / avatar_height / 2) * 2)
    return out_width, out_height


def i420_scaler(width: int, height: int, out_width: int, out_height: int) -> Callable[[np.ndarray], np.ndarray] | None:
    """A function that scales an I420 frame of ``width`` x ``height`` to the output size; None when they are equal."""
    if (width, height) == (out_width, out_height):
        return None

    def scale(frame: np.ndarray) -> np.ndarray:
        planes = split_i420(np.ascontiguousarray(frame), height, width)
        sizes = ((out_width, out_height), (out_width // 2, out_height // 2), (out_width // 2, out_height // 2))
        scaled = [cv2.resize(plane, size, interpolation=cv2.INTER_AREA) for plane, size in zip(planes, sizes)]
        return np.concatenate([p.reshape(-1) for p in scaled]).reshape(out_height * 3 // 2, out_width)

    return scale
