"""Tests for services.gateway.encoding: splitting a clip into parts and encoding them in parallel."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import av
import numpy as np
import pytest

from services.gateway.avatars import build_avatar
from services.gateway.encoding import ClipEncoder, EncodeClock, interleave_key, segment_bounds
from services.gateway.media import probe_media

BOX = (8, 8, 40, 40)  # x1, y1, x2, y2 of the face in every avatar frame


def test_segment_bounds() -> None:
    assert segment_bounds(0, 4) == []
    assert segment_bounds(150, 4, 100) == [(0, 150)]  # too short for two parts
    assert segment_bounds(1500, 4, 100) == [(0, 375), (375, 750), (750, 1125), (1125, 1500)]
    assert segment_bounds(250, 8, 100) == [(0, 125), (125, 250)]  # the minimum length caps the count
    assert segment_bounds(1501, 1, 100) == [(0, 1501)]
    for total in (1, 99, 250, 1003):
        bounds = segment_bounds(total, 3, 10)
        assert bounds[0][0] == 0 and bounds[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))


def test_interleave_key_deals_frames_across_parts() -> None:
    bounds = [(0, 3), (3, 6), (6, 8)]
    order = sorted(range(8), key=lambda i: interleave_key(i, bounds))
    assert order == [0, 3, 6, 1, 4, 7, 2, 5]


def _avatar(frames: int = 3):
    """An avatar whose template frames are flat grey, with a face box in each."""
    pictures = np.stack([np.full((48, 64, 3), 40 + 10 * k, np.uint8) for k in range(frames)])
    return build_avatar("a" * 24, "test", pictures, 25.0, [BOX] * frames)


def _face(level: int) -> np.ndarray:
    x1, y1, x2, y2 = BOX
    return np.full((y2 - y1, x2 - x1, 3), level, np.uint8)


def _encode(out: Path, total: int, parts: int, faces: dict[int, int], min_frames: int = 10) -> EncodeClock:
    """Run a ClipEncoder over `total` frames; `faces` maps frame -> face level (others pass through)."""

    async def go() -> EncodeClock:
        clock = EncodeClock(time.perf_counter())
        bounds = segment_bounds(total, parts, min_frames)
        encoder = ClipEncoder(_avatar(), out, np.zeros(total * 640, np.float32), 16000, bounds, clock, lambda *_: None, crf=0)
        await encoder.start()
        try:
            for index in sorted(faces, key=lambda i: interleave_key(i, bounds)):
                await encoder.put(index, _face(faces[index]))
            await encoder.finish()
        except BaseException:
            await encoder.abort()
            raise
        return clock

    return asyncio.run(go())


@pytest.mark.parametrize("parts", [1, 3])
def test_clip_encoder_writes_every_frame_in_order(tmp_path: Path, parts: int) -> None:
    total = 45
    faces = {i: 200 if i % 2 else 120 for i in range(total) if i % 5}  # every 5th frame has no face
    out = tmp_path / "clip.mp4"
    clock = _encode(out, total, parts, faces)
    info = probe_media(out)
    assert (info["video_codec"], info["audio_codec"], info["frames"]) == ("h264", "aac", total)
    assert info["video_duration"] == pytest.approx(total / 25)
    with av.open(str(out)) as container:
        decoded = [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]
    x1, y1, x2, y2 = BOX
    for i, frame in enumerate(decoded):
        centre = frame[y1 + 12 : y2 - 12, x1 + 12 : x2 - 12].mean()
        expected = faces.get(i, 40 + 10 * (i % 3))  # the face, or the template frame (it loops)
        assert abs(centre - expected) < 3, (i, centre, expected)
        assert abs(frame[:, 50:].mean() - (40 + 10 * (i % 3))) < 3  # outside the box: the template
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]  # the parts are gone
    assert clock.composite > 0 and clock.encode > 0 and clock.first_frame > 0


def test_clip_encoder_failure_removes_every_file(tmp_path: Path) -> None:
    out = tmp_path / "clip.mp4"

    async def go() -> None:
        bounds = segment_bounds(40, 2, 10)
        encoder = ClipEncoder(_avatar(), out, np.zeros(40 * 640, np.float32), 16000, bounds, EncodeClock(time.perf_counter()), lambda *_: None)
        await encoder.start()
        try:
            await encoder.put(0, _face(100))
            await encoder.put(20, np.zeros((5, 5, 3), np.uint8))  # not the box's size: paste_face raises
            await encoder.finish()
        except BaseException:
            await encoder.abort()
            raise

    with pytest.raises(ValueError, match="face has shape"):
        asyncio.run(go())
    assert list(tmp_path.iterdir()) == []


def test_frames_of_a_part_must_come_in_order(tmp_path: Path) -> None:
    async def go() -> None:
        encoder = ClipEncoder(_avatar(), tmp_path / "clip.mp4", np.zeros(6400, np.float32), 16000,
                              [(0, 10)], EncodeClock(time.perf_counter()), lambda *_: None)
        await encoder.start()
        try:
            await encoder.put(5, None)
            with pytest.raises(ValueError, match="arrived after"):
                await encoder.put(3, None)
        finally:
            await encoder.abort()

    asyncio.run(go())
    assert list(tmp_path.iterdir()) == []
