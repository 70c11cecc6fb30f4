"""Media I/O: decode avatars, paste generated faces back, encode segments and AAC, join and probe MP4s.

The gateway decodes avatars (CreateAvatar); render workers decode them again into their cache,
encode segments (H.264, yuv420p) and the AAC track, and join them into an MP4 that plays
everywhere (``+faststart``).
"""

from __future__ import annotations

import functools
import io
import os
import uuid
from fractions import Fraction
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType

import av
import cv2
import numpy as np

from services.common import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.common.errors import InvalidMedia, TooLarge
from services.common.image_header import ImageHeaderError, ImageSize, read_image_size

_DEFAULT_VIDEO_FPS = 25.0
MUX_AUDIO_RATE = 48_000  # the output's AAC track: the original audio resampled, mono
_SUPPORTED_HINT = "send JPEG, PNG or an MP4/WebM/MOV video"
# The least width and height of an avatar frame: the face detector looks for faces of 24 px and more,
# and a 96x96 mouth crop is cut around them; below this nothing can be found, and saying so up front
# beats a failed stage call.
MIN_AVATAR_SIDE = 64


# --------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------


def decode_avatar(
    data: bytes,
    *,
    photo_fps: float = 25.0,
    max_frames: int = 1500,
    max_pixels: int = 1920 * 1080,
    min_side: int = MIN_AVATAR_SIDE,
) -> tuple[np.ndarray, float]:
    """Decodes an avatar photo or template video into BGR frames, refusing oversized input before decoding it.

    Every limit is checked from the headers before any pixel is decoded, and again while decoding:

    - a still image's size comes from its header (`services.common.image_header`), so a small PNG
      that claims 30000x30000 is refused without allocating anything;
    - a video's declared frame size and frame count are checked after opening it (FFmpeg's stream
      probing is not allowed to decode: see `_open_video`), the compressed frames are counted before
      decoding (more than twice ``max_frames`` is refused there; see `_decode_video` for why not
      exactly ``max_frames``), the decoder refuses frames above ``max_pixels`` by itself
      (FFmpeg's ``max_pixels`` codec option), and every decoded frame must have the first frame's
      size (a container whose size changes mid-stream is invalid, not an internal error).

    Memory: the result is the only large allocation. A video is decoded straight into a
    preallocated (N, H, W, 3) array, N = the number of compressed frames (at most ``max_frames``),
    H * W <= ``max_pixels``; no list of frames, no stacking copy, no cropping copy. Beyond it only the
    compressed packets (at most the upload's size), one BGR frame and the decoder's own few frames
    are held. So an avatar costs at most ``max_frames * max_pixels * 3`` bytes (9.3 GB with the
    defaults: the limits, not the decoder, are what bound it).

    Args:
        data: The encoded bytes: a still image (JPEG, PNG, WebP, BMP, GIF: its first frame; AVIF) or
            a video (MP4, WebM, MOV, MKV, MPEG-TS...). Other still formats (TIFF, JPEG 2000, PNM,
            EXR...) are refused: their headers are not checked, so they are not decoded.
        photo_fps: The frame rate reported for a still image (which becomes a single frame).
        max_frames: The most frames a video may have.
        max_pixels: The most pixels (width * height) a frame may have.
        min_side: The least width and height a frame may have (a face must be findable in it).

    Returns:
        ``(frames, fps)``: frames is a (N, H, W, 3) uint8 BGR array with even H and W (the last row
        and/or column is cropped if needed, as H.264 yuv420p needs even sizes); fps is a float.

    Raises:
        InvalidMedia: The bytes are empty, cannot be decoded, hold no video frames, are smaller than
            ``min_side`` px, are a still image in an unsupported format, or change frame size
            mid-stream.
        TooLarge: The avatar has more than ``max_frames`` frames or more than ``max_pixels`` pixels.
    """
    if not data:
        raise InvalidMedia("avatar is empty")
    try:
        header = read_image_size(data)
    except ImageHeaderError as exc:
        raise InvalidMedia(f"could not decode the avatar image: {exc}; {_SUPPORTED_HINT}") from exc
    if header is not None:
        return _decode_still(data, header, max_pixels=max_pixels, min_side=min_side), float(photo_fps)
    try:
        frames, fps = _decode_video(data, max_frames=max_frames, max_pixels=max_pixels, min_side=min_side)
        # An AVIF photo (ISO-BMFF, major brand "avif") is a one-frame AV1 video to FFmpeg; it is a photo.
        return frames, float(photo_fps) if data[8:12] == b"avif" else fps
    except _DECODE_ERRORS as exc:
        raise InvalidMedia(f"could not decode the avatar as an image or a video: {_reason(exc)}; {_SUPPORTED_HINT}") from exc


