"""Converse through the gateway: the client's stream checked, routed to the live worker that holds the
session, and relayed both ways; a session whose worker is gone re-placed on another first.

- **The first message** must be ConverseStart (else INVALID_ARGUMENT saying so): the session's id
  and resume token, checked against the caller's tenant and the token's stored sha256 (constant
  time). The worker gets the start without the token (it trusts the gateway: the internal token)
  and the tenant in `x-lipline-tenant`.
- **Routing**: the row names the worker holding the lease. When that lease has expired (its worker
  died) or the worker answers UNAVAILABLE or NOT_FOUND before its first message (draining, killed,
  restarted; or CANCELLED or INTERNAL from a server that is stopping), the gateway gives the lease up, places the session on another worker with
  OpenSession(resume=true) (it reloads the avatar from the blob store) and streams from there. A
  client resumes by sending ConverseStart again on a new stream with the last frame it received.
- **Relay**: two loops, one per direction, each awaiting the other side before it takes the next
  message (gRPC's flow control pushes back through them), so the gateway holds at most a message
  each way per stream: a client that reads slowly stalls the worker's stream, where the worker
  drops its oldest frames (counted; the reader gets the live edge, H.264 from an IDR) rather than
  buffering them. Below the worker's send queue a stream holds the message the worker is writing,
  the gateway's receive window for the stream (16 KiB: services.gateway.live_workers, no BDP
  probing) and the message relayed; the client's own receive window is the client's (docs/limits.md).
  When either side ends, both are cancelled.
- **Acknowledgements** (ConverseStart.ack_window N > 0): the client sends FrameAck as it takes frames and
  the relay holds the next frame while N it has not acknowledged are out (services.gateway.frame_acks),
  so a client that stalls holds at most N frames of the past whatever its transport buffers. Acks go
  no further than the gateway; when the client ends its side, nothing more is held back.
  A worker's status reaches the client as it was (its message is written for people), UNAVAILABLE
  mid-stream with a note that the stream may be resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc

from lipline.v1 import live_pb2_grpc, session_pb2
from services.gateway.frame_acks import MAX_ACK_WINDOW, FrameAcks
from services.gateway.live_workers import GONE, LiveWorkerError, LiveWorkers, call_metadata
from services.gateway.sessions import check_last_frame, require_active, session_to_proto, stream_session
from services.jobs.store.jobs import JobStore
from services.jobs.store.sessions import SessionRow
from services.serving.errors import InvalidRequest

_LOGGER = logging.getLogger(__name__)

# A worker answering these before its first message does not hold the session (any more): re-place it.
_NOT_THERE = GONE | {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED}
StreamCall: TypeAlias = grpc.aio.StreamStreamCall


async def first_start(requests: AsyncIterator[session_pb2.ConverseRequest]) -> session_pb2.ConverseStart:
    """The stream's ConverseStart; InvalidRequest when the first message is something else or none."""
    first = await anext(requests, None)
    kind = first.WhichOneof("request") if first is not None else None
    if first is None or kind != "start":
        got = f"a {kind} message" if kind else ("an empty message" if first is not None else "no message")
        raise InvalidRequest(
            f"the first message of a Converse stream must be ConverseStart (session_id, resume_token), got {got}"
        )
    return first.start


async def _open_stream(
    stub: live_pb2_grpc.LiveServiceStub,
    start: session_pb2.ConverseStart,
    tenant: str,
    request_id: str,
    timeout_s: float,
) -> tuple[StreamCall, session_pb2.ConverseResponse]:
    """Converse on a worker: the start sent, its first response read (within `timeout_s`: a worker
    that takes the connection but never answers counts as gone). AioRpcError when it refuses."""
    call: StreamCall = stub.Converse(metadata=call_metadata(tenant, request_id))
    try:
        await call.write(session_pb2.ConverseRequest(start=start))
        response = await asyncio.wait_for(call.read(), timeout_s)
    except TimeoutError:
        call.cancel()
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            f"no answer to ConverseStart within {timeout_s:g} s",
        ) from None
    except BaseException:
        call.cancel()
        raise
    if response is grpc.aio.EOF:
        status = await _status(call)
        if status.code() is not grpc.StatusCode.OK:
            raise status  # as if read() had raised it: the caller decides whether the worker is gone
        # It ended OK without a word: no stream anyone can use.
        raise LiveWorkerError(status, "the live worker ended the stream before it was ready; resume with ConverseStart")
    return call, response


async def _status(call: StreamCall) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        await call.code(), await call.initial_metadata(), await call.trailing_metadata(), await call.details()
    )


