"""One live session on a worker: its pacing task, its Converse stream, its limits.

A `SessionRunner` owns a `LiveSession` and one asyncio task that paces it: it waits for the next
slot, takes it (`begin_tick`, on the event loop: it reads the faces' futures), composites and encodes
it in the worker's thread pool (`render`), and queues the frame on the attached stream's bounded
`SendQueue` (a client that reads slowly loses its oldest frames, counted, and gets the live edge,
H.264 restarting at a forced IDR; never the worker's memory).

Streams: at most one Converse stream is attached; a newer one takes over (the older one ends
ABORTED). With no stream attached the session makes no frames (nobody would see them): the queued
speech is dropped when the stream goes (it played to nobody), and the clock moves on without
counting skips; the next stream starts with a keyframe at the frame due then. The session ends by
CloseSession, by its `max_session_seconds`, or after `idle_timeout_s` with no stream.

Wire conventions (protos/lipline/v1/session.proto): utterances are numbered from 1 on the wire (0 is
"idle"); a frame's `audio` is its own re-timed input (silence while idle), preceded by the audio of
the slots skipped right before it, so the audio a client concatenates has no hole (a frame dropped
for a slow reader goes with its audio: both are counted lost, and the gap in the indices is the gap
in the audio; each frame's audio ends where its slot does, so the two stay locked).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Callable

import grpc
import numpy as np

from lipline.v1 import session_pb2
from services.live.audio_retime import frame_sample_range
from services.live.clock import NS_PER_S, FrameKind
from services.live.send_queue import SendQueue
from services.live.session import Event, EventKind, FrameWork, LiveSession, Tick
from services.serving.errors import LiplineError
from services.serving.metrics import Metrics

_LOGGER = logging.getLogger(__name__)
STATS_EVERY_S = 1.0


class StreamEnded(LiplineError):
    """Why a Converse stream ends (the status its client gets)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Ending:
    """How a session ended: its row's state and error, and the status its stream gets."""

    state: int  # session_pb2.SessionState
    error: str
    code: grpc.StatusCode


