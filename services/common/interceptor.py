"""The one error funnel of every lipline server, plus per-RPC metrics, request ids and trace spans.

Handlers raise plain exceptions (services.common.errors); this interceptor turns them into a gRPC
status with an actionable message, counts the RPC, and keeps tracebacks in the log, never on the
wire. It also answers UNAVAILABLE while the service is still loading its models.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common import tracing
from services.common.errors import LiplineError
from services.common.metrics import Metrics

_LOGGER = logging.getLogger(__name__)
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
_ALWAYS_OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics, ready: asyncio.Event) -> None:
        self._metrics = metrics
        self._ready = ready

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_ALWAYS_OPEN):
            return handler
        method = details.method.rsplit("/", 1)[-1]
        metadata = dict(details.invocation_metadata or ())
        if handler.response_streaming:
            behavior = handler.unary_stream or handler.stream_stream
            wrapped = self._wrap_streaming(method, metadata, behavior)
        else:
            behavior = handler.unary_unary or handler.stream_unary
            wrapped = self._wrap_unary(method, metadata, behavior)
        factory = {
            (False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler,
        }[(handler.request_streaming, handler.response_streaming)]
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_unary(self, method: str, metadata: dict[str, Any], behavior: Callable) -> Callable:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _Call(self, method, metadata, context)
            with call:
                await call.check_ready()
                try:
                    return await behavior(request, context)
                except BaseException as exc:  # noqa: BLE001 - funnel: every failure gets a status
                    await call.fail(exc)

        return wrapper

    def _wrap_streaming(self, method: str, metadata: dict[str, Any], behavior: Callable) -> Callable:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _Call(self, method, metadata, context)
            with call:
                await call.check_ready()
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:  # noqa: BLE001
                    await call.fail(exc)

        return wrapper


class _Call:
    """Book-keeping of one RPC: request id, span, timing and the final status code."""

    def __init__(
        self, owner: ServerInterceptor, method: str, metadata: dict[str, Any], context: grpc.aio.ServicerContext
    ) -> None:
        self.owner, self.method, self.context = owner, method, context
        self.code = grpc.StatusCode.OK
        self.request_id = str(metadata.get("x-request-id") or uuid.uuid4().hex[:16])
        self._span_cm = tracing.server_span(f"{owner._metrics.stage}/{method}", metadata)

    def __enter__(self) -> _Call:
        self._token = REQUEST_ID.set(self.request_id)
        self._start = time.perf_counter()
        self._span = self._span_cm.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        m = self.owner._metrics
        m.requests.labels(m.stage, self.method, self.code.name).inc()
        m.request_seconds.labels(m.stage, self.method).observe(time.perf_counter() - self._start)
        tracing.set_status(self._span, self.code)
        self._span_cm.__exit__(None, None, None)
        REQUEST_ID.reset(self._token)

    async def check_ready(self) -> None:
        if not self.owner._ready.is_set():
            self.code = grpc.StatusCode.UNAVAILABLE
            await self.context.abort(self.code, f"{self.owner._metrics.stage} is still loading its models; retry shortly")

    async def fail(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            self.code = grpc.StatusCode.CANCELLED
            raise exc
        if isinstance(exc, LiplineError):
            self.code = exc.code
            _LOGGER.info(
                "%s failed: %s", self.method, exc, extra={"request_id": self.request_id, "code": self.code.name}
            )
            await self.context.abort(self.code, str(exc))
        if isinstance(exc, grpc.aio.AbortError):
            # The handler aborted by itself (context.abort raises AbortError); keep its status.
            code = self.context.code()
            self.code = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN
            raise exc
        self.code = grpc.StatusCode.INTERNAL
        _LOGGER.exception("%s crashed", self.method, extra={"request_id": self.request_id})
        await self.context.abort(
            self.code, f"internal error in {self.method} (request id {self.request_id}); the server log has details"
        )
