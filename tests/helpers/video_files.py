"""Small synthetic pictures and videos for the media tests (decoding, the MP4 writer)."""

from __future__ import annotations

import io
from pathlib import Path

import av
import cv2
import numpy as np

from services.render.mp4 import Mp4Writer


def smooth_image(height: int, width: int) -> np.ndarray:
    """A smooth synthetic BGR image (smooth so JPEG round-trips closely)."""
    y, x = np.mgrid[0:height, 0:width]
    blue, green = x * 255 // (width - 1), y * 255 // (height - 1)
    return np.stack([blue, green, np.full_like(x, 128)], axis=-1).astype(np.uint8)


def write_flat_video(path: Path, frames: int, fps: float, size: tuple[int, int] = (64, 48)) -> Path:
    """An MP4 of `frames` flat grey frames (frame i at level 20 * i mod 256), no audio track."""
    width, height = size
    with Mp4Writer(path, width, height, fps, None, 16000) as writer:
        for i in range(frames):
            writer.write(np.full((height, width, 3), (i * 20) % 256, np.uint8))
    return path


def encode_video(fmt: str, size: tuple[int, int], frames: int, codec: str = "libx264") -> bytes:
    """A small video in memory (container format `fmt`, e.g. "mp4" or "mpegts"), frames of one grey
    level each (frame i at level 40 * i mod 256), 25 fps; x264's fastest preset."""
    width, height = size
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"preset": "ultrafast"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((height, width, 3), (i * 40) % 256, np.uint8), format="bgr24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buf.getvalue()


def write_shifted_video(path: Path, image: np.ndarray, frames: int, step: int, fps: float = 25.0) -> np.ndarray:
    """An MP4 of `image` shifted right by `step` px more in every frame; returns the frames written."""
    h, w = image.shape[:2]
    written = []
    with Mp4Writer(path, w, h, fps, None, 16_000, crf=12) as writer:
        for i in range(frames):
            shift = np.float32([[1, 0, i * step], [0, 1, 0]])
            frame = cv2.warpAffine(image, shift, (w, h), borderMode=cv2.BORDER_REFLECT)
            writer.write(frame)
            written.append(frame)
    return np.stack(written)
