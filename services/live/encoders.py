"""Per-frame video encoders of a live session: one frame in, its encoded frame out, at once.

Two codecs behind one small interface (`FrameEncoder`): H.264 (`H264Encoder`, libx264 through PyAV)
for browsers and the open internet, JPEG (`JpegEncoder`, OpenCV) for consumers that re-encode anyway.

Input is the compositor's I420 ((height * 3 / 2, width) uint8, BT.601 limited range: what
`services.media.composite.Compositor` writes and `services.media.video_format.to_yuv420` returns); a BGR
(height, width, 3) frame is accepted too and converted. I420 because that is what x264 eats: a render
worker composites straight into I420 for the same reason (no per-frame colour conversion); JPEG needs
BGR for OpenCV, so it pays one conversion (~0.2 ms at 512x512).

Why these x264 settings (the live path's latency and robustness):
* ``tune=zerolatency``: no B-frames, no lookahead, no frame threads (sliced threads instead), so each
  input frame's access unit comes out of the `encode` call that took it (asserted by `H264Encoder`:
  a frame of delay would be 40 ms of latency at 25 fps, and x264 would hold frames on a flush).
* The keyframes are decided here, not by x264 (``keyint=infinite``, ``scenecut=0``): an IDR every
  ``keyframe_interval`` frames of the session's own clock (2 s; measured on timestamps, so skipped
  frames do not stretch it), and on demand (`force_keyframe`: a resumed stream or a new viewer must
  start decoding at once). Every IDR carries SPS and PPS in band (Annex B, no global header), so any
  keyframe is a place to start.
* One x264 thread by default: a worker encodes many sessions side by side, and independent
  single-threaded encoders scale best across cores (issue 19: 16 processes, 3,460 frames/s
  ``veryfast`` at 512x512 on 16 cores).
* ``preset`` defaults to `DEFAULT_PRESET`, ``ultrafast``: measured on a 2-core Xeon VM, one thread,
  512x512 with a changing mouth (bench/bench_live_encode.py), 0.97 ms and 17 KB a frame against
  ``veryfast``'s 2.16 ms and 12 KB; a whole session (mel, compositor, encoder;
  bench/bench_live_session.py) 38 against 63 ms of CPU per second of speech. CPU is what limits a
  live worker's sessions; the bytes are what ``crf`` or ``bitrate_kbps`` trade.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Protocol

import av
import cv2
import numpy as np

from services.media import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.media.video_format import COLOR_TAGS, X264_PRESETS, split_i420, to_yuv420

DEFAULT_PRESET = "ultrafast"
DEFAULT_CRF = 23
KEYFRAME_SECONDS = 2
DEFAULT_JPEG_QUALITY = 80


@dataclasses.dataclass(frozen=True)
class EncodedFrame:
    """One frame on the wire: an H.264 access unit (Annex B) or a JPEG image, with its timestamp."""

    data: bytes
    keyframe: bool  # an IDR (H.264; SPS and PPS in front) or any JPEG: a decoder can start here
    pts: int  # the frame's index on the session's clock (time base 1 / fps)


class FrameEncoder(Protocol):
    """What a session encodes with."""

    codec: str

    def encode(self, frame: np.ndarray, pts: int) -> EncodedFrame:
        """Encodes one frame (I420, or BGR) shown at frame ``pts`` of the session; strictly increasing pts."""
        ...

    def input_planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Writable Y, U, V planes the next frame can be composited into (`Compositor.frame_into`), so
        a speech frame is copied once (cached frame -> encoder input), not twice; then `encode_input`."""
        ...

    def encode_input(self, pts: int) -> EncodedFrame:
        """Encodes what was written into `input_planes`, as `encode` would the same I420 frame."""
        ...

    def force_keyframe(self) -> None:
        """Makes the next encoded frame a keyframe."""
        ...

    def close(self) -> None: ...


def _check_size(width: int, height: int) -> None:
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise ValueError(f"frames are I420, so width and height must be even and positive, got {width}x{height}")


