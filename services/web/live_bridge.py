"""The live session's WebSocket: one per page session, bridged to the gateway's CreateSession and Converse.

A browser cannot open a gRPC bidi stream, and WebRTC needs UDP and TURN through the cluster's way
in; one WebSocket over the page's own origin goes through any HTTP ingress. The protocol:

page -> server
    text   {"type": "start", "api_key", "avatar_id", "codec": "h264"|"jpeg", "sample_rate", "max_height"}
           first, within START_TIMEOUT_S (the key travels here, never in the URL); or, to resume a
           session whose socket dropped, {"type": "resume", "api_key", "session_id", "resume_token",
           "last_frame"} (the index of the last frame the page received)
    binary one PCM chunk, s16le mono at the session's rate (10-100 ms)
    text   {"type": "clear"} (barge-in) or {"type": "end"} (EndOfUtterance)
server -> page
    text   {"type": "session", "session": Session}, {"type": "ready", "next_frame"},
           {"type": "event", ...SessionEvent}, {"type": "stats", ...SessionStats},
           {"type": "error", "code", "message"} (then the socket closes)
    binary one frame: uint32 LE n, n bytes of JSON {index, keyframe, speech, utterance, video_bytes},
           the frame's data (an H.264 access unit or a JPEG), then its re-timed PCM

The session outlives a dropped socket: the page reconnects (to this server or, after a restart or
behind a balancer, to another) and resumes it with the session's resume token, which the session
message carries and the page keeps in memory only; the live worker goes on from a keyframe. The
session is closed (CloseSession) when the page closes its socket (a close frame: Stop, or leaving
the page) or the bridge ends it for a bad message; a socket that drops without a close frame, a
server shutting down, or a stream another resume took over leave it to be resumed, and a session
nobody resumes ends by itself after the live worker's idle_timeout_s (60 s). Frames are
sent as the gateway's stream yields them and each send waits for the socket to drain, so a slow
page slows the Converse stream and the live worker drops frames for it (counted there), as for any
slow gRPC reader. Only pages of the page's public origins (or `allowed_origins`) may open it,
whatever Host a request names (services/web/origins.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import WebSocketError, WSMsgType, web
from google.protobuf import json_format

from lipline.v1 import session_pb2
from services.serving.metrics import Metrics
from services.serving.streams import stream_call
from services.web.gateway_link import GatewayLink, key_metadata
from services.web.origins import local_port, origin_allowed, page_origins
from services.web.settings import WebSettings

_LOGGER = logging.getLogger(__name__)
START_TIMEOUT_S = 10.0
CODECS = {"h264": session_pb2.VIDEO_CODEC_H264, "jpeg": session_pb2.VIDEO_CODEC_JPEG}
UP_QUEUE = 100  # messages from the page waiting for the gateway: 2 s of 20 ms chunks
#: WebSocket close codes of the application range (4000-4999), by what went wrong
CLOSE_REFUSED = 4400
CLOSE_ENDED = 4000
CLOSE_TRY_AGAIN = 1013  # RFC 6455 "try again later": the page resumes the session
ACK_WINDOW_S = 2.0  # video the gateway may send ahead of what went onto the socket (as lipline-client's LiveSession)
READER_END_S = 5.0  # after a failed send, how long the page's side may take to say whether it closed or dropped


class StartError(ValueError):
    """The page's first message is not a start message the bridge can act on."""


