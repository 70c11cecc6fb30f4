"""The live session's WebSocket: one per page session, bridged to the gateway's CreateSession and Converse.

A browser cannot open a gRPC bidi stream, and WebRTC needs UDP and TURN through the cluster's way
in; one WebSocket over the page's own origin goes through any HTTP ingress. The protocol:

page -> server
    text   {"type": "start", "api_key", "avatar_id", "codec": "h264"|"jpeg", "sample_rate", "max_height"}
           first, within START_TIMEOUT_S (the key travels here, never in the URL)
    binary one PCM chunk, s16le mono at the session's rate (10-100 ms)
    text   {"type": "clear"} (barge-in) or {"type": "end"} (EndOfUtterance)
server -> page
    text   {"type": "session", "session": Session}, {"type": "ready", "next_frame"},
           {"type": "event", ...SessionEvent}, {"type": "stats", ...SessionStats},
           {"type": "error", "code", "message"} (then the socket closes)
    binary one frame: uint32 LE n, n bytes of JSON {index, keyframe, speech, utterance, video_bytes},
           the frame's data (an H.264 access unit or a JPEG), then its re-timed PCM

The socket's end closes the session (CloseSession): the page keeps no resume token. Frames are
sent as the gateway's stream yields them and each send waits for the socket to drain, so a slow
page slows the Converse stream and the live worker drops frames for it (counted there), as for any
slow gRPC reader. Only same-origin pages (or `allowed_origins`) may open it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import grpc
from aiohttp import WSMsgType, web
from google.protobuf import json_format

from lipline.v1 import session_pb2
from services.serving.metrics import Metrics
from services.web.gateway_link import GatewayLink, key_metadata
from services.web.settings import WebSettings

_LOGGER = logging.getLogger(__name__)
START_TIMEOUT_S = 10.0
CODECS = {"h264": session_pb2.VIDEO_CODEC_H264, "jpeg": session_pb2.VIDEO_CODEC_JPEG}
UP_QUEUE = 100  # messages from the page waiting for the gateway: 2 s of 20 ms chunks
#: WebSocket close codes of the application range (4000-4999), by what went wrong
CLOSE_REFUSED = 4400
CLOSE_ENDED = 4000


class StartError(ValueError):
    """The page's first message is not a start message the bridge can act on."""


def parse_start(text: str) -> dict[str, Any]:
    """The start message's fields, checked; StartError says what to fix."""
    try:
        start = json.loads(text)
    except ValueError:
        raise StartError('the first message must be JSON: {"type": "start", ...}') from None
    if not isinstance(start, dict) or start.get("type") != "start":
        raise StartError('the first message must be {"type": "start", "api_key", "avatar_id", ...}')
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
        "api_key": str(start.get("api_key", "")).strip(),
        "avatar_id": start["avatar_id"],
        "codec": CODECS[codec],
        "sample_rate": rate,
        "max_height": max_height,
    }


def same_origin(request: web.Request, allowed: tuple[str, ...]) -> bool:
    """The page that opens the socket was served from this host (or is listed): a browser always sends
    Origin on a WebSocket, and a page of another site must not drive a session with its visitor's key."""
    origin = request.headers.get("Origin", "")
    if not origin:
        return False
    if origin in allowed:
        return True
    return urlsplit(origin).netloc.lower() == request.host.lower()


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

    async def shutdown(self, app: web.Application) -> None:
        """Server stopping: close every socket with "going away" (the page says so and can reconnect)."""
        for ws in list(self.sockets):
            await ws.close(code=1001, message=b"the web server is restarting: start the session again")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if not same_origin(request, self.settings.allowed_origins):
            self.metrics.web_live_refused.labels("origin").inc()
            return web.json_response(
                {"error": "the live WebSocket accepts only this page's own origin", "code": "PERMISSION_DENIED"},
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
            session = await stub.CreateSession(
                session_pb2.CreateSessionRequest(
                    avatar_id=start["avatar_id"],
                    audio=session_pb2.AudioFormat(sample_rate=start["sample_rate"]),
                    video=session_pb2.VideoFormat(codec=start["codec"], max_height=start["max_height"]),
                ),
                metadata=metadata,
                timeout=self.settings.call_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            await _send_error(ws, exc.code().name, exc.details() or exc.code().name)
            return
        public = session_pb2.Session()
        public.CopyFrom(session)
        public.ClearField("resume_token")  # the page never needs it: a closed socket closes the session
        await ws.send_json(
            {
                "type": "session",
                "session": json_format.MessageToDict(
                    public, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                ),
            }
        )
        try:
            await self._converse(ws, session, metadata)
        finally:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                await asyncio.shield(
                    stub.CloseSession(
                        session_pb2.CloseSessionRequest(session_id=session.id), metadata=metadata, timeout=10.0
                    )
                )

    async def _converse(self, ws: web.WebSocketResponse, session: session_pb2.Session, metadata: Any) -> None:
        up: asyncio.Queue[session_pb2.ConverseRequest | None] = asyncio.Queue(UP_QUEUE)

        async def requests() -> AsyncIterator[session_pb2.ConverseRequest]:
            yield session_pb2.ConverseRequest(
                start=session_pb2.ConverseStart(session_id=session.id, resume_token=session.resume_token, last_frame=-1)
            )
            while (request := await up.get()) is not None:
                yield request

        call = self.gateway.stub.Converse(requests(), metadata=metadata)
        reader = asyncio.create_task(self._read_page(ws, up))
        reader.add_done_callback(lambda _: call.cancel())  # the page went away: end the stream
        try:
            async for response in call:
                message = response_message(response)
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await ws.send_json(message)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED or not reader.done():
                await _send_error(ws, exc.code().name, exc.details() or exc.code().name)
        except ConnectionResetError:
            pass  # the page closed mid-send
        finally:
            reader.cancel()
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read_page(self, ws: web.WebSocketResponse, up: asyncio.Queue) -> None:
        """The page's messages onto the Converse stream until it closes the socket; a message this
        bridge cannot read ends the socket with an error saying which (the session closes)."""
        async for message in ws:
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
                    break
            elif message.type == WSMsgType.ERROR:
                _LOGGER.info("live WebSocket failed", extra={"error": str(ws.exception())})
                break
        await up.put(None)


async def _send_error(ws: web.WebSocketResponse, code: str, message: str) -> None:
    if ws.closed:
        return
    with contextlib.suppress(ConnectionResetError):
        await ws.send_json({"type": "error", "code": code, "message": message})
        await ws.close(code=CLOSE_REFUSED, message=code.encode()[:120])
