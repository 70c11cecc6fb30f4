"""Conversions between wire messages and arrays: frames, face crops and mel windows.

Raw BGR24 is the default on the wire between stages (no encode/decode cost); JPEG/PNG are accepted
where a client sends files. Every decoder validates sizes, so a malformed message is an
INVALID_ARGUMENT with a precise message instead of a reshape error deep in a model.
"""

from __future__ import annotations

import cv2
import numpy as np

from lipline.v1 import common_pb2, lipsync_pb2
from services.media.image_header import JPEG, PNG, ImageHeaderError, read_image_size
from services.serving.errors import InvalidMedia

MEL_BANDS = 80
MEL_STEP = 16
MEL_BYTES = MEL_BANDS * MEL_STEP * 2  # one float16 window on the wire and in the blob store
# Largest width or height of any image a stage accepts or returns (a paste size, an upscale): a whole
# 1080p frame fits; a larger one is refused at the edge, before it can reach a shared batch.
MAX_IMAGE_SIDE = 2048


def image_to_proto(image: np.ndarray) -> common_pb2.Image:
    """(H, W, 3) uint8 BGR -> Image(BGR24)."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected (H, W, 3) uint8, got {image.shape} {image.dtype}")
    h, w = image.shape[:2]
    return common_pb2.Image(
        width=w, height=h, format=common_pb2.PIXEL_FORMAT_BGR24, data=np.ascontiguousarray(image).tobytes()
    )


def image_from_proto(msg: common_pb2.Image, what: str = "image") -> np.ndarray:
    """Image -> (H, W, 3) uint8 BGR; raises InvalidMedia naming `what` when the message is unusable."""
    data = msg.data  # read once: each read of a bytes field copies it out of the message
    if msg.format == common_pb2.PIXEL_FORMAT_BGR24:
        width, height = msg.width, msg.height
        expected = width * height * 3
        if width == 0 or height == 0 or len(data) != expected:
            raise InvalidMedia(f"{what}: BGR24 {width}x{height} needs {expected} bytes, got {len(data)}")
        return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
    if msg.format in (common_pb2.PIXEL_FORMAT_JPEG, common_pb2.PIXEL_FORMAT_PNG):
        name = "JPEG" if msg.format == common_pb2.PIXEL_FORMAT_JPEG else "PNG"
        # The header's size is checked before decoding: a 1 MB PNG holds 16000x16000 black pixels (768 MB
        # decoded). Only PNG and JPEG data are decoded (either, whichever of the two is declared):
        # cv2.imdecode would also decode TIFF, EXR, JPEG 2000... whose sizes nobody checked.
        try:
            header = read_image_size(data)
        except ImageHeaderError as exc:
            raise InvalidMedia(f"{what}: could not decode {name} data: {exc}") from exc
        if header is None or header.format not in (PNG, JPEG):
            found = "empty" if not data else f"a {header.format} image" if header else "not an image"
            raise InvalidMedia(f"{what}: could not decode {name} data: the bytes are {found}, not PNG or JPEG")
        if max(header.width, header.height) > MAX_IMAGE_SIDE:
            raise InvalidMedia(
                f"{what}: the {header.format} is {header.width}x{header.height} px, above the limit of {MAX_IMAGE_SIDE} px per side"
            )
        decoded = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
        if decoded is None:
            raise InvalidMedia(f"{what}: could not decode {name} data (corrupt or truncated)")
        return decoded
    raise InvalidMedia(f"{what}: pixel format {msg.format} is not supported (use BGR24, JPEG or PNG)")


def mel_to_bytes(window: np.ndarray) -> bytes:
    """(80, 16) float -> 2,560 bytes of little-endian float16 (values are in [-4, 4]; fp16 is exact to 2e-3)."""
    if window.shape != (MEL_BANDS, MEL_STEP):
        raise ValueError(f"mel window must be (80, 16), got {window.shape}")
    return window.astype("<f2").tobytes()


def mel_from_bytes(data: bytes, what: str = "mel window") -> np.ndarray:
    """Inverse of mel_to_bytes: (80, 16) float32."""
    if len(data) != MEL_BYTES:
        raise InvalidMedia(f"{what}: expected {MEL_BYTES} bytes (80x16 float16), got {len(data)}")
    return np.frombuffer(data, dtype="<f2").astype(np.float32).reshape(MEL_BANDS, MEL_STEP)


def pack_generate_items(
    frame_indices: list[int],
    crop_indices: list[int],
    mels: list[bytes],
    speech: list[float] | None = None,
) -> lipsync_pb2.GenerateItems:
    """Packed Generate items from per-item values (mels: 2,560-byte float16 windows, as on the wire;
    speech: the clip's envelope value per item, or None)."""
    return lipsync_pb2.GenerateItems(
        frame_indices=frame_indices,
        crop_indices=crop_indices,
        mels=b"".join(mels),
        speech=speech or [],
    )


def unpack_speech(items: lipsync_pb2.GenerateItems) -> np.ndarray | None:
    """GenerateItems' speech envelope: (N,) float32 in [0, 1], or None when the client sent none."""
    if not items.speech:
        return None
    speech = np.asarray(items.speech, dtype=np.float32)
    if len(speech) != len(items.frame_indices):
        raise InvalidMedia(
            f"items: {len(items.frame_indices)} items but {len(speech)} speech values (one each, or none)"
        )
    if not (np.isfinite(speech).all() and (speech >= 0).all() and (speech <= 1).all()):
        raise InvalidMedia("items: speech values must lie in [0, 1]")
    return speech


def unpack_generate_items(items: lipsync_pb2.GenerateItems) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GenerateItems -> (frame indices (N,), crop indices (N,), mels (N, 80, 16) float16); validated."""
    frames = np.asarray(items.frame_indices, dtype=np.int64)
    crops = np.asarray(items.crop_indices, dtype=np.int64)
    n = len(frames)
    if len(crops) != n:
        raise InvalidMedia(f"items: {n} frame indices but {len(crops)} crop indices")
    raw = items.mels  # read a bytes field once: each read copies it out of the message
    if len(raw) != n * MEL_BYTES:
        raise InvalidMedia(
            f"items: {n} items need {n * MEL_BYTES} bytes of mel windows (80x16 float16 each), got {len(raw)}"
        )
    mels = np.frombuffer(raw, dtype="<f2").reshape(n, MEL_BANDS, MEL_STEP)
    if not np.isfinite(mels).all():
        bad = int(np.argmax(~np.isfinite(mels).reshape(n, -1).all(axis=1)))
        raise InvalidMedia(f"items: the mel window of frame {int(frames[bad])} holds NaN or infinity")
    return frames, crops, mels
