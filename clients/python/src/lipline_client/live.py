"""A live session on asyncio (grpc.aio), for voice agents: speech in as it is made, frames out in real time.

`LiveSession.create(address, avatar_id, ...)` creates the session (CreateSession, retried while no
live worker has room and the gateway says when: RESOURCE_EXHAUSTED with retry-after-ms) and opens
its Converse stream. Then, from any coroutine of the same event loop:

- `push_audio(pcm, sample_rate)`: PCM s16le (mono, or `channels`) of any length and rate; resampled to
  the session's rate where it differs (lipline_client.audio) and sent in chunks of `chunk_ms`.
- `end_utterance()`: the rest of the audio, then EndOfUtterance (the utterance plays out).
- `clear()`: barge-in, at once: the audio not sent yet is dropped, Clear goes out before anything
  else, and the speech frames still on their way from before the Clear are not yielded (the worker's
  next frame after a Clear is idle: the first idle frame ends the dropping).
- `async for item in session`: `session_pb2.Ready`, `VideoFrame` (every frame, idle ones too: JPEG or
  H.264 bytes, `index` (its time is `frame_time(frame)`), the re-timed audio in `audio`, `speech`,
  `utterance`), `SessionEvent` (PLAYBACK_STARTED / PLAYBACK_FINISHED with `position_seconds` and
  `interrupted`) and `SessionStats`. An event is yielded in frame order: PLAYBACK_STARTED right before
  the frame holding the utterance's first audio, PLAYBACK_FINISHED right after the one holding its
  last (the worker may send it ahead of that frame; when the last frame was skipped, its audio goes
  with the next frame sent, and the event after that one).
- `speech_audio(frame)`: the part of a frame's `audio` that is the speech pushed, for a consumer that
  counts what played (a voice agent's playback position): a speech frame's whole audio; an idle
  frame's only while an utterance plays, and only the skipped speech frames' audio it carries, never
  its own slot's silence (a pause for late audio, or the idle loop).
- `close()`: CloseSession, the stream ended, the channel closed.

A stream the gateway or the network cut (UNAVAILABLE: a gateway restarting or draining, a live worker
that went away) is resumed with the session's resume token and the last frame received
(`converse_start(session, last_frame)`), with back-off (`resume`, by default `RESUME_POLICY`: ~15-30
s of outage). Audio pushed meanwhile waits and is sent on the resumed stream (the worker dropped the
speech it had queued: nobody saw it). Any other status, or an outage longer than that, ends the
iteration by raising the `grpc.aio.AioRpcError` (its `code()` and `details()` say what went wrong).

Frames are acknowledged as the consumer takes them (FrameAck; `ack_window_s` of frames may be out
unacknowledged, 2 s by default, so a voice agent's pipeline that hiccups loses no speech): a consumer
that stalls finds at most that much of the past waiting when it reads again, then the live edge
(H.264 from an IDR), however large gRPC's receive window grew.

Audio is paced, never lost: a TTS makes speech faster than real time, and a worker refuses more
than `max_queued_audio_s` (10 s) queued ahead of playback, so no more than `max_ahead_s` of speech
is sent ahead of the frames that played it; the rest waits here. Frames are read only as fast as
they are consumed (a small queue), so a consumer that falls behind makes the worker drop frames
(counted in SessionStats), never this process's memory.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import grpc

from lipline_client.audio import PcmChunker, StreamResampler, to_mono
from lipline_client.client import DEFAULT_MAX_MESSAGE_BYTES, Connection, converse_start, frame_ack
from lipline_client.retry import RESUME_POLICY, RetryPolicy, retry_delay_s
from lipline_client.v1 import gateway_pb2_grpc, session_pb2

_LOGGER = logging.getLogger(__name__)

CODECS = {"h264": session_pb2.VIDEO_CODEC_H264, "jpeg": session_pb2.VIDEO_CODEC_JPEG}
#: statuses after which a Converse stream is opened again (the session lives on)
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
OUT_QUEUE = 16  # items read ahead of the consumer (< 1 s of frames)
MAX_ACK_WINDOW = 1000  # frames (the gateway's bound)
STARTED = session_pb2.SessionEvent.PLAYBACK_STARTED
FINISHED = session_pb2.SessionEvent.PLAYBACK_FINISHED

Item = session_pb2.Ready | session_pb2.VideoFrame | session_pb2.SessionEvent | session_pb2.SessionStats


class LiveSession:
    """One live session and its Converse stream (see the module's doc). Build it with `create`."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        session: session_pb2.Session,
        metadata: tuple[tuple[str, str], ...],
        *,
        chunk_ms: int = 20,
        max_ahead_s: float = 4.0,
        ack_window_s: float = 2.0,
        resume: RetryPolicy = RESUME_POLICY,
        call_timeout_s: float = 30.0,
    ) -> None:
        self.session = session
        self._channel = channel
        self._stub = gateway_pb2_grpc.GatewayStub(channel)
        self._metadata = metadata
        self._resume = resume
        self._call_timeout_s = call_timeout_s
        self.max_ahead_s = max_ahead_s
        # Frames that may be out unacknowledged (0: no acknowledgements, gRPC's flow control alone).
        self.ack_window = min(MAX_ACK_WINDOW, math.ceil(ack_window_s * (session.video.fps or 25.0)))
        self._ack_due: session_pb2.ConverseRequest | None = None  # the newest FrameAck not sent yet
        self._chunker = PcmChunker(self.sample_rate, chunk_ms)
        self._resamplers: dict[int, StreamResampler] = {}
        self._pending: collections.deque[session_pb2.ConverseRequest] = collections.deque()
        self._wake = asyncio.Event()  # something to send, or room to send it
        self._out: asyncio.Queue[Item | BaseException | None] = asyncio.Queue(OUT_QUEUE)
        self._held: list[session_pb2.SessionEvent] = []  # events waiting for their frame
        self._last_frame = -1  # the last frame received (a resume starts after it)
        self._yielded_frame = -1
        self._playing = False  # the consumer took an utterance's PLAYBACK_STARTED and not yet its FINISHED
        self._dropping_speech = False
        self._sent_s = self._played_s = 0.0  # speech sent / played since the last Clear or resume
        self._utterances_open = 0  # EndOfUtterance sent, PLAYBACK_FINISHED not yet seen
        self._speech_since_end = False
        self._closed = False
        self._ended = False
        self._call: Any = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"lipline session {session.id}")

    # -- creating ---------------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        address: str,
        avatar_id: str,
        *,
        api_key: str | None = None,
        tls: bool | None = None,
        tls_ca_file: str | None = None,
        tls_server_name: str | None = None,
        sample_rate: int = 16000,
        codec: str | int = "jpeg",
        fps: float = 0.0,
        max_height: int = 0,
        jpeg_quality: int = 0,
        crf: int = 0,
        super_resolution: bool = False,
        max_session_seconds: float = 0.0,
        idle_timeout_seconds: float = 0.0,
        chunk_ms: int = 20,
        max_ahead_s: float = 4.0,
        ack_window_s: float = 2.0,
        retry: RetryPolicy | None = None,
        resume: RetryPolicy | None = None,
        timeout: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> LiveSession:
        """A new session on `avatar_id`, its stream open. `codec`: "jpeg" or "h264" (or the enum);
        0 leaves a field to the gateway (fps: the avatar's; max_height: its size). API key and TLS as
        LiplineClient takes them (or the LIPLINE_* variables). `timeout` bounds CreateSession with
        its retries, and each of GetSession and CloseSession. `ack_window_s`: how much video may be
        on its way unacknowledged (see the module's doc; 0 turns acknowledgements off)."""
        codec_value = CODECS[codec] if isinstance(codec, str) else codec
        connection = Connection.resolve(
            max_message_bytes, api_key=api_key, tls=tls, tls_ca_file=tls_ca_file, tls_server_name=tls_server_name
        )
        options = list(connection.options)
        if connection.credentials is not None:
            channel = grpc.aio.secure_channel(address, connection.credentials, options=options)
        else:
            channel = grpc.aio.insecure_channel(address, options=options)
        request = session_pb2.CreateSessionRequest(
            avatar_id=avatar_id,
            audio=session_pb2.AudioFormat(sample_rate=sample_rate),
            video=session_pb2.VideoFormat(
                codec=codec_value,  # type: ignore[arg-type]  # an int of the enum
                fps=fps,
                max_height=max_height,
                jpeg_quality=jpeg_quality,
                crf=crf,
            ),
            super_resolution=super_resolution,
            limits=session_pb2.SessionLimits(
                max_session_seconds=max_session_seconds, idle_timeout_seconds=idle_timeout_seconds
            ),
        )
        stub = gateway_pb2_grpc.GatewayStub(channel)
        try:
            # Not repeated after UNAVAILABLE: a second session would hold a worker's slot until its idle timeout.
            session = await _with_retries(
                lambda t: stub.CreateSession(request, timeout=t, metadata=connection.metadata),
                timeout,
                retry or RetryPolicy(),
                idempotent=False,
            )
        except BaseException:
            await channel.close()
            raise
        return cls(
            channel,
            session,
            connection.metadata,
            chunk_ms=chunk_ms,
            max_ahead_s=max_ahead_s,
            ack_window_s=ack_window_s,
            resume=resume or RESUME_POLICY,
            call_timeout_s=timeout,
        )

    # -- what the session is ----------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def sample_rate(self) -> int:
        return self.session.audio.sample_rate or 16000

    @property
    def fps(self) -> float:
        return self.session.video.fps

    @property
    def codec(self) -> int:
        return self.session.video.codec or session_pb2.VIDEO_CODEC_H264

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the frames."""
        return self.session.width, self.session.height

    def frame_time(self, frame: session_pb2.VideoFrame) -> float:
        """The frame's time in the session, seconds (index / fps)."""
        return frame.index / self.fps

    @property
    def last_frame(self) -> int:
        """The index of the last frame received (-1: none): where a resume starts after."""
        return self._last_frame

    # -- speech in --------------------------------------------------------------------------------

    def push_audio(self, pcm: bytes, sample_rate: int | None = None, channels: int = 1) -> None:
        """Queue PCM s16le at `sample_rate` (the session's when None) for sending; returns at once."""
        self._check_open()
        if channels != 1:
            pcm = to_mono(pcm, channels)
        rate = sample_rate or self.sample_rate
        if rate != self.sample_rate:
            resampler = self._resamplers.get(rate)
            if resampler is None:
                resampler = self._resamplers[rate] = StreamResampler(rate, self.sample_rate)
            pcm = resampler.resample(pcm)
        self._queue_chunks(self._chunker.feed(pcm))

    def end_utterance(self) -> None:
        """The speech pushed so far is one utterance: send its rest, then EndOfUtterance."""
        self._check_open()
        rest = b"".join(r.flush() for r in self._resamplers.values())
        chunks = self._chunker.feed(rest) if rest else []
        tail = self._chunker.flush()
        self._queue_chunks([*chunks, *([tail] if tail else [])])
        if not self._speech_since_end:
            return  # nothing was said: no utterance to end
        self._speech_since_end = False
        self._utterances_open += 1
        self._send(session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance()))

    def clear(self) -> None:
        """Barge-in: drop what was not sent, send Clear first, and stop yielding the old speech frames."""
        self._check_open()
        self._pending.clear()
        self._chunker.reset()
        for resampler in self._resamplers.values():
            resampler.reset()
        self._speech_since_end = False
        self._utterances_open = 0
        self._sent_s = self._played_s = 0.0
        self._dropping_speech = True
        self._send(session_pb2.ConverseRequest(clear=session_pb2.Clear()))

    @property
    def speaking(self) -> bool:
        """Speech was pushed that has not finished playing (or was not ended with end_utterance)."""
        return self._speech_since_end or self._utterances_open > 0

    def _queue_chunks(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self._speech_since_end = True
            self._pending.append(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=chunk)))
        if chunks:
            self._wake.set()

    def _send(self, request: session_pb2.ConverseRequest) -> None:
        if request.WhichOneof("request") == "clear":
            self._pending.appendleft(request)
        else:
            self._pending.append(request)
        self._wake.set()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"live session {self.id} is closed")

    # -- frames and events out --------------------------------------------------------------------

    def __aiter__(self) -> LiveSession:
        return self

    async def __anext__(self) -> Item:
        if self._ended:
            raise StopAsyncIteration
        item = await self._out.get()
        if item is None:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        if isinstance(item, session_pb2.VideoFrame) and self.ack_window:
            self._ack_due = frame_ack(item)  # taken: the gateway may send one more
            self._wake.set()
        elif isinstance(item, session_pb2.SessionEvent):
            self._playing = item.kind == STARTED
        return item

    def speech_audio(self, frame: session_pb2.VideoFrame) -> bytes:
        """The part of `frame.audio` that is the speech pushed (call it as the frame is taken).

        A frame carries its own slot's audio after that of the slots skipped just before it. A speech
        frame's is all speech. An idle frame's own slot is silence (the idle loop, or a pause while an
        utterance's audio comes late): only while an utterance plays (its PLAYBACK_STARTED taken, not
        its FINISHED) is what it carries before that slot the audio of speech frames skipped at the
        utterance's end. So a voice agent that sums this counts what it sent, no more, no less.
        """
        if frame.speech:
            return frame.audio
        if not self._playing:
            return b""
        own = 2 * slot_samples(frame.index, self.sample_rate, self.fps or 25.0)
        return frame.audio[: max(0, len(frame.audio) - own)]

    # -- the stream -------------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        error: BaseException | None = None
        while not self._closed:
            call = self._call = self._stub.Converse(metadata=self._metadata)
            sender: asyncio.Task[None] | None = None
            try:
                self._ack_due = None  # a new stream counts its own frames
                await call.write(converse_start(self.session, self._last_frame, self.ack_window))
                sender = asyncio.get_running_loop().create_task(self._write(call))
                async for response in call:
                    failures = 0
                    await self._take(response)
                break  # the gateway ended the stream: the session ended (closed or failed)
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    break
                failures += 1
                delay = retry_delay_s(exc, failures, self._resume, idempotent=True)
                if exc.code() not in RESUMABLE or delay is None:
                    error = exc
                    break
                _LOGGER.info(
                    "live session %s: the stream was cut (%s: %s); resuming after frame %d in %.2f s",
                    self.id,
                    exc.code().name,
                    exc.details(),
                    self._last_frame,
                    delay,
                )
                # The worker dropped the speech it had queued for the cut stream: start the count again.
                self._sent_s = self._played_s = 0.0
                self._utterances_open = 0
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except grpc.aio.UsageError:
                if self._closed:
                    break
                raise
            finally:
                if sender is not None:
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)
                call.cancel()
        for event in self._held:  # the stream ended: what was held has no frame to wait for
            await self._out.put(event)
        self._held.clear()
        await self._out.put(error)
        if error is None:
            await self._out.put(None)

    async def _write(self, call: Any) -> None:
        """Send the queued requests on `call`, pacing speech to `max_ahead_s` ahead of playback; the
        newest frame acknowledgement goes first (it paces nothing but the frames)."""
        while True:
            while self._ack_due is None and (
                not self._pending
                or (
                    self._pending[0].WhichOneof("request") == "audio"
                    and self._sent_s - self._played_s > self.max_ahead_s
                )
            ):
                self._wake.clear()
                await self._wake.wait()
            if self._ack_due is not None:
                ack, self._ack_due = self._ack_due, None
                try:
                    await call.write(ack)
                except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                    return  # the stream broke: the next one starts its own count
                continue
            request = self._pending[0]
            _LOGGER.debug("live session %s: sending %s", self.id, request.WhichOneof("request"))
            try:
                await call.write(request)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                return  # the stream broke: the request waits for the next one
            if self._pending and self._pending[0] is request:
                self._pending.popleft()
            if request.WhichOneof("request") == "audio":
                self._sent_s += len(request.audio.pcm) / 2 / self.sample_rate

    async def _take(self, response: session_pb2.ConverseResponse) -> None:
        kind = response.WhichOneof("response")
        if kind == "frame":
            frame = response.frame
            self._last_frame = max(self._last_frame, frame.index)
            if frame.speech:
                self._played_s += len(frame.audio) / 2 / self.sample_rate
                self._wake.set()
                if self._dropping_speech:
                    if self.ack_window:
                        self._ack_due = frame_ack(frame)  # taken, to be dropped: the gateway may send on
                    return  # said before the Clear: its picture and sound go with it
            else:
                self._dropping_speech = False
            await self._release(frame.index, before=True)
            await self._out.put(frame)
            self._yielded_frame = frame.index
            await self._release(frame.index, before=False)
        elif kind == "event":
            event = response.event
            if event.kind == FINISHED:
                self._finished()
            self._held.append(event)
            await self._release(self._yielded_frame, before=False)
        else:
            await self._out.put(getattr(response, kind))

    async def _release(self, frame: int, *, before: bool) -> None:
        """Yield the held events due around `frame`: before it, PLAYBACK_STARTED of it or of an earlier
        frame (that one was skipped: its audio is in this one); after it, PLAYBACK_FINISHED whose last
        frame is this one or an earlier one (skipped: its audio is in this one, so the event follows)."""
        if before:
            due = [e for e in self._held if e.kind != FINISHED and e.frame <= frame]
        else:
            due = [e for e in self._held if e.frame - 1 <= frame]
        if not due:
            return
        self._held = [e for e in self._held if e not in due]
        for event in due:
            await self._out.put(event)

    def _finished(self) -> None:
        self._utterances_open = max(0, self._utterances_open - 1)
        if self._utterances_open == 0 and not self._speech_since_end:
            self._sent_s = self._played_s  # all played: skipped slots' audio counted or not, start level

    # -- ending -----------------------------------------------------------------------------------

    async def get(self) -> session_pb2.Session:
        """GetSession: the session as the gateway has it now (state, error)."""
        return await self._stub.GetSession(
            session_pb2.GetSessionRequest(session_id=self.id), timeout=self._call_timeout_s, metadata=self._metadata
        )

    async def close(self) -> session_pb2.Session | None:
        """CloseSession and end the stream (safe to repeat); the closed session, or None when the gateway
        could not be told (the session then ends by its idle timeout)."""
        if self._closed:
            return None
        self._closed = True
        closed: session_pb2.Session | None = None
        try:
            closed = await self._stub.CloseSession(
                session_pb2.CloseSessionRequest(session_id=self.id),
                timeout=self._call_timeout_s,
                metadata=self._metadata,
            )
        except grpc.aio.AioRpcError as exc:
            _LOGGER.warning("live session %s: CloseSession failed (%s: %s)", self.id, exc.code().name, exc.details())
        finally:
            if self._call is not None:
                self._call.cancel()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            while not self._out.empty():
                self._out.get_nowait()
            self._out.put_nowait(None)
            await self._channel.close()
        return closed

    async def __aenter__(self) -> LiveSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _with_retries(
    attempt: Callable[[float], Any], timeout: float, policy: RetryPolicy, *, idempotent: bool
) -> Any:
    """`await attempt(seconds left)` until it succeeds, its status is not retried, or time is up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    failures = 0
    while True:
        try:
            return await attempt(max(deadline - loop.time(), 0.001))
        except grpc.aio.AioRpcError as error:
            failures += 1
            delay = retry_delay_s(error, failures, policy, idempotent)
            if delay is None or loop.time() + delay >= deadline:
                raise
            await asyncio.sleep(delay)


def slot_samples(frame: int, sample_rate: int, fps: float) -> int:
    """Samples of frame `frame`'s slot: the worker cuts the audio at ceil(k * rate / fps) for each
    frame k (fps as the fraction it stands for, 30000/1001 for 29.97), so slots differ by one sample
    where rate / fps is not whole."""
    rate = Fraction(fps).limit_denominator(1001)

    def start(k: int) -> int:
        return -(-k * sample_rate * rate.denominator // rate.numerator)

    return start(frame + 1) - start(frame)
