"""Settings of the web page's server (`python -m services.web`): where it listens, which gateway it calls."""

from __future__ import annotations

import dataclasses

from services.serving.settings import ServiceSettings, address_field, setting
from services.serving.stages import STAGES
from services.web.origins import origin_of


@dataclasses.dataclass(frozen=True)
class WebSettings(ServiceSettings):
    """Settings of the web page: an HTTP server (the page, its API, the live WebSocket) in front of the gateway.

    It holds no state: every request is one or more gateway calls made with the caller's API key.
    """

    port: int = setting(STAGES["web"].port, "gRPC port (health and reflection only; the page is on http_port)")
    metrics_port: int = setting(
        STAGES["web"].metrics_port, "Prometheus /metrics HTTP port (0 = any free port, -1 = off)"
    )
    http_port: int = setting(
        STAGES["web"].http_port, "HTTP port of the page, its API and the live WebSocket (0 = any free port)"
    )
    gateway_address: str = address_field(STAGES["gateway"].local_address, "gateway (the public API)")
    gateway_tls: bool = setting(False, "call the gateway over TLS (the system's roots, or gateway_tls_ca_file)")
    gateway_tls_ca_file: str = setting("", "PEM bundle that signed the gateway's certificate (implies gateway_tls)")
    gateway_tls_server_name: str = setting(
        "",
        "the name the gateway's certificate is checked against over TLS (empty: the address's host); "
        "the chart sets the gateway Service's name, as helm test does",
    )
    require_api_key: bool = setting(
        True,
        "refuse API calls and WebSockets that carry no API key (401) before calling the gateway; "
        "off only where the gateway checks no keys (local mode)",
    )
    public_origins: tuple[str, ...] = setting(
        (),
        "the origins (scheme://host[:port]) the page is served at, as a browser shows them (an ingress's "
        "https://try.example.com): only pages of these (and allowed_origins) may open the live WebSocket, "
        "whatever Host a request names, and without API keys the API answers only at these; empty = the "
        "loopback ones of the HTTP port (http://127.0.0.1:<port>, http://localhost:<port>, http://[::1]:<port>: "
        "local mode)",
    )
    allowed_origins: tuple[str, ...] = setting(
        (),
        "origins (scheme://host[:port]) of other pages allowed to open the live WebSocket besides the "
        "page's own (public_origins); empty = none",
    )
    max_avatar_bytes: int = setting(
        200 * 1024 * 1024, "largest avatar upload, refused 413 before it reaches the gateway (the gateway's own limit)"
    )
    max_audio_bytes: int = setting(
        50 * 1024 * 1024,
        "largest audio file of a job, refused 413 before it reaches the gateway (the gateway's own limit)",
    )
    max_live_message_bytes: int = setting(
        64 * 1024, "largest WebSocket message from the page (PCM chunks of 100 ms at 48 kHz are 9.6 kB)"
    )
    call_timeout_s: float = setting(120.0, "deadline of one gateway call (uploads, submits, listings)")
    stage_wait_s: float = setting(60.0, "at start-up, how long to wait for the gateway to be SERVING")

    def validate(self) -> None:
        super().validate()
        problems = []
        if not 0 <= self.http_port <= 65535:
            problems.append(f"http_port {self.http_port} is not in 0..65535")
        if self.max_avatar_bytes < 1 or self.max_audio_bytes < 1:
            problems.append("max_avatar_bytes and max_audio_bytes must be >= 1")
        if self.max_live_message_bytes < 1024:
            problems.append(f"max_live_message_bytes must be >= 1024, got {self.max_live_message_bytes}")
        if self.call_timeout_s <= 0:
            problems.append(f"call_timeout_s must be > 0, got {self.call_timeout_s}")
        for name in ("public_origins", "allowed_origins"):
            for origin in getattr(self, name):
                try:
                    origin_of(origin)
                except ValueError as exc:
                    problems.append(f"{name}: {exc}")
        if self.gateway_tls or self.gateway_tls_ca_file or self.gateway_tls_server_name:
            if self.gateway_address.startswith(("k8s:", "file:")) or "," in self.gateway_address:
                problems.append(
                    f"over TLS the gateway is one channel to host:port or dns:///name:port, not {self.gateway_address!r} "
                    "(k8s:///, file:// and lists are the plaintext discovery forms)"
                )
        if problems:
            raise ValueError("; ".join(problems))
