"""LiplineClient's client-streaming calls when the requests themselves fail (issue 29): the caller gets
the exception its requests raised, not gRPC's UNKNOWN "Exception iterating requests!", and the call
is ended at the server. A real gRPC server in this process stands in for the gateway."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from lipline_client import LiplineClient, converse_start
from lipline_client.v1 import gateway_pb2, gateway_pb2_grpc, session_pb2


class ReadingGateway(gateway_pb2_grpc.GatewayServicer):
    """CreateAvatar reads the upload to its end; Converse answers each request with a stats message
    (`ended` is set when a Converse call ends)."""

    def __init__(self) -> None:
        self.ended = threading.Event()

    def CreateAvatar(self, request_iterator, context):
        return gateway_pb2.Avatar(id="a1", frame_count=sum(len(r.data) for r in request_iterator))

    def Converse(self, request_iterator, context):
        if not context.add_callback(self.ended.set):  # the call ended before this handler ran
            self.ended.set()
        for _ in request_iterator:
            yield session_pb2.ConverseResponse(stats=session_pb2.SessionStats())


@contextlib.contextmanager
def client() -> Iterator[tuple[ReadingGateway, LiplineClient]]:
    gateway = ReadingGateway()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    gateway_pb2_grpc.add_GatewayServicer_to_server(gateway, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with LiplineClient(f"127.0.0.1:{port}", timeout=30.0) as c:
            yield gateway, c
    finally:
        server.stop(0).wait()


class ReadableFirstMiB(bytes):
    """Upload bytes of which only the first MiB can be read (a file whose disk fails mid-read)."""

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, slice) and (key.start or 0) > 0:
            raise OSError("the avatar file could not be read past its first MiB")
        return super().__getitem__(key)


def test_an_upload_that_fails_while_it_is_sent_raises_its_own_error() -> None:
    with client() as (_, c):
        assert c.create_avatar(bytes(3 << 20)).frame_count == 3 << 20
        with pytest.raises(OSError, match="past its first MiB") as failed:
            c.create_avatar(ReadableFirstMiB(bytes(3 << 20)))
        assert isinstance(failed.value.__cause__, grpc.RpcError)  # the call it ended, chained


def test_converse_requests_that_fail_raise_their_own_error_where_the_responses_are_read() -> None:
    session = session_pb2.Session(id="s1", resume_token="t")

    def requests() -> Iterator[session_pb2.ConverseRequest]:
        yield converse_start(session)
        yield session_pb2.ConverseRequest(audio=session_pb2.AudioChunk(pcm=bytes(640)))
        raise ValueError("the microphone went away")

    with client() as (gateway, c):
        responses = c.converse(requests(), timeout=30)
        with pytest.raises(ValueError, match="the microphone went away"):
            for _ in responses:
                pass
        assert responses.code() == grpc.StatusCode.UNKNOWN  # the call's own (gRPC ended it)
        assert gateway.ended.wait(10)
        # A stream whose requests end normally still reads to its end.
        answers = list(c.converse(iter([converse_start(session)]), timeout=30))
        assert [a.WhichOneof("response") for a in answers] == ["stats"]
