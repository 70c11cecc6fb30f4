"""Read the format and pixel size of a still image from its first bytes, without decoding a pixel.

Decoders must refuse an oversized image *before* they spend memory on it: a 2.5 MiB PNG can claim
30000x30000 pixels (2.7 GB as BGR), and ``cv2.imdecode`` allocates all of it before anyone can look at
the size. This module answers "what is it and how big does it say it is" from the header alone, so
callers compare the answer with their limits first and decode only what fits.

Why a small pure-Python reader and not a library:

- Pillow would do it (``Image.open`` reads only the header), but it is not in the lock, and adding a
  whole imaging library (and its own decoders' attack surface) to read five fixed header layouts is
  the wrong trade.
- PyAV (in the lock) can probe images (``png_pipe``, ``jpeg_pipe``...), but ``avformat_find_stream_info``
  may decode a frame to learn the size, which is exactly what must not happen before the check, and
  for PNG it reports 0x0 until a frame has been decoded.
- OpenCV (in the lock) has no header-only API in Python (``cv2.imdecode`` decodes everything).

The layouts read here are short and fixed (PNG IHDR; JPEG SOFn; WebP VP8/VP8L/VP8X; BMP DIB header;
GIF logical screen), every read is bounds-checked against the bytes given, and every loop advances
through the data, so a hostile header can only produce `ImageHeaderError`, never an IndexError, a
hang or a large allocation. Only the first bytes are needed except for JPEG (the SOF marker comes
after the APPn/DQT/DHT segments, which are skipped by their lengths without being read) and PNG
(every chunk's length is checked against the bytes left: see `_check_png_chunks`).

What the header size bounds: OpenCV's decoders allocate the declared canvas and refuse parts that do
not fit it (APNG frame controls, GIF frames: checked, they return None), and libwebp requires a
still VP8X image to match its canvas; so the size read here bounds the decoded image.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["ImageHeaderError", "ImageSize", "read_image_size", "sniff_image_format"]

PNG, JPEG, WEBP, BMP, GIF = "PNG", "JPEG", "WebP", "BMP", "GIF"

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (the frame header holds the size): C0-CF except DHT (C4), JPG (C8), DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7, SOI (EOI and SOS end the search).
_JPEG_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8), 0xD8])


class ImageHeaderError(ValueError):
    """The bytes start like an image of a known format, but its header is truncated or malformed."""


@dataclass(frozen=True)
class ImageSize:
    """What an image's header declares."""

    format: str  # one of "PNG", "JPEG", "WebP", "BMP", "GIF"
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def sniff_image_format(data: bytes) -> str | None:
    """The still-image format the bytes start with (by magic number), or None for anything else."""
    if data.startswith(_PNG_SIGNATURE):
        return PNG
    if data.startswith(b"\xff\xd8\xff"):
        return JPEG
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return WEBP
    if data.startswith(b"BM"):
        return BMP
    if data.startswith((b"GIF87a", b"GIF89a")):
        return GIF
    return None


def read_image_size(data: bytes) -> ImageSize | None:
    """The format and declared size of a PNG, JPEG, WebP, BMP or GIF image, from its header only.

    Args:
        data: The encoded image: for JPEG the bytes up to its SOF marker suffice; PNG needs the whole
            file (its chunk lengths are checked).

    Returns:
        The header's format, width and height (both > 0), or None when the bytes are not one of these
        formats (e.g. a video, or garbage).

    Raises:
        ImageHeaderError: The magic number matches a format but the header is truncated or invalid
            (including a zero width or height).
    """
    fmt = sniff_image_format(data)
    if fmt is None:
        return None
    width, height = _READERS[fmt](memoryview(data))
    if width <= 0 or height <= 0:
        raise ImageHeaderError(f"the {fmt} header declares an empty image ({width}x{height})")
    return ImageSize(fmt, width, height)


