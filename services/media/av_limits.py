"""A ceiling on FFmpeg's single allocations, for every PyAV user in this process.

FFmpeg's demuxers trust some size fields of the files they read and allocate them before reading:
an 8 KB WAV whose ``LIST`` chunk claims 1.6 GB made ``avformat_open_input`` zero-fill 845 MB (found by
tests/unit/media/test_fuzz_decoders.py; the field is 32 bits, so up to 4 GiB). Such allocations are
transient, but a gateway that receives a few at once runs out of memory. ``av_max_alloc`` (a public
libavutil function since FFmpeg 0.x) caps any single ``av_malloc``, which every FFmpeg library uses
for its buffers; above it, the allocation fails and the caller reports ENOMEM, which PyAV raises as
an error our decoders turn into InvalidMedia. FFmpeg's default ceiling is INT_MAX (2 GiB).

`MAX_FFMPEG_ALLOC` (128 MiB) is far above any single buffer this service needs: the largest are
frame planes and BGR conversions (an 8K BGR frame is 100 MB; avatars are limited to 1080p by default,
stage images to 2048x2048, 12.6 MB); packets are bounded by the upload. External codec libraries
(x264, dav1d, libvpx) allocate with their own allocators and are not affected.

PyAV does not wrap ``av_max_alloc``; the symbol is looked up through PyAV's own extension module, so
``dlsym`` resolves it in the libavutil that PyAV is linked against (its bundled copy in a wheel, the
system's in a source build), never in OpenCV's separate copy.
"""

from __future__ import annotations

import ctypes
import logging

import av._core

_LOGGER = logging.getLogger(__name__)

MAX_FFMPEG_ALLOC = 128 * 1024 * 1024


def cap_ffmpeg_allocations(max_bytes: int = MAX_FFMPEG_ALLOC) -> bool:
    """Sets FFmpeg's largest single allocation (process-wide); False where it cannot be set."""
    try:
        av_max_alloc = ctypes.CDLL(av._core.__file__).av_max_alloc
    except (OSError, AttributeError) as exc:  # a build without the symbol exported: keep going, say so
        _LOGGER.warning("could not cap FFmpeg allocations: %s", exc)
        return False
    av_max_alloc.argtypes = [ctypes.c_size_t]
    av_max_alloc.restype = None
    av_max_alloc(max_bytes)
    return True


CAPPED = cap_ffmpeg_allocations()
