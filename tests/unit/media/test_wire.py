"""Tests for services.media.wire: images and mel windows to and from wire messages."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from lipline.v1 import common_pb2
from services.media.wire import (
    MEL_BANDS,
    MEL_BYTES,
    MEL_STEP,
    image_from_proto,
    image_to_proto,
    mel_from_bytes,
    mel_to_bytes,
    pack_generate_items,
    unpack_speech,
)
from services.serving.errors import InvalidMedia


def _image(height: int = 24, width: int = 32) -> np.ndarray:
    """A smooth BGR gradient (smooth so JPEG round-trips closely)."""
    y, x = np.mgrid[0:height, 0:width]
    blue, green = x * 255 // (width - 1), y * 255 // (height - 1)
    return np.stack([blue, green, np.full_like(x, 128)], axis=-1).astype(np.uint8)


def test_bgr24_round_trip_is_exact() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(7, 11, 3), dtype=np.uint8)
    msg = image_to_proto(image)
    assert (msg.width, msg.height, msg.format) == (11, 7, common_pb2.PIXEL_FORMAT_BGR24)
    assert len(msg.data) == 7 * 11 * 3
    back = image_from_proto(msg)
    assert back.dtype == np.uint8
    assert back.shape == (7, 11, 3)
    np.testing.assert_array_equal(back, image)


def test_bgr24_round_trip_through_serialization() -> None:
    image = _image()
    wire = image_to_proto(image).SerializeToString()
    back = image_from_proto(common_pb2.Image.FromString(wire))
    np.testing.assert_array_equal(back, image)


def test_image_to_proto_accepts_non_contiguous_views() -> None:
    image = _image(20, 30)[:, ::2]  # a strided view
    back = image_from_proto(image_to_proto(image))
    np.testing.assert_array_equal(back, image)


@pytest.mark.parametrize(
    "bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), np.zeros((4, 4, 3), np.float32)]
)
def test_image_to_proto_rejects_wrong_arrays(bad: np.ndarray) -> None:
    with pytest.raises(ValueError):
        image_to_proto(bad)


def test_png_decode_is_lossless() -> None:
    image = _image()
    ok, png = cv2.imencode(".png", image)
    assert ok
    msg = common_pb2.Image(width=32, height=24, format=common_pb2.PIXEL_FORMAT_PNG, data=png.tobytes())
    np.testing.assert_array_equal(image_from_proto(msg), image)


def test_jpeg_decode_is_close() -> None:
    image = _image()
    ok, jpg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    msg = common_pb2.Image(format=common_pb2.PIXEL_FORMAT_JPEG, data=jpg.tobytes())  # sizes are informative
    back = image_from_proto(msg)
    assert back.shape == image.shape
    assert np.abs(back.astype(int) - image.astype(int)).mean() < 3


@pytest.mark.parametrize("fmt", [common_pb2.PIXEL_FORMAT_JPEG, common_pb2.PIXEL_FORMAT_PNG])
@pytest.mark.parametrize("data", [b"", b"definitely not an image"])
def test_undecodable_encoded_image_is_invalid_media(fmt: int, data: bytes) -> None:
    msg = common_pb2.Image(width=2, height=2, format=fmt, data=data)
    with pytest.raises(InvalidMedia, match=r"^crop 3: could not decode"):
        image_from_proto(msg, "crop 3")


@pytest.mark.parametrize(
    ("width", "height", "size"),
    [(4, 4, 4 * 4 * 3 - 1), (4, 4, 4 * 4 * 3 + 3), (0, 4, 0), (4, 0, 0), (4, 4, 0)],
)
def test_bgr24_wrong_byte_length_names_the_item(width: int, height: int, size: int) -> None:
    msg = common_pb2.Image(width=width, height=height, format=common_pb2.PIXEL_FORMAT_BGR24, data=b"\0" * size)
    with pytest.raises(InvalidMedia) as info:
        image_from_proto(msg, "frame 17")
    message = str(info.value)
    assert message.startswith("frame 17:")
    assert f"{width}x{height}" in message
    assert f"got {size}" in message


def test_default_item_name_is_image() -> None:
    msg = common_pb2.Image(width=1, height=1, format=common_pb2.PIXEL_FORMAT_BGR24, data=b"\0")
    with pytest.raises(InvalidMedia, match=r"^image:"):
        image_from_proto(msg)


@pytest.mark.parametrize("fmt", [common_pb2.PIXEL_FORMAT_UNSPECIFIED, 42])
def test_unsupported_pixel_format(fmt: int) -> None:
    msg = common_pb2.Image(width=1, height=1, format=fmt, data=b"\0\0\0")
    with pytest.raises(InvalidMedia, match=r"frame 2: pixel format .* not supported"):
        image_from_proto(msg, "frame 2")


def test_invalid_media_is_a_client_error() -> None:
    import grpc

    assert InvalidMedia.code == grpc.StatusCode.INVALID_ARGUMENT


def test_mel_round_trip_within_float16_precision() -> None:
    rng = np.random.default_rng(1)
    window = rng.uniform(-4, 4, size=(MEL_BANDS, MEL_STEP)).astype(np.float32)
    window[0, :4] = [-4.0, 4.0, 0.0, 3.9999]
    data = mel_to_bytes(window)
    assert isinstance(data, bytes)
    assert len(data) == 80 * 16 * 2
    back = mel_from_bytes(data)
    assert back.dtype == np.float32
    assert back.shape == (80, 16)
    np.testing.assert_allclose(back, window, atol=1e-3, rtol=0)


def test_mel_bytes_are_little_endian_float16_band_major() -> None:
    window = np.arange(80 * 16, dtype=np.float32).reshape(80, 16) / 1000
    data = mel_to_bytes(window)
    flat = np.frombuffer(data, dtype="<f2")
    assert flat[16] == np.float16(window[1, 0])  # row 1 starts after the 16 values of row 0
    np.testing.assert_array_equal(mel_from_bytes(data), flat.astype(np.float32).reshape(80, 16))


def test_mel_to_bytes_rejects_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"\(80, 16\)"):
        mel_to_bytes(np.zeros((16, 80), np.float32))


@pytest.mark.parametrize("size", [0, 2559, 2561, 1280])
def test_wrong_mel_length_is_invalid_media(size: int) -> None:
    with pytest.raises(InvalidMedia) as info:
        mel_from_bytes(b"\0" * size, "window 5")
    message = str(info.value)
    assert message.startswith("window 5:")
    assert "2560" in message
    assert f"got {size}" in message


def test_generate_items_pack_round_trip_and_validation() -> None:
    from lipline.v1 import lipsync_pb2
    from services.media.wire import pack_generate_items, unpack_generate_items

    windows = [np.full((80, 16), v, np.float32) for v in (-4.0, 0.5, 3.25)]
    items = pack_generate_items([7, 8, 9], [0, 2, 0], [mel_to_bytes(w) for w in windows])
    frames, crops, mels = unpack_generate_items(lipsync_pb2.GenerateItems.FromString(items.SerializeToString()))
    assert frames.tolist() == [7, 8, 9] and crops.tolist() == [0, 2, 0]
    assert mels.dtype == np.float16 and np.array_equal(mels.astype(np.float32), np.stack(windows))
    with pytest.raises(InvalidMedia, match="2 frame indices but 1 crop indices"):
        unpack_generate_items(lipsync_pb2.GenerateItems(frame_indices=[1, 2], crop_indices=[0], mels=bytes(5120)))
    with pytest.raises(InvalidMedia, match="need 5120 bytes"):
        unpack_generate_items(lipsync_pb2.GenerateItems(frame_indices=[1, 2], crop_indices=[0, 0], mels=bytes(5119)))
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = windows[1].copy()
        poisoned[40, 3] = bad
        with pytest.raises(InvalidMedia, match="frame 8 holds NaN or infinity"):
            unpack_generate_items(
                pack_generate_items([7, 8, 9], [0, 0, 0], [mel_to_bytes(w) for w in (windows[0], poisoned, windows[2])])
            )


def test_packed_faces_from_pb_sizes_and_validation() -> None:
    from lipline.v1 import lipsync_pb2
    from services.media.packed import PackedImages

    a = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    b = np.full((4, 1, 3), 9, np.uint8)
    msg = lipsync_pb2.GeneratedFaces(
        frame_indices=[5, 6], crop_indices=[0, 0], widths=[3, 1], heights=[2, 4], data=a.tobytes() + b.tobytes()
    )
    got_a, got_b = PackedImages.from_pb(msg).arrays()
    fa, fb = msg.frame_indices
    assert (fa, fb) == (5, 6) and np.array_equal(got_a, a) and np.array_equal(got_b, b)
    msg.data = msg.data[:-1]
    with pytest.raises(InvalidMedia, match="need 30 bytes"):
        PackedImages.from_pb(msg)


def test_generate_items_speech_is_optional_and_checked() -> None:
    mel = bytes(MEL_BYTES)
    assert unpack_speech(pack_generate_items([0, 1], [0, 0], [mel, mel])) is None
    speech = unpack_speech(pack_generate_items([0, 1], [0, 0], [mel, mel], [0.0, 0.75]))
    np.testing.assert_array_equal(speech, np.array([0.0, 0.75], np.float32))
    with pytest.raises(InvalidMedia, match="2 items but 1 speech values"):
        unpack_speech(pack_generate_items([0, 1], [0, 0], [mel, mel], [0.5]))
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(InvalidMedia, match=r"\[0, 1\]"):
            unpack_speech(pack_generate_items([0], [0], [mel], [bad]))