def _unpack(fmt: str, data: memoryview, offset: int, what: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    if offset < 0 or offset + size > len(data):
        raise ImageHeaderError(f"the {what} header is truncated")
    return struct.unpack_from(fmt, data, offset)


# Chunks walked before IEND at most (0.3 s of Python): a 200 MB PNG written in 8 KiB IDAT chunks has
# 25,000; a file of millions of empty chunks is refused instead of walked.
PNG_MAX_CHUNKS = 1_000_000
_PNG_CHUNK = struct.Struct(">I4s")


def _png(data: memoryview) -> tuple[int, int]:
    # The signature, then IHDR, which the specification requires to be the first chunk.
    length, kind = _unpack(">I4s", data, 8, "PNG")
    if kind != b"IHDR" or length != 13:
        raise ImageHeaderError("the PNG does not start with an IHDR chunk")
    width, height = _unpack(">II", data, 16, "PNG")
    _check_png_chunks(data)
    return width, height


def _check_png_chunks(data: memoryview) -> None:
    """Every chunk up to IEND must fit in the data.

    OpenCV's PNG reader allocates (and zero-fills) each chunk's declared length before reading it:
    a 5 KB PNG whose IDAT claims 0xFFFF2000 bytes cost 4 GB and 4.7 s in cv2.imdecode (found by
    tests/unit/media/test_fuzz_decoders.py). A chunk that claims more than the bytes left is a
    truncated or forged file either way, so it is refused here; then no chunk allocation exceeds the
    upload's size.
    """
    offset, end = 8, len(data)
    for _ in range(PNG_MAX_CHUNKS):
        if offset + 12 > end:
            raise ImageHeaderError("the PNG is truncated (it ends before its IEND chunk)")
        length, kind = _PNG_CHUNK.unpack_from(data, offset)
        if length > end - offset - 12:
            raise ImageHeaderError(
                f"the PNG is truncated or corrupt: its {bytes(kind)!r} chunk claims {length} bytes, {end - offset - 12} remain"
            )
        if kind == b"IEND":
            return
        offset += 12 + length
    raise ImageHeaderError(f"the PNG has more than {PNG_MAX_CHUNKS} chunks")


def _jpeg(data: memoryview) -> tuple[int, int]:
    offset = 2  # after SOI
    n = len(data)
    while offset < n:
        # Markers are 0xFF followed by a code; any number of 0xFF fill bytes may precede the code, and
        # decoders skip stray bytes between segments (libjpeg warns "extraneous bytes"): do the same.
        while offset < n and data[offset] != 0xFF:
            offset += 1
        while offset < n and data[offset] == 0xFF:
            offset += 1
        if offset >= n:
            break
        marker = data[offset]
        offset += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):  # EOI, or SOS (entropy-coded data) before any frame header
            raise ImageHeaderError("the JPEG has no frame header (SOF) before its image data")
        (length,) = _unpack(">H", data, offset, "JPEG")
        if length < 2:
            raise ImageHeaderError(f"the JPEG has a segment of invalid length {length}")
        if marker in _JPEG_SOF:
            _, height, width = _unpack(">BHH", data, offset + 2, "JPEG SOF")
            if height == 0:
                raise ImageHeaderError("the JPEG declares its height later (DNL marker), which is not supported")
            return width, height
        offset += length
    raise ImageHeaderError("the JPEG header is truncated (no frame header found)")


def _webp(data: memoryview) -> tuple[int, int]:
    (chunk,) = _unpack("4s", data, 12, "WebP")
    if chunk == b"VP8 ":  # lossy: 3-byte frame tag, start code 9d 01 2a, 14-bit sizes (2 bits of scale)
        (start_code,) = _unpack("3s", data, 23, "WebP VP8")
        if start_code != b"\x9d\x01\x2a":
            raise ImageHeaderError("the WebP VP8 frame has no start code")
        width, height = _unpack("<HH", data, 26, "WebP VP8")
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":  # lossless: signature 0x2f, then 14 bits width - 1, 14 bits height - 1
        signature, bits = _unpack("<BI", data, 20, "WebP VP8L")
        if signature != 0x2F:
            raise ImageHeaderError("the WebP VP8L stream has no signature")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: the canvas size, 24 bits each, minus one; frames must fit it
        raw = _unpack("6s", data, 24, "WebP VP8X")[0]
        width = int.from_bytes(raw[0:3], "little") + 1
        height = int.from_bytes(raw[3:6], "little") + 1
        return width, height
    raise ImageHeaderError(f"the WebP has an unknown first chunk {bytes(chunk)!r}")


def _bmp(data: memoryview) -> tuple[int, int]:
    (header_size,) = _unpack("<I", data, 14, "BMP")
    if header_size == 12:  # BITMAPCOREHEADER (OS/2 1.x): unsigned 16-bit sizes
        return _unpack("<HH", data, 18, "BMP")
    if header_size < 16:
        raise ImageHeaderError(f"the BMP has an unknown DIB header of {header_size} bytes")
    width, height = _unpack("<ii", data, 18, "BMP")
    return width, abs(height)  # a negative height means rows stored top-down


def _gif(data: memoryview) -> tuple[int, int]:
    # The logical screen: OpenCV's decoder (and browsers) refuse frames that do not fit in it.
    return _unpack("<HH", data, 6, "GIF")


_READERS = {PNG: _png, JPEG: _jpeg, WEBP: _webp, BMP: _bmp, GIF: _gif}
