"""The web page's HTTP server: the page and its static files, a small JSON API over the gateway, the live WebSocket.

Browsers cannot speak gRPC streams, so each page action is one HTTP request that this server turns
into gateway calls (services/web/gateway_link.py), made with the API key the page sends in the
`X-Api-Key` header: never in a URL (URLs end up in access logs and browser history), never logged.
Nothing is kept between requests: avatars and jobs live behind the gateway, the key in the
browser's session storage.

Routes (docs/architecture.md section 11):

    GET    /                         the page (services/web/static/index.html)
    GET    /static/...               its scripts and styles (no build step, nothing from a CDN)
    GET    /api/config               the limits the page shows before an upload (no key needed)
    GET    /api/avatars              ListAvatars
    POST   /api/avatars?name=        CreateAvatar, the request body streamed through in 1 MiB pieces
    DELETE /api/avatars/{id}         DeleteAvatar
    POST   /api/jobs?avatar_id=&super_resolution=&loop=   SubmitJob with the body as the audio file
    GET    /api/jobs/{id}            GetJob
    GET    /api/jobs/{id}/watch      WatchJob as NDJSON, one job per line (fetch() streams it)
    GET    /api/jobs/{id}/output     DownloadOutput as video/mp4
    GET    /api/live                 the live session's WebSocket (services/web/live_bridge.py)

A gateway status becomes an HTTP status with the gateway's own message in a JSON body
(`{"error": ..., "code": "UNAUTHENTICATED"}`): what the page shows. Once a streamed answer has
started (its status and headers sent), nothing else is: a failure from then on cuts the connection
before the body's end (`cut_transfer`), so the client sees a failed transfer and never a second
response on its connection. Every response carries SECURITY_HEADERS (a strict Content-Security-Policy
the page works under: no inline script or style, nothing from another origin, no framing).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from lipline.v1 import gateway_pb2
from services.serving.metrics import Metrics
from services.serving.streams import stream_call
from services.web.gateway_link import GatewayLink, http_status, key_metadata
from services.web.live_bridge import LiveBridge
from services.web.origins import hosts_of, local_port, own_origins
from services.web.settings import WebSettings

_LOGGER = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
#: the request header that carries the page user's API key (the gateway's x-api-key metadata)
KEY_HEADER = "X-Api-Key"
UPLOAD_PIECE = 1 << 20  # CreateAvatar's pieces, as services/gateway/client.py sends them
LOOP_MODES = {"ping_pong": gateway_pb2.JobOptions.PING_PONG, "wrap": gateway_pb2.JobOptions.WRAP}
#: routes by name for the metrics label (bounded: never the raw path, which holds ids)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: The page's Content-Security-Policy: its scripts, styles and worklet come from /static (no inline
#: code, no eval); pictures and media from blob: (the MP4, a file being uploaded) and data: (the
#: thumbnails kept in localStorage); its calls and its WebSocket go to its own origin only ('self'
#: covers ws:/wss: to it, CSP Level 3); no plugin, no <base>, no form posted anywhere, no framing.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' blob: data:",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "worker-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
#: On every response (the page, its files, the API, the WebSocket's handshake, errors).
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors 'none' for browsers without CSP Level 2
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
#: the response a handler has prepared (its status line and headers are on their way to the client)
PREPARED = web.RequestKey("prepared_response", web.StreamResponse)
#: the HTTP status a cut transfer is counted as (the metrics label; the client saw 200 and a short body)
CUT_STATUS = web.RequestKey("cut_status", int)


def to_json(message: Message) -> dict[str, Any]:
    """A proto message as the page reads it: field names as in the proto, enums by name, zeros kept."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def error_response(status: int, message: str, code: str = "") -> web.Response:
    return web.json_response({"error": message, "code": code}, status=status)


def api_key(request: web.Request) -> str:
    return request.headers.get(KEY_HEADER, "").strip()


def cut_transfer(request: web.Request, response: web.StreamResponse, status: int) -> web.StreamResponse:
    """End a prepared response as a failed transfer: the connection closes after what was already
    written, before the body's end (short of its Content-Length, or no chunked terminator), so a
    browser or client reports the download failed; nothing more is written on the connection (aiohttp's
    end of the response finds it closing). `status` is what the request is counted as. Returns the
    response, for the handler to return."""
    response.force_close()
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then closes: no terminator, no next response
    request[CUT_STATUS] = status
    return response


