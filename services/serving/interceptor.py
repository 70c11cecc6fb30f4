"""The one error funnel of every lipline server, plus per-RPC metrics, request ids and trace spans.

Handlers raise plain exceptions (services.serving.errors); this interceptor turns them into a gRPC
status with an actionable message, counts the RPC, and keeps tracebacks in the log, never on the
wire. It also answers UNAVAILABLE while the service is still loading its models.

It also caps concurrent RPCs (`RpcLimits`): in all (`max_concurrent_streams`) and per client
(`max_streams_per_client`). An RPC counts from its start to its end: a streaming response until the
handler's last message or its cancellation. Health checks and reflection are never counted nor
refused, so that no client's idle streams can make a probe, or another client's call, fail. Over
a cap the call ends RESOURCE_EXHAUSTED at once, with trailing metadata `retry-after-ms` (a hint).

Authentication (services.serving.auth.Auth) runs first, health and reflection exempt.

Tenants (services.serving.tenants): with API keys on, each key belongs to a tenant (the keys file's
`tenant/name:key` lines; a `name:key` line is its own tenant, "name"); without keys every call is the
implicit tenant. Handlers read it from `TENANT` and find only that tenant's objects.

The client is identified by its API key's TENANT when API keys are on ("tenant:<tenant>": a tenant
with five keys gets one share of the per-client caps, not five); without them, by its `x-api-key`
metadata when it sends one (unauthenticated: the value is the identity, "key:<value>"), else by the
peer's IP address ("ip:<addr>"; every connection from one host is one client). Handlers read it from
`CLIENT_ID`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.serving import tracing
from services.serving.auth import API_KEY_HEADER, MAX_API_KEY_CHARS, Auth
from services.serving.errors import RETRY_AFTER_HEADER, LiplineError
from services.serving.metrics import Metrics
from services.serving.tenants import IMPLICIT_TENANT, tenant_of_key

_LOGGER = logging.getLogger(__name__)
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
CLIENT_ID: contextvars.ContextVar[str] = contextvars.ContextVar("client_id", default="")
#: the caller's tenant, set once the call is admitted ("" before: handlers refuse to run without one)
TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant", default="")
_ALWAYS_OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")
RETRY_AFTER_MS = 1000  # the hint in `retry-after-ms` when a cap refuses a call


def client_identity(metadata: dict[str, Any], peer: str) -> str:
    """ "key:<x-api-key>" when the call carries one, else "ip:<address>" of `peer` (gRPC's
    "ipv4:1.2.3.4:5678", "ipv6:[::1]:5678", possibly percent-encoded); other peers as they are.

    Raises:
        ValueError: an `x-api-key` that is empty, longer than MAX_API_KEY_CHARS or not printable ASCII.
    """
    key = metadata.get(API_KEY_HEADER)
    if key is not None:
        key = key.decode("ascii", "replace") if isinstance(key, bytes) else str(key)
        if not (0 < len(key) <= MAX_API_KEY_CHARS and key.isascii() and key.isprintable()):
            raise ValueError(f"the {API_KEY_HEADER} metadata must be 1..{MAX_API_KEY_CHARS} printable ASCII characters")
        return f"key:{key}"
    peer = urllib.parse.unquote(peer or "")
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and address:
        host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
        return f"ip:{host.strip('[]')}"
    return peer or "unknown"


class RpcLimits:
    """Counts concurrent RPCs in all and per client; `acquire` refuses over a cap (<= 0: no cap).

    Used from the server's event loop only (no locks): a check and its increment never interleave."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.total = 0
        self.per_client: dict[str, int] = {}

    def acquire(self, client: str) -> str | None:
        """Count one RPC of `client` and return None, or return why it is refused (nothing counted)."""
        mine = self.per_client.get(client, 0)
        if 0 < self.max_per_client <= mine:
            return (
                f"this client ({client}) already has {mine} calls in progress, the limit per client "
                f"(max_streams_per_client {self.max_per_client}); close some streams or retry later"
            )
        if 0 < self.max_total <= self.total:
            return f"the server has {self.total} calls in progress, its limit (max_concurrent_streams {self.max_total}); retry later or on another replica"
        self.total += 1
        self.per_client[client] = mine + 1
        return None

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.per_client.get(client, 0) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self, metrics: Metrics, ready: asyncio.Event, limits: RpcLimits | None = None, auth: Auth | None = None
    ) -> None:
        self._metrics = metrics
        self._ready = ready
        self.limits = limits or RpcLimits(0, 0)
        self.auth = auth or Auth()

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
                await call.authenticate()
                await call.check_ready()
                await call.admit()
                try:
                    return await behavior(request, context)
                except BaseException as exc:  # noqa: BLE001 - funnel: every failure gets a status
                    await call.fail(exc)

        return wrapper

    def _wrap_streaming(self, method: str, metadata: dict[str, Any], behavior: Callable) -> Callable:
        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _Call(self, method, metadata, context)
            with call:
                await call.authenticate()
                await call.check_ready()
                await call.admit()
                try:
                    async for response in behavior(request, context):
                        yield response
                except GeneratorExit:
                    # gRPC stopped taking responses (the client cancelled or went away) and closes the
                    # generator at its yield: a cancel, with nothing left to send a status on.
                    call.code = grpc.StatusCode.CANCELLED
                    raise
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
        self.metadata = metadata
        self.client = ""
        self.key_name = ""
        self.tenant = ""
        self._admitted = False
        self._span_cm = tracing.server_span(f"{owner._metrics.stage}/{method}", metadata)

    def __enter__(self) -> _Call:
        self._token = REQUEST_ID.set(self.request_id)
        self._client_token = CLIENT_ID.set("")
        self._tenant_token = TENANT.set("")
        self._start = time.perf_counter()
        self._span = self._span_cm.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._admitted:
            self._admitted = False
            self.owner.limits.release(self.client)
        m = self.owner._metrics
        m.requests.labels(m.stage, self.method, self.code.name).inc()
        m.request_seconds.labels(m.stage, self.method).observe(time.perf_counter() - self._start)
        tracing.set_status(self._span, self.code)
        self._span_cm.__exit__(None, None, None)
        # A streaming handler's generator may be closed from another context (its finaliser, after the
        # client went away): the tokens belong to the handler's context, which is gone with it.
        with contextlib.suppress(ValueError):
            TENANT.reset(self._tenant_token)
            CLIENT_ID.reset(self._client_token)
            REQUEST_ID.reset(self._token)

    async def check_ready(self) -> None:
        if not self.owner._ready.is_set():
            self.code = grpc.StatusCode.UNAVAILABLE
            await self.context.abort(
                self.code, f"{self.owner._metrics.stage} is still loading its models; retry shortly"
            )

    async def authenticate(self) -> None:
        """End the call UNAUTHENTICATED unless its metadata passes the service's Auth."""
        if not self.owner.auth.enabled:
            return
        try:
            self.key_name = self.owner.auth.authenticate(self.metadata)
        except PermissionError as exc:
            self.code = grpc.StatusCode.UNAUTHENTICATED
            _LOGGER.info(
                "%s refused: %s",
                self.method,
                exc,
                extra={"request_id": self.request_id, "code": self.code.name, "peer": self.context.peer()},
            )
            await self.context.abort(self.code, str(exc))

    async def admit(self) -> None:
        """Identify the tenant and the client and count the call against the caps, or end it
        RESOURCE_EXHAUSTED. With API keys the client is the key's tenant (its keys share its caps)."""
        self.tenant = tenant_of_key(self.key_name) if self.key_name else IMPLICIT_TENANT
        try:
            self.client = (
                f"tenant:{self.tenant}" if self.key_name else client_identity(self.metadata, self.context.peer())
            )
        except ValueError as exc:
            self.code = grpc.StatusCode.UNAUTHENTICATED
            await self.context.abort(self.code, str(exc))
        CLIENT_ID.set(self.client)
        TENANT.set(self.tenant)
        refusal = self.owner.limits.acquire(self.client)
        if refusal is not None:
            self.code = grpc.StatusCode.RESOURCE_EXHAUSTED
            _LOGGER.info(
                "%s refused: %s", self.method, refusal, extra={"request_id": self.request_id, "code": self.code.name}
            )
            await self.context.abort(self.code, refusal, trailing_metadata=((RETRY_AFTER_HEADER, str(RETRY_AFTER_MS)),))
        self._admitted = True

    async def fail(self, exc: BaseException) -> None:
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is None or task.cancelling():  # this RPC was cancelled (its client went, the server stops)
                self.code = grpc.StatusCode.CANCELLED
                raise exc
            # Nobody cancelled this RPC: a call the handler made was cancelled under it (gRPC cancels a
            # call whose request iterator raised; services.serving.streams.request_stream raises that
            # error instead). Sent on, it would end the RPC without a status, the client waiting until
            # its deadline: it is a bug, answered INTERNAL below.
        if isinstance(exc, LiplineError):
            self.code = exc.code
            _LOGGER.info(
                "%s failed: %s", self.method, exc, extra={"request_id": self.request_id, "code": self.code.name}
            )
            await self.context.abort(self.code, str(exc), trailing_metadata=exc.trailing_metadata())
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
