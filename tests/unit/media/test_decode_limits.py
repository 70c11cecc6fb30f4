"""Hostile inputs: decoders refuse oversized media from its headers, before they spend memory on it.

Covers `decode_avatar` (photos and videos), `image_from_proto` (stage items), `decode_audio`'s header
checks and `services.media.image_header`. The bombs are made here: a valid header that claims a
huge size in front of a few bytes of data, so each test file is small and fast to build.
"""

from __future__ import annotations

import io
import struct
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import pytest

from lipline.v1 import common_pb2
from services.media import av_limits
from services.media import decode as media
from services.media.audio import MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, decode_audio
from services.media.decode import MIN_AVATAR_SIDE, decode_avatar
from services.media.image_header import ImageHeaderError, ImageSize, read_image_size
from services.media.wire import MAX_IMAGE_SIDE, image_from_proto
from services.render.mp4 import Mp4Writer
from services.serving.errors import InvalidMedia, TooLarge
from tests.helpers.bombs import jpeg_claiming, png_claiming
from tests.helpers.video_files import encode_video

MB = 1 << 20


# --------------------------------------------------------------------------------------------------
# Helpers: memory measurement and bomb builders
# --------------------------------------------------------------------------------------------------


def _status(field: str) -> int:
    """A /proc/self/status memory field (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


@contextmanager
def _measured() -> Iterator[dict[str, float]]:
    """Measures a block: wall seconds, RSS growth (after - before) and, where possible, peak growth."""
    result: dict[str, float] = {}
    peak_ok = _reset_peak()
    before = _status("VmRSS")
    start = time.perf_counter()
    try:
        yield result
    finally:
        result["seconds"] = time.perf_counter() - start
        result["rss_growth"] = _status("VmRSS") - before
        result["peak_growth"] = _status("VmHWM") - before if peak_ok else float("nan")


def _refused_cheaply(call: Callable[[], object], error: type[Exception], match: str) -> dict[str, float]:
    """Asserts that call() raises `error` within 1 s, using at most 100 MB more RSS (and peak)."""
    with _measured() as cost, pytest.raises(error, match=match):
        call()
    assert cost["seconds"] < 1.0, cost
    assert cost["rss_growth"] < 100 * MB, cost
    assert not cost["peak_growth"] >= 100 * MB, cost  # NaN (no peak reset available) passes
    return cost


def test_png_bomb_builder_makes_a_valid_png() -> None:
    small = png_claiming(300, 200)
    decoded = cv2.imdecode(np.frombuffer(small, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (200, 300, 3) and not decoded.any()


def _image(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), np.full_like(x, 128)], -1).astype(
        np.uint8
    )


def _mp4(tmp_path: Path, size: tuple[int, int], frames: int) -> bytes:
    width, height = size
    path = tmp_path / f"{width}x{height}x{frames}.mp4"
    with Mp4Writer(path, width, height, 25.0, None, 16000, preset="ultrafast") as writer:
        for i in range(frames):
            writer.write(np.full((height, width, 3), (i * 7) % 256, np.uint8))
    return path.read_bytes()


# --------------------------------------------------------------------------------------------------
# Still-image bombs: refused from the header, in well under a second, without memory
# --------------------------------------------------------------------------------------------------


def test_png_bomb_30000_is_refused_before_decoding() -> None:
    bomb = png_claiming(30000, 30000)
    assert len(bomb) < 4 * MB  # what the adversarial client sent: 2.5 MiB
    assert read_image_size(bomb) == ImageSize("PNG", 30000, 30000)
    _refused_cheaply(lambda: decode_avatar(bomb), TooLarge, r"30000x30000 = 900000000 pixels.*limit of 2073600")


def test_two_png_bombs_12000_leave_memory_flat() -> None:
    bomb = png_claiming(12000, 12000)
    for _ in range(2):
        _refused_cheaply(lambda: decode_avatar(bomb), TooLarge, "12000x12000")


@pytest.mark.parametrize(("width", "height"), [(30000, 30000), (65535, 65535), (1921, 1081)])
def test_jpeg_bomb_is_refused_before_decoding(width: int, height: int) -> None:
    bomb = jpeg_claiming(width, height)
    assert read_image_size(bomb) == ImageSize("JPEG", width, height)
    _refused_cheaply(lambda: decode_avatar(bomb), TooLarge, f"{width}x{height}")


def test_other_still_formats_are_checked_from_their_headers() -> None:
    image = _image(96, 128)
    for ext, patch in [
        # BMP: int32 width/height at 18/22; GIF: uint16 logical screen at 6/8; WebP VP8X canvas - 1.
        (".bmp", lambda d: d[:18] + struct.pack("<ii", 40000, -40000) + d[26:]),
        (".gif", lambda d: d[:6] + struct.pack("<HH", 60000, 60000) + d[10:]),
    ]:
        bomb = patch(cv2.imencode(ext, image)[1].tobytes())
        _refused_cheaply(lambda: decode_avatar(bomb), TooLarge, "pixels, more than the limit")
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (16383).to_bytes(3, "little") * 2
    webp = b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x
    _refused_cheaply(lambda: decode_avatar(webp), TooLarge, "16384x16384")


def test_image_from_proto_refuses_a_16000_png_item_from_its_header() -> None:
    for fmt, data in [
        (common_pb2.PIXEL_FORMAT_PNG, png_claiming(16000, 16000)),
        (common_pb2.PIXEL_FORMAT_JPEG, jpeg_claiming(16000, 16000)),
    ]:
        msg = common_pb2.Image(format=fmt, data=data)
        _refused_cheaply(
            lambda: image_from_proto(msg, "item 7"),
            InvalidMedia,
            rf"^item 7: the (PNG|JPEG) is 16000x16000 px, above the limit of {MAX_IMAGE_SIDE} px per side",
        )


def test_image_from_proto_accepts_the_limit_and_refuses_one_more() -> None:
    ok = cv2.imencode(".png", np.zeros((8, MAX_IMAGE_SIDE, 3), np.uint8))[1].tobytes()
    assert image_from_proto(common_pb2.Image(format=common_pb2.PIXEL_FORMAT_PNG, data=ok)).shape == (
        8,
        MAX_IMAGE_SIDE,
        3,
    )
    big = cv2.imencode(".png", np.zeros((MAX_IMAGE_SIDE + 1, 8, 3), np.uint8))[1].tobytes()
    with pytest.raises(InvalidMedia, match=f"8x{MAX_IMAGE_SIDE + 1} px"):
        image_from_proto(common_pb2.Image(format=common_pb2.PIXEL_FORMAT_PNG, data=big))


@pytest.mark.parametrize("ext", [".bmp", ".tiff", ".webp"])
def test_image_from_proto_decodes_only_png_and_jpeg(ext: str) -> None:
    # cv2.imdecode would decode any of these, whatever the declared format; nobody checked their size.
    data = cv2.imencode(ext, _image(16, 16))[1].tobytes()
    with pytest.raises(InvalidMedia, match=r"^face: could not decode PNG data: the bytes are .*not PNG or JPEG"):
        image_from_proto(common_pb2.Image(format=common_pb2.PIXEL_FORMAT_PNG, data=data), "face")


def test_image_from_proto_accepts_png_declared_as_jpeg() -> None:
    # Either of the two is decoded whichever is declared (as before): clients mislabel files.
    png = cv2.imencode(".png", _image(16, 24))[1].tobytes()
    assert image_from_proto(common_pb2.Image(format=common_pb2.PIXEL_FORMAT_JPEG, data=png)).shape == (16, 24, 3)


def _png_with_idat_length(length: int) -> bytes:
    data = bytearray(cv2.imencode(".png", _image(80, 96))[1].tobytes())
    idat = data.index(b"IDAT") - 4
    data[idat : idat + 4] = struct.pack(">I", length)  # the CRC is wrong too; the length is what costs
    return bytes(data)


def test_png_chunk_claiming_4_gb_is_refused_from_the_header() -> None:
    # Found by the fuzz test: OpenCV allocates and zero-fills a chunk's declared length before reading
    # it; this 5 KB PNG cost 4 GB and 4.7 s in cv2.imdecode.
    bomb = _png_with_idat_length(0xFFFF2000)
    _refused_cheaply(
        lambda: decode_avatar(bomb),
        InvalidMedia,
        r"the PNG is truncated or corrupt: its b'IDAT' chunk claims 4294909952 bytes",
    )
    msg = common_pb2.Image(format=common_pb2.PIXEL_FORMAT_PNG, data=bomb)
    _refused_cheaply(
        lambda: image_from_proto(msg, "crop 1"),
        InvalidMedia,
        r"^crop 1: could not decode PNG data: the PNG is truncated",
    )


def wav_list_bomb() -> bytes:
    """A 3 KB WAV whose LIST/INFO chunk claims 2 GB and an INFO entry 1 GiB, which FFmpeg's RIFF reader
    allocates and zero-fills before reading (1 GB of peak RSS without `services.media.av_limits`)."""
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    info = b"INFO" + b"ISFT" + struct.pack("<I", 0x40000000) + b"lipline\0"
    riff = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"LIST" + struct.pack("<I", 0x7FFFFFF0) + info
    riff += b"data" + struct.pack("<I", 3200) + b"\0" * 3200
    return b"RIFF" + struct.pack("<I", len(riff)) + riff


def test_ffmpeg_allocations_are_capped() -> None:
    assert av_limits.CAPPED
    _refused_cheaply(lambda: decode_audio(wav_list_bomb()), InvalidMedia, "could not decode audio")


# --------------------------------------------------------------------------------------------------
# Minimum size
# --------------------------------------------------------------------------------------------------


def test_one_pixel_avatar_is_invalid_with_an_actionable_message() -> None:
    one = cv2.imencode(".png", np.zeros((1, 1, 3), np.uint8))[1].tobytes()
    with pytest.raises(InvalidMedia, match=r"^the avatar is 1x1 px; send at least 64x64"):
        decode_avatar(one)


@pytest.mark.parametrize(
    ("width", "height", "ok"), [(64, 64, True), (63, 200, False), (200, 63, False), (65, 65, True)]
)
def test_minimum_side_of_a_photo(width: int, height: int, ok: bool) -> None:
    data = cv2.imencode(".jpg", _image(height, width))[1].tobytes()
    if ok:
        frames, _ = decode_avatar(data)
        assert frames.shape == (1, height - height % 2, width - width % 2, 3)
    else:
        with pytest.raises(InvalidMedia, match=f"the avatar is {width}x{height} px; send at least 64x64"):
            decode_avatar(data)


def test_minimum_side_of_a_video_is_checked_before_decoding(tmp_path: Path) -> None:
    data = _mp4(tmp_path, (32, 96), 3)
    with pytest.raises(InvalidMedia, match="the avatar is 32x96 px; send at least 64x64"):
        decode_avatar(data)
    assert decode_avatar(data, min_side=32)[0].shape == (3, 96, 32, 3)
    assert MIN_AVATAR_SIDE == 64


# --------------------------------------------------------------------------------------------------
# Videos
# --------------------------------------------------------------------------------------------------


def test_video_declaring_a_huge_frame_is_refused_before_decoding() -> None:
    # MPEG-TS declares no size; the H.264 parser reads it from the SPS. FFmpeg's stream probing would
    # decode the frame (unbounded) to learn it: _open_video does not let it.
    bomb = encode_video("mpegts", (4096, 4096), 2)
    _refused_cheaply(lambda: decode_avatar(bomb), TooLarge, "4096x4096")


def test_frame_size_change_mid_stream_is_invalid_media() -> None:
    # Two MPEG-TS segments of different sizes, concatenated: a valid stream whose SPS changes size.
    data = encode_video("mpegts", (96, 96), 6) + encode_video("mpegts", (128, 96), 6)
    with pytest.raises(InvalidMedia, match=r"frame 6 of the avatar video is 128x96 but frame 0 is 96x96"):
        decode_avatar(data)


def test_mid_stream_switch_to_an_oversized_frame_is_refused_by_the_decoder() -> None:
    # The second segment's frames exceed max_pixels: the decoder refuses to allocate them.
    data = encode_video("mpegts", (96, 96), 4) + encode_video("mpegts", (512, 512), 2)
    with _measured() as cost, pytest.raises(InvalidMedia, match=r"could not decode frame 4 .*limited to 20000 pixels"):
        decode_avatar(data, max_pixels=20000)
    assert cost["seconds"] < 1.0


def test_frame_count_is_checked_before_decoding(tmp_path: Path) -> None:
    # MP4 declares its count; MPEG-TS does not, so the packets are counted before any is decoded.
    # Beyond 2 * max_frames (a frame may take two packets, one per field) nothing is decoded.
    mp4, ts = _mp4(tmp_path, (96, 96), 30), encode_video("mpegts", (96, 96), 30)
    with pytest.raises(TooLarge, match=r"more than 10 frames \(it declares 30\)"):
        decode_avatar(mp4, max_frames=10)
    with pytest.raises(TooLarge, match=r"more than 10 frames, the limit \(0.4 s at 25 fps\)"):
        decode_avatar(ts, max_frames=10)
    for data in (mp4, ts):
        # Within 2x, the decoded frames are counted: the exact limit still holds.
        with pytest.raises(TooLarge, match="more than 20 frames"):
            decode_avatar(data, max_frames=20)
        assert decode_avatar(data, max_frames=30)[0].shape == (30, 96, 96, 3)


def test_other_containers_decode(tmp_path: Path) -> None:
    # Containers that declare their streams only in packets (MPEG-PS, FLV) still open (no decoding
    # during probing), and one that declares sizes in the header (Matroska) too.
    for fmt, codec in [("mpeg", "mpeg2video"), ("flv", "libx264"), ("matroska", "libx264"), ("mpegts", "libx264")]:
        frames, fps = decode_avatar(encode_video(fmt, (96, 80), 12, codec))
        assert frames.shape == (12, 80, 96, 3), fmt
        assert fps > 0


def test_video_memory_is_one_array_not_a_list_plus_a_stack(tmp_path: Path) -> None:
    # 40 static 1280x720 frames: 110 MB of BGR. The old decoder held a list of frames and then
    # np.stack-ed them (2x); now the frames are decoded into one preallocated array.
    data = _mp4(tmp_path, (1280, 720), 40)
    assert len(data) < MB
    expected = 40 * 720 * 1280 * 3
    with _measured() as cost:
        frames, _ = decode_avatar(data)
    assert frames.shape == (40, 720, 1280, 3) and frames.flags.c_contiguous
    if cost["peak_growth"] == cost["peak_growth"]:  # not NaN: the peak could be measured
        assert cost["peak_growth"] < expected + 60 * MB, (cost, expected)
    del frames


@pytest.mark.parametrize("count", [1, 5, 12, 50])
def test_frames_decode_into_one_array_whatever_the_packet_count_said(tmp_path: Path, count: int) -> None:
    # The array is sized from the packet count; more frames grow it in place, fewer shrink it.
    data = _mp4(tmp_path, (96, 96), 12)
    with media._open_video(data) as container:
        stream = container.streams.video[0]
        packets = list(container.demux(stream))
        frames = media._collect(media._iter_packets(stream, packets, 100, 96 * 96, 64), count, max_frames=100)
    assert frames.shape == (12, 96, 96, 3) and frames.flags.owndata and frames.flags.c_contiguous
    np.testing.assert_array_equal(frames, decode_avatar(data)[0])
    with media._open_video(data) as container:
        stream = container.streams.video[0]
        with pytest.raises(TooLarge, match="more than 5 frames"):
            media._collect(media._iter_packets(stream, list(container.demux(stream)), 5, 96 * 96, 64), 1, max_frames=5)


def test_odd_sized_video_is_cropped_even_without_a_copy(tmp_path: Path) -> None:
    # libx264 needs even sizes; an MPEG-4 Part 2 stream in AVI may be odd.
    data = encode_video("avi", (97, 81), 3, codec="mpeg4")
    frames, _ = decode_avatar(data)
    assert frames.shape == (3, 80, 96, 3)
    assert frames.flags.c_contiguous


@pytest.mark.parametrize("ext", [".tiff", ".ppm", ".jp2"])
def test_unsupported_still_formats_are_refused_not_decoded(ext: str) -> None:
    data = cv2.imencode(ext, _image(96, 96))[1].tobytes()
    with pytest.raises(InvalidMedia, match="still image in a format that is not supported"):
        decode_avatar(data)


def test_truncated_header_is_invalid_media() -> None:
    png = cv2.imencode(".png", _image(96, 96))[1].tobytes()
    with pytest.raises(InvalidMedia, match="could not decode the avatar image: the PNG header is truncated"):
        decode_avatar(png[:20])
    jpeg = cv2.imencode(".jpg", _image(96, 96))[1].tobytes()
    with pytest.raises(InvalidMedia, match="could not decode the avatar image: the JPEG"):
        decode_avatar(jpeg[: jpeg.index(b"\xff\xc0")])
    with pytest.raises(InvalidMedia, match="could not decode the avatar as a JPEG image"):
        decode_avatar(jpeg[: len(jpeg) // 3])  # header fine, data cut


# --------------------------------------------------------------------------------------------------
# Audio header checks
# --------------------------------------------------------------------------------------------------


def _wav(rate: int, samples: int = 8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"\0\0" * samples)
    return buf.getvalue()


@pytest.mark.parametrize("rate", [1, 100, MIN_SAMPLE_RATE - 1, MAX_SAMPLE_RATE + 1, 2**31 - 1])
def test_audio_sample_rate_out_of_range_is_refused_from_the_header(rate: int) -> None:
    data = _wav(rate, 500_000 if rate < 1000 else 8000)
    _refused_cheaply(lambda: decode_audio(data, 48000), InvalidMedia, f"sample rate is {rate} Hz; it must be between")


def test_audio_codec_without_a_decoder_is_invalid_media() -> None:
    # Found by the fuzz test: a WAV whose format tag names no decoder gave AttributeError (INTERNAL).
    data = bytearray(_wav(16000, 1600))
    tag = data.index(b"fmt ") + 8
    data[tag : tag + 2] = struct.pack("<H", 0x1234)
    with pytest.raises(InvalidMedia, match="the audio's codec is not one this service can decode"):
        decode_audio(bytes(data))


@pytest.mark.parametrize("rate", [MIN_SAMPLE_RATE, 8000, 44100, MAX_SAMPLE_RATE])
def test_audio_sample_rates_in_range_decode(rate: int) -> None:
    assert len(decode_audio(_wav(rate, rate // 10), 16000)) == pytest.approx(1600, abs=2)


# --------------------------------------------------------------------------------------------------
# image_header
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ext", "params", "fmt"),
    [
        (".png", [], "PNG"),
        (".jpg", [], "JPEG"),
        (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1], "JPEG"),
        (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80], "WebP"),  # lossy: VP8
        (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101], "WebP"),  # lossless: VP8L
        (".bmp", [], "BMP"),
        (".gif", [], "GIF"),
    ],
)
@pytest.mark.parametrize(("height", "width"), [(1, 1), (37, 201), (480, 640)])
def test_header_sizes_match_the_encoder(ext: str, params: list[int], fmt: str, height: int, width: int) -> None:
    data = cv2.imencode(ext, _image(height, width), params)[1].tobytes()
    assert read_image_size(data) == ImageSize(fmt, width, height)


def test_header_of_non_images_is_none() -> None:
    for data in (b"", b"\0" * 100, b"RIFF\0\0\0\0WAVEfmt ", b"\0\0\0 ftypisom" + b"\0" * 100):
        assert read_image_size(data) is None


@pytest.mark.parametrize("ext", [".png", ".jpg", ".webp", ".bmp", ".gif"])
def test_every_truncation_of_a_header_raises_header_error_or_reads(ext: str) -> None:
    data = cv2.imencode(ext, _image(20, 30))[1].tobytes()
    for end in range(len(data) + 1):
        try:
            size = read_image_size(data[:end])
        except ImageHeaderError:
            continue
        assert size is None or size == ImageSize(size.format, 30, 20)


def test_jpeg_header_skips_segments_and_stray_bytes() -> None:
    jpeg = cv2.imencode(".jpg", _image(20, 30))[1].tobytes()
    # An APP segment holding bytes that look like a SOF marker, fill bytes, and a stray byte.
    app = b"\xff\xe5" + struct.pack(">H", 2 + 9) + b"\xff\xc0\x00\x11\x08\x7f\xff\x7f\xff"
    patched = jpeg[:2] + app + b"\x00\x17" + b"\xff\xff" + jpeg[2:]
    assert read_image_size(patched) == ImageSize("JPEG", 30, 20)
    with pytest.raises(ImageHeaderError, match="no frame header"):
        read_image_size(b"\xff\xd8\xff\xda\x00\x02")
    with pytest.raises(ImageHeaderError, match="invalid length"):
        read_image_size(b"\xff\xd8\xff\xe0\x00\x01")


def test_zero_sizes_are_header_errors() -> None:
    with pytest.raises(ImageHeaderError, match="empty image"):
        read_image_size(png_claiming(0, 10))
    with pytest.raises(ImageHeaderError, match="empty image"):
        read_image_size(jpeg_claiming(0, 10))
