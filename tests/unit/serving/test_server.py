"""The server bootstrap in-process: readiness gating, the error funnel of the interceptor, RPC metrics.

A tiny Service with raw-bytes methods (no protobuf needed) runs in a real grpc.aio server on
127.0.0.1:0; its load() waits on an asyncio.Event the test controls, so the loading phase can be
observed. Each test is a plain function running its own event loop (`asyncio.run`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.serving.errors import InvalidMedia, NotFound, TooLarge
from services.serving.interceptor import CLIENT_ID, REQUEST_ID, TENANT, client_identity
from services.serving.metrics import Metrics
from services.serving.server import Service, ServiceRunner
from services.serving.settings import ServiceSettings
from services.serving.streams import stream_call

SERVICE = "lipline.test.Echo"
SECRET = "secret internal detail 12345"


class EchoService(Service[ServiceSettings]):
    stage = "test"

    def __init__(self, settings: ServiceSettings, metrics: Metrics) -> None:
        super().__init__(settings, metrics)
        self.gate = asyncio.Event()  # load() returns once this is set
        self.loading = asyncio.Event()  # set when load() has started (the port is open)
        self.closed = False
        self.request_ids: list[str] = []
        self.client_ids: list[str] = []
        self.tenants: list[str] = []
        self.idle_open = 0  # Idle streams whose handler is running
        self.forever = asyncio.Event()  # never set: Idle streams wait on it
        self.flood_sent = 0  # messages Flood streams have handed to gRPC
        self.loopback: grpc.aio.Channel | None = None  # a channel to this server, for Relay

    @property
    def service_names(self) -> Sequence[str]:
        return [SERVICE]

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "Invalid": grpc.unary_unary_rpc_method_handler(self.invalid),
            "Crash": grpc.unary_unary_rpc_method_handler(self.crash),
            "Abort": grpc.unary_unary_rpc_method_handler(self.abort),
            "Stream": grpc.unary_stream_rpc_method_handler(self.stream),
            "Upload": grpc.stream_unary_rpc_method_handler(self.upload),
            "Idle": grpc.unary_stream_rpc_method_handler(self.idle),
            "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
            "Relay": grpc.unary_unary_rpc_method_handler(self.relay),
            "Hold": grpc.unary_unary_rpc_method_handler(self.hold),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def load(self) -> None:
        self.loading.set()
        await self.gate.wait()

    async def close(self) -> None:
        self.closed = True

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.request_ids.append(REQUEST_ID.get())
        self.client_ids.append(CLIENT_ID.get())
        self.tenants.append(TENANT.get())
        return request

    async def idle(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """One message, then nothing until the client goes away (an idle WatchJob)."""
        self.idle_open += 1
        try:
            yield b"open"
            await self.forever.wait()
        finally:
            self.idle_open -= 1

    async def flood(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """256 KiB messages for as long as the client takes them (a download)."""
        piece = bytes(256 * 1024)
        while True:
            yield piece
            self.flood_sent += 1

    async def invalid(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise InvalidMedia("the picture is not a picture; send JPEG or PNG")

    async def crash(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise ValueError(SECRET)

    async def abort(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no entry")
        return b""

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(request or b"0")):
            yield b"item %d" % i
        raise TooLarge("stream is over its limit")

    async def hold(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """No answer until the client goes away."""
        await self.forever.wait()
        return b""

    async def relay(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Uploads to this server's Upload a stream that fails while it is read (a limit met while
        decoding): through stream_call when `request` is b"stream_call", else handed to gRPC as it is."""

        async def failing() -> AsyncIterator[bytes]:
            yield b"ab"
            raise TooLarge("the upload met its limit while it was read")

        assert self.loopback is not None
        upload = self.loopback.stream_unary(f"/{SERVICE}/Upload")
        if request == b"stream_call":
            return await stream_call(upload, failing(), timeout=30)
        return await upload(failing(), timeout=30)

    async def upload(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        total = 0
        async for chunk in requests:
            total += len(chunk)
            if total > 10:
                raise NotFound("upload target vanished")
        return str(total).encode()


def run_server(
    test: Callable[[EchoService, ServiceRunner, grpc.aio.Channel], Awaitable[None]],
    port_file: Path | None = None,
    ready: bool = True,
    **settings: Any,
) -> EchoService:
    """Start EchoService on 127.0.0.1:0 (loaded unless ready=False), run `test`, stop the server."""

    async def main() -> EchoService:
        settings_ = ServiceSettings(
            host="127.0.0.1", port=0, metrics_port=-1, grace_s=1.0, port_file=str(port_file or ""), **settings
        )
        service = EchoService(settings_, Metrics("test"))
        runner = ServiceRunner(service)
        start = asyncio.create_task(runner.start())
        await asyncio.wait_for(service.loading.wait(), 10)
        assert runner.port > 0
        if ready:
            service.gate.set()
            await asyncio.wait_for(start, 10)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{runner.port}") as channel:
                await test(service, runner, channel)
        finally:
            service.gate.set()
            await asyncio.wait_for(start, 10)
            await runner.stop()
        return service

    return asyncio.run(main())


async def health(channel: grpc.aio.Channel, service: str = "") -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status


async def call_error(call: Awaitable[Any] | AsyncIterator[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    return err.value


def requests_count(service: EchoService, method: str, code: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "lipline_stage_requests_total", {"stage": "test", "method": method, "code": code}
    )
    return value or 0.0


def unary(channel: grpc.aio.Channel, method: str) -> grpc.aio.UnaryUnaryMultiCallable:
    return channel.unary_unary(f"/{SERVICE}/{method}")


def test_not_serving_and_unavailable_while_loading(tmp_path: Path) -> None:
    port_file = tmp_path / "port"

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        assert await health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health(channel, SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
        err = await call_error(unary(channel, "Echo")(b"hi", timeout=5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "loading" in err.details() and "test" in err.details()
        err = await call_error(channel.unary_stream(f"/{SERVICE}/Stream")(b"2", timeout=5))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert not port_file.exists(), "the port file must appear only once SERVING"
        assert service.request_ids == []  # the handler never ran

        service.gate.set()
        for _ in range(100):
            if await health(channel) == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.02)
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
        assert await health(channel, SERVICE) == health_pb2.HealthCheckResponse.SERVING
        assert await unary(channel, "Echo")(b"hi", timeout=5) == b"hi"
        assert port_file.read_text().split() == [str(runner.port), "-1"]

    service = run_server(test, port_file=port_file, ready=False)
    assert requests_count(service, "Echo", "UNAVAILABLE") == 1
    assert requests_count(service, "Stream", "UNAVAILABLE") == 1
    assert requests_count(service, "Echo", "OK") == 1
    assert service.closed
    # Health checks bypass the interceptor: they are neither gated nor counted.
    assert requests_count(service, "Check", "OK") == 0


def test_errors_map_to_status_codes() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        err = await call_error(unary(channel, "Invalid")(b"", timeout=5))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == "the picture is not a picture; send JPEG or PNG"

        err = await call_error(unary(channel, "Crash")(b"", timeout=5, metadata=(("x-request-id", "req-abc-123"),)))
        assert err.code() == grpc.StatusCode.INTERNAL
        assert "req-abc-123" in err.details() and "Crash" in err.details()
        assert SECRET not in err.details() and "Traceback" not in err.details() and "ValueError" not in err.details()

        err = await call_error(unary(channel, "Crash")(b"", timeout=5))  # no id sent: one is made up
        assert err.code() == grpc.StatusCode.INTERNAL and "request id " in err.details()

        err = await call_error(unary(channel, "Abort")(b"", timeout=5))
        assert (err.code(), err.details()) == (grpc.StatusCode.PERMISSION_DENIED, "no entry")

        # Streaming responses: the items before the error arrive, then the mapped status.
        call = channel.unary_stream(f"/{SERVICE}/Stream")(b"2", timeout=5)
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            async for item in call:
                received.append(item)
        assert received == [b"item 0", b"item 1"]
        assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert exc.value.details() == "stream is over its limit"

        # Streaming requests.
        upload = channel.stream_unary(f"/{SERVICE}/Upload")
        assert await upload(iter([b"abc", b"de"]), timeout=5) == b"5"
        err = await call_error(upload(iter([b"abcdef", b"ghijkl"]), timeout=5))
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "upload target vanished")

        # The request id reaches the handler through the context variable.
        assert await unary(channel, "Echo")(b"x", timeout=5, metadata=(("x-request-id", "rid-7"),)) == b"x"
        assert service.request_ids[-1] == "rid-7"
        assert await unary(channel, "Echo")(b"y", timeout=5) == b"y"
        assert len(service.request_ids[-1]) == 16 and service.request_ids[-1] != "rid-7"

        # Nothing above broke the server.
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING

    service = run_server(test)
    expected = {
        ("Invalid", "INVALID_ARGUMENT"): 1,
        ("Crash", "INTERNAL"): 2,
        ("Abort", "PERMISSION_DENIED"): 1,
        ("Stream", "RESOURCE_EXHAUSTED"): 1,
        ("Upload", "OK"): 1,
        ("Upload", "NOT_FOUND"): 1,
        ("Echo", "OK"): 2,
        ("Echo", "INTERNAL"): 0,
    }
    assert {key: requests_count(service, *key) for key in expected} == expected
    registry = service.metrics.registry
    assert registry.get_sample_value("lipline_stage_request_seconds_count", {"stage": "test", "method": "Crash"}) == 2


def test_stop_refuses_new_calls() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        assert await unary(channel, "Echo")(b"1", timeout=5) == b"1"
        await runner.stop()
        assert service.closed
        err = await call_error(unary(channel, "Echo")(b"2", timeout=2))
        assert err.code() == grpc.StatusCode.UNAVAILABLE

    run_server(test)


def test_load_failure_propagates() -> None:
    class Broken(EchoService):
        async def load(self) -> None:
            raise RuntimeError("checkpoint does not fit")

    async def main() -> None:
        service = Broken(ServiceSettings(host="127.0.0.1", port=0, metrics_port=-1, grace_s=0.1), Metrics("test"))
        runner = ServiceRunner(service)
        with pytest.raises(RuntimeError, match="checkpoint does not fit"):
            await runner.start()
        assert not runner.ready.is_set()
        await runner.stop()

    asyncio.run(main())


def key(name: str) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", name),)


async def open_idle(channel: grpc.aio.Channel, client: str) -> grpc.aio.UnaryStreamCall:
    """An Idle stream of `client` that has started (its first message read) and then sits there."""
    call = channel.unary_stream(f"/{SERVICE}/Idle")(b"", timeout=30, metadata=key(client))
    assert await asyncio.wait_for(call.read(), 5) == b"open"
    return call


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_caps_in_all_and_per_client_never_starve_health() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        limits = runner.limits
        a = [await open_idle(channel, "a") for _ in range(3)]
        # A's fourth call is refused at once, with which cap, the advice and a retry hint.
        refused = channel.unary_stream(f"/{SERVICE}/Idle")(b"", timeout=5, metadata=key("a"))
        err = await call_error(refused)
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "per client" in err.details() and "max_streams_per_client 3" in err.details()
        assert "retry later" in err.details()
        assert dict(err.trailing_metadata() or ())["retry-after-ms"] == "1000"
        err = await call_error(unary(channel, "Echo")(b"x", timeout=5, metadata=key("a")))  # unary calls too
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        # Another client still gets in, up to the cap in all (5).
        b = [await open_idle(channel, "b") for _ in range(2)]
        assert (limits.total, limits.per_client) == (5, {"key:a": 3, "key:b": 2})
        err = await call_error(unary(channel, "Echo")(b"x", timeout=5, metadata=key("c")))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_concurrent_streams 5" in err.details() and "retry later" in err.details()
        assert dict(err.trailing_metadata() or ())["retry-after-ms"] == "1000"

        # Health checks are neither counted nor refused, however many run at once.
        statuses = await asyncio.gather(*(health(channel) for _ in range(20)))
        assert statuses == [health_pb2.HealthCheckResponse.SERVING] * 20
        assert limits.total == 5

        # A stream counts until it ends: cancelled by its client, its slot is free again.
        for call in a:
            call.cancel()
        await until(lambda: "key:a" not in limits.per_client and service.idle_open == 2, "A's streams to end")
        assert await unary(channel, "Echo")(b"y", timeout=5, metadata=key("c")) == b"y"
        assert service.client_ids[-1] == "key:c"
        # No key: the client is the peer's IP address.
        assert await unary(channel, "Echo")(b"z", timeout=5) == b"z"
        assert service.client_ids[-1] == "ip:127.0.0.1"
        # A stream that ends by itself (here with an error status) frees its slot too.
        err = await call_error(channel.unary_stream(f"/{SERVICE}/Stream")(b"2", timeout=5, metadata=key("b")))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.details() == "stream is over its limit"
        # A key that cannot be an identity is refused.
        err = await call_error(unary(channel, "Echo")(b"x", timeout=5, metadata=key("k" * 129)))
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "x-api-key" in err.details()

        for call in b:
            call.cancel()
        await until(lambda: limits.total == 0 and service.idle_open == 0, "every slot to be free")
        assert limits.per_client == {}

    service = run_server(test, max_concurrent_streams=5, max_streams_per_client=3)
    assert requests_count(service, "Idle", "RESOURCE_EXHAUSTED") == 1
    assert requests_count(service, "Echo", "RESOURCE_EXHAUSTED") == 2
    assert requests_count(service, "Echo", "UNAUTHENTICATED") == 1
    assert requests_count(service, "Check", "OK") == 0


def test_no_caps_when_zero() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        calls = [await open_idle(channel, "a") for _ in range(40)]
        assert runner.limits.total == 40
        for call in calls:
            call.cancel()
        await until(lambda: runner.limits.total == 0, "every slot to be free")

    run_server(test, max_concurrent_streams=0, max_streams_per_client=0)


@pytest.mark.parametrize(
    ("metadata", "peer", "identity"),
    [
        ({}, "ipv4:10.1.2.3:45678", "ip:10.1.2.3"),
        ({}, "ipv6:[::1]:45678", "ip:::1"),
        ({}, "ipv6:%5B2001:db8::7%5D:443", "ip:2001:db8::7"),
        ({}, "unix:/tmp/socket", "unix:/tmp/socket"),
        ({}, "", "unknown"),
        ({"x-api-key": "team-7"}, "ipv4:10.1.2.3:45678", "key:team-7"),
    ],
)
def test_client_identity(metadata: dict[str, str], peer: str, identity: str) -> None:
    assert client_identity(metadata, peer) == identity


@pytest.mark.parametrize("bad", ["", "k" * 129, "caf\u00e9", "a\tb"])
def test_client_identity_refuses_odd_keys(bad: str) -> None:
    with pytest.raises(ValueError, match="x-api-key"):
        client_identity({"x-api-key": bad}, "ipv4:10.1.2.3:1")


def test_a_stream_blocked_on_a_client_that_stopped_reading_counts_until_cancelled() -> None:
    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        call = channel.unary_stream(f"/{SERVICE}/Flood")(b"", timeout=30, metadata=key("a"))
        assert len(await call.read()) == 256 * 1024
        # The client reads no more: the handler stops once HTTP/2 flow control is exhausted.
        sent = -1
        while sent != service.flood_sent:
            sent = service.flood_sent
            await asyncio.sleep(0.3)
        assert sent < 200, f"{sent} messages of 256 KiB were sent to a client that reads none"
        assert runner.limits.per_client == {"key:a": 1}
        call.cancel()
        await until(lambda: runner.limits.total == 0, "the blocked stream's slot to be free")

    run_server(test, max_concurrent_streams=5, max_streams_per_client=3)


def test_a_stream_the_client_cancels_while_it_is_sending_ends_cancelled_not_crashed(caplog) -> None:
    """A client that cancels a stream the handler is still producing leaves gRPC's generator suspended at
    its `yield`; it is closed later (GeneratorExit, possibly in another context). That is a cancel, not a
    crash: no "crashed" log, no second status, no "Task exception was never retrieved", the slot is freed."""

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        for _ in range(8):
            call = channel.unary_stream(f"/{SERVICE}/Flood")(b"", timeout=30)
            await call.read()
            call.cancel()
        await until(lambda: runner.limits.total == 0, "the cancelled streams' slots to be free")
        gc.collect()  # closes the generators left at their yield
        await asyncio.sleep(0.2)
        gc.collect()
        await asyncio.sleep(0.2)
        assert requests_count(service, "Flood", "INTERNAL") == 0

    with caplog.at_level(logging.ERROR):
        run_server(test)
    gc.collect()
    # Ours (the interceptor's "crashed", asyncio's "never retrieved"); gRPC's own core may log the failed write.
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and (r.name.startswith("services") or r.name == "asyncio")
    ]
    assert not errors, errors


def test_a_request_iterator_failing_under_a_handler_gets_its_status_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's own client-streaming call whose requests fail: through stream_call, the failure is
    the RPC's status (logged once); handed to gRPC as it is, gRPC only cancels the inner call, and
    the interceptor answers INTERNAL rather than leave the client waiting until its deadline."""

    async def test(service: EchoService, runner: ServiceRunner, channel: grpc.aio.Channel) -> None:
        service.loopback = channel
        with caplog.at_level(logging.INFO, logger="services.serving.interceptor"):
            err = await call_error(unary(channel, "Relay")(b"stream_call", timeout=60))
            assert (err.code(), err.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "the upload met its limit while it was read",
            )
            logged = [r for r in caplog.records if r.getMessage().startswith("Relay")]
            assert [r.getMessage() for r in logged] == ["Relay failed: the upload met its limit while it was read"]

            caplog.clear()
            err = await call_error(unary(channel, "Relay")(b"as it is", timeout=60))
            assert err.code() == grpc.StatusCode.INTERNAL and "Relay" in err.details()
            assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Relay")] == ["Relay crashed"]

            # A call its client cancels (or whose deadline passes) is still a cancel, not a crash.
            call = await open_idle(channel, "d")
            call.cancel()
            err = await call_error(unary(channel, "Hold")(b"", timeout=0.5))
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: service.idle_open == 0, "the cancelled stream to end")
            await until(lambda: requests_count(service, "Hold", "CANCELLED") == 1, "the held call to end")
        assert not [r for r in caplog.records if "crashed" in r.getMessage() and not r.getMessage().startswith("Relay")]

    service = run_server(test)
    assert requests_count(service, "Relay", "RESOURCE_EXHAUSTED") == 1
    assert requests_count(service, "Relay", "INTERNAL") == 1
    assert requests_count(service, "Idle", "CANCELLED") == 1
