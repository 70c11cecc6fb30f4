"""Decompression bombs for tests: small files that claim (and, for PNG, really hold) huge pictures."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_claiming(width: int, height: int) -> bytes:
    """A complete, valid PNG of width x height black RGB pixels, a few MiB whatever the size.

    The pixel data really is there (every row, with a correct Adler-32), so a decoder that trusts the
    header decodes all of it: 2.7 GB and ~20 s for 30000x30000, from a 3.1 MiB file. Built in
    milliseconds: with a full flush after each row, every row deflates to the same bytes, so one row is
    compressed and repeated; the Adler-32 of N zero bytes is ((N mod 65521) << 16) | 1.
    """
    row = b"\0" * (width * 3 + 1)  # filter byte 0, then zero pixels
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate; the zlib wrapper is added below
    first = deflate.compress(row) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(row) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.flush()
    adler = ((len(row) * height % 65521) << 16) | 1
    idat = b"\x78\xda" + first + block * (height - 1) + end + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real 64x64 baseline JPEG whose SOF0 is patched to say width x height (JPEG has no CRC)."""
    data = bytearray(cv2.imencode(".jpg", np.full((64, 64, 3), 128, np.uint8))[1].tobytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)