def parse_start(text: str) -> dict[str, Any]:
    """The first message's fields, checked (a start, or a resume: `type` says which); StartError says
    what to fix."""
    try:
        start = json.loads(text)
    except ValueError:
        raise StartError('the first message must be JSON: {"type": "start", ...}') from None
    if isinstance(start, dict) and start.get("type") == "resume":
        return _parse_resume(start)
    if not isinstance(start, dict) or start.get("type") != "start":
        raise StartError(
            'the first message must be {"type": "start", "api_key", "avatar_id", ...} or {"type": "resume", ...}'
        )
    if not isinstance(start.get("avatar_id"), str) or not start["avatar_id"]:
        raise StartError("pick an avatar first (avatar_id is empty)")
    codec = start.get("codec", "h264")
    if codec not in CODECS:
        raise StartError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
    try:
        rate, max_height = int(start.get("sample_rate", 16000)), int(start.get("max_height", 0))
    except (TypeError, ValueError):
        raise StartError("sample_rate and max_height must be whole numbers") from None
    return {
        "type": "start",
        "api_key": str(start.get("api_key", "")).strip(),
        "avatar_id": start["avatar_id"],
        "codec": CODECS[codec],
        "sample_rate": rate,
        "max_height": max_height,
    }


def _parse_resume(resume: dict[str, Any]) -> dict[str, Any]:
    for field in ("session_id", "resume_token"):
        if not isinstance(resume.get(field), str) or not resume[field]:
            raise StartError(f"a resume names the session: {field} is missing (the session message had it)")
    last_frame = resume.get("last_frame", -1)
    if not isinstance(last_frame, int) or isinstance(last_frame, bool) or last_frame < -1:
        raise StartError(f"last_frame is the index of the last frame received (-1: none), got {last_frame!r}")
    return {
        "type": "resume",
        "api_key": str(resume.get("api_key", "")).strip(),
        "start": session_pb2.ConverseStart(
            session_id=resume["session_id"], resume_token=resume["resume_token"], last_frame=last_frame
        ),
    }


def trusted_origin(request: web.Request, settings: WebSettings) -> bool:
    """The page that opens the socket is one of the page's public origins (or an allowed one): a
    browser always sends Origin on a WebSocket, and a page of another site, a DNS-rebinding one
    included (its Host matches its Origin), must not drive a session with its visitor's key
    (services/web/origins.py)."""
    origins = page_origins(settings.public_origins, settings.allowed_origins, local_port(request, settings.http_port))
    return origin_allowed(request.headers.get("Origin", ""), origins)


def frame_message(frame: session_pb2.VideoFrame) -> bytes:
    header = json.dumps(
        {
            "index": frame.index,
            "keyframe": frame.keyframe,
            "speech": frame.speech,
            "utterance": frame.utterance,
            "video_bytes": len(frame.data),
        },
        separators=(",", ":"),
    ).encode()
    return struct.pack("<I", len(header)) + header + frame.data + frame.audio