# What PyAV and FFmpeg raise for bad input (av.FFmpegError subclasses ValueError or OSError; metadata
# that is not UTF-8 raises UnicodeDecodeError, a ValueError; absurd rates or sizes can overflow).
_DECODE_ERRORS = (av.FFmpegError, ValueError, OSError, ArithmeticError)


def _reason(exc: BaseException) -> str:
    """FFmpeg's own words for an error, without PyAV's '[Errno N] ...: <file>' decoration."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _decode_still(data: bytes, header: ImageSize, *, max_pixels: int, min_side: int) -> np.ndarray:
    """A still image whose header passed the limits, decoded by OpenCV into (1, H, W, 3) even-sized BGR."""
    _check_size(header.width, header.height, max_pixels, min_side)
    # OpenCV sniffs the format from the bytes (only the five the header reader knows get here), and
    # applies the EXIF orientation (which swaps width and height, not their product).
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise InvalidMedia(f"could not decode the avatar as a {header.format} image (corrupt or truncated data); {_SUPPORTED_HINT}")
    _check_size(image.shape[1], image.shape[0], max_pixels, min_side)
    return _even(image[None])


def _decode_video(data: bytes, *, max_frames: int, max_pixels: int, min_side: int) -> tuple[np.ndarray, float]:
    """Decodes every frame of the first video stream into one preallocated even-sized array (see decode_avatar)."""
    with _open_video(data) as container:
        stream, packets, count, fps = _demux_checked(container, max_frames=max_frames, max_pixels=max_pixels, min_side=min_side)
        return _decode_packets(stream, packets, min(count, max_frames), max_frames, max_pixels, min_side), fps


def _demux_checked(
    container: av.container.InputContainer, *, max_frames: int, max_pixels: int, min_side: int
) -> tuple[av.video.stream.VideoStream, list[av.Packet], int, float]:
    """The first video stream's compressed packets, after the header checks of `decode_avatar`.

    Returns ``(stream, packets, count, fps)``; count is the number of frame-carrying packets.
    """
    if not container.streams.video:
        raise InvalidMedia(f"could not decode the avatar as an image or a video: it has no video stream; {_SUPPORTED_HINT}")
    if container.format.name.endswith("_pipe") or container.format.name in _IMAGE_DEMUXERS:
        raise InvalidMedia(f"the avatar is a still image in a format that is not supported ({container.format.name}); {_SUPPORTED_HINT}")
    stream = container.streams.video[0]
    context = stream.codec_context
    if context is None:
        raise InvalidMedia(f"the avatar video's codec is not one this service can decode; {_SUPPORTED_HINT}")
    # 1. The size the container (or the codec parser) declares, before anything is decoded.
    if context.width and context.height:
        _check_size(context.width, context.height, max_pixels, min_side)
    fps = float(stream.average_rate) if stream.average_rate else _DEFAULT_VIDEO_FPS
    # 2. The frame count, declared (MP4, AVI; 0 where the container has none) and then counted in
    #    compressed packets, before decoding any. Neither is exactly the decoded count: samples
    #    outside an MP4 edit list are demuxed but never shown, and interlaced video may carry each
    #    field in its own packet, so a frame is at most 2 packets. Above 2 * max_frames the video
    #    is refused here; the exact limit holds for the decoded frames (render workers decode
    #    with max_frames = the frame count CreateAvatar found, so the count must not be early).
    if stream.frames > 2 * max_frames:
        raise TooLarge(_too_many_frames(max_frames, fps, stream.frames))
    # 3. The decoder refuses to allocate a frame above max_pixels, whatever the headers said (a
    #    later SPS may switch to 16000x16000): FFmpeg checks it in every frame allocation.
    context.options = {**(context.options or {}), "max_pixels": str(max_pixels)}
    packets = []
    count = 0
    for packet in container.demux(stream):  # the last packet (size 0) is the decoder's flush
        if packet.size and not packet.is_discard:
            count += 1
            if count > 2 * max_frames:
                raise TooLarge(_too_many_frames(max_frames, fps))
        packets.append(packet)
    return stream, packets, count, fps


# FFmpeg demuxers of still images (besides the "*_pipe" ones): such files reach the video path only
# when their format is not one `decode_avatar` decodes as a photo.
_IMAGE_DEMUXERS = frozenset({"image2", "apng", "gif", "webp", "jpegxl_anim"})


def _open_video(data: bytes) -> av.container.InputContainer:
    """Opens a container without letting FFmpeg decode anything.

    ``avformat_find_stream_info`` (run by ``av.open``) decodes frames to learn parameters that the
    headers leave out, with a decoder that has no size limit: a tiny MPEG-TS declaring one 16000x16000
    H.264 frame costs ~400 MB per frame before any check could run. Codec options cannot reach that
    decoder for containers that declare streams only in their packets (MPEG-TS/PS, FLV), so instead
    an empty ``codec_whitelist`` keeps it from opening at all. The sizes then come from the
    container's headers or the codec parsers (which read SPS-like headers without decoding), or,
    where neither has them, from the first decoded frame (by then under the ``max_pixels`` limit).
    """
    return av.open(io.BytesIO(data), mode="r", container_options={"codec_whitelist": "none"})


def _iter_packets(
    stream: av.video.stream.VideoStream,
    packets: list[av.Packet],
    max_frames: int,
    max_pixels: int,
    min_side: int,
) -> Iterator[np.ndarray]:
    """Decodes packets one at a time into even-sized, upright (H, W, 3) BGR views, checking every frame.

    Each packet is dropped from ``packets`` once decoded. A yielded frame is only valid until the
    next one is asked for (it may be a view of the decoder's output): copy what must be kept.
    """
    first: tuple[int, int, int] | None = None  # (width, height, rotation) of frame 0
    n = 0
    try:
        for i, packet in enumerate(packets):
            packets[i] = None  # type: ignore[call-overload] # each packet is freed once decoded
            for frame in stream.decode(packet):
                key = (frame.width, frame.height, frame.rotation)
                if first is None:
                    first = key
                    _check_size(frame.width, frame.height, max_pixels, min_side)
                elif key != first:
                    raise InvalidMedia(
                        f"frame {n} of the avatar video is {_describe(key)} but frame 0 is {_describe(first)}; "
                        f"the video must keep one frame size and orientation (re-encode it at one size)"
                    )
                if n >= max_frames:
                    raise TooLarge(_too_many_frames(max_frames, _rate(stream)))
                image = frame.to_ndarray(format="bgr24")
                # Phone videos are often stored sideways with a display-rotation tag that players
                # honour; apply it so the face is upright for the face detector (counterclockwise).
                if frame.rotation:
                    image = np.rot90(image, k=round(frame.rotation / 90))  # a view
                height, width = image.shape[:2]
                n += 1
                yield image[: height - height % 2, : width - width % 2]  # yuv420p needs even sizes
    except _DECODE_ERRORS as exc:
        raise InvalidMedia(
            f"could not decode frame {n} of the avatar video: {_reason(exc)} (frames are limited to {max_pixels} pixels); {_SUPPORTED_HINT}"
        ) from exc
    if n == 0:
        raise InvalidMedia(f"the avatar video has no frames; {_SUPPORTED_HINT}")


def _decode_packets(
    stream: av.video.stream.VideoStream,
    packets: list[av.Packet],
    count: int,
    max_frames: int,
    max_pixels: int,
    min_side: int,
) -> np.ndarray:
    """Decodes packets into an (n, H, W, 3) array allocated once for ``count`` frames (grown if more come)."""
    out: np.ndarray | None = None
    n = 0
    for image in _iter_packets(stream, packets, max_frames, max_pixels, min_side):
        if out is None:
            out = np.empty((max(count, 1), *image.shape), np.uint8)
        elif n == len(out):
            # More frames than packets (a codec that packs several frames in one, such as
            # MPEG-4 Part 2 "packed B-frames" in AVI): grow by doubling, never past max_frames,
            # in place (realloc: glibc moves the pages of a large block with mremap, no copy).
            out.resize((min(2 * n, max_frames), *out.shape[1:]), refcheck=False)
        out[n] = image
        n += 1
    assert out is not None  # _iter_packets raises on no frames
    if n < len(out):
        # Fewer frames than packets: give the unused tail back (in place, like the growth above;
        # its pages were never written, so they never counted in RSS). No view of `out` exists.
        out.resize((n, *out.shape[1:]), refcheck=False)
    return out


class AvatarFrames:
    """An avatar's frames decoded one at a time: what `decode_avatar` returns, without holding them all.

    Why: a 1080p frame is 6 MB in BGR, so holding a 1,500-frame avatar costs 9.3 GB; CreateAvatar
    and the render workers' cache need each frame once, in order (docs/performance.md, "Avatar
    memory"). Opening checks what `decode_avatar` checks before decoding (image header, declared
    size and frame count, the compressed packets counted), so a bad upload fails at `open_avatar`;
    iterating decodes frame by frame with the per-frame checks (``max_pixels`` in the decoder, one
    size throughout, at most ``max_frames``). Memory: the compressed packets (at most the upload),
    the decoder's few frames and the frame being handed out.

    Iterating yields even-sized (H, W, 3) uint8 BGR frames, each valid until the next is asked for
    (copy to keep one). It can be iterated once; `open_avatar` again for a second pass.
    """

    def __init__(self, fps: float, frames: Iterator[np.ndarray], count_hint: int, closer: av.container.InputContainer | None = None) -> None:
        self.fps = fps
        #: Frames the headers or the compressed packets announce (the decoded count may differ).
        self.count_hint = count_hint
        self._frames = frames
        self._closer = closer
        #: Frames handed out so far.
        self.count = 0
        self.width = 0
        self.height = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        try:
            for frame in self._frames:
                self.height, self.width = frame.shape[:2]
                self.count += 1
                yield frame
        finally:
            self.close()

    def close(self) -> None:
        if self._closer is not None:
            self._closer.close()
            self._closer = None

    def __enter__(self) -> AvatarFrames:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_avatar(
    data: bytes,
    *,
    photo_fps: float = 25.0,
    max_frames: int = 1500,
    max_pixels: int = 1920 * 1080,
    min_side: int = MIN_AVATAR_SIDE,
) -> AvatarFrames:
    """The avatar's frames, one at a time (`AvatarFrames`), with `decode_avatar`'s limits and errors.

    A photo is one frame (decoded here: it is one frame either way); a video is opened and demuxed
    here and decoded as it is iterated. Raises what `decode_avatar` raises, at open or while iterating.
    """
    if not data:
        raise InvalidMedia("avatar is empty")
    try:
        header = read_image_size(data)
    except ImageHeaderError as exc:
        raise InvalidMedia(f"could not decode the avatar image: {exc}; {_SUPPORTED_HINT}") from exc
    if header is not None:
        still = _decode_still(data, header, max_pixels=max_pixels, min_side=min_side)
        return AvatarFrames(float(photo_fps), iter([still[0]]), 1)
    container = None
    try:
        container = _open_video(data)
        stream, packets, count, fps = _demux_checked(container, max_frames=max_frames, max_pixels=max_pixels, min_side=min_side)
    except _DECODE_ERRORS as exc:
        if container is not None:
            container.close()
        raise InvalidMedia(f"could not decode the avatar as an image or a video: {_reason(exc)}; {_SUPPORTED_HINT}") from exc
    except BaseException:
        if container is not None:
            container.close()
        raise
    # An AVIF photo (ISO-BMFF, major brand "avif") is a one-frame AV1 video to FFmpeg; it is a photo.
    fps = float(photo_fps) if data[8:12] == b"avif" else fps
    return AvatarFrames(fps, _iter_packets(stream, packets, max_frames, max_pixels, min_side), min(count, max_frames), container)


def _rate(stream: av.video.stream.VideoStream) -> float:
    return float(stream.average_rate) if stream.average_rate else _DEFAULT_VIDEO_FPS


def _describe(key: tuple[int, int, int]) -> str:
    width, height, rotation = key
    return f"{width}x{height}" + (f" rotated {rotation} degrees" if rotation else "")


def _too_many_frames(max_frames: int, fps: float, frames: int | None = None) -> str:
    has = f" (it declares {frames})" if frames else ""
    return f"the avatar video has more than {max_frames} frames{has}, the limit ({max_frames / fps:.1f} s at {fps:g} fps); send a shorter video"


def _check_size(width: int, height: int, max_pixels: int, min_side: int) -> None:
    """TooLarge above ``max_pixels``, InvalidMedia below ``min_side`` on either side."""
    _check_pixels(width, height, max_pixels)
    if min(width, height) < min_side:
        raise InvalidMedia(f"the avatar is {width}x{height} px; send at least {min_side}x{min_side} (a photo or video in which the face is clearly visible)")


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise TooLarge(
            f"the avatar is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels}; resize to at most {max_pixels} pixels (e.g. 1920x1080)"
        )


def _even(frames: np.ndarray) -> np.ndarray:
    """Crops the last row/column of (N, H, W, 3) frames where H/W is odd (yuv420p needs even sizes)."""
    _, height, width, _ = frames.shape
    return np.ascontiguousarray(frames[:, : height - height % 2, : width - width % 2])


# --------------------------------------------------------------------------------------------------
# Pasting faces
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def feather_mask(height: int, width: int, feather: float = 0.15) -> np.ndarray:
    """A blending mask that is 1 in the centre and ramps smoothly to 0 at the borders.

    The ramp covers ``feather`` of the height (top and bottom) and of the width (left and right) and
    follows a smoothstep, so a pasted face has no visible seam: its edge pixels take the frame's
    value and the blend has no kink where the ramp starts.

    Args:
        height: Mask height in pixels.
        width: Mask width in pixels.
        feather: Ramp length as a fraction of each dimension, in [0, 0.5]; 0 gives a hard paste.

    Returns:
        A read-only (height, width, 1) float32 array in [0, 1] (cached per arguments, so shared).
    """
    if not 0.0 <= feather <= 0.5:
        raise ValueError(f"feather must be in [0, 0.5], got {feather}")
    mask = np.outer(_ramp(height, feather), _ramp(width, feather)).astype(np.float32)[:, :, None]
    mask.setflags(write=False)  # cached and shared between callers: nobody may modify it
    return mask


def _ramp(size: int, feather: float) -> np.ndarray:
    """1-D profile: 0 at both ends, smoothstep up to 1 over ``feather * size`` pixels."""
    ramp_len = feather * size
    if ramp_len < 1.0:
        return np.ones(size, dtype=np.float64)
    index = np.arange(size, dtype=np.float64)
    distance = np.minimum(index, size - 1 - index)  # pixels from the nearest edge
    t = np.clip(distance / ramp_len, 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def paste_face(frame: np.ndarray, face: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """Alpha-blends a face crop into a copy of a frame using the feather mask.

    Args:
        frame: (H, W, 3) uint8 BGR frame; not modified.
        face: (y2 - y1, x2 - x1, 3) uint8 BGR face, already resized to the box.
        box: ``(x1, y1, x2, y2)`` pixel box inside the frame (x2/y2 exclusive).

    Returns:
        A new frame with the face blended into ``frame[y1:y2, x1:x2]``.

    Raises:
        ValueError: The box is empty or outside the frame, or the face's shape does not match it.
    """
    x1, y1, x2, y2 = (int(v) for v in box)
    height, width = frame.shape[:2]
    if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
        raise ValueError(f"box {box} is empty or outside the {width}x{height} frame")
    if face.shape != (y2 - y1, x2 - x1, 3):
        raise ValueError(f"face has shape {face.shape}, the box {box} needs {(y2 - y1, x2 - x1, 3)}")
    mask = feather_mask(y2 - y1, x2 - x1)
    region = frame[y1:y2, x1:x2].astype(np.float32)
    blended = region + mask * (face.astype(np.float32) - region)
    out = frame.copy()
    # Values lie in [0, 255], so +0.5 then truncation is rounding; where mask == 1 this is exactly face.
    out[y1:y2, x1:x2] = (blended + 0.5).astype(np.uint8)
    return out


# --------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------


def split_i420(frame: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y (height, width), U and V (height/2, width/2) views of a C-contiguous I420 frame (the
    (height * 3 / 2, width) layout of `to_yuv420`)."""
    flat = frame.reshape(-1)
    y_size = height * width
    c_size = y_size // 4
    return (
        flat[:y_size].reshape(height, width),
        flat[y_size : y_size + c_size].reshape(height // 2, width // 2),
        flat[y_size + c_size : y_size + 2 * c_size].reshape(height // 2, width // 2),
    )


def to_yuv420(frame_bgr: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 BGR -> (H * 3 / 2, W) uint8 I420 planes (Y, then U, then V), BT.601 limited range.

    Why not let PyAV convert: its swscale path (bgr24 -> yuv420p) runs single-threaded on the
    encoding thread and measured 8.4 ms per 720p frame on 2 cores, against 1.8 ms for OpenCV's
    SIMD conversion, which also releases the GIL. Both use BT.601 limited-range coefficients (what
    an untagged H.264 stream is read as); they differ by rounding only (Y within 1 level, chroma
    within 3 where swscale filters the 2x2 subsampling differently).
    """
    return cv2.cvtColor(frame_bgr, cv2.COLOR_BGR2YUV_I420)


def exact_rate(fps: float) -> Fraction:
    """The exact frame rate for ``fps``: 25 -> 25/1, 29.97 or 29.97002997 -> 30000/1001.

    A float fps cannot be a time base; the NTSC family (N * 1000/1001) is snapped explicitly because
    a typed 29.97 would otherwise become 2997/100, which drifts against 30000/1001 material.
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    ntsc = round(fps * 1.001)
    if abs(fps - round(fps)) > 1e-6 and abs(fps * 1.001 - ntsc) < 1e-3:
        return Fraction(ntsc * 1000, 1001)
    return Fraction(fps).limit_denominator(1001)


X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")


class _AacTrack:
    """A mono AAC stream of a container, encoded in step with the video (an interleaved file)."""

    _FRAME = 1024  # samples per AAC frame

    def __init__(self, container: av.container.OutputContainer, audio: np.ndarray, rate: int) -> None:
        self._audio = np.ascontiguousarray(audio, dtype=np.float32)
        if self._audio.ndim != 1:
            raise ValueError(f"audio must be mono (1-D), got shape {self._audio.shape}")
        self._container = container
        self.rate = int(rate)
        self._pos = 0  # samples already encoded
        self._stream = container.add_stream("aac", rate=self.rate)
        self._stream.layout = "mono"
        # FFmpeg's "fast" coder: 1.7x faster than its default "twoloop" (0.21 vs 0.36 s per minute of
        # audio on one core), plenty for speech; the AAC track is on every job's critical path.
        self._stream.options = {"aac_coder": "fast"}
        # The native aac encoder accepts only planar float ("fltp"); ask it rather than assume.
        self._format = self._stream.codec_context.codec.audio_formats[0].name

    def encode(self, until: int | None) -> None:
        """Encodes 1024-sample frames up to sample ``until`` (None: to the end, the last frame short)."""
        end = len(self._audio)
        while self._pos < end:
            stop = min(self._pos + self._FRAME, end)
            # Mid-stream, only full frames: the encoder accepts a short frame only as the last one.
            if until is not None and (stop - self._pos < self._FRAME or stop > until):
                return
            frame = av.AudioFrame.from_ndarray(self._audio[None, self._pos : stop], format=self._format, layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self._pos
            frame.time_base = Fraction(1, self.rate)
            self._container.mux(self._stream.encode(frame))
            self._pos = stop

    def finish(self) -> None:
        """Encodes the rest of the audio (even past the last video frame) and flushes the encoder."""
        self.encode(None)
        self._container.mux(self._stream.encode(None))


class _AtomicMp4:
    """An MP4 container opened on a temporary name next to ``path``, renamed to it by `commit`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.tmp")
        # format= is needed because the temporary name does not end in .mp4.
        self.container = av.open(str(self._tmp), mode="w", format="mp4", container_options={"movflags": "+faststart"})

    def commit(self) -> None:
        self.container.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        try:
            self.container.close()
        except Exception:  # noqa: BLE001 - already failing; the original error matters
            pass
        self._tmp.unlink(missing_ok=True)


#: The colour tags of every H.264 stream `Mp4Writer` writes (AVCodecContext values; docs/quality.md).
#: They state what the pixels are, so that players do not guess (many assume BT.709 for HD):
#: * matrix BT.601 (smpte170m; bt470bg has the same coefficients) and range limited (tv, 16-235/240):
#:   the frames are converted by OpenCV's COLOR_BGR2YUV_I420 (`to_yuv420`, the compositor's
#:   `I420Frames`), whose coefficients are BT.601 limited range (white -> Y 235, black -> Y 16,
#:   pure red -> Y 82, V 240; checked by tests/unit/render/test_quality.py) whatever the frame size;
#: * primaries and transfer BT.709: nothing in the pipeline converts them, so they are the
#:   source's, and the sources are camera videos and photos (sRGB: BT.709 primaries, a
#:   BT.709-like transfer).
COLOR_TAGS = {"colorspace": 6, "color_range": 1, "color_primaries": 1, "color_trc": 1}
COLOR_TAG_NAMES = {"colorspace": "smpte170m", "color_range": "tv", "color_primaries": "bt709", "color_trc": "bt709"}


class Mp4Writer:
    """Writes an MP4 with H.264 video and optional mono AAC audio, atomically.

    Frames go to a temporary file next to ``path`` that is renamed to ``path`` by :meth:`close`, so a
    half-written file never appears under its final name; leaving a ``with`` block by an exception
    deletes the temporary file instead.

    Example:
        >>> with Mp4Writer(path, 640, 480, 25.0, audio, 16000) as writer:  # doctest: +SKIP
        ...     for frame in frames:
        ...         writer.write(frame)
    """

    def __init__(
        self,
        path: Path,
        width: int,
        height: int,
        fps: float,
        audio: np.ndarray | None,
        audio_rate: int,
        crf: int = 20,
        preset: str = "veryfast",
        threads: int = 0,
    ) -> None:
        """Opens the temporary file and sets up the streams.

        Args:
            path: The final output path.
            width: Frame width (even).
            height: Frame height (even).
            fps: Frame rate; converted to an exact fraction (25 -> 25/1, 29.97 -> 30000/1001).
            audio: Mono float32 PCM in [-1, 1] (1-D), or None for a silent video.
            audio_rate: Audio sample rate in Hz.
            crf: x264 constant rate factor (lower is better quality, bigger files).
            preset: x264 speed preset.
            threads: x264 frame threads; 0 = x264's choice (1.5 per core). Writers that run side by
                side (segments of one clip) split the cores between them instead.
        """
        if width % 2 or height % 2:
            raise ValueError(f"H.264 yuv420p needs an even size, got {width}x{height}")
        if preset not in X264_PRESETS:
            raise ValueError(f"unknown x264 preset {preset!r}; one of {', '.join(X264_PRESETS)}")
        self.path = Path(path)
        self._rate = exact_rate(fps)
        self._frames = 0
        self._closed = False
        self._frame: av.VideoFrame | None = None  # the one frame encoded from (`i420_planes`)
        self._planes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._file = _AtomicMp4(self.path)
        self._container = self._file.container
        try:
            self._video = self._container.add_stream("libx264", rate=self._rate)
            self._video.width = width
            self._video.height = height
            self._video.pix_fmt = "yuv420p"
            # x264 frame threading (all cores) instead of PyAV's default slice threading: 11.9 vs
            # 13.4 ms per 720p frame on 2 cores, and it scales further on more; the added latency
            # (a few frames in flight) does not matter for a file.
            self._video.codec_context.thread_type = "FRAME"
            self._video.codec_context.thread_count = threads
            self._video.codec_context.time_base = 1 / self._rate
            self._video.options = {"crf": str(crf), "preset": preset}
            # Written into the H.264 VUI (libx264 takes them from the context) and the MP4's colr box.
            for name, value in COLOR_TAGS.items():
                setattr(self._video.codec_context, name, value)
            self._audio = None if audio is None else _AacTrack(self._container, audio, audio_rate)
        except BaseException:
            self.abort()
            raise

    def write(self, frame_bgr: np.ndarray) -> None:
        """Encodes one (height, width, 3) uint8 BGR frame."""
        expected = (self._video.height, self._video.width, 3)
        if frame_bgr.shape != expected:
            # PyAV would silently rescale a mismatched frame; a wrong size is a caller bug.
            raise ValueError(f"frame has shape {frame_bgr.shape}, the video needs {expected}")
        self.write_yuv420(to_yuv420(frame_bgr))

    def i420_planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Writable Y (height, width), U and V (height/2, width/2) views of the frame the next
        `write_planes` encodes: a caller that composes frames fills them in place.

        Why one frame, reused: `av.VideoFrame.from_ndarray` allocates a fresh 1.4 MB frame per 720p
        frame and copies into it, several times the cost of a copy into a frame already mapped
        (docs/performance.md), and a compositor writing here saves its own output buffer too. It is
        safe because libx264 copies a frame's pixels into its own buffers inside
        `x264_encoder_encode`, which libavcodec calls before `encode` returns (tested: a clip encoded
        from one reused frame decodes to each of its distinct frames).
        """
        if self._planes is None:
            w, h = self._video.width, self._video.height
            self._frame = av.VideoFrame(w, h, "yuv420p")
            views = []
            for plane, rows, cols in zip(self._frame.planes, (h, h // 2, h // 2), (w, w // 2, w // 2)):
                views.append(np.frombuffer(plane, np.uint8).reshape(rows, plane.line_size)[:, :cols])
            self._planes = (views[0], views[1], views[2])
        return self._planes

    def write_planes(self) -> None:
        """Encodes the frame of `i420_planes` as it is now."""
        self.i420_planes()
        frame = self._frame
        assert frame is not None
        frame.pts = self._frames  # time_base is 1/fps, so the duration is exactly frames / fps
        frame.time_base = self._video.codec_context.time_base
        self._container.mux(self._video.encode(frame))
        self._frames += 1
        # Encode the audio alongside the video so the file is interleaved (small read-ahead for
        # players streaming it) instead of all video followed by all audio.
        if self._audio is not None:
            self._audio.encode(until=round(self._frames / self._rate * self._audio.rate))

    def write_yuv420(self, frame_i420: np.ndarray) -> None:
        """Encodes one frame already converted by `to_yuv420` ((height * 3 / 2, width) uint8, I420)."""
        h, w = self._video.height, self._video.width
        expected = (h * 3 // 2, w)
        if frame_i420.shape != expected or frame_i420.dtype != np.uint8:
            raise ValueError(f"I420 frame has shape {frame_i420.shape} {frame_i420.dtype}, the video needs {expected} uint8")
        for plane, source in zip(self.i420_planes(), split_i420(frame_i420, h, w)):
            plane[:] = source
        self.write_planes()

    def close(self) -> None:
        """Encodes the rest of the audio, flushes both encoders and moves the file to ``path``."""
        if self._closed:
            return
        try:
            if self._audio is not None:
                self._audio.encode(until=None)
            self._container.mux(self._video.encode(None))
            if self._audio is not None:
                self._audio.finish()
            self._file.commit()
        except BaseException:
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        """Closes the container without finishing it and deletes the temporary file."""
        self._closed = True
        self._file.abort()

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --------------------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------------------


def probe_media(path: Path) -> dict:
    """Describes an MP4 by decoding it fully (used by tests and the demo to check outputs).

    Args:
        path: The file to probe.

    Returns:
        A dict with ``video_codec``, ``audio_codec`` (None without audio), ``width``, ``height``,
        ``fps`` (float), ``frames`` (decoded count), ``video_duration`` (frames / fps),
        ``audio_duration`` (decoded samples / rate, capped at the stream's declared duration to drop
        the last AAC frame's padding; 0.0 without audio) and ``audio_rate``
        (None without audio).
    """
    with av.open(str(path), mode="r") as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0] if container.streams.audio else None
        frames = samples = 0
        # One demux pass over both streams. The AAC decoder drops the leading priming samples
        # (encoder delay) but not the padding that fills the last 1024-sample frame, which the
        # muxer's edit list marks as beyond the stream's duration; hence the cap below.
        for frame in container.decode(*(s for s in (video, audio) if s is not None)):
            if isinstance(frame, av.VideoFrame):
                frames += 1
            else:
                samples += frame.samples
        fps = float(video.average_rate) if video.average_rate else _DEFAULT_VIDEO_FPS
        audio_rate = audio.codec_context.sample_rate if audio is not None else None
        audio_duration = samples / audio_rate if audio_rate else 0.0
        if audio is not None and audio.duration:
            audio_duration = min(audio_duration, float(audio.duration * audio.time_base))
        return {
            "video_codec": video.codec_context.name,
            "audio_codec": audio.codec_context.name if audio is not None else None,
            "width": video.codec_context.width,
            "height": video.codec_context.height,
            "fps": fps,
            "frames": frames,
            "video_duration": frames / fps,
            "audio_duration": audio_duration,
            "audio_rate": audio_rate,
        }


# --------------------------------------------------------------------------------------------------
# Segments of a job: AAC track once, H.264 segments by workers, joined by a stream copy
# --------------------------------------------------------------------------------------------------


def encode_aac(audio: np.ndarray, rate: int, path: Path) -> None:
    """Encode mono float PCM into an AAC-in-MP4 file (`path`, atomically): the job's audio track.

    Made once at SubmitJob, so the join of a job's segments is a pure stream copy of both tracks.
    """
    out = _AtomicMp4(path)
    try:
        track = _AacTrack(out.container, audio, rate)
        track.finish()
        out.commit()
    except BaseException:
        out.abort()
        raise


def join_segments(parts: Sequence[Path], path: Path, fps: float, audio: Path | None) -> int:
    """Join H.264 MP4 segments of one clip into ``path`` with the AAC track of ``audio``, both by stream copy.

    Every part must come from `Mp4Writer` with the same size, rate and encoder settings and start
    at its own frame 0 (what render workers write); each part's timestamps are shifted by the frames
    before it. Audio packets are interleaved by time with the video (players read ahead little).
    The colour tags (`COLOR_TAGS`) come with the copied stream parameters (SPS/VUI and colr box).
    Written atomically.

    Returns:
        The number of video frames written.
    """
    if not parts:
        raise ValueError("no segments to join")
    rate = exact_rate(fps)
    out = _AtomicMp4(path)
    audio_in = av.open(str(audio)) if audio is not None else None
    try:
        with av.open(str(parts[0])) as first:
            video = out.container.add_stream_from_template(first.streams.video[0])
        audio_out = None
        audio_packets = iter(())
        if audio_in is not None:
            source_audio = audio_in.streams.audio[0]
            audio_out = out.container.add_stream_from_template(source_audio)
            audio_packets = (p for p in audio_in.demux(source_audio) if p.dts is not None)
        pending_audio = next(audio_packets, None)
        frames = 0
        for part in parts:
            with av.open(str(part)) as source:
                stream = source.streams.video[0]
                shift = round(frames / rate / stream.time_base)  # this part's start, in its time base
                count = 0
                for packet in source.demux(stream):
                    if packet.dts is None:  # the demuxer's end-of-stream marker
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = video
                    out.container.mux(packet)
                    count += 1
                    now = (frames + count) / rate
                    while pending_audio is not None and pending_audio.dts * pending_audio.time_base <= now:
                        pending_audio.stream = audio_out
                        out.container.mux(pending_audio)
                        pending_audio = next(audio_packets, None)
            frames += count
        while pending_audio is not None:
            pending_audio.stream = audio_out
            out.container.mux(pending_audio)
            pending_audio = next(audio_packets, None)
        out.commit()
    except BaseException:
        out.abort()
        raise
    finally:
        if audio_in is not None:
            audio_in.close()
    return frames
