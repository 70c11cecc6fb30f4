"""A live session's frames as pictures: JPEG or H.264 bytes decoded to RGB (the `agents` extra: PyAV, numpy).

Voice-agent frameworks hand pictures on as raw pixels (Pipecat's OutputImageRawFrame, LiveKit's
rtc.VideoFrame), so both integrations decode here, with one decoder per session: H.264 is a stream
(each access unit refers to the ones before it, back to the last IDR, which a new or resumed
Converse stream starts with), JPEG is one picture per frame. Both go through FFmpeg (PyAV), which
decodes JPEG with libjpeg-turbo's speed and H.264 without the frame threads that would hold a
picture back by one frame per thread: a frame in is a picture out.
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np

from lipline_client.v1 import session_pb2

_DECODERS = {session_pb2.VIDEO_CODEC_JPEG: "mjpeg", session_pb2.VIDEO_CODEC_H264: "h264"}


class FrameDecoder:
    """Decodes one session's frames, in order (`codec`: the Session's `video.codec`)."""

    def __init__(self, codec: int) -> None:
        codec = codec or session_pb2.VIDEO_CODEC_H264  # unspecified means H.264 (session.proto)
        if codec not in _DECODERS:
            raise ValueError(f"no decoder for video codec {codec}")
        self.codec = codec
        self._context: Any = av.CodecContext.create(_DECODERS[codec], "r")
        self._context.thread_count = 1  # no frame threads: each access unit gives its picture at once

    def decode(self, data: bytes) -> Any | None:
        """The av.VideoFrame of one frame's bytes (None while an H.264 stream waits for its first IDR)."""
        try:
            pictures = self._context.decode(av.Packet(data))
        except av.error.InvalidDataError:
            if self.codec == session_pb2.VIDEO_CODEC_H264:
                return None  # a P-frame before any IDR: the next keyframe starts the picture again
            raise
        return pictures[-1] if pictures else None

    def rgb(self, data: bytes) -> np.ndarray | None:
        """The frame as an (height, width, 3) uint8 RGB array, or None (see `decode`)."""
        picture = self.decode(data)
        return None if picture is None else picture.to_ndarray(format="rgb24")