def _as_i420(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    if frame.shape == (height, width, 3):
        return to_yuv420(frame)
    if frame.shape != (height * 3 // 2, width) or frame.dtype != np.uint8:
        i420, bgr = (height * 3 // 2, width), (height, width, 3)
        raise ValueError(
            f"frame has shape {frame.shape} {frame.dtype}; the session's frames are {width}x{height}: I420 {i420} or BGR {bgr} uint8"
        )
    return frame


class H264Encoder:
    """libx264, zerolatency: one Annex B access unit per frame, out of the call that took the frame.

    Args:
        width, height: the frame size (even).
        fps: the session's frame rate (time base 1 / fps; the keyframe interval is 2 s of it).
        preset: x264 speed preset.
        crf: constant rate factor, used when ``bitrate_kbps`` is None.
        bitrate_kbps: a target bitrate with a one-second VBV buffer (for links with a fixed budget).
        threads: x264 threads (sliced, with zerolatency).
    """

    codec = "h264"

    def __init__(
        self,
        width: int,
        height: int,
        fps: Fraction,
        preset: str = DEFAULT_PRESET,
        crf: int = DEFAULT_CRF,
        bitrate_kbps: int | None = None,
        threads: int = 1,
    ) -> None:
        _check_size(width, height)
        if preset not in X264_PRESETS:
            raise ValueError(f"unknown x264 preset {preset!r}; one of {', '.join(X264_PRESETS)}")
        self.width, self.height = width, height
        self.keyframe_interval = round(KEYFRAME_SECONDS * fps)
        context = av.CodecContext.create("libx264", "w")
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = Fraction(1) / fps
        context.framerate = fps
        context.thread_count = threads
        for name, value in COLOR_TAGS.items():  # BT.601 limited range: what the I420 frames are
            setattr(context, name, value)
        options = {
            "preset": preset,
            "tune": "zerolatency",
            "forced-idr": "1",
            "x264-params": "keyint=infinite:scenecut=0:bframes=0",
        }
        if bitrate_kbps is None:
            options["crf"] = str(crf)
        else:
            kbps = str(int(bitrate_kbps))
            options.update({"b": f"{kbps}k", "maxrate": f"{kbps}k", "bufsize": f"{kbps}k"})
        context.options = options
        context.open()
        self._context = context
        self._frame = av.VideoFrame(width, height, "yuv420p")  # reused: libx264 copies the pixels in encode
        self._planes = [
            np.frombuffer(plane, np.uint8).reshape(rows, plane.line_size)[:, :cols]  # type: ignore[call-overload]  # PyAV's stubs: a plane is a buffer
            for plane, rows, cols in zip(
                self._frame.planes, (height, height // 2, height // 2), (width, width // 2, width // 2)
            )
        ]
        self._force = True  # the first frame is an IDR
        self._last_keyframe: int | None = None
        self._last_pts: int | None = None

    def force_keyframe(self) -> None:
        self._force = True

    def encode(self, frame: np.ndarray, pts: int) -> EncodedFrame:
        for plane, source in zip(
            self._planes, split_i420(_as_i420(frame, self.width, self.height), self.height, self.width)
        ):
            plane[:] = source
        return self.encode_input(pts)

    def input_planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reused frame's own planes (x264 copies them in `encode_input`, so they are free again after)."""
        y, u, v = self._planes
        return y, u, v

    def encode_input(self, pts: int) -> EncodedFrame:
        if self._last_pts is not None and pts <= self._last_pts:
            raise ValueError(f"pts {pts} after {self._last_pts}: frames are encoded in the session's order")
        keyframe = self._force or self._last_keyframe is None or pts - self._last_keyframe >= self.keyframe_interval
        self._frame.pts = pts
        self._frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        packets = self._context.encode(self._frame)
        if len(packets) != 1:  # zerolatency holds nothing back; anything else is a broken build or option
            raise RuntimeError(
                f"libx264 returned {len(packets)} access units for one frame (pts {pts}); the live path needs exactly one"
            )
        packet = packets[0]
        if packet.is_keyframe != keyframe:
            raise RuntimeError(
                f"libx264 made frame {pts} {'a' if packet.is_keyframe else 'no'} keyframe against the request"
            )
        self._last_pts = pts
        if keyframe:
            self._force = False
            self._last_keyframe = pts
        return EncodedFrame(bytes(packet), keyframe, pts)

    def close(self) -> None:
        """Drops the encoder (nothing is pending: every frame came out of its own call; PyAV frees it)."""
        self._planes = []
        self._context = None  # type: ignore[assignment]  # encode after close is a caller bug


class JpegEncoder:
    """OpenCV JPEG: every frame is a keyframe; ``quality`` 1-100 (cv2.IMWRITE_JPEG_QUALITY)."""

    codec = "jpeg"

    def __init__(self, width: int, height: int, quality: int = DEFAULT_JPEG_QUALITY) -> None:
        _check_size(width, height)
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality is 1-100, got {quality}")
        self.width, self.height = width, height
        self._params = [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
        self._input = np.empty((height * 3 // 2, width), np.uint8)  # `input_planes`' frame

    def force_keyframe(self) -> None:
        """Nothing to do: every JPEG stands alone."""

    def encode(self, frame: np.ndarray, pts: int) -> EncodedFrame:
        if frame.shape != (self.height, self.width, 3):
            frame = cv2.cvtColor(_as_i420(frame, self.width, self.height), cv2.COLOR_YUV2BGR_I420)
        ok, data = cv2.imencode(".jpg", frame, self._params)
        if not ok:
            raise RuntimeError(f"OpenCV could not encode frame {pts} as JPEG")
        return EncodedFrame(data.tobytes(), True, pts)

    def input_planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return split_i420(self._input, self.height, self.width)

    def encode_input(self, pts: int) -> EncodedFrame:
        return self.encode(self._input, pts)

    def close(self) -> None:
        """Nothing to free."""
