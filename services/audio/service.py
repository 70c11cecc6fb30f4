"""The audio stage's gRPC service: audio file bytes in, one Wav2Lip mel window per video frame out
(and, when asked, the clip's whisper log-mel windows for the musetalk tier)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import grpc

from lipline.v1 import audio_pb2, audio_pb2_grpc, common_pb2
from services.audio.extract import SAMPLE_RATE, ClipExtractor, ExtractFn, decode_and_extract
from services.audio.settings import AudioSettings
from services.media.musetalk_wire import clip_windows
from services.media.wire import MEL_BANDS, MEL_STEP, mel_to_bytes
from services.serving.errors import InvalidMedia, InvalidRequest, TooLarge
from services.serving.metrics import Metrics
from services.serving.server import Service
from services.serving.streams import message_budget

_LOGGER = logging.getLogger(__name__)
# One MelWindow on the wire: its 2,560 bytes of float16 plus the frame index and the field tags.
_WINDOW_WIRE_BYTES = MEL_BANDS * MEL_STEP * 2 + 16


def checked_options(options: audio_pb2.ExtractOptions, max_audio_seconds: float) -> tuple[float, float]:
    """(fps, the clip's length limit) of a stream's options; INVALID_ARGUMENT naming the field and its
    range for a value no caller means (NaN, negative, absurd), rather than a silent default."""
    fps = options.fps or 25.0
    if not 1.0 <= fps <= 120.0:
        raise InvalidRequest(f"fps {fps} is outside 1..120 (0 = 25)")
    if not options.max_seconds >= 0:  # negative or NaN: a caller's bug, not "no limit"
        raise InvalidRequest(
            f"max_seconds {options.max_seconds} is not >= 0 (0 = the stage's max_audio_seconds, {max_audio_seconds:g} s)"
        )
    limit = (
        min(max_audio_seconds, options.max_seconds) if options.max_seconds > 0 else max_audio_seconds
    )  # the caller's own limit, if lower
    return fps, limit


class AudioServicer(audio_pb2_grpc.AudioServiceServicer):
    def __init__(self, settings: AudioSettings, clips: ClipExtractor, service: AudioService) -> None:
        self._settings = settings
        self._clips = clips
        self._service = service

    async def Extract(
        self, request_iterator: AsyncIterator[audio_pb2.ExtractRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[audio_pb2.ExtractResponse]:
        options: audio_pb2.ExtractOptions | None = None
        chunks: list[bytes] = []
        size = 0
        fps, limit = 25.0, self._settings.max_audio_seconds
        async for request in request_iterator:
            if options is None:
                options = request.options
                fps, limit = checked_options(
                    options, self._settings.max_audio_seconds
                )  # before the upload costs anything
            size += len(request.data)
            if size > self._settings.max_audio_bytes:
                raise TooLarge(f"audio is over {self._settings.max_audio_bytes} bytes; send a shorter clip")
            chunks.append(request.data)
        asked = (options.windows_per_message if options is not None else 0) or 64
        # Whatever the client asks for, a response stays under half the message limit (bytes, not count).
        per_message = max(1, min(asked, message_budget(self._settings.max_message_bytes) // _WINDOW_WIRE_BYTES))
        data = b"".join(chunks)
        # Decoding and the STFT are CPU work: off the event loop (so other streams flow), in arrival order.
        whisper = options is not None and options.whisper
        windows, samples, log_mel = await self._clips.extract(data, fps, limit, whisper)
        m = self._service.metrics
        m.items.labels(m.stage).inc(len(windows))
        duration = samples / SAMPLE_RATE
        _LOGGER.info("extracted mel windows", extra={"frames": len(windows), "seconds": round(duration, 3), "fps": fps})
        first = True
        for start in range(0, len(windows), per_message):
            response = audio_pb2.ExtractResponse(
                windows=[
                    common_pb2.MelWindow(frame_index=i, data=mel_to_bytes(windows[i]))
                    for i in range(start, min(start + per_message, len(windows)))
                ]
            )
            if first:
                response.total_frames = len(windows)
                response.duration_seconds = duration
                first = False
            yield response
        if first:  # cannot happen (frame_count >= 1), but never answer with nothing
            raise InvalidMedia("audio produced no frames")
        if log_mel is not None:  # one 30 s window (at most 480 KB) per response, after the mel windows
            for window in clip_windows(log_mel, samples):
                yield audio_pb2.ExtractResponse(whisper_windows=[window])


class AudioService(Service[AudioSettings]):
    """The audio stage.

    Args:
        work: what the extraction workers run per upload; tests pass one that crashes its process.
    """

    stage = "audio"

    def __init__(self, settings: AudioSettings, metrics: Metrics, *, work: ExtractFn = decode_and_extract) -> None:
        super().__init__(settings, metrics)
        self._work = work

    @property
    def service_names(self) -> Sequence[str]:
        return [audio_pb2.DESCRIPTOR.services_by_name["AudioService"].full_name]

    def register(self, server: grpc.aio.Server) -> None:
        self.clips = ClipExtractor(self.settings.extract_processes, self._work)
        audio_pb2_grpc.add_AudioServiceServicer_to_server(AudioServicer(self.settings, self.clips, self), server)

    async def load(self) -> None:
        # Warm-up: starts the workers, builds the mel filter banks and pulls scipy's lazy imports in before traffic.
        await self.clips.warm()
        self.metrics.set_backend("wav2lip-mel", "cpu", "fp32")

    async def close(self) -> None:
        await asyncio.to_thread(self.clips.close)
