"""Channels to the stage services, as the gateway and the render workers use them.

One aio channel per stage with explicit message limits and client-side round-robin over whatever
the address resolves to (in Kubernetes `dns:///<headless-service>:<port>` lists every ready pod;
`max_connection_age` on the servers makes clients re-resolve after a scale-up).

With an internal token (`internal_token_file`; ServiceRunner puts it in INTERNAL_TOKEN before the
service's `load()` opens its channels) every call on a stage channel carries it as
`x-lipline-internal` metadata (services.serving.auth.INTERNAL_TOKEN_HEADER), added by a client interceptor: the one place, whatever the caller.
Stage channels stay plaintext: inside the cluster the token and the NetworkPolicy guard the stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.serving.auth import INTERNAL_TOKEN_HEADER
from services.serving.errors import LiplineError

_LOGGER = logging.getLogger(__name__)

SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        # Transient UNAVAILABLE (a pod going away mid-scale-down) is retried on another replica.
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }
)


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """gRPC options shared by servers (services.serving.server) and clients: explicit message limits on both ends."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def grpc_target(address: str) -> str:
    """The gRPC target for a stage address setting: the discovery seam.

    - `host:port` -> as is (one replica);
    - `ip1:port1,ip2:port2,...` (a static list of IP addresses, e.g. one replica per local GPU) -> gRPC's
      `ipv4:` (or `ipv6:`) resolver, which hands every address to the round-robin balancer;
    - `dns:///name:port` (a Kubernetes headless Service: every ready pod) or any other scheme -> as is.
    """
    if "," not in address or ":///" in address or address.startswith(("ipv4:", "ipv6:", "unix:")):
        return address
    parts = [a.strip() for a in address.split(",") if a.strip()]
    scheme = "ipv6" if all(p.startswith("[") for p in parts) else "ipv4"
    return f"{scheme}:" + ",".join(parts)


#: the internal token this task's stage channels send ("" = none); set by ServiceRunner from the settings
INTERNAL_TOKEN: contextvars.ContextVar[str] = contextvars.ContextVar("internal_token", default="")


def open_channel(
    address: str,
    max_message_bytes: int,
    internal_token: str | None = None,
    extra_options: Sequence[tuple[str, int]] = (),
) -> grpc.aio.Channel:
    """A channel to a stage; `internal_token` (default: INTERNAL_TOKEN's value) goes on every call;
    `extra_options` are further gRPC channel options (e.g. a shorter reconnect back-off)."""
    options = channel_options(max_message_bytes) + [
        ("grpc.service_config", SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", 30_000),
        *extra_options,
    ]
    token = INTERNAL_TOKEN.get() if internal_token is None else internal_token
    interceptors = _metadata_interceptors(((INTERNAL_TOKEN_HEADER, token),)) if token else None
    return grpc.aio.insecure_channel(grpc_target(address), options=options, interceptors=interceptors)


def _add_metadata(
    details: grpc.aio.ClientCallDetails, extra: tuple[tuple[str, str], ...]
) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()), *extra)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


def _metadata_interceptors(extra: tuple[tuple[str, str], ...]) -> list[grpc.aio.ClientInterceptor]:
    """aio client interceptors (one per call kind) that add `extra` to every call's metadata."""

    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(_add_metadata(details, extra), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return await continuation(_add_metadata(details, extra), request)

    class StreamUnary(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
            return await continuation(_add_metadata(details, extra), requests)

    class StreamStream(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
            return await continuation(_add_metadata(details, extra), requests)

    return [UnaryUnary(), UnaryStream(), StreamUnary(), StreamStream()]


class StageClients:
    """One channel per stage this process calls (the gateway: audio, lipsync; a render worker:
    lipsync, superres), with explicit message limits and round-robin over the stage's replicas."""

    def __init__(self, addresses: dict[str, str], max_message_bytes: int) -> None:
        self.addresses = dict(addresses)
        self.channels = {name: open_channel(addr, max_message_bytes) for name, addr in self.addresses.items()}

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

    async def check(self, stage: str, timeout: float = 2.0) -> bool:
        """True when the stage reports SERVING."""
        stub = health_pb2_grpc.HealthStub(self.channels[stage])
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def wait_serving(self, timeout_s: float, stages: Sequence[str] | None = None) -> None:
        """Wait until every stage (or those of `stages`) is SERVING (start-up); RuntimeError naming the first that is not."""
        deadline = time.monotonic() + timeout_s
        for stage in self.addresses if stages is None else stages:
            while not await self.check(stage):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{stage} stage at {self.addresses[stage]} is not SERVING after {timeout_s:g} s")
                await asyncio.sleep(0.2)
        _LOGGER.info("stages SERVING", extra=self.addresses)


def stage_error_message(stage: str, exc: grpc.aio.AioRpcError) -> str:
    return f"{stage} stage failed ({exc.code().name}): {exc.details()}"


class StageFailed(LiplineError):
    """A stage answered a job's call with an error: keep its status code, name the stage."""

    def __init__(self, stage: str, exc: grpc.aio.AioRpcError) -> None:
        super().__init__(stage_error_message(stage, exc))
        self.code = exc.code()

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES


# A stage call that ended with one of these may work on another try (another replica, later); the
# others say the request itself is wrong, and trying again cannot help.
RETRYABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


@contextlib.asynccontextmanager
async def stage_errors(stage: str) -> AsyncIterator[None]:
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise StageFailed(stage, exc) from exc