class SessionRunner:
    """A live session held by this worker (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        tenant: str,
        proto: session_pb2.Session,
        live: LiveSession,
        pool: concurrent.futures.Executor,
        metrics: Metrics,
        send_queue_frames: int,
        on_end: Callable[[SessionRunner], None],
        send_lag_s: float | None = None,
    ) -> None:
        """`send_queue_frames`, `send_lag_s`: the bounds of each stream's SendQueue (frames; how far
        behind the newest frame a queued one may fall, None: no such bound)."""
        self.session_id = session_id
        self.tenant = tenant
        self.proto = proto
        self.live = live
        self.pool = pool
        self.metrics = metrics
        self.send_queue_frames = send_queue_frames
        self.send_lag_frames = None if send_lag_s is None else math.ceil(send_lag_s * live.clock.fps)
        self.on_end = on_end
        self.max_session_s = proto.limits.max_session_seconds
        self.idle_timeout_s = proto.limits.idle_timeout_seconds
        self.started = time.monotonic()
        self.detached_since = self.started
        self.stream: SendQueue | None = None
        self.half_closed = False
        self.ending: Ending | None = None
        self.dropped = 0  # frames dropped for slow readers, every stream of the session
        self._attached = asyncio.Event()
        self._ended = asyncio.Event()
        self._clear_at: float | None = None
        self._latencies: list[float] = []
        self._next_stats = 0.0
        self._skipped_seen = 0
        self._carried_audio = b""  # audio of slots skipped: it goes with the next frame sent
        self._task: asyncio.Task | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"live-session-{self.session_id}")

    @property
    def ended(self) -> bool:
        return self.ending is not None

    def end(self, state: int, error: str, code: grpc.StatusCode) -> None:
        """Ends the session: its stream gets `code` (OK: it ends cleanly), its task stops, `on_end` runs once."""
        if self.ending is not None:
            return
        self.ending = Ending(state, error, code)
        if self.stream is not None:
            # What is queued is not sent: the session is over (its frames and their memory go now,
            # even when the reader has stopped reading and its stream stays open).
            self.stream.abort(None if code == grpc.StatusCode.OK else StreamEnded(code, error))
        self._ended.set()
        self._attached.set()
        self.on_end(self)

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    # -- the stream ---------------------------------------------------------------------------------

    def attach(self, last_frame: int = -1) -> SendQueue:
        """A new Converse stream for this session; an older one ends ABORTED. `last_frame`: the last
        frame the client received (a resume): the frames sent go on after it."""
        if self.stream is not None:
            self.stream.abort(
                StreamEnded(grpc.StatusCode.ABORTED, f"a newer Converse stream took session {self.session_id}")
            )
        self.stream = SendQueue(self.send_queue_frames, self.send_lag_frames)
        self.half_closed = False
        self._carried_audio = b""
        self.live.clock.skip_to_now()
        self.live.clock.continue_from(last_frame + 1)
        self.live.force_keyframe()  # a new stream starts decoding at its first frame
        self._attached.set()
        return self.stream

    def detach(self, stream: SendQueue) -> None:
        """The stream went away (ended, cancelled): its queued speech is dropped; the idle timeout starts."""
        if self.stream is not stream:
            return
        self.stream = None
        self._attached.clear()
        self.detached_since = time.monotonic()
        if not self.ended:
            self.live.clear()
            self.live.discard_events()

    def ready_message(self) -> session_pb2.ConverseResponse:
        return session_pb2.ConverseResponse(
            ready=session_pb2.Ready(session=self.proto, next_frame=self.live.clock.next_frame)
        )

    # -- input (the reader of the attached stream) --------------------------------------------------

    def push_audio(self, pcm: bytes) -> None:
        self.live.push_audio(pcm)

    def end_utterance(self) -> None:
        self.live.end_utterance()

    def clear(self) -> None:
        self._clear_at = time.monotonic()
        self.live.clear()

    # -- the pacing task ----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.ended:
                if self.stream is None:
                    await self._wait_for_stream()
                    continue
                delay = self.live.clock.seconds_until_next()
                if delay > 0:
                    await asyncio.sleep(delay)
                stream = self.stream
                if self.ended or stream is None:
                    continue
                work = self.live.begin_tick()
                if work is None:
                    continue
                if work.pending is not None:  # its face is not back yet: wait for it within the grace
                    await self._wait_for_face(work)
                    self.live.settle(work)
                self.make_room(stream, work.frame)
                tick = await loop.run_in_executor(self.pool, self.live.render, work)
                if (
                    self.stream is stream
                ):  # a frame made for a stream that went is not the next one's (its first is a keyframe)
                    self.deliver(tick, stream)
                self._check_limits()
        except Exception as exc:
            _LOGGER.exception("live session failed", extra={"session_id": self.session_id})
            self.end(
                session_pb2.SESSION_STATE_FAILED,
                f"the live worker failed this session: {exc!r}",
                grpc.StatusCode.INTERNAL,
            )
        finally:
            self.live.close()

    async def _wait_for_face(self, work: FrameWork) -> None:
        """Waits for a speech frame's face up to the session's grace, and never past the first half of
        its slot (the rest is the compositor's and the encoder's): a face back a little late costs that
        frame a few ms of latency instead of a skipped frame."""
        clock = self.live.clock
        slot_left_s = (clock.due_ns(work.frame + 1) - clock.now_ns()) / NS_PER_S
        timeout = min(self.live.grace_s, slot_left_s / 2)
        if timeout > 0 and isinstance(work.pending, asyncio.Future):
            await asyncio.wait([work.pending], timeout=timeout)

    async def _wait_for_stream(self) -> None:
        remaining = self.idle_timeout_s - (time.monotonic() - self.detached_since)
        if remaining <= 0:
            message = (
                f"session {self.session_id} had no Converse stream for {self.idle_timeout_s:g} s (its idle timeout)"
            )
            self.end(session_pb2.SESSION_STATE_CLOSED, message, grpc.StatusCode.DEADLINE_EXCEEDED)
            return
        remaining = min(remaining, self.max_session_s - (time.monotonic() - self.started))
        try:
            await asyncio.wait_for(self._attached.wait(), timeout=max(remaining, 0.0))
        except TimeoutError:
            self._check_limits()

    def _check_limits(self) -> None:
        if time.monotonic() - self.started >= self.max_session_s:
            message = f"session {self.session_id} reached its limit of {self.max_session_s:g} s (max_session_seconds); create a new session"
            self.end(session_pb2.SESSION_STATE_CLOSED, message, grpc.StatusCode.DEADLINE_EXCEEDED)

    def deliver(self, tick: Tick, stream: SendQueue) -> None:
        """Puts a tick on the stream: its events, its frame (with its audio, and that of the slots
        skipped before it), the stats once a second; a frame the queue refuses is dropped (counted)."""
        m = self.metrics
        skipped = self.live.counts.skipped
        if skipped > self._skipped_seen:
            m.live_frames.labels("skipped").inc(skipped - self._skipped_seen)
            self._skipped_seen = skipped
        for event in tick.events:
            stream.put_control(session_pb2.ConverseResponse(event=_event_proto(event)))
        audio = self._carried_audio + self._frame_audio(tick)
        self._carried_audio = b""
        if tick.frame is None:  # skipped: its audio goes with the next frame sent
            self._carried_audio = audio
        else:
            frame = session_pb2.VideoFrame(
                index=tick.frame.pts,
                keyframe=tick.frame.keyframe,
                data=tick.frame.data,
                audio=audio,
                speech=tick.kind is FrameKind.SPEECH,
                utterance=0 if tick.utterance is None else tick.utterance + 1,
            )
            arrived_ns = None
            if tick.latency_s is not None:
                arrived_ns = time.monotonic_ns() - round(tick.latency_s * NS_PER_S)
            response = session_pb2.ConverseResponse(frame=frame)
            self._count_dropped(stream.put_frame(response, frame.index, frame.keyframe, arrived_ns), stream)
            if tick.kind is FrameKind.IDLE and self._clear_at is not None:
                m.live_clear_seconds.observe(time.monotonic() - self._clear_at)
                self._clear_at = None
        now = time.monotonic()
        if now >= self._next_stats:
            self._next_stats = now + STATS_EVERY_S
            stream.put_control(session_pb2.ConverseResponse(stats=self._stats()))
        if self.half_closed and not self.live.playing:
            stream.close()  # the client sent everything and it has played

    def make_room(self, stream: SendQueue, frame: int) -> None:
        """Before `frame` is made: a reader behind by a bound loses its oldest frames now, and when
        that breaks the reference chain, this frame is made a keyframe (rather than lost too)."""
        self._count_dropped(stream.make_room(frame), stream)

    def _count_dropped(self, dropped: int, stream: SendQueue) -> None:
        """Frames the stream's queue dropped for a slow reader (with their audio): counted in the
        stats and `lipline_live_frames_total{kind="dropped"}`; when no decodable frame is left queued,
        the next frame made is a keyframe (an H.264 IDR), so the reader decodes again from it."""
        if dropped:
            self.dropped += dropped
            self.metrics.live_frames.labels("dropped").inc(dropped)
        if stream.need_keyframe:
            self.live.force_keyframe()

    def _frame_audio(self, tick: Tick) -> bytes:
        """The frame's re-timed audio, after that of the slots skipped before it (silence where idle).
        A slot is never short: an utterance's last frame, whose input ends inside the slot, is
        filled with silence to the slot's end, so the audio concatenated stays as long as the frames."""
        by_frame = {a.frame: a.samples for a in tick.audio}
        rate, fps = self.live.sample_rate, self.live.clock.fps
        parts = []
        for frame in [*tick.skipped, tick.slot]:
            start, stop = frame_sample_range(frame, rate, fps)
            samples = by_frame.get(frame)
            if samples is None:
                samples = np.zeros(stop - start, np.int16)
            parts.append(samples.astype("<i2", copy=False).tobytes())
            if len(samples) < stop - start:
                parts.append(bytes(2 * (stop - start - len(samples))))
        return b"".join(parts)

    def observe_sent(self, response: session_pb2.ConverseResponse, arrived_ns: int | None) -> None:
        """The writer sent a frame: counted by kind (a frame still queued may yet be dropped, so it
        counts when it goes), and its latency (audio arrived -> frame sent) when it is a speech frame."""
        self.metrics.live_frames.labels(FrameKind.SPEECH.value if response.frame.speech else FrameKind.IDLE.value).inc()
        if arrived_ns is None:
            return
        latency = (time.monotonic_ns() - arrived_ns) / NS_PER_S
        self.metrics.live_frame_latency_seconds.observe(latency)
        if len(self._latencies) < 1000:
            self._latencies.append(latency)

    def _stats(self) -> session_pb2.SessionStats:
        latencies, self._latencies = self._latencies, []
        p50, p95 = (
            (float(np.percentile(latencies, 50)), float(np.percentile(latencies, 95))) if latencies else (0.0, 0.0)
        )
        counts = self.live.counts
        return session_pb2.SessionStats(
            latency_p50_seconds=p50,
            latency_p95_seconds=p95,
            queued_audio_seconds=self.live.queued_seconds,
            frames_speech=counts.speech,
            frames_idle=counts.idle,
            frames_skipped=counts.skipped,
            frames_dropped=self.dropped,
        )


def _event_proto(event: Event) -> session_pb2.SessionEvent:
    kind = (
        session_pb2.SessionEvent.PLAYBACK_STARTED
        if event.kind is EventKind.PLAYBACK_STARTED
        else session_pb2.SessionEvent.PLAYBACK_FINISHED
    )
    return session_pb2.SessionEvent(
        kind=kind,
        utterance=event.utterance + 1,
        frame=event.frame,
        position_seconds=event.position_ms / 1000.0,
        interrupted=event.interrupted,
    )
