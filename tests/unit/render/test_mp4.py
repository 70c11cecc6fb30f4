"""Tests for services.render.mp4 (segments, AAC, the join, I420), the reference paste and probing."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from services.media.composite import feather_mask
from services.media.probe import probe_media
from services.media.video_format import exact_rate, to_yuv420
from services.render.mp4 import Mp4Writer, encode_aac, join_segments
from services.render.reference import paste_face
from tests.helpers.video_files import smooth_image, write_flat_video


def _sine(seconds: float, rate: int, hz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(round(seconds * rate)) / rate)).astype(np.float32)


def test_feather_mask_properties() -> None:
    mask = feather_mask(96, 80)
    assert mask.shape == (96, 80, 1) and mask.dtype == np.float32
    assert mask.min() >= 0.0 and mask.max() <= 1.0
    assert mask[48, 40, 0] == 1.0
    for border in (mask[0], mask[-1], mask[:, 0], mask[:, -1]):
        assert border.max() < 1e-6
    # Monotonic: rises from each edge to the centre along the middle row and column.
    row, col = mask[48, :, 0], mask[:, 40, 0]
    assert np.all(np.diff(row[:40]) >= 0) and np.all(np.diff(row[40:]) <= 0)
    assert np.all(np.diff(col[:48]) >= 0) and np.all(np.diff(col[48:]) <= 0)
    assert (row < 1).sum() < 0.4 * 80  # the ramp covers ~15% of each side, the rest is fully the face


def test_feather_mask_is_cached_and_read_only() -> None:
    mask = feather_mask(32, 32)
    assert feather_mask(32, 32) is mask
    with pytest.raises(ValueError):
        mask[0, 0, 0] = 1.0
    assert feather_mask(32, 32, 0.0).min() == 1.0  # no feather: a hard paste


def test_paste_face_changes_only_the_box() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    original = frame.copy()
    face = np.full((50, 40, 3), 7, np.uint8)
    x1, y1, x2, y2 = 30, 20, 70, 70
    out = paste_face(frame, face, (x1, y1, x2, y2))
    np.testing.assert_array_equal(frame, original)  # input untouched
    outside = np.ones(frame.shape[:2], bool)
    outside[y1:y2, x1:x2] = False
    np.testing.assert_array_equal(out[outside], frame[outside])
    np.testing.assert_array_equal(out[(y1 + y2) // 2, (x1 + x2) // 2], face[25, 20])
    np.testing.assert_array_equal(out[y1, x1], frame[y1, x1])  # border pixel: mask 0, frame kept


def test_paste_face_shape_mismatch() -> None:
    frame = np.zeros((100, 100, 3), np.uint8)
    with pytest.raises(ValueError, match="shape"):
        paste_face(frame, np.zeros((10, 10, 3), np.uint8), (0, 0, 20, 10))
    with pytest.raises(ValueError, match="outside"):
        paste_face(frame, np.zeros((20, 20, 3), np.uint8), (90, 90, 110, 110))


# --- Mp4Writer / probe_media -----------------------------------------------------------------------


def test_mp4_video_and_audio(tmp_path: Path) -> None:
    path = tmp_path / "out.mp4"
    with Mp4Writer(path, 64, 48, 25.0, _sine(2.0, 16000), 16000) as writer:
        for i in range(50):
            writer.write(np.full((48, 64, 3), i * 5, np.uint8))
    info = probe_media(path)
    assert info["video_codec"] == "h264" and info["audio_codec"] == "aac"
    assert (info["width"], info["height"], info["fps"]) == (64, 48, 25.0)
    assert info["frames"] == 50
    assert info["video_duration"] == pytest.approx(2.0)
    assert info["audio_rate"] == 16000
    assert abs(info["audio_duration"] - 2.0) < 0.05
    data = path.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")  # +faststart: playable while downloading


def test_mp4_ntsc_rate(tmp_path: Path) -> None:
    assert exact_rate(25) == Fraction(25, 1)
    assert exact_rate(29.97) == exact_rate(30000 / 1001) == Fraction(30000, 1001)
    path = write_flat_video(tmp_path / "ntsc.mp4", frames=30, fps=30000 / 1001)
    info = probe_media(path)
    assert info["fps"] == pytest.approx(30000 / 1001)
    assert info["frames"] == 30
    assert info["video_duration"] == pytest.approx(30 * 1001 / 30000)
    assert info["audio_codec"] is None


def test_mp4_appears_only_at_close(tmp_path: Path) -> None:
    path = tmp_path / "atomic.mp4"
    writer = Mp4Writer(path, 64, 48, 25.0, _sine(0.4, 16000), 16000)
    for _ in range(10):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    assert not path.exists()
    assert len(list(tmp_path.iterdir())) == 1  # the temporary file, next to the final path
    writer.close()
    assert path.exists() and list(tmp_path.iterdir()) == [path]
    assert probe_media(path)["frames"] == 10


def test_mp4_error_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "failed.mp4"
    with pytest.raises(RuntimeError):
        with Mp4Writer(path, 64, 48, 25.0, None, 16000) as writer:
            writer.write(np.zeros((48, 64, 3), np.uint8))
            with pytest.raises(ValueError, match="shape"):
                writer.write(np.zeros((50, 64, 3), np.uint8))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_yuv420_conversion_matches_pyav_within_rounding() -> None:
    """OpenCV's I420 conversion stands in for PyAV's swscale one: same matrix and range, rounding apart."""
    frame = smooth_image(48, 64)
    frame[10:30, 20:40] = (30, 200, 90)  # a saturated patch: chroma far from neutral
    ours = to_yuv420(frame)
    pyav = av.VideoFrame.from_ndarray(frame, format="bgr24").reformat(format="yuv420p").to_ndarray()
    assert ours.shape == pyav.shape == (72, 64) and ours.dtype == np.uint8
    diff = np.abs(ours.astype(int) - pyav)
    assert diff[:48].max() <= 1  # luma
    assert diff[48:].max() <= 3 and diff[48:].mean() < 1.0  # chroma: 2x2 subsampling filters differ


def test_write_yuv420_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "i420.mp4"
    frame = smooth_image(48, 64)
    with Mp4Writer(path, 64, 48, 25.0, None, 16000, crf=0) as writer:
        for _ in range(5):
            writer.write_yuv420(to_yuv420(frame))
        with pytest.raises(ValueError, match="I420"):
            writer.write_yuv420(np.zeros((48, 64), np.uint8))  # missing the chroma planes
    with av.open(str(path)) as container:
        decoded = next(container.decode(video=0)).to_ndarray(format="bgr24")
    assert probe_media(path)["frames"] == 5
    assert np.abs(decoded.astype(int) - frame).mean() < 3  # lossless x264; only the YUV round trip differs


@pytest.mark.parametrize("size", [(64, 48), (1000, 200)], ids=["64x48", "1000x200-padded-chroma-rows"])
def test_one_reused_frame_encodes_each_distinct_frame(tmp_path: Path, size: tuple[int, int]) -> None:
    # `i420_planes` hands out the same frame every time: if x264 kept a pointer to it instead of
    # copying (B-frames and the lookahead hold frames back), later frames would overwrite earlier
    # ones. Each frame here is a flat grey of its own level, with B-frames and lookahead on.
    width, height = size
    path = tmp_path / "reused.mp4"
    levels = [16 + 7 * k for k in range(30)]
    with Mp4Writer(path, width, height, 25.0, None, 16000, crf=0, preset="veryfast", threads=2) as writer:
        for level in levels:
            y, u, v = writer.i420_planes()
            assert y.shape == (height, width) and u.shape == v.shape == (height // 2, width // 2)
            y[:] = level
            u[:] = 128
            v[:] = 128
            writer.write_planes()
    with av.open(str(path)) as container:
        decoded = [frame.to_ndarray(format="yuv420p")[:height] for frame in container.decode(video=0)]
    assert [int(round(float(f.mean()))) for f in decoded] == levels


def test_unknown_x264_preset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="preset"):
        Mp4Writer(tmp_path / "x.mp4", 64, 48, 25.0, None, 16000, preset="warpspeed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fps", [25.0, 30000 / 1001])
def test_join_segments_is_one_playable_clip(tmp_path: Path, fps: float) -> None:
    """Segments encoded apart (B-frames and all) and an AAC track join into one clip by stream copy:
    frames in order, audio whole, interleaved, moov first."""
    lengths = [30, 25, 20]
    levels = np.arange(sum(lengths)) * 3 % 256  # each frame its own grey level, to check the order
    parts, start = [], 0
    for k, n in enumerate(lengths):
        part = tmp_path / f"part{k}.mp4"
        with Mp4Writer(part, 64, 48, fps, None, 16000, crf=0, threads=2) as writer:
            for level in levels[start : start + n]:
                writer.write(np.full((48, 64, 3), level, np.uint8))
        parts.append(part)
        start += n
    seconds = sum(lengths) / fps
    out = tmp_path / "joined.mp4"
    encode_aac(_sine(seconds, 48000), 48000, tmp_path / "audio.m4a")
    assert join_segments(parts, out, fps, tmp_path / "audio.m4a") == 75
    info = probe_media(out)
    assert (info["video_codec"], info["audio_codec"]) == ("h264", "aac")
    assert info["frames"] == 75
    assert info["video_duration"] == pytest.approx(seconds)
    assert abs(info["audio_duration"] - seconds) < 0.05
    with av.open(str(out)) as container:
        decoded = [f.to_ndarray(format="gray").mean() for f in container.decode(video=0)]
    assert np.abs(np.array(decoded) - levels).max() < 2  # every frame in its place
    data = out.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "audio.m4a",
        "joined.mp4",
        "part0.mp4",
        "part1.mp4",
        "part2.mp4",
    ]


def test_join_segments_failure_leaves_no_file(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.mp4"
    bogus.write_bytes(b"not an mp4")
    with pytest.raises(Exception):
        join_segments([bogus], tmp_path / "out.mp4", 25.0, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bogus.mp4"]
