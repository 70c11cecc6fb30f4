"""The live encoders: every frame's access unit (or JPEG) out of its own call, decodable, keyframes where asked."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from services.live.encoders import H264Encoder, JpegEncoder
from services.media.video_format import split_i420, to_yuv420

AVATAR = Path(__file__).resolve().parents[3] / "samples" / "avatar.jpg"
FPS = Fraction(25)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def talking_frames() -> list[np.ndarray]:
    """BGR frames of the sample avatar whose lower face changes every frame (a mouth opening and closing)."""
    base = cv2.imread(str(AVATAR))
    assert base is not None and base.shape == (512, 512, 3)
    frames = []
    for k in range(120):
        frame = base.copy()
        opening = int(6 + 6 * np.sin(k / 3))
        region = frame[300:380, 190:320]
        frame[300:380, 190:320] = np.roll(region, opening, axis=0)
        frames.append(frame)
    return frames


def decoded_i420(frame: av.VideoFrame) -> np.ndarray:
    """The decoded picture in the layout of the input (Y, then U, then V rows)."""
    planes = frame.to_ndarray(format="yuv420p")
    assert planes.shape == (frame.height * 3 // 2, frame.width)
    return planes


def nal_types(access_unit: bytes) -> list[int]:
    """NAL unit types of an Annex B access unit (after each 00 00 01 start code)."""
    types, i = [], access_unit.find(b"\x00\x00\x01")
    while i != -1:
        types.append(access_unit[i + 3] & 0x1F)
        i = access_unit.find(b"\x00\x00\x01", i + 3)
    return types


def test_h264_one_access_unit_per_frame_decoded_at_once_with_psnr(talking_frames) -> None:
    encoder = H264Encoder(512, 512, FPS)
    decoder = av.CodecContext.create("h264", "r")
    values = []
    for k, frame in enumerate(talking_frames):
        source = to_yuv420(frame)
        unit = encoder.encode(source, pts=k)
        assert unit.pts == k
        assert unit.data.startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01"))  # Annex B
        # No frame of delay: the decoder gives this very frame back from this very access unit.
        pictures = decoder.decode(av.Packet(unit.data))
        assert len(pictures) == 1, f"frame {k}: {len(pictures)} pictures from its access unit"
        values.append(psnr(decoded_i420(pictures[0]), source))
    assert decoder.decode(None) == []  # nothing was held back
    assert min(values) > 30, f"PSNR min {min(values):.1f} dB"
    print(f"H.264 ultrafast crf 23 PSNR min {min(values):.1f} dB, mean {np.mean(values):.1f} dB")


def test_h264_accepts_bgr_and_writes_the_same_as_its_i420(talking_frames) -> None:
    from_bgr = H264Encoder(512, 512, FPS, crf=18)
    from_i420 = H264Encoder(512, 512, FPS, crf=18)
    for k, frame in enumerate(talking_frames[:5]):
        assert from_bgr.encode(frame, k).data == from_i420.encode(to_yuv420(frame), k).data


@pytest.mark.parametrize("codec", ["h264", "jpeg"])
def test_a_frame_written_into_the_input_planes_encodes_as_the_same_frame_given(codec: str, talking_frames) -> None:
    """A session composites speech frames straight into the encoder's input: the bytes must be what
    `encode` makes of the same I420 frame, frame after frame (H.264's P-frames reference the ones before)."""
    make = (lambda: H264Encoder(512, 512, FPS)) if codec == "h264" else (lambda: JpegEncoder(512, 512))
    given, written = make(), make()
    for k, frame in enumerate(talking_frames[:12]):
        source = to_yuv420(frame)
        for plane, part in zip(written.input_planes(), split_i420(source, 512, 512)):
            plane[:] = part
        assert written.encode_input(k) == given.encode(source, k), f"frame {k}"
    if codec == "h264":
        with pytest.raises(ValueError, match="pts 11 after 11"):
            written.encode_input(11)


def test_h264_keyframes_every_2_s_of_timestamps_and_on_demand(talking_frames) -> None:
    encoder = H264Encoder(512, 512, FPS)
    assert encoder.keyframe_interval == 50
    # 0..69, then a gap (frames 70..79 skipped), then 80..159; a forced keyframe at 120.
    timestamps = [*range(70), *range(80, 160)]
    keyframes = []
    for i, pts in enumerate(timestamps):
        if pts == 120:
            encoder.force_keyframe()
        unit = encoder.encode(talking_frames[i % len(talking_frames)], pts)
        is_idr = 5 in nal_types(unit.data)
        assert unit.keyframe == is_idr
        if unit.keyframe:
            assert {7, 8} <= set(nal_types(unit.data))  # SPS and PPS in band: a decoder can start here
            keyframes.append(pts)
    assert keyframes == [0, 50, 100, 120]  # 2 s on the clock (the gap counts), then from the forced one


def test_a_decoder_can_start_at_a_forced_keyframe(talking_frames) -> None:
    """What a resumed stream does: it gets frames from the forced IDR on, and they decode."""
    encoder = H264Encoder(512, 512, FPS)
    units = []
    for k, frame in enumerate(talking_frames[:30]):
        if k == 17:
            encoder.force_keyframe()
        units.append(encoder.encode(frame, k))
    decoder = av.CodecContext.create("h264", "r")
    for k in range(17, 30):
        pictures = decoder.decode(av.Packet(units[k].data))
        assert len(pictures) == 1
        assert psnr(decoded_i420(pictures[0]), to_yuv420(talking_frames[k])) > 30


def test_h264_bitrate_mode_stays_near_its_budget(talking_frames) -> None:
    encoder = H264Encoder(512, 512, FPS, bitrate_kbps=400)
    sizes = [len(encoder.encode(frame, k).data) for k, frame in enumerate(talking_frames)]
    kbps = sum(sizes) * 8 / (len(sizes) / 25) / 1000
    assert kbps < 400 * 1.5, f"{kbps:.0f} kbit/s against a 400 kbit/s budget"


def test_jpeg_decodes_with_opencv_and_quality_sets_the_size(talking_frames) -> None:
    high, low = JpegEncoder(512, 512, quality=90), JpegEncoder(512, 512, quality=40)
    for k, frame in enumerate(talking_frames[:10]):
        unit = high.encode(to_yuv420(frame), k)
        assert unit.keyframe and unit.pts == k
        image = cv2.imdecode(np.frombuffer(unit.data, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == frame.shape
        reference = cv2.cvtColor(to_yuv420(frame), cv2.COLOR_YUV2BGR_I420)  # what the I420 input shows
        assert psnr(image, reference) > 30
        assert len(low.encode(frame, k).data) < len(unit.data)


def test_bad_frames_and_settings_are_refused(talking_frames) -> None:
    with pytest.raises(ValueError, match="even"):
        H264Encoder(511, 512, FPS)
    with pytest.raises(ValueError, match="preset"):
        H264Encoder(512, 512, FPS, preset="warp")
    with pytest.raises(ValueError, match="quality"):
        JpegEncoder(512, 512, quality=0)
    encoder = H264Encoder(512, 512, FPS)
    with pytest.raises(ValueError, match="shape"):
        encoder.encode(np.zeros((512, 512), np.uint8), 0)
    encoder.encode(talking_frames[0], 3)
    with pytest.raises(ValueError, match="pts 3 after 3"):
        encoder.encode(talking_frames[1], 3)
