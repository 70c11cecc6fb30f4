"""Output quality rules (issue 10, items 1-3): the pasted region, ping-pong loops, colour tags.

* The compositor blends only the lower part of the face box (what the lip-sync model regenerates:
  rows 48-95 of its 96 px crop, from box row height/2 down), with a feathered top edge; above it
  the frame keeps the template's bytes, Y, U and V, before encoding.
* Templates shorter than the audio loop forward and back (ping-pong) unless the job asks for WRAP.
* Every MP4 says what its pixels are: BT.601 matrix, limited range (OpenCV's BGR->I420), BT.709
  primaries and transfer; joined outputs keep the tags.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from lipline.v1 import gateway_pb2
from services.media.composite import (
    Compositor,
    I420Frames,
    blend_mask,
    regenerated_start,
)
from services.media.timeline import LOOP_PING_PONG, LOOP_WRAP, loop_frame, loop_mode
from services.media.video_format import COLOR_TAG_NAMES, COLOR_TAGS, to_yuv420
from services.render.mp4 import Mp4Writer, join_segments

REPO_ROOT = Path(__file__).resolve().parents[3]


def _planes(frame: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    flat = frame.reshape(-1)
    n = height * width
    return (
        flat[:n].reshape(height, width),
        flat[n : n + n // 4].reshape(height // 2, width // 2),
        flat[n + n // 4 :].reshape(height // 2, width // 2),
    )


@pytest.fixture(scope="module")
def avatar() -> np.ndarray:
    image = cv2.imread(str(REPO_ROOT / "samples" / "avatar.jpg"), cv2.IMREAD_COLOR)
    h, w = image.shape[:2]
    return np.ascontiguousarray(image[: h - h % 2, : w - w % 2])


# -- 1. only the regenerated region ---------------------------------------------------------------


@pytest.mark.parametrize(
    "box",
    [
        (100, 80, 460, 480),
        (101, 81, 301, 333),
        (131, 97, 450, 420),
        (10, 11, 13, 200),
        (7, 9, 12, 14),
        (0, 0, 512, 512),
    ],
)
def test_upper_face_is_the_templates_bytes(avatar: np.ndarray, box: tuple[int, int, int, int]) -> None:
    """Y rows above box row height/2 and the chroma rows above it are bit-identical to the cached frame."""
    height, width = avatar.shape[:2]
    x1, y1, x2, y2 = box
    face = np.random.default_rng(x1 + y1).integers(0, 256, (y2 - y1, x2 - x1, 3), np.uint8)
    out = Compositor(I420Frames.from_bgr(avatar[None]), [box]).frame(0, face)
    plain = to_yuv420(avatar)
    start = y1 + regenerated_start(y2 - y1, 0.5)
    assert start == y1 + (y2 - y1) // 2
    gy, gu, gv = _planes(out, height, width)
    py, pu, pv = _planes(plain, height, width)
    assert np.array_equal(gy[:start], py[:start])
    assert np.array_equal(gu[: (start + 1) // 2], pu[: (start + 1) // 2])
    assert np.array_equal(gv[: (start + 1) // 2], pv[: (start + 1) // 2])
    # ... and the lower part is the face's (the test would see a paste): the mouth rows moved.
    mouth = slice(y1 + (y2 - y1) * 5 // 8, y2 - (y2 - y1) // 8)
    assert np.abs(gy[mouth, x1:x2].astype(int) - py[mouth, x1:x2]).mean() > 20


def test_the_whole_box_is_still_available(avatar: np.ndarray) -> None:
    box = (100, 80, 460, 480)
    face = np.full((400, 360, 3), 200, np.uint8)
    out = Compositor(I420Frames.from_bgr(avatar[None]), [box], regenerated_from=0).frame(0, face)
    gy, _, _ = _planes(out, *avatar.shape[:2])
    assert not np.array_equal(gy[80:280], to_yuv420(avatar)[80:280])  # the upper face was pasted over
    with pytest.raises(ValueError):
        Compositor(I420Frames.from_bgr(avatar[None]), [box], regenerated_from=1.0)


@pytest.mark.parametrize("height,width", [(400, 360), (600, 520), (96, 96), (257, 199)])
def test_mask_has_a_smooth_top_edge(height: int, width: int) -> None:
    """0 down to row height/2; a smoothstep up over 0.075 of the height; full weight on the lips."""
    mask = blend_mask(height, width, 0.15, 0.5)
    start = height // 2
    assert not mask[: start + 1].any()  # the first regenerated row still has weight 0: no step
    column = mask[:, width // 2]
    ramp = 0.15 * height / 2
    steps = np.diff(column)
    # A smoothstep over `ramp` rows rises by at most 1.5 / ramp per row (a hard paste: 1 in one row).
    assert steps.max() <= 1.5 / ramp + 1e-6
    assert steps[: start + int(ramp)].min() >= 0  # rising, no kink inside the ramp
    lips = slice(round(height * 57 / 96), round(height * 71 / 96))  # rows 57-70 of the 96 px crop
    assert column[lips].min() >= 0.99
    # The other edges keep the feather mask's ramps (left/right and bottom reach 0 at the border).
    assert mask[-1].max() == 0 and mask[:, 0].max() == 0 and mask[:, -1].max() == 0


def test_no_seam_on_the_real_face(avatar: np.ndarray) -> None:
    """A generated face 30 levels brighter than the template: no row step at the top edge above the image's own.

    (A hard edge measures 28.6 here against the image's own 11.9; the ramp 10.5.)
    """
    box = (100, 80, 460, 480)
    x1, y1, x2, y2 = box
    face = cv2.GaussianBlur(np.roll(avatar, (2, -2), axis=(0, 1))[y1:y2, x1:x2], (7, 7), 2)
    face = np.clip(face.astype(np.int16) + 30, 0, 255).astype(np.uint8)
    out = Compositor(I420Frames.from_bgr(avatar[None]), [box]).frame(0, face)
    gy, _, _ = _planes(out, *avatar.shape[:2])
    py, _, _ = _planes(to_yuv420(avatar), *avatar.shape[:2])
    edge = slice(y1 + 200 - 4, y1 + 200 + 34)  # the top ramp (30 rows) and around it
    got = np.abs(np.diff(gy[edge, x1 + 60 : x2 - 60].astype(np.float32), axis=0)).mean(axis=1)
    own = np.abs(np.diff(py[edge, x1 + 60 : x2 - 60].astype(np.float32), axis=0)).mean(axis=1)
    assert got.max() <= own.max() + 2.0, (got.round(2), own.round(2))


# -- 2. ping-pong ---------------------------------------------------------------------------------


def test_ping_pong_mapping() -> None:
    assert [loop_frame(i, 4) for i in range(14)] == [0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1]
    assert [loop_frame(i, 2) for i in range(5)] == [0, 1, 0, 1, 0]
    assert [loop_frame(i, 1) for i in range(4)] == [0, 0, 0, 0]  # a photo
    assert [loop_frame(i, 4, LOOP_WRAP) for i in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    assert [loop_frame(i, 1, LOOP_WRAP) for i in range(3)] == [0, 0, 0]
    # Consecutive output frames never show template frames more than 1 apart (no cut), F > 1.
    for frames in (2, 3, 10, 251):
        seq = [loop_frame(i, frames) for i in range(5 * frames)]
        assert max(abs(a - b) for a, b in itertools.pairwise(seq)) == 1 and set(seq) == set(range(frames))
    with pytest.raises(ValueError):
        loop_frame(3, 4, "bounce")
    with pytest.raises(ValueError):
        loop_frame(-1, 4)


def test_the_loop_defaults_to_ping_pong() -> None:
    assert [loop_frame(i, 3) for i in range(7)] == [0, 1, 2, 1, 0, 1, 2]
    assert [loop_frame(i, 3, LOOP_PING_PONG) for i in range(7)] == [0, 1, 2, 1, 0, 1, 2]
    assert [loop_frame(i, 3, LOOP_WRAP) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_job_options_choose_the_loop() -> None:
    """The worker reads the mode from the job's stored options bytes; unset is PING_PONG."""
    stored = gateway_pb2.JobOptions(crf=20).SerializeToString()
    assert loop_mode(gateway_pb2.JobOptions.FromString(stored)) == LOOP_PING_PONG
    assert loop_mode(gateway_pb2.JobOptions.FromString(b"")) == LOOP_PING_PONG
    wrap = gateway_pb2.JobOptions(loop=gateway_pb2.JobOptions.WRAP).SerializeToString()
    assert loop_mode(gateway_pb2.JobOptions.FromString(wrap)) == LOOP_WRAP
    assert gateway_pb2.JobOptions.PING_PONG == 0


# -- 3. colour tags -------------------------------------------------------------------------------


def test_opencv_i420_is_bt601_limited_range() -> None:
    """The conversion the tags describe: Y = 16 + 219 Y', U/V = 128 + 224 (B'-Y')/1.772, (R'-Y')/1.402 (BT.601)."""
    rng = np.random.default_rng(0)
    bgr = rng.integers(0, 256, (64, 64, 3), np.uint8)
    bgr = np.repeat(np.repeat(bgr[::2, ::2], 2, axis=0), 2, axis=1)  # flat 2x2 blocks: chroma siting does not matter
    y, u, v = _planes(to_yuv420(bgr), 64, 64)
    b, g, r = (bgr[..., k].astype(np.float64) / 255 for k in range(3))
    luma = 0.299 * r + 0.587 * g + 0.114 * b
    assert np.abs(y - (16 + 219 * luma)).max() <= 1
    assert np.abs(u - (128 + 224 * (b - luma) / 1.772)[::2, ::2]).max() <= 1
    assert np.abs(v - (128 + 224 * (r - luma) / 1.402)[::2, ::2]).max() <= 1
    # BT.709's luma of pure green (0.7152 -> Y 173) differs from BT.601's (0.587 -> Y 145).
    assert to_yuv420(np.full((2, 2, 3), (0, 255, 0), np.uint8))[0, 0] == 145
    assert COLOR_TAG_NAMES == {
        "colorspace": "smpte170m",
        "color_range": "tv",
        "color_primaries": "bt709",
        "color_trc": "bt709",
    }


def _tags(path: Path) -> tuple[dict, dict]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frame = next(container.decode(stream))
        return ({k: getattr(stream.codec_context, k) for k in COLOR_TAGS}, {k: getattr(frame, k) for k in COLOR_TAGS})


def test_writer_and_join_tag_the_stream(tmp_path: Path) -> None:
    parts = []
    for k in range(2):
        part = tmp_path / f"{k}.mp4"
        with Mp4Writer(part, 64, 48, 25.0, None, 16_000) as writer:
            for i in range(4):
                writer.write(np.full((48, 64, 3), 30 * i + k, np.uint8))
        parts.append(part)
    assert _tags(parts[0]) == (COLOR_TAGS, COLOR_TAGS)
    joined = tmp_path / "joined.mp4"
    assert join_segments(parts, joined, 25.0, None) == 8
    assert _tags(joined) == (COLOR_TAGS, COLOR_TAGS)
    # Named the way ffprobe names them (av's enum values: 6 smpte170m, 1 tv/mpeg, 1 bt709).
    assert COLOR_TAGS == {"colorspace": 6, "color_range": 1, "color_primaries": 1, "color_trc": 1}
