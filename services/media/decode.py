"""Decoding avatars: a photo or a template video into BGR frames, with every limit checked first.

The gateway decodes avatars (CreateAvatar) frame by frame (`open_avatar`); render workers decode
them again into their I420 cache. Encoding and the MP4 side live with the render workers
(services/render/mp4.py).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from types import TracebackType

import av
import cv2
import numpy as np

from services.media import av_limits  # noqa: F401 - caps FFmpeg allocations on import
from services.media.image_header import ImageHeaderError, ImageSize, read_image_size
from services.serving.errors import InvalidMedia, TooLarge

DEFAULT_VIDEO_FPS = 25.0
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

    - a still image's size comes from its header (`services.media.image_header`), so a small PNG
      that claims 30000x30000 is refused without allocating anything;
    - a video's declared frame size and frame count are checked after opening it (FFmpeg's stream
      probing is not allowed to decode: see `_open_video`), the compressed frames are counted before
      decoding (more than twice ``max_frames`` is refused there; see `_demux_checked` for why not
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
    with open_avatar(
        data, photo_fps=photo_fps, max_frames=max_frames, max_pixels=max_pixels, min_side=min_side
    ) as frames:
        return _collect(frames, frames.count_hint, max_frames), frames.fps


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
        raise InvalidMedia(
            f"could not decode the avatar as a {header.format} image (corrupt or truncated data); {_SUPPORTED_HINT}"
        )
    _check_size(image.shape[1], image.shape[0], max_pixels, min_side)
    return _even(image[None])


def _demux_checked(
    container: av.container.InputContainer, *, max_frames: int, max_pixels: int, min_side: int
) -> tuple[av.video.stream.VideoStream, list[av.Packet | None], int, float]:
    """The first video stream's compressed packets, after the header checks of `decode_avatar`.

    Returns ``(stream, packets, count, fps)``; count is the number of frame-carrying packets.
    """
    if not container.streams.video:
        raise InvalidMedia(
            f"could not decode the avatar as an image or a video: it has no video stream; {_SUPPORTED_HINT}"
        )
    if container.format.name.endswith("_pipe") or container.format.name in _IMAGE_DEMUXERS:
        raise InvalidMedia(
            f"the avatar is a still image in a format that is not supported ({container.format.name}); {_SUPPORTED_HINT}"
        )
    stream = container.streams.video[0]
    context = stream.codec_context
    if context is None:
        raise InvalidMedia(f"the avatar video's codec is not one this service can decode; {_SUPPORTED_HINT}")
    # 1. The size the container (or the codec parser) declares, before anything is decoded.
    if context.width and context.height:
        _check_size(context.width, context.height, max_pixels, min_side)
    fps = float(stream.average_rate) if stream.average_rate else DEFAULT_VIDEO_FPS
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
    packets: list[av.Packet | None] = []  # None once decoded (_iter_packets)
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
    packets: list[av.Packet | None],
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
            packets[i] = None  # each packet is freed once decoded
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


def _collect(images: Iterable[np.ndarray], count: int, max_frames: int) -> np.ndarray:
    """Copies frames into an (n, H, W, 3) array allocated once for ``count`` frames (grown if more come)."""
    out: np.ndarray | None = None
    n = 0
    for image in images:
        if out is None:
            out = np.empty((max(count, 1), *image.shape), np.uint8)
        elif n == len(out):
            # More frames than packets (a codec that packs several frames in one, such as
            # MPEG-4 Part 2 "packed B-frames" in AVI): grow by doubling, never past max_frames,
            # in place (realloc: glibc moves the pages of a large block with mremap, no copy).
            out.resize((min(2 * n, max_frames), *out.shape[1:]), refcheck=False)
        out[n] = image
        n += 1
    assert out is not None  # open_avatar yields at least one frame or raises
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

    def __init__(
        self,
        fps: float,
        frames: Iterator[np.ndarray],
        count_hint: int,
        closer: av.container.InputContainer | None = None,
    ) -> None:
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

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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
        stream, packets, count, fps = _demux_checked(
            container, max_frames=max_frames, max_pixels=max_pixels, min_side=min_side
        )
    except _DECODE_ERRORS as exc:
        if container is not None:
            container.close()
        raise InvalidMedia(
            f"could not decode the avatar as an image or a video: {_reason(exc)}; {_SUPPORTED_HINT}"
        ) from exc
    except BaseException:
        if container is not None:
            container.close()
        raise
    # An AVIF photo (ISO-BMFF, major brand "avif") is a one-frame AV1 video to FFmpeg; it is a photo.
    fps = float(photo_fps) if data[8:12] == b"avif" else fps
    return AvatarFrames(
        fps, _iter_packets(stream, packets, max_frames, max_pixels, min_side), min(count, max_frames), container
    )


def _rate(stream: av.video.stream.VideoStream) -> float:
    return float(stream.average_rate) if stream.average_rate else DEFAULT_VIDEO_FPS


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
        raise InvalidMedia(
            f"the avatar is {width}x{height} px; send at least {min_side}x{min_side} (a photo or video in which the face is clearly visible)"
        )


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


# --------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Probing
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# Segments of a job: AAC track once, H.264 segments by workers, joined by a stream copy
# --------------------------------------------------------------------------------------------------