def response_message(response: session_pb2.ConverseResponse) -> dict[str, Any] | bytes:
    kind = response.WhichOneof("response")
    if kind == "frame":
        return frame_message(response.frame)
    if kind == "ready":
        return {"type": "ready", "next_frame": response.ready.next_frame}
    body = json_format.MessageToDict(
        getattr(response, kind), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return {"type": kind, **body}


class LiveBridge:
    """Accepts the live WebSockets of one web server process."""

    def __init__(self, settings: WebSettings, gateway: GatewayLink, metrics: Metrics) -> None:
        self.settings = settings
        self.gateway = gateway
        self.metrics = metrics
        self.sockets: set[web.WebSocketResponse] = set()
        self.stopping = False

    async def shutdown(self, app: web.Application) -> None:
        """Server stopping: close every socket with "going away"; their sessions stay, for the pages
        to resume through another replica or this one once it is back."""
        self.stopping = True
        for ws in list(self.sockets):
            await ws.close(code=1001, message=b"the web server is restarting: resuming")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not trusted_origin(request, self.settings):
            self.metrics.web_live_refused.labels("origin").inc()
            return web.json_response(
                {
                    "error": "the live WebSocket accepts only the page's own origins (the web server's "
                    "public_origins): open the page at one of them",
                    "code": "PERMISSION_DENIED",
                },
                status=403,
            )
        ws = web.WebSocketResponse(max_msg_size=self.settings.max_live_message_bytes, heartbeat=30.0)
        await ws.prepare(request)
        self.sockets.add(ws)
        self.metrics.web_live_sockets.inc()
        try:
            await self._run(ws)
        finally:
            self.sockets.discard(ws)
            self.metrics.web_live_sockets.dec()
            if not ws.closed:
                await ws.close(code=CLOSE_ENDED)
        return ws

    async def _run(self, ws: web.WebSocketResponse) -> None:
        try:
            first = await asyncio.wait_for(ws.receive(), START_TIMEOUT_S)
            if first.type != WSMsgType.TEXT:
                raise StartError('send {"type": "start", ...} first, as text')
            start = parse_start(first.data)
        except (StartError, TimeoutError) as exc:
            self.metrics.web_live_refused.labels("start").inc()
            message = str(exc) or f"no start message within {START_TIMEOUT_S:g} s"
            await _send_error(ws, "INVALID_ARGUMENT", message)
            return
        if self.settings.require_api_key and not start["api_key"]:
            self.metrics.web_live_refused.labels("key").inc()
            await _send_error(ws, "UNAUTHENTICATED", "this page needs an API key: enter yours in the API key field")
            return
        metadata = key_metadata(start["api_key"])
        stub = self.gateway.stub
        try:
            if start["type"] == "resume":
                converse = start["start"]
                session = await stub.GetSession(
                    session_pb2.GetSessionRequest(session_id=converse.session_id),
                    metadata=metadata,
                    timeout=self.settings.call_timeout_s,
                )
                session.resume_token = converse.resume_token  # GetSession never returns it; the page has it
            else:
                session = await stub.CreateSession(
                    session_pb2.CreateSessionRequest(
                        avatar_id=start["avatar_id"],
                        audio=session_pb2.AudioFormat(sample_rate=start["sample_rate"]),
                        video=session_pb2.VideoFormat(codec=start["codec"], max_height=start["max_height"]),
                    ),
                    metadata=metadata,
                    timeout=self.settings.call_timeout_s,
                )
                converse = session_pb2.ConverseStart(
                    session_id=session.id, resume_token=session.resume_token, last_frame=-1
                )
        except grpc.aio.AioRpcError as exc:
            if start["type"] == "resume" and exc.code() == grpc.StatusCode.UNAVAILABLE:
                # No gateway answers right now (one restarting): the page tries again, with back-off.
                await ws.close(code=CLOSE_TRY_AGAIN, message=b"the gateway is away: resuming")
                return
            await _send_error(ws, exc.code().name, exc.details() or exc.code().name)
            return
        # Frames are acknowledged once written to the socket: a page that reads slowly holds the gateway
        # back by ACK_WINDOW_S, and the worker drops the oldest for it and goes on from the live edge
        # (docs/decisions.md, "Live readers acknowledge frames"), rather than gRPC's buffers between
        # bridge and gateway filling with the past.
        converse.ack_window = math.ceil(ACK_WINDOW_S * (session.video.fps or 25.0))
        announce = {
            "type": "session",
            "session": json_format.MessageToDict(
                session, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
            ),
        }
        keep = True  # until the stream ends in a way that says the page is done with the session
        try:
            keep = await self._converse(ws, converse, metadata, announce, resuming=start["type"] == "resume")
        finally:
            if not keep and not self.stopping:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                    await asyncio.shield(
                        stub.CloseSession(
                            session_pb2.CloseSessionRequest(session_id=session.id), metadata=metadata, timeout=10.0
                        )
                    )

    async def _converse(
        self,
        ws: web.WebSocketResponse,
        start: session_pb2.ConverseStart,
        metadata: Any,
        announce: dict[str, Any],
        resuming: bool,
    ) -> bool:
        """Bridge the socket and the Converse stream until either ends; whether the session should be
        kept for a resume (the socket dropped without a close frame, another stream took it over, the
        gateway went away, or a resume was refused: a wrong token or an ended session is not this
        socket's to close). `announce` (the session message) goes to the page once the stream has
        answered, so a page never takes a refused resume for a resumed session."""
        up: asyncio.Queue[session_pb2.ConverseRequest | None] = asyncio.Queue(UP_QUEUE)

        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield session_pb2.ConverseRequest(start=start)
            while (request := await up.get()) is not None:
                yield request

        call = stream_call(self.gateway.stub.Converse, requests(), metadata=metadata)
        reader = asyncio.create_task(self._read_page(ws, up))
        reader.add_done_callback(lambda _: call.cancel())  # the page went away: end the stream
        keep = announced = False
        try:
            async for response in call:
                if not announced:
                    await ws.send_json(announce)
                    announced = True
                    if resuming:
                        self.metrics.web_live_resumed.inc()
                message = response_message(response)
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                    await up.put(session_pb2.ConverseRequest(ack=session_pb2.FrameAck(frame=response.frame.index)))
                else:
                    await ws.send_json(message)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ABORTED:
                keep = True  # a resume through another socket took the session over: it is that one's now
            elif exc.code() == grpc.StatusCode.UNAVAILABLE and not reader.done():
                keep = True  # the gateway went away (a pod replaced): the page resumes through another
                await ws.close(code=CLOSE_TRY_AGAIN, message=b"the gateway went away: resuming")
            elif resuming and not announced:
                keep = True
                await _send_error(ws, exc.code().name, exc.details() or exc.code().name)
            elif exc.code() != grpc.StatusCode.CANCELLED or not reader.done():
                await _send_error(ws, exc.code().name, exc.details() or exc.code().name)
        except ConnectionResetError:
            # The socket went mid-send: the page closed it (a close frame) or the connection dropped.
            # Only the reader knows which: let it finish before it is cancelled (a close frame would
            # have been read by now: a reader still waiting means a drop).
            await asyncio.wait({reader}, timeout=READER_END_S)
            keep = not reader.done()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this handler is being cancelled (the server stops): not the stream's end
            # else the stream was cancelled here, when the reader ended: the reader says how
        finally:
            reader.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        if not reader.done() or reader.cancelled() or reader.exception() is not None:
            return keep  # ended by the stream: the session ended, or the page's side never said how
        return keep or reader.result()

    async def _read_page(self, ws: web.WebSocketResponse, up: asyncio.Queue) -> bool:
        """The page's messages onto the Converse stream until the socket ends; whether it dropped
        (no close frame from the page: keep the session for a resume) or the page closed it, or sent
        a message this bridge cannot read (the socket ends with an error saying which)."""
        dropped = True
        while True:
            message = await ws.receive()
            if message.type == WSMsgType.BINARY:
                await up.put(session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=message.data)))
            elif message.type == WSMsgType.TEXT:
                try:
                    kind = json.loads(message.data).get("type")
                except (ValueError, AttributeError):
                    kind = None
                if kind == "clear":
                    await up.put(session_pb2.ConverseRequest(clear=session_pb2.Clear()))
                elif kind == "end":
                    await up.put(session_pb2.ConverseRequest(end_of_utterance=session_pb2.EndOfUtterance()))
                else:
                    await _send_error(
                        ws, "INVALID_ARGUMENT", 'messages are PCM (binary), {"type": "clear"} or {"type": "end"}'
                    )
                    dropped = False
                    break
            elif message.type == WSMsgType.CLOSE:
                dropped = False  # the page's close frame: Stop, or the page left
                break
            else:  # CLOSING or CLOSED (the connection ended without a close frame, or is ending), or ERROR
                if message.type == WSMsgType.ERROR:
                    _LOGGER.info("live WebSocket failed", extra={"error": str(ws.exception())})
                    # The page broke the protocol (a message over max_live_message_bytes: 1009); a
                    # connection that failed is a drop.
                    dropped = not isinstance(message.data, WebSocketError)
                break
        await up.put(None)
        return dropped


async def _send_error(ws: web.WebSocketResponse, code: str, message: str) -> None:
    if ws.closed:
        return
    with contextlib.suppress(ConnectionResetError):
        await ws.send_json({"type": "error", "code": code, "message": message})
        await ws.close(code=CLOSE_REFUSED, message=code.encode()[:120])
