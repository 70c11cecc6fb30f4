"""LiplineClient.wait: a cut WatchJob stream is resumed (GetJob, then WatchJob again) within its retry
budget, against a real gRPC server in this process."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from lipline_client import LiplineClient, RetryPolicy
from lipline_client.v1 import gateway_pb2, gateway_pb2_grpc

RUNNING, DONE = gateway_pb2.JOB_STATE_RUNNING, gateway_pb2.JOB_STATE_SUCCEEDED


def fast(max_attempts: int = 9, backoff_s: float = 0.01, max_backoff_s: float = 5.0) -> RetryPolicy:
    return RetryPolicy(max_attempts=max_attempts, initial_backoff_s=backoff_s, max_backoff_s=max_backoff_s)


# --------------------------------------------------------------------------------------------------
# wait(): a cut WatchJob stream is resumed (GetJob, then WatchJob again), within a retry budget.
# A real gRPC server in this process plays the gateway; each test scripts its WatchJob streams.
# --------------------------------------------------------------------------------------------------

QUEUED, FAILED = gateway_pb2.JOB_STATE_QUEUED, gateway_pb2.JOB_STATE_FAILED
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def job(state: int, progress: float = 0.0) -> gateway_pb2.Job:
    return gateway_pb2.Job(id="j1", state=state, progress=progress)


class FakeGateway(gateway_pb2_grpc.GatewayServicer):
    """WatchJob plays the next script: a list of Jobs to send, then an optional status to end with.
    GetJob answers `current` (or `get_error`)."""

    def __init__(
        self,
        watches: list[tuple[list[gateway_pb2.Job], grpc.StatusCode | None]],
        current: gateway_pb2.Job | None = None,
    ) -> None:
        self.watches = list(watches)
        self.current = current or job(RUNNING)
        self.get_error: grpc.StatusCode | None = None
        self.calls: list[str] = []
        self.api_keys: list[str | None] = []
        self.sent = threading.Event()  # set once a WatchJob has sent its jobs

    def WatchJob(self, request, context):
        self.calls.append("WatchJob")
        self.api_keys.append(dict(context.invocation_metadata()).get("x-api-key"))
        jobs, status = self.watches.pop(0) if self.watches else ([], UNAVAILABLE)
        yield from (gateway_pb2.JobEvent(job=j) for j in jobs)
        self.sent.set()
        if status is not None:
            context.abort(status, "scripted cut")

    def GetJob(self, request, context):
        self.calls.append("GetJob")
        if self.get_error is not None:
            context.abort(self.get_error, "scripted failure")
        return self.current


@contextlib.contextmanager
def serve(servicer: FakeGateway, port: int = 0) -> Iterator[tuple[grpc.Server, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    assert port > 0
    server.start()
    try:
        yield server, port
    finally:
        server.stop(0).wait()


def client_of(port: int, **kwargs: object) -> LiplineClient:
    return LiplineClient(f"127.0.0.1:{port}", timeout=kwargs.pop("timeout", 20.0), **kwargs)


def test_wait_resumes_a_cut_stream() -> None:
    fake = FakeGateway(
        [([job(QUEUED), job(RUNNING, 0.2)], UNAVAILABLE), ([job(RUNNING, 0.6), job(DONE, 1.0)], None)],
        current=job(RUNNING, 0.4),
    )
    seen: list[tuple[int, float]] = []
    with serve(fake) as (_, port), client_of(port, api_key="team-7") as client:
        final = client.wait("j1", lambda j: seen.append((j.state, round(j.progress, 1))), retry=fast())
    assert final.state == DONE
    assert fake.calls == ["WatchJob", "GetJob", "WatchJob"]
    assert seen == [(QUEUED, 0.0), (RUNNING, 0.2), (RUNNING, 0.4), (RUNNING, 0.6), (DONE, 1.0)]
    assert fake.api_keys == ["team-7", "team-7"]  # the key goes with every call


def test_wait_returns_a_job_that_finished_while_the_stream_was_cut() -> None:
    fake = FakeGateway([([job(RUNNING)], UNAVAILABLE)], current=job(FAILED))
    with serve(fake) as (_, port), client_of(port) as client:
        assert client.wait("j1", retry=fast()).state == FAILED
    assert fake.calls == ["WatchJob", "GetJob"]


def test_wait_resumes_after_a_stream_that_ends_early_without_an_error() -> None:
    fake = FakeGateway([([job(RUNNING)], None), ([job(DONE)], None)])
    with serve(fake) as (_, port), client_of(port) as client:
        assert client.wait("j1", retry=fast()).state == DONE
    assert fake.calls == ["WatchJob", "GetJob", "WatchJob"]


def test_wait_rides_out_a_gateway_restart_on_the_same_port() -> None:
    """The server goes away mid-stream (connection closed: UNAVAILABLE), is down for a while, and a
    new one on the same port answers: GetJob and WatchJob fail until it is back, then succeed."""
    first = FakeGateway([([job(RUNNING, 0.1)], None)])
    first.WatchJob = _hold_open(first.WatchJob)
    second = FakeGateway([([job(RUNNING, 0.7), job(DONE, 1.0)], None)], current=job(RUNNING, 0.5))
    seen: list[float] = []
    result: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        server, port = stack.enter_context(serve(first))
        client = stack.enter_context(client_of(port, timeout=60.0))
        thread = threading.Thread(
            target=lambda: result.update(
                job=client.wait("j1", lambda j: seen.append(j.progress), retry=fast(backoff_s=0.2, max_backoff_s=1.0))
            )
        )
        thread.start()
        assert first.sent.wait(10)
        server.stop(0).wait()  # the gateway dies with the stream open
        time.sleep(1.5)  # down: the client's calls fail meanwhile
        with serve(second, port):
            thread.join(30)
    assert not thread.is_alive()
    assert result["job"].state == DONE
    assert seen[0] == pytest.approx(0.1) and seen[-3:] == pytest.approx([0.5, 0.7, 1.0])
    assert second.calls == ["GetJob", "WatchJob"]


def _hold_open(watch: Callable) -> Callable:
    """A WatchJob that sends its script and then stays open until the server stops."""

    def held(request, context):
        yield from watch(request, context)
        while context.is_active():
            time.sleep(0.05)

    return held


def test_wait_gives_up_after_its_retry_budget() -> None:
    fake = FakeGateway([([job(RUNNING)], UNAVAILABLE)] * 10)
    fake.get_error = UNAVAILABLE
    with serve(fake) as (_, port), client_of(port) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.wait("j1", retry=fast(max_attempts=4, backoff_s=0.05))
        assert time.monotonic() - start < 5
    assert err.value.code() == UNAVAILABLE
    assert fake.calls == ["WatchJob", "GetJob", "GetJob", "GetJob"]


def test_wait_does_not_retry_other_errors() -> None:
    fake = FakeGateway([([], grpc.StatusCode.NOT_FOUND)])
    with serve(fake) as (_, port), client_of(port) as client:
        with pytest.raises(grpc.RpcError) as err:
            client.wait("j1", retry=fast())
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert fake.calls == ["WatchJob"]


def test_wait_is_bounded_by_the_client_timeout() -> None:
    fake = FakeGateway([([job(RUNNING)], None)] * 100)  # ends early every time: resumed, never finished
    with serve(fake) as (_, port), client_of(port, timeout=1.0) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError):
            client.wait("j1", retry=fast(max_attempts=1000, backoff_s=0.05, max_backoff_s=0.05))
        assert time.monotonic() - start < 3
