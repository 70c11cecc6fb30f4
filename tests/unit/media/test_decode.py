"""Tests for services.media.decode: avatar decoding (photos, videos, limits)."""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from services.media.decode import decode_avatar
from services.serving.errors import InvalidMedia, TooLarge
from tests.helpers.video_files import smooth_image, write_flat_video

# --- decode_avatar -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_decode_photo(ext: str) -> None:
    image = smooth_image(60, 80)
    ok, encoded = cv2.imencode(ext, image)
    assert ok
    frames, fps = decode_avatar(encoded.tobytes(), photo_fps=30.0, min_side=1)
    assert frames.shape == (1, 60, 80, 3) and frames.dtype == np.uint8
    assert fps == 30.0
    tolerance = 0 if ext == ".png" else 8  # PNG is lossless, JPEG close on a smooth image
    assert np.abs(frames[0].astype(int) - image).max() <= tolerance


def test_odd_photo_size_is_cropped_even() -> None:
    image = smooth_image(61, 81)
    frames, _ = decode_avatar(cv2.imencode(".png", image)[1].tobytes(), min_side=1)
    assert frames.shape == (1, 60, 80, 3)
    np.testing.assert_array_equal(frames[0], image[:60, :80])  # crop the last row/column, no resize
    assert frames.flags.c_contiguous


def test_decode_video(tmp_path: Path) -> None:
    data = write_flat_video(tmp_path / "avatar.mp4", frames=10, fps=25.0).read_bytes()
    frames, fps = decode_avatar(data, min_side=1)
    assert frames.shape == (10, 48, 64, 3)
    assert fps == 25.0
    # The frames come back in order (grey i*20; the yuv420p round trip shifts greys by a few levels).
    means = frames.reshape(10, -1).mean(axis=1)
    assert np.all(np.diff(means) > 10) and abs(means[3] - 60) < 6


def test_decode_video_applies_display_rotation(tmp_path: Path) -> None:
    # Phone videos are stored sideways with a rotation tag; the decoder must return them upright.
    path = tmp_path / "rotated.mp4"
    image = np.zeros((16, 32, 3), np.uint8)
    image[:, :8] = 255  # white strip on the left
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 16, "yuv420p"
        stream.set_display_rotation(90)  # shown rotated 90 degrees counterclockwise
        for i in range(2):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    frames, _ = decode_avatar(path.read_bytes(), min_side=1)
    assert frames.shape == (2, 32, 16, 3)
    assert frames[0, -8:].mean() > 200 and frames[0, :-8].mean() < 50  # the left strip is now at the bottom


def test_video_too_many_frames(tmp_path: Path) -> None:
    data = write_flat_video(tmp_path / "long.mp4", frames=10, fps=25.0).read_bytes()
    with pytest.raises(TooLarge, match="more than 5 frames"):
        decode_avatar(data, max_frames=5, min_side=1)
    assert decode_avatar(data, max_frames=10, min_side=1)[0].shape[0] == 10  # the limit itself is allowed


def test_too_many_pixels(tmp_path: Path) -> None:
    photo = cv2.imencode(".png", smooth_image(60, 80))[1].tobytes()
    with pytest.raises(TooLarge, match="resize to at most 1000"):
        decode_avatar(photo, max_pixels=1000)
    video = write_flat_video(tmp_path / "big.mp4", frames=2, fps=25.0).read_bytes()
    with pytest.raises(TooLarge, match="64x48"):
        decode_avatar(video, max_pixels=1000)


def test_empty_and_garbage_are_invalid() -> None:
    with pytest.raises(InvalidMedia, match="avatar is empty"):
        decode_avatar(b"")
    with pytest.raises(InvalidMedia, match="could not decode the avatar as an image or a video.*send JPEG"):
        decode_avatar(b"this is not an image nor a video" * 100)


# --- feather_mask / paste_face ---------------------------------------------------------------------
