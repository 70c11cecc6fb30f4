"""A session's output size (the avatar's, or scaled down) and the I420 scaling."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from services.live.frame_size import i420_scaler, output_size
from services.media.video_format import split_i420, to_yuv420
from services.serving.errors import InvalidRequest


def test_output_size_keeps_the_aspect_and_even_sides() -> None:
    assert output_size(1280, 720) == (1280, 720)
    assert output_size(1280, 720, max_height=1080) == (1280, 720)  # never scaled up
    assert output_size(1280, 720, max_height=480) == (854, 480)
    assert output_size(1920, 1080, max_height=361) == (640, 360)
    assert output_size(512, 512, width=256, height=256) == (256, 256)
    for bad in ({"width": 255, "height": 256}, {"width": 1024, "height": 1024}):
        with pytest.raises(InvalidRequest, match="even sides"):
            output_size(512, 512, **bad)
    with pytest.raises(InvalidRequest, match="16 pixels"):
        output_size(512, 512, max_height=8)


def test_the_scaler_resizes_each_plane() -> None:
    rng = np.random.default_rng(3)
    bgr = cv2.GaussianBlur(rng.integers(0, 255, (360, 640, 3), np.uint8), (9, 9), 3)
    i420 = to_yuv420(bgr)
    assert i420_scaler(640, 360, 640, 360) is None
    scale = i420_scaler(640, 360, 320, 180)
    assert scale is not None
    out = scale(i420)
    assert out.shape == (270, 320) and out.dtype == np.uint8
    y, u, v = split_i420(out, 180, 320)
    y0, u0, v0 = split_i420(i420, 360, 640)
    np.testing.assert_array_equal(y, cv2.resize(y0, (320, 180), interpolation=cv2.INTER_AREA))
    np.testing.assert_array_equal(v, cv2.resize(v0, (160, 90), interpolation=cv2.INTER_AREA))
    assert (
        np.abs(
            cv2.cvtColor(out, cv2.COLOR_YUV2BGR_I420).astype(int)
            - cv2.resize(bgr, (320, 180), interpolation=cv2.INTER_AREA)
        ).mean()
        < 3
    )
    assert u.shape == (90, 160)
