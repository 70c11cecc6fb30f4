"""The live worker: LiveService (OpenSession, Converse, CloseSession) over a worker's live sessions.

One process holds up to `max_sessions` sessions (admission: RESOURCE_EXHAUSTED with `retry-after-ms`
beyond it; the sessions running are never degraded to take one more). Per session a `SessionRunner`
(services/live/runner.py) paces a `LiveSession`; every session's speech frames go to the lipsync
stage (and superres) over the worker's one `FaceLink`, per tick one message for all of them (a
`musetalk` avatar's sessions to the lipsync-musetalk stage over the link's stream to it, with their
whisper features and speech gate: docs/architecture.md section 12.7). Avatars
come from the blob store through the worker's AvatarCache (decoded and converted to I420 once per
worker, memory-mapped, shared by every session of the avatar). Placement (services/live/placement.py):
the worker's row and its sessions' leases in the job store, renewed every `heartbeat_s`.

Input rules (decided here): a bad audio chunk (odd byte count, over `max_chunk_ms`), audio beyond
`max_queued_audio_s`, or a second ConverseStart ends the Converse stream with INVALID_ARGUMENT or
RESOURCE_EXHAUSTED and a message saying what to send; the session survives (a gRPC stream cannot
refuse one message and go on), so the client opens a new Converse stream on it. Chunks shorter than
10 ms are taken: the last chunk of an utterance often is.

SIGTERM (`begin_drain`): OpenSession answers UNAVAILABLE "draining", every Converse stream ends
UNAVAILABLE telling the client to resume with its token (the gateway places the resume on another
worker), the leases are released, and the process exits within `grace_s`.

Torch-free: `python -c "import services.live.service, sys; sys.exit('torch' in sys.modules)"` exits 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from lipline.v1 import lipsync_pb2_grpc, live_pb2, live_pb2_grpc, session_pb2, superres_pb2_grpc
from services.jobs.avatar_cache import AvatarCache, LocalAvatar
from services.jobs.store import close_stores, open_stores
from services.jobs.store.sessions import CLOCK_SLACK_S, SessionState
from services.live.clock import FrameClock, FrameKind, started_at
from services.live.encoders import DEFAULT_CRF, H264Encoder, JpegEncoder
from services.live.face_link import (
    FaceLink,
    FaceLinkSettings,
    ReferenceFace,
    ReferenceLatent,
    avatar_reference_faces,
    avatar_reference_latents,
)
from services.live.frame_size import i420_scaler, output_size
from services.live.idle import IdleLoop
from services.live.mel_stream import SUPPORTED_RATES, MelStream, check_sample_rate
from services.live.placement import Placement
from services.live.runner import SessionRunner, StreamEnded
from services.live.send_queue import StreamClosed
from services.live.session import LiveSession, MadeFace, SpeechFrame
from services.live.settings import LiveSettings
from services.live.whisper_stream import WhisperStream
from services.media.speech import StreamingEnvelope
from services.serving.discovery import DiscoveredStageClients
from services.serving.errors import InvalidRequest, NoCapacity, NotFound
from services.serving.server import Service
from services.serving.stages import MUSETALK_TIER
from services.serving.tenants import IMPLICIT_TENANT

_LOGGER = logging.getLogger(__name__)
SERVICE_NAME = "lipline.v1.LiveService"
TENANT_HEADER = "x-lipline-tenant"
RETRY_AFTER_MS = 2000  # the hint when this worker is full: sessions end at human pace
DEFAULT_JPEG_QUALITY = 85  # session.proto: "85 when unset"
DRAIN_MESSAGE = (
    "this live worker is shutting down: resume the session with its resume token (it continues on another worker)"
)


def _tenant_of(context: grpc.aio.ServicerContext) -> str:
    """The tenant the gateway passes (it checked the caller's key and the resume token)."""
    for key, value in context.invocation_metadata() or ():
        if key == TENANT_HEADER:
            return str(value)
    return IMPLICIT_TENANT


class LiveService(Service[LiveSettings], live_pb2_grpc.LiveServiceServicer):
    stage = "live"

    @property
    def service_names(self) -> Sequence[str]:
        return [SERVICE_NAME]

    def register(self, server: grpc.aio.Server) -> None:
        live_pb2_grpc.add_LiveServiceServicer_to_server(self, server)
        self.sessions: dict[str, SessionRunner] = {}
        self.opening = 0  # OpenSession calls past admission and not yet done
        self.draining = False
        self._loops: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._row_updates: dict[
            str, asyncio.Task
        ] = {}  # a session's end being written to the store (CloseSession waits for it)
        self._link_seen: dict[str, int] = {}
        self._avatar_users: dict[str, int] = {}  # avatar id -> sessions open on it (the avatar is closed at 0)

    async def load(self) -> None:
        s = self.settings
        # Every frame kind exported from the start (0): a rate of skipped frames over all frames is 0,
        # not nothing, before the first skip (the dashboard's share and LiplineLiveFramesLost read it).
        for kind in (*(k.value for k in FrameKind), "dropped"):
            self.metrics.live_frames.labels(kind)
        self.jobs, self.blobs = await open_stores(s)
        addresses = {"lipsync": s.lipsync_address}
        if s.superres_address:
            addresses["superres"] = s.superres_address
        if s.lipsync_musetalk_address:  # the musetalk tier's stage: optional, not waited for
            addresses["lipsync-musetalk"] = s.lipsync_musetalk_address
        self.clients = DiscoveredStageClients(addresses, s.max_message_bytes)
        await self.clients.start()
        await self.clients.wait_serving(s.stage_wait_s, stages=[a for a in addresses if a != "lipsync-musetalk"])
        clients = self.clients
        superres = (
            (lambda: clients.stub("superres", superres_pb2_grpc.SuperResServiceStub)) if s.superres_address else None
        )
        musetalk = (
            (lambda: clients.stub("lipsync-musetalk", lipsync_pb2_grpc.MuseTalkServiceStub))
            if s.lipsync_musetalk_address
            else None
        )
        self.link = FaceLink(
            lambda: clients.stub("lipsync", lipsync_pb2_grpc.LipSyncServiceStub),
            superres,
            FaceLinkSettings(flush_interval_s=s.face_flush_ms / 1000),
            on_message=self._on_link_message,
            musetalk=musetalk,
        )
        await self.link.start()
        await asyncio.to_thread(_warm_up)
        self.cache = AvatarCache(self.blobs, Path(s.cache_dir), max_bytes=s.avatar_cache_bytes)
        threads = s.encode_threads or len(os.sched_getaffinity(0))
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="live-frames")
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        address = s.advertise_address or f"127.0.0.1:{self.bound_port}"
        self.placement = Placement(self.jobs, self.worker_id, address, s.max_sessions, s.lease_s)
        await self.placement.beat([], 0, False)
        self._loops = [asyncio.create_task(self._heartbeat(), name="live-heartbeat")]
        self._export_gauges()
        _LOGGER.info(
            "live worker ready",
            extra={"worker": self.worker_id, "address": address, "max_sessions": s.max_sessions, "threads": threads},
        )

    # -- OpenSession --------------------------------------------------------------------------------

    async def OpenSession(
        self, request: live_pb2.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        session_id = request.session.id
        if not session_id:
            raise InvalidRequest("OpenSession needs the session's id (the gateway's CreateSession gives it)")
        if self.draining:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "this live worker is draining: open the session on another worker"
            )
        held = self.sessions.get(session_id)
        if held is not None:  # the gateway asked again (a retry): the same session
            if held.tenant != (request.tenant or IMPLICIT_TENANT):
                raise NotFound(f"session {session_id} not found")
            return held.proto
        if len(self.sessions) + self.opening >= self.settings.max_sessions:
            self.metrics.live_admission_refused.inc()
            raise NoCapacity(
                f"this live worker holds its {self.settings.max_sessions} sessions (max_sessions); retry, or on another worker",
                RETRY_AFTER_MS,
            )
        self.opening += 1
        try:
            runner = await self._open(request)
        finally:
            self.opening -= 1
        return runner.proto

    async def _open(self, request: live_pb2.OpenSessionRequest) -> SessionRunner:
        s, asked = self.settings, request.session
        rate = asked.audio.sample_rate or 16000
        check_sample_rate(rate)
        limits = asked.limits
        if limits.max_session_seconds < 0 or limits.max_session_seconds > s.max_session_seconds:
            raise InvalidRequest(
                f"max_session_seconds {limits.max_session_seconds:g}: this deployment allows up to {s.max_session_seconds:g} s (0: that)"
            )
        if limits.idle_timeout_seconds < 0 or limits.idle_timeout_seconds > s.idle_timeout_s:
            raise InvalidRequest(
                f"idle_timeout_seconds {limits.idle_timeout_seconds:g}: this deployment allows up to {s.idle_timeout_s:g} s (0: that)"
            )
        video = asked.video
        if video.crf > 51 or video.jpeg_quality > 100 or video.fps < 0 or video.fps > 60:
            raise InvalidRequest(
                f"video crf {video.crf} (0-51), jpeg_quality {video.jpeg_quality} (1-100) or fps {video.fps:g} (0-60) is out of range"
            )
        if asked.super_resolution and not s.superres_address:
            raise InvalidRequest("super-resolution was asked for, but this live worker has no superres stage")
        avatar: LocalAvatar = await asyncio.to_thread(self.cache.get, asked.avatar_id)
        self._avatar_users[asked.avatar_id] = self._avatar_users.get(asked.avatar_id, 0) + 1
        try:
            return await self._start(request, avatar)
        except BaseException:
            self._release_avatar(asked.avatar_id)
            raise

    async def _start(self, request: live_pb2.OpenSessionRequest, avatar: LocalAvatar) -> SessionRunner:
        """The session on its avatar (open, counted in `_avatar_users`): its encoder, lease, face link
        registration and runner."""
        s, asked = self.settings, request.session
        rate = asked.audio.sample_rate or 16000
        video, limits = asked.video, asked.limits
        meta = avatar.meta
        width, height = output_size(meta.width, meta.height, video.max_height, asked.width, asked.height)
        fps = video.fps or meta.fps or 25.0
        codec = video.codec or session_pb2.VIDEO_CODEC_H264
        proto = session_pb2.Session()
        proto.CopyFrom(asked)
        proto.resume_token = ""  # never travels back from a worker
        proto.state = session_pb2.SESSION_STATE_ACTIVE
        proto.audio.sample_rate = rate
        proto.video.codec = codec
        proto.video.fps = fps
        proto.width, proto.height = width, height
        proto.limits.max_session_seconds = limits.max_session_seconds or s.max_session_seconds
        proto.limits.idle_timeout_seconds = limits.idle_timeout_seconds or s.idle_timeout_s
        if codec == session_pb2.VIDEO_CODEC_JPEG:
            proto.video.jpeg_quality = video.jpeg_quality or DEFAULT_JPEG_QUALITY
            encoder: Any = JpegEncoder(width, height, proto.video.jpeg_quality)
        else:
            proto.video.crf = video.crf or DEFAULT_CRF
            encoder = H264Encoder(width, height, FrameClock(fps).fps, preset=s.x264_preset, crf=proto.video.crf)
        await self.placement.lease(asked.id)
        try:
            musetalk = meta.model == MUSETALK_TIER
            faces: Sequence[ReferenceFace] | Sequence[ReferenceLatent]
            if musetalk:  # the 256 px tier: its latents, its whisper features, its gate
                assert avatar.latents is not None
                faces, crop_of = avatar_reference_latents(meta.boxes, avatar.latents, avatar.crop_row)
            else:
                faces, crop_of = avatar_reference_faces(meta.boxes, avatar.crops, avatar.crop_row)
            session_id = asked.id
            if faces:
                self.link.register(
                    session_id,
                    faces,
                    super_resolution=asked.super_resolution,
                    shared_as=(meta.id, asked.super_resolution),
                )
            link, loop = self.link, asyncio.get_running_loop()
            clock = FrameClock(fps, t0=_session_start(asked))

            def submit_face(frame: int, template: int, speech: SpeechFrame, due_ns: int) -> Any:
                crop = crop_of.get(template)
                if crop is None:  # this template frame has no face: it passes through
                    return MadeFace(None)
                due = loop.time() + (due_ns - clock.now_ns()) / 1e9
                if musetalk:
                    assert isinstance(speech.features, WhisperStream)
                    future = link.submit_musetalk(
                        session_id, frame % (1 << 32), crop, speech.features, speech.index, due=due
                    )
                else:
                    future = link.submit(session_id, frame % (1 << 32), crop, speech.mel, due=due)
                future.add_done_callback(_retrieve)
                return future

            def whisper_stream() -> WhisperStream:
                return WhisperStream(rate, float(clock.fps), s.musetalk_right_context_ms)

            live = LiveSession(
                IdleLoop(avatar.compositor.frames),
                avatar.compositor,
                encoder,
                clock,
                None,
                rate,
                max_queued_seconds=s.max_queued_audio_s,
                submit_face=submit_face,
                lead_s=s.face_lead(musetalk),
                face_grace_s=s.face_grace_s,
                max_chunk_ms=s.max_chunk_ms,
                scale=i420_scaler(meta.width, meta.height, width, height),
                features=whisper_stream if musetalk else None,
                gate=StreamingEnvelope(float(clock.fps)) if musetalk else None,
            )
            runner = SessionRunner(
                session_id,
                request.tenant or IMPLICIT_TENANT,
                proto,
                live,
                self.pool,
                self.metrics,
                s.send_queue_frames,
                self._ended,
                send_lag_s=s.send_lag_s,
            )
            self.sessions[session_id] = runner
        except BaseException:  # nothing of a session that could not open stays behind: its crops, its lease
            self.link.unregister(asked.id)
            encoder.close()
            with contextlib.suppress(Exception):
                await self.placement.release([asked.id])
            raise
        runner.start()
        self._export_gauges()
        _LOGGER.info(
            "session opened",
            extra={
                "session_id": session_id,
                "avatar_id": meta.id,
                "size": f"{width}x{height}",
                "fps": fps,
                "resume": request.resume,
            },
        )
        return runner

    # -- Converse -----------------------------------------------------------------------------------

    async def Converse(
        self, request_iterator: AsyncIterator[session_pb2.ConverseRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator:
        if self.draining:
            raise StreamEnded(grpc.StatusCode.UNAVAILABLE, DRAIN_MESSAGE)
        iterator = request_iterator.__aiter__()
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            raise InvalidRequest(
                "Converse ended before its first message: send ConverseStart naming the session first"
            ) from None
        if first.WhichOneof("request") != "start":
            raise InvalidRequest(
                f"the first message of Converse is ConverseStart naming the session, got {first.WhichOneof('request') or 'nothing'}"
            )
        session_id = first.start.session_id
        runner = self.sessions.get(session_id)
        if runner is None or runner.ended or runner.tenant != _tenant_of(context):
            raise NotFound(
                f"session {session_id!r} is not held by this live worker (it ended, or moved: resume it through the gateway)"
            )
        # last_frame: unset reads 0, and a client that saw only frame 0 loses nothing by starting anywhere after it
        last_frame = first.start.last_frame
        if last_frame < -1 or last_frame > runner.live.clock.last_due(CLOCK_SLACK_S):
            raise InvalidRequest(
                f"last_frame {last_frame} is not a frame session {session_id} has made (at most "
                f"{runner.live.clock.last_due()} by now, on its clock since it started): send the index of the "
                "last frame received, or -1"
            )
        stream = runner.attach(last_frame if last_frame > 0 else -1)
        self._export_gauges()
        reader = asyncio.create_task(self._read(runner, stream, iterator), name=f"live-read-{session_id}")
        try:
            yield runner.ready_message()
            while True:
                try:
                    response, arrived_ns = await stream.get()
                except StreamClosed:
                    break
                yield response  # returns once gRPC has taken it: flow control holds the rest here, bounded
                if response.WhichOneof("response") == "frame":
                    runner.observe_sent(response, arrived_ns)
            if stream.error is not None:
                raise stream.error
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            runner.detach(stream)
            self._export_gauges()

    async def _read(
        self, runner: SessionRunner, stream: Any, iterator: AsyncIterator[session_pb2.ConverseRequest]
    ) -> None:
        """The client's messages, in order; a bad one ends the stream with its status (the session lives on)."""
        try:
            async for request in iterator:
                kind = request.WhichOneof("request")
                if kind == "audio":
                    runner.push_audio(request.audio.pcm)
                elif kind == "end_of_utterance":
                    runner.end_utterance()
                elif kind == "clear":
                    runner.clear()
                elif kind == "ack":
                    pass  # acknowledgements pace the gateway's relay (services/gateway/converse.py), not the worker
                elif kind == "start":
                    raise InvalidRequest(
                        "ConverseStart is the first message of a Converse stream only; open a new stream to resume"
                    )
                else:
                    raise InvalidRequest("an empty ConverseRequest: send audio, end_of_utterance or clear")
            runner.half_closed = True
            runner.end_utterance()  # nothing more comes: what was sent plays out, then the stream ends
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stream ends with the error's status; the session lives on
            stream.abort(exc)

    # -- CloseSession -------------------------------------------------------------------------------

    async def CloseSession(
        self, request: session_pb2.CloseSessionRequest, context: grpc.aio.ServicerContext
    ) -> session_pb2.Session:
        runner = self.sessions.get(request.session_id)
        if runner is None or runner.tenant != _tenant_of(context):
            raise NotFound(f"session {request.session_id!r} is not held by this live worker")
        runner.end(session_pb2.SESSION_STATE_CLOSED, "closed by CloseSession", grpc.StatusCode.OK)
        await runner.wait_closed()
        update = self._row_updates.get(request.session_id)
        if update is not None:
            await asyncio.gather(update, return_exceptions=True)  # its row says CLOSED before the answer does
        closed = session_pb2.Session()
        closed.CopyFrom(runner.proto)
        closed.state = session_pb2.SESSION_STATE_CLOSED
        closed.error = "closed by CloseSession"
        return closed

    # -- bookkeeping --------------------------------------------------------------------------------

    def _ended(self, runner: SessionRunner) -> None:
        """A session ended (closed, a limit, failed): frees its slot and its crops, marks its row."""
        if self.sessions.get(runner.session_id) is runner:
            del self.sessions[runner.session_id]
        self.link.unregister(runner.session_id)
        self._release_avatar(runner.proto.avatar_id)
        self._export_gauges()
        ending = runner.ending
        assert ending is not None
        code = ending.code.value[0]
        _LOGGER.info(
            "session ended",
            extra={
                "session_id": runner.session_id,
                "state": session_pb2.SessionState.Name(ending.state),
                "reason": ending.error,
                "frames": dataclasses.asdict(runner.live.counts),
                "dropped_for_slow_reader": runner.dropped,
            },
        )
        if ending.state != session_pb2.SESSION_STATE_ACTIVE:  # ACTIVE: it goes on elsewhere (drain, a lost lease)
            session_id = runner.session_id
            update = self._spawn(self.placement.end(session_id, SessionState(ending.state), ending.error, code))
            self._row_updates[session_id] = update
            update.add_done_callback(
                lambda task: (
                    self._row_updates.pop(session_id, None) if self._row_updates.get(session_id) is task else None
                )
            )

    def _release_avatar(self, avatar_id: str) -> None:
        """One session fewer on the avatar; the last one closes it (its memory goes with the session)."""
        users = self._avatar_users.get(avatar_id, 0) - 1
        if users > 0:
            self._avatar_users[avatar_id] = users
            return
        self._avatar_users.pop(avatar_id, None)
        self.cache.release(avatar_id)

    def footprint(self) -> dict[str, int]:
        """What this worker holds for its sessions, by where: every figure is 0 once every session has
        ended (what a closed session leaves behind is a leak; tests/unit/live/test_service.py)."""
        return {
            "sessions": len(self.sessions),
            "opening": self.opening,
            "row_updates": len(self._row_updates),
            "avatars_in_use": len(self._avatar_users),
            "avatars_open": len(self.cache.open_ids),
            "link_sessions": self.link.sessions,
            "link_crops": self.link.crops_in_use,
        }

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)
        return task

    def _export_gauges(self) -> None:
        m = self.metrics
        m.live_sessions.labels("active").set(len(self.sessions))
        m.live_sessions.labels("streaming").set(sum(1 for r in self.sessions.values() if r.stream is not None))
        m.live_sessions.labels("draining").set(len(self.sessions) if self.draining else 0)

    def _on_link_message(self, stage: str, items: int) -> None:
        self.metrics.live_link_messages.labels(stage).inc()
        self.metrics.live_link_items_per_message.labels(stage).observe(items)

    def _export_link_counters(self) -> None:
        c = self.link.counters
        outcomes = {"face": c.faces, "late": c.late - c.shed, "shed": c.shed, "failed": c.failed, "dropped": c.dropped}
        for outcome, value in outcomes.items():
            seen = self._link_seen.get(outcome, 0)
            if value > seen:
                self.metrics.live_link_faces.labels(outcome).inc(value - seen)
                self._link_seen[outcome] = value

    async def _heartbeat(self) -> None:
        """Every `heartbeat_s`: this worker's row, its sessions' leases (a lost one ends its session), metrics."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            self._export_link_counters()
            try:
                lost = await self.placement.beat(list(self.sessions), len(self.sessions), self.draining)
            except Exception:
                _LOGGER.warning("live worker heartbeat failed", exc_info=True)
                continue
            for session_id in lost:
                runner = self.sessions.get(session_id)
                if runner is not None:
                    message = f"session {session_id} moved to another live worker (this one lost its lease); resume it through the gateway"
                    runner.end(session_pb2.SESSION_STATE_ACTIVE, message, grpc.StatusCode.ABORTED)

    # -- shutdown -----------------------------------------------------------------------------------

    async def begin_drain(self) -> None:
        """SIGTERM: no new sessions; every stream ends UNAVAILABLE (resume elsewhere); leases released."""
        self.draining = True
        self._export_gauges()
        runners = list(self.sessions.values())
        for runner in runners:
            if runner.stream is not None:
                runner.stream.abort(StreamEnded(grpc.StatusCode.UNAVAILABLE, DRAIN_MESSAGE))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.placement.beat(list(self.sessions), len(self.sessions), True), timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.placement.release(list(self.sessions)), timeout=2.0)
        _LOGGER.info("live worker draining", extra={"sessions": len(runners)})

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        runners = list(getattr(self, "sessions", {}).values())
        for runner in runners:
            runner.end(session_pb2.SESSION_STATE_ACTIVE, DRAIN_MESSAGE, grpc.StatusCode.UNAVAILABLE)
        await asyncio.gather(*(r.wait_closed() for r in runners), return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if hasattr(self, "placement"):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.placement.remove(), timeout=2.0)
        if hasattr(self, "link"):
            await self.link.close()
        if hasattr(self, "pool"):
            self.pool.shutdown(wait=True, cancel_futures=True)
        if hasattr(self, "clients"):
            await self.clients.close()
        close_stores(getattr(self, "jobs", None), getattr(self, "blobs", None))


def _session_start(session: session_pb2.Session) -> int | None:
    """The session's frame clock's t0 on this process's monotonic clock: from its create_time (the
    gateway's row), so that it keeps its numbering on whichever worker holds it; None (now) without one."""
    if session.create_time.seconds <= 0:
        return None
    return started_at(session.create_time.ToNanoseconds())


def _warm_up() -> None:
    """The mel at every input rate once, before SERVING: the first call loads scipy's FFT and builds
    the resampling filters and the filter bank, which on a session's first chunk would stall every
    session's clock."""
    for rate in SUPPORTED_RATES:
        mel = MelStream(rate, 25.0)
        mel.push(np.zeros(rate // 2))
        mel.finish()


def _retrieve(future: asyncio.Future) -> None:
    """Reads a face future's exception (late, failed) so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        _LOGGER.warning("live worker store update failed", exc_info=task.exception())
