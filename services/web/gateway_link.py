"""The web server's one channel to the gateway, and how a gateway status becomes an HTTP answer.

Every call carries the page user's API key as `x-api-key` metadata (services/serving/auth.py), so the
gateway authenticates, picks the tenant and applies its per-client limits exactly as for any other
client: the web server has no credentials of its own and keeps nothing between requests.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from lipline.v1 import gateway_pb2_grpc
from services.serving.auth import API_KEY_HEADER
from services.serving.channels import channel_options

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
    """One grpc.aio channel to the gateway, shared by every request (HTTP/2 multiplexes them)."""

    def __init__(self, address: str, max_message_bytes: int, *, tls: bool = False, tls_ca_file: str = "") -> None:
        options = channel_options(max_message_bytes)
        if tls or tls_ca_file:
            roots = Path(tls_ca_file).read_bytes() if tls_ca_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
            self.channel = grpc.aio.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        self.stub = gateway_pb2_grpc.GatewayStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