async def attach(
    jobs: JobStore,
    workers: LiveWorkers,
    row: SessionRow,
    start: session_pb2.ConverseStart,
    tenant: str,
    request_id: str = "",
) -> tuple[StreamCall, session_pb2.ConverseResponse]:
    """A stream on the worker holding the session, or on the one it was re-placed on."""
    # No token: the worker does not need it (the gateway checked it).
    forward = session_pb2.ConverseStart(session_id=row.id, last_frame=start.last_frame)
    failed: frozenset[str] = frozenset()
    if row.lease_live and row.worker_address:
        try:
            return await _open_stream(
                workers.stub(row.worker_address), forward, tenant, request_id, workers.open_timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in _NOT_THERE:
                raise LiveWorkerError(exc) from exc
            _LOGGER.info(
                "session %s: its live worker %s answered %s (%s); placing it on another",
                row.id,
                row.worker_id,
                exc.code().name,
                exc.details(),
            )
        await jobs.release_session(row.id, row.worker_id)
        failed = frozenset({row.worker_id})  # asked last: it may be alive and hung
        row = await jobs.get_session(tenant, row.id)
        require_active(row)
    worker = await workers.place(session_to_proto(row), tenant, resume=True, request_id=request_id, avoid=failed)
    _LOGGER.info("session %s resumes on live worker %s", row.id, worker.id, extra={"request_id": request_id})
    try:
        return await _open_stream(workers.stub(worker.address), forward, tenant, request_id, workers.open_timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise LiveWorkerError(exc) from exc


def check_ack_window(start: session_pb2.ConverseStart) -> None:
    if start.ack_window > MAX_ACK_WINDOW:
        raise InvalidRequest(
            f"ack_window {start.ack_window} is over {MAX_ACK_WINDOW} frames: ask for the frames a client may "
            "hold unacknowledged (about a second's worth), or 0 for no acknowledgements"
        )


async def _pump(
    requests: AsyncIterator[session_pb2.ConverseRequest],
    call: StreamCall,
    acks: FrameAcks,
    problems: list[BaseException],
) -> None:
    """Client -> worker, one message at a time (acknowledgements stop here); a second ConverseStart
    ends the stream."""
    try:
        async for request in requests:
            kind = request.WhichOneof("request")
            if kind == "ack":
                acks.acked(request.ack.frame)
                continue
            if kind == "start":
                raise InvalidRequest(
                    "ConverseStart comes once, as the stream's first message; to resume, open a new stream"
                )
            await call.write(request)
        acks.stop()
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        pass  # the worker's side has ended: the reading loop reports its status
    except Exception as exc:  # noqa: BLE001 - the client's stream failed or broke a rule: end both sides
        problems.append(exc)
        call.cancel()
    finally:
        acks.stop()


async def relay(
    call: StreamCall, requests: AsyncIterator[session_pb2.ConverseRequest], session_id: str, ack_window: int = 0
) -> AsyncIterator[session_pb2.ConverseResponse]:
    """Worker -> client until either side ends; the worker's status as the stream's. With an
    `ack_window`, a frame waits while that many sent ones are unacknowledged (the worker's stream
    waits with it)."""
    problems: list[BaseException] = []
    acks = FrameAcks(ack_window)
    pump = asyncio.create_task(_pump(requests, call, acks, problems))
    try:
        while True:
            try:
                response = await call.read()
            except grpc.aio.AioRpcError as exc:
                if problems:
                    raise problems[0] from None
                raise _worker_ended(exc, session_id) from exc
            except asyncio.CancelledError:
                # The pump cancelled the call (a locally cancelled read raises this), or we are cancelled.
                task = asyncio.current_task()
                if problems and task is not None and not task.cancelling():
                    raise problems[0] from None
                raise
            if response is grpc.aio.EOF:
                break
            if response.HasField("frame"):
                await acks.wait_for_room()
                acks.sent(response.frame.index)
            yield response
        if problems:
            raise problems[0]
        if await call.code() is not grpc.StatusCode.OK:
            raise _worker_ended(await _status(call), session_id)
    finally:
        pump.cancel()
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


def _worker_ended(exc: grpc.aio.AioRpcError, session_id: str) -> LiveWorkerError:
    """The worker's status for the client: as it was, but a worker gone mid-stream (killed, drained,
    its server stopping: UNAVAILABLE, or CANCELLED or INTERNAL from gRPC) is UNAVAILABLE saying to resume."""
    if exc.code() in GONE:
        message = f"the live worker of session {session_id} went away ({exc.details()}); resume with ConverseStart and the last frame"
        return LiveWorkerError(exc, message, grpc.StatusCode.UNAVAILABLE)
    return LiveWorkerError(exc)


async def converse(
    jobs: JobStore,
    workers: LiveWorkers,
    requests: AsyncIterator[session_pb2.ConverseRequest],
    tenant: str,
    request_id: str = "",
) -> AsyncIterator[session_pb2.ConverseResponse]:
    """Converse: the start checked, the stream attached, then relayed (see the module docstring)."""
    requests = aiter(requests)  # one iterator: the start is read from it, the rest relayed
    start = await first_start(requests)
    row = await stream_session(jobs, tenant, start.session_id, start.resume_token)
    check_last_frame(row, start.last_frame)
    check_ack_window(start)
    call, first = await attach(jobs, workers, row, start, tenant, request_id)
    try:
        yield first
    except BaseException:
        call.cancel()
        raise
    async for response in relay(call, requests, row.id, start.ack_window):
        yield response
