"""`LiplineVideoService`: a Pipecat service after TTS that turns the bot's speech into a lip-synced avatar.

Placed between the TTS service and `transport.output()`, it holds one lipline live session
(lipline_client.LiveSession) for the pipeline's life:

- `StartFrame`: the session is created (at the TTS's rate where a session takes it: 16, 24 or 48 kHz;
  else the next one up, the audio resampled), its stream opened.
- `TTSAudioRawFrame`: the audio goes to the session (in 20-40 ms chunks) and is swallowed here: the
  re-timed copy comes back with the frames that show it, so picture and sound leave together.
- `TTSStoppedFrame`: EndOfUtterance. The frame itself is held and sent on right after the utterance's
  last frame and audio (PLAYBACK_FINISHED), so the output transport's "bot stopped speaking" comes
  when the avatar stops, not ~250 ms of look-ahead before.
- `InterruptionFrame` (a system frame: handled at once, ahead of queued frames): Clear; the speech not
  sent yet, the held TTSStoppedFrames and the speech frames still on their way are dropped (the
  frame processor's own queue is flushed by Pipecat), then the frame goes on.
- Out, for every frame the session sends (idle ones too, so the picture never freezes): an
  `OutputImageRawFrame` (RGB, its size; `sync_with_audio`, so the transport shows it as the audio
  before it has played; `metadata["lipline_frame"]` is its index in the session, its time index / fps,
  and `metadata["lipline_speech"]` whether the mouth follows speech), then the speech in the frame's
  re-timed audio as a `TTSAudioRawFrame` (`LiveSession.speech_audio`: an idle frame's silence is not
  sent; the audio of speech frames skipped is, with the frame that carries it).
- TTFB: from the first audio of an utterance pushed in to its first speaking frame out.
- `EndFrame`: the utterance under way plays out (up to `end_timeout_s`), then the session is closed;
  `CancelFrame`: closed at once.
- A gRPC error (CreateSession refused, a stream ended for good) is pushed upstream as an `ErrorFrame`
  saying the status and the gateway's message; a stream that was cut is resumed by the session with
  its token, unseen by the pipeline but for a pause in the frames.
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputImageRawFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.ai_service import AIService
from pipecat.services.settings import ServiceSettings
from pipecat.utils.errors import ErrorCategory

from lipline_client import LiveSession
from lipline_client.audio import session_rate
from lipline_client.frames import FrameDecoder
from lipline_client.v1 import session_pb2

#: how a gateway status reads as Pipecat's error category (what a handler decides on)
CATEGORIES = {
    grpc.StatusCode.UNAUTHENTICATED: ErrorCategory.AUTHENTICATION,
    grpc.StatusCode.PERMISSION_DENIED: ErrorCategory.AUTHORIZATION,
    grpc.StatusCode.INVALID_ARGUMENT: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.NOT_FOUND: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: ErrorCategory.INVALID_REQUEST,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCategory.RATE_LIMIT,
    grpc.StatusCode.UNAVAILABLE: ErrorCategory.CONNECTIVITY,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCategory.CONNECTIVITY,
}
FINISHED = session_pb2.SessionEvent.PLAYBACK_FINISHED


class LiplineVideoService(AIService):
    """A lipline live session as a Pipecat video service (see the module's doc).

    `codec`: "jpeg" (cheap to decode; the default) or "h264" (a tenth of the bytes, for a gateway far
    away); `fps` and `max_height` 0: the avatar's. `api_key` and TLS as lipline_client takes them
    (unset: the LIPLINE_* variables). `sample_rate`: the session's, by default from the TTS's output
    rate (the pipeline's `audio_out_sample_rate`).
    """

    def __init__(
        self,
        *,
        avatar_id: str,
        address: str,
        api_key: str | None = None,
        codec: str = "jpeg",
        fps: float = 0.0,
        max_height: int = 0,
        jpeg_quality: int = 0,
        sample_rate: int | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
        chunk_ms: int = 20,
        end_timeout_s: float = 15.0,
        **kwargs: Any,
    ) -> None:
        settings = ServiceSettings(model=None)
        super().__init__(settings=settings, **kwargs)
        if codec not in ("jpeg", "h264"):
            raise ValueError(f'codec is "jpeg" or "h264", got {codec!r}')
        self._avatar_id = avatar_id
        self._address = address
        self._session_args: dict[str, Any] = {
            "api_key": api_key,
            "codec": codec,
            "fps": fps,
            "max_height": max_height,
            "jpeg_quality": jpeg_quality,
            "tls": tls,
            "tls_ca_file": tls_ca_file,
            "tls_server_name": tls_server_name,
            "chunk_ms": chunk_ms,
        }
        self._sample_rate = sample_rate
        self._end_timeout_s = end_timeout_s
        self._session: LiveSession | None = None
        self._decoder: FrameDecoder | None = None
        self._receive_task: asyncio.Task[None] | None = None
        self._decode_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lipline-decode")
        self._held_stops: collections.deque[TTSStoppedFrame] = collections.deque()
        self._context_id: str | None = None
        self._awaiting_speech = False  # TTFB running: audio sent, no speaking frame out yet
        self._played = asyncio.Event()  # set whenever no utterance is waiting to play

    @property
    def session(self) -> LiveSession | None:
        """The live session (None before StartFrame, after the end or a failure)."""
        return self._session

    def can_generate_metrics(self) -> bool:
        return True

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        rate = session_rate(self._sample_rate or self.processor_setup.audio_out_sample_rate)
        try:
            self._session = await LiveSession.create(
                self._address, self._avatar_id, sample_rate=rate, **self._session_args
            )
        except grpc.aio.AioRpcError as exc:
            await self._push_rpc_error("CreateSession", exc)
            return
        self._decoder = FrameDecoder(self._session.codec)
        logger.info(
            f"{self}: lipline session {self._session.id} ({self._session.size[0]}x{self._session.size[1]}, "
            f"{self._session.fps:g} fps, {rate} Hz)"
        )
        self._receive_task = self.create_task(self._receive(self._session))

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        session = self._session
        if session is not None and session.speaking:
            session.end_utterance()  # an utterance the TTS left open plays out too
            try:
                await asyncio.wait_for(self._wait_played(session), self._end_timeout_s)
            except TimeoutError:
                logger.warning(f"{self}: the last utterance did not finish within {self._end_timeout_s:g} s")
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def cleanup(self) -> None:
        await super().cleanup()
        await self._close()
        self._decode_thread.shutdown(wait=False)

    async def _close(self) -> None:
        session, self._session = self._session, None
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        if session is not None:
            closed = await session.close()
            if closed is not None:
                logger.info(f"{self}: lipline session {closed.id} closed")

    async def _wait_played(self, session: LiveSession) -> None:
        while session.speaking:
            self._played.clear()
            await self._played.wait()

    # -- frames in --------------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction != FrameDirection.DOWNSTREAM:
            await self.push_frame(frame, direction)
        elif isinstance(frame, TTSAudioRawFrame):
            await self._take_audio(frame)  # swallowed: the re-timed copy goes out with the frames
        elif isinstance(frame, TTSStoppedFrame):
            if self._session is not None and self._session.speaking:
                self._session.end_utterance()
                self._held_stops.append(frame)  # sent on after the utterance's last frame
            else:
                await self.push_frame(frame, direction)
        elif isinstance(frame, InterruptionFrame):
            if self._session is not None:
                self._session.clear()
            self._held_stops.clear()
            self._awaiting_speech = False
            self._played.set()
            await self.push_frame(frame, direction)
        else:
            await self.push_frame(frame, direction)

    async def _take_audio(self, frame: TTSAudioRawFrame) -> None:
        if self._session is None:
            return
        if not self._session.speaking:
            self._awaiting_speech = True
            await self.start_ttfb_metrics()
        self._context_id = frame.context_id
        self._session.push_audio(frame.audio, frame.sample_rate, frame.num_channels)

    # -- frames out -------------------------------------------------------------------------------

    async def _receive(self, session: LiveSession) -> None:
        try:
            async for item in session:
                if isinstance(item, session_pb2.VideoFrame):
                    await self._push_video_frame(session, item)
                elif isinstance(item, session_pb2.SessionEvent) and item.kind == FINISHED:
                    if not item.interrupted and self._held_stops:
                        await self.push_frame(self._held_stops.popleft())
                    if not session.speaking:
                        self._played.set()
        except grpc.aio.AioRpcError as exc:
            await self._push_rpc_error("Converse", exc)
            self._session = None
            self._played.set()
            await session.close()

    async def _push_video_frame(self, session: LiveSession, frame: session_pb2.VideoFrame) -> None:
        assert self._decoder is not None
        decoder = self._decoder
        loop = asyncio.get_running_loop()
        rgb = await loop.run_in_executor(self._decode_thread, decoder.rgb, frame.data)
        if rgb is None:
            return  # an H.264 stream waiting for its keyframe
        image = OutputImageRawFrame(image=rgb.tobytes(), size=(rgb.shape[1], rgb.shape[0]), format="RGB")
        image.sync_with_audio = True
        image.metadata.update(lipline_frame=frame.index, lipline_speech=frame.speech)
        if frame.speech and self._awaiting_speech:
            self._awaiting_speech = False
            await self.stop_ttfb_metrics()
        await self.push_frame(image)
        audio = session.speech_audio(frame)
        if audio:
            await self.push_frame(
                TTSAudioRawFrame(
                    audio=audio, sample_rate=session.sample_rate, num_channels=1, context_id=self._context_id
                )
            )

    async def _push_rpc_error(self, call: str, exc: grpc.aio.AioRpcError) -> None:
        code = exc.code()
        await self.push_error(
            error_msg=f"lipline {call} failed: {code.name}: {exc.details()}",
            exception=exc,
            category=CATEGORIES.get(code, ErrorCategory.SERVER),
        )
