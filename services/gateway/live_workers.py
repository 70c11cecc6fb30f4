"""The live workers as the gateway reaches them: placement by their heartbeats, one channel per worker.

Live workers are found through the job store, not a Service: each writes a heartbeat row (address,
capacity, active sessions, draining) every second, and the gateway places a new or resumed session
on the fresh one with the most room (services.jobs.store.sessions); a worker whose live leases fill
its capacity is not asked, one full only by its heartbeat (a second old) is. A worker can be full by
the time it is asked (another gateway placed there since its heartbeat): it answers
RESOURCE_EXHAUSTED and the next is tried; a dead or draining one answers UNAVAILABLE (or, while its server stops,
CANCELLED or INTERNAL) and is skipped the same way. Only
when every fresh worker has refused does CreateSession fail, RESOURCE_EXHAUSTED with
`retry-after-ms`: sessions already running are never degraded to make room.

Calls carry the internal token (services.serving.channels.open_channel), the request id and the
session's tenant in `x-lipline-tenant`, which the worker checks the session against.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

import grpc

from lipline.v1 import live_pb2, live_pb2_grpc, session_pb2
from services.jobs.store.jobs import JobStore
from services.jobs.store.sessions import LiveWorker
from services.serving.channels import open_channel
from services.serving.errors import RETRY_AFTER_HEADER, LiplineError, NoCapacity
from services.serving.tracing import outgoing_metadata

_LOGGER = logging.getLogger(__name__)

TENANT_HEADER = "x-lipline-tenant"
MAX_CHANNELS = 256  # channels kept to live workers; the least recently used beyond it are closed
# A worker's channel that lost its connection tries again within a second (gRPC's back-off grows to
# 120 s by default, and a call during the back-off fails UNAVAILABLE at once): a worker restarted on
# the same address takes sessions again as soon as it is up.
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000))
# A live stream's frames must wait in the worker's send queue, where a reader that fell behind loses
# the oldest and gets the live edge (services/live/send_queue.py), not in gRPC's buffers below it,
# which can only hand the past over. The gateway is the receiver of a worker's Converse stream, so
# its window bounds what the worker's transport takes while the relay is not reading (its client is
# not): a fixed 16 KiB, never grown by BDP probing (which grows it to megabytes on a fast link). A
# frame larger than that still flows in one round trip: gRPC opens the window as far as the message a
# pending read needs (docs/limits.md: what a live session holds below its send queue).
LIVE_STREAM_WINDOW_BYTES = 16 * 1024
LIVE_STREAM_OPTIONS = (("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", LIVE_STREAM_WINDOW_BYTES))
CLOSE_TIMEOUT_S = 5.0
# A call to a worker that is going away (killed, draining, its server stopping) ends with one of
# these, depending on the moment: gRPC says "Internal error from Core" or CANCELLED for a call cut
# while its server shuts down. The session does not live there: another worker may take it.
GONE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
)
# A worker answering these to OpenSession cannot take the session now; the next worker may.
_SKIP = GONE | {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED}
# A worker restarted on its old address a moment ago heartbeats while the gateway's channel to it may
# still be in its reconnect back-off (RECONNECT_OPTIONS: up to a second), and a call in the back-off
# fails UNAVAILABLE at once. When no worker took a session, those that answered UNAVAILABLE are asked
# once more if their channel connects within this long (a worker really gone costs this much more).
RECONNECT_WAIT_S = 2.0


class LiveWorkerError(LiplineError):
    """A live worker answered with an error that is the caller's to see (its status and message as
    the worker gave them: the worker's messages are written for people), or went away mid-stream."""

    def __init__(self, exc: grpc.aio.AioRpcError, message: str = "", code: grpc.StatusCode | None = None) -> None:
        super().__init__(message or exc.details() or exc.code().name)
        self.code = code or exc.code()
        self._trailing = tuple(
            (k, v) for k, v in (exc.trailing_metadata() or ()) if k == RETRY_AFTER_HEADER and isinstance(v, str)
        )

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


def retry_after_ms(exc: grpc.aio.AioRpcError) -> int | None:
    """The worker's `retry-after-ms` hint, if it sent a usable one."""
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_HEADER:
            with contextlib.suppress(TypeError, ValueError):
                return max(0, int(value))
    return None


def call_metadata(tenant: str, request_id: str = "") -> list[tuple[str, str]]:
    return [(TENANT_HEADER, tenant), *outgoing_metadata(request_id)]


