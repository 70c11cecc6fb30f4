"""LiplineClient's retries against a real gRPC server in this process that scripts its answers: what is
retried (UNAVAILABLE on calls safe to repeat, RESOURCE_EXHAUSTED with `retry-after-ms`), how long it
waits (the hint), what is never retried, and the request id a create carries on every attempt."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from lipline_client import RETRY_AFTER_HEADER, LiplineClient, RetryPolicy, has_field
from lipline_client.retry import retry_after_s
from lipline_client.v1 import gateway_pb2, gateway_pb2_grpc
from services.serving.auth import API_KEY_HEADER
from services.serving.errors import RETRY_AFTER_HEADER as SERVER_RETRY_AFTER_HEADER

UNAVAILABLE, EXHAUSTED = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED
Failure = tuple[grpc.StatusCode, str | None]  # a status and its retry-after-ms (None: no hint)


class ScriptedGateway(gateway_pb2_grpc.GatewayServicer):
    """GetJob and SubmitJob fail with the next scripted failure, then succeed; every request and when it came is kept."""

    def __init__(self, failures: list[Failure]) -> None:
        self.failures = list(failures)
        self.requests: list[tuple[float, object]] = []

    def _answer(self, request, context, response):
        self.requests.append((time.monotonic(), request))
        if self.failures:
            code, hint = self.failures.pop(0)
            if hint is not None:
                context.set_trailing_metadata(((RETRY_AFTER_HEADER, hint),))
            context.abort(code, f"scripted {code.name}")
        return response

    def GetJob(self, request, context):
        return self._answer(request, context, gateway_pb2.Job(id=request.job_id))

    def SubmitJob(self, request, context):
        return self._answer(request, context, gateway_pb2.Job(id="j1", avatar_id=request.avatar_id))


@contextlib.contextmanager
def client_for(failures: list[Failure], **kwargs: object) -> Iterator[tuple[ScriptedGateway, LiplineClient]]:
    fake = ScriptedGateway(failures)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    gateway_pb2_grpc.add_GatewayServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    policy = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.05)
    try:
        with LiplineClient(f"127.0.0.1:{port}", timeout=kwargs.pop("timeout", 20.0), retry=policy, **kwargs) as c:
            yield fake, c
    finally:
        server.stop(0).wait()


def test_the_client_speaks_the_servers_header_names() -> None:
    from lipline_client.client import API_KEY_HEADER as CLIENT_API_KEY_HEADER

    assert (CLIENT_API_KEY_HEADER, RETRY_AFTER_HEADER) == (API_KEY_HEADER, SERVER_RETRY_AFTER_HEADER)


def test_a_read_is_retried_after_unavailable() -> None:
    with client_for([(UNAVAILABLE, None), (UNAVAILABLE, None)]) as (fake, client):
        assert client.get_job("j1").id == "j1"
    assert len(fake.requests) == 3


def test_retries_stop_after_max_attempts() -> None:
    with client_for([(UNAVAILABLE, None)] * 10) as (fake, client), pytest.raises(grpc.RpcError) as caught:
        client.get_job("j1")
    assert caught.value.code() == UNAVAILABLE
    assert len(fake.requests) == 4


def test_resource_exhausted_waits_as_long_as_the_server_says() -> None:
    with client_for([(EXHAUSTED, "300")]) as (fake, client):
        assert client.get_job("j1").id == "j1"
    (first, _), (second, _) = fake.requests
    assert second - first >= 0.3  # the hint, not the policy's 10 ms back-off


def test_resource_exhausted_without_a_hint_is_a_limit_and_not_retried() -> None:
    with client_for([(EXHAUSTED, None)]) as (fake, client), pytest.raises(grpc.RpcError) as caught:
        client.get_job("j1")
    assert caught.value.code() == EXHAUSTED
    assert len(fake.requests) == 1


def test_a_hint_beyond_the_deadline_raises_at_once() -> None:
    with client_for([(EXHAUSTED, "60000")], timeout=2.0) as (fake, client), pytest.raises(grpc.RpcError) as caught:
        client.get_job("j1")
    assert caught.value.code() == EXHAUSTED
    assert retry_after_s(caught.value) == 60.0
    assert len(fake.requests) == 1


def test_other_statuses_are_not_retried() -> None:
    with client_for([(grpc.StatusCode.INVALID_ARGUMENT, "10")]) as (fake, client), pytest.raises(grpc.RpcError):
        client.get_job("j1")
    assert len(fake.requests) == 1


def test_submit_job_is_repeated_after_unavailable_only_with_a_request_id() -> None:
    """With request_id in the protos, every attempt carries the same fresh id and UNAVAILABLE is retried;
    without it a SubmitJob that may have been done is not repeated, and asking for an id is an error."""
    with client_for([(UNAVAILABLE, None)]) as (fake, client):
        if has_field(gateway_pb2.SubmitJobRequest, "request_id"):
            assert client.submit_job("a" * 24, b"RIFF").id == "j1"
            ids = [getattr(request, "request_id") for _, request in fake.requests]
            assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 36
            client.submit_job("a" * 24, b"RIFF")
            assert getattr(fake.requests[-1][1], "request_id") != ids[0]  # a new call, a new id
        else:
            with pytest.raises(grpc.RpcError) as caught:
                client.submit_job("a" * 24, b"RIFF")
            assert caught.value.code() == UNAVAILABLE and len(fake.requests) == 1
            with pytest.raises(ValueError, match="request_id"):
                client.submit_job("a" * 24, b"RIFF", request_id="mine")


def test_a_create_is_retried_when_the_server_says_when_even_without_a_request_id() -> None:
    with client_for([(EXHAUSTED, "20")]) as (fake, client):
        assert client.submit_job("a" * 24, audio_uri="s3://bucket/speech.wav").avatar_id == "a" * 24
    assert [request.audio_uri for _, request in fake.requests] == ["s3://bucket/speech.wav"] * 2