class WebApp:
    """The aiohttp application of one web server process; `build()` returns it."""

    def __init__(self, settings: WebSettings, gateway: GatewayLink, metrics: Metrics) -> None:
        self.settings = settings
        self.gateway = gateway
        self.metrics = metrics
        self.live = LiveBridge(settings, gateway, metrics)

    def build(self) -> web.Application:
        # client_max_size bounds the bodies aiohttp would buffer; the uploads are streamed (request.content)
        # and bounded by the gateway's limits below, so they are not buffered at all.
        app = web.Application(middlewares=[self._observe, self._require_key], client_max_size=1 << 20)
        app.on_response_prepare.append(self._on_prepare)
        app.router.add_get("/", self.page, name="page")
        app.router.add_static("/static/", STATIC, name="static", append_version=False)
        app.router.add_get("/api/config", self.config, name="config")
        app.router.add_get("/api/avatars", self.list_avatars, name="list_avatars")
        app.router.add_post("/api/avatars", self.create_avatar, name="create_avatar")
        app.router.add_delete("/api/avatars/{avatar_id}", self.delete_avatar, name="delete_avatar")
        app.router.add_post("/api/jobs", self.submit_job, name="submit_job")
        app.router.add_get("/api/jobs/{job_id}", self.get_job, name="get_job")
        app.router.add_get("/api/jobs/{job_id}/watch", self.watch_job, name="watch_job")
        app.router.add_get("/api/jobs/{job_id}/output", self.download_output, name="download_output")
        app.router.add_get("/api/live", self.live.handle, name="live")
        app.on_shutdown.append(self.live.shutdown)
        return app

    # -- middlewares ------------------------------------------------------------------------------
    @staticmethod
    async def _on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        """Every response, as its headers are about to go: the security headers, and a note that this
        request's answer has started (after which an error can only cut it, never answer again)."""
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        request[PREPARED] = response

    @web.middleware
    async def _observe(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """lipline_requests_total / lipline_request_seconds with the route's name as the method label
        (bounded), and any unexpected error as a 500 with a message instead of a traceback; an error
        after the handler's response has started cuts that response (`cut_transfer`) instead: a second
        response on the connection would be read as the answer to the client's next request."""
        route = request.match_info.route.name or "unknown"
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = request.get(CUT_STATUS, response.status)
            return response
        except web.HTTPException as exc:
            status = exc.status
            if (sent := request.get(PREPARED)) is None:
                raise
            _LOGGER.warning("request failed after its answer started", extra={"route": route, "status": status})
            return cut_transfer(request, sent, status)
        except Exception:
            _LOGGER.exception("request failed", extra={"route": route})
            if (sent := request.get(PREPARED)) is not None:
                return cut_transfer(request, sent, 500)
            return error_response(500, "the web server failed on this request; its log has the details", "INTERNAL")
        finally:
            self.metrics.requests.labels("web", route, str(status)).inc()
            self.metrics.request_seconds.labels("web", route).observe(time.perf_counter() - started)

    @web.middleware
    async def _require_key(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every API call but /api/config needs the key header (the WebSocket sends it in its first message).
        Without keys (local mode) nothing guards the API but where it is asked: only requests whose
        Host names one of the page's own origins, so a DNS-rebinding page (its own name) is refused."""
        path = request.path
        if not path.startswith("/api/"):
            return await handler(request)
        s = self.settings
        if s.require_api_key:
            if path not in {"/api/config", "/api/live"} and not api_key(request):
                return error_response(
                    401, "this page needs an API key: enter yours in the API key field", "UNAUTHENTICATED"
                )
        elif request.host.lower() not in hosts_of(own_origins(s.public_origins, local_port(request, s.http_port))):
            return error_response(
                403,
                f"without API keys this server answers its API only at the page's own address, not at {request.host!r} "
                "(public_origins)",
                "PERMISSION_DENIED",
            )
        return await handler(request)

    # -- page -------------------------------------------------------------------------------------
    async def page(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def config(self, request: web.Request) -> web.Response:
        s = self.settings
        return web.json_response(
            {
                "require_api_key": s.require_api_key,
                "max_avatar_bytes": s.max_avatar_bytes,
                "max_audio_bytes": s.max_audio_bytes,
            }
        )

    # -- avatars ----------------------------------------------------------------------------------
    async def list_avatars(self, request: web.Request) -> web.Response:
        reply = await self._call(request, self.gateway.stub.ListAvatars, gateway_pb2.ListAvatarsRequest())
        return web.json_response(to_json(reply))

    async def create_avatar(self, request: web.Request) -> web.StreamResponse:
        limit = self.settings.max_avatar_bytes
        too_big = self._too_big(request, limit, "avatar upload")
        if too_big is not None:
            return too_big
        name = request.query.get("name", "")[:200]
        try:
            photo_fps = float(request.query.get("photo_fps", "0") or 0)
        except ValueError:
            return error_response(400, "photo_fps must be a number of frames per second", "INVALID_ARGUMENT")
        received = 0
        over = False

        async def pieces() -> AsyncIterator[gateway_pb2.CreateAvatarRequest]:
            nonlocal received, over
            first = True
            async for piece in _read_pieces(request):
                received += len(piece)
                if received > limit:
                    over = True
                    return  # the call then ends with the gateway's own complaint, replaced below
                yield gateway_pb2.CreateAvatarRequest(
                    name=name if first else "", photo_fps=photo_fps if first else 0.0, data=piece
                )
                first = False

        try:
            avatar = await stream_call(  # a failed read of the body is raised as itself
                self.gateway.stub.CreateAvatar,
                pieces(),
                metadata=key_metadata(api_key(request)),
                timeout=self.settings.call_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if over:
                return _limit_response("avatar upload", limit)
            return _status_response(exc)
        if over:
            return _limit_response("avatar upload", limit)
        return web.json_response(to_json(avatar))

    async def delete_avatar(self, request: web.Request) -> web.Response:
        await self._call(
            request,
            self.gateway.stub.DeleteAvatar,
            gateway_pb2.DeleteAvatarRequest(avatar_id=request.match_info["avatar_id"]),
        )
        return web.json_response({})

    # -- jobs -------------------------------------------------------------------------------------
    async def submit_job(self, request: web.Request) -> web.StreamResponse:
        limit = self.settings.max_audio_bytes
        too_big = self._too_big(request, limit, "audio file")
        if too_big is not None:
            return too_big
        loop = request.query.get("loop", "ping_pong").lower()
        if loop not in LOOP_MODES:
            return error_response(400, f"loop must be one of {', '.join(LOOP_MODES)}, got {loop!r}", "INVALID_ARGUMENT")
        avatar_id = request.query.get("avatar_id", "")
        if not avatar_id:
            return error_response(400, "pick an avatar first (avatar_id is empty)", "INVALID_ARGUMENT")
        chunks, size = [], 0
        async for piece in _read_pieces(request):
            size += len(piece)
            if size > limit:
                return _limit_response("audio file", limit)
            chunks.append(piece)
        options = gateway_pb2.JobOptions(
            super_resolution=request.query.get("super_resolution", "").lower() in {"1", "true", "on", "yes"},
            loop=LOOP_MODES[loop],
        )
        job = await self._call(
            request,
            self.gateway.stub.SubmitJob,
            gateway_pb2.SubmitJobRequest(avatar_id=avatar_id, audio=b"".join(chunks), options=options),
        )
        return web.json_response(to_json(job))

    async def get_job(self, request: web.Request) -> web.Response:
        job = await self._call(
            request, self.gateway.stub.GetJob, gateway_pb2.GetJobRequest(job_id=request.match_info["job_id"])
        )
        return web.json_response(to_json(job))

    async def watch_job(self, request: web.Request) -> web.StreamResponse:
        """WatchJob as NDJSON: one job per line; a status that ends the stream early is a last
        line `{"error": ..., "code": ...}` (the headers are sent by then)."""
        call = self.gateway.stub.WatchJob(
            gateway_pb2.WatchJobRequest(job_id=request.match_info["job_id"]),
            metadata=key_metadata(api_key(request)),
        )
        response: web.StreamResponse | None = None
        try:
            async for event in call:
                if response is None:
                    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                    await response.prepare(request)
                await response.write(json.dumps(to_json(event.job)).encode() + b"\n")
        except grpc.aio.AioRpcError as exc:
            if response is None:
                return _status_response(exc)
            line = {"error": exc.details() or exc.code().name, "code": exc.code().name}
            await response.write(json.dumps(line).encode() + b"\n")
        finally:
            call.cancel()
        if response is None:
            return error_response(502, "the gateway's WatchJob ended without an event", "UNKNOWN")
        await response.write_eof()
        return response

    async def download_output(self, request: web.Request) -> web.StreamResponse:
        """DownloadOutput streamed through, one gateway chunk (1 MiB) behind: the gateway checks the
        output's sha256 as it reads and ends the call DATA_LOSS after its last chunk when the stored
        bytes are damaged (services/jobs/integrity.py), so the last chunk is written only once the call
        has ended OK. A damaged output that fits in one chunk is then answered 502 DATA_LOSS before any
        byte; a longer one is cut short of its Content-Length (`cut_transfer`), never completed."""
        job_id = request.match_info["job_id"]
        call = self.gateway.stub.DownloadOutput(
            gateway_pb2.DownloadOutputRequest(job_id=job_id), metadata=key_metadata(api_key(request))
        )
        response: web.StreamResponse | None = None
        held: bytes | None = None  # the latest chunk, written once the next one (or the call's OK) comes
        total = 0
        try:
            async for chunk in call:
                total = total or chunk.total_bytes
                if held is not None:
                    if response is None:
                        response = await self._start_download(request, job_id, total)
                    await response.write(held)
                held = chunk.data
        except grpc.aio.AioRpcError as exc:
            if response is None:
                return _status_response(exc)
            _LOGGER.warning(
                "download cut: the gateway ended DownloadOutput mid-stream",
                extra={"job_id": job_id, "code": exc.code().name, "error": exc.details()},
            )
            return cut_transfer(request, response, http_status(exc.code()))
        finally:
            call.cancel()
        if held is None:
            return error_response(502, "the gateway sent no output", "UNKNOWN")
        if response is None:
            response = await self._start_download(request, job_id, total)
        await response.write(held)
        await response.write_eof()
        return response

    @staticmethod
    async def _start_download(request: web.Request, job_id: str, total_bytes: int) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "video/mp4",
                "Content-Disposition": f'attachment; filename="{_safe_name(job_id)}.mp4"',
            }
        )
        if total_bytes:
            response.content_length = total_bytes
        await response.prepare(request)
        return response

    # -- helpers ----------------------------------------------------------------------------------
    async def _call(self, request: web.Request, method: Any, message: Message) -> Any:
        try:
            return await method(message, metadata=key_metadata(api_key(request)), timeout=self.settings.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _StatusError(exc) from None

    @staticmethod
    def _too_big(request: web.Request, limit: int, what: str) -> web.Response | None:
        """413 at once when the declared length is over the limit (the body is then never read)."""
        if request.content_length is not None and request.content_length > limit:
            return _limit_response(what, limit)
        return None


class _StatusError(web.HTTPException):
    """A gateway status raised out of a handler, answered as its HTTP status with the gateway's message."""

    def __init__(self, exc: grpc.aio.AioRpcError) -> None:
        self.status_code = http_status(exc.code())
        super().__init__(
            text=web.json_response({"error": exc.details() or exc.code().name, "code": exc.code().name}).text,
            content_type="application/json",
        )


def _status_response(exc: grpc.aio.AioRpcError) -> web.Response:
    return error_response(http_status(exc.code()), exc.details() or exc.code().name, exc.code().name)


def _limit_response(what: str, limit: int) -> web.Response:
    return error_response(
        413, f"the {what} is larger than the limit of {_mib(limit)} (the gateway's): use a smaller file", "OUT_OF_RANGE"
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n} bytes"


def _safe_name(text: str) -> str:
    return "".join(c for c in text if c.isalnum() or c in "-_")[:80] or "output"


async def _read_pieces(request: web.Request) -> AsyncIterator[bytes]:
    """The request body in pieces of up to UPLOAD_PIECE bytes, as they arrive."""
    buffer = bytearray()
    async for data in request.content.iter_chunked(UPLOAD_PIECE):
        buffer += data
        while len(buffer) >= UPLOAD_PIECE:
            yield bytes(buffer[:UPLOAD_PIECE])
            del buffer[:UPLOAD_PIECE]
    if buffer:
        yield bytes(buffer)
