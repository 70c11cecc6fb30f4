"""The one server bootstrap of every lipline service.

`run(Service, Settings)` is each service's `__main__`: parse settings, configure logs and tracing,
start /metrics, start a grpc.aio server with health (NOT_SERVING until the models are loaded and
warmed up), reflection and the error interceptor (which also caps concurrent RPCs in all and per
client, health and reflection exempt), then wait for SIGTERM and drain in-flight streams
within `grace_s` before exiting. A service only supplies what differs: its servicers and `load()`.

Security, from the settings: `tls_cert_file`/`tls_key_file` serve the port over TLS; `api_keys_file`
makes the interceptor require an API key (the public API); `internal_token_file` makes every stage
(any service but the public ones in PUBLIC_STAGES) require the internal token, and makes every
service send it on its own stage calls (services.serving.channels). Health and reflection stay open.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Generic, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.serving import native_threads, tracing
from services.serving.auth import Auth, parse_api_keys, read_secret_file
from services.serving.background import cancel_and_wait
from services.serving.channels import INTERNAL_TOKEN, channel_options
from services.serving.interceptor import RpcLimits, ServerInterceptor
from services.serving.logs import configure_logging
from services.serving.metrics import Metrics, start_metrics_server
from services.serving.secret_files import start_watch
from services.serving.settings import ServiceSettings, parse_settings
from services.serving.stages import public_stages

_LOGGER = logging.getLogger(__name__)
SettingsT = TypeVar("SettingsT", bound=ServiceSettings)
#: services whose RPCs are the public API: they check API keys, never the internal token (they send it)
PUBLIC_STAGES = public_stages()


def connection_age_grace_s(settings: ServiceSettings) -> float:
    """How long calls open on a connection past its max age may go on: `max_connection_age_grace_s`,
    or (0) the SIGTERM drain time, at least 1 s. The gateway's default is a day, so that its
    long streams (WatchJob, DownloadOutput) end when they are done, not when the connection ages:
    only new calls move to a new connection (which is what rebalances)."""
    return settings.max_connection_age_grace_s or max(settings.grace_s, 1.0)


class Service(abc.ABC, Generic[SettingsT]):
    """What a lipline service provides to the bootstrap."""

    #: stage label in metrics and logs ("audio", "lipsync", "superres", "gateway")
    stage: str = ""

    def __init__(self, settings: SettingsT, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        #: the process's health servicer, set by ServiceRunner: a service whose work can stall after
        #: start-up (a render worker's claim loop) reports NOT_SERVING through it
        self.health: health.aio.HealthServicer | None = None
        #: the gRPC port bound, set by ServiceRunner before `load` (a live worker advertises it)
        self.bound_port = 0
        #: the HTTP port a service serves beside gRPC (the web page), set by `load`; written to the
        #: port file after the gRPC and metrics ports, so local mode and tests can find a port 0's choice
        self.http_port = 0

    @property
    @abc.abstractmethod
    def service_names(self) -> Sequence[str]:
        """Full gRPC service names (for health and reflection)."""

    @abc.abstractmethod
    def register(self, server: grpc.aio.Server) -> None:
        """Add the servicers to the server (cheap; runs before the port opens)."""

    @abc.abstractmethod
    async def load(self) -> None:
        """Load models and warm them up. The service reports SERVING only after this returns."""

    async def begin_drain(self) -> None:
        """SIGTERM, before the server waits for its RPCs: a service whose streams never end by
        themselves (a live worker's Converse) ends them here, with a status its clients act on."""

    async def close(self) -> None:
        """Release resources after the server has stopped."""


class ServiceRunner:
    """Starts, serves and stops one Service; usable from `main()` and from tests in-process."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.settings = service.settings
        self.ready = asyncio.Event()
        self.health = health.aio.HealthServicer()
        service.health = self.health
        s = self.settings
        options = channel_options(s.max_message_bytes) + [
            ("grpc.max_connection_age_ms", int(s.max_connection_age_s * 1000)),
            ("grpc.max_connection_age_grace_ms", int(connection_age_grace_s(s) * 1000)),
            ("grpc.so_reuseport", 0),
        ]
        # No `maximum_concurrent_rpcs`: gRPC's own cap counts every RPC, health checks included, so
        # one client's idle streams would starve probes and other clients. The interceptor caps RPCs
        # in all and per client instead, and never counts health or reflection.
        self.limits = RpcLimits(s.max_concurrent_streams, s.max_streams_per_client)
        keys_and_token = Auth.from_files(s.api_keys_file, s.internal_token_file)
        self.internal_token = keys_and_token.internal_token
        # A stage checks the internal token; the gateway only sends it (its callers hold API keys).
        self.auth = Auth(keys_and_token.api_keys, "" if service.stage in PUBLIC_STAGES else self.internal_token)
        self.interceptor = ServerInterceptor(service.metrics, self.ready, self.limits, self.auth)
        self.server = grpc.aio.server(interceptors=[self.interceptor], options=options)
        self._watch_keys: asyncio.Task | None = None
        self.port = 0
        self.metrics_port = -1

    async def start(self) -> None:
        s, svc = self.settings, self.service
        svc.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = list(svc.service_names)
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        for name in ["", *names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{s.host}:{s.port}"
        if s.tls_cert_file:
            credentials = grpc.ssl_server_credentials(
                [
                    (
                        read_secret_file(s.tls_key_file, "TLS key file").encode(),
                        read_secret_file(s.tls_cert_file, "TLS certificate file").encode(),
                    )
                ]
            )
            self.port = self.server.add_secure_port(address, credentials)
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise RuntimeError(f"could not bind {s.host}:{s.port}")
        self.metrics_port = start_metrics_server(svc.metrics, s.metrics_port, s.host)
        await self.server.start()
        _LOGGER.info(
            "listening; loading models",
            extra={
                "port": self.port,
                "metrics_port": self.metrics_port,
                "tls": bool(s.tls_cert_file),
                "api_keys": sorted(self.auth.api_keys),
                "internal_token": bool(self.internal_token),
            },
        )
        self._watch_keys = start_watch(
            s.api_keys_file,
            "API keys file",
            lambda text: parse_api_keys(text, s.api_keys_file),
            self._use_api_keys,
            s.secrets_reload_s,
            svc.metrics,
            "api_keys",
        )
        # The stage channels that load() opens send the internal token (a context variable: this task only).
        INTERNAL_TOKEN.set(self.internal_token)
        svc.bound_port = self.port
        await svc.load()
        self.ready.set()
        for name in ["", *names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if s.port_file:
            tmp = Path(s.port_file + ".tmp")
            extra = f" {svc.http_port}" if svc.http_port else ""
            tmp.write_text(f"{self.port} {self.metrics_port}{extra}\n")
            tmp.replace(s.port_file)
        _LOGGER.info("SERVING", extra={"port": self.port, "metrics_port": self.metrics_port})

    def _use_api_keys(self, keys: dict[str, str]) -> None:
        """A rotated API keys file: calls from now on are checked against `keys` (the token unchanged)."""
        self.auth = Auth(keys, self.auth.internal_token)
        self.interceptor.auth = self.auth
        _LOGGER.info("API keys in force", extra={"api_keys": sorted(keys)})

    async def stop(self) -> None:
        """Go NOT_SERVING (load balancers stop sending), then drain in-flight RPCs within grace_s."""
        await cancel_and_wait(self._watch_keys)
        await self.health.enter_graceful_shutdown()
        await self.service.begin_drain()
        _LOGGER.info("draining in-flight RPCs", extra={"grace_s": self.settings.grace_s})
        await self.server.stop(self.settings.grace_s)
        await self.service.close()
        _LOGGER.info("stopped")


async def warm_cache_only(service: Service) -> None:
    """Load (build, warm every bucket, save a fresh compile's artifacts, check numerics) and exit,
    without binding a port or reading credentials: what the chart's compile-cache Job runs."""
    await service.load()
    await service.close()
    _LOGGER.info(
        "model loaded and warmed; compile cache filled",
        extra={"dir": getattr(service.settings, "compile_cache_dir", "")},
    )


async def serve(service: Service) -> None:
    if getattr(service.settings, "warm_cache_only", False):
        await warm_cache_only(service)
        return
    runner = ServiceRunner(service)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(runner.start())
    stopped = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if start in done:
        start.result()  # re-raise a start-up failure (bad checkpoint, port in use)
        await stopped
    else:
        start.cancel()
    _LOGGER.info("signal received, shutting down")
    await runner.stop()


def run(service_cls: type[Service], settings_cls: type[SettingsT], argv: Sequence[str] | None = None) -> None:
    """Entry point of `python -m services.<stage>`."""
    settings = parse_settings(settings_cls, argv)
    native_threads.apply_opencv_threads()
    configure_logging(service_cls.stage, settings.log_level, settings.log_format)
    tracing.configure_tracing(f"lipline-{service_cls.stage}")
    metrics = Metrics(service_cls.stage)
    try:
        asyncio.run(serve(service_cls(settings, metrics)))
    except Exception as exc:
        _LOGGER.critical("failed to start: %s", exc, exc_info=True)
        sys.exit(1)