class LiveWorkers:
    """Placement on, and channels to, the live workers the job store lists."""

    def __init__(
        self, jobs: JobStore, max_message_bytes: int, fresh_s: float, open_timeout_s: float, retry_after_ms: int
    ) -> None:
        self.jobs = jobs
        self.fresh_s, self.open_timeout_s, self.retry_after_ms = fresh_s, open_timeout_s, retry_after_ms
        self._max_message_bytes = max_message_bytes
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._closing: set[asyncio.Task] = set()

    def stub(self, address: str) -> live_pb2_grpc.LiveServiceStub:
        """A stub on the worker's channel (opened on first use, kept for the next call)."""
        return live_pb2_grpc.LiveServiceStub(self._channel(address))

    def _channel(self, address: str) -> grpc.aio.Channel:
        """The worker's channel, opened on first use and kept (the least recently used beyond MAX_CHANNELS close)."""
        channel = self._channels.pop(address, None) or open_channel(
            address, self._max_message_bytes, extra_options=RECONNECT_OPTIONS + LIVE_STREAM_OPTIONS
        )
        self._channels[address] = channel
        while len(self._channels) > MAX_CHANNELS:  # the least recently used: a worker long gone, most likely
            _, old = self._channels.popitem(last=False)
            closing = asyncio.get_running_loop().create_task(old.close(grace=CLOSE_TIMEOUT_S))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        return channel

    async def place(
        self,
        session: session_pb2.Session,
        tenant: str,
        resume: bool,
        request_id: str = "",
        avoid: frozenset[str] = frozenset(),
    ) -> LiveWorker:
        """OpenSession on the fresh worker with the most room that takes it (those in `avoid`, e.g.
        the one that just failed the session, last); NoCapacity (with the workers' retry-after hint,
        else the deployment's) when none does. Any other error of a worker (the avatar cannot be
        loaded, a limit it refuses) is the caller's: LiveWorkerError."""
        workers = await self.jobs.live_workers(self.fresh_s)
        hint, refused, unreachable = self.retry_after_ms, [], []
        request = live_pb2.OpenSessionRequest(session=session, tenant=tenant, resume=resume)
        # sorted() is stable: the avoided go last, each group in the order of room.
        candidates = sorted((w for w in workers if w.free_by_leases > 0), key=lambda w: w.id in avoid)
        for worker in candidates:
            refusal = await self._open(worker, request, tenant, request_id)
            if refusal is None:
                return worker
            refused.append(f"{worker.id} {refusal.code().name}")
            if refusal.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                hint = retry_after_ms(refusal) or hint
            elif refusal.code() is grpc.StatusCode.UNAVAILABLE and not self._connected(worker.address):
                # not the worker's own answer (a draining worker's comes over a connected channel)
                unreachable.append(worker)
        for worker in unreachable:  # a channel in its reconnect back-off, perhaps: once more, once it connects
            if not await self._connects(worker.address, RECONNECT_WAIT_S):
                continue
            if await self._open(worker, request, tenant, request_id) is None:
                return worker
        full = sum(1 for w in workers if w.free_by_leases <= 0)
        raise NoCapacity(
            f"no live worker has room for a session now ({len(workers)} available, {full} full"
            + (f", refused by {', '.join(refused)}" if refused else "")
            + f"); retry in {hint} ms",
            hint,
        )

    def _connected(self, address: str) -> bool:
        """Whether the worker's channel is connected now."""
        return self._channel(address).get_state() is grpc.ChannelConnectivity.READY

    async def _connects(self, address: str, wait_s: float) -> bool:
        """Whether the worker's channel is connected within `wait_s` (trying at once if it is idle)."""
        try:
            await asyncio.wait_for(self._channel(address).channel_ready(), wait_s)
        except TimeoutError:
            return False
        return True

    async def _open(
        self, worker: LiveWorker, request: live_pb2.OpenSessionRequest, tenant: str, request_id: str
    ) -> grpc.aio.AioRpcError | None:
        """OpenSession on one worker: None when it took the session, else its refusal (logged). Any
        other error of the worker is the caller's: LiveWorkerError."""
        try:
            await self.stub(worker.address).OpenSession(
                request, metadata=call_metadata(tenant, request_id), timeout=self.open_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _SKIP:
                raise LiveWorkerError(exc) from exc
            if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                # it may have leased the session before it stopped answering: let the next one take it
                await self.jobs.release_session(request.session.id, worker.id)
            _LOGGER.info(
                "live worker refused session %s (%s): %s",
                request.session.id,
                exc.code().name,
                exc.details(),
                extra={"worker": worker.id},
            )
            return exc
        return None

    async def close_on_worker(self, address: str, session_id: str, tenant: str, request_id: str = "") -> None:
        """CloseSession on the worker that holds the session; a worker that does not answer is
        logged, not raised (the caller marks the row CLOSED anyway: the worker drops it at its next
        lease renewal)."""
        try:
            await self.stub(address).CloseSession(
                session_pb2.CloseSessionRequest(session_id=session_id),
                metadata=call_metadata(tenant, request_id),
                timeout=CLOSE_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            _LOGGER.info(
                "CloseSession %s on live worker %s: %s (%s); marking it closed",
                session_id,
                address,
                exc.code().name,
                exc.details(),
            )

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), OrderedDict()
        for channel in channels:
            await channel.close()
