"""The web deployable in the common bootstrap: its gRPC port serves health and reflection only (the
chart's probes, as for every stage); `load` waits for the gateway and opens the HTTP site, so the
process is SERVING only once the page can be served and its calls can reach the gateway."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc
from aiohttp import web

from services.serving.server import Service
from services.web.app import WebApp
from services.web.gateway_link import GatewayLink
from services.web.settings import WebSettings

_LOGGER = logging.getLogger(__name__)


class WebService(Service[WebSettings]):
    stage = "web"

    @property
    def service_names(self) -> Sequence[str]:
        return []  # health ("") and reflection only: the page is HTTP

    def register(self, server: grpc.aio.Server) -> None:
        self.gateway: GatewayLink | None = None
        self.runner: web.AppRunner | None = None

    async def load(self) -> None:
        s = self.settings
        self.gateway = GatewayLink(
            s.gateway_address,
            s.max_message_bytes,
            tls=s.gateway_tls,
            tls_ca_file=s.gateway_tls_ca_file,
            tls_server_name=s.gateway_tls_server_name,
        )
        await self.gateway.start(s.stage_wait_s)
        # access_log=None: aiohttp's access log would print every request line; the metrics count them,
        # and nothing about a request (its key is a header, never logged) goes to the log.
        self.runner = web.AppRunner(WebApp(s, self.gateway, self.metrics).build(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, s.host, s.http_port, reuse_address=True)
        await site.start()
        self.http_port = int(self.runner.addresses[0][1])  # the port bound (http_port 0: the OS's choice)
        _LOGGER.info("web page listening", extra={"http_port": self.http_port, "gateway": s.gateway_address})

    async def begin_drain(self) -> None:
        """SIGTERM: the page's live sockets are closed with "going away" before the gRPC drain."""
        if self.runner is not None:
            await self.runner.shutdown()

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.gateway is not None:
            await self.gateway.close()
