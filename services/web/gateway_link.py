"""The web server's one channel to the gateway, and how a gateway status becomes an HTTP answer.

Every call carries the page user's API key as `x-api-key` metadata (services/serving/auth.py), so the
gateway authenticates, picks the tenant and applies its per-client limits exactly as for any other
client: the web server has no credentials of its own and keeps nothing between requests.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lipline.v1 import gateway_pb2_grpc
from services.serving.auth import API_KEY_HEADER
from services.serving.channels import INTERNAL_TOKEN, channel_options, grpc_target
from services.serving.discovery import DiscoveredChannel, discovery_for

#: the HTTP status a page request gets for each gateway status (the body carries the gateway's message)
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status of a gateway status; anything unlisted (INTERNAL, DATA_LOSS, UNKNOWN) is 502."""
    return HTTP_STATUS.get(code, 502)


def key_metadata(api_key: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries the user's key (none when the page sent none)."""
    return ((API_KEY_HEADER, api_key),) if api_key else ()


class GatewayLink:
    """The channel to the gateway, shared by every request (HTTP/2 multiplexes them).

    Plaintext, it follows the gateway's replicas as every caller of a stage does
    (services/serving/discovery.py: host:port, dns:///, k8s:///, file://). Over TLS it is one
    channel to the address as given (a Service or an ingress in front of the gateways). It never
    carries the internal token: the gateway authenticates the page's user by their API key only.
    """

    def __init__(
        self,
        address: str,
        max_message_bytes: int,
        *,
        tls: bool = False,
        tls_ca_file: str = "",
        tls_server_name: str = "",
    ) -> None:
        self.address = address
        self._tls_channel: grpc.aio.Channel | None = None
        self._discovered: DiscoveredChannel | None = None
        if tls or tls_ca_file or tls_server_name:
            roots = Path(tls_ca_file).read_bytes() if tls_ca_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
            options: list[tuple[str, int | str]] = [*channel_options(max_message_bytes)]
            if tls_server_name:  # a Service's short name in the certificate, dialled by its DNS name
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._tls_channel = grpc.aio.secure_channel(grpc_target(address), credentials, options=options)
        else:
            INTERNAL_TOKEN.set("")  # this task's context: the discovered channels are opened in it
            self._discovered = DiscoveredChannel(discovery_for(address), max_message_bytes, name="gateway")

    async def start(self, timeout_s: float) -> None:
        """Find the gateway and wait until it is SERVING; RuntimeError after `timeout_s`."""
        if self._discovered is not None:
            await self._discovered.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                health = health_pb2_grpc.HealthStub(self.channel)
                reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway at {self.address} is not SERVING after {timeout_s:g} s")
            await asyncio.sleep(0.2)

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._tls_channel is not None:
            return self._tls_channel
        assert self._discovered is not None
        return self._discovered.stub(lambda channel: channel)

    @property
    def stub(self) -> gateway_pb2_grpc.GatewayStub:
        """A stub on the current channel: take one per call, as discovery swaps channels."""
        return gateway_pb2_grpc.GatewayStub(self.channel)

    async def close(self) -> None:
        if self._tls_channel is not None:
            await self._tls_channel.close()
        if self._discovered is not None:
            await self._discovered.close()
