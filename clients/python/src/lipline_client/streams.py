"""Client-streaming calls whose request iterator's own exception reaches the caller.

gRPC reads the requests of a streaming call (CreateAvatar's upload, Converse's audio) in a thread of
its own; when the iterator raises, gRPC logs "Exception iterating requests!" and ends the call
UNKNOWN with that text, so the caller learns neither what failed nor why. `RequestStream` keeps the
exception as the iterator raises it (which still ends the call), and the code that waits for the
answer raises it instead of the RpcError it caused (chained as its cause). The services have the
same for grpc.aio (services.serving.streams.request_stream); this package imports nothing of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Generic, TypeVar

import grpc

T = TypeVar("T")


class RequestStream(Generic[T]):
    """`requests` as the iterator to hand to a client-streaming call; `check` raises what they raised."""

    def __init__(self, requests: Iterable[T]) -> None:
        self._requests = iter(requests)
        #: the exception the requests raised, once they have
        self.error: Exception | None = None

    def __iter__(self) -> RequestStream[T]:
        return self

    def __next__(self) -> T:
        try:
            return next(self._requests)
        except StopIteration:
            raise
        except Exception as exc:
            self.error = exc
            raise

    def check(self, error: BaseException) -> None:
        """Raise the requests' own exception, from `error` (the call's end it caused), if they raised one."""
        if self.error is not None:
            raise self.error from error


class ResponseStream:
    """A bidirectional call's responses: iterating raises its requests' own exception where gRPC
    would raise the RpcError it caused; everything else (`cancel()`, `code()`, ...) is the call's."""

    def __init__(self, call: Any, requests: RequestStream[Any]) -> None:
        self._call = call
        self._requests = requests

    def __iter__(self) -> ResponseStream:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as error:
            self._requests.check(error)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


def stream_responses(method: Any, requests: Iterable[Any], **kwargs: Any) -> ResponseStream:
    """`method(requests, **kwargs)` of a bidirectional stub method, as a ResponseStream."""
    stream: RequestStream[Any] = RequestStream(requests)
    return ResponseStream(method(stream, **kwargs), stream)


def unary_response(method: Any, requests: Iterable[Any], **kwargs: Any) -> Any:
    """`method(requests, **kwargs)` of a client-streaming stub method: its response, or the
    requests' own exception where they raised one."""
    stream: RequestStream[Any] = RequestStream(requests)
    try:
        return method(stream, **kwargs)
    except grpc.RpcError as error:
        stream.check(error)
        raise
